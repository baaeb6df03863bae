// The simt tier's entries in the backend table (registry.cu).
#pragma once

#include "fmha/fmha.h"

namespace fmha::cuda::simt {

Status supports(const Params& params, Direction direction);
Status run(const Params& params, Direction direction);

}  // namespace fmha::cuda::simt
