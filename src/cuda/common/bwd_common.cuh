// The two backward kernels every tier shares, before and after its main kernel:
//   preprocess: Δ = rowsum(dO ∘ O) (dO rounded as the tier's dP product rounds it), LSE into the
//               exp2 domain (+inf for rows that see no key, so that P = 2^(S - LSE) is 0 there),
//               and the fp32 dQ accumulator zeroed;
//   convert:    dQ = scale · accumulator, stored in the tensors' dtype.
// Both are memory-bound: grid-stride loops over rows, a few lanes per row in 16-byte vectors.
// Neither reads a sequence table: Δ, the exp2-domain LSE and dQ of a (query row, head) do not
// depend on which sequence the row belongs to, so a packed call runs them over all its rows
// (row_kernel_args).
#pragma once

#include <cstdint>
#include <string>

#include "cuda/common/args.h"
#include "cuda/common/launch.h"
#include "cuda/tile/convert.cuh"
#include "cuda/tile/reduce.cuh"

namespace fmha::cuda {

inline constexpr int kRowKernelThreads = 256;
inline constexpr int kWarpSize = 32;
inline constexpr float kLog2eF = 1.4426950408889634f;

// The row kernels' shape, chosen on the host per call (launch_bwd_preprocess,
// launch_bwd_convert_dq): `lanes` lanes of a warp
// share one row (a power of two, at most the warp), each taking one 16-byte vector of it per
// turn; `vectors` says that every row the kernel reads or writes in the storage type starts on 16
// bytes and is whole vectors (else it goes element by element, `lanes` apart), `accum_vectors`
// the same of the fp32 dQ accumulator's rows. On an H200 (docs/PERF.md, 2026-12-05) a warp per
// row with 2-byte accesses ran the preprocess at 36 % and the convert at 16 % of the memory's
// bandwidth: 0.42 ms of a 1.1 ms sm90 backward at B32 H16 S512 D128 bf16.
struct RowKernelShape {
  int lanes = kWarpSize;
  bool vectors = false;
  bool accum_vectors = false;
};

inline constexpr int kAccumVector = tile::kVector16<float>;  // floats of the accumulator in one 16-byte vector

// One 16-byte vector of T as floats, and back.
template <class T>
__device__ __forceinline__ void load_vector(const T* p, float (&out)[tile::kVector16<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < tile::kVector16<T>; ++i) out[i] = tile::to_float(e[i]);
}
template <class T>
__device__ __forceinline__ void store_vector(T* p, const float (&in)[tile::kVector16<T>]) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < tile::kVector16<T>; ++i) e[i] = tile::from_float<T>(in[i]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// The rows of a row kernel's grid-stride loop: each warp takes kWarpSize / lanes consecutive rows
// per turn, and every lane of the warp runs the same turns (so that the lanes of a row may shuffle
// with the whole warp's mask). f(row, live, lane_in_row) per turn; live is false for a group past
// the last row.
template <class F>
__device__ __forceinline__ void for_row_groups(int64_t total, int lanes, F&& f) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int rows_per_warp = kWarpSize / lanes;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t first = warp * rows_per_warp; first < total; first += warps * rows_per_warp) {
    const int64_t row = first + lane / lanes;
    f(row, row < total, lane % lanes);
  }
}

