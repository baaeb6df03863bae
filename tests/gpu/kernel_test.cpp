// Every GPU tier against the fp64 oracle on odd shapes and every option, forward and backward,
// under the accuracy rule of gpu_test_util.h; plus the tiers' refusals and the bitwise
// reproducibility of the deterministic backward. Tests whose name contains "Small" are the
// quick subset the sanitizer runs (scripts/gpu_check.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/sm90/sm90_config.h"
#include "fmha/tune.h"
#include "gpu_test_util.h"
#include "tune/selection.h"

namespace fmha::test {
namespace {

std::vector<int> compiled_head_dims() {
  std::vector<int> out;
  std::stringstream in(FMHA_TEST_HEAD_DIMS);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
  return out;
}

bool tier_available(Backend b) {
  const auto compiled = compiled_backends();
  if (std::find(compiled.begin(), compiled.end(), b) == compiled.end()) return false;
  if (b == Backend::cuda_sm90) return device_arch() == 90;
  return b != Backend::cuda_sm80 || device_arch() >= 80;
}

// The sm90 backward covers every head dim the tier takes (64 to 256: up to 128 one warpgroup per
// 64 keys, above the split of the head dim over both warpgroups); its tf32 backward (fp32
// storage) head dims 64 to 128 (larger ones run on sm80; refusal tested below); its split tf32
// (tf32x3) backward head dim 64.
constexpr int kSm90MaxBackwardHeadDim = 256;
constexpr int kSm90MaxTf32BackwardHeadDim = 128;
constexpr int kSm90MaxTf32x3BackwardHeadDim = 64;
bool has_backward(const Case& c) {
  const int64_t d = std::max(c.head_dim, c.head_dim_v);
  if (c.backend == Backend::cuda_sm90 && c.dtype == DType::fp32)
    return d <= (c.precision == Precision::tf32x3 ? kSm90MaxTf32x3BackwardHeadDim : kSm90MaxTf32BackwardHeadDim);
  return c.backend != Backend::cuda_sm90 || d <= kSm90MaxBackwardHeadDim;
}
// Head dims below 64 run on sm80 (sm90 refuses them, tested below); its tf32 forward takes 64 to
// 128, its split-tf32 forward 64.
constexpr int kSm90MaxTf32x3HeadDim = 64;
bool takes_head_dim(Backend b, int head_dim, DType dtype = DType::bf16, Precision precision = Precision::tf32) {
  if (b == Backend::cuda_sm90 && dtype == DType::fp32 && precision == Precision::tf32x3)
    return head_dim >= 64 && head_dim <= kSm90MaxTf32x3HeadDim;
  if (b == Backend::cuda_sm90 && dtype == DType::fp32) return head_dim >= 64 && head_dim <= 128;
  return b != Backend::cuda_sm90 || head_dim >= 64;
}

// The (backend, dtype, precision) combinations of each tier.
struct Flavor {
  Backend backend;
  DType dtype;
  Precision precision;
};
const Flavor kFlavors[] = {{Backend::cuda_simt, DType::fp32, Precision::ieee},
                           {Backend::cuda_sm80, DType::fp16, Precision::ieee},
                           {Backend::cuda_sm80, DType::bf16, Precision::ieee},
                           {Backend::cuda_sm80, DType::fp32, Precision::tf32},
                           {Backend::cuda_sm80, DType::fp32, Precision::tf32x3},
                           {Backend::cuda_sm90, DType::fp16, Precision::ieee},
                           {Backend::cuda_sm90, DType::bf16, Precision::ieee},
                           {Backend::cuda_sm90, DType::fp32, Precision::tf32},
                           {Backend::cuda_sm90, DType::fp32, Precision::tf32x3}};

Case base(const Flavor& f, int head_dim) {
  Case c;
  c.backend = f.backend;
  c.dtype = f.dtype;
  c.precision = f.precision;
  c.head_dim = c.head_dim_v = head_dim;
  return c;
}

// The sweep. "small" cases are short enough for the sanitizer.
struct Named {
  Case c;
  bool small;
};

std::vector<Named> all_cases() {
  std::vector<Named> out;
  const std::vector<int> dims = compiled_head_dims();
  const int main_dim_all = std::find(dims.begin(), dims.end(), 64) != dims.end() ? 64 : dims.back();
  for (const Flavor& f : kFlavors) {
    int main_dim = main_dim_all;
    if (!takes_head_dim(f.backend, main_dim, f.dtype, f.precision)) {  // sm90 tf32 without 64: its largest compiled one
      main_dim = 0;
      for (int hd : dims)
        if (takes_head_dim(f.backend, hd, f.dtype, f.precision)) main_dim = hd;
      if (main_dim == 0) continue;
    }
    // Every compiled head dim on a ragged GQA shape, causal and not.
    for (int hd : dims) {
      if (!takes_head_dim(f.backend, hd, f.dtype, f.precision)) continue;
      Case c = base(f, hd);
      c.batch = 2, c.seqlen_q = 65, c.seqlen_k = 63, c.heads = 4, c.kv_heads = 2;
      out.push_back({c, true});
      c.causal = Causal::bottom_right;
      c.deterministic = true;
      out.push_back({c, false});
    }
    // Sequence lengths, Sq != Sk, both causal alignments.
    const int64_t lens[][2] = {{1, 1}, {1, 1013}, {15, 63}, {63, 15}, {64, 64}, {65, 1013}, {1013, 65}, {1013, 1013}};
    for (const auto& len : lens)
      for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
        Case c = base(f, main_dim);
        c.seqlen_q = len[0], c.seqlen_k = len[1], c.heads = 2, c.kv_heads = 1;
        c.causal = causal;
        const bool small = len[0] * len[1] <= 64 * 64;
        out.push_back({c, small});
      }
    // Sliding windows, q_offset (negative too: leading rows see nothing), GQA/MQA, Dv != D,
    // no LSE, the [B, H, S, D] layout, deterministic backward.
    {
      Case c = base(f, main_dim);
      c.seqlen_q = 130, c.seqlen_k = 200, c.heads = 8, c.kv_heads = 8;
      c.window_left = 17, c.window_right = 5;
      out.push_back({c, true});
      c.kv_heads = 1, c.causal = Causal::top_left, c.window_right = 0, c.q_offset = -40;
      out.push_back({c, true});
      c.kv_heads = 2, c.q_offset = 70, c.window_left = 0, c.deterministic = true;
      out.push_back({c, true});
      c = base(f, main_dim);
      c.seqlen_q = 100, c.seqlen_k = 33, c.heads = 8, c.kv_heads = 1, c.causal = Causal::bottom_right;
      c.with_lse = false, c.bhsd_layout = true;
      out.push_back({c, true});
      c.causal = Causal::top_left, c.q_offset = -50, c.heads = 2, c.kv_heads = 2, c.window_left = 3;
      out.push_back({c, true});
    }
    // What TMA makes risky (sm90; the other tiers run them too): base pointers 16 bytes past an
    // allocation, batch × heads above 65,535, GQA 8:1 over many tiles at head dim 128.
    {
      Case c = base(f, main_dim);
      c.seqlen_q = 200, c.seqlen_k = 300, c.heads = 4, c.kv_heads = 2, c.base_offset = 16;
      out.push_back({c, true});
      // Every tensor 4 bytes past its allocation (simt takes any fp32 view): the backward's row
      // kernels (Δ, dQ's conversion) then go element by element instead of in 16-byte vectors.
      if (f.backend == Backend::cuda_simt) {
        c.base_offset = 4, c.causal = Causal::bottom_right, c.seqlen_q = 77;
        out.push_back({c, true});
      }
      // dQ, dK and dV one element past 16 bytes (every tier writes them without TMA): dQ's
      // conversion goes element by element, sm90's dK and dV leave from registers, not in vectors.
      c = base(f, main_dim);
      c.seqlen_q = 70, c.seqlen_k = 150, c.heads = 4, c.kv_heads = 2, c.grad_offset = int(dtype_size(f.dtype));
      out.push_back({c, true});
      c = base(f, main_dim);
      c.batch = 300, c.heads = 256, c.kv_heads = 32, c.seqlen_q = 1, c.seqlen_k = 5;
      out.push_back({c, false});
      if (std::find(dims.begin(), dims.end(), 128) != dims.end() && takes_head_dim(f.backend, 128, f.dtype, f.precision)) {
        c = base(f, 128);
        c.seqlen_q = 1000, c.seqlen_k = 1000, c.heads = 16, c.kv_heads = 2, c.causal = Causal::bottom_right;
        out.push_back({c, false});
      }
    }
    // Head dims above 128 (the sm90 backward's split scheme: 64 keys per block, the head dim's
    // chunks shared by two warpgroups, one P/dS buffer, one Q/dO stage at 256): every option.
    for (int hd : dims) {
      if (hd <= 128 || !takes_head_dim(f.backend, hd, f.dtype, f.precision)) continue;
      Case c = base(f, hd);
      c.seqlen_q = 200, c.seqlen_k = 333, c.heads = 4, c.kv_heads = 1, c.causal = Causal::top_left;
      out.push_back({c, true});
      c.causal = Causal::bottom_right, c.kv_heads = 2, c.deterministic = true;
      out.push_back({c, false});
      c = base(f, hd);  // ragged lengths, Sq != Sk both ways
      c.seqlen_q = 1, c.seqlen_k = 1013, c.heads = 2, c.kv_heads = 1;
      out.push_back({c, false});
      c.seqlen_q = 1013, c.seqlen_k = 65, c.causal = Causal::bottom_right;
      out.push_back({c, false});
      c.seqlen_q = 63, c.seqlen_k = 15, c.causal = Causal::top_left;
      out.push_back({c, true});
      c = base(f, hd);  // sliding window; then MQA with q_offset < 0 (rows that see nothing)
      c.seqlen_q = 130, c.seqlen_k = 200, c.heads = 4, c.kv_heads = 4;
      c.window_left = 17, c.window_right = 5;
      out.push_back({c, true});
      c.kv_heads = 1, c.causal = Causal::top_left, c.window_right = 0, c.q_offset = -40;
      out.push_back({c, true});
      c.kv_heads = 2, c.q_offset = 70, c.window_left = 0, c.deterministic = true;
      out.push_back({c, true});
      c = base(f, hd);  // strided [B, H, S, D] views, no LSE; base pointers 16 bytes in
      c.seqlen_q = 100, c.seqlen_k = 33, c.heads = 4, c.kv_heads = 1, c.causal = Causal::bottom_right;
      c.with_lse = false, c.bhsd_layout = true;
      out.push_back({c, true});
      c = base(f, hd);
      c.seqlen_q = 200, c.seqlen_k = 300, c.heads = 4, c.kv_heads = 2, c.base_offset = 16;
      out.push_back({c, true});
      // Head dims inside the bucket, off the chunk grid (the last chunk partly zero-filled).
      if (hd == 192) {
        c = base(f, 160);
        c.head_dim_v = 136, c.seqlen_q = 70, c.seqlen_k = 129, c.heads = 3, c.kv_heads = 1;
        c.causal = Causal::bottom_right;
        out.push_back({c, true});
      }
      // Dv != D inside the bucket (192 and 256 mixed; the narrower side's chunks zero-filled).
      if (hd == 256 && std::find(dims.begin(), dims.end(), 192) != dims.end()) {
        c = base(f, hd);
        c.head_dim = 192, c.seqlen_q = 77, c.seqlen_k = 90, c.heads = 2, c.kv_heads = 1;
        out.push_back({c, true});
        c.head_dim = 256, c.head_dim_v = 192, c.causal = Causal::bottom_right;
        out.push_back({c, true});
      }
    }
    for (int hd : dims) {
      if (hd < 64 || !takes_head_dim(f.backend, hd, f.dtype, f.precision)) continue;
      Case c = base(f, hd);
      c.head_dim_v = hd / 2;
      c.seqlen_q = 77, c.seqlen_k = 90, c.heads = 2, c.kv_heads = 1;
      out.push_back({c, true});
      c.head_dim = hd / 2, c.head_dim_v = hd, c.causal = Causal::top_left;
      out.push_back({c, true});
    }
  }
  return out;
}

class Kernel : public ::testing::TestWithParam<Named> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
    if (!tier_available(GetParam().c.backend)) GTEST_SKIP() << "tier not compiled or not runnable on this GPU";
  }
};

