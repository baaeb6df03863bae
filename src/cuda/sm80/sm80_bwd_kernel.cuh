// The sm80 backward kernels (tensor cores), between the shared preprocess and convert kernels of
// cuda/common/bwd_common.cuh:
//   bwd_kernel:    one block per (key tile, KV head, batch), WARPS warps of 16 keys each. Loads K and V once, loops over the
//                  group's query heads and the query tiles that see the key tile, accumulates dK
//                  and dV in registers (GQA sums included, no atomics) and writes them once; adds
//                  dS·K into the fp32 dQ accumulator with atomics unless dq_accum is null.
//   bwd_dq_kernel: deterministic mode's dQ: one block per (query tile, head, batch) over the key
//                  tiles it sees; one writer per dQ element, so results are bitwise reproducible.
//   bwd_stats_kernel: split tf32 only, before the others: the rows' own softmax statistics
//                  (cuda/common/own_softmax.cuh), one block per query tile of the dQ kernel's
//                  shapes, from S formed by the dQ kernel's own products (dq_products); query
//                  tiles with a peaked row also form Δ = rowsum(P ∘ dP) there.
// In a packed call the batch index is the sequence's (args.h sequence()), and a key tile
// (query tile, for bwd_dq_kernel) past that sequence's length exits at once.
#pragma once

#include "cuda/common/block_sequence.cuh"
#include "cuda/sm80/sm80_bwd_mainloop.cuh"

namespace fmha::cuda::sm80 {

template <class T, int HD, int BM, int BN, int STAGES, int HEAD_SPLITS, int WARPS, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) bwd_kernel(const AttentionArgs args) {
  using Tiles = BwdTiles<T, HD, BM, BN, STAGES, HEAD_SPLITS, WARPS>;
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int kv_head = blockIdx.y;
  const int64_t col0 = int64_t(blockIdx.x) * BN;
  if (col0 >= mask.seqlen_k) return;  // past a packed sequence's end
  const Range cols{col0, col0 + BN < mask.seqlen_k ? col0 + BN : mask.seqlen_k};
  const Range rows_all = mask.queries(Range{0, mask.seqlen_q}, cols);

  typename Tiles::KeyAcc dk, dv;  // [16 keys, HD / HEAD_SPLITS] per warp, fp32
  dk.fill(0.f);
  dv.fill(0.f);
  if (!rows_all.empty()) {
    const int valid = int(cols.size());
    tile::block::load_async<Tiles::kVec, Tiles::kThreads>(
        shared.k.tile(), args.k.at<const T>(seq.k, cols.begin, kv_head), args.k.seq_stride, valid, args.head_dim);
    tile::block::load_async<Tiles::kVec, Tiles::kThreads>(
        shared.v.tile(), args.v.at<const T>(seq.k, cols.begin, kv_head), args.v.seq_stride, valid, args.head_dim_v);
    tile::block::commit();
    bwd_mainloop<T, Tiles, HD, BM, BN, STAGES, HEAD_SPLITS>(args, mask, shared, seq.q, kv_head, cols, rows_all, dk, dv);
  }

  // Epilogue: each lane stores column pairs of keys g and g + 8 of its warp; keys no query sees
  // store the zeros they were initialised with.
  const int warp = int(threadIdx.x) / 32;
  const int g = lane_id() / 4, t = lane_id() % 4;
  const int key_row0 = (warp / HEAD_SPLITS) * kRowsPerWarp;
  const int head_col0 = (warp % HEAD_SPLITS) * Tiles::kHeadCols;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t key = cols.begin + key_row0 + g + 8 * i;
    if (key >= cols.end) continue;
    T* dk_row = args.dk.at<T>(seq.k, key, kv_head);
    T* dv_row = args.dv.at<T>(seq.k, key, kv_head);
#pragma unroll
    for (int j = 0; j < Tiles::KeyAcc::kCols; ++j) {
      const int d = head_col0 + Tiles::KeyAcc::col(j, t);
      if (d < args.head_dim) dk_row[d] = tile::from_float<T>(dk(i, j) * args.scale);
      if (d < args.head_dim_v) dv_row[d] = tile::from_float<T>(dv(i, j));
    }
  }
}

