// 64-bit offsets on the GPU: the same call through a dense Q and through a strided view whose
// rows sit 2^20 elements apart (the last rows start past element 2^31) must give bitwise the same
// O, LSE and gradients. Any 32-bit base-offset arithmetic in a kernel reads the wrong rows.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/numeric.h"
#include "fmha/fmha.h"

namespace {

using fmha::Backend;
using fmha::DType;

constexpr int64_t kSeqlenQ = 2100, kSeqlenK = 96, kHeadDim = 64;
constexpr int64_t kRowStride = int64_t(1) << 20;  // elements between Q rows in the sparse view

bool have_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

struct DeviceMemory {
  void* ptr = nullptr;
  explicit DeviceMemory(size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) {
      cudaGetLastError();
      ptr = nullptr;
    }
  }
  ~DeviceMemory() {
    if (ptr) cudaFree(ptr);
  }
};

std::vector<uint8_t> download(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  EXPECT_EQ(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

void run_case(Backend backend, DType dtype, fmha::Precision precision, bool with_backward = true) {
  const fmha::Device gpu{fmha::DeviceType::cuda, 0};
  const size_t elem = fmha::dtype_size(dtype);
  const size_t q_bytes = size_t(kSeqlenQ * kHeadDim) * elem, kv_bytes = size_t(kSeqlenK * kHeadDim) * elem;
  const int64_t span = (kSeqlenQ - 1) * kRowStride + kHeadDim;  // elements covered by the sparse view
  ASSERT_GT(span, int64_t(1) << 31);

  // Random dense inputs on the host, in the storage dtype.
  std::mt19937_64 rng(20261202);
  std::normal_distribution<float> normal;
  auto random_bytes = [&](size_t count) {
    std::vector<uint8_t> bytes(count * elem);
    for (size_t i = 0; i < count; ++i) fmha::store_element(bytes.data(), dtype, int64_t(i), normal(rng));
    return bytes;
  };
  const auto q_host = random_bytes(size_t(kSeqlenQ * kHeadDim)), k_host = random_bytes(size_t(kSeqlenK * kHeadDim)),
             v_host = random_bytes(size_t(kSeqlenK * kHeadDim)), do_host = random_bytes(size_t(kSeqlenQ * kHeadDim));

  DeviceMemory q(q_bytes), q_sparse(size_t(span) * elem), k(kv_bytes), v(kv_bytes), o(q_bytes), lse(kSeqlenQ * 4),
      dout(q_bytes), dq(q_bytes), dk(kv_bytes), dv(kv_bytes), workspace(size_t(64) << 20);
  for (void* p : {q.ptr, q_sparse.ptr, k.ptr, v.ptr, o.ptr, lse.ptr, dout.ptr, dq.ptr, dk.ptr, dv.ptr, workspace.ptr})
    if (!p) GTEST_SKIP() << "not enough device memory for the sparse view";
  ASSERT_EQ(cudaMemcpy(q.ptr, q_host.data(), q_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy2D(q_sparse.ptr, size_t(kRowStride) * elem, q_host.data(), size_t(kHeadDim) * elem,
                         size_t(kHeadDim) * elem, size_t(kSeqlenQ), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k.ptr, k_host.data(), kv_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v.ptr, v_host.data(), kv_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dout.ptr, do_host.data(), q_bytes, cudaMemcpyHostToDevice), cudaSuccess);

  fmha::Params p;
  p.q = fmha::make_tensor(q.ptr, dtype, {1, kSeqlenQ, 1, kHeadDim}, gpu);
  p.k = fmha::make_tensor(k.ptr, dtype, {1, kSeqlenK, 1, kHeadDim}, gpu);
  p.v = fmha::make_tensor(v.ptr, dtype, {1, kSeqlenK, 1, kHeadDim}, gpu);
  p.o = fmha::make_tensor(o.ptr, dtype, {1, kSeqlenQ, 1, kHeadDim}, gpu);
  p.lse = fmha::make_tensor(lse.ptr, DType::fp32, {1, 1, kSeqlenQ}, gpu);
  p.dout = fmha::make_tensor(dout.ptr, dtype, {1, kSeqlenQ, 1, kHeadDim}, gpu);
  p.dq = fmha::make_tensor(dq.ptr, dtype, {1, kSeqlenQ, 1, kHeadDim}, gpu);
  p.dk = fmha::make_tensor(dk.ptr, dtype, {1, kSeqlenK, 1, kHeadDim}, gpu);
  p.dv = fmha::make_tensor(dv.ptr, dtype, {1, kSeqlenK, 1, kHeadDim}, gpu);
  p.backend = backend;
  p.precision = precision;
  p.causal = fmha::Causal::bottom_right;
  p.deterministic = true;  // bitwise comparison of the gradients
  p.workspace = workspace.ptr;
  p.workspace_bytes = size_t(64) << 20;
  if (!fmha::supports(p, fmha::Direction::forward).ok()) GTEST_SKIP() << "tier not available on this device";

  ASSERT_TRUE(fmha::forward(p).ok());
  if (with_backward) ASSERT_TRUE(fmha::backward(p).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto o_dense = download(o.ptr, q_bytes), lse_dense = download(lse.ptr, kSeqlenQ * 4),
             dq_dense = download(dq.ptr, q_bytes), dk_dense = download(dk.ptr, kv_bytes),
             dv_dense = download(dv.ptr, kv_bytes);

  fmha::Params s = p;
  s.q = fmha::make_tensor(q_sparse.ptr, dtype, {1, kSeqlenQ, 1, kHeadDim}, {span, kRowStride, kHeadDim, 1}, gpu);
  ASSERT_EQ(cudaMemset(o.ptr, 0xff, q_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(lse.ptr, 0xff, kSeqlenQ * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dq.ptr, 0xff, q_bytes), cudaSuccess);
  ASSERT_TRUE(fmha::forward(s).ok());
  if (with_backward) ASSERT_TRUE(fmha::backward(s).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(download(o.ptr, q_bytes), o_dense) << "O differs through the sparse view";
  EXPECT_EQ(download(lse.ptr, kSeqlenQ * 4), lse_dense) << "LSE differs through the sparse view";
  if (!with_backward) return;
  EXPECT_EQ(download(dq.ptr, q_bytes), dq_dense) << "dQ differs through the sparse view";
  EXPECT_EQ(download(dk.ptr, kv_bytes), dk_dense) << "dK differs through the sparse view";
  EXPECT_EQ(download(dv.ptr, kv_bytes), dv_dense) << "dV differs through the sparse view";
}

TEST(LargeOffsets, SimtReadsRowsPastTwoToTheThirtyOne) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  run_case(Backend::cuda_simt, DType::fp32, fmha::Precision::ieee);
}

TEST(LargeOffsets, Sm80ReadsRowsPastTwoToTheThirtyOne) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  run_case(Backend::cuda_sm80, DType::bf16, fmha::Precision::ieee);
}

TEST(LargeOffsets, Sm90ReadsRowsPastTwoToTheThirtyOne) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  run_case(Backend::cuda_sm90, DType::bf16, fmha::Precision::ieee, /*with_backward=*/false);
}

}  // namespace
