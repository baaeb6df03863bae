// The fast CPU path's building blocks, on GCC/Clang vector extensions: a register-blocked panel
// matmul, a vectorizable exp2, and 64-wide row operations. No intrinsics except the AVX-512 BF16
// dot product, so the code builds anywhere; the vector width follows the instruction set
// (FMHA_CPU_LEVEL) the including file is compiled for: 16 fp32 lanes (one AVX-512 register) with
// AVX-512, 8 (one AVX register) with AVX2, 4 (one SSE or NEON register) otherwise, so that the
// matmul's accumulators fit the register file (an AVX2 machine running 16-lane vectors spills
// them and runs ~50x slower).
//
// Everything here lives in the namespace of one instruction-set path (FMHA_CPU_ISA, set by the
// build for each compilation of src/cpu/fast_attention.cpp; see src/cpu/isa.h): the same inline
// function compiled with different flags must not share a name, or the linker would keep one
// copy, say the AVX-512 one, for every path.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// The instruction-set level: set by the build for the CPU paths (src/cpu/isa_target.h), else
// read off the compiler's target (bench/cpu_peak.cpp, compiled with -march=native).
#ifndef FMHA_CPU_LEVEL
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define FMHA_CPU_LEVEL 3
#elif defined(__AVX512F__)
#define FMHA_CPU_LEVEL 2
#elif defined(__AVX2__) && defined(__FMA__)
#define FMHA_CPU_LEVEL 1
#else
#define FMHA_CPU_LEVEL 0
#endif
#endif

#ifndef FMHA_CPU_ISA
#error "FMHA_CPU_ISA names the instruction-set path this file is compiled for (see CMakeLists.txt)"
#endif

namespace fmha::cpu::FMHA_CPU_ISA {

#if FMHA_CPU_LEVEL >= 2
inline constexpr int kLanes = 16;      // floats per vector
inline constexpr int kRowBlock = 8;    // rows of C held in registers by the matmul kernel
inline constexpr int kBlockCols = 32;  // columns of C held in registers (2 vectors): 16 of 32 registers
#elif FMHA_CPU_LEVEL == 1
inline constexpr int kLanes = 8;
inline constexpr int kRowBlock = 8;
inline constexpr int kBlockCols = 8;   // 1 vector: 8 accumulators of 16 registers
#else
inline constexpr int kLanes = 4;
inline constexpr int kRowBlock = 8;
inline constexpr int kBlockCols = 4;   // 1 vector: 8 accumulators of 16 (SSE) or 32 (NEON) registers
#endif
// The rows a matmul takes at least: half a register block, which a call with few rows (the
// few-row forward's packed GQA rows: 4 for one query of 4 heads) runs on, as twice the columns,
// instead of padding it to a whole block of mostly empty rows.
inline constexpr int kHalfRowBlock = kRowBlock / 2;
inline constexpr int kWideCols = 64;   // the softmax's row width: 64 / kLanes vectors
inline constexpr size_t kAlign = 64;   // scratch alignment in bytes (one cache line, at least one vector)

using vf = float __attribute__((vector_size(kLanes * sizeof(float))));      // kLanes floats
using vi = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));  // kLanes int32
static_assert(kWideCols % kBlockCols == 0 && kBlockCols % kLanes == 0 && 64 % kRowBlock == 0);

inline vf load(const float* p) { return *reinterpret_cast<const vf*>(p); }
inline void store(float* p, vf x) { *reinterpret_cast<vf*>(p) = x; }
inline vf splat(float x) { return vf{} + x; }

