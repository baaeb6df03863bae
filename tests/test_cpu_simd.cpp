// The fast CPU path's vector exp2 (src/cpu/simd.h), compiled here for the test's own target: its
// arithmetic is the same at every vector width, only the lane count follows the target. Against
// exp2 in double over its range, and at its edges: 0 exactly at -inf and below 2^-127, 1 exactly
// at 0, the clamp at 127, NaN kept; exp2_nonpositive (no upper clamp) the same bits on x <= 0.
// And the register-block transpose that forms the transposed panels.
#define FMHA_CPU_ISA simd_test
#include "cpu/simd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace fmha::cpu::simd_test {
namespace {

// exp2 (or exp2_nonpositive) of each x, a vector at a time.
template <class F>
std::vector<float> over(F&& f, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += kLanes) {
    vf v{};
    for (int l = 0; l < kLanes && i + l < x.size(); ++l) v[l] = x[i + l];
    const vf r = f(v);
    for (int l = 0; l < kLanes && i + l < x.size(); ++l) y[i + l] = r[l];
  }
  return y;
}

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

TEST(CpuSimd, Exp2MatchesDoubleOverItsRange) {
  std::vector<float> x;
  for (int i = -126 * 64; i <= 127 * 64; ++i) x.push_back(float(i) / 64.0f);  // every 1/64
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> any(-126.0f, 127.0f), small(-1.0f, 1.0f);
  for (int i = 0; i < 20000; ++i) x.push_back(any(rng)), x.push_back(small(rng));
  const std::vector<float> y = over([](vf v) { return exp2(v); }, x);
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp2(double(x[i]));
    worst = std::max(worst, std::abs(double(y[i]) - want) / want);
  }
  EXPECT_LT(worst, 3e-7) << "worst relative error of exp2 on [-126, 127]";
}

TEST(CpuSimd, Exp2Edges) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x{-inf, -1000.0f, -127.0f, 0.0f, -0.0f, 1.0f, -1.0f, 127.0f, 200.0f, inf, nan};
  const std::vector<float> y = over([](vf v) { return exp2(v); }, x);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 0.0f);  // results below 2^-126 flush to 0
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_EQ(y[4], 1.0f);
  EXPECT_EQ(y[5], 2.0f);
  EXPECT_EQ(y[6], 0.5f);
  EXPECT_EQ(y[7], y[8]);  // clamped at 127
  EXPECT_EQ(y[7], y[9]);
  EXPECT_NEAR(double(y[7]) / std::exp2(127.0), 1.0, 3e-7);
  EXPECT_TRUE(std::isnan(y[10]));
}

TEST(CpuSimd, Exp2NonpositiveIsExp2AtOrBelowZero) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x{-inf, -0.0f, 0.0f};
  for (int i = -140 * 256; i <= 0; ++i) x.push_back(float(i) / 256.0f);
  const std::vector<float> want = over([](vf v) { return exp2(v); }, x);
  const std::vector<float> got = over([](vf v) { return exp2_nonpositive(v); }, x);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits(got[i]), bits(want[i])) << "x = " << x[i];
  EXPECT_TRUE(std::isnan(over([](vf v) { return exp2_nonpositive(v); }, {nan})[0]));
}

// The register-block transpose moves every element, bits and all (NaN payloads, -0, denormals),
// to its transposed place, and writes nothing outside the rows x cols it is given.
TEST(CpuSimd, TransposeMovesEveryElementAndNothingElse) {
  for (const auto [rows, cols] : {std::pair<int64_t, int64_t>{kLanes, kLanes}, {3 * kLanes, kLanes}, {2 * kLanes, 5 * kLanes}}) {
    const int64_t lds = cols + kLanes, ldd = rows + 2 * kLanes;  // padded rows, as the panels have
    Scratch src(rows * lds), dst(cols * ldd);
    uint32_t next = 0x3f800000u;
    for (int64_t i = 0; i < rows * lds; ++i) {
      next = next * 1664525u + 1013904223u;  // every bit pattern is fair game: NaNs, -0, denormals
      std::memcpy(src.get() + i, &next, sizeof next);
    }
    const uint32_t kUntouched = 0xdeadbeefu;
    for (int64_t i = 0; i < cols * ldd; ++i) std::memcpy(dst.get() + i, &kUntouched, sizeof kUntouched);
    transpose(src.get(), lds, rows, cols, dst.get(), ldd);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < ldd; ++r) {
        const uint32_t want = r < rows ? bits(src.get()[r * lds + c]) : kUntouched;
        ASSERT_EQ(bits(dst.get()[c * ldd + r]), want) << rows << "x" << cols << " at (" << r << ", " << c << ")";
      }
  }
}

}  // namespace
}  // namespace fmha::cpu::simd_test
