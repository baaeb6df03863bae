// The fuzz suite on the CPU (tests/fuzz/fuzz.h has the generator and the rule): random calls of
// every shape, mask, scale, magnitude, layout and dtype, forward and backward, each against the
// fp64 oracle. Each shard is its own CTest test, so `ctest -j` spreads them over the cores.
// FMHA_FUZZ_SEED=<seed> replays one failing case; FMHA_FUZZ_COUNT sets how many run in all;
// FMHA_FUZZ_BASE_SEED=clock draws fresh cases instead of CI's fixed set.
#include <gtest/gtest.h>

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

INSTANTIATE_TEST_SUITE_P(Fuzz, CpuFuzz, ::testing::Range(0, kShards),
                         [](const auto& info) { return "shard" + std::to_string(info.param); });

}  // namespace
}  // namespace fmha::fuzz