TEST_P(Kernel, Forward) {
  const uint64_t seed = test_seed();
  const std::string msg = check_forward(GetParam().c, seed);
  EXPECT_TRUE(msg.empty()) << GetParam().c.name() << " (seed " << seed << ", FMHA_TEST_SEED to repeat)\n" << msg;
}

TEST_P(Kernel, Backward) {
  if (!has_backward(GetParam().c)) GTEST_SKIP() << "the sm90 backward does not take this case (refusals tested)";
  const uint64_t seed = test_seed() + 1;
  const std::string msg = check_backward(GetParam().c, seed);
  EXPECT_TRUE(msg.empty()) << GetParam().c.name() << " (seed " << seed << ", FMHA_TEST_SEED to repeat)\n" << msg;
}

std::string case_name(const ::testing::TestParamInfo<Named>& info) {
  return std::string(info.param.small ? "Small_" : "Large_") + info.param.c.name() + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Sweep, Kernel, ::testing::ValuesIn(all_cases()), case_name);

// ---- Deterministic backward: bitwise identical across runs --------------------------------------

class Deterministic : public ::testing::TestWithParam<Flavor> {};

TEST_P(Deterministic, SmallBitwiseIdentical) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  if (!tier_available(GetParam().backend)) GTEST_SKIP() << "tier not available";
  int head_dim = compiled_head_dims().front();
  for (int d : compiled_head_dims())  // sm90: its backward's head dims are 64 to 256
    if (GetParam().backend != Backend::cuda_sm90 || d >= 64) {
      head_dim = d;
      break;
    }
  Case c = base(GetParam(), head_dim);
  if (!takes_head_dim(c.backend, head_dim) || !has_backward(c)) GTEST_SKIP() << "no head dim of this build";
  // 400 keys: four sm90 key tiles (128 keys) add into each query tile; two alone would sum in
  // either order to the same bits.
  c.batch = 2, c.seqlen_q = 150, c.seqlen_k = 400, c.heads = 4, c.kv_heads = 1, c.causal = Causal::bottom_right;
  const std::string msg = check_deterministic(c, test_seed());
  EXPECT_TRUE(msg.empty()) << c.name() << " (seed " << test_seed() << ")\n" << msg;
}

