// The accuracy rule, stated once, used by `fmha run --check` and by every test.
//
// A result is compared with the fp64 oracle evaluated on the same stored inputs by
//     rel_err = ||out - ref||_2 / ||ref||_2
// and passes when rel_err <= tolerance(...), where
//     forward  tolerance = 4 * u_op + 64 * u_fp32
//     backward tolerance = 4 * that
// u_op is the unit roundoff of the format the matmul operands are rounded to (0 for exact fp32,
// 2^-11 for tf32 and fp16, 2^-8 for bf16, 2^-21 for split tf32: its hi·lo and lo·hi terms carry
// the residual's own tf32 rounding, 2^-22, and the dropped lo·lo term is below 2^-22 too) and
// 64 * u_fp32 (~3.8e-6) covers fp32 accumulation over long rows. dQ and dK, which vanish in exact arithmetic where a row sees a single key, are
// measured against max(||ref||, rms(dV_ref) * sqrt(numel)). LSE must match to tolerance * max(1, |lse|), and rows that see no key must be
// exactly O = 0, LSE = -inf. NaN never passes.
#pragma once

#include "fmha/fmha.h"

namespace fmha {

inline double operand_roundoff(DType dtype, Precision precision) {
  constexpr double kTf32 = 1.0 / 2048.0;   // 2^-11: 10 stored mantissa bits
  constexpr double kFp16 = 1.0 / 2048.0;   // 2^-11
  constexpr double kBf16 = 1.0 / 256.0;    // 2^-8: 7 stored mantissa bits
  constexpr double kTf32x3 = 1.0 / 2097152.0;  // 2^-21: twice the residual's rounding, 2^-22
  switch (dtype) {
    case DType::fp16: return kFp16;
    case DType::bf16: return kBf16;
    default: return precision == Precision::tf32 ? kTf32 : precision == Precision::tf32x3 ? kTf32x3 : 0.0;
  }
}

inline double tolerance(DType dtype, Precision precision, Direction direction) {
  constexpr double kFp32Roundoff = 1.0 / 16777216.0;  // 2^-24
  constexpr double kOperandFactor = 4.0, kAccumulationFactor = 64.0, kBackwardFactor = 4.0;
  const double forward = kOperandFactor * operand_roundoff(dtype, precision) + kAccumulationFactor * kFp32Roundoff;
  return direction == Direction::backward ? kBackwardFactor * forward : forward;
}

}  // namespace fmha
