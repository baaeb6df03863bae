// Tile-op tests of the Hopper pieces (src/cuda/tile/tma.cuh, wgmma.cuh): TMA loads and stores
// through a swizzled tile completing on an mbarrier, wgmma with both operands in shared memory and
// with A from registers and a transposed B, the accumulator layout, the fp32 transposes, stores
// and roundings that feed tf32 wgmma (split tf32 too), named barriers and register reallocation.
// Each tiny kernel is compared with a host computation (the fp32 ops' address arithmetic is also
// emulated on the CPU: tests/test_tile_layouts.cpp). Compiled for sm_90a; skips without an sm_90
// GPU.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/sm90/sm90_tma.h"
#include "cuda/tile/tma.cuh"
#include "cuda/tile/wgmma.cuh"

namespace fmha::cuda::test {
namespace {

namespace wg = tile::warpgroup;
using bf16 = __nv_bfloat16;

bool have_sm90() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major == 9 && minor == 0;
}

std::vector<bf16> random_bf16(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<bf16> out(n);
  for (auto& x : out) x = __float2bfloat16(u(rng));
  return out;
}
float f(bf16 x) { return __bfloat162float(x); }

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// A [1, seqlen, 1, head_dim] bf16 view with rows `row_stride` elements apart.
Tensor view(void* data, int64_t seqlen, int64_t head_dim, int64_t row_stride) {
  return make_tensor(data, DType::bf16, {1, seqlen, 1, head_dim}, {seqlen * row_stride, row_stride, row_stride, 1},
                     Device{DeviceType::cuda, 0});
}

constexpr int kChunk = wg::kChunkCols<bf16>;  // 64 columns per swizzled chunk

// f(e, element) for every element e of a row-major [ROWS, COLS] bf16 tile that `smem` holds in
// swizzled chunks (wg::swizzled_offset), the block's threads taking every blockDim.x-th.
template <int ROWS, int COLS, class F>
__device__ __forceinline__ void for_each_swizzled(bf16* smem, F&& f) {
  char* base = reinterpret_cast<char*>(smem);
  for (int e = threadIdx.x; e < ROWS * COLS; e += blockDim.x)
    f(e, *reinterpret_cast<bf16*>(base + wg::swizzled_offset<bf16>(e / COLS, e % COLS, ROWS * wg::kSwizzleBytes)));
}

// The row-major [ROWS, COLS] `src` (global memory) into `smem`'s swizzled chunks, by ordinary
// stores; the caller fences them for the async proxy.
template <int ROWS, int COLS>
__device__ __forceinline__ void stage_swizzled(bf16* smem, const bf16* src) {
  for_each_swizzled<ROWS, COLS>(smem, [&](int e, bf16& element) { element = src[e]; });
}

// A row-major [64, N] fp32 matrix to and from thread t's elements of a warpgroup accumulator.
template <int N>
__device__ __forceinline__ void load_accumulator(wg::Accumulator<N>& acc, const float* src, int t) {
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < N / 4; ++j) acc(i, j) = src[wg::Accumulator<N>::row(i, t) * N + wg::Accumulator<N>::col(j, t)];
}
template <int N>
__device__ __forceinline__ void store_accumulator(float* dst, const wg::Accumulator<N>& acc, int t) {
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < N / 4; ++j) dst[wg::Accumulator<N>::row(i, t) * N + wg::Accumulator<N>::col(j, t)] = acc(i, j);
}

// n elements of device memory, every byte 0xFF, so that an element the kernel leaves unwritten
// shows (NaN for floats).
template <class T>
T* poisoned_device(size_t n) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, n * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemset(d, 0xFF, n * sizeof(T)), cudaSuccess);
  return d;
}

// ---- TMA load into a swizzled chunk, zero fill past the tensor ----------------------------------
template <int ROWS>
__global__ void tma_load_kernel(const __grid_constant__ CUtensorMap map, int col0, int row0, bf16* out) {
  __shared__ alignas(1024) bf16 tile_smem[ROWS * kChunk];
  __shared__ tile::MBarrier bar;
  if (threadIdx.x == 0) {
    bar.init(1);
    tile::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    bar.arrive_expect_tx(ROWS * kChunk * sizeof(bf16));
    tile::tma::load(tile_smem, &map, col0, row0, 0, 0, bar);
  }
  bar.wait(0);
  for_each_swizzled<ROWS, kChunk>(tile_smem, [&](int e, bf16& element) { out[e] = element; });
}

TEST(Sm90Tile, TmaLoadSwizzledWithZeroFill) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  constexpr int kRows = 64;
  const int64_t seqlen = 100, head_dim = 96, row_stride = 104;  // rows 208 bytes apart
  const auto host = random_bf16(size_t(seqlen * row_stride), 7);
  bf16* src = to_device(host);
  bf16* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, kRows * kChunk * sizeof(bf16)), cudaSuccess);
  CUtensorMap map;
  ASSERT_TRUE(sm90::encode_tile_map(&map, view(src, seqlen, head_dim, row_stride), kChunk, kRows, "src").ok());
  // The second column chunk (columns 64..127: 96..127 lie past head_dim) of rows 50..113 (100..113
  // lie past seqlen): both must read as zero.
  tma_load_kernel<kRows><<<1, 128>>>(map, kChunk, 50, out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = to_host(out, kRows * kChunk);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kChunk; ++c) {
      const int64_t row = 50 + r, col = kChunk + c;
      const float want = row < seqlen && col < head_dim ? f(host[size_t(row * row_stride + col)]) : 0.f;
      ASSERT_EQ(f(got[size_t(r * kChunk + c)]), want) << "row " << row << " col " << col;
    }
  cudaFree(src);
  cudaFree(out);
}

// ---- TMA store from a swizzled chunk, clipped at the tensor's edges -----------------------------
template <int ROWS>
__global__ void tma_store_kernel(const __grid_constant__ CUtensorMap map, int col0, int row0) {
  __shared__ alignas(1024) bf16 tile_smem[ROWS * kChunk];
  for_each_swizzled<ROWS, kChunk>(tile_smem, [](int e, bf16& element) {
    element = __float2bfloat16(float((e / kChunk) * 100 + e % kChunk));  // row * 100 + column
  });
  tile::fence_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    tile::tma::store(&map, col0, row0, 0, 0, tile_smem);
    tile::tma::store_commit();
    tile::tma::store_wait();
  }
}

TEST(Sm90Tile, TmaStoreSwizzledClipped) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  constexpr int kRows = 64;
  const int64_t seqlen = 40, head_dim = 80, row_stride = 96;  // columns 80..95 are padding
  std::vector<bf16> poison(size_t(seqlen * row_stride), __float2bfloat16(-1.f));
  bf16* dst = to_device(poison);
  CUtensorMap map;
  ASSERT_TRUE(sm90::encode_tile_map(&map, view(dst, seqlen, head_dim, row_stride), kChunk, kRows, "dst").ok());
  tma_store_kernel<kRows><<<1, 128>>>(map, kChunk, 10);  // columns 64..127 of rows 10..73
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = to_host(dst, size_t(seqlen * row_stride));
  for (int64_t row = 0; row < seqlen; ++row)
    for (int64_t col = 0; col < row_stride; ++col) {
      const bool written = row >= 10 && col >= kChunk && col < head_dim;
      const float want = written ? float((row - 10) * 100 + (col - kChunk)) : -1.f;
      ASSERT_EQ(f(got[size_t(row * row_stride + col)]), __bfloat162float(__float2bfloat16(want)))
          << "row " << row << " col " << col << (written ? "" : " (must be untouched)");
    }
  cudaFree(dst);
}

