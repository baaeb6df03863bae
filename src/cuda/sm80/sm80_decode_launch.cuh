// Definitions of the sm80 decode launcher (declared in sm80_launch.h), included by the generated
// instantiation files only: one per (storage type, head-dim bucket) of FMHA_DECODE_HEAD_DIMS.
#pragma once

#include "cuda/common/launch.h"
#include "cuda/sm80/sm80_decode_kernel.cuh"
#include "cuda/sm80/sm80_launch.h"

namespace fmha::cuda::sm80 {

template <class T, int HD>
size_t decode_shared_bytes() {
  return sizeof(typename DecodeTiles<T, HD>::SharedStorage);
}

template <class T, int HD>
Status decode(const DecodeArgs& args, cudaStream_t stream) {
  const dim3 grid(unsigned(args.splits), unsigned(args.kv_heads * args.row_tiles), unsigned(args.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return Status::success();
  const size_t shared = decode_shared_bytes<T, HD>();
  auto kernel = decode_kernel<T, HD>;
  if (Status s = prepare_kernel(kernel, shared, "sm80 decode"); !s.ok()) return s;
  kernel<<<grid, DecodeTiles<T, HD>::kThreads, shared, stream>>>(args);
  return check_launch("sm80 decode kernel launch");
}

}  // namespace fmha::cuda::sm80
