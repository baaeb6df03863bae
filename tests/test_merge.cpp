// fmha::merge: partial attention results over disjoint key sets combined into the attention over
// their union. Against the fp64 oracle over the union; its algebra (commutative, associative, a
// part with lse = -inf is the identity); extreme and infinite LSEs; the accumulate form over many
// parts; the packed layout; the gradient identity that ring attention relies on; bad input.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/reference.h"
#include "test_util.h"

namespace fmha {
namespace {

using testing::HostTensor;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint64_t fresh_seed() {
  return uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count()) & 0xffffffffull;
}

// Keys [begin, end) of a [B, Sk, Hkv, D] view.
Tensor key_range(const Tensor& t, int64_t begin, int64_t end) {
  Tensor out = t;
  out.shape[1] = end - begin;
  out.data = static_cast<char*>(t.data) + begin * t.stride[1] * int64_t(dtype_size(t.dtype));
  return out;
}

// One attention problem over keys [0, Sk) split at `splits` into parts; each part's forward (and
// backward) is an ordinary call whose q_offset places its keys where they sit in the whole.
struct Split {
  testing::Problem whole;
  std::vector<int64_t> bounds;  // 0, splits..., Sk
  std::vector<HostTensor> out, lse;  // per part: O [B, Sq, H, Dv], LSE [B, H, Sq]

  Split(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seqlen_q, int64_t seqlen_k, int64_t dim,
        int64_t dim_v, std::vector<int64_t> splits, DType dtype = DType::fp32)
      : whole(batch, heads, kv_heads, seqlen_q, seqlen_k, dim, dim_v, dtype, fresh_seed()) {
    bounds.push_back(0);
    for (int64_t s : splits) bounds.push_back(s);
    bounds.push_back(seqlen_k);
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      out.emplace_back(dtype, std::initializer_list<int64_t>{batch, seqlen_q, heads, dim_v});
      lse.emplace_back(DType::fp32, std::initializer_list<int64_t>{batch, heads, seqlen_q});
    }
  }
  size_t parts() const { return out.size(); }

  // The call over part i's keys, with the whole problem's mask options.
  Params part(size_t i, const Params& whole_call) {
    Params p = whole_call;
    p.k = key_range(whole_call.k, bounds[i], bounds[i + 1]);
    p.v = key_range(whole_call.v, bounds[i], bounds[i + 1]);
    p.dk = key_range(whole_call.dk, bounds[i], bounds[i + 1]);
    p.dv = key_range(whole_call.dv, bounds[i], bounds[i + 1]);
    p.o = out[i].view;
    p.lse = lse[i].view;
    // Key j of the part sits at bounds[i] + j: the part's query positions are the whole call's
    // shifted left by as much. Bottom-right alignment depends on the key count, so the part states
    // the whole call's shift as a top-left one.
    int64_t shift = whole_call.q_offset;
    if (whole_call.causal == Causal::bottom_right) {
      shift += whole_call.k.shape[1] - whole_call.q.shape[1];
      p.causal = Causal::top_left;
    }
    p.q_offset = shift - bounds[i];
    return p;
  }
};

MergeParams merge_of(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b, const Tensor& lse_b,
                     const Tensor& out, const Tensor& lse) {
  MergeParams m;
  m.out_a = out_a, m.lse_a = lse_a, m.out_b = out_b, m.lse_b = lse_b, m.out = out, m.lse = lse;
  return m;
}

// ---- Against the oracle over the union ---------------------------------------------------------