// ---- Bulk reduction: shared-memory rows added into global memory -------------------------------
// Every block adds its rows into the same global rows (the adds are atomic per element), twice
// from one buffer, the second after the first has read it and the buffer was rewritten.
constexpr int kReduceRows = 8, kReduceCols = 72, kReduceStride = 80;  // fp32; 16-byte aligned rows
__global__ void reduce_add_kernel(float* dst) {
  __shared__ alignas(128) float rows[kReduceRows * kReduceStride];
  for (int pass = 0; pass < 2; ++pass) {
    for (int e = int(threadIdx.x); e < kReduceRows * kReduceStride; e += int(blockDim.x))
      rows[e] = float((pass + 1) * (e / kReduceStride) + (e % kReduceStride) * 0.25f);
    tile::fence_async_shared();
    __syncthreads();
    if (threadIdx.x < kReduceRows) {  // one row per thread, each its own bulk group
      tile::tma::reduce_add_bytes(dst + threadIdx.x * kReduceCols, rows + threadIdx.x * kReduceStride,
                                  kReduceCols * sizeof(float));
      tile::tma::store_commit();
      tile::tma::store_wait_read();
    }
    __syncthreads();
  }
  if (threadIdx.x < kReduceRows) tile::tma::store_wait();
}

TEST(Sm90Tile, BulkReduceAddsRows) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  constexpr int kBlocks = 5;
  std::vector<float> start(kReduceRows * kReduceCols);
  for (size_t i = 0; i < start.size(); ++i) start[i] = float(i % 7) - 3.f;
  float* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&dst, start.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dst, start.data(), start.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  reduce_add_kernel<<<kBlocks, 128>>>(dst);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(start.size());
  ASSERT_EQ(cudaMemcpy(got.data(), dst, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int r = 0; r < kReduceRows; ++r)
    for (int c = 0; c < kReduceCols; ++c) {
      // Both passes' values, from every block; exact in fp32 (small multiples of 1/4).
      const float per_block = float(1 * r + c * 0.25f) + float(2 * r + c * 0.25f);
      ASSERT_EQ(got[size_t(r * kReduceCols + c)], start[size_t(r * kReduceCols + c)] + kBlocks * per_block)
          << "row " << r << " col " << c;
    }
  cudaFree(dst);
}

// ---- wgmma: C[64, N] = A[64, K] · B[N, K]ᵀ, both K-major in shared memory ---------------------
// (Static shared memory: 48 KiB at most, which bounds N and K here.) The operands are written into swizzled chunks by ordinary stores, then fenced for the async
// proxy; C leaves through the accumulator layout (Accumulator::row / col).
// B_ROW0: B's N rows start at that row of a [B_ROW0 + N, K] tile (the split backward's scores
// read a 32-row half of a 64-row query stage).
// acc = A·Bᵀ for A [64, K] and B's N rows from row B_ROW0 of a [B_ROWS, K] tile, both swizzled in
// shared memory (K-major); issued and committed, not waited for.
template <int N, int K, int B_ROW0, int B_ROWS>
__device__ __forceinline__ void issue_ss(wg::Accumulator<N>& acc, const bf16* a_smem, const bf16* b_smem) {
  const uint64_t a0 = wg::k_major_desc<bf16, 16>(a_smem, 0, 0, 64 * wg::kSwizzleBytes);
  const uint64_t b0 = wg::k_major_desc<bf16, 16>(b_smem, B_ROW0, 0, B_ROWS * wg::kSwizzleBytes);
  wg::fence();
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16)
    wg::Wgmma<bf16, N>::ss(acc.d, a0 + wg::k_major_step<bf16>(k0, 64 * wg::kSwizzleBytes),
                           b0 + wg::k_major_step<bf16>(k0, B_ROWS * wg::kSwizzleBytes), k0 > 0 ? 1 : 0);
  wg::commit();
}

template <int N, int K, int B_ROW0>
__global__ void wgmma_ss_kernel(const bf16* a, const bf16* b, float* c) {
  constexpr int kBRows = B_ROW0 + N;
  __shared__ alignas(1024) bf16 a_smem[64 * K];
  __shared__ alignas(1024) bf16 b_smem[kBRows * K];
  const int t = threadIdx.x;
  stage_swizzled<64, K>(a_smem, a);
  stage_swizzled<kBRows, K>(b_smem, b);
  tile::fence_async_shared();
  __syncthreads();
  wg::Accumulator<N> acc;
  issue_ss<N, K, B_ROW0, kBRows>(acc, a_smem, b_smem);
  wg::wait<0>();
  wg::fence_operand(acc.d);
  store_accumulator(c, acc, t);
}

template <int N, int K, int B_ROW0 = 0>
void check_wgmma_ss() {
  const auto a = random_bf16(64 * K, 1), b = random_bf16(size_t(B_ROW0 + N) * K, 2);
  bf16 *da = to_device(a), *db = to_device(b);
  float* dc = poisoned_device<float>(64 * N);
  wgmma_ss_kernel<N, K, B_ROW0><<<1, wg::kThreads>>>(da, db, dc);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto c = to_host(dc, 64 * N);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0;
      for (int k = 0; k < K; ++k) want += double(f(a[size_t(m * K + k)])) * f(b[size_t((B_ROW0 + n) * K + k)]);
      ASSERT_NEAR(c[size_t(m * N + n)], want, 1e-3 * (1 + std::fabs(want)))
          << "N " << N << " K " << K << " B from row " << B_ROW0 << " at " << m << ", " << n;
    }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

TEST(Sm90Tile, WgmmaSharedOperands) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  check_wgmma_ss<64, 64>();
  check_wgmma_ss<64, 128>();  // two column chunks of K
  check_wgmma_ss<128, 64>();
  check_wgmma_ss<96, 128>();  // N not a power of two
  check_wgmma_ss<32, 128, 32>();  // N = 32 from row 32 of a 64-row tile, as the split backward's Sᵀ
}

// ---- copy_out: a waited-for accumulator read while a later wgmma is in flight -----------------
// C1 = A·B1 waited for and copied out; C2 = A·B2 issued; the copy stored (and -0 read as +0)
// while C2 runs; then C2 waited for and stored.
__global__ void copy_out_kernel(const bf16* a, const bf16* b1, const bf16* b2, float* c1, float* c2, float* zeros) {
  constexpr int K = 64, N = 64;
  __shared__ alignas(1024) bf16 a_smem[64 * K];
  __shared__ alignas(1024) bf16 b1_smem[N * K];
  __shared__ alignas(1024) bf16 b2_smem[N * K];
  const int t = threadIdx.x;
  stage_swizzled<64, K>(a_smem, a);
  stage_swizzled<N, K>(b1_smem, b1);
  stage_swizzled<N, K>(b2_smem, b2);
  tile::fence_async_shared();
  __syncthreads();
  wg::Accumulator<N> first, second, copy;
  issue_ss<N, K, 0, N>(first, a_smem, b1_smem);
  wg::wait<0>();
  wg::fence_operand(first.d);
  wg::copy_out(copy.d, first.d);
  issue_ss<N, K, 0, N>(second, a_smem, b2_smem);
  store_accumulator(c1, copy, t);  // under the second product
  wg::wait<0>();
  wg::fence_operand(second.d);
  store_accumulator(c2, second, t);
  wg::Accumulator<N> negative_zero, out;
  negative_zero.fill(-0.f);
  wg::copy_out(out.d, negative_zero.d);
  store_accumulator(zeros, out, t);
}

