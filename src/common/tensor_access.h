// Element offsets into the 4-d [batch, seqlen, heads, dim] and 3-d [batch, heads, seqlen] views.
// All index arithmetic is int64.
#pragma once

#include <cstdint>

#include "fmha/fmha.h"

namespace fmha {

inline int64_t offset4(const Tensor& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + d * t.stride[3];
}
inline int64_t offset3(const Tensor& t, int64_t b, int64_t h, int64_t s) {
  return b * t.stride[0] + h * t.stride[1] + s * t.stride[2];
}

}  // namespace fmha
