// The simt forward mainloop: the key tiles one query tile sees, STAGES of them in flight through
// cp.async. Per tile it reads like the algorithm: S = Q·K^T, mask, row max, exp2, row sum,
// rescale, O += P·V. Exact fp32: FMA products, libdevice exp2f.
#pragma once

#include "cuda/common/args.h"
#include "cuda/simt/simt_config.h"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/reduce.cuh"
#include "cuda/tile/simt.cuh"

namespace fmha::cuda::simt {

template <int HD, int BM, int BN, int STAGES>
struct FwdTiles {
  static_assert(BM % 16 == 0 && BN % 16 == 0 && HD % 16 == 0, "Grid16 tiles are multiples of 16");
  using QTile = tile::SmemTile<float, BM, HD, kRowPad>;   // [BM, HD] queries
  using KVTile = tile::SmemTile<float, BN, HD, kRowPad>;  // [BN, HD] keys, or values (head_dim_v <= HD)
  using PTile = tile::SmemTile<float, BM, BN, kRowPad>;   // [BM, BN] probabilities
  struct SharedStorage {
    tile::SmemArray<QTile> q;
    tile::SmemArray<KVTile> k[STAGES];
    tile::SmemArray<KVTile> v[STAGES];
    tile::SmemArray<PTile> p;
  };
  using Scores = tile::RegTile<float, BM / 16, BN / 16>;  // [BM, BN] scores then P, Grid16 layout
  using Output = tile::RegTile<float, BM / 16, HD / 16>;  // [BM, HD] unnormalised output, Grid16 layout
  using Softmax = tile::OnlineSoftmax<BM / 16, tile::Grid16::kSide>;
};

template <class Tiles, int HD, int BM, int BN, int STAGES>
__device__ __forceinline__ void fwd_mainloop(const AttentionArgs& args, const Mask& mask,
                                             typename Tiles::SharedStorage& shared,
                                             int64_t k_start, int kv_head, Range rows, Range keys,
                                             typename Tiles::Output& acc, typename Tiles::Softmax& softmax,
                                             tile::Grid16 g) {
  namespace block = tile::block;
  const int num_tiles = int((keys.size() + BN - 1) / BN);

  // Issues the K and V loads of key tile t into its stage; an empty group past the end keeps
  // the wait counts the same on every iteration.
  auto issue = [&](int t) {
    if (t < num_tiles) {
      const int64_t col0 = keys.begin + int64_t(t) * BN;
      const int valid = int(keys.end - col0 < BN ? keys.end - col0 : BN);
      block::load_async<1, kThreads>(shared.k[t % STAGES].tile(), args.k.at<const float>(k_start, col0, kv_head),
                                     args.k.seq_stride, valid, args.head_dim);
      block::load_async<1, kThreads>(shared.v[t % STAGES].tile(), args.v.at<const float>(k_start, col0, kv_head),
                                     args.v.seq_stride, valid, args.head_dim_v);
    }
    block::commit();
  };

  for (int t = 0; t < STAGES - 1; ++t) issue(t);
  for (int t = 0; t < num_tiles; ++t) {
    issue(t + STAGES - 1);
    block::wait<STAGES - 1>();
    __syncthreads();
    const int stage = t % STAGES;
    const int64_t col0 = keys.begin + int64_t(t) * BN;
    const Range cols{col0, col0 + BN < keys.end ? col0 + BN : keys.end};

    typename Tiles::Scores s;  // [BM, BN] S = Q·K^T, then scaled into the exp2 domain
    s.fill(0.f);
    tile::thread::mma_nt<HD>(s, shared.q.tile(), shared.k[stage].tile(), g);
    tile::thread::scale(s, args.scale_log2);
    if (!(cols.size() == BN && mask.tile_is_full(rows, cols)))
      tile::thread::mask_scores(
          s, mask, [&](int i) { return rows.begin + g.row(i); }, [&](int j) { return cols.begin + g.col(j); });

    float rescale[BM / 16];
    softmax.template update<false>(s, rescale);
#pragma unroll
    for (int i = 0; i < BM / 16; ++i)
#pragma unroll
      for (int j = 0; j < HD / 16; ++j) acc(i, j) *= rescale[i];

    tile::thread::store(shared.p.tile(), s, g);
    __syncthreads();
    tile::thread::mma_nn<BN>(acc, shared.p.tile(), shared.v[stage].tile(), g);  // O += P·V
    __syncthreads();  // the stage and P are overwritten next iteration
  }
}

}  // namespace fmha::cuda::simt
