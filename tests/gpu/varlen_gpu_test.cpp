// Variable-length (packed) calls on the simt, sm80 and sm90 tiers, with the sequence tables in
// device memory: every sequence against the fp64 oracle under the rule of gpu_test_util.h (mixed
// lengths with 0 and 1, one sequence, 1,000 short ones, both causal alignments, windows,
// q_offset, GQA/MQA, Dv != D, negative softmax scales, every dtype, forward and backward, atomic
// and deterministic dQ); tables that break the caller's promise, which must neither fault nor
// write outside the tensors; the backward workspace's size; and `auto`'s choice of tier for packed
// calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/precision.h"
#include "gpu_test_util.h"

namespace fmha::test {
namespace {

bool compiled(Backend b) {
  const auto all = compiled_backends();
  return std::find(all.begin(), all.end(), b) != all.end();
}

bool tier_available(Backend b) {
  if (!compiled(b)) return false;
  if (b == Backend::cuda_sm80) return device_arch() >= 80;
  if (b == Backend::cuda_sm90) return device_arch() == 90;
  return true;
}

Device current_device() {
  int ordinal = 0;
  cudaGetDevice(&ordinal);
  return Device{DeviceType::cuda, ordinal};
}

std::vector<int> compiled_head_dims() {
  std::vector<int> dims;
  std::stringstream in(FMHA_TEST_HEAD_DIMS);
  for (std::string item; std::getline(in, item, ',');) dims.push_back(std::stoi(item));
  return dims;
}
bool has_head_dim(int dim) {
  const std::vector<int> dims = compiled_head_dims();
  return std::find(dims.begin(), dims.end(), dim) != dims.end();
}

// The compiled head dim the cases run at: 64 where it is compiled.
int main_head_dim() { return has_head_dim(64) ? 64 : compiled_head_dims().back(); }

struct Flavor {
  Backend backend;
  DType dtype;
  Precision precision;
};
const Flavor kFlavors[] = {{Backend::cuda_simt, DType::fp32, Precision::ieee},
                           {Backend::cuda_sm80, DType::fp16, Precision::ieee},
                           {Backend::cuda_sm80, DType::bf16, Precision::ieee},
                           {Backend::cuda_sm80, DType::fp32, Precision::tf32},
                           {Backend::cuda_sm90, DType::fp16, Precision::ieee},
                           {Backend::cuda_sm90, DType::bf16, Precision::ieee},
                           {Backend::cuda_sm80, DType::fp32, Precision::tf32x3},
                           {Backend::cuda_sm90, DType::fp32, Precision::tf32},
                           {Backend::cuda_sm90, DType::fp32, Precision::tf32x3}};

// The sm90 tf32 tier (fp32 storage): head dims 64 to 128 (split tf32: 64), forward and backward.
bool sm90_tf32(Backend backend, DType dtype) { return backend == Backend::cuda_sm90 && dtype == DType::fp32; }
int64_t sm90_fp32_max_head_dim(Precision precision) { return precision == Precision::tf32x3 ? 64 : 128; }

// Lengths 0 and 1 on either side, queries longer and shorter than keys, tiles split unevenly.
const std::vector<int64_t> kMixedQ = {37, 0, 1, 130, 64, 5, 1, 90};
const std::vector<int64_t> kMixedK = {50, 9, 1, 130, 0, 77, 1, 20};

// 33 sequences of lengths 0 ... 80, more sequences than a grid row has tiles.
std::vector<int64_t> many_lengths(int64_t salt) {
  std::vector<int64_t> out;
  for (int64_t b = 0; b < 33; ++b) out.push_back((b * 37 + salt * 11) % 81);
  return out;
}

std::vector<VarlenCase> all_cases() {
  std::vector<VarlenCase> out;
  const int64_t dim = main_head_dim();
  for (const Flavor& f : kFlavors) {
    if (sm90_tf32(f.backend, f.dtype) && (dim < 64 || dim > sm90_fp32_max_head_dim(f.precision))) continue;
    VarlenCase base;
    base.base.backend = f.backend;
    base.base.dtype = f.dtype;
    base.base.precision = f.precision;
    base.base.heads = base.base.kv_heads = 2;
    base.base.head_dim = base.base.head_dim_v = dim;
    base.seqlens_q = kMixedQ;
    base.seqlens_k = kMixedK;
    out.push_back(base);
    for (Causal causal : {Causal::top_left, Causal::bottom_right}) {
      VarlenCase c = base;
      c.base.causal = causal;
      out.push_back(c);
    }
    {  // sliding window, both sides bounded
      VarlenCase c = base;
      c.base.window_left = 16;
      c.base.window_right = 8;
      out.push_back(c);
    }
    {  // causal with a window and a negative q_offset: rows before each sequence's first key
      VarlenCase c = base;
      c.base.causal = Causal::bottom_right;
      c.base.window_left = 24;
      c.base.q_offset = -5;
      out.push_back(c);
    }
    {  // GQA 3:1, causal
      VarlenCase c = base;
      c.base.heads = 6;
      c.base.kv_heads = 2;
      c.base.causal = Causal::top_left;
      out.push_back(c);
    }
    {  // MQA, Dv = D / 2, no LSE requested by the forward
      VarlenCase c = base;
      c.base.heads = 4;
      c.base.kv_heads = 1;
      c.base.head_dim_v = dim / 2;
      c.base.with_lse = false;
      out.push_back(c);
    }
    {  // many sequences, and max_seqlen above the longest: tiles past every sequence exit
      VarlenCase c = base;
      c.seqlens_q = many_lengths(1);
      c.seqlens_k = many_lengths(2);
      c.extra_max = 40;
      c.base.causal = Causal::bottom_right;
      out.push_back(c);
    }
    {  // a single sequence
      VarlenCase c = base;
      c.seqlens_q = {200};
      c.seqlens_k = {333};
      c.base.causal = Causal::bottom_right;
      out.push_back(c);
    }
    {  // 1,000 short sequences (lengths 0 ... 8), GQA
      VarlenCase c = base;
      c.seqlens_q.clear();
      c.seqlens_k.clear();
      for (int64_t b = 0; b < 1000; ++b) {
        c.seqlens_q.push_back((b * 7) % 9);
        c.seqlens_k.push_back((b * 5 + 3) % 9);
      }
      c.base.heads = 4;
      c.base.causal = Causal::top_left;
      out.push_back(c);
    }
    {  // deterministic backward (the dQ kernel over query tiles; sm90: dQ added in key-tile order)
      VarlenCase c = base;
      c.base.deterministic = true;
      c.base.causal = Causal::bottom_right;
      out.push_back(c);
    }
    {  // a negative softmax scale under a causal mask and ragged ends: masked scores must stay
       // hidden once multiplied by it (-inf · scale is +inf)
      VarlenCase c = base;
      c.base.causal = Causal::bottom_right;
      c.base.softmax_scale = -0.125f;
      out.push_back(c);
    }
    if (f.backend == Backend::cuda_sm90) {
      {  // sequences of whole and partial 64-row boxes, past several query and key tiles: the
         // sm90 forward's TMA stores of full boxes beside its bounded stores of a sequence's tail
        VarlenCase c = base;
        c.seqlens_q = {64, 128, 65, 63, 257, 192, 1, 384};
        c.seqlens_k = {64, 300, 129, 1, 257, 64, 500, 130};
        out.push_back(c);
        c.base.causal = Causal::top_left;
        c.base.heads = 4;
        c.base.kv_heads = 2;
        out.push_back(c);
      }
      const bool takes_128 = !sm90_tf32(f.backend, f.dtype) || sm90_fp32_max_head_dim(f.precision) >= 128;
      if (has_head_dim(128) && dim != 128 && takes_128) {  // head dim 128 (the pingpong variant at both head dims)
        VarlenCase c = base;
        c.base.head_dim = c.base.head_dim_v = 128;
        c.base.causal = Causal::bottom_right;
        out.push_back(c);
        c.base.softmax_scale = -0.125f;  // and a negative scale (tf32: the wide backward's packed kernel)
        out.push_back(c);
      }
      // Head dims 192 and 256: the backward's split kernel (64-key tiles) on packed sequences,
      // causal, windowed with rows that see nothing, GQA with Dv != D, deterministic.
      for (int64_t big : {int64_t(192), int64_t(256)}) {
        if (!has_head_dim(int(big)) || dim == big || sm90_tf32(f.backend, f.dtype)) continue;  // tf32: up to 128
        VarlenCase c = base;
        c.base.head_dim = c.base.head_dim_v = big;
        c.seqlens_q = {64, 128, 65, 63, 257, 0, 1, 130};
        c.seqlens_k = {64, 300, 129, 1, 257, 9, 500, 0};
        c.base.causal = Causal::bottom_right;
        out.push_back(c);
        c.base.causal = Causal::top_left, c.base.window_left = 24, c.base.q_offset = -5;
        out.push_back(c);
        c.base.causal = Causal::none, c.base.window_left = -1, c.base.q_offset = 0;
        c.base.heads = 4, c.base.kv_heads = 2, c.base.head_dim_v = big / 2;
        out.push_back(c);
        c.base.head_dim_v = big, c.base.deterministic = true, c.base.causal = Causal::bottom_right;
        out.push_back(c);
        c.base.deterministic = false, c.base.softmax_scale = -0.0625f;  // a negative scale
        out.push_back(c);
      }
    }
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<VarlenCase>& info) { return info.param.name(); }

class VarlenKernel : public ::testing::TestWithParam<VarlenCase> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
    if (!tier_available(GetParam().base.backend)) GTEST_SKIP() << "tier not compiled or not runnable on this GPU";
  }
};

TEST_P(VarlenKernel, Forward) {
  const uint64_t seed = test_seed();
  const std::string err = check_varlen_forward(GetParam(), seed);
  EXPECT_TRUE(err.empty()) << "seed " << seed << "\n" << err;
}

TEST_P(VarlenKernel, Backward) {
  const uint64_t seed = test_seed();
  const std::string err = check_varlen_backward(GetParam(), seed);
  EXPECT_TRUE(err.empty()) << "seed " << seed << "\n" << err;
}

INSTANTIATE_TEST_SUITE_P(Tiers, VarlenKernel, ::testing::ValuesIn(all_cases()), case_name);

// A device allocation with guard bytes on both sides: a kernel that writes outside the view it
// was given changes them.
struct Guarded {
  static constexpr size_t kGuard = 512;  // bytes on each side; keeps the view 256-byte aligned
  static constexpr int kPattern = 0x5A;
  DeviceBuffer buffer;
  size_t bytes = 0;
  explicit Guarded(size_t n) : buffer(n + 2 * kGuard), bytes(n) {
    EXPECT_EQ(cudaMemset(buffer.ptr, kPattern, n + 2 * kGuard), cudaSuccess);
  }
  void* view() const { return static_cast<char*>(buffer.ptr) + kGuard; }
  // Empty when both guards still hold the pattern.
  std::string check(const char* name) const {
    const std::vector<uint8_t> all = buffer.download();
    for (size_t i = 0; i < all.size(); ++i) {
      if (i >= kGuard && i < kGuard + bytes) continue;
      if (all[i] != kPattern)
        return std::string(name) + ": byte " + std::to_string(i < kGuard ? int64_t(i) - int64_t(kGuard)
                                                                          : int64_t(i - kGuard - bytes)) +
               (i < kGuard ? " before" : " after") + " the tensor was written\n";
    }
    return "";
  }
};

// Tables that break every promise (decreasing, negative, past the packed tensors, INT32_MAX;
// max_seqlen above and below the real lengths): the call is the caller's error, but it must
// return, leave the device usable and write nothing outside its tensors and workspace.
TEST(Varlen, BrokenDeviceTablesStayInBounds) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kTotalQ = 48, kTotalK = 40, kHeads = 2;
  const int64_t dim = main_head_dim();
  const Device gpu = current_device();
  const std::vector<int32_t> cu_q = {7, 30, 10, INT32_MAX, -5, 48, 3};
  const std::vector<int32_t> cu_k = {-3, 12, INT32_MAX, 5, 40, 2, 41};
  const int64_t entries = int64_t(cu_q.size());
  DeviceBuffer tables(2 * cu_q.size() * sizeof(int32_t));
  std::vector<uint8_t> table_bytes(2 * cu_q.size() * sizeof(int32_t));
  std::memcpy(table_bytes.data(), cu_q.data(), cu_q.size() * sizeof(int32_t));
  std::memcpy(table_bytes.data() + cu_q.size() * sizeof(int32_t), cu_k.data(), cu_k.size() * sizeof(int32_t));
  tables.upload(table_bytes);

