// Row reductions across the lanes that share a row, exp2 in both precisions, and the masking of
// a score tile through the shared Mask object.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

#include "cuda/tile/tile.cuh"
#include "fmha/mask.h"

namespace fmha::cuda::tile {

inline constexpr float kNegInf = -__builtin_huge_valf();
inline constexpr float kLn2 = 0.6931471805599453f;

// The value a masked score takes where it is multiplied by `scale` afterwards: -inf once
// multiplied under either sign (a negative softmax scale turns -inf into +inf). Formed where it
// is used (opaque to the compiler), so that masking code inside a branch does not hoist it into a
// register kept live across a mainloop.
__device__ __forceinline__ float masked_before_scale(float scale) {
  asm volatile("" : "+f"(scale));
  return scale < 0.f ? __builtin_huge_valf() : kNegInf;
}

namespace warp {

// x reduced (max or sum) over the LANES consecutive lanes (LANES a power of two, aligned) that
// hold one row; every one of them gets the result.
template <int LANES>
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int offset = LANES / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
template <int LANES>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int offset = LANES / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Per-row max / sum of a register tile whose row i is spread over LANES lanes: out[i].
// A thread's part of a row is reduced through kChains independent chains, then across them: the
// dependent path is kCols / kChains + log2(kChains) operations, not kCols (max is exact in any
// order; a sum's rounding changes only within fp32's usual error).
inline constexpr int kChains = 4;
template <class Op, class Reg>
__device__ __forceinline__ float thread_row_reduce(const Reg& s, int i, Op op) {
  constexpr int kChainsUsed = Reg::kCols % kChains == 0 ? kChains : 1;
  float part[kChainsUsed];
#pragma unroll
  for (int c = 0; c < kChainsUsed; ++c) part[c] = s(i, c);
#pragma unroll
  for (int j = kChainsUsed; j < Reg::kCols; ++j) part[j % kChainsUsed] = op(part[j % kChainsUsed], s(i, j));
#pragma unroll
  for (int width = kChainsUsed / 2; width > 0; width /= 2)
#pragma unroll
    for (int c = 0; c < width; ++c) part[c] = op(part[c], part[c + width]);
  return part[0];
}

template <int LANES, class Reg>
__device__ __forceinline__ void row_max(float (&out)[Reg::kRows], const Reg& s) {
#pragma unroll
  for (int i = 0; i < Reg::kRows; ++i)
    out[i] = row_max<LANES>(thread_row_reduce(s, i, [](float a, float b) { return fmaxf(a, b); }));
}
template <int LANES, class Reg>
__device__ __forceinline__ void row_sum(float (&out)[Reg::kRows], const Reg& s) {
#pragma unroll
  for (int i = 0; i < Reg::kRows; ++i) {
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < Reg::kCols; ++j) m += s(i, j);
    out[i] = row_sum<LANES>(m);
  }
}

}  // namespace warp

