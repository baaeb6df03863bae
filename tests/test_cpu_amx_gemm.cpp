// The amxbf16 path's bf16 matmul on tiles (src/cpu/simd.h, gemm_bf16) against an fp64 sum of the
// same bf16 products, over the shapes the fast path gives it and their edges: row counts that are
// odd multiples of 8 (the last 8 rows on vdpbf16ps), widths that are odd multiples of 16 (a
// one-column-tile block), depths that are odd multiples of 16 elements (the last k-pairs on
// vdpbf16ps), and accumulation into C. Skips where this CPU cannot run the path; the attention
// tests (test_cpu_attention.cpp) run the whole path against the oracle.
//
// The test bodies are compiled for the baseline target: the kernel's code is in a function of its
// own at the end of the file, after src/cpu/isa_target.h switches the instruction set.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/isa.h"

namespace fmha::cpu {
namespace amx_kernel_test {
// C[rows][width] (+)= A · B on tiles, A [rows][2 * depth_pairs] bf16 row-major (lda), B bf16
// pair-interleaved (ldb), C fp32 (ldc); B and C 64-byte aligned.
void tile_gemm(int64_t rows, int64_t width, int64_t depth_pairs, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate);
}  // namespace amx_kernel_test

namespace {

float from_bf16(uint16_t x) {
  const uint32_t bits = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t to_bf16_truncated(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return uint16_t(bits >> 16);
}

struct Aligned {
  explicit Aligned(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64)) {}
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  void* p;
};

// One shape: a relative error per element against the fp64 sum, measured against the sum of the
// products' magnitudes (fp32 accumulation of at most 128 products: well under 2^-16 of it).
void check_shape(int64_t rows, int64_t width, int64_t depth_pairs, bool accumulate, std::mt19937& rng) {
  const int64_t depth = 2 * depth_pairs;
  const int64_t lda = depth + 16;  // padded rows, as Q's panel may be
  const int64_t ldb = 2 * (width + 16);
  const int64_t ldc = width + 16;
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<uint16_t> a(size_t(rows * lda));
  for (uint16_t& x : a) x = to_bf16_truncated(uniform(rng));
  Aligned b_buffer(size_t(depth_pairs * ldb) * sizeof(uint16_t)), c_buffer(size_t(rows * ldc) * sizeof(float));
  uint16_t* b = static_cast<uint16_t*>(b_buffer.p);
  float* c = static_cast<float*>(c_buffer.p);
  for (int64_t i = 0; i < depth_pairs * ldb; ++i) b[i] = to_bf16_truncated(uniform(rng));
  std::vector<float> c_before(size_t(rows * ldc));
  for (float& x : c_before) x = uniform(rng);
  std::memcpy(c, c_before.data(), c_before.size() * sizeof(float));

  amx_kernel_test::tile_gemm(rows, width, depth_pairs, a.data(), lda, b, ldb, c, ldc, accumulate);

  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < ldc; ++n) {
      const float got = c[r * ldc + n];
      if (n >= width) {
        ASSERT_EQ(got, c_before[size_t(r * ldc + n)]) << "wrote C outside its width at row " << r << " column " << n;
        continue;
      }
      double sum = accumulate ? c_before[size_t(r * ldc + n)] : 0.0, magnitude = std::abs(sum);
      for (int64_t k = 0; k < depth; ++k) {
        const double product =
            double(from_bf16(a[size_t(r * lda + k)])) * double(from_bf16(b[(k / 2) * ldb + 2 * n + k % 2]));
        sum += product;
        magnitude += std::abs(product);
      }
      ASSERT_LE(std::abs(double(got) - sum), 1e-5 * magnitude + 1e-30)
          << "C[" << r << "][" << n << "] = " << got << ", fp64 " << sum << "; rows " << rows << ", width " << width
          << ", depth " << depth << (accumulate ? ", accumulating" : "");
    }
}

TEST(CpuAmxGemm, MatchesFp64SumsOfTheSameProducts) {
#ifndef FMHA_TEST_AMX_KERNEL
  GTEST_SKIP() << "this build has no amxbf16 path";
#else
  if (!cpu_isas().has(Isa::amxbf16)) GTEST_SKIP() << "this CPU cannot run the amxbf16 path: " << cpu_lacks(Isa::amxbf16);
  std::mt19937 rng(20261204);
  for (int64_t rows : {8, 16, 24, 32, 40, 64})
    for (int64_t width : {16, 32, 48, 64, 80})
      for (int64_t depth_pairs : {8, 16, 24, 32, 40, 64})
        for (bool accumulate : {false, true}) {
          check_shape(rows, width, depth_pairs, accumulate, rng);
          if (::testing::Test::HasFatalFailure()) return;
        }
#endif
}

}  // namespace
}  // namespace fmha::cpu

#ifdef FMHA_TEST_AMX_KERNEL
// From here on compiled for the amxbf16 path's instruction set, in a namespace of its own.
#define FMHA_CPU_ISA amx_kernel_test
#define FMHA_CPU_LEVEL 4
#include "cpu/isa_target.h"
#include "cpu/simd.h"

namespace fmha::cpu::amx_kernel_test {
void tile_gemm(int64_t rows, int64_t width, int64_t depth_pairs, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const TileSession tiles;
  gemm_bf16(rows, width, depth_pairs, a, lda, b, ldb, c, ldc, accumulate);
}
}  // namespace fmha::cpu::amx_kernel_test
#endif