TEST(Merge, PartsMergeToTheOracleOverTheUnion) {
  // Top-left causal with an offset: some rows see no key of a part (lse = -inf there), and the
  // first rows see none at all (o = 0, lse = -inf after the merge too).
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(to_string(backend));
    Split split(2, 4, 2, 37, 90, 32, 24, {20, 61});
    Params whole = split.whole.params(backend);
    whole.causal = Causal::top_left;
    whole.q_offset = -3;
    const reference::ForwardResult oracle = reference::forward(whole);
    for (size_t i = 0; i < split.parts(); ++i) ASSERT_TRUE(forward(split.part(i, whole)).ok());

    // (a ∪ b) ∪ c, written over a's tensors in place.
    for (size_t i = 1; i < split.parts(); ++i)
      ASSERT_TRUE(merge_into(split.out[0].view, split.lse[0].view, split.out[i].view, split.lse[i].view).ok());
    const HostTensor& out = split.out[0];
    const HostTensor& lse = split.lse[0];
    for (int64_t i = 0; i < lse.numel(); ++i) {
      if (std::isinf(oracle.lse[size_t(i)])) EXPECT_EQ(lse.at(i), -kInf) << "lse " << i;
      else EXPECT_NEAR(lse.at(i), oracle.lse[size_t(i)], 1e-5 * std::max(1.0, std::abs(oracle.lse[size_t(i)]))) << i;
    }
    double diff2 = 0.0, ref2 = 0.0;
    for (int64_t i = 0; i < out.numel(); ++i) {
      diff2 += (out.at(i) - oracle.o[size_t(i)]) * (out.at(i) - oracle.o[size_t(i)]);
      ref2 += oracle.o[size_t(i)] * oracle.o[size_t(i)];
      ASSERT_FALSE(std::isnan(out.at(i))) << i;
    }
    EXPECT_LT(std::sqrt(diff2 / ref2), 1e-6);
    // The first three rows see no key (pos = row - 3 < 0): exactly zero output.
    for (int64_t h = 0; h < 4; ++h) {
      for (int64_t row = 0; row < 3; ++row) {
        EXPECT_EQ(lse.at(h * 37 + row), -kInf);
        for (int64_t d = 0; d < 24; ++d) EXPECT_EQ(out.at((row * 4 + h) * 24 + d), 0.0f);
      }
    }
  }
}

// bf16 parts into an fp32 accumulator that starts empty (lse = -inf, out unwritten: NaN).
TEST(Merge, AccumulateManyPartsIntoFp32) {
  Split split(1, 2, 1, 50, 256, 64, 64, {40, 41, 100, 200}, DType::bf16);
  Params whole = split.whole.params(Backend::cpu);
  whole.causal = Causal::bottom_right;
  const reference::ForwardResult oracle = reference::forward(whole);
  HostTensor acc_out(DType::fp32, {1, 50, 2, 64}), acc_lse(DType::fp32, {1, 2, 50});
  acc_out.fill(kNaN);
  acc_lse.fill(-kInf);
  for (size_t i = 0; i < split.parts(); ++i) {
    ASSERT_TRUE(forward(split.part(i, whole)).ok());
    ASSERT_TRUE(merge_into(acc_out.view, acc_lse.view, split.out[i].view, split.lse[i].view).ok());
  }
  double diff2 = 0.0, ref2 = 0.0;
  for (int64_t i = 0; i < acc_out.numel(); ++i) {
    diff2 += (acc_out.at(i) - oracle.o[size_t(i)]) * (acc_out.at(i) - oracle.o[size_t(i)]);
    ref2 += oracle.o[size_t(i)] * oracle.o[size_t(i)];
  }
  EXPECT_LT(std::sqrt(diff2 / ref2), 1e-2);  // bf16 parts: their own rounding, 2^-8
  for (int64_t i = 0; i < acc_lse.numel(); ++i) EXPECT_NEAR(acc_lse.at(i), oracle.lse[size_t(i)], 1e-2);
}

// ---- Algebra -------------------------------------------------------------------------------------

