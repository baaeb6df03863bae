// Tile-op tests: each op of src/cuda/tile (and the sm80 fragment loads built on it) run by a
// tiny kernel and compared with a host computation, over a few tile sizes; and the sm90 packed
// forward's walk over the sequence table (plain code, run here on any GPU). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm80/sm80_fragments.cuh"
#include "cuda/sm90/sm90_packed_tiles.h"
#include "cuda/tile/atomic.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/reduce.cuh"
#include "cuda/tile/simt.cuh"
#include "../packed_walk.h"

namespace fmha::cuda::test {
namespace {

bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}
int arch() {
  int d = 0, major = 0, minor = 0;
  cudaGetDevice(&d);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d);
  return major * 10 + minor;
}

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  cudaMalloc(&d, h.size() * sizeof(T));
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

std::vector<float> random(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> out(n);
  for (auto& x : out) x = u(rng);
  return out;
}

// ---- load_async with ragged bounds: [R, C] tile from a [rows_valid, cols_valid] corner ----------
template <int R, int C>
__global__ void load_kernel(const float* src, int64_t stride, int rows, int cols, float* out) {
  __shared__ float buf[R * (C + 1)];
  tile::SmemTile<float, R, C, 1> t{buf};
  tile::block::load_async<1, 256>(t, src, stride, rows, cols);
  tile::block::commit();
  tile::block::wait<0>();
  __syncthreads();
  for (int e = threadIdx.x; e < R * C; e += 256) out[e] = t(e / C, e % C);
}

template <int R, int C>
void check_load(int rows, int cols) {
  const int64_t stride = C + 7;
  const auto host = random(size_t(R * stride), 1);
  float* src = to_device(host);
  float* out = nullptr;
  cudaMalloc(&out, R * C * sizeof(float));
  load_kernel<R, C><<<1, 256>>>(src, stride, rows, cols, out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = to_host(out, R * C);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      ASSERT_EQ(got[r * C + c], r < rows && c < cols ? host[r * stride + c] : 0.f) << r << "," << c;
  cudaFree(src);
  cudaFree(out);
}

// ---- load_vector_async: the first `valid` entries copied, the rest filled ------------------------
template <int N>
__global__ void load_vector_kernel(const float* src, int valid, float* out) {
  __shared__ float buf[N];
  tile::block::load_vector_async<N, 128>(buf, src, valid, -7.5f);
  tile::block::commit();
  tile::block::wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < N; i += 128) out[i] = buf[i];
}

TEST(TileOps, LoadVectorAsync) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr int kN = 200;
  const auto host = random(kN, 3);
  float* src = to_device(host);
  float* out = nullptr;
  cudaMalloc(&out, kN * sizeof(float));
  for (int valid : {0, 1, 127, 128, 199, kN}) {
    load_vector_kernel<kN><<<1, 128>>>(src, valid, out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = to_host(out, kN);
    for (int i = 0; i < kN; ++i) ASSERT_EQ(got[i], i < valid ? host[i] : -7.5f) << "valid " << valid << ", i " << i;
  }
  cudaFree(src);
  cudaFree(out);
}

TEST(TileOps, LoadRagged) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  check_load<16, 32>(16, 32);
  check_load<16, 32>(5, 17);
  check_load<64, 64>(63, 1);
  check_load<32, 128>(0, 0);
}

// ---- atomic_add_pair: many threads add small integers (exact in fp32, so order-free) into pairs --
__global__ void atomic_pair_kernel(float* sums, int pairs) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  tile::atomic_add_pair(sums + 2 * (i % pairs), float(i % 7), float(i % 5 - 2));
}

TEST(TileOps, AtomicAddPair) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr int kPairs = 37, kBlocks = 64, kThreadsPerBlock = 256;
  std::vector<float> init(2 * kPairs);
  for (int p = 0; p < 2 * kPairs; ++p) init[p] = float(p);
  float* sums = to_device(init);
  atomic_pair_kernel<<<kBlocks, kThreadsPerBlock>>>(sums, kPairs);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> want(init.begin(), init.end());
  for (int i = 0; i < kBlocks * kThreadsPerBlock; ++i) {
    want[2 * (i % kPairs)] += i % 7;
    want[2 * (i % kPairs) + 1] += i % 5 - 2;
  }
  const auto got = to_host(sums, 2 * kPairs);
  for (int p = 0; p < 2 * kPairs; ++p) EXPECT_EQ(double(got[p]), want[p]) << "element " << p;
  cudaFree(sums);
}

// ---- atomic_add_quad: the same with four consecutive columns (float4 atomics on sm_90) ----------
__global__ void atomic_quad_kernel(float* sums, int quads) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  tile::atomic_add_quad(sums + 4 * (i % quads), make_float4(float(i % 7), float(i % 5 - 2), float(i % 3), -1.f));
}

