// Storage formats on the device: fp32, fp16 and bf16 to and from fp32, and pairs packed into
// the 32-bit registers that mma.sync takes; fp32 as tf32 operands, whole or split (tf32x3).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/tile/split_tf32.h"

namespace fmha::cuda::tile {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(tf32x3 x) { return x.value; }

// Elements of storage type T in one 16-byte vector: 8 of 16 bits, 4 of fp32.
template <class T>
inline constexpr int kVector16 = 16 / int(sizeof(T));

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ tf32x3 from_float<tf32x3>(float x) { return {x}; }

// Two fp32 values as one register of two 16-bit elements: `lo` in the low half (the lower
// column index in every mma fragment).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// fp32 → tf32 (round to nearest, ties away from zero), kept in a 32-bit register.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t out;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(out) : "f"(x));
  return out;
}

// fp32 → tf32 rounded to nearest, ties to even (cvt.rn.tf32.f32: sm_90 and later, one SASS
// instruction, F2FP.TF32; cvt.rna above has none there and takes four). The sm90 tier's kernels
// round with it, and the preprocess's Δ where it runs for them, and every split of split tf32
// (set_operand below); below sm_90 it is to_tf32, the one tf32 rounding there.
__device__ __forceinline__ uint32_t to_tf32_rn(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t out;
  asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(out) : "f"(x));
  return out;
#else
  return to_tf32(x);
#endif
}

// x as element i of an mma operand fragment of N registers for fp32 storage T: tf32 (T = float)
// in r[i]; split tf32 (T = tf32x3) as hi = tf32(x) in r[i] and lo = tf32(x - hi) in r[i + N/2]:
// a split fragment is the high fragment followed by the residual one (mma.cuh). x - hi is exact
// in fp32 (hi is x rounded to its top 11 bits), so hi + lo carries x to within 2^-22 of |x|.
// Split tf32 rounds with to_tf32_rn: to nearest even where the GPU has an instruction for it
// (sm_90: one instruction, where cvt.rna takes four) and half away from zero before (sm_80, sm_86,
// sm_89: cvt.rna alone exists); every split of one kernel build rounds alike, so a kernel and the
// statistics kernel that must form its scores bit for bit agree.
template <class T, int N>
__device__ __forceinline__ void set_operand(uint32_t (&r)[N], int i, float x) {
  if constexpr (std::is_same_v<T, tf32x3>) {
    static_assert(N % 2 == 0, "a split fragment holds a high and a residual half");
    const uint32_t hi = to_tf32_rn(x);
    r[i] = hi;
    r[i + N / 2] = to_tf32_rn(x - __uint_as_float(hi));
  } else {
    static_assert(std::is_same_v<T, float>, "tf32 operands come from fp32 storage");
    r[i] = to_tf32(x);
  }
}

}  // namespace fmha::cuda::tile
