// The sm90 tier's entries in the backend table (registry.cu).
#pragma once

#include <string>
#include <vector>

#include "fmha/fmha.h"

namespace fmha::cuda::sm90 {

Status supports(const Params& params, Direction direction);
Status run(const Params& params, Direction direction);
// The backward's workspace: the shared layout, with the deterministic mode's turn counters.
Status workspace_size(const Params& params, Direction direction, size_t* bytes);
// Tuning: the variant names for a direction, and the one a call runs (src/cuda/common/variant.h).
std::vector<std::string> variants(const Params& params, Direction direction);
Status variant_of(const Params& params, Direction direction, std::string* name);

}  // namespace fmha::cuda::sm90
