// Definitions of the sm90 launchers (declared in sm90_launch.h), included by the generated
// instantiation files only. The backward runs between the preprocess and convert kernels every
// tier shares (cuda/common/bwd_common.cuh).
#pragma once

#include "cuda/common/bwd_common.cuh"
#include "cuda/common/launch.h"
#include "cuda/sm90/sm90_bwd_kernel.cuh"
#include "cuda/sm90/sm90_fwd_kernel.cuh"
#include "cuda/sm90/sm90_launch.h"

namespace fmha::cuda::sm90 {

template <class T, int HD, int VARIANT>
size_t forward_shared_bytes() {
  return FwdKernel<T, HD, VARIANT>::kSharedBytes;
}

template <class T, int HD, int VARIANT>
Status forward(const FwdParams& params, int grid, cudaStream_t stream) {
  using K = FwdKernel<T, HD, VARIANT>;
  if (grid <= 0) return Status::success();
  auto kernel = fwd_kernel<T, HD, VARIANT>;
  if (Status s = prepare_kernel(kernel, K::kSharedBytes, "sm90 forward"); !s.ok()) return s;
  kernel<<<grid, K::kThreads, K::kSharedBytes, stream>>>(params);
  return check_launch("sm90 forward kernel launch");
}

template <class T, int HD>
size_t backward_shared_bytes() {
  return BwdKernel<T, HD>::kSharedBytes;
}

template <class T, int HD>
Status backward(const BwdParams& params, cudaStream_t stream) {
  using K = BwdKernel<T, HD>;
  const AttentionArgs& args = params.args;
  const int64_t rows = int64_t(args.batch) * args.heads * args.seqlen_q;
  if (rows > 0) {
    const int kWarpsPerBlock = kRowKernelThreads / kWarpSize;
    bwd_preprocess_kernel<T><<<grid_stride_blocks(rows, kWarpsPerBlock), kRowKernelThreads, 0, stream>>>(args);
    if (Status s = check_launch("sm90 backward preprocess launch"); !s.ok()) return s;
  }
  const dim3 grid(unsigned(ceil_div(args.seqlen_k, kBwdKeys)), unsigned(args.kv_heads), unsigned(args.batch));
  if (grid.x > 0 && grid.y > 0 && grid.z > 0) {
    auto kernel = bwd_kernel<T, HD>;
    if (Status s = prepare_kernel(kernel, K::kSharedBytes, "sm90 backward"); !s.ok()) return s;
    kernel<<<grid, K::kThreads, K::kSharedBytes, stream>>>(params);
    if (Status s = check_launch("sm90 backward kernel launch"); !s.ok()) return s;
  }
  if (rows == 0) return Status::success();
  const int64_t elements = rows * args.head_dim;
  bwd_convert_dq_kernel<T><<<grid_stride_blocks(elements, kRowKernelThreads), kRowKernelThreads, 0, stream>>>(args);
  return check_launch("sm90 backward dQ convert launch");
}

}  // namespace fmha::cuda::sm90