// The largest compiled head dim (sm90 above 128: 64-key tiles, so seven of them add into each
// query tile of 400 keys).
TEST_P(Deterministic, LargeHeadDimBitwiseIdentical) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  if (!tier_available(GetParam().backend)) GTEST_SKIP() << "tier not available";
  const int head_dim = compiled_head_dims().back();
  if (head_dim <= 128) GTEST_SKIP() << "no head dim above 128 in this build";
  Case c = base(GetParam(), head_dim);
  if (!has_backward(c)) GTEST_SKIP() << "no backward at this head dim";
  c.batch = 2, c.seqlen_q = 150, c.seqlen_k = 400, c.heads = 4, c.kv_heads = 1, c.causal = Causal::bottom_right;
  const std::string msg = check_deterministic(c, test_seed());
  EXPECT_TRUE(msg.empty()) << c.name() << " (seed " << test_seed() << ")\n" << msg;
  c.causal = Causal::none, c.head_dim_v = head_dim / 2, c.kv_heads = 2;  // Dv != D, GQA 2:1
  const std::string msg2 = check_deterministic(c, test_seed() + 1);
  EXPECT_TRUE(msg2.empty()) << c.name() << " (seed " << test_seed() + 1 << ")\n" << msg2;
}

INSTANTIATE_TEST_SUITE_P(Tiers, Deterministic, ::testing::ValuesIn(kFlavors),
                         [](const ::testing::TestParamInfo<Flavor>& info) {
                           return std::string(to_string(info.param.backend)) + "_" +
                                  (info.param.precision != Precision::ieee ? to_string(info.param.precision)
                                                                           : to_string(info.param.dtype));
                         });

// ---- The sm90 forward's schedules: dynamic (counter in the workspace) and static agree ----------

// The sm90 schedule and forward-variant tests, one test per head dim (and variant), so that the
// suite's shards share them: each takes seconds to a minute or more of host time (the fp64 oracle
// and the naive computations, on the one core of its shard).
class Sm90ScheduleByHeadDim : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
    if (!tier_available(Backend::cuda_sm90)) GTEST_SKIP() << "tier not available";
    if (!takes_head_dim(Backend::cuda_sm90, GetParam())) GTEST_SKIP() << "the sm90 tier does not take this head dim";
  }
};

TEST_P(Sm90ScheduleByHeadDim, DynamicAndStaticAgreeBitwise) {
  const int d = GetParam();
  for (Causal causal : {Causal::none, Causal::bottom_right}) {
    Case c;
    c.backend = Backend::cuda_sm90, c.dtype = DType::bf16, c.head_dim = c.head_dim_v = d;
    // More work tiles than an H200 has SMs, of uneven length under the causal mask.
    c.batch = 3, c.heads = 16, c.kv_heads = 4, c.seqlen_q = 700, c.seqlen_k = 900, c.causal = causal;
    const std::string msg = check_schedules_agree(c, test_seed());
    EXPECT_TRUE(msg.empty()) << c.name() << " (seed " << test_seed() << ")\n" << msg;
  }
}

// Short work tiles, several per block (dense: 512 of one or two key tiles at head dim 64, about
// four per block of a 132-SM grid), causal and not, against the oracle: each block takes its
// query buffers (two at 16-bit head dims 64 and 128, sm90_fwd_mainloop.cuh's fwd_query_buffers)
// in both barrier phases and every work-tile slot. The second shape (640 work tiles) puts tiles
// without keys (rows 0-449 of 600 see none of the 150 keys under the bottom-right mask) among
// tiles with one or two key tiles, in the order the scheduler gives them to each block.
TEST_P(Sm90ScheduleByHeadDim, ManyShortWorkTilesPerBlockMatchTheOracle) {
  const int d = GetParam();
  for (DType dtype : {DType::bf16, DType::fp16})
    for (Causal causal : {Causal::none, Causal::bottom_right})
      for (int seqlen_q : {200, 600}) {
        Case c;
        c.backend = Backend::cuda_sm90, c.dtype = dtype, c.head_dim = c.head_dim_v = d;
        c.batch = seqlen_q == 200 ? 32 : 16, c.heads = 8, c.kv_heads = 4, c.seqlen_q = seqlen_q, c.seqlen_k = 150;
        c.causal = causal;
        const std::string msg = check_forward(c, test_seed());
        EXPECT_TRUE(msg.empty()) << c.name() << " (seed " << test_seed() << ")\n" << msg;
      }
}

// The same for a packed call: 96 sequences of 40 to 299 rows, one to three query tiles each.
TEST_P(Sm90ScheduleByHeadDim, ManyShortPackedWorkTilesPerBlockMatchTheOracle) {
  const int d = GetParam();
  VarlenCase vc;
  vc.base.backend = Backend::cuda_sm90, vc.base.dtype = DType::bf16;
  vc.base.head_dim = vc.base.head_dim_v = d, vc.base.heads = vc.base.kv_heads = 4;
  for (int i = 0; i < 96; ++i) vc.seqlens_q.push_back(40 + (i * 37) % 260);
  vc.seqlens_k = vc.seqlens_q;
  const std::string msg = check_varlen_forward(vc, test_seed());
  EXPECT_TRUE(msg.empty()) << "packed, head dim " << d << " (seed " << test_seed() << ")\n" << msg;
}

INSTANTIATE_TEST_SUITE_P(HeadDims, Sm90ScheduleByHeadDim, ::testing::ValuesIn(compiled_head_dims()),
                         [](const ::testing::TestParamInfo<int>& info) { return "d" + std::to_string(info.param); });

