// The sm90 tier's launchers, one explicit instantiation per (storage type, head-dim bucket,
// variant; the backward has one configuration) in the generated .cu files (compiled for sm_90a only). Host code includes this header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/sm90/sm90_config.h"
#include "cuda/sm90/sm90_bwd_params.h"
#include "cuda/sm90/sm90_fwd_params.h"
#include "fmha/fmha.h"

namespace fmha::cuda::sm90 {

// Launches the persistent forward kernel in configuration VARIANT (sm90_config.h) on `grid`
// blocks; params' tensor maps must use fwd_config(HD, VARIANT)'s tile shapes.
template <class T, int HD, int VARIANT>
Status forward(const FwdParams& params, int grid, cudaStream_t stream);
template <class T, int HD, int VARIANT>
size_t forward_shared_bytes();

// The backward at head-dim bucket HD (at most kBwdMaxHeadDim): the shared preprocess, (split tf32,
// T = tf32x3_t: the rows' own statistics kernel,) the main kernel on ceil(seqlen_k / keys) ×
// kv_heads × batch blocks (keys: BwdConfig's), then the dQ convert. params.args carries the bound
// workspace (dq_accum set: the backward here is the atomic one).
template <class T, int HD>
Status backward(const BwdParams& params, cudaStream_t stream);
// The most shared memory one of those kernels takes.
template <class T, int HD>
size_t backward_shared_bytes();

}  // namespace fmha::cuda::sm90
