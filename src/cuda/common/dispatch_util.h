// Turns the runtime head-dim bucket into the template argument of a compiled instantiation, and
// phrases the refusals every tier shares (bucket not compiled, architecture, shared memory).
#pragma once

#include <initializer_list>
#include <string>
#include <type_traits>

#include "cuda/common/host.h"
#include "cuda/instances.h"

namespace fmha::cuda {

// True when `head_dim` is in `dims`, a list of instances.h spelled out by FMHA_CUDA_LIST_ITEM:
// in_head_dims(hd, {FMHA_CUDA_HEAD_DIMS(FMHA_CUDA_LIST_ITEM)}). An empty list holds none.
#define FMHA_CUDA_LIST_ITEM(hd) hd,
constexpr bool in_head_dims(int head_dim, std::initializer_list<int> dims) {
  for (int dim : dims)
    if (dim == head_dim) return true;
  return false;
}

// True when the sm80 decode kernel is compiled for head-dim bucket `bucket` (FMHA_DECODE_HEAD_DIMS).
constexpr bool has_decode_kernel(int bucket) {
  return in_head_dims(bucket, {FMHA_CUDA_DECODE_HEAD_DIMS(FMHA_CUDA_LIST_ITEM)});
}

// f(std::integral_constant<int, HD>{}) for the compiled bucket HD; `unsupported` when the bucket
// is not compiled into this build.
template <class F>
Status with_head_dim(int bucket, F&& f) {
  switch (bucket) {
#define FMHA_CUDA_HEAD_DIM_CASE(hd) \
  case hd: return f(std::integral_constant<int, hd>{});
    FMHA_CUDA_HEAD_DIMS(FMHA_CUDA_HEAD_DIM_CASE)
#undef FMHA_CUDA_HEAD_DIM_CASE
    default: break;
  }
  return unsupported("head_dim " + std::to_string(bucket) +
                     " is not compiled into this build (FMHA_HEAD_DIMS = " FMHA_CUDA_HEAD_DIMS_TEXT ")");
}

// The head-dim bucket of the call, or a refusal that names the argument.
inline Status head_dim_of(const Problem& s, int* bucket) {
  *bucket = head_dim_bucket(s.head_dim, s.head_dim_v);
  if (*bucket == 0)
    return unsupported("q: head_dim " + std::to_string(s.head_dim) + " / head_dim_v " + std::to_string(s.head_dim_v) +
                       " is above the GPU tiers' limit of 256");
  if (!in_head_dims(*bucket, {FMHA_CUDA_HEAD_DIMS(FMHA_CUDA_LIST_ITEM)})) {
    const std::string dims = s.head_dim == s.head_dim_v
                                 ? "head_dim " + std::to_string(s.head_dim)
                                 : "head_dim " + std::to_string(s.head_dim) + " / head_dim_v " +
                                       std::to_string(s.head_dim_v);
    const std::string runs_on = *bucket == s.head_dim && *bucket == s.head_dim_v
                                    ? ""
                                    : " (it runs on the head_dim " + std::to_string(*bucket) + " kernels)";
    return unsupported(dims + runs_on + " is not compiled into this build (FMHA_HEAD_DIMS = " FMHA_CUDA_HEAD_DIMS_TEXT
                       ")");
  }
  return Status::success();
}

inline Status check_shared_memory(const char* tier, Direction direction, int bucket, size_t need,
                                  const DeviceProps& props) {
  if (need <= props.max_shared_per_block) return Status::success();
  return unsupported(std::string("head_dim: the ") + tier + " " + to_string(direction) + " kernel for head_dim " +
                     std::to_string(bucket) + " needs " + std::to_string(need) +
                     " bytes of shared memory per block; cuda:" + std::to_string(props.ordinal) + " (sm_" +
                     std::to_string(props.arch) + ") offers " + std::to_string(props.max_shared_per_block));
}

}  // namespace fmha::cuda
