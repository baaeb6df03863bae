// The sm80 backward mainloops on mma.sync, fp32 accumulation.
//   bwd_mainloop: one key tile (K, V in shared memory) against every query tile of the GQA group
//     that sees it, Q/dO tiles arriving through a STAGES-deep cp.async pipeline. Each warp owns 16
//     keys and works on the transposed scores S^T = K·Q^T, so that P^T and dS^T come out of the
//     accumulators already in the A-operand layout of dV += P^T·dO and dK += dS^T·Q (no shared
//     round trip for them). dS goes through shared memory once, for dQ += dS·K (atomics).
//   dq_mainloop: the deterministic dQ, forward-shaped: one query tile against its key tiles,
//     each warp owning 16 query rows, dQ += dS·K with dS taken from the score registers.
// Both compute P and dS = P ∘ (dP - Δ) the same way; a fully masked row has P = dS = 0 exactly.
// P = 2^(S·scale_log2 - LSE·log2e) from the given LSE (+inf where a row sees no key: preprocess),
// except under split tf32, whose P comes from the rows' own softmax statistics
// (cuda/common/own_softmax.cuh; bwd_stats_kernel): 2^((x - row_max)·|scale_log2|)·row_inv_sum with
// x = sign(scale)·S. The statistics kernel forms S and dP with dq_products, as the dQ kernel does,
// and the main kernel's S^T and dP^T agree with them bit for bit (tile::warp::mma_transposed).
#pragma once

#include "cuda/common/args.h"
#include "cuda/common/own_softmax.cuh"
#include "cuda/sm80/sm80_config.h"
#include "cuda/sm80/sm80_fragments.cuh"
#include "cuda/tile/atomic.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/tile.cuh"

namespace fmha::cuda::sm80 {

inline constexpr float kPosInf = __builtin_huge_valf();

// The shared storage of the tiers' P from the LSE: nothing more (an empty base of SharedStorage).
struct NoOwnStats {};

// Tiles of the main kernel: a block of WARPS warps holds BN keys; HEAD_SPLITS warps share 16 keys
// and split dK/dV's columns; BM queries per step.
template <class T, int HD, int BM, int BN, int STAGES, int HEAD_SPLITS, int WARPS>
struct BwdTiles {
  static constexpr int kWarps = WARPS;
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kPad = kSmemRowPadBytes / int(sizeof(T));
  static constexpr int kVec = 16 / int(sizeof(T));  // elements per 16-byte cp.async
  static constexpr int kKeyWarps = kWarps / HEAD_SPLITS;
  static_assert(BN == kKeyWarps * kRowsPerWarp, "each warp holds 16 keys of the tile");
  static constexpr int kHeadCols = HD / HEAD_SPLITS;  // dK/dV columns per warp
  static_assert(kHeadCols % 16 == 0, "dK/dV columns come in pairs of n8 tiles");
  // dQ += dS·K: the [BM, HD] product is split over the warps as kDqRowWarps × kDqColWarps blocks
  // of [16, kDqCols].
  static constexpr int kDqRowWarps = BM / kRowsPerWarp;
  static_assert(kWarps % kDqRowWarps == 0, "query rows of a step split evenly over the warps");
  static constexpr int kDqColWarps = kWarps / kDqRowWarps;
  static constexpr int kDqCols = HD / kDqColWarps;
  static_assert(kDqCols % 16 == 0, "dQ columns come in pairs of n8 tiles");

