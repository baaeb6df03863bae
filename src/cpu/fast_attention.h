// The fast CPU backend (`cpu`): tiled online softmax, forward and backward, every option.
#pragma once

#include <string>
#include <vector>

#include "fmha/fmha.h"

namespace fmha::cpu {

// Largest head_dim / head_dim_v the CPU backend's per-thread tiles are sized for.
inline constexpr int64_t kMaxHeadDim = 1024;

Status supports(const Params& params, Direction direction);
Status run(const Params& params, Direction direction);
// Tuning: the block-size variants (src/cpu/cpu_config.h), and the one a call runs.
std::vector<std::string> variants(const Params& params, Direction direction);
Status variant_of(const Params& params, Direction direction, std::string* name);

}  // namespace fmha::cpu
