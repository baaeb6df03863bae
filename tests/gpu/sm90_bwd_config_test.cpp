// The sm90 backward's configuration per head dim (sm90_config.h): 128 keys and a warpgroup per
// 64 keys up to 128; above, 64 keys with the head dim's chunks split over the two warpgroups;
// fp32 (tf32) at head dim 64 with one stage.
// Host logic only: runs without a GPU.
#include <gtest/gtest.h>

#include "cuda/common/args.h"
#include "cuda/sm90/sm90_config.h"

namespace fmha::cuda::sm90 {
namespace {

TEST(Sm90BwdConfig, KeysPerWarpgroupUpTo128) {
  for (int d : {64, 96, 128}) {
    const BwdConfig c = bwd_config(d);
    EXPECT_FALSE(c.split_head_dim) << d;
    EXPECT_EQ(c.keys, kBwdConsumers * kConsumerRows) << d;
    EXPECT_EQ(c.stages, 2) << d;
    EXPECT_EQ(c.ds_buffers, 2) << d;
  }
}

TEST(Sm90BwdConfig, HeadDimSplitAbove128) {
  for (int d : {192, 256}) {
    const BwdConfig c = bwd_config(d);
    EXPECT_TRUE(c.split_head_dim) << d;
    EXPECT_EQ(c.keys, kConsumerRows) << d;
    EXPECT_EQ(c.ds_buffers, 1) << d;
  }
  EXPECT_EQ(bwd_config(192).stages, 2);
  EXPECT_EQ(bwd_config(256).stages, 1);  // a second Q/dO stage does not fit beside the dQ tile
  EXPECT_EQ(kBwdMaxHeadDim, 256);
}

// Each warpgroup owns whole 64-column chunks (an MN-major wgmma operand starts on one), together
// the padded head dim, the first the larger share.
TEST(Sm90BwdConfig, SplitColumnsAreWholeChunks) {
  EXPECT_EQ(bwd_split_cols(256, 0), 128);
  EXPECT_EQ(bwd_split_cols(256, 1), 128);
  EXPECT_EQ(bwd_split_cols(192, 0), 128);
  EXPECT_EQ(bwd_split_cols(192, 1), 64);
  for (int d : {192, 256}) {
    EXPECT_EQ(bwd_split_cols(d, 0) % kChunkCols, 0);
    EXPECT_EQ(bwd_split_cols(d, 1) % kChunkCols, 0);
    EXPECT_EQ(bwd_split_cols(d, 0) + bwd_split_cols(d, 1), padded_head_dim(d));
    EXPECT_GE(bwd_split_cols(d, 0), bwd_split_cols(d, 1));
  }
}

// Query rows a step: 128 for 16-bit storage at head dims up to 64, 64 elsewhere (fp32's transposes
// and the split scheme's shares are of 64 rows); every tile a whole number of m64 wgmma rows, and
// no tile's row statistics straddle a (batch, head) run.
TEST(Sm90BwdConfig, WideStepsAtSmallHeadDims) {
  for (int d : {32, 40, 64}) EXPECT_EQ(bwd_config(d).rows, kBwdWideRows) << d;
  for (int d : {96, 128, 192, 256}) EXPECT_EQ(bwd_config(d).rows, kBwdRows) << d;
  EXPECT_EQ(bwd_config(64, 4).rows, kBwdRows);
  for (int d : {32, 64, 96, 128, 192, 256}) {
    EXPECT_EQ(bwd_config(d).rows % kConsumerRows, 0) << d;
    EXPECT_EQ(kStatRowAlign % bwd_config(d).rows, 0) << d;
    EXPECT_GE(bwd_config(d).rows, kBwdRows) << d;  // the turn counters are counted in kBwdRows tiles
  }
}

// The wide step's shared memory (sm90_config.h): K, V; two Q/dO stages; two dS buffers [128 q,
// 128 keys]; the dQ staging tile; LSE and Δ.
TEST(Sm90BwdConfig, WideStepBuffersFitSharedMemory) {
  const BwdConfig c = bwd_config(64);
  const size_t d = 64;
  const size_t bytes = 2 * size_t(c.keys) * d * 2 + size_t(c.stages) * 2 * c.rows * d * 2 +
                       size_t(c.ds_buffers) * c.rows * c.keys * 2 + size_t(c.rows) * (d + kBwdDqPad) * 4 +
                       size_t(c.stages) * 2 * c.rows * 4;
  EXPECT_EQ(bytes, 202752u);
  EXPECT_LE(bytes + 2048, kSharedLimit);
}

// The shared memory the split kernel's buffers take (sm90_config.h's table), against Hopper's
// 227 KiB: K, V; the Q/dO stages; P and dS; the dQ staging tile; LSE and Δ.
size_t split_shared_bytes(int d) {
  const BwdConfig c = bwd_config(d);
  const size_t kv = 2 * size_t(c.keys) * d * 2;
  const size_t stages = size_t(c.stages) * 2 * kBwdRows * d * 2;
  const size_t scores = size_t(c.ds_buffers) * 2 * kBwdRows * c.keys * 2;
  const size_t dq = size_t(kBwdRows) * (d + kBwdDqPad) * 4;
  const size_t stats = size_t(c.stages) * 2 * kBwdRows * 4;
  return kv + stages + scores + dq + stats;
}

TEST(Sm90BwdConfig, SplitBuffersFitSharedMemory) {
  EXPECT_EQ(split_shared_bytes(256), 215552u);
  EXPECT_EQ(split_shared_bytes(192), 216064u);
  for (int d : {192, 256}) EXPECT_LE(split_shared_bytes(d) + 2048, kSharedLimit) << d;  // barriers, alignment
}

// fp32 storage (tf32): head dim 64 only, the 16-bit layout's 128 keys with one Q/dO stage and
// one dS buffer, because the transposes Kᵀ, Qᵀ and dOᵀ sit beside the tiles (sm90_config.h's
// table): K, V, Kᵀ; the Q/dO stages; Qᵀ, dOᵀ; dS [64 q, keys]; the dQ staging tile; LSE and Δ.
size_t tf32_shared_bytes(int d, int stages) {
  const BwdConfig c = bwd_config(d, 4);
  const size_t keys_side = 3 * size_t(c.keys) * d * 4;
  const size_t query_side = size_t(stages) * 2 * kBwdRows * d * 4 + 2 * size_t(kBwdRows) * d * 4;
  const size_t ds = size_t(c.ds_buffers) * kBwdRows * c.keys * 4;
  const size_t dq = size_t(kBwdRows) * (d + kBwdDqPad) * 4;
  const size_t stats = size_t(stages) * 2 * kBwdRows * 4;
  return keys_side + query_side + ds + dq + stats;
}

TEST(Sm90BwdConfig, Tf32AtHeadDim64WithOneStage) {
  for (int d : {64, 96, 128}) EXPECT_TRUE(tf32_backward_head_dim(d)) << d;
  for (int d : {32, 48, 192, 256}) EXPECT_FALSE(tf32_backward_head_dim(d)) << d;
  const BwdConfig c = bwd_config(64, 4);
  EXPECT_EQ(c.keys, kBwdConsumers * kConsumerRows);
  EXPECT_FALSE(c.split_head_dim);
  EXPECT_EQ(c.stages, 1);
  EXPECT_EQ(c.ds_buffers, 1);
  EXPECT_EQ(tf32_shared_bytes(64, 1), 215552u);              // 210.5 KiB
  EXPECT_LE(tf32_shared_bytes(64, 1) + 2048, kSharedLimit);  // barriers, alignment
  EXPECT_GT(tf32_shared_bytes(64, 2), kSharedLimit);         // a second Q/dO stage does not fit
  // Nor head dim 128: K, V, Kᵀ and one stage of Q, dO, Qᵀ, dOᵀ alone exceed it.
  EXPECT_GT(3 * size_t(c.keys) * 128 * 4 + 4 * size_t(kBwdRows) * 128 * 4, kSharedLimit);
  // The 16-bit configurations are unchanged by the element size's default.
  EXPECT_EQ(bwd_config(64).stages, 2);
  EXPECT_EQ(bwd_config(64, 2).ds_buffers, 2);
}

// fp32 storage at head dims 96 and 128 (the wide tf32 backward, sm90_config.h's table): 64 keys,
// the two warpgroups splitting the scores' query columns, one Q/dO stage, one buffer of P and dS
// as [keys, q] and dS as [q, keys]; no transposed copies of K, Q or dO. K and V; Q and dO; the
// three score tiles; the dQ staging tile; LSE and Δ.
size_t wide_tf32_shared_bytes(int d, int stages) {
  const BwdConfig c = bwd_config(d, 4);
  const size_t keys_side = 2 * size_t(c.keys) * d * 4;
  const size_t query_side = size_t(stages) * 2 * kBwdRows * d * 4;
  const size_t scores = 3 * size_t(c.ds_buffers) * kBwdRows * c.keys * 4;
  const size_t dq = size_t(kBwdRows) * (d + kBwdDqPad) * 4;
  const size_t stats = size_t(stages) * 2 * kBwdRows * 4;
  return keys_side + query_side + scores + dq + stats;
}

TEST(Sm90BwdConfig, WideTf32At96And128WithOneStage) {
  for (int d : {96, 128}) {
    const BwdConfig c = bwd_config(d, 4);
    EXPECT_EQ(c.keys, kConsumerRows) << d;
    EXPECT_TRUE(c.split_head_dim) << d;
    EXPECT_EQ(c.stages, 1) << d;
    EXPECT_EQ(c.ds_buffers, 1) << d;
    EXPECT_EQ(c.rows, kBwdRows) << d;
  }
  EXPECT_EQ(padded_head_dim(96), 128);
  EXPECT_EQ(wide_tf32_shared_bytes(128, 1), 215552u);              // 210.5 KiB
  EXPECT_LE(wide_tf32_shared_bytes(128, 1) + 2048, kSharedLimit);  // barriers, alignment
  EXPECT_GT(wide_tf32_shared_bytes(128, 2), kSharedLimit);         // a second Q/dO stage does not fit
  // Each warpgroup's query columns are one fp32 chunk of P and dS; its head-dim rows one m64 wgmma.
  EXPECT_EQ(kBwdRows / kBwdConsumers, 32);
  EXPECT_EQ(padded_head_dim(128) / kBwdConsumers, kConsumerRows);
}

// Split tf32 (tf32x3) at head dim 64 (sm90_config.h's table): the wide shape (64 keys, the two
// warpgroups splitting the scores' query columns, one Q/dO stage, one score buffer) with every
// operand tile beside its residual tile: K, V, Q, dO and their residuals; P and dS [keys, q] and
// their residuals (dS [q, keys] takes the residual tiles of Q and dO); the dQ staging tile; the
// rows' own max, Δ and 1/sum.
size_t split_tf32_shared_bytes(int d, int stages) {
  const BwdConfig c = bwd_config(d, 4, true);
  const size_t keys_side = 4 * size_t(c.keys) * d * 4;
  const size_t query_side = size_t(stages) * 2 * kBwdRows * d * 4 + 2 * size_t(kBwdRows) * d * 4;
  const size_t scores = 4 * size_t(c.ds_buffers) * kBwdRows * c.keys * 4;
  const size_t dq = size_t(kBwdRows) * (d + kBwdDqPad) * 4;
  const size_t stats = size_t(stages) * 3 * kBwdRows * 4;
  return keys_side + query_side + scores + dq + stats;
}

TEST(Sm90BwdConfig, SplitTf32AtHeadDim64WithOneStage) {
  EXPECT_TRUE(tf32x3_backward_head_dim(64));
  for (int d : {32, 48, 96, 128, 192, 256}) EXPECT_FALSE(tf32x3_backward_head_dim(d)) << d;
  const BwdConfig c = bwd_config(64, 4, true);
  EXPECT_EQ(c.keys, kConsumerRows);
  EXPECT_TRUE(c.split_head_dim);
  EXPECT_EQ(c.stages, 1);
  EXPECT_EQ(c.ds_buffers, 1);
  EXPECT_EQ(c.rows, kBwdRows);
  EXPECT_EQ(split_tf32_shared_bytes(64, 1), 215808u);              // 210.75 KiB
  EXPECT_LE(split_tf32_shared_bytes(64, 1) + 2048, kSharedLimit);  // barriers, alignment
  EXPECT_GT(split_tf32_shared_bytes(64, 2), kSharedLimit);         // a second Q/dO stage does not fit
  // dS [q, keys] fits the residual tiles of Q and dO ([q, head dim]): at head dim 64 alone.
  EXPECT_EQ(kBwdRows * c.keys, kBwdRows * padded_head_dim(64));
  // The flag leaves plain tf32 as it was.
  EXPECT_EQ(bwd_config(64, 4).keys, kBwdConsumers * kConsumerRows);
}

}  // namespace
}  // namespace fmha::cuda::sm90
