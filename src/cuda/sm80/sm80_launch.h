// The sm80 tier's launchers, one explicit instantiation per (storage type, head-dim bucket) in
// the generated .cu files. Host code includes this header only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/common/args.h"
#include "cuda/sm80/sm80_config.h"
#include "fmha/fmha.h"

namespace fmha::cuda::sm80 {

template <class T, int HD>
Status forward(const AttentionArgs& args, cudaStream_t stream);
template <class T, int HD>
size_t forward_shared_bytes();

template <class T, int HD>
Status backward(const AttentionArgs& args, cudaStream_t stream);
template <class T, int HD>
size_t backward_shared_bytes();

}  // namespace fmha::cuda::sm80