TEST(TileOps, AtomicAddQuad) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr int kQuads = 37, kBlocks = 64, kThreadsPerBlock = 256;
  std::vector<float> init(4 * kQuads);
  for (int p = 0; p < 4 * kQuads; ++p) init[p] = float(p);
  float* sums = to_device(init);  // cudaMalloc: 256-byte aligned, so every quad is 16-byte aligned
  atomic_quad_kernel<<<kBlocks, kThreadsPerBlock>>>(sums, kQuads);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> want(init.begin(), init.end());
  for (int i = 0; i < kBlocks * kThreadsPerBlock; ++i) {
    want[4 * (i % kQuads)] += i % 7;
    want[4 * (i % kQuads) + 1] += i % 5 - 2;
    want[4 * (i % kQuads) + 2] += i % 3;
    want[4 * (i % kQuads) + 3] -= 1;
  }
  const auto got = to_host(sums, 4 * kQuads);
  for (int p = 0; p < 4 * kQuads; ++p) EXPECT_EQ(double(got[p]), want[p]) << "element " << p;
  cudaFree(sums);
}

// ---- wait_turn / pass_turn: blocks add into shared fp32 sums in block order ---------------------
// Every thread of block b adds values[b][t] into sums[t] with plain atomics, but only in its turn
// (turn counter = b), and the block's thread 0 records the order. Values of mixed magnitudes make
// fp32 sums order-dependent, so only block order reproduces the host's sequential sums bit for bit.
__global__ void turns_kernel(const float* values, float* sums, int* turn, int* order, int* next) {
  const int b = int(blockIdx.x), t = int(threadIdx.x);
  if (t == 0) tile::wait_turn(turn, b);
  __syncthreads();
  atomicAdd(sums + t, values[b * blockDim.x + t]);
  if (t == 0) order[(*next)++] = b;  // plain read-modify-write: safe only while the turn is held
  __syncthreads();
  if (t == 0) tile::pass_turn(turn, b + 1);
}

TEST(TileOps, TurnsOrderBlocks) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr int kBlocks = 512, kThreadsPerBlock = 128;
  std::vector<float> values = random(size_t(kBlocks) * kThreadsPerBlock, 7);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::ldexp(values[i], int(i % 29) - 14);
  float* d_values = to_device(values);
  float* sums = to_device(std::vector<float>(kThreadsPerBlock, 0.f));
  int* counters = to_device(std::vector<int>(2, 0));  // turn, next
  int* order = to_device(std::vector<int>(kBlocks, -1));
  turns_kernel<<<kBlocks, kThreadsPerBlock>>>(d_values, sums, counters, order, counters + 1);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got_order = to_host(order, kBlocks);
  for (int b = 0; b < kBlocks; ++b) ASSERT_EQ(got_order[size_t(b)], b) << "position " << b;
  const auto got = to_host(sums, kThreadsPerBlock);
  for (int t = 0; t < kThreadsPerBlock; ++t) {
    float want = 0.f;
    for (int b = 0; b < kBlocks; ++b) want += values[size_t(b) * kThreadsPerBlock + t];
    EXPECT_EQ(got[size_t(t)], want) << "column " << t;
  }
  cudaFree(d_values);
  cudaFree(sums);
  cudaFree(counters);
  cudaFree(order);
}

// ---- SIMT mma_nt, row max / row sum, exp2 on the Grid16 layout -----------------------------------
template <int M, int N, int K>
__global__ void simt_kernel(const float* a, const float* b, float* c, float* row_max, float* row_sum, float* ex) {
  __shared__ float sa[M * K], sb[N * K];
  for (int e = threadIdx.x; e < M * K; e += 256) sa[e] = a[e];
  for (int e = threadIdx.x; e < N * K; e += 256) sb[e] = b[e];
  __syncthreads();
  const tile::Grid16 g = tile::Grid16::of_thread();
  tile::RegTile<float, M / 16, N / 16> acc;  // [M, N] Grid16
  acc.fill(0.f);
  tile::thread::mma_nt<K>(acc, tile::SmemTile<float, M, K>{sa}, tile::SmemTile<float, N, K>{sb}, g);
  float mx[M / 16], sm[M / 16];
  tile::warp::row_max<16>(mx, acc);
  tile::warp::row_sum<16>(sm, acc);
  for (int i = 0; i < M / 16; ++i) {
    for (int j = 0; j < N / 16; ++j) {
      c[g.row(i) * N + g.col(j)] = acc(i, j);
      ex[g.row(i) * N + g.col(j)] = tile::exp2_exact(acc(i, j));
    }
    if (g.tx == 0) row_max[g.row(i)] = mx[i], row_sum[g.row(i)] = sm[i];
  }
}

template <int M, int N, int K>
void check_simt() {
  const auto a = random(M * K, 2), b = random(N * K, 3);
  float *da = to_device(a), *db = to_device(b), *dc, *dmax, *dsum, *dex;
  cudaMalloc(&dc, M * N * 4);
  cudaMalloc(&dex, M * N * 4);
  cudaMalloc(&dmax, M * 4);
  cudaMalloc(&dsum, M * 4);
  simt_kernel<M, N, K><<<1, 256>>>(da, db, dc, dmax, dsum, dex);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto c = to_host(dc, M * N), mx = to_host(dmax, M), sm = to_host(dsum, M), ex = to_host(dex, M * N);
  for (int i = 0; i < M; ++i) {
    double row_max = -1e30, row_sum = 0;
    for (int j = 0; j < N; ++j) {
      double dot = 0;
      for (int k = 0; k < K; ++k) dot += double(a[i * K + k]) * b[j * K + k];
      ASSERT_NEAR(c[i * N + j], dot, 1e-5 * K) << i << "," << j;
      ASSERT_NEAR(ex[i * N + j], std::exp2(double(c[i * N + j])), 1e-6 * std::exp2(std::abs(dot)) * 4);
      row_max = std::max(row_max, double(c[i * N + j]));
      row_sum += c[i * N + j];
    }
    ASSERT_EQ(mx[i], float(row_max)) << i;
    ASSERT_NEAR(sm[i], row_sum, 1e-5 * N * K) << i;
  }
  for (float* p : {da, db, dc, dmax, dsum, dex}) cudaFree(p);
}

