// The two backward kernels every tier shares, before and after its main kernel:
//   preprocess: Δ = rowsum(dO ∘ O) (dO rounded as the tier's dP product rounds it), LSE into the
//               exp2 domain (+inf for rows that see no key, so that P = 2^(S - LSE) is 0 there),
//               and the fp32 dQ accumulator zeroed;
//   convert:    dQ = scale · accumulator, stored in the tensors' dtype.
// Both are memory-bound and use one warp per row / a grid-stride loop. Neither reads a sequence
// table: Δ, the exp2-domain LSE and dQ of a (query row, head) do not depend on which sequence the
// row belongs to, so a packed call runs them over all its rows (row_kernel_args).
#pragma once

#include "cuda/common/args.h"
#include "cuda/tile/convert.cuh"
#include "cuda/tile/reduce.cuh"

namespace fmha::cuda {

inline constexpr int kRowKernelThreads = 256;
inline constexpr int kWarpSize = 32;
inline constexpr float kLog2eF = 1.4426950408889634f;

// kTf32Operands: the tier forms dP = dO·V^T on tf32 tensor cores, so Δ is formed from dO rounded
// the same way (cvt.rna). Where a row sees one key, O is that key's V as the tensor cores saw it
// (P = 1), and Δ and dP are then sums of the same products, each exact in fp32: dS = P·(dP - Δ)
// cancels to fp32 rounding instead of leaving tf32-sized residues in dQ and dK.
template <class T, bool kTf32Operands = false>
__global__ void __launch_bounds__(kRowKernelThreads) bwd_preprocess_kernel(const AttentionArgs args) {
  const int lane = threadIdx.x % kWarpSize;
  // One warp per row of the padded statistics: rows past seqlen_q get LSE = +inf and Δ = 0.
  const int64_t total = int64_t(args.batch) * args.heads * args.stat_rows;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize; w < total; w += warps) {
    const int64_t s = w % args.stat_rows;
    const int64_t h = (w / args.stat_rows) % args.heads;
    const int64_t b = w / (args.stat_rows * args.heads);
    if (s >= args.seqlen_q) {
      if (lane == 0) {
        args.delta[w] = 0.f;
        args.lse_log2[w] = __int_as_float(0x7f800000);
      }
      continue;
    }
    const T* o = args.o.at<const T>(b, s, h);
    const T* dout = args.dout.at<const T>(b, s, h);
    float dot = 0.f;
    for (int d = lane; d < args.head_dim_v; d += kWarpSize) {
      float g = tile::to_float(dout[d]);
      if constexpr (kTf32Operands) g = __uint_as_float(tile::to_tf32(g));
      dot += tile::to_float(o[d]) * g;
    }
    dot = tile::warp::row_sum<kWarpSize>(dot);
    if (lane == 0) {
      args.delta[w] = dot;
      const float lse = args.lse[b * args.lse_batch_stride + h * args.lse_head_stride + s * args.lse_seq_stride];
      args.lse_log2[w] = lse == tile::kNegInf ? __int_as_float(0x7f800000) : lse * kLog2eF;
    }
    if (args.dq_accum != nullptr) {
      float* accum = args.dq_accum + args.row_index(b, h, s) * args.dq_accum_stride;
      for (int d = lane; d < args.dq_accum_stride; d += kWarpSize) accum[d] = 0.f;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kRowKernelThreads) bwd_convert_dq_kernel(const AttentionArgs args) {
  const int64_t total = int64_t(args.batch) * args.heads * args.seqlen_q * args.head_dim;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int d = int(i % args.head_dim);
    const int64_t w = i / args.head_dim;
    const int64_t s = w % args.seqlen_q;
    const int64_t h = (w / args.seqlen_q) % args.heads;
    const int64_t b = w / (args.seqlen_q * args.heads);
    args.dq.at<T>(b, s, h)[d] = tile::from_float<T>(args.dq_accum[w * args.dq_accum_stride + d] * args.scale);
  }
}

// The row kernels' view of a call: a packed call as one sequence of all total_q rows. Its views
// then read row s at s · row stride, and its workspace rows [H, total_q] are the dense layout
// [1, H, total_q] that the row kernels index.
inline AttentionArgs row_kernel_args(const AttentionArgs& args) {
  if (!args.is_packed()) return args;
  AttentionArgs rows = args;
  rows.batch = 1;
  rows.seqlen_q = args.packed.total_q;
  return rows;
}

// Blocks for a grid-stride kernel over `items` (capped: each block loops).
inline unsigned grid_stride_blocks(int64_t items, int items_per_block) {
  constexpr int64_t kMaxBlocks = 65536;
  const int64_t blocks = (items + items_per_block - 1) / items_per_block;
  return unsigned(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace fmha::cuda
