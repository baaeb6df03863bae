// A build without CUDA: no GPU tiers and no CUDA devices.
#include "backends.h"
#include "tune/device.h"

namespace fmha::detail {

std::vector<BackendEntry> cuda_backends() { return {}; }
std::vector<DeviceInfo> cuda_devices() { return {}; }
std::string cuda_device_key(int) { return {}; }
std::unique_ptr<TuneDevice> make_cuda_tune_device(int) { return nullptr; }
Status cuda_merge(const MergeRows&, void*) {
  return {Code::no_device, "out: tensors are on a CUDA device but this build has no CUDA support (configure with CUDA)"};
}

Status cuda_append_kv(const Params&) {
  return {Code::no_device, "k: the cache is on a CUDA device but this build has no CUDA support (configure with CUDA)"};
}

}  // namespace fmha::detail