TEST(TileOps, SimtMmaReduceExp2) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  check_simt<16, 16, 8>();
  check_simt<32, 64, 64>();
  check_simt<64, 32, 96>();
}

// ---- exp2 on the FMA pipe against exp2 in double ---------------------------------------------
__global__ void exp2_poly_kernel(const float* x, float* y, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = tile::exp2_poly(x[i]);
}

TEST(TileOps, Exp2PolynomialMatchesExp2) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  // A dense sweep of the range the softmax uses (scores minus the row max, up to the lazy
  // rescale's 2^8 above it), integers and half-integers where the rounding splits, and the ends.
  std::vector<float> x;
  for (int i = 0; i <= 270000; ++i) x.push_back(-126.f + float(i) * (134.f / 270000.f));
  for (int j = -125; j <= 8; ++j)
    for (float d : {0.f, 0.5f, -0.5f, 1e-6f, -1e-6f}) x.push_back(float(j) + d);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> zero_at = {-inf, -1e30f, -200.f, -127.f};
  x.insert(x.end(), zero_at.begin(), zero_at.end());
  float* dx = to_device(x);
  float* dy = nullptr;
  cudaMalloc(&dy, x.size() * sizeof(float));
  exp2_poly_kernel<<<unsigned((x.size() + 255) / 256), 256>>>(dx, dy, int(x.size()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto y = to_host(dy, x.size());
  double worst = 0.0;
  for (size_t i = 0; i + zero_at.size() < x.size(); ++i) {
    const double want = std::exp2(double(x[i]));
    const double rel = std::abs(double(y[i]) - want) / want;
    worst = std::max(worst, rel);
    ASSERT_LE(rel, 4.0 * std::ldexp(1.0, -24)) << "2^" << x[i] << " = " << y[i] << ", expected " << want;
  }
  for (size_t i = x.size() - zero_at.size(); i < x.size(); ++i) EXPECT_EQ(y[i], 0.f) << "2^" << x[i];
  for (int j = -125; j <= 8; ++j) {  // exact powers of two, 2^0 = 1 above all
    const auto it = std::find(x.begin(), x.end(), float(j));
    EXPECT_EQ(y[size_t(it - x.begin())], std::ldexp(1.f, j)) << "2^" << j;
  }
  std::printf("exp2_poly: worst relative error %.3g (%.2f ulp)\n", worst, worst / std::ldexp(1.0, -24));
  cudaFree(dx);
  cudaFree(dy);
}

// ---- the online softmax with scores scaled first: a row's largest score gives P = 1 exactly -----
// Each thread one row of kScoreCols scores; P scaled first (thread::scale_rounded, then the folded
// update with scale 1, as the sm90 tf32 forward runs it) and with the scale folded into the
// exponent's FMA (update_scaled with the scale), both lazy.
constexpr int kScoreRows = 256, kScoreCols = 16;
__global__ void scaled_first_kernel(const float* scores, float scale, float* p_first, float* p_folded) {
  const int row = int(blockIdx.x * blockDim.x + threadIdx.x);
  tile::RegTile<float, 1, kScoreCols> first, folded;
  for (int j = 0; j < kScoreCols; ++j) first(0, j) = folded(0, j) = scores[row * kScoreCols + j];
  tile::OnlineSoftmax<1, 1> a, b;
  a.init();
  b.init();
  float rescale[1];
  tile::thread::scale_rounded(first, scale);
  a.update_scaled<true, true>(first, 1.f, rescale);
  b.update_scaled<true, true>(folded, scale, rescale);
  for (int j = 0; j < kScoreCols; ++j) {
    p_first[row * kScoreCols + j] = first(0, j);
    p_folded[row * kScoreCols + j] = folded(0, j);
  }
}

TEST(TileOps, ScoresScaledFirstGiveTheRowMaxPExactlyOne) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::vector<float> s = random(size_t(kScoreRows) * kScoreCols, 11);
  for (auto& x : s) x *= 24.f;  // scores of tf32 attention at head dim 64 and unit inputs
  const float scale = 0.125f * 1.4426950408889634f;  // 1/sqrt(64) in the exp2 domain
  float* ds = to_device(s);
  float *dfirst = nullptr, *dfolded = nullptr;
  cudaMalloc(&dfirst, s.size() * sizeof(float));
  cudaMalloc(&dfolded, s.size() * sizeof(float));
  scaled_first_kernel<<<kScoreRows / 64, 64>>>(ds, scale, dfirst, dfolded);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto first = to_host(dfirst, s.size()), folded = to_host(dfolded, s.size());
  int folded_off_one = 0;
  for (int r = 0; r < kScoreRows; ++r) {
    const float* row = &s[size_t(r) * kScoreCols];
    const int arg = int(std::max_element(row, row + kScoreCols) - row);
    ASSERT_EQ(first[size_t(r) * kScoreCols + arg], 1.f) << "row " << r;
    folded_off_one += folded[size_t(r) * kScoreCols + arg] != 1.f;
    // And every P is 2^(scale·(s − max)) within the roundings of scale·s, scale·max and their
    // difference (about 1e-6 in exponents of at most 8.7 here) and ex2.approx's 2^-22.
    for (int j = 0; j < kScoreCols; ++j) {
      const double want = std::exp2(double(scale) * (double(row[j]) - double(row[arg])));
      EXPECT_NEAR(first[size_t(r) * kScoreCols + j], want, 4e-6 * want) << r << "," << j;
    }
  }
  // The folded FMA keeps scale·max's rounding: most rows' max gives 2^ε ≠ 1 (why tf32 scales first).
  EXPECT_GT(folded_off_one, 0);
  std::printf("rows whose max gives P != 1: scaled first 0, folded %d of %d\n", folded_off_one, kScoreRows);
  for (float* p : {ds, dfirst, dfolded}) cudaFree(p);
}