  for (const Flavor& f : {kFlavors[0], kFlavors[2], kFlavors[5]}) {
    if (!tier_available(f.backend)) continue;
    for (int64_t max_seqlen : {int64_t(16), int64_t(100)}) {
      for (bool deterministic : {false, true}) {
        SCOPED_TRACE(std::string(to_string(f.backend)) + " " + to_string(f.dtype) + " max_seqlen " +
                     std::to_string(max_seqlen) + (deterministic ? " deterministic" : ""));
        const size_t elem = dtype_size(f.dtype);
        const size_t q_bytes = size_t(kTotalQ * kHeads * dim) * elem, k_bytes = size_t(kTotalK * kHeads * dim) * elem;
        Guarded q(q_bytes), k(k_bytes), v(k_bytes), o(q_bytes), lse(size_t(kHeads * kTotalQ) * sizeof(float));
        Guarded dout(q_bytes), dq(q_bytes), dk(k_bytes), dv(k_bytes);
        Params p;
        p.q = make_tensor(q.view(), f.dtype, {kTotalQ, kHeads, dim}, gpu);
        p.k = make_tensor(k.view(), f.dtype, {kTotalK, kHeads, dim}, gpu);
        p.v = make_tensor(v.view(), f.dtype, {kTotalK, kHeads, dim}, gpu);
        p.o = make_tensor(o.view(), f.dtype, {kTotalQ, kHeads, dim}, gpu);
        p.lse = make_tensor(lse.view(), DType::fp32, {kHeads, kTotalQ}, gpu);
        p.cu_seqlens_q = make_tensor(tables.ptr, DType::int32, {entries}, gpu);
        p.cu_seqlens_k = make_tensor(static_cast<int32_t*>(tables.ptr) + entries, DType::int32, {entries}, gpu);
        p.max_seqlen_q = p.max_seqlen_k = max_seqlen;
        p.causal = Causal::bottom_right;
        p.backend = f.backend;
        p.precision = f.precision;
        p.deterministic = deterministic;
        // The inputs hold the guard pattern: finite values in every dtype.
        Status s = forward(p);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

        p.dout = make_tensor(dout.view(), f.dtype, {kTotalQ, kHeads, dim}, gpu);
        p.dq = make_tensor(dq.view(), f.dtype, {kTotalQ, kHeads, dim}, gpu);
        p.dk = make_tensor(dk.view(), f.dtype, {kTotalK, kHeads, dim}, gpu);
        p.dv = make_tensor(dv.view(), f.dtype, {kTotalK, kHeads, dim}, gpu);
        size_t bytes = 0;
        ASSERT_TRUE(workspace_size(p, Direction::backward, &bytes).ok());
        Guarded workspace(bytes);
        p.workspace = workspace.view();
        p.workspace_bytes = bytes;
        s = backward(p);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::string err;
        for (const auto& [name, g] : {std::pair<const char*, const Guarded*>{"q", &q}, {"k", &k}, {"v", &v},
                                      {"o", &o}, {"lse", &lse}, {"dout", &dout}, {"dq", &dq}, {"dk", &dk},
                                      {"dv", &dv}, {"workspace", &workspace}})
          err += g->check(name);
        EXPECT_TRUE(err.empty()) << err;
      }
    }
  }
}