// Every forward variant of the sm90 tier (each a different pipeline, tile or rescaling scheme)
// against the oracle, on random scores and on scores that grow along the keys, so that rows
// rescale on some key tiles and keep their exponent base on others (the lazy variants' two paths).
// FMHA_TEST_FWD_VARIANTS=a,b limits it to those variants (all by default).
class Sm90VariantByHeadDim : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(Sm90VariantByHeadDim, MatchesTheOracle) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  if (!tier_available(Backend::cuda_sm90)) GTEST_SKIP() << "tier not available";
  const auto [v, d] = GetParam();
  if (!takes_head_dim(Backend::cuda_sm90, d)) GTEST_SKIP() << "the sm90 tier does not take this head dim";
  const char* name = cuda::sm90::kFwdVariantNames[v];
  const char* only = std::getenv("FMHA_TEST_FWD_VARIANTS");
  if (only && ("," + std::string(only) + ",").find("," + std::string(name) + ",") == std::string::npos)
    GTEST_SKIP() << "not among FMHA_TEST_FWD_VARIANTS";
  detail::CandidateScope scope(Backend::cuda_sm90, Direction::forward, name);
  for (DType dtype : {DType::bf16, DType::fp16})
    for (Causal causal : {Causal::none, Causal::bottom_right})
      for (double ramp : {0.0, 800.0}) {
        Case c;
        c.backend = Backend::cuda_sm90, c.dtype = dtype, c.head_dim = c.head_dim_v = d;
        c.batch = 1, c.heads = 2, c.kv_heads = 1, c.seqlen_q = 200, c.seqlen_k = 1100, c.causal = causal;
        c.key_ramp = ramp;
        const std::string msg = check_forward(c, test_seed());
        EXPECT_TRUE(msg.empty()) << name << " " << c.name() << " (seed " << test_seed()
                                 << ", FMHA_TEST_SEED to repeat)\n" << msg;
      }
  // Several work tiles per block (176, above an H200's 132 SMs), so that a block goes from one
  // tile to the next (the carried turns run on across them): tiles of uneven length under the
  // causal mask, and with more queries than keys under the bottom-right mask, tiles whose rows
  // see no key before tiles that do.
  for (Causal causal : {Causal::none, Causal::bottom_right}) {
    Case c;
    c.backend = Backend::cuda_sm90, c.dtype = DType::bf16, c.head_dim = c.head_dim_v = d;
    c.batch = 1, c.heads = 16, c.kv_heads = 4, c.seqlen_q = 1300, c.seqlen_k = 300, c.causal = causal;
    const std::string msg = check_forward(c, test_seed());
    EXPECT_TRUE(msg.empty()) << name << " " << c.name() << " (seed " << test_seed()
                             << ", FMHA_TEST_SEED to repeat)\n" << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Sm90VariantByHeadDim,
                         ::testing::Combine(::testing::Range(0, cuda::sm90::kFwdVariants),
                                            ::testing::ValuesIn(compiled_head_dims())),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return std::string(cuda::sm90::kFwdVariantNames[std::get<0>(info.param)]) + "_d" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The sm90 tf32 forward (fp32 storage): schedules agree bitwise, rows rescale lazily on growing
// scores, and longer sequences (many key tiles through the Vᵀ ring, several work tiles per
// block) match the oracle, at every head dim it takes (one test each, so that shards share them).
class Sm90Tf32ByHeadDim : public ::testing::TestWithParam<int> {};

TEST_P(Sm90Tf32ByHeadDim, ForwardSchedulesRampsAndLongSequences) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  if (!tier_available(Backend::cuda_sm90)) GTEST_SKIP() << "tier not available";
  const int d = GetParam();
  if (!takes_head_dim(Backend::cuda_sm90, d, DType::fp32)) GTEST_SKIP() << "the sm90 tf32 forward does not take this head dim";
  for (Causal causal : {Causal::none, Causal::bottom_right}) {
    Case c;
    c.backend = Backend::cuda_sm90, c.dtype = DType::fp32, c.precision = Precision::tf32;
    c.head_dim = c.head_dim_v = d;
    c.batch = 3, c.heads = 16, c.kv_heads = 4, c.seqlen_q = 700, c.seqlen_k = 900, c.causal = causal;
    std::string msg = check_schedules_agree(c, test_seed());
    EXPECT_TRUE(msg.empty()) << c.name() << " (seed " << test_seed() << ")\n" << msg;
    for (double ramp : {0.0, 800.0}) {
      c.batch = 1, c.heads = 2, c.kv_heads = 1, c.seqlen_q = 200, c.seqlen_k = 1100, c.key_ramp = ramp;
      msg = check_forward(c, test_seed());
      EXPECT_TRUE(msg.empty()) << c.name() << " (seed " << test_seed() << ", FMHA_TEST_SEED to repeat)\n" << msg;
    }
    c.key_ramp = 0.0;
    c.batch = 2, c.heads = 2, c.kv_heads = 2, c.seqlen_q = 1500, c.seqlen_k = 2100;
    msg = check_forward(c, test_seed());
    EXPECT_TRUE(msg.empty()) << c.name() << " (seed " << test_seed() << ", FMHA_TEST_SEED to repeat)\n" << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, Sm90Tf32ByHeadDim, ::testing::ValuesIn(compiled_head_dims()),
                         [](const ::testing::TestParamInfo<int>& info) { return "d" + std::to_string(info.param); });

// The yardstick of every check above: the naive computations' key blocks give each key's dot
// product the bits it has alone (host only: runs without a GPU).
TEST(NaiveComputation, KeyBlocksGiveEachKeyItsOwnBits) {
  const std::string msg = check_naive_dots(test_seed());
  EXPECT_TRUE(msg.empty()) << msg << " (seed " << test_seed() << ")";
}

// The LSE bound's accumulation term: none for the exact fp32 tier; at D256 with scores near 52
// (the ramp) large enough to cover what run 103 measured (3.19e-5 against 2.76e-5 without it, so
// at least 4.3e-6), about 2.2e-4 by its formula and no looser; at D64 on random inputs small
// beside the bound it joins (host only: runs without a GPU).
TEST(NaiveComputation, LseAccumulationTermCoversTheTensorCoresAndNoMore) {
  Case c;
  c.backend = Backend::cuda_sm90, c.dtype = DType::bf16, c.head_dim = c.head_dim_v = 256;
  c.batch = 1, c.heads = 2, c.kv_heads = 1, c.seqlen_q = 200, c.seqlen_k = 1100, c.key_ramp = 800.0;
  const double ramp = lse_accumulation_bound(c, test_seed());
  EXPECT_GT(ramp, 1.5e-4) << "seed " << test_seed();
  EXPECT_LT(ramp, 3e-4) << "seed " << test_seed();
  c.key_ramp = 0.0, c.head_dim = c.head_dim_v = 64;
  const double plain = lse_accumulation_bound(c, test_seed());
  EXPECT_GT(plain, 0.0) << "seed " << test_seed();
  EXPECT_LT(plain, 1e-5) << "seed " << test_seed();
  c.backend = Backend::cuda_simt, c.dtype = DType::fp32;
  EXPECT_EQ(lse_accumulation_bound(c, test_seed()), 0.0);
}

// ---- Rows that see one key, and rows that see two ------------------------------------------------
// One key: P = 1 and dS = 0 exactly, so dQ and dK must cancel to fp32 rounding (the tf32 backward
// used to leave residues of ~50 tf32 units: Δ was formed from dO unrounded, dP from dO in tf32).
// Two keys: the usual rule against the oracle. Causal top-left with a window of 0 (or 1) keys to
// the left: row i sees key i (and i - 1).

class FewKeys : public ::testing::TestWithParam<Flavor> {};

TEST_P(FewKeys, SmallRowsSeeingOneOrTwoKeys) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const Flavor& f = GetParam();
  if (!tier_available(f.backend)) GTEST_SKIP() << "tier not available";
  const std::vector<int> dims = compiled_head_dims();
  for (int hd : {dims.front(), dims.back(), 128})
    for (bool deterministic : {false, true}) {
      Case c = base(f, hd);
      c.batch = 2, c.seqlen_q = 77, c.seqlen_k = 90, c.heads = 4, c.kv_heads = 2;
      c.causal = Causal::top_left, c.window_left = 0, c.deterministic = deterministic;
      // Cases a tier refuses (tested elsewhere) and head dims this build lacks are left out.
      if (std::find(dims.begin(), dims.end(), hd) == dims.end() || !takes_head_dim(f.backend, hd, f.dtype, f.precision) ||
          !has_backward(c))
        continue;
      const uint64_t seed = test_seed();
      const std::string one = check_single_key_rows_cancel(c, seed);
      EXPECT_TRUE(one.empty()) << c.name() << " (seed " << seed << ", FMHA_TEST_SEED to repeat)\n" << one;
      c.window_left = 1;
      const std::string two = check_backward(c, seed);
      EXPECT_TRUE(two.empty()) << c.name() << " (seed " << seed << ", FMHA_TEST_SEED to repeat)\n" << two;
      // Causal bottom-right with one key (every row that sees a key sees only it) and with two
      // (the last row sees both, the one before it one).
      for (int64_t keys : {1, 2}) {
        c.causal = Causal::bottom_right, c.window_left = -1, c.seqlen_k = keys;
        const std::string few = check_single_key_rows_cancel(c, seed);
        EXPECT_TRUE(few.empty()) << c.name() << " (seed " << seed << ", FMHA_TEST_SEED to repeat)\n" << few;
        const std::string all = check_backward(c, seed);
        EXPECT_TRUE(all.empty()) << c.name() << " (seed " << seed << ", FMHA_TEST_SEED to repeat)\n" << all;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Tiers, FewKeys, ::testing::ValuesIn(kFlavors),
                         [](const ::testing::TestParamInfo<Flavor>& info) {
                           return std::string(to_string(info.param.backend)) + "_" +
                                  (info.param.precision != Precision::ieee ? to_string(info.param.precision)
                                                                           : to_string(info.param.dtype));
                         });

// ---- Split tf32: as accurate as exact fp32, far more than tf32 ---------------------------------
// The same inputs through sm80 tf32x3, simt (exact fp32) and sm80 tf32. Split tf32's error must be
// within 2× of exact fp32's plus 8 fp32 units of the largest result (the split-tf32 target, against
// PyTorch in fp32), and at least 16× below tf32's.

// One case through its tier's split tf32, simt's exact fp32 and the same tier's tf32, on the same
// inputs: split tf32's O, dQ, dK and dV errors against the criteria above.
void expect_split_tf32_between_fp32_and_tf32(Case c) {
  constexpr double kFp32Factor = 2.0, kRoundingUnits = 8.0, kTf32Margin = 16.0;
  const double unit = std::ldexp(1.0, -24);
  const Backend tier = c.backend;
  const uint64_t seed = test_seed();
  c.precision = Precision::tf32x3;
  const OutputErrors split = output_errors(c, seed);
  c.backend = Backend::cuda_simt, c.precision = Precision::ieee;
  const OutputErrors exact = output_errors(c, seed);
  c.backend = tier, c.precision = Precision::tf32;
  const OutputErrors tf32 = output_errors(c, seed);
  ASSERT_TRUE(split.error.empty() && exact.error.empty() && tf32.error.empty())
      << split.error << exact.error << tf32.error;
  const struct {
    const char* name;
    double split, exact, tf32, ref_max;
  } outputs[] = {{"o", split.o, exact.o, tf32.o, split.o_max},
                 {"dq", split.dq, exact.dq, tf32.dq, split.dq_max},
                 {"dk", split.dk, exact.dk, tf32.dk, split.dk_max},
                 {"dv", split.dv, exact.dv, tf32.dv, split.dv_max}};
  for (const auto& x : outputs) {
    EXPECT_LE(x.split, kFp32Factor * x.exact + kRoundingUnits * unit * x.ref_max)
        << c.name() << " " << x.name << ": tf32x3 " << x.split << ", simt " << x.exact << " (seed " << seed << ")";
    EXPECT_LT(kTf32Margin * x.split, x.tf32)
        << c.name() << " " << x.name << ": tf32x3 " << x.split << ", tf32 " << x.tf32 << " (seed " << seed << ")";
  }
}

TEST(SplitTf32, SmallAsAccurateAsFp32FarBelowTf32) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  if (!tier_available(Backend::cuda_sm80) || !tier_available(Backend::cuda_simt)) GTEST_SKIP() << "no sm80/simt";
  const std::vector<int> dims = compiled_head_dims();
  for (int hd : {dims.front(), dims.back()})
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      Case c = base({Backend::cuda_sm80, DType::fp32, Precision::tf32x3}, hd);
      c.batch = 2, c.seqlen_q = 200, c.seqlen_k = 333, c.heads = 4, c.kv_heads = 2, c.causal = causal;
      expect_split_tf32_between_fp32_and_tf32(c);
    }
}