// ---- the speculative online softmax (sm90 `spec`) and the lazy one, tile by tile, against fp64 ----
// A warp holds kSpecRows rows, each over kSpecLanes consecutive lanes of kSpecCols scores, and
// walks kSpecTiles key tiles: the first with update_scaled<true, true>, the others with
// update_speculative (as the sm90 forward's speculative kernel runs them) or update_scaled
// (speculative = 0), each feeding o = o · rescale + Σ P·v. The rows take shapes that send the
// speculative update down each of its ways: a max that never grows (the vote keeps every base), a
// max that grows within the lazy bound while the row's share of the sum passes 2^8 (the vote fails,
// the rows keep their bases), one that grows past the bound (rows rebase), rows whose first tiles
// are fully masked (no base yet), a masked tile between others, one peaked score, constant and
// falling rows. The vote is the warp's: the first kSpecShapes warps hold rows of one shape each
// (so the vote holds where that shape lets it), the others a row of every shape (where one row's
// share passes 2^8 the warp's other rows take the fallback and keep their bases).
constexpr int kSpecLanes = 4, kSpecCols = 16, kSpecTiles = 6, kSpecRows = 32 / kSpecLanes, kSpecShapes = 8;
constexpr int kSpecWarps = 2 * kSpecShapes;  // warp w < kSpecShapes: rows of shape w; then rows of every shape
constexpr int kSpecAllRows = kSpecWarps * kSpecRows, kSpecKeys = kSpecTiles * kSpecLanes * kSpecCols;
__global__ void speculative_kernel(const float* scores, const float* values, float scale, int speculative,
                                   float* out, float* lse) {
  const int lane = int(threadIdx.x) % 32, part = lane % kSpecLanes;
  const int row = (int(threadIdx.x) / 32) * kSpecRows + lane / kSpecLanes;
  tile::OnlineSoftmax<1, kSpecLanes> softmax;
  softmax.init();
  float o = 0.f;
  for (int t = 0; t < kSpecTiles; ++t) {
    tile::RegTile<float, 1, kSpecCols> s, p;
    const int key0 = (t * kSpecLanes + part) * kSpecCols;
    for (int j = 0; j < kSpecCols; ++j) s(0, j) = scores[row * kSpecKeys + key0 + j];
    float rescale[1];
    if (speculative && t > 0) {
      softmax.update_speculative(s, scale, rescale, [&](const tile::RegTile<float, 1, kSpecCols>& q) { p = q; });
    } else {
      softmax.update_scaled<true, true>(s, scale, rescale);
      p = s;
    }
    float add = 0.f;
    for (int j = 0; j < kSpecCols; ++j) add += p(0, j) * values[key0 + j];
    o = o * rescale[0] + add;
  }
  softmax.finish();
  o = tile::warp::row_sum<kSpecLanes>(o);
  if (part == 0) out[row] = o * softmax.inv_sum(0), lse[row] = softmax.lse(0);
}