// a·b + c rounded as one lane of gemm() rounds it: fused where the path has FMA (the matmuls'
// `acc += a * b` is contracted to it there), a product and a sum where it has not. Written out
// because the compiler may vectorise a scalar dot product into products and separate sums.
inline float multiply_add(float a, float b, float c) {
#if FMHA_CPU_LEVEL >= 1 || defined(__FMA__) || defined(__aarch64__)
  return __builtin_fmaf(a, b, c);
#else
  const volatile float product = a * b;  // kept apart from the sum
  return product + c;
#endif
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// 2^x for x <= 127, flushing results below 2^-126 to 0 (so exp2(-inf) = 0). Relative error
// ~1e-7: a degree-7 polynomial of 2^f on f in [-0.5, 0.5] times 2^round(x). kUpper = false
// leaves out the clamp at 127, for arguments known to be at most 0 (exp2_nonpositive).
template <bool kUpper>
inline vf exp2_clamped(vf x) {
  const vf lo = splat(-127.0f), hi = splat(127.0f);
  x = x < lo ? lo : x;
  if constexpr (kUpper) x = x > hi ? hi : x;
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf shifted = x + magic;         // round(x) in the low bits of the mantissa
  const vf whole = shifted - magic;
  const vf f = x - whole;
  // Taylor coefficients of 2^f = e^(f ln 2): (ln 2)^k / k!
  vf p = splat(1.525273380405984e-05f);
  p = p * f + 1.5403530393381606e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.618129107628477e-03f;
  p = p * f + 5.550410866482158e-02f;
  p = p * f + 2.402265069591007e-01f;
  p = p * f + 6.931471805599453e-01f;
  p = p * f + 1.0f;
  // 2^round(x) from the bits of `shifted` (no conversion): round(x) + 127 into the exponent
  // field, where magic's own bits shift out of the word; 0 at x = -127.
  using vu = uint32_t __attribute__((vector_size(kLanes * sizeof(uint32_t))));
  vu bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  const vu exponent = (bits + 127u) << 23;
  vf scale;
  std::memcpy(&scale, &exponent, sizeof scale);
  return p * scale;
}
inline vf exp2(vf x) { return exp2_clamped<true>(x); }
// exp2 of arguments at most 0 (or -inf): a score less the row max that it is part of.
inline vf exp2_nonpositive(vf x) { return exp2_clamped<false>(x); }

// Horizontal reductions as a tree of in-register shuffles (log2(kLanes) dependent steps).
// swap_groups<Step> exchanges neighbouring groups of Step lanes.
template <int Step, int... I>
inline vf swap_groups(vf x, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(x, x, (I ^ Step)...);
}
template <int Step>
inline vf swap_groups(vf x) {
  return swap_groups<Step>(x, std::make_integer_sequence<int, kLanes>{});
}
template <int Step = kLanes / 2>
inline float horizontal_max(vf x) {
  if constexpr (Step == 0) {
    return x[0];
  } else {
    const vf y = swap_groups<Step>(x);
    return horizontal_max<Step / 2>(x > y ? x : y);
  }
}
template <int Step = kLanes / 2>
inline float horizontal_sum(vf x) {
  if constexpr (Step == 0) return x[0];
  else return horizontal_sum<Step / 2>(x + swap_groups<Step>(x));
}

// A kLanes x kLanes block transposed in registers: in[r] is row r (lane c: element (r, c)),
// out[c] column c. One stage per bit of the index: the stage of bit B swaps bit B of the row with
// bit B of the lane, exchanging element (i, l) with (i ^ B, l ^ B) where bit B of i is clear and
// that of l set; after every bit, element (r, c) sits at (c, r). Two two-source shuffles per row
// pair and stage (log2(kLanes) · kLanes shuffles in all) instead of kLanes² scalar moves.
template <int B, int... L>
inline void swap_bit(vf& lower, vf& upper, std::integer_sequence<int, L...>) {
  const vf a = lower, b = upper;
  lower = __builtin_shufflevector(a, b, ((L & B) == 0 ? L : kLanes + (L ^ B))...);
  upper = __builtin_shufflevector(a, b, ((L & B) == 0 ? (L ^ B) : kLanes + L)...);
}
template <int B = 1>
inline void transpose_block(vf (&x)[kLanes]) {
  if constexpr (B < kLanes) {
    for (int i = 0; i < kLanes; ++i)
      if ((i & B) == 0) swap_bit<B>(x[i], x[i | B], std::make_integer_sequence<int, kLanes>{});
    transpose_block<2 * B>(x);
  }
}

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (both multiples of kLanes; src and
// dst vector-aligned, lds and ldd multiples of kLanes), a register block at a time.
inline void transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd) {
  for (int64_t r0 = 0; r0 < rows; r0 += kLanes)
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
      vf x[kLanes];
      for (int i = 0; i < kLanes; ++i) x[i] = load(src + (r0 + i) * lds + c0);
      transpose_block(x);
      for (int i = 0; i < kLanes; ++i) store(dst + (c0 + i) * ldd + r0, x[i]);
    }
}

