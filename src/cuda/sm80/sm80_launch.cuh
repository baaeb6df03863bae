// Definitions of the sm80 launchers (declared in sm80_launch.h), included by the generated
// instantiation files only. Forward and backward are mma.sync kernels; the backward runs between
// the preprocess and convert kernels every tier shares (cuda/common/bwd_common.cuh).
#pragma once

#include "cuda/common/block_sequence.cuh"
#include "cuda/common/bwd_common.cuh"
#include "cuda/common/launch.h"
#include "cuda/sm80/sm80_bwd_kernel.cuh"
#include "cuda/sm80/sm80_fwd_kernel.cuh"
#include "cuda/sm80/sm80_launch.h"

namespace fmha::cuda::sm80 {

template <class T, int HD, int VARIANT>
size_t forward_shared_bytes() {
  constexpr FwdConfig c = fwd_config_of<T>(HD, VARIANT);
  return sizeof(typename FwdTiles<T, HD, c.tile_m(), c.tile_n, c.stages, c.warp_rows / kMmaRows>::SharedStorage);
}

template <class T, int HD, int VARIANT>
Status forward(const AttentionArgs& args, cudaStream_t stream) {
  constexpr FwdConfig c = fwd_config_of<T>(HD, VARIANT);
  const dim3 grid(unsigned(ceil_div(args.seqlen_q, c.tile_m())), unsigned(args.heads), unsigned(args.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return Status::success();
  const size_t shared = forward_shared_bytes<T, HD, VARIANT>();
  return with_packing(args, [&](auto packed) {
    auto kernel =
        fwd_kernel<T, HD, c.warps, c.warp_rows / kMmaRows, c.tile_n, c.stages, c.min_blocks, decltype(packed)::value>;
    if (Status s = prepare_kernel(kernel, shared, "sm80 forward"); !s.ok()) return s;
    kernel<<<grid, c.threads(), shared, stream>>>(args);
    return check_launch("sm80 forward kernel launch");
  });
}

// The main kernel in configuration VARIANT (sm80_config.h bwd_config); the deterministic dQ
// kernel in tile_config's shapes (compact: its own keys per step), with two K/V tiles in flight
// where they fit the configuration's dq_shared_limit, one otherwise.
template <class T, int HD, int VARIANT>
struct BwdShapes {
  static constexpr BwdConfig main = bwd_config_of<T>(HD, VARIANT);
  static constexpr TileConfig c = main.tile;
  using Main = BwdTiles<T, HD, c.tile_m, c.tile_n, c.stages, c.head_splits, main.warps>;
  static constexpr TileConfig dq = tile_config(Direction::backward, int(sizeof(T)), HD);
  static constexpr int kDqKeys = c.dq_tile_n > 0 ? c.dq_tile_n : dq.dq_tile_n > 0 ? dq.dq_tile_n : dq.tile_n;
  static constexpr int kDqStages =
      sizeof(typename DqTiles<T, HD, kDqKeys, 2>::SharedStorage) <= main.dq_shared_limit ? 2 : 1;
  using Dq = DqTiles<T, HD, kDqKeys, kDqStages>;
  static constexpr size_t kMainShared = sizeof(typename Main::SharedStorage);
  static constexpr size_t kDqShared = sizeof(typename Dq::SharedStorage);
  // Split tf32's statistics kernel: the dQ kernel's shapes with one K/V stage, and 16 keys per
  // step where its keys do not fit an A100's shared memory beside the Q and dO tiles (head dim
  // 256). A score does not depend on the keys a step holds: the same S either way. 0 for the others.
  static constexpr int kStatsKeys =
      sizeof(typename StatsTiles<T, HD, kDqKeys>::SharedStorage) <= kSm80SharedBytes ? kDqKeys : kRowsPerWarp;
  using Stats = StatsTiles<T, HD, kStatsKeys>;
  static constexpr size_t kStatsShared = kSplitTf32<T> ? sizeof(typename Stats::SharedStorage) : 0;
  static_assert(kStatsShared <= kSm80SharedBytes, "the statistics kernel fits an A100's shared memory");
};

// The most shared memory one kernel of the backward asks for: the main kernel's, split tf32's
// statistics kernel's, and when deterministic the dQ kernel's.
template <class T, int HD, int VARIANT>
size_t backward_shared_bytes(bool deterministic) {
  using S = BwdShapes<T, HD, VARIANT>;
  const size_t most = S::kStatsShared > S::kMainShared ? S::kStatsShared : S::kMainShared;
  return deterministic && S::kDqShared > most ? S::kDqShared : most;
}

// Preprocess, main kernel, then convert (atomic dQ, args.dq_accum set) or the dQ kernel
// (deterministic, args.dq_accum null).
template <class T, int HD, int VARIANT>
Status backward(const AttentionArgs& args, cudaStream_t stream) {
  using S = BwdShapes<T, HD, VARIANT>;
  constexpr TileConfig c = S::c;
  // Preprocess and convert run over every (query row, head) pair, packed calls' included.
  const AttentionArgs row_args = row_kernel_args(args);
  const int64_t rows = int64_t(row_args.batch) * row_args.heads * row_args.seqlen_q;
  {
    // fp32 storage on (whole) tf32 tensor cores: Δ from dO rounded to tf32, as dP sees it. Split
    // tf32 carries dO to within 2^-22 into dP, as exact fp32 does: Δ from dO as stored.
    constexpr bool kTf32 = std::is_same_v<T, tf32_t>;
    if (Status s = launch_bwd_preprocess<T, kTf32>(row_args, stream, "sm80"); !s.ok()) return s;
  }

  // Split tf32: each row's own softmax max and sum (cuda/common/own_softmax.cuh says why), and Δ
  // on peaked query tiles, before the kernels that form P from them.
  const dim3 q_grid(unsigned(ceil_div(args.seqlen_q, S::Dq::kRows)), unsigned(args.heads), unsigned(args.batch));
  if constexpr (kSplitTf32<T>) {
    if (q_grid.x > 0 && q_grid.y > 0 && q_grid.z > 0) {
      const Status s = with_packing(args, [&](auto packed) {
        auto kernel = bwd_stats_kernel<T, HD, S::kStatsKeys, S::dq.min_blocks, decltype(packed)::value>;
        if (Status st = prepare_kernel(kernel, S::kStatsShared, "sm80 backward statistics"); !st.ok()) return st;
        kernel<<<q_grid, kThreads, S::kStatsShared, stream>>>(args);
        return check_launch("sm80 backward statistics kernel launch");
      });
      if (!s.ok()) return s;
    }
  }

  const dim3 kv_grid(unsigned(ceil_div(args.seqlen_k, c.tile_n)), unsigned(args.kv_heads), unsigned(args.batch));
  if (kv_grid.x > 0 && kv_grid.y > 0 && kv_grid.z > 0) {
    const Status s = with_packing(args, [&](auto packed) {
      auto kernel = bwd_kernel<T, HD, c.tile_m, c.tile_n, c.stages, c.head_splits, S::main.warps, c.min_blocks,
                               decltype(packed)::value>;
      if (Status st = prepare_kernel(kernel, S::kMainShared, "sm80 backward"); !st.ok()) return st;
      kernel<<<kv_grid, S::main.threads(), S::kMainShared, stream>>>(args);
      return check_launch("sm80 backward kernel launch");
    });
    if (!s.ok()) return s;
  }
  if (rows == 0) return Status::success();

  if (args.dq_accum != nullptr) return launch_bwd_convert_dq<T>(row_args, stream, "sm80");
  return with_packing(args, [&](auto packed) {
    auto kernel = bwd_dq_kernel<T, HD, S::kDqKeys, S::kDqStages, S::dq.min_blocks, decltype(packed)::value>;
    if (Status s = prepare_kernel(kernel, S::kDqShared, "sm80 backward dQ"); !s.ok()) return s;
    kernel<<<q_grid, kThreads, S::kDqShared, stream>>>(args);
    return check_launch("sm80 backward dQ kernel launch");
  });
}

}  // namespace fmha::cuda::sm80
