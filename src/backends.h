// The table of backends compiled into this build, and the argument checks shared by all of them.
// api.cpp is the only caller: it validates, picks one entry and runs it.
#pragma once

#include <string>
#include <vector>

#include "common/merge.h"
#include "fmha/fmha.h"

namespace fmha::detail {

struct BackendEntry {
  Backend id;
  DeviceType device;
  // Whether this backend can run an already validated call; the message says why not.
  Status (*supports)(const Params&, Direction);
  Status (*run)(const Params&, Direction);
  Status (*workspace_size)(const Params&, Direction, size_t*);
  // Tuning (include/fmha/tune.h): the tier's variant names for a call it supports, in the tier's
  // order (none for the oracle; the same for every call of a direction but on sm80, whose decode
  // kernel has its own), and the one the call runs (src/tune/selection.h's order).
  std::vector<std::string> (*variants)(const Params&, Direction) = nullptr;
  Status (*variant_of)(const Params&, Direction, std::string*) = nullptr;
};

// CPU backends first, then GPU tiers from the most capable down (auto-selection takes the first
// entry on the tensors' device that supports the call).
std::vector<BackendEntry> registered_backends();

// GPU tiers and devices; empty in a build without CUDA.
std::vector<BackendEntry> cuda_backends();
std::vector<DeviceInfo> cuda_devices();

// Validates a call and picks the entry that runs it (api.cpp: the one function that chooses);
// `resolved` is the call as that entry runs it: `params`, but for an fp32 call that `auto` meets
// with split tf32 (common/precision.h), whose precision reads tf32x3.
Status choose_backend(const Params& params, Direction direction, BackendEntry* chosen, Params* resolved);
// The same choice over a given table of backends and of CUDA devices (indexed by device index):
// choose_backend passes this build's and this process's; the CPU tests pass stand-ins.
Status choose_among(const Params& params, Direction direction, const std::vector<BackendEntry>& entries,
                    const std::vector<DeviceInfo>& cuda_devices, BackendEntry* chosen, Params* resolved);

// A CUDA device as the tuning cache names it: name, multiprocessors, CUDA runtime and driver
// versions. Empty in a build without CUDA or for a device that cannot be queried.
std::string cuda_device_key(int ordinal);

// Backend-independent checks: shapes, strides, dtypes, devices, pointers, options.
Status validate(const Params& params, Direction direction);

// The checks of append_kv: the cache, the new rows, and the tables (in full when on the CPU).
Status validate_append(const Params& params);

// The checks of a merge; on success `rows` holds its normalised views.
Status validate_merge(const MergeParams& params, MergeRows* rows);

// The merge on CUDA tensors (src/cuda/merge.cu); an error in a build without CUDA.
Status cuda_merge(const MergeRows& rows, void* stream);

// The split-KV partials of the GPU decode kernel, fp32 out [splits, batch, seqlen, heads,
// head_dim_v] and lse [splits, batch, heads, seqlen] in device memory, merged into out (dense
// [batch, seqlen, heads, head_dim_v], any of the merge's dtypes) and lse ([batch, heads, seqlen]
// fp32, or undefined) on `stream` (src/cuda/merge.cu; CUDA builds only).
struct SplitParts {
  const float* out = nullptr;
  const float* lse = nullptr;
  int64_t splits = 0, batch = 0, seqlen = 0, heads = 0, head_dim_v = 0;
};
Status cuda_merge_splits(const SplitParts& parts, const Tensor& out, const Tensor& lse, void* stream);

// append_kv on CUDA tensors (src/cuda/append_kv.cu): one kernel on params.stream; an error in a
// build without CUDA.
Status cuda_append_kv(const Params& params);

}  // namespace fmha::detail
