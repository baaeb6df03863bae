// The simt tier's launchers, one explicit instantiation per head-dim bucket (generated .cu files,
// see cmake/cuda.cmake). Host code includes this header only; kernels stay in their own files.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/common/args.h"
#include "fmha/fmha.h"

namespace fmha::cuda::simt {

// Runs the forward in configuration VARIANT (simt_config.h) on `stream`; errors of the launches
// come back as Code::cuda_error. Compiled for every variant at the tuned head dims
// (FMHA_CUDA_TUNED_HEAD_DIMS), for default_fwd_variant(HD) only at the others.
template <int HD, int VARIANT>
Status forward(const AttentionArgs& args, cudaStream_t stream);
template <int HD, int VARIANT>
size_t forward_shared_bytes();

// Preprocess, main kernel in configuration VARIANT (simt_config.h), then convert (atomic dQ,
// args.dq_accum set) or the dQ kernel (deterministic, args.dq_accum null). Compiled for every
// variant at the tuned head dims, for default_bwd_variant(HD) only at the others. The shared
// memory is the main kernel's, or the larger of it and the dQ kernel's when deterministic.
template <int HD, int VARIANT>
Status backward(const AttentionArgs& args, cudaStream_t stream);
template <int HD, int VARIANT>
size_t backward_shared_bytes(bool deterministic);

}  // namespace fmha::cuda::simt