template <class T, int HD, int BN, int STAGES, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) bwd_dq_kernel(const AttentionArgs args) {
  using Tiles = DqTiles<T, HD, BN, STAGES>;
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int h = blockIdx.y;
  const int kv_head = h / args.group;
  const int64_t row0 = int64_t(blockIdx.x) * Tiles::kRows;
  if (row0 >= mask.seqlen_q) return;  // past a packed sequence's end
  const Range rows{row0, row0 + Tiles::kRows < mask.seqlen_q ? row0 + Tiles::kRows : mask.seqlen_q};
  const Range keys = mask.keys(rows);

  typename Tiles::Output dq;  // [16, HD] per warp, fp32, unscaled
  dq.fill(0.f);
  if (!keys.empty()) {
    const int valid = int(rows.size());
    tile::block::load_async<Tiles::kVec, kThreads>(shared.q.tile(), args.q.at<const T>(seq.q, rows.begin, h),
                                                   args.q.seq_stride, valid, args.head_dim);
    tile::block::load_async<Tiles::kVec, kThreads>(shared.dout.tile(), args.dout.at<const T>(seq.q, rows.begin, h),
                                                   args.dout.seq_stride, valid, args.head_dim_v);
    tile::block::commit();
    const int64_t stat0 = args.stat_index(seq.q, h, rows.begin);
    if constexpr (kSplitTf32<T>) {
      tile::block::load_vector<Tiles::kRows, kThreads>(shared.lse_log2, args.row_max + stat0, valid, kPosInf);
      tile::block::load_vector<Tiles::kRows, kThreads>(shared.inv_sum, args.row_inv_sum + stat0, valid, 0.f);
    } else {
      tile::block::load_vector<Tiles::kRows, kThreads>(shared.lse_log2, args.lse_log2 + stat0, valid, kPosInf);
    }
    tile::block::load_vector<Tiles::kRows, kThreads>(shared.delta, args.delta + stat0, valid, 0.f);
    dq_mainloop<T, Tiles, HD, BN, STAGES>(args, mask, shared, seq.k, kv_head, rows, keys, dq);
  }

  const int warp = int(threadIdx.x) / 32;
  const int g = lane_id() / 4, t = lane_id() % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t row = rows.begin + warp * kRowsPerWarp + g + 8 * i;
    if (row >= rows.end) continue;
    T* dq_row = args.dq.at<T>(seq.q, row, h);
#pragma unroll
    for (int j = 0; j < Tiles::Output::kCols; ++j) {
      const int d = Tiles::Output::col(j, t);
      if (d < args.head_dim) dq_row[d] = tile::from_float<T>(dq(i, j) * args.scale);
    }
  }
}

// The statistics kernel's tiles (the dQ kernel's shapes, one K/V stage): Q and K for the rows' max
// and sum; dO and V besides for the Δ pass.
template <class T, int HD, int BN>
struct StatsTiles {
  static constexpr int kPad = kSmemRowPadBytes / int(sizeof(T));
  static constexpr int kVec = 16 / int(sizeof(T));
  static constexpr int kRows = kWarps * kRowsPerWarp;
  // Key norms: kKeyLanes adjacent lanes per key, each over every kKeyLanes-th dim (rows ≡ 4 words
  // mod 32 apart: 8 keys of 4 lanes fill the 32 banks).
  static constexpr int kKeyLanes = kThreads / BN;
  static_assert(kThreads % BN == 0 && kKeyLanes <= 32 && (kKeyLanes & (kKeyLanes - 1)) == 0,
                "the key norms' lanes: a power of two per key, within a warp");
  using QTile = tile::SmemTile<T, kRows, HD, kPad>;  // [kRows, HD] queries, or dO
  using KVTile = tile::SmemTile<T, BN, HD, kPad>;    // [BN, HD] keys, or values
  struct SharedStorage {
    tile::SmemArray<QTile> q, dout;
    tile::SmemArray<KVTile> k, v;
    float key_norm2[kWarps];  // [warps] each warp's largest |k|^2 over the block's keys (lse_factor)
  };
  using Scores = Acc16<BN>;  // [16 queries, BN keys] per warp: S, or dP
};

