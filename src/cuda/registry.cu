// The GPU tiers compiled into this build and the CUDA devices this process can see.
#include <cuda_runtime.h>

#include "backends.h"

namespace fmha::detail {

std::vector<BackendEntry> cuda_backends() { return {}; }

std::vector<DeviceInfo> cuda_devices() {
  std::vector<DeviceInfo> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for a CPU run
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo info;
    info.device = Device{DeviceType::cuda, i};
    info.name = prop.name;
    info.compute_capability = prop.major * 10 + prop.minor;
    info.multiprocessors = prop.multiProcessorCount;
    info.memory_bytes = prop.totalGlobalMem;
    out.push_back(info);
  }
  return out;
}

}  // namespace fmha::detail