TEST(Sm90Tile, CopyOutOfAnAccumulatorUnderALaterWgmma) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  constexpr int K = 64, N = 64;
  const auto a = random_bf16(64 * K, 5), b1 = random_bf16(N * K, 6), b2 = random_bf16(N * K, 7);
  bf16 *da = to_device(a), *db1 = to_device(b1), *db2 = to_device(b2);
  float *dc1 = poisoned_device<float>(64 * N), *dc2 = poisoned_device<float>(64 * N),
        *dz = poisoned_device<float>(64 * N);
  copy_out_kernel<<<1, wg::kThreads>>>(da, db1, db2, dc1, dc2, dz);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto c1 = to_host(dc1, 64 * N), c2 = to_host(dc2, 64 * N), z = to_host(dz, 64 * N);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double want1 = 0, want2 = 0;
      for (int k = 0; k < K; ++k) {
        want1 += double(f(a[size_t(m * K + k)])) * f(b1[size_t(n * K + k)]);
        want2 += double(f(a[size_t(m * K + k)])) * f(b2[size_t(n * K + k)]);
      }
      ASSERT_NEAR(c1[size_t(m * N + n)], want1, 1e-3 * (1 + std::fabs(want1))) << m << ", " << n;
      ASSERT_NEAR(c2[size_t(m * N + n)], want2, 1e-3 * (1 + std::fabs(want2))) << m << ", " << n;
      ASSERT_EQ(z[size_t(m * N + n)], 0.f);
      ASSERT_FALSE(std::signbit(z[size_t(m * N + n)])) << "-0 copied as -0 at " << m << ", " << n;
    }
  cudaFree(da);
  cudaFree(db1);
  cudaFree(db2);
  cudaFree(dc1);
  cudaFree(dc2);
  cudaFree(dz);
}

// ---- wgmma with A from registers: O[64, N] = P[64, K] · V[K, N], V row-major (MN-major B) -------
// P is given as an accumulator (the layout scores leave a wgmma in) and converted by a_from_acc.
template <int N, int K>
__global__ void wgmma_rs_kernel(const float* p, const bf16* v, float* o) {
  __shared__ alignas(1024) bf16 v_smem[K * N];
  const int t = threadIdx.x;
  stage_swizzled<K, N>(v_smem, v);
  tile::fence_async_shared();
  __syncthreads();
  wg::Accumulator<K> scores;
  load_accumulator(scores, p, t);
  uint32_t a[K / 16][4];
  wg::a_from_acc<bf16>(a, scores);
  wg::Accumulator<N> acc;
  acc.fill(0.f);
  const uint64_t b0 = wg::mn_major_desc(v_smem, 0, K * wg::kSwizzleBytes);
  wg::fence();
#pragma unroll
  for (int kb = 0; kb < K / 16; ++kb)
    wg::Wgmma<bf16, N>::template rs<1>(acc.d, a[kb], b0 + wg::mn_major_step(kb * 16), 1);
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(acc.d);
  wg::fence_operand(a);
  store_accumulator(o, acc, t);
}

template <int N, int K>
void check_wgmma_rs() {
  std::vector<float> p(64 * K);
  {
    const auto r = random_bf16(p.size(), 3);  // P exactly representable in bf16
    for (size_t i = 0; i < p.size(); ++i) p[i] = f(r[i]);
  }
  const auto v = random_bf16(size_t(K) * N, 4);
  float* dp = to_device(p);
  bf16* dv = to_device(v);
  float* dout = poisoned_device<float>(64 * N);
  wgmma_rs_kernel<N, K><<<1, wg::kThreads>>>(dp, dv, dout);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto o = to_host(dout, 64 * N);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0;
      for (int k = 0; k < K; ++k) want += double(p[size_t(m * K + k)]) * f(v[size_t(k * N + n)]);
      ASSERT_NEAR(o[size_t(m * N + n)], want, 1e-3 * (1 + std::fabs(want))) << "N " << N << " K " << K << " at " << m
                                                                               << ", " << n;
    }
  cudaFree(dp);
  cudaFree(dv);
  cudaFree(dout);
}

TEST(Sm90Tile, WgmmaRegisterATransposedB) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  check_wgmma_rs<64, 64>();
  check_wgmma_rs<128, 128>();  // two 64-column chunks of V (the leading byte offset)
  check_wgmma_rs<256, 64>();
}

// ---- tf32: O[64, N] = P[64, K] · V[K, N], V transposed in shared memory -------------------------
// V (row-major [K, N] fp32, as TMA lands it: [K, 32] swizzled chunks) is transposed by a
// warpgroup into Vᵀ (K-major: [N, 32] chunks of keys, each 8 permuted as a_from_acc<float>
// orders P's k), then O = P·V on tf32 wgmma with A from registers. Values are exact in tf32
// (bf16 values), so any misplaced element shows.
// WARPS of the warpgroup's warps transpose (the forward's producer uses its three idle ones).
template <int N, int K, int WARPS>
__global__ void wgmma_tf32_transposed_kernel(const float* p, const float* v, float* o) {
  __shared__ alignas(1024) float v_smem[K * N];
  __shared__ alignas(1024) float vt_smem[N * K];
  const int t = threadIdx.x;
  {
    char* base = reinterpret_cast<char*>(v_smem);
    for (int e = t; e < K * N; e += blockDim.x)
      *reinterpret_cast<float*>(base + wg::swizzled_offset<float>(e / N, e % N, K * wg::kSwizzleBytes)) = v[e];
  }
  __syncthreads();
  if (t / 32 < WARPS) wg::transpose_k_major<K, N, WARPS>(v_smem, vt_smem, t / 32, t % 32);
  tile::fence_async_shared();
  __syncthreads();
  wg::Accumulator<K> scores;
  load_accumulator(scores, p, t);
  uint32_t a[K / 8][4];
  wg::a_from_acc<float>(a, scores);
  wg::Accumulator<N> acc;
  acc.fill(0.f);
  constexpr int kVtChunkBytes = N * wg::kSwizzleBytes;
  const uint64_t b0 = wg::k_major_desc<float, 8>(vt_smem, 0, 0, kVtChunkBytes);
  wg::fence();
#pragma unroll
  for (int kb = 0; kb < K / 8; ++kb)
    wg::Wgmma<float, N>::template rs<0>(acc.d, a[kb], b0 + wg::k_major_step<float>(kb * 8, kVtChunkBytes), 1);
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(acc.d);
  wg::fence_operand(a);
  store_accumulator(o, acc, t);
}

