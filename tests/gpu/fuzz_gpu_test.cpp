// The fuzz suite (tests/fuzz/fuzz.h) over each GPU tier: the CPU suite's generator and rule, each
// call copied to the device (every tensor with its strides and padding), run there, and copied
// back. Skips without a GPU or where the tier is not built or not runnable. FMHA_FUZZ_COUNT sets
// the number of cases per tier (default kCasesPerTier, in kShards tests of their own),
// FMHA_FUZZ_SEED=<seed> replays one. GpuPeakedSoftmax holds each fp32 backward to the peaked
// bound (fuzz.h) on the fixed peaked calls.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/precision.h"
#include "common/problem.h"
#include "fmha/tune.h"
#include "fuzz/fuzz.h"
#include "gpu_test_util.h"

namespace fmha::fuzz {
namespace {

constexpr int64_t kCasesPerTier = 2000;
constexpr int kShards = 4;

std::vector<int64_t> compiled_head_dims() {
  std::vector<int64_t> out;
  std::stringstream in(FMHA_TEST_HEAD_DIMS);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

// Runs a call whose views point into host memory on the current CUDA device: each tensor's whole
// host storage (strides and padding included) is copied over, the views re-pointed, and the
// outputs copied back after the call.
Status run_on_device(const Params& host, Direction dir) {
  int ordinal = 0;
  cudaGetDevice(&ordinal);
  const Device dev{DeviceType::cuda, ordinal};
  Params p = host;
  std::vector<test::DeviceBuffer> buffers;
  buffers.reserve(10);
  struct Mapped {
    Tensor* view;
    const Tensor* host;
    size_t bytes;
    bool output;
  };
  std::vector<Mapped> maps;
  auto span_bytes = [](const Tensor& t) {
    int64_t last = 0;
    for (int d = 0; d < t.rank; ++d) last += (t.shape[d] > 0 ? t.shape[d] - 1 : 0) * t.stride[d];
    return size_t(last + 1) * dtype_size(t.dtype);
  };
  const bool bwd = dir == Direction::backward;
  Tensor* views[] = {&p.q, &p.k, &p.v, &p.o, &p.lse, &p.dout, &p.dq, &p.dk, &p.dv};
  const Tensor* hosts[] = {&host.q, &host.k, &host.v, &host.o, &host.lse, &host.dout, &host.dq, &host.dk, &host.dv};
  for (int i = 0; i < 9; ++i) {
    if (!hosts[i]->defined()) continue;
    const bool output = bwd ? i >= 6 : (i == 3 || i == 4);
    const size_t bytes = span_bytes(*hosts[i]);
    buffers.emplace_back(bytes);
    std::vector<uint8_t> data(static_cast<const uint8_t*>(hosts[i]->data), static_cast<const uint8_t*>(hosts[i]->data) + bytes);
    buffers.back().upload(data);
    views[i]->data = buffers.back().ptr;
    views[i]->device = dev;
    maps.push_back({views[i], hosts[i], bytes, output});
  }
  p.num_threads = 0;
  size_t workspace = 0;
  if (Status s = workspace_size(p, dir, &workspace); !s.ok()) return s;
  test::DeviceBuffer ws(workspace);
  p.workspace = ws.ptr;
  p.workspace_bytes = workspace;
  const Status s = dir == Direction::forward ? forward(p) : backward(p);
  if (!s.ok()) return s;
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return {Code::cuda_error, cudaGetErrorString(e)};
  size_t b = 0;
  for (const Mapped& m : maps) {
    if (m.output) {
      const std::vector<uint8_t> out = buffers[b].download();
      std::copy(out.begin(), out.end(), static_cast<uint8_t*>(m.host->data));
    }
    ++b;
  }
  return Status::success();
}

// Skips unless a device is present and `backend` compiled.
#define SKIP_UNLESS_RUNNABLE(backend)                                                                 \
  do {                                                                                               \
    if (!test::have_cuda_device()) GTEST_SKIP() << "no CUDA device";                                 \
    const auto compiled = compiled_backends();                                                       \
    if (std::find(compiled.begin(), compiled.end(), backend) == compiled.end())                      \
      GTEST_SKIP() << "tier not compiled";                                                           \
  } while (false)

class GpuFuzz : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(GpuFuzz, MatchesOracleWithinNaiveError) {
  const Backend backend = std::get<0>(GetParam());
  const int shard = std::get<1>(GetParam());
  SKIP_UNLESS_RUNNABLE(backend);
  const Tier tier = gpu_tier(backend, compiled_head_dims());
  int64_t ran = 0, refused = 0, failed = 0;
  for (uint64_t seed : seeds(kCasesPerTier, shard, kShards)) {
    const Config c = generate(seed, tier);
    const Outcome o = check(c, run_on_device);
    ++ran;
    if (o.refused) {
      ++refused;
      continue;
    }
    if (!o.failure.empty()) {
      ++failed;
      ADD_FAILURE() << c.describe() << "\n" << o.failure << "  replay: FMHA_FUZZ_SEED=" << seed
                    << " fmha_gpu_tests --gtest_filter='Fuzz/GpuFuzz.*" << to_string(backend)
                    << "_shard0'";
    }
  }
  std::printf("%s shard %d: %lld cases, %lld refused, %lld failed\n", to_string(backend), shard, (long long)ran, (long long)refused,
              (long long)failed);
  if (refused == ran && ran > 0) GTEST_SKIP() << "the tier refused every case (not runnable on this GPU)";
  EXPECT_LE(refused * 10, ran) << "the tier refused more than a tenth of the cases";
}

INSTANTIATE_TEST_SUITE_P(Fuzz, GpuFuzz,
                         ::testing::Combine(::testing::Values(Backend::cuda_simt, Backend::cuda_sm80, Backend::cuda_sm90),
                                            ::testing::Range(0, kShards)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_shard" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Peaked softmax (fuzz.h): each tier's fp32 backward (every fp32 precision it runs) within the
// peaked bound, on the CPU test's calls and more: head dims 64 and 128 where compiled, GQA 1 and
// 4, no mask and bottom_right (rows that see no key), atomic and deterministic dQ. The simt
// backward that recovered P from the fp32 LSE failed this on dV (~15x) and on dQ/dK (2-4x).
class GpuPeakedSoftmax : public ::testing::TestWithParam<Backend> {};

// The fp32 precisions a tier's backward runs.
std::vector<Precision> fp32_precisions(const Tier& tier) {
  std::vector<Precision> precisions;
  for (const Tier::Flavor& flavor : tier.flavors)
    if (flavor.dtype == DType::fp32 && std::find(precisions.begin(), precisions.end(), flavor.precision) == precisions.end())
      precisions.push_back(flavor.precision);
  return precisions;
}

TEST_P(GpuPeakedSoftmax, BackwardWithinTwiceNaiveFp32Error) {
  const Backend backend = GetParam();
  SKIP_UNLESS_RUNNABLE(backend);
  const Tier tier = gpu_tier(backend, compiled_head_dims());
  if (!tier.backward) GTEST_SKIP() << "the tier has no backward";
  int64_t ran = 0;
  for (Precision precision : fp32_precisions(tier)) {
    for (int64_t head_dim : {int64_t(64), int64_t(128)}) {
      if (std::find(tier.head_dims.begin(), tier.head_dims.end(), head_dim) == tier.head_dims.end()) continue;
      for (Causal causal : {Causal::none, Causal::bottom_right})
        for (int64_t group : {1, 4})
          for (bool deterministic : {false, true}) {
            const uint64_t seed = 20261203 + uint64_t(group) + uint64_t(causal == Causal::none ? 0 : 1);
            const Config c = peaked_config(seed, backend, precision, causal, group, head_dim, deterministic);
            const Outcome o = check(c, run_on_device);
            if (o.refused) continue;
            ++ran;
            EXPECT_TRUE(o.failure.empty()) << c.describe() << "\n" << o.failure;
            const std::string peaked = peaked_failure(o);
            EXPECT_TRUE(peaked.empty()) << c.describe() << "\n" << peaked;
          }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no fp32 backward call ran on this tier";
}

// Rows that see one key, in a large-logit call (scale 1, inputs of std 3: scores of ~50-100 from
// head-dim products that often cancel to near 0): P of such a row is 1, so dV of a key that only
// one such row sees is that row's dO, exactly where the backward computes in fp32 (simt, every
// precision) and to the operand rounding on tensor cores (tf32: 2^-11; split tf32: 2^-20 of |dO|,
// the residual the split drops). Where the backward forms P from its own softmax statistics
// (simt; sm80 and sm90 split tf32) dQ and dK of such rows and keys are exactly 0: dS = P·(dP - Δ)
// with Δ = rowsum(P∘dP) of the same dP bits (on sm80 this needs the main kernel's S^T and dP^T to
// equal the statistics kernel's S and dP bit for bit: tile::warp::mma_transposed; on sm90 both
// kernels form them with issue_split_products). A backward
// whose P is off 1 by the forward's rounding of the score (simt's own-softmax test of the LSE,
// fooled where the score's products cancel; P recovered from the LSE) misses by ~1e-5 of dO. Masks: causal top-left with a
// window of 0 (row i sees key i; keys past the rows are seen by none), and causal bottom-right
// with one key (only the last row sees it). One KV head per query head: dV sums no other row.
TEST_P(GpuPeakedSoftmax, OneKeyRowsTakePExactlyOne) {
  const Backend backend = GetParam();
  SKIP_UNLESS_RUNNABLE(backend);
  const Tier tier = gpu_tier(backend, compiled_head_dims());
  if (!tier.backward) GTEST_SKIP() << "the tier has no backward";
  const std::vector<Precision> precisions = fp32_precisions(tier);
  struct MaskCase {
    Causal causal;
    int64_t seqlen_q, seqlen_k, window_left;
  };
  constexpr MaskCase kMasks[] = {{Causal::top_left, 77, 90, 0}, {Causal::bottom_right, 9, 1, -1}};
  int64_t ran = 0;
  for (Precision precision : precisions) {
    // Relative distance of dV from dO allowed on a one-key row: 0 where the arithmetic is fp32.
    const double tolerance = backend == Backend::cuda_simt ? 0.0
                             : precision == Precision::tf32 ? std::ldexp(1.0, -11)
                                                            : std::ldexp(1.0, -20);
    const bool own_statistics = backend == Backend::cuda_simt || precision == Precision::tf32x3;
    for (int64_t head_dim : {int64_t(64), int64_t(128)}) {
      if (std::find(tier.head_dims.begin(), tier.head_dims.end(), head_dim) == tier.head_dims.end()) continue;
      for (const MaskCase& m : kMasks)
        for (bool deterministic : {false, true}) {
          Config c;
          c.seed = 20261205 + uint64_t(head_dim) + uint64_t(m.seqlen_k);
          c.backend = backend;
          c.dtype = DType::fp32;
          c.precision = precision;
          c.batch = 2, c.heads = c.kv_heads = 4;
          c.seqlen_q = m.seqlen_q, c.seqlen_k = m.seqlen_k, c.head_dim = c.head_dim_v = head_dim;
          c.causal = m.causal, c.window_left = m.window_left;
          c.softmax_scale = 1.f;
          c.magnitude = kPeakedMagnitude;
          c.deterministic = deterministic;
          Problem pr = make_problem(c);
          Params fwd = pr.params();
          fwd.dout = fwd.dq = fwd.dk = fwd.dv = Tensor{};
          const Status fs = run_on_device(fwd, Direction::forward);
          if (fs.code == Code::unsupported) continue;
          ASSERT_TRUE(fs.ok()) << fs.message;
          const Status bs = run_on_device(pr.params(), Direction::backward);
          if (bs.code == Code::unsupported) continue;
          ASSERT_TRUE(bs.ok()) << bs.message;
          ++ran;
          const fmha::Problem s = fmha::Problem::of(pr.params());
          // [B, S, H, D] contiguous (Layout::bshd): element (b, row, h, d).
          const auto at = [&](const HostTensor& t, int64_t rows, int64_t b, int64_t row, int64_t h, int64_t d) {
            return reinterpret_cast<const float*>(t.bytes.data())[((b * rows + row) * c.heads + h) * head_dim + d];
          };
          int64_t one_key_rows = 0, bad = 0;
          std::ostringstream first;
          const auto expect = [&](const char* name, int64_t b, int64_t row, int64_t h, int64_t d, float got, float want,
                                  double allowed) {
            if (std::abs(double(got) - double(want)) <= allowed) return;
            if (bad++ == 0)
              first << name << "[" << b << "," << row << "," << h << "," << d << "] = " << got << ", expected "
                    << want << " within " << allowed;
          };
          for (int64_t b = 0; b < c.batch; ++b)
            for (int64_t h = 0; h < c.heads; ++h)
              for (int64_t i = 0; i < c.seqlen_q; ++i) {
                const Range keys = s.mask.keys(i);
                if (keys.size() != 1 || s.mask.queries(keys.begin).size() != 1)
                  continue;  // the key must be seen by this row alone
                ++one_key_rows;
                const int64_t j = keys.begin;
                for (int64_t d = 0; d < head_dim; ++d) {
                  const float dout = at(pr.dout, c.seqlen_q, b, i, h, d);
                  expect("dv", b, j, h, d, at(pr.dv, c.seqlen_k, b, j, h, d), dout, tolerance * std::abs(dout));
                  if (!own_statistics) continue;
                  expect("dq", b, i, h, d, at(pr.dq, c.seqlen_q, b, i, h, d), 0.f, 0.0);
                  expect("dk", b, j, h, d, at(pr.dk, c.seqlen_k, b, j, h, d), 0.f, 0.0);
                }
              }
          EXPECT_GT(one_key_rows, 0) << c.describe() << ": no row sees one key of its own";
          EXPECT_EQ(bad, 0) << c.describe() << "\n" << first.str() << " (" << bad << " elements off)";
          const Outcome o = check(c, run_on_device);
          EXPECT_TRUE(o.failure.empty()) << c.describe() << "\n" << o.failure;
        }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no fp32 backward call ran on this tier";
}

// A given LSE larger than the call's own (the call is one part of the keys, the LSE the merged
// softmax's, as in ring attention's backward): P = exp(scale·S - LSE) is the part's share of that
// softmax. The simt backward and sm80's split tf32 form P from their own statistics, scaled by
// exp(own - LSE) where the two differ; against the CPU backend's backward of the same call
// (Merge.PerPart* tests that one against the fp64 oracle). Row r's share is 1 (the own-softmax
// path) or 0.3 to 0.999.
// `tolerance`: the relative 2-norm of the difference allowed, far below the smallest share's
// 1e-3 that a P not scaled by exp(own - LSE) would leave.
void expect_given_lse_scales_p(Backend backend, Precision precision, double tolerance) {
  constexpr double kShares[] = {1.0, 0.3, 0.5, 0.9, 0.99, 1.0 - 1e-3};
  int64_t ran = 0;
  for (int64_t head_dim : compiled_head_dims())
    for (bool deterministic : {false, true}) {
      Config c;
      c.seed = 20261204 + uint64_t(head_dim) + (deterministic ? 1 : 0);
      c.backend = Backend::cpu;
      c.batch = 2, c.heads = 4, c.kv_heads = 2, c.seqlen_q = 77, c.seqlen_k = 130;
      c.head_dim = c.head_dim_v = head_dim;
      c.causal = Causal::bottom_right;
      c.window_left = 90;
      c.softmax_scale = 0.5f;
      c.magnitude = 1.5f;
      c.deterministic = deterministic;
      Problem pr = make_problem(c);
      Params fwd = pr.params();
      fwd.dout = fwd.dq = fwd.dk = fwd.dv = Tensor{};
      ASSERT_TRUE(forward(fwd).ok());
      float* lse = reinterpret_cast<float*>(pr.lse.bytes.data());
      const int64_t rows = int64_t(pr.lse.bytes.size() / sizeof(float));
      for (int64_t r = 0; r < rows; ++r) lse[r] -= float(std::log(kShares[r % std::size(kShares)]));

      Params cpu = pr.params();
      ASSERT_TRUE(backward(cpu).ok());
      const std::vector<uint8_t> dq = pr.dq.bytes, dk = pr.dk.bytes, dv = pr.dv.bytes;
      Params gpu = pr.params();
      gpu.backend = backend;
      gpu.precision = precision;
      const Status st = run_on_device(gpu, Direction::backward);
      if (st.code == Code::unsupported) continue;
      ASSERT_TRUE(st.ok()) << st.message;
      ++ran;
      const auto rel_err = [](const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
        const float* a = reinterpret_cast<const float*>(got.data());
        const float* b = reinterpret_cast<const float*>(want.data());
        double diff2 = 0, ref2 = 0;
        for (size_t i = 0; i < want.size() / sizeof(float); ++i) {
          diff2 += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
          ref2 += double(b[i]) * b[i];
        }
        return std::sqrt(diff2 / ref2);  // NaN (never below the tolerance) if any output is NaN
      };
      EXPECT_LT(rel_err(pr.dq.bytes, dq), tolerance) << "dq, " << c.describe();
      EXPECT_LT(rel_err(pr.dk.bytes, dk), tolerance) << "dk, " << c.describe();
      EXPECT_LT(rel_err(pr.dv.bytes, dv), tolerance) << "dv, " << c.describe();
    }
  if (ran == 0) GTEST_SKIP() << "the tier refused every call";
}

TEST(SimtBackward, GivenLseLargerThanItsOwnScalesP) {
  SKIP_UNLESS_RUNNABLE(Backend::cuda_simt);
  expect_given_lse_scales_p(Backend::cuda_simt, Precision::ieee, 1e-5);  // fp32 against fp32
}

TEST(SplitTf32Backward, GivenLseLargerThanItsOwnScalesP) {
  SKIP_UNLESS_RUNNABLE(Backend::cuda_sm80);
  // Split tf32 drops each product's lo·lo term (2^-22 of it): on an H200 1.0e-5 to 2.4e-5 from
  // head dim 128 to 256, against simt's exact fp32 below 1e-5.
  expect_given_lse_scales_p(Backend::cuda_sm80, Precision::tf32x3, 4e-5);
}

TEST(SplitTf32Backward, Sm90GivenLseLargerThanItsOwnScalesP) {
  SKIP_UNLESS_RUNNABLE(Backend::cuda_sm90);
  expect_given_lse_scales_p(Backend::cuda_sm90, Precision::tf32x3, 4e-5);  // head dim 64 (others refused)
}

INSTANTIATE_TEST_SUITE_P(Fuzz, GpuPeakedSoftmax,
                         ::testing::Values(Backend::cuda_simt, Backend::cuda_sm80, Backend::cuda_sm90),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// Negative softmax scales on each GPU tier: 150 of its fuzz calls with their scale negated (every
// flavor the tier draws, tf32 and split tf32 among them), under the fuzz's rule; the CPU suite's
// CpuNegativeScale on the GPU.
class GpuNegativeScale : public ::testing::TestWithParam<Backend> {};

TEST_P(GpuNegativeScale, MatchesOracleWithinNaiveError) {
  const Backend backend = GetParam();
  SKIP_UNLESS_RUNNABLE(backend);
  const Tier tier = gpu_tier(backend, compiled_head_dims());
  int64_t ran = 0;
  for (uint64_t seed : seeds(150, 0, 1)) {
    const Config c = with_negative_scale(generate(seed, tier));
    const Outcome o = check(c, run_on_device);
    if (o.refused) continue;
    ++ran;
    EXPECT_TRUE(o.failure.empty()) << c.describe() << "\n" << o.failure << "  replay: FMHA_FUZZ_SEED=" << seed
                                   << " fmha_gpu_tests --gtest_filter='Fuzz/GpuNegativeScale.*"
                                   << to_string(backend) << "'";
  }
  if (ran == 0) GTEST_SKIP() << "the tier refused every call";
}

INSTANTIATE_TEST_SUITE_P(Fuzz, GpuNegativeScale,
                         ::testing::Values(Backend::cuda_simt, Backend::cuda_sm80, Backend::cuda_sm90),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// Split tf32 against exact fp32, class by class: the fuzz's fp32 calls drawn for a tier (sm80; sm90
// at its split head dim, 64) at precision tf32x3, each run there and on simt (exact fp32, the same
// inputs), and each output's
// error relative to the oracle's norm averaged over a class. Split tf32 is to stay within 2x of
// fp32's error (plus a few fp32 units) on every class and output; the table it prints says
// where it is also at least as accurate as simt, the condition for making it fp32's default.
// Classes, in this order: peaked (typical scores |scale|·magnitude²·sqrt(D) of 20 or more),
// few keys (seqlen_k <= 8), masked (causal or a window), plain.
void expect_split_tf32_within_twice_fp32_by_class(Backend backend, const std::vector<int64_t>& head_dims) {
  constexpr double kFp32Factor = 2.0;
  constexpr double kUnits = 4.0 * 5.96e-8;  // 4 fp32 units, relative to the output's norm
  constexpr int64_t kCases = 500;
  constexpr int kMinCalls = 5;               // classes with fewer calls are printed, not checked
  Tier tier = gpu_tier(backend, head_dims);
  tier.flavors = {{DType::fp32, Precision::tf32x3}};
  const char* kClasses[] = {"peaked", "few keys", "masked", "plain"};
  auto class_of = [](const Config& c) {
    const double scale = c.softmax_scale != 0.f ? c.softmax_scale : 1.0 / std::sqrt(double(c.head_dim));
    if (std::abs(scale) * c.magnitude * c.magnitude * std::sqrt(double(c.head_dim)) >= 20.0) return 0;
    if (c.seqlen_k <= 8) return 1;
    if (c.causal != Causal::none || c.window_left >= 0 || c.window_right >= 0) return 2;
    return 3;
  };
  struct Sums {
    int64_t calls = 0;
    double split = 0, exact = 0, worst = 0;  // mean relative errors' sums; the largest split/exact
  };
  std::vector<std::vector<Sums>> sums(4);  // [class][output: o, lse, dq, dk, dv]
  std::vector<std::string> names;
  int64_t compared = 0;
  for (uint64_t seed : seeds(kCases, 0, 1)) {
    const Config split = generate(seed, tier);
    Config exact = split;
    exact.backend = Backend::cuda_simt;
    exact.precision = Precision::ieee;
    const Outcome a = check(split, run_on_device), b = check(exact, run_on_device);
    if (a.refused || b.refused || a.errors.size() != b.errors.size()) continue;
    ++compared;
    std::vector<Sums>& row = sums[class_of(split)];
    if (row.size() < a.errors.size()) row.resize(a.errors.size());
    for (size_t i = 0; i < a.errors.size(); ++i) {
      if (names.size() <= i) names.push_back(a.errors[i].name);
      if (!(a.errors[i].ref > 0)) continue;  // an output of zeros: nothing to compare
      Sums& t = row[i];
      const double es = a.errors[i].kernel / a.errors[i].ref, ee = b.errors[i].kernel / b.errors[i].ref;
      ++t.calls;
      t.split += es;
      t.exact += ee;
      t.worst = std::max(t.worst, es / std::max(ee, kUnits));
    }
  }
  if (compared == 0) GTEST_SKIP() << "no call ran on both tiers";
  std::printf("split tf32 (%s) against exact fp32 (simt), %lld calls: mean error / |ref| by class\n",
              to_string(backend), (long long)compared);
  std::printf("%-9s %-4s %6s %12s %12s %7s %9s\n", "class", "out", "calls", "tf32x3", "fp32", "ratio", "worst");
  bool every_class_at_most_fp32 = true;
  for (int k = 0; k < 4; ++k)
    for (size_t i = 0; i < sums[k].size(); ++i) {
      const Sums& t = sums[k][i];
      if (t.calls == 0) continue;
      const double split = t.split / double(t.calls), exact = t.exact / double(t.calls);
      std::printf("%-9s %-4s %6lld %12.3e %12.3e %7.2f %9.2f\n", kClasses[k], names[i].c_str(), (long long)t.calls,
                  split, exact, split / std::max(exact, kUnits), t.worst);
      if (t.calls < kMinCalls) continue;
      every_class_at_most_fp32 = every_class_at_most_fp32 && split <= exact + kUnits;
      EXPECT_LE(split, kFp32Factor * exact + kUnits)
          << kClasses[k] << " " << names[i] << ": split tf32's mean relative error " << split << " against fp32's " << exact;
    }
  std::printf("at least as accurate as exact fp32 on every class: %s\n", every_class_at_most_fp32 ? "yes" : "no");
}

TEST(GpuSplitTf32, WithinTwiceExactFp32ErrorOnEveryFuzzClass) {
  SKIP_UNLESS_RUNNABLE(Backend::cuda_sm80);
  SKIP_UNLESS_RUNNABLE(Backend::cuda_simt);
  expect_split_tf32_within_twice_fp32_by_class(Backend::cuda_sm80, compiled_head_dims());
}

TEST(GpuSplitTf32, Sm90WithinTwiceExactFp32ErrorOnEveryFuzzClass) {
  SKIP_UNLESS_RUNNABLE(Backend::cuda_sm90);
  SKIP_UNLESS_RUNNABLE(Backend::cuda_simt);
  const std::vector<int64_t> dims = compiled_head_dims();
  if (std::find(dims.begin(), dims.end(), int64_t(64)) == dims.end()) GTEST_SKIP() << "no head dim 64";
  expect_split_tf32_within_twice_fp32_by_class(Backend::cuda_sm90, {64});  // sm90's split head dim
}

// `auto` on fp32 calls asking for exact fp32 (the simt tier's fuzz draws, run under `auto`): split
// tf32 on a tensor-core tier where common/precision.h's rule says so, the simt tier elsewhere,
// and either way within the fuzz's fp32 rule. On the GPU generation the rule names, some calls
// must have taken split tf32 (so that the test cannot pass by never using it).
TEST(GpuSplitTf32, AutoMeetsExactFp32ByTheRule) {
  SKIP_UNLESS_RUNNABLE(Backend::cuda_simt);
  constexpr int64_t kCases = 300;
  int ordinal = 0;
  cudaGetDevice(&ordinal);
  const int compute_capability = test::device_arch();
  Tier tier = gpu_tier(Backend::cuda_simt, compiled_head_dims());
  tier.backend = Backend::auto_select;
  tier.flavors = {{DType::fp32, Precision::ieee}};
  int64_t split = 0, exact = 0, failed = 0;
  std::string last;  // the tier of the call under way, for a failure's message
  const Runner runner = [&](const Params& host, Direction dir) {
    Params p = host;
    for (Tensor* t : {&p.q, &p.k, &p.v, &p.o, &p.lse, &p.dout, &p.dq, &p.dk, &p.dv})
      if (t->defined()) t->device = Device{DeviceType::cuda, ordinal};
    Backend chosen = Backend::auto_select;
    if (Status s = select_backend(p, dir, &chosen); !s.ok()) return s;
    const bool rule = split_tf32_meets_ieee(p, dir, compute_capability);
    if (!rule) EXPECT_EQ(chosen, Backend::cuda_simt) << to_string(dir) << ": the rule keeps exact fp32";
    VariantChoice choice;
    if (Status s = selected_variant(p, dir, &choice); !s.ok()) return s;
    const bool as_split = rule && chosen != Backend::cuda_simt;
    EXPECT_EQ(choice.precision, as_split ? Precision::tf32x3 : Precision::ieee) << to_string(dir) << " on " << to_string(chosen);
    (as_split ? split : exact) += 1;
    last = std::string(to_string(dir)) + " on " + to_string(chosen);
    return run_on_device(host, dir);
  };
  for (uint64_t seed : seeds(kCases, 0, 1)) {
    const Config c = generate(seed, tier);
    const Outcome o = check(c, runner);
    EXPECT_FALSE(o.refused) << c.describe();
    if (!o.failure.empty()) {
      ++failed;
      ADD_FAILURE() << c.describe() << " (" << last << ")\n" << o.failure;
    }
  }
  std::printf("auto on fp32 (compute capability %d): %lld calls, %lld passes as split tf32, %lld as exact fp32, %lld failed\n",
              compute_capability, (long long)kCases, (long long)split, (long long)exact, (long long)failed);
  if (compute_capability == kSplitTf32FasterComputeCapability) EXPECT_GT(split, 0);
}

}  // namespace
}  // namespace fmha::fuzz
