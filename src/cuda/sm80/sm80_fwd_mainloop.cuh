// The sm80 forward mainloop: per key tile, S = Q·K^T on mma.sync, mask, row max, exp2, row sum,
// rescale, O += P·V with P taken from the score registers. K/V tiles arrive through a STAGES-deep
// cp.async pipeline; the next tile's copies are issued before this tile's mmas. Each warp owns
// WARP_BLOCKS m16 row blocks (16 or 32 query rows): a K or V fragment loaded from shared memory
// feeds WARP_BLOCKS mmas. Nothing but K and V is shared between warps.
#pragma once

#include "cuda/common/args.h"
#include "cuda/sm80/sm80_config.h"
#include "cuda/sm80/sm80_fragments.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/tile.cuh"

namespace fmha::cuda::sm80 {

inline constexpr int kMmaRows = 16;  // rows of one m16 block

// A warp's [16·BLOCKS, N] fp32 accumulator: BLOCKS Acc16 row blocks stacked. Element (i, j) is
// block i / 2's element (i % 2, j), i.e. row 16·(i/2) + g + 8·(i%2), column (j/2)·8 + 2t + j%2.
template <int N, int BLOCKS>
struct WarpAcc {
  static constexpr int kRows = 2 * BLOCKS, kCols = N / 4;
  Acc16<N> block[BLOCKS];
  __device__ __forceinline__ float& operator()(int i, int j) { return block[i / 2](i % 2, j); }
  __device__ __forceinline__ const float& operator()(int i, int j) const { return block[i / 2](i % 2, j); }
  __device__ __forceinline__ void fill(float x) {
#pragma unroll
    for (int m = 0; m < BLOCKS; ++m) block[m].fill(x);
  }
  __device__ __forceinline__ static int row(int i, int g) { return kMmaRows * (i / 2) + g + 8 * (i % 2); }
  __device__ __forceinline__ static int col(int j, int t) { return Acc16<N>::col(j, t); }
};

// Shared-memory row padding in elements. 16-bit tiles: 16 bytes, so the 8 rows of an ldmatrix
// hit distinct 16-byte bank groups. fp32 (tf32) tiles: Q and K are read as float2 pairs at
// (row g, column 2t), conflict-free when the row stride is ≡ 8 words (mod 32); V is read as
// scalars at (row 2t, column g), conflict-free when the stride is ≡ 4 words (mod 32).
template <class T>
struct SmemPads {
  static constexpr int kQK = sizeof(T) == 2 ? kSmemRowPadBytes / 2 : 8;
  static constexpr int kV = sizeof(T) == 2 ? kSmemRowPadBytes / 2 : 4;
};

template <class T, int HD, int BM, int BN, int STAGES, int WARP_BLOCKS>
struct FwdTiles {
  static constexpr int kVec = 16 / int(sizeof(T));  // elements per 16-byte cp.async
  static constexpr int kWarpBlocks = WARP_BLOCKS;
  static constexpr int kWarpRows = kMmaRows * WARP_BLOCKS;
  using QTile = tile::SmemTile<T, BM, HD, SmemPads<T>::kQK>;  // [BM, HD] queries
  using KTile = tile::SmemTile<T, BN, HD, SmemPads<T>::kQK>;  // [BN, HD] keys
  using VTile = tile::SmemTile<T, BN, HD, SmemPads<T>::kV>;   // [BN, HD] values (head_dim_v <= HD)
  struct SharedStorage {
    tile::SmemArray<QTile> q;
    tile::SmemArray<KTile> k[STAGES];
    tile::SmemArray<VTile> v[STAGES];
  };
  using Scores = WarpAcc<BN, WARP_BLOCKS>;  // [16·WARP_BLOCKS, BN] a warp's scores, then P, fp32
  using Output = WarpAcc<HD, WARP_BLOCKS>;  // [16·WARP_BLOCKS, HD] a warp's unnormalised output, fp32
  using Softmax = tile::OnlineSoftmax<2 * WARP_BLOCKS, 4>;  // rows g and g + 8 of each block, on a quad
};

template <class T, class Tiles, int HD, int BM, int BN, int STAGES, int THREADS>
__device__ __forceinline__ void fwd_mainloop(const AttentionArgs& args, const Mask& mask,
                                             typename Tiles::SharedStorage& shared,
                                             int64_t k_start, int kv_head, Range rows, Range keys,
                                             typename Tiles::Output& acc, typename Tiles::Softmax& softmax) {
  namespace block = tile::block;
  constexpr int kK = tile::warp::MmaOp<T>::kK;
  constexpr int kBlocks = Tiles::kWarpBlocks;
  // Split tf32: Q·K^T's k-steps two at a time. Unrolled in full, the Q and K fragments of later
  // steps (two halves each, converted as they load) are hoisted and the kernel runs out of
  // registers (spills at head dim 128).
  constexpr int kQkUnroll = kSplitTf32<T> ? 2 : HD / kK;
  const int warp = int(threadIdx.x) / 32;
  const int g = lane_id() / 4, t = lane_id() % 4;
  const int warp_row0 = warp * Tiles::kWarpRows;
  const int num_tiles = int((keys.size() + BN - 1) / BN);

  auto issue = [&](int tile_index) {
    if (tile_index < num_tiles) {
      const int64_t col0 = keys.begin + int64_t(tile_index) * BN;
      const int valid = int(keys.end - col0 < BN ? keys.end - col0 : BN);
      block::load_async<Tiles::kVec, THREADS>(shared.k[tile_index % STAGES].tile(),
                                               args.k.at<const T>(k_start, col0, kv_head), args.k.seq_stride, valid,
                                               args.head_dim);
      block::load_async<Tiles::kVec, THREADS>(shared.v[tile_index % STAGES].tile(),
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
    const auto k = shared.k[stage].tile();
    const auto v = shared.v[stage].tile();
    const int64_t col0 = keys.begin + int64_t(tile_index) * BN;
    const Range cols{col0, col0 + BN < keys.end ? col0 + BN : keys.end};

    typename Tiles::Scores s;  // [16·kBlocks, BN] S = Q·K^T for this warp's rows
    s.fill(0.f);
#pragma unroll kQkUnroll
    for (int k0 = 0; k0 < HD; k0 += kK) {
      FragA<T> a[kBlocks];
#pragma unroll
      for (int m = 0; m < kBlocks; ++m) load_a<T>(a[m], q, warp_row0 + kMmaRows * m, k0);
#pragma unroll
      for (int n0 = 0; n0 < BN; n0 += 16) {
        FragB<T> bk[2];
        load_b_nk<T>(bk, k, n0, k0);
#pragma unroll
        for (int m = 0; m < kBlocks; ++m) {
          tile::warp::mma<T>(s.block[m].c[n0 / 8], a[m], bk[0]);
          tile::warp::mma<T>(s.block[m].c[n0 / 8 + 1], a[m], bk[1]);
        }
      }
    }
    tile::thread::scale(s, args.scale_log2);
    if (!(cols.size() == BN && mask.tile_is_full(rows, cols)))
      tile::thread::mask_scores(
          s, mask, [&](int i) { return rows.begin + warp_row0 + Tiles::Scores::row(i, g); },
          [&](int j) { return cols.begin + Tiles::Scores::col(j, t); });

    float rescale[2 * kBlocks];
    softmax.template update<kFastExp2<T>>(s, rescale);
#pragma unroll
    for (int i = 0; i < 2 * kBlocks; ++i)
#pragma unroll
      for (int j = 0; j < Tiles::Output::kCols; ++j) acc(i, j) *= rescale[i];

    // O += P·V. P becomes A fragments once (16-bit: half the registers of the fp32 scores), then
    // each V fragment is used right after its load, which keeps the live V fragments to a few.
    FragA<T> p_frag[BN / kK][kBlocks];  // [16·kBlocks, BN] P as A fragments, per k step
#pragma unroll
    for (int kb = 0; kb < BN / kK; ++kb)
#pragma unroll
      for (int m = 0; m < kBlocks; ++m) a_from_acc<T>(p_frag[kb][m], s.block[m], kb);
#pragma unroll
    for (int n0 = 0; n0 < HD; n0 += 16) {
#pragma unroll
      for (int kb = 0; kb < BN / kK; ++kb) {
        FragB<T> bv[2];
        load_b_kn<T>(bv, v, kb * kK, n0);
#pragma unroll
        for (int m = 0; m < kBlocks; ++m) {
          tile::warp::mma<T>(acc.block[m].c[n0 / 8], p_frag[kb][m], bv[0]);
          tile::warp::mma<T>(acc.block[m].c[n0 / 8 + 1], p_frag[kb][m], bv[1]);
        }
      }
    }
    __syncthreads();  // this stage is refilled STAGES - 1 iterations from now
  }
}

}  // namespace fmha::cuda::sm80
