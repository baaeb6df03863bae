// The backward's own softmax statistics, shared by the tiers whose backward forms P from them
// (simt: fp32 arithmetic; sm80: split tf32). A statistics kernel, one block per query tile, forms
// each row's max and sum from the very scores the main kernels form (same operands, same product
// order, bit for bit), and the main kernels take P = 2^((x - row_max)·|scale_log2|)·row_inv_sum
// with x = sign(scale)·(q·k), instead of 2^(x·scale_log2 - LSE·log2 e) from the given LSE:
//   - an fp32 LSE of magnitude ~100 (peaked softmax: large logits) is off by ~|LSE|·2^-24, and
//     forming the exponent adds two more roundings of that size, an error in every P (dV ~60x a
//     plain fp32 softmax's on such rows; dQ, dK 3-10x) where a plain softmax gets the dominant P
//     exactly (exp(s - max) = 1);
//   - the forward forms its scores in its own order, so even an exact LSE leaves P of a row's
//     largest score off 1 by the forward's rounding of that score.
// With the row's own max, x - max is exactly 0 at the max and exact near it (Sterbenz), and a row
// that sees one key gets P = 1. Query tiles with a peaked row (largest P >= kOwnDeltaMinPeak)
// also form Δ = rowsum(P ∘ dP) from their own P and dP (a second pass over their keys).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/args.h"
#include "cuda/tile/reduce.cuh"

