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
#include <type_traits>

#include "cuda/tile/convert.cuh"
#include "cuda/tile/layout.h"

namespace fmha::cuda::tile::warpgroup {

inline constexpr int kThreads = 128;
inline constexpr int kRows = 64;           // M of every wgmma
inline constexpr int kSwizzleBytes = layout::kSwizzleBytes;            // a row of a swizzled column chunk
inline constexpr int kSwizzleAtomBytes = layout::kSwizzlePeriodBytes;  // 8 rows × 128 B: the swizzle pattern's period

// The block's warpgroup of this thread, through a shuffle from lane 0: the compiler then knows it
// the same across the warp, so that what derives from it (tile addresses, wgmma descriptors) may
// live in uniform registers rather than be moved there (R2UR) before each use.
__device__ __forceinline__ int uniform_index() {
  return __shfl_sync(0xffffffffu, int(threadIdx.x) / kThreads, 0);
}

// Elements of T in one 128-byte swizzled row: the width of a column chunk.
template <class T>
inline constexpr int kChunkCols = kSwizzleBytes / int(sizeof(T));

// A kernel's shared storage S at the first swizzle atom of its dynamic shared memory `raw`
// (launched with sizeof(S) + kSwizzleAtomBytes bytes). Aligned by pointer arithmetic on the
// shared array itself: through an integer, the compiler loses track of the address space and
// reaches S's fields with generic 64-bit loads and stores (-Xptxas -v, sm90 backward at head dim
// 128: 26 LD.E and 82 ST.E, 44 bytes of spills in the packed kernel, against 0, 0 and 0 this
// way; measured against it on an H100, docs/PERF.md run 44: the backward 1-9 % faster).
template <class S>
__device__ __forceinline__ S& shared_storage(char* raw) {
  const size_t misalignment = reinterpret_cast<uintptr_t>(raw) % kSwizzleAtomBytes;
  return *reinterpret_cast<S*>(raw + (misalignment == 0 ? 0 : kSwizzleAtomBytes - misalignment));
}

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
  return layout::swizzled_offset(row, col, chunk_bytes, int(sizeof(T)));
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
template <int PARTS, int ROWS, int COLS>
__device__ __forceinline__ void fence_operand(uint32_t (&x)[PARTS][ROWS][COLS]) {
#pragma unroll
  for (int i = 0; i < PARTS; ++i) fence_operand(x[i]);
}

// dst = src + 0 (src's values, -0 read as +0): src is a waited-for accumulator, and dst may be
// read after more wgmmas are issued. A move would not do: ptxas folds it and, tracing dst's
// values to the wgmma that wrote them, injects a wait for every wgmma in flight before the read;
// an addition of +0 it must keep (it changes -0).
template <int COUNT>
__device__ __forceinline__ void copy_out(float (&dst)[COUNT], const float (&src)[COUNT]) {
#pragma unroll
  for (int i = 0; i < COUNT; ++i) asm volatile("add.rn.f32 %0, %1, 0f00000000;" : "=f"(dst[i]) : "f"(src[i]));
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

// fence_operand over the accumulators of a product issued as several m64 wgmmas (one per 64 rows).
template <int N, int PARTS>
__device__ __forceinline__ void fence_operand(Accumulator<N> (&acc)[PARTS]) {
#pragma unroll
  for (int i = 0; i < PARTS; ++i) fence_operand(acc[i].d);
}

// K of one wgmma step for operand type T: 16 for 16-bit types, 8 for tf32 (fp32 storage).
template <class T>
inline constexpr int kStepK = sizeof(T) == 4 ? 8 : 16;

// The register-A fragments of acc's N/kStepK column blocks: a[kb] feeds the kb-th k step of an
// rs wgmma whose A is acc (P·V with P from the scores, never through shared memory).
// 16-bit: the block's 16 columns converted pairwise (the layout above).
// tf32 (T = float): A of m64nNk8 is a0 = A[r0][l%4], a1 = A[r0+8][l%4], a2 = A[r0][l%4 + 4],
// a3 = A[r0+8][l%4 + 4], while the accumulator holds columns 2(l%4) and 2(l%4) + 1 of each 8.
// Rather than move values between lanes, the k index is permuted: a0/a1 take column 2(l%4),
// a2/a3 column 2(l%4) + 1, so k step position p holds column tf32_key_of(p) — and B's rows must
// be permuted the same way (transpose_k_major below writes Vᵀ so). Rounded to nearest even (tile::to_tf32_rn, as every tf32 rounding of this tier).
using layout::tf32_position_of;  // column → k position in its 8 (layout.h)
// Split tf32: x as its tf32 high part and residual, hi = tf32(x) and lo = tf32(x − hi), rounded
// to nearest even (x − hi is exact, so hi + lo carries x to within 2^-22 of |x|), each in a 32-bit
// register. Every split of this tier's split-tf32 kernels goes through it (the backward's main
// and statistics kernels must split alike).
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32_rn(x);
  lo = to_tf32_rn(x - __uint_as_float(hi));
}

// Split tf32 (T = tile::tf32x3): the tf32 fragments above twice, a[0] the high parts tf32(x) and
// a[1] the residuals tf32(x − high), in the same k order.
template <class T, int N>
__device__ __forceinline__ void a_from_acc(uint32_t (&a)[2][N / 8][4], const Accumulator<N>& acc) {
  static_assert(std::is_same_v<T, tile::tf32x3>, "split fragments are tf32x3's");
#pragma unroll
  for (int kb = 0; kb < N / 8; ++kb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      split_tf32(acc.d[4 * kb + layout::acc_register_of(e)], a[0][kb][e], a[1][kb][e]);
    }
}
template <class T, int N>
__device__ __forceinline__ void a_from_acc(uint32_t (&a)[N / kStepK<T>][4], const Accumulator<N>& acc) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int kb = 0; kb < N / 8; ++kb)
#pragma unroll
      for (int e = 0; e < 4; ++e)  // rows r0, r0 + 8 of column 2(l%4), then of column 2(l%4) + 1
        a[kb][e] = tile::to_tf32_rn(acc.d[4 * kb + layout::acc_register_of(e)]);
  } else {
#pragma unroll
    for (int kb = 0; kb < N / 16; ++kb) {
      a[kb][0] = tile::pack2<T>(acc.d[8 * kb + 0], acc.d[8 * kb + 1]);
      a[kb][1] = tile::pack2<T>(acc.d[8 * kb + 2], acc.d[8 * kb + 3]);
      a[kb][2] = tile::pack2<T>(acc.d[8 * kb + 4], acc.d[8 * kb + 5]);
      a[kb][3] = tile::pack2<T>(acc.d[8 * kb + 6], acc.d[8 * kb + 7]);
    }
  }
}

