// The tuner on the GPU tiers (include/fmha/tune.h): every variant compiled for a class runs and
// agrees with the default, the fastest is cached, and dispatch then runs it. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fmha/fmha.h"
#include "common/decode.h"
#include "fmha/tune.h"
#include "gpu_test_util.h"
#include "tune/cache.h"

namespace {

using fmha::test::ScopedTuneCache;

bool have_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

struct TuneCase {
  const char* name;
  fmha::Backend backend;
  fmha::DType dtype;
  fmha::Precision precision;
  int64_t head_dim;
  fmha::Direction direction;
  fmha::Causal causal;
};

class GpuTune : public ::testing::TestWithParam<TuneCase> {};

TEST_P(GpuTune, EveryCompiledVariantAgreesAndTheFastestIsUsed) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const TuneCase& c = GetParam();
  const ScopedTuneCache cache(std::string("fmha_gpu_tune_") + c.name);
  fmha::Params p;  // shapes only: the tuner allocates its own inputs
  const fmha::Device gpu{fmha::DeviceType::cuda, 0};
  p.q = fmha::make_tensor(nullptr, c.dtype, {2, 1000, 4, c.head_dim}, gpu);
  p.k = p.v = fmha::make_tensor(nullptr, c.dtype, {2, 1000, 2, c.head_dim}, gpu);
  p.precision = c.precision;
  p.causal = c.causal;
  p.backend = c.backend;
  fmha::TuneOptions options;
  options.iters = 3;
  options.warmup = 1;
  fmha::TuneResult r;
  const fmha::Status s = fmha::tune(p, c.direction, options, &r);
  if (s.code == fmha::Code::unsupported || s.code == fmha::Code::no_device) GTEST_SKIP() << s.message;
  ASSERT_TRUE(s.ok()) << s.message;
  int timed = 0;
  for (const fmha::VariantTiming& v : r.variants) {
    EXPECT_EQ(v.status.find("disagrees"), std::string::npos) << v.variant << ": " << v.status;
    EXPECT_EQ(v.status.find("failed"), std::string::npos) << v.variant << ": " << v.status;
    timed += v.agrees;
  }
  EXPECT_GE(timed, 2) << "at a tuned head dim, several variants run: " << r.problem.key();
  // A real call of the class now runs the winner, chosen by the cache.
  fmha::detail::reload_tune_cache();
  void* memory = nullptr;
  const size_t bytes = size_t(2) * 1000 * 4 * c.head_dim * 4 * 8;
  ASSERT_EQ(cudaMalloc(&memory, bytes), cudaSuccess);
  fmha::Params call = p;
  char* base = static_cast<char*>(memory);
  const size_t part = bytes / 8;
  call.q.data = base;
  call.k.data = base + part;
  call.v.data = base + 2 * part;
  call.o = fmha::make_tensor(base + 3 * part, c.dtype, {2, 1000, 4, c.head_dim}, gpu);
  call.lse = fmha::make_tensor(base + 4 * part, fmha::DType::fp32, {2, 4, 1000}, gpu);
  call.dout = call.o;
  call.dq = fmha::make_tensor(base + 5 * part, c.dtype, {2, 1000, 4, c.head_dim}, gpu);
  call.dk = fmha::make_tensor(base + 6 * part, c.dtype, {2, 1000, 2, c.head_dim}, gpu);
  call.dv = fmha::make_tensor(base + 7 * part, c.dtype, {2, 1000, 2, c.head_dim}, gpu);
  fmha::VariantChoice choice;
  ASSERT_TRUE(fmha::selected_variant(call, c.direction, &choice).ok());
  EXPECT_EQ(choice.variant, r.winner);
  if (r.winner != r.default_variant) EXPECT_EQ(choice.source, "cache");
  cudaFree(memory);
}

