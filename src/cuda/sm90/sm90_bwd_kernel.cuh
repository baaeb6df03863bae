// The sm90 backward's main kernel: warp-specialised, one block per (key tile, KV head, batch).
// Warpgroup 0 is the producer: one of its threads loads the block's K and V tiles once (TMA),
// then, for every query tile that sees those keys (every head of the GQA group), Q and dO by TMA
// and the tile's LSE and Δ rows by bulk copies, into a ring of BwdConfig::stages; the warpgroup
// gives its registers back; another of its warps, the dQ warp, adds each step's dQ tile, staged by
// the consumers, into the global accumulator by a bulk reduction. Warpgroups 1-2 are consumers of
// 64 keys each (sm90_bwd_mainloop.cuh); dK and dV stay in their registers until the epilogue
// writes them. At head dims 192 and 256 a block has 64 keys and the two warpgroups split the query
// columns of the scores and the head-dim columns of dK, dV and dQ instead (BwdConfig); with fp32
// storage (tf32) at head dim 64 the consumers also make the transposed operands tf32 wgmma needs,
// and at 96 and 128 they split a 64-key block that way and take those operands as register A
// fragments loaded transposed from the landed tiles (sm90_bwd_mainloop.cuh); split tf32 (head dim
// 64) runs that shape with every product as three tf32 ones and its P from the rows' own
// statistics, which its statistics kernel finds first (sm90_bwd_stats.cuh). In the deterministic
// kernels the dQ warps also find each query tile's turn. Between the shared preprocess (Δ, LSE in the exp2 domain, dQ accumulator zeroed) and
// convert kernels (cuda/common).
//
// PACKED: a variable-length call, a kernel of its own. Block (n, kv head, b) takes key tile n of
// sequence b (read once from the tables into shared memory, clamped, args.h sequence()); the
// blocks past the sequence's keys exit at once. Tiles load from the packed tensors as [1, total,
// H, D] at the sequence's first rows; query rows past the sequence's end (the next sequence's)
// get LSE = +inf and Δ = 0, so that P = dS = 0 there as on a dense call's zero-filled rows. The
// row statistics are read with plain loads bounded by the sequence (a tile's run of them starts
// anywhere, not on the 16 bytes a bulk copy needs), by the producer's whole warp; dQ, dK and dV
// are written for the sequence's rows only.
#pragma once

#include <cmath>

#include "cuda/sm90/sm90_bwd_mainloop.cuh"
#include "cuda/sm90/sm90_bwd_params.h"

namespace fmha::cuda::sm90 {

template <class T, int HD, bool ORDERED_DQ, bool PACKED>
struct BwdKernel {
  using Mainloop = BwdMainloop<T, HD, ORDERED_DQ, PACKED>;
  using Shared = typename Mainloop::Shared;
  using Tiles = typename Mainloop::Tiles;
  static constexpr BwdConfig kConfig = Shared::kConfig;
  static constexpr int kKeys = kConfig.keys;
  static constexpr int kRows = kConfig.rows;  // query rows per step
  static constexpr int kStages = kConfig.stages;
  // Split: the head-dim columns of consumer warpgroups 0 and 1.
  static constexpr int kSplitCols[kBwdConsumers] = {bwd_split_cols(HD, 0), bwd_split_cols(HD, 1)};
  static constexpr int kThreads = (kBwdConsumers + 1) * kWarpgroupThreads;
  // Packed and deterministic kernels: the wider producer split (sm90_config.h).
  static constexpr int kProducerRegisters = bwd_producer_registers(PACKED || ORDERED_DQ);
  static constexpr int kConsumerRegisters = bwd_consumer_registers(PACKED || ORDERED_DQ);
  static_assert(kProducerRegisters * kWarpgroupThreads + kConsumerRegisters * kBwdConsumers * kWarpgroupThreads <=
                    register_pool(kThreads),
                "the register split exceeds the block's pool: setmaxnreg.inc would wait forever");
  static constexpr size_t kSharedBytes = sizeof(Shared) + wg::kSwizzleAtomBytes;
  static_assert(kSharedBytes <= kSharedLimit, "the backward's tiles exceed Hopper's shared memory");
  static_assert(padded_head_dim(HD) <= kBwdMaxHeadDim, "dK and dV of larger head dims do not fit the registers");