  using QTile = tile::SmemTile<T, BM, HD, kPad>;   // [BM, HD] queries, or dO (head_dim_v <= HD)
  using KVTile = tile::SmemTile<T, BN, HD, kPad>;  // [BN, HD] keys, or values
  using DsTile = tile::SmemTile<T, BM, BN, kPad>;  // [BM, BN] dS, rounded to the mma input type
  struct OwnStats {
    float inv_sum[STAGES][BM];  // split tf32: row_inv_sum per query row, 0 past the tile's rows
  };
  // The others take nothing for it (an empty base).
  struct SharedStorage : std::conditional_t<kSplitTf32<T>, OwnStats, NoOwnStats> {
    tile::SmemArray<KVTile> k, v;
    tile::SmemArray<QTile> q[STAGES], dout[STAGES];
    tile::SmemArray<DsTile> ds;
    float lse_log2[STAGES][BM];  // LSE·log2(e) per query row (split tf32: row_max), +inf past the tile's rows
    float delta[STAGES][BM];     // Δ per query row, 0 past the tile's rows
  };
  // [16 keys, BM queries] per warp, fp32, Acc16 layout: element (i, j) = key g + 8i of the warp,
  // query Acc16::col(j, t) of the step. Holds S^T, then P^T; dP^T, then dS^T.
  using Scores = Acc16<BM>;
  // [16 keys, kHeadCols] per warp, fp32: key g + 8i, column head_col0 + Acc16::col(j, t).
  using KeyAcc = Acc16<kHeadCols>;
};

// Tiles of the deterministic dQ kernel: kWarps · 16 query rows, BN keys per step.
template <class T, int HD, int BN, int STAGES>
struct DqTiles {
  static constexpr int kPad = kSmemRowPadBytes / int(sizeof(T));
  static constexpr int kVec = 16 / int(sizeof(T));
  static constexpr int kRows = kWarps * kRowsPerWarp;
  using QTile = tile::SmemTile<T, kRows, HD, kPad>;  // [kRows, HD] queries, or dO
  using KVTile = tile::SmemTile<T, BN, HD, kPad>;    // [BN, HD] keys, or values
  struct OwnStats {
    float inv_sum[kRows];  // split tf32: row_inv_sum per query row, 0 past the rows
  };
  struct SharedStorage : std::conditional_t<kSplitTf32<T>, OwnStats, NoOwnStats> {
    tile::SmemArray<QTile> q, dout;
    tile::SmemArray<KVTile> k[STAGES], v[STAGES];
    float lse_log2[kRows];  // LSE·log2(e) per query row (split tf32: row_max), +inf past the rows
    float delta[kRows];
  };
  using Scores = Acc16<BN>;  // [16 queries, BN keys] per warp: S, then P; dP, then dS
  using Output = Acc16<HD>;  // [16 queries, HD] per warp: dQ, unscaled
};

// P of one score s = q·k: 2^(s·scale_log2 - lse_log2) from the given LSE, or under split tf32 from
// the row's own statistics (lse_log2 then holds row_max, inv_sum its row_inv_sum).
template <class T>
__device__ __forceinline__ float probability(const AttentionArgs& args, float s, float lse_log2, float inv_sum) {
  if constexpr (kSplitTf32<T>) {
    return own_probability(score_sign(args) * s, lse_log2, inv_sum, fabsf(args.scale_log2));
  } else {
    const float x = s * args.scale_log2 - lse_log2;
    return kFastExp2<T> ? tile::exp2_fast(x) : tile::exp2_exact(x);
  }
}

// S = Q·K^T (and with kDp, dP = dO·V^T) for a warp's 16 query rows from row0 of the [rows][d]
// tiles q (dout) against the BN keys of k (v): the dQ kernel's products and the statistics
// kernel's, one function so that the two agree bit for bit.
template <class T, int HD, int BN, bool kDp, class Scores, class QTile, class KVTile>
__device__ __forceinline__ void dq_products(Scores& s, Scores& dp, QTile q, QTile dout, KVTile k, KVTile v,
                                            int row0) {
  constexpr int kK = tile::warp::MmaOp<T>::kK;
  s.fill(0.f);
  if constexpr (kDp) dp.fill(0.f);
  // Split tf32: two k-steps at a time (unrolled in full, hoisted fragment loads spill).
#pragma unroll(kSplitTf32<T> ? 2 : HD / kK)
  for (int k0 = 0; k0 < HD; k0 += kK) {
    FragA<T> aq, ad;
    load_a<T>(aq, q, row0, k0);
    if constexpr (kDp) load_a<T>(ad, dout, row0, k0);
#pragma unroll
    for (int n0 = 0; n0 < BN; n0 += 16) {
      FragB<T> bk[2], bv[2];
      load_b_nk<T>(bk, k, n0, k0);
      tile::warp::mma<T>(s.c[n0 / 8], aq, bk[0]);
      tile::warp::mma<T>(s.c[n0 / 8 + 1], aq, bk[1]);
      if constexpr (kDp) {
        load_b_nk<T>(bv, v, n0, k0);
        tile::warp::mma<T>(dp.c[n0 / 8], ad, bv[0]);
        tile::warp::mma<T>(dp.c[n0 / 8 + 1], ad, bv[1]);
      }
    }
  }
}

// Split tf32: acc[:, 0:COLS) += A·B[k blocks kb0 .. kb0 + BLOCKS, col0 .. col0 + COLS), A the
// register fragments of `scores`' k blocks kb0.. (P^T or dS^T in the main kernel, dS in the dQ
// kernel), B a [k][n] tile (dO or Q; K). Each 16-column block is formed from zero over the k
// blocks and then added to acc in fp32 (round to nearest): the tensor cores' own additions into
// an accumulator keep fewer bits than fp32's rounding, and over the hundreds of k-steps of a long
// sequence added straight into dK, dV or dQ that loss grew past fp32's (a model,
// docs/perf/split_tf32_accumulation_model.py: ~10× the naive fp32 sum's error straight, ~0.5×
// formed per step).
template <class T, int BLOCKS, int COLS, class Acc, class Scores, class Tile>
__device__ __forceinline__ void add_fresh_product(Acc& acc, const Scores& scores, int kb0, Tile b_tile, int col0) {
  constexpr int kK = tile::warp::MmaOp<T>::kK;
  FragA<T> a[BLOCKS];
#pragma unroll
  for (int h = 0; h < BLOCKS; ++h) a_from_acc<T>(a[h], scores, kb0 + h);
#pragma unroll
  for (int n0 = 0; n0 < COLS; n0 += 16) {
    float part[2][4] = {};
#pragma unroll
    for (int h = 0; h < BLOCKS; ++h) {
      FragB<T> bb[2];
      load_b_kn<T>(bb, b_tile, (kb0 + h) * kK, col0 + n0);
      tile::warp::mma<T>(part[0], a[h], bb[0]);
      tile::warp::mma<T>(part[1], a[h], bb[1]);
    }
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc.c[n0 / 8 + c][e] += part[c][e];
  }
}

// The main loop of the main kernel. The caller has issued (not waited for) the K/V group.
template <class T, class Tiles, int HD, int BM, int BN, int STAGES, int HEAD_SPLITS>
__device__ __forceinline__ void bwd_mainloop(const AttentionArgs& args, const Mask& mask,
                                             typename Tiles::SharedStorage& shared,
                                             int64_t q_start, int kv_head, Range cols, Range rows_all,
                                             typename Tiles::KeyAcc& dk, typename Tiles::KeyAcc& dv) {
  namespace block = tile::block;
  constexpr int kK = tile::warp::MmaOp<T>::kK;
  const int warp = int(threadIdx.x) / 32;
  const int g = lane_id() / 4, t = lane_id() % 4;
  const int key_row0 = (warp / HEAD_SPLITS) * kRowsPerWarp;   // the warp's 16 keys in the tile
  const int head_col0 = (warp % HEAD_SPLITS) * Tiles::kHeadCols;  // its dK/dV columns
  const int dq_row0 = (warp % Tiles::kDqRowWarps) * kRowsPerWarp;  // its block of dS·K
  const int dq_col0 = (warp / Tiles::kDqRowWarps) * Tiles::kDqCols;
  const int row_tiles = int((rows_all.size() + BM - 1) / BM);
  const int steps = args.group * row_tiles;  // (query head of the group, query tile) pairs
  const auto k = shared.k.tile();
  const auto v = shared.v.tile();
  const auto ds_tile = shared.ds.tile();

  auto rows_of = [&](int step) {
    const int64_t row0 = rows_all.begin + int64_t(step % row_tiles) * BM;
    return Range{row0, row0 + BM < rows_all.end ? row0 + BM : rows_all.end};
  };
  auto head_of = [&](int step) { return kv_head * args.group + step / row_tiles; };
  auto issue = [&](int step) {
    if (step < steps) {
      const int stage = step % STAGES;
      const int h = head_of(step);
      const Range rows = rows_of(step);
      const int valid = int(rows.size());
      block::load_async<Tiles::kVec, Tiles::kThreads>(shared.q[stage].tile(),
                                                      args.q.at<const T>(q_start, rows.begin, h),
                                                      args.q.seq_stride, valid, args.head_dim);
      block::load_async<Tiles::kVec, Tiles::kThreads>(shared.dout[stage].tile(),
                                                      args.dout.at<const T>(q_start, rows.begin, h),
                                                      args.dout.seq_stride, valid, args.head_dim_v);
      const int64_t stat0 = args.stat_index(q_start, h, rows.begin);
      if constexpr (kSplitTf32<T>) {
        block::load_vector_async<BM, Tiles::kThreads>(shared.lse_log2[stage], args.row_max + stat0, valid, kPosInf);
        block::load_vector_async<BM, Tiles::kThreads>(shared.inv_sum[stage], args.row_inv_sum + stat0, valid, 0.f);
      } else {
        block::load_vector_async<BM, Tiles::kThreads>(shared.lse_log2[stage], args.lse_log2 + stat0, valid, kPosInf);
      }
      block::load_vector_async<BM, Tiles::kThreads>(shared.delta[stage], args.delta + stat0, valid, 0.f);
    }
    block::commit();
  };

  for (int i = 0; i < STAGES - 1; ++i) issue(i);
  for (int step = 0; step < steps; ++step) {
    issue(step + STAGES - 1);
    block::wait<STAGES - 1>();
    __syncthreads();
    const int stage = step % STAGES;
    const auto q = shared.q[stage].tile();
    const auto dout = shared.dout[stage].tile();
    const Range rows = rows_of(step);

    // S^T = K·Q^T and dP^T = V·dO^T for the warp's 16 keys: A from the key side, B from the
    // [query][d] tiles (the "n × k" layout); each element summed as dq_products sums S and dP.
    typename Tiles::Scores s, dp;
    s.fill(0.f);
    dp.fill(0.f);
    // Not unrolled in full: with dK/dV resident, loads hoisted from later k-steps would spill.
#pragma unroll 2
    for (int k0 = 0; k0 < HD; k0 += kK) {
      FragA<T> ak, av;
      load_a<T>(ak, k, key_row0, k0);
      load_a<T>(av, v, key_row0, k0);
#pragma unroll
      for (int n0 = 0; n0 < BM; n0 += 16) {
        FragB<T> bq[2], bd[2];
        load_b_nk<T>(bq, q, n0, k0);
        load_b_nk<T>(bd, dout, n0, k0);
        tile::warp::mma_transposed<T>(s.c[n0 / 8], ak, bq[0]);
        tile::warp::mma_transposed<T>(s.c[n0 / 8 + 1], ak, bq[1]);
        tile::warp::mma_transposed<T>(dp.c[n0 / 8], av, bd[0]);
        tile::warp::mma_transposed<T>(dp.c[n0 / 8 + 1], av, bd[1]);
      }
    }

    // P^T (0 where masked), dS^T = P^T ∘ (dP^T - Δ); s becomes P^T and dp becomes dS^T.
    const bool full = rows.size() == BM && cols.size() == BN && mask.tile_is_full(rows, cols);
#pragma unroll
    for (int j = 0; j < Tiles::Scores::kCols; ++j) {
      const int query = Tiles::Scores::col(j, t);
      const float lse = shared.lse_log2[stage][query];  // split tf32: row_max
      float inv_sum = 0.f;  // split tf32: row_inv_sum
      if constexpr (kSplitTf32<T>) inv_sum = shared.inv_sum[stage][query];
      const float delta = shared.delta[stage][query];
      const Range seen = full ? Range{} : mask.keys(rows.begin + query);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float p = probability<T>(args, s(i, j), lse, inv_sum);
        if (!full) {
          const int64_t key = cols.begin + key_row0 + g + 8 * i;
          if (key < seen.begin || key >= seen.end) p = 0.f;
        }
        s(i, j) = p;
        dp(i, j) = p * (dp(i, j) - delta);
      }
    }

    // dV += P^T·dO and dK += dS^T·Q over the step's queries (k), the warp's columns (n).
    if constexpr (kSplitTf32<T>) {
      add_fresh_product<T, BM / kK, Tiles::kHeadCols>(dv, s, 0, dout, head_col0);
      add_fresh_product<T, BM / kK, Tiles::kHeadCols>(dk, dp, 0, q, head_col0);
    } else {
#pragma unroll
      for (int kb = 0; kb < BM / kK; ++kb) {
        FragA<T> ap, ads;
        a_from_acc<T>(ap, s, kb);
        a_from_acc<T>(ads, dp, kb);
#pragma unroll
        for (int n0 = 0; n0 < Tiles::kHeadCols; n0 += 16) {
          FragB<T> bd[2], bq[2];
          load_b_kn<T>(bd, dout, kb * kK, head_col0 + n0);
          load_b_kn<T>(bq, q, kb * kK, head_col0 + n0);
          tile::warp::mma<T>(dv.c[n0 / 8], ap, bd[0]);
          tile::warp::mma<T>(dv.c[n0 / 8 + 1], ap, bd[1]);
          tile::warp::mma<T>(dk.c[n0 / 8], ads, bq[0]);
          tile::warp::mma<T>(dk.c[n0 / 8 + 1], ads, bq[1]);
        }
      }
    }

    if (args.dq_accum != nullptr) {
      // dS^T registers → dS [query][key] in shared memory, once per key (the first warp of each
      // head split holds the same values as the others).
      if (warp % HEAD_SPLITS == 0) {
#pragma unroll
        for (int j = 0; j < Tiles::Scores::kCols; ++j)
#pragma unroll
          for (int i = 0; i < 2; ++i)
            ds_tile(Tiles::Scores::col(j, t), key_row0 + g + 8 * i) = tile::from_float<T>(dp(i, j));
      }
      __syncthreads();

      // This warp's [16, kDqCols] block of dS·K, added to the fp32 accumulator. dS's A fragments
      // (rows dq_row0.., all BN keys) are loaded once for every column step; split tf32, whose
      // fragments are twice the size, loads them again at each step instead of spilling.
      constexpr bool kHoistDs = !kSplitTf32<T>;
      FragA<T> a[BN / kK];
      if constexpr (kHoistDs) {
#pragma unroll
        for (int kb = 0; kb < BN / kK; ++kb) load_a<T>(a[kb], ds_tile, dq_row0, kb * kK);
      }
      // The accumulator rows of this lane (rows g and g + 8 of the warp's block; null past the
      // tile). Column pairs (2t, 2t + 1) are 8-byte aligned and both in range: the tier's head
      // dims are multiples of 8 (supports() checks it), so the row starts and d are even.
      const int h = head_of(step);
      float* dq_row[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t row = rows.begin + dq_row0 + g + 8 * i;
        dq_row[i] = row < rows.end ? args.dq_accum + args.row_index(q_start, h, row) * args.head_dim : nullptr;
      }
#pragma unroll 1
      for (int n0 = 0; n0 < Tiles::kDqCols; n0 += 16) {
        float acc[2][4] = {};  // two m16n8 C fragments: columns dq_col0 + n0 + 8x
#pragma unroll
        for (int kb = 0; kb < BN / kK; ++kb) {
          if constexpr (!kHoistDs) load_a<T>(a[kb], ds_tile, dq_row0, kb * kK);
          FragB<T> bk[2];
          load_b_kn<T>(bk, k, kb * kK, dq_col0 + n0);
          tile::warp::mma<T>(acc[0], a[kb], bk[0]);
          tile::warp::mma<T>(acc[1], a[kb], bk[1]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {  // row g + 8i: elements 2i, 2i + 1 of each fragment
          if (dq_row[i] == nullptr) continue;
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const int d = dq_col0 + n0 + 8 * x + 2 * t;
            if (d < args.head_dim) tile::atomic_add_pair(dq_row[i] + d, acc[x][2 * i], acc[x][2 * i + 1]);
          }
        }
      }
    }
    __syncthreads();  // Q/dO of this stage and dS are overwritten from here on
  }
}

// The main loop of the deterministic dQ kernel. The caller has issued the Q/dO group and filled
// the LSE/Δ vectors (made visible by the first barrier here).
template <class T, class Tiles, int HD, int BN, int STAGES>
__device__ __forceinline__ void dq_mainloop(const AttentionArgs& args, const Mask& mask,
                                            typename Tiles::SharedStorage& shared,
                                            int64_t k_start, int kv_head, Range rows, Range keys,
                                            typename Tiles::Output& dq) {
  namespace block = tile::block;
  constexpr int kK = tile::warp::MmaOp<T>::kK;
  const int warp = int(threadIdx.x) / 32;
  const int g = lane_id() / 4, t = lane_id() % 4;
  const int warp_row0 = warp * kRowsPerWarp;
  const int num_tiles = int((keys.size() + BN - 1) / BN);

  auto issue = [&](int tile_index) {
    if (tile_index < num_tiles) {
      const int64_t col0 = keys.begin + int64_t(tile_index) * BN;
      const int valid = int(keys.end - col0 < BN ? keys.end - col0 : BN);
      block::load_async<Tiles::kVec, kThreads>(shared.k[tile_index % STAGES].tile(),
                                                args.k.at<const T>(k_start, col0, kv_head), args.k.seq_stride, valid,
                                                args.head_dim);
      block::load_async<Tiles::kVec, kThreads>(shared.v[tile_index % STAGES].tile(),
                                                args.v.at<const T>(k_start, col0, kv_head), args.v.seq_stride, valid,
                                                args.head_dim_v);
    }
    block::commit();
  };

  for (int i = 0; i < STAGES - 1; ++i) issue(i);
  for (int tile_index = 0; tile_index < num_tiles; ++tile_index) {
    issue(tile_index + STAGES - 1);
    block::wait<STAGES - 1>();
    __syncthreads();
    const int stage = tile_index % STAGES;
    const auto q = shared.q.tile();
    const auto dout = shared.dout.tile();
    const auto k = shared.k[stage].tile();
    const auto v = shared.v[stage].tile();
    const int64_t col0 = keys.begin + int64_t(tile_index) * BN;
    const Range cols{col0, col0 + BN < keys.end ? col0 + BN : keys.end};

    typename Tiles::Scores s, dp;  // [16, BN] S = Q·K^T and dP = dO·V^T for the warp's rows
    dq_products<T, HD, BN, true>(s, dp, q, dout, k, v, warp_row0);

    // dp becomes dS = P ∘ (dP - Δ), 0 where masked.
    const bool full = rows.size() == Tiles::kRows && cols.size() == BN && mask.tile_is_full(rows, cols);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = warp_row0 + g + 8 * i;
      const float lse = shared.lse_log2[row];  // split tf32: row_max
      float inv_sum = 0.f;  // split tf32: row_inv_sum
      if constexpr (kSplitTf32<T>) inv_sum = shared.inv_sum[row];
      const float delta = shared.delta[row];
      const Range seen = full ? Range{} : mask.keys(rows.begin + row);
#pragma unroll
      for (int j = 0; j < Tiles::Scores::kCols; ++j) {
        float p = probability<T>(args, s(i, j), lse, inv_sum);
        if (!full) {
          const int64_t key = cols.begin + Tiles::Scores::col(j, t);
          if (key < seen.begin || key >= seen.end) p = 0.f;
        }
        dp(i, j) = p * (dp(i, j) - delta);
      }
    }

    // dQ += dS·K: A straight from dS's registers, B from the [key][d] tile. Split tf32 up to head
    // dim 64: per two k blocks (16 keys) and 16 columns, the product formed from zero and added
    // in fp32, as the main kernel does for dK and dV (A fragments for two blocks at a time; beside
    // a larger dQ they spill, -Xptxas -v: 16-56 bytes in the sm_80 code at 128, ~1.9 KB at 256).
    if constexpr (kSplitTf32<T> && HD <= 64) {
      constexpr int kPair = 2;
      static_assert((BN / kK) % kPair == 0, "the step's k blocks go in pairs");
#pragma unroll
      for (int kb0 = 0; kb0 < BN / kK; kb0 += kPair) add_fresh_product<T, kPair, HD>(dq, dp, kb0, k, 0);
    } else {
#pragma unroll
      for (int kb = 0; kb < BN / kK; ++kb) {
        FragA<T> a;
        a_from_acc<T>(a, dp, kb);
#pragma unroll
        for (int n0 = 0; n0 < HD; n0 += 16) {
          FragB<T> bk[2];
          load_b_kn<T>(bk, k, kb * kK, n0);
          tile::warp::mma<T>(dq.c[n0 / 8], a, bk[0]);
          tile::warp::mma<T>(dq.c[n0 / 8 + 1], a, bk[1]);
        }
      }
    }
    __syncthreads();  // this stage is refilled STAGES - 1 iterations from now
  }
}

}  // namespace fmha::cuda::sm80
