// The Hopper tile ops' layouts (src/cuda/tile/layout.h), emulated on the CPU with the very
// address arithmetic the kernels run: the fp32 transpose that feeds tf32 wgmma its K-major B
// operands (Vᵀ in the forward; Qᵀ, dOᵀ and Kᵀ in the backward), the transposed store of register
// fragments (dS from dSᵀ in the backward), and the register-A fragments' k order. Each test builds
// a product the way the GPU does — operands through these layouts, the wgmma's reading of them
// as the PTX ISA defines it — and compares it with the plain product, exactly (small integers).
// It also checks the bank-conflict claims of wgmma.cuh.
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "cuda/tile/layout.h"

namespace fmha::cuda::tile::layout {
namespace {

constexpr int kBanks = 32;
constexpr int kWarp = 32;

// An fp32 tile in shared memory as bytes, addressed by byte offset.
struct Smem {
  std::vector<float> words;
  std::vector<int> writes;  // per word: how many times it was written
  explicit Smem(size_t bytes) : words(bytes / 4, -1e30f), writes(bytes / 4, 0) {}
  float& at(uint32_t offset) {
    EXPECT_EQ(offset % 4, 0u);
    EXPECT_LT(offset / 4, words.size());
    return words[offset / 4];
  }
  void store(uint32_t offset, float x) {
    at(offset) = x;
    ++writes[offset / 4];
  }
};

// A [rows, cols] fp32 tile as TMA lands it: chunks of [rows, 32].
Smem landed(const std::vector<float>& m, int rows, int cols) {
  Smem s(size_t(rows) * cols * 4);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) s.at(uint32_t(swizzled_offset(r, c, rows * kSwizzleBytes, 4))) = m[size_t(r) * cols + c];
  return s;
}

std::vector<float> small_ints(size_t n, int seed) {
  std::vector<float> v(n);
  uint32_t x = uint32_t(seed) * 2654435761u + 1;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = float(int(x >> 28) - 8);  // -8 .. 7: products and sums stay exact in fp32
  }
  return v;
}

TEST(TileLayout, SwizzleIsAPermutationOfEachRow) {
  for (int elem : {2, 4})
    for (int rows : {8, 64, 128}) {
      const int cols = kSwizzleBytes / elem;
      std::set<int> seen;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 2 * cols; ++c) {  // two chunks
          const int at = swizzled_offset(r, c, rows * kSwizzleBytes, elem);
          EXPECT_EQ(at / (rows * kSwizzleBytes), c / cols);             // its chunk
          EXPECT_EQ(at % (rows * kSwizzleBytes) / kSwizzleBytes, r);  // its row
          seen.insert(at);
        }
      EXPECT_EQ(seen.size(), size_t(rows) * 2 * cols) << elem << " " << rows;
    }
}

// Every item and lane of transpose_k_major<ROWS, COLS>: dst[c][place(r)] = src[r][c], each
// destination word written once; source reads by quarter warp and destination stores by warp
// free of bank conflicts.
template <int ROWS, int COLS>
void check_transpose(bool permute) {
  using T = Transpose<ROWS, COLS>;
  const std::vector<float> m = small_ints(size_t(ROWS) * COLS, ROWS + COLS);
  Smem src = landed(m, ROWS, COLS);
  Smem dst{size_t(ROWS) * COLS * 4};
  for (uint32_t item = 0; item < T::kItems; ++item) {
    std::set<int> read_units[kWarp / 8];
    std::set<int> store_banks[4];
    for (uint32_t l = 0; l < uint32_t(kWarp); ++l) {
      const uint32_t from = T::source(item, l);
      ASSERT_EQ(from % 16, 0u);
      read_units[l / 8].insert(int(from / 16) % (kBanks / 4));
      const uint32_t place = permute ? uint32_t(tf32_position_of(int(l))) : l;
      for (uint32_t i = 0; i < 4; ++i) {
        const uint32_t to = T::destination(item, place, i);
        dst.store(to, src.at(from + 4 * i));
        store_banks[i].insert(int(to / 4) % kBanks);
      }
    }
    for (const auto& u : read_units) EXPECT_EQ(u.size(), 8u) << "item " << item;  // 8 lanes, 8 distinct units
    for (const auto& b : store_banks) EXPECT_EQ(b.size(), size_t(kBanks)) << "item " << item;
  }
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) {
      const int column = permute ? (r / 32) * 32 + tf32_position_of(r % 32) : r;
      const uint32_t at = uint32_t(swizzled_offset(c, column, COLS * kSwizzleBytes, 4));
      ASSERT_EQ(dst.at(at), m[size_t(r) * COLS + c]) << ROWS << "x" << COLS << " permute " << permute << " at " << r
                                                     << ", " << c;
      ASSERT_EQ(dst.writes[at / 4], 1);
    }
}

