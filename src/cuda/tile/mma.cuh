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
// A score tile S[16, N] accumulated by a warp is a RegTile<float, 2, N/4> "Acc16" per lane:
//   element (i, j) = S[g + 8i][(j/2)·8 + 2t + j%2], so each row lives on the 4 lanes of a quad.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fmha::cuda::tile::warp {

template <class T>
struct MmaOp;

// D = A·B + D, fp16 inputs, fp32 accumulate.
template <>
struct MmaOp<__half> {
  static constexpr int kK = 16;
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
  static constexpr int kK = 16;
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
  static constexpr int kK = 8;
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
};

// d += a·b on the tensor cores for storage type T.
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
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