TEST(TileOps, SpeculativeSoftmaxMatchesFp64OnEveryPath) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const float inf = std::numeric_limits<float>::infinity();
  const float scale = 1.f;  // scores in the exp2 domain
  std::vector<float> s = random(size_t(kSpecAllRows) * kSpecKeys, 21), v = random(kSpecKeys, 22);
  constexpr int kTileKeys = kSpecKeys / kSpecTiles;
  // Key k of tile t lies in [t·kTileKeys, (t + 1)·kTileKeys) of the row in the kernel's order
  // (tile, lane, column), so a tile is a contiguous run of the row.
  auto tile_of = [&](int row, int t) { return &s[size_t(row) * kSpecKeys + size_t(t) * kTileKeys]; };
  for (int r = 0; r < kSpecAllRows; ++r) {
    const int warp = r / kSpecRows, shape = warp < kSpecShapes ? warp : r % kSpecShapes;
    for (int t = 0; t < kSpecTiles; ++t) {
      float* x = tile_of(r, t);
      for (int k = 0; k < kTileKeys; ++k) {
        switch (shape) {
          case 0: break;                                       // uniform(-1, 1): bases kept
          case 1: x[k] = t == 0 ? x[k] : 5.5f * float(t); break;  // +5.5 a tile: sums past 2^8
          case 2: x[k] += 12.f * float(t); break;                   // +12 a tile: rebased
          case 3: if (t < 2) x[k] = -inf; break;                    // first tiles masked
          case 4: if (t == 3) x[k] = -inf; break;                   // a masked tile between
          case 5: if (t == 2 && k == 7) x[k] = 30.f; break;         // one peaked score
          case 6: x[k] = 0.5f; break;                               // constant
          case 7: x[k] += -10.f * float(t); break;                  // falling
        }
      }
    }
  }
  float *ds = to_device(s), *dv = to_device(v), *dout = nullptr, *dlse = nullptr;
  cudaMalloc(&dout, kSpecAllRows * sizeof(float));
  cudaMalloc(&dlse, kSpecAllRows * sizeof(float));
  double vmax = 0.0;
  for (float x : v) vmax = std::max(vmax, double(std::abs(x)));
  for (int speculative : {0, 1}) {
    speculative_kernel<<<1, 32 * kSpecWarps>>>(ds, dv, scale, speculative, dout, dlse);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto out = to_host(dout, kSpecAllRows), lse = to_host(dlse, kSpecAllRows);
    for (int r = 0; r < kSpecAllRows; ++r) {
      const float* row = &s[size_t(r) * kSpecKeys];
      double m = -inf;
      for (int k = 0; k < kSpecKeys; ++k) m = std::max(m, double(scale) * row[k]);
      double sum = 0.0, acc = 0.0;
      for (int k = 0; k < kSpecKeys; ++k) {
        const double p = std::exp2(double(scale) * row[k] - m);
        sum += p;
        acc += p * v[k];
      }
      const double want_lse = (m + std::log2(sum)) * std::log(2.0);
      // fp32 sums of up to kSpecKeys terms and ex2.approx: ~1e-6 typically; a wrong base or rescale
      // is off by a large fraction of vmax.
      EXPECT_NEAR(out[r], acc / sum, 1e-4 * vmax) << "row " << r << ", speculative " << speculative;
      EXPECT_NEAR(lse[r], want_lse, 2e-5 * std::max(1.0, std::abs(want_lse)))
          << "row " << r << ", speculative " << speculative;
    }
  }
  for (float* p : {ds, dv, dout, dlse}) cudaFree(p);
}

// ---- ex2.approx.ftz against exp2f: the same bits on every normal result -----------------------
__global__ void exp2_pair_kernel(const float* x, float* fast, float* exact, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) fast[i] = tile::exp2_fast(x[i]), exact[i] = tile::exp2_exact(x[i]);
}

TEST(TileOps, Exp2FastIsExp2fAboveDenormals) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  // Every 2^-10 step of [-150, 128) and random points between: the own softmax's exponents
  // (split tf32 backward, own_exp2<true>) lie in [-inf, 0].
  std::vector<float> x;
  for (int i = -150 * 1024; i < 128 * 1024; ++i) x.push_back(float(i) / 1024.f);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-150.f, 128.f);
  for (int i = 0; i < 1 << 18; ++i) x.push_back(u(rng));
  x.push_back(-std::numeric_limits<float>::infinity());
  float* dx = to_device(x);
  float *dfast = nullptr, *dexact = nullptr;
  cudaMalloc(&dfast, x.size() * sizeof(float));
  cudaMalloc(&dexact, x.size() * sizeof(float));
  exp2_pair_kernel<<<unsigned((x.size() + 255) / 256), 256>>>(dx, dfast, dexact, int(x.size()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto fast = to_host(dfast, x.size()), exact = to_host(dexact, x.size());
  size_t normal = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (exact[i] >= std::numeric_limits<float>::min()) {
      ++normal;
      uint32_t a, b;
      std::memcpy(&a, &fast[i], 4);
      std::memcpy(&b, &exact[i], 4);
      ASSERT_EQ(a, b) << "2^" << x[i] << ": ex2.approx.ftz " << fast[i] << ", exp2f " << exact[i];
    } else {
      ASSERT_EQ(fast[i], 0.f) << "2^" << x[i];  // flushed: below FLT_MIN
    }
  }
  EXPECT_GT(normal, x.size() / 2);
  for (float* p : {dx, dfast, dexact}) cudaFree(p);
}

