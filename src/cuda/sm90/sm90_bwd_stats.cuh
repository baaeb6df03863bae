// The split-tf32 backward's statistics kernel on sm90 (precision tf32x3; cuda/common/own_softmax.cuh
// says why the split backward forms P from each row's own max and sum): one block per (128 query
// rows, head, batch or sequence), before the main kernel. Warpgroup w takes the block's w-th query
// tile of 64 rows — the main kernel's steps — and forms each key tile's Sᵀ [64 keys, 64 q] of it
// as the main kernel's two consumer warpgroups do, one m64n32 product chain per 32 query columns
// (issue_split_products), from tiles split by the same function, at the same places of the same
// wgmma shapes (key tiles of 64 from the sequence's first key, the main kernel's blocks; each query
// half in the same columns), so that every score is the main kernel's bit for bit:
//   pass 1  each row's max of x = sign(scale)·(q·k) over its visible keys and its sum of
//           2^((x − max)·|scale_log2|), online over the key tiles; row_max and row_inv_sum
//           written (+inf and 0 where a row sees no key, and on a dense call's padding rows);
//   pass 2  where a row of the block is peaked (kOwnDeltaMinPeak), Δ = rowsum(P ∘ dP) from its own
//           P and the main kernel's dPᵀ (V·dOᵀ the same way), written over the preprocess's Δ.
// One thread issues the TMA copies (the main kernel's maps: boxes of 64 rows, two a 128-row tile);
// pass 1 keeps two K stages in flight, pass 2 one K/V stage (peaked blocks are few) in the same
// shared memory. 128 rows a block (not 64) halve the key tiles each query row loads and splits.
#pragma once

#include "cuda/common/own_softmax.cuh"
#include "cuda/sm90/sm90_bwd_mainloop.cuh"
#include "cuda/sm90/sm90_bwd_params.h"

namespace fmha::cuda::sm90 {

template <int HD>
struct BwdStatsShared {
  static constexpr int kHeadDimPadded = padded_head_dim(HD);
  static constexpr int kTileRows = kBwdRows;                  // a query tile (the main kernel's step)
  static constexpr int kRows = kBwdConsumers * kTileRows;     // query rows of a block: one tile a warpgroup
  static constexpr int kKeys = kConsumerRows;                 // keys of a tile (the main kernel's block)
  static constexpr int kStages = 2;                           // pass 1's K tiles in flight
  static constexpr int kChunkCols = chunk_cols(sizeof(float));  // 32
  static constexpr int kChunks = kHeadDimPadded / kChunkCols;
  static constexpr int kRowChunkBytes = kRows * wg::kSwizzleBytes;  // one [128 rows, 32] chunk
  static constexpr int kKVChunkBytes = kKeys * wg::kSwizzleBytes;   // one [64 keys, 32] chunk (the main kernel's)
  static constexpr uint32_t kRowBytes = uint32_t(kRowChunkBytes) * kChunks;
  static constexpr uint32_t kKVBytes = uint32_t(kKVChunkBytes) * kChunks;
  static constexpr int kTileFloats = kKeys * kHeadDimPadded;
  static constexpr int kWarps = kBwdConsumers * wg::kThreads / 32;

