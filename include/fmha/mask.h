// The attention mask, written once: causal alignments, sliding windows, the query offset and the
// ragged key tail. The fp64 oracle, the fast CPU path and every GPU tier ask this object which
// keys a query row sees, so they cannot disagree on what a mask means.
//
// Every row sees one contiguous key interval [begin, end), and both ends are non-decreasing in
// the row index. That lets a tiled kernel skip whole tiles and know which tiles need no
// per-element masking.
#pragma once

#include <cstdint>

#include "fmha/fmha.h"

#if defined(__CUDACC__)
#define FMHA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FMHA_HOST_DEVICE inline
#endif

namespace fmha {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;  // exclusive
  FMHA_HOST_DEVICE bool empty() const { return end <= begin; }
  FMHA_HOST_DEVICE int64_t size() const { return end > begin ? end - begin : 0; }
};

struct Mask {
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t shift = 0;         // query row i sits at key position i + shift
  int64_t window_left = -1;  // -1: unbounded
  int64_t window_right = -1; // -1: unbounded; 0 under causal masking

  FMHA_HOST_DEVICE static Mask make(Causal causal, int64_t window_left, int64_t window_right, int64_t q_offset,
                   int64_t seqlen_q, int64_t seqlen_k) {
    Mask m;
    m.seqlen_q = seqlen_q;
    m.seqlen_k = seqlen_k;
    m.shift = q_offset + (causal == Causal::bottom_right ? seqlen_k - seqlen_q : 0);
    m.window_left = window_left;
    m.window_right = causal == Causal::none ? window_right : 0;
    return m;
  }

  // Keys that query row i sees: [begin, end), clamped to [0, seqlen_k).
  FMHA_HOST_DEVICE Range keys(int64_t row) const {
    const int64_t pos = row + shift;
    int64_t begin = window_left < 0 ? 0 : pos - window_left;
    int64_t end = window_right < 0 ? seqlen_k : pos + window_right + 1;
    begin = begin < 0 ? 0 : (begin > seqlen_k ? seqlen_k : begin);
    end = end > seqlen_k ? seqlen_k : end;
    if (end < begin) end = begin;
    return {begin, end};
  }

  // Query rows that see key j: [begin, end), clamped to [0, seqlen_q).
  FMHA_HOST_DEVICE Range queries(int64_t key) const {
    // key >= pos - window_left  <=>  row <= key + window_left - shift
    // key <= pos + window_right <=>  row >= key - window_right - shift
    int64_t begin = window_right < 0 ? 0 : key - window_right - shift;
    int64_t end = window_left < 0 ? seqlen_q : key + window_left - shift + 1;
    begin = begin < 0 ? 0 : (begin > seqlen_q ? seqlen_q : begin);
    end = end > seqlen_q ? seqlen_q : end;
    if (end < begin) end = begin;
    return {begin, end};
  }

  FMHA_HOST_DEVICE bool visible(int64_t row, int64_t key) const {
    const Range r = keys(row);
    return key >= r.begin && key < r.end;
  }

  // Keys seen by any row of [row_begin, row_end): the union of monotone intervals.
  FMHA_HOST_DEVICE Range keys(Range rows) const {
    if (rows.empty()) return {0, 0};
    Range first = keys(rows.begin), last = keys(rows.end - 1);
    return first.begin < last.end ? Range{first.begin, last.end} : Range{0, 0};
  }

  // Rows of [row_begin, row_end) that see any key of `cols`.
  FMHA_HOST_DEVICE Range queries(Range rows, Range cols) const {
    if (rows.empty() || cols.empty()) return {0, 0};
    Range first = queries(cols.begin), last = queries(cols.end - 1);
    int64_t begin = first.begin > rows.begin ? first.begin : rows.begin;
    int64_t end = last.end < rows.end ? last.end : rows.end;
    return begin < end ? Range{begin, end} : Range{0, 0};
  }

  // True when every (row, key) of the tile is visible: such a tile needs no per-element mask.
  // The keys that every row of `rows` sees (empty where no key is seen by all). begin is
  // non-decreasing in the row, end likewise: the binding rows are the last (begin) and the first
  // (end). Every rows range sees all keys when it is empty.
  FMHA_HOST_DEVICE Range full_keys(Range rows) const {
    if (rows.empty()) return {0, seqlen_k};
    const Range first = keys(rows.begin), last = keys(rows.end - 1);
    return {last.begin, first.end};
  }

  // Whether every row of `rows` sees every key of `cols` (a tile that needs no masking).
  FMHA_HOST_DEVICE bool tile_is_full(Range rows, Range cols) const {
    if (rows.empty() || cols.empty()) return true;
    const Range full = full_keys(rows);
    return full.begin <= cols.begin && full.end >= cols.end;
  }
};

}  // namespace fmha
