// Host helpers shared by the launchers: CUDA errors come back as Status, never abort, and the
// dynamic shared memory opt-in above 48 KiB is done once per kernel before its launch.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "fmha/fmha.h"

namespace fmha::cuda {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::success();
  return {Code::cuda_error, std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")"};
}

// The error of the launch just made (configuration, resources), without waiting for the kernel.
inline Status check_launch(const char* kernel) { return cuda_status(cudaGetLastError(), kernel); }

template <class Kernel>
Status prepare_kernel(Kernel kernel, size_t shared_bytes, const char* name) {
  if (shared_bytes <= 48 * 1024) return Status::success();
  return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)),
                     name);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace fmha::cuda