  // [chunks][rows or keys, 32] as TMA lands them; high parts in place, residuals beside.
  alignas(wg::kSwizzleAtomBytes) float q[kRows * kHeadDimPadded];
  alignas(wg::kSwizzleAtomBytes) float q_lo[kRows * kHeadDimPadded];
  alignas(wg::kSwizzleAtomBytes) float dout[kRows * kHeadDimPadded];
  alignas(wg::kSwizzleAtomBytes) float dout_lo[kRows * kHeadDimPadded];
  // Key-side tiles: pass 1 K of stage s in [s] and its residuals in [kStages + s]; pass 2 K, K's
  // residuals, V, V's residuals in [0..3].
  alignas(wg::kSwizzleAtomBytes) float keys[2 * kStages][kTileFloats];
  // Each warp's reduction over its 16 keys of a column (a warpgroup's 4 warps, its 64 columns).
  float partial[kBwdConsumers][wg::kThreads / 32][kTileRows];
  float q_norm[kRows];      // |q| of each row of the block (lse_factor)
  float key_norm2[kWarps];  // each warp's largest |k|² over the block's keys
  tile::MBarrier q_full, dout_full, kv_full[kStages], kv_values_full;
  Sequence sequence;  // packed: the block's sequence
};

template <int HD, bool PACKED>
struct BwdStatsKernel {
  using Shared = BwdStatsShared<HD>;
  static constexpr int kThreads = kBwdConsumers * wg::kThreads;
  static constexpr int kRows = Shared::kRows;
  static constexpr int kKeys = Shared::kKeys;
  static constexpr int kHalves = 2;                                   // a tile's two 32-column products
  static constexpr int kQueries = Shared::kTileRows / kHalves;        // query columns of a product
  using Scores = wg::Accumulator<kQueries>;                           // [64 keys, 32 q]
  static constexpr int kCols = Scores::kCols;                         // a thread's columns of a product
  static constexpr int kNormLanes = 4;                                // lanes per row (or key) of the norms
  static constexpr size_t kSharedBytes = sizeof(Shared) + wg::kSwizzleAtomBytes;
  static_assert(kSharedBytes <= kSharedLimit, "the statistics kernel's tiles exceed Hopper's shared memory");
  static_assert(kThreads == kKeys * kNormLanes && kRows * kNormLanes == 2 * kThreads,
                "four lanes per key, eight per row (two rows a thread)");
  using Columns = float[kHalves][kCols];  // a thread's columns of both halves

