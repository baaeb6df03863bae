// Hopper's asynchronous data movement (sm_90): tensor-map (TMA) copies between global and shared
// memory, the mbarriers they complete on, named barriers and register reallocation. TMA and
// mbarrier go through CCCL's cuda::ptx; named barriers and setmaxnreg have no cuda::ptx form
// and are inline PTX.
//
// Tensor maps are encoded on the host (cuda/sm90/sm90_tma.h) and passed as __grid_constant__
// kernel parameters; a map's coordinates are innermost first ({column, row, head, batch} for a
// [batch, seqlen, heads, head_dim] tensor).
#pragma once

#include <cuda.h>
#include <cuda/ptx>

#include <cstdint>

#include "cuda/tile/pipeline.h"

namespace fmha::cuda::tile {

namespace ptx = ::cuda::ptx;

// ---- mbarrier --------------------------------------------------------------------------------

// A shared-memory mbarrier. Phases alternate; a waiter passes the parity of the phase it waits
// to see completed. A fresh barrier is in phase 0, so waiting on parity 1 returns at once: that is
// how a producer treats "empty" barriers as free before any consumer has released them.
struct alignas(8) MBarrier {
  uint64_t word;

  __device__ __forceinline__ void init(uint32_t arrivals) { ptx::mbarrier_init(&word, arrivals); }
  // One arrival that also announces `bytes` of TMA traffic completing on this barrier.
  __device__ __forceinline__ void arrive_expect_tx(uint32_t bytes) {
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &word, bytes);
  }
  __device__ __forceinline__ void arrive() { ptx::mbarrier_arrive(&word); }
  __device__ __forceinline__ void wait(uint32_t parity) {
    while (!ptx::mbarrier_try_wait_parity(&word, parity)) {
    }
  }
  // Whether the phase of `parity` has completed, without waiting (acquire, as wait).
  __device__ __forceinline__ bool test(uint32_t parity) { return ptx::mbarrier_test_wait_parity(&word, parity); }
};

// Makes barrier initialisation visible to the async proxy (TMA) before its first use.
__device__ __forceinline__ void fence_barrier_init() { ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster); }

// Ordinary shared-memory stores become visible to TMA and wgmma (the async proxy) after this,
// in each writing thread, followed by a barrier among the writers.
__device__ __forceinline__ void fence_async_shared() { ptx::fence_proxy_async(ptx::space_shared); }
// Orders global-memory accesses of the async proxy (bulk copies and reductions) with this thread's
// generic ones: after waiting for its bulk operations and before releasing what they wrote, and
// after acquiring what other threads' bulk operations wrote and before issuing its own.
__device__ __forceinline__ void fence_async_global() { ptx::fence_proxy_async(ptx::space_global); }

// ---- TMA ------------------------------------------------------------------------------------

namespace tma {

// Hints the tensor map into the cache before first use (one thread).
__device__ __forceinline__ void prefetch(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// A 4-D box from global into shared memory, completing on `bar` (one thread issues it).
__device__ __forceinline__ void load(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, MBarrier& bar) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, map, coords, &bar.word);
}

// `bytes` contiguous bytes from global into shared memory, completing on `bar` (one thread
// issues it). Both addresses 16-byte aligned, `bytes` a multiple of 16.
__device__ __forceinline__ void load_bytes(void* dst, const void* src, uint32_t bytes, MBarrier& bar) {
  ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst, src, bytes, &bar.word);
}

// A 4-D box from shared into global memory; elements outside the tensor are dropped.
__device__ __forceinline__ void store(const CUtensorMap* map, int c0, int c1, int c2, int c3, const void* src) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, map, coords, src);
}

// `bytes` contiguous fp32 values from shared memory added into global memory element by element
// (the reduction runs in the memory system, atomically per element; one thread issues it). Both
// addresses 16-byte aligned, `bytes` a multiple of 16. Completes with the stores' bulk group.
__device__ __forceinline__ void reduce_add_bytes(float* dst, const float* src, uint32_t bytes) {
  ptx::cp_reduce_async_bulk(ptx::space_global, ptx::space_shared, ptx::op_add, dst, src, bytes);
}

__device__ __forceinline__ void store_commit() { ptx::cp_async_bulk_commit_group(); }
// Waits until the committed stores have read their shared memory (it may then be reused).
__device__ __forceinline__ void store_wait_read() { ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{}); }
// Waits until the committed stores are complete in global memory.
__device__ __forceinline__ void store_wait() { ptx::cp_async_bulk_wait_group(ptx::n32_t<0>{}); }

}  // namespace tma

// ---- Named barriers and register reallocation -----------------------------------------------

// bar.sync / bar.arrive on barrier `id` (1..15; 0 is __syncthreads) among `threads` threads
// (a multiple of 32). Every thread of each participating warp executes it.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// The same with the barrier and the count as immediates (no register holds them).
template <int ID, int THREADS>
__device__ __forceinline__ void named_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(THREADS) : "memory");
}
template <int ID, int THREADS>
__device__ __forceinline__ void named_arrive() {
  asm volatile("bar.arrive %0, %1;" ::"n"(ID), "n"(THREADS) : "memory");
}

// setmaxnreg: a warpgroup gives back registers (dec) or takes them (inc, blocking until the pool
// has them). Takes effect only in a kernel with a register cap at entry (__launch_bounds__ with
// min blocks 1) and where each warpgroup's role is one branch.
template <int REGS>
__device__ __forceinline__ void registers_decrease() {
  static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg takes 24..256 in steps of 8");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}
template <int REGS>
__device__ __forceinline__ void registers_increase() {
  static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg takes 24..256 in steps of 8");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}

}  // namespace fmha::cuda::tile
