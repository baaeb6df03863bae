// A paged KV cache (decoding): the cpu and reference backends against the fp64 oracle on random
// block tables (pages shuffled, shared prefixes, last pages partly filled, lengths 0 and 1), GQA
// ratios 1 to 16, 1 to 16 query rows, windows and query offsets; the oracle on the paged cache
// against the oracle on the same keys stored densely; the paged call against the dense call; a
// long single sequence whose keys are split between threads; the contiguous cache; append_kv;
// and bad input refused with an error that names the argument, writing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/paged.h"
#include "common/tolerance.h"
#include "cpu/reference.h"
#include "paged_case.h"
#include "test_util.h"

namespace fmha {
namespace {

using testing::HostTensor;

using testing::CacheSpec;
using testing::compare;
using testing::describe;
using testing::Errors;
using testing::PagedCall;

// Runs the call on `backend` (poisoned outputs first) and checks it against the oracle.
void run_and_check(const CacheSpec& c, Backend backend, int threads = 0) {
  PagedCall call(c);
  std::memset(call.o.view.data, 0xff, call.o.storage.size() * 4);
  std::memset(call.lse.view.data, 0xff, call.lse.storage.size() * 4);
  Params p = call.params(backend);
  p.num_threads = threads;
  const Status s = forward(p);
  ASSERT_TRUE(s.ok()) << s.message << "\n  " << describe(c);
  const reference::ForwardResult ref = reference::forward(call.params(Backend::reference), 1);
  const Errors e = compare(call, ref);
  const double tol = tolerance(c.dtype, Precision::ieee, Direction::forward);
  EXPECT_LE(e.rel_err, tol) << to_string(backend) << ": " << describe(c);
  EXPECT_LE(e.lse_err, tol) << to_string(backend) << ": " << describe(c);
  EXPECT_TRUE(e.empty_rows_ok) << to_string(backend) << ": rows that see no key must be 0 / -inf; " << describe(c);
}

TEST(PagedForward, RandomTablesAgainstOracle) {
  std::mt19937_64 rng(2026);
  const int64_t page_sizes[] = {16, 32, 64, 256};
  const int64_t groups[] = {1, 2, 4, 8, 16};
  const int64_t seqlens_q[] = {1, 2, 5, 16};
  const DType dtypes[] = {DType::fp32, DType::bf16, DType::fp16};
  int cases = 0;
  for (int64_t page : page_sizes)
    for (int64_t group : groups) {
      CacheSpec c;
      c.seed = rng();
      c.page_size = page;
      c.kv_heads = group >= 8 ? 1 : 2;
      c.heads = c.kv_heads * group;
      c.seqlen_q = seqlens_q[cases % 4];
      c.dtype = dtypes[cases % 3];
      c.head_dim = cases % 2 ? 64 : 40;
      c.head_dim_v = cases % 3 ? c.head_dim : 24;
      // Lengths 0 and 1, multiples of the page and not, a long one; the order varies.
      std::vector<int64_t> lengths = {0, 1, page, 3 * page + 5, 2 * page - 1, 17, 300 + int64_t(rng() % 200)};
      std::shuffle(lengths.begin(), lengths.end(), rng);
      c.lengths = lengths;
      switch (cases % 5) {
        case 0: c.causal = Causal::bottom_right; break;
        case 1: c.causal = Causal::none; break;
        case 2: c.causal = Causal::bottom_right, c.window_left = 37; break;
        case 3: c.causal = Causal::top_left, c.q_offset = 20; break;
        case 4: c.causal = Causal::none, c.window_left = 50, c.window_right = 3, c.q_offset = -4; break;
      }
      for (Backend backend : {Backend::cpu, Backend::reference}) run_and_check(c, backend);
      ++cases;
    }
}

// The CPU path keeps its scratch buffers per thread from call to call, and its few-row forward
// zeroes only the rows its matmuls use. A call whose queries are NaN leaves NaN in them; the next
// call on the same thread (one thread: the caller's) must not see it. Would fail if the rows it
// uses were not zeroed (a rescale by 0 of a NaN left by the previous call stays NaN).
TEST(PagedForward, ACallAfterOneWithNaNQueriesOnTheSameThread) {
  for (DType dtype : {DType::fp32, DType::bf16}) {
    CacheSpec c;
    c.dtype = dtype;
    c.heads = 8;  // four query heads a KV head, one query row: the few-row forward
    c.head_dim = c.head_dim_v = 64;
    c.page_size = 64;
    c.lengths = {300, 130};
    PagedCall poisoned(c);
    poisoned.q.fill(std::nanf(""));
    Params p = poisoned.params(Backend::cpu);
    p.num_threads = 1;
    ASSERT_TRUE(forward(p).ok());
    c.seed = 2;
    run_and_check(c, Backend::cpu, 1);
  }
}

TEST(PagedForward, SharedPrefixPages) {
  CacheSpec c;
  c.page_size = 16;
  c.lengths = {70, 90, 64, 33};
  c.shared_prefix_pages = 2;  // the first 32 keys of every sequence are sequence 0's
  c.seqlen_q = 4;
  c.heads = 8;
  c.kv_heads = 2;
  run_and_check(c, Backend::cpu);
  c.dtype = DType::bf16;
  run_and_check(c, Backend::cpu);
}

// One sequence with a long cache: the keys are split into pieces that run on every thread and are
// merged; the result does not depend on the thread count beyond rounding, nor on the page order.
TEST(PagedForward, LongSequenceSplitAcrossThreads) {
  CacheSpec c;
  c.page_size = 64;
  c.lengths = {5000};
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = c.head_dim_v = 64;
  for (bool shuffle : {true, false}) {
    c.shuffle = shuffle;
    for (int threads : {1, 4}) run_and_check(c, Backend::cpu, threads);
  }
}

// More pieces than one wave of partial results holds (src/cpu/paged.cpp keeps 64 MiB of them: here
// 1 MiB per piece, about 80 pieces of one shuffled page each): the waves' merges chain correctly.
TEST(PagedForward, ManyPiecesRunInWaves) {
  CacheSpec c;
  c.page_size = 16;
  c.lengths = {1300};
  c.seqlen_q = 16;
  c.heads = 64;
  c.kv_heads = 4;
  c.head_dim = 16;
  c.head_dim_v = 256;
  c.causal = Causal::none;
  run_and_check(c, Backend::cpu);
}

// The oracle reads a paged cache exactly as it reads the same keys stored densely, and the cpu
// backend's paged call agrees with its dense call within the rule.
TEST(PagedForward, MatchesTheDenseCall) {
  CacheSpec c;
  c.page_size = 32;
  c.lengths = {100, 0, 1, 257};
  c.seqlen_q = 3;
  c.heads = 6;
  c.kv_heads = 3;
  c.causal = Causal::bottom_right;
  c.window_left = 60;
  PagedCall call(c);
  ASSERT_TRUE(forward(call.params()).ok());
  const reference::ForwardResult paged_ref = reference::forward(call.params(Backend::reference), 1);
  for (int64_t b = 0; b < call.batch; ++b) {
    HostTensor k = call.dense(call.k, b, c.head_dim), v = call.dense(call.v, b, c.head_dim_v);
    HostTensor o(c.dtype, {1, c.seqlen_q, c.heads, c.head_dim_v}), lse(DType::fp32, {1, c.heads, c.seqlen_q});
    Params p;
    p.q = call.q.view;
    p.q.shape[0] = 1;
    p.q.data = static_cast<float*>(call.q.view.data) + b * call.q.view.stride[0];
    p.k = k.view, p.v = v.view, p.o = o.view, p.lse = lse.view;
    p.causal = c.causal, p.window_left = c.window_left;
    ASSERT_TRUE(forward(p).ok());
    const reference::ForwardResult dense_ref = reference::forward(p, 1);
    const int64_t rows = c.seqlen_q * c.heads;
    for (int64_t i = 0; i < rows * c.head_dim_v; ++i) {
      ASSERT_EQ(dense_ref.o[size_t(i)], paged_ref.o[size_t(b * rows * c.head_dim_v + i)]) << "sequence " << b;
      EXPECT_NEAR(o.at(i), call.o.at(b * rows * c.head_dim_v + i), 1e-5) << "sequence " << b << " element " << i;
    }
    for (int64_t i = 0; i < rows; ++i) {
      ASSERT_EQ(dense_ref.lse[size_t(i)], paged_ref.lse[size_t(b * rows + i)]) << "sequence " << b;
      const float a = lse.at(i), x = call.lse.at(b * rows + i);
      if (std::isinf(a)) EXPECT_EQ(a, x);
      else EXPECT_NEAR(a, x, 1e-5);
    }
  }
}

// Without a block table: a contiguous cache [batch, capacity, ...] with per-sequence lengths.
TEST(PagedForward, ContiguousCacheWithLengths) {
  const int64_t batch = 3, capacity = 100, heads = 4, kv_heads = 1, dim = 32, seqlen_q = 2;
  std::mt19937_64 rng(5);
  HostTensor q(DType::fp32, {batch, seqlen_q, heads, dim}), k(DType::fp32, {batch, capacity, kv_heads, dim}),
      v(DType::fp32, {batch, capacity, kv_heads, dim}), o(DType::fp32, {batch, seqlen_q, heads, dim}),
      lse(DType::fp32, {batch, heads, seqlen_q}), lengths(DType::int32, {batch});
  q.randomize(rng), k.randomize(rng), v.randomize(rng);
  const int32_t cache_lengths[] = {100, 0, 37};
  std::memcpy(lengths.view.data, cache_lengths, sizeof(cache_lengths));
  Params p;
  p.q = q.view, p.k = k.view, p.v = v.view, p.o = o.view, p.lse = lse.view, p.cache_seqlens = lengths.view;
  p.causal = Causal::bottom_right;
  ASSERT_TRUE(forward(p).ok());
  for (int64_t b = 0; b < batch; ++b) {
    // The dense call on the first cache_seqlens[b] rows of sequence b.
    Params d = p;
    d.cache_seqlens = Tensor{};
    auto narrow = [&](Tensor t, int64_t rows) {
      t.data = static_cast<float*>(t.data) + b * t.stride[0];
      t.shape[0] = 1;
      if (rows >= 0) t.shape[1] = rows;
      return t;
    };
    d.q = narrow(p.q, -1), d.k = narrow(p.k, cache_lengths[b]), d.v = narrow(p.v, cache_lengths[b]);
    HostTensor od(DType::fp32, {1, seqlen_q, heads, dim}), ld(DType::fp32, {1, heads, seqlen_q});
    d.o = od.view, d.lse = ld.view;
    ASSERT_TRUE(forward(d).ok());
    for (int64_t i = 0; i < seqlen_q * heads * dim; ++i)
      EXPECT_NEAR(od.at(i), o.at(b * seqlen_q * heads * dim + i), 1e-5) << "sequence " << b;
    for (int64_t i = 0; i < heads * seqlen_q; ++i) {
      if (cache_lengths[b] == 0) EXPECT_TRUE(std::isinf(lse.at(b * heads * seqlen_q + i)));
      else EXPECT_NEAR(ld.at(i), lse.at(b * heads * seqlen_q + i), 1e-5);
    }
  }
}

// The clamps that keep an unchecked (device-resident) table inside the cache.
TEST(PagedCacheView, ClampsLengthsAndEntries) {
  EXPECT_EQ(clamp_page(-1, 10), 0);
  EXPECT_EQ(clamp_page(10, 10), 9);
  EXPECT_EQ(clamp_page(1 << 30, 10), 9);
  EXPECT_EQ(clamp_page(4, 10), 4);
  EXPECT_EQ(clamp_cache_length(-5, 64), 0);
  EXPECT_EQ(clamp_cache_length(65, 64), 64);
  CacheSpec c;
  c.lengths = {40};
  PagedCall call(c);
  call.table()[0] = -7;
  call.table()[1] = int32_t(call.num_pages) + 3;
  call.lengths()[0] = 1 << 20;
  const PagedCache cache = PagedCache::of(call.params());
  EXPECT_EQ(cache.length(0), cache.capacity());
  EXPECT_EQ(cache.row_of(0, 3).page, 0);
  EXPECT_EQ(cache.row_of(0, 3).row, 3);
  EXPECT_EQ(cache.row_of(0, 16 + 5).page, call.num_pages - 1);
  EXPECT_EQ(cache.row_of(0, 16 + 5).row, 5);
}

// ---- Bad input --------------------------------------------------------------------------------

void expect_refused(const Params& p, const std::string& name, Code code = Code::invalid_argument,
                    Direction direction = Direction::forward) {
  const Status s = direction == Direction::forward ? forward(p) : backward(p);
  EXPECT_EQ(s.code, code) << s.message;
  EXPECT_EQ(s.message.rfind(name, 0), 0u) << "expected the message to start with '" << name << "': " << s.message;
}

TEST(PagedBadInput, RefusedWithTheArgumentNamedAndNothingWritten) {
  CacheSpec c;
  c.lengths = {40, 20};
  PagedCall call(c);
  std::memset(call.o.view.data, 0x5a, call.o.storage.size() * 4);
  const std::vector<uint32_t> before = call.o.storage;
  const Params good = call.params();
  Params p = good;

  p.cache_seqlens = Tensor{};
  expect_refused(p, "cache_seqlens");
  p = good;
  p.block_table.dtype = DType::fp32;
  expect_refused(p, "block_table");
  p = good;
  p.block_table.shape[0] = 3;
  expect_refused(p, "block_table");
  p = good;
  p.cache_seqlens.rank = 2;
  expect_refused(p, "cache_seqlens");
  p = good;
  p.block_table.data = nullptr;
  expect_refused(p, "block_table");
  p = good;
  p.block_table.device = Device{DeviceType::cuda, 0};
  expect_refused(p, "block_table");
  // Page sizes outside 16 ... 256.
  {
    HostTensor k(DType::fp32, {4, 8, c.kv_heads, c.head_dim}), v(DType::fp32, {4, 8, c.kv_heads, c.head_dim_v});
    p = good;
    p.k = k.view, p.v = v.view;
    expect_refused(p, "k");
  }
  // v's pages unlike k's.
  {
    HostTensor v(DType::fp32, {call.num_pages + 1, c.page_size, c.kv_heads, c.head_dim_v});
    p = good;
    p.v = v.view;
    expect_refused(p, "v");
  }
  // Lengths out of range, entries that a length reaches out of [0, num_pages).
  call.lengths()[1] = -1;
  expect_refused(good, "cache_seqlens[1]");
  call.lengths()[1] = int32_t(call.pages_per_seq * c.page_size + 1);
  expect_refused(good, "cache_seqlens[1]");
  call.lengths()[1] = 20;
  const int32_t saved = call.table()[call.pages_per_seq + 1];
  call.table()[call.pages_per_seq + 1] = int32_t(call.num_pages);
  expect_refused(good, "block_table[1][1]");
  call.table()[call.pages_per_seq + 1] = -1;
  expect_refused(good, "block_table[1][1]");
  call.table()[call.pages_per_seq + 1] = saved;
  // Backward, variable-length queries, rows to append.
  expect_refused(good, "block_table", Code::unsupported, Direction::backward);
  p = good;
  p.cu_seqlens_q = p.cu_seqlens_k = call.cache_seqlens.view;
  expect_refused(p, "block_table", Code::unsupported);
  p = good;
  p.k_new = call.q.view;
  expect_refused(p, "k_new");
  EXPECT_EQ(call.o.storage, before) << "a refused call wrote o";
  // Entries past a sequence's length are not read: -1 there is fine.
  EXPECT_EQ(call.table()[call.pages_per_seq - 1], -1);
  EXPECT_TRUE(forward(good).ok());
}

// ---- append_kv ----------------------------------------------------------------------------------

TEST(AppendKv, WritesRowsAtEachSequencesEnd) {
  for (DType dtype : {DType::fp32, DType::bf16}) {
    CacheSpec c;
    c.dtype = dtype;
    c.page_size = 16;
    c.lengths = {15, 0, 32};  // the new rows cross a page boundary, start a cache, start a page
    PagedCall call(c);
    // Give every sequence the pages its new rows need.
    const int64_t seqlen_new = 3;
    for (int64_t b = 0; b < call.batch; ++b) {
      const int64_t last = (c.lengths[size_t(b)] + seqlen_new - 1) / c.page_size;
      for (int64_t i = 0; i <= last; ++i)
        if (call.table()[b * call.pages_per_seq + i] < 0) call.table()[b * call.pages_per_seq + i] = int32_t(call.num_pages - 1 - b);
    }
    std::mt19937_64 rng(9);
    HostTensor k_new(dtype, {call.batch, seqlen_new, c.kv_heads, c.head_dim}),
        v_new(dtype, {call.batch, seqlen_new, c.kv_heads, c.head_dim_v});
    k_new.randomize(rng), v_new.randomize(rng);
    const std::vector<uint32_t> k_before = call.k.storage;
    Params p = call.params();
    p.k_new = k_new.view, p.v_new = v_new.view;
    const Status s = append_kv(p);
    ASSERT_TRUE(s.ok()) << s.message;
    // The new rows where the table puts them, bit for bit; everything else unchanged.
    HostTensor expected_k(dtype, {call.num_pages, c.page_size, c.kv_heads, c.head_dim});
    expected_k.storage = k_before;
    for (int64_t b = 0; b < call.batch; ++b)
      for (int64_t i = 0; i < seqlen_new; ++i) {
        const int64_t pos = c.lengths[size_t(b)] + i;
        const int64_t page = call.table()[b * call.pages_per_seq + pos / c.page_size], row = pos % c.page_size;
        for (int64_t h = 0; h < c.kv_heads; ++h)
          for (int64_t d = 0; d < c.head_dim; ++d) {
            const float x = k_new.at(((b * seqlen_new + i) * c.kv_heads + h) * c.head_dim + d);
            expected_k.set(((page * c.page_size + row) * c.kv_heads + h) * c.head_dim + d, x);
            EXPECT_EQ(call.k.at(((page * c.page_size + row) * c.kv_heads + h) * c.head_dim + d), x);
            if (d < c.head_dim_v)
              EXPECT_EQ(call.v.at(((page * c.page_size + row) * c.kv_heads + h) * c.head_dim_v + d),
                        v_new.at(((b * seqlen_new + i) * c.kv_heads + h) * c.head_dim_v + d));
          }
      }
    EXPECT_EQ(call.k.storage, expected_k.storage) << "append_kv wrote outside the new rows";

    // Attention over the grown cache equals the oracle on it.
    for (int64_t b = 0; b < call.batch; ++b) call.lengths()[b] += int32_t(seqlen_new);
    call.spec.lengths = {c.lengths[0] + seqlen_new, c.lengths[1] + seqlen_new, c.lengths[2] + seqlen_new};
    ASSERT_TRUE(forward(call.params()).ok());
    const Errors e = compare(call, reference::forward(call.params(Backend::reference), 1));
    EXPECT_LE(e.rel_err, tolerance(dtype, Precision::ieee, Direction::forward));
  }
}

TEST(AppendKv, ContiguousCache) {
  const int64_t batch = 2, capacity = 8, kv_heads = 2, dim = 4, seqlen_new = 2;
  HostTensor k(DType::fp32, {batch, capacity, kv_heads, dim}), v(DType::fp32, {batch, capacity, kv_heads, dim}),
      k_new(DType::fp32, {batch, seqlen_new, kv_heads, dim}), v_new(DType::fp32, {batch, seqlen_new, kv_heads, dim}),
      lengths(DType::int32, {batch});
  for (int64_t i = 0; i < k_new.numel(); ++i) k_new.set(i, float(i + 1)), v_new.set(i, float(-i - 1));
  const int32_t cache_lengths[] = {6, 0};
  std::memcpy(lengths.view.data, cache_lengths, sizeof(cache_lengths));
  Params p;
  p.k = k.view, p.v = v.view, p.k_new = k_new.view, p.v_new = v_new.view, p.cache_seqlens = lengths.view;
  ASSERT_TRUE(append_kv(p).ok());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < capacity; ++j)
      for (int64_t h = 0; h < kv_heads; ++h)
        for (int64_t d = 0; d < dim; ++d) {
          const int64_t i = j - cache_lengths[b];
          const float want = i >= 0 && i < seqlen_new ? float(((b * seqlen_new + i) * kv_heads + h) * dim + d + 1) : 0.f;
          EXPECT_EQ(k.at(((b * capacity + j) * kv_heads + h) * dim + d), want);
          EXPECT_EQ(v.at(((b * capacity + j) * kv_heads + h) * dim + d), -want);
        }
  // Two more rows do not fit in sequence 0's capacity of 8.
  const int32_t full[] = {7, 0};
  std::memcpy(lengths.view.data, full, sizeof(full));
  const Status s = append_kv(p);
  EXPECT_EQ(s.code, Code::invalid_argument);
  EXPECT_EQ(s.message.rfind("cache_seqlens[0]", 0), 0u) << s.message;
}

TEST(AppendKv, BadInputRefusedAndNothingWritten) {
  CacheSpec c;
  c.lengths = {16, 10};
  c.page_size = 16;
  PagedCall call(c);
  HostTensor k_new(DType::fp32, {2, 2, c.kv_heads, c.head_dim}), v_new(DType::fp32, {2, 2, c.kv_heads, c.head_dim_v});
  const std::vector<uint32_t> k_before = call.k.storage, v_before = call.v.storage;
  Params good = call.params();
  good.k_new = k_new.view, good.v_new = v_new.view;
  auto refused = [&](const Params& p, const std::string& name) {
    const Status s = append_kv(p);
    EXPECT_EQ(s.code, Code::invalid_argument) << s.message;
    EXPECT_EQ(s.message.rfind(name, 0), 0u) << "expected '" << name << "': " << s.message;
  };
  // Sequence 0's new rows start page 1, whose entry is -1: no page for them.
  refused(good, "block_table[0][1]");
  call.table()[1] = int32_t(call.num_pages - 1);
  // Sequence 1 writes rows 10, 11 of its own page 0; make it sequence 0's new page: a collision.
  const int32_t own = call.table()[call.pages_per_seq];
  call.table()[call.pages_per_seq] = int32_t(call.num_pages - 1);
  call.lengths()[1] = 0;
  refused(good, "block_table: sequences 0 and 1");
  call.table()[call.pages_per_seq] = own;
  call.lengths()[1] = 10;
  Params p = good;
  p.k_new = Tensor{};
  refused(p, "k_new");
  HostTensor k_half(DType::bf16, {2, 2, c.kv_heads, c.head_dim});
  p = good;
  p.k_new = k_half.view;
  refused(p, "k_new");
  p = good;
  p.v_new.shape[1] = 1;
  refused(p, "v_new");
  p = good;
  p.cache_seqlens = Tensor{};
  refused(p, "cache_seqlens");
  p = good;
  p.k_new = call.k.view;  // the new rows may not live in the cache
  p.k_new.shape[0] = 2, p.k_new.shape[1] = 2;
  refused(p, "k_new");
  call.lengths()[0] = int32_t(call.pages_per_seq * c.page_size - 1);
  refused(good, "cache_seqlens[0]");
  call.lengths()[0] = 16;
  EXPECT_EQ(call.k.storage, k_before);
  EXPECT_EQ(call.v.storage, v_before);
  EXPECT_TRUE(append_kv(good).ok());
}

// The decode gather's walk over a thread's rows (RowWalk): from any first key, every step of at
// most a page lands where the division puts that key, at every page size the cache takes and in
// the contiguous case (one page the length of the sequence).
TEST(DecodeRowWalk, StepsMatchTheDivisionAtEveryRow) {
  for (int page_size : {16, 17, 32, 48, 64, 100, 128, 256, 4096})
    for (int step : {1, 4, 8, 16})
      for (int first : {0, 1, 7, 15, 63, 64, 255, 1000, 4095}) {
        RowWalk at(first, page_size);
        for (int key = first; key < first + 40 * step; key += step) {
          ASSERT_EQ(at.page, key / page_size) << page_size << " " << step << " " << first << " key " << key;
          ASSERT_EQ(at.within, key % page_size) << page_size << " " << step << " " << first << " key " << key;
          const bool crossed = at.advance(step, page_size);
          EXPECT_EQ(crossed, (key + step) / page_size != key / page_size) << page_size << " key " << key;
        }
      }
}

}  // namespace
}  // namespace fmha
