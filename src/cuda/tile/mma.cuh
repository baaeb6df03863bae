// Warp-level tensor-core ops (sm_80+): mma.sync and ldmatrix, as inline PTX because CUDA has no
// intrinsic for them (cuda::ptx in CCCL 3 covers neither).
//
// Register layouts, with g = lane / 4 (groupID) and t = lane % 4 (thread in group):
//   m16n8k16 fp16/bf16, A (16×16, row-major), 4 regs of 2 elements (low half = lower column):
//     a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]   a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B (16×8, k × n), 2 regs: b0 = B[2t, 2t+1][g]   b1 = B[2t+8, 2t+9][g]
//   C/D (16×8) fp32, 4 regs: c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
//   m16n8k8 tf32, A (16×8): a0 = A[g][t]  a1 = A[g+8][t]  a2 = A[g][t+4]  a3 = A[g+8][t+4]
//   B (8×8): b0 = B[t][g]  b1 = B[t+4][g];  C/D as above.
//   m16n8k8 split tf32 (tf32x3): A is 8 regs, a0..a3 the high parts as above and a4..a7 the
//     residuals of the same elements; B is 4 regs, b0, b1 high and b2, b3 residual.
// A score tile S[16, N] accumulated by a warp is a RegTile<float, 2, N/4> "Acc16" per lane:
//   element (i, j) = S[g + 8i][(j/2)·8 + 2t + j%2], so each row lives on the 4 lanes of a quad.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/tile/split_tf32.h"

namespace fmha::cuda::tile::warp {

// MmaOp<T>: one m16n8kK tensor-core product for storage T; kA and kB are the registers of its A
// and B fragments.
template <class T>
struct MmaOp;

// d += a·b, m16n8k8 on tf32 operands (bit patterns from convert.cuh to_tf32), fp32 accumulate.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// D = A·B + D, fp16 inputs, fp32 accumulate.
template <>
struct MmaOp<__half> {
  static constexpr int kK = 16, kA = 4, kB = 2;
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
};

template <>
struct MmaOp<__nv_bfloat16> {
  static constexpr int kK = 16, kA = 4, kB = 2;
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
};

// fp32 storage on tf32 tensor cores: operands are tf32 bit patterns (convert.cuh to_tf32).
template <>
struct MmaOp<float> {
  static constexpr int kK = 8, kA = 4, kB = 2;
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[kA], const uint32_t (&b)[kB]) {
    mma_m16n8k8_tf32(d, a[0], a[1], a[2], a[3], b[0], b[1]);
  }
};

// fp32 storage on split tf32: d += a_hi·b_hi + a_hi·b_lo + a_lo·b_hi (convert.cuh set_operand). The
// tensor cores' internal sums truncate the low bits of their addends relative to the largest one
// instead of rounding them: an accumulator carried through the mma picks up an error of up to an
// ulp of |d| at every k-step, of one sign, which over a head dim of 256 (32 steps) grows to several
// times fp32's own error. So d never enters the tensor cores: the high product and the two cross
// terms (~2^-11 of it) are formed in zeroed fragments — the cross terms together, rounded relative
// to their own size — and the step's sum is added to d in fp32, rounded to nearest. lo·lo (below
// 2^-22 of the product) is left out.
template <>
struct MmaOp<tf32x3> {
  static constexpr int kK = 8, kA = 8, kB = 4;
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[kA], const uint32_t (&b)[kB]) {
    float cross[4] = {0.f, 0.f, 0.f, 0.f};  // [16, 8] a_hi·b_lo + a_lo·b_hi, fp32
    mma_m16n8k8_tf32(cross, a[0], a[1], a[2], a[3], b[2], b[3]);
    mma_m16n8k8_tf32(cross, a[4], a[5], a[6], a[7], b[0], b[1]);
    float high[4] = {0.f, 0.f, 0.f, 0.f};  // [16, 8] a_hi·b_hi, fp32
    mma_m16n8k8_tf32(high, a[0], a[1], a[2], a[3], b[0], b[1]);
#pragma unroll
    for (int e = 0; e < 4; ++e) d[e] += high[e] + cross[e];
  }
  // run() with the cross terms in the other order (a_lo·b_hi, then a_hi·b_lo): element (i, j) of
  // a·b is then summed as run() sums element (j, i) of b·a, the same products in the same order.
  __device__ __forceinline__ static void run_transposed(float (&d)[4], const uint32_t (&a)[kA],
                                                        const uint32_t (&b)[kB]) {
    float cross[4] = {0.f, 0.f, 0.f, 0.f};  // [16, 8] a_lo·b_hi + a_hi·b_lo, fp32
    mma_m16n8k8_tf32(cross, a[4], a[5], a[6], a[7], b[0], b[1]);
    mma_m16n8k8_tf32(cross, a[0], a[1], a[2], a[3], b[2], b[3]);
    float high[4] = {0.f, 0.f, 0.f, 0.f};  // [16, 8] a_hi·b_hi, fp32
    mma_m16n8k8_tf32(high, a[0], a[1], a[2], a[3], b[0], b[1]);
#pragma unroll
    for (int e = 0; e < 4; ++e) d[e] += high[e] + cross[e];
  }
};

// d += a·b on the tensor cores for storage type T (fragments of MmaOp<T>::kA and kB registers).
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[MmaOp<T>::kA],
                                    const uint32_t (&b)[MmaOp<T>::kB]) {
  MmaOp<T>::run(d, a, b);
}

// d += a·b summed as mma<T>(b, a) sums the transposed element: a product formed both ways (the
// sm80 backward's S^T = K·Q^T and its dQ kernel's S = Q·K^T, which its own-softmax statistics must
// match bit for bit) agrees. Only split tf32 orders its terms by operand; the others are mma<T>.
template <class T>
__device__ __forceinline__ void mma_transposed(float (&d)[4], const uint32_t (&a)[MmaOp<T>::kA],
                                               const uint32_t (&b)[MmaOp<T>::kB]) {
  if constexpr (std::is_same_v<T, tf32x3>)
    MmaOp<T>::run_transposed(d, a, b);
  else
    MmaOp<T>::run(d, a, b);
}

// Four 8×8 matrices of 16-bit elements from shared memory. Lane l gives the address of row l % 8
// of matrix l / 8; out[m] then holds, on lane l, matrix m's row l / 4, columns 2(l % 4), +1 —
// the A/B fragment layout above. `_trans` delivers the transposed matrices instead (row 2(l%4),
// +1 of column l / 4), which turns a row-major [k][n] tile into B fragments.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&out)[4], const void* row_address) {
#if __CUDA_ARCH__ >= 800
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(row_address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
               : "r"(addr));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&out)[4], const void* row_address) {
#if __CUDA_ARCH__ >= 800
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(row_address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
               : "r"(addr));
#endif
}

}  // namespace fmha::cuda::tile::warp