// The transpose of a swizzled fp32 tile, shared to shared, rounded to tf32: src is [ROWS, COLS]
// in column chunks of [ROWS, 32] (TMA's layout: V as [keys, Dv]), dst is [COLS, ROWS] in column
// chunks of [COLS, 32] (K-major with ROWS as K: Vᵀ as the B operand of P·V). PERMUTE: each row's
// 32 entries permuted within groups of 8 by tf32_position_of (a_from_acc's k order: the A operand
// comes from registers); else in order (both operands from shared memory). ROUND_SOURCE: src is
// rounded to tf32 in place as well. RESIDUAL (split tf32): dst takes tf32(x) and dst_lo, a tile
// of dst's shape, the residual tf32(x − tf32(x)) at the same place. WARPS warps share the work,
// `warp` is this one's index among them.
// Work item: 32 source rows (one per lane) × 4 columns. A lane reads one 16-byte unit (float4)
// of its row and writes 4 scalars, one into each of 4 destination rows at its row's (permuted)
// position. Bank conflicts: reads go by quarter warps of 8 lanes, rows r..r+7 (r % 8 = 0) at
// the same logical unit u, stored at units u ^ (r % 8): 8 distinct units, all 32 banks once.
// Writes: 32 lanes, one destination row, 32 distinct positions p, bank 4 · ((p / 4) ^ row % 8) +
// p % 4: a permutation of the 32 banks (p = l without PERMUTE too). Both conflict-free; the
// in-place rounding stores the float4 where it was read.
// Addresses are shared-window (32-bit) and indices unsigned: the producer warpgroup runs this
// on few registers.
template <int ROWS, int COLS, int WARPS, bool PERMUTE = true, bool ROUND_SOURCE = false, bool RESIDUAL = false>
__device__ __forceinline__ void transpose_k_major(uint32_t src, uint32_t dst, int warp, int lane, uint32_t dst_lo = 0) {
  using L = layout::Transpose<ROWS, COLS>;  // the addressing (layout.h; emulated by the CPU tests)
  const uint32_t l = uint32_t(lane);
  const uint32_t place = PERMUTE ? uint32_t(tf32_position_of(int(l))) : l;  // this lane's row's place in a destination row
#pragma unroll 1
  for (uint32_t item = uint32_t(warp); item < L::kItems; item += WARPS) {
    float x[4];
    const uint32_t from = src + L::source(item, l);
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3])
                 : "r"(from));
    if constexpr (ROUND_SOURCE)
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(from), "r"(tile::to_tf32_rn(x[0])),
                   "r"(tile::to_tf32_rn(x[1])), "r"(tile::to_tf32_rn(x[2])), "r"(tile::to_tf32_rn(x[3]))
                   : "memory");