TEST(TileLayout, TransposeMovesEveryElementOnce) {
  for (bool permute : {false, true}) {
    check_transpose<64, 64>(permute);   // Qᵀ, dOᵀ (backward, head dim 64); Vᵀ (forward, 64 keys)
    check_transpose<128, 64>(permute);  // Kᵀ (backward: 128 keys)
    check_transpose<96, 64>(permute);   // Vᵀ (tf32 forward: 96 keys at head dim 64)
    check_transpose<64, 128>(permute);  // Vᵀ (tf32 forward: 64 keys at head dim 128)
  }
}

// One thread's view of a_from_acc<float>: register e of k block kb holds the accumulator element
// (row, col); the accumulator's register index 4 kb + acc_register_of(e) says which.
struct Element {
  int row, col;
};
Element fragment_element(int t, int kb, int e) {
  const int reg = 4 * kb + acc_register_of(e);  // d[4 g + 2 i + c]
  const int g = reg / 4, i = (reg % 4) / 2, c = reg % 2;
  return {acc_row(t, i), acc_col(t, 2 * g + c)};
}

// O[64, N] = P[64, K] · V[K, N] as the tf32 forward (and the backward's dV += Pᵀ·dO, dK += dSᵀ·Q)
// forms it: P's fragments from the accumulator (a_from_acc<float>), read by the wgmma in the PTX
// A layout; B = Vᵀ from the permuted transpose, read K-major (row n, column k).
template <int K, int N>
void check_register_a_product() {
  const std::vector<float> p = small_ints(64 * K, 1), v = small_ints(size_t(K) * N, 2);
  Smem vt{size_t(K) * N * 4};
  {
    using T = Transpose<K, N>;
    Smem src = landed(v, K, N);
    for (uint32_t item = 0; item < T::kItems; ++item)
      for (uint32_t l = 0; l < uint32_t(kWarp); ++l)
        for (uint32_t i = 0; i < 4; ++i)
          vt.store(T::destination(item, uint32_t(tf32_position_of(int(l))), i), src.at(T::source(item, l) + 4 * i));
  }
  // A as the hardware reads the fragments: a[m][k] of each k step.
  std::vector<float> a(64 * K, -1e30f);
  for (int t = 0; t < 128; ++t)
    for (int kb = 0; kb < K / 8; ++kb)
      for (int e = 0; e < 4; ++e) {
        const Element x = fragment_element(t, kb, e);
        ASSERT_EQ(tf32_a_row(t, e), x.row);                   // the fragment's row is the accumulator's
        ASSERT_EQ(tf32_column_at(8 * kb + tf32_a_k(t, e)), x.col);  // its k position holds that column
        a[size_t(x.row) * K + 8 * kb + tf32_a_k(t, e)] = p[size_t(x.row) * K + x.col];
      }
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      float got = 0, want = 0;
      for (int k = 0; k < K; ++k) {
        got += a[size_t(m) * K + k] * vt.at(uint32_t(swizzled_offset(n, k, N * kSwizzleBytes, 4)));
        want += p[size_t(m) * K + k] * v[size_t(k) * N + n];
      }
      ASSERT_EQ(got, want) << "K " << K << " N " << N << " at " << m << ", " << n;
    }
}

TEST(TileLayout, Tf32RegisterAMeetsPermutedRows) {
  for (int c = 0; c < 64; ++c) EXPECT_EQ(tf32_column_at(tf32_position_of(c)), c);
  check_register_a_product<64, 64>();   // the backward's dV, dK at head dim 64
  check_register_a_product<96, 64>();   // the tf32 forward at head dim 64
  check_register_a_product<64, 128>();  // the tf32 forward at head dim 128
}

