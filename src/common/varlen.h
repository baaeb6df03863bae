// Variable-length (packed) batches on the host: reading the sequence tables and viewing one
// sequence of a packed call as a dense batch-1 call, so that every CPU path runs each sequence
// with the code, and the mask, of the dense layout.
#pragma once

#include <cstdint>
#include <vector>

#include "fmha/fmha.h"

namespace fmha {

inline bool is_varlen(const Params& p) { return p.cu_seqlens_q.defined() || p.cu_seqlens_k.defined(); }

// The number of sequences of a validated varlen call.
inline int64_t varlen_batch(const Params& p) { return p.cu_seqlens_q.shape[0] - 1; }

// One sequence's rows in the packed q (o, dout, dq, lse) and k (v, dk, dv) tensors.
struct SequenceRows {
  int64_t q_begin = 0, q_end = 0, k_begin = 0, k_end = 0;
};

// The table of a validated varlen call whose tables are in CPU memory.
std::vector<SequenceRows> sequence_rows(const Params& params);

// Sequence `rows` of a validated varlen call as a dense call with batch 1: the packed views
// narrowed to the sequence's rows, everything else (options, stream, threads) unchanged.
Params sequence_params(const Params& params, const SequenceRows& rows);

// Every sequence of a varlen call as its own dense call; a dense call as itself.
std::vector<Params> dense_calls(const Params& params);

}  // namespace fmha
