// The simt tier's entries in the backend table (registry.cu).
#pragma once

#include <string>
#include <vector>

#include "fmha/fmha.h"

namespace fmha::cuda::simt {

Status supports(const Params& params, Direction direction);
Status run(const Params& params, Direction direction);
// Tuning: the variant names for a direction, and the one a call runs (src/cuda/common/variant.h).
std::vector<std::string> variants(const Params& params, Direction direction);
Status variant_of(const Params& params, Direction direction, std::string* name);

}  // namespace fmha::cuda::simt
