// The fast CPU path against the fp64 oracle, forward and backward, over odd shapes and every
// option, under the one tolerance rule (src/common/tolerance.h). Inputs are fresh random data on
// every run (the seed is printed on failure); outputs are poisoned before each call. Every kernel
// test runs once per instruction-set path compiled in (FMHA_CPU_ISA forced to it), and skips the
// paths this CPU cannot run.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/tolerance.h"
#include "cpu/reference.h"
#include "cpu_path.h"
#include "harness.h"
#include "test_util.h"

namespace fmha::tools {
namespace {

uint64_t fresh_seed() {
  return uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count()) & 0xffffffffull;
}

std::string describe(const CaseSpec& c) {
  std::ostringstream out;
  if (const char* path = getenv("FMHA_CPU_ISA")) out << "FMHA_CPU_ISA=" << path << " ";
  out << "fmha run --backend " << to_string(c.backend) << " --mode " << to_string(c.mode) << " --dtype "
      << c.dtype_name() << " --batch " << c.batch << " --heads " << c.heads << " --kv-heads " << c.kv_heads
      << " --seqlen-q " << c.seqlen_q << " --seqlen-k " << c.seqlen_k << " --head-dim " << c.head_dim
      << " --head-dim-v " << c.head_dim_v << " --causal " << to_string(c.causal) << " --window " << c.window_left
      << "," << c.window_right << " --q-offset " << c.q_offset << " --seed " << c.seed
      << (c.deterministic ? " --deterministic" : "") << (c.with_lse ? "" : " --no-lse");
  if (c.paged()) out << " --paged --page-size " << c.page_size;
  out << " --check";
  return out.str();
}

CheckResult run_and_check(CaseSpec c) {
  c.seed = fresh_seed();
  Harness h(c, Device{});
  const Status s = h.run_once();
  EXPECT_TRUE(s.ok()) << s.message << "\n  " << describe(h.spec());
  if (!s.ok()) return {};
  const CheckResult r = h.check();
  EXPECT_TRUE(r.pass) << r.failure << " (rel_err " << r.rel_err << ", tolerance " << r.tolerance << ")\n  "
                      << describe(h.spec());
  return r;
}

// Skips the test when this CPU cannot run `path`; otherwise forces it for the test's scope.
#define FORCE_CPU_PATH_OR_SKIP(path)                                                          \
  if (!::fmha::testing::cpu_runs(path)) GTEST_SKIP() << "this CPU cannot run the " << (path) << " path"; \
  const ::fmha::testing::ForceCpuPath force_cpu_path(path)

const std::vector<std::string> kPaths = ::fmha::testing::compiled_cpu_paths();

CaseSpec base_case() {
  CaseSpec c;
  c.backend = Backend::cpu;
  c.batch = 1;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 64;
  return c;
}

// ---- Every pair of odd sequence lengths, causal alignments in turn, forward and backward -------

class SeqlenPairs : public ::testing::TestWithParam<std::tuple<std::string, int64_t, int64_t>> {};

TEST_P(SeqlenPairs, ForwardAndBackwardMatchOracle) {
  const auto [path, seqlen_q, seqlen_k] = GetParam();
  FORCE_CPU_PATH_OR_SKIP(path);
  const Causal alignments[] = {Causal::none, Causal::top_left, Causal::bottom_right};
  const Causal causal = alignments[(seqlen_q * 7 + seqlen_k) % 3];
  for (Direction mode : {Direction::forward, Direction::backward}) {
    CaseSpec c = base_case();
    c.seqlen_q = seqlen_q;
    c.seqlen_k = seqlen_k;
    c.causal = causal;
    c.mode = mode;
    run_and_check(c);
  }
}

const int64_t kOddLengths[] = {1, 15, 63, 64, 65, 1013};
INSTANTIATE_TEST_SUITE_P(Cpu, SeqlenPairs,
                         ::testing::Combine(::testing::ValuesIn(kPaths), ::testing::ValuesIn(kOddLengths),
                                            ::testing::ValuesIn(kOddLengths)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_q" + std::to_string(std::get<1>(info.param)) + "_k" +
                                  std::to_string(std::get<2>(info.param));
                         });

// ---- Both causal alignments at Sq != Sk, each direction ------------------------------------------

class CpuPath : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuPath, CausalAlignmentsWithUnequalLengths) {
  FORCE_CPU_PATH_OR_SKIP(GetParam());
  for (Causal causal : {Causal::top_left, Causal::bottom_right})
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{100, 37}, {37, 100}, {129, 130}})
      for (Direction mode : {Direction::forward, Direction::backward}) {
        CaseSpec c = base_case();
        c.seqlen_q = sq;
        c.seqlen_k = sk;
        c.causal = causal;
        c.mode = mode;
        run_and_check(c);
      }
}