// C[r][0:W] (+)= sum_k A[r][k] * B[k][0:W] for r in [0, kRowBlock). B and C rows are 64-byte
// aligned; W is a multiple of kLanes. The kRowBlock x W block of C stays in registers over the
// k loop: with AVX-512, 8 x 32 is 16 accumulators and 2 vector loads + 8 broadcasts per 16 FMAs;
// with AVX, 8 x 8 is 8 accumulators and 1 load + 8 broadcasts per 8 FMAs (measured fastest of
// 4x8, 4x16, 8x8, 8x16, 16x8 on a 2-core AVX2 EPYC: docs/PERF.md); with 4 lanes, 8 x 4 the same
// shape at half the width. None spills.
// With kAccumulate, the block's C comes from L2 or further as often as not (the accumulators of a
// tile pair outgrow L1): the block asks for the next block's C rows (`next_c`, same ldc, W wide)
// while its k loop runs, so that they are in L1 when that block loads them.
// ROWS: kRowBlock, or kHalfRowBlock for the last rows of a matmul whose row count is an odd
// multiple of it (gemm_rows).
template <int W, bool kAccumulate, int ROWS = kRowBlock>
inline void gemm_block(int64_t depth, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                       int64_t ldc, const float* next_c = nullptr) {
  constexpr int kVecs = W / kLanes;
  vf acc[ROWS][kVecs];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = kAccumulate ? load(c + r * ldc + v * kLanes) : vf{};
  if (kAccumulate && next_c)
    for (int r = 0; r < ROWS; ++r)
      for (int64_t i = 0; i < W; i += int64_t(kAlign / sizeof(float))) __builtin_prefetch(next_c + r * ldc + i);
  for (int64_t k = 0; k < depth; ++k) {
    vf brow[kVecs];
    for (int v = 0; v < kVecs; ++v) brow[v] = load(b + k * ldb + v * kLanes);
    for (int r = 0; r < ROWS; ++r) {
      const float ark = a[r * lda + k];
      for (int v = 0; v < kVecs; ++v) acc[r][v] += ark * brow[v];
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < kVecs; ++v) store(c + r * ldc + v * kLanes, acc[r][v]);
}

template <bool kAccumulate>
inline void gemm_rows(int64_t rows, int64_t width, int64_t depth, const float* a, int64_t lda, const float* b,
                      int64_t ldb, float* c, int64_t ldc) {
  const int64_t full_width = width / kBlockCols * kBlockCols;
  const int64_t full_rows = rows / kRowBlock * kRowBlock;
  if (full_rows < rows) {  // half a block: as many accumulators as a whole one over twice the columns
    const int64_t r = full_rows;
    int64_t col = 0;
    for (; col + 2 * kBlockCols <= width; col += 2 * kBlockCols)
      gemm_block<2 * kBlockCols, kAccumulate, kHalfRowBlock>(depth, a + r * lda, lda, b + col, ldb, c + r * ldc + col,
                                                             ldc);
    for (; col < width; col += kLanes)
      gemm_block<kLanes, kAccumulate, kHalfRowBlock>(depth, a + r * lda, lda, b + col, ldb, c + r * ldc + col, ldc);
  }
  for (int64_t r = 0; r < full_rows; r += kRowBlock) {
    int64_t col = 0;
    for (; col < full_width; col += kBlockCols) {
      const float* next = col + kBlockCols < full_width ? c + r * ldc + col + kBlockCols
                          : r + kRowBlock < full_rows   ? c + (r + kRowBlock) * ldc
                                                        : nullptr;
      gemm_block<kBlockCols, kAccumulate>(depth, a + r * lda, lda, b + col, ldb, c + r * ldc + col, ldc, next);
    }
    for (; col < width; col += kLanes)
      gemm_block<kLanes, kAccumulate>(depth, a + r * lda, lda, b + col, ldb, c + r * ldc + col, ldc);
  }
}

// C[rows][width] (+)= A[rows][depth] · B[depth][width]; rows a multiple of kHalfRowBlock, width a
// multiple of kLanes, ldb and ldc multiples of kLanes floats, B and C vector-aligned.
inline void gemm(int64_t rows, int64_t width, int64_t depth, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (accumulate) gemm_rows<true>(rows, width, depth, a, lda, b, ldb, c, ldc);
  else gemm_rows<false>(rows, width, depth, a, lda, b, ldb, c, ldc);
}

#if FMHA_CPU_LEVEL >= 3
// ---- bf16 operands, fp32 accumulation: vdpbf16ps -------------------------------------------------
// vdpbf16ps adds to each fp32 lane i the products of the bf16 pairs (2i, 2i+1) of its two
// operands. A matmul over depth k therefore takes A rows as they are stored (pairs along k are
// neighbours) and B in "pair-interleaved" form: element (k, n) at b[(k / 2) * ldb + 2 * n + k % 2],
// so that one 64-byte vector holds the k-pair of 16 consecutive columns.
inline constexpr bool kBf16Dot = true;
inline constexpr int kBf16PerVector = 2 * kLanes;  // 32 bf16 values in one 64-byte vector

// C[ROWS][W] (+)= A · B, C in registers.
template <int W, bool kAccumulate, int ROWS = kRowBlock>
inline void gemm_block_bf16(int64_t depth_pairs, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                            float* c, int64_t ldc) {
  constexpr int kVecs = W / kLanes;
  __m512 acc[ROWS][kVecs];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = kAccumulate ? _mm512_load_ps(c + r * ldc + v * kLanes) : _mm512_setzero_ps();
  for (int64_t kp = 0; kp < depth_pairs; ++kp) {
    __m512bh brow[kVecs];
    for (int v = 0; v < kVecs; ++v) brow[v] = (__m512bh)_mm512_load_si512(b + kp * ldb + v * kBf16PerVector);
    for (int r = 0; r < ROWS; ++r) {
      uint32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * kp, sizeof pair);
      const __m512bh a_pair = (__m512bh)_mm512_set1_epi32(int(pair));
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a_pair, brow[v]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < kVecs; ++v) _mm512_store_ps(c + r * ldc + v * kLanes, acc[r][v]);
}

// C[rows][width] (+)= A[rows][2 * depth_pairs] · B, A bf16 row-major (lda even), B bf16
// pair-interleaved (ldb elements per k-pair, a multiple of 32), C fp32; rows a multiple of
// kHalfRowBlock, width of kLanes; B and C 64-byte aligned. On the avx512bf16 path this is
// gemm_bf16; the amxbf16 path's gemm_bf16 (below) runs on tiles and leaves it the edges.
inline void gemm_bf16_dot(int64_t rows, int64_t width, int64_t depth_pairs, const uint16_t* a, int64_t lda,
                      const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  auto run = [&](auto accumulate_tag) {
    constexpr bool kAcc = decltype(accumulate_tag)::value;
    int64_t r = 0;
    for (; r + kRowBlock <= rows; r += kRowBlock) {
      int64_t col = 0;
      for (; col + kBlockCols <= width; col += kBlockCols)
        gemm_block_bf16<kBlockCols, kAcc>(depth_pairs, a + r * lda, lda, b + 2 * col, ldb, c + r * ldc + col, ldc);
      for (; col < width; col += kLanes)
        gemm_block_bf16<kLanes, kAcc>(depth_pairs, a + r * lda, lda, b + 2 * col, ldb, c + r * ldc + col, ldc);
    }
    if (r < rows) {  // half a block: as many accumulators as a whole one over twice the columns
      int64_t col = 0;
      for (; col + 2 * kBlockCols <= width; col += 2 * kBlockCols)
        gemm_block_bf16<2 * kBlockCols, kAcc, kHalfRowBlock>(depth_pairs, a + r * lda, lda, b + 2 * col, ldb,
                                                            c + r * ldc + col, ldc);
      for (; col < width; col += kLanes)
        gemm_block_bf16<kLanes, kAcc, kHalfRowBlock>(depth_pairs, a + r * lda, lda, b + 2 * col, ldb,
                                                    c + r * ldc + col, ldc);
    }
  };
  if (accumulate) run(std::true_type{});
  else run(std::false_type{});
}

#if FMHA_CPU_LEVEL >= 4
// ---- bf16 operands on AMX tiles, fp32 accumulation: tdpbf16ps --------------------------------------
// A tile register holds up to 16 rows of 64 bytes. tdpbf16ps adds to the fp32 tile C[16][16] the
// product of A[16][32 bf16] and B[16 k-pairs][16 columns x 2 bf16]: B in exactly the
// pair-interleaved form gemm_bf16_dot takes, so the operands and panels are the same on both
// paths. The eight registers, set up once per work item (TileSession):
//   tmm0..3  C   four [16 x 16] fp32 tiles, a [32 x 32] block of C: tmm0 tmm1 / tmm2 tmm3
//   tmm4, 5  A   [16 rows x 16 k-pairs], rows 0..15 and 16..31 of the block
//   tmm6, 7  B   [16 k-pairs x 16 columns], columns 0..15 and 16..31 of the block
// Each step over 16 k-pairs loads 4 tiles for 4 tdpbf16ps (each 16 x 16 x 32 multiply-adds).
inline constexpr int kTileRows = 16;                              // rows of every tile
inline constexpr int kTileRowBytes = 64;                          // bytes per tile row
inline constexpr int kTileCols = kTileRowBytes / sizeof(float);   // 16 fp32 columns of a C tile
inline constexpr int kTilePairs = kTileRowBytes / sizeof(float);  // 16 k-pairs of an A row / B tile
inline constexpr int kTileRegisters = 8;

// The LDTILECFG operand (palette 1): every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t row_bytes[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

inline const TileConfig& tile_config() {
  static const TileConfig config = [] {
    TileConfig c;
    for (int t = 0; t < kTileRegisters; ++t) c.row_bytes[t] = kTileRowBytes, c.rows[t] = kTileRows;
    return c;
  }();
  return config;
}

// Tells the compiler that the tile instructions between two of these read and write memory: GCC's
// tile load intrinsics declare no memory operand, so without it a store to an operand could be
// moved after the load that reads it.
inline void tile_memory_fence() { __asm__ __volatile__("" ::: "memory"); }

// The tile registers configured for gemm_bf16 for the scope of one work item (a thread's run of
// many matmuls), released after it: a thread that holds tile state makes every context switch
// save it, and other code on the thread (another library's AMX kernels) may configure the tiles
// differently between two of our items. The operating system's permission to use the tiles is
// asked for once per process by the path's selection (src/cpu/dispatch.cpp, cpu_isas).
class TileSession {
 public:
  TileSession() {
    tile_memory_fence();
    _tile_loadconfig(&tile_config());
  }
  ~TileSession() { _tile_release(); }
  TileSession(const TileSession&) = delete;
  TileSession& operator=(const TileSession&) = delete;
};

// C[32 * kRowTiles][16 * kColTiles] (+)= A · B over k_steps steps of 16 k-pairs, C kept in tiles.
// a, b, c as gemm_bf16's; strides in bytes.
template <int kRowTiles, int kColTiles>
inline void tile_block_bf16(int64_t k_steps, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float* c,
                            int64_t ldc, bool accumulate) {
  static_assert((kRowTiles == 1 || kRowTiles == 2) && (kColTiles == 1 || kColTiles == 2));
  const int64_t a_stride = lda * int64_t(sizeof(uint16_t)), b_stride = ldb * int64_t(sizeof(uint16_t));
  const int64_t c_stride = ldc * int64_t(sizeof(float));
  float* c_right = c + kTileCols;                       // tmm1, tmm3
  float* c_lower = c + kTileRows * ldc;                 // tmm2, tmm3
  if (accumulate) {
    _tile_loadd(0, c, c_stride);
    if constexpr (kColTiles == 2) _tile_loadd(1, c_right, c_stride);
    if constexpr (kRowTiles == 2) _tile_loadd(2, c_lower, c_stride);
    if constexpr (kRowTiles == 2 && kColTiles == 2) _tile_loadd(3, c_lower + kTileCols, c_stride);
  } else {
    _tile_zero(0);
    if constexpr (kColTiles == 2) _tile_zero(1);
    if constexpr (kRowTiles == 2) _tile_zero(2);
    if constexpr (kRowTiles == 2 && kColTiles == 2) _tile_zero(3);
  }
  for (int64_t k = 0; k < k_steps; ++k) {
    const uint16_t* a_k = a + k * 2 * kTilePairs;  // 32 bf16 of each row
    const uint16_t* b_k = b + k * kTilePairs * ldb;
    _tile_loadd(4, a_k, a_stride);
    if constexpr (kRowTiles == 2) _tile_loadd(5, a_k + kTileRows * lda, a_stride);
    _tile_loadd(6, b_k, b_stride);
    if constexpr (kColTiles == 2) _tile_loadd(7, b_k + 2 * kTileCols, b_stride);  // 16 columns of pairs on
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kColTiles == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (kRowTiles == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (kRowTiles == 2 && kColTiles == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_stride);
  if constexpr (kColTiles == 2) _tile_stored(1, c_right, c_stride);
  if constexpr (kRowTiles == 2) _tile_stored(2, c_lower, c_stride);
  if constexpr (kRowTiles == 2 && kColTiles == 2) _tile_stored(3, c_lower + kTileCols, c_stride);
}

// gemm_bf16_dot's contract, on tiles (inside a TileSession): the rows in whole tiles (multiples of
// 16) and k-pairs in whole steps (multiples of 16) run on tiles; the last 8 rows of a row count
// that is an odd multiple of 8, and the last depth_pairs % 16 k-pairs of a head dim that is an
// odd multiple of 16 (80, 112, ...), are added by gemm_bf16_dot. Every C element sums its
// products in one fixed order for a given shape: deterministic.
inline void gemm_bf16(int64_t rows, int64_t width, int64_t depth_pairs, const uint16_t* a, int64_t lda,
                      const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const int64_t tile_rows = rows / kTileRows * kTileRows;
  const int64_t k_steps = depth_pairs / kTilePairs, k_tail = depth_pairs % kTilePairs;
  tile_memory_fence();
  for (int64_t r = 0; r < tile_rows; r += 2 * kTileRows) {
    const bool two_rows = r + 2 * kTileRows <= tile_rows;
    const uint16_t* a_r = a + r * lda;
    float* c_r = c + r * ldc;
    int64_t col = 0;
    for (; col + 2 * kTileCols <= width; col += 2 * kTileCols) {
      if (two_rows) tile_block_bf16<2, 2>(k_steps, a_r, lda, b + 2 * col, ldb, c_r + col, ldc, accumulate);
      else tile_block_bf16<1, 2>(k_steps, a_r, lda, b + 2 * col, ldb, c_r + col, ldc, accumulate);
    }
    for (; col < width; col += kTileCols) {
      if (two_rows) tile_block_bf16<2, 1>(k_steps, a_r, lda, b + 2 * col, ldb, c_r + col, ldc, accumulate);
      else tile_block_bf16<1, 1>(k_steps, a_r, lda, b + 2 * col, ldb, c_r + col, ldc, accumulate);
    }
  }
  tile_memory_fence();
  if (k_tail > 0 && tile_rows > 0) {
    const int64_t done = k_steps * kTilePairs;
    gemm_bf16_dot(tile_rows, width, k_tail, a + 2 * done, lda, b + done * ldb, ldb, c, ldc, true);
  }
  if (tile_rows < rows)
    gemm_bf16_dot(rows - tile_rows, width, depth_pairs, a + tile_rows * lda, lda, b, ldb, c + tile_rows * ldc, ldc,
                  accumulate);
}
#elif FMHA_CPU_LEVEL == 3
// No tile state on this path.
struct TileSession {
  TileSession() = default;
  TileSession(const TileSession&) = delete;
  TileSession& operator=(const TileSession&) = delete;
};

inline void gemm_bf16(int64_t rows, int64_t width, int64_t depth_pairs, const uint16_t* a, int64_t lda,
                      const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  gemm_bf16_dot(rows, width, depth_pairs, a, lda, b, ldb, c, ldc, accumulate);
}
#endif

// n fp32 values (n a multiple of 32) to bf16, rounding to nearest even.
inline void to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += kBf16PerVector) {
    const __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + kLanes), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, (__m512i)pair);
  }
}

