// Host-side number formats: fp16/bf16 <-> fp32 conversion (round to nearest even), tf32
// rounding, and typed element access by DType; and splitmix64, the integer mix from which the
// benchmark harness draws its inputs and the fuzz its case seeds. Used by the CPU backends, the
// CLI and the tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "fmha/fmha.h"

namespace fmha {

// splitmix64's output function: a well-mixed 64-bit value of `z`.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline constexpr uint64_t kSplitmix64Increment = 0x9e3779b97f4a7c15ull;
// The next value of the splitmix64 stream whose state is `state`.
inline uint64_t splitmix64(uint64_t& state) { return splitmix64_mix(state += kSplitmix64Increment); }

inline uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // Subnormal: value = mantissa * 2^-24.
    const float magnitude = float(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t float_to_fp16(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return uint16_t(sign | 0x7e00u);           // NaN
  if (magnitude >= 0x477ff000u) return uint16_t(sign | 0x7c00u);          // rounds to inf
  if (magnitude < 0x38800000u) {                                          // fp16 subnormal or 0
    // Scale so that one fp16 subnormal ulp (2^-24) is 1, then round to nearest even.
    const float scaled = bits_float(magnitude) * 16777216.0f;
    return uint16_t(sign | uint16_t(std::nearbyint(scaled)));
  }
  const uint32_t rounding = 0xfffu + ((magnitude >> 13) & 1u);
  return uint16_t(sign | ((magnitude - (112u << 23) + rounding) >> 13));
}

// tf32 keeps 10 mantissa bits; round half away from zero, as the tensor cores' cvt.rna does.
inline float round_to_tf32(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  return bits_float((u + 0x1000u) & 0xffffe000u);
}

// tf32 by truncation: the top 19 bits of x (what the tensor cores take from an fp32 operand that
// was not rounded first).
inline float truncate_to_tf32(float x) { return bits_float(float_bits(x) & 0xffffe000u); }

// Round-trip a value through the storage format (what writing then reading it gives).
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::fp16: return fp16_to_float(float_to_fp16(x));
    case DType::bf16: return bf16_to_float(float_to_bf16(x));
    default: return x;
  }
}

inline float load_element(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::fp16: return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

inline void store_element(void* base, DType dtype, int64_t index, float value) {
  switch (dtype) {
    case DType::fp16: static_cast<uint16_t*>(base)[index] = float_to_fp16(value); break;
    case DType::bf16: static_cast<uint16_t*>(base)[index] = float_to_bf16(value); break;
    default: static_cast<float*>(base)[index] = value; break;
  }
}

inline constexpr double kLog2e = 1.4426950408889634;  // log2(e)
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace fmha