// ---- mma.sync through the sm80 fragment loads: C[16, N] = A[16, K]·B[N, K]^T, then D = P·V ------
// with P = C from registers (a_from_acc) and V = B read as [K=N keys][K dims] via load_b_kn.
template <class T, int N, int K>
__global__ void mma_kernel(const T* a, const T* b, float* c, float* d) {
#if __CUDA_ARCH__ >= 800
  constexpr int kPad = 16 / int(sizeof(T));
  __shared__ __align__(16) T sa[16 * (K + kPad)];
  __shared__ __align__(16) T sb[N * (K + kPad)];
  tile::SmemTile<T, 16, K, kPad> ta{sa};
  tile::SmemTile<T, N, K, kPad> tb{sb};
  for (int e = threadIdx.x; e < 16 * K; e += 32) ta(e / K, e % K) = a[e];
  for (int e = threadIdx.x; e < N * K; e += 32) tb(e / K, e % K) = b[e];
  __syncwarp();
  constexpr int kK = tile::warp::MmaOp<T>::kK;
  sm80::Acc16<N> acc;  // [16, N]
  acc.fill(0.f);
  for (int k0 = 0; k0 < K; k0 += kK) {
    sm80::FragA<T> fa;
    sm80::load_a<T>(fa, ta, 0, k0);
    for (int n0 = 0; n0 < N; n0 += 16) {
      sm80::FragB<T> fb[2];
      sm80::load_b_nk<T>(fb, tb, n0, k0);
      tile::warp::mma<T>(acc.c[n0 / 8], fa, fb[0]);
      tile::warp::mma<T>(acc.c[n0 / 8 + 1], fa, fb[1]);
    }
  }
  const int g = threadIdx.x / 4, t = threadIdx.x % 4;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < acc.kCols; ++j) c[(g + 8 * i) * N + sm80::Acc16<N>::col(j, t)] = acc(i, j);
  // D[16, K] = C·B  (B as [N][K] row-major: the k = N dimension is its rows)
  sm80::Acc16<K> out;
  out.fill(0.f);
  for (int kb = 0; kb < N / kK; ++kb) {
    sm80::FragA<T> fa;
    sm80::a_from_acc<T>(fa, acc, kb);
    for (int n0 = 0; n0 < K; n0 += 16) {
      sm80::FragB<T> fb[2];
      sm80::load_b_kn<T>(fb, tb, kb * kK, n0);
      tile::warp::mma<T>(out.c[n0 / 8], fa, fb[0]);
      tile::warp::mma<T>(out.c[n0 / 8 + 1], fa, fb[1]);
    }
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < out.kCols; ++j) d[(g + 8 * i) * K + sm80::Acc16<K>::col(j, t)] = out(i, j);
#endif
}

float host_round(float x, int kind) {  // 0 fp16, 1 bf16, 2 tf32
  if (kind == 0) return __half2float(__float2half_rn(x));
  if (kind == 1) return __bfloat162float(__float2bfloat16_rn(x));
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}

template <class T, int N, int K>
void check_mma(int kind) {
  const auto af = random(16 * K, 4), bf = random(N * K, 5);
  std::vector<T> a(af.size()), b(bf.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = T(af[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] = T(bf[i]);
  T *da = to_device(a), *db = to_device(b);
  float *dc, *dd;
  cudaMalloc(&dc, 16 * N * 4);
  cudaMalloc(&dd, 16 * K * 4);
  mma_kernel<T, N, K><<<1, 32>>>(da, db, dc, dd);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto c = to_host(dc, 16 * N), d = to_host(dd, 16 * K);
  auto val = [&](const std::vector<T>& v, size_t i) { return host_round(float(v[i]), kind); };
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < N; ++j) {
      double dot = 0;
      for (int k = 0; k < K; ++k) dot += double(val(a, i * K + k)) * val(b, j * K + k);
      ASSERT_NEAR(c[i * N + j], dot, 1e-4 * K) << "C " << i << "," << j;
    }
    for (int k = 0; k < K; ++k) {
      double dot = 0;
      for (int j = 0; j < N; ++j) dot += double(host_round(c[i * N + j], kind)) * val(b, j * K + k);
      ASSERT_NEAR(d[i * K + k], dot, 1e-3 * N) << "D " << i << "," << k;
    }
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dd);
}

TEST(TileOps, MmaSyncLdmatrix) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  if (arch() < 80) GTEST_SKIP() << "mma.sync needs sm_80";
  check_mma<__half, 16, 16>(0);
  check_mma<__half, 32, 64>(0);
  check_mma<__nv_bfloat16, 16, 32>(1);
  check_mma<__nv_bfloat16, 64, 64>(1);
  check_mma<float, 16, 16>(2);
  check_mma<float, 32, 64>(2);
}

// The sm90 packed forward's work tiles, walked as its producer walks them: one thread per block,
// each taking work tiles t = blockIdx.x, then every grid-th (static) or the next from a counter
// (dynamic), until the cursor runs past the last. Every (sequence, query tile, head) must come
// exactly once; a tile outside the expected ranges counts in `bad`.
__global__ void packed_cursor_kernel(sm90::PackedTileCursor start, AttentionArgs args, int* counter,
                                     const int* first_tile, const int* m_blocks, int* visits, int* bad) {
  sm90::PackedTileCursor cursor = start;
  for (int t = int(blockIdx.x);;) {
    if (!cursor.seek(args, t)) break;
    const sm90::WorkTile w = cursor.tile(t);
    if (w.batch < 0 || w.batch >= args.batch || w.head < 0 || w.head >= args.heads || w.m_block < 0 ||
        w.m_block >= m_blocks[w.batch]) {
      atomicAdd(bad, 1);
    } else {
      atomicAdd(&visits[first_tile[w.batch] + w.m_block * args.heads + w.head], 1);
    }
    t = counter != nullptr ? int(gridDim.x) + atomicAdd(counter, 1) : t + int(gridDim.x);
  }
}

