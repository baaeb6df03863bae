// The sm80 forward mainloop: per key tile, S = Q·K^T on mma.sync, mask, row max, exp2, row sum,
// rescale, O += P·V with P taken from the score registers. K/V tiles arrive through a STAGES-deep
// cp.async pipeline. Each warp owns 16 query rows; nothing but K and V is shared between warps.
#pragma once

#include "cuda/common/args.h"
#include "cuda/sm80/sm80_config.h"
#include "cuda/sm80/sm80_fragments.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/tile.cuh"

namespace fmha::cuda::sm80 {

template <class T, int HD, int BM, int BN, int STAGES>
struct FwdTiles {
  static constexpr int kPad = kSmemRowPadBytes / int(sizeof(T));
  static constexpr int kVec = 16 / int(sizeof(T));  // elements per 16-byte cp.async
  using QTile = tile::SmemTile<T, BM, HD, kPad>;    // [BM, HD] queries
  using KVTile = tile::SmemTile<T, BN, HD, kPad>;   // [BN, HD] keys, or values (head_dim_v <= HD)
  struct SharedStorage {
    tile::SmemArray<QTile> q;
    tile::SmemArray<KVTile> k[STAGES];
    tile::SmemArray<KVTile> v[STAGES];
  };
  using Scores = Acc16<BN>;  // [16, BN] a warp's scores, then P, fp32
  using Output = Acc16<HD>;  // [16, HD] a warp's unnormalised output, fp32
  using Softmax = tile::OnlineSoftmax<2, 4>;  // rows g and g + 8, each on a quad
};

template <class T, class Tiles, int HD, int BM, int BN, int STAGES>
__device__ __forceinline__ void fwd_mainloop(const AttentionArgs& args, typename Tiles::SharedStorage& shared,
                                             int64_t b, int kv_head, Range rows, Range keys,
                                             typename Tiles::Output& acc, typename Tiles::Softmax& softmax) {
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
                                                args.k.at<const T>(b, col0, kv_head), args.k.seq_stride, valid,
                                                args.head_dim);
      block::load_async<Tiles::kVec, kThreads>(shared.v[tile_index % STAGES].tile(),
                                                args.v.at<const T>(b, col0, kv_head), args.v.seq_stride, valid,
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
    const auto k = shared.k[stage].tile();
    const auto v = shared.v[stage].tile();
    const int64_t col0 = keys.begin + int64_t(tile_index) * BN;
    const Range cols{col0, col0 + BN < keys.end ? col0 + BN : keys.end};

    typename Tiles::Scores s;  // [16, BN] S = Q·K^T for this warp's rows
    s.fill(0.f);
#pragma unroll
    for (int k0 = 0; k0 < HD; k0 += kK) {
      uint32_t a[4];
      load_a<T>(a, q, warp_row0, k0);
#pragma unroll
      for (int n0 = 0; n0 < BN; n0 += 16) {
        uint32_t bk[2][2];
        load_b_nk<T>(bk, k, n0, k0);
        tile::warp::mma<T>(s.c[n0 / 8], a, bk[0]);
        tile::warp::mma<T>(s.c[n0 / 8 + 1], a, bk[1]);
      }
    }
    tile::thread::scale(s, args.scale_log2);
    if (!(cols.size() == BN && args.mask.tile_is_full(rows, cols)))
      tile::thread::mask_scores(
          s, args.mask, [&](int i) { return rows.begin + warp_row0 + g + 8 * i; },
          [&](int j) { return cols.begin + Tiles::Scores::col(j, t); });

    float rescale[2];
    softmax.template update<true>(s, rescale);
#pragma unroll
    for (int j = 0; j < Tiles::Output::kCols; ++j) {
      acc(0, j) *= rescale[0];
      acc(1, j) *= rescale[1];
    }

    // O += P·V
#pragma unroll
    for (int kb = 0; kb < BN / kK; ++kb) {
      uint32_t a[4];
      a_from_acc<T>(a, s, kb);
#pragma unroll
      for (int n0 = 0; n0 < HD; n0 += 16) {
        uint32_t bv[2][2];
        load_b_kn<T>(bv, v, kb * kK, n0);
        tile::warp::mma<T>(acc.c[n0 / 8], a, bv[0]);
        tile::warp::mma<T>(acc.c[n0 / 8 + 1], a, bv[1]);
      }
    }
    __syncthreads();  // this stage is refilled STAGES - 1 iterations from now
  }
}

}  // namespace fmha::cuda::sm80