// ---- Sequences longer than the CPU path's conversion blocks (2048 keys / queries) -----------------

TEST_P(CpuPath, LongSequencesCrossConversionBlocks) {
  FORCE_CPU_PATH_OR_SKIP(GetParam());
  struct Long {
    int64_t sq, sk;
    Causal causal;
    int64_t left;
  };
  for (Long l : {Long{2100, 4200, Causal::none, -1}, Long{4100, 2090, Causal::bottom_right, -1},
                 Long{2300, 2300, Causal::top_left, 700}})
    for (Direction mode : {Direction::forward, Direction::backward}) {
      CaseSpec c = base_case();
      c.heads = c.kv_heads = 1;
      c.head_dim = 32;
      c.seqlen_q = l.sq;
      c.seqlen_k = l.sk;
      c.causal = l.causal;
      c.window_left = l.left;
      c.mode = mode;
      run_and_check(c);
    }
}

// bf16 storage at odd lengths and head dims: on the avx512bf16 path the forward multiplies the
// stored bf16 values (vdpbf16ps), with its own operand layouts and padding.
TEST_P(CpuPath, Bf16OddShapes) {
  FORCE_CPU_PATH_OR_SKIP(GetParam());
  struct Shape {
    int64_t sq, sk, head_dim, head_dim_v;
    Causal causal;
  };
  for (Shape shape : {Shape{1, 1, 64, 64, Causal::none}, Shape{15, 1013, 32, 32, Causal::bottom_right},
                      Shape{65, 63, 128, 128, Causal::top_left}, Shape{1013, 15, 64, 64, Causal::none},
                      Shape{70, 2100, 15, 17, Causal::none}, Shape{130, 129, 256, 40, Causal::bottom_right}})
    for (Direction mode : {Direction::forward, Direction::backward}) {
      CaseSpec c = base_case();
      c.dtype = DType::bf16;
      c.seqlen_q = shape.sq;
      c.seqlen_k = shape.sk;
      c.head_dim = shape.head_dim;
      c.head_dim_v = shape.head_dim_v;
      c.causal = shape.causal;
      c.mode = mode;
      run_and_check(c);
    }
}

