// Warpgroup tensor-core ops of Hopper (sm_90a): wgmma shared-memory descriptors, the async
// protocol (fence, commit, wait) and the accumulator fragment. The instructions themselves are
// generated (wgmma_ops.inc, scripts/gen_wgmma.py); cuda::ptx in CCCL does not cover wgmma.
//
// A warpgroup is 4 consecutive warps starting at a warp index divisible by 4 (128 threads). With
// thread t of the warpgroup, w = t / 32, l = t % 32, r0 = 16·w + l / 4:
//   accumulator m64nN, fp32, N/2 registers: d[4g + 2i + c] = D[r0 + 8i][8g + 2(l % 4) + c]
//     (g < N/8, i, c in {0, 1}); a row lives on the 4 lanes of a quad.
//   A from registers, m64n?k16 16-bit, 4 registers of 2 elements (low half = lower column):
//     a0 = A[r0][2(l%4) + {0,1}]  a1 = A[r0+8][same]  a2 = A[r0][2(l%4) + 8 + {0,1}]  a3 = A[r0+8][same]
//     which is the accumulator's k-th 16-column block converted pairwise (a_from_acc).
//
// Shared-memory operands use the 128-byte swizzle that TMA writes (SWIZZLE_128B): a tile is a
// sequence of "column chunks" of 64 16-bit (or 32 fp32) elements, each chunk [rows, 128 B] with
// the 16-byte units of row r XOR-ed by r % 8. Chunks must start 1024-byte aligned.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/tile/convert.cuh"