#pragma unroll
    for (uint32_t i = 0; i < uint32_t(layout::kFp32UnitCols); ++i) {
      const uint32_t to = L::destination(item, place, i);
      uint32_t hi, lo = 0;
      if constexpr (RESIDUAL) split_tf32(x[i], hi, lo);
      else hi = tile::to_tf32_rn(x[i]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst + to), "r"(hi) : "memory");
      if constexpr (RESIDUAL) asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst_lo + to), "r"(lo) : "memory");
    }
  }
}
template <int ROWS, int COLS, int WARPS, bool PERMUTE = true, bool ROUND_SOURCE = false>
__device__ __forceinline__ void transpose_k_major(float* src, float* dst, int warp, int lane) {
  transpose_k_major<ROWS, COLS, WARPS, PERMUTE, ROUND_SOURCE>(static_cast<uint32_t>(__cvta_generic_to_shared(src)),
                                                             static_cast<uint32_t>(__cvta_generic_to_shared(dst)),
                                                             warp, lane);
}
// Split tf32: dst = tf32(x), dst_lo = tf32(x − tf32(x)), both permuted (P's split fragments' order).
template <int ROWS, int COLS, int WARPS>
__device__ __forceinline__ void transpose_k_major_split(float* src, float* dst, float* dst_lo, int warp, int lane) {
  transpose_k_major<ROWS, COLS, WARPS, true, false, true>(
      static_cast<uint32_t>(__cvta_generic_to_shared(src)), static_cast<uint32_t>(__cvta_generic_to_shared(dst)), warp,
      lane, static_cast<uint32_t>(__cvta_generic_to_shared(dst_lo)));
}

// f(u) for the 16-byte units u of a tile of UNITS units that thread `index` (< THREADS) of
// THREADS takes: index, index + THREADS, ... The thread count a compile-time constant, each
// thread's units are a loop of known length (no remainder loop, no trip count formed from the
// index at run time).
template <int UNITS, int THREADS, class F>
__device__ __forceinline__ void for_each_unit(int index, F&& f) {
  constexpr int kSteps = (UNITS + THREADS - 1) / THREADS;
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int u = index + step * THREADS;
    if (UNITS % THREADS != 0 && u >= UNITS) break;
    f(u);
  }
}

// Every element of an fp32 tile of FLOATS elements (any layout) rounded to tf32 in place, in
// 16-byte units, by THREADS threads of which this is `index` (for_each_unit).
template <int FLOATS, int THREADS>
__device__ __forceinline__ void round_to_tf32(float* tile, int index) {
  static_assert(FLOATS % 4 == 0, "whole 16-byte units");
  float4* units = reinterpret_cast<float4*>(tile);
  for_each_unit<FLOATS / 4, THREADS>(index, [&](int u) {
    const float4 x = units[u];
    units[u] = make_float4(__uint_as_float(tile::to_tf32_rn(x.x)), __uint_as_float(tile::to_tf32_rn(x.y)),
                           __uint_as_float(tile::to_tf32_rn(x.z)), __uint_as_float(tile::to_tf32_rn(x.w)));
  });
}

// Every element x of an fp32 tile of FLOATS elements (any layout) split for tf32 products: hi
// takes tf32(x) in place and lo, a tile of the same layout, tf32(x − tf32(x)); in 16-byte units,
// by THREADS threads of which this is `index` (for_each_unit).
template <int FLOATS, int THREADS>
__device__ __forceinline__ void split_to_tf32(float* hi, float* lo, int index) {
  static_assert(FLOATS % 4 == 0, "whole 16-byte units");
  float4* units = reinterpret_cast<float4*>(hi);
  float4* residuals = reinterpret_cast<float4*>(lo);
  for_each_unit<FLOATS / 4, THREADS>(index, [&](int u) {
    const float x[4] = {units[u].x, units[u].y, units[u].z, units[u].w};
    uint32_t h[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) split_tf32(x[i], h[i], l[i]);
    units[u] = make_float4(__uint_as_float(h[0]), __uint_as_float(h[1]), __uint_as_float(h[2]), __uint_as_float(h[3]));
    residuals[u] =
        make_float4(__uint_as_float(l[0]), __uint_as_float(l[1]), __uint_as_float(l[2]), __uint_as_float(l[3]));
  });
}