// bf16 inputs through strided views whose rows lie an odd number of elements apart ([B, H, S, D]
// storage, each row padded by 3): the bf16 operands are copied into their layouts by register
// blocks (32 rows by 32 dims, 16 rows by 16 dim pairs, two rows interleaved) with element-wise
// edges, from whatever row the mask makes a key block start at; the result must be bitwise the
// contiguous call's. Head dim 80 leaves a 16-dim edge after the blocks; the window makes key
// blocks start at odd rows.
TEST_P(CpuPath, Bf16StridedViewsGiveTheContiguousResultBitwise) {
  FORCE_CPU_PATH_OR_SKIP(GetParam());
  using ::fmha::testing::HostTensor;
  const int64_t B = 2, H = 4, Hkv = 2, Sq = 150, Sk = 333, D = 80, kPad = 3;
  ::fmha::testing::Problem pr(B, H, Hkv, Sq, Sk, D, D, DType::bf16, fresh_seed());
  Params p = pr.params();
  p.causal = Causal::bottom_right;
  p.window_left = 37;
  ASSERT_TRUE(forward(p).ok());
  ASSERT_TRUE(backward(p).ok());
  // The same values in [B, H, S, D + kPad] storage, seen as [B, S, H, D].
  std::vector<std::vector<uint16_t>> storage;
  const auto strided = [&](const Tensor& t) {
    const int64_t heads = t.shape[2], seqlen = t.shape[1], ld = D + kPad;
    std::vector<uint16_t>& words = storage.emplace_back(size_t(B * heads * seqlen * ld), uint16_t{0xffff});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < seqlen; ++s)
        for (int64_t h = 0; h < heads; ++h)
          std::memcpy(&words[size_t(((b * heads + h) * seqlen + s) * ld)],
                      static_cast<const uint16_t*>(t.data) + ((b * seqlen + s) * heads + h) * D, D * sizeof(uint16_t));
    return make_tensor(words.data(), DType::bf16, {B, seqlen, heads, D}, {heads * seqlen * ld, ld, seqlen * ld, 1});
  };
  HostTensor o(DType::bf16, {B, Sq, H, D}), lse(DType::fp32, {B, H, Sq}), dq(DType::bf16, {B, Sq, H, D}),
      dk(DType::bf16, {B, Sk, Hkv, D}), dv(DType::bf16, {B, Sk, Hkv, D});
  for (HostTensor* t : {&o, &lse, &dq, &dk, &dv}) t->fill(1e4f);  // poison
  Params t = p;
  t.q = strided(p.q), t.k = strided(p.k), t.v = strided(p.v), t.dout = strided(p.dout);
  t.o = o.view, t.lse = lse.view;
  ASSERT_TRUE(forward(t).ok());
  EXPECT_EQ(o.bytes(), pr.o.bytes());
  EXPECT_EQ(lse.bytes(), pr.lse.bytes());
  t.o = pr.o.view, t.lse = pr.lse.view;  // the backward from the contiguous forward's O and LSE
  t.dq = dq.view, t.dk = dk.view, t.dv = dv.view;
  ASSERT_TRUE(backward(t).ok());
  EXPECT_EQ(dq.bytes(), pr.dq.bytes());
  EXPECT_EQ(dk.bytes(), pr.dk.bytes());
  EXPECT_EQ(dv.bytes(), pr.dv.bytes());
}

// Scores whose row max climbs tile after tile, by just under the forward's stale-max allowance
// (8 in exp2's units: src/cpu/fast_attention.cpp, kStaleMaxLog2) and by more, and falls back:
// the running max trails the true one, the sums and O^T are taken against it and rescaled only
// on the larger climbs. O and LSE against the oracle under the usual rule, fp32 and bf16.
TEST_P(CpuPath, ForwardWithAClimbingRowMaxMatchesOracle) {
  FORCE_CPU_PATH_OR_SKIP(GetParam());
  constexpr int64_t kTile = 64;
  // A tile's scores in exp2's units, centred on 0 so that their own fp32 rounding stays small.
  const double climb[] = {-12.0, -4.1, 3.8, 4.0, -6.0, 12.4, 8.0, -9.0, 12.5, 0.0};
  const int64_t B = 1, H = 2, Sq = 100, Sk = kTile * int64_t(std::size(climb)), D = 64;
  for (DType dtype : {DType::fp32, DType::bf16}) {
    const uint64_t seed = fresh_seed();
    ::fmha::testing::Problem pr(B, H, H, Sq, Sk, D, D, dtype, seed);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    const float scale = 1.0f / std::sqrt(float(D)), log2e = 1.4426950408889634f;
    // q·k·scale·log2(e) ≈ climb[key / 64] + noise, through the first dim; the others add a little.
    for (int64_t i = 0; i < pr.q.numel(); ++i)
      pr.q.set(i, i % D == 0 ? 1.0f + 0.001f * float(i / D) : 0.1f * normal(rng));
    for (int64_t i = 0; i < pr.k.numel(); ++i) {
      const int64_t key = i / (H * D) % Sk;
      pr.k.set(i, i % D == 0 ? float(climb[key / kTile]) / (scale * log2e) + 0.3f * normal(rng) : 0.1f * normal(rng));
    }
    Params p = pr.params();
    pr.o.fill(1e4f);
    pr.lse.fill(1e4f);
    ASSERT_TRUE(forward(p).ok());
    const reference::ForwardResult ref = reference::forward(p, 1);
    double err = 0.0, norm = 0.0, lse_err = 0.0;
    for (int64_t i = 0; i < pr.o.numel(); ++i) {
      err += (pr.o.at(i) - ref.o[size_t(i)]) * (pr.o.at(i) - ref.o[size_t(i)]);
      norm += ref.o[size_t(i)] * ref.o[size_t(i)];
    }
    for (int64_t i = 0; i < pr.lse.numel(); ++i)
      lse_err = std::max(lse_err, std::abs(pr.lse.at(i) - ref.lse[size_t(i)]) /
                                      std::max(1.0, std::abs(ref.lse[size_t(i)])));
    const double tol = tolerance(dtype, Precision::ieee, Direction::forward);
    EXPECT_LE(std::sqrt(err / norm), tol) << to_string(dtype) << ", seed " << seed;
    EXPECT_LE(lse_err, tol) << to_string(dtype) << ", seed " << seed;
  }
}

