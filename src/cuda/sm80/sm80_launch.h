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

// The decode kernel (sm80_decode_kernel.cuh) for fp16/bf16 at the head dims of
// FMHA_DECODE_HEAD_DIMS (instances.h FMHA_CUDA_DECODE_HEAD_DIMS); the split merge is the caller's.
template <class T, int HD>
Status decode(const DecodeArgs& args, cudaStream_t stream);
template <class T, int HD>
size_t decode_shared_bytes();

}  // namespace fmha::cuda::sm80
