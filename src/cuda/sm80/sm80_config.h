// The sm80 tier's tile configurations, chosen in one place from (direction, storage dtype, head
// dim). sm_80 offers 163 KiB of shared memory per block and sm_90 227 KiB; the default shapes fit
// the smaller, so one set serves both. sm_86 and sm_89 offer 99 KiB: there the "compact"
// variants below (and, at the tuned head dims, any smaller variant) take over where a default
// does not fit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/tile/split_tf32.h"
#include "fmha/fmha.h"

namespace fmha::cuda::sm80 {

// Storage types of the tier's instantiations: fp32 storage runs on tf32 tensor cores, whole
// (Precision::tf32) or split into high and residual parts (Precision::tf32x3).
using fp16_t = __half;
using bf16_t = __nv_bfloat16;
using tf32_t = float;
using tf32x3_t = tile::tf32x3;

template <class T>
inline constexpr bool kSplitTf32 = std::is_same_v<T, tf32x3_t>;
// The softmax's exp2: the ex2.approx instruction where the matmul operands are rounded to 16 bits
// or tf32 anyway; libdevice's exp2f (as the simt tier) for split tf32, whose softmax stays fp32.
template <class T>
inline constexpr bool kFastExp2 = !kSplitTf32<T>;

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kRowsPerWarp = 16;  // one m16 mma row block per warp
inline constexpr int kSmemRowPadBytes = 16;  // staggers rows across banks and keeps 16-byte alignment
// Opt-in shared memory per block of the smallest sm_80+ GPUs (sm_86, sm_89), which the compact
// variants fit at every head dim; and sm_80's, which the default shapes fit.
inline constexpr size_t kCompactSharedBytes = 99 * 1024;
inline constexpr size_t kSm80SharedBytes = 163 * 1024;

struct TileConfig {
  int tile_m;       // query rows per block (forward: kWarps · 16) or per step (backward)
  int tile_n;       // keys per tile (backward: per block, 16 per warp along the keys)
  int stages;       // forward: K/V tiles in flight; backward: Q/dO tiles in flight
  int min_blocks;   // blocks per SM the register allocation must allow
  int head_splits = 1;  // backward: warps that share 16 keys, each owning 1/head_splits of dK/dV's columns
  int dq_tile_n = 0;    // backward: keys per step of the deterministic dQ kernel (0: tile_n)
};

// The backward's main kernel gives each warp 16 keys and keeps their dK and dV rows in registers
// (head_dim fp32 values per lane between the two), so above 128 two warps share 16 keys and split
// the head dim. tile_m is the query tile of one step: [16 keys, tile_m] S^T and dP^T per warp.
// The deterministic dQ kernel has kWarps · 16 query rows and dq_tile_n (default tile_n) keys per
// step, with two K/V tiles in flight where sm_80's shared memory allows.
constexpr TileConfig tile_config(Direction direction, int element_bytes, int head_dim) {
  if (direction == Direction::backward) {
    if (element_bytes == 2) {
      if (head_dim <= 64) return {64, 64, 2, 2};
      if (head_dim <= 96) return {32, 64, 2, 2};
      if (head_dim <= 128) return {16, 64, 2, 2};
      return {32, 32, 2, 1, 2};
    }
    // tf32 fragments take more registers (fp32 shared loads, conversions): shorter query steps;
    // above 128 one Q/dO buffer keeps the block within sm_80's 163 KiB.
    if (head_dim <= 64) return {32, 64, 2, 2};
    if (head_dim <= 96) return {32, 32, 2, 1, 2};
    if (head_dim <= 128) return {16, 64, 2, 2};
    return {16, 32, 1, 1, 2, 16};
  }
  const int m = kWarps * kRowsPerWarp;
  if (element_bytes == 2) {
    if (head_dim <= 64) return {m, 64, 2, 2};
    if (head_dim <= 192) return {m, 64, 2, 1};
    return {m, 32, 2, 1};
  }
  if (head_dim <= 64) return {m, 64, 2, 2};
  if (head_dim <= 192) return {m, 32, 2, 1};
  return {m, 32, 1, 1};
}

// The forward's configurations. Each warp owns warp_rows query rows (one or two m16 row blocks:
// two halve the shared-memory traffic of K and V per mma); a block is warps × warp_rows rows.
// Head dims 64 and 128 are compiled in every variant, the others in their default only;
// FMHA_SM80_FWD_CONFIG=<name> picks one at run time (read once, see sm80_dispatch.cpp):
//   w4r16     4 warps × 16 rows (64-row tiles), keys per tile from tile_config above
//   w4r32     4 warps × 32 rows (128-row tiles), 64 keys (32 for tf32 above head dim 64)
//   w8r16     8 warps × 16 rows (128-row tiles), keys as w4r32
//   w4r32n32  4 warps × 32 rows, 32 keys
//   compact   for 99 KiB GPUs: 4 warps × 16 rows and 32 keys (16-bit); 2 warps × 16 rows and
//             32 keys, one K/V stage above head dim 128 (tf32). Also compiled at head dims 96,
//             192 and 256 (FMHA_SM80_COMPACT_HEAD_DIMS), where some defaults exceed 99 KiB.
// With 16-bit types above head dim 64, 32 rows per warp spill registers (a 32 × 128 fp32
// accumulator is 128 of them), so w4r32 and w4r32n32 run 8 warps × 16 rows there.
struct FwdConfig {
  int warps;       // warps per block
  int warp_rows;   // query rows per warp: 16 or 32 (m16 row blocks of the mma)
  int tile_n;      // keys per tile
  int stages;      // K/V tiles in flight
  int min_blocks;  // blocks per SM the register allocation must allow
  constexpr int tile_m() const { return warps * warp_rows; }
  constexpr int threads() const { return warps * 32; }
};

inline constexpr int kFwdVariants = 5;
inline constexpr const char* kFwdVariantNames[kFwdVariants] = {"w4r16", "w4r32", "w8r16", "w4r32n32", "compact"};
inline constexpr int kFwdCompact = 4;

// The forward variant used when FMHA_SM80_FWD_CONFIG is unset: 32 rows per warp where the
// accumulators fit (head dim 64 for 16-bit types, up to 128 for tf32), else 8 warps × 16 rows;
// tf32 above 128 keeps 64-row tiles to fit sm_80's 163 KiB of shared memory.
constexpr int default_fwd_variant(int element_bytes, int head_dim) {
  if (element_bytes == 2) return head_dim <= 64 ? 1 : 2;
  return head_dim <= 128 ? 1 : 0;
}

constexpr FwdConfig fwd_config(int element_bytes, int head_dim, int variant) {
  const int wide_n = element_bytes == 2 ? (head_dim <= 192 ? 64 : 32) : (head_dim <= 64 ? 64 : 32);
  const bool wide_rows_fit = element_bytes == 4 || head_dim <= 64;
  switch (variant) {
    case 1: return wide_rows_fit ? FwdConfig{4, 32, wide_n, 2, 1} : FwdConfig{8, 16, wide_n, 2, 1};
    case 2: return {8, 16, wide_n, 2, 1};
    case 3: return wide_rows_fit ? FwdConfig{4, 32, 32, 2, 1} : FwdConfig{8, 16, 32, 2, 1};
    case kFwdCompact:
      if (element_bytes == 2) return {4, 16, 32, 2, 1};
      return {2, 16, 32, head_dim <= 128 ? 2 : 1, 1};
    default: break;
  }
  const TileConfig legacy = tile_config(Direction::forward, element_bytes, head_dim);
  return {kWarps, kRowsPerWarp, legacy.tile_n, legacy.stages, legacy.min_blocks};
}

// The backward main kernel's configurations. Each warp owns 16 keys (or 16 keys × 1/head_splits
// of the head dim), so a block holds warps / head_splits · 16 keys; more keys per block read each
// Q/dO tile and add each dQ row with atomics fewer times per key. Head dims 64 and 128 are compiled
// in every variant, the others in their default only; FMHA_SM80_BWD_CONFIG=<name> picks one:
//   w4    4 warps, the shapes of tile_config above
//   w8    8 warps: twice the keys per block, the same query steps, one block per SM
//   w8b2  8 warps, half the query step (at least 2048 / head dim rows, so that each warp's share
//         of dS·K is a pair of n8 tiles), register budget for two blocks per SM
//   compact  for 99 KiB GPUs: 4 warps, 16-row query steps above head dim 128 (and 32 keys per
//         block for tf32 at 128, 16 at 256), the deterministic dQ kernel with 32 keys per step
//         up to head dim 64 (16-bit: 128), 16 above. Compiled like the forward's compact.
// The deterministic dQ kernel keeps tile_config's 4-warp shapes in every variant but compact.
struct BwdConfig {
  int warps;
  TileConfig tile;  // tile_n = warps / head_splits · 16; tile.dq_tile_n: keys per dQ-kernel step
  size_t dq_shared_limit = kSm80SharedBytes;  // the dQ kernel keeps two K/V stages where they fit this
  constexpr int threads() const { return warps * 32; }
};

inline constexpr int kBwdVariants = 4;
inline constexpr const char* kBwdVariantNames[kBwdVariants] = {"w4", "w8", "w8b2", "compact"};
inline constexpr int kBwdCompact = 3;

// The backward variant used when FMHA_SM80_BWD_CONFIG is unset: w8b2 for 16-bit types at head
// dim 64, where it measured fastest on an H200 (docs/PERF.md), w4 elsewhere.
constexpr int default_bwd_variant(int element_bytes, int head_dim) {
  return element_bytes == 2 && head_dim == 64 ? 2 : 0;
}

constexpr BwdConfig bwd_config(int element_bytes, int head_dim, int variant) {
  const TileConfig base = tile_config(Direction::backward, element_bytes, head_dim);
  if (variant == 0) return {kWarps, base};
  if (variant == kBwdCompact) {
    TileConfig compact = base;
    compact.dq_tile_n = head_dim <= (element_bytes == 2 ? 128 : 64) ? 32 : 16;
    if (head_dim > 128) compact.tile_m = kRowsPerWarp;
    if (element_bytes == 4 && head_dim > 96) {  // tf32: fewer keys per block, dK/dV split over more warps
      compact.head_splits = head_dim <= 128 ? 2 : 4;
      compact.tile_n = kWarps / compact.head_splits * kRowsPerWarp;
      compact.tile_m = kRowsPerWarp;
    }
    return {kWarps, compact, kCompactSharedBytes};
  }
  constexpr int kWideWarps = 2 * kWarps;
  TileConfig wide = base;
  wide.tile_n = kWideWarps / base.head_splits * kRowsPerWarp;
  wide.min_blocks = 1;
  if (variant == 2) {
    const int min_rows = 2048 / head_dim > kRowsPerWarp ? 2048 / head_dim : kRowsPerWarp;
    wide.tile_m = base.tile_m / 2 > min_rows ? base.tile_m / 2 : min_rows;
    wide.min_blocks = 2;
  }
  return {kWideWarps, wide};
}

// Split tf32 (tf32x3_t) has one configuration per direction, compiled alone at every head dim
// (FMHA_SM80_FWD_CONFIG and FMHA_SM80_BWD_CONFIG do not apply to it). Its fragments hold a high
// and a residual half, twice tf32's operand registers, and P (dS) as A fragments is 2·BN/4
// registers per m16 block instead of BN/4, so
//   forward: one m16 block per warp (32 rows per warp would hold a [32, HD] accumulator, the
//     scores and P's two halves: past 255 registers at head dim 128): w8r16 up to head dim 128
//     (128-row tiles: K and V cross from global memory once per 128 queries, as in tf32's w4r32,
//     though each warp splits the fragments it loads for its 16 rows), w4r16 above, with the
//     register budget of one block per SM;
//   backward: 4 warps as w4, with 16-row query steps (S^T, dP^T and their split A fragments for
//     16 queries), dK/dV split over two warps from head dim 65 (a warp's 16 × 128 dK and dV
//     would be 128 registers), and 32 keys per step of the deterministic dQ kernel. With tf32's
//     shapes both kernels spill at head dims 64 and 128 (ptxas -v).
constexpr int split_fwd_variant(int head_dim) { return head_dim <= 128 ? 2 : 0; }
constexpr int split_bwd_variant(int) { return 0; }
constexpr TileConfig split_bwd_tile(int head_dim) {
  constexpr int kSplitDqKeys = 32;
  TileConfig c = tile_config(Direction::backward, sizeof(float), head_dim);
  // dQ's [16, HD] step splits its columns over the 4 warps in pairs of n8 tiles: where HD / 4 is
  // not a multiple of 16 (head dims 32 and 96), 32-row steps split them over 2 warps instead.
  c.tile_m = (head_dim / kWarps) % 16 == 0 ? kRowsPerWarp : 2 * kRowsPerWarp;
  if (head_dim > 64 && c.head_splits == 1) {
    c.head_splits = 2;
    c.tile_n = kWarps / c.head_splits * kRowsPerWarp;
  }
  if (c.dq_tile_n == 0 || c.dq_tile_n > kSplitDqKeys) c.dq_tile_n = kSplitDqKeys;
  return c;
}

template <class T>
constexpr int default_fwd_variant_of(int head_dim) {
  return kSplitTf32<T> ? split_fwd_variant(head_dim) : default_fwd_variant(int(sizeof(T)), head_dim);
}
template <class T>
constexpr int default_bwd_variant_of(int head_dim) {
  return kSplitTf32<T> ? split_bwd_variant(head_dim) : default_bwd_variant(int(sizeof(T)), head_dim);
}

// The configurations of storage T: its element size's, one block per SM for split tf32.
template <class T>
constexpr FwdConfig fwd_config_of(int head_dim, int variant) {
  FwdConfig c = fwd_config(int(sizeof(T)), head_dim, variant);
  if (kSplitTf32<T>) c.min_blocks = 1;
  return c;
}
template <class T>
constexpr BwdConfig bwd_config_of(int head_dim, int variant) {
  if (kSplitTf32<T>) return {kWarps, split_bwd_tile(head_dim)};
  return bwd_config(int(sizeof(T)), head_dim, variant);
}

}  // namespace fmha::cuda::sm80
