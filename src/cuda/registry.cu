// The GPU tiers compiled into this build and the CUDA devices this process can see.
// Order matters: auto-selection takes the first tier that supports a call, so sm90 (Hopper)
// comes before sm80 (tensor cores, sm_80+), and that before simt (exact fp32, any GPU).
#include <cuda_runtime.h>

#include <string>

#include "backends.h"
#include "cuda/common/host.h"
#include "cuda/instances.h"
#include "cuda/simt/simt_dispatch.h"
#if FMHA_CUDA_SM80_MIN_ARCH
#include "cuda/sm80/sm80_dispatch.h"
#endif
#if FMHA_CUDA_SM90
#include "cuda/sm90/sm90_dispatch.h"
#endif

namespace fmha::detail {

std::vector<BackendEntry> cuda_backends() {
  std::vector<BackendEntry> out;
#if FMHA_CUDA_SM90
  out.push_back({Backend::cuda_sm90, DeviceType::cuda, cuda::sm90::supports, cuda::sm90::run,
                 cuda::sm90::workspace_size, cuda::sm90::variants, cuda::sm90::variant_of});
#endif
#if FMHA_CUDA_SM80_MIN_ARCH
  out.push_back({Backend::cuda_sm80, DeviceType::cuda, cuda::sm80::supports, cuda::sm80::run,
                 cuda::sm80::workspace_size, cuda::sm80::variants, cuda::sm80::variant_of});
#endif
  out.push_back({Backend::cuda_simt, DeviceType::cuda, cuda::simt::supports, cuda::simt::run,
                 cuda::workspace_size, cuda::simt::variants, cuda::simt::variant_of});
  return out;
}

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

std::string cuda_device_key(int ordinal) {
  cudaDeviceProp prop{};
  int runtime = 0, driver = 0;
  if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess || cudaRuntimeGetVersion(&runtime) != cudaSuccess ||
      cudaDriverGetVersion(&driver) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  // CUDA versions are 1000 * major + 10 * minor.
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  return std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, CUDA runtime " +
         version(runtime) + ", driver " + version(driver);
}

}  // namespace fmha::detail