// Random parts: O in N(0, 1), LSE in N(0, 5), with some rows -inf on one side.
struct Parts {
  static constexpr int64_t kBatch = 2, kSeqlen = 33, kHeads = 3, kDim = 20;
  std::vector<HostTensor> out, lse;
  explicit Parts(int count, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 5.f);
    for (int i = 0; i < count; ++i) {
      out.emplace_back(DType::fp32, std::initializer_list<int64_t>{kBatch, kSeqlen, kHeads, kDim});
      lse.emplace_back(DType::fp32, std::initializer_list<int64_t>{kBatch, kHeads, kSeqlen});
      out.back().randomize(rng);
      for (int64_t r = 0; r < lse.back().numel(); ++r) lse.back().set(r, (r + i) % 7 == 0 ? -kInf : normal(rng));
    }
  }
  HostTensor new_out() const { return HostTensor(DType::fp32, {kBatch, kSeqlen, kHeads, kDim}); }
  HostTensor new_lse() const { return HostTensor(DType::fp32, {kBatch, kHeads, kSeqlen}); }
};

TEST(Merge, CommutativeExactlyAndAssociativeToRounding) {
  const Parts p(3, fresh_seed());
  HostTensor ab = p.new_out(), ab_lse = p.new_lse(), ba = p.new_out(), ba_lse = p.new_lse();
  ASSERT_TRUE(merge(merge_of(p.out[0].view, p.lse[0].view, p.out[1].view, p.lse[1].view, ab.view, ab_lse.view)).ok());
  ASSERT_TRUE(merge(merge_of(p.out[1].view, p.lse[1].view, p.out[0].view, p.lse[0].view, ba.view, ba_lse.view)).ok());
  for (int64_t i = 0; i < ab.numel(); ++i) ASSERT_EQ(ab.at(i), ba.at(i)) << i;
  for (int64_t i = 0; i < ab_lse.numel(); ++i) ASSERT_EQ(ab_lse.at(i), ba_lse.at(i)) << i;

  // (a ∪ b) ∪ c against a ∪ (b ∪ c)
  HostTensor left = p.new_out(), left_lse = p.new_lse(), bc = p.new_out(), bc_lse = p.new_lse();
  HostTensor right = p.new_out(), right_lse = p.new_lse();
  ASSERT_TRUE(merge(merge_of(ab.view, ab_lse.view, p.out[2].view, p.lse[2].view, left.view, left_lse.view)).ok());
  ASSERT_TRUE(merge(merge_of(p.out[1].view, p.lse[1].view, p.out[2].view, p.lse[2].view, bc.view, bc_lse.view)).ok());
  ASSERT_TRUE(merge(merge_of(p.out[0].view, p.lse[0].view, bc.view, bc_lse.view, right.view, right_lse.view)).ok());
  constexpr float kRounding = 4 * std::numeric_limits<float>::epsilon();
  for (int64_t i = 0; i < left_lse.numel(); ++i) {
    if (std::isinf(left_lse.at(i))) EXPECT_EQ(left_lse.at(i), right_lse.at(i));
    else EXPECT_NEAR(left_lse.at(i), right_lse.at(i), kRounding * std::max(1.f, std::abs(left_lse.at(i)))) << i;
  }
  for (int64_t i = 0; i < left.numel(); ++i)
    EXPECT_NEAR(left.at(i), right.at(i), 8 * kRounding * std::max(1.f, std::abs(left.at(i)))) << i;
}

TEST(Merge, PartWithMinusInfinityIsTheIdentity) {
  const Parts p(1, fresh_seed());
  HostTensor empty_out = p.new_out(), empty_lse = p.new_lse(), out = p.new_out(), lse = p.new_lse();
  empty_out.fill(kNaN);  // never read: a side with lse = -inf contributes nothing
  empty_lse.fill(-kInf);
  for (bool empty_first : {true, false}) {
    MergeParams m = empty_first ? merge_of(empty_out.view, empty_lse.view, p.out[0].view, p.lse[0].view, out.view, lse.view)
                                : merge_of(p.out[0].view, p.lse[0].view, empty_out.view, empty_lse.view, out.view, lse.view);
    ASSERT_TRUE(merge(m).ok());
    for (int64_t r = 0; r < lse.numel(); ++r) ASSERT_EQ(lse.at(r), p.lse[0].at(r)) << r;
    // Rows where the part itself is -inf have no defined output; the others come through bit for bit.
    for (int64_t b = 0; b < Parts::kBatch; ++b)
      for (int64_t s = 0; s < Parts::kSeqlen; ++s)
        for (int64_t h = 0; h < Parts::kHeads; ++h) {
          const bool seen = !std::isinf(p.lse[0].at((b * Parts::kHeads + h) * Parts::kSeqlen + s));
          for (int64_t d = 0; d < Parts::kDim; ++d) {
            const int64_t i = ((b * Parts::kSeqlen + s) * Parts::kHeads + h) * Parts::kDim + d;
            if (seen) ASSERT_EQ(out.at(i), p.out[0].at(i)) << i;
            else ASSERT_EQ(out.at(i), 0.0f) << "both sides -inf: o = 0";
          }
        }
  }
}