// The packed backward's workspace has one entry per (query row, head) of the packed tensors, like
// a dense call over the same rows, not batch · max_seqlen_q of them.
TEST(Varlen, WorkspaceFollowsTotalRows) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = current_device();
  constexpr int64_t kHeads = 3, kLongest = 200, kBatch = 4, kTotal = kLongest + kBatch - 1;  // lengths 1, 1, 1, 200
  const int64_t dim = main_head_dim();
  DeviceBuffer unread(256);  // workspace_size reads shapes only: every view may share one address
  void* data = unread.ptr;
  DeviceBuffer tables(2 * (kBatch + 1) * sizeof(int32_t));
  for (bool deterministic : {false, true}) {
    Params packed;
    packed.q = make_tensor(data, DType::fp32, {kTotal, kHeads, dim}, gpu);
    packed.k = packed.v = packed.q;
    packed.o = packed.dout = packed.dq = packed.dk = packed.dv = packed.q;
    packed.lse = make_tensor(data, DType::fp32, {kHeads, kTotal}, gpu);
    packed.cu_seqlens_q = make_tensor(tables.ptr, DType::int32, {kBatch + 1}, gpu);
    packed.cu_seqlens_k = make_tensor(static_cast<int32_t*>(tables.ptr) + kBatch + 1, DType::int32, {kBatch + 1}, gpu);
    packed.max_seqlen_q = packed.max_seqlen_k = kLongest;
    packed.deterministic = deterministic;
    Params rows;  // the same rows as one dense sequence
    rows.q = make_tensor(data, DType::fp32, {1, kTotal, kHeads, dim}, gpu);
    rows.k = rows.v = rows.o = rows.dout = rows.dq = rows.dk = rows.dv = rows.q;
    rows.lse = make_tensor(data, DType::fp32, {1, kHeads, kTotal}, gpu);
    rows.deterministic = deterministic;
    Params padded = rows;  // every sequence padded to the longest
    padded.q = make_tensor(data, DType::fp32, {kBatch, kLongest, kHeads, dim}, gpu);
    padded.k = padded.v = padded.o = padded.dout = padded.dq = padded.dk = padded.dv = padded.q;
    padded.lse = make_tensor(data, DType::fp32, {kBatch, kHeads, kLongest}, gpu);
    size_t packed_bytes = 0, rows_bytes = 0, padded_bytes = 0;
    Status s = workspace_size(packed, Direction::backward, &packed_bytes);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_TRUE(workspace_size(rows, Direction::backward, &rows_bytes).ok());
    ASSERT_TRUE(workspace_size(padded, Direction::backward, &padded_bytes).ok());
    EXPECT_EQ(packed_bytes, rows_bytes);
    EXPECT_LT(packed_bytes, padded_bytes);
    EXPECT_GE(packed_bytes, size_t(kTotal * kHeads) * 2 * sizeof(float));
  }
}

