// The split-tf32 backward's statistics kernel on sm90 (precision tf32x3; cuda/common/own_softmax.cuh
// says why the split backward forms P from each row's own max and sum): one block per (query tile
// of 64 rows, head, batch or sequence), before the main kernel. Its two warpgroups take the query
// columns [32 w, 32 w + 32) of each key tile's Sᵀ [64 keys, 64 q], as the main kernel's consumers
// do, and form them with the main kernel's products (issue_split_products) from tiles split by the
// same function, at the same places of the same wgmma shapes (key tiles of 64 from the sequence's
// first key, the block's key tiles; the query tile's rows in the same columns), so that every
// score is the main kernel's bit for bit:
//   pass 1  each row's max of x = sign(scale)·(q·k) over its visible keys and its sum of
//           2^((x − max)·|scale_log2|), online over the key tiles; row_max and row_inv_sum
//           written (+inf and 0 where a row sees no key, and on a dense call's padding rows);
//   pass 2  where a row of the tile is peaked (kOwnDeltaMinPeak), Δ = rowsum(P ∘ dP) from its own
//           P and the main kernel's dPᵀ (V·dOᵀ the same way), written over the preprocess's Δ.
// One thread issues the TMA copies (the main kernel's maps: its tiles are these tiles); two K/V
// stages, the next tile landing while this one is split and multiplied.
#pragma once

#include "cuda/common/own_softmax.cuh"
#include "cuda/sm90/sm90_bwd_mainloop.cuh"
#include "cuda/sm90/sm90_bwd_params.h"

namespace fmha::cuda::sm90 {

template <int HD>
struct BwdStatsShared {
  static constexpr int kHeadDimPadded = padded_head_dim(HD);
  static constexpr int kRows = kBwdRows;         // query rows of a block (the main kernel's step)
  static constexpr int kKeys = kConsumerRows;    // keys of a tile (the main kernel's block)
  static constexpr int kStages = 2;              // K/V tiles in flight
  static constexpr int kChunkCols = chunk_cols(sizeof(float));  // 32
  static constexpr int kChunks = kHeadDimPadded / kChunkCols;
  static constexpr int kRowChunkBytes = kRows * wg::kSwizzleBytes;  // the main kernel's strides
  static constexpr int kKVChunkBytes = kKeys * wg::kSwizzleBytes;
  static constexpr uint32_t kRowBytes = uint32_t(kRowChunkBytes) * kChunks;
  static constexpr uint32_t kKVBytes = uint32_t(kKVChunkBytes) * kChunks;
  static constexpr int kWarps = kBwdConsumers * wg::kThreads / 32;

  // [chunks][rows or keys, 32] as TMA lands them; high parts in place, residuals beside.
  alignas(wg::kSwizzleAtomBytes) float q[kRows * kHeadDimPadded];
  alignas(wg::kSwizzleAtomBytes) float q_lo[kRows * kHeadDimPadded];
  alignas(wg::kSwizzleAtomBytes) float dout[kRows * kHeadDimPadded];
  alignas(wg::kSwizzleAtomBytes) float dout_lo[kRows * kHeadDimPadded];
  alignas(wg::kSwizzleAtomBytes) float k[kStages][kKeys * kHeadDimPadded];
  alignas(wg::kSwizzleAtomBytes) float k_lo[kStages][kKeys * kHeadDimPadded];
  alignas(wg::kSwizzleAtomBytes) float v[kStages][kKeys * kHeadDimPadded];
  alignas(wg::kSwizzleAtomBytes) float v_lo[kStages][kKeys * kHeadDimPadded];
  // Each warp's reduction over its 16 keys of a column (a warpgroup's 4 warps, its 32 columns).
  float partial[kBwdConsumers][wg::kThreads / 32][kRows / kBwdConsumers];
  float q_norm[kRows];          // |q| of each row of the tile (lse_factor)
  float key_norm2[kWarps];      // each warp's largest |k|² over the tile's keys
  tile::MBarrier q_full, dout_full, kv_full[kStages];
  Sequence sequence;  // packed: the block's sequence
};

template <int HD, bool PACKED>
struct BwdStatsKernel {
  using Shared = BwdStatsShared<HD>;
  static constexpr int kThreads = kBwdConsumers * wg::kThreads;
  static constexpr int kRows = Shared::kRows;
  static constexpr int kKeys = Shared::kKeys;
  static constexpr int kQueries = kRows / kBwdConsumers;  // query columns per warpgroup
  using Scores = wg::Accumulator<kQueries>;                // [64 keys, 32 q]
  static constexpr int kCols = Scores::kCols;              // a thread's columns
  static constexpr int kColumnLanes = 8;                   // lanes that hold a column of a warp's 16 keys
  static constexpr int kNormLanes = 4;                     // lanes per row (or key) of the norms
  static constexpr size_t kSharedBytes = sizeof(Shared) + wg::kSwizzleAtomBytes;
  static_assert(kSharedBytes <= kSharedLimit, "the statistics kernel's tiles exceed Hopper's shared memory");
  static_assert(kThreads == kRows * kNormLanes && kThreads == kKeys * kNormLanes, "four lanes per row and per key");

