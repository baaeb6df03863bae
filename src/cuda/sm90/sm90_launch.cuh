// Definitions of the sm90 launchers (declared in sm90_launch.h), included by the generated
// instantiation files only.
#pragma once

#include "cuda/common/launch.h"
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

}  // namespace fmha::cuda::sm90
