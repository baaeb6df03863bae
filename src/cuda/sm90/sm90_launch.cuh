// Definitions of the sm90 launchers (declared in sm90_launch.h), included by the generated
// instantiation files only. The backward runs between the preprocess and convert kernels every
// tier shares (cuda/common/bwd_common.cuh).
#pragma once

#include "cuda/common/block_sequence.cuh"
#include "cuda/common/bwd_common.cuh"
#include "cuda/common/launch.h"
#include "cuda/sm90/sm90_bwd_kernel.cuh"
#include "cuda/sm90/sm90_bwd_stats.cuh"
#include "cuda/sm90/sm90_fwd_kernel.cuh"
#include "cuda/sm90/sm90_launch.h"

namespace fmha::cuda::sm90 {

template <class T, int HD, int VARIANT>
size_t forward_shared_bytes() {
  static_assert(FwdKernel<T, HD, VARIANT, true>::kSharedBytes == FwdKernel<T, HD, VARIANT, false>::kSharedBytes);
  return FwdKernel<T, HD, VARIANT, false>::kSharedBytes;
}

// The dense or the packed kernel, by the call's layout.
template <class T, int HD, int VARIANT>
Status forward(const FwdParams& params, int grid, cudaStream_t stream) {
  if (grid <= 0) return Status::success();
  return with_packing(params.args, [&](auto packed) {
    using K = FwdKernel<T, HD, VARIANT, decltype(packed)::value>;
    auto kernel = fwd_kernel<T, HD, VARIANT, decltype(packed)::value>;
    if (Status s = prepare_kernel(kernel, K::kSharedBytes, "sm90 forward"); !s.ok()) return s;
    kernel<<<grid, K::kThreads, K::kSharedBytes, stream>>>(params);
    return check_launch("sm90 forward kernel launch");
  });
}

template <class T, int HD>
size_t backward_shared_bytes() {
  static_assert(BwdKernel<T, HD, true, false>::kSharedBytes == BwdKernel<T, HD, false, false>::kSharedBytes &&
                BwdKernel<T, HD, false, true>::kSharedBytes == BwdKernel<T, HD, false, false>::kSharedBytes);
  const size_t main = BwdKernel<T, HD, false, false>::kSharedBytes;
  if constexpr (is_split_tf32<T>) {  // and its statistics kernel (sm90_bwd_stats.cuh)
    const size_t stats = BwdStatsKernel<HD, false>::kSharedBytes;
    return stats > main ? stats : main;
  }
  return main;
}

// The main kernel, in its deterministic form when the workspace carries turn counters, dense or
// packed by the call's layout: a block per (key tile, KV head, batch) (packed calls: per key tile
// of the longest sequence, and the blocks past their own sequence's keys exit at once); the
// default kernel's grid is (key tiles, KV heads, batch), the deterministic one's 1-D in the order
// of params.order (BwdKernel::block_key_tile and the like).
template <class T, int HD, bool ORDERED_DQ>
Status launch_backward_main(const BwdParams& params, cudaStream_t stream) {
  const AttentionArgs& args = params.args;
  if (params.order.key_tiles == 0 || args.kv_heads == 0 || args.batch == 0) return Status::success();
  const dim3 grid = ORDERED_DQ ? dim3(unsigned(params.order.blocks()))  // at most INT32_MAX (check_call)
                               : dim3(unsigned(params.order.key_tiles), unsigned(args.kv_heads), unsigned(args.batch));
  return with_packing(args, [&](auto packed) {
    using K = BwdKernel<T, HD, ORDERED_DQ, decltype(packed)::value>;
    auto kernel = bwd_kernel<T, HD, ORDERED_DQ, decltype(packed)::value>;
    if (Status s = prepare_kernel(kernel, K::kSharedBytes, "sm90 backward"); !s.ok()) return s;
    kernel<<<grid, K::kThreads, K::kSharedBytes, stream>>>(params);
    return check_launch("sm90 backward kernel launch");
  });
}

template <class T, int HD>
Status backward(const BwdParams& params, cudaStream_t stream) {
  const AttentionArgs& args = params.args;
  // Preprocess and convert run over every (query row, head) pair, packed calls' included.
  const AttentionArgs row_args = row_kernel_args(args);
  const int64_t rows = int64_t(row_args.batch) * row_args.heads * row_args.seqlen_q;
  // fp32 (tf32): Δ from dO rounded to tf32 as the kernel rounds it for dPᵀ (to nearest even,
  // tile::to_tf32_rn). Split tf32 carries dO to within 2^-22 into dPᵀ, as exact fp32 does: Δ from
  // dO as stored.
  constexpr bool kRoundedDout = sizeof(T) == 4 && !is_split_tf32<T>;
  if (Status s = launch_bwd_preprocess<T, kRoundedDout, true>(row_args, stream, "sm90"); !s.ok()) return s;
  // Split tf32: each row's own softmax max and sum, and Δ on peaked query tiles, before the main
  // kernel forms P from them: a block per (128 query rows, head, batch or sequence).
  if constexpr (is_split_tf32<T>) {
    constexpr int64_t kStatsRows = BwdStatsKernel<HD, false>::kRows;
    const dim3 grid(unsigned(ceil_div(args.seqlen_q, kStatsRows)), unsigned(args.heads), unsigned(args.batch));
    if (grid.x > 0 && grid.y > 0 && grid.z > 0) {
      const Status s = with_packing(args, [&](auto packed) {
        using K = BwdStatsKernel<HD, decltype(packed)::value>;
        auto kernel = bwd_stats_kernel<HD, decltype(packed)::value>;
        if (Status st = prepare_kernel(kernel, K::kSharedBytes, "sm90 backward statistics"); !st.ok()) return st;
        kernel<<<grid, K::kThreads, K::kSharedBytes, stream>>>(params);
        return check_launch("sm90 backward statistics kernel launch");
      });
      if (!s.ok()) return s;
    }
  }
  if (args.dq_turns != nullptr && rows > 0) {
    const size_t counters = size_t(args.batch) * size_t(args.heads) * size_t(args.dq_turn_tiles) * kBwdTurnParts;
    if (Status s = cuda_status(cudaMemsetAsync(args.dq_turns, 0, counters * sizeof(int), stream),
                               "sm90 backward turn counters reset");
        !s.ok())
      return s;
  }
  const Status main = args.dq_turns != nullptr ? launch_backward_main<T, HD, true>(params, stream)
                                               : launch_backward_main<T, HD, false>(params, stream);
  if (!main.ok()) return main;
  return launch_bwd_convert_dq<T>(row_args, stream, "sm90");
}

}  // namespace fmha::cuda::sm90