  // One column reduction over the warpgroup's 64 keys: each thread's 2 keys, the lanes of its
  // column (lane / 4) and the warpgroup's 4 warps (through shared memory; `barrier` is the
  // warpgroup's named barrier). op: max or sum.
  template <class Op>
  __device__ __forceinline__ static void reduce_columns(float (&x)[kCols], Shared& shared, int warpgroup, int thread,
                                                        Op op) {
    const int warp = thread / 32, lane = thread % 32;
#pragma unroll
    for (int j = 0; j < kCols; ++j)
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2) x[j] = op(x[j], __shfl_xor_sync(0xffffffffu, x[j], offset));
    if (lane < 4) {
#pragma unroll
      for (int j = 0; j < kCols; ++j) shared.partial[warpgroup][warp][Scores::col(j, thread)] = x[j];
    }
    tile::named_sync(int(NamedBarrier::epilogue_first) + warpgroup, wg::kThreads);
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      float r = shared.partial[warpgroup][0][Scores::col(j, thread)];
#pragma unroll
      for (int w = 1; w < wg::kThreads / 32; ++w) r = op(r, shared.partial[warpgroup][w][Scores::col(j, thread)]);
      x[j] = r;
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
    const int warpgroup = index / wg::kThreads, thread = index % wg::kThreads;
    const int q_col0 = warpgroup * kQueries;
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
    // TMA coordinates: dense (row, batch); packed (first row + row, 0) of [1, total, H, D].
    const int batch = PACKED ? 0 : int(blockIdx.z);
    const int64_t q_row = (PACKED ? seq.q : 0) + row0;
    const int64_t k_row0 = PACKED ? seq.k : 0;
    auto load_tile = [&](float* dst, const CUtensorMap* map, int tile_rows, int64_t r0, int head, tile::MBarrier& bar) {
#pragma unroll
      for (int c = 0; c < Shared::kChunks; ++c)
        tile::tma::load(dst + c * tile_rows * Shared::kChunkCols, map, c * Shared::kChunkCols, int(r0), head, batch,
                        bar);
    };
    // Key tile n of a pass (n counts on through both: stage n % 2), with its values in pass 2.
    auto load_keys = [&](int n, bool values) {
      const int stage = n % Shared::kStages;
      const int64_t key0 = k_row0 + (first_tile + n % tiles) * kKeys;
      shared.kv_full[stage].arrive_expect_tx((values ? 2 : 1) * Shared::kKVBytes);
      load_tile(shared.k[stage], &params.k, kKeys, key0, kv_head, shared.kv_full[stage]);
      if (values) load_tile(shared.v[stage], &params.v, kKeys, key0, kv_head, shared.kv_full[stage]);
    };
    const float sign = score_sign(args), abs_scale_log2 = fabsf(args.scale_log2);
    // Sᵀ of this warpgroup's columns of the key tile in `stage`, as the main kernel forms it
    // (issued); then x = sign(scale)·Sᵀ with the hidden scores -inf (the tile's keys from key0).
    auto scores = [&](Scores& s, int stage) {
      issue_split_products<HD>(s, shared.k[stage], shared.k_lo[stage], 0, Shared::kKVChunkBytes, shared.q,
                               shared.q_lo, q_col0, Shared::kRowChunkBytes);
    };
    auto finish_scores = [&](Scores& s, int64_t key0) {
#pragma unroll
      for (int r = 0; r < Scores::kRegs; ++r) s.d[r] *= sign;
      mask_transposed_scores(s, mask, key0, row0 + q_col0, thread);
    };
    constexpr int kTileFloats = kKeys * Shared::kHeadDimPadded;
    constexpr int kRowFloats = kRows * Shared::kHeadDimPadded;
    // Split for tf32 products as the main kernel splits (high parts in place), by the block.
    auto split = [&](float* hi, float* lo) { wg::split_to_tf32<kTileFloats>(hi, lo, index, kThreads); };
    static_assert(kTileFloats == kRowFloats, "query and key tiles alike");

