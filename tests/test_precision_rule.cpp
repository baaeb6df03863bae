// How `auto` meets an fp32 call's exact-fp32 precision on a GPU (src/common/precision.h): split
// tf32 where it was measured as accurate as the simt tier and faster, exact fp32 elsewhere. The
// rule reads shapes only, so it is checked here without a GPU; the GPU tests check that `auto`
// follows it (kernel_test.cpp's refusals, varlen_gpu_test.cpp's packed calls).
#include <gtest/gtest.h>

#include <string>

#include "common/precision.h"
#include "fmha/fmha.h"

namespace fmha {
namespace {

constexpr int kHopper = 90, kAmpere = 80, kAda = 89;

// Shapes only (the rule reads no data): a dense fp32 call on CUDA device 0 under `auto`.
Params dense_call(int64_t seqlen_q, int64_t head_dim, int64_t seqlen_k = 4096) {
  Params p;
  const Device gpu{DeviceType::cuda, 0};
  p.q = make_tensor(nullptr, DType::fp32, {4, seqlen_q, 4, head_dim}, gpu);
  p.k = make_tensor(nullptr, DType::fp32, {4, seqlen_k, 4, head_dim}, gpu);
  p.v = make_tensor(nullptr, DType::fp32, {4, seqlen_k, 4, head_dim}, gpu);
  p.o = make_tensor(nullptr, DType::fp32, {4, seqlen_q, 4, head_dim}, gpu);
  return p;
}

TEST(SplitTf32Rule, ForwardAtEveryHeadDimBackwardAbove128OnHopper) {
  for (int64_t d : {32, 64, 96, 128, 192, 256}) {
    const Params p = dense_call(4096, d);
    EXPECT_TRUE(split_tf32_meets_ieee(p, Direction::forward, kHopper)) << d;
    EXPECT_EQ(split_tf32_meets_ieee(p, Direction::backward, kHopper), d > kSplitTf32BackwardAboveHeadDim) << d;
  }
}

TEST(SplitTf32Rule, ExactFp32OnGpusWhereItWasNotMeasuredFaster) {
  const Params p = dense_call(4096, 256);
  for (int cc : {0, 70, kAmpere, 86, kAda, 100, 120})
    for (Direction d : {Direction::forward, Direction::backward})
      EXPECT_FALSE(split_tf32_meets_ieee(p, d, cc)) << cc;
}

TEST(SplitTf32Rule, OnlyAutoOnFp32AskingForExactFp32) {
  Params p = dense_call(4096, 64);
  ASSERT_TRUE(split_tf32_meets_ieee(p, Direction::forward, kHopper));
  for (Backend b : {Backend::cuda_simt, Backend::cuda_sm80, Backend::cuda_sm90, Backend::cpu, Backend::reference}) {
    Params named = p;
    named.backend = b;  // a named backend runs the call as asked
    EXPECT_FALSE(split_tf32_meets_ieee(named, Direction::forward, kHopper)) << to_string(b);
  }
  for (Precision precision : {Precision::tf32, Precision::tf32x3}) {
    Params asked = p;
    asked.precision = precision;  // asked for already: nothing to resolve
    EXPECT_FALSE(split_tf32_meets_ieee(asked, Direction::forward, kHopper)) << to_string(precision);
  }
  for (DType dtype : {DType::fp16, DType::bf16}) {
    Params half = p;
    half.q.dtype = half.k.dtype = half.v.dtype = half.o.dtype = dtype;
    EXPECT_FALSE(split_tf32_meets_ieee(half, Direction::forward, kHopper)) << to_string(dtype);
  }
  Params cpu = p;
  for (Tensor* t : {&cpu.q, &cpu.k, &cpu.v, &cpu.o}) t->device = Device{DeviceType::cpu, 0};
  EXPECT_FALSE(split_tf32_meets_ieee(cpu, Direction::forward, kHopper));
}

TEST(SplitTf32Rule, NotForKvCachesOrAFewQueryRows) {
  for (int64_t rows = 1; rows <= 16; ++rows)
    EXPECT_FALSE(split_tf32_meets_ieee(dense_call(rows, 64), Direction::forward, kHopper)) << rows;
  EXPECT_TRUE(split_tf32_meets_ieee(dense_call(17, 64), Direction::forward, kHopper));

  Params paged = dense_call(64, 64);
  paged.block_table = make_tensor(nullptr, DType::int32, {4, 8}, paged.q.device);
  paged.cache_seqlens = make_tensor(nullptr, DType::int32, {4}, paged.q.device);
  EXPECT_FALSE(split_tf32_meets_ieee(paged, Direction::forward, kHopper));
}

TEST(SplitTf32Rule, PackedCallsByTheirLongestSequence) {
  Params p;
  const Device gpu{DeviceType::cuda, 0};
  p.q = make_tensor(nullptr, DType::fp32, {300, 4, 256}, gpu);
  p.k = make_tensor(nullptr, DType::fp32, {300, 4, 256}, gpu);
  p.v = make_tensor(nullptr, DType::fp32, {300, 4, 256}, gpu);
  p.cu_seqlens_q = p.cu_seqlens_k = make_tensor(nullptr, DType::int32, {4}, gpu);
  p.max_seqlen_q = p.max_seqlen_k = 200;
  EXPECT_TRUE(split_tf32_meets_ieee(p, Direction::forward, kHopper));
  EXPECT_TRUE(split_tf32_meets_ieee(p, Direction::backward, kHopper));  // head dim 256
  p.max_seqlen_q = 16;
  EXPECT_FALSE(split_tf32_meets_ieee(p, Direction::forward, kHopper));
}

}  // namespace
}  // namespace fmha
