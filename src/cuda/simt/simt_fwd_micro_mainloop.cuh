// The simt forward's micro-tile mainloop: each thread owns a register block of S and of O and
// feeds it from float4 shared-memory loads, so that a k step costs one load per eight or more
// FMAs (the Grid16 loop costs one per two). Q is stored transposed and multiplied by
// scale_log2 once, so scores come out in the exp2 domain; P goes through shared memory
// transposed, because a thread's P·V needs whole rows of P that sixteen threads computed.
//
// Register layout "Micro" (256 threads, tx = thread % 16, ty = thread / 16, RM = BM / 64):
//   Scores (i, j), i < 4·RM, j < BN/16:  query row 64·(i/4) + 4·ty + i%4, key tx + 16·j
//   Output (i, c), i < 4·RM, c < HD/16:  the same query row, dim 64·(c/4) + 4·tx + c%4
// The 16 threads of a query row are the 16 lanes of a half warp (row reductions: LANES = 16).
#pragma once

#include <cstdint>

#include "cuda/common/args.h"
#include "cuda/simt/simt_config.h"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/reduce.cuh"
#include "cuda/tile/tile.cuh"

namespace fmha::cuda::simt {

inline constexpr int kMicroSide = 16;     // threads per row and per column of the block's thread grid
inline constexpr int kMicroPanel = 64;    // rows (of S) and dims (of O) one 16-thread line covers with float4s
inline constexpr int kMicroVec = 4;       // floats per shared-memory vector load
inline constexpr int kMicroRowPad = 4;    // fp32 words: keeps float4 alignment; strides ≡ 4 (mod 32) banks
                                          // make the K reads and the transposed P stores conflict-free

template <int HD, int BM, int BN, int STAGES>
struct MicroFwdTiles {
  static_assert(BM % kMicroPanel == 0 && HD % kMicroPanel == 0 && BN % kMicroSide == 0, "micro-tile shapes");
  static constexpr int kRowGroups = BM / kMicroPanel;  // RM: float4 row groups per thread
  static constexpr int kRows = kMicroVec * kRowGroups;  // query rows per thread
  static constexpr int kKeys = BN / kMicroSide;         // keys per thread
  static constexpr int kDims = HD / kMicroSide;         // output dims per thread
  using QtTile = tile::SmemTile<float, HD, BM, kMicroRowPad>;  // [HD, BM] (Q · scale_log2)^T
  using KVTile = tile::SmemTile<float, BN, HD, kMicroRowPad>;  // [BN, HD] keys, or values (head_dim_v <= HD)
  using PtTile = tile::SmemTile<float, BN, BM, kMicroRowPad>;  // [BN, BM] P^T
  struct SharedStorage {
    tile::SmemArray<QtTile> qt;
    tile::SmemArray<KVTile> k[STAGES];
    tile::SmemArray<KVTile> v[STAGES];
    tile::SmemArray<PtTile> pt;
  };
  using Scores = tile::RegTile<float, kRows, kKeys>;  // [BM, BN] scores then P, Micro layout
  using Output = tile::RegTile<float, kRows, kDims>;  // [BM, HD] unnormalised output, Micro layout
  using Softmax = tile::OnlineSoftmax<kRows, kMicroSide>;