template <int N, int K, int WARPS = wg::kThreads / 32>
void check_wgmma_tf32_transposed() {
  std::vector<float> p(64 * K), v(size_t(K) * N);
  {
    const auto r = random_bf16(p.size(), 5);
    for (size_t i = 0; i < p.size(); ++i) p[i] = f(r[i]);
    const auto w = random_bf16(v.size(), 6);
    for (size_t i = 0; i < v.size(); ++i) v[i] = f(w[i]);
  }
  float* dp = to_device(p);
  float* dv = to_device(v);
  float* dout = poisoned_device<float>(64 * N);
  wgmma_tf32_transposed_kernel<N, K, WARPS><<<1, wg::kThreads>>>(dp, dv, dout);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto o = to_host(dout, 64 * N);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0;
      for (int k = 0; k < K; ++k) want += double(p[size_t(m * K + k)]) * v[size_t(k * N + n)];
      ASSERT_NEAR(o[size_t(m * N + n)], want, 1e-4 * (1 + std::fabs(want))) << "N " << N << " K " << K << " at " << m
                                                                               << ", " << n;
    }
  cudaFree(dp);
  cudaFree(dv);
  cudaFree(dout);
}

TEST(Sm90Tile, Tf32WgmmaRegisterAWithTransposedV) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  check_wgmma_tf32_transposed<64, 64>();   // two 32-column chunks of V and of Vᵀ
  check_wgmma_tf32_transposed<128, 32>();  // four chunks of V, one of Vᵀ
  check_wgmma_tf32_transposed<32, 128>();  // one chunk of V, four of Vᵀ (static shared memory: 48 KiB)
  // Three transposing warps, as in the forward (its producer warpgroup's idle ones).
  check_wgmma_tf32_transposed<64, 96, wg::kThreads / 32 - 1>();  // 48 KiB of static shared memory
  check_wgmma_tf32_transposed<128, 32, wg::kThreads / 32 - 1>();
}

// ---- tf32 operands transposed in order: D[64, N] = Xᵀ · Y (the tf32 backward's dQ = dS·K) ------
// X [K, 64] (K = 128) is two warpgroups' accumulators (rows [64 w, 64 w + 64)), each stored
// transposed from its tf32 fragments into Xᵀ [64, K] at column 64 w (store_transposed_tf32); Y
// [K, 64] lands as TMA writes it ([K, 32] swizzled chunks) and is transposed in order into Yᵀ
// [64, K] (transpose_k_major without the permutation), rounded to tf32 in place on the way. Then
// warpgroup w computes D[:, 32 w, 32 w + 32) = Xᵀ · Y[:, 32 w..] on tf32 wgmma with both
// operands in shared memory, B from Yᵀ's rows 32 w (the backward's warpgroups' shares of dQ).
// Y's values are not tf32-exact: Y and Yᵀ must hold them rounded to nearest (ties away), D the
// products of the rounded ones; X's are (bf16 values), so a misplaced element shows.
constexpr int kOpK = 128, kOpM = 64, kOpN = 64;
constexpr size_t kOpSharedBytes = (size_t(kOpM) * kOpK + 2 * size_t(kOpK) * kOpN) * sizeof(float) + 1024;

__global__ void tf32_transposed_operands_kernel(const float* x, const float* y, float* d, float* y_raw,
                                                float* yt_raw) {
  extern __shared__ char dynamic_smem[];
  char* base = dynamic_smem + (1024 - reinterpret_cast<uintptr_t>(dynamic_smem) % 1024) % 1024;
  float* xt_smem = reinterpret_cast<float*>(base);  // Xᵀ [64, K]: K / 32 chunks of [64, 32]
  float* y_smem = xt_smem + kOpM * kOpK;            // Y [K, 64]: 2 chunks of [K, 32]
  float* yt_smem = y_smem + kOpK * kOpN;            // Yᵀ [64, K]: K / 32 chunks of [64, 32]
  const int w = int(threadIdx.x) / wg::kThreads, t = int(threadIdx.x) % wg::kThreads;
  for (int e = threadIdx.x; e < kOpK * kOpN; e += blockDim.x)
    *reinterpret_cast<float*>(reinterpret_cast<char*>(y_smem) +
                              wg::swizzled_offset<float>(e / kOpN, e % kOpN, kOpK * wg::kSwizzleBytes)) = y[e];
  __syncthreads();
  wg::transpose_k_major<kOpK, kOpN, 2 * wg::kThreads / 32, false, true>(y_smem, yt_smem, int(threadIdx.x) / 32,
                                                                      int(threadIdx.x) % 32);
  wg::Accumulator<kOpM> xw;  // rows [64 w, 64 w + 64) of X
  load_accumulator(xw, x + size_t(w) * 64 * kOpM, t);
  uint32_t frags[kOpM / 8][4];
  wg::a_from_acc<float>(frags, xw);
  wg::store_transposed_tf32<kOpM>(frags, static_cast<uint32_t>(__cvta_generic_to_shared(xt_smem)), 64 * w, t);
  tile::fence_async_shared();
  __syncthreads();
  constexpr int kXtChunkBytes = kOpM * wg::kSwizzleBytes, kYtChunkBytes = kOpN * wg::kSwizzleBytes;
  wg::Accumulator<32> acc;
  const uint64_t a0 = wg::k_major_desc<float, 8>(xt_smem, 0, 0, kXtChunkBytes);
  const uint64_t b0 = wg::k_major_desc<float, 8>(yt_smem, 32 * w, 0, kYtChunkBytes);
  wg::fence();
#pragma unroll
  for (int k0 = 0; k0 < kOpK; k0 += 8)
    wg::Wgmma<float, 32>::ss(acc.d, a0 + wg::k_major_step<float>(k0, kXtChunkBytes),
                             b0 + wg::k_major_step<float>(k0, kYtChunkBytes), k0 > 0 ? 1 : 0);
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(acc.d);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 8; ++j)
      d[wg::Accumulator<32>::row(i, t) * kOpN + 32 * w + wg::Accumulator<32>::col(j, t)] = acc(i, j);
  for (int e = threadIdx.x; e < kOpK * kOpN; e += blockDim.x) {
    y_raw[e] = y_smem[e];
    yt_raw[e] = yt_smem[e];
  }
}