// The tf32 backward's dQ = dS·K: two warpgroups' dSᵀ fragments ([64 keys, 64 q] each) stored
// transposed into dS [64 q, 128 keys] at column 64 w (store_transposed_tf32); K [128, 64]
// transposed in order into Kᵀ [64, 128]; warpgroup w's share dQ[:, 32 w, 32 w + 32) from both
// operands in shared memory, K-major: A(m, k) at dS's (m, k), B(k, n) at Kᵀ's (32 w + n, k).
TEST(TileLayout, TransposedFragmentsFeedTheQueryGradient) {
  constexpr int kKeys = 128, kQueries = 64, kHead = 64;
  const std::vector<float> ds = small_ints(size_t(kQueries) * kKeys, 3), k = small_ints(size_t(kKeys) * kHead, 4);
  Smem ds_tile{size_t(kQueries) * kKeys * 4};
  for (int w = 0; w < 2; ++w)
    for (int kb = 0; kb < kQueries / 8; ++kb)
      for (int e = 0; e < 4; ++e) {
        std::set<int> banks;
        for (int t = 0; t < 128; ++t) {
          const Element x = fragment_element(t, kb, e);  // (key in the warpgroup's 64, query)
          const int at = transposed_fragment_offset(kQueries, t, kb, e, 64 * w);
          ds_tile.store(uint32_t(at), ds[size_t(x.col) * kKeys + 64 * w + x.row]);
          banks.insert((at / 4) % kBanks);
          if (t % kWarp == kWarp - 1) {  // one warp's store of this register: 32 distinct banks
            EXPECT_EQ(banks.size(), size_t(kBanks)) << "warpgroup " << w << " kb " << kb << " e " << e;
            banks.clear();
          }
        }
      }
  for (int w : ds_tile.writes) ASSERT_EQ(w, 1);
  Smem kt{size_t(kKeys) * kHead * 4};
  {
    using T = Transpose<kKeys, kHead>;
    Smem src = landed(k, kKeys, kHead);
    for (uint32_t item = 0; item < T::kItems; ++item)
      for (uint32_t l = 0; l < uint32_t(kWarp); ++l)
        for (uint32_t i = 0; i < 4; ++i) kt.store(T::destination(item, l, i), src.at(T::source(item, l) + 4 * i));
  }
  for (int w = 0; w < 2; ++w)
    for (int m = 0; m < kQueries; ++m)
      for (int n = 0; n < 32; ++n) {
        float got = 0, want = 0;
        for (int key = 0; key < kKeys; ++key) {
          got += ds_tile.at(uint32_t(swizzled_offset(m, key, kQueries * kSwizzleBytes, 4))) *
                 kt.at(uint32_t(swizzled_offset(32 * w + n, key, kHead * kSwizzleBytes, 4)));
          want += ds[size_t(m) * kKeys + key] * k[size_t(key) * kHead + 32 * w + n];
        }
        ASSERT_EQ(got, want) << "warpgroup " << w << " at " << m << ", " << n;
      }
}

// Wavefronts of one warp's 4-byte accesses at these byte offsets: the most distinct words that
// fall in one bank.
int wavefronts(const std::vector<int>& offsets) {
  std::vector<std::set<int>> words(kBanks);
  for (int at : offsets) words[size_t(at / 4) % kBanks].insert(at / 4);
  size_t most = 0;
  for (const auto& w : words) most = std::max(most, w.size());
  return int(most);
}

