// The merge of partial attention results (fmha::merge), written once for the CPU and the GPU:
// the normalised views every implementation reads, and the per-row weights.
#pragma once

#include <math.h>

#include <cstdint>

#include "fmha/fmha.h"
#include "fmha/mask.h"  // FMHA_HOST_DEVICE

namespace fmha {

// A validated merge with every part seen in the dense layout: out [batch, seqlen, heads, head_dim_v]
// and lse [batch, heads, seqlen] (a packed call is one batch of `total` rows).
struct MergeRows {
  Tensor out_a, lse_a, out_b, lse_b, out, lse;
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim_v = 0;
  int64_t rows() const { return batch * seqlen * heads; }
};

// out = weight_a · out_a + weight_b · out_b, and the merged lse. A side with weight 0 contributes
// nothing and its out is not used (it may hold anything, as an unstarted accumulator does).
struct MergeWeights {
  float a = 0.f, b = 0.f, lse = 0.f;
};

FMHA_HOST_DEVICE MergeWeights merge_weights(float lse_a, float lse_b) {
  if (lse_a != lse_a || lse_b != lse_b) return {lse_a + lse_b, lse_a + lse_b, lse_a + lse_b};  // NaN stays NaN
  const float hi = lse_a > lse_b ? lse_a : lse_b;
  if (hi == -INFINITY) return {0.f, 0.f, -INFINITY};  // no key on either side
  // Scaling by the larger side keeps exp() in [0, 1]; the side equal to it weighs exactly 1, which
  // also makes +inf on both sides (no finite difference) an even split rather than NaN.
  const float wa = lse_a == hi ? 1.f : expf(lse_a - hi);
  const float wb = lse_b == hi ? 1.f : expf(lse_b - hi);
  const float sum = wa + wb;  // in [1, 2]
  return {wa / sum, wb / sum, hi + logf(sum)};
}

}  // namespace fmha
