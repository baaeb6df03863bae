// Block-wide tile copies between strided global tensors and shared memory. Loads are cp.async
// (through the __pipeline intrinsics) so that a kernel can keep STAGES tiles in flight; rows and
// columns past the valid extent are zero-filled instead of read, which is what makes ragged tails
// safe: a padded key scores 0 before masking and a padded value row adds nothing.
#pragma once

#include <cuda_pipeline.h>

#include <cstdint>

#include "cuda/tile/convert.cuh"
#include "cuda/tile/tile.cuh"

namespace fmha::cuda::tile::block {

// dst[r][c] = src[r * row_stride + c] for r < rows_valid, c < cols_valid; 0 elsewhere.
// Copies VEC elements per instruction (4, 8 or 16 bytes): cols_valid, row_stride and src must be
// multiples of VEC elements (the tier's supports() checks that). Issues the copies and returns;
// pair with commit() and wait<N>().
template <int VEC, int THREADS, class Tile>
__device__ __forceinline__ void load_async(Tile dst, const typename Tile::Element* src, int64_t row_stride,
                                           int rows_valid, int cols_valid) {
  using T = typename Tile::Element;
  static_assert(Tile::kCols % VEC == 0, "tile width must be a multiple of the copy width");
  static_assert(sizeof(T) * VEC == 4 || sizeof(T) * VEC == 8 || sizeof(T) * VEC == 16, "cp.async copies 4/8/16 B");
  constexpr int kChunksPerRow = Tile::kCols / VEC;
  constexpr int kChunks = Tile::kRows * kChunksPerRow;
  constexpr size_t kBytes = sizeof(T) * VEC;
  for (int chunk = threadIdx.x; chunk < kChunks; chunk += THREADS) {
    const int r = chunk / kChunksPerRow;
    const int c = (chunk % kChunksPerRow) * VEC;
    const bool valid = r < rows_valid && c < cols_valid;
    // An invalid chunk reads nothing (zfill covers all of it); src is only a harmless address.
    const T* from = valid ? src + r * row_stride + c : src;
    __pipeline_memcpy_async(&dst(r, c), from, kBytes, valid ? 0 : kBytes);
  }
}

// The same tile through registers, converting T to the tile's element type (fp16/bf16 → fp32)
// on the way; synchronous (plain loads), for kernels that compute in fp32 from 16-bit storage.
template <int THREADS, class Tile, class T>
__device__ __forceinline__ void load_convert(Tile dst, const T* src, int64_t row_stride, int rows_valid,
                                             int cols_valid) {
  constexpr int kElements = Tile::kRows * Tile::kCols;
  for (int e = threadIdx.x; e < kElements; e += THREADS) {
    const int r = e / Tile::kCols, c = e % Tile::kCols;
    dst(r, c) = r < rows_valid && c < cols_valid ? typename Tile::Element(to_float(src[r * row_stride + c]))
                                                 : typename Tile::Element(0);
  }
}

__device__ __forceinline__ void commit() { __pipeline_commit(); }

// Waits until at most N committed groups of this thread are still in flight. The caller follows
// with __syncthreads() so that every thread's copies are visible.
template <int N>
__device__ __forceinline__ void wait() { __pipeline_wait_prior(N); }

// dst[i] = src[i] for i < valid, `fill` elsewhere: small per-row vectors (LSE, Δ).
template <int N, int THREADS>
__device__ __forceinline__ void load_vector(float* dst, const float* src, int valid, float fill) {
  for (int i = threadIdx.x; i < N; i += THREADS) dst[i] = i < valid ? src[i] : fill;
}

// The same as load_vector through cp.async: the copies join the caller's next commit() group
// instead of stalling this thread on a global load; entries past `valid` are stored directly.
template <int N, int THREADS>
__device__ __forceinline__ void load_vector_async(float* dst, const float* src, int valid, float fill) {
  for (int i = threadIdx.x; i < N; i += THREADS) {
    if (i < valid)
      __pipeline_memcpy_async(dst + i, src + i, sizeof(float));
    else
      dst[i] = fill;
  }
}

}  // namespace fmha::cuda::tile::block