// `auto` picks a packed call's tier as it picks a dense one's: sm90 for fp16 and bf16 on an
// sm_90 device where it is compiled (which supports() then confirms), else sm80; for fp32 simt, or
// split tf32 where common/precision.h's rule has it meet exact fp32 (the sm90 tier refuses fp32
// storage at ieee and says why). The call then runs.
TEST(Varlen, AutoPicksTheTierOfTheDenseCall) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kTotal = 80, kHeads = 2, kDim = 64;
  const Device gpu = current_device();
  const std::vector<int32_t> table = {0, 30, 30, 80};
  DeviceBuffer tables(2 * table.size() * sizeof(int32_t));
  std::vector<uint8_t> table_bytes(2 * table.size() * sizeof(int32_t));
  std::memcpy(table_bytes.data(), table.data(), table.size() * sizeof(int32_t));
  std::memcpy(table_bytes.data() + table.size() * sizeof(int32_t), table.data(), table.size() * sizeof(int32_t));
  tables.upload(table_bytes);
  for (DType dtype : {DType::bf16, DType::fp16, DType::fp32}) {
    SCOPED_TRACE(to_string(dtype));
    const size_t bytes = size_t(kTotal * kHeads * kDim) * dtype_size(dtype);
    DeviceBuffer buffer(4 * bytes + 4096);
    char* base = static_cast<char*>(buffer.ptr);
    Params p;
    p.q = make_tensor(base, dtype, {kTotal, kHeads, kDim}, gpu);
    p.k = make_tensor(base + bytes, dtype, {kTotal, kHeads, kDim}, gpu);
    p.v = make_tensor(base + 2 * bytes, dtype, {kTotal, kHeads, kDim}, gpu);
    p.o = make_tensor(base + 3 * bytes, dtype, {kTotal, kHeads, kDim}, gpu);
    ASSERT_EQ(cudaMemset(base, 0, 3 * bytes), cudaSuccess);
    p.cu_seqlens_q = make_tensor(tables.ptr, DType::int32, {int64_t(table.size())}, gpu);
    p.cu_seqlens_k = make_tensor(static_cast<int32_t*>(tables.ptr) + table.size(), DType::int32,
                                 {int64_t(table.size())}, gpu);
    p.max_seqlen_q = p.max_seqlen_k = 50;
    const bool sm90 = tier_available(Backend::cuda_sm90);
    if (sm90) {
      p.backend = Backend::cuda_sm90;
      const Status s = supports(p, Direction::forward);
      if (dtype == DType::fp32) {
        EXPECT_EQ(s.code, Code::unsupported) << s.message;
        EXPECT_NE(s.message.find("fp32"), std::string::npos) << s.message;
      } else {
        EXPECT_TRUE(s.ok()) << s.message;  // the backward's packed calls: the VarlenKernel sm90 cases
      }
    }
    p.backend = Backend::auto_select;
    Backend expected = dtype == DType::fp32 ? Backend::cuda_simt : (sm90 ? Backend::cuda_sm90 : Backend::cuda_sm80);
    if (split_tf32_meets_ieee(p, Direction::forward, device_arch())) {
      // fp32 where split tf32 meets exact fp32 (common/precision.h): the first tensor-core tier
      // that takes the call at tf32x3.
      for (Backend tier : {Backend::cuda_sm90, Backend::cuda_sm80}) {
        Params split = p;
        split.backend = tier;
        split.precision = Precision::tf32x3;
        if (tier_available(tier) && supports(split, Direction::forward).ok()) {
          expected = tier;
          break;
        }
      }
    }
    if (!tier_available(expected)) continue;
    Backend chosen = Backend::auto_select;
    const Status sel = select_backend(p, Direction::forward, &chosen);
    ASSERT_TRUE(sel.ok()) << sel.message;
    EXPECT_EQ(chosen, expected) << to_string(chosen);
    const Status s = forward(p);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
}

}  // namespace
}  // namespace fmha::test
