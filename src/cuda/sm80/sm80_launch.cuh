// Definitions of the sm80 launchers (declared in sm80_launch.h), included by the generated
// instantiation files only. The backward runs the three-kernel fp32 SIMT backward on the tier's
// storage types (simt_launch.cuh); the forward is the mma.sync kernel.
#pragma once

#include "cuda/common/launch.h"
#include "cuda/sm80/sm80_fwd_kernel.cuh"
#include "cuda/sm80/sm80_launch.h"
#include "cuda/simt/simt_launch.cuh"

namespace fmha::cuda::sm80 {

template <class T, int HD, int VARIANT>
size_t forward_shared_bytes() {
  constexpr FwdConfig c = fwd_config(int(sizeof(T)), HD, VARIANT);
  return sizeof(typename FwdTiles<T, HD, c.tile_m(), c.tile_n, c.stages, c.warp_rows / kMmaRows>::SharedStorage);
}

template <class T, int HD, int VARIANT>
Status forward(const AttentionArgs& args, cudaStream_t stream) {
  constexpr FwdConfig c = fwd_config(int(sizeof(T)), HD, VARIANT);
  const dim3 grid(unsigned(ceil_div(args.seqlen_q, c.tile_m())), unsigned(args.heads), unsigned(args.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return Status::success();
  auto kernel = fwd_kernel<T, HD, c.warps, c.warp_rows / kMmaRows, c.tile_n, c.stages, c.min_blocks>;
  const size_t shared = forward_shared_bytes<T, HD, VARIANT>();
  if (Status s = prepare_kernel(kernel, shared, "sm80 forward"); !s.ok()) return s;
  kernel<<<grid, c.threads(), shared, stream>>>(args);
  return check_launch("sm80 forward kernel launch");
}

template <class T, int HD>
size_t backward_shared_bytes() {
  return simt::backward_shared_bytes<HD>();
}

template <class T, int HD>
Status backward(const AttentionArgs& args, cudaStream_t stream) {
  return simt::backward_for<T, HD>(args, stream);
}

}  // namespace fmha::cuda::sm80
