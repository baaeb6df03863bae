// Storage may be fp32, fp16 or bf16 (T); tiles are fp32 in shared memory either way.
// The simt backward's shared step: for one (query tile, key tile) pair in shared memory,
// P = 2^((x - row_max)·|scale_log2|)·row_inv_sum masked, with x = sign(scale)·(q·k) and the row
// statistics of the statistics kernel (cuda/common/own_softmax.cuh says why not 2^(S·scale_log2 - LSE)),
// and dS = P ∘ (dP - Δ) with dP = dO·V^T, in the Grid16 layout (rows = queries, columns = keys).
// The main kernel (dK, dV, atomic dQ) and the deterministic dQ kernel both call it, so the two
// backward variants cannot differ on what P and dS are. The statistics kernel forms S with the
// same loads and the same product (mma_nt over the head dim, first to last), so its row max is
// one of these very scores.
#pragma once

#include "cuda/common/args.h"
#include "cuda/common/own_softmax.cuh"
#include "cuda/simt/simt_config.h"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/reduce.cuh"
#include "cuda/tile/simt.cuh"

namespace fmha::cuda::simt {

template <int HD, int BM, int BN>
struct BwdTiles {
  static_assert(BM % 16 == 0 && BN % 16 == 0 && HD % 16 == 0, "Grid16 tiles are multiples of 16");
  using QTile = tile::SmemTile<float, BM, HD, kRowPad>;   // [BM, HD] queries, or dO (head_dim_v <= HD)
  using KVTile = tile::SmemTile<float, BN, HD, kRowPad>;  // [BN, HD] keys, or values
  using PTile = tile::SmemTile<float, BM, BN, kRowPad>;   // [BM, BN] P or dS
  struct SharedStorage {
    tile::SmemArray<QTile> q, dout;
    tile::SmemArray<KVTile> k, v;
    tile::SmemArray<PTile> p, ds;
    float row_max[BM];      // [BM] max of x per query row, +inf past the tile's rows (P = 0)
    float row_inv_sum[BM];  // [BM] the softmax's normalisation per query row, 0 past the tile's rows
    float delta[BM];        // [BM] Δ per query row, 0 past the tile's rows
  };
  using Scores = tile::RegTile<float, BM / 16, BN / 16>;   // [BM, BN] queries × keys, Grid16
  using KeyAcc = tile::RegTile<float, BN / 16, HD / 16>;   // [BN, HD] dK or dV, Grid16
  using QueryAcc = tile::RegTile<float, BM / 16, HD / 16>; // [BM, HD] dQ, Grid16
};

// A [rows, HD] fp32 tile from storage type T: cp.async for fp32, converting loads for 16-bit.
template <class T, class Tile>
__device__ __forceinline__ void load_fp32_tile(Tile dst, const T* src, int64_t row_stride, int rows, int cols) {
  if constexpr (sizeof(T) == sizeof(float))
    tile::block::load_async<1, kThreads>(dst, src, row_stride, rows, cols);
  else
    tile::block::load_convert<kThreads>(dst, src, row_stride, rows, cols);
}

// Loads the query-side tiles (Q, dO, the row statistics, Δ) of `rows` of head h; one cp.async group.
template <class T, class Tiles, int BM>
__device__ __forceinline__ void load_query_side(const AttentionArgs& args, typename Tiles::SharedStorage& shared,
                                                int64_t q_start, int64_t h, Range rows) {
  const int valid = int(rows.size());
  load_fp32_tile(shared.q.tile(), args.q.at<const T>(q_start, rows.begin, h), args.q.seq_stride, valid, args.head_dim);
  load_fp32_tile(shared.dout.tile(), args.dout.at<const T>(q_start, rows.begin, h), args.dout.seq_stride, valid,
                 args.head_dim_v);
  tile::block::commit();
  const int64_t stat0 = args.stat_index(q_start, h, rows.begin);
  tile::block::load_vector<BM, kThreads>(shared.row_max, args.row_max + stat0, valid, __int_as_float(0x7f800000));
  tile::block::load_vector<BM, kThreads>(shared.row_inv_sum, args.row_inv_sum + stat0, valid, 0.f);
  tile::block::load_vector<BM, kThreads>(shared.delta, args.delta + stat0, valid, 0.f);
}

// Loads the key-side tiles (K, V) of `cols`; one cp.async group.
template <class T, class Tiles>
__device__ __forceinline__ void load_key_side(const AttentionArgs& args, typename Tiles::SharedStorage& shared,
                                              int64_t k_start, int64_t kv_head, Range cols) {
  const int valid = int(cols.size());
  load_fp32_tile(shared.k.tile(), args.k.at<const T>(k_start, cols.begin, kv_head), args.k.seq_stride, valid,
                 args.head_dim);
  load_fp32_tile(shared.v.tile(), args.v.at<const T>(k_start, cols.begin, kv_head), args.v.seq_stride, valid,
                 args.head_dim_v);
  tile::block::commit();
}

template <class Tiles, int HD, int BM, int BN>
__device__ __forceinline__ void score_gradients(const AttentionArgs& args, const Mask& mask,
                                                typename Tiles::SharedStorage& shared,
                                                Range rows, Range cols, tile::Grid16 g, typename Tiles::Scores& p,
                                                typename Tiles::Scores& ds) {
  p.fill(0.f);
  tile::thread::mma_nt<HD>(p, shared.q.tile(), shared.k.tile(), g);  // S = Q·K^T
  typename Tiles::Scores dp;                                           // [BM, BN] dP = dO·V^T
  dp.fill(0.f);
  tile::thread::mma_nt<HD>(dp, shared.dout.tile(), shared.v.tile(), g);
  tile::thread::scale(p, score_sign(args));  // x = sign(scale)·S: exact
  if (!(rows.size() == BM && cols.size() == BN && mask.tile_is_full(rows, cols)))
    tile::thread::mask_scores(
        p, mask, [&](int i) { return rows.begin + g.row(i); }, [&](int j) { return cols.begin + g.col(j); });
  const float scale_log2 = fabsf(args.scale_log2);
#pragma unroll
  for (int i = 0; i < BM / 16; ++i) {
    const float row_max = shared.row_max[g.row(i)], inv_sum = shared.row_inv_sum[g.row(i)];
    const float delta = shared.delta[g.row(i)];
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
      p(i, j) = own_probability(p(i, j), row_max, inv_sum, scale_log2);
      ds(i, j) = p(i, j) * (dp(i, j) - delta);
    }
  }
}

}  // namespace fmha::cuda::simt
