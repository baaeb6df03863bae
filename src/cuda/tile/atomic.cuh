// Global-memory fp32 accumulation for the backward's dQ: adds a pair of adjacent columns, the two
// values an mma C fragment holds per row on one lane (columns 2t, 2t + 1), or a quad, the four
// consecutive columns of a SIMT micro-tile thread. And turns: a counter in global memory that
// orders the blocks adding into the same place, so that fp32 sums come out the same every run.
#pragma once

#include <cuda_runtime.h>

#include <cuda/atomic>

namespace fmha::cuda::tile {

inline constexpr unsigned kTurnBackoffNs = 64;  // sleep between polls of a turn counter

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

// Waits (one thread) until *turn == mine. Acquire: what the holders of earlier turns wrote before
// passing the turn on is visible afterwards. Only blocks launched earlier may hold earlier turns,
// so the wait ends (blocks start in launch order).
__device__ __forceinline__ void wait_turn(int* turn, int mine) {
  ::cuda::atomic_ref<int, ::cuda::thread_scope_device> counter(*turn);
  while (counter.load(::cuda::memory_order_acquire) != mine) __nanosleep(kTurnBackoffNs);
}

// Passes the turn on to `next` (one thread, once the writes the turn covers are complete and
// ordered before it: the caller's own, or other threads' through a barrier, or bulk async
// reductions waited for and fenced to the generic proxy). The release store alone orders them
// before the next holder's acquire (release is cumulative); a sequentially consistent fence
// (__threadfence) before it added nothing but its cost: up to 4 % of the sm90 deterministic
// backward's time at head dim 256 (docs/PERF.md, runs 67-70).
__device__ __forceinline__ void pass_turn(int* turn, int next) {
  ::cuda::atomic_ref<int, ::cuda::thread_scope_device> counter(*turn);
  counter.store(next, ::cuda::memory_order_release);
}

}  // namespace fmha::cuda::tile
