// The sm80 tier's entries in the backend table (registry.cu).
#pragma once

#include <string>
#include <vector>

#include "fmha/fmha.h"

namespace fmha::cuda::sm80 {

Status supports(const Params& params, Direction direction);
Status run(const Params& params, Direction direction);
// The backward's workspace, or the decode kernel's split partials (common/decode.h).
Status workspace_size(const Params& params, Direction direction, size_t* bytes);
// Tuning: the variant names for a call, and the one it runs (src/cuda/common/variant.h). Calls on
// the decode kernel have its split-count variants (common/decode.h kSplitVariantNames), the
// others the forward's or the backward's configurations.
std::vector<std::string> variants(const Params& params, Direction direction);
Status variant_of(const Params& params, Direction direction, std::string* name);

}  // namespace fmha::cuda::sm80
