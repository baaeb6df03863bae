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
// What variant_of names for a call on the decode kernel, which has no variants to tune.
inline constexpr const char* kDecodeVariantName = "decode";
// Tuning: the variant names for a direction, and the one a call runs (src/cuda/common/variant.h).
std::vector<std::string> variants(Direction direction);
Status variant_of(const Params& params, Direction direction, std::string* name);

}  // namespace fmha::cuda::sm80