// x rounded to tf32 as cvt.rna.tf32.f32 does: to nearest, ties away from zero (finite x).
float tf32_rna(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits = (bits + 0x1000u) & 0xFFFFE000u;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// Round to nearest, ties to even, keeping 10 mantissa bits (inf and NaN as they are).
float tf32_rn(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  const uint32_t keep_lsb = (u >> 13) & 1u;
  u = (u + 0xfffu + keep_lsb) & 0xffffe000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

TEST(Sm90Tile, Tf32OperandsTransposedInOrder) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  std::vector<float> x(size_t(kOpK) * kOpM), y(size_t(kOpK) * kOpN);
  {
    const auto r = random_bf16(x.size(), 11);
    for (size_t i = 0; i < x.size(); ++i) x[i] = f(r[i]);
    std::mt19937 rng(12);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& v : y) v = u(rng);  // 24 significant bits: rounding to tf32 changes them
  }
  float *dx = to_device(x), *dy = to_device(y);
  float* dd = poisoned_device<float>(size_t(kOpM) * kOpN);
  float* dy_raw = poisoned_device<float>(y.size());
  float* dyt_raw = poisoned_device<float>(y.size());
  ASSERT_EQ(cudaFuncSetAttribute(tf32_transposed_operands_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kOpSharedBytes)),
            cudaSuccess);
  tf32_transposed_operands_kernel<<<1, 2 * wg::kThreads, kOpSharedBytes>>>(dx, dy, dd, dy_raw, dyt_raw);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto d = to_host(dd, size_t(kOpM) * kOpN);
  const auto y_raw = to_host(dy_raw, y.size()), yt_raw = to_host(dyt_raw, y.size());
  auto offset = [](int row, int col, int rows) {  // swizzled_offset<float> in floats, chunks of [rows, 32]
    const int byte = (col % 32) * 4;
    return ((col / 32) * rows * wg::kSwizzleBytes + row * wg::kSwizzleBytes + (((byte / 16) ^ (row % 8)) * 16) +
            byte % 16) /
           4;
  };
  int changed = 0;  // values that rounding changes: most of them
  for (int k = 0; k < kOpK; ++k)
    for (int n = 0; n < kOpN; ++n) {
      const float want = tf32_rn(y[size_t(k * kOpN + n)]);  // the tier rounds to nearest even
      changed += want != y[size_t(k * kOpN + n)];
      ASSERT_EQ(y_raw[size_t(offset(k, n, kOpK))], want) << "Y rounded in place at " << k << ", " << n;
      ASSERT_EQ(yt_raw[size_t(offset(n, k, kOpN))], want) << "Yᵀ at " << n << ", " << k;
    }
  EXPECT_GT(changed, kOpK * kOpN / 2);
  for (int m = 0; m < kOpM; ++m)
    for (int n = 0; n < kOpN; ++n) {
      double want = 0, magnitude = 0;
      for (int k = 0; k < kOpK; ++k) {
        const double term = double(x[size_t(k * kOpM + m)]) * tf32_rn(y[size_t(k * kOpN + n)]);
        want += term;
        magnitude += std::fabs(term);
      }
      ASSERT_NEAR(d[size_t(m * kOpN + n)], want, 1e-4 * (1 + magnitude)) << "D at " << m << ", " << n;
    }
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dd);
  cudaFree(dy_raw);
  cudaFree(dyt_raw);
}

// ---- Split tf32: O[64, N] = P·V from hi/lo parts, fp32-accurate ----------------------------------
// P (fp32, not tf32-exact) as split fragments (a_from_acc<tf32x3>: highs, then residuals), V
// (fp32, not tf32-exact) transposed into Vᵀ's highs and residuals (transpose_k_major_split), O as
// P_lo·V + P·V_lo + P·V on tf32 wgmma. A second tile, Y, is split in place by split_to_tf32 and
// copied out. Against fp64: O within fp32-level error (tf32 alone is ~2^-11 off), Y's high parts
// and residuals tf32-exact with hi + lo = y to 2^-22.
constexpr int kSplitN = 64, kSplitK = 64;
__global__ void tf32_split_kernel(const float* p, const float* v, float* o, float* y, float* y_lo_out) {
  __shared__ alignas(1024) float v_smem[kSplitK * kSplitN];
  __shared__ alignas(1024) float vt_smem[kSplitN * kSplitK];
  __shared__ alignas(1024) float vt_lo_smem[kSplitN * kSplitK];
  const int t = threadIdx.x;
  for (int e = t; e < kSplitK * kSplitN; e += blockDim.x)
    *reinterpret_cast<float*>(reinterpret_cast<char*>(v_smem) +
                              wg::swizzled_offset<float>(e / kSplitN, e % kSplitN, kSplitK * wg::kSwizzleBytes)) = v[e];
  __syncthreads();
  wg::transpose_k_major_split<kSplitK, kSplitN, wg::kThreads / 32>(v_smem, vt_smem, vt_lo_smem, t / 32, t % 32);
  tile::fence_async_shared();
  __syncthreads();
  wg::Accumulator<kSplitK> scores;
  load_accumulator(scores, p, t);
  uint32_t a[2][kSplitK / 8][4];
  wg::a_from_acc<tile::tf32x3>(a, scores);
  wg::Accumulator<kSplitN> acc;
  constexpr int kVtChunkBytes = kSplitN * wg::kSwizzleBytes;
  const uint64_t hi = wg::k_major_desc<float, 8>(vt_smem, 0, 0, kVtChunkBytes);
  const uint64_t lo = wg::k_major_desc<float, 8>(vt_lo_smem, 0, 0, kVtChunkBytes);
  wg::fence();
#pragma unroll
  for (int kb = 0; kb < kSplitK / 8; ++kb)
    wg::Wgmma<float, kSplitN>::template rs<0>(acc.d, a[1][kb], hi + wg::k_major_step<float>(kb * 8, kVtChunkBytes),
                                              kb > 0 ? 1 : 0);
#pragma unroll
  for (int kb = 0; kb < kSplitK / 8; ++kb)
    wg::Wgmma<float, kSplitN>::template rs<0>(acc.d, a[0][kb], lo + wg::k_major_step<float>(kb * 8, kVtChunkBytes), 1);
#pragma unroll
  for (int kb = 0; kb < kSplitK / 8; ++kb)
    wg::Wgmma<float, kSplitN>::template rs<0>(acc.d, a[0][kb], hi + wg::k_major_step<float>(kb * 8, kVtChunkBytes), 1);
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(acc.d);
  wg::fence_operand(a);
  store_accumulator(o, acc, t);
  // Y split in place (v_smem reused: Y's highs) and into vt_smem (its residuals).
  __syncthreads();
  for (int e = t; e < kSplitK * kSplitN; e += blockDim.x) v_smem[e] = y[e];
  __syncthreads();
  wg::split_to_tf32<kSplitK * kSplitN, wg::kThreads>(v_smem, vt_smem, t);
  __syncthreads();
  for (int e = t; e < kSplitK * kSplitN; e += blockDim.x) {
    y[e] = v_smem[e];
    y_lo_out[e] = vt_smem[e];
  }
}

