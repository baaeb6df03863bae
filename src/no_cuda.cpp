// A build without CUDA: no GPU tiers and no CUDA devices.
#include "backends.h"

namespace fmha::detail {

std::vector<BackendEntry> cuda_backends() { return {}; }
std::vector<DeviceInfo> cuda_devices() { return {}; }
Status cuda_merge(const MergeRows&, void*) {
  return {Code::no_device, "out: tensors are on a CUDA device but this build has no CUDA support (configure with CUDA)"};
}

}  // namespace fmha::detail