// kTf32Operands: the tier forms dP = dO·V^T on tf32 tensor cores, so Δ is formed from dO rounded
// the same way (cvt.rna; kTiesToEven: cvt.rn, as the sm90 tier rounds). Where a row sees one key, O is that key's V as the tensor cores saw it
// (P = 1), and Δ and dP are then sums of the same products, each exact in fp32: dS = P·(dP - Δ)
// cancels to fp32 rounding instead of leaving tf32-sized residues in dQ and dK.
template <class T, bool kTf32Operands = false, bool kTiesToEven = false>
__global__ void __launch_bounds__(kRowKernelThreads)
    bwd_preprocess_kernel(const AttentionArgs args, const RowKernelShape shape) {
  // Every row of the padded statistics: rows past seqlen_q get LSE = +inf and Δ = 0.
  const int64_t total = int64_t(args.batch) * args.heads * args.stat_rows;
  const int lanes = shape.lanes;
  for_row_groups(total, lanes, [&](int64_t w, bool live, int sub) {
    const int64_t s = w % args.stat_rows;
    const int64_t h = (w / args.stat_rows) % args.heads;
    const int64_t b = w / (args.stat_rows * args.heads);
    const bool inside = live && s < args.seqlen_q;
    float dot = 0.f;
    if (inside) {
      const T* o = args.o.at<const T>(b, s, h);
      const T* dout = args.dout.at<const T>(b, s, h);
      auto add = [&](float ov, float g) {
        if constexpr (kTf32Operands) g = __uint_as_float(kTiesToEven ? tile::to_tf32_rn(g) : tile::to_tf32(g));
        dot += ov * g;
      };
      if (shape.vectors) {
        constexpr int V = tile::kVector16<T>;
        for (int d = sub * V; d < args.head_dim_v; d += lanes * V) {
          float ov[V], gv[V];
          load_vector(o + d, ov);
          load_vector(dout + d, gv);
#pragma unroll
          for (int i = 0; i < V; ++i) add(ov[i], gv[i]);
        }
      } else {
        for (int d = sub; d < args.head_dim_v; d += lanes) add(tile::to_float(o[d]), tile::to_float(dout[d]));
      }
      if (args.dq_accum != nullptr) {
        float* accum = args.dq_accum + args.row_index(b, h, s) * args.dq_accum_stride;
        if (shape.accum_vectors) {
          for (int d = sub * kAccumVector; d < args.dq_accum_stride; d += lanes * kAccumVector)
            *reinterpret_cast<float4*>(accum + d) = make_float4(0.f, 0.f, 0.f, 0.f);
        } else {
          for (int d = sub; d < args.dq_accum_stride; d += lanes) accum[d] = 0.f;
        }
      }
    }
    // The row's lanes are aligned groups of `lanes`: xor offsets below it stay inside the group.
    for (int offset = lanes / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (live && sub == 0) {
      args.delta[w] = inside ? dot : 0.f;
      float lse_log2 = __int_as_float(0x7f800000);
      if (inside) {
        const float lse = args.lse[b * args.lse_batch_stride + h * args.lse_head_stride + s * args.lse_seq_stride];
        if (lse != tile::kNegInf) lse_log2 = lse * kLog2eF;
      }
      args.lse_log2[w] = lse_log2;
    }
  });
}

// dQ = scale · accumulator in the storage type, the rows in the accumulator's order ([B, H, Sq]).
template <class T>
__global__ void __launch_bounds__(kRowKernelThreads)
    bwd_convert_dq_kernel(const AttentionArgs args, const RowKernelShape shape) {
  const int64_t total = int64_t(args.batch) * args.heads * args.seqlen_q;
  const int lanes = shape.lanes;
  for_row_groups(total, lanes, [&](int64_t w, bool live, int sub) {
    if (!live) return;
    const int64_t s = w % args.seqlen_q;
    const int64_t h = (w / args.seqlen_q) % args.heads;
    const int64_t b = w / (args.seqlen_q * args.heads);
    const float* accum = args.dq_accum + w * args.dq_accum_stride;
    T* dq = args.dq.at<T>(b, s, h);
    if (shape.vectors) {
      constexpr int V = tile::kVector16<T>;
      for (int d = sub * V; d < args.head_dim; d += lanes * V) {
        float x[V];
#pragma unroll
        for (int i = 0; i < V; i += kAccumVector) {
          const float4 a = *reinterpret_cast<const float4*>(accum + d + i);
          x[i] = a.x * args.scale, x[i + 1] = a.y * args.scale, x[i + 2] = a.z * args.scale,
          x[i + 3] = a.w * args.scale;
        }
        store_vector(dq + d, x);
      }
    } else {
      for (int d = sub; d < args.head_dim; d += lanes) dq[d] = tile::from_float<T>(accum[d] * args.scale);
    }
  });
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

// Lanes per row: enough for one 16-byte vector each across `dim` elements of `element_bytes`
// (a power of two, at most a warp; a warp where the rows go element by element).
inline int row_lanes(int64_t dim, size_t element_bytes, bool vectors) {
  if (!vectors) return kWarpSize;
  const int64_t per_vector = 16 / int64_t(element_bytes);
  int lanes = 1;
  while (lanes < kWarpSize && lanes * per_vector < dim) lanes *= 2;
  return lanes;
}

// The accumulator's rows (workspace, 16-byte aligned) in float4s: whole vectors per row.
inline bool vector_accum(const AttentionArgs& args) {
  return args.dq_accum == nullptr ||
         (reinterpret_cast<uintptr_t>(args.dq_accum) % (kAccumVector * sizeof(float)) == 0 && args.dq_accum_stride % kAccumVector == 0);
}

// Preprocess and convert of a call's rows (row_kernel_args: a packed call as one sequence),
// launched on `stream`; `tier` names the launch in errors.
template <class T, bool kTf32Operands = false, bool kTiesToEven = false>
Status launch_bwd_preprocess(const AttentionArgs& rows_args, cudaStream_t stream, const char* tier) {
  const AttentionArgs& a = rows_args;
  const int64_t rows = int64_t(a.batch) * a.heads * a.stat_rows;
  if (rows <= 0) return Status::success();
  RowKernelShape shape;
  // fp32 storage sums Δ element by element over 32 lanes, the order its tiers were tested with on
  // a GPU: where a row sees one key Δ must cancel the tensor cores' dP to fp32 rounding (tf32
  // tiers, above), and the vectors' order (4 consecutive products a lane) left sm80 tf32's one-key
  // dK residue at 1.1x its test's bound on an H200 (docs/PERF.md, run 32). 16-bit storage, whose
  // products carry 16 significant bits and mostly sum exactly in fp32, takes the vectors.
  shape.vectors = sizeof(T) == 2 && a.o.vector_rows(a.batch, a.seqlen_q, a.heads, a.head_dim_v, sizeof(T)) &&
                  a.dout.vector_rows(a.batch, a.seqlen_q, a.heads, a.head_dim_v, sizeof(T));
  shape.accum_vectors = vector_accum(a);
  shape.lanes = row_lanes(a.head_dim_v, sizeof(T), shape.vectors);
  const int rows_per_block = kRowKernelThreads / kWarpSize * (kWarpSize / shape.lanes);
  bwd_preprocess_kernel<T, kTf32Operands, kTiesToEven>
      <<<grid_stride_blocks(rows, rows_per_block), kRowKernelThreads, 0, stream>>>(a, shape);
  return check_launch((std::string(tier) + " backward preprocess launch").c_str());
}

template <class T>
Status launch_bwd_convert_dq(const AttentionArgs& rows_args, cudaStream_t stream, const char* tier) {
  const AttentionArgs& a = rows_args;
  const int64_t rows = int64_t(a.batch) * a.heads * a.seqlen_q;
  if (rows <= 0) return Status::success();
  RowKernelShape shape;
  shape.vectors = a.dq.vector_rows(a.batch, a.seqlen_q, a.heads, a.head_dim, sizeof(T)) && vector_accum(a);
  shape.accum_vectors = shape.vectors;
  shape.lanes = row_lanes(a.head_dim, sizeof(T), shape.vectors);
  const int rows_per_block = kRowKernelThreads / kWarpSize * (kWarpSize / shape.lanes);
  bwd_convert_dq_kernel<T><<<grid_stride_blocks(rows, rows_per_block), kRowKernelThreads, 0, stream>>>(a, shape);
  return check_launch((std::string(tier) + " backward dQ convert launch").c_str());
}

}  // namespace fmha::cuda