template <class V>
struct DeviceArray {
  V* ptr = nullptr;
  explicit DeviceArray(const std::vector<V>& host) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(1, host.size()) * sizeof(V)), cudaSuccess);
    if (!host.empty()) EXPECT_EQ(cudaMemcpy(ptr, host.data(), host.size() * sizeof(V), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<V> download(size_t n) const {
    std::vector<V> out(n);
    if (n > 0) EXPECT_EQ(cudaMemcpy(out.data(), ptr, n * sizeof(V), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  ~DeviceArray() { cudaFree(ptr); }
};

void check_packed_walk(const std::vector<int32_t>& table, int64_t total_q, int64_t max_seqlen, int heads, int tile_m,
                       bool reverse, int grid, bool dynamic) {
  SCOPED_TRACE("tile_m " + std::to_string(tile_m) + " grid " + std::to_string(grid) +
               (dynamic ? " dynamic" : " static") + (reverse ? " longest first" : ""));
  const fmha::test::PackedWalkPlan plan = fmha::test::plan_packed_walk(table, total_q, max_seqlen, heads, tile_m);
  const AttentionArgs& args = plan.args;
  const std::vector<int>&first = plan.first, &blocks = plan.blocks;
  const int tiles = plan.tiles;
  DeviceArray<int32_t> dtable(table);
  DeviceArray<int> dfirst(first), dblocks(blocks), visits(std::vector<int>(tiles, 0)), bad(std::vector<int>{0}),
      counter(std::vector<int>{0});
  AttentionArgs device_args = args;
  device_args.packed.cu_seqlens_q = device_args.packed.cu_seqlens_k = dtable.ptr;
  const sm90::PackedTileCursor start(device_args, tile_m, reverse);
  packed_cursor_kernel<<<grid, 1>>>(start, device_args, dynamic ? counter.ptr : nullptr, dfirst.ptr, dblocks.ptr,
                                    visits.ptr, bad.ptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(bad.download(1)[0], 0);
  const std::vector<int> seen = visits.download(size_t(tiles));
  for (int i = 0; i < tiles; ++i) EXPECT_EQ(seen[i], 1) << "work tile " << i;
  // Every tile is within the bound the launcher checks against the int32 range.
  EXPECT_LE(int64_t(tiles), sm90::packed_tile_bound(args, tile_m));
}

// set_operand's split tf32 (tf32x3): hi + lo of every value, in fp32's layout with the 13 low bits
// zero (what the tensor cores read), rounded to nearest even on sm_90 (cvt.rn) and half away from
// zero before (cvt.rna), against host models of both.
__global__ void split_operand_kernel(const float* x, uint32_t* out, int n) {
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) {
    uint32_t r[2];
    tile::set_operand<tile::tf32x3>(r, 0, x[i]);
    out[2 * i] = r[0];
    out[2 * i + 1] = r[1];
  }
}

float tf32_model(float x, bool ties_to_even) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u = (u + (ties_to_even ? 0xfffu + ((u >> 13) & 1u) : 0x1000u)) & 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}

TEST(TileOps, SplitTf32OperandRounding) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const bool even = arch() >= 90;  // the build's code for this GPU: sm_90's rounds ties to even
  std::vector<float> v(2048);
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-50.f, 50.f);
  for (auto& x : v) x = u(rng);
  const float special[] = {1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, -(1.f + 0x1p-11f), 0x1p-140f, 0.f, -0.f};
  for (size_t i = 0; i < std::size(special); ++i) v[i] = special[i];
  float* dx = to_device(v);
  uint32_t* dout = nullptr;
  cudaMalloc(&dout, v.size() * 8);
  split_operand_kernel<<<1, 128>>>(dx, dout, int(v.size()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint32_t> out = to_host(dout, 2 * v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    float h, l;
    std::memcpy(&h, &out[2 * i], 4);
    std::memcpy(&l, &out[2 * i + 1], 4);
    EXPECT_EQ(out[2 * i] & 0x1fffu, 0u) << i;
    EXPECT_EQ(out[2 * i + 1] & 0x1fffu, 0u) << i;
    EXPECT_EQ(h, tf32_model(v[i], even)) << i << ": " << v[i];
    EXPECT_EQ(l, tf32_model(v[i] - h, even)) << i;
  }
  EXPECT_EQ(tf32_model(1.f + 0x1p-11f, true), 1.f);
  EXPECT_EQ(tf32_model(1.f + 0x1p-11f, false), 1.f + 0x1p-10f);
  cudaFree(dx);
  cudaFree(dout);
}

TEST(PackedTiles, EveryWorkTileOnce) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  fmha::test::for_each_packed_walk([](auto&&... c) { check_packed_walk(c...); });
}

// Tables that break the promise: each tile the walk hands out is still one of the clamped
// sequences' tiles, each once.
TEST(PackedTiles, BrokenTablesStayClamped) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  fmha::test::for_each_broken_packed_walk([](auto&&... c) { check_packed_walk(c...); });
}

// ---- Split tf32 (tf32x3): the same two products on fp32 inputs, against fp64 ------------------
// Each product's error must stay within a few fp32 units per term, kUlps · 2^-24 · (terms + 8) ·
// sum|a·b| (the 8: 2^-21 for the residuals' rounding and the dropped lo·lo term), and far below
// plain tf32's on the same inputs (whose operands lose 2^-11).
template <class T, int N, int K>
void run_fp32_mma(const std::vector<float>& a, const std::vector<float>& b, std::vector<float>* c,
                  std::vector<float>* d) {
  static_assert(sizeof(T) == sizeof(float), "fp32 storage");
  float *da = to_device(a), *db = to_device(b), *dc = nullptr, *dd = nullptr;
  cudaMalloc(&dc, 16 * N * 4);
  cudaMalloc(&dd, 16 * K * 4);
  mma_kernel<T, N, K><<<1, 32>>>(reinterpret_cast<const T*>(da), reinterpret_cast<const T*>(db), dc, dd);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  *c = to_host(dc, 16 * N);
  *d = to_host(dd, 16 * K);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dd);
}