// ---- Short backward calls: exponent tiles kept from the statistics pass (ScoreCache) ---------------
// A call keeps its tiles while all of them, every (batch, head) together, fit 8 MiB (cpu_config.h,
// kScoreCacheBytes): 16 KiB per 64 x 64 tile, so 512 tiles. Cases on both sides of that budget.

struct ShortCall {
  const char* name;
  int64_t batch, heads, kv_heads, sq, sk, head_dim;
  Causal causal;
  int64_t window_left, q_offset;
  DType dtype;
  bool kept;  // under the budget
};

int64_t score_tiles(const ShortCall& c) { return c.batch * c.heads * ((c.sq + 63) / 64) * ((c.sk + 63) / 64); }

const ShortCall kShortCalls[] = {
    {"b1_h4_s192_d128", 1, 4, 4, 192, 192, 128, Causal::none, -1, 0, DType::fp32, true},
    {"gqa_causal_unequal", 2, 4, 2, 100, 130, 64, Causal::bottom_right, -1, 0, DType::fp32, true},
    {"window_offset", 1, 2, 1, 150, 200, 40, Causal::top_left, 33, 20, DType::fp32, true},
    {"bf16_gqa", 1, 8, 2, 65, 127, 64, Causal::none, -1, 0, DType::bf16, true},
    {"decode_keys_in_parts", 1, 8, 1, 2, 3001, 64, Causal::bottom_right, -1, 0, DType::fp32, true},
    // Parts of the keys that the window leaves without a key, beside the part that has its first.
    {"decode_window_parts", 1, 8, 1, 3, 3001, 64, Causal::bottom_right, 500, 0, DType::bf16, true},
    // Many short heads: the budget counts tiles, the oracle's cost stays small.
    {"at_the_budget", 4, 32, 8, 65, 65, 16, Causal::none, -1, 0, DType::fp32, true},           // 512 tiles
    {"over_the_budget", 5, 26, 13, 65, 65, 16, Causal::none, -1, 0, DType::fp32, false},       // 520 tiles
    {"over_the_budget_bf16", 5, 26, 13, 65, 65, 32, Causal::bottom_right, -1, 0, DType::bf16, false},  // 520
};

// A host tensor's elements as bytes (the harness's tensors are contiguous).
std::string tensor_bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.data), size_t(t.numel()) * dtype_size(t.dtype));
}

CaseSpec short_call_case(const ShortCall& shape) {
  CaseSpec c = base_case();
  c.batch = shape.batch;
  c.heads = shape.heads;
  c.kv_heads = shape.kv_heads;
  c.seqlen_q = shape.sq;
  c.seqlen_k = shape.sk;
  c.head_dim = shape.head_dim;
  c.causal = shape.causal;
  c.window_left = shape.window_left;
  c.q_offset = shape.q_offset;
  c.dtype = shape.dtype;
  c.mode = Direction::backward;
  return c;
}

TEST_P(CpuPath, ShortCallsBackwardMatchesOracleOnBothSidesOfTheScoreBudget) {
  FORCE_CPU_PATH_OR_SKIP(GetParam());
  for (const ShortCall& shape : kShortCalls) {
    ASSERT_EQ(score_tiles(shape) <= 512, shape.kept) << shape.name << ": the case is on the wrong side of the budget";
    SCOPED_TRACE(shape.name);
    run_and_check(short_call_case(shape));
  }
}

