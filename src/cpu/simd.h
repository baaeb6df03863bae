// The fast CPU path's building blocks, on GCC/Clang vector extensions (16 x fp32 = one AVX-512
// register; the compiler splits them on narrower targets): a register-blocked panel matmul, a
// vectorizable exp2, and 64-wide row operations. No intrinsics, so the code builds anywhere.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace fmha::cpu {

using v16f = float __attribute__((vector_size(64)));
using v16i = int32_t __attribute__((vector_size(64)));

inline constexpr int kLanes = 16;      // floats per vector
inline constexpr int kRowBlock = 8;    // rows of C held in registers by the matmul kernel
inline constexpr int kBlockCols = 32;  // columns of C held in registers (2 vectors)
inline constexpr int kWideCols = 64;   // the softmax's row width: 4 vectors
inline constexpr size_t kAlign = 64;   // scratch alignment in bytes (one cache line, one vector)

inline v16f load(const float* p) { return *reinterpret_cast<const v16f*>(p); }
inline void store(float* p, v16f x) { *reinterpret_cast<v16f*>(p) = x; }
inline v16f splat(float x) { return v16f{} + x; }

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// 2^x for x <= 127, flushing results below 2^-126 to 0 (so exp2(-inf) = 0). Relative error
// ~1e-7: a degree-7 polynomial of 2^f on f in [-0.5, 0.5] times 2^round(x).
inline v16f exp2(v16f x) {
  const v16f lo = splat(-127.0f), hi = splat(127.0f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const v16f magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const v16f whole = (x + magic) - magic;
  const v16f f = x - whole;
  // Taylor coefficients of 2^f = e^(f ln 2): (ln 2)^k / k!
  v16f p = splat(1.525273380405984e-05f);
  p = p * f + 1.5403530393381606e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.618129107628477e-03f;
  p = p * f + 5.550410866482158e-02f;
  p = p * f + 2.402265069591007e-01f;
  p = p * f + 6.931471805599453e-01f;
  p = p * f + 1.0f;
  const v16i exponent = (__builtin_convertvector(whole, v16i) + 127) << 23;  // 0 at x = -127
  v16f scale;
  std::memcpy(&scale, &exponent, sizeof scale);
  return p * scale;
}

// Horizontal reductions as a tree of in-register shuffles (4 dependent steps, not 15).
inline v16f swap_halves(v16f x, int step) {
  switch (step) {
    case 8: return __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    case 4: return __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    case 2: return __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    default: return __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  }
}
inline float horizontal_max(v16f x) {
  for (int step = kLanes / 2; step >= 1; step /= 2) {
    const v16f y = swap_halves(x, step);
    x = x > y ? x : y;
  }
  return x[0];
}
inline float horizontal_sum(v16f x) {
  for (int step = kLanes / 2; step >= 1; step /= 2) x += swap_halves(x, step);
  return x[0];
}

// C[r][0:W] (+)= sum_k A[r][k] * B[k][0:W] for r in [0, kRowBlock). B and C rows are 64-byte
// aligned; W is a multiple of 16. The kRowBlock x W block of C stays in registers over the k
// loop: 8 x 32 uses 16 accumulators and needs 2 vector loads + 8 broadcasts per 16 FMAs, which
// keeps both FMA ports busy without saturating the load ports.
template <int W, bool kAccumulate>
inline void gemm_block(int64_t depth, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                       int64_t ldc) {
  constexpr int kVecs = W / kLanes;
  v16f acc[kRowBlock][kVecs];
  for (int r = 0; r < kRowBlock; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = kAccumulate ? load(c + r * ldc + v * kLanes) : v16f{};
  for (int64_t k = 0; k < depth; ++k) {
    v16f brow[kVecs];
    for (int v = 0; v < kVecs; ++v) brow[v] = load(b + k * ldb + v * kLanes);
    for (int r = 0; r < kRowBlock; ++r) {
      const float ark = a[r * lda + k];
      for (int v = 0; v < kVecs; ++v) acc[r][v] += ark * brow[v];
    }
  }
  for (int r = 0; r < kRowBlock; ++r)
    for (int v = 0; v < kVecs; ++v) store(c + r * ldc + v * kLanes, acc[r][v]);
}

template <bool kAccumulate>
inline void gemm_rows(int64_t rows, int64_t width, int64_t depth, const float* a, int64_t lda, const float* b,
                      int64_t ldb, float* c, int64_t ldc) {
  for (int64_t r = 0; r < rows; r += kRowBlock) {
    int64_t col = 0;
    for (; col + kBlockCols <= width; col += kBlockCols)
      gemm_block<kBlockCols, kAccumulate>(depth, a + r * lda, lda, b + col, ldb, c + r * ldc + col, ldc);
    for (; col < width; col += kLanes)
      gemm_block<kLanes, kAccumulate>(depth, a + r * lda, lda, b + col, ldb, c + r * ldc + col, ldc);
  }
}

// C[rows][width] (+)= A[rows][depth] · B[depth][width]; rows a multiple of kRowBlock, width a
// multiple of 16, ldb and ldc multiples of 16 floats, B and C 64-byte aligned.
inline void gemm(int64_t rows, int64_t width, int64_t depth, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (accumulate) gemm_rows<true>(rows, width, depth, a, lda, b, ldb, c, ldc);
  else gemm_rows<false>(rows, width, depth, a, lda, b, ldb, c, ldc);
}

// 64-byte aligned fp32 scratch that grows on demand (contents are not kept when it grows).
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(int64_t floats) { reserve(floats); }

  float* reserve(int64_t floats) {
    if (floats > capacity_) {
      const size_t bytes = size_t(round_up(floats > 0 ? floats : 1, kLanes)) * sizeof(float);
      float* p = static_cast<float*>(std::aligned_alloc(kAlign, bytes));
      if (!p) throw std::bad_alloc();
      data_.reset(p);
      capacity_ = floats;
    }
    return data_.get();
  }
  float* get() const { return data_.get(); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  int64_t capacity_ = 0;
};

}  // namespace fmha::cpu
