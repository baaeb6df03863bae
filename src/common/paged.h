// A paged KV cache (Params::block_table, cache_seqlens) as every implementation reads it: where
// key j of sequence b lives, with the table entries and lengths clamped into the cache, so that a
// bad device-resident table (the caller's promise, never checked there) reads wrong pages but
// never memory outside k and v. The same view reads tables in CPU memory on the host and in
// device memory in the GPU kernels (the sm80 decode kernel, append_kv): the clamps are written
// once for the CPU paths and the GPU tiers.
#pragma once

#include <cstdint>

#include "fmha/fmha.h"
#include "fmha/mask.h"  // FMHA_HOST_DEVICE

namespace fmha {

inline bool is_paged(const Params& p) { return p.block_table.defined() || p.cache_seqlens.defined(); }

// A length clamped to [0, capacity] and a page entry clamped to [0, num_pages - 1] (num_pages > 0).
FMHA_HOST_DEVICE int64_t clamp_cache_length(int64_t length, int64_t capacity) {
  return length < 0 ? 0 : (length > capacity ? capacity : length);
}
FMHA_HOST_DEVICE int64_t clamp_page(int64_t entry, int64_t num_pages) {
  return entry < 0 ? 0 : (entry >= num_pages ? num_pages - 1 : entry);
}

// A key's place in the cache: row `row` of page `page` (k/v's first two indices).
struct CacheRow {
  int64_t page = 0, row = 0;
};

// The tables of a validated paged call (or of append_kv), in the memory of whoever reads them.
// Without a block table the cache is contiguous [B, capacity, ...]: sequence b is the one page b
// of `capacity` rows; without lengths (a dense call) every sequence fills its capacity.
struct PagedCache {
  const int32_t* table = nullptr;  // null: contiguous
  int64_t table_stride[2] = {0, 0};
  const int32_t* lengths = nullptr;
  int64_t lengths_stride = 0;
  int64_t batch = 0, page_size = 0, pages_per_seq = 0, num_pages = 0;

  static PagedCache of(const Params& p) {
    PagedCache c;
    c.lengths = static_cast<const int32_t*>(p.cache_seqlens.data);
    c.lengths_stride = p.cache_seqlens.stride[0];
    c.batch = p.cache_seqlens.shape[0];
    c.num_pages = p.k.shape[0];
    c.page_size = p.k.shape[1];
    if (p.block_table.defined()) {
      c.table = static_cast<const int32_t*>(p.block_table.data);
      c.table_stride[0] = p.block_table.stride[0];
      c.table_stride[1] = p.block_table.stride[1];
      c.pages_per_seq = p.block_table.shape[1];
    } else {
      c.pages_per_seq = 1;
    }
    return c;
  }

  // A dense [B, Sk, ...] call seen as a cache (the GPU decode kernel's view of it): no tables,
  // sequence b is page b, and every sequence has all Sk keys.
  static PagedCache dense(int64_t batch, int64_t seqlen_k) {
    PagedCache c;
    c.batch = c.num_pages = batch;
    c.page_size = seqlen_k;
    c.pages_per_seq = 1;
    return c;
  }

  // The methods below run on the host and in the GPU kernels alike.
  FMHA_HOST_DEVICE int64_t capacity() const { return pages_per_seq * page_size; }
  // The raw entries, unclamped (what validation checks).
  FMHA_HOST_DEVICE int64_t raw_length(int64_t b) const {
    return lengths ? lengths[b * lengths_stride] : capacity();
  }
  FMHA_HOST_DEVICE int64_t raw_entry(int64_t b, int64_t i) const {
    return table ? table[b * table_stride[0] + i * table_stride[1]] : b;
  }
  // The clamped ones (what implementations read).
  FMHA_HOST_DEVICE int64_t length(int64_t b) const { return clamp_cache_length(raw_length(b), capacity()); }
  FMHA_HOST_DEVICE int64_t page(int64_t b, int64_t i) const { return clamp_page(raw_entry(b, i), num_pages); }
  FMHA_HOST_DEVICE CacheRow row_of(int64_t b, int64_t key) const {
    return {page(b, key / page_size), key % page_size};
  }
};

// A walk over every `step`-th key of a sequence from key `key` on, as (page among the sequence's,
// row in that page): one division at the start, then steps of at most one page, each crossing at
// most one page boundary. The GPU decode kernel's gather walks each thread's rows of a tile so.
struct RowWalk {
  int page = 0, within = 0;

  FMHA_HOST_DEVICE RowWalk(int key, int page_size) : page(key / page_size), within(key % page_size) {}
  // `step` keys on (0 < step <= page_size); whether that entered the next page.
  FMHA_HOST_DEVICE bool advance(int step, int page_size) {
    within += step;
    if (within < page_size) return false;
    within -= page_size;
    ++page;
    return true;
  }
};

// The options a paged call's masks share; each sequence's mask adds its own seqlen_k (host and
// GPU kernels alike).
struct CacheMask {
  Causal causal = Causal::none;
  int64_t window_left = -1, window_right = -1, q_offset = 0;

  static CacheMask of(const Params& p) { return {p.causal, p.window_left, p.window_right, p.q_offset}; }
  FMHA_HOST_DEVICE Mask sequence(int64_t seqlen_q, int64_t seqlen_k) const {
    return Mask::make(causal, window_left, window_right, q_offset, seqlen_q, seqlen_k);
  }
};

// The mask of sequence b of a paged call: the call's options with that sequence's own seqlen_k.
inline Mask sequence_mask(const Params& p, int64_t seqlen_q, int64_t seqlen_k) {
  return CacheMask::of(p).sequence(seqlen_q, seqlen_k);
}

}  // namespace fmha
