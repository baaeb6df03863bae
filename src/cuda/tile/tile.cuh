// Typed tiles: a shared-memory tile and a register tile, each with its shape in the type, so that
// an op's signature says which shapes it accepts. Layouts of register tiles (which element each
// lane holds) are documented with the ops that produce them (simt.cuh, mma.cuh).
#pragma once

#include <cuda_runtime.h>

namespace fmha::cuda::tile {

// [ROWS, COLS] elements of T in shared memory, row-major with a row stride of COLS + PAD
// elements. PAD staggers rows across banks; it must keep rows aligned to what the loads need.
template <class T, int ROWS, int COLS, int PAD = 0>
struct SmemTile {
  using Element = T;
  static constexpr int kRows = ROWS, kCols = COLS, kStride = COLS + PAD;
  static constexpr int kElements = ROWS * kStride;
  T* ptr;

  __device__ __forceinline__ T& operator()(int row, int col) const { return ptr[row * kStride + col]; }
  __device__ __forceinline__ T* row(int r) const { return ptr + r * kStride; }
};

// Storage for one SmemTile inside a kernel's SharedStorage struct.
template <class Tile>
struct SmemArray {
  typename Tile::Element data[Tile::kElements];
  __device__ __forceinline__ Tile tile() { return Tile{data}; }
};

// A thread's [ROWS, COLS] registers. Which global element (i, j) stands for is the layout of the
// op that fills it.
template <class T, int ROWS, int COLS>
struct RegTile {
  static constexpr int kRows = ROWS, kCols = COLS;
  T v[ROWS][COLS];

  __device__ __forceinline__ T& operator()(int i, int j) { return v[i][j]; }
  __device__ __forceinline__ const T& operator()(int i, int j) const { return v[i][j]; }
  __device__ __forceinline__ void fill(T x) {
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
      for (int j = 0; j < COLS; ++j) v[i][j] = x;
  }
};

// Makes `indices` opaque to the compiler where called: what is derived from them afterwards is
// computed again there rather than taken from before. At the top of a mainloop's step, the
// shared-memory addresses a step derives from its thread's indices are then recomputed each step
// instead of hoisted out of the loop and kept in registers beside its accumulators, where ptxas
// spills them (the sm80 and sm90 backwards, the sm90 packed forward: docs/PERF.md, 2026-12-06).
__device__ __forceinline__ void opaque_one(int& index) { asm volatile("" : "+r"(index)); }
template <class... I>
__device__ __forceinline__ void opaque(I&... indices) {
  (opaque_one(indices), ...);
}

}  // namespace fmha::cuda::tile
