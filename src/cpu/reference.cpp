// The fp64 oracle. Deliberately plain: one query row (or one KV-head group) at a time, straight
// from the definition, with the mask taken from the shared Mask object.
#include "cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/numeric.h"
#include "common/paged.h"
#include "common/parallel.h"
#include "common/tensor_access.h"
#include "common/varlen.h"

namespace fmha::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double at(const Tensor& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return double(load_element(t.data, t.dtype, offset4(t, b, s, h, d)));
}

// Where key j of sequence b is stored: row j of batch b, or a row of a page of a KV cache.
CacheRow key_row(const PagedCache* cache, int64_t b, int64_t j) {
  return cache ? cache->row_of(b, j) : CacheRow{b, j};
}

// Scaled scores of one row over its visible keys; returns the row max (-inf if none visible).
double row_scores(const Params& p, const Problem& s, const PagedCache* cache, int64_t b, int64_t h, int64_t row,
                  Range keys, std::vector<double>& scores) {
  const int64_t kv_head = h / s.group;
  scores.assign(size_t(keys.size()), 0.0);
  double max_score = -kInf;
  for (int64_t j = keys.begin; j < keys.end; ++j) {
    const CacheRow key = key_row(cache, b, j);
    double dot = 0.0;
    for (int64_t d = 0; d < s.head_dim; ++d) dot += at(p.q, b, row, h, d) * at(p.k, key.page, key.row, kv_head, d);
    const double score = dot * double(s.scale);
    scores[size_t(j - keys.begin)] = score;
    max_score = std::max(max_score, score);
  }
  return max_score;
}

}  // namespace

void forward_row(const Params& p, const Problem& s, int64_t b, int64_t h, int64_t row,
                 double* o_row, double* lse) {
  // A KV cache: this sequence's own length sets its mask, and its keys are read through the table.
  const bool paged = is_paged(p);
  const PagedCache cache = paged ? PagedCache::of(p) : PagedCache{};
  const Mask mask = paged ? sequence_mask(p, s.seqlen_q, cache.length(b)) : s.mask;
  const Range keys = mask.keys(row);
  const int64_t kv_head = h / s.group;
  std::fill(o_row, o_row + s.head_dim_v, 0.0);
  if (keys.empty()) {
    *lse = -kInf;
    return;
  }
  std::vector<double> scores;
  const double max_score = row_scores(p, s, paged ? &cache : nullptr, b, h, row, keys, scores);
  double sum = 0.0;
  for (double& x : scores) sum += (x = std::exp(x - max_score));
  for (int64_t j = keys.begin; j < keys.end; ++j) {
    const double weight = scores[size_t(j - keys.begin)] / sum;
    const CacheRow key = key_row(paged ? &cache : nullptr, b, j);
    for (int64_t d = 0; d < s.head_dim_v; ++d) o_row[d] += weight * at(p.v, key.page, key.row, kv_head, d);
  }
  *lse = max_score + std::log(sum);
}

void backward_group(const Params& p, const Problem& s, int64_t b, int64_t kv_head, double* dq,
                    double* dk, double* dv) {
  std::fill(dq, dq + s.group * s.seqlen_q * s.head_dim, 0.0);
  std::fill(dk, dk + s.seqlen_k * s.head_dim, 0.0);
  std::fill(dv, dv + s.seqlen_k * s.head_dim_v, 0.0);
  std::vector<double> probs, dprobs;
  for (int64_t g = 0; g < s.group; ++g) {
    const int64_t h = kv_head * s.group + g;
    for (int64_t row = 0; row < s.seqlen_q; ++row) {
      const Range keys = s.mask.keys(row);
      if (keys.empty()) continue;  // the row's output is the constant 0: no gradient flows
      const double max_score = row_scores(p, s, nullptr, b, h, row, keys, probs);
      double sum = 0.0;
      for (double& x : probs) sum += (x = std::exp(x - max_score));
      for (double& x : probs) x /= sum;
      // dP = dO · V^T, and D = sum_j P dP (= rowsum(dO ∘ O) for the exact O).
      dprobs.assign(probs.size(), 0.0);
      double delta = 0.0;
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < s.head_dim_v; ++d) dot += at(p.dout, b, row, h, d) * at(p.v, b, j, kv_head, d);
        dprobs[size_t(j - keys.begin)] = dot;
        delta += probs[size_t(j - keys.begin)] * dot;
      }
      double* dq_row = dq + (g * s.seqlen_q + row) * s.head_dim;
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        const double prob = probs[size_t(j - keys.begin)];
        const double dscore = prob * (dprobs[size_t(j - keys.begin)] - delta) * double(s.scale);
        for (int64_t d = 0; d < s.head_dim; ++d) {
          dq_row[d] += dscore * at(p.k, b, j, kv_head, d);
          dk[j * s.head_dim + d] += dscore * at(p.q, b, row, h, d);
        }
        for (int64_t d = 0; d < s.head_dim_v; ++d) dv[j * s.head_dim_v + d] += prob * at(p.dout, b, row, h, d);
      }
    }
  }
}

