// The sm90 backward's main kernel: warp-specialised, one block per (key tile, KV head, batch).
// Warpgroup 0 is the producer: one of its threads loads the block's K and V tiles once (TMA),
// then, for every query tile that sees those keys (every head of the GQA group), Q and dO by TMA
// and the tile's LSE and Δ rows by bulk copies, into a kBwdStages-deep ring; the warpgroup gives
// its registers back; another of its warps, the dQ warp, adds each step's dQ tile, staged by the
// consumers, into the global accumulator by a bulk reduction. Warpgroups 1-2 are consumers of 64
// keys each (sm90_bwd_mainloop.cuh); dK and dV stay in their registers until the epilogue writes
// them. Between the shared preprocess (Δ, LSE in the exp2 domain, dQ accumulator zeroed) and
// convert kernels (cuda/common).
#pragma once

#include "cuda/sm90/sm90_bwd_mainloop.cuh"
#include "cuda/sm90/sm90_bwd_params.h"

namespace fmha::cuda::sm90 {

template <class T, int HD, bool ORDERED_DQ>
struct BwdKernel {
  using Mainloop = BwdMainloop<T, HD, ORDERED_DQ>;
  using Shared = typename Mainloop::Shared;
  using Tiles = typename Mainloop::Tiles;
  static constexpr int kThreads = (kBwdConsumers + 1) * kWarpgroupThreads;
  static constexpr size_t kSharedBytes = sizeof(Shared) + wg::kSwizzleAtomBytes;
  static_assert(kSharedBytes <= kSharedLimit, "the backward's tiles exceed Hopper's shared memory");
  static_assert(padded_head_dim(HD) <= kBwdMaxHeadDim, "dK and dV of larger head dims do not fit the registers");

  __device__ static void produce(const BwdParams& params, Shared& shared) {
    const AttentionArgs& args = params.args;
    const int kv_head = int(blockIdx.y), batch = int(blockIdx.z);
    const Range keys = bwd_key_tile(args, int(blockIdx.x));
    const Range tiles = bwd_query_tiles(args, keys);
    // One tile of `rows` rows into `dst` (its column chunks), completing on `full`.
    auto load_tile = [&](T* dst, const CUtensorMap* map, int rows, int64_t row0, int head, tile::MBarrier& full) {
#pragma unroll
      for (int c = 0; c < Shared::kChunks; ++c)
        tile::tma::load(dst + c * rows * kChunkCols, map, c * kChunkCols, int(row0), head, batch, full);
    };
    tile::tma::prefetch(&params.q);
    tile::tma::prefetch(&params.dout);
    shared.kv_full.arrive_expect_tx(2 * Shared::kKVBytes);
    load_tile(shared.k, &params.k, kBwdKeys, keys.begin, kv_head, shared.kv_full);
    load_tile(shared.v, &params.v, kBwdKeys, keys.begin, kv_head, shared.kv_full);
    // Q, dO and the rows' LSE and Δ (padded to whole tiles by the preprocess) per query tile.
    tile::PipelineState<kBwdStages> pipe;
    for (int g = 0; g < args.group; ++g) {
      const int head = kv_head * args.group + g;
      for (int m = int(tiles.begin); m < int(tiles.end); ++m) {
        const int64_t row0 = int64_t(m) * kBwdRows;
        const int64_t stat = args.stat_index(batch, head, row0);
        tile::MBarrier& full = shared.full[pipe.index];
        shared.empty[pipe.index].wait(pipe.phase ^ 1);
        full.arrive_expect_tx(2 * Shared::kRowBytes + 2 * Shared::kStatBytes);
        load_tile(shared.q[pipe.index], &params.q, kBwdRows, row0, head, full);
        load_tile(shared.dout[pipe.index], &params.dout, kBwdRows, row0, head, full);
        tile::tma::load_bytes(shared.lse[pipe.index], args.lse_log2 + stat, Shared::kStatBytes, full);
        tile::tma::load_bytes(shared.delta[pipe.index], args.delta + stat, Shared::kStatBytes, full);
        pipe.advance();
      }
    }
  }

