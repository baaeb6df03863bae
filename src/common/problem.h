// Sizes and derived constants of a call, read off a validated Params. Every backend starts here.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/numeric.h"
#include "fmha/fmha.h"
#include "fmha/mask.h"

namespace fmha {

struct Problem {
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads = 0, kv_heads = 0;
  int64_t head_dim = 0, head_dim_v = 0;
  int64_t group = 1;            // query heads per KV head
  // Rows of the query-side and key-side tensors over all sequences: batch · seqlen for dense
  // calls, the packed tensors' token counts (total_q, total_k) for variable-length ones.
  int64_t total_q = 0, total_k = 0;
  bool packed = false;          // variable-length call: seqlen_q/k above are max_seqlen_q/k
  float scale = 0.f;            // softmax scale applied to q·k
  float scale_log2 = 0.f;       // scale * log2(e): scores in the exp2 domain
  Mask mask;
  DType dtype = DType::fp32;
  bool tf32 = false;

  static Problem of(const Params& p) {
    Problem s;
    if (p.cu_seqlens_q.defined()) {
      // Packed [total, heads, dim] tensors: the batch is the sequence table's, and seqlen_q/k are
      // the longest sequence's (each sequence's own mask comes from common/varlen.h).
      s.batch = p.cu_seqlens_q.shape[0] - 1;
      s.seqlen_q = p.max_seqlen_q;
      s.heads = p.q.shape[1];
      s.head_dim = p.q.shape[2];
      s.seqlen_k = p.max_seqlen_k;
      s.kv_heads = p.k.shape[1];
      s.head_dim_v = p.v.shape[2];
      s.total_q = p.q.shape[0];
      s.total_k = p.k.shape[0];
      s.packed = true;
    } else {
      s.batch = p.q.shape[0];
      s.seqlen_q = p.q.shape[1];
      s.heads = p.q.shape[2];
      s.head_dim = p.q.shape[3];
      s.seqlen_k = p.k.shape[1];
      // A paged cache: the capacity of one sequence's pages (each sequence's own length and mask
      // come from common/paged.h).
      if (p.block_table.defined()) s.seqlen_k = p.k.shape[1] * p.block_table.shape[1];
      s.kv_heads = p.k.shape[2];
      s.head_dim_v = p.v.shape[3];
      s.total_q = s.batch * s.seqlen_q;
      s.total_k = s.batch * s.seqlen_k;
    }
    s.group = s.kv_heads > 0 ? s.heads / s.kv_heads : 1;
    s.scale = p.softmax_scale != 0.f ? p.softmax_scale
                                     : float(1.0 / std::sqrt(double(s.head_dim > 0 ? s.head_dim : 1)));
    s.scale_log2 = float(double(s.scale) * kLog2e);
    s.mask = Mask::make(p.causal, p.window_left, p.window_right, p.q_offset, s.seqlen_q, s.seqlen_k);
    s.dtype = p.q.dtype;
    s.tf32 = p.precision == Precision::tf32;
    return s;
  }

  bool empty() const { return batch == 0 || seqlen_q == 0 || heads == 0; }

  // FlashAttention's FLOP convention: forward 4·B·H·Sq·Sk·D (D = mean of the two head dims),
  // halved when causal; backward 2.5× forward. Counted over the full rectangle, like its peers.
  static double flops(const Problem& s, Causal causal, Direction dir) {
    double f = 2.0 * double(s.batch) * double(s.heads) * double(s.seqlen_q) * double(s.seqlen_k) *
               double(s.head_dim + s.head_dim_v);
    if (causal != Causal::none) f *= 0.5;
    return dir == Direction::backward ? 2.5 * f : f;
  }
};

}  // namespace fmha
