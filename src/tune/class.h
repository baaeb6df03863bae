// The problem class of a validated call on a given tier (include/fmha/tune.h, ProblemClass).
#pragma once

#include "fmha/fmha.h"
#include "fmha/tune.h"

namespace fmha::detail {

ProblemClass class_of(Backend tier, const Params& params, Direction direction);

}  // namespace fmha::detail
