// fmha::merge on CUDA tensors: a memory-bound kernel, one warp per (batch, row, head) row of the
// output, lanes striding over head_dim_v so that loads and stores are coalesced. The per-row
// weights are common/merge.h's, the same function the CPU path calls.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backends.h"
#include "common/merge.h"

namespace fmha::detail {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreadsPerBlock = kWarpSize * kWarpsPerBlock;
// Blocks beyond this loop over the rows (grid-stride) instead of being launched.
constexpr int64_t kMaxBlocks = int64_t(1) << 20;

// A [batch, seqlen, heads, dim] view (lse: [batch, heads, seqlen]) with its storage format.
struct RowView {
  void* data = nullptr;
  DType dtype = DType::fp32;
  int64_t stride[4] = {};
};

RowView row_view(const Tensor& t) {
  RowView v;
  v.data = t.data;
  v.dtype = t.dtype;
  for (int d = 0; d < t.rank; ++d) v.stride[d] = t.stride[d];
  return v;
}

struct MergeArgs {
  RowView out_a, lse_a, out_b, lse_b, out, lse;
  int64_t seqlen = 0, heads = 0, head_dim_v = 0, rows = 0;
};

__device__ __forceinline__ float load(const RowView& v, int64_t index) {
  switch (v.dtype) {
    case DType::fp16: return __half2float(static_cast<const __half*>(v.data)[index]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(v.data)[index]);
    default: return static_cast<const float*>(v.data)[index];
  }
}

__device__ __forceinline__ void store(const RowView& v, int64_t index, float x) {
  switch (v.dtype) {
    case DType::fp16: static_cast<__half*>(v.data)[index] = __float2half_rn(x); break;
    case DType::bf16: static_cast<__nv_bfloat16*>(v.data)[index] = __float2bfloat16_rn(x); break;
    default: static_cast<float*>(v.data)[index] = x; break;
  }
}

__device__ __forceinline__ int64_t out_offset(const RowView& v, int64_t b, int64_t s, int64_t h) {
  return b * v.stride[0] + s * v.stride[1] + h * v.stride[2];
}
__device__ __forceinline__ int64_t lse_offset(const RowView& v, int64_t b, int64_t s, int64_t h) {
  return b * v.stride[0] + h * v.stride[1] + s * v.stride[2];
}

__global__ void __launch_bounds__(kThreadsPerBlock) merge_kernel(const MergeArgs a) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize; r < a.rows; r += warps) {
    const int64_t h = r % a.heads, s = (r / a.heads) % a.seqlen, b = r / (a.heads * a.seqlen);
    // Every lane reads both LSEs before lane 0 writes the merged one: lse may be lse_a or lse_b.
    const float lse_a = static_cast<const float*>(a.lse_a.data)[lse_offset(a.lse_a, b, s, h)];
    const float lse_b = static_cast<const float*>(a.lse_b.data)[lse_offset(a.lse_b, b, s, h)];
    const MergeWeights w = merge_weights(lse_a, lse_b);
    const int64_t oa = out_offset(a.out_a, b, s, h), ob = out_offset(a.out_b, b, s, h), o = out_offset(a.out, b, s, h);
    // Each element is read and written by the same lane, so out may be out_a or out_b.
    for (int64_t d = lane; d < a.head_dim_v; d += kWarpSize) {
      float x = 0.f;
      if (w.a != 0.f) x += w.a * load(a.out_a, oa + d);
      if (w.b != 0.f) x += w.b * load(a.out_b, ob + d);
      store(a.out, o + d, x);
    }
    __syncwarp();
    if (lane == 0) static_cast<float*>(a.lse.data)[lse_offset(a.lse, b, s, h)] = w.lse;
  }
}

}  // namespace

Status cuda_merge(const MergeRows& m, void* stream) {
  int ordinal = 0, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&ordinal) != cudaSuccess) {
    cudaGetLastError();
    return {Code::no_device, "out_a: no usable CUDA device (none found, or no driver)"};
  }
  if (m.out_a.device.index != ordinal)
    return {Code::invalid_argument, "out_a: is on cuda:" + std::to_string(m.out_a.device.index) +
                                        " but the current device is cuda:" + std::to_string(ordinal) +
                                        "; make that device current (cudaSetDevice) before the call"};
  MergeArgs a;
  a.out_a = row_view(m.out_a);
  a.lse_a = row_view(m.lse_a);
  a.out_b = row_view(m.out_b);
  a.lse_b = row_view(m.lse_b);
  a.out = row_view(m.out);
  a.lse = row_view(m.lse);
  a.seqlen = m.seqlen;
  a.heads = m.heads;
  a.head_dim_v = m.head_dim_v;
  a.rows = m.rows();
  const int64_t blocks = std::min<int64_t>((a.rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
  merge_kernel<<<unsigned(blocks), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(a);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess)
    return {Code::cuda_error, std::string("merge: kernel launch failed: ") + cudaGetErrorString(err)};
  return Status::success();
}

}  // namespace fmha::detail