// The backward of `c` under the default configuration and under `recompute` (a separate
// statistics pass, S^T formed again by the fused pass, 8-tile key chunks): the same bits for dK and
// dV, and for dQ where `same_dq` (its sum follows how the keys are cut into chunks).
void expect_the_bits_of_recompute(CaseSpec c, bool same_dq) {
  c.seed = fresh_seed();
  Harness default_run(c, Device{});
  ASSERT_TRUE(default_run.run_once().ok());
  setenv("FMHA_CPU_CONFIG", "recompute", 1);
  Harness recomputed(c, Device{});
  const Status s = recomputed.run_once();
  unsetenv("FMHA_CPU_CONFIG");
  ASSERT_TRUE(s.ok()) << s.message;
  const Params a = default_run.params(), b = recomputed.params();
  if (same_dq) EXPECT_EQ(tensor_bytes(a.dq), tensor_bytes(b.dq)) << "dq\n  " << describe(c);
  EXPECT_EQ(tensor_bytes(a.dk), tensor_bytes(b.dk)) << "dk\n  " << describe(c);
  EXPECT_EQ(tensor_bytes(a.dv), tensor_bytes(b.dv)) << "dv\n  " << describe(c);
}

// A kept tile is the matmul's output as the fused pass forms it: the gradients are the same bits
// whether the call keeps its tiles or (variant `recompute`) forms them again.
TEST_P(CpuPath, ShortCallsKeptScoresGiveTheBitsOfRecomputedOnes) {
  FORCE_CPU_PATH_OR_SKIP(GetParam());
  for (const ShortCall& shape : kShortCalls) {
    if (!shape.kept) continue;
    SCOPED_TRACE(shape.name);
    expect_the_bits_of_recompute(short_call_case(shape), true);
  }
}

// Calls over the score budget whose heads alone give every thread its items: each fused item then
// spans its head's keys and forms its queries' statistics itself (own statistics). Against the
// oracle; and against the separate statistics pass (variant `recompute`) the same bits for dK and
// dV, whose sums do not depend on how the keys are cut, and for dQ where the keys are one chunk
// either way (at most 8 tiles; on a machine with more threads than these heads can keep busy,
// both variants cut the keys alike and every output must match).
const ShortCall kOwnStatsCalls[] = {
    {"fp32_gqa_causal", 4, 16, 8, 65, 260, 32, Causal::bottom_right, -1, 0, DType::fp32, false},     // 640 tiles
    {"bf16_gqa_causal", 4, 16, 8, 65, 260, 32, Causal::bottom_right, -1, 0, DType::bf16, false},
    {"fp16_window_offset", 4, 16, 16, 70, 300, 32, Causal::top_left, 70, -30, DType::fp16, false},  // 640 tiles
    // 18 key tiles: one chunk a head here, three under `recompute`
    {"fp32_long_keys", 2, 8, 8, 65, 1100, 32, Causal::none, -1, 0, DType::fp32, false},
    {"bf16_long_keys", 2, 8, 8, 65, 1100, 32, Causal::none, -1, 0, DType::bf16, false},
};