ForwardResult forward(const Params& p, int threads) {
  const Problem s = Problem::of(p);
  ForwardResult r;
  r.o.assign(size_t(s.batch * s.seqlen_q * s.heads * s.head_dim_v), 0.0);
  r.lse.assign(size_t(s.batch * s.heads * s.seqlen_q), 0.0);
  parallel_for(s.batch * s.heads * s.seqlen_q, resolve_threads(threads), [&](int, int64_t item) {
    const int64_t row = item % s.seqlen_q, h = (item / s.seqlen_q) % s.heads, b = item / (s.seqlen_q * s.heads);
    forward_row(p, s, b, h, row, &r.o[size_t(((b * s.seqlen_q + row) * s.heads + h) * s.head_dim_v)],
                &r.lse[size_t((b * s.heads + h) * s.seqlen_q + row)]);
  });
  return r;
}

BackwardResult backward(const Params& p, int threads) {
  const Problem s = Problem::of(p);
  BackwardResult r;
  r.dq.assign(size_t(s.batch * s.seqlen_q * s.heads * s.head_dim), 0.0);
  r.dk.assign(size_t(s.batch * s.seqlen_k * s.kv_heads * s.head_dim), 0.0);
  r.dv.assign(size_t(s.batch * s.seqlen_k * s.kv_heads * s.head_dim_v), 0.0);
  parallel_for(s.batch * s.kv_heads, resolve_threads(threads), [&](int, int64_t item) {
    const int64_t kv_head = item % s.kv_heads, b = item / s.kv_heads;
    std::vector<double> dq(size_t(s.group * s.seqlen_q * s.head_dim)), dk(size_t(s.seqlen_k * s.head_dim)),
        dv(size_t(s.seqlen_k * s.head_dim_v));
    backward_group(p, s, b, kv_head, dq.data(), dk.data(), dv.data());
    for (int64_t g = 0; g < s.group; ++g)
      for (int64_t row = 0; row < s.seqlen_q; ++row)
        std::copy_n(&dq[size_t((g * s.seqlen_q + row) * s.head_dim)], s.head_dim,
                    &r.dq[size_t(((b * s.seqlen_q + row) * s.heads + kv_head * s.group + g) * s.head_dim)]);
    for (int64_t j = 0; j < s.seqlen_k; ++j) {
      std::copy_n(&dk[size_t(j * s.head_dim)], s.head_dim,
                  &r.dk[size_t(((b * s.seqlen_k + j) * s.kv_heads + kv_head) * s.head_dim)]);
      std::copy_n(&dv[size_t(j * s.head_dim_v)], s.head_dim_v,
                  &r.dv[size_t(((b * s.seqlen_k + j) * s.kv_heads + kv_head) * s.head_dim_v)]);
    }
  });
  return r;
}

Status run(const Params& p, Direction direction) {
  if (is_varlen(p)) {
    // Each sequence is a dense batch-1 call, run on one thread: the oracle's per-call threads
    // would mostly idle on short sequences, so the threads take whole sequences instead.
    const std::vector<Params> calls = dense_calls(p);
    parallel_for(int64_t(calls.size()), resolve_threads(p.num_threads), [&](int, int64_t i) {
      Params call = calls[size_t(i)];
      call.num_threads = 1;
      run(call, direction);
    });
    return Status::success();
  }
  const Problem s = Problem::of(p);
  if (direction == Direction::forward) {
    const ForwardResult r = forward(p, p.num_threads);
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t row = 0; row < s.seqlen_q; ++row)
        for (int64_t h = 0; h < s.heads; ++h) {
          for (int64_t d = 0; d < s.head_dim_v; ++d)
            store_element(p.o.data, p.o.dtype, offset4(p.o, b, row, h, d),
                          float(r.o[size_t(((b * s.seqlen_q + row) * s.heads + h) * s.head_dim_v + d)]));
          if (p.lse.defined())
            store_element(p.lse.data, DType::fp32, offset3(p.lse, b, h, row),
                          float(r.lse[size_t((b * s.heads + h) * s.seqlen_q + row)]));
        }
    return Status::success();
  }
  const BackwardResult r = backward(p, p.num_threads);
  auto store = [](const Tensor& t, const std::vector<double>& src, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    for (int64_t i0 = 0; i0 < n0; ++i0)
      for (int64_t i1 = 0; i1 < n1; ++i1)
        for (int64_t i2 = 0; i2 < n2; ++i2)
          for (int64_t i3 = 0; i3 < n3; ++i3)
            store_element(t.data, t.dtype, offset4(t, i0, i1, i2, i3),
                          float(src[size_t(((i0 * n1 + i1) * n2 + i2) * n3 + i3)]));
  };
  store(p.dq, r.dq, s.batch, s.seqlen_q, s.heads, s.head_dim);
  store(p.dk, r.dk, s.batch, s.seqlen_k, s.kv_heads, s.head_dim);
  store(p.dv, r.dv, s.batch, s.seqlen_k, s.kv_heads, s.head_dim_v);
  return Status::success();
}

}  // namespace fmha::reference