// 2^x. `exp2_exact` is libdevice's exp2f (within 2 ulp: the simt tier's ieee promise);
// `exp2_fast` is the single ex2.approx.ftz instruction (2 ulp over the range that matters, flushes
// denormals), used where inputs are already rounded to 16 bits or tf32. Both give +0 for -inf.
__device__ __forceinline__ float exp2_exact(float x) { return exp2f(x); }
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^x on the FMA pipe rather than the MUFU unit that ex2.approx occupies (16 results per clock
// per SM against 128 FMAs): x = j + f with j = round(x), read from the bits of x + 1.5 · 2^23, and
// f in [-1/2, 1/2]; 2^f by a degree-5 polynomial fitted for relative error (at most 1.9e-7 over
// that range, about 3 ulp, like ex2.approx's 2; the constant term is 1, so 2^0 is exactly 1); j
// added to the exponent field. x at or below -127 gives +0, as ex2.approx.ftz does for -inf;
// between -127 and -126 the result is below 2^-126 and not accurate (ex2.approx.ftz flushes it).
// A softmax's exponentials are at most 0 (2^8 with lazy rescaling), its smallest ones negligible.
__device__ __forceinline__ float exp2_poly(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 · 2^23: x + kRound holds round(x) in its low bits
  constexpr float kC1 = 0x1.62e42ap-1f, kC2 = 0x1.ebf9bcp-3f, kC3 = 0x1.c6b754p-5f, kC4 = 0x1.3cea88p-7f,
                  kC5 = 0x1.5bb984p-10f;
  x = fmaxf(x, -127.f);
  const float t = x + kRound;
  const float f = x - (t - kRound);
  float p = fmaf(kC5, f, kC4);
  p = fmaf(p, f, kC3);
  p = fmaf(p, f, kC2);
  p = fmaf(p, f, kC1);
  p = fmaf(p, f, 1.f);
  // round(x) << 23 is the low bits of t shifted into the exponent field (kRound's own bits shift
  // out of the word).
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

namespace thread {

// s(i, j) = -inf where row_of(i) does not see key col_of(j) (absolute indices).
template <class Reg, class RowOf, class ColOf>
__device__ __forceinline__ void mask_scores(Reg& s, const Mask& mask, RowOf row_of, ColOf col_of) {
#pragma unroll
  for (int i = 0; i < Reg::kRows; ++i) {
    const Range keys = mask.keys(row_of(i));
#pragma unroll
    for (int j = 0; j < Reg::kCols; ++j) {
      const int64_t key = col_of(j);
      if (key < keys.begin || key >= keys.end) s(i, j) = kNegInf;
    }
  }
}

// s(i, j) = masked (-inf unless given) unless column col0 + col_of(j) lies in visible_of(i) (a
// Range of absolute indices), for 0 <= col_of(j) < 2^31. Each row's interval is made relative to
// col0 once, so the per-element test is two 32-bit compares against col_of(j), which the caller's
// layout knows up to a lane offset: 64-bit indices per element cost registers that wgmma's wide
// tiles lack.
template <class Reg, class VisibleOf, class ColOf>
__device__ __forceinline__ void mask_outside(Reg& s, VisibleOf visible_of, int64_t col0, ColOf col_of,
                                             float masked = kNegInf) {
  auto relative = [col0](int64_t x) {
    const int64_t r = x - col0;
    return r < 0 ? 0 : (r > INT32_MAX ? INT32_MAX : int(r));
  };
#pragma unroll
  for (int i = 0; i < Reg::kRows; ++i) {
    const Range visible = visible_of(i);
    const int begin = relative(visible.begin), end = relative(visible.end);
#pragma unroll
    for (int j = 0; j < Reg::kCols; ++j) {
      const int col = col_of(j);
      if (col < begin || col >= end) s(i, j) = masked;
    }
  }
}

template <class Reg>
__device__ __forceinline__ void scale(Reg& s, float factor) {
#pragma unroll
  for (int i = 0; i < Reg::kRows; ++i)
#pragma unroll
    for (int j = 0; j < Reg::kCols; ++j) s(i, j) *= factor;
}

// scale() with each product rounded on its own (__fmul_rn): never contracted into the FMA of a
// later subtraction, so that a score minus its own scaled row max is exactly 0.
template <class Reg>
__device__ __forceinline__ void scale_rounded(Reg& s, float factor) {
#pragma unroll
  for (int i = 0; i < Reg::kRows; ++i)
#pragma unroll
    for (int j = 0; j < Reg::kCols; ++j) s(i, j) = __fmul_rn(s(i, j), factor);
}

}  // namespace thread

// The online softmax state of a thread's ROWS rows, each spread over LANES lanes: running max
// (exp2 domain, reduced over the lanes; after LAZY updates, the exponent base, at most
// kLazyRescaleLog2 below the max) and this thread's share of the running sum (reduced once,
// in finish()).
template <int ROWS, int LANES>
struct OnlineSoftmax {
  // How far (log2 units) a LAZY update lets the row max outgrow the exponent base.
  static constexpr float kLazyRescaleLog2 = 8.f;
  // The largest P a LAZY update leaves: 2^kLazyRescaleLog2.
  static constexpr float kLazyRescaleBound = float(1 << int(kLazyRescaleLog2));
  float max[ROWS];
  float sum[ROWS];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < ROWS; ++i) max[i] = kNegInf, sum[i] = 0.f;
  }

  // s (scaled, masked scores) becomes P = 2^(s - max); rescale[i] is what the output rows
  // accumulated so far must be multiplied by.
  template <bool FAST, class Reg>
  __device__ __forceinline__ void update(Reg& s, float (&rescale)[ROWS]) {
    static_assert(Reg::kRows == ROWS, "one softmax row per tile row");
    float tile_max[ROWS];
    warp::row_max<LANES>(tile_max, s);
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const float new_max = fmaxf(max[i], tile_max[i]);
      // A row that has seen only masked keys keeps max = -inf; subtracting 0 keeps P = 0, not NaN.
      const float base = new_max == kNegInf ? 0.f : new_max;
      rescale[i] = FAST ? exp2_fast(max[i] - base) : exp2_exact(max[i] - base);
#pragma unroll
      for (int j = 0; j < Reg::kCols; ++j) s(i, j) = FAST ? exp2_fast(s(i, j) - base) : exp2_exact(s(i, j) - base);
      sum[i] = sum[i] * rescale[i] + warp::thread_row_reduce(s, i, [](float a, float b) { return a + b; });
      max[i] = new_max;
    }
  }

  // update() for unscaled scores with the scale folded into the exponent (one FMA per element
  // instead of a multiply and a subtract): P = 2^(scale·s - max), the state kept in the scaled
  // domain. Needs scale > 0 (the row max of s is then the max of scale·s).
  //
  // LAZY: a row keeps its exponent base while the new max exceeds it by at most
  // kLazyRescaleLog2, so P stays below 2^kLazyRescaleLog2 (far inside fp32 and 16-bit range) and
  // rescale[i] is exactly 1: the caller may skip multiplying the output rows. The result is the
  // same function (O and the sums share the base; LSE = base + log2(sum)); after the first tiles
  // of a row the max rarely grows by that much, so most tiles skip the rescale.
  //
  // POLY > 0 (FAST only): every POLY-th column of a thread's row takes exp2_poly, the rest
  // ex2.approx, so the exponentials share the MUFU unit with the FMA pipe.
  template <bool FAST, bool LAZY = false, int POLY = 0, class Reg>
  __device__ __forceinline__ void update_scaled(Reg& s, float scale, float (&rescale)[ROWS]) {
    static_assert(POLY == 0 || FAST, "the polynomial exponential replaces ex2.approx only");
    static_assert(Reg::kRows == ROWS, "one softmax row per tile row");
    float tile_max[ROWS];
    warp::row_max<LANES>(tile_max, s);
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const float tile_row_max = tile_max[i] * scale;
      // With -inf on both sides the difference is NaN and the compare false: the plain path.
      const bool keep = LAZY && tile_row_max - max[i] <= kLazyRescaleLog2;
      const float new_max = keep ? max[i] : fmaxf(max[i], tile_row_max);
      const float base = new_max == kNegInf ? 0.f : new_max;
      rescale[i] = keep ? 1.f : FAST ? exp2_fast(max[i] - base) : exp2_exact(max[i] - base);
#pragma unroll
      for (int j = 0; j < Reg::kCols; ++j) {
        const float x = fmaf(s(i, j), scale, -base);
        if constexpr (POLY > 0)
          s(i, j) = j % POLY == POLY - 1 ? exp2_poly(x) : exp2_fast(x);
        else
          s(i, j) = FAST ? exp2_fast(x) : exp2_exact(x);
      }
      sum[i] = sum[i] * rescale[i] + warp::thread_row_reduce(s, i, [](float a, float b) { return a + b; });
      max[i] = new_max;
    }
  }

  // update_scaled<true, true> (lazy, ex2.approx) with the exponentials started on each row's
  // current base before the tile's row max is known: the row max no longer precedes them (its
  // in-thread reduction runs beside them and its lane shuffles are gone). x = scale·s − base is
  // kept in s; P = 2^x goes to emit(P) (the caller packs it into its own registers while P's
  // registers are still live, so that s and the packed P, not two fp32 tiles, cross the check).
  // Then one vote: if every lane of the warp saw its share of each row's sum at most
  // 2^kLazyRescaleLog2 in rows that had a base already, every P of the tile is within the lazy
  // bound (each is at most its share of the sum, P ≥ 0), every row keeps its base (rescale 1) and
  // P stands. The sum is formed anyway, so the check costs no reduction of its own (a max over x,
  // one FMNMX a score, did before). Otherwise (a row's first key tile, or a share past 2^8: a max
  // that grew past the lazy bound, or by 3 or more with many keys near it — rare after a row's
  // first tiles) each row decides as update_scaled does from its max over the lanes, and P is
  // formed again from x on the new base, 2^(x − (new base − base)), and emitted again (the same P
  // where the row keeps its base). Needs scale > 0.
  template <class Reg, class Emit>
  __device__ __forceinline__ void update_speculative(Reg& s, float scale, float (&rescale)[ROWS], Emit&& emit) {
    static_assert(Reg::kRows == ROWS, "one softmax row per tile row");
    Reg p;
    float base[ROWS], part[ROWS];
    bool keep_all = true;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      keep_all &= max[i] != kNegInf;
      base[i] = max[i] == kNegInf ? 0.f : max[i];
#pragma unroll
      for (int j = 0; j < Reg::kCols; ++j) {
        s(i, j) = fmaf(s(i, j), scale, -base[i]);
        p(i, j) = exp2_fast(s(i, j));
      }
      part[i] = warp::thread_row_reduce(p, i, [](float a, float b) { return a + b; });
      keep_all &= part[i] <= kLazyRescaleBound;  // false for NaN
    }
    emit(p);
    if (__all_sync(0xffffffffu, keep_all)) {
#pragma unroll
      for (int i = 0; i < ROWS; ++i) sum[i] += part[i], rescale[i] = 1.f;
      return;
    }
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      // The tile's row max, less base[i].
      const float grown =
          warp::row_max<LANES>(warp::thread_row_reduce(s, i, [](float a, float b) { return fmaxf(a, b); }));
      // With -inf on both sides (a row with no visible key yet) the plain path, as update_scaled.
      const bool keep = max[i] != kNegInf && grown <= kLazyRescaleLog2;
      const float new_max = keep ? max[i] : fmaxf(max[i], base[i] + grown);
      const float new_base = new_max == kNegInf ? 0.f : new_max;
      const float shift = new_base - base[i];
      rescale[i] = keep ? 1.f : exp2_fast(max[i] - new_base);
#pragma unroll
      for (int j = 0; j < Reg::kCols; ++j) p(i, j) = exp2_fast(s(i, j) - shift);
      sum[i] = sum[i] * rescale[i] + warp::thread_row_reduce(p, i, [](float a, float b) { return a + b; });
      max[i] = new_max;
    }
    emit(p);
  }

  // Row sums reduced over the lanes; afterwards inv_sum / lse are per row.
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int i = 0; i < ROWS; ++i) sum[i] = warp::row_sum<LANES>(sum[i]);
  }
  // 1/sum, or 0 for a row that saw no key (its output is 0).
  __device__ __forceinline__ float inv_sum(int i) const { return sum[i] > 0.f ? 1.f / sum[i] : 0.f; }
  // Natural-log LSE of the scaled scores, -inf for a row that saw no key.
  __device__ __forceinline__ float lse(int i) const {
    return sum[i] > 0.f ? (max[i] + log2f(sum[i])) * kLn2 : kNegInf;
  }
};

}  // namespace fmha::cuda::tile
