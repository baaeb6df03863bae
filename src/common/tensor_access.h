// Element offsets into the 4-d [batch, seqlen, heads, dim] and 3-d [batch, heads, seqlen] views,
// and the fp32 reads and writes of one contiguous row that the fast CPU path and the CPU merge
// share. All index arithmetic is int64.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/numeric.h"
#include "fmha/fmha.h"

namespace fmha {

inline int64_t offset4(const Tensor& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + d * t.stride[3];
}
inline int64_t offset3(const Tensor& t, int64_t b, int64_t h, int64_t s) {
  return b * t.stride[0] + h * t.stride[1] + s * t.stride[2];
}

// One contiguous row of `t`, `n` elements from element `offset`, converted to fp32 (and rounded
// to tf32 where `tf32`). The dtype switch sits outside the loops so that they vectorise.
// Always inlined: the fast CPU path includes this header before it switches to its instruction
// set (src/cpu/isa_target.h), so an out-of-line copy would run its loops on the baseline target;
// inlined into the path's code they get the path's vectors.
[[gnu::always_inline]] inline void read_row(const Tensor& t, int64_t offset, int64_t n, float* dst, bool tf32 = false) {
  switch (t.dtype) {
    case DType::fp32: std::memcpy(dst, static_cast<const float*>(t.data) + offset, size_t(n) * sizeof(float)); break;
    case DType::fp16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(src[i]);
      break;
    }
    case DType::bf16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
      break;
    }
    case DType::int32: break;  // never an attention tensor (validate() refuses it)
  }
  if (tf32)
    for (int64_t i = 0; i < n; ++i) dst[i] = round_to_tf32(dst[i]);
}

// The row's `n` fp32 values `src` stored in `t`'s dtype (round to nearest even); inlined as read_row.
[[gnu::always_inline]] inline void write_row(const Tensor& t, int64_t offset, int64_t n, const float* src) {
  switch (t.dtype) {
    case DType::fp32: std::memcpy(static_cast<float*>(t.data) + offset, src, size_t(n) * sizeof(float)); break;
    case DType::fp16: {
      uint16_t* dst = static_cast<uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_fp16(src[i]);
      break;
    }
    case DType::bf16: {
      uint16_t* dst = static_cast<uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
      break;
    }
    case DType::int32: break;  // never an attention tensor (validate() refuses it)
  }
}

}  // namespace fmha
