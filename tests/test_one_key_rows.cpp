// Rows that see one key, on the CPU backends: P = 1 there, so dS = P·(dP - Δ) is 0 in exact
// arithmetic and dQ of such a row, and dK of a key that only such rows see, must cancel to fp32
// rounding of the dP and Δ sums, in every dtype and precision (tf32 included: Δ must be formed from
// the operands the dP product rounds). The masks: causal top-left with a window of 0 (every row
// sees its own key), and causal bottom-right with one and with two keys (the last rows see one or
// two keys, the others none). Rows that see two keys are checked against the oracle by the
// harness's rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "common/problem.h"
#include "harness.h"
#include "test_util.h"

namespace fmha {
namespace {

struct Flavor {
  DType dtype;
  Precision precision;
  const char* name;
};
const Flavor kFlavors[] = {{DType::fp32, Precision::ieee, "fp32"},
                           {DType::fp32, Precision::tf32, "tf32"},
                           {DType::fp32, Precision::tf32x3, "tf32x3"},
                           {DType::fp16, Precision::ieee, "fp16"},
                           {DType::bf16, Precision::ieee, "bf16"}};

struct MaskCase {
  const char* name;
  Causal causal;
  int64_t seqlen_q, seqlen_k, window_left;
};
const MaskCase kMasks[] = {{"window0", Causal::top_left, 37, 45, 0},
                           {"bottom_right_k1", Causal::bottom_right, 9, 1, -1},
                           {"bottom_right_k2", Causal::bottom_right, 9, 2, -1}};

// |x| <= kCancelUlps · 2^-24 · |scale| · sum_d |dO·V| · max|K| (dQ; max|Q| for dK), as the GPU
// tests bound it (tests/gpu/gpu_test_util.h check_single_key_rows_cancel).
constexpr double kCancelUlps = 16.0;

std::string check_one_key_rows(const Flavor& f, const MaskCase& m, Backend backend) {
  constexpr int64_t kBatch = 2, kHeads = 4, kKvHeads = 2, kHeadDim = 64;
  testing::Problem pr(kBatch, kHeads, kKvHeads, m.seqlen_q, m.seqlen_k, kHeadDim, kHeadDim, f.dtype, 7);
  Params p = pr.params(backend);
  p.precision = f.precision;
  p.causal = m.causal;
  p.window_left = m.window_left;
  if (Status s = forward(p); !s.ok()) return "forward: " + s.message;
  if (Status s = backward(p); !s.ok()) return "backward: " + s.message;
  const fmha::Problem s = fmha::Problem::of(p);
  // [B, S, H, D] contiguous views: element (b, s, h, d).
  auto at = [](const testing::HostTensor& t, int64_t b, int64_t row, int64_t h, int64_t d) {
    return double(t.at(((b * t.view.shape[1] + row) * t.view.shape[2] + h) * t.view.shape[3] + d));
  };
  std::vector<double> dk_bound(size_t(kBatch * m.seqlen_k * kKvHeads), 0.0);
  std::vector<bool> dk_only_one_key_rows(dk_bound.size(), true);
  std::ostringstream out;
  int64_t one_key_rows = 0;
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t i = 0; i < m.seqlen_q; ++i) {
        const Range keys = s.mask.keys(i);
        const int64_t kvh = h / s.group;
        if (keys.size() != 1) {
          for (int64_t j = keys.begin; j < keys.end; ++j)
            dk_only_one_key_rows[size_t((b * m.seqlen_k + j) * kKvHeads + kvh)] = false;
          continue;
        }
        ++one_key_rows;
        const int64_t j = keys.begin;
        double terms = 0.0, k_max = 0.0, q_max = 0.0;
        for (int64_t d = 0; d < kHeadDim; ++d) {
          terms += std::abs(at(pr.dout, b, i, h, d) * at(pr.v, b, j, kvh, d));
          k_max = std::max(k_max, std::abs(at(pr.k, b, j, kvh, d)));
          q_max = std::max(q_max, std::abs(at(pr.q, b, i, h, d)));
        }
        const double unit = kCancelUlps * std::ldexp(1.0, -24) * std::abs(double(s.scale)) * terms;
        dk_bound[size_t((b * m.seqlen_k + j) * kKvHeads + kvh)] += unit * q_max;
        for (int64_t d = 0; d < kHeadDim; ++d)
          if (!(std::abs(at(pr.dq, b, i, h, d)) <= unit * k_max)) {
            out << "dq[" << b << "," << i << "," << h << "," << d << "] = " << at(pr.dq, b, i, h, d) << ", bound "
                << unit * k_max << " (a row that sees one key)";
            return out.str();
          }
      }
  if (one_key_rows == 0) return "no row sees exactly one key: the case tests nothing";
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t j = 0; j < m.seqlen_k; ++j)
      for (int64_t kvh = 0; kvh < kKvHeads; ++kvh) {
        const size_t idx = size_t((b * m.seqlen_k + j) * kKvHeads + kvh);
        if (!dk_only_one_key_rows[idx]) continue;
        for (int64_t d = 0; d < kHeadDim; ++d)
          if (!(std::abs(at(pr.dk, b, j, kvh, d)) <= dk_bound[idx])) {
            out << "dk[" << b << "," << j << "," << kvh << "," << d << "] = " << at(pr.dk, b, j, kvh, d) << ", bound "
                << dk_bound[idx] << " (a key that only one-key rows see)";
            return out.str();
          }
      }
  return "";
}

class OneKeyRows : public ::testing::TestWithParam<std::tuple<Flavor, MaskCase>> {};