    if (index == 0 && tiles > 0) {
      shared.q_full.arrive_expect_tx(Shared::kRowBytes);
      load_tile(shared.q, &params.q, kRows, q_row, h, shared.q_full);
      for (int n = 0; n < Shared::kStages && n < tiles; ++n) load_keys(n, false);
    }

    // Pass 1: each column's (query row's) running max and this thread's share of its sum.
    float max[kCols], sum[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) max[j] = tile::kNegInf, sum[j] = 0.f;
    float key_norm2_max = 0.f;  // the largest |k|² this thread's keys had (lse_factor)
    if (tiles > 0) {
      shared.q_full.wait(0);
      // |q| of row index / 4, before the split.
      const float n2 = row_norm2(shared.q, index / kNormLanes, Shared::kRowChunkBytes, index % kNormLanes);
      if (index % kNormLanes == 0) shared.q_norm[index / kNormLanes] = sqrtf(n2);
      __syncthreads();  // the norms read Q before its split
      split(shared.q, shared.q_lo);
    }
    for (int n = 0; n < tiles; ++n) {
      const int stage = n % Shared::kStages;
      const int64_t key0 = (first_tile + n) * kKeys;
      shared.kv_full[stage].wait((n / Shared::kStages) & 1);
      {
        // |k|² of key index / 4 of the tile (keys of the rows' range only), before the split.
        const int key = index / kNormLanes;
        const float n2 = row_norm2(shared.k[stage], key, Shared::kKVChunkBytes, index % kNormLanes);
        if (key0 + key >= keys.begin && key0 + key < keys.end) key_norm2_max = fmaxf(key_norm2_max, n2);
      }
      __syncthreads();  // the norms read K before its split
      split(shared.k[stage], shared.k_lo[stage]);
      tile::fence_async_shared();
      __syncthreads();
      Scores s;
      scores(s, stage);
      wg::wait<0>();
      wg::fence_operand(s.d);
      __syncthreads();  // every read of the stage done: the next tile may land there
      if (index == 0 && n + Shared::kStages < tiles) load_keys(n + Shared::kStages, false);
      finish_scores(s, key0);
      float tile_max[kCols];
#pragma unroll
      for (int j = 0; j < kCols; ++j) tile_max[j] = fmaxf(s(0, j), s(1, j));
      reduce_columns(tile_max, shared, warpgroup, thread, [](float a, float b) { return fmaxf(a, b); });
#pragma unroll
      for (int j = 0; j < kCols; ++j)
        own_softmax_step(max[j], sum[j], tile_max[j], abs_scale_log2, [&](float base) {
          return tile::exp2_exact((s(0, j) - base) * abs_scale_log2) + tile::exp2_exact((s(1, j) - base) * abs_scale_log2);
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

    // The rows' statistics, by lanes 0-3 of each warpgroup's first warp (which hold its 32
    // columns between them). own: P is the row's own softmax, where Δ from its own P and dP is right.
    const bool writer = thread < 4;
    bool own[kCols], peaked = false;
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int col = q_col0 + Scores::col(j, thread);
      const int64_t row = row0 + col;
      own[j] = false;
      if (row >= rows.end) {
        // Padding rows of a dense call's statistics (the main kernel loads whole tiles): P = 0.
        if (!PACKED && writer) {
          const int64_t stat = args.stat_index(seq.q, h, row);
          args.row_max[stat] = __int_as_float(0x7f800000), args.row_inv_sum[stat] = 0.f;
        }
        continue;
      }
      own[j] = store_own_row_stats(args, args.stat_index(seq.q, h, row), max[j], sum[j], shared.q_norm[col],
                                   key_norm_max, writer, [&] { return given_lse(args, seq.q, h, row); });
      peaked = peaked || (own[j] && 1.f / sum[j] >= kOwnDeltaMinPeak);  // the largest P is 1/sum
    }

    // Pass 2, where a row of the tile is peaked: Δ = rowsum(P ∘ dP) over the same keys.
    if (!__syncthreads_or(peaked)) return;
    if (index == 0) {
      shared.dout_full.arrive_expect_tx(Shared::kRowBytes);
      load_tile(shared.dout, &params.dout, kRows, q_row, h, shared.dout_full);
      for (int n = tiles; n < tiles + Shared::kStages && n < 2 * tiles; ++n) load_keys(n, true);
    }
    shared.dout_full.wait(0);
    split(shared.dout, shared.dout_lo);
    float delta[kCols];  // this thread's share of rowsum(2^((x − max)·|scale_log2|) ∘ dP)
#pragma unroll
    for (int j = 0; j < kCols; ++j) delta[j] = 0.f;
    for (int n = tiles; n < 2 * tiles; ++n) {
      const int stage = n % Shared::kStages;
      const int64_t key0 = (first_tile + n - tiles) * kKeys;
      shared.kv_full[stage].wait((n / Shared::kStages) & 1);
      split(shared.k[stage], shared.k_lo[stage]);
      split(shared.v[stage], shared.v_lo[stage]);
      tile::fence_async_shared();
      __syncthreads();
      Scores s, dp;
      scores(s, stage);
      issue_split_products<HD>(dp, shared.v[stage], shared.v_lo[stage], 0, Shared::kKVChunkBytes, shared.dout,
                               shared.dout_lo, q_col0, Shared::kRowChunkBytes);
      wg::wait<0>();
      wg::fence_operand(s.d);
      wg::fence_operand(dp.d);
      __syncthreads();
      if (index == 0 && n + Shared::kStages < 2 * tiles) load_keys(n + Shared::kStages, true);
      finish_scores(s, key0);
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const float base = max[j] == tile::kNegInf ? 0.f : max[j];
#pragma unroll
        for (int i = 0; i < Scores::kRows; ++i)
          delta[j] = fmaf(tile::exp2_exact((s(i, j) - base) * abs_scale_log2), dp(i, j), delta[j]);
      }
    }
    reduce_columns(delta, shared, warpgroup, thread, [](float a, float b) { return a + b; });
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int64_t row = row0 + q_col0 + Scores::col(j, thread);
      if (own[j] && writer) args.delta[args.stat_index(seq.q, h, row)] = delta[j] / sum[j];
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
    if constexpr (PACKED) shared.sequence = params.args.sequence(int64_t(blockIdx.z));
    tile::fence_barrier_init();
  }
  __syncthreads();
  K::run(params, shared);
#endif
}

}  // namespace fmha::cuda::sm90