namespace fmha::cuda::tile::warpgroup {

inline constexpr int kThreads = 128;
inline constexpr int kRows = 64;           // M of every wgmma
inline constexpr int kSwizzleBytes = 128;  // a row of a swizzled column chunk
inline constexpr int kSwizzleAtomBytes = 1024;  // 8 rows × 128 B: the swizzle pattern's period

// Elements of T in one 128-byte swizzled row: the width of a column chunk.
template <class T>
inline constexpr int kChunkCols = kSwizzleBytes / int(sizeof(T));

// The 64-bit matrix descriptor: start address, leading and stride byte offsets (16-byte units),
// base offset 0 (chunks are 1024-byte aligned) and the 128-byte swizzle mode.
__device__ __forceinline__ uint64_t make_desc(const void* smem, uint32_t leading_bytes, uint32_t stride_bytes) {
  constexpr uint64_t kSwizzle128 = 1;
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t desc = 0;
  desc |= uint64_t((addr & 0x3FFFF) >> 4);
  desc |= uint64_t((leading_bytes >> 4) & 0x3FFF) << 16;
  desc |= uint64_t((stride_bytes >> 4) & 0x3FFF) << 32;
  desc |= kSwizzle128 << 62;
  return desc;
}

// A K-major operand (rows × K, K contiguous: Q, K as B of Q·Kᵀ). The k-th step of kK elements
// (32 bytes) starts 32·(k % steps per chunk) bytes into a 128-byte row of chunk k / steps per
// chunk; 8-row groups are 1024 bytes apart. chunk_bytes is the size of one column chunk.
template <class T, int K_STEP>
__device__ __forceinline__ uint64_t k_major_desc(const T* tile, int row0, int k0, int chunk_bytes) {
  const char* base = reinterpret_cast<const char*>(tile) + (k0 / kChunkCols<T>) * chunk_bytes +
                     row0 * kSwizzleBytes + (k0 % kChunkCols<T>) * int(sizeof(T));
  return make_desc(base, 16, kSwizzleAtomBytes);
}

// An MN-major operand (K rows × N, N contiguous: V as B of P·V, 16-bit only). A k-step of 16 rows
// starts 16 · 128 bytes further; consecutive 64-column chunks (N) are chunk_bytes apart (the
// leading byte offset), 8-row groups 1024 bytes apart (the stride byte offset).
template <class T>
__device__ __forceinline__ uint64_t mn_major_desc(const T* tile, int k0, int chunk_bytes) {
  static_assert(sizeof(T) == 2, "wgmma transposes 16-bit operands only");
  const char* base = reinterpret_cast<const char*>(tile) + k0 * kSwizzleBytes;
  return make_desc(base, uint32_t(chunk_bytes), kSwizzleAtomBytes);
}

// What k_major_desc(tile, row0, k0, ...) adds to k_major_desc(tile, row0, 0, ...), and
// mn_major_desc(tile, k0, ...) to mn_major_desc(tile, 0, ...): the start address moves in
// 16-byte units.
template <class T>
__host__ __device__ __forceinline__ constexpr uint64_t k_major_step(int k0, int chunk_bytes) {
  return uint64_t(((k0 / kChunkCols<T>) * chunk_bytes + (k0 % kChunkCols<T>) * int(sizeof(T))) >> 4);
}
__host__ __device__ __forceinline__ constexpr uint64_t mn_major_step(int k0) {
  return uint64_t((k0 * kSwizzleBytes) >> 4);
}

// Byte offset of element (row, col) inside a swizzled tile of column chunks of chunk_bytes.
template <class T>
__device__ __forceinline__ int swizzled_offset(int row, int col, int chunk_bytes) {
  const int byte = (col % kChunkCols<T>) * int(sizeof(T));
  return (col / kChunkCols<T>) * chunk_bytes + row * kSwizzleBytes + (((byte / 16) ^ (row % 8)) * 16) + byte % 16;
}

// The async protocol. fence() before the first wgmma that reads registers written by ordinary
// instructions (accumulators, register A); commit() closes a group; wait<N>() returns when at most
// N groups are pending. Accumulators must not be touched between issue and the covering wait.
__device__ __forceinline__ void fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Keeps the compiler from moving reads or writes of `x` across a wait (it cannot see that an
// issued wgmma still owns the register).
template <int COUNT>
__device__ __forceinline__ void fence_operand(float (&x)[COUNT]) {
#pragma unroll
  for (int i = 0; i < COUNT; ++i) asm volatile("" : "+f"(x[i])::"memory");
}
template <int COUNT>
__device__ __forceinline__ void fence_operand(uint32_t (&x)[COUNT]) {
#pragma unroll
  for (int i = 0; i < COUNT; ++i) asm volatile("" : "+r"(x[i])::"memory");
}
template <int ROWS, int COLS>
__device__ __forceinline__ void fence_operand(uint32_t (&x)[ROWS][COLS]) {
#pragma unroll
  for (int i = 0; i < ROWS; ++i) fence_operand(x[i]);
}

template <class T, int N>
struct Wgmma;
#include "cuda/tile/wgmma_ops.inc"

// A warpgroup's [64, N] fp32 accumulator, seen by one thread as a RegTile<float, 2, N/4>:
// element (i, j) is D[row(i)][col(j)] (the layout above), so the row reductions of reduce.cuh
// apply with 4 lanes per row.
template <int N>
struct Accumulator {
  static constexpr int kRows = 2, kCols = N / 4, kRegs = N / 2;
  float d[kRegs];

  __device__ __forceinline__ float& operator()(int i, int j) { return d[4 * (j / 2) + 2 * i + j % 2]; }
  __device__ __forceinline__ const float& operator()(int i, int j) const { return d[4 * (j / 2) + 2 * i + j % 2]; }
  __device__ __forceinline__ void fill(float x) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) d[i] = x;
  }
  // Row and column of element (i, j) for thread t of the warpgroup.
  __device__ __forceinline__ static int row(int i, int t) { return 16 * (t / 32) + (t % 32) / 4 + 8 * i; }
  __device__ __forceinline__ static int col(int j, int t) { return 8 * (j / 2) + 2 * (t % 4) + j % 2; }
};

// The register-A fragments of acc's N/16 column blocks: a[kb] feeds the kb-th k16 step of an rs
// wgmma whose A is acc (P·V with P from the scores, never through shared memory).
template <class T, int N>
__device__ __forceinline__ void a_from_acc(uint32_t (&a)[N / 16][4], const Accumulator<N>& acc) {
#pragma unroll
  for (int kb = 0; kb < N / 16; ++kb) {
    a[kb][0] = tile::pack2<T>(acc.d[8 * kb + 0], acc.d[8 * kb + 1]);
    a[kb][1] = tile::pack2<T>(acc.d[8 * kb + 2], acc.d[8 * kb + 3]);
    a[kb][2] = tile::pack2<T>(acc.d[8 * kb + 4], acc.d[8 * kb + 5]);
    a[kb][3] = tile::pack2<T>(acc.d[8 * kb + 6], acc.d[8 * kb + 7]);
  }
}