// The wide tf32 backward's gradients (head dim 128, 64 keys, 64 query rows; sm90_bwd_mainloop.cuh's
// step_wide_tf32): warpgroup w's Pᵀ and dSᵀ ([64 keys, 32 q] accumulators) stored as they are at
// chunk w of P and dS [keys, q] (store_swizzled's arithmetic) and dSᵀ transposed at rows 32 w of
// dS [q, keys] (transposed_acc_offset); then warpgroup w's head-dim rows [64 w, 64 w + 64) of
// dVᵀ = dOᵀ·P and dQᵀ = Kᵀ·dSᵀ with A loaded transposed from the landed dO and K tiles
// (transposed_a_offset) and B read K-major from the stored tiles, as the PTX ISA defines both.
TEST(TileLayout, WideTf32GradientsFromTransposedFragments) {
  constexpr int kKeys = 64, kRows = 64, kHead = 128, kThreads = 128, kQueries = 32;
  constexpr int kChunk = 64 * kSwizzleBytes;  // [64 rows, 32] chunks: every tile here has 64 rows
  const std::vector<float> p = small_ints(size_t(kRows) * kKeys, 5), ds = small_ints(size_t(kRows) * kKeys, 6);
  const std::vector<float> dout = small_ints(size_t(kRows) * kHead, 7), k = small_ints(size_t(kKeys) * kHead, 8);
  Smem p_tile{size_t(kKeys) * kRows * 4}, ds_rows{size_t(kRows) * kKeys * 4};
  for (int w = 0; w < 2; ++w)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < kQueries / 4; ++j) {
        std::vector<int> stores;
        for (int t = 0; t < kThreads; ++t) {
          const int key = acc_row(t, i), q = kQueries * w + acc_col(t, j);
          p_tile.store(uint32_t(w * kChunk + swizzled_offset(acc_row(t, i), acc_col(t, j), kChunk, 4)),
                       p[size_t(q) * kKeys + key]);
          const int at = transposed_acc_offset(t, i, j, kQueries * w, kChunk);
          ds_rows.store(uint32_t(at), ds[size_t(q) * kKeys + key]);
          stores.push_back(at);
          if (t % kWarp == kWarp - 1) {  // a warp's transposed store of one register: 2 wavefronts
            EXPECT_LE(wavefronts(stores), 2) << "w " << w << " i " << i << " j " << j;
            stores.clear();
          }
        }
      }
  for (int n : p_tile.writes) ASSERT_EQ(n, 1);
  for (int n : ds_rows.writes) ASSERT_EQ(n, 1);
  Smem dout_tile = landed(dout, kRows, kHead), k_tile = landed(k, kKeys, kHead);
  for (int w = 0; w < 2; ++w) {
    // A[m][k] of each product as the thread registers hold it (checking each load's wavefronts).
    std::vector<float> a_dout(size_t(64) * kRows), a_k(size_t(64) * kKeys);
    for (int kb = 0; kb < 8; ++kb)
      for (int e = 0; e < 4; ++e) {
        std::vector<int> loads;
        for (int t = 0; t < kThreads; ++t) {
          const int at = transposed_a_offset(t, kb, e, 64 * w, kChunk);
          const size_t m = size_t(tf32_a_row(t, e)), kk = size_t(8 * kb + tf32_a_k(t, e));
          a_dout[m * kRows + kk] = dout_tile.at(uint32_t(at));
          a_k[m * kKeys + kk] = k_tile.at(uint32_t(at));
          loads.push_back(at);
          if (t % kWarp == kWarp - 1) {
            EXPECT_LE(wavefronts(loads), 2) << "w " << w << " kb " << kb << " e " << e;
            loads.clear();
          }
        }
      }
    // D[m][n] = Σ_k A[m][k] · B(k, n), B K-major at the tile's row n, column k (the wgmma's reading),
    // against the plain product `want`.
    auto check_product = [&](const char* name, const std::vector<float>& a, Smem& b, int n_count, int k_count,
                             auto want) {
      for (int m = 0; m < 64; ++m)
        for (int n = 0; n < n_count; ++n) {
          float got = 0;
          for (int kk = 0; kk < k_count; ++kk)
            got += a[size_t(m) * k_count + kk] * b.at(uint32_t(swizzled_offset(n, kk, kChunk, 4)));
          ASSERT_EQ(got, want(m, n)) << name << ", warpgroup " << w << " at " << m << ", " << n;
        }
    };
    check_product("dVᵀ", a_dout, p_tile, kKeys, kRows, [&](int m, int key) {  // Σ_q dO[q][d] P[q][key]
      float sum = 0;
      for (int q = 0; q < kRows; ++q) sum += dout[size_t(q) * kHead + 64 * w + m] * p[size_t(q) * kKeys + key];
      return sum;
    });
    check_product("dQᵀ", a_k, ds_rows, kRows, kKeys, [&](int m, int q) {  // Σ_key K[key][d] dS[q][key]
      float sum = 0;
      for (int key = 0; key < kKeys; ++key) sum += k[size_t(key) * kHead + 64 * w + m] * ds[size_t(q) * kKeys + key];
      return sum;
    });
  }
}

// The transposed loads and stores take one address a thread per register and add immediates for
// the rest (wgmma.cuh): every offset equals its base's plus whole swizzle periods, at every thread,
// head dim and chunk size the kernels use (8 rows on, the swizzle's row phase is the same).
TEST(TileLayout, TransposedOffsetsStepByThePeriod) {
  for (int chunk : {32 * kSwizzleBytes, 64 * kSwizzleBytes, 128 * kSwizzleBytes})
    for (int t = 0; t < 128; ++t) {
      for (int m0 : {0, 32, 64, 96})
        for (int kb = 0; kb < 16; ++kb)
          for (int e = 0; e < 4; ++e)
            ASSERT_EQ(transposed_a_offset(t, kb, e, m0, chunk),
                      transposed_a_offset(t, 0, e, m0, chunk) + kb * kSwizzlePeriodBytes)
                << "t " << t << " kb " << kb << " e " << e << " m0 " << m0 << " chunk " << chunk;
      for (int row0 : {0, 4, 32, 64})
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 32; ++j)
            ASSERT_EQ(transposed_acc_offset(t, i, j, row0, chunk),
                      transposed_acc_offset(t, i, j % 2, row0, chunk) + (j / 2) * kSwizzlePeriodBytes)
                << "t " << t << " i " << i << " j " << j << " row0 " << row0 << " chunk " << chunk;
    }
}

}  // namespace
}  // namespace fmha::cuda::tile::layout
