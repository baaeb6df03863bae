// The sm80 tier's tile configurations, chosen in one place from (direction, storage dtype, head
// dim). sm_80 offers 163 KiB of shared memory per block and sm_90 227 KiB; the shapes below fit
// the smaller, so one set serves both.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fmha/fmha.h"

namespace fmha::cuda::sm80 {

// Storage types of the tier's instantiations: fp32 storage runs on tf32 tensor cores.
using fp16_t = __half;
using bf16_t = __nv_bfloat16;
using tf32_t = float;

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kRowsPerWarp = 16;  // one m16 mma row block per warp
inline constexpr int kSmemRowPadBytes = 16;  // staggers rows across banks and keeps 16-byte alignment

struct TileConfig {
  int tile_m;      // query rows per block (kWarps · 16)
  int tile_n;      // keys per tile
  int stages;      // K/V tiles in flight
  int min_blocks;  // blocks per SM the register allocation must allow
};

constexpr TileConfig tile_config(Direction, int element_bytes, int head_dim) {
  const int m = kWarps * kRowsPerWarp;
  if (element_bytes == 2) {
    if (head_dim <= 64) return {m, 64, 2, 2};
    if (head_dim <= 192) return {m, 64, 2, 1};
    return {m, 32, 2, 1};
  }
  if (head_dim <= 64) return {m, 64, 2, 2};
  if (head_dim <= 192) return {m, 32, 2, 1};
  return {m, 32, 1, 1};
}

}  // namespace fmha::cuda::sm80
