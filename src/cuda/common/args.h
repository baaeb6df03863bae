// The kernels' view of one call: raw pointers, int64 element strides and sizes, read off a
// validated Params on the host and passed by value to every kernel of every tier.
// Base offsets are int64 (tensors above 2^31 elements); indices inside a tile stay int32.
#pragma once

#include <cstdint>

#include "fmha/fmha.h"
#include "fmha/mask.h"

namespace fmha::cuda {

// A [batch, seqlen, heads, dim] view; the last dimension is contiguous.
struct View4 {
  void* data = nullptr;
  int64_t batch_stride = 0, seq_stride = 0, head_stride = 0;

  FMHA_HOST_DEVICE int64_t offset(int64_t b, int64_t s, int64_t h) const {
    return b * batch_stride + s * seq_stride + h * head_stride;
  }
  template <class T>
  FMHA_HOST_DEVICE T* at(int64_t b, int64_t s, int64_t h) const {
    return static_cast<T*>(data) + offset(b, s, h);
  }
};

// Row statistics (lse_log2, delta) are stored in runs of this many rows per (batch, head).
inline constexpr int64_t kStatRowAlign = 64;

struct AttentionArgs {
  View4 q, k, v, o;
  View4 dout, dq, dk, dv;
  float* lse = nullptr;  // [B, H, Sq] natural log; null when the caller wants none
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_seq_stride = 0;

  int batch = 0, heads = 0, kv_heads = 0, group = 1;
  int head_dim = 0, head_dim_v = 0;
  int64_t seqlen_q = 0, seqlen_k = 0;
  float scale = 0.f;       // softmax scale on q·k
  float scale_log2 = 0.f;  // scale * log2(e): scores in the exp2 domain
  Mask mask;

  // Backward workspace, all fp32 and contiguous:
  float* dq_accum = nullptr;  // [B, H, Sq, head_dim], unscaled dS·K (non-deterministic backward)
  float* lse_log2 = nullptr;  // [B, H, stat_rows]: LSE · log2(e); +inf for rows that see no key
  float* delta = nullptr;     // [B, H, stat_rows]: rowsum(dO ∘ O)
  // seqlen_q rounded up to kStatRowAlign: each (batch, head) of the row statistics starts on a
  // 256-byte boundary and its padding rows hold LSE = +inf, Δ = 0, so that a kernel may copy a
  // whole tile of them in one bulk copy without bounds checks.
  int64_t stat_rows = 0;
  // Deterministic backward of a tier that orders its dQ additions (sm90): turn counters
  // [B, H, dq_turn_tiles, parts], zeroed before the main kernel; null otherwise.
  int* dq_turns = nullptr;
  int64_t dq_turn_tiles = 0;  // query tiles per (batch, head)

  FMHA_HOST_DEVICE int64_t row_index(int64_t b, int64_t h, int64_t s) const {
    return (b * heads + h) * seqlen_q + s;
  }
  // Index of row s of (b, h) in lse_log2 and delta.
  FMHA_HOST_DEVICE int64_t stat_index(int64_t b, int64_t h, int64_t s) const {
    return (b * heads + h) * stat_rows + s;
  }
};

}  // namespace fmha::cuda