  // The block's key tile, KV head and batch, functions of the block index and the parameters alone
  // (so that the compiler may recompute them wherever that is cheaper than keeping them live):
  // the default kernel's 3-D grid is (key tile, KV head, batch); the deterministic kernel's is
  // 1-D in the order of params.order, its key tiles from the last. One field a call: the default
  // kernel then reads just that index, where it is used.
  __device__ __forceinline__ static int block_key_tile(const BwdParams& params) {
    if constexpr (ORDERED_DQ) return params.order.template get<true>(int(blockIdx.x)).key_tile;
    else return int(blockIdx.x);
  }
  __device__ __forceinline__ static int block_kv_head(const BwdParams& params) {
    if constexpr (ORDERED_DQ) return params.order.template get<true>(int(blockIdx.x)).kv_head;
    else return int(blockIdx.y);
  }
  __device__ __forceinline__ static int block_batch(const BwdParams& params) {
    if constexpr (ORDERED_DQ) return params.order.template get<true>(int(blockIdx.x)).batch;
    else return int(blockIdx.z);
  }
  // The block's mask and where its sequence's rows start (dense: the call's mask and the batch
  // index).
  __device__ __forceinline__ static const Mask& block_mask(const AttentionArgs& args, const Shared& shared) {
    if constexpr (PACKED) return shared.sequence.mask;
    else return args.mask;
  }
  __device__ __forceinline__ static SequenceStart block_start(const BwdParams& params, const Shared& shared) {
    if constexpr (PACKED) return shared.sequence.start;
    else return {int64_t(block_batch(params)), int64_t(block_batch(params))};
  }