// The transpose of a warpgroup's [64, N] tile given as tf32 a_from_acc fragments (rounded
// already), into a swizzled fp32 tile of column chunks of [N, 32] (chunk bytes N · 128) at the
// shared-window address `tile`: element (r, c) goes to row c, column col0 + r (col0 a multiple of
// 32), in order (K-major with the tile's rows as K: dS from dSᵀ in the backward). Fragment
// register e of block kb holds (r0 + 8 (e % 2), 8 kb + 2 (l % 4) + e / 2) (a_from_acc). One
// 4-byte store per element; a warp's 32 stores of one register land in 32 distinct banks: its
// rows r cover 8 consecutive columns (two 16-byte units) and its columns c four rows of one
// parity, whose swizzles send those two units to eight distinct ones.
template <int N>
__device__ __forceinline__ void store_transposed_tf32(const uint32_t (&frags)[N / 8][4], uint32_t tile, int col0,
                                                      int thread) {
#pragma unroll
  for (int kb = 0; kb < N / 8; ++kb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t at = tile + uint32_t(layout::transposed_fragment_offset(N, thread, kb, e, col0));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(frags[kb][e]) : "memory");
    }
}

// The register A fragments of Xᵀ for tf32 wgmma, KSTEPS k steps of 8, from an fp32 tile X [K
// rows, M columns] in chunks of chunk_bytes at the shared-window address `tile` (TMA's layout),
// this warpgroup's M rows from m0 (layout::transposed_a_offset), rounded to tf32 (nearest): A
// from registers may take any layout, so the product needs no transposed copy of X in shared
// memory. Bank conflicts: a warp's load of one register reads 4 rows of X (t % 4) × 8 adjacent
// columns (two 16-byte units); rows r and r ^ 1 swap those units under the swizzle, so the 8
// (row, unit) pairs fall on 4 units: 2 wavefronts a load.
// ROUND = false: the tile holds tf32 values already (split_to_tf32's high parts and residuals,
// a tile rounded in place), loaded as they are — the rounding is four instructions a value
// (cvt.rna.tf32.f32 has no SASS instruction of its own on sm_90) and changes no tf32 value.
template <int KSTEPS, bool ROUND = true>
__device__ __forceinline__ void load_transposed_a_tf32(uint32_t (&a)[KSTEPS][4], uint32_t tile, int m0,
                                                       int chunk_bytes, int thread) {
  // One address per register e; every k step's is it plus an immediate (layout.h).
  uint32_t base[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) base[e] = tile + uint32_t(layout::transposed_a_offset(thread, 0, e, m0, chunk_bytes));
#pragma unroll
  for (int kb = 0; kb < KSTEPS; ++kb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x;
      asm volatile("ld.shared.f32 %0, [%1];\n"
                   : "=f"(x)
                   : "r"(base[e] + uint32_t(kb * kSwizzleAtomBytes)));
      // cvt.rna (to_tf32), not cvt.rn: with the one-instruction rounding here the split backward's
      // default kernel spilled 16 bytes (-Xptxas -v); the values it rounds feed products only.
      a[kb][e] = ROUND ? tile::to_tf32(x) : __float_as_uint(x);
    }
}

// The addresses origin + layout::transposed_acc_offset of a thread's accumulator elements (i, j)
// in a transposed tile, from one base a row i and column parity: column pair j / 2 is an
// immediate of j / 2 swizzle periods on (layout.h), so the stores need no per-element arithmetic.
// (origin 0: offsets, for stores into two tiles at once.)
template <int ROWS>
struct TransposedAccAddresses {
  uint32_t base[ROWS][2];
  __device__ __forceinline__ TransposedAccAddresses(uint32_t origin, int thread, int row0, int chunk_bytes) {
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        base[i][c] = origin + uint32_t(layout::transposed_acc_offset(thread, i, c, row0, chunk_bytes));
  }
  __device__ __forceinline__ uint32_t operator()(int i, int j) const {
    return base[i][j % 2] + uint32_t((j / 2) * kSwizzleAtomBytes);
  }
};

