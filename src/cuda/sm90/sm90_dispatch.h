// The sm90 tier's entries in the backend table (registry.cu).
#pragma once

#include "fmha/fmha.h"

namespace fmha::cuda::sm90 {

Status supports(const Params& params, Direction direction);
Status run(const Params& params, Direction direction);

}  // namespace fmha::cuda::sm90