template <int N, int K>
void check_split_mma(unsigned seed, float magnitude) {
  constexpr double kUlps = 2.0, kFp32Unit = 1.0 / 16777216.0, kSplitTerms = 8.0;
  constexpr double kTf32Margin = 64.0;  // split tf32 is at least this much closer than tf32
  auto a = random(16 * K, seed), b = random(N * K, seed + 1);
  for (auto& x : a) x *= magnitude;
  for (auto& x : b) x *= magnitude;
  std::vector<float> c3, d3, c1, d1;
  run_fp32_mma<tile::tf32x3, N, K>(a, b, &c3, &d3);
  run_fp32_mma<float, N, K>(a, b, &c1, &d1);
  double worst_split = 0, worst_tf32 = 0;  // max error / sum|a·b|
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < N; ++j) {
      double dot = 0, abs_dot = 0;
      for (int k = 0; k < K; ++k) {
        dot += double(a[i * K + k]) * b[j * K + k];
        abs_dot += std::abs(double(a[i * K + k]) * b[j * K + k]);
      }
      const double err = std::abs(c3[i * N + j] - dot);
      ASSERT_LE(err, kUlps * kFp32Unit * (K + kSplitTerms) * abs_dot) << "C " << i << "," << j << " K " << K;
      worst_split = std::max(worst_split, err / abs_dot);
      worst_tf32 = std::max(worst_tf32, std::abs(c1[i * N + j] - dot) / abs_dot);
    }
    for (int k = 0; k < K; ++k) {  // D = C·B from C's registers, against C as the kernel holds it
      double dot = 0, abs_dot = 0;
      for (int j = 0; j < N; ++j) {
        dot += double(c3[i * N + j]) * b[j * K + k];
        abs_dot += std::abs(double(c3[i * N + j]) * b[j * K + k]);
      }
      ASSERT_LE(std::abs(d3[i * K + k] - dot), kUlps * kFp32Unit * (N + kSplitTerms) * abs_dot)
          << "D " << i << "," << k << " N " << N;
    }
  }
  EXPECT_LT(kTf32Margin * worst_split, worst_tf32) << "split tf32 " << worst_split << " vs tf32 " << worst_tf32;
}

TEST(TileOps, MmaSplitTf32) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  if (arch() < 80) GTEST_SKIP() << "mma.sync needs sm_80";
  check_split_mma<16, 16>(7, 1.f);
  check_split_mma<32, 64>(8, 1.f);
  check_split_mma<64, 128>(9, 1.f);
  check_split_mma<32, 64>(10, 300.f);   // large logits: |a·b| up to ~10^5
  check_split_mma<16, 32>(11, 1e-3f);  // small values: the residuals stay normal
}

// Split tf32 over a long reduction of one sign (K = 256 positive products, a head dim's Q·K^T on
// positive logits): the tensor cores truncate what they add, so an accumulator carried through
// them drifts by up to an ulp of itself each k-step, all one way. The products are summed in
// zeroed fragments and added to the accumulator in fp32 (mma.cuh), which keeps the error with a
// sequential fp32 sum's (fmaf, rounded to nearest) on the same inputs: within 2x of it over the
// tile, where the carried accumulator measured several times it.
TEST(TileOps, MmaSplitTf32SumsOneSignLikeFp32) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  if (arch() < 80) GTEST_SKIP() << "mma.sync needs sm_80";
  constexpr int N = 16, K = 256;
  constexpr double kFp32Factor = 2.0;
  for (unsigned seed : {21u, 22u, 23u}) {
    auto a = random(16 * K, seed), b = random(N * K, seed + 100);
    for (auto& x : a) x = 1.f + 0.5f * x;  // [0.5, 1.5)
    for (auto& x : b) x = 1.f + 0.5f * x;
    std::vector<float> c3, d3;
    run_fp32_mma<tile::tf32x3, N, K>(a, b, &c3, &d3);
    double split_error = 0, fp32_error = 0;  // summed over the [16, N] tile
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < N; ++j) {
        double dot = 0;
        float sequential = 0.f;
        for (int k = 0; k < K; ++k) {
          dot += double(a[i * K + k]) * b[j * K + k];
          sequential = std::fmaf(a[i * K + k], b[j * K + k], sequential);
        }
        split_error += std::abs(c3[i * N + j] - dot);
        fp32_error += std::abs(double(sequential) - dot);
      }
    }
    EXPECT_LE(split_error, kFp32Factor * fp32_error)
        << "seed " << seed << ": split tf32 " << split_error << ", sequential fp32 " << fp32_error;
  }
}

}  // namespace
}  // namespace fmha::cuda::test