// The sm80 decode kernel's calls tune their split count: every split variant runs, agrees with
// the heuristic's, and a call of the class then runs the winner with the workspace that
// workspace_size asks for.
TEST(GpuTuneDecode, SplitCountsAreTunedAndTheWinnerRuns) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const ScopedTuneCache cache("fmha_gpu_tune_decode");
  constexpr int64_t kHeads = 32, kKvHeads = 8, kDim = 128, kKeys = 8192;
  const fmha::Device gpu{fmha::DeviceType::cuda, 0};
  fmha::Params p;  // shapes only: one query token of one sequence against 8k keys
  p.q = fmha::make_tensor(nullptr, fmha::DType::bf16, {1, 1, kHeads, kDim}, gpu);
  p.k = p.v = fmha::make_tensor(nullptr, fmha::DType::bf16, {1, kKeys, kKvHeads, kDim}, gpu);
  p.backend = fmha::Backend::cuda_sm80;
  fmha::TuneOptions options;
  options.iters = 3;
  options.warmup = 1;
  fmha::TuneResult r;
  const fmha::Status s = fmha::tune(p, fmha::Direction::forward, options, &r);
  if (s.code == fmha::Code::unsupported || s.code == fmha::Code::no_device) GTEST_SKIP() << s.message;
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_TRUE(r.problem.decode) << r.problem.key();
  EXPECT_EQ(r.default_variant, "decode");
  ASSERT_EQ(r.variants.size(), 4u);
  const char* names[] = {"decode", "decode-half", "decode-twice", "decode-unsplit"};
  for (size_t i = 0; i < r.variants.size(); ++i) {
    EXPECT_EQ(r.variants[i].variant, names[i]);
    EXPECT_TRUE(r.variants[i].agrees) << r.variants[i].variant << ": " << r.variants[i].status;
  }
  fmha::detail::reload_tune_cache();
  void* memory = nullptr;
  const size_t q_bytes = size_t(kHeads * kDim) * 2, kv_bytes = size_t(kKeys * kKvHeads * kDim) * 2;
  ASSERT_EQ(cudaMalloc(&memory, 2 * q_bytes + 2 * kv_bytes + kHeads * sizeof(float)), cudaSuccess);
  char* base = static_cast<char*>(memory);
  fmha::Params call = p;
  call.q.data = base;
  call.k.data = base + q_bytes;
  call.v.data = base + q_bytes + kv_bytes;
  call.o = fmha::make_tensor(base + q_bytes + 2 * kv_bytes, fmha::DType::bf16, {1, 1, kHeads, kDim}, gpu);
  call.lse = fmha::make_tensor(base + 2 * q_bytes + 2 * kv_bytes, fmha::DType::fp32, {1, kHeads, 1}, gpu);
  ASSERT_EQ(cudaMemset(memory, 0, 2 * q_bytes + 2 * kv_bytes), cudaSuccess);
  fmha::VariantChoice choice;
  ASSERT_TRUE(fmha::selected_variant(call, fmha::Direction::forward, &choice).ok());
  EXPECT_EQ(choice.variant, r.winner);
  if (r.winner != r.default_variant) EXPECT_EQ(choice.source, "cache");
  size_t workspace = 0;
  ASSERT_TRUE(fmha::workspace_size(call, fmha::Direction::forward, &workspace).ok());
  void* scratch = nullptr;
  if (workspace > 0) ASSERT_EQ(cudaMalloc(&scratch, workspace), cudaSuccess);
  call.workspace = scratch;
  call.workspace_bytes = workspace;
  const fmha::Status run = fmha::forward(call);
  EXPECT_TRUE(run.ok()) << run.message;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(scratch);
  cudaFree(memory);
}