// The sm90 split tf32 (head dim 64), the same way: O, dQ, dK and dV against simt's exact fp32 and
// sm90's tf32, on the shape above and on 4,096 keys, where each key tile's P·V is added to O in
// fp32 (the tensor cores' own additions along the keys would lose more), and 256 query rows'
// parts of dK and dV likewise.
TEST(SplitTf32, Sm90AsAccurateAsFp32FarBelowTf32) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  if (!tier_available(Backend::cuda_sm90) || !tier_available(Backend::cuda_simt)) GTEST_SKIP() << "no sm90/simt";
  const std::vector<int> dims = compiled_head_dims();
  if (std::find(dims.begin(), dims.end(), kSm90MaxTf32x3HeadDim) == dims.end()) GTEST_SKIP() << "no head dim 64";
  for (int shape = 0; shape < 3; ++shape) {
    Case c = base({Backend::cuda_sm90, DType::fp32, Precision::tf32x3}, kSm90MaxTf32x3HeadDim);
    if (shape < 2) {
      c.batch = 2, c.seqlen_q = 200, c.seqlen_k = 333, c.heads = 4, c.kv_heads = 2;
      c.causal = shape == 0 ? Causal::none : Causal::bottom_right;
    } else {
      c.batch = 1, c.seqlen_q = 256, c.seqlen_k = 4096, c.heads = 2, c.kv_heads = 1;
    }
    expect_split_tf32_between_fp32_and_tf32(c);
  }
}

// ---- Empty problems: nothing to compute, but backward with Sq = 0 still zeroes dK/dV -------------

TEST(Edge, SmallEmptySequences) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  for (const Flavor& f : kFlavors) {
    if (!tier_available(f.backend)) continue;
    for (int which = 0; which < 3; ++which) {
      // The largest compiled head dim the flavor takes (sm90: its backward too); none in a build
      // of only head dims the flavor refuses (sm90 tf32 in a 192/256 build): nothing to check.
      int head_dim = -1;
      for (int hd : compiled_head_dims())
        if (f.backend != Backend::cuda_sm90 || takes_head_dim(f.backend, hd, f.dtype, f.precision)) head_dim = hd;
      if (head_dim < 0) continue;
      Case c = base(f, head_dim);
      c.batch = which == 2 ? 0 : 2;
      c.seqlen_q = which == 0 ? 0 : 17;
      c.seqlen_k = which == 1 ? 0 : 17;
      c.heads = 2, c.kv_heads = 1;
      const std::string fwd = check_forward(c, test_seed());
      EXPECT_TRUE(fwd.empty()) << c.name() << "\n" << fwd;
      if (!has_backward(c)) continue;
      const std::string bwd = check_backward(c, test_seed());
      EXPECT_TRUE(bwd.empty()) << c.name() << "\n" << bwd;
    }
  }
}