  // One column reduction over the warpgroup's 64 keys: each thread's 2 keys, the lanes of its
  // column (lane / 4) and the warpgroup's 4 warps (through shared memory and the warpgroup's named
  // barrier). op: max or sum.
  template <class Op>
  __device__ __forceinline__ static void reduce_columns(Columns& x, Shared& shared, int warpgroup, int thread, Op op) {
    const int warp = thread / 32, lane = thread % 32;
#pragma unroll
    for (int hf = 0; hf < kHalves; ++hf)
#pragma unroll
      for (int j = 0; j < kCols; ++j)
#pragma unroll
        for (int offset = 4; offset < 32; offset *= 2) x[hf][j] = op(x[hf][j], __shfl_xor_sync(0xffffffffu, x[hf][j], offset));
    if (lane < 4) {
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf)
#pragma unroll
        for (int j = 0; j < kCols; ++j) shared.partial[warpgroup][warp][hf * kQueries + Scores::col(j, thread)] = x[hf][j];
    }
    tile::named_sync(int(NamedBarrier::epilogue_first) + warpgroup, wg::kThreads);
#pragma unroll
    for (int hf = 0; hf < kHalves; ++hf)
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int col = hf * kQueries + Scores::col(j, thread);
        float r = shared.partial[warpgroup][0][col];
#pragma unroll
        for (int w = 1; w < wg::kThreads / 32; ++w) r = op(r, shared.partial[warpgroup][w][col]);
        x[hf][j] = r;
      }
    tile::named_sync(int(NamedBarrier::epilogue_first) + warpgroup, wg::kThreads);  // partial is rewritten next
  }

  // |x|² of row r of an fp32 tile in swizzled chunks of chunk_bytes (TMA's layout), by the
  // kNormLanes adjacent lanes of the row: lane `part` sums the dims d ≡ part (mod kNormLanes).
  __device__ __forceinline__ static float row_norm2(const float* tile, int r, int chunk_bytes, int part) {
    float n2 = 0.f;
#pragma unroll 8
    for (int d = part; d < Shared::kHeadDimPadded; d += kNormLanes) {
      const float x = tile[wg::swizzled_offset<float>(r, d, chunk_bytes) / 4];
      n2 = fmaf(x, x, n2);
    }
    return tile::warp::row_sum<kNormLanes>(n2);
  }

  __device__ static void run(const BwdParams& params, Shared& shared) {
    const AttentionArgs& args = params.args;
    const int index = int(threadIdx.x);
    const int warpgroup = wg::uniform_index(), thread = index % wg::kThreads;
    const int tile_row0 = warpgroup * Shared::kTileRows;  // this warpgroup's query tile within the block
    const Mask& mask = PACKED ? shared.sequence.mask : args.mask;
    const SequenceStart seq = PACKED ? shared.sequence.start : SequenceStart{int64_t(blockIdx.z), int64_t(blockIdx.z)};
    const int h = int(blockIdx.y);
    const int kv_head = h / args.group;
    const int64_t row0 = int64_t(blockIdx.x) * kRows;
    if (row0 >= mask.seqlen_q) return;  // past a packed sequence's end
    const Range rows{row0, row0 + kRows < mask.seqlen_q ? row0 + kRows : mask.seqlen_q};
    const Range keys = mask.keys(rows);
    // The key tiles of the main kernel's blocks (64 keys from the sequence's first) that hold the
    // rows' visible keys.
    const int64_t first_tile = keys.empty() ? 0 : keys.begin / kKeys;
    const int tiles = keys.empty() ? 0 : int((keys.end + kKeys - 1) / kKeys - first_tile);
    // TMA coordinates: dense (row, batch); packed (first row + row, 0) of [1, total, H, D]. The
    // maps' boxes are the main kernel's 64 rows: a 128-row tile lands as two.
    const int batch = PACKED ? 0 : int(blockIdx.z);
    const int64_t q_row = (PACKED ? seq.q : 0) + row0;
    const int64_t k_row0 = PACKED ? seq.k : 0;
    auto load_tile = [&](float* dst, const CUtensorMap* map, int tile_rows, int64_t r0, int head, tile::MBarrier& bar) {
#pragma unroll
      for (int c = 0; c < Shared::kChunks; ++c)
        for (int part = 0; part < tile_rows; part += kBwdRows)
          tile::tma::load(dst + (c * tile_rows + part) * Shared::kChunkCols, map, c * Shared::kChunkCols,
                          int(r0 + part), head, batch, bar);
    };
    auto key_row = [&](int n) { return k_row0 + (first_tile + n) * kKeys; };  // the n-th key tile's first row
    const float abs_scale_log2 = fabsf(args.scale_log2);
    // Sᵀ of this warpgroup's query tile against the key tile (k, k_lo), as the main kernel's two
    // consumer warpgroups form it, one product a query half (issued); then x = sign(scale)·Sᵀ with
    // the hidden scores -inf (the tile's keys from key0).
    auto issue_scores = [&](Scores (&s)[kHalves], const float* k, const float* k_lo) {
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf)
        issue_split_products<HD>(s[hf], k, k_lo, 0, Shared::kKVChunkBytes, shared.q, shared.q_lo,
                                 tile_row0 + hf * kQueries, Shared::kRowChunkBytes);
    };
    auto finish_scores = [&](Scores& s, int hf, int64_t key0) {
      apply_score_sign(args, s.d);
      mask_transposed_scores(s, mask, key0, row0 + tile_row0 + hf * kQueries, thread);
    };
    // Split for tf32 products as the main kernel splits (high parts in place), by the block: a key
    // tile, or the block's query-side tile.
    auto split_keys = [&](float* hi, float* lo) { wg::split_to_tf32<Shared::kTileFloats, kThreads>(hi, lo, index); };
    auto split_rows = [&](float* hi, float* lo) {
      wg::split_to_tf32<kRows * Shared::kHeadDimPadded, kThreads>(hi, lo, index);
    };

    if (index == 0 && tiles > 0) {
      shared.q_full.arrive_expect_tx(Shared::kRowBytes);
      load_tile(shared.q, &params.q, kRows, q_row, h, shared.q_full);
      for (int n = 0; n < Shared::kStages && n < tiles; ++n) {
        shared.kv_full[n].arrive_expect_tx(Shared::kKVBytes);
        load_tile(shared.keys[n], &params.k, kKeys, key_row(n), kv_head, shared.kv_full[n]);
      }
    }

    // Pass 1: each column's (query row's) running max and this thread's share of its sum.
    Columns max, sum;
#pragma unroll
    for (int hf = 0; hf < kHalves; ++hf)
