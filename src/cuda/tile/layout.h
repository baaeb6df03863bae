// Where the Hopper tile ops put each element: the 128-byte swizzle of TMA tiles, the accumulator
// and tf32 register-fragment layouts of wgmma, and the addressing of the ops that move fp32 tiles
// between those (transpose_k_major, store_transposed_tf32 in wgmma.cuh). Plain C++ (host and
// device), so that the CPU tests emulate the very arithmetic the kernels run
// (tests/test_tile_layouts.cpp).
#pragma once

#include <cstdint>

#include "fmha/mask.h"  // FMHA_HOST_DEVICE

namespace fmha::cuda::tile::layout {

inline constexpr int kSwizzleBytes = 128;                      // a row of a swizzled column chunk
inline constexpr int kUnitBytes = 16;                          // the swizzle permutes 16-byte units
inline constexpr int kUnitsPerRow = kSwizzleBytes / kUnitBytes;  // 8: also its period in rows
inline constexpr int kFp32ChunkCols = kSwizzleBytes / 4;       // fp32 columns of a chunk
inline constexpr int kFp32UnitCols = kUnitBytes / 4;           // fp32 columns of a unit
inline constexpr int kSwizzlePeriodBytes = kUnitsPerRow * kSwizzleBytes;  // 1,024: 8 rows, the pattern's period

// Byte offset of element (row, col) of a tile stored as column chunks of chunk_bytes ([rows, 128
// bytes] each), elements of elem_bytes, each row's 16-byte units XOR-ed by row % 8 (SWIZZLE_128B).
FMHA_HOST_DEVICE constexpr int swizzled_offset(int row, int col, int chunk_bytes, int elem_bytes) {
  const int cols = kSwizzleBytes / elem_bytes;
  const int byte = (col % cols) * elem_bytes;
  return (col / cols) * chunk_bytes + row * kSwizzleBytes + ((byte / kUnitBytes) ^ (row % kUnitsPerRow)) * kUnitBytes +
         byte % kUnitBytes;
}

// A warpgroup's [64, N] fp32 accumulator: thread t's register d[4 g + 2 i + c] holds (row, col) =
// (acc_row(t, i), acc_col(t, 2 g + c)).
FMHA_HOST_DEVICE constexpr int acc_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * i; }
FMHA_HOST_DEVICE constexpr int acc_col(int t, int j) { return 8 * (j / 2) + 2 * (t % 4) + j % 2; }

// The register A operand of tf32 wgmma (m64nNk8), as the PTX ISA defines it: register e of
// thread t holds A[tf32_a_row(t, e)][tf32_a_k(t, e)] of the k step.
FMHA_HOST_DEVICE constexpr int tf32_a_row(int t, int e) { return 16 * (t / 32) + (t % 32) / 4 + 8 * (e % 2); }
FMHA_HOST_DEVICE constexpr int tf32_a_k(int t, int e) { return t % 4 + 4 * (e / 2); }

// a_from_acc<float>'s fragments: register e of k block kb is the accumulator's register
// 4 kb + acc_register_of(e), which holds column 2 (t % 4) + e / 2 of the block; the hardware reads
// it as k position t % 4 + 4 (e / 2). So k position p holds column tf32_column_at(p), and column
// c sits at position tf32_position_of(c): B's rows must be permuted the same way.
FMHA_HOST_DEVICE constexpr int acc_register_of(int e) { return e == 1 ? 2 : e == 2 ? 1 : e; }
FMHA_HOST_DEVICE constexpr int tf32_position_of(int col) { return (col / 8) * 8 + (col % 2) * 4 + (col % 8) / 2; }
FMHA_HOST_DEVICE constexpr int tf32_column_at(int position) {
  return (position / 8) * 8 + 2 * (position % 4) + (position % 8) / 4;
}

// transpose_k_major<ROWS, COLS>: an fp32 [ROWS, COLS] tile in chunks of [ROWS, 32] into its
// transpose [COLS, ROWS] in chunks of [COLS, 32]. Work item `item` of a warp: 32 source rows (one
// a lane) of one 16-byte unit (4 columns). Lane l reads the unit at transpose_source(item, l)
// and writes its element i at transpose_destination(item, place, i), `place` its row's place in
// a destination row (l, or tf32_position_of(l) when permuted).
template <int ROWS, int COLS>
struct Transpose {
  static_assert(ROWS % kFp32ChunkCols == 0 && COLS % kFp32ChunkCols == 0, "whole 32-column chunks");
  static constexpr uint32_t kSrcChunkBytes = ROWS * kSwizzleBytes;
  static constexpr uint32_t kDstChunkBytes = COLS * kSwizzleBytes;
  static constexpr uint32_t kItemsPerBlock = COLS / kFp32UnitCols;  // items per 32 source rows
  static constexpr uint32_t kItems = (ROWS / kFp32ChunkCols) * kItemsPerBlock;

