// The simt backward's micro-tile step (fp32 storage): for one query tile against the block's key
// tile, the same math as simt_bwd_mainloop.cuh (P = 2^((x - row_max)·|scale_log2|)·row_inv_sum masked,
// x = sign(scale)·(q·k) summed over the head dim first to last as the statistics kernel sums it,
// dS = P ∘ (dP - Δ),
// dV += P^T·dO, dK += dS^T·Q, dQ += dS·K) with each thread owning register blocks fed by float4
// shared-memory loads, so that a reduction step costs one load per eight or more FMAs (the Grid16
// kernel's cost one per two). S and dP reduce over the head dim with float4s of natural-layout
// Q, dO, K and V rows; P and dS reach the other products through shared memory transposed
// ([keys, queries]), stored as float4 columns of four query rows.
//
// Register layouts "MicroBwd" (256 threads, tx = thread % 16, ty = thread / 16):
//   Scores   (i, j), i < 4·BM/64, j < BN/16:  query row 64·(i/4) + 4·ty + i%4, key tx + 16·j
//   KeyAcc   (i, c), i < 4·BN/64, c < HD/16:  key 64·(i/4) + 4·ty + i%4, dim 64·(c/4) + 4·tx + c%4
//   QueryAcc (i, c), i < 4·BM/64, c < HD/16:  the query row of Scores, the dim of KeyAcc
// A thread's dims are float4 groups, consecutive across the 16 lanes of a half warp.
//
// Shared-memory banks: every row stride is ≡ 4 (mod 32) words (kMicroRowPad), so the 16 keys of a
// half warp's K/V reads and of its P^T/dS^T stores fall in distinct 16-byte bank groups, and the
// two half warps' query rows (4 apart) differ by 16 words. Row-of-ty reads are broadcasts.
#pragma once

#include <cstdint>

#include "cuda/common/args.h"
#include "cuda/simt/simt_bwd_mainloop.cuh"
#include "cuda/simt/simt_config.h"
#include "cuda/simt/simt_fwd_micro_mainloop.cuh"
#include "cuda/tile/atomic.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/reduce.cuh"
#include "cuda/tile/tile.cuh"

namespace fmha::cuda::simt {

static_assert(kBwdMicroPanel == kMicroPanel, "simt_config.h's micro-tile panel is the mainloop's");

template <int HD, int BM, int BN>
struct MicroBwdTiles {
  static_assert(BM % kMicroPanel == 0 && BN % kMicroPanel == 0 && HD % kMicroPanel == 0, "micro-tile shapes");
  static constexpr int kRowGroups = BM / kMicroPanel;     // float4 groups of query rows per thread
  static constexpr int kRows = kMicroVec * kRowGroups;    // query rows per thread (S, dP, dQ)
  static constexpr int kKeys = BN / kMicroSide;           // keys per thread in S and dP
  static constexpr int kKeyGroups = BN / kMicroPanel;     // float4 groups of keys per thread (dK, dV)
  static constexpr int kKeyRows = kMicroVec * kKeyGroups;  // keys per thread in dK and dV
  static constexpr int kDimGroups = HD / kMicroPanel;     // float4 groups of dims per thread
  static constexpr int kDims = kMicroVec * kDimGroups;    // dims per thread in dK, dV and dQ
  using RowTile = tile::SmemTile<float, BM, HD, kMicroRowPad>;  // [BM, HD] Q, or dO (head_dim_v <= HD)
  using KeyTile = tile::SmemTile<float, BN, HD, kMicroRowPad>;  // [BN, HD] K, or V
  using KeyRowTile = tile::SmemTile<float, BN, BM, kMicroRowPad>;  // [BN, BM] P^T, or dS^T
  struct SharedStorage {
    tile::SmemArray<RowTile> q, dout;
    tile::SmemArray<KeyTile> k, v;
    tile::SmemArray<KeyRowTile> pt, dst;
    float row_max[BM];      // [BM] max of x per query row, +inf past the tile's rows (P = 0)
    float row_inv_sum[BM];  // [BM] the softmax's normalisation per query row, 0 past the tile's rows
    float delta[BM];        // [BM] Δ per query row, 0 past the tile's rows
  };
  using Scores = tile::RegTile<float, kRows, kKeys>;       // [BM, BN] S then P, or dP then dS; MicroBwd
  using KeyAcc = tile::RegTile<float, kKeyRows, kDims>;    // [BN, HD] dK or dV, MicroBwd
  using QueryAcc = tile::RegTile<float, kRows, kDims>;     // [BM, HD] dQ, MicroBwd

