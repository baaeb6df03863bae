// The fuzz suite on the CPU (tests/fuzz/fuzz.h has the generator and the rule): random calls of
// every shape, mask, scale, magnitude, layout and dtype, forward and backward, each against the
// fp64 oracle. Each shard is its own CTest test, so `ctest -j` spreads them over the cores.
// FMHA_FUZZ_SEED=<seed> replays one failing case; FMHA_FUZZ_COUNT sets how many run in all;
// FMHA_FUZZ_BASE_SEED=clock draws fresh cases instead of CI's fixed set.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cpu_path.h"
#include "fuzz/fuzz.h"

namespace fmha::fuzz {
namespace {

constexpr int64_t kCasesPerRun = 2000;
constexpr int kShards = 8;

class CpuFuzz : public ::testing::TestWithParam<int> {};

TEST_P(CpuFuzz, MatchesOracleWithinNaiveError) {
  const Tier tier = cpu_tier();
  // Each case runs on one of the instruction-set paths this CPU runs, chosen by its seed.
  const std::vector<std::string> paths = cpu_paths().runnable;
  ASSERT_FALSE(paths.empty());
  const Runner runner = [](const Params& p, Direction dir) { return dir == Direction::forward ? forward(p) : backward(p); };
  int64_t ran = 0, failed = 0;
  for (uint64_t seed : seeds(kCasesPerRun, GetParam(), kShards)) {
    const Config c = generate(seed, tier);
    const std::string& path = paths[seed % paths.size()];
    const testing::ForceCpuPath force(path);
    const Outcome o = check(c, runner);
    ++ran;
    EXPECT_FALSE(o.refused) << "the cpu backend refused " << c.describe();
    if (!o.failure.empty()) {
      ++failed;
      ADD_FAILURE() << c.describe() << " (path " << path << ")\n" << o.failure << "  replay: FMHA_FUZZ_SEED=" << seed
                    << " fmha_tests --gtest_filter='Fuzz/CpuFuzz.*' (the seed picks the path too)";
    }
  }
  std::printf("shard %d: %lld cases, %lld failed\n", GetParam(), (long long)ran, (long long)failed);
}

// Peaked softmax (fuzz.h: scale 1.0, head dim 128, inputs of standard deviation 3, scores of
// ~100): the fp32 backward within the peaked bound, 2x the naive fp32 computation's error on dQ,
// dK and dV plus a rounding term. Recomputing P from an fp32 LSE of ~100 made dV ~60x worse.
TEST(CpuPeakedSoftmax, BackwardWithinTwiceNaiveFp32Error) {
  const Runner runner = [](const Params& p, Direction dir) { return dir == Direction::forward ? forward(p) : backward(p); };
  for (const std::string& path : cpu_paths().runnable) {
    const testing::ForceCpuPath force(path);
    for (Causal causal : {Causal::none, Causal::bottom_right})
      for (int64_t group : {1, 4}) {
        const uint64_t seed = 20261203 + uint64_t(group) + uint64_t(causal == Causal::none ? 0 : 1);
        const Config c = peaked_config(seed, Backend::cpu, Precision::ieee, causal, group, 128, false);
        const Outcome o = check(c, runner);
        EXPECT_TRUE(o.failure.empty()) << c.describe() << " (path " << path << ")\n" << o.failure;
        const std::string peaked = peaked_failure(o);
        EXPECT_TRUE(peaked.empty()) << c.describe() << " (path " << path << ")\n" << peaked;
      }
  }
}

// Negative softmax scales (the API takes any finite scale): 240 of the fuzz's calls with their
// scale negated, each against the oracle under the same rule, on the instruction-set paths this
// CPU runs.
TEST(CpuNegativeScale, MatchesOracleWithinNaiveError) {
  const std::vector<std::string> paths = cpu_paths().runnable;
  ASSERT_FALSE(paths.empty());
  const Runner runner = [](const Params& p, Direction dir) { return dir == Direction::forward ? forward(p) : backward(p); };
  int64_t ran = 0;
  for (uint64_t seed : seeds(240, 0, 1)) {
    const Config c = with_negative_scale(generate(seed, cpu_tier()));
    ASSERT_LT(c.softmax_scale, 0.f);
    const std::string& path = paths[seed % paths.size()];
    const testing::ForceCpuPath force(path);
    const Outcome o = check(c, runner);
    ++ran;
    EXPECT_FALSE(o.refused) << "the cpu backend refused " << c.describe();
    EXPECT_TRUE(o.failure.empty()) << c.describe() << " (path " << path << ")\n" << o.failure;
  }
  EXPECT_GT(ran, 0);
}

// The GPU tiers' generators (run on the GPU by fuzz_gpu_test.cpp): the sm90 tier draws its fp32
// flavors too, each at the head dims its kernels take (tf32 up to 128, split tf32 64), and drops
// a flavor that no compiled head dim serves.
TEST(FuzzGenerator, Sm90Fp32FlavorsDrawTheirHeadDims) {
  const Tier tier = gpu_tier(Backend::cuda_sm90, {32, 64, 96, 128, 192, 256});
  ASSERT_EQ(tier.flavors.size(), 4u);
  EXPECT_EQ(flavor_head_dims(tier, tier.flavors[0]), (std::vector<int64_t>{64, 96, 128, 192, 256}));
  int64_t drawn[3] = {0, 0, 0};  // 16-bit, tf32, tf32x3
  for (uint64_t seed = 1; seed <= 2000; ++seed) {
    const Config c = generate(seed, tier);
    const int64_t d = std::max(c.head_dim, c.head_dim_v);
    EXPECT_GE(std::min(c.head_dim, c.head_dim_v), 64) << c.describe();
    if (c.dtype != DType::fp32) {
      ++drawn[0];
    } else if (c.precision == Precision::tf32) {
      ++drawn[1];
      EXPECT_LE(d, kSm90Tf32MaxHeadDim) << c.describe();
    } else {
      ++drawn[2];
      EXPECT_EQ(c.precision, Precision::tf32x3);
      EXPECT_EQ(d, kSm90Tf32x3MaxHeadDim) << c.describe();
    }
  }
  for (int64_t n : drawn) EXPECT_GT(n, 300);
  // Without head dim 64 the split flavor has nothing to draw, and only the tiers' own remain.
  const Tier wide = gpu_tier(Backend::cuda_sm90, {128, 256});
  ASSERT_EQ(wide.flavors.size(), 3u);
  EXPECT_EQ(wide.flavors[2].precision, Precision::tf32);
  // The other tiers are as they were: no limits of their own.
  for (Backend b : {Backend::cuda_simt, Backend::cuda_sm80})
    for (const Tier::Flavor& f : gpu_tier(b, {64, 128}).flavors) EXPECT_EQ(f.max_head_dim, 0) << to_string(b);
}

INSTANTIATE_TEST_SUITE_P(Fuzz, CpuFuzz, ::testing::Range(0, kShards),
                         [](const auto& info) { return "shard" + std::to_string(info.param); });

}  // namespace
}  // namespace fmha::fuzz
