// How `auto` meets an fp32 call's exact-fp32 precision on a GPU (src/common/precision.h): split
// tf32 where it was measured as accurate as the simt tier and faster, exact fp32 elsewhere. The
// rule reads shapes only, so it is checked here without a GPU, and so is the choice that applies
// it (api.cpp's choose_among, over stand-in tiers and devices); the GPU tests check that `auto`
// follows it on the real tiers (kernel_test.cpp's refusals, varlen_gpu_test.cpp's packed calls).
#include <gtest/gtest.h>

#include <string>

#include "backends.h"
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

TEST(SplitTf32Rule, ForwardAtEveryHeadDimBackwardAt64AndAbove128OnHopper) {
  for (int64_t d : {32, 48, 64, 96, 128, 192, 256}) {
    const Params p = dense_call(4096, d);
    EXPECT_TRUE(split_tf32_meets_ieee(p, Direction::forward, kHopper)) << d;
    EXPECT_EQ(split_tf32_meets_ieee(p, Direction::backward, kHopper), d == 64 || d > 128) << d;
  }
  // The larger head dim decides: D 64 with Dv 128 is a head-dim-128 backward.
  Params wide_v = dense_call(4096, 64);
  wide_v.v.shape[3] = wide_v.o.shape[3] = 128;
  EXPECT_FALSE(split_tf32_meets_ieee(wide_v, Direction::backward, kHopper));
  wide_v.v.shape[3] = wide_v.o.shape[3] = 256;
  EXPECT_TRUE(split_tf32_meets_ieee(wide_v, Direction::backward, kHopper));
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

// The choice itself (detail::choose_among) over stand-in tiers, which accept by precision and head
// dim as the real ones do (sm90: split tf32 at head dim 64, forward and backward; sm80: split tf32
// at any head dim; simt: exact fp32 only), and stand-in devices: 0 a Hopper, 1 an Ampere.
namespace stand_in {
Status unused_run(const Params&, Direction) { return {Code::internal, "not run"}; }
Status no_workspace(const Params&, Direction, size_t* bytes) {
  *bytes = 0;
  return Status::success();
}
bool split(const Params& p) { return p.precision == Precision::tf32x3; }
Status sm90(const Params& p, Direction d) {
  if (!split(p)) return {Code::unsupported, "sm90 stand-in: split tf32 only"};
  if (p.q.shape[3] != 64) return {Code::unsupported, "sm90 stand-in: head dim 64 only"};
  return Status::success();
}
Status sm80(const Params& p, Direction) {
  return split(p) ? Status::success() : Status{Code::unsupported, "sm80 stand-in: split tf32 only"};
}
Status simt(const Params& p, Direction) {
  return p.precision == Precision::ieee ? Status::success() : Status{Code::unsupported, "simt stand-in: ieee only"};
}
std::vector<detail::BackendEntry> tiers() {
  return {{Backend::cpu, DeviceType::cpu, simt, unused_run, no_workspace},
          {Backend::cuda_sm90, DeviceType::cuda, sm90, unused_run, no_workspace},
          {Backend::cuda_sm80, DeviceType::cuda, sm80, unused_run, no_workspace},
          // simt takes split tf32 too here: `auto` must still not meet exact fp32 with it that way.
          {Backend::cuda_simt, DeviceType::cuda, [](const Params&, Direction) { return Status::success(); },
           unused_run, no_workspace}};
}
std::vector<DeviceInfo> devices() {
  DeviceInfo hopper, ampere;
  hopper.device = Device{DeviceType::cuda, 0};
  hopper.compute_capability = kHopper;
  ampere.device = Device{DeviceType::cuda, 1};
  ampere.compute_capability = kAmpere;
  return {hopper, ampere};
}
}  // namespace stand_in

// A whole fp32 call on CUDA device `device` (forward and backward tensors), its pointers
// stand-ins (the choice reads no data).
Params whole_call(int64_t head_dim, int device = 0) {
  Params p = dense_call(4096, head_dim);
  for (Tensor* t : {&p.q, &p.k, &p.v, &p.o}) t->device.index = device;
  p.dout = p.o;
  p.dq = p.q;
  p.dk = p.k;
  p.dv = p.v;
  p.lse = make_tensor(nullptr, DType::fp32, {4, 4, 4096}, p.q.device);
  static float stand_in_data[4];
  for (Tensor* t : {&p.q, &p.k, &p.v, &p.o, &p.lse, &p.dout, &p.dq, &p.dk, &p.dv}) t->data = stand_in_data;
  return p;
}

struct Choice {
  Status status;
  Backend backend = Backend::auto_select;
  Precision precision = Precision::ieee;
};
Choice choose(const Params& p, Direction d, const std::vector<DeviceInfo>& devices = stand_in::devices()) {
  detail::BackendEntry entry{};
  Params resolved;
  Choice c;
  c.status = detail::choose_among(p, d, stand_in::tiers(), devices, &entry, &resolved);
  if (c.status.ok()) {
    c.backend = entry.id;
    c.precision = resolved.precision;
  }
  return c;
}

TEST(SplitTf32Choice, AutoRunsTheFirstTensorCoreTierThatTakesSplitTf32) {
  const Choice fwd64 = choose(whole_call(64), Direction::forward);
  ASSERT_TRUE(fwd64.status.ok()) << fwd64.status.message;
  EXPECT_EQ(fwd64.backend, Backend::cuda_sm90);
  EXPECT_EQ(fwd64.precision, Precision::tf32x3);
  const Choice fwd128 = choose(whole_call(128), Direction::forward);  // sm90 refuses: the next tier
  ASSERT_TRUE(fwd128.status.ok()) << fwd128.status.message;
  EXPECT_EQ(fwd128.backend, Backend::cuda_sm80);
  EXPECT_EQ(fwd128.precision, Precision::tf32x3);
  const Choice bwd64 = choose(whole_call(64), Direction::backward);
  ASSERT_TRUE(bwd64.status.ok()) << bwd64.status.message;
  EXPECT_EQ(bwd64.backend, Backend::cuda_sm90);
  EXPECT_EQ(bwd64.precision, Precision::tf32x3);
  const Choice bwd256 = choose(whole_call(256), Direction::backward);
  ASSERT_TRUE(bwd256.status.ok()) << bwd256.status.message;
  EXPECT_EQ(bwd256.backend, Backend::cuda_sm80);
  EXPECT_EQ(bwd256.precision, Precision::tf32x3);
}

TEST(SplitTf32Choice, ExactFp32WhereTheRuleSaysNo) {
  // The backward at head dims 96 and 128 (rule: not faster), every call on the Ampere.
  for (int64_t d : {96, 128}) {
    const Choice c = choose(whole_call(d), Direction::backward);
    ASSERT_TRUE(c.status.ok()) << c.status.message;
    EXPECT_EQ(c.backend, Backend::cuda_simt) << d;
    EXPECT_EQ(c.precision, Precision::ieee) << d;
  }
  for (Direction dir : {Direction::forward, Direction::backward}) {
    const Choice c = choose(whole_call(256, 1), dir);
    ASSERT_TRUE(c.status.ok()) << c.status.message;
    EXPECT_EQ(c.backend, Backend::cuda_simt);
    EXPECT_EQ(c.precision, Precision::ieee);
  }
  // A device index with no device behind it: no compute capability, so no split.
  const Choice unknown = choose(whole_call(64, 3), Direction::forward);
  ASSERT_TRUE(unknown.status.ok()) << unknown.status.message;
  EXPECT_EQ(unknown.backend, Backend::cuda_simt);
  EXPECT_EQ(unknown.precision, Precision::ieee);
}

TEST(SplitTf32Choice, NoTierTakesTheSplitCall) {
  // Only simt is left to take split tf32: the call stays exact fp32 on simt.
  std::vector<detail::BackendEntry> tiers = stand_in::tiers();
  tiers.erase(tiers.begin() + 1, tiers.begin() + 3);
  detail::BackendEntry entry{};
  Params resolved;
  ASSERT_TRUE(
      detail::choose_among(whole_call(64), Direction::forward, tiers, stand_in::devices(), &entry, &resolved).ok());
  EXPECT_EQ(entry.id, Backend::cuda_simt);
  EXPECT_EQ(resolved.precision, Precision::ieee);
}

TEST(SplitTf32Choice, NamedTiersRunTheCallAsAsked) {
  Params p = whole_call(64);
  p.backend = Backend::cuda_sm80;
  const Choice named = choose(p, Direction::forward);  // sm80 stand-in takes split tf32 only
  EXPECT_EQ(named.status.code, Code::unsupported);
  EXPECT_NE(named.status.message.find("backend sm80"), std::string::npos) << named.status.message;
  p.backend = Backend::cuda_simt;
  const Choice simt = choose(p, Direction::forward);
  ASSERT_TRUE(simt.status.ok()) << simt.status.message;
  EXPECT_EQ(simt.precision, Precision::ieee);
  // No CUDA device at all: a named CUDA tier says so.
  const Choice none = choose(p, Direction::forward, {});
  EXPECT_EQ(none.status.code, Code::no_device);
}

}  // namespace
}  // namespace fmha
