// The host side of the GPU decode kernel (src/common/decode.h): which calls are decode-shaped,
// the split count chosen from the shape and the SM count (and its override), and the workspace
// the split partials take; Params::num_splits out of range is refused. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "common/decode.h"
#include "fmha/fmha.h"

namespace fmha {
namespace {

constexpr int64_t kH200Sms = 132;

// Shapes only (the plan reads no data): a paged bf16 call of `batch` sequences.
Params paged_call(int64_t batch, int64_t seqlen_q, int64_t heads, int64_t kv_heads, int64_t pages_per_seq,
                  int64_t page_size = 64, int64_t head_dim = 128) {
  Params p;
  const int64_t pages = batch * pages_per_seq;
  p.q = make_tensor(nullptr, DType::bf16, {batch, seqlen_q, heads, head_dim});
  p.o = make_tensor(nullptr, DType::bf16, {batch, seqlen_q, heads, head_dim});
  p.k = make_tensor(nullptr, DType::bf16, {pages, page_size, kv_heads, head_dim});
  p.v = make_tensor(nullptr, DType::bf16, {pages, page_size, kv_heads, head_dim});
  p.block_table = make_tensor(nullptr, DType::int32, {batch, pages_per_seq});
  p.cache_seqlens = make_tensor(nullptr, DType::int32, {batch});
  return p;
}

TEST(DecodePlan, DecodeShape) {
  Params p = paged_call(1, 1, 32, 8, 4);
  EXPECT_TRUE(decode::is_decode_shape(p, Direction::forward));
  EXPECT_FALSE(decode::is_decode_shape(p, Direction::backward));
  p.q.dtype = DType::fp32;
  EXPECT_FALSE(decode::is_decode_shape(p, Direction::forward)) << "fp32 runs on the existing tiers";
  Params dense = paged_call(2, 16, 8, 2, 1);
  dense.block_table = dense.cache_seqlens = Tensor{};
  EXPECT_TRUE(decode::is_decode_shape(dense, Direction::forward));
  dense.q.shape[1] = decode::kMaxSeqlenQ + 1;
  EXPECT_FALSE(decode::is_decode_shape(dense, Direction::forward));
}

TEST(DecodePlan, SplitsFillTheGpuWithoutStarvingSplits) {
  const int64_t slots = kH200Sms * decode::kBlocksPerSm;
  // Enough CTAs already: no split.
  EXPECT_EQ(decode::choose_splits(slots, 1 << 20, kH200Sms), 1);
  EXPECT_EQ(decode::choose_splits(64 * 8, 8192, kH200Sms), 1);
  // 1 x 8k and 1 x 128k, 8 KV heads: close to one full wave, never past it; 8k keys allow at most
  // 32 splits of kMinKeysPerSplit.
  for (int64_t keys : {int64_t(8192), int64_t(128 * 1024)}) {
    const int64_t s = decode::choose_splits(8, keys, kH200Sms);
    EXPECT_LE(8 * s, slots) << keys;
    EXPECT_GE(8 * s, slots * 9 / 10) << keys;
    EXPECT_LE(s, std::max<int64_t>(1, keys / decode::kMinKeysPerSplit)) << keys;
  }
  // 16 x 8k and 16 x 32k: 128 CTAs take 2 splits (one nearly full wave), not 3 (one and a half).
  EXPECT_EQ(decode::choose_splits(128, 8192, kH200Sms), 2);
  EXPECT_EQ(decode::choose_splits(128, 32768, kH200Sms), 2);
  EXPECT_GT(decode::wave_efficiency(256, slots), decode::wave_efficiency(384, slots));
  // A short cache is not split below kMinKeysPerSplit keys per split.
  EXPECT_EQ(decode::choose_splits(1, 300, kH200Sms), 2);
  EXPECT_EQ(decode::choose_splits(1, 10, kH200Sms), 1);
  // Never more than kMaxSplits, even on a large GPU (and within kSplitGain of it there).
  const int64_t huge = decode::choose_splits(1, int64_t(1) << 30, 100000);
  EXPECT_LE(huge, decode::kMaxSplits);
  EXPECT_GE(double(huge), double(decode::kMaxSplits) * (1.0 - decode::kSplitGain));
  // The override wins (capped); no CTAs: one split.
  EXPECT_EQ(decode::choose_splits(4096, 100, kH200Sms, 7), 7);
  EXPECT_EQ(decode::choose_splits(1, 100, kH200Sms, 100000), decode::kMaxSplits);
  EXPECT_EQ(decode::choose_splits(0, 100, kH200Sms), 1);
}

TEST(DecodePlan, WorkspaceHoldsThePartials) {
  EXPECT_EQ(decode::workspace(1, 4, 2, 8, 64).total, 0u) << "one split writes o and lse itself";
  const decode::Workspace w = decode::workspace(3, 2, 5, 8, 72);
  const size_t rows = 3 * 2 * 5 * 8;
  EXPECT_EQ(w.part_o, 0u);
  EXPECT_GE(w.part_lse, rows * 72 * sizeof(float));
  EXPECT_EQ(w.part_lse % decode::kWorkspaceAlign, 0u);
  EXPECT_GE(w.total, w.part_lse + rows * sizeof(float));
  EXPECT_EQ(w.total % decode::kWorkspaceAlign, 0u);
  EXPECT_EQ(decode::workspace(4, 0, 1, 8, 64).total, 0u) << "an empty batch needs nothing";
}

TEST(DecodePlan, PlanOfACall) {
  // 1 sequence, 32 query heads over 8 KV heads, capacity 128 pages of 64: GQA packs the 4 query
  // heads of a KV head into one row tile; the split count comes from the capacity.
  Params p = paged_call(1, 1, 32, 8, 128);
  decode::Plan plan = decode::plan(p, kH200Sms);
  EXPECT_EQ(plan.row_tiles, 1);
  EXPECT_EQ(plan.max_keys, 128 * 64);
  EXPECT_EQ(plan.splits, decode::choose_splits(8, 128 * 64, kH200Sms));
  EXPECT_GT(plan.splits, 1);
  EXPECT_EQ(plan.workspace.total, decode::workspace(plan.splits, 1, 1, 32, 128).total);
  // 16 query rows × group 4 = 64 packed rows: four row tiles.
  p = paged_call(1, 16, 32, 8, 128);
  EXPECT_EQ(decode::plan(p, kH200Sms).row_tiles, 4);
  p.num_splits = 5;
  EXPECT_EQ(decode::plan(p, kH200Sms).splits, 5);
}

// The tuner's split variants (include/fmha/tune.h): half, twice and none of the heuristic's
// count, within [1, kMaxSplits]; Params::num_splits overrides every one; names map both ways.
TEST(DecodePlan, SplitVariantsScaleTheHeuristicsCount) {
  using decode::SplitVariant;
  for (int64_t splits : {int64_t(1), int64_t(2), int64_t(31), decode::kMaxSplits}) {
    EXPECT_EQ(decode::apply_split_variant(splits, SplitVariant::heuristic), splits);
    EXPECT_EQ(decode::apply_split_variant(splits, SplitVariant::half), std::max<int64_t>(1, splits / 2));
    EXPECT_EQ(decode::apply_split_variant(splits, SplitVariant::twice), std::min(2 * splits, decode::kMaxSplits));
    EXPECT_EQ(decode::apply_split_variant(splits, SplitVariant::unsplit), 1);
  }
  for (int i = 0; i < decode::kSplitVariants; ++i) {
    SplitVariant v = SplitVariant::unsplit;
    ASSERT_TRUE(decode::split_variant_of(decode::kSplitVariantNames[i], &v));
    EXPECT_EQ(int(v), i);
  }
  SplitVariant v = SplitVariant::twice;
  EXPECT_FALSE(decode::split_variant_of("b64", &v));
  EXPECT_EQ(v, SplitVariant::twice) << "an unknown name leaves the variant as it was";

  Params p = paged_call(1, 1, 32, 8, 128);
  const int64_t heuristic = decode::plan(p, kH200Sms).splits;
  ASSERT_GT(heuristic, 2);
  EXPECT_EQ(decode::plan(p, kH200Sms, SplitVariant::half).splits, heuristic / 2);
  EXPECT_EQ(decode::plan(p, kH200Sms, SplitVariant::twice).splits, 2 * heuristic);
  const decode::Plan one = decode::plan(p, kH200Sms, SplitVariant::unsplit);
  EXPECT_EQ(one.splits, 1);
  EXPECT_EQ(one.workspace.total, 0u) << "one split writes o and lse itself";
  EXPECT_GT(decode::plan(p, kH200Sms, SplitVariant::twice).workspace.total,
            decode::plan(p, kH200Sms).workspace.total);
  p.num_splits = 7;
  for (int i = 0; i < decode::kSplitVariants; ++i)
    EXPECT_EQ(decode::plan(p, kH200Sms, SplitVariant(i)).splits, 7) << decode::kSplitVariantNames[i];
}

TEST(DecodePlan, NumSplitsOutOfRangeIsRefused) {
  std::vector<float> q(64), k(16 * 64), v(16 * 64), o(64);
  Params p;
  p.q = make_tensor(q.data(), DType::fp32, {1, 1, 1, 64});
  p.k = make_tensor(k.data(), DType::fp32, {1, 16, 1, 64});
  p.v = make_tensor(v.data(), DType::fp32, {1, 16, 1, 64});
  p.o = make_tensor(o.data(), DType::fp32, {1, 1, 1, 64});
  for (int bad : {-1, int(decode::kMaxSplits) + 1}) {
    p.num_splits = bad;
    const Status s = forward(p);
    EXPECT_EQ(s.code, Code::invalid_argument);
    EXPECT_EQ(s.message.rfind("num_splits", 0), 0u) << s.message;
  }
  p.num_splits = 3;  // ignored by the CPU backends
  EXPECT_TRUE(forward(p).ok());
}

}  // namespace
}  // namespace fmha
