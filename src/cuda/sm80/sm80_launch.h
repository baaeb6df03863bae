// The sm80 tier's launchers, one explicit instantiation per (storage type, head-dim bucket) in
// the generated .cu files. Host code includes this header only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/common/args.h"
#include "cuda/sm80/sm80_config.h"
#include "fmha/fmha.h"

namespace fmha::cuda::sm80 {

// The forward in configuration VARIANT (sm80_config.h fwd_config): every variant at the tuned
// head dims (FMHA_CUDA_TUNED_HEAD_DIMS), default_fwd_variant only at the others.
template <class T, int HD, int VARIANT>
Status forward(const AttentionArgs& args, cudaStream_t stream);
template <class T, int HD, int VARIANT>
size_t forward_shared_bytes();

// The backward with its main kernel in configuration VARIANT (sm80_config.h bwd_config), compiled
// the same way as the forward's.
template <class T, int HD, int VARIANT>
Status backward(const AttentionArgs& args, cudaStream_t stream);
template <class T, int HD, int VARIANT>
size_t backward_shared_bytes(bool deterministic);

}  // namespace fmha::cuda::sm80
