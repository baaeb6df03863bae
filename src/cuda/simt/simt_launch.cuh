// Definitions of the simt launchers (declared in simt_launch.h), included by the generated
// instantiation files only.
#pragma once

#include <type_traits>

#include "cuda/common/block_sequence.cuh"
#include "cuda/common/bwd_common.cuh"
#include "cuda/common/launch.h"
#include "cuda/simt/simt_bwd_kernel.cuh"
#include "cuda/simt/simt_config.h"
#include "cuda/simt/simt_fwd_kernel.cuh"
#include "cuda/simt/simt_launch.h"

namespace fmha::cuda::simt {

template <int HD, int VARIANT>
size_t forward_shared_bytes() {
  constexpr TileConfig c = fwd_config(HD, VARIANT);
  if constexpr (c.kernel == FwdKernel::micro)
    return sizeof(typename MicroFwdTiles<HD, c.tile_m, c.tile_n, c.stages>::SharedStorage);
  else
    return sizeof(typename FwdTiles<HD, c.tile_m, c.tile_n, c.stages>::SharedStorage);
}

// Shared memory of the backward main kernel of VARIANT, and of its deterministic dQ kernel
// (Grid16 shapes: tile_config's, or the compact ones).
template <int HD, int VARIANT>
constexpr size_t backward_main_shared_bytes() {
  constexpr BwdConfig c = bwd_config(HD, VARIANT);
  if constexpr (c.kernel == BwdKernel::micro)
    return sizeof(typename MicroBwdTiles<HD, c.tile.tile_m, c.tile.tile_n>::SharedStorage);
  else
    return sizeof(typename BwdTiles<HD, c.tile.tile_m, c.tile.tile_n>::SharedStorage);
}
template <int HD, int VARIANT>
constexpr size_t backward_dq_shared_bytes() {
  constexpr TileConfig c = bwd_config(HD, VARIANT).dq;
  return sizeof(typename BwdTiles<HD, c.tile_m, c.tile_n>::SharedStorage);
}

// The statistics kernel's (the deterministic dQ kernel's Grid16 shapes; Q, dO, K and V tiles, no P or dS).
template <int HD, int VARIANT>
constexpr size_t backward_stats_shared_bytes() {
  constexpr TileConfig c = bwd_config(HD, VARIANT).dq;
  return sizeof(typename StatsTiles<HD, c.tile_m, c.tile_n>::SharedStorage);
}

// The most shared memory one kernel of the backward asks for: the main kernel's, the statistics
// kernel's, and when deterministic the dQ kernel's.
template <int HD, int VARIANT>
size_t backward_shared_bytes(bool deterministic) {
  constexpr size_t main = backward_main_shared_bytes<HD, VARIANT>(), dq = backward_dq_shared_bytes<HD, VARIANT>();
  constexpr size_t stats = backward_stats_shared_bytes<HD, VARIANT>();
  const size_t most = main > stats ? main : stats;
  return deterministic && dq > most ? dq : most;
}

template <int HD, int VARIANT>
Status forward(const AttentionArgs& args, cudaStream_t stream) {
  constexpr TileConfig c = fwd_config(HD, VARIANT);
  const dim3 grid(unsigned(ceil_div(args.seqlen_q, c.tile_m)), unsigned(args.heads), unsigned(args.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return Status::success();
  const size_t shared = forward_shared_bytes<HD, VARIANT>();
  auto launch = [&](auto kernel) {
    if (Status s = prepare_kernel(kernel, shared, "simt forward"); !s.ok()) return s;
    kernel<<<grid, kThreads, shared, stream>>>(args);
    return check_launch("simt forward kernel launch");
  };
  constexpr bool kMicro = c.kernel == FwdKernel::micro;
  return with_packing(args, [&](auto packed) {
    constexpr bool kPacked = decltype(packed)::value;
    if constexpr (kMicro)
      return launch(micro_fwd_kernel<HD, c.tile_m, c.tile_n, c.stages, c.min_blocks, kPacked>);
    else
      return launch(fwd_kernel<HD, c.tile_m, c.tile_n, c.stages, c.min_blocks, kPacked>);
  });
}

// The backward for storage type T in configuration VARIANT; the micro-tile main kernel reads fp32
// storage only.
template <class T, int HD, int VARIANT>
Status backward_for(const AttentionArgs& args, cudaStream_t stream) {
  constexpr BwdConfig c = bwd_config(HD, VARIANT);
  constexpr TileConfig dq = c.dq;  // the deterministic dQ kernel's shapes
  static_assert(c.kernel == BwdKernel::grid16 || std::is_same_v<T, float>, "the micro-tile backward reads fp32");
  // Preprocess and convert run over every (query row, head) pair, packed calls' included.
  const AttentionArgs row_args = row_kernel_args(args);
  const int64_t rows = int64_t(row_args.batch) * row_args.heads * row_args.seqlen_q;
  if (Status s = launch_bwd_preprocess<T>(row_args, stream, "simt"); !s.ok()) return s;

  // Each row's own softmax max and sum (cuda/common/own_softmax.cuh says why), before the kernels that
  // form P from them.
  const dim3 q_grid(unsigned(ceil_div(args.seqlen_q, dq.tile_m)), unsigned(args.heads), unsigned(args.batch));
  if (q_grid.x > 0 && q_grid.y > 0 && q_grid.z > 0) {
    const Status s = with_packing(args, [&](auto packed) {
      auto kernel = bwd_stats_kernel<T, HD, dq.tile_m, dq.tile_n, dq.min_blocks, decltype(packed)::value>;
      const size_t shared = backward_stats_shared_bytes<HD, VARIANT>();
      if (Status s = prepare_kernel(kernel, shared, "simt backward statistics"); !s.ok()) return s;
      kernel<<<q_grid, kThreads, shared, stream>>>(args);
      return check_launch("simt backward statistics kernel launch");
    });
    if (!s.ok()) return s;
  }

  const dim3 kv_grid(unsigned(ceil_div(args.seqlen_k, c.tile.tile_n)), unsigned(args.kv_heads),
                     unsigned(args.batch));
  if (kv_grid.x > 0 && kv_grid.y > 0 && kv_grid.z > 0) {
    const size_t shared = backward_main_shared_bytes<HD, VARIANT>();
    auto launch = [&](auto kernel) {
      if (Status s = prepare_kernel(kernel, shared, "simt backward"); !s.ok()) return s;
      kernel<<<kv_grid, kThreads, shared, stream>>>(args);
      return check_launch("simt backward kernel launch");
    };
    constexpr bool kMicro = c.kernel == BwdKernel::micro;
    const Status s = with_packing(args, [&](auto packed) {
      constexpr bool kPacked = decltype(packed)::value;
      if constexpr (kMicro)
        return launch(micro_bwd_kernel<HD, c.tile.tile_m, c.tile.tile_n, c.tile.min_blocks, kPacked>);
      else
        return launch(bwd_kernel<T, HD, c.tile.tile_m, c.tile.tile_n, c.tile.min_blocks, kPacked>);
    });
    if (!s.ok()) return s;
  }
  if (rows == 0) return Status::success();

  if (args.dq_accum != nullptr) return launch_bwd_convert_dq<T>(row_args, stream, "simt");
  const size_t dq_shared = backward_dq_shared_bytes<HD, VARIANT>();
  return with_packing(args, [&](auto packed) {
    auto kernel = bwd_dq_kernel<T, HD, dq.tile_m, dq.tile_n, dq.min_blocks, decltype(packed)::value>;
    if (Status s = prepare_kernel(kernel, dq_shared, "simt backward dQ"); !s.ok()) return s;
    kernel<<<q_grid, kThreads, dq_shared, stream>>>(args);
    return check_launch("simt backward dQ kernel launch");
  });
}

template <int HD, int VARIANT>
Status backward(const AttentionArgs& args, cudaStream_t stream) {
  return backward_for<float, HD, VARIANT>(args, stream);
}

}  // namespace fmha::cuda::simt