  // Run by one thread (dense) or by the producer's first warp (packed: lane 0 issues the copies,
  // every lane loads row statistics).
  __device__ static void produce(const BwdParams& params, Shared& shared, int lane) {
    const AttentionArgs& args = params.args;
    const Mask& mask = block_mask(args, shared);
    const int kv_head = block_kv_head(params);
    const Range keys = bwd_key_tile<kKeys>(mask, block_key_tile(params));
    const Range tiles = bwd_query_tiles<kRows>(mask, keys);
    // TMA coordinates: dense (row, batch) of [B, S, H, D]; packed (first row + row, 0) of the
    // packed tensors as [1, total, H, D]. The sequence's first rows are read from shared memory
    // where used (the producer has few registers).
    const int batch = PACKED ? 0 : block_batch(params);
    // One tile of `rows` rows into `dst` (its column chunks), completing on `full`.
    auto load_tile = [&](T* dst, const CUtensorMap* map, int rows, int64_t row0, int head, tile::MBarrier& full) {
#pragma unroll
      for (int c = 0; c < Shared::kChunks; ++c)
        tile::tma::load(dst + c * rows * Shared::kChunkCols, map, c * Shared::kChunkCols, int(row0), head, batch,
                        full);
    };
    if (lane == 0) {
      tile::tma::prefetch(&params.q);
      tile::tma::prefetch(&params.dout);
      shared.kv_full.arrive_expect_tx(2 * Shared::kKVBytes);
      const int64_t k_row0 = PACKED ? block_start(params, shared).k : 0;
      load_tile(shared.k, &params.k, kKeys, k_row0 + keys.begin, kv_head, shared.kv_full);
      load_tile(shared.v, &params.v, kKeys, k_row0 + keys.begin, kv_head, shared.kv_full);
    }
    // Q, dO and the rows' LSE and Δ (padded to whole tiles by the preprocess) per query tile.
    tile::PipelineState<kStages> pipe;
    for (int g = 0; g < args.group; ++g) {
      const int head = kv_head * args.group + g;
      for (int m = int(tiles.begin); m < int(tiles.end); ++m) {
        const int64_t row0 = int64_t(m) * kRows;
        tile::MBarrier& full = shared.full[pipe.index];
        shared.empty[pipe.index].wait(pipe.phase ^ 1);
        if constexpr (PACKED) {
          // Rows past the sequence's end: LSE = +inf and Δ = 0 (P = dS = 0), as the preprocess
          // pads a dense call's.
          for (int r = lane; r < kRows; r += 32) {
            const bool inside = row0 + r < mask.seqlen_q;
            const int64_t stat = args.stat_index(block_start(params, shared).q, head, row0 + r);
            if constexpr (Shared::kSplitTf32) {  // the row's own max and 1/sum
              shared.lse[pipe.index][r] = inside ? args.row_max[stat] : INFINITY;
              shared.residual.inv_sum[pipe.index][r] = inside ? args.row_inv_sum[stat] : 0.f;
            } else {
              shared.lse[pipe.index][r] = inside ? args.lse_log2[stat] : INFINITY;
            }
            shared.delta[pipe.index][r] = inside ? args.delta[stat] : 0.f;
          }
          __threadfence_block();
          __syncwarp();  // the lanes' statistics come before lane 0's arrival (release)
          if (lane == 0) {
            const int64_t q_row = block_start(params, shared).q + row0;
            full.arrive_expect_tx(2 * Shared::kRowBytes);
            load_tile(shared.q[pipe.index], &params.q, kRows, q_row, head, full);
            load_tile(shared.dout[pipe.index], &params.dout, kRows, q_row, head, full);
          }
        } else {
          const int64_t stat = args.stat_index(block_start(params, shared).q, head, row0);
          constexpr int kStats = Shared::kSplitTf32 ? 3 : 2;  // split: the row's own max and 1/sum for LSE
          full.arrive_expect_tx(2 * Shared::kRowBytes + kStats * Shared::kStatBytes);
          load_tile(shared.q[pipe.index], &params.q, kRows, row0, head, full);
          load_tile(shared.dout[pipe.index], &params.dout, kRows, row0, head, full);
          tile::tma::load_bytes(shared.lse[pipe.index], (Shared::kSplitTf32 ? args.row_max : args.lse_log2) + stat,
                                Shared::kStatBytes, full);
          tile::tma::load_bytes(shared.delta[pipe.index], args.delta + stat, Shared::kStatBytes, full);
          if constexpr (Shared::kSplitTf32)
            tile::tma::load_bytes(shared.residual.inv_sum[pipe.index], args.row_inv_sum + stat, Shared::kStatBytes,
                                  full);
        }
        pipe.advance();
      }
    }
  }