#pragma unroll
      for (int j = 0; j < kCols; ++j) max[hf][j] = tile::kNegInf, sum[hf][j] = 0.f;
    float key_norm2_max = 0.f;  // the largest |k|² this thread's keys had (lse_factor)
    if (tiles > 0) {
      shared.q_full.wait(0);
      // |q| of rows index / 4 and 64 + index / 4, dims d ≡ index (mod 4), before the split.
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = index / kNormLanes + i * (kThreads / kNormLanes);
        const float n2 = row_norm2(shared.q, r, Shared::kRowChunkBytes, index % kNormLanes);
        if (index % kNormLanes == 0) shared.q_norm[r] = sqrtf(n2);
      }
      __syncthreads();  // the norms read Q before its split
      split_rows(shared.q, shared.q_lo);
    }
    for (int n = 0; n < tiles; ++n) {
      const int stage = n % Shared::kStages;
      float* const k = shared.keys[stage];
      float* const k_lo = shared.keys[Shared::kStages + stage];
      const int64_t key0 = (first_tile + n) * kKeys;
      shared.kv_full[stage].wait((n / Shared::kStages) & 1);
      {
        // |k|² of key index / 4 of the tile (keys of the rows' range only), before the split.
        const int key = index / kNormLanes;
        const float n2 = row_norm2(k, key, Shared::kKVChunkBytes, index % kNormLanes);
        if (key0 + key >= keys.begin && key0 + key < keys.end) key_norm2_max = fmaxf(key_norm2_max, n2);
      }
      __syncthreads();  // the norms read K before its split
      split_keys(k, k_lo);
      tile::fence_async_shared();
      __syncthreads();
      Scores s[kHalves];
      issue_scores(s, k, k_lo);
      wg::wait<0>();
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf) wg::fence_operand(s[hf].d);
      __syncthreads();  // every read of the stage done: the next tile may land there
      if (index == 0 && n + Shared::kStages < tiles) {
        shared.kv_full[stage].arrive_expect_tx(Shared::kKVBytes);
        load_tile(k, &params.k, kKeys, key_row(n + Shared::kStages), kv_head, shared.kv_full[stage]);
      }
      Columns tile_max;
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf) {
        finish_scores(s[hf], hf, key0);
#pragma unroll
        for (int j = 0; j < kCols; ++j) tile_max[hf][j] = fmaxf(s[hf](0, j), s[hf](1, j));
      }
      reduce_columns(tile_max, shared, warpgroup, thread, [](float a, float b) { return fmaxf(a, b); });
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf)
#pragma unroll
        for (int j = 0; j < kCols; ++j)
          own_softmax_step<kSplitOwnFtz>(max[hf][j], sum[hf][j], tile_max[hf][j], abs_scale_log2, [&](float base) {
            return own_exp2<kSplitOwnFtz>((s[hf](0, j) - base) * abs_scale_log2) +
                   own_exp2<kSplitOwnFtz>((s[hf](1, j) - base) * abs_scale_log2);
          });
    }
    reduce_columns(sum, shared, warpgroup, thread, [](float a, float b) { return a + b; });

    // The longest key of the rows' range (every thread: lse_factor's bound).
    key_norm2_max = tile::warp::row_max<32>(key_norm2_max);
    if (index % 32 == 0) shared.key_norm2[index / 32] = key_norm2_max;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < Shared::kWarps; ++w) key_norm2_max = fmaxf(key_norm2_max, shared.key_norm2[w]);
    const float key_norm_max = sqrtf(key_norm2_max);

    // The rows' statistics, by lanes 0-3 of each warpgroup's first warp (which hold its 64 columns
    // between them). own: P is the row's own softmax, where Δ from its own P and dP is right.
    const bool writer = thread < 4;
    bool own[kHalves][kCols], peaked = false;