TEST_P(OneKeyRows, GradientsCancel) {
  const auto& [flavor, mask] = GetParam();
  for (Backend backend : {Backend::cpu, Backend::reference}) {
    const std::string msg = check_one_key_rows(flavor, mask, backend);
    EXPECT_TRUE(msg.empty()) << to_string(backend) << ": " << msg;
  }
}

// Rows that see two keys (window 1; bottom-right with two keys): the usual rule against the oracle.
TEST_P(OneKeyRows, TwoKeyRowsMatchOracle) {
  const auto& [flavor, mask] = GetParam();
  tools::CaseSpec c;
  c.backend = Backend::cpu;
  c.dtype = flavor.dtype;
  c.precision = flavor.precision;
  c.batch = 2, c.heads = 4, c.kv_heads = 2, c.head_dim = c.head_dim_v = 64;
  c.seqlen_q = mask.seqlen_q, c.seqlen_k = mask.seqlen_k;
  c.causal = mask.causal;
  c.window_left = mask.window_left == 0 ? 1 : mask.window_left;
  for (Direction mode : {Direction::forward, Direction::backward}) {
    c.mode = mode;
    tools::Harness h(c, Device{});
    const Status s = h.run_once();
    ASSERT_TRUE(s.ok()) << s.message;
    const tools::CheckResult r = h.check();
    EXPECT_TRUE(r.pass) << r.failure << " (rel_err " << r.rel_err << ", tolerance " << r.tolerance << ")";
  }
}

// An LSE formed elsewhere (here the exact one: a row that sees one key has LSE = scale·(q·k), in
// double, rounded to fp32), on rows whose score cancels to near 0 (each key made orthogonal to
// the one query that sees it, inputs of standard deviation 3, scale 1): the backward's own score
// differs from it by its rounding of sum_d |q_d·k_d|, many units of an LSE near 0. The row is
// still its own softmax: P = 1, so dV = dO and dQ = dK = 0 exactly.
TEST(OneKeyRowsForeignLse, TakeTheirOwnSoftmax) {
  constexpr int64_t kBatch = 2, kHeads = 4, kSeqlenQ = 37, kSeqlenK = 45, kHeadDim = 64;
  constexpr float kStd = 3.0f;
  testing::Problem pr(kBatch, kHeads, kHeads, kSeqlenQ, kSeqlenK, kHeadDim, kHeadDim, DType::fp32, 11);
  auto idx = [](const testing::HostTensor& t, int64_t b, int64_t row, int64_t h, int64_t d) {
    return ((b * t.view.shape[1] + row) * t.view.shape[2] + h) * t.view.shape[3] + d;
  };
  for (testing::HostTensor* t : {&pr.q, &pr.k})
    for (int64_t i = 0; i < t->numel(); ++i) t->set(i, t->at(i) * kStd);
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t i = 0; i < kSeqlenQ; ++i) {  // k_i -= (q_i·k_i / |q_i|^2) q_i
        double qk = 0.0, qq = 0.0;
        for (int64_t d = 0; d < kHeadDim; ++d) {
          const double q = pr.q.at(idx(pr.q, b, i, h, d));
          qk += q * pr.k.at(idx(pr.k, b, i, h, d));
          qq += q * q;
        }
        for (int64_t d = 0; d < kHeadDim; ++d)
          pr.k.set(idx(pr.k, b, i, h, d),
                   float(pr.k.at(idx(pr.k, b, i, h, d)) - qk / qq * pr.q.at(idx(pr.q, b, i, h, d))));
      }
  Params p = pr.params(Backend::cpu);
  p.softmax_scale = 1.0f;
  p.causal = Causal::top_left;
  p.window_left = 0;  // row i sees key i alone
  ASSERT_TRUE(forward(p).ok());
  int64_t moved = 0;  // rows whose exact LSE differs from the forward's (the case is live)
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t i = 0; i < kSeqlenQ; ++i) {
        double score = 0.0;
        for (int64_t d = 0; d < kHeadDim; ++d)
          score += double(pr.q.at(idx(pr.q, b, i, h, d))) * double(pr.k.at(idx(pr.k, b, i, h, d)));
        const int64_t l = (b * kHeads + h) * kSeqlenQ + i;
        moved += pr.lse.at(l) != float(score);
        pr.lse.set(l, float(score));
      }
  ASSERT_GT(moved, 0) << "the exact LSE equals the forward's everywhere: the case tests nothing";
  ASSERT_TRUE(backward(p).ok());
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t j = 0; j < kSeqlenK; ++j)
        for (int64_t d = 0; d < kHeadDim; ++d) {
          const float want_dv = j < kSeqlenQ ? pr.dout.at(idx(pr.dout, b, j, h, d)) : 0.0f;
          ASSERT_EQ(pr.dv.at(idx(pr.dv, b, j, h, d)), want_dv) << "dv[" << b << "," << j << "," << h << "," << d << "]";
          ASSERT_EQ(pr.dk.at(idx(pr.dk, b, j, h, d)), 0.0f) << "dk[" << b << "," << j << "," << h << "," << d << "]";
          if (j < kSeqlenQ)
            ASSERT_EQ(pr.dq.at(idx(pr.dq, b, j, h, d)), 0.0f) << "dq[" << b << "," << j << "," << h << "," << d << "]";
        }
}

INSTANTIATE_TEST_SUITE_P(Cpu, OneKeyRows,
                         ::testing::Combine(::testing::ValuesIn(kFlavors), ::testing::ValuesIn(kMasks)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param).name;
                         });

}  // namespace
}  // namespace fmha
