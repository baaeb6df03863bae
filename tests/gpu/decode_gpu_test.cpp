// The sm80 decode kernel (calls on a KV cache, and dense decode-shaped ones) against the fp64
// oracle: random block tables (pages shuffled, shared prefixes, last pages partly filled, lengths
// 0 and 1, lengths not a multiple of the page), GQA ratios 1 to 16, 1 to 16 query rows, masks,
// split counts forced from 1 to more than there are key tiles; a device table that breaks its
// promise (read clamped, never outside the cache); the contiguous cache; append_kv on the GPU;
// the workspace rules; and CUDA-graph capture and replay. The tables live in device memory.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/decode.h"
#include "common/paged.h"
#include "common/tolerance.h"
#include "cpu/reference.h"
#include "fmha/tune.h"
#include "gpu_test_util.h"
#include "paged_case.h"

namespace fmha::test {
namespace {

using testing::CacheSpec;
using testing::HostTensor;
using testing::PagedCall;

// The head dim the decode tests run at: 128 where the decode kernel is compiled for it, else the
// first head dim it is compiled for in this build; 0 when none is.
int64_t decode_head_dim() {
  const std::vector<int64_t> dims = decode_head_dims();
  if (std::find(dims.begin(), dims.end(), 128) != dims.end()) return 128;
  return dims.empty() ? 0 : dims.front();
}

#define FMHA_DECODE_PRECONDITIONS()                                                      \
  do {                                                                                   \
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";                          \
    if (device_arch() < 80) GTEST_SKIP() << "the decode kernel needs sm_80 or newer";   \
    if (decode_head_dim() == 0) GTEST_SKIP() << "no decode head dim compiled (FMHA_DECODE_HEAD_DIMS)"; \
  } while (0)

std::vector<uint8_t> bytes_of(const HostTensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.view.data);
  return {p, p + size_t(t.view.numel()) * dtype_size(t.view.dtype)};
}

void copy_into(HostTensor& t, const std::vector<uint8_t>& bytes) { std::memcpy(t.view.data, bytes.data(), bytes.size()); }

Tensor on_device(const HostTensor& host, DeviceBuffer& buffer, Device dev) {
  Tensor t = host.view;
  t.data = buffer.ptr;
  t.device = dev;
  return t;
}

// A paged call's tensors on the GPU (tables in device memory), outputs poisoned.
struct DeviceCall {
  DeviceBuffer q, k, v, o, lse, table, lengths, workspace;
  Params params;

  explicit DeviceCall(const PagedCall& call) {
    const Device dev{DeviceType::cuda, 0};
    auto put = [](DeviceBuffer& b, const HostTensor& t) {
      b = DeviceBuffer(std::max<size_t>(bytes_of(t).size(), 16));
      b.upload(bytes_of(t));
    };
    put(q, call.q);
    put(k, call.k);
    put(v, call.v);
    put(o, call.o);
    put(lse, call.lse);
    put(table, call.block_table);
    put(lengths, call.cache_seqlens);
    o.poison();
    lse.poison();
    params = call.params(Backend::cuda_sm80);
    params.q = on_device(call.q, q, dev);
    params.k = on_device(call.k, k, dev);
    params.v = on_device(call.v, v, dev);
    params.o = on_device(call.o, o, dev);
    params.lse = on_device(call.lse, lse, dev);
    params.block_table = on_device(call.block_table, table, dev);
    params.cache_seqlens = on_device(call.cache_seqlens, lengths, dev);
  }

  // The workspace that workspace_size asks for (none when it asks for none).
  void attach_workspace() {
    size_t bytes = 0;
    throw_if_error(workspace_size(params, Direction::forward, &bytes));
    if (bytes == 0) return;
    workspace = DeviceBuffer(bytes);
    workspace.poison();
    params.workspace = workspace.ptr;
    params.workspace_bytes = bytes;
  }

