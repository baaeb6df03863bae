// The entry points every GPU tier shares. A tier is a class with two static functions:
//   Status check(const Params&, Direction, DeviceProps&)   whether it takes the call (and the
//                                                          device's properties), naming the reason
//   Status launch(const Params&, Direction, const DeviceProps&, const AttentionArgs&, cudaStream_t)
// and its supports() / run() are tier_supports<Tier> / tier_run<Tier>: run() checks again, builds
// the kernels' argument block, binds the backward's workspace, and launches on the call's stream.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/host.h"
#include "fmha/fmha.h"

namespace fmha::cuda {

// A KV cache (block_table / cache_seqlens) runs on the sm80 tier's decode kernel (fp16, bf16),
// which declares kRunsKvCache; every other tier refuses it here, before its own checks read k and
// v as the dense layout's [B, Sk, ...].
inline Status refuse_paged(const Params& p) {
  if (p.block_table.defined() || p.cache_seqlens.defined())
    return {Code::unsupported, std::string(p.block_table.defined() ? "block_table" : "cache_seqlens") +
                                   ": calls on a KV cache run on the sm80 tier's decode kernel (fp16, bf16) on the "
                                   "GPU, and on the reference and cpu backends"};
  return Status::success();
}

template <class Tier>
constexpr bool runs_kv_cache() {
  if constexpr (requires { Tier::kRunsKvCache; }) return Tier::kRunsKvCache;
  else return false;
}

// The tier's deterministic dQ scheme: Tier::kOrderedDq where it declares one.
template <class Tier>
constexpr OrderedDq ordered_dq() {
  if constexpr (requires { Tier::kOrderedDq; }) return Tier::kOrderedDq;
  else return OrderedDq{};
}

template <class Tier>
Status tier_supports(const Params& p, Direction direction) {
  if constexpr (!runs_kv_cache<Tier>())
    if (Status st = refuse_paged(p); !st.ok()) return st;
  DeviceProps props;
  return Tier::check(p, direction, props);
}

template <class Tier>
Status tier_run(const Params& p, Direction direction) {
  if constexpr (!runs_kv_cache<Tier>())
    if (Status st = refuse_paged(p); !st.ok()) return st;
  DeviceProps props;
  if (Status st = Tier::check(p, direction, props); !st.ok()) return st;
  const Problem s = Problem::of(p);
  AttentionArgs args = make_args(p, s);
  if (direction == Direction::backward) {
    if (Status st = bind_workspace(p, workspace_layout(s, p.deterministic, ordered_dq<Tier>()), &args); !st.ok())
      return st;
  }
  return Tier::launch(p, direction, props, args, static_cast<cudaStream_t>(p.stream));
}

}  // namespace fmha::cuda