// stmatrix (sm_90): four 8×8 16-bit matrices from a warp's registers into shared memory. Lane l
// gives the shared-window address of row l % 8 of matrix l / 8; register i of every lane holds
// matrix i as an mma fragment (row l / 4, columns 2(l % 4) and 2(l % 4) + 1). cuda::ptx has no
// stmatrix, hence the inline PTX.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
#endif
}

// acc, row i of each thread's pair multiplied by row_scale[i], converted to T and stored as the
// warpgroup's [64, N] tile of 128-byte swizzled column chunks (chunk_bytes apart) at the
// shared-window address `tile`. One stmatrix per 16 columns: lanes 0-7 / 8-15 / 16-23 / 24-31
// address rows 0-7 / 8-15 of the block's first 8 columns, then of its second 8. A lane's row is
// fixed, so its swizzle term takes 4 values (16-column blocks modulo 64 columns); the chunk
// offset is a constant per block. The register packing is a_from_acc's.
template <class T, int N>
__device__ __forceinline__ void store_swizzled(const Accumulator<N>& acc, const float (&row_scale)[2], uint32_t tile,
                                               int chunk_bytes, int thread) {
  static_assert(sizeof(T) == 2 && N % 16 == 0, "stmatrix stores 16-bit 8×8 blocks");
  constexpr int kBlocksPerChunk = kChunkCols<T> / 16;  // 16-column blocks in a swizzled chunk
  const int lane = thread % 32;
  const int row_in_block = lane % 8, half = (lane / 8) % 2, col_half = lane / 16;
  const uint32_t row_addr = tile + uint32_t((16 * (thread / 32) + 8 * half + row_in_block) * kSwizzleBytes);
  uint32_t addr[kBlocksPerChunk];
#pragma unroll
  for (int q = 0; q < kBlocksPerChunk; ++q) addr[q] = row_addr + uint32_t(((2 * q + col_half) ^ row_in_block) * 16);
#pragma unroll
  for (int kb = 0; kb < N / 16; ++kb) {
    const float* d = acc.d + 8 * kb;
    stmatrix_x4(addr[kb % kBlocksPerChunk] + uint32_t((kb / kBlocksPerChunk) * chunk_bytes),
                tile::pack2<T>(d[0] * row_scale[0], d[1] * row_scale[0]),
                tile::pack2<T>(d[2] * row_scale[1], d[3] * row_scale[1]),
                tile::pack2<T>(d[4] * row_scale[0], d[5] * row_scale[0]),
                tile::pack2<T>(d[6] * row_scale[1], d[7] * row_scale[1]));
  }
}

// stmatrix.trans: as stmatrix_x4, each 8×8 matrix stored transposed (lane l addresses row l % 8
// of the transposed matrix l / 8).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#endif
}

// The transpose of a warpgroup's [64, N] 16-bit tile, given as a_from_acc fragments, stored as
// an [N, 64] tile in one 128-byte swizzled column chunk at the shared-window address `tile`
// (K-major for a later wgmma whose A is the transpose: dS from dSᵀ in the backward). The 8×8
// block (i, g) of warp w (source rows 16w + 8i.., columns 8g..) lands, transposed, at rows
// 8g.. and the 16-byte unit 2w + i of the destination; a lane's address then only moves by
// whole 16-row groups (2 KiB), a constant per fragment.
template <class T, int N>
__device__ __forceinline__ void store_transposed_swizzled(const uint32_t (&frags)[N / 16][4], uint32_t tile,
                                                          int thread) {
  static_assert(sizeof(T) == 2, "stmatrix stores 16-bit 8×8 blocks");
  constexpr uint32_t kGroupBytes = 16 * kSwizzleBytes;  // 16 destination rows
  const int lane = thread % 32, warp = thread / 32;
  const int row_in_block = lane % 8, half = (lane / 8) % 2, col_half = lane / 16;
  const uint32_t addr =
      tile + uint32_t((8 * col_half + row_in_block) * kSwizzleBytes + (((2 * warp + half) ^ row_in_block) * 16));
#pragma unroll
  for (int kb = 0; kb < N / 16; ++kb)
    stmatrix_x4_trans(addr + uint32_t(kb) * kGroupBytes, frags[kb][0], frags[kb][1], frags[kb][2], frags[kb][3]);
}

}  // namespace fmha::cuda::tile::warpgroup
