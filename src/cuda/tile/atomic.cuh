// Global-memory fp32 accumulation for the backward's dQ: adds a pair of adjacent columns, the two
// values an mma C fragment holds per row on one lane (columns 2t, 2t + 1).
#pragma once

#include <cstdint>

namespace fmha::cuda::tile {

// p[0] += x and, where `in_range` > 1, p[1] += y. On sm_90 an 8-byte-aligned full pair is one
// vector atomic (half the L2 atomic operations of two scalar ones); elsewhere two scalar atomics.
__device__ __forceinline__ void atomic_add_pair(float* p, float x, float y, int in_range) {
  if (in_range <= 0) return;
#if __CUDA_ARCH__ >= 900
  if (in_range >= 2 && (reinterpret_cast<uintptr_t>(p) & (sizeof(float2) - 1)) == 0) {
    atomicAdd(reinterpret_cast<float2*>(p), float2{x, y});
    return;
  }
#endif
  atomicAdd(p, x);
  if (in_range >= 2) atomicAdd(p + 1, y);
}

}  // namespace fmha::cuda::tile