  // The item's block of 32 source rows (one destination chunk) and 16-byte unit of a source row
  // (over its chunks).
  FMHA_HOST_DEVICE static constexpr uint32_t block(uint32_t item) { return item / kItemsPerBlock; }
  FMHA_HOST_DEVICE static constexpr uint32_t unit(uint32_t item) { return item % kItemsPerBlock; }
  // Source row 32 · block + lane: its unit, swizzled by the row (lane % 8, as 32 · block is a
  // multiple of 8).
  FMHA_HOST_DEVICE static constexpr uint32_t source(uint32_t item, uint32_t lane) {
    return lane * kSwizzleBytes + block(item) * kFp32ChunkCols * kSwizzleBytes +
           (unit(item) / kUnitsPerRow) * kSrcChunkBytes + ((unit(item) % kUnitsPerRow) ^ (lane % kUnitsPerRow)) * kUnitBytes;
  }
  // Destination row 4 · unit + i (its row % 8 is (unit % 2) · 4 + i), column `place` of chunk
  // `block`.
  FMHA_HOST_DEVICE static constexpr uint32_t destination(uint32_t item, uint32_t place, uint32_t i) {
    return block(item) * kDstChunkBytes + (unit(item) * kFp32UnitCols + i) * kSwizzleBytes +
           ((place / kFp32UnitCols) ^ ((unit(item) % 2) * kFp32UnitCols + i)) * kUnitBytes +
           (place % kFp32UnitCols) * 4;
  }
};

// store_transposed_tf32<N>: register e of k block kb of thread t (a_from_acc<float>'s fragment of
// element (r, c) = (tf32_a_row(t, e), 8 kb + 2 (t % 4) + e / 2) of a [64, N] tile) goes to row c,
// column col0 + r of a tile in chunks of [N, 32].
FMHA_HOST_DEVICE constexpr int transposed_fragment_offset(int n, int t, int kb, int e, int col0) {
  return swizzled_offset(8 * kb + 2 * (t % 4) + e / 2, col0 + tf32_a_row(t, e), n * kSwizzleBytes, 4);
}

// load_transposed_a_tf32: the register A operand Xᵀ [M, K] of a tf32 wgmma taken from an fp32
// tile X [K rows, M columns] as TMA lands it (chunks of [K rows, 32], chunk_bytes apart), k in
// order: register e of k step kb of thread t holds X[8 kb + tf32_a_k(t, e)][m0 + tf32_a_row(t, e)]
// (dO as dOᵀ, Q as Qᵀ, K as Kᵀ in the wide tf32 backward). B's k rows are then in order too.
FMHA_HOST_DEVICE constexpr int transposed_a_offset(int t, int kb, int e, int m0, int chunk_bytes) {
  return swizzled_offset(8 * kb + tf32_a_k(t, e), m0 + tf32_a_row(t, e), chunk_bytes, 4);
}
// k step kb's offsets are k step 0's plus kb · kSwizzlePeriodBytes: its rows are 8 kb on, and
// the swizzle's row phase (row % 8) repeats every 8 rows. So four base addresses a thread (one
// per register e) serve every k step, the rest being immediates (CPU test
// TileLayout.TransposedOffsetsStepByThePeriod).

// store_transposed_acc_tf32: a warpgroup's [64, N] fp32 accumulator transposed into a tile in
// chunks of chunk_bytes: element (acc_row(t, i), acc_col(t, j)) goes to row row0 + acc_col(t, j),
// column acc_row(t, i) (dS [q, keys] from dSᵀ [keys, q] in the wide tf32 backward).
FMHA_HOST_DEVICE constexpr int transposed_acc_offset(int t, int i, int j, int row0, int chunk_bytes) {
  return swizzled_offset(row0 + acc_col(t, j), acc_row(t, i), chunk_bytes, 4);
}
// Columns j and j + 2 g land kSwizzlePeriodBytes · g apart (rows 8 g on, the same row phase):
// four base addresses a thread (i, j < 2) serve every column pair (same test).

}  // namespace fmha::cuda::tile::layout