  // The dQ warp: per step (the consumers' order), once both warpgroups have staged their shares,
  // one bulk reduction of the tile's rows (those before seqlen_q), which are one contiguous run of
  // the accumulator; the buffer is handed back once the reduction has read it. Deterministic: the
  // reduction waits for the tile's turn, and the turn passes on once the reduction is complete in
  // global memory.
  static constexpr int kDqWarp = 1;  // warp of the producer warpgroup
  __device__ static void reduce_dq(const BwdParams& params, Shared& shared, int lane) {
    const AttentionArgs& args = params.args;
    const int kv_head = int(blockIdx.y), batch = int(blockIdx.z);
    const Range tiles = bwd_query_tiles(args, bwd_key_tile(args, int(blockIdx.x)));
    // The padding columns are never written by the consumers: zero, so that they add nothing.
    for (int r = lane; r < kBwdRows; r += 32)
      for (int c = Shared::kHeadDimPadded; c < Shared::kDqStride; ++c) shared.dq[r * Shared::kDqStride + c] = 0.f;
    tile::fence_async_shared();
    __syncwarp();
    int step = 0;
    for (int g = 0; g < args.group; ++g) {
      const int head = kv_head * args.group + g;
      for (int m = int(tiles.begin); m < int(tiles.end); ++m, ++step) {
        shared.dq_full.wait(step & 1);
        if (lane == 0) {
          // Deterministic: the tile's turn counter (recomputed where needed: few registers here).
          auto turn_counter = [&] {
            return args.dq_turns + (int64_t(batch) * args.heads + head) * args.dq_turn_tiles + m;
          };
          const int turn = ORDERED_DQ ? shared.dq_turn : 0;  // read before the buffer is handed back
          if constexpr (ORDERED_DQ) {
            tile::wait_turn(turn_counter(), turn);
            tile::fence_async_global();
          }
          const int64_t row0 = int64_t(m) * kBwdRows;
          const int rows = int(args.seqlen_q - row0 < kBwdRows ? args.seqlen_q - row0 : kBwdRows);
          tile::tma::reduce_add_bytes(args.dq_accum + args.row_index(batch, head, row0) * Shared::kDqStride, shared.dq,
                                      uint32_t(rows) * Shared::kDqStride * sizeof(float));
          tile::tma::store_commit();
          tile::tma::store_wait_read();
          shared.dq_empty.arrive();
          if constexpr (ORDERED_DQ) {
            tile::tma::store_wait();
            tile::fence_async_global();
            tile::pass_turn(turn_counter(), turn + 1);
          }
        }
        __syncwarp();
      }
    }
    if (lane == 0) tile::tma::store_wait();
  }

  __device__ static void consume(const BwdParams& params, Shared& shared, int warpgroup, int thread) {
    const AttentionArgs& args = params.args;
    const int kv_head = int(blockIdx.y), batch = int(blockIdx.z);
    const Range keys = bwd_key_tile(args, int(blockIdx.x));
    const Range tiles = bwd_query_tiles(args, keys);
    Mainloop mainloop{shared, args, warpgroup, thread};
    typename Tiles::KeyGrad dk, dv;
    dk.fill(0.f);
    dv.fill(0.f);
    shared.kv_full.wait(0);
    tile::PipelineState<kBwdStages> pipe;
    int step = 0;
    for (int g = 0; g < args.group; ++g)  // every head of the GQA group: the same query tiles
      for (int m = int(tiles.begin); m < int(tiles.end); ++m, ++step) {
        mainloop.step(pipe, m, keys, step % 2, dk, dv);
        pipe.advance();
      }
    store_key_grads(args, warpgroup, thread, kv_head, batch, keys, dk, dv);
  }

  // dK = scale · acc and dV in the storage type, rows past seqlen_k and columns past the head
  // dims dropped. Once per block: plain stores from registers.
  __device__ static void store_key_grads(const AttentionArgs& args, int warpgroup, int thread, int kv_head, int batch,
                                         Range keys, const typename Tiles::KeyGrad& dk,
                                         const typename Tiles::KeyGrad& dv) {
    using G = typename Tiles::KeyGrad;
#pragma unroll
    for (int i = 0; i < G::kRows; ++i) {
      const int64_t key = keys.begin + int64_t(warpgroup) * kConsumerRows + G::row(i, thread);
      if (key >= keys.end) continue;
      T* dk_row = args.dk.at<T>(batch, key, kv_head);
      T* dv_row = args.dv.at<T>(batch, key, kv_head);
#pragma unroll
      for (int j = 0; j < G::kCols; ++j) {
        const int col = G::col(j, thread);
        if (col < args.head_dim) dk_row[col] = tile::from_float<T>(dk(i, j) * args.scale);
        if (col < args.head_dim_v) dv_row[col] = tile::from_float<T>(dv(i, j));
      }
    }
  }
};

template <class T, int HD, bool ORDERED_DQ>
__global__ void __launch_bounds__(BwdKernel<T, HD, ORDERED_DQ>::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using K = BwdKernel<T, HD, ORDERED_DQ>;
  extern __shared__ char shared_raw[];
  const uintptr_t base = reinterpret_cast<uintptr_t>(shared_raw);
  auto& shared = *reinterpret_cast<typename K::Shared*>((base + wg::kSwizzleAtomBytes - 1) / wg::kSwizzleAtomBytes *
                                                        wg::kSwizzleAtomBytes);
  const int warpgroup = int(threadIdx.x) / wg::kThreads;
  const int thread = int(threadIdx.x) % wg::kThreads;
  if (threadIdx.x == 0) {
    shared.kv_full.init(1);
    for (int s = 0; s < kBwdStages; ++s) {
      shared.full[s].init(1);
      shared.empty[s].init(kBwdConsumers * K::Mainloop::kConsumerWarps);
    }
    shared.dq_full.init(K::Mainloop::kDqWriters);
    shared.dq_empty.init(1);
    tile::fence_barrier_init();
  }
  __syncthreads();
  if (warpgroup == 0) {
    tile::registers_decrease<kBwdProducerRegisters>();
    if (thread == 0) K::produce(params, shared);
    else if (thread / 32 == K::kDqWarp) K::reduce_dq(params, shared, thread % 32);
  } else {
    tile::registers_increase<kBwdConsumerRegisters>();
    K::consume(params, shared, warpgroup - 1, thread);
  }
#endif
}

}  // namespace fmha::cuda::sm90
