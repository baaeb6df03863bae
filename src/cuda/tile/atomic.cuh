// Global-memory fp32 accumulation for the backward's dQ: adds a pair of adjacent columns, the two
// values an mma C fragment holds per row on one lane (columns 2t, 2t + 1), or a quad, the four
// consecutive columns of a SIMT micro-tile thread.
#pragma once

#include <cuda_runtime.h>

namespace fmha::cuda::tile {

// p[0] += x, p[1] += y, with p 8-byte aligned (both columns in range). On sm_90 one vector atomic
// (half the L2 atomic operations of two scalar ones); elsewhere two scalar atomics.
__device__ __forceinline__ void atomic_add_pair(float* p, float x, float y) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), float2{x, y});
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

// p[0, 4) += v, with p 16-byte aligned (all four columns in range). On sm_90 one vector atomic
// (a quarter of the L2 atomic operations of four scalar ones); elsewhere two pairs' worth of
// scalar atomics.
__device__ __forceinline__ void atomic_add_quad(float* p, float4 v) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), v);
#else
  atomicAdd(p, v.x);
  atomicAdd(p + 1, v.y);
  atomicAdd(p + 2, v.z);
  atomicAdd(p + 3, v.w);
#endif
}

}  // namespace fmha::cuda::tile