  __device__ __forceinline__ static int row(int i, int ty) { return kMicroPanel * (i / 4) + 4 * ty + i % 4; }
  __device__ __forceinline__ static int key(int j, int tx) { return tx + kMicroSide * j; }
  __device__ __forceinline__ static int dim(int c, int tx) { return kMicroPanel * (c / 4) + 4 * tx + c % 4; }
};

__device__ __forceinline__ float component(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Q rows `rows` of head h, transposed and scaled, into Qt (zero past the valid rows and dims).
// Once per block, so plain loads suffice; consecutive threads take consecutive rows, which keeps
// the transposed shared stores conflict-free.
template <class Tiles, int HD, int BM>
__device__ __forceinline__ void load_q_transposed(const AttentionArgs& args, typename Tiles::QtTile qt, int64_t q_start,
                                                  int h, Range rows) {
  const float* q = args.q.at<const float>(q_start, rows.begin, h);
  const int valid_rows = int(rows.size());
  for (int e = int(threadIdx.x); e < BM * HD; e += kThreads) {
    const int r = e % BM, c = e / BM;
    qt(c, r) = r < valid_rows && c < args.head_dim ? q[int64_t(r) * args.q.seq_stride + c] * args.scale_log2 : 0.f;
  }
}

// True when K and V can be copied in 16-byte pieces: aligned bases, strides and head dims.
__device__ __forceinline__ bool kv_vectorizable(const AttentionArgs& args) {
  const auto aligned = [](int64_t x) { return x % kMicroVec == 0; };
  const uintptr_t bases = reinterpret_cast<uintptr_t>(args.k.data) | reinterpret_cast<uintptr_t>(args.v.data);
  return bases % (kMicroVec * sizeof(float)) == 0 && aligned(args.k.batch_stride) && aligned(args.k.seq_stride) &&
         aligned(args.k.head_stride) && aligned(args.v.batch_stride) && aligned(args.v.seq_stride) &&
         aligned(args.v.head_stride) && aligned(args.head_dim) && aligned(args.head_dim_v);
}

template <class Tiles, int HD, int BM, int BN, int STAGES>
__device__ __forceinline__ void micro_fwd_mainloop(const AttentionArgs& args, const Mask& mask,
                                                   typename Tiles::SharedStorage& shared,
                                                   int64_t k_start, int kv_head, Range rows, Range keys,
                                                   typename Tiles::Output& acc, typename Tiles::Softmax& softmax) {
  namespace block = tile::block;
  const int tx = int(threadIdx.x) % kMicroSide, ty = int(threadIdx.x) / kMicroSide;
  const int num_tiles = int((keys.size() + BN - 1) / BN);
  const bool vec = kv_vectorizable(args);

  auto issue = [&](int t) {
    if (t < num_tiles) {
      const int64_t col0 = keys.begin + int64_t(t) * BN;
      const int valid = int(keys.end - col0 < BN ? keys.end - col0 : BN);
      const float* k = args.k.at<const float>(k_start, col0, kv_head);
      const float* v = args.v.at<const float>(k_start, col0, kv_head);
      if (vec) {
        block::load_async<kMicroVec, kThreads>(shared.k[t % STAGES].tile(), k, args.k.seq_stride, valid, args.head_dim);
        block::load_async<kMicroVec, kThreads>(shared.v[t % STAGES].tile(), v, args.v.seq_stride, valid,
                                               args.head_dim_v);
      } else {
        block::load_async<1, kThreads>(shared.k[t % STAGES].tile(), k, args.k.seq_stride, valid, args.head_dim);
        block::load_async<1, kThreads>(shared.v[t % STAGES].tile(), v, args.v.seq_stride, valid, args.head_dim_v);
      }
    }
    block::commit();
  };

  const auto qt = shared.qt.tile();
  const auto pt = shared.pt.tile();
  for (int t = 0; t < STAGES - 1; ++t) issue(t);
  for (int t = 0; t < num_tiles; ++t) {
    issue(t + STAGES - 1);
    block::wait<STAGES - 1>();
    __syncthreads();
    const auto k = shared.k[t % STAGES].tile();
    const auto v = shared.v[t % STAGES].tile();
    const int64_t col0 = keys.begin + int64_t(t) * BN;
    const Range cols{col0, col0 + BN < keys.end ? col0 + BN : keys.end};

    typename Tiles::Scores s;  // [BM, BN] S · scale_log2 (Q was pre-scaled)
    s.fill(0.f);
#pragma unroll 2
    for (int k0 = 0; k0 < HD; k0 += kMicroVec) {
      float4 key4[Tiles::kKeys];  // K[key(j)][k0, k0 + 4)
#pragma unroll
      for (int j = 0; j < Tiles::kKeys; ++j) key4[j] = *reinterpret_cast<const float4*>(&k(Tiles::key(j, tx), k0));
#pragma unroll
      for (int kk = 0; kk < kMicroVec; ++kk) {
        float q[Tiles::kRows];  // Qt[k0 + kk][row(i)]
#pragma unroll
        for (int r = 0; r < Tiles::kRowGroups; ++r) {
          const float4 q4 = *reinterpret_cast<const float4*>(&qt(k0 + kk, kMicroPanel * r + 4 * ty));
          q[4 * r] = q4.x, q[4 * r + 1] = q4.y, q[4 * r + 2] = q4.z, q[4 * r + 3] = q4.w;
        }
#pragma unroll
        for (int i = 0; i < Tiles::kRows; ++i)
#pragma unroll
          for (int j = 0; j < Tiles::kKeys; ++j) s(i, j) = fmaf(q[i], component(key4[j], kk), s(i, j));
      }
    }
    if (!(cols.size() == BN && mask.tile_is_full(rows, cols)))
      tile::thread::mask_scores(
          s, mask, [&](int i) { return rows.begin + Tiles::row(i, ty); },
          [&](int j) { return cols.begin + Tiles::key(j, tx); });

    float rescale[Tiles::kRows];
    softmax.template update<false>(s, rescale);
#pragma unroll
    for (int i = 0; i < Tiles::kRows; ++i)
#pragma unroll
      for (int c = 0; c < Tiles::kDims; ++c) acc(i, c) *= rescale[i];

    // P^T: four consecutive rows of one key are one float4 store.
#pragma unroll
    for (int r = 0; r < Tiles::kRowGroups; ++r)
#pragma unroll
      for (int j = 0; j < Tiles::kKeys; ++j)
        *reinterpret_cast<float4*>(&pt(Tiles::key(j, tx), kMicroPanel * r + 4 * ty)) =
            make_float4(s(4 * r, j), s(4 * r + 1, j), s(4 * r + 2, j), s(4 * r + 3, j));
    __syncthreads();

    // O += P·V
#pragma unroll 4
    for (int n = 0; n < BN; ++n) {
      float p[Tiles::kRows];  // P[row(i)][n]
#pragma unroll
      for (int r = 0; r < Tiles::kRowGroups; ++r) {
        const float4 p4 = *reinterpret_cast<const float4*>(&pt(n, kMicroPanel * r + 4 * ty));
        p[4 * r] = p4.x, p[4 * r + 1] = p4.y, p[4 * r + 2] = p4.z, p[4 * r + 3] = p4.w;
      }
      float4 v4[HD / kMicroPanel];  // V[n][dim(c)]
#pragma unroll
      for (int c = 0; c < HD / kMicroPanel; ++c) v4[c] = *reinterpret_cast<const float4*>(&v(n, kMicroPanel * c + 4 * tx));
#pragma unroll
      for (int i = 0; i < Tiles::kRows; ++i)
#pragma unroll
        for (int c = 0; c < Tiles::kDims; ++c) acc(i, c) = fmaf(p[i], component(v4[c / 4], c % 4), acc(i, c));
    }
    __syncthreads();  // the stage and P^T are overwritten next iteration
  }
}

}  // namespace fmha::cuda::simt