// One row per case: the merged lse and out[0] for out_a = 1, out_b = 3 (out_b = NaN where unread).
TEST(Merge, ExtremeAndInfiniteLse) {
  struct Row {
    float lse_a, lse_b;
    float out_b;
    float lse, out;  // expected
  };
  const float log2 = std::log(2.f);
  const Row rows[] = {
      {-kInf, -kInf, kNaN, -kInf, 0.f},               // no key on either side
      {-kInf, 5.f, 3.f, 5.f, 3.f},                    // identity
      {1000.f, 1000.f, 3.f, 1000.f + log2, 2.f},      // exp(1000) overflows: must not be formed
      {-1000.f, -1000.f, 3.f, -1000.f + log2, 2.f},   // exp(-1000) underflows
      {3e38f, -3e38f, kNaN, 3e38f, 1.f},              // a difference that overflows to +inf: b weighs 0
      {kInf, kInf, 3.f, kInf, 2.f},                   // +inf both sides: an even split, not NaN
      {0.f, std::log(3.f), 3.f, std::log(4.f), 2.5f}, // weights 1/4 and 3/4
  };
  for (const Row& r : rows) {
    HostTensor oa(DType::fp32, {1, 1, 1, 2}), ob(DType::fp32, {1, 1, 1, 2}), la(DType::fp32, {1, 1, 1}),
        lb(DType::fp32, {1, 1, 1}), o(DType::fp32, {1, 1, 1, 2}), l(DType::fp32, {1, 1, 1});
    oa.fill(1.f);
    ob.fill(r.out_b);
    la.set(0, r.lse_a);
    lb.set(0, r.lse_b);
    ASSERT_TRUE(merge(merge_of(oa.view, la.view, ob.view, lb.view, o.view, l.view)).ok());
    SCOPED_TRACE("lse_a " + std::to_string(r.lse_a) + ", lse_b " + std::to_string(r.lse_b));
    if (std::isinf(r.lse)) EXPECT_EQ(l.at(0), r.lse);
    else EXPECT_NEAR(l.at(0), r.lse, 1e-6f * std::max(1.f, std::abs(r.lse)));
    EXPECT_NEAR(o.at(0), r.out, 1e-6f);
    EXPECT_NEAR(o.at(1), r.out, 1e-6f);
  }
  // NaN stays NaN: a broken part is not hidden.
  HostTensor oa(DType::fp32, {1, 1, 1, 1}), la(DType::fp32, {1, 1, 1}), o(DType::fp32, {1, 1, 1, 1}), l(DType::fp32, {1, 1, 1});
  oa.fill(1.f);
  la.set(0, kNaN);
  HostTensor ob(DType::fp32, {1, 1, 1, 1}), lb(DType::fp32, {1, 1, 1});
  lb.set(0, -kInf);
  ASSERT_TRUE(merge(merge_of(oa.view, la.view, ob.view, lb.view, o.view, l.view)).ok());
  EXPECT_TRUE(std::isnan(l.at(0)));
}

// ---- Layouts and in place ------------------------------------------------------------------------