// ---- Refusals: tier-specific limits come back as Status, naming the argument --------------------

struct Refusal {
  Params params;
  DeviceBuffer buffer;
  DeviceBuffer backward_buffer;
};

// A tiny valid call on the current device (`seqlen` queries and keys); tests then break one thing.
Refusal tiny_call(Backend backend, DType dtype, int64_t head_dim, int64_t seqlen = 8) {
  Refusal r;
  int ordinal = 0;
  cudaGetDevice(&ordinal);
  const Device dev{DeviceType::cuda, ordinal};
  const int64_t n = 2 * seqlen * 2 * head_dim;
  r.buffer = DeviceBuffer(size_t(n) * 4 * 8 + 1024);
  char* base = static_cast<char*>(r.buffer.ptr);
  const size_t stride = size_t(n) * 4;
  Params& p = r.params;
  p.q = make_tensor(base, dtype, {2, seqlen, 2, head_dim}, dev);
  p.k = make_tensor(base + stride, dtype, {2, seqlen, 2, head_dim}, dev);
  p.v = make_tensor(base + 2 * stride, dtype, {2, seqlen, 2, head_dim}, dev);
  p.o = make_tensor(base + 3 * stride, dtype, {2, seqlen, 2, head_dim}, dev);
  p.backend = backend;
  return r;
}

// Adds the backward's tensors (dout, dq, dk, dv in `dtype`, fp32 LSE) to a tiny call of q's
// sequence length, so that it passes the argument checks and reaches the tier's own.
void add_backward_tensors(Refusal& r, DType dtype, int64_t head_dim) {
  Params& p = r.params;
  const int64_t seqlen = p.q.size(1);
  const size_t bytes = size_t(2 * seqlen * 2 * head_dim) * dtype_size(dtype);
  r.backward_buffer = DeviceBuffer(4 * bytes + 4096);
  char* base = static_cast<char*>(r.backward_buffer.ptr);
  p.dout = make_tensor(base, dtype, {2, seqlen, 2, head_dim}, p.q.device);
  p.dq = make_tensor(base + bytes, dtype, {2, seqlen, 2, head_dim}, p.q.device);
  p.dk = make_tensor(base + 2 * bytes, dtype, {2, seqlen, 2, head_dim}, p.q.device);
  p.dv = make_tensor(base + 3 * bytes, dtype, {2, seqlen, 2, head_dim}, p.q.device);
  p.lse = make_tensor(base + 4 * bytes, DType::fp32, {2, 2, seqlen}, p.q.device);
}

// The tier `auto` gives a tf32 (or, with `precision`, split-tf32) forward of fp32 storage at
// `head_dim`: sm90 where it runs and takes the head dim, sm80 otherwise.
Backend tf32_forward_tier(int64_t head_dim, Precision precision = Precision::tf32) {
  return tier_available(Backend::cuda_sm90) &&
                 takes_head_dim(Backend::cuda_sm90, int(head_dim), DType::fp32, precision)
             ? Backend::cuda_sm90
             : Backend::cuda_sm80;
}

bool mentions(const Status& s, const std::string& word) { return s.message.find(word) != std::string::npos; }

// The tf32 forward compiles the default configuration alone: naming it runs it, naming another
// is refused with the reason (the tuner records such candidates as refused).
TEST(Sm90Tf32, OnlyTheDefaultConfigurationIsCompiled) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  if (!tier_available(Backend::cuda_sm90)) GTEST_SKIP() << "tier not available";
  for (int d : compiled_head_dims()) {
    if (!takes_head_dim(Backend::cuda_sm90, d, DType::fp32)) continue;
    Refusal r = tiny_call(Backend::cuda_sm90, DType::fp32, d, 32);
    r.params.precision = Precision::tf32;
    for (const char* name : cuda::sm90::kFwdVariantNames) {
      detail::CandidateScope scope(Backend::cuda_sm90, Direction::forward, name);
      const Status s = supports(r.params, Direction::forward);
      if (std::string(name) == cuda::sm90::kFwdVariantNames[cuda::sm90::kFwdDefault]) {
        EXPECT_TRUE(s.ok()) << name << ": " << s.message;
        VariantChoice choice;
        EXPECT_TRUE(selected_variant(r.params, Direction::forward, &choice).ok());
        EXPECT_EQ(choice.variant, name);
      } else {
        EXPECT_EQ(s.code, Code::unsupported) << name << ": " << s.message;
        EXPECT_TRUE(mentions(s, "FMHA_SM90_FWD_CONFIG")) << s.message;
      }
    }
  }
}

// The 16-bit forward's default at each head dim (default_fwd_variant: spec for dense calls at
// 64, 128 and 256, compiled there in every build; pingpong at the others), and each variant named:
// run where every variant is compiled (the tuned head dims), elsewhere run if compiled there (the
// default, spec at FMHA_SM90_SPEC_HEAD_DIMS), else ignored for the shape's default.
TEST(Sm90Variants, DefaultsByHeadDim) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  if (!tier_available(Backend::cuda_sm90)) GTEST_SKIP() << "tier not available";
  if (std::getenv("FMHA_SM90_FWD_CONFIG")) GTEST_SKIP() << "FMHA_SM90_FWD_CONFIG names the variant";
  using namespace cuda::sm90;
  const ScopedTuneCache no_cache("sm90_defaults_by_head_dim");  // no cached winner picks for the call
  for (int d : compiled_head_dims()) {
    if (!takes_head_dim(Backend::cuda_sm90, d)) continue;
    Refusal r = tiny_call(Backend::cuda_sm90, DType::bf16, d, 32);
    const std::string shape_default = kFwdVariantNames[default_fwd_variant(d, false)];
    VariantChoice choice;
    ASSERT_TRUE(selected_variant(r.params, Direction::forward, &choice).ok()) << d;
    EXPECT_EQ(choice.variant, shape_default) << d;
    // Every variant is compiled at d where naming one that is no default there runs it.
    bool tuned = false;
    {
      detail::CandidateScope scope(Backend::cuda_sm90, Direction::forward, "overlap");
      ASSERT_TRUE(selected_variant(r.params, Direction::forward, &choice).ok()) << d;
      tuned = choice.variant == "overlap";
      if (!tuned) EXPECT_EQ(choice.variant, shape_default) << d;
    }
    for (int v = 0; v < kFwdVariants; ++v) {
      const std::string name = kFwdVariantNames[v];
      detail::CandidateScope scope(Backend::cuda_sm90, Direction::forward, name);
      const Status s = supports(r.params, Direction::forward);
      EXPECT_TRUE(s.ok()) << name << " at " << d << ": " << s.message;
      ASSERT_TRUE(selected_variant(r.params, Direction::forward, &choice).ok()) << name << " at " << d;
      if (tuned) EXPECT_EQ(choice.variant, name) << d;
      else EXPECT_TRUE(choice.variant == name || choice.variant == shape_default) << name << " at " << d << " ran "
                                                                                 << choice.variant;
    }
  }
}