  void download_into(PagedCall& call) const {
    copy_into(call.o, o.download());
    copy_into(call.lse, lse.download());
  }
};

std::string sync_status() {
  const cudaError_t err = cudaDeviceSynchronize();
  return err == cudaSuccess ? std::string() : std::string("CUDA error: ") + cudaGetErrorString(err);
}

// The oracle on `oracle_call` (host tables), the GPU's o and lse in `gpu_call`, under the paged
// tests' rule (common/tolerance.h).
void expect_matches(const PagedCall& gpu_call, const PagedCall& oracle_call, const std::string& what) {
  const reference::ForwardResult ref = reference::forward(oracle_call.params(Backend::reference), 1);
  const testing::Errors e = testing::compare(gpu_call, ref);
  const double tol = tolerance(gpu_call.spec.dtype, Precision::ieee, Direction::forward);
  EXPECT_LE(e.rel_err, tol) << what;
  EXPECT_LE(e.lse_err, tol) << what;
  EXPECT_TRUE(e.empty_rows_ok) << "rows that see no key must be 0 / -inf; " << what;
}

// How run_and_check lays out the keys: the block table; the contiguous cache [B, capacity, ...]
// over the first B · pages_per_seq pages of the pool with the lengths; or that view as a dense
// call (every sequence all `capacity` keys, no tables).
enum class Layout { paged, contiguous, dense };

Params contiguous_view(Params p, const PagedCall& call, Layout layout) {
  const int64_t capacity = call.pages_per_seq * call.spec.page_size;
  p.block_table = Tensor{};
  if (layout == Layout::dense) p.cache_seqlens = Tensor{};
  for (Tensor* t : {&p.k, &p.v}) {
    t->shape[0] = call.batch;
    t->shape[1] = capacity;
    t->stride[0] = capacity * t->stride[1];
  }
  return p;
}

// Runs `c` on the GPU with `num_splits` (0: the heuristic) in `layout` and checks it against the
// oracle on the same layout.
void run_and_check(CacheSpec c, int num_splits, Layout layout = Layout::paged) {
  const bool contiguous = layout != Layout::paged;
  if (contiguous) {  // enough spare pages that the pool holds batch · pages_per_seq of them
    int64_t pages_per_seq = 0;
    for (int64_t length : c.lengths)
      pages_per_seq = std::max(pages_per_seq, (length + c.page_size - 1) / c.page_size + 1);
    c.spare_pages = int64_t(c.lengths.size()) * pages_per_seq;
  }
  PagedCall call(c);
  // The contiguous view spans batch · pages_per_seq pages of the pool (a paged table may share
  // pages between sequences, so it needs fewer).
  if (contiguous) ASSERT_GE(call.num_pages, call.batch * call.pages_per_seq);
  DeviceCall d(call);
  if (contiguous) d.params = contiguous_view(d.params, call, layout);
  d.params.num_splits = num_splits;
  d.attach_workspace();
  const std::string what =
      testing::describe(c) + " splits " + std::to_string(num_splits) +
      (layout == Layout::contiguous ? " contiguous" : layout == Layout::dense ? " dense" : "");
  const Status s = forward(d.params);
  ASSERT_TRUE(s.ok()) << s.message << "; " << what;
  ASSERT_EQ(sync_status(), "") << what;
  d.download_into(call);
  Params oracle = call.params(Backend::reference);
  if (contiguous) oracle = contiguous_view(oracle, call, layout);
  const reference::ForwardResult ref = reference::forward(oracle, 1);
  const testing::Errors e = testing::compare(call, ref);
  const double tol = tolerance(c.dtype, Precision::ieee, Direction::forward);
  EXPECT_LE(e.rel_err, tol) << what;
  EXPECT_LE(e.lse_err, tol) << what;
  EXPECT_TRUE(e.empty_rows_ok) << "rows that see no key must be 0 / -inf; " << what;
}

TEST(DecodeGpu, RandomTablesAgainstOracle) {
  FMHA_DECODE_PRECONDITIONS();
  std::mt19937_64 rng(test_seed());
  const int64_t page_sizes[] = {16, 64, 256};
  const int64_t groups[] = {1, 2, 4, 8, 16};
  const int64_t seqlens_q[] = {1, 3, 8, 16};
  const int splits[] = {0, 1, 3, 17};
  int cases = 0;
  for (int64_t page : page_sizes)
    for (int64_t group : groups) {
      CacheSpec c;
      c.seed = rng();
      c.page_size = page;
      c.kv_heads = group >= 8 ? 1 : 2;
      c.heads = c.kv_heads * group;
      c.seqlen_q = seqlens_q[cases % 4];
      c.dtype = cases % 2 ? DType::fp16 : DType::bf16;
      c.head_dim = c.head_dim_v = decode_head_dim();
      std::vector<int64_t> lengths = {0, 1, page, 3 * page + 5, 2 * page - 1, 17, 300 + int64_t(rng() % 200)};
      std::shuffle(lengths.begin(), lengths.end(), rng);
      c.lengths = lengths;
      c.shared_prefix_pages = cases % 3 == 0 ? 1 : 0;
      switch (cases % 5) {
        case 0: c.causal = Causal::bottom_right; break;
        case 1: c.causal = Causal::none; break;
        case 2: c.causal = Causal::bottom_right, c.window_left = 37; break;
        case 3: c.causal = Causal::top_left, c.q_offset = 20; break;
        case 4: c.causal = Causal::none, c.window_left = 50, c.window_right = 3, c.q_offset = -4; break;
      }
      run_and_check(c, splits[cases % 4]);
      ++cases;
    }
}

// One long sequence, split from 1 CTA to more CTAs than it has key tiles (empty splits write
// LSE = -inf, which the merge skips); the heuristic's choice too.
TEST(DecodeGpu, SplitCountsFromOneToMany) {
  FMHA_DECODE_PRECONDITIONS();
  CacheSpec c;
  c.page_size = 64;
  c.lengths = {5000, 77};
  c.heads = 16;
  c.kv_heads = 2;
  c.seqlen_q = 4;
  c.dtype = DType::bf16;
  c.head_dim = c.head_dim_v = decode_head_dim();
  // The split merge takes 1, 2, 4 or 8 warps a row as the count grows (1-4, 5-8, 9-16, 17 and up).
  for (int splits : {1, 2, 5, 12, 32, 79, int(decode::kMaxSplits), 0}) run_and_check(c, splits);
  c.causal = Causal::none;
  c.window_left = 700, c.window_right = 0;
  for (int splits : {1, 7, 0}) run_and_check(c, splits);
}

// Every compiled decode head dim: each thread of the kernel copies every (128 / chunks a row)-th
// row of a tile (16 at head dim 64, 8 at 128, 4 at 256) and follows its rows from page to page, so
// pages of 16 keys (a new page for every row of a thread at 64), tiles that start inside a page (a
// window's odd first key) and the contiguous cache, against the oracle.
TEST(DecodeGpu, EveryHeadDimFollowsItsRowsAcrossPages) {
  FMHA_DECODE_PRECONDITIONS();
  for (int64_t head_dim : decode_head_dims())
    for (int64_t page : {int64_t(16), int64_t(64)})
      for (Layout layout : {Layout::paged, Layout::contiguous}) {
        CacheSpec c;
        c.page_size = page;
        c.lengths = {1000, 3 * page + 5, 1};
        c.heads = 8;
        c.kv_heads = 2;
        c.seqlen_q = 2;
        c.dtype = page == 16 ? DType::bf16 : DType::fp16;
        c.head_dim = c.head_dim_v = head_dim;
        c.causal = Causal::bottom_right;
        c.window_left = 301;  // the visible keys start at an odd key, inside a page
        for (int splits : {1, 3, 0}) run_and_check(c, splits, layout);
      }
}

TEST(DecodeGpu, ContiguousCacheWithLengths) {
  FMHA_DECODE_PRECONDITIONS();
  CacheSpec c;
  c.page_size = 256;  // each sequence's capacity is pages_per_seq pages of it
  c.lengths = {0, 1, 300, 511};
  c.heads = 8;
  c.kv_heads = 2;
  c.seqlen_q = 2;
  c.dtype = DType::fp16;
  c.head_dim = c.head_dim_v = decode_head_dim();
  for (int splits : {1, 4}) run_and_check(c, splits, Layout::contiguous);
}

// A dense decode-shaped call (no tables): the decode kernel reads k and v as one page per
// sequence; split too.
TEST(DecodeGpu, DenseCallSplitAcrossCtas) {
  FMHA_DECODE_PRECONDITIONS();
  CacheSpec c;
  c.page_size = 128;
  c.lengths = {0, 200};  // the dense call's seqlen_k is the capacity, 3 pages of 128
  c.heads = 12;
  c.kv_heads = 4;
  c.seqlen_q = 5;
  c.dtype = DType::bf16;
  c.head_dim = c.head_dim_v = decode_head_dim();
  for (Causal causal : {Causal::none, Causal::bottom_right})
    for (int splits : {1, 3, 0}) {
      c.causal = causal;
      run_and_check(c, splits, Layout::dense);
    }
}

// Entries out of the pool and lengths out of range in device memory (unchecked there): the
// kernel clamps them as common/paged.h says, so the result is the oracle's on the clamped table,
// and nothing outside k and v is read (compute-sanitizer shows that).
TEST(DecodeGpu, BrokenDeviceTableIsClamped) {
  FMHA_DECODE_PRECONDITIONS();
  CacheSpec c;
  c.page_size = 16;
  c.lengths = {40, 20, 33};
  c.heads = 8;
  c.kv_heads = 2;
  c.seqlen_q = 2;
  c.dtype = DType::bf16;
  c.head_dim = c.head_dim_v = decode_head_dim();
  PagedCall call(c);
  PagedCall clamped(c);  // the same seed: the same tensors and tables
  int32_t* table = call.table();
  table[0] = -7;
  table[1] = int32_t(call.num_pages) + 100;
  table[call.pages_per_seq] = 1 << 30;
  call.lengths()[1] = 1 << 20;  // past the capacity: every page of the row is read, clamped
  call.lengths()[2] = -3;
  const PagedCache view = PagedCache::of(call.params());
  for (int64_t b = 0; b < call.batch; ++b) {
    clamped.lengths()[b] = int32_t(view.length(b));
    for (int64_t i = 0; i < call.pages_per_seq; ++i)
      clamped.table()[b * call.pages_per_seq + i] = int32_t(view.page(b, i));
  }
  for (int splits : {1, 3}) {
    DeviceCall d(call);
    d.params.num_splits = splits;
    d.attach_workspace();
    const Status s = forward(d.params);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(sync_status(), "");
    d.download_into(clamped);
    expect_matches(clamped, clamped, "clamped table, splits " + std::to_string(splits));
  }
}

// Dense fp16/bf16 forwards with seqlen_q <= 16 run on the decode kernel under auto; the dense
// kernel tests (kernel_test.cpp) cover them under THE RULE too.
TEST(DecodeGpu, AutoTakesTheDecodeKernel) {
  FMHA_DECODE_PRECONDITIONS();
  CacheSpec c;
  c.lengths = {100};
  c.head_dim = c.head_dim_v = decode_head_dim();
  c.dtype = DType::bf16;
  PagedCall call(c);
  DeviceCall d(call);
  d.params.backend = Backend::auto_select;
  Backend chosen{};
  ASSERT_TRUE(select_backend(d.params, Direction::forward, &chosen).ok());
  EXPECT_EQ(chosen, Backend::cuda_sm80);
  Params dense = d.params;
  dense.block_table = dense.cache_seqlens = Tensor{};
  dense.k.shape[0] = dense.v.shape[0] = 1;
  dense.k.shape[1] = dense.v.shape[1] = 32;  // the first 2 pages of the pool as one sequence
  ASSERT_TRUE(select_backend(dense, Direction::forward, &chosen).ok());
  EXPECT_EQ(chosen, Backend::cuda_sm80);
  dense.q.shape[1] = 17;  // no longer decoding: not the decode kernel's call
  dense.o.shape[1] = 17;
  dense.lse = Tensor{};
  VariantChoice choice;
  ASSERT_TRUE(select_backend(dense, Direction::forward, &chosen).ok());
  if (chosen == Backend::cuda_sm80) {
    ASSERT_TRUE(selected_variant(dense, Direction::forward, &choice).ok());
    EXPECT_NE(choice.variant, "decode");
  }
}

// The workspace: its size covers the split partials; a forced split count without it is refused
// (nothing written); the heuristic without it runs unsplit; fp32 caches stay on the CPU.
TEST(DecodeGpu, WorkspaceAndRefusals) {
  FMHA_DECODE_PRECONDITIONS();
  CacheSpec c;
  c.page_size = 64;
  c.lengths = {4000};
  c.heads = 8;
  c.kv_heads = 8;
  c.head_dim = c.head_dim_v = decode_head_dim();
  c.dtype = DType::bf16;
  PagedCall call(c);
  DeviceCall d(call);
  size_t bytes = 0;
  ASSERT_TRUE(workspace_size(d.params, Direction::forward, &bytes).ok());
  EXPECT_GT(bytes, 0u) << "one long sequence on 8 CTAs should be split";
  d.params.num_splits = 4;
  const Status refused = forward(d.params);
  EXPECT_EQ(refused.code, Code::invalid_argument);
  EXPECT_EQ(refused.message.rfind("workspace", 0), 0u) << refused.message;
  d.params.num_splits = 0;
  ASSERT_TRUE(forward(d.params).ok());  // no workspace: unsplit
  ASSERT_EQ(sync_status(), "");
  d.download_into(call);
  expect_matches(call, call, "unsplit without workspace");

  CacheSpec f = c;
  f.dtype = DType::fp32;
  PagedCall fp32_call(f);
  DeviceCall fd(fp32_call);
  fd.params.backend = Backend::auto_select;
  const Status s = supports(fd.params, Direction::forward);
  EXPECT_EQ(s.code, Code::unsupported);
  EXPECT_NE(s.message.find("fp16 and bf16"), std::string::npos) << s.message;
}

TEST(DecodeGpu, AppendKvOnDevice) {
  FMHA_DECODE_PRECONDITIONS();
  CacheSpec c;
  c.page_size = 16;
  c.lengths = {15, 0, 40};
  c.dtype = DType::bf16;
  PagedCall call(c);
  const int64_t seqlen_new = 3;
  // Each sequence's next page: the table has one spare entry per row; give it a spare page.
  for (int64_t b = 0; b < call.batch; ++b) {
    const int64_t last = (c.lengths[size_t(b)] + seqlen_new - 1) / c.page_size;
    if (call.table()[b * call.pages_per_seq + last] < 0)
      call.table()[b * call.pages_per_seq + last] = int32_t(call.num_pages - 1 - b);
  }
  std::mt19937_64 rng(7);
  HostTensor k_new(c.dtype, {call.batch, seqlen_new, c.kv_heads, c.head_dim});
  HostTensor v_new(c.dtype, {call.batch, seqlen_new, c.kv_heads, c.head_dim_v});
  k_new.randomize(rng);
  v_new.randomize(rng);
  DeviceCall d(call);
  DeviceBuffer dk_new(bytes_of(k_new).size()), dv_new(bytes_of(v_new).size());
  dk_new.upload(bytes_of(k_new));
  dv_new.upload(bytes_of(v_new));
  Params p = d.params;
  p.k_new = on_device(k_new, dk_new, p.k.device);
  p.v_new = on_device(v_new, dv_new, p.k.device);
  const Status s = append_kv(p);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(sync_status(), "");
  Params host = call.params();
  host.k_new = k_new.view, host.v_new = v_new.view;
  ASSERT_TRUE(append_kv(host).ok());
  EXPECT_EQ(d.k.download(), bytes_of(call.k));
  EXPECT_EQ(d.v.download(), bytes_of(call.v));
}

// The call captured into a CUDA graph (no allocation, no host synchronisation inside it) and
// replayed: the split partials and their merge run from the caller's workspace.
TEST(DecodeGpu, CudaGraphCaptureAndReplay) {
  FMHA_DECODE_PRECONDITIONS();
  CacheSpec c;
  c.page_size = 64;
  c.lengths = {3000, 10};
  c.heads = 16;
  c.kv_heads = 2;
  c.head_dim = c.head_dim_v = decode_head_dim();
  c.dtype = DType::fp16;
  PagedCall call(c);
  DeviceCall d(call);
  d.params.num_splits = 6;
  d.attach_workspace();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  d.params.stream = stream;
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status s = forward(d.params);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(s.ok()) << s.message;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    d.o.poison();
    d.lse.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    d.download_into(call);
    expect_matches(call, call, "graph replay " + std::to_string(replay));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace fmha::test