  __device__ __forceinline__ static int row(int i, int ty) {
    return kMicroPanel * (i / kMicroVec) + kMicroVec * ty + i % kMicroVec;
  }
  __device__ __forceinline__ static int key(int j, int tx) { return tx + kMicroSide * j; }
  __device__ __forceinline__ static int key_row(int i, int ty) { return row(i, ty); }
  __device__ __forceinline__ static int dim(int c, int tx) {
    return kMicroPanel * (c / kMicroVec) + kMicroVec * tx + c % kMicroVec;
  }
};

// acc + a·b over the four components, in order (the same rounding as four scalar FMA steps).
__device__ __forceinline__ float fma4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// True when Q, dO, K and V can be copied in 16-byte pieces: aligned bases, strides and head dims.
__device__ __forceinline__ bool bwd_vectorizable(const AttentionArgs& args) {
  const auto aligned = [](int64_t x) { return x % kMicroVec == 0; };
  const uintptr_t bases = reinterpret_cast<uintptr_t>(args.q.data) | reinterpret_cast<uintptr_t>(args.dout.data);
  return kv_vectorizable(args) && bases % (kMicroVec * sizeof(float)) == 0 && aligned(args.q.batch_stride) &&
         aligned(args.q.seq_stride) && aligned(args.q.head_stride) && aligned(args.dout.batch_stride) &&
         aligned(args.dout.seq_stride) && aligned(args.dout.head_stride);
}

// dst[r][c] = src[r · row_stride + c] for r < rows, c < cols, zero elsewhere; 16-byte copies when
// `vec` (bwd_vectorizable), 4-byte ones otherwise. Joins the caller's next commit() group.
template <class Tile>
__device__ __forceinline__ void load_micro_tile(Tile dst, const float* src, int64_t row_stride, int rows, int cols,
                                                bool vec) {
  if (vec)
    tile::block::load_async<kMicroVec, kThreads>(dst, src, row_stride, rows, cols);
  else
    tile::block::load_async<1, kThreads>(dst, src, row_stride, rows, cols);
}

// K and V of `cols`; one cp.async group.
template <class Tiles>
__device__ __forceinline__ void load_micro_key_side(const AttentionArgs& args, typename Tiles::SharedStorage& shared,
                                                    int64_t k_start, int kv_head, Range cols, bool vec) {
  const int valid = int(cols.size());
  load_micro_tile(shared.k.tile(), args.k.at<const float>(k_start, cols.begin, kv_head), args.k.seq_stride, valid,
                  args.head_dim, vec);
  load_micro_tile(shared.v.tile(), args.v.at<const float>(k_start, cols.begin, kv_head), args.v.seq_stride, valid,
                  args.head_dim_v, vec);
  tile::block::commit();
}

// Q, dO, the row statistics and Δ of `rows` of head h; one cp.async group (the fills past the
// valid rows of the statistics and Δ are plain stores, made at once).
template <class Tiles, int BM>
__device__ __forceinline__ void load_micro_query_side(const AttentionArgs& args,
                                                      typename Tiles::SharedStorage& shared, int64_t q_start, int h,
                                                      Range rows, bool vec) {
  const int valid = int(rows.size());
  load_micro_tile(shared.q.tile(), args.q.at<const float>(q_start, rows.begin, h), args.q.seq_stride, valid,
                  args.head_dim, vec);
  load_micro_tile(shared.dout.tile(), args.dout.at<const float>(q_start, rows.begin, h), args.dout.seq_stride, valid,
                  args.head_dim_v, vec);
  const int64_t stat0 = args.stat_index(q_start, h, rows.begin);
  tile::block::load_vector_async<BM, kThreads>(shared.row_max, args.row_max + stat0, valid,
                                               __int_as_float(0x7f800000));
  tile::block::load_vector_async<BM, kThreads>(shared.row_inv_sum, args.row_inv_sum + stat0, valid, 0.f);
  tile::block::load_vector_async<BM, kThreads>(shared.delta, args.delta + stat0, valid, 0.f);
  tile::block::commit();
}

// P and dS of the (rows, cols) tile pair from Q, dO, K, V, LSE and Δ in shared memory, written
// transposed to shared.pt and shared.dst. The caller synchronises before and after.
template <class Tiles, int HD, int BM, int BN>
__device__ __forceinline__ void micro_bwd_scores(const AttentionArgs& args, const Mask& mask,
                                                 typename Tiles::SharedStorage& shared,
                                                 Range rows, Range cols, int tx, int ty) {
  const auto q = shared.q.tile(), dout = shared.dout.tile();
  const auto k = shared.k.tile(), v = shared.v.tile();
  typename Tiles::Scores s, dp;  // [BM, BN] S = Q·K^T and dP = dO·V^T, MicroBwd
  s.fill(0.f);
  dp.fill(0.f);
#pragma unroll 2
  for (int d0 = 0; d0 < HD; d0 += kMicroVec) {
    // S first, then dP: only one side's operands are live at a time.
    float4 kv4[Tiles::kKeys];  // K (then V) [key(j)][d0, d0 + 4)
#pragma unroll
    for (int j = 0; j < Tiles::kKeys; ++j) kv4[j] = *reinterpret_cast<const float4*>(&k(Tiles::key(j, tx), d0));
#pragma unroll
    for (int i = 0; i < Tiles::kRows; ++i) {
      const float4 q4 = *reinterpret_cast<const float4*>(&q(Tiles::row(i, ty), d0));  // Q[row(i)][d0, d0 + 4)
#pragma unroll
      for (int j = 0; j < Tiles::kKeys; ++j) s(i, j) = fma4(q4, kv4[j], s(i, j));
    }
#pragma unroll
    for (int j = 0; j < Tiles::kKeys; ++j) kv4[j] = *reinterpret_cast<const float4*>(&v(Tiles::key(j, tx), d0));
#pragma unroll
    for (int i = 0; i < Tiles::kRows; ++i) {
      const float4 o4 = *reinterpret_cast<const float4*>(&dout(Tiles::row(i, ty), d0));  // dO[row(i)][d0, d0 + 4)
#pragma unroll
      for (int j = 0; j < Tiles::kKeys; ++j) dp(i, j) = fma4(o4, kv4[j], dp(i, j));
    }
  }

  tile::thread::scale(s, score_sign(args));  // x = sign(scale)·S: exact
  if (!(rows.size() == BM && cols.size() == BN && mask.tile_is_full(rows, cols)))
    tile::thread::mask_scores(
        s, mask, [&](int i) { return rows.begin + Tiles::row(i, ty); },
        [&](int j) { return cols.begin + Tiles::key(j, tx); });
  const float scale_log2 = fabsf(args.scale_log2);
#pragma unroll
  for (int i = 0; i < Tiles::kRows; ++i) {
    const float row_max = shared.row_max[Tiles::row(i, ty)], inv_sum = shared.row_inv_sum[Tiles::row(i, ty)];
    const float delta = shared.delta[Tiles::row(i, ty)];
#pragma unroll
    for (int j = 0; j < Tiles::kKeys; ++j) {
      s(i, j) = own_probability(s(i, j), row_max, inv_sum, scale_log2);  // P
      dp(i, j) = s(i, j) * (dp(i, j) - delta);    // dS
    }
  }

  // P^T and dS^T: a thread's four consecutive query rows of one key are one float4 store.
  const auto pt = shared.pt.tile(), dst = shared.dst.tile();
#pragma unroll
  for (int r = 0; r < Tiles::kRowGroups; ++r)
#pragma unroll
    for (int j = 0; j < Tiles::kKeys; ++j) {
      const int i = kMicroVec * r;
      float* p_at = &pt(Tiles::key(j, tx), kMicroPanel * r + kMicroVec * ty);
      float* ds_at = &dst(Tiles::key(j, tx), kMicroPanel * r + kMicroVec * ty);
      *reinterpret_cast<float4*>(p_at) = make_float4(s(i, j), s(i + 1, j), s(i + 2, j), s(i + 3, j));
      *reinterpret_cast<float4*>(ds_at) = make_float4(dp(i, j), dp(i + 1, j), dp(i + 2, j), dp(i + 3, j));
    }
}

// dV += P^T·dO and dK += dS^T·Q (unscaled) over the tile's BM query rows; rows past the valid
// ones hold P = dS = 0.
template <class Tiles, int BM>
__device__ __forceinline__ void micro_bwd_key_grads(typename Tiles::SharedStorage& shared, typename Tiles::KeyAcc& dk,
                                                    typename Tiles::KeyAcc& dv, int tx, int ty) {
  const auto q = shared.q.tile(), dout = shared.dout.tile();
  const auto pt = shared.pt.tile(), dst = shared.dst.tile();
#pragma unroll 2
  for (int m0 = 0; m0 < BM; m0 += kMicroVec) {
    float4 p4[Tiles::kKeyRows], ds4[Tiles::kKeyRows];  // P^T, dS^T [key_row(i)][m0, m0 + 4)
#pragma unroll
    for (int i = 0; i < Tiles::kKeyRows; ++i) {
      p4[i] = *reinterpret_cast<const float4*>(&pt(Tiles::key_row(i, ty), m0));
      ds4[i] = *reinterpret_cast<const float4*>(&dst(Tiles::key_row(i, ty), m0));
    }
#pragma unroll
    for (int mm = 0; mm < kMicroVec; ++mm) {
      float4 o4[Tiles::kDimGroups], q4[Tiles::kDimGroups];  // dO, Q [m0 + mm][dim(4g), dim(4g) + 4)
#pragma unroll
      for (int g = 0; g < Tiles::kDimGroups; ++g) {
        o4[g] = *reinterpret_cast<const float4*>(&dout(m0 + mm, kMicroPanel * g + kMicroVec * tx));
        q4[g] = *reinterpret_cast<const float4*>(&q(m0 + mm, kMicroPanel * g + kMicroVec * tx));
      }
#pragma unroll
      for (int i = 0; i < Tiles::kKeyRows; ++i) {
        const float p = component(p4[i], mm), ds = component(ds4[i], mm);
#pragma unroll
        for (int c = 0; c < Tiles::kDims; ++c) {
          dv(i, c) = fmaf(p, component(o4[c / kMicroVec], c % kMicroVec), dv(i, c));
          dk(i, c) = fmaf(ds, component(q4[c / kMicroVec], c % kMicroVec), dk(i, c));
        }
      }
    }
  }
}

// This key tile's share of dQ (dS·K, unscaled) for `rows` of head h, added into args.dq_accum:
// float4 atomics where the four dims are in range and rows are 16-byte aligned, scalar ones
// otherwise. Keys past the valid ones hold dS = 0.
template <class Tiles, int BN>
__device__ __forceinline__ void micro_bwd_query_grads(const AttentionArgs& args,
                                                      typename Tiles::SharedStorage& shared, int64_t q_start, int h,
                                                      Range rows, int tx, int ty) {
  const auto k = shared.k.tile();
  const auto dst = shared.dst.tile();
  typename Tiles::QueryAcc dq;  // [BM, HD] dS·K, MicroBwd
  dq.fill(0.f);
#pragma unroll 4
  for (int n = 0; n < BN; ++n) {
    float4 ds4[Tiles::kRowGroups];  // dS^T[n][row(4r), row(4r) + 4)
    float4 k4[Tiles::kDimGroups];   // K[n][dim(4g), dim(4g) + 4)
#pragma unroll
    for (int r = 0; r < Tiles::kRowGroups; ++r)
      ds4[r] = *reinterpret_cast<const float4*>(&dst(n, kMicroPanel * r + kMicroVec * ty));
#pragma unroll
    for (int g = 0; g < Tiles::kDimGroups; ++g)
      k4[g] = *reinterpret_cast<const float4*>(&k(n, kMicroPanel * g + kMicroVec * tx));
#pragma unroll
    for (int i = 0; i < Tiles::kRows; ++i) {
      const float ds = component(ds4[i / kMicroVec], i % kMicroVec);
#pragma unroll
      for (int c = 0; c < Tiles::kDims; ++c)
        dq(i, c) = fmaf(ds, component(k4[c / kMicroVec], c % kMicroVec), dq(i, c));
    }
  }

  // dq_accum rows are head_dim floats from a 256-byte aligned workspace.
  const bool quads = args.head_dim % kMicroVec == 0;
#pragma unroll
  for (int i = 0; i < Tiles::kRows; ++i) {
    const int r = Tiles::row(i, ty);
    if (r >= rows.size()) continue;
    float* accum = args.dq_accum + args.row_index(q_start, h, rows.begin + r) * args.head_dim;
#pragma unroll
    for (int g = 0; g < Tiles::kDimGroups; ++g) {
      const int d = kMicroPanel * g + kMicroVec * tx;
      const int c = kMicroVec * g;
      const float4 x = make_float4(dq(i, c), dq(i, c + 1), dq(i, c + 2), dq(i, c + 3));
      if (quads && d + kMicroVec <= args.head_dim) {
        tile::atomic_add_quad(accum + d, x);
      } else {
#pragma unroll
        for (int e = 0; e < kMicroVec; ++e)
          if (d + e < args.head_dim) atomicAdd(accum + d + e, component(x, e));
      }
    }
  }
}

}  // namespace fmha::cuda::simt