TEST(Sm90Tile, SplitTf32OperandsFp32Accurate) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  std::vector<float> p(64 * kSplitK), v(size_t(kSplitK) * kSplitN), y(size_t(kSplitK) * kSplitN);
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& x : p) x = u(rng);
  for (auto& x : v) x = u(rng);
  for (auto& x : y) x = 100.f * u(rng);
  float *dp = to_device(p), *dv = to_device(v), *dy = to_device(y);
  float* dout = poisoned_device<float>(64 * kSplitN);
  float* dy_lo = poisoned_device<float>(y.size());
  tf32_split_kernel<<<1, wg::kThreads>>>(dp, dv, dout, dy, dy_lo);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto o = to_host(dout, 64 * kSplitN);
  double worst = 0, worst_tf32 = 0;  // against fp64, relative to the sum of |terms|
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < kSplitN; ++n) {
      double want = 0, magnitude = 0, tf32_only = 0;
      for (int k = 0; k < kSplitK; ++k) {
        const double a = p[size_t(m * kSplitK + k)], b = v[size_t(k * kSplitN + n)];
        want += a * b;
        magnitude += std::fabs(a * b);
        tf32_only += double(tf32_rna(float(a))) * tf32_rna(float(b));
      }
      worst = std::max(worst, std::fabs(o[size_t(m * kSplitN + n)] - want) / magnitude);
      worst_tf32 = std::max(worst_tf32, std::fabs(tf32_only - want) / magnitude);
    }
  EXPECT_LT(worst, 4e-6) << "split tf32 error relative to the terms' magnitude";  // tf32 alone: ~2^-11
  EXPECT_GT(worst_tf32, 16 * worst) << "tf32 alone: " << worst_tf32;
  const auto hi = to_host(dy, y.size()), lo = to_host(dy_lo, y.size());
  for (size_t e = 0; e < y.size(); ++e) {
    uint32_t hb, lb;
    std::memcpy(&hb, &hi[e], 4);
    std::memcpy(&lb, &lo[e], 4);
    ASSERT_EQ(hb & 0x1FFFu, 0u) << e;
    ASSERT_EQ(lb & 0x1FFFu, 0u) << e;
    ASSERT_EQ(hi[e], tf32_rn(y[e])) << e;  // the split rounds to nearest even (wg::split_tf32)
    ASSERT_LE(std::fabs(double(hi[e]) + lo[e] - y[e]), std::ldexp(std::fabs(double(y[e])), -22)) << e;
  }
  cudaFree(dp);
  cudaFree(dv);
  cudaFree(dy);
  cudaFree(dout);
  cudaFree(dy_lo);
}

// ---- round_to_tf32: a tile rounded in place -----------------------------------------------------
constexpr int kRoundThreads = 96;  // not a divisor of the tile's 256 units
__global__ void round_to_tf32_kernel(float* values) {
  constexpr int kFloats = 1024;
  __shared__ alignas(16) float tile_smem[kFloats];
  for (int e = threadIdx.x; e < kFloats; e += blockDim.x) tile_smem[e] = values[e];
  __syncthreads();
  wg::round_to_tf32<kFloats, kRoundThreads>(tile_smem, int(threadIdx.x));
  __syncthreads();
  for (int e = threadIdx.x; e < kFloats; e += blockDim.x) values[e] = tile_smem[e];
}

TEST(Sm90Tile, RoundToTf32InPlace) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  std::vector<float> v(1024);
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-100.f, 100.f);
  for (auto& x : v) x = u(rng);
  v[0] = 1.f + 0x1p-11f;  // a tie: to even (down)
  v[1] = -(1.f + 0x1p-11f);
  v[2] = 1.f + 3 * 0x1p-11f;  // a tie: to even (up)
  float* dv = to_device(v);
  round_to_tf32_kernel<<<1, kRoundThreads>>>(dv);  // not a divisor of the 256 units: the last thread takes fewer
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto out = to_host(dv, v.size());
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[1], -1.f);
  EXPECT_EQ(out[2], 1.f + 0x1p-9f);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(out[i], tf32_rn(v[i])) << i;
  cudaFree(dv);
}

// ---- split_tf32: the split-tf32 kernels' split, rounded to nearest even (cvt.rn.tf32.f32) ---------
__global__ void split_tf32_kernel(const float* x, uint32_t* hi, uint32_t* lo, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) wg::split_tf32(x[i], hi[i], lo[i]);
}

TEST(Sm90Tile, SplitTf32RoundsToNearestEvenInFp32Layout) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  std::vector<float> v(4096);
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-100.f, 100.f);
  for (auto& x : v) x = u(rng);
  // Ties both ways (1 + 2^-11 rounds down to even, 1 + 3·2^-11 up), signs, denormals, zero,
  // infinities, the largest finite value (rounds to infinity) and a NaN.
  const float special[] = {1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, -(1.f + 0x1p-11f), -(1.f + 3 * 0x1p-11f),
                           0x1p-140f, -0x1.8p-130f, 0.f, -0.f, INFINITY, -INFINITY, 3.4028235e38f};
  for (size_t i = 0; i < std::size(special); ++i) v[i] = special[i];
  v[std::size(special)] = std::nanf("");
  float* dx = to_device(v);
  uint32_t *dhi = nullptr, *dlo = nullptr;
  cudaMalloc(&dhi, v.size() * 4);
  cudaMalloc(&dlo, v.size() * 4);
  split_tf32_kernel<<<1, 128>>>(dx, dhi, dlo, int(v.size()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint32_t> hi(v.size()), lo(v.size());
  cudaMemcpy(hi.data(), dhi, v.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(lo.data(), dlo, v.size() * 4, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < v.size(); ++i) {
    float h, l;
    std::memcpy(&h, &hi[i], 4);
    std::memcpy(&l, &lo[i], 4);
    if (std::isnan(v[i])) {
      EXPECT_TRUE(std::isnan(h)) << i;
      continue;
    }
    // fp32 layout, the 13 low bits zero: the value wgmma reads as tf32.
    EXPECT_EQ(hi[i] & 0x1fffu, 0u) << i;
    EXPECT_EQ(h, tf32_rn(v[i])) << i << ": " << v[i];
    if (std::isinf(h)) continue;
    EXPECT_EQ(lo[i] & 0x1fffu, 0u) << i;
    EXPECT_EQ(l, tf32_rn(v[i] - h)) << i;
    // Within 2^-21 of |x|, or of the tf32 grid where x is an fp32 denormal: a tf32 value in fp32
    // layout has its 13 low bits zero, so denormals step by 2^-136 and the split of 2^-140 is 0 + 0.
    EXPECT_LE(std::abs(double(v[i]) - double(h) - double(l)), std::ldexp(std::abs(double(v[i])), -21) + 0x1p-137) << i;
  }
  EXPECT_EQ(tf32_rn(1.f + 0x1p-11f), 1.f);  // the model's own ties
  EXPECT_EQ(tf32_rn(1.f + 3 * 0x1p-11f), 1.f + 0x1p-9f);
  cudaFree(dx);
  cudaFree(dhi);
  cudaFree(dlo);
}

// ---- fp32 store of an accumulator into a swizzled [64, N] tile (the tf32 forward's epilogue) -----
template <int N>
__global__ void store_swizzled_fp32_kernel(const float* values, float* raw) {
  __shared__ alignas(1024) float tile_smem[64 * N];
  const int t = threadIdx.x;
  wg::Accumulator<N> acc;
  load_accumulator(acc, values, t);
  const float row_scale[2] = {1.f, 0.5f};
  wg::store_swizzled<float>(acc, row_scale, static_cast<uint32_t>(__cvta_generic_to_shared(tile_smem)),
                            64 * wg::kSwizzleBytes, t);
  __syncthreads();
  for (int e = t; e < 64 * N; e += wg::kThreads) raw[e] = tile_smem[e];
}

TEST(Sm90Tile, Fp32SwizzledStore) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  constexpr int N = 128;
  std::vector<float> values(64 * N);
  for (size_t e = 0; e < values.size(); ++e) values[e] = float(int(e * 7 % 251) - 125);
  float* dv = to_device(values);
  float* draw = poisoned_device<float>(64 * N);
  store_swizzled_fp32_kernel<N><<<1, wg::kThreads>>>(dv, draw);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto raw = to_host(draw, 64 * N);
  constexpr int kChunkBytes = 64 * wg::kSwizzleBytes;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < N; ++c) {
      const int byte = (c % 32) * 4;
      const int offset = (c / 32) * kChunkBytes + r * wg::kSwizzleBytes + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
      const float want = values[size_t(r * N + c)] * ((r % 16) >= 8 ? 0.5f : 1.f);
      ASSERT_EQ(raw[size_t(offset / 4)], want) << "at " << r << ", " << c;
    }
  cudaFree(dv);
  cudaFree(draw);
}

