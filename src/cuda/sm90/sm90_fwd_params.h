// The sm90 forward's kernel parameters: the tier-independent argument block plus what only this
// tier needs, TMA tensor maps (encoded on the host per call) and the tile scheduler. Passed as one
// __grid_constant__ parameter.
#pragma once

#include <cuda.h>

#include "cuda/common/args.h"
#include "cuda/sm90/sm90_tile_scheduler.cuh"

namespace fmha::cuda::sm90 {

struct FwdParams {
  CUtensorMap q;  // [B, Sq, H, D]: boxes of 64 columns × tile_m rows
  CUtensorMap k;  // [B, Sk, Hkv, D]: 64 × tile_n
  CUtensorMap v;  // [B, Sk, Hkv, Dv]: 64 × tile_n
  CUtensorMap o;  // [B, Sq, H, Dv]: 64 × 64 (one consumer warpgroup's rows)
  AttentionArgs args;
  TileScheduler scheduler;
  // Zeroed before the launch: work tiles past the first wave are taken from it in order, by
  // whichever block is free. Null: each block takes every grid-th tile.
  int* tile_counter;
};

}  // namespace fmha::cuda::sm90
