// How `auto` meets an fp32 call's exact-fp32 precision (`Precision::ieee`) on a GPU: with the
// simt tier's FMA arithmetic, or with split tf32 (`Precision::tf32x3`, three tf32 tensor-core
// products per product) where that is as accurate and faster. Plain C++ so that the CPU build
// tests the rule; api.cpp's choose_backend is its only user at run time.
//
// Accuracy: over the GPU fuzz's classes (plain, masked, few keys, peaked softmax), split tf32's
// mean error against fp64 is at most the simt tier's in every class and output (forward O and
// LSE, backward dQ, dK, dV; GpuSplitTf32.WithinTwiceExactFp32ErrorOnEveryFuzzClass, docs/PERF.md
// run 61; the sm90 tier's split backward at head dim 64 likewise, run 81). Speed: measured on
// compute capability 9.0 only (H100, docs/PERF.md run 62; H200, run 81): the forward is faster at
// every head dim, the backward at head dim 64 (the sm90 tier's split backward: 1.6× simt's on
// the seed shape) and above head dim 128. Elsewhere (other GPUs, KV caches, calls of a few query
// rows, the backward at head dims 96 and 128 and below 64) exact fp32 stays.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/decode.h"
#include "common/paged.h"
#include "fmha/fmha.h"

namespace fmha {

// The compute capability on which split tf32 was measured faster than the simt tier.
inline constexpr int kSplitTf32FasterComputeCapability = 90;
// The backward by split tf32 is faster than simt's at this head dim (the sm90 tier's split
// backward; sm80's is not) and above the next (on sm80 at 96 and 128 its five GEMMs' three
// products each outweigh what the tensor cores save).
inline constexpr int64_t kSplitTf32BackwardHeadDim = 64;
inline constexpr int64_t kSplitTf32BackwardAboveHeadDim = 128;

// Whether `auto` runs this call, fp32 storage asking for exact fp32, as split tf32 on a CUDA
// device of compute capability `compute_capability` (major · 10 + minor).
inline bool split_tf32_meets_ieee(const Params& p, Direction direction, int compute_capability) {
  if (p.backend != Backend::auto_select || p.q.device.type != DeviceType::cuda) return false;
  if (p.q.dtype != DType::fp32 || p.precision != Precision::ieee) return false;
  if (compute_capability != kSplitTf32FasterComputeCapability || is_paged(p)) return false;
  const bool packed = p.cu_seqlens_q.defined();
  const int64_t rows = packed ? p.max_seqlen_q : p.q.shape[1];
  if (rows <= decode::kMaxSeqlenQ) return false;  // a few query rows: not measured
  // The larger of the two head dims (the kernels' tiles are sized by it).
  const int64_t head_dim = std::max(p.q.shape[p.q.rank - 1], p.v.shape[p.v.rank - 1]);
  return direction == Direction::forward || head_dim == kSplitTf32BackwardHeadDim ||
         head_dim > kSplitTf32BackwardAboveHeadDim;
}

}  // namespace fmha