TEST_P(CpuPath, BackwardWithOwnStatisticsMatchesOracleAndTheStatisticsPass) {
  FORCE_CPU_PATH_OR_SKIP(GetParam());
  for (const ShortCall& shape : kOwnStatsCalls) {
    SCOPED_TRACE(shape.name);
    ASSERT_GT(score_tiles(shape), 512) << "under the score budget";
    const CaseSpec c = short_call_case(shape);
    run_and_check(c);
    expect_the_bits_of_recompute(c, c.seqlen_k <= 512);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, CpuPath, ::testing::ValuesIn(kPaths), [](const auto& info) { return info.param; });

// ---- Head dims x storage dtypes ---------------------------------------------------------------------

class HeadDimsAndDtypes : public ::testing::TestWithParam<std::tuple<std::string, int64_t, std::string>> {};

TEST_P(HeadDimsAndDtypes, ForwardAndBackwardMatchOracle) {
  const auto [path, head_dim, dtype] = GetParam();
  FORCE_CPU_PATH_OR_SKIP(path);
  for (Direction mode : {Direction::forward, Direction::backward}) {
    CaseSpec c = base_case();
    c.seqlen_q = 65;
    c.seqlen_k = 127;
    c.head_dim = head_dim;
    c.causal = Causal::bottom_right;
    parse(dtype == "tf32" ? "fp32" : dtype, &c.dtype);
    c.precision = dtype == "tf32" ? Precision::tf32 : Precision::ieee;
    c.mode = mode;
    run_and_check(c);
  }
}

const int64_t kHeadDims[] = {32, 64, 96, 128, 192, 256};
INSTANTIATE_TEST_SUITE_P(Cpu, HeadDimsAndDtypes,
                         ::testing::Combine(::testing::ValuesIn(kPaths), ::testing::ValuesIn(kHeadDims),
                                            ::testing::Values("fp32", "tf32", "fp16", "bf16")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_d" + std::to_string(std::get<1>(info.param)) + "_" +
                                  std::get<2>(info.param);
                         });

// ---- Options ------------------------------------------------------------------------------------------

struct OptionCase {
  const char* name;
  CaseSpec spec;
};

std::vector<OptionCase> option_cases() {
  std::vector<OptionCase> cases;
  auto add = [&](const char* name, auto&& edit) {
    CaseSpec c = base_case();
    c.seqlen_q = 150;
    c.seqlen_k = 200;
    edit(c);
    cases.push_back({name, c});
  };
  add("window_both_sides", [](CaseSpec& c) { c.window_left = 17; c.window_right = 5; });
  add("window_left_only", [](CaseSpec& c) { c.window_left = 40; });
  add("window_right_only", [](CaseSpec& c) { c.window_right = 3; });
  add("window_zero_zero", [](CaseSpec& c) { c.window_left = 0; c.window_right = 0; });
  add("causal_with_window", [](CaseSpec& c) { c.causal = Causal::bottom_right; c.window_left = 30; });
  add("causal_top_left_window", [](CaseSpec& c) { c.causal = Causal::top_left; c.window_left = 9; c.window_right = 0; });
  add("q_offset_positive", [](CaseSpec& c) { c.causal = Causal::top_left; c.q_offset = 50; });
  add("q_offset_negative", [](CaseSpec& c) { c.causal = Causal::top_left; c.q_offset = -20; });
  add("q_offset_window", [](CaseSpec& c) { c.q_offset = 70; c.window_left = 25; c.window_right = 10; });
  add("q_offset_beyond_keys", [](CaseSpec& c) { c.causal = Causal::bottom_right; c.q_offset = -260; });
  add("gqa_8", [](CaseSpec& c) { c.heads = 8; c.kv_heads = 1; });
  add("gqa_2", [](CaseSpec& c) { c.heads = 4; c.kv_heads = 2; c.batch = 2; });
  add("mha", [](CaseSpec& c) { c.heads = 3; c.kv_heads = 3; });
  add("head_dim_v_larger", [](CaseSpec& c) { c.head_dim = 64; c.head_dim_v = 128; });
  add("head_dim_v_smaller", [](CaseSpec& c) { c.head_dim = 128; c.head_dim_v = 32; });
  add("head_dim_odd", [](CaseSpec& c) { c.head_dim = 40; c.head_dim_v = 24; });
  add("custom_scale", [](CaseSpec& c) { c.softmax_scale = 0.3f; });
  add("no_lse", [](CaseSpec& c) { c.with_lse = false; });
  add("single_thread", [](CaseSpec& c) { c.num_threads = 1; });
  add("many_threads", [](CaseSpec& c) { c.num_threads = 7; });
  add("deterministic", [](CaseSpec& c) { c.deterministic = true; });
  add("bf16_gqa_window", [](CaseSpec& c) { c.dtype = DType::bf16; c.heads = 8; c.kv_heads = 2; c.window_left = 33; });
  add("fp16_causal_offset", [](CaseSpec& c) { c.dtype = DType::fp16; c.causal = Causal::top_left; c.q_offset = 31; });
  add("tf32_causal", [](CaseSpec& c) { c.precision = Precision::tf32; c.causal = Causal::bottom_right; });
  add("tf32x3_causal", [](CaseSpec& c) { c.precision = Precision::tf32x3; c.causal = Causal::bottom_right; });
  add("tf32x3_gqa_window", [](CaseSpec& c) {
    c.precision = Precision::tf32x3; c.heads = 8; c.kv_heads = 2; c.window_left = 20; c.deterministic = true;
  });
  return cases;
}

void PrintTo(const OptionCase& c, std::ostream* os) { *os << c.name; }

// The case forward, then backward (with LSE), each against the oracle.
void check_both_directions(const OptionCase& option) {
  for (Direction mode : {Direction::forward, Direction::backward}) {
    CaseSpec c = option.spec;
    c.mode = mode;
    if (mode == Direction::backward) c.with_lse = true;
    run_and_check(c);
  }
}

class Options : public ::testing::TestWithParam<std::tuple<std::string, OptionCase>> {};

TEST_P(Options, ForwardAndBackwardMatchOracle) {
  const auto& [path, option] = GetParam();
  FORCE_CPU_PATH_OR_SKIP(path);
  check_both_directions(option);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Options, ::testing::Combine(::testing::ValuesIn(kPaths), ::testing::ValuesIn(option_cases())),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::string(std::get<1>(info.param).name);
                         });