TEST(Merge, PackedLayoutMatchesDenseAndInPlaceOnEitherSide) {
  const Parts p(2, fresh_seed());
  HostTensor dense = p.new_out(), dense_lse = p.new_lse();
  ASSERT_TRUE(merge(merge_of(p.out[0].view, p.lse[0].view, p.out[1].view, p.lse[1].view, dense.view, dense_lse.view)).ok());
  // Batch 0 of the dense parts as packed [total, H, Dv] / [H, total] views.
  auto packed_out = [](const Tensor& t) {
    return make_tensor(t.data, t.dtype, {Parts::kSeqlen, Parts::kHeads, Parts::kDim});
  };
  auto packed_lse = [](const Tensor& t) {
    return make_tensor(t.data, t.dtype, {Parts::kHeads, Parts::kSeqlen});
  };
  HostTensor b_out = p.out[1], b_lse = p.lse[1];
  b_out.view.data = b_out.storage.data();
  b_lse.view.data = b_lse.storage.data();
  // In place over b (the second operand).
  const Tensor out_b = packed_out(b_out.view), lse_b = packed_lse(b_lse.view);
  ASSERT_TRUE(merge(merge_of(packed_out(p.out[0].view), packed_lse(p.lse[0].view), out_b, lse_b, out_b, lse_b)).ok());
  for (int64_t i = 0; i < Parts::kSeqlen * Parts::kHeads * Parts::kDim; ++i) ASSERT_EQ(b_out.at(i), dense.at(i)) << i;
  for (int64_t i = 0; i < Parts::kHeads * Parts::kSeqlen; ++i) ASSERT_EQ(b_lse.at(i), dense_lse.at(i)) << i;
}

// ---- The gradient identity ------------------------------------------------------------------------

// Ring attention computes the backward over the union part by part: each part's backward, given the
// merged O and LSE (not its own), yields that part's dK, dV and a share of dQ that sum to the
// backward over the union.
TEST(Merge, PerPartBackwardsWithMergedOutputSumToTheWholeBackward) {
  Split split(2, 4, 2, 45, 100, 32, 16, {37});
  Params whole = split.whole.params(Backend::cpu);
  whole.causal = Causal::top_left;
  whole.q_offset = 30;
  whole.window_left = 60;
  const reference::BackwardResult oracle = reference::backward(whole);
  ASSERT_TRUE(forward(whole).ok());
  ASSERT_TRUE(backward(whole).ok());

  HostTensor merged_out(DType::fp32, {2, 45, 4, 16}), merged_lse(DType::fp32, {2, 4, 45});
  for (size_t i = 0; i < 2; ++i) ASSERT_TRUE(forward(split.part(i, whole)).ok());
  ASSERT_TRUE(merge(merge_of(split.out[0].view, split.lse[0].view, split.out[1].view, split.lse[1].view,
                             merged_out.view, merged_lse.view))
                  .ok());
  HostTensor dq_part[2] = {HostTensor(DType::fp32, {2, 45, 4, 32}), HostTensor(DType::fp32, {2, 45, 4, 32})};
  HostTensor dk(DType::fp32, {2, 100, 2, 32}), dv(DType::fp32, {2, 100, 2, 16});
  for (size_t i = 0; i < 2; ++i) {
    Params part = split.part(i, whole);
    part.o = merged_out.view;
    part.lse = merged_lse.view;
    part.dq = dq_part[i].view;
    part.dk = key_range(dk.view, split.bounds[i], split.bounds[i + 1]);
    part.dv = key_range(dv.view, split.bounds[i], split.bounds[i + 1]);
    ASSERT_TRUE(backward(part).ok());
  }
  auto rel_err = [](auto&& value, const std::vector<double>& ref) {
    double diff2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
      diff2 += (value(int64_t(i)) - ref[i]) * (value(int64_t(i)) - ref[i]);
      ref2 += ref[i] * ref[i];
    }
    return std::sqrt(diff2 / ref2);
  };
  constexpr double kTolerance = 1e-5;  // fp32 parts against the fp64 oracle
  EXPECT_LT(rel_err([&](int64_t i) { return double(dq_part[0].at(i)) + double(dq_part[1].at(i)); }, oracle.dq), kTolerance);
  EXPECT_LT(rel_err([&](int64_t i) { return double(dk.at(i)); }, oracle.dk), kTolerance);
  EXPECT_LT(rel_err([&](int64_t i) { return double(dv.at(i)); }, oracle.dv), kTolerance);
  // And the whole call's own backward agrees with the parts to the same rounding.
  EXPECT_LT(rel_err([&](int64_t i) { return double(dq_part[0].at(i)) + double(dq_part[1].at(i)); },
                    [&] {
                      std::vector<double> v(size_t(split.whole.dq.numel()));
                      for (size_t i = 0; i < v.size(); ++i) v[i] = split.whole.dq.at(int64_t(i));
                      return v;
                    }()),
            kTolerance);
}