#pragma unroll
    for (int hf = 0; hf < kHalves; ++hf)
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int col = tile_row0 + hf * kQueries + Scores::col(j, thread);  // the row within the block
        const int64_t row = row0 + col;
        own[hf][j] = false;
        if (row >= rows.end) {
          // Padding rows of a dense call's statistics (the main kernel loads whole tiles): P = 0.
          if (!PACKED && writer) {
            const int64_t stat = args.stat_index(seq.q, h, row);
            args.row_max[stat] = __int_as_float(0x7f800000), args.row_inv_sum[stat] = 0.f;
          }
          continue;
        }
        own[hf][j] = store_own_row_stats(args, args.stat_index(seq.q, h, row), max[hf][j], sum[hf][j],
                                         shared.q_norm[col], key_norm_max, writer,
                                         [&] { return given_lse(args, seq.q, h, row); });
        peaked = peaked || (own[hf][j] && 1.f / sum[hf][j] >= kOwnDeltaMinPeak);  // the largest P is 1/sum
      }

    // Pass 2, where a row of the block is peaked: Δ = rowsum(P ∘ dP) over the same keys, one K/V
    // tile at a time (pass 1's stages are free: its last tile's reads ended at a block barrier).
    if (!__syncthreads_or(peaked)) return;
    float* const k = shared.keys[0];
    float* const k_lo = shared.keys[1];
    float* const v = shared.keys[2];
    float* const v_lo = shared.keys[3];
    auto load_values = [&](int n) {  // thread 0: K and V of key tile n
      shared.kv_values_full.arrive_expect_tx(2 * Shared::kKVBytes);
      load_tile(k, &params.k, kKeys, key_row(n), kv_head, shared.kv_values_full);
      load_tile(v, &params.v, kKeys, key_row(n), kv_head, shared.kv_values_full);
    };
    if (index == 0) {
      shared.dout_full.arrive_expect_tx(Shared::kRowBytes);
      load_tile(shared.dout, &params.dout, kRows, q_row, h, shared.dout_full);
      load_values(0);
    }
    shared.dout_full.wait(0);
    split_rows(shared.dout, shared.dout_lo);
    Columns delta;  // this thread's share of rowsum(2^((x − max)·|scale_log2|) ∘ dP)
#pragma unroll
    for (int hf = 0; hf < kHalves; ++hf)
#pragma unroll
      for (int j = 0; j < kCols; ++j) delta[hf][j] = 0.f;
    for (int n = 0; n < tiles; ++n) {
      const int64_t key0 = (first_tile + n) * kKeys;
      shared.kv_values_full.wait(n & 1);
      split_keys(k, k_lo);
      split_keys(v, v_lo);
      tile::fence_async_shared();
      __syncthreads();
      Scores s[kHalves], dp[kHalves];
      issue_scores(s, k, k_lo);
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf)
        issue_split_products<HD>(dp[hf], v, v_lo, 0, Shared::kKVChunkBytes, shared.dout, shared.dout_lo,
                                 tile_row0 + hf * kQueries, Shared::kRowChunkBytes);
      wg::wait<0>();
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf) {
        wg::fence_operand(s[hf].d);
        wg::fence_operand(dp[hf].d);
      }
      __syncthreads();
      if (index == 0 && n + 1 < tiles) load_values(n + 1);
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf) {
        finish_scores(s[hf], hf, key0);
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
          const float base = max[hf][j] == tile::kNegInf ? 0.f : max[hf][j];
#pragma unroll
          for (int i = 0; i < Scores::kRows; ++i)
            delta[hf][j] =
                fmaf(own_exp2<kSplitOwnFtz>((s[hf](i, j) - base) * abs_scale_log2), dp[hf](i, j), delta[hf][j]);
        }
      }
    }
    reduce_columns(delta, shared, warpgroup, thread, [](float a, float b) { return a + b; });
#pragma unroll
    for (int hf = 0; hf < kHalves; ++hf)
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int64_t row = row0 + tile_row0 + hf * kQueries + Scores::col(j, thread);
        if (own[hf][j] && writer) args.delta[args.stat_index(seq.q, h, row)] = delta[hf][j] / sum[hf][j];
      }
  }
};

template <int HD, bool PACKED>
__global__ void __launch_bounds__(BwdStatsKernel<HD, PACKED>::kThreads, 1)
    bwd_stats_kernel(const __grid_constant__ BwdParams params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using K = BwdStatsKernel<HD, PACKED>;
  extern __shared__ char shared_raw[];
  auto& shared = wg::shared_storage<typename K::Shared>(shared_raw);
  if (threadIdx.x == 0) {
    shared.q_full.init(1);
    shared.dout_full.init(1);
    for (int s = 0; s < K::Shared::kStages; ++s) shared.kv_full[s].init(1);
    shared.kv_values_full.init(1);
    if constexpr (PACKED) shared.sequence = params.args.sequence(int64_t(blockIdx.z));
    tile::fence_barrier_init();
  }
  __syncthreads();
  K::run(params, shared);
#endif
}

}  // namespace fmha::cuda::sm90