// ---- stmatrix: an accumulator, scaled per row and converted, into a swizzled [64, N] tile ------
// The tile is copied out raw; the host finds each element where swizzled_offset says it must be.
template <int N>
__global__ void store_swizzled_kernel(const float* values, bf16* raw) {
  __shared__ alignas(1024) bf16 tile_smem[64 * N];
  const int t = threadIdx.x;
  wg::Accumulator<N> acc;
  load_accumulator(acc, values, t);
  const float row_scale[2] = {1.f, 0.5f};  // rows r0 and r0 + 8 of each thread
  wg::store_swizzled<bf16>(acc, row_scale, static_cast<uint32_t>(__cvta_generic_to_shared(tile_smem)),
                           64 * wg::kSwizzleBytes, t);
  __syncthreads();
  for (int e = t; e < 64 * N; e += wg::kThreads) raw[e] = tile_smem[e];
}

template <int N>
void check_store_swizzled() {
  std::vector<float> values(64 * N);
  for (size_t e = 0; e < values.size(); ++e) values[e] = float(int(e * 7 % 251) - 125);  // exact in bf16, halved too
  float* dv = to_device(values);
  bf16* draw = poisoned_device<bf16>(64 * N);
  store_swizzled_kernel<N><<<1, wg::kThreads>>>(dv, draw);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto raw = to_host(draw, 64 * N);
  constexpr int kChunkBytes = 64 * wg::kSwizzleBytes;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < N; ++c) {
      // swizzled_offset on the host: chunk, row, 16-byte unit XOR-ed by row % 8, byte in unit.
      const int byte = (c % 64) * 2;
      const int offset = (c / 64) * kChunkBytes + r * wg::kSwizzleBytes + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
      const float want = values[size_t(r * N + c)] * ((r % 16) >= 8 ? 0.5f : 1.f);
      ASSERT_EQ(f(raw[size_t(offset / 2)]), want) << "N " << N << " at " << r << ", " << c;
    }
  cudaFree(dv);
  cudaFree(draw);
}

TEST(Sm90Tile, StmatrixSwizzledStore) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  check_store_swizzled<64>();
  check_store_swizzled<128>();  // two column chunks
  check_store_swizzled<256>();
}

// ---- stmatrix.trans: a [64, 64] tile given as register-A fragments, stored transposed ----------
__global__ void store_transposed_kernel(const float* values, bf16* raw) {
  __shared__ alignas(1024) bf16 tile_smem[64 * 64];
  const int t = threadIdx.x;
  wg::Accumulator<64> acc;
  load_accumulator(acc, values, t);
  uint32_t frags[4][4];
  wg::a_from_acc<bf16>(frags, acc);
  wg::store_transposed_swizzled<bf16, 64>(frags, static_cast<uint32_t>(__cvta_generic_to_shared(tile_smem)), t);
  __syncthreads();
  for (int e = t; e < 64 * 64; e += wg::kThreads) raw[e] = tile_smem[e];
}

TEST(Sm90Tile, StmatrixTransposedStore) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  std::vector<float> values(64 * 64);
  for (size_t e = 0; e < values.size(); ++e) values[e] = float(int(e * 13 % 241) - 120);
  float* dv = to_device(values);
  bf16* draw = poisoned_device<bf16>(64 * 64);
  store_transposed_kernel<<<1, wg::kThreads>>>(dv, draw);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto raw = to_host(draw, 64 * 64);
  // Destination row r, column c holds source (c, r), at the swizzled place of (r, c).
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) {
      const int byte = c * 2;
      const int offset = r * wg::kSwizzleBytes + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
      ASSERT_EQ(f(raw[size_t(offset / 2)]), values[size_t(c * 64 + r)]) << "at " << r << ", " << c;
    }
  cudaFree(dv);
  cudaFree(draw);
}

// ---- stmatrix.trans of a [64, 32] share into rows [32 w, 32 w + 32) of a [64, 64] tile --------
// (the split backward at head dims 192/256: each warpgroup stores its 32 query columns of Pᵀ and
// dSᵀ as 32 rows of P and dS). Two warpgroups, one per half.
__global__ void store_transposed_half_kernel(const float* values, bf16* raw) {
  __shared__ alignas(1024) bf16 tile_smem[64 * 64];
  const int w = threadIdx.x / wg::kThreads, t = threadIdx.x % wg::kThreads;
  wg::Accumulator<32> acc;  // [64, 32]: columns [32 w, 32 w + 32) of the [64, 64] source
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
      acc(i, j) = values[wg::Accumulator<32>::row(i, t) * 64 + 32 * w + wg::Accumulator<32>::col(j, t)];
  uint32_t frags[2][4];
  wg::a_from_acc<bf16>(frags, acc);
  wg::store_transposed_swizzled<bf16, 32>(
      frags, static_cast<uint32_t>(__cvta_generic_to_shared(tile_smem + 32 * w * 64)), t);
  __syncthreads();
  for (int e = threadIdx.x; e < 64 * 64; e += blockDim.x) raw[e] = tile_smem[e];
}

TEST(Sm90Tile, StmatrixTransposedStoreHalves) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  std::vector<float> values(64 * 64);
  for (size_t e = 0; e < values.size(); ++e) values[e] = float(int(e * 17 % 233) - 116);
  float* dv = to_device(values);
  bf16* draw = poisoned_device<bf16>(64 * 64);
  store_transposed_half_kernel<<<1, 2 * wg::kThreads>>>(dv, draw);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto raw = to_host(draw, 64 * 64);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) {
      const int byte = c * 2;
      const int offset = r * wg::kSwizzleBytes + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
      ASSERT_EQ(f(raw[size_t(offset / 2)]), values[size_t(c * 64 + r)]) << "at " << r << ", " << c;
    }
  cudaFree(dv);
  cudaFree(draw);
}

// ---- wgmma, A and B both MN-major in shared memory: C[64, N] = Aᵀ[64, K] · B[K, N] -------------
// A is stored [K, 64] (M contiguous: P or dS [q, keys] read as Pᵀ, dSᵀ by dV += Pᵀ·dO and
// dK += dSᵀ·Q in the split backward), B [K, BCOLS] with N columns from the chunk at col0.
template <int N, int K, int BCOLS>
__global__ void wgmma_ss_transposed_ab_kernel(const bf16* a, const bf16* b, float* c, int col0) {
  __shared__ alignas(1024) bf16 a_smem[K * 64];
  __shared__ alignas(1024) bf16 b_smem[K * BCOLS];
  const int t = threadIdx.x;
  stage_swizzled<K, 64>(a_smem, a);
  stage_swizzled<K, BCOLS>(b_smem, b);
  tile::fence_async_shared();
  __syncthreads();
  wg::Accumulator<N> acc;
  const uint64_t a0 = wg::mn_major_desc(a_smem, 0, K * wg::kSwizzleBytes);
  const uint64_t b0 = wg::mn_major_desc(b_smem + (col0 / 64) * (K * 64), 0, K * wg::kSwizzleBytes);
  wg::fence();
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16)
    wg::Wgmma<bf16, N>::template ss<1, 1>(acc.d, a0 + wg::mn_major_step(k0), b0 + wg::mn_major_step(k0),
                                          k0 > 0 ? 1 : 0);
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(acc.d);
  store_accumulator(c, acc, t);
}