// A warpgroup's [64, N] fp32 accumulator, rounded to tf32, transposed into a tile in chunks of
// chunk_bytes at the shared-window address `tile`: element (r, c) to row row0 + c, column r
// (layout::transposed_acc_offset). One 4-byte store per element (2 wavefronts a warp's store, as
// load_transposed_a_tf32's loads).
template <int N>
__device__ __forceinline__ void store_transposed_acc_tf32(const Accumulator<N>& acc, uint32_t tile, int row0,
                                                          int chunk_bytes, int thread) {
  using A = Accumulator<N>;
  const TransposedAccAddresses<A::kRows> at(tile, thread, row0, chunk_bytes);
#pragma unroll
  for (int i = 0; i < A::kRows; ++i)
#pragma unroll
    for (int j = 0; j < A::kCols; ++j)
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at(i, j)),
                   "r"(tile::to_tf32_rn(acc(i, j)))
                   : "memory");
}

// Split tf32: a warpgroup's [64, N] fp32 accumulator stored as store_swizzled<float, N> places it
// (column chunks of chunk_bytes), its high parts into the tile at `hi` and its residuals at the
// same offsets of the tile at `lo` (P and dS as the split backward's B operands).
template <int N>
__device__ __forceinline__ void store_swizzled_split(const Accumulator<N>& acc, uint32_t hi, uint32_t lo,
                                                     int chunk_bytes, int thread) {
  const int r0 = 16 * (thread / 32) + (thread % 32) / 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int g = 0; g < N / 8; ++g) {
      const uint32_t at = uint32_t(swizzled_offset<float>(r0 + 8 * i, 8 * g + 2 * (thread % 4), chunk_bytes));
      uint32_t xh, xl, yh, yl;
      split_tf32(acc.d[4 * g + 2 * i], xh, xl);
      split_tf32(acc.d[4 * g + 2 * i + 1], yh, yl);
      asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(hi + at), "r"(xh), "r"(yh) : "memory");
      asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(lo + at), "r"(xl), "r"(yl) : "memory");
    }
  }
}

// Split tf32: store_transposed_acc_tf32's transpose, high parts into the tile at `hi` and
// residuals at the same offsets of the tile at `lo` (dS [q, keys] from dSᵀ in the split backward).
template <int N>
__device__ __forceinline__ void store_transposed_acc_split(const Accumulator<N>& acc, uint32_t hi, uint32_t lo,
                                                           int row0, int chunk_bytes, int thread) {
  using A = Accumulator<N>;
  const TransposedAccAddresses<A::kRows> at(0, thread, row0, chunk_bytes);
#pragma unroll
  for (int i = 0; i < A::kRows; ++i)
#pragma unroll
    for (int j = 0; j < A::kCols; ++j) {
      uint32_t h, l;
      split_tf32(acc(i, j), h, l);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(hi + at(i, j)), "r"(h) : "memory");
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(lo + at(i, j)), "r"(l) : "memory");
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

// acc, row i of each thread's pair multiplied by row_scale[i], converted to T (fp32: kept) and stored as the
// warpgroup's [64, N] tile of 128-byte swizzled column chunks (chunk_bytes apart) at the
// shared-window address `tile`. One stmatrix per 16 columns: lanes 0-7 / 8-15 / 16-23 / 24-31
// address rows 0-7 / 8-15 of the block's first 8 columns, then of its second 8. A lane's row is
// fixed, so its swizzle term takes 4 values (16-column blocks modulo 64 columns); the chunk
// offset is a constant per block. The register packing is a_from_acc's.
template <class T, int N, bool TF32_ROUND = false>
__device__ __forceinline__ void store_swizzled(const Accumulator<N>& acc, const float (&row_scale)[2], uint32_t tile,
                                               int chunk_bytes, int thread) {
  static_assert(!TF32_ROUND || sizeof(T) == 4, "tf32 rounding is of fp32 tiles (a tf32 wgmma's operand)");
  if constexpr (sizeof(T) == 4) {
    // fp32: no stmatrix; each thread stores its column pairs as 8-byte units at their swizzled
    // places (half warps of 4 rows × 4 pairs: rows r and r ^ 1 share units, a 2-way conflict in
    // the epilogue only).
    const int r0 = 16 * (thread / 32) + (thread % 32) / 4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = r0 + 8 * i;
#pragma unroll
      for (int g = 0; g < N / 8; ++g) {
        const int col = 8 * g + 2 * (thread % 4);
        const uint32_t addr = tile + uint32_t(swizzled_offset<float>(row, col, chunk_bytes));
        float x = acc.d[4 * g + 2 * i] * row_scale[i], y = acc.d[4 * g + 2 * i + 1] * row_scale[i];
        if constexpr (TF32_ROUND) x = __uint_as_float(tile::to_tf32_rn(x)), y = __uint_as_float(tile::to_tf32_rn(y));
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
      }
    }
    return;
  } else {
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
