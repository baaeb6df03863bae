// The kernels' view of one call: raw pointers, int64 element strides and sizes, read off a
// validated Params on the host and passed by value to every kernel of every tier.
// Base offsets are int64 (tensors above 2^31 elements); indices inside a tile stay int32.
//
// Variable-length (packed) calls use the same block: a kernel's packed instantiation first calls
// sequence() with its batch index (block_sequence.cuh), which reads the sequence tables in device
// memory and gives that sequence's lengths and mask; the views then take the sequence's first
// packed row in place of the batch index (SequenceStart), since their batch strides are row
// strides.
#pragma once

#include <cstdint>

#include "common/paged.h"
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
  // Whether every row of this view over [batch, rows, heads] (`dim` elements of `element_bytes`)
  // starts on 16 bytes and is whole 16-byte vectors: the base, and the stride of every dimension
  // with more than one index, multiples of 16 bytes.
  bool vector_rows(int64_t batch, int64_t rows, int64_t heads, int64_t dim, int64_t element_bytes) const {
    const auto aligned = [&](int64_t elements) { return (elements * element_bytes) % 16 == 0; };
    return reinterpret_cast<uintptr_t>(data) % 16 == 0 && aligned(dim) && (batch <= 1 || aligned(batch_stride)) &&
           (rows <= 1 || aligned(seq_stride)) && (heads <= 1 || aligned(head_stride));
  }
};

// Row statistics (lse_log2, delta, row_max, row_inv_sum) are stored in runs of this many rows per (batch, head).
inline constexpr int64_t kStatRowAlign = 128;  // the largest query tile a backward copies whole

// Where one block's sequence starts: the first argument of the views' at() and of row_index()
// on the query side (q, o, dout, dq, LSE, workspace rows) and on the key side (k, v, dk, dv).
// Dense calls: the batch index on both sides. Packed calls: the sequence's first row in q and k.
struct SequenceStart {
  int64_t q = 0, k = 0;
};

// One sequence of a call as a kernel block sees it: where its rows start, and its mask, which
// carries its lengths (mask.seqlen_q, mask.seqlen_k).
struct Sequence {
  SequenceStart start;
  Mask mask;
};

// The sequence tables of a packed call (cu_seqlens_q null for a dense call), as far as the
// kernels need them: where each sequence's rows are, and what each sequence's mask depends on.
struct PackedTables {
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1], element stride stride_q
  const int32_t* cu_seqlens_k = nullptr;  // [batch + 1], element stride stride_k
  int64_t stride_q = 1, stride_k = 1;
  int64_t total_q = 0, total_k = 0;       // rows of the packed q-side and k-side tensors
  int64_t q_offset = 0;
  bool bottom_right = false;              // causal alignment to the last key of each sequence
};

struct AttentionArgs {
  View4 q, k, v, o;
  View4 dout, dq, dk, dv;
  float* lse = nullptr;  // [B, H, Sq] natural log; null when the caller wants none
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_seq_stride = 0;

  int batch = 0, heads = 0, kv_heads = 0, group = 1;
  int head_dim = 0, head_dim_v = 0;
  // Dense: the call's lengths and mask. Packed: the longest sequences' lengths (which size the
  // grids) and the window; each block's own come from sequence().
  int64_t seqlen_q = 0, seqlen_k = 0;
  float scale = 0.f;       // softmax scale on q·k
  float scale_log2 = 0.f;  // scale * log2(e): scores in the exp2 domain
  Mask mask;
  PackedTables packed;

  // Backward workspace, all fp32 and contiguous, per (query row, head): dense calls [B, H, Sq],
  // packed ones [H, total_q]:
  float* dq_accum = nullptr;  // [rows, dq_accum_stride], unscaled dS·K (non-deterministic backward)
  int64_t dq_accum_stride = 0;  // floats per row: head_dim, or the tier's padded tile width (sm90)
  // row_index(start, h, s) = start · row_start_stride + h · row_head_stride + s: dense
  // {H · Sq, Sq} with the batch index as start, packed {1, total_q} with the sequence's first row.
  int64_t row_start_stride = 0, row_head_stride = 0;
  // The row statistics, per head in runs of stat_rows = (Sq dense, total_q packed) rounded up to
  // kStatRowAlign: each run starts on a 512-byte boundary and its padding rows hold LSE = +inf,
  // Δ = 0, so that a kernel may copy a whole tile of them in one bulk copy without bounds checks.
  // stat_index(start, h, s) = start · stat_start_stride + h · stat_rows + s: dense
  // {H · stat_rows} with the batch index as start, packed {1} with the sequence's first row.
  float* lse_log2 = nullptr;  // LSE · log2(e); +inf for rows that see no key
  float* delta = nullptr;     // rowsum(dO ∘ O)
  // The softmax the backward recomputes itself (the statistics kernels of simt and of sm80's split
  // tf32, from their own scores): row_max, the max of x = sign(scale)·(q·k) over the visible keys
  // (+inf where none), and row_inv_sum, the factor that makes 2^((x - row_max)·|scale_log2|) the P
  // of the given LSE (0 where no key is visible). Only a sequence's rows are stored: kernels fill
  // the padding rows of a tile as they load it (+inf, 0). cuda/common/own_softmax.cuh says why.
  float* row_max = nullptr;
  float* row_inv_sum = nullptr;
  int64_t stat_rows = 0, stat_start_stride = 0;
  // Deterministic backward of a tier that orders its dQ additions (sm90, dense calls): turn
  // counters [B, H, dq_turn_tiles, parts], zeroed before the main kernel; null otherwise.
  int* dq_turns = nullptr;
  int64_t dq_turn_tiles = 0;  // query tiles per (batch, head)

