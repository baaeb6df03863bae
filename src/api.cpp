// The public entry points and the one function that chooses a backend.
#include <algorithm>
#include <exception>
#include <new>
#include <string>
#include <thread>

#include "backends.h"
#include "common/paged.h"
#include "common/parallel.h"
#include "common/precision.h"
#include "cpu/fast_attention.h"
#include "cpu/paged.h"
#include "cpu/reference.h"
#include "fmha/fmha.h"
#include "tune/tuner.h"

#ifndef FMHA_VERSION
#define FMHA_VERSION "0.0.0"
#endif

namespace fmha {

const char* version() { return FMHA_VERSION; }

int64_t Tensor::numel() const {
  if (rank == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

size_t dtype_size(DType dtype) { return dtype == DType::fp32 || dtype == DType::int32 ? 4 : 2; }

Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = int(std::min<size_t>(shape.size(), kMaxRank));
  std::copy_n(shape.begin(), t.rank, t.shape);
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                   std::initializer_list<int64_t> strides, Device device) {
  Tensor t = make_tensor(data, dtype, shape, device);
  std::copy_n(strides.begin(), std::min<size_t>(strides.size(), size_t(t.rank)), t.stride);
  return t;
}

void throw_if_error(const Status& status) {
  if (!status.ok()) throw Error(status.code, status.message);
}

namespace detail {

namespace {
Status no_workspace(const Params&, Direction, size_t* bytes) {
  *bytes = 0;
  return Status::success();
}
Status reference_supports(const Params&, Direction) { return Status::success(); }
}  // namespace

std::vector<BackendEntry> registered_backends() {
  std::vector<BackendEntry> all = {
      {Backend::cpu, DeviceType::cpu, cpu::supports, cpu::run, no_workspace, cpu::variants, cpu::variant_of},
      {Backend::reference, DeviceType::cpu, reference_supports, reference::run, no_workspace},
  };
  for (const BackendEntry& e : cuda_backends()) all.push_back(e);
  return all;
}

}  // namespace detail

namespace {

std::string device_name(const Device& d) {
  return d.type == DeviceType::cpu ? "cpu" : "cuda:" + std::to_string(d.index);
}

// CUDA devices visible to this process, queried once.
const std::vector<DeviceInfo>& cuda_device_list() {
  static const std::vector<DeviceInfo> devices = detail::cuda_devices();
  return devices;
}
size_t cuda_device_count() { return cuda_device_list().size(); }

}  // namespace

// Validates the call and picks the backend entry that will run it, and the call it runs.
Status detail::choose_among(const Params& p, Direction direction, const std::vector<detail::BackendEntry>& entries,
                            const std::vector<DeviceInfo>& cuda_devices, detail::BackendEntry* chosen,
                            Params* resolved) {
  if (Status s = detail::validate(p, direction); !s.ok()) return s;
  const DeviceType device = p.q.device.type;
  const int index = p.q.device.index;
  const int compute_capability =
      index >= 0 && size_t(index) < cuda_devices.size() ? cuda_devices[size_t(index)].compute_capability : 0;
  *resolved = p;

  if (p.backend != Backend::auto_select) {
    const auto it = std::find_if(entries.begin(), entries.end(),
                                 [&](const detail::BackendEntry& e) { return e.id == p.backend; });
    if (it == entries.end()) {
      const bool known = p.backend == Backend::cuda_simt || p.backend == Backend::cuda_sm80 ||
                         p.backend == Backend::cuda_sm90;
      if (!known) return {Code::invalid_argument, "backend: unknown backend value"};
      return {Code::no_device, std::string("backend: ") + to_string(p.backend) +
                                   " is not available in this build (no CUDA backend was compiled in)"};
    }
    if (it->device == DeviceType::cuda && cuda_devices.empty())
      return {Code::no_device, std::string("backend: ") + to_string(p.backend) + " needs a CUDA device, and none was found"};
    if (it->device != device)
      return {Code::invalid_argument, std::string("backend: ") + to_string(p.backend) + " runs on " +
                                          (it->device == DeviceType::cpu ? "CPU" : "CUDA") + " tensors, but q is on " +
                                          device_name(p.q.device)};
    if (Status s = it->supports(p, direction); !s.ok())
      return {s.code, std::string("backend ") + to_string(p.backend) + ": " + s.message};
    *chosen = *it;
    return Status::success();
  }

  // fp32 asking for exact fp32: split tf32 on the tensor-core tiers where it is as accurate as the
  // simt tier and faster (common/precision.h); the simt tier otherwise.
  if (split_tf32_meets_ieee(p, direction, compute_capability)) {
    Params split = p;
    split.precision = Precision::tf32x3;
    for (const detail::BackendEntry& e : entries) {
      if (e.device != device || e.id == Backend::cuda_simt || !e.supports(split, direction).ok()) continue;
      *chosen = e;
      *resolved = split;
      return Status::success();
    }
  }

  std::string reasons;
  for (const detail::BackendEntry& e : entries) {
    if (e.device != device || e.id == Backend::reference) continue;
    Status s = e.supports(p, direction);
    if (s.ok()) {
      *chosen = e;
      return Status::success();
    }
    reasons += std::string(reasons.empty() ? "" : "; ") + to_string(e.id) + ": " + s.message;
  }
  if (reasons.empty())
    return {Code::no_device, "q: tensors are on " + device_name(p.q.device) +
                                 " but this build has no backend for that device (configure with CUDA)"};
  return {Code::unsupported, "no backend supports this call (" + reasons + ")"};
}

Status detail::choose_backend(const Params& p, Direction direction, detail::BackendEntry* chosen, Params* resolved) {
  return detail::choose_among(p, direction, detail::registered_backends(), cuda_device_list(), chosen, resolved);
}

namespace {

Status choose(const Params& p, Direction direction, detail::BackendEntry* chosen, Params* resolved) {
  return detail::choose_backend(p, direction, chosen, resolved);
}

Status run(const Params& params, Direction direction) {
  detail::BackendEntry entry{};
  Params p;  // the call as the chosen tier runs it
  if (Status s = choose(params, direction, &entry, &p); !s.ok()) return s;
  // Opt-in autotuning (include/fmha/tune.h): the first call of an untuned class tunes it, then
  // runs with the winner it found.
  // (Not for a KV cache: the tuner's classes and timing inputs are those of dense calls.)
  if (entry.variants && !is_paged(p) && detail::autotune_wanted(p, direction, entry.id))
    detail::autotune(p, direction, entry.id);
  try {
    return entry.run(p, direction);
  } catch (const std::bad_alloc&) {
    return {Code::internal, std::string(to_string(entry.id)) + ": out of host memory"};
  } catch (const std::exception& e) {
    return {Code::internal, std::string(to_string(entry.id)) + ": " + e.what()};
  }
}

}  // namespace

Status forward(const Params& params) { return run(params, Direction::forward); }
Status backward(const Params& params) { return run(params, Direction::backward); }

Status supports(const Params& params, Direction direction) {
  detail::BackendEntry entry{};
  Params resolved;
  return choose(params, direction, &entry, &resolved);
}

Status select_backend(const Params& params, Direction direction, Backend* chosen) {
  detail::BackendEntry entry{};
  Params resolved;
  Status s = choose(params, direction, &entry, &resolved);
  if (s.ok() && chosen) *chosen = entry.id;
  return s;
}

Status workspace_size(const Params& params, Direction direction, size_t* bytes) {
  detail::BackendEntry entry{};
  Params resolved;
  if (Status s = choose(params, direction, &entry, &resolved); !s.ok()) return s;
  return entry.workspace_size(resolved, direction, bytes);
}

Status append_kv(const Params& params) {
  if (Status s = detail::validate_append(params); !s.ok()) return s;
  if (params.k.device.type == DeviceType::cuda) {
    if (cuda_device_count() == 0)
      return {Code::no_device, "k: the cache is on " + device_name(params.k.device) + " but no CUDA device was found"};
    return detail::cuda_append_kv(params);
  }
  try {
    cpu::append_kv(params);
  } catch (const std::bad_alloc&) {
    return {Code::internal, "append_kv: out of host memory"};
  } catch (const std::exception& e) {
    return {Code::internal, std::string("append_kv: ") + e.what()};
  }
  return Status::success();
}

std::vector<Backend> compiled_backends() {
  std::vector<Backend> out;
  for (const auto& e : detail::registered_backends()) out.push_back(e.id);
  return out;
}

std::vector<DeviceInfo> devices() {
  DeviceInfo cpu;
  cpu.device = Device{DeviceType::cpu, 0};
  cpu.name = "cpu";
  cpu.multiprocessors = hardware_threads();
  std::vector<DeviceInfo> out = {cpu};
  for (const DeviceInfo& d : detail::cuda_devices()) out.push_back(d);
  return out;
}

// ------------------------------------------------------------------------------------------------
// Names
// ------------------------------------------------------------------------------------------------

const char* to_string(Backend b) {
  switch (b) {
    case Backend::auto_select: return "auto";
    case Backend::reference: return "reference";
    case Backend::cpu: return "cpu";
    case Backend::cuda_simt: return "simt";
    case Backend::cuda_sm80: return "sm80";
    case Backend::cuda_sm90: return "sm90";
  }
  return "unknown";
}
const char* to_string(DType d) {
  switch (d) {
    case DType::fp32: return "fp32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::int32: return "int32";
  }
  return "unknown";
}
const char* to_string(Causal c) {
  switch (c) {
    case Causal::none: return "none";
    case Causal::top_left: return "top-left";
    case Causal::bottom_right: return "bottom-right";
  }
  return "unknown";
}
const char* to_string(Precision p) {
  switch (p) {
    case Precision::ieee: return "ieee";
    case Precision::tf32: return "tf32";
    case Precision::tf32x3: return "tf32x3";
  }
  return "unknown";
}
const char* to_string(Direction d) { return d == Direction::backward ? "bwd" : "fwd"; }
const char* to_string(Code c) {
  switch (c) {
    case Code::ok: return "ok";
    case Code::invalid_argument: return "invalid_argument";
    case Code::unsupported: return "unsupported";
    case Code::no_device: return "no_device";
    case Code::cuda_error: return "cuda_error";
    case Code::internal: return "internal";
  }
  return "unknown";
}

bool parse(const std::string& text, Backend* out) {
  for (Backend b : {Backend::auto_select, Backend::reference, Backend::cpu, Backend::cuda_simt, Backend::cuda_sm80,
                    Backend::cuda_sm90})
    if (text == to_string(b)) return *out = b, true;
  return false;
}
bool parse(const std::string& text, DType* out) {
  for (DType d : {DType::fp32, DType::fp16, DType::bf16})
    if (text == to_string(d)) return *out = d, true;
  return false;
}
bool parse(const std::string& text, Precision* out) {
  for (Precision p : {Precision::ieee, Precision::tf32, Precision::tf32x3})
    if (text == to_string(p)) return *out = p, true;
  return false;
}
bool parse(const std::string& text, Causal* out) {
  for (Causal c : {Causal::none, Causal::top_left, Causal::bottom_right})
    if (text == to_string(c)) return *out = c, true;
  return false;
}

}  // namespace fmha
