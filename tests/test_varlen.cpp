// Variable-length (packed) batches: every CPU backend against the fp64 oracle run one sequence at a
// time (the harness's check), over tables with empty sequences, a single sequence, length-1
// sequences and a thousand short ones, every mask, negative softmax scales; a packed batch of
// equal lengths against the dense call; and bad sequence tables refused with an error that names
// them, writing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_path.h"
#include "cuda/sm90/sm90_packed_tiles.h"
#include "harness.h"
#include "packed_walk.h"
#include "test_util.h"

namespace fmha {
namespace {

using tools::CaseSpec;
using tools::CheckResult;
using tools::Harness;

uint64_t fresh_seed() {
  return uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count()) & 0xffffffffull;
}

std::string join(const std::vector<int64_t>& lengths) {
  std::string out;
  for (size_t i = 0; i < lengths.size(); ++i) out += (i ? "," : "") + std::to_string(lengths[i]);
  return out;
}

std::string describe(const CaseSpec& c) {
  std::ostringstream out;
  if (const char* path = getenv("FMHA_CPU_ISA")) out << "FMHA_CPU_ISA=" << path << " ";
  out << "fmha run --backend " << to_string(c.backend) << " --mode " << to_string(c.mode) << " --dtype "
      << c.dtype_name() << " --heads " << c.heads << " --kv-heads " << c.kv_heads << " --seqlens-q "
      << join(c.seqlens_q) << " --seqlens-k " << join(c.seqlens_k.empty() ? c.seqlens_q : c.seqlens_k)
      << " --head-dim " << c.head_dim << " --head-dim-v " << c.head_dim_v << " --causal " << to_string(c.causal)
      << " --window " << c.window_left << "," << c.window_right << " --q-offset " << c.q_offset;
  if (c.softmax_scale != 0.f) out << " --scale " << c.softmax_scale;
  out << " --seed " << c.seed << " --check";
  return out.str();
}

void run_and_check(CaseSpec c) {
  c.seed = fresh_seed();
  Harness h(c, Device{});
  const Status s = h.run_once();
  ASSERT_TRUE(s.ok()) << s.message << "\n  " << describe(h.spec());
  const CheckResult r = h.check();
  EXPECT_TRUE(r.pass) << r.failure << " (rel_err " << r.rel_err << ", tolerance " << r.tolerance << ")\n  "
                      << describe(h.spec());
}

CaseSpec varlen_case(Backend backend, std::vector<int64_t> seqlens_q, std::vector<int64_t> seqlens_k) {
  CaseSpec c;
  c.backend = backend;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 32;
  c.head_dim_v = 24;
  c.seqlens_q = std::move(seqlens_q);
  c.seqlens_k = std::move(seqlens_k);
  return c;
}

// Empty sequences on either side and both, lengths around the CPU path's 64-row tiles.
const std::vector<int64_t> kMixedQ = {70, 0, 13, 1, 0, 129, 64};
const std::vector<int64_t> kMixedK = {33, 45, 0, 1, 0, 200, 65};

// Parameterised by the backend's name, which the test names then show.
class VarlenBackend : public ::testing::TestWithParam<std::string> {
 protected:
  Backend backend() const {
    Backend b{};
    EXPECT_TRUE(parse(GetParam(), &b)) << GetParam();
    return b;
  }
};

// Every mask option applies within each sequence: the alignments use that sequence's own lengths.
TEST_P(VarlenBackend, MixedLengthsEveryMaskMatchOracle) {
  struct Mask {
    Causal causal;
    int64_t left, right, q_offset;
  };
  for (Mask m : {Mask{Causal::none, -1, -1, 0}, Mask{Causal::top_left, -1, -1, 0}, Mask{Causal::bottom_right, -1, -1, 0},
                 Mask{Causal::top_left, 17, 0, 5}, Mask{Causal::none, 9, 4, -3}, Mask{Causal::bottom_right, 40, -1, 2}})
    for (Direction mode : {Direction::forward, Direction::backward}) {
      CaseSpec c = varlen_case(backend(), kMixedQ, kMixedK);
      c.causal = m.causal;
      c.window_left = m.left;
      c.window_right = m.right;
      c.q_offset = m.q_offset;
      c.mode = mode;
      run_and_check(c);
    }
}

// A negative softmax scale (the dense fuzz's CpuNegativeScale draws no packed calls): masked keys
// stay hidden once their scores are multiplied by it, in every sequence's causal and windowed cuts.
TEST_P(VarlenBackend, NegativeScaleKeepsMaskedKeysHidden) {
  for (Causal causal : {Causal::bottom_right, Causal::top_left})
    for (DType dtype : {DType::fp32, DType::bf16})
      for (Direction mode : {Direction::forward, Direction::backward}) {
        CaseSpec c = varlen_case(backend(), kMixedQ, kMixedK);
        c.causal = causal;
        if (causal == Causal::top_left) c.window_left = 17;
        c.dtype = dtype;
        c.softmax_scale = -0.2f;
        c.mode = mode;
        run_and_check(c);
      }
}

TEST_P(VarlenBackend, HalfPrecisionMqaAndDeterministic) {
  for (DType dtype : {DType::bf16, DType::fp16})
    for (Direction mode : {Direction::forward, Direction::backward}) {
      CaseSpec c = varlen_case(backend(), kMixedQ, kMixedK);
      c.dtype = dtype;
      c.kv_heads = 1;  // MQA
      c.causal = Causal::bottom_right;
      c.deterministic = true;
      c.mode = mode;
      run_and_check(c);
    }
}

TEST_P(VarlenBackend, SingleSequenceAndLengthOne) {
  for (Direction mode : {Direction::forward, Direction::backward}) {
    CaseSpec one = varlen_case(backend(), {150}, {97});
    one.causal = Causal::top_left;
    one.mode = mode;
    run_and_check(one);
    CaseSpec ones = varlen_case(backend(), {1, 1, 1, 1, 1}, {1, 1, 1, 1, 1});
    ones.mode = mode;
    run_and_check(ones);
  }
}

// A thousand short sequences (0 to 20 tokens): the work pool of the cpu path spans sequences.
TEST_P(VarlenBackend, ThousandShortSequences) {
  constexpr int kSequences = 1000;
  constexpr int64_t kMaxLength = 20;
  std::mt19937_64 rng(fresh_seed());
  std::uniform_int_distribution<int64_t> length(0, kMaxLength);
  std::vector<int64_t> q, k;
  for (int i = 0; i < kSequences; ++i) {
    q.push_back(length(rng));
    k.push_back(length(rng));
  }
  for (Direction mode : {Direction::forward, Direction::backward}) {
    CaseSpec c = varlen_case(backend(), q, k);
    c.causal = Causal::bottom_right;
    c.mode = mode;
    run_and_check(c);
  }
}

// Every sequence empty: nothing to compute, and still a valid call.
TEST_P(VarlenBackend, AllSequencesEmpty) {
  for (Direction mode : {Direction::forward, Direction::backward}) {
    CaseSpec c = varlen_case(backend(), {0, 0, 0}, {0, 5, 0});
    c.mode = mode;
    run_and_check(c);
  }
}

// Decode-shaped sequences (a few query rows, thousands of keys) beside sequences without keys: the
// cpu path splits the keys of such a pool over the threads (fast_attention.cpp, key_parts), and a
// sequence with no key still gets one empty part.
TEST_P(VarlenBackend, DecodeShapedBesideEmptyKeys) {
  for (Direction mode : {Direction::forward, Direction::backward}) {
    CaseSpec c = varlen_case(backend(), {1, 3, 2, 0}, {0, 3001, 700, 40});
    c.causal = Causal::bottom_right;
    c.mode = mode;
    run_and_check(c);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, VarlenBackend, ::testing::Values("reference", "cpu"),
                         [](const auto& info) { return info.param; });

// The cpu backend's other instruction-set paths on the mixed table (the selected one ran above).
TEST(Varlen, EveryCpuPathMatchesOracle) {
  for (const std::string& path : testing::compiled_cpu_paths()) {
    if (!testing::cpu_runs(path)) continue;
    const testing::ForceCpuPath force(path);
    for (Direction mode : {Direction::forward, Direction::backward}) {
      CaseSpec c = varlen_case(Backend::cpu, kMixedQ, kMixedK);
      c.causal = Causal::top_left;
      c.dtype = DType::bf16;
      c.mode = mode;
      run_and_check(c);
    }
  }
}

// ---- A packed batch of equal lengths is the dense batch: same bits from the same backend --------

TEST(Varlen, EqualLengthsGiveTheDenseResult) {
  constexpr int64_t kBatch = 3, kSeqlenQ = 77, kSeqlenK = 90, kHeads = 4, kKvHeads = 2, kDim = 32;
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (Direction mode : {Direction::forward, Direction::backward}) {
      testing::Problem dense(kBatch, kHeads, kKvHeads, kSeqlenQ, kSeqlenK, kDim, kDim, DType::fp32, fresh_seed());
      Params p = dense.params(backend);
      p.causal = Causal::bottom_right;
      p.window_left = 30;
      ASSERT_TRUE(forward(p).ok());
      if (mode == Direction::backward) ASSERT_TRUE(backward(p).ok());

      // The same memory seen as packed tensors: [B, S, H, D] contiguous is [B·S, H, D]; the LSE is
      // [B, H, S] dense but [H, total] packed, so it gets its own buffer.
      auto packed = [](const testing::HostTensor& t) {
        Tensor v = t.view;
        v.rank = 3;
        v.shape[0] = t.view.shape[0] * t.view.shape[1];
        v.shape[1] = t.view.shape[2];
        v.shape[2] = t.view.shape[3];
        v.stride[0] = t.view.stride[1];
        v.stride[1] = t.view.stride[2];
        v.stride[2] = t.view.stride[3];
        return v;
      };
      testing::HostTensor o(DType::fp32, {kBatch * kSeqlenQ, kHeads, kDim}), lse(DType::fp32, {kHeads, kBatch * kSeqlenQ});
      testing::HostTensor dq(DType::fp32, {kBatch * kSeqlenQ, kHeads, kDim});
      testing::HostTensor dk(DType::fp32, {kBatch * kSeqlenK, kKvHeads, kDim}), dv(DType::fp32, {kBatch * kSeqlenK, kKvHeads, kDim});
      testing::HostTensor cu_q(DType::int32, {kBatch + 1}), cu_k(DType::int32, {kBatch + 1});
      for (int64_t b = 0; b <= kBatch; ++b) {
        static_cast<int32_t*>(cu_q.view.data)[b] = int32_t(b * kSeqlenQ);
        static_cast<int32_t*>(cu_k.view.data)[b] = int32_t(b * kSeqlenK);
      }
      Params v = p;
      v.q = packed(dense.q);
      v.k = packed(dense.k);
      v.v = packed(dense.v);
      v.o = o.view;
      v.lse = lse.view;
      v.cu_seqlens_q = cu_q.view;
      v.cu_seqlens_k = cu_k.view;
      v.max_seqlen_q = kSeqlenQ;
      v.max_seqlen_k = kSeqlenK;
      ASSERT_TRUE(forward(v).ok());
      for (int64_t i = 0; i < o.numel(); ++i) ASSERT_EQ(o.at(i), dense.o.at(i)) << "o element " << i;
      for (int64_t b = 0; b < kBatch; ++b)
        for (int64_t h = 0; h < kHeads; ++h)
          for (int64_t s = 0; s < kSeqlenQ; ++s)
            ASSERT_EQ(lse.at(h * kBatch * kSeqlenQ + b * kSeqlenQ + s), dense.lse.at((b * kHeads + h) * kSeqlenQ + s));
      if (mode == Direction::forward) continue;
      v.o = packed(dense.o);  // the dense forward's O and the packed LSE hold the same values
      v.dout = packed(dense.dout);
      v.dq = dq.view;
      v.dk = dk.view;
      v.dv = dv.view;
      ASSERT_TRUE(backward(v).ok());
      for (int64_t i = 0; i < dq.numel(); ++i) ASSERT_EQ(dq.at(i), dense.dq.at(i)) << "dq element " << i;
      for (int64_t i = 0; i < dk.numel(); ++i) ASSERT_EQ(dk.at(i), dense.dk.at(i)) << "dk element " << i;
      for (int64_t i = 0; i < dv.numel(); ++i) ASSERT_EQ(dv.at(i), dense.dv.at(i)) << "dv element " << i;
    }
}

// ---- Bad tables -----------------------------------------------------------------------------------

constexpr float kSentinel = 777.0f;

// A small valid varlen call (3 sequences) whose parts the cases below break one at a time.
struct VarlenCall {
  static constexpr int64_t kHeads = 2, kDim = 16;
  std::vector<int32_t> table_q = {0, 5, 5, 12}, table_k = {0, 3, 9, 10};
  testing::HostTensor q{DType::fp32, {12, kHeads, kDim}}, k{DType::fp32, {10, kHeads, kDim}},
      v{DType::fp32, {10, kHeads, kDim}}, o{DType::fp32, {12, kHeads, kDim}}, lse{DType::fp32, {kHeads, 12}};
  testing::HostTensor dout{DType::fp32, {12, kHeads, kDim}}, dq{DType::fp32, {12, kHeads, kDim}},
      dk{DType::fp32, {10, kHeads, kDim}}, dv{DType::fp32, {10, kHeads, kDim}};

  VarlenCall() {
    std::mt19937_64 rng(7);
    for (testing::HostTensor* t : {&q, &k, &v, &dout}) t->randomize(rng);
    for (testing::HostTensor* t : {&o, &lse, &dq, &dk, &dv}) t->fill(kSentinel);
  }
  Params params() {
    Params p;
    p.q = q.view, p.k = k.view, p.v = v.view, p.o = o.view, p.lse = lse.view;
    p.dout = dout.view, p.dq = dq.view, p.dk = dk.view, p.dv = dv.view;
    p.cu_seqlens_q = make_tensor(table_q.data(), DType::int32, {int64_t(table_q.size())});
    p.cu_seqlens_k = make_tensor(table_k.data(), DType::int32, {int64_t(table_k.size())});
    p.max_seqlen_q = 7;
    p.max_seqlen_k = 6;
    p.backend = Backend::cpu;
    return p;
  }
  bool outputs_untouched() const {
    for (const testing::HostTensor* t : {&o, &lse, &dq, &dk, &dv})
      for (int64_t i = 0; i < t->numel(); ++i)
        if (t->at(i) != kSentinel) return false;
    return true;
  }
};

TEST(Varlen, ValidCallOfTheBadInputTestsRuns) {
  VarlenCall call;
  Params p = call.params();
  Backend chosen{};
  ASSERT_TRUE(select_backend(p, Direction::backward, &chosen).ok());
  EXPECT_EQ(chosen, Backend::cpu);
  size_t bytes = 1;
  ASSERT_TRUE(workspace_size(p, Direction::backward, &bytes).ok());
  EXPECT_EQ(bytes, 0u);  // the CPU backends need no workspace, packed or not
  ASSERT_TRUE(forward(p).ok());
  ASSERT_TRUE(backward(p).ok());
  EXPECT_FALSE(call.outputs_untouched());
}

struct BadTable {
  const char* name;
  const char* mentions;
  void (*edit)(VarlenCall&, Params&);
};

TEST(Varlen, BadTablesAreRefusedAndNothingIsWritten) {
  static testing::HostTensor int64_like(DType::fp32, {4});
  static testing::HostTensor dense_q(DType::fp32, {1, 12, 2, 16});
  static testing::HostTensor dense_lse(DType::fp32, {1, 2, 12});
  const BadTable cases[] = {
      {"first_not_zero", "cu_seqlens_q[0]: is 1, expected 0", [](VarlenCall& c, Params&) { c.table_q[0] = 1; }},
      {"decreasing", "cu_seqlens_k: not non-decreasing", [](VarlenCall& c, Params&) { c.table_k[2] = 2; }},
      {"last_not_total", "cu_seqlens_q: last entry is 11, expected 12",
       [](VarlenCall& c, Params&) { c.table_q[3] = 11; }},
      {"last_above_total", "cu_seqlens_k: last entry is 11, expected 10",
       [](VarlenCall& c, Params&) { c.table_k[3] = 11; }},
      {"length_above_max", "above max_seqlen_q = 6", [](VarlenCall&, Params& p) { p.max_seqlen_q = 6; }},
      {"negative_max", "max_seqlen_k: is -1", [](VarlenCall&, Params& p) { p.max_seqlen_k = -1; }},
      {"batch_mismatch", "cu_seqlens_k: has 3 entries, expected 4",
       [](VarlenCall&, Params& p) { p.cu_seqlens_k.shape[0] = 3; }},
      {"empty_table", "cu_seqlens_q: has 0 entries",
       [](VarlenCall&, Params& p) { p.cu_seqlens_q.shape[0] = p.cu_seqlens_k.shape[0] = 0; }},
      {"missing_k_table", "cu_seqlens_k: required", [](VarlenCall&, Params& p) { p.cu_seqlens_k = Tensor{}; }},
      {"missing_q_table", "cu_seqlens_q: required", [](VarlenCall&, Params& p) { p.cu_seqlens_q = Tensor{}; }},
      {"table_dtype", "cu_seqlens_q: dtype must be int32",
       [](VarlenCall&, Params& p) { p.cu_seqlens_q = int64_like.view; }},
      {"table_rank", "cu_seqlens_k: expected a 1-d tensor",
       [](VarlenCall&, Params& p) { p.cu_seqlens_k.rank = 2, p.cu_seqlens_k.shape[1] = 1; }},
      {"table_null", "cu_seqlens_q: data pointer is null", [](VarlenCall&, Params& p) { p.cu_seqlens_q.data = nullptr; }},
      {"table_device", "cu_seqlens_k: is on a different device",
       [](VarlenCall&, Params& p) { p.cu_seqlens_k.device = Device{DeviceType::cuda, 0}; }},
      {"dense_q_with_tables", "q: expected a 3-d tensor [total_q, heads, head_dim]",
       [](VarlenCall&, Params& p) { p.q = dense_q.view; }},
      {"dense_lse_with_tables", "lse: expected a 2-d tensor [heads, total_q]",
       [](VarlenCall&, Params& p) { p.lse = dense_lse.view; }},
      {"k_total_mismatch", "v: total_k is 9, expected 10", [](VarlenCall&, Params& p) { p.v.shape[0] = 9; }},
  };
  for (const BadTable& bad : cases)
    for (Direction direction : {Direction::forward, Direction::backward})
      for (Backend backend : {Backend::cpu, Backend::reference, Backend::auto_select}) {
        SCOPED_TRACE(std::string(bad.name) + " " + to_string(direction) + " " + to_string(backend));
        VarlenCall call;
        Params p = call.params();
        p.backend = backend;
        bad.edit(call, p);
        const Status s = direction == Direction::forward ? forward(p) : backward(p);
        EXPECT_EQ(s.code, Code::invalid_argument) << s.message;
        EXPECT_NE(s.message.find(bad.mentions), std::string::npos) << "message: " << s.message;
        EXPECT_TRUE(call.outputs_untouched());
        EXPECT_FALSE(supports(p, direction).ok());
      }
}

// The sm90 packed forward's walk over the sequence table (plain code, the same on the host):
// blocks taking every grid-th work tile, or the next one from a shared counter, each with its own
// cursor, hand out every (sequence, query tile, head) of the clamped table exactly once, heads
// fastest and, under masks, the last query tile first.
void check_packed_walk(const std::vector<int32_t>& table, int64_t total_q, int64_t max_seqlen, int heads, int tile_m,
                       bool reverse, int grid, bool dynamic) {
  SCOPED_TRACE("tile_m " + std::to_string(tile_m) + " grid " + std::to_string(grid) +
               (dynamic ? " dynamic" : " static") + (reverse ? " longest first" : ""));
  const test::PackedWalkPlan plan = test::plan_packed_walk(table, total_q, max_seqlen, heads, tile_m);
  const cuda::AttentionArgs& args = plan.args;
  const std::vector<int>&first = plan.first, &blocks = plan.blocks;
  const int tiles = plan.tiles;
  std::vector<int> visits(size_t(tiles), 0);
  std::vector<cuda::sm90::PackedTileCursor> cursors(size_t(grid), cuda::sm90::PackedTileCursor(args, tile_m, reverse));
  std::vector<int> next(static_cast<size_t>(grid));
  std::vector<bool> done(static_cast<size_t>(grid), false);
  for (int g = 0; g < grid; ++g) next[size_t(g)] = g;
  int counter = grid;
  // Round robin over the blocks: each asks for its next tile in turn (the dynamic order).
  for (int active = grid; active > 0;) {
    for (int g = 0; g < grid; ++g) {
      if (done[size_t(g)]) continue;
      const int t = next[size_t(g)];
      cuda::sm90::PackedTileCursor& cursor = cursors[size_t(g)];
      if (!cursor.seek(args, t)) {
        done[size_t(g)] = true;
        --active;
        continue;
      }
      const cuda::sm90::WorkTile w = cursor.tile(t);
      ASSERT_TRUE(w.batch >= 0 && w.batch < args.batch && w.head >= 0 && w.head < heads && w.m_block >= 0 &&
                  w.m_block < blocks[size_t(w.batch)])
          << "tile " << t << ": sequence " << w.batch << ", query tile " << w.m_block << ", head " << w.head;
      const int in_sequence = t - first[size_t(w.batch)];
      EXPECT_EQ(w.head, in_sequence % heads) << "heads vary fastest";
      EXPECT_EQ(w.m_block, reverse ? blocks[size_t(w.batch)] - 1 - in_sequence / heads : in_sequence / heads);
      ++visits[size_t(first[size_t(w.batch)] + w.m_block * heads + w.head)];
      next[size_t(g)] = dynamic ? counter++ : t + grid;
    }
  }
  for (int i = 0; i < tiles; ++i) EXPECT_EQ(visits[size_t(i)], 1) << "work tile " << i;
  EXPECT_LE(int64_t(tiles), cuda::sm90::packed_tile_bound(args, tile_m));
}

TEST(Varlen, Sm90PackedTilesEachOnce) {
  test::for_each_packed_walk([](auto&&... c) { check_packed_walk(c...); });
  // Tables that break the promise: the walk follows the clamped sequences, each tile once.
  test::for_each_broken_packed_walk([](auto&&... c) { check_packed_walk(c...); });
}

}  // namespace
}  // namespace fmha