// x = sign(scale)·S of a warp's scores, -inf where the mask hides the key (or past the tile).
template <class Scores>
__device__ __forceinline__ void mask_own_scores(const AttentionArgs& args, const Mask& mask, Scores& s, Range rows,
                                                Range cols, int warp_row0, bool full) {
  const int g = lane_id() / 4, t = lane_id() % 4;
  const float sign = score_sign(args);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const Range seen = full ? Range{} : mask.keys(rows.begin + warp_row0 + g + 8 * i);
#pragma unroll
    for (int j = 0; j < Scores::kCols; ++j) {
      s(i, j) *= sign;
      if (!full) {
        const int64_t key = cols.begin + Scores::col(j, t);
        if (key < seen.begin || key >= seen.end) s(i, j) = tile::kNegInf;
      }
    }
  }
}

template <class T, int HD, int BN, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) bwd_stats_kernel(const AttentionArgs args) {
  using Tiles = StatsTiles<T, HD, BN>;
  using Scores = typename Tiles::Scores;
  constexpr int kLanes = 4;  // lanes per query row of an Acc16 tile (t = lane % 4)
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int h = blockIdx.y;
  const int kv_head = h / args.group;
  const int64_t row0 = int64_t(blockIdx.x) * Tiles::kRows;
  if (row0 >= mask.seqlen_q) return;  // past a packed sequence's end
  const Range rows{row0, row0 + Tiles::kRows < mask.seqlen_q ? row0 + Tiles::kRows : mask.seqlen_q};
  const Range keys = mask.keys(rows);
  const int warp = int(threadIdx.x) / 32;
  const int g = lane_id() / 4, t = lane_id() % 4;
  const int warp_row0 = warp * kRowsPerWarp;
  const float scale_log2 = fabsf(args.scale_log2);
  const auto q = shared.q.tile(), dout = shared.dout.tile();
  const auto k = shared.k.tile(), v = shared.v.tile();
  const auto key_tile = [&](int64_t col0) { return Range{col0, col0 + BN < keys.end ? col0 + BN : keys.end}; };
  const auto load_keys = [&](Range cols, bool values) {
    tile::block::load_async<Tiles::kVec, kThreads>(k, args.k.at<const T>(seq.k, cols.begin, kv_head),
                                                   args.k.seq_stride, int(cols.size()), args.head_dim);
    if (values)
      tile::block::load_async<Tiles::kVec, kThreads>(v, args.v.at<const T>(seq.k, cols.begin, kv_head),
                                                     args.v.seq_stride, int(cols.size()), args.head_dim_v);
    tile::block::commit();
    tile::block::wait<0>();
    __syncthreads();
  };
  const auto full_tile = [&](Range cols) {
    return rows.size() == Tiles::kRows && cols.size() == BN && mask.tile_is_full(rows, cols);
  };

  // Pass 1: each row's max of x and sum of 2^((x - max)·|scale_log2|), online over its keys.
  float max[2], sum[2];       // rows g and g + 8 of the warp: running max; this lane's share of the sum
  float key_norm2_max = 0.f;  // the largest |k|^2 of the keys this thread measured
#pragma unroll
  for (int i = 0; i < 2; ++i) max[i] = tile::kNegInf, sum[i] = 0.f;
  if (!keys.empty()) {
    tile::block::load_async<Tiles::kVec, kThreads>(q, args.q.at<const T>(seq.q, rows.begin, h), args.q.seq_stride,
                                                   int(rows.size()), args.head_dim);  // joins the first key tile's group
    for (int64_t col0 = keys.begin; col0 < keys.end; col0 += BN) {
      const Range cols = key_tile(col0);
      load_keys(cols, false);
      {
        const int key = int(threadIdx.x) / Tiles::kKeyLanes, part = int(threadIdx.x) % Tiles::kKeyLanes;
        float n2 = 0.f;  // this lane's share of |k|^2 (zero past the tile's keys and head dims)
#pragma unroll 8
        for (int d = part; d < HD; d += Tiles::kKeyLanes) {
          const float x = tile::to_float(k(key, d));
          n2 = fmaf(x, x, n2);
        }
        key_norm2_max = fmaxf(key_norm2_max, tile::warp::row_sum<Tiles::kKeyLanes>(n2));
      }
      Scores s, unused;  // [16, BN] x = sign(scale)·S
      dq_products<T, HD, BN, false>(s, unused, q, dout, k, v, warp_row0);
      mask_own_scores(args, mask, s, rows, cols, warp_row0, full_tile(cols));
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float m = tile::kNegInf;
#pragma unroll
        for (int j = 0; j < Scores::kCols; ++j) m = fmaxf(m, s(i, j));
        own_softmax_step(max[i], sum[i], tile::warp::row_max<kLanes>(m), scale_log2, [&](float base) {
          float part = 0.f;
#pragma unroll
          for (int j = 0; j < Scores::kCols; ++j) part += tile::exp2_exact((s(i, j) - base) * scale_log2);
          return part;
        });
      }
      __syncthreads();  // K is overwritten by the next key tile
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) sum[i] = tile::warp::row_sum<kLanes>(sum[i]);

  // lse_factor's bound on the forward's rounding of a score: each row's |q| and the longest key's
  // |k| (over the block's keys: at least the row's). Q is still in shared memory.
  float q_norm[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float part = 0.f;  // this lane's dims of the row: t, t + 4, ...
    if (!keys.empty()) {
#pragma unroll 8
      for (int d = t; d < HD; d += kLanes) {
        const float x = tile::to_float(q(warp_row0 + g + 8 * i, d));
        part = fmaf(x, x, part);
      }
    }
    q_norm[i] = sqrtf(tile::warp::row_sum<kLanes>(part));
  }
  key_norm2_max = tile::warp::row_max<32>(key_norm2_max);
  if (lane_id() == 0) shared.key_norm2[warp] = key_norm2_max;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) key_norm2_max = fmaxf(key_norm2_max, shared.key_norm2[w]);
  const float key_norm_max = sqrtf(key_norm2_max);

  // The rows' statistics. `own`: P is this row's own softmax (not a part of a merged one), so a
  // Δ from its own P and dP is the right one.
  bool own[2], peaked = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t row = rows.begin + warp_row0 + g + 8 * i;
    own[i] = false;
    if (row >= rows.end) continue;
    own[i] = store_own_row_stats(args, args.stat_index(seq.q, h, row), max[i], sum[i], q_norm[i], key_norm_max,
                                 t == 0, [&] { return given_lse(args, seq.q, h, row); });
    peaked = peaked || (own[i] && 1.f / sum[i] >= kOwnDeltaMinPeak);  // the largest P is 1/sum
  }

  // Pass 2, where a row is peaked: Δ = rowsum(P ∘ dP) over the same keys (kOwnDeltaMinPeak).
  if (!__syncthreads_or(peaked)) return;
  tile::block::load_async<Tiles::kVec, kThreads>(dout, args.dout.at<const T>(seq.q, rows.begin, h),
                                                 args.dout.seq_stride, int(rows.size()),
                                                 args.head_dim_v);  // joins the first key tile's group
  float delta[2] = {0.f, 0.f};  // this lane's share of rowsum(2^((x - max)·|scale_log2|) ∘ dP)
  for (int64_t col0 = keys.begin; col0 < keys.end; col0 += BN) {
    const Range cols = key_tile(col0);
    load_keys(cols, true);
    Scores s, dp;  // [16, BN] x and dP, as the dQ kernel forms them
    dq_products<T, HD, BN, true>(s, dp, q, dout, k, v, warp_row0);
    mask_own_scores(args, mask, s, rows, cols, warp_row0, full_tile(cols));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float base = max[i] == tile::kNegInf ? 0.f : max[i];
#pragma unroll
      for (int j = 0; j < Scores::kCols; ++j)
        delta[i] = fmaf(tile::exp2_exact((s(i, j) - base) * scale_log2), dp(i, j), delta[i]);
    }
    __syncthreads();  // K and V are overwritten by the next key tile
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    delta[i] = tile::warp::row_sum<kLanes>(delta[i]);
    const int64_t row = rows.begin + warp_row0 + g + 8 * i;
    if (own[i] && t == 0) args.delta[args.stat_index(seq.q, h, row)] = delta[i] / sum[i];
  }
}

}  // namespace fmha::cuda::sm80