// ---- Decode-shaped calls ----------------------------------------------------------------------------
// A few query rows against many keys on one KV head: the forward cuts the keys into parts that run
// on different threads and merges them (fast_attention.cpp, key_parts); with one item of query
// tiles it does so on every machine once the keys span at least two parts of 256.

std::vector<OptionCase> decode_cases() {
  std::vector<OptionCase> cases;
  auto add = [&](const char* name, auto&& edit) {
    CaseSpec c = base_case();
    c.seqlen_q = 1;
    c.seqlen_k = 3001;
    edit(c);
    cases.push_back({name, c});
  };
  add("one_row", [](CaseSpec&) {});
  add("rows_16_causal", [](CaseSpec& c) { c.seqlen_q = 16; c.causal = Causal::bottom_right; });
  add("rows_5_window", [](CaseSpec& c) { c.seqlen_q = 5; c.causal = Causal::bottom_right; c.window_left = 700; });
  add("keys_1013_no_lse", [](CaseSpec& c) { c.seqlen_k = 1013; c.with_lse = false; });
  add("rows_beyond_keys", [](CaseSpec& c) { c.seqlen_q = 3; c.causal = Causal::top_left; c.q_offset = -2; });
  add("gqa_8_bf16", [](CaseSpec& c) { c.dtype = DType::bf16; c.heads = 8; c.seqlen_q = 2; });
  // The query heads of a KV group packed into one tile (fewer than 64 rows per head): GQA ratios
  // 1 (nothing to pack), 4 and 8, tiles that hold several heads' rows or split one head's rows
  // (20 rows x 4 heads: 64 + 16), masks, q_offset, fp32 and bf16, a paged cache. Items of at most
  // 8 queries (one_row, keys_1013_no_lse, rows_beyond_keys, gqa_*_one_row, gqa_4_paged) take the
  // row-major forward, the others the query-major one (fast_attention.cpp, forward_chunk_rows and
  // forward_chunk).
  add("gqa_1_one_row", [](CaseSpec& c) { c.heads = c.kv_heads = 2; });
  add("gqa_4_one_row", [](CaseSpec& c) { c.heads = 8; c.kv_heads = 2; c.batch = 2; });
  add("gqa_8_one_row", [](CaseSpec& c) { c.heads = 8; });
  add("gqa_8_rows_16_causal", [](CaseSpec& c) { c.heads = 8; c.seqlen_q = 16; c.causal = Causal::bottom_right; });
  add("gqa_4_rows_20_window_offset", [](CaseSpec& c) {
    c.heads = 4;
    c.seqlen_q = 20;
    c.causal = Causal::top_left;
    c.q_offset = 2900;
    c.window_left = 300;
  });
  add("gqa_8_rows_3_bf16_window", [](CaseSpec& c) {
    c.dtype = DType::bf16;
    c.heads = 8;
    c.seqlen_q = 3;
    c.causal = Causal::bottom_right;
    c.window_left = 500;
  });
  add("gqa_4_paged", [](CaseSpec& c) { c.heads = 8; c.kv_heads = 2; c.seqlen_q = 2; c.page_size = 64; });
  add("gqa_8_paged_bf16_causal", [](CaseSpec& c) {
    c.dtype = DType::bf16;
    c.heads = 8;
    c.seqlen_q = 4;
    c.causal = Causal::bottom_right;
    c.page_size = 128;
  });
  return cases;
}

