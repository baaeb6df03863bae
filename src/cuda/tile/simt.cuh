// SIMT (FMA) matrix ops for a block of 256 threads arranged as a 16 × 16 grid.
//
// Register layout "Grid16": thread t has ty = t / 16 and tx = t % 16. A RegTile<float, R, C>
// in this layout holds element (i, j) = tile element (ty + 16·i, tx + 16·j) of an [16R, 16C]
// tile. The 16 threads that share a row are the 16 consecutive lanes tx = 0..15 of one half warp,
// so a row reduction is a 4-step xor butterfly (reduce.cuh, LANES = 16). Interleaving rows and
// columns by 16 makes shared-memory reads of a row (fixed k, 16 consecutive columns) conflict-free
// and lets the row operand be a broadcast.
#pragma once

#include "cuda/tile/tile.cuh"

namespace fmha::cuda::tile {

struct Grid16 {
  static constexpr int kSide = 16;
  static constexpr int kThreads = kSide * kSide;
  int ty, tx;
  __device__ __forceinline__ static Grid16 of_thread() {
    return {int(threadIdx.x) / kSide, int(threadIdx.x) % kSide};
  }
  __device__ __forceinline__ int row(int i) const { return ty + kSide * i; }
  __device__ __forceinline__ int col(int j) const { return tx + kSide * j; }
};

namespace thread {

// acc[M, N] += A[M, K] · B[N, K]^T  (A, B row-major in shared memory; acc in the Grid16 layout)
template <int K, class Acc, class TileA, class TileB>
__device__ __forceinline__ void mma_nt(Acc& acc, TileA a, TileB b, Grid16 g) {
  static_assert(TileA::kRows == 16 * Acc::kRows && TileB::kRows == 16 * Acc::kCols, "tile shapes");
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float a_col[Acc::kRows], b_col[Acc::kCols];
#pragma unroll
    for (int i = 0; i < Acc::kRows; ++i) a_col[i] = a(g.row(i), k);
#pragma unroll
    for (int j = 0; j < Acc::kCols; ++j) b_col[j] = b(g.col(j), k);
#pragma unroll
    for (int i = 0; i < Acc::kRows; ++i)
#pragma unroll
      for (int j = 0; j < Acc::kCols; ++j) acc(i, j) = fmaf(a_col[i], b_col[j], acc(i, j));
  }
}

// acc[M, N] += A[M, K] · B[K, N]
template <int K, class Acc, class TileA, class TileB>
__device__ __forceinline__ void mma_nn(Acc& acc, TileA a, TileB b, Grid16 g) {
  static_assert(TileA::kRows == 16 * Acc::kRows && TileB::kCols == 16 * Acc::kCols, "tile shapes");
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float a_col[Acc::kRows], b_row[Acc::kCols];
#pragma unroll
    for (int i = 0; i < Acc::kRows; ++i) a_col[i] = a(g.row(i), k);
#pragma unroll
    for (int j = 0; j < Acc::kCols; ++j) b_row[j] = b(k, g.col(j));
#pragma unroll
    for (int i = 0; i < Acc::kRows; ++i)
#pragma unroll
      for (int j = 0; j < Acc::kCols; ++j) acc(i, j) = fmaf(a_col[i], b_row[j], acc(i, j));
  }
}

// acc[M, N] += A[K, M]^T · B[K, N]
template <int K, class Acc, class TileA, class TileB>
__device__ __forceinline__ void mma_tn(Acc& acc, TileA a, TileB b, Grid16 g) {
  static_assert(TileA::kCols == 16 * Acc::kRows && TileB::kCols == 16 * Acc::kCols, "tile shapes");
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float a_row[Acc::kRows], b_row[Acc::kCols];
#pragma unroll
    for (int i = 0; i < Acc::kRows; ++i) a_row[i] = a(k, g.row(i));
#pragma unroll
    for (int j = 0; j < Acc::kCols; ++j) b_row[j] = b(k, g.col(j));
#pragma unroll
    for (int i = 0; i < Acc::kRows; ++i)
#pragma unroll
      for (int j = 0; j < Acc::kCols; ++j) acc(i, j) = fmaf(a_row[i], b_row[j], acc(i, j));
  }
}

// dst(row(i), col(j)) = src(i, j): a Grid16 register tile written to shared memory.
template <class Tile, class Reg>
__device__ __forceinline__ void store(Tile dst, const Reg& src, Grid16 g) {
#pragma unroll
  for (int i = 0; i < Reg::kRows; ++i)
#pragma unroll
    for (int j = 0; j < Reg::kCols; ++j) dst(g.row(i), g.col(j)) = src(i, j);
}

}  // namespace thread
}  // namespace fmha::cuda::tile