// A [rows][cols] fp32 tile (rows even, cols a multiple of kLanes, ld = cols) to bf16 in the
// pair-interleaved B form over its rows: element (k, n) at dst[(k / 2) * 2 * cols + 2 * n + k % 2].
// Two rows' kLanes values as bf16 pairs: dst[2 * n] = even[n], dst[2 * n + 1] = odd[n]. One
// conversion of both (even's in the lower 16 words, odd's in the upper) and one word permute
// that interleaves them.
alignas(64) inline constexpr uint16_t kPairInterleave[2 * kLanes] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                                     21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                                     11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
inline void store_bf16_pairs(uint16_t* dst, vf even, vf odd) {
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh((__m512)odd, (__m512)even);
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(_mm512_load_si512(kPairInterleave), both));
}

inline void to_bf16_pairs(const float* src, uint16_t* dst, int64_t rows, int64_t cols) {
  for (int64_t k = 0; k < rows; k += 2)
    for (int64_t n = 0; n < cols; n += kLanes)
      store_bf16_pairs(dst + k * cols + 2 * n, load(src + k * cols + n), load(src + (k + 1) * cols + n));
}
#else
inline constexpr bool kBf16Dot = false;
// Declared (never defined) so that code with an `if constexpr (kBf16Dot)` branch compiles on
// every path; that branch is never instantiated where these are missing.
void gemm_bf16(int64_t rows, int64_t width, int64_t depth_pairs, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate);
struct TileSession {};
void to_bf16(const float* src, uint16_t* dst, int64_t n);
void to_bf16_pairs(const float* src, uint16_t* dst, int64_t rows, int64_t cols);
void store_bf16_pairs(uint16_t* dst, vf even, vf odd);
#endif

// 64-byte aligned fp32 scratch that grows on demand (contents are not kept when it grows).
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(int64_t floats) { reserve(floats); }

  float* reserve(int64_t floats) {
    if (floats > capacity_) {
      // aligned_alloc wants a size that is a multiple of the alignment.
      const size_t bytes = size_t(round_up((floats > 0 ? floats : 1) * int64_t(sizeof(float)), int64_t(kAlign)));
      float* p = static_cast<float*>(std::aligned_alloc(kAlign, bytes));
      if (!p) throw std::bad_alloc();
      data_.reset(p);
      capacity_ = floats;
    }
    return data_.get();
  }
  float* get() const { return data_.get(); }
  // Gives the memory back if more than `max_floats` are held.
  void trim(int64_t max_floats) {
    if (capacity_ > max_floats) data_.reset(), capacity_ = 0;
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  int64_t capacity_ = 0;
};

}  // namespace fmha::cpu::FMHA_CPU_ISA
