// The simt tier's tile configurations: the one place where tile sizes, pipeline depth, thread
// count and occupancy are chosen, from (direction, head dim). The simt tier stores fp32 only and
// uses the same shapes on every architecture; what changes with the GPU is only whether the
// shared memory fits (simt_dispatch.cu checks that against the device).
#pragma once

#include "fmha/fmha.h"

namespace fmha::cuda::simt {

inline constexpr int kThreads = 256;  // a 16 × 16 thread grid (tile::Grid16)
inline constexpr int kRowPad = 1;     // fp32 words of padding per shared row: odd strides avoid bank conflicts

struct TileConfig {
  int tile_m;      // query rows per block
  int tile_n;      // keys per tile
  int stages;      // K/V tiles in flight (forward)
  int min_blocks;  // blocks per SM the register allocation must allow
};

// head_dim is the compiled head-dim bucket (32, 64, 96, 128, 192, 256).
constexpr TileConfig tile_config(Direction direction, int head_dim) {
  if (direction == Direction::forward) {
    if (head_dim <= 64) return {64, 64, 2, 2};
    if (head_dim <= 96) return {64, 64, 2, 1};
    if (head_dim <= 128) return {64, 32, 2, 1};
    if (head_dim <= 192) return {32, 32, 2, 1};
    return {32, 32, 1, 1};
  }
  if (head_dim <= 96) return {64, 64, 1, 1};
  if (head_dim <= 128) return {32, 64, 1, 1};
  return {32, 32, 1, 1};
}

}  // namespace fmha::cuda::simt
