// The simt tier's tile configurations: the one place where tile sizes, pipeline depth, thread
// count and occupancy are chosen, from (direction, head dim, forward variant). The simt tier
// stores fp32 only and uses the same shapes on every architecture; what changes with the GPU is
// only whether the shared memory fits (simt_dispatch.cpp checks that against the device).
//
// Forward variants. Head dims 64 and 128 are compiled in every variant below, the others in their
// default only; FMHA_SIMT_CONFIG=<name> picks one at run time (read once, see simt_dispatch.cpp):
//   grid16    the Grid16 kernel: 16 × 16 threads, each an interleaved [BM/16, BN/16] block of S,
//             scalar shared loads (two loads per two FMAs at 4 × 4).
//   m128n64   the micro-tile kernel: 128 query rows, 64 keys; a thread owns an [8, 4] block of S
//             and an [8, 4 · HD/64] block of O, float4 shared loads, Q transposed and pre-scaled.
//   m128n32   the same with 32-key tiles (fewer registers and less shared memory at head dim 128).
//   m64n64    64 query rows ([4, 4] blocks of S): half the registers, two blocks per SM.
//   compact   the Grid16 kernel on 32 × 32 tiles, one K/V stage: the shapes for GPUs with less
//             shared memory (99 KiB on sm_86/sm_89, 64 KiB on sm_75). Also compiled at head dims
//             32, 96 and 192 (FMHA_SIMT_COMPACT_HEAD_DIMS), where some defaults need more.
//
// Backward variants (the main kernel: dK, dV and the atomic dQ), compiled like the forward's;
// FMHA_SIMT_BWD_CONFIG=<name> picks one. The deterministic dQ kernel keeps tile_config's Grid16
// shapes in every variant but compact.
//   grid16    the Grid16 kernel: 16 × 16 threads, interleaved blocks of S, dK, dV and dQ, scalar
//             shared loads; tile_config's shapes.
//   micro     the micro-tile kernel (simt_bwd_micro_mainloop.cuh): 64 keys per block, 64-row query
//             steps; a thread owns [4, 4] blocks of S and dP and [4, HD/16] blocks of dK, dV and
//             dQ, float4 shared loads, P^T and dS^T exchanged through shared memory, dQ added with
//             float4 atomics on sm_90. Head dims that are multiples of 64 only; the others run
//             grid16 under this name.
//   compact   grid16 on 32 × 32 tiles, main and deterministic dQ kernel (see the forward's).
#pragma once

#include "fmha/fmha.h"

namespace fmha::cuda::simt {

inline constexpr int kThreads = 256;  // a 16 × 16 thread grid (tile::Grid16)
inline constexpr int kRowPad = 1;     // fp32 words of padding per shared row: odd strides avoid bank conflicts

enum class FwdKernel { grid16, micro };
enum class BwdKernel { grid16, micro };

struct TileConfig {
  int tile_m;      // query rows per block (backward: per step of the main kernel)
  int tile_n;      // keys per tile (backward: per block of the main kernel)
  int stages;      // K/V tiles in flight (forward)
  int min_blocks;  // blocks per SM the register allocation must allow
  FwdKernel kernel = FwdKernel::grid16;
};

inline constexpr int kFwdVariants = 5;
inline constexpr const char* kFwdVariantNames[kFwdVariants] = {"grid16", "m128n64", "m128n32", "m64n64", "compact"};
inline constexpr int kFwdCompact = 4;
inline constexpr TileConfig kCompactTiles = {32, 32, 1, 1};  // the compact variants' shapes

// The forward variant used when FMHA_SIMT_CONFIG is unset; the micro-tile kernel needs head dims
// that are multiples of 64 (its threads own float4 column groups of 64-wide O panels).
constexpr int default_fwd_variant(int head_dim) {
  if (head_dim == 64) return 1;   // m128n64
  if (head_dim == 128) return 2;  // m128n32
  return 0;
}

// Forward configuration of `variant` at the compiled head-dim bucket.
constexpr TileConfig fwd_config(int head_dim, int variant) {
  switch (variant) {
    case 1: return {128, 64, head_dim <= 64 ? 2 : 1, 1, FwdKernel::micro};
    case 2: return {128, 32, 2, 1, FwdKernel::micro};
    case 3: return {64, 64, 2, head_dim <= 64 ? 2 : 1, FwdKernel::micro};
    case kFwdCompact: return kCompactTiles;
    default: break;
  }
  if (head_dim <= 64) return {64, 64, 2, 2};
  if (head_dim <= 96) return {64, 64, 2, 1};
  if (head_dim <= 128) return {64, 32, 2, 1};
  if (head_dim <= 192) return {32, 32, 2, 1};
  return {32, 32, 1, 1};
}

// head_dim is the compiled head-dim bucket (32, 64, 96, 128, 192, 256). The backward entry is
// the Grid16 kernels' shapes (grid16's main kernel, and the deterministic dQ kernel of every
// backward variant).
constexpr TileConfig tile_config(Direction direction, int head_dim) {
  if (direction == Direction::forward) return fwd_config(head_dim, default_fwd_variant(head_dim));
  if (head_dim <= 96) return {64, 64, 1, 1};
  if (head_dim <= 128) return {32, 64, 1, 1};
  return {32, 32, 1, 1};
}

// The micro-tile backward's panels: a 16-thread line covers 64 keys, query rows or dims with
// float4 groups (simt_bwd_micro_mainloop.cuh), so tiles and head dims are multiples of this.
inline constexpr int kBwdMicroPanel = 64;

struct BwdConfig {
  TileConfig tile;  // main kernel: tile_m query rows per step, tile_n keys per block
  BwdKernel kernel = BwdKernel::grid16;
  TileConfig dq;    // the deterministic dQ kernel's shapes (Grid16)
};

inline constexpr int kBwdVariants = 3;
inline constexpr const char* kBwdVariantNames[kBwdVariants] = {"grid16", "micro", "compact"};
inline constexpr int kBwdCompact = 2;

// The backward variant used when FMHA_SIMT_BWD_CONFIG is unset: micro at head dims 64 and 128,
// where it measured 1.3x (D64) and 1.7x (D128) grid16 on an H200 (docs/PERF.md); grid16 elsewhere
// and on GPUs whose shared memory the micro kernel exceeds (simt_dispatch.cpp).
constexpr int default_bwd_variant(int head_dim) { return head_dim == 64 || head_dim == 128 ? 1 : 0; }

// Backward configuration of `variant` at the compiled head-dim bucket. The micro-tile kernel
// asks for one block per SM: at head dim 64 its shared memory (104 KiB) would allow two, but a
// 128-register budget spills (it uses about 216 registers at one block).
constexpr BwdConfig bwd_config(int head_dim, int variant) {
  const TileConfig grid16 = tile_config(Direction::backward, head_dim);
  if (variant == kBwdCompact) return {kCompactTiles, BwdKernel::grid16, kCompactTiles};
  if (variant == 1 && head_dim % kBwdMicroPanel == 0)
    return {{kBwdMicroPanel, kBwdMicroPanel, 1, 1}, BwdKernel::micro, grid16};
  return {grid16, BwdKernel::grid16, grid16};
}

}  // namespace fmha::cuda::simt