// ---- Bad input -------------------------------------------------------------------------------------

TEST(Merge, BadInputIsRefusedAndNothingIsWritten) {
  constexpr float kSentinel = 777.f;
  struct Bad {
    const char* name;
    const char* mentions;
    void (*edit)(MergeParams&);
  };
  static HostTensor fp16_lse(DType::fp16, {2, 3, 33});
  static HostTensor short_out(DType::fp32, {2, 32, 3, 20});
  static HostTensor rank2(DType::fp32, {33, 20});
  static HostTensor packed_lse_wrong(DType::fp32, {2, 3, 33, 1});
  const Bad cases[] = {
      {"missing_out_a", "out_a: required", [](MergeParams& m) { m.out_a = Tensor{}; }},
      {"missing_lse", "lse: required", [](MergeParams& m) { m.lse = Tensor{}; }},
      {"rank", "out_a: expected a 4-d tensor", [](MergeParams& m) { m.out_a = rank2.view; }},
      {"lse_dtype", "lse_b: dtype must be fp32", [](MergeParams& m) { m.lse_b = fp16_lse.view; }},
      {"shape", "out_b: seqlen_q is 32, expected 33", [](MergeParams& m) { m.out_b = short_out.view; }},
      {"lse_rank", "lse_a: expected a 3-d tensor", [](MergeParams& m) { m.lse_a = packed_lse_wrong.view; }},
      {"device", "out: is on a different device than out_a",
       [](MergeParams& m) { m.out.device = Device{DeviceType::cuda, 0}; }},
      {"partial_overlap", "out: overlaps out_a",
       [](MergeParams& m) {
         m.out = m.out_a;
         m.out.data = static_cast<float*>(m.out_a.data) + 1;
       }},
      {"out_overlaps_lse", "lse: overlaps out",
       [](MergeParams& m) { m.lse = make_tensor(m.out.data, DType::fp32, {2, 3, 33}); }},
      {"num_threads", "num_threads", [](MergeParams& m) { m.num_threads = -2; }},
  };
  const Parts p(2, 11);
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.name);
    Parts fresh(2, 11);
    HostTensor out = p.new_out(), lse = p.new_lse();
    out.fill(kSentinel);
    lse.fill(kSentinel);
    MergeParams m = merge_of(fresh.out[0].view, fresh.lse[0].view, fresh.out[1].view, fresh.lse[1].view, out.view, lse.view);
    bad.edit(m);
    const Status s = merge(m);
    EXPECT_EQ(s.code, Code::invalid_argument) << s.message;
    EXPECT_NE(s.message.find(bad.mentions), std::string::npos) << "message: " << s.message;
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.at(i), kSentinel);
    for (int64_t i = 0; i < lse.numel(); ++i) ASSERT_EQ(lse.at(i), kSentinel);
    for (size_t k = 0; k < 2; ++k) {
      for (int64_t i = 0; i < p.out[k].numel(); ++i) ASSERT_EQ(fresh.out[k].at(i), p.out[k].at(i));
      for (int64_t i = 0; i < p.lse[k].numel(); ++i)
        ASSERT_TRUE(fresh.lse[k].at(i) == p.lse[k].at(i) || (std::isinf(p.lse[k].at(i)) && std::isinf(fresh.lse[k].at(i))));
    }
  }
}

}  // namespace
}  // namespace fmha
