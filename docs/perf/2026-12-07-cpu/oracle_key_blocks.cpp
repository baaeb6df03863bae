// The fp64 oracle 8 keys at a time (docs/PERF.md, "The fp64 oracle 8 keys at a time", tried and
// not kept): the change is oracle_key_blocks.patch beside this file. This program carries the
// plain oracle (src/cpu/reference.cpp as it is, one key at a time) as fmha::plain_reference and
// links the patched one from libfmha.a: both run on 16 dense problems (every mask, GQA, Dv != D,
// fp32/bf16/fp16 storage, D32-256) and 8 paged caches with shuffled pages, and their results must
// be bitwise the same; then each is timed on one thread on the GPU tests' largest problems.
// In a checkout with the patch applied (git apply docs/perf/2026-12-07-cpu/oracle_key_blocks.patch)
// and a build directory of it (libfmha.a rebuilt), from that build directory:
//   c++ -O3 -DNDEBUG -std=gnu++20 -I<src>/src -I<src>/include -I<src>/tests \
//     <main>/docs/perf/2026-12-07-cpu/oracle_key_blocks.cpp libfmha.a /usr/local/cuda/lib/libcudart.so \
//     -L/usr/local/cuda/targets/x86_64-linux/lib -lcudadevrt -lrt -lpthread -ldl -o oracle_key_blocks
//   ./oracle_key_blocks
// where <main> is a checkout without the patch (this file carries the plain oracle's text).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "common/numeric.h"
#include "common/paged.h"
#include "common/parallel.h"
#include "common/problem.h"
#include "common/tensor_access.h"
#include "common/varlen.h"
#include "cpu/reference.h"
#include "paged_case.h"
#include "test_util.h"

namespace fmha::plain_reference {
using reference::ForwardResult;
using reference::BackwardResult;
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

}  // namespace fmha::plain_reference

namespace {
using namespace fmha;
bool same(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}
double seconds(auto f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main() {
  int bad = 0;
  const DType dtypes[3] = {DType::fp32, DType::bf16, DType::fp16};
  for (int k = 0; k < 16; ++k) {  // dense problems, forward and backward
    const int64_t heads = 4, kv_heads = k % 3 == 0 ? 4 : (k % 3 == 1 ? 2 : 1), sq = 1 + 13 * k, sk = 3 + 11 * k;
    const int64_t d = k < 12 ? 32 + 32 * (k % 4) : 256, dv = k % 5 == 2 ? d / 2 : d;
    testing::Problem pr(2, heads, kv_heads, sq, sk, d, dv, dtypes[k % 3], 100 + k);
    Params p = pr.params(Backend::reference);
    p.causal = k % 4 == 1 ? Causal::bottom_right : (k % 4 == 2 ? Causal::top_left : Causal::none);
    if (k % 7 == 3) p.window_left = 5, p.window_right = 2;
    if (k % 6 == 4) p.q_offset = 3;
    const reference::ForwardResult f1 = reference::forward(p, 1), f0 = plain_reference::forward(p, 1);
    const reference::BackwardResult b1 = reference::backward(p, 1), b0 = plain_reference::backward(p, 1);
    const bool ok = same(f1.o, f0.o) && same(f1.lse, f0.lse) && same(b1.dq, b0.dq) && same(b1.dk, b0.dk) && same(b1.dv, b0.dv);
    std::printf("dense %2d: B2 H%lld/%lld %lld x %lld D%lld/%lld %s: %s\n", k, (long long)heads, (long long)kv_heads,
                (long long)sq, (long long)sk, (long long)d, (long long)dv, to_string(dtypes[k % 3]), ok ? "bitwise same" : "DIFFERENT");
    bad += !ok;
  }
  for (int k = 0; k < 8; ++k) {  // paged caches, forward
    testing::CacheSpec c;
    c.seqlen_q = 1 + k % 4, c.page_size = 16 << (k % 3), c.lengths = {40 + 29 * k, 1, 0, 97};
    c.head_dim = c.head_dim_v = 64, c.dtype = dtypes[k % 3], c.seed = 7 + k, c.shared_prefix_pages = k % 2;
    if (k % 4 == 3) c.window_left = 20;
    const testing::PagedCall call(c);
    const Params p = call.params(Backend::reference);
    const reference::ForwardResult f1 = reference::forward(p, 1), f0 = plain_reference::forward(p, 1);
    const bool ok = same(f1.o, f0.o) && same(f1.lse, f0.lse);
    std::printf("paged %d: page %lld, %lld query rows: %s\n", k, (long long)c.page_size, (long long)c.seqlen_q,
                ok ? "bitwise same" : "DIFFERENT");
    bad += !ok;
  }
  for (int shape = 0; shape < 2; ++shape) {  // the GPU tests' largest: many short tiles at D256
    const int64_t batch = shape == 0 ? 32 : 16, sq = shape == 0 ? 200 : 600;
    testing::Problem pr(batch, 8, 4, sq, 150, 256, 256, DType::bf16, 9);
    Params p = pr.params(Backend::reference);
    p.causal = shape == 0 ? Causal::none : Causal::bottom_right;
    reference::ForwardResult f1, f0;
    const double t0 = seconds([&] { f0 = plain_reference::forward(p, 1); }), t1 = seconds([&] { f1 = reference::forward(p, 1); });
    const bool ok = same(f1.o, f0.o) && same(f1.lse, f0.lse);
    std::printf("forward B%lld H8/4 %lld x 150 D256 bf16%s, one thread: %.2f s -> %.2f s (%s)\n", (long long)batch,
                (long long)sq, shape ? " causal" : "", t0, t1, ok ? "bitwise same" : "DIFFERENT");
    bad += !ok;
  }
  {
    testing::Problem pr(8, 8, 4, 600, 150, 128, 128, DType::bf16, 11);
    Params p = pr.params(Backend::reference);
    p.causal = Causal::bottom_right;
    reference::BackwardResult b1, b0;
    const double t0 = seconds([&] { b0 = plain_reference::backward(p, 1); }), t1 = seconds([&] { b1 = reference::backward(p, 1); });
    const bool ok = same(b1.dq, b0.dq) && same(b1.dk, b0.dk) && same(b1.dv, b0.dv);
    std::printf("backward B8 H8/4 600 x 150 D128 bf16 causal, one thread: %.2f s -> %.2f s (%s)\n", t0, t1,
                ok ? "bitwise same" : "DIFFERENT");
    bad += !ok;
  }
  std::printf("%s\n", bad ? "FAILED" : "all bitwise the same");
  return bad;
}
