// fmha::merge on CUDA tensors against the CPU merge of the same parts (dense and packed layouts,
// bf16 parts into an fp32 accumulator in place, rows with -inf on one or both sides). The GPU
// tiers' variable-length calls are tested in varlen_gpu_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/numeric.h"
#include "gpu_test_util.h"

namespace fmha::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

Device current_device() {
  int ordinal = 0;
  cudaGetDevice(&ordinal);
  return Device{DeviceType::cuda, ordinal};
}

// Host bytes of `count` elements of `dtype` from `values`.
std::vector<uint8_t> encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) store_element(bytes.data(), dtype, int64_t(i), values[i]);
  return bytes;
}

std::vector<float> decode(const std::vector<uint8_t>& bytes, DType dtype, size_t count) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = load_element(bytes.data(), dtype, int64_t(i));
  return out;
}

struct MergeCase {
  bool packed;
  DType part_dtype, out_dtype;
  bool in_place;  // out, lse are out_a, lse_a
  int64_t dim;
};

TEST(MergeCuda, MatchesTheCpuMerge) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kBatch = 3, kSeqlen = 129, kHeads = 5;
  const int64_t rows = kBatch * kSeqlen * kHeads;
  const Device gpu = current_device();
  // One storage format with rows of whole 16-byte vectors takes the vector kernel: 18 vectors a
  // row (fp32, 72), 9 (fp16, 72: two rows a warp), 16 (bf16, 128), 64 (fp32, 256: lanes loop);
  // so does an fp32 accumulator merged in place with a 16-bit part (vectors of 4 values: 32 a
  // row at 128, 18 at 72); other mixed formats, rows of 200 bytes (fp16, 100) and an accumulate
  // whose rows are not whole vectors (70) take the element kernel.
  for (MergeCase mc : {MergeCase{false, DType::fp32, DType::fp32, false, 72}, MergeCase{false, DType::bf16, DType::fp32, false, 72},
                       MergeCase{true, DType::fp16, DType::fp16, true, 72}, MergeCase{true, DType::fp32, DType::fp32, true, 72},
                       MergeCase{false, DType::bf16, DType::bf16, false, 128}, MergeCase{false, DType::bf16, DType::bf16, true, 128},
                       MergeCase{false, DType::fp32, DType::fp32, false, 256}, MergeCase{true, DType::fp16, DType::fp16, false, 100},
                       MergeCase{false, DType::bf16, DType::fp32, true, 128}, MergeCase{true, DType::fp16, DType::fp32, true, 72},
                       MergeCase{false, DType::bf16, DType::fp32, true, 70}}) {
    const int64_t kDim = mc.dim, elements = rows * kDim;
    SCOPED_TRACE(std::string(mc.packed ? "packed " : "dense ") + to_string(mc.part_dtype) + " -> " +
                 to_string(mc.out_dtype) + (mc.in_place ? " in place" : "") + ", head_dim_v " + std::to_string(kDim));
    std::mt19937_64 rng(test_seed());
    std::normal_distribution<float> normal(0.f, 4.f);
    std::vector<float> out_a(static_cast<size_t>(elements)), out_b(static_cast<size_t>(elements));
    std::vector<float> lse_a(static_cast<size_t>(rows)), lse_b(static_cast<size_t>(rows));
    for (auto& x : out_a) x = normal(rng);
    for (auto& x : out_b) x = normal(rng);
    for (int64_t r = 0; r < rows; ++r) {
      lse_a[size_t(r)] = r % 5 == 0 ? -kInf : normal(rng);
      lse_b[size_t(r)] = r % 7 == 0 ? -kInf : normal(rng);
    }
    // A side of weight 0 may hold anything: NaN there must not reach the result. Out rows are
    // [B, S, H] ([B·S, H] packed), LSE rows [B, H, S] ([H, B·S] packed).
    for (int64_t b = 0; b < kBatch; ++b)
      for (int64_t t = 0; t < kSeqlen; ++t)
        for (int64_t h = 0; h < kHeads; ++h) {
          const int64_t token = b * kSeqlen + t;
          const size_t lse_row = size_t(mc.packed ? h * kBatch * kSeqlen + token : (b * kHeads + h) * kSeqlen + t);
          const size_t first = size_t((token * kHeads + h) * kDim);
          for (size_t d = 0; d < size_t(kDim); ++d) {
            if (std::isinf(lse_a[lse_row])) out_a[first + d] = std::numeric_limits<float>::quiet_NaN();
            if (std::isinf(lse_b[lse_row])) out_b[first + d] = std::numeric_limits<float>::quiet_NaN();
          }
        }
    const DType a_dtype = mc.in_place ? mc.out_dtype : mc.part_dtype;
    const std::vector<uint8_t> host_oa = encode(out_a, a_dtype), host_ob = encode(out_b, mc.part_dtype);
    const std::vector<uint8_t> host_la = encode(lse_a, DType::fp32), host_lb = encode(lse_b, DType::fp32);

    auto view = [&](void* data, DType dtype, bool is_lse, Device device) {
      if (mc.packed)
        return is_lse ? make_tensor(data, dtype, {kHeads, kBatch * kSeqlen}, device)
                      : make_tensor(data, dtype, {kBatch * kSeqlen, kHeads, kDim}, device);
      return is_lse ? make_tensor(data, dtype, {kBatch, kHeads, kSeqlen}, device)
                    : make_tensor(data, dtype, {kBatch, kSeqlen, kHeads, kDim}, device);
    };

    // The CPU merge of the same stored values.
    std::vector<uint8_t> cpu_oa = host_oa, cpu_ob = host_ob, cpu_la = host_la, cpu_lb = host_lb;
    std::vector<uint8_t> cpu_o(size_t(elements) * dtype_size(mc.out_dtype)), cpu_l(size_t(rows) * 4);
    MergeParams cpu;
    cpu.out_a = view(cpu_oa.data(), a_dtype, false, Device{});
    cpu.lse_a = view(cpu_la.data(), DType::fp32, true, Device{});
    cpu.out_b = view(cpu_ob.data(), mc.part_dtype, false, Device{});
    cpu.lse_b = view(cpu_lb.data(), DType::fp32, true, Device{});
    cpu.out = mc.in_place ? cpu.out_a : view(cpu_o.data(), mc.out_dtype, false, Device{});
    cpu.lse = mc.in_place ? cpu.lse_a : view(cpu_l.data(), DType::fp32, true, Device{});
    ASSERT_TRUE(merge(cpu).ok());

    DeviceBuffer oa(host_oa.size()), ob(host_ob.size()), la(host_la.size()), lb(host_lb.size());
    DeviceBuffer o(size_t(elements) * dtype_size(mc.out_dtype)), l(size_t(rows) * 4);
    oa.upload(host_oa);
    ob.upload(host_ob);
    la.upload(host_la);
    lb.upload(host_lb);
    o.poison();
    l.poison();
    MergeParams dev;
    dev.out_a = view(oa.ptr, a_dtype, false, gpu);
    dev.lse_a = view(la.ptr, DType::fp32, true, gpu);
    dev.out_b = view(ob.ptr, mc.part_dtype, false, gpu);
    dev.lse_b = view(lb.ptr, DType::fp32, true, gpu);
    dev.out = mc.in_place ? dev.out_a : view(o.ptr, mc.out_dtype, false, gpu);
    dev.lse = mc.in_place ? dev.lse_a : view(l.ptr, DType::fp32, true, gpu);
    const Status s = merge(dev);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    const std::vector<float> want_o = decode(mc.in_place ? cpu_oa : cpu_o, mc.out_dtype, size_t(elements));
    const std::vector<float> want_l = decode(mc.in_place ? cpu_la : cpu_l, DType::fp32, size_t(rows));
    const std::vector<float> got_o = decode((mc.in_place ? oa : o).download(), mc.out_dtype, size_t(elements));
    const std::vector<float> got_l = decode((mc.in_place ? la : l).download(), DType::fp32, size_t(rows));
    // CUDA's expf/logf are within 2 ulp of the correctly rounded result, and the output is
    // rounded to its dtype: a few units of that dtype's roundoff, relative to the terms of
    // o = w_a·o_a + w_b·o_b (weights at most 1), which may cancel to a much smaller o.
    const double u = mc.out_dtype == DType::fp32 ? 0x1p-24 : mc.out_dtype == DType::fp16 ? 0x1p-11 : 0x1p-8;
    for (int64_t r = 0; r < rows; ++r) {
      if (std::isinf(want_l[size_t(r)])) ASSERT_EQ(got_l[size_t(r)], want_l[size_t(r)]) << "lse row " << r;
      else ASSERT_NEAR(got_l[size_t(r)], want_l[size_t(r)], 8 * 0x1p-24 * std::max(1.f, std::abs(want_l[size_t(r)])));
    }
    for (int64_t i = 0; i < elements; ++i) {
      ASSERT_FALSE(std::isnan(got_o[size_t(i)])) << "o element " << i << " unwritten or NaN";
      const auto size = [](float x) { return std::isnan(x) ? 0.f : std::abs(x); };  // NaN: a side of weight 0
      const float terms = size(out_a[size_t(i)]) + size(out_b[size_t(i)]);
      ASSERT_NEAR(got_o[size_t(i)], want_o[size_t(i)], 8 * u * std::max(1.f, terms)) << i;
    }
  }
}

TEST(MergeCuda, RefusesMixedDevices) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer buffer(4096);
  std::vector<float> host(64);
  MergeParams m;
  const Device gpu = current_device();
  m.out_a = make_tensor(buffer.ptr, DType::fp32, {1, 4, 1, 8}, gpu);
  m.lse_a = make_tensor(static_cast<char*>(buffer.ptr) + 1024, DType::fp32, {1, 1, 4}, gpu);
  m.out_b = make_tensor(host.data(), DType::fp32, {1, 4, 1, 8});
  m.lse_b = m.lse_a;
  m.out = m.out_a;
  m.lse = m.lse_a;
  const Status s = merge(m);
  EXPECT_EQ(s.code, Code::invalid_argument);
  EXPECT_NE(s.message.find("out_b: is on a different device than out_a"), std::string::npos) << s.message;
}

}  // namespace
}  // namespace fmha::test
