// A paged KV cache call with its own tensors (random q, a shuffled page pool, block table and
// lengths) and its comparison against the fp64 oracle, shared by the CPU paged tests
// (test_paged.cpp) and the GPU decode tests (gpu/decode_gpu_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/reference.h"
#include "fmha/fmha.h"
#include "test_util.h"

namespace fmha::testing {

struct CacheSpec {
  int64_t heads = 4, kv_heads = 2, seqlen_q = 1, head_dim = 32, head_dim_v = 32, page_size = 16;
  std::vector<int64_t> lengths = {40};
  DType dtype = DType::fp32;
  Causal causal = Causal::bottom_right;
  int64_t window_left = -1, window_right = -1, q_offset = 0;
  int64_t shared_prefix_pages = 0;  // sequences 1.. reuse sequence 0's first pages
  int64_t spare_pages = 3;          // pages in the pool that no sequence uses
  bool shuffle = true;
  uint64_t seed = 1;
};

// Owned tensors of a paged call: q, the page pool, the tables and the outputs.
struct PagedCall {
  CacheSpec spec;
  int64_t batch = 0, pages_per_seq = 0, num_pages = 0;
  HostTensor q, k, v, o, lse, block_table, cache_seqlens;

  explicit PagedCall(const CacheSpec& c) : spec(c) {
    batch = int64_t(c.lengths.size());
    std::mt19937_64 rng(c.seed);
    std::vector<int64_t> pages_of(c.lengths.size());
    int64_t needed = 0;
    for (size_t b = 0; b < c.lengths.size(); ++b) {
      pages_of[b] = (c.lengths[b] + c.page_size - 1) / c.page_size;
      pages_per_seq = std::max(pages_per_seq, pages_of[b] + 1);  // one unused entry at least
      needed += b > 0 ? std::max<int64_t>(0, pages_of[b] - c.shared_prefix_pages) : pages_of[b];
    }
    num_pages = needed + c.spare_pages;
    std::vector<int32_t> physical(static_cast<size_t>(num_pages));
    std::iota(physical.begin(), physical.end(), 0);
    if (c.shuffle) std::shuffle(physical.begin(), physical.end(), rng);
    q = HostTensor(c.dtype, {batch, c.seqlen_q, c.heads, c.head_dim});
    k = HostTensor(c.dtype, {num_pages, c.page_size, c.kv_heads, c.head_dim});
    v = HostTensor(c.dtype, {num_pages, c.page_size, c.kv_heads, c.head_dim_v});
    o = HostTensor(c.dtype, {batch, c.seqlen_q, c.heads, c.head_dim_v});
    lse = HostTensor(DType::fp32, {batch, c.heads, c.seqlen_q});
    block_table = HostTensor(DType::int32, {batch, pages_per_seq});
    cache_seqlens = HostTensor(DType::int32, {batch});
    q.randomize(rng);
    k.randomize(rng);
    v.randomize(rng);
    auto* table = static_cast<int32_t*>(block_table.view.data);
    auto* lengths = static_cast<int32_t*>(cache_seqlens.view.data);
    std::fill_n(table, batch * pages_per_seq, -1);  // entries past a sequence's pages are never read
    size_t next = 0;
    for (int64_t b = 0; b < batch; ++b) {
      lengths[b] = int32_t(c.lengths[size_t(b)]);
      for (int64_t i = 0; i < pages_of[size_t(b)]; ++i)
        table[b * pages_per_seq + i] = b > 0 && i < c.shared_prefix_pages ? table[i] : physical[next++];
    }
  }

  int32_t* table() { return static_cast<int32_t*>(block_table.view.data); }
  int32_t* lengths() { return static_cast<int32_t*>(cache_seqlens.view.data); }

  Params params(Backend backend = Backend::cpu) const {
    Params p;
    p.q = q.view;
    p.k = k.view;
    p.v = v.view;
    p.o = o.view;
    p.lse = lse.view;
    p.block_table = block_table.view;
    p.cache_seqlens = cache_seqlens.view;
    p.causal = spec.causal;
    p.window_left = spec.window_left;
    p.window_right = spec.window_right;
    p.q_offset = spec.q_offset;
    p.backend = backend;
    return p;
  }

  // Sequence b's keys gathered into a dense [1, length, Hkv, D] tensor (the same stored values).
  HostTensor dense(const HostTensor& cache, int64_t b, int64_t dim) const {
    const int64_t length = spec.lengths[size_t(b)];
    HostTensor out(spec.dtype, {1, length, spec.kv_heads, dim});
    const auto* t = static_cast<const int32_t*>(block_table.view.data);
    for (int64_t j = 0; j < length; ++j) {
      const int64_t page = t[b * pages_per_seq + j / spec.page_size], row = j % spec.page_size;
      for (int64_t h = 0; h < spec.kv_heads; ++h)
        for (int64_t d = 0; d < dim; ++d)
          out.set((j * spec.kv_heads + h) * dim + d,
                  cache.at(((page * spec.page_size + row) * spec.kv_heads + h) * dim + d));
    }
    return out;
  }
};

// rel_err of o against the oracle, the worst LSE error, and whether rows that see no key are
// exactly 0 / -inf.
struct Errors {
  double rel_err = 0.0, lse_err = 0.0;
  bool empty_rows_ok = true;
};

inline Errors compare(const PagedCall& call, const reference::ForwardResult& ref) {
  const CacheSpec& c = call.spec;
  double diff2 = 0.0, ref2 = 0.0;
  Errors e;
  for (int64_t b = 0; b < call.batch; ++b)
    for (int64_t row = 0; row < c.seqlen_q; ++row)
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t o0 = ((b * c.seqlen_q + row) * c.heads + h) * c.head_dim_v, l = (b * c.heads + h) * c.seqlen_q + row;
        const double ref_lse = ref.lse[size_t(l)];
        const float out_lse = call.lse.at(l);
        if (std::isinf(ref_lse)) {
          for (int64_t d = 0; d < c.head_dim_v; ++d) e.empty_rows_ok &= call.o.at(o0 + d) == 0.0f;
          e.empty_rows_ok &= std::isinf(out_lse) && out_lse < 0;
          continue;
        }
        for (int64_t d = 0; d < c.head_dim_v; ++d) {
          const double r = ref.o[size_t(o0 + d)], x = call.o.at(o0 + d);
          diff2 += (x - r) * (x - r);
          ref2 += r * r;
        }
        const double le = std::abs(double(out_lse) - ref_lse) / std::max(1.0, std::abs(ref_lse));
        e.lse_err = std::isnan(le) ? INFINITY : std::max(e.lse_err, le);
      }
  e.rel_err = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  if (std::isnan(e.rel_err)) e.rel_err = INFINITY;
  return e;
}

inline std::string describe(const CacheSpec& c) {
  std::string lengths;
  for (int64_t l : c.lengths) lengths += (lengths.empty() ? "" : ",") + std::to_string(l);
  return std::string(to_string(c.dtype)) + " heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
         " seqlen_q " + std::to_string(c.seqlen_q) + " page " + std::to_string(c.page_size) + " lengths " + lengths +
         " causal " + to_string(c.causal) + " window " + std::to_string(c.window_left) + "," +
         std::to_string(c.window_right) + " q_offset " + std::to_string(c.q_offset) + " shared " +
         std::to_string(c.shared_prefix_pages) + " seed " + std::to_string(c.seed);
}

}  // namespace fmha::testing