class Decode : public ::testing::TestWithParam<std::tuple<std::string, OptionCase>> {};

TEST_P(Decode, ForwardAndBackwardMatchOracle) {
  const auto& [path, option] = GetParam();
  FORCE_CPU_PATH_OR_SKIP(path);
  if (!option.spec.paged()) return check_both_directions(option);
  CaseSpec c = option.spec;  // a paged KV cache: forward only
  c.mode = Direction::forward;
  run_and_check(c);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Decode,
                         ::testing::Combine(::testing::ValuesIn(kPaths), ::testing::ValuesIn(decode_cases())),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::string(std::get<1>(info.param).name);
                         });

// ---- The check itself can fail ----------------------------------------------------------------------

TEST(CpuAttention, CheckRejectsAWrongResult) {
  for (Direction mode : {Direction::forward, Direction::backward}) {
    CaseSpec c = base_case();
    c.seqlen_q = c.seqlen_k = 70;
    c.mode = mode;
    c.seed = fresh_seed();
    Harness h(c, Device{});
    ASSERT_TRUE(h.run_once().ok());
    EXPECT_TRUE(h.check().pass);
    h.perturb_result_for_testing(1.001f);
    EXPECT_FALSE(h.check().pass) << "a 0.1% error passed the fp32 check";
  }
}

// ---- The harness's inputs ---------------------------------------------------------------------------

// The benchmark harness fills its inputs in blocks on every core: a seed gives the same values on
// every run, the values are N(0, 1), and neither the tensors nor the blocks repeat one another.
TEST(HarnessInputs, SameSeedSameValuesNormalAndNoBlockRepeated) {
  CaseSpec c = base_case();
  c.heads = c.kv_heads = 4;
  c.seqlen_q = c.seqlen_k = 4096;  // 1M elements a tensor: 16 of the fill's 64k-element blocks
  c.seed = fresh_seed();
  const Harness a(c, Device{}), b(c, Device{});
  const Params pa = a.params(), pb = b.params();
  EXPECT_EQ(tensor_bytes(pa.q), tensor_bytes(pb.q)) << "seed " << c.seed;
  EXPECT_EQ(tensor_bytes(pa.v), tensor_bytes(pb.v)) << "seed " << c.seed;
  EXPECT_NE(tensor_bytes(pa.q), tensor_bytes(pa.k));
  const float* q = static_cast<const float*>(pa.q.data);
  const int64_t n = pa.q.numel(), block = int64_t(1) << 16;
  EXPECT_NE(std::string(reinterpret_cast<const char*>(q), block * 4),
            std::string(reinterpret_cast<const char*>(q + block), block * 4));
  double sum = 0, squares = 0;
  for (int64_t i = 0; i < n; ++i) sum += q[i], squares += double(q[i]) * q[i];
  const double mean = sum / double(n), variance = squares / double(n) - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5e-3) << "seed " << c.seed;  // 5 standard errors at 1M samples
  EXPECT_NEAR(variance, 1.0, 8e-3) << "seed " << c.seed;
}

// ---- Reference backend and determinism --------------------------------------------------------------

TEST(CpuAttention, ReferenceBackendMatchesOracle) {
  for (Direction mode : {Direction::forward, Direction::backward}) {
    CaseSpec c = base_case();
    c.backend = Backend::reference;
    c.seqlen_q = 33;
    c.seqlen_k = 47;
    c.causal = Causal::bottom_right;
    c.mode = mode;
    run_and_check(c);
  }
}

TEST(CpuAttention, AutoSelectsCpuBackendForHostTensors) {
  CaseSpec c = base_case();
  c.backend = Backend::auto_select;
  c.seqlen_q = c.seqlen_k = 20;
  Harness h(c, Device{});
  ASSERT_TRUE(h.run_once().ok());
  EXPECT_EQ(h.backend_used(), Backend::cpu);
}

}  // namespace
}  // namespace fmha::tools