TEST(Refuse, SmallTierLimits) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const int hd = compiled_head_dims().front();
  {
    Refusal r = tiny_call(Backend::cuda_simt, DType::fp16, hd);
    const Status s = supports(r.params, Direction::forward);
    EXPECT_EQ(s.code, Code::unsupported) << s.message;
    EXPECT_TRUE(mentions(s, "q:")) << s.message;
  }
  {
    Refusal r = tiny_call(Backend::cuda_simt, DType::fp32, 300);
    const Status s = supports(r.params, Direction::forward);
    EXPECT_EQ(s.code, Code::unsupported) << s.message;
    EXPECT_TRUE(mentions(s, "head_dim")) << s.message;
  }
  // A head dim whose bucket is pruned from this build.
  for (int bucket : {32, 64, 96, 128, 192, 256}) {
    const auto dims = compiled_head_dims();
    if (std::find(dims.begin(), dims.end(), bucket) != dims.end()) continue;
    Refusal r = tiny_call(Backend::cuda_simt, DType::fp32, bucket);
    const Status s = supports(r.params, Direction::forward);
    EXPECT_EQ(s.code, Code::unsupported) << s.message;
    EXPECT_TRUE(mentions(s, "not compiled into this build (FMHA_HEAD_DIMS")) << s.message;
    break;
  }
  // Backward without workspace.
  {
    Refusal r = tiny_call(Backend::cuda_simt, DType::fp32, hd);
    add_backward_tensors(r, DType::fp32, hd);
    const Status s = backward(r.params);
    EXPECT_EQ(s.code, Code::invalid_argument) << s.message;
    EXPECT_TRUE(mentions(s, "workspace")) << s.message;
  }
  if (tier_available(Backend::cuda_sm80)) {
    {
      Refusal r = tiny_call(Backend::cuda_sm80, DType::fp32, hd);  // fp32 with ieee: simt's job
      const Status s = supports(r.params, Direction::forward);
      EXPECT_EQ(s.code, Code::unsupported) << s.message;
      EXPECT_TRUE(mentions(s, "precision")) << s.message;
    }
    {
      Refusal r = tiny_call(Backend::cuda_sm80, DType::bf16, hd);
      r.params.q.data = static_cast<char*>(r.params.q.data) + 2;  // 2-byte aligned only
      const Status s = supports(r.params, Direction::forward);
      EXPECT_EQ(s.code, Code::unsupported) << s.message;
      EXPECT_TRUE(mentions(s, "q:")) << s.message;
    }
    {
      Refusal r = tiny_call(Backend::cuda_sm80, DType::fp16, hd);
      r.params.k.stride[1] = 2 * hd + 1;  // row stride not a multiple of the 16-byte vector
      r.params.k.stride[0] = 8 * (2 * hd + 1);
      const Status s = supports(r.params, Direction::forward);
      EXPECT_EQ(s.code, Code::unsupported) << s.message;
      EXPECT_TRUE(mentions(s, "k:")) << s.message;
    }
    {
      // The backward also loads dO with 16-byte cp.async.
      Refusal r = tiny_call(Backend::cuda_sm80, DType::bf16, hd);
      const size_t bytes = size_t(2 * 8 * 2 * hd) * 2;
      DeviceBuffer more(4 * bytes + 4096);
      char* base = static_cast<char*>(more.ptr);
      Params& p = r.params;
      p.dout = make_tensor(base + 2, DType::bf16, {2, 8, 2, hd}, p.q.device);  // 2-byte aligned only
      p.dq = make_tensor(base + bytes + 256, DType::bf16, {2, 8, 2, hd}, p.q.device);
      p.dk = make_tensor(base + 2 * bytes + 512, DType::bf16, {2, 8, 2, hd}, p.q.device);
      p.dv = make_tensor(base + 3 * bytes + 768, DType::bf16, {2, 8, 2, hd}, p.q.device);
      p.lse = make_tensor(base + 4 * bytes + 1024, DType::fp32, {2, 2, 8}, p.q.device);
      const Status s = supports(p, Direction::backward);
      EXPECT_EQ(s.code, Code::unsupported) << s.message;
      EXPECT_TRUE(mentions(s, "dout:")) << s.message;
    }
    {
      Refusal r = tiny_call(Backend::auto_select, DType::fp32, hd);
      Backend chosen{};
      ASSERT_TRUE(select_backend(r.params, Direction::forward, &chosen).ok());
      EXPECT_EQ(chosen, Backend::cuda_simt);
      r.params.precision = Precision::tf32;
      ASSERT_TRUE(select_backend(r.params, Direction::forward, &chosen).ok());
      EXPECT_EQ(chosen, tf32_forward_tier(hd));
      // Split tf32: auto runs it on sm90 where that tier has the head dim, else on sm80; simt takes
      // it too (exact fp32), plain tf32 it refuses.
      r.params.precision = Precision::tf32x3;
      ASSERT_TRUE(select_backend(r.params, Direction::forward, &chosen).ok());
      EXPECT_EQ(chosen, tf32_forward_tier(hd, Precision::tf32x3));
      Params simt = r.params;
      simt.backend = Backend::cuda_simt;
      EXPECT_TRUE(supports(simt, Direction::forward).ok()) << supports(simt, Direction::forward).message;
      simt.precision = Precision::tf32;
      EXPECT_EQ(supports(simt, Direction::forward).code, Code::unsupported);
    }
  }
  if (tier_available(Backend::cuda_sm90)) {
    const int big = compiled_head_dims().back();
    // What `auto` chooses for the call, forward and backward.
    auto expect_auto = [](Refusal& r, Backend forward, Backend backward) {
      r.params.backend = Backend::auto_select;
      Backend chosen{};
      ASSERT_TRUE(select_backend(r.params, Direction::forward, &chosen).ok());
      EXPECT_EQ(chosen, forward);
      ASSERT_TRUE(select_backend(r.params, Direction::backward, &chosen).ok());
      EXPECT_EQ(chosen, backward);
    };
    auto refused = [&](Refusal& r, Direction direction, const char* word) {
      const Status s = supports(r.params, direction);
      EXPECT_EQ(s.code, Code::unsupported) << s.message;
      EXPECT_TRUE(mentions(s, word)) << s.message;
    };
    {
      // fp32: ieee is refused; tf32 runs forward and backward at head dims 64 to 128; tf32x3
      // (split) forward and backward at 64; larger calls go to sm80.
      Refusal r = tiny_call(Backend::cuda_sm90, DType::fp32, big);
      refused(r, Direction::forward, "precision");
      r.params.precision = Precision::tf32x3;
      if (big > kSm90MaxTf32x3HeadDim) refused(r, Direction::forward, "head_dim");
      // A tiny call of `precision` at head dim d: the forward here, the backward (atomic and
      // deterministic) here up to max_backward and refused above, and auto's choice of each.
      auto expect_fp32 = [&](int d, Precision precision, int max_backward) {
        Refusal t = tiny_call(Backend::cuda_sm90, DType::fp32, d, 32);
        t.params.precision = precision;
        EXPECT_TRUE(supports(t.params, Direction::forward).ok()) << supports(t.params, Direction::forward).message;
        add_backward_tensors(t, DType::fp32, d);
        const bool backward_here = d <= max_backward;
        if (backward_here) {
          EXPECT_TRUE(supports(t.params, Direction::backward).ok()) << supports(t.params, Direction::backward).message;
          t.params.deterministic = true;
          EXPECT_TRUE(supports(t.params, Direction::backward).ok()) << supports(t.params, Direction::backward).message;
          t.params.deterministic = false;
        } else {
          refused(t, Direction::backward, "head_dim");
        }
        expect_auto(t, Backend::cuda_sm90, backward_here ? Backend::cuda_sm90 : Backend::cuda_sm80);
      };
      for (int d : compiled_head_dims())
        if (takes_head_dim(Backend::cuda_sm90, d, DType::fp32, Precision::tf32x3))
          expect_fp32(d, Precision::tf32x3, kSm90MaxTf32x3BackwardHeadDim);
      r.params.precision = Precision::tf32;
      if (big > 128) refused(r, Direction::forward, "head_dim");
      for (int d : compiled_head_dims())
        if (d >= 64 && d <= 128) expect_fp32(d, Precision::tf32, kSm90MaxTf32BackwardHeadDim);
    }
    const auto dims = compiled_head_dims();
    if (std::find(dims.begin(), dims.end(), 128) != dims.end()) {
      Refusal r = tiny_call(Backend::cuda_sm90, DType::bf16, 128);
      add_backward_tensors(r, DType::bf16, 128);
      EXPECT_TRUE(supports(r.params, Direction::backward).ok()) << supports(r.params, Direction::backward).message;
      r.params.deterministic = true;
      EXPECT_TRUE(supports(r.params, Direction::backward).ok()) << supports(r.params, Direction::backward).message;
    }
    if (big > 128) {  // the split backward (192, 256): auto takes it too
      Refusal r = tiny_call(Backend::cuda_sm90, DType::bf16, big);
      add_backward_tensors(r, DType::bf16, big);
      EXPECT_TRUE(supports(r.params, Direction::backward).ok()) << supports(r.params, Direction::backward).message;
      r.params.backend = Backend::auto_select;
      Backend chosen = Backend::auto_select;
      EXPECT_TRUE(select_backend(r.params, Direction::backward, &chosen).ok());
      EXPECT_EQ(chosen, Backend::cuda_sm90);
      r.params.backend = Backend::cuda_sm90;
      r.params.deterministic = true;
      EXPECT_TRUE(supports(r.params, Direction::backward).ok()) << supports(r.params, Direction::backward).message;
    }
    {
      Refusal r = tiny_call(Backend::cuda_sm90, DType::bf16, big);
      r.params.v.data = static_cast<char*>(r.params.v.data) + 8;  // 8-byte aligned only: TMA needs 16
      refused(r, Direction::forward, "v:");
    }
    {
      Refusal r = tiny_call(Backend::cuda_sm90, DType::fp16, big);
      r.params.o.stride[1] = 2 * big + 4;  // a row stride of 8 bytes past the 16-byte grid
      r.params.o.stride[0] = 8 * (2 * big + 4);
      refused(r, Direction::forward, "o:");
    }
    {
      Refusal r = tiny_call(Backend::cuda_sm90, DType::bf16, 32);
      refused(r, Direction::forward, "head_dim");
    }
    {
      // auto: decoding (seqlen_q <= 16) goes to sm80's decode kernel where it is compiled.
      Backend chosen{};
      {
        Refusal small = tiny_call(Backend::auto_select, DType::bf16, big);
        ASSERT_TRUE(select_backend(small.params, Direction::forward, &chosen).ok());
        const auto decode = decode_head_dims();
        const bool has_decode = std::find(decode.begin(), decode.end(), int64_t(big)) != decode.end();
        EXPECT_EQ(chosen, has_decode ? Backend::cuda_sm80 : Backend::cuda_sm90);
      }
      // Longer queries in bf16 go to sm90, also with padded rows; K and V shared by the whole
      // batch (batch stride 0, which TMA cannot encode) fall back to sm80, which reads them with
      // cp.async.
      constexpr int64_t kRows = 32;
      Refusal r = tiny_call(Backend::auto_select, DType::bf16, big, kRows);
      ASSERT_TRUE(select_backend(r.params, Direction::forward, &chosen).ok());
      EXPECT_EQ(chosen, Backend::cuda_sm90);
      r.params.q.stride[1] = 2 * big + 8;  // rows padded by 16 bytes: fine for TMA
      r.params.q.stride[0] = kRows * (2 * big + 8);
      ASSERT_TRUE(select_backend(r.params, Direction::forward, &chosen).ok());
      EXPECT_EQ(chosen, Backend::cuda_sm90);
      r.params.k.stride[0] = r.params.v.stride[0] = 0;
      const Status why = supports([&] {
        Params p = r.params;
        p.backend = Backend::cuda_sm90;
        return p;
      }(), Direction::forward);
      EXPECT_EQ(why.code, Code::unsupported) << why.message;
      EXPECT_TRUE(mentions(why, "k:")) << why.message;
      ASSERT_TRUE(select_backend(r.params, Direction::forward, &chosen).ok());
      EXPECT_EQ(chosen, Backend::cuda_sm80);
      r.params.k.stride[0] = r.params.v.stride[0] = kRows * 2 * big;
      r.params.precision = Precision::tf32;
      r.params.q.dtype = r.params.k.dtype = r.params.v.dtype = r.params.o.dtype = DType::fp32;
      r.params.q.stride[1] = 2 * big, r.params.q.stride[0] = kRows * 2 * big;
      ASSERT_TRUE(select_backend(r.params, Direction::forward, &chosen).ok());
      EXPECT_EQ(chosen, tf32_forward_tier(big));
    }
  }
}

// A workspace too small for the sm90 forward's tile counter is refused, naming it.
TEST(Sm90Schedule, ShortWorkspaceIsRefused) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  if (!tier_available(Backend::cuda_sm90)) GTEST_SKIP() << "tier not available";
  const int hd = compiled_head_dims().back();
  if (!takes_head_dim(Backend::cuda_sm90, hd)) GTEST_SKIP() << "no sm90 head dim in this build";
  Refusal r = tiny_call(Backend::cuda_sm90, DType::bf16, hd);
  r.params.workspace = r.params.q.data;
  r.params.workspace_bytes = 2;  // less than one counter
  const Status s = forward(r.params);
  EXPECT_EQ(s.code, Code::invalid_argument) << s.message;
  EXPECT_TRUE(mentions(s, "workspace")) << s.message;
}

}  // namespace
}  // namespace fmha::test
