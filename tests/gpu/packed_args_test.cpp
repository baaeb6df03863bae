// The GPU kernels' view of a packed (variable-length) call (src/cuda/common/args.h, host.cpp):
// the argument block's packed strides and workspace rows, and sequence(), which every packed
// kernel block runs first, on good tables and on tables that break the caller's promise; and
// the sm90 tier's host checks of packed views and calls. Host logic only (sequence() is
// host-and-device code): runs without a GPU.
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "common/problem.h"
#include "cuda/common/host.h"
#include "cuda/instances.h"
#if FMHA_CUDA_SM90
#include "cuda/sm90/sm90_dispatch.h"
#include "cuda/sm90/sm90_tma.h"
#endif

namespace fmha::cuda {
namespace {

constexpr int64_t kHeads = 4, kKvHeads = 2, kDim = 64, kDimV = 32;

// A packed call over `total_q` / `total_k` rows with the given tables (host memory: the kernels'
// reads are replayed on the host here). Data pointers are never dereferenced.
struct PackedCall {
  std::vector<int32_t> cu_q, cu_k;
  Params params;
  PackedCall(std::vector<int32_t> q_table, std::vector<int32_t> k_table, int64_t total_q, int64_t total_k,
             int64_t max_q, int64_t max_k)
      : cu_q(std::move(q_table)), cu_k(std::move(k_table)) {
    Params& p = params;
    p.q = make_tensor(nullptr, DType::bf16, {total_q, kHeads, kDim});
    p.k = make_tensor(nullptr, DType::bf16, {total_k, kKvHeads, kDim});
    p.v = make_tensor(nullptr, DType::bf16, {total_k, kKvHeads, kDimV});
    p.o = p.dout = make_tensor(nullptr, DType::bf16, {total_q, kHeads, kDimV});
    p.dq = p.q;
    p.dk = p.k;
    p.dv = p.v;
    p.lse = make_tensor(nullptr, DType::fp32, {kHeads, total_q});
    p.cu_seqlens_q = make_tensor(cu_q.data(), DType::int32, {int64_t(cu_q.size())});
    p.cu_seqlens_k = make_tensor(cu_k.data(), DType::int32, {int64_t(cu_k.size())});
    p.max_seqlen_q = max_q;
    p.max_seqlen_k = max_k;
  }
  AttentionArgs args() const { return make_args(params, Problem::of(params)); }
};

TEST(PackedArgs, ViewsTakeTheSequenceStartAsTheirBatchIndex) {
  const PackedCall call({0, 5, 12}, {0, 7, 7}, 12, 7, 7, 7);
  const AttentionArgs a = call.args();
  // q [12, 4, 64]: row stride 256, head stride 64; the start is a row, so the batch stride is 256.
  EXPECT_EQ(a.q.offset(5, 2, 3), (5 + 2) * kHeads * kDim + 3 * kDim);
  EXPECT_EQ(a.v.offset(7, 0, 1), 7 * kKvHeads * kDimV + kDimV);
  // LSE [4, 12]: (start, head, row) -> head · 12 + start + row.
  EXPECT_EQ(a.lse_batch_stride * 5 + a.lse_head_stride * 3 + a.lse_seq_stride * 2, 3 * 12 + 5 + 2);
  // Workspace rows [H, total_q], the same order as the LSE's.
  EXPECT_EQ(a.row_index(5, 3, 2), 3 * 12 + 5 + 2);
  // Row statistics: each head's run padded to kStatRowAlign (128) rows.
  EXPECT_EQ(a.stat_rows, kStatRowAlign);
  EXPECT_EQ(a.stat_index(5, 3, 2), 3 * kStatRowAlign + 5 + 2);
  EXPECT_TRUE(a.is_packed());
  EXPECT_EQ(a.batch, 2);
}

TEST(PackedArgs, WorkspaceHasOneRowPerPackedQueryRowAndHead) {
  const PackedCall call({0, 1, 2, 3, 203}, {0, 1, 2, 3, 203}, 203, 203, 200, 200);
  const WorkspaceLayout packed = workspace_layout(Problem::of(call.params), false);
  Params dense = call.params;  // the same rows as one dense sequence
  dense.cu_seqlens_q = dense.cu_seqlens_k = Tensor{};
  dense.q = make_tensor(nullptr, DType::bf16, {1, 203, kHeads, kDim});
  dense.k = make_tensor(nullptr, DType::bf16, {1, 203, kKvHeads, kDim});
  dense.v = make_tensor(nullptr, DType::bf16, {1, 203, kKvHeads, kDimV});
  EXPECT_EQ(packed.total, workspace_layout(Problem::of(dense), false).total);
  EXPECT_GE(packed.total, size_t(203 * kHeads) * (kDim + 2) * sizeof(float));
  EXPECT_LT(packed.total, size_t(4 * 200 * kHeads) * (kDim + 2) * sizeof(float));  // not batch · max_seqlen_q
}

TEST(PackedArgs, EnterSequenceGivesEachSequenceItsRowsAndMask) {
  const std::vector<int32_t> cu_q = {0, 37, 37, 38, 168}, cu_k = {0, 50, 59, 60, 60};
  for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
    PackedCall call(cu_q, cu_k, 168, 60, 130, 50);
    call.params.causal = causal;
    call.params.window_left = 16;
    call.params.q_offset = -3;
    const AttentionArgs base = call.args();
    for (int64_t b = 0; b + 1 < int64_t(cu_q.size()); ++b) {
      const Sequence seq = base.sequence(b);
      const int64_t len_q = cu_q[size_t(b) + 1] - cu_q[size_t(b)], len_k = cu_k[size_t(b) + 1] - cu_k[size_t(b)];
      EXPECT_EQ(seq.start.q, cu_q[size_t(b)]);
      EXPECT_EQ(seq.start.k, cu_k[size_t(b)]);
      EXPECT_EQ(seq.mask.seqlen_q, len_q);
      EXPECT_EQ(seq.mask.seqlen_k, len_k);
      const Mask want = Mask::make(causal, 16, -1, -3, len_q, len_k);
      for (int64_t row = 0; row < len_q; ++row) {
        EXPECT_EQ(seq.mask.keys(row).begin, want.keys(row).begin) << "sequence " << b << " row " << row;
        EXPECT_EQ(seq.mask.keys(row).end, want.keys(row).end) << "sequence " << b << " row " << row;
      }
    }
  }
}

TEST(PackedArgs, DenseCallsKeepTheirBatchIndexAndMask) {
  Params p;
  p.q = make_tensor(nullptr, DType::fp32, {3, 10, kHeads, kDim});
  p.k = p.v = make_tensor(nullptr, DType::fp32, {3, 12, kKvHeads, kDim});
  p.o = p.q;
  p.causal = Causal::bottom_right;
  const AttentionArgs a = make_args(p, Problem::of(p));
  const Sequence seq = a.sequence(2);
  EXPECT_FALSE(a.is_packed());
  EXPECT_EQ(seq.start.q, 2);
  EXPECT_EQ(seq.start.k, 2);
  EXPECT_EQ(seq.mask.seqlen_q, 10);
  EXPECT_EQ(seq.mask.seqlen_k, 12);
  EXPECT_EQ(seq.mask.shift, 2);  // bottom-right: 12 - 10
  EXPECT_EQ(a.row_index(2, 1, 4), (2 * kHeads + 1) * 10 + 4);
}

// Tables that break every promise: whatever a kernel block reads, its rows stay inside the
// packed tensors and the workspace, and its lengths within max_seqlen and the grid.
TEST(PackedArgs, BrokenTablesStayInsideTheTensors) {
  constexpr int64_t kTotalQ = 48, kTotalK = 40;
  const std::vector<int32_t> cu_q = {7, 30, 10, INT32_MAX, -5, 48, 3, INT32_MIN};
  const std::vector<int32_t> cu_k = {-3, 12, INT32_MAX, 5, 40, 2, 41, 0};
  for (int64_t max_seqlen : {int64_t(0), int64_t(16), int64_t(100), int64_t(1) << 40}) {
    const PackedCall call(cu_q, cu_k, kTotalQ, kTotalK, max_seqlen, max_seqlen);
    const AttentionArgs base = call.args();
    EXPECT_LE(base.seqlen_q, kTotalQ);  // the grid: never more tiles than the packed rows need
    EXPECT_LE(base.seqlen_k, kTotalK);
    for (int64_t b = 0; b + 1 < int64_t(cu_q.size()); ++b) {
      const Sequence seq = base.sequence(b);
      const int64_t len_q = seq.mask.seqlen_q, len_k = seq.mask.seqlen_k;
      SCOPED_TRACE("sequence " + std::to_string(b) + ", max_seqlen " + std::to_string(max_seqlen));
      EXPECT_GE(seq.start.q, 0);
      EXPECT_GE(seq.start.k, 0);
      EXPECT_GE(len_q, 0);
      EXPECT_GE(len_k, 0);
      EXPECT_LE(seq.start.q + len_q, kTotalQ);
      EXPECT_LE(seq.start.k + len_k, kTotalK);
      EXPECT_LE(len_q, base.seqlen_q);
      EXPECT_LE(len_k, base.seqlen_k);
      if (len_q > 0)  // the last workspace row the block touches
        EXPECT_LT(base.row_index(seq.start.q, kHeads - 1, len_q - 1), kHeads * kTotalQ);
      // Every key a row of the sequence sees is one of the sequence's keys.
      for (int64_t row = 0; row < len_q; ++row) {
        const Range keys = seq.mask.keys(row);
        EXPECT_GE(keys.begin, 0);
        EXPECT_LE(keys.end, len_k);
      }
    }
  }
}

#if FMHA_CUDA_SM90
// The sm90 tier addresses a packed [total, H, D] view through TMA as [1, total, H, D]: its row
// and head strides are the ones checked, and a bad one is named as the packed view's dimension.
TEST(PackedArgs, Sm90ChecksPackedViewsForTma) {
  const Tensor good = make_tensor(nullptr, DType::bf16, {100, kHeads, kDim});
  const Status ok = sm90::check_tma_view(good, "q");
  EXPECT_TRUE(ok.ok()) << ok.message;
  // 68 elements (136 bytes) between rows: not a multiple of 16 bytes.
  const Tensor bad = make_tensor(nullptr, DType::bf16, {100, kHeads, kDim}, {68, kDim, 1});
  const Status s = sm90::check_tma_view(bad, "q");
  EXPECT_EQ(s.code, Code::unsupported);
  EXPECT_NE(s.message.find("stride 68 of dimension 0"), std::string::npos) << s.message;
}

// The sm90 tier's own check takes packed calls: whatever it answers (no device without a GPU),
// it does not refuse them for being packed; fp32 storage is still refused, for its own reason.
TEST(PackedArgs, Sm90NoLongerRefusesPackedCalls) {
  PackedCall call({0, 30, 30, 80}, {0, 20, 50, 80}, 80, 80, 50, 50);
  Params& p = call.params;
  p.backend = Backend::cuda_sm90;
  p.q.device = p.k.device = p.v.device = p.o.device = p.lse.device = Device{DeviceType::cuda, 0};
  p.cu_seqlens_q.device = p.cu_seqlens_k.device = Device{DeviceType::cuda, 0};
  for (Direction direction : {Direction::forward, Direction::backward}) {
    const Status s = sm90::supports(p, direction);
    EXPECT_EQ(s.message.find("variable-length"), std::string::npos) << s.message;
  }
  Params fp32 = p;
  fp32.q.dtype = fp32.k.dtype = fp32.v.dtype = fp32.o.dtype = DType::fp32;
  const Status s = sm90::supports(fp32, Direction::forward);
  EXPECT_EQ(s.code, Code::unsupported);
  EXPECT_NE(s.message.find("fp32"), std::string::npos) << s.message;
}
#endif

}  // namespace
}  // namespace fmha::cuda