// A split-count winner cached after the caller sized the workspace for the heuristic's count (the
// cache written in between, by autotune or another process): the call runs the heuristic's count
// in that workspace, bit for bit what the heuristic's count asked for explicitly gives.
TEST(GpuTuneDecode, AWinnerCachedAfterTheWorkspaceWasSizedRunsTheHeuristicsCount) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const ScopedTuneCache cache("fmha_gpu_tune_decode_late");
  constexpr int64_t kHeads = 32, kKvHeads = 8, kDim = 128, kKeys = 8192;
  const fmha::Device gpu{fmha::DeviceType::cuda, 0};
  const size_t q_elems = size_t(kHeads * kDim), kv_elems = size_t(kKeys * kKvHeads * kDim);
  std::vector<uint16_t> host(q_elems + 2 * kv_elems);  // bf16 values in [-1, 1)
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (uint16_t& x : host) {
    const float f = uniform(rng);
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    x = uint16_t(bits >> 16);
  }
  void* memory = nullptr;
  const size_t bytes = host.size() * 2 + 2 * q_elems * 2;
  ASSERT_EQ(cudaMalloc(&memory, bytes), cudaSuccess);
  char* base = static_cast<char*>(memory);
  ASSERT_EQ(cudaMemcpy(base, host.data(), host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  fmha::Params call;
  call.q = fmha::make_tensor(base, fmha::DType::bf16, {1, 1, kHeads, kDim}, gpu);
  call.k = fmha::make_tensor(base + q_elems * 2, fmha::DType::bf16, {1, kKeys, kKvHeads, kDim}, gpu);
  call.v = fmha::make_tensor(base + (q_elems + kv_elems) * 2, fmha::DType::bf16, {1, kKeys, kKvHeads, kDim}, gpu);
  call.o = fmha::make_tensor(base + host.size() * 2, fmha::DType::bf16, {1, 1, kHeads, kDim}, gpu);
  call.backend = fmha::Backend::cuda_sm80;
  size_t heuristic_bytes = 0;
  const fmha::Status sized = fmha::workspace_size(call, fmha::Direction::forward, &heuristic_bytes);
  if (sized.code == fmha::Code::unsupported) GTEST_SKIP() << sized.message;
  ASSERT_TRUE(sized.ok()) << sized.message;
  ASSERT_GT(heuristic_bytes, 0u) << "one sequence of 8k keys splits";
  fmha::ProblemClass cls;
  ASSERT_TRUE(fmha::problem_class(call, fmha::Direction::forward, &cls).ok());
  ASSERT_TRUE(cls.decode) << cls.key();
  fmha::detail::CacheEntry winner;
  winner.variant = "decode-twice";
  winner.default_variant = "decode";
  ASSERT_TRUE(fmha::detail::store_in_cache(fmha::detail::device_key(gpu), cls.key(), winner).ok());
  fmha::detail::reload_tune_cache();
  fmha::VariantChoice choice;
  ASSERT_TRUE(fmha::selected_variant(call, fmha::Direction::forward, &choice).ok());
  EXPECT_EQ(choice.variant, "decode-twice");
  EXPECT_EQ(choice.source, "cache");
  size_t twice_bytes = 0;
  ASSERT_TRUE(fmha::workspace_size(call, fmha::Direction::forward, &twice_bytes).ok());
  EXPECT_GT(twice_bytes, heuristic_bytes) << "the winner's partials take more room";
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, twice_bytes), cudaSuccess);
  call.workspace = scratch;
  call.workspace_bytes = heuristic_bytes;  // what the caller asked for before the winner was cached
  fmha::Status run = fmha::forward(call);
  ASSERT_TRUE(run.ok()) << run.message;
  fmha::Params explicit_count = call;
  explicit_count.o =
      fmha::make_tensor(base + host.size() * 2 + q_elems * 2, fmha::DType::bf16, {1, 1, kHeads, kDim}, gpu);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  fmha::Params plain = call;
  plain.workspace = nullptr;
  explicit_count.num_splits = int(fmha::decode::plan(plain, sms).splits);
  run = fmha::forward(explicit_count);
  ASSERT_TRUE(run.ok()) << run.message;
  std::vector<uint16_t> tuned(q_elems), reference(q_elems);
  ASSERT_EQ(cudaMemcpy(tuned.data(), call.o.data, q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(reference.data(), explicit_count.o.data, q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(tuned, reference) << "the heuristic's " << explicit_count.num_splits << " splits, bit for bit";
  cudaFree(scratch);
  cudaFree(memory);
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, GpuTune,
    ::testing::Values(
        TuneCase{"simt_fwd", fmha::Backend::cuda_simt, fmha::DType::fp32, fmha::Precision::ieee, 64,
                 fmha::Direction::forward, fmha::Causal::none},
        TuneCase{"simt_bwd", fmha::Backend::cuda_simt, fmha::DType::fp32, fmha::Precision::ieee, 64,
                 fmha::Direction::backward, fmha::Causal::none},
        TuneCase{"sm80_fwd_tf32", fmha::Backend::cuda_sm80, fmha::DType::fp32, fmha::Precision::tf32, 64,
                 fmha::Direction::forward, fmha::Causal::bottom_right},
        TuneCase{"sm80_fwd", fmha::Backend::cuda_sm80, fmha::DType::bf16, fmha::Precision::ieee, 64,
                 fmha::Direction::forward, fmha::Causal::none},
        TuneCase{"sm80_bwd", fmha::Backend::cuda_sm80, fmha::DType::fp16, fmha::Precision::ieee, 128,
                 fmha::Direction::backward, fmha::Causal::bottom_right},
        TuneCase{"sm90_fwd", fmha::Backend::cuda_sm90, fmha::DType::bf16, fmha::Precision::ieee, 128,
                 fmha::Direction::forward, fmha::Causal::none},
        TuneCase{"sm90_fwd_causal", fmha::Backend::cuda_sm90, fmha::DType::fp16, fmha::Precision::ieee, 64,
                 fmha::Direction::forward, fmha::Causal::bottom_right}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