  // The dQ warps (Mainloop::kDqWarps; dQ warp w takes the steps s with s % kDqWarps == w): per
  // step (the consumers' order), once both warpgroups have staged their shares, one bulk
  // reduction of the tile's rows (those before seqlen_q), which are one contiguous run of the
  // accumulator; the buffer is handed back once the reduction has read it. Deterministic: the
  // reduction waits for the tile's turn, and the turn passes on once the reduction is complete in
  // global memory (meanwhile the other dQ warp takes the next step).
  static constexpr int kFirstDqWarp = 1;  // warps kFirstDqWarp.. of the producer warpgroup
  static constexpr int kDqWarps = Mainloop::kDqWarps;
  static_assert(kFirstDqWarp + kDqWarps <= wg::kThreads / 32, "the dQ warps are the producer warpgroup's");
  template <int DQ_WARP>
  __device__ static void reduce_dq(const BwdParams& params, Shared& shared, int lane) {
    const AttentionArgs& args = params.args;
    const Mask& mask = block_mask(args, shared);
    const int kv_head = block_kv_head(params), batch = block_batch(params);
    const Range tiles = bwd_query_tiles<kRows>(mask, bwd_key_tile<kKeys>(mask, block_key_tile(params)));
    // The padding columns are never written by the consumers: zero, so that they add nothing.
    if constexpr (DQ_WARP == 0) {
      for (int r = lane; r < kRows; r += 32)
        for (int c = Shared::kHeadDimPadded; c < Shared::kDqStride; ++c) shared.dq[r * Shared::kDqStride + c] = 0.f;
      tile::fence_async_shared();
    }
    __syncwarp();
    int step = 0;
    for (int g = 0; g < args.group; ++g) {
      const int head = kv_head * args.group + g;
      for (int m = int(tiles.begin); m < int(tiles.end); ++m, ++step) {
        if (step % kDqWarps != DQ_WARP) continue;
        // Deterministic: the tile's turn (the binary search of bwd_turn), found while the
        // consumers still compute the step; here rather than in the consumers, whose 232
        // registers it crowded (-Xptxas -v: local memory at head dims 96 and 128).
        int turn = 0;
        if constexpr (ORDERED_DQ) turn = bwd_turn<kKeys, kRows>(mask, m, block_key_tile(params));
        shared.dq_full[DQ_WARP].wait((step / kDqWarps) & 1);
        if (lane == 0) {
          // Deterministic: the tile's turn counter (recomputed where needed: few registers here).
          auto turn_counter = [&] {
            return args.dq_turns + (int64_t(batch) * args.heads + head) * args.dq_turn_tiles + m;
          };
          if constexpr (ORDERED_DQ) {
            tile::wait_turn(turn_counter(), turn);
            tile::fence_async_global();
          }
          const int64_t row0 = int64_t(m) * kRows;
          const int rows = int(mask.seqlen_q - row0 < kRows ? mask.seqlen_q - row0 : kRows);
          const int64_t first = args.row_index(block_start(params, shared).q, head, row0);
          tile::tma::reduce_add_bytes(args.dq_accum + first * Shared::kDqStride, shared.dq,
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
    const Mask& mask = block_mask(args, shared);
    const Range keys = bwd_key_tile<kKeys>(mask, block_key_tile(params));
    const Range tiles = bwd_query_tiles<kRows>(mask, keys);
    Mainloop mainloop{shared, args, warpgroup, thread};
    if constexpr (PACKED) mainloop.find_visible(keys);
    if constexpr (Mainloop::kSplitTf32) {
      consume_split_tf32(mainloop, params, shared, keys, tiles);
    } else if constexpr (Mainloop::kWideTf32) {
      consume_wide_tf32(mainloop, params, shared, keys, tiles);
    } else if constexpr (kConfig.split_head_dim) {
      // Each warpgroup's share of the columns is a compile-time width (one code path when the
      // shares are equal).
      if constexpr (kSplitCols[0] == kSplitCols[1])
        consume_split<kSplitCols[0]>(mainloop, params, shared, keys, tiles);
      else if (warpgroup == 0) consume_split<kSplitCols[0]>(mainloop, params, shared, keys, tiles);
      else consume_split<kSplitCols[1]>(mainloop, params, shared, keys, tiles);
    } else {
      consume_keys(mainloop, params, shared, keys, tiles);
    }
  }

  // Up to 128: this warpgroup's 64 keys, dK and dV [64, HDP] fp32 in its registers.
  __device__ __forceinline__ static void consume_keys(Mainloop& mainloop, const BwdParams& params, Shared& shared,
                                                      Range keys, Range tiles) {
    const AttentionArgs& args = params.args;
    const int warpgroup = mainloop.warpgroup, thread = mainloop.thread;
    const int kv_head = block_kv_head(params);
    typename Tiles::KeyGrad dk, dv;
    dk.fill(0.f);
    dv.fill(0.f);
    shared.kv_full.wait(0);
    if constexpr (Mainloop::kTf32) mainloop.prepare_keys();
    tile::PipelineState<kStages> pipe;
    int step = 0;
    // Every head of the GQA group (at least one) walks the same query tiles. A do-while: as a for
    // loop, its condition was kept in local memory in the deterministic kernels at head dims 96
    // and 128 (-Xptxas -v: 4 bytes at 232 registers).
    int heads_left = args.group;
    do {
      for (int m = int(tiles.begin); m < int(tiles.end); ++m, ++step) {
        mainloop.step(pipe, m, keys, step % 2, dk, dv);
        pipe.advance();
      }
    } while (--heads_left > 0);
    if (params.vector_key_grads) {
      stage_key_grads(shared, dk, dv, warpgroup * kConsumerRows, 0, args.scale, thread);
      write_key_grads(args, shared, kv_head, block_start(params, shared).k, keys);
    } else {
      store_key_grads(args, warpgroup, thread, kv_head, block_start(params, shared).k, keys, dk, dv);
    }
  }

  // Split: this warpgroup's COLS columns of dK and dV ([64 keys, COLS] fp32 each), from column
  // col0 (warpgroup 0's share first).
  template <int COLS>
  __device__ __forceinline__ static void consume_split(Mainloop& mainloop, const BwdParams& params, Shared& shared,
                                                       Range keys, Range tiles) {
    const AttentionArgs& args = params.args;
    const int warpgroup = mainloop.warpgroup, thread = mainloop.thread;
    const int col0 = warpgroup == 0 ? 0 : kSplitCols[0];
    wg::Accumulator<COLS> dk, dv;
    dk.fill(0.f);
    dv.fill(0.f);
    shared.kv_full.wait(0);
    tile::PipelineState<kStages> pipe;
    int step = 0;
    for (int g = 0; g < args.group; ++g)
      for (int m = int(tiles.begin); m < int(tiles.end); ++m, ++step) {
        mainloop.template step_split<COLS>(pipe, m, keys, step % 2, col0, dk, dv);
        pipe.advance();
      }
    // dK = scale · acc and dV in the storage type, rows past seqlen_k and columns past the head
    // dims dropped.
    const int64_t start = block_start(params, shared).k;
    const int kv_head = block_kv_head(params);
    if (params.vector_key_grads) {
      stage_key_grads(shared, dk, dv, 0, col0, args.scale, thread);
      write_key_grads(args, shared, kv_head, start, keys);
      return;
    }
    using G = wg::Accumulator<COLS>;
#pragma unroll
    for (int i = 0; i < G::kRows; ++i) {
      const int64_t key = keys.begin + G::row(i, thread);
      if (key >= keys.end) continue;
      T* dk_row = args.dk.at<T>(start, key, kv_head);
      T* dv_row = args.dv.at<T>(start, key, kv_head);
#pragma unroll
      for (int j = 0; j < G::kCols; j += 2) {
        const int col = col0 + G::col(j, thread);
        store_pair(dk_row, col, args.head_dim, dk(i, j) * args.scale, dk(i, j + 1) * args.scale);
        store_pair(dv_row, col, args.head_dim_v, dv(i, j), dv(i, j + 1));
      }
    }
  }

  // Every query tile of every head of the GQA group (at least one), in the producer's order:
  // step(pipe, m, parity), the parity alternating per step (the dQ hand-off). A do-while, as
  // consume_keys.
  template <class Step>
  __device__ __forceinline__ static void each_step(const AttentionArgs& args, Range tiles, Step&& step) {
    tile::PipelineState<kStages> pipe;
    int n = 0;
    int heads_left = args.group;
    do {
      for (int m = int(tiles.begin); m < int(tiles.end); ++m, ++n) {
        step(pipe, m, n % 2);
        pipe.advance();
      }
    } while (--heads_left > 0);
  }

  // A transposed key gradient [64 head-dim rows from d0, 64 keys] fp32 into `out` (fp32 storage)
  // times `scale`, one element a store; keys past the block's and rows past head_dim dropped (the
  // split backward's; the wide one stores its dK and dV together).
  __device__ __forceinline__ static void store_transposed_key_grad(const View4& out, const BwdParams& params,
                                                                   Shared& shared, Range keys, int d0,
                                                                   int64_t head_dim, float scale,
                                                                   const typename Mainloop::WideGrad& grad,
                                                                   int thread) {
    using G = typename Mainloop::WideGrad;
    const int64_t start = block_start(params, shared).k;
    const int kv_head = block_kv_head(params);
#pragma unroll
    for (int j = 0; j < G::kCols; ++j) {
      const int64_t key = keys.begin + G::col(j, thread);
      if (key >= keys.end) continue;
      float* row = out.at<float>(start, key, kv_head);
#pragma unroll
      for (int i = 0; i < G::kRows; ++i) {
        const int d = d0 + G::row(i, thread);
        if (d < head_dim) row[d] = grad(i, j) * scale;
      }
    }
  }

  // The wide tf32 backward (head dims 96 and 128): this warpgroup's head-dim rows [64 w, 64 w + 64)
  // of dKᵀ and dVᵀ ([rows, 64 keys] fp32 each) across the query tiles, then written transposed
  // (dK scaled).
  __device__ __forceinline__ static void consume_wide_tf32(Mainloop& mainloop, const BwdParams& params, Shared& shared,
                                                           Range keys, Range tiles) {
    const AttentionArgs& args = params.args;
    typename Mainloop::WideGrad dk, dv;
    dk.fill(0.f);
    dv.fill(0.f);
    shared.kv_full.wait(0);
    mainloop.prepare_wide_tf32();
    each_step(args, tiles, [&](const auto& pipe, int m, int parity) { mainloop.step_wide_tf32(pipe, m, keys, parity, dk, dv); });
    // dK and dV of a key together (one element pair a step; kept so: this kernel was measured so).
    using G = typename Mainloop::WideGrad;
    const int64_t start = block_start(params, shared).k;
    const int kv_head = block_kv_head(params);
    const int d0 = mainloop.warpgroup * kConsumerRows, thread = mainloop.thread;
#pragma unroll
    for (int j = 0; j < G::kCols; ++j) {
      const int64_t key = keys.begin + G::col(j, thread);
      if (key >= keys.end) continue;
      T* dk_row = args.dk.at<T>(start, key, kv_head);
      T* dv_row = args.dv.at<T>(start, key, kv_head);
#pragma unroll
      for (int i = 0; i < G::kRows; ++i) {
        const int d = d0 + G::row(i, thread);
        if (d < args.head_dim) dk_row[d] = dk(i, j) * args.scale;
        if (d < args.head_dim_v) dv_row[d] = dv(i, j);
      }
    }
  }

  // The split-tf32 backward (head dim 64): warpgroup 0's dVᵀ or warpgroup 1's dKᵀ ([64 head-dim
  // rows, 64 keys] fp32) across the query tiles, then written transposed (dK scaled).
  __device__ __forceinline__ static void consume_split_tf32(Mainloop& mainloop, const BwdParams& params, Shared& shared,
                                                            Range keys, Range tiles) {
    const AttentionArgs& args = params.args;
    typename Mainloop::WideGrad grad;
    grad.fill(0.f);
    shared.kv_full.wait(0);
    mainloop.prepare_split_tf32();
    each_step(args, tiles, [&](const auto& pipe, int m, int parity) { mainloop.step_split_tf32(pipe, m, keys, parity, grad); });
    const bool values = mainloop.warpgroup == 0;
    store_transposed_key_grad(values ? args.dv : args.dk, params, shared, keys, 0,
                              values ? args.head_dim_v : args.head_dim, values ? 1.f : args.scale, grad,
                              mainloop.thread);
  }

  // The key gradients through shared memory (params.vector_key_grads): once both consumer
  // warpgroups are past their last GEMM (the dQ GEMMs read every key of K), the K and V tiles are
  // dead and take dK and dV ([keys, HDP] in the storage type, row-major, each row's 16-byte chunks
  // XOR-swizzled by the row's index mod 8, so that a warp's 4-byte stores of an accumulator
  // fragment, 8 rows × 4 columns pairs, fall in 32 distinct banks); then all 256 consumer threads
  // write the tiles out in 16-byte vectors, whole rows at a time.
  static constexpr int kVectorElems = tile::kVector16<T>;
  static constexpr int kRowChunks = Shared::kHeadDimPadded / kVectorElems;  // 16-byte chunks per row
  static constexpr int kSwizzleRows = 8;
  static_assert(kRowChunks % kSwizzleRows == 0, "the XOR swizzle permutes chunks inside a row");
  static constexpr int kKeyGradThreads = kBwdConsumers * wg::kThreads;
  __device__ __forceinline__ static int staged_index(int row, int col) {
    return row * Shared::kHeadDimPadded + ((col / kVectorElems) ^ (row % kSwizzleRows)) * kVectorElems +
           col % kVectorElems;
  }
  template <int N>
  __device__ __forceinline__ static void stage_key_grads(Shared& shared, const wg::Accumulator<N>& dk,
                                                         const wg::Accumulator<N>& dv, int row0, int col0,
                                                         float scale, int thread) {
    using G = wg::Accumulator<N>;
    tile::named_sync(int(NamedBarrier::ds_ready), kKeyGradThreads);  // every GEMM of the block is done
#pragma unroll
    for (int i = 0; i < G::kRows; ++i) {
      const int row = row0 + G::row(i, thread);
#pragma unroll
      for (int j = 0; j < G::kCols; j += 2) {
        const int at = staged_index(row, col0 + G::col(j, thread));
        if constexpr (sizeof(T) == 4) {
          *reinterpret_cast<float2*>(shared.k + at) = make_float2(dk(i, j) * scale, dk(i, j + 1) * scale);
          *reinterpret_cast<float2*>(shared.v + at) = make_float2(dv(i, j), dv(i, j + 1));
        } else {
          *reinterpret_cast<uint32_t*>(shared.k + at) = tile::pack2<T>(dk(i, j) * scale, dk(i, j + 1) * scale);
          *reinterpret_cast<uint32_t*>(shared.v + at) = tile::pack2<T>(dv(i, j), dv(i, j + 1));
        }
      }
    }
    tile::named_sync(int(NamedBarrier::ds_ready), kKeyGradThreads);  // both tiles are staged
  }
  // By every consumer thread (the block's threads past the producer warpgroup).
  __device__ __forceinline__ static void write_key_grads(const AttentionArgs& args, const Shared& shared, int kv_head,
                                                         int64_t start, Range keys) {
    const int thread = int(threadIdx.x) - wg::kThreads;
    const int k_chunks = args.head_dim / kVectorElems, v_chunks = args.head_dim_v / kVectorElems;
#pragma unroll 4
    for (int idx = thread; idx < kKeys * kRowChunks; idx += kKeyGradThreads) {
      const int row = idx / kRowChunks, chunk = idx % kRowChunks;
      const int64_t key = keys.begin + row;
      if (key >= keys.end) continue;
      const int at = staged_index(row, chunk * kVectorElems);
      if (chunk < k_chunks)
        *reinterpret_cast<uint4*>(args.dk.at<T>(start, key, kv_head) + chunk * kVectorElems) =
            *reinterpret_cast<const uint4*>(shared.k + at);
      if (chunk < v_chunks)
        *reinterpret_cast<uint4*>(args.dv.at<T>(start, key, kv_head) + chunk * kVectorElems) =
            *reinterpret_cast<const uint4*>(shared.v + at);
    }
  }

  // Columns col and col + 1 of a row (an accumulator's adjacent pair) in the storage type, as one
  // store of both (32 bits, fp32 64) where both are inside `cols` and the row allows it, else each
  // that is inside.
  __device__ __forceinline__ static void store_pair(T* row, int col, int cols, float a, float b) {
    if (col + 1 < cols && reinterpret_cast<uintptr_t>(row + col) % (2 * sizeof(T)) == 0) {
      if constexpr (sizeof(T) == 4) *reinterpret_cast<float2*>(row + col) = make_float2(a, b);
      else *reinterpret_cast<uint32_t*>(row + col) = tile::pack2<T>(a, b);
      return;
    }
    if (col < cols) row[col] = tile::from_float<T>(a);
    if (col + 1 < cols) row[col + 1] = tile::from_float<T>(b);
  }

  // dK = scale · acc and dV in the storage type, rows past seqlen_k and columns past the head
  // dims dropped, from registers, two columns a store (views whose rows are not 16-byte aligned;
  // the others take stage_key_grads). start: the sequence's first key row (dense: the batch index).
  __device__ static void store_key_grads(const AttentionArgs& args, int warpgroup, int thread, int kv_head,
                                         int64_t start,
                                         Range keys, const typename Tiles::KeyGrad& dk,
                                         const typename Tiles::KeyGrad& dv) {
    using G = typename Tiles::KeyGrad;
#pragma unroll
    for (int i = 0; i < G::kRows; ++i) {
      const int64_t key = keys.begin + int64_t(warpgroup) * kConsumerRows + G::row(i, thread);
      if (key >= keys.end) continue;
      T* dk_row = args.dk.at<T>(start, key, kv_head);
      T* dv_row = args.dv.at<T>(start, key, kv_head);
#pragma unroll
      for (int j = 0; j < G::kCols; j += 2) {
        const int col = G::col(j, thread);
        store_pair(dk_row, col, args.head_dim, dk(i, j) * args.scale, dk(i, j + 1) * args.scale);
        store_pair(dv_row, col, args.head_dim_v, dv(i, j), dv(i, j + 1));
      }
    }
  }
};

template <class T, int HD, bool ORDERED_DQ, bool PACKED>
__global__ void __launch_bounds__(BwdKernel<T, HD, ORDERED_DQ, PACKED>::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using K = BwdKernel<T, HD, ORDERED_DQ, PACKED>;
  extern __shared__ char shared_raw[];
  auto& shared = wg::shared_storage<typename K::Shared>(shared_raw);
  // fp32 storage (tf32, split tf32): the index known warp-uniform. (16-bit storage keeps the plain
  // index: with the uniform one its packed and deterministic kernels spilled more, -Xptxas -v.)
  const int warpgroup = sizeof(T) == 4 ? wg::uniform_index() : int(threadIdx.x) / wg::kThreads;
  const int thread = int(threadIdx.x) % wg::kThreads;
  if (threadIdx.x == 0) {
    shared.kv_full.init(1);
    for (int s = 0; s < K::kStages; ++s) {
      shared.full[s].init(1);
      shared.empty[s].init(K::Mainloop::kEmptyArrivals);
    }
    for (int w = 0; w < K::kDqWarps; ++w) shared.dq_full[w].init(K::Mainloop::kDqWriters);
    shared.dq_empty.init(1);
    if constexpr (PACKED) shared.sequence = params.args.sequence(K::block_batch(params));
    tile::fence_barrier_init();
  }
  __syncthreads();
  // Packed: a block past its sequence's keys has nothing to do (no key, so no query tile sees it).
  if (PACKED && bwd_key_tile<K::kKeys>(shared.sequence.mask, K::block_key_tile(params)).empty()) return;
  if (warpgroup == 0) {
    tile::registers_decrease<K::kProducerRegisters>();
    if (PACKED ? thread < 32 : thread == 0) K::produce(params, shared, thread);
    else if (thread / 32 == K::kFirstDqWarp) K::template reduce_dq<0>(params, shared, thread % 32);
    else if (K::kDqWarps > 1 && thread / 32 == K::kFirstDqWarp + 1)
      K::template reduce_dq<1>(params, shared, thread % 32);
  } else {
    tile::registers_increase<K::kConsumerRegisters>();
    K::consume(params, shared, warpgroup - 1, thread);
  }
#endif
}

}  // namespace fmha::cuda::sm90