  FMHA_HOST_DEVICE int64_t row_index(int64_t start, int64_t h, int64_t s) const {
    return start * row_start_stride + h * row_head_stride + s;
  }

  FMHA_HOST_DEVICE bool is_packed() const { return packed.cu_seqlens_q != nullptr; }

  // The sequence of batch index `batch`, as a kernel block sees it: for a dense call the batch
  // index on both sides and the call's mask; for a packed one the sequence's rows read from the
  // tables, and the mask of its own lengths (mask.seqlen_q, mask.seqlen_k).
  //
  // The tables are the caller's promise (fmha.h) and are not trusted: every begin is clamped to
  // [0, total], every end to [begin, total], and every length to the call's max_seqlen, so that a
  // broken table (decreasing, negative, past the packed tensors) gives wrong sequences but never a
  // row outside the tensors or the workspace.
  FMHA_HOST_DEVICE Sequence sequence(int64_t batch) const {
    if (!is_packed()) return {{batch, batch}, mask};
    const auto clamp = [](int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); };
    const int64_t q_begin = clamp(packed.cu_seqlens_q[batch * packed.stride_q], 0, packed.total_q);
    const int64_t q_end = clamp(packed.cu_seqlens_q[(batch + 1) * packed.stride_q], q_begin, packed.total_q);
    const int64_t k_begin = clamp(packed.cu_seqlens_k[batch * packed.stride_k], 0, packed.total_k);
    const int64_t k_end = clamp(packed.cu_seqlens_k[(batch + 1) * packed.stride_k], k_begin, packed.total_k);
    Sequence seq{{q_begin, k_begin}, mask};  // the window from the call's mask
    // seqlen_q / seqlen_k are max_seqlen_q / max_seqlen_k (at most the totals) for packed calls.
    seq.mask.seqlen_q = q_end - q_begin < seqlen_q ? q_end - q_begin : seqlen_q;
    seq.mask.seqlen_k = k_end - k_begin < seqlen_k ? k_end - k_begin : seqlen_k;
    seq.mask.shift = packed.q_offset + (packed.bottom_right ? seq.mask.seqlen_k - seq.mask.seqlen_q : 0);
    return seq;
  }
  // Index of row s of head h in lse_log2 and delta (start as for row_index).
  FMHA_HOST_DEVICE int64_t stat_index(int64_t start, int64_t h, int64_t s) const {
    return start * stat_start_stride + h * stat_rows + s;
  }
};

// The decode kernel's view of a call (sm80_decode_kernel.cuh): dense queries, a KV cache read
// through PagedCache (common/paged.h: a block table, a contiguous cache, or a dense call's k and v
// as one page per sequence), and where each split's partial result goes.
struct DecodeArgs {
  View4 q, o;                                       // [B, Sq, H, D] and [B, Sq, H, Dv]
  const void* k = nullptr;                          // [pages, page_size, Hkv, D]
  const void* v = nullptr;                          // [pages, page_size, Hkv, Dv]
  int64_t k_page_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_page_stride = 0, v_row_stride = 0, v_head_stride = 0;
  PagedCache cache;                                 // tables in device memory, clamped as read
  CacheMask masks;                                  // each sequence's mask with its own length
  float* lse = nullptr;                             // [B, H, Sq]; null when the caller wants none
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_seq_stride = 0;
  int batch = 0, heads = 0, kv_heads = 0, group = 1, head_dim = 0, head_dim_v = 0;
  int seqlen_q = 0;
  int rows = 0;                                     // packed query rows per KV head: seqlen_q · group
  int row_tiles = 1;                                // blocks of decode::kTileRows packed rows
  float scale_log2 = 0.f;
  int splits = 1;                                   // CTAs per (sequence, KV head, row tile)
  // splits > 1: fp32 partials [splits, B, Sq, H, Dv] and LSEs [splits, B, H, Sq] (workspace);
  // the merge of the parts writes o and lse.
  float* part_o = nullptr;
  float* part_lse = nullptr;
};

}  // namespace fmha::cuda
