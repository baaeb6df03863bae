// A build without CUDA: no GPU tiers and no CUDA devices.
#include "backends.h"

namespace fmha::detail {

std::vector<BackendEntry> cuda_backends() { return {}; }
std::vector<DeviceInfo> cuda_devices() { return {}; }

}  // namespace fmha::detail