namespace fmha::cuda {

// Δ = rowsum(dO ∘ O) cancels against dP = dO·V^T only to O's rounding: where one key dominates a
// row (P near 1), dS = P·(dP - Δ) keeps that residue, and dQ and dK reach 2-3x a plain fp32
// softmax's error (whose Δ = rowsum(P ∘ dP) cancels exactly). A query tile with a row whose
// largest P is at least this forms Δ = rowsum(P ∘ dP) from its own P and dP; the others keep the
// preprocess's Δ.
inline constexpr float kOwnDeltaMinPeak = 0.5f;

// The factor that turns the row's own softmax (its recomputed max and sum) into the one the given
// LSE defines, P = exp(scale·s - lse): 1 where lse is the row's own, within what the forward's
// rounding and its differently ordered scores leave; exp(own - lse) where lse is larger, as when the
// call is one part of the keys and lse the merged softmax's (fmha::merge; ring attention): P is then
// the part's share. 0 where lse is -inf (no key seen).
// What "within the forward's rounding" means: the forward forms each score in its own order (Q
// pre-scaled by scale·log2 e, or S scaled after; split tf32 products in its own tiling; the LSE as
// (max + log2 sum)·ln 2), so its scores differ from these by up to a few fp32 units of
// |scale|·sum_d |q_d·k_d|, not of the score: where the products cancel (a score near 0 from terms
// of ~10, as on a row that sees one key of a large-logit call) that is many units of lse. A
// tolerance of units of lse alone then took such a row's own softmax for a part of a larger one
// and scaled its P = 1 by exp(own - lse) = 1 ± 1e-5: dV = P·dO off by that on one-key rows. The
// bound adds kDotUnits fp32 units of |scale|·|q|·max|k| (Cauchy-Schwarz over sum_d |q_d·k_d|, the
// row's query against the longest key of the block); an emulation of the simt forward's and
// backward's orders against each other peaked at 5 units of it (head dims 32-256, inputs of std
// 0.25-3, scales 0.01-2). A true part whose share of the merged softmax lies within the bound of 1
// is taken as whole: an error in its P no larger than recovering P from the LSE would leave.
__device__ __forceinline__ float lse_factor(float row_max, float row_sum, float abs_scale, float lse, float q_norm,
                                            float key_norm_max) {
  constexpr double kOwnUlps = 32.0;   // fp32 epsilons of |lse|: the LSE's own formation
  constexpr double kDotUnits = 16.0;  // fp32 unit roundoffs of |scale|·|q|·max|k|: the scores'
  constexpr double kFp32Epsilon = 1.1920928955078125e-7;  // 2^-23
  constexpr double kFp32Unit = kFp32Epsilon / 2;           // 2^-24
  if (lse == tile::kNegInf) return 0.f;
  const double own = double(row_max) * abs_scale + log(double(row_sum));
  const double tolerance = kOwnUlps * kFp32Epsilon * fmax(1.0, fabs(double(lse))) +
                           kDotUnits * kFp32Unit * abs_scale * double(q_norm) * double(key_norm_max);
  if (fabs(own - double(lse)) <= tolerance) return 1.f;
  return float(exp(own - double(lse)));
}

// ±1: the scores x = sign(scale)·(q·k) whose max the row statistics hold; the exp2 argument is
// then (x - row_max)·|scale_log2|, where the difference is exact near the max (Sterbenz).
__device__ __forceinline__ float score_sign(const AttentionArgs& args) { return args.scale_log2 < 0.f ? -1.f : 1.f; }

// x = sign(scale)·s in place over a thread's scores: a negation, and only where the scale is
// negative (a multiply by 1 per score otherwise).
template <int N>
__device__ __forceinline__ void apply_score_sign(const AttentionArgs& args, float (&x)[N]) {
  if (args.scale_log2 < 0.f)
#pragma unroll
    for (int r = 0; r < N; ++r) x[r] = -x[r];
}

// 2^x of the own softmax: libdevice's exp2f, or with FTZ the single ex2.approx.ftz, which gives
// exp2f's bits wherever the result is at least 2^-126 (FLT_MIN; TileOps.Exp2FastIsExp2fAboveDenormals)
// and 0 below it, where exp2f's denormals weigh less than 2^-126 of a row's P = 1. A tier's
// statistics and main kernels must take the same one: P's sums are formed in the one and used in
// the other.
template <bool FTZ>
__device__ __forceinline__ float own_exp2(float x) {
  return FTZ ? tile::exp2_fast(x) : tile::exp2_exact(x);
}

// P from the row statistics: 2^((x - row_max)·|scale_log2|)·row_inv_sum; 0 where row_max is +inf
// (a row that sees no key, or padding).
template <bool FTZ = false>
__device__ __forceinline__ float own_probability(float x, float row_max, float row_inv_sum, float abs_scale_log2) {
  return own_exp2<FTZ>((x - row_max) * abs_scale_log2) * row_inv_sum;
}

// One key tile of the online max and sum: `max` is the row's running max (every lane of the row
// holds it), `sum` this thread's share of sum 2^((x - max)·|scale_log2|); tile_max the row's max
// over the tile (reduced over its lanes), part(base) this thread's sum of 2^((x - base)·|scale_log2|)
// over its elements of the tile.
template <bool FTZ = false, class Part>
__device__ __forceinline__ void own_softmax_step(float& max, float& sum, float tile_max, float abs_scale_log2,
                                                 Part part) {
  const float new_max = fmaxf(max, tile_max);
  const float base = new_max == tile::kNegInf ? 0.f : new_max;  // nothing visible yet: 0, not NaN
  sum = sum * own_exp2<FTZ>((max - base) * abs_scale_log2) + part(base);
  max = new_max;
}

// A row's statistics once its max and (lane-reduced) sum are complete: row_max and row_inv_sum at
// `stat` (written by the thread with `writer` set), +inf and 0 where the row sees no key. Returns
// whether P is this row's own softmax (the LSE's factor is 1), where Δ = rowsum(P ∘ dP) from its
// own P and dP is the right Δ. `lse` is the given LSE of the row (read only where sum > 0).
template <class Lse>
__device__ __forceinline__ bool store_own_row_stats(const AttentionArgs& args, int64_t stat, float max, float sum,
                                                    float q_norm, float key_norm_max, bool writer, Lse lse) {
  if (!(sum > 0.f)) {  // sees no key: P = 2^(x - inf)·0 = 0
    if (writer) args.row_max[stat] = __int_as_float(0x7f800000), args.row_inv_sum[stat] = 0.f;
    return false;
  }
  const float factor = lse_factor(max, sum, fabsf(args.scale), lse(), q_norm, key_norm_max);
  if (writer) args.row_max[stat] = max, args.row_inv_sum[stat] = factor / sum;
  return factor == 1.f;
}

// The given LSE of (sequence start q_start, head h, row).
__device__ __forceinline__ float given_lse(const AttentionArgs& args, int64_t q_start, int64_t h, int64_t row) {
  return args.lse[q_start * args.lse_batch_stride + h * args.lse_head_stride + row * args.lse_seq_stride];
}

}  // namespace fmha::cuda