template <int N, int K, int BCOLS>
void check_wgmma_ss_transposed_ab(int col0) {
  const auto a = random_bf16(size_t(K) * 64, 7), b = random_bf16(size_t(K) * BCOLS, 8);
  bf16 *da = to_device(a), *db = to_device(b);
  float* dc = poisoned_device<float>(64 * N);
  wgmma_ss_transposed_ab_kernel<N, K, BCOLS><<<1, wg::kThreads>>>(da, db, dc, col0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto c = to_host(dc, 64 * N);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0;
      for (int k = 0; k < K; ++k) want += double(f(a[size_t(k * 64 + m)])) * f(b[size_t(k * BCOLS + col0 + n)]);
      ASSERT_NEAR(c[size_t(m * N + n)], want, 1e-3 * (1 + std::fabs(want)))
          << "N " << N << " K " << K << " col0 " << col0 << " at " << m << ", " << n;
    }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

TEST(Sm90Tile, WgmmaSharedOperandsTransposedAB) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  check_wgmma_ss_transposed_ab<128, 64, 128>(0);  // head dim 256: two chunks (the leading byte offset)
  check_wgmma_ss_transposed_ab<64, 64, 192>(128);  // head dim 192: warpgroup 1's chunk
  check_wgmma_ss_transposed_ab<64, 64, 128>(64);
}

// ---- wgmma, A K-major and B MN-major, both in shared memory: C[64, N] = A[64, K] · B[K, N] -------
// (dQ = dS·K in the backward: K is [keys, head dim] with the head dim contiguous.) col0 picks a
// column window of a wider B ([K, 64] stored, N = 32 columns from col0) as the backward's
// warpgroups do at head dim 64.
template <int N, int K, int BCOLS>
__global__ void wgmma_ss_transposed_b_kernel(const bf16* a, const bf16* b, float* c, int col0) {
  __shared__ alignas(1024) bf16 a_smem[64 * K];
  __shared__ alignas(1024) bf16 b_smem[K * BCOLS];
  const int t = threadIdx.x;
  stage_swizzled<64, K>(a_smem, a);
  stage_swizzled<K, BCOLS>(b_smem, b);
  tile::fence_async_shared();
  __syncthreads();
  wg::Accumulator<N> acc;
  const bf16* b_cols = b_smem + (col0 / 64) * (K * 64) + col0 % 64;
  const uint64_t a0 = wg::k_major_desc<bf16, 16>(a_smem, 0, 0, 64 * wg::kSwizzleBytes);
  const uint64_t b0 = wg::mn_major_desc(b_cols, 0, K * wg::kSwizzleBytes);
  wg::fence();
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16)
    wg::Wgmma<bf16, N>::template ss<0, 1>(acc.d, a0 + wg::k_major_step<bf16>(k0, 64 * wg::kSwizzleBytes),
                                          b0 + wg::mn_major_step(k0), k0 > 0 ? 1 : 0);
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(acc.d);
  store_accumulator(c, acc, t);
}

template <int N, int K, int BCOLS>
void check_wgmma_ss_transposed_b(int col0) {
  const auto a = random_bf16(64 * K, 5), b = random_bf16(size_t(K) * BCOLS, 6);
  bf16 *da = to_device(a), *db = to_device(b);
  float* dc = poisoned_device<float>(64 * N);
  wgmma_ss_transposed_b_kernel<N, K, BCOLS><<<1, wg::kThreads>>>(da, db, dc, col0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto c = to_host(dc, 64 * N);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0;
      for (int k = 0; k < K; ++k) want += double(f(a[size_t(m * K + k)])) * f(b[size_t(k * BCOLS + col0 + n)]);
      ASSERT_NEAR(c[size_t(m * N + n)], want, 1e-3 * (1 + std::fabs(want)))
          << "N " << N << " K " << K << " col0 " << col0 << " at " << m << ", " << n;
    }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

TEST(Sm90Tile, WgmmaSharedOperandsTransposedB) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  check_wgmma_ss_transposed_b<64, 128, 128>(0);   // head dim 128: warpgroup 0's columns
  check_wgmma_ss_transposed_b<64, 128, 128>(64);  // and warpgroup 1's (the second chunk)
  check_wgmma_ss_transposed_b<32, 128, 64>(0);    // head dim 64: half a chunk each
  check_wgmma_ss_transposed_b<32, 128, 64>(32);
}

// ---- Named barriers and register reallocation: a producer warpgroup with few registers hands a
// value to a consumer warpgroup with many, through shared memory and bar.arrive / bar.sync. ------
__global__ void __launch_bounds__(256, 1) handoff_kernel(int* out) {
  __shared__ int value[wg::kThreads];
  const int t = threadIdx.x % wg::kThreads;
  constexpr int kBarrier = 1;
  if (threadIdx.x < wg::kThreads) {
    tile::registers_decrease<40>();
    value[t] = 1000 + t;
    tile::named_arrive(kBarrier, 2 * wg::kThreads);
  } else {
    tile::registers_increase<232>();
    tile::named_sync(kBarrier, 2 * wg::kThreads);
    out[t] = value[wg::kThreads - 1 - t];
  }
}

TEST(Sm90Tile, NamedBarrierHandoffAcrossRegisterBudgets) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  int* out = poisoned_device<int>(wg::kThreads);
  handoff_kernel<<<1, 2 * wg::kThreads>>>(out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = to_host(out, wg::kThreads);
  for (int t = 0; t < wg::kThreads; ++t) ASSERT_EQ(got[size_t(t)], 1000 + wg::kThreads - 1 - t) << "thread " << t;
  cudaFree(out);
}

// ---- MBarrier::test: whether a phase has completed, without waiting. A fresh barrier (phase 0
// running) reports the phase before it (parity 1) complete and phase 0 not; after its one
// arrival, phase 0 complete and phase 1 (now running) not. ------------------------------------
__global__ void mbarrier_test_kernel(int* out) {
  __shared__ tile::MBarrier bar;
  if (threadIdx.x == 0) {
    bar.init(1);
    out[0] = bar.test(0);
    out[1] = bar.test(1);
    bar.arrive();
    out[2] = bar.test(0);
    out[3] = bar.test(1);
  }
}

TEST(Sm90Tile, MBarrierTestSeesCompletedPhasesWithoutWaiting) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  int* out = poisoned_device<int>(4);
  mbarrier_test_kernel<<<1, 32>>>(out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = to_host(out, 4);
  EXPECT_EQ(got[0], 0) << "phase 0 running";
  EXPECT_EQ(got[1], 1) << "the phase before a fresh barrier's first counts as complete";
  EXPECT_EQ(got[2], 1) << "phase 0 complete after its one arrival";
  EXPECT_EQ(got[3], 0) << "phase 1 running";
  cudaFree(out);
}

}  // namespace
}  // namespace fmha::cuda::test
