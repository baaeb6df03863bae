// See varlen.h.
#include "common/varlen.h"

namespace fmha {
namespace {

// Rows [begin, end) of a packed [total, heads, dim] view as a [1, end - begin, heads, dim] view.
Tensor packed_rows(const Tensor& t, int64_t begin, int64_t end) {
  if (!t.defined()) return t;
  Tensor out = t;
  out.rank = 4;
  out.shape[0] = 1;
  out.shape[1] = end - begin;
  out.shape[2] = t.shape[1];
  out.shape[3] = t.shape[2];
  out.stride[0] = 0;  // one sequence: the batch stride is never used
  out.stride[1] = t.stride[0];
  out.stride[2] = t.stride[1];
  out.stride[3] = t.stride[2];
  if (end > begin) out.data = static_cast<char*>(t.data) + begin * t.stride[0] * int64_t(dtype_size(t.dtype));
  return out;
}

// Columns [begin, end) of the packed LSE [heads, total_q] as a [1, heads, end - begin] view.
Tensor packed_lse(const Tensor& t, int64_t begin, int64_t end) {
  if (!t.defined()) return t;
  Tensor out = t;
  out.rank = 3;
  out.shape[0] = 1;
  out.shape[1] = t.shape[0];
  out.shape[2] = end - begin;
  out.stride[0] = 0;
  out.stride[1] = t.stride[0];
  out.stride[2] = t.stride[1];
  if (end > begin) out.data = static_cast<char*>(t.data) + begin * t.stride[1] * int64_t(sizeof(float));
  return out;
}

}  // namespace

std::vector<SequenceRows> sequence_rows(const Params& p) {
  const int64_t batch = varlen_batch(p);
  const auto* cu_q = static_cast<const int32_t*>(p.cu_seqlens_q.data);
  const auto* cu_k = static_cast<const int32_t*>(p.cu_seqlens_k.data);
  const int64_t stride_q = p.cu_seqlens_q.stride[0], stride_k = p.cu_seqlens_k.stride[0];
  std::vector<SequenceRows> rows(size_t(batch > 0 ? batch : 0));
  for (int64_t b = 0; b < batch; ++b)
    rows[size_t(b)] = {cu_q[b * stride_q], cu_q[(b + 1) * stride_q], cu_k[b * stride_k], cu_k[(b + 1) * stride_k]};
  return rows;
}

Params sequence_params(const Params& p, const SequenceRows& r) {
  Params s = p;
  s.cu_seqlens_q = Tensor{};
  s.cu_seqlens_k = Tensor{};
  s.max_seqlen_q = s.max_seqlen_k = 0;
  s.q = packed_rows(p.q, r.q_begin, r.q_end);
  s.o = packed_rows(p.o, r.q_begin, r.q_end);
  s.dout = packed_rows(p.dout, r.q_begin, r.q_end);
  s.dq = packed_rows(p.dq, r.q_begin, r.q_end);
  s.lse = packed_lse(p.lse, r.q_begin, r.q_end);
  s.k = packed_rows(p.k, r.k_begin, r.k_end);
  s.v = packed_rows(p.v, r.k_begin, r.k_end);
  s.dk = packed_rows(p.dk, r.k_begin, r.k_end);
  s.dv = packed_rows(p.dv, r.k_begin, r.k_end);
  return s;
}

std::vector<Params> dense_calls(const Params& p) {
  if (!is_varlen(p)) return {p};
  std::vector<Params> calls;
  for (const SequenceRows& r : sequence_rows(p)) calls.push_back(sequence_params(p, r));
  return calls;
}

}  // namespace fmha
