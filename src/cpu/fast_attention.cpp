// The fast CPU path: FlashAttention-2 style tiled online softmax, forward and backward, fp32
// accumulation for fp32/fp16/bf16 storage, multi-threaded over (batch, KV head, chunk of tiles).
// K/V (and Q/dO in the backward) are converted to fp32 once per chunk into panels that many tiles
// read, so conversion and transposition stay off the critical path.
//
// Forward, per query tile: for each key tile the mask lets it see,
//   load K tile, S^T = K·Q^T, mask, max, exp2, sum, rescale (lane-wise over 16 queries of a
//   vector), load V, O^T += V^T·P^T;
// items of at most 8 queries (decode) take the same steps on row-major S = Q·K^T tiles.
// The exp2 argument is (x - max)·|scale|·log2(e) with x = sign(scale)·(q·k): the difference of two
// unscaled scores is exact near the max, so large logits lose nothing to the scaling.
// Calls with too few query tiles for the threads (decode) split their keys into parts and merge
// the parts' running max, sum and output as the online softmax merges two key tiles.
//
// Backward, after Δ = rowsum(dO∘O) (the preprocess step; inside the fused items where they form
// their own statistics):
//   statistics pass, per query tile: over key tiles, S^T = K·Q^T (the fused pass's tile), each
//     query's max and sum online (RowStats says why the stored LSE is not read), on exponents
//     E = exp2((x - tile base)·|scale_log2|) that short calls keep for the fused pass;
//   fused pass, per key tile: over the group's query heads and query tiles,
//     P = E · exp2((tile base - max)·|scale_log2|) / sum, dV += P^T·dO, dP = dO·V^T,
//     dS = P∘(dP - Δ), dK += dS^T·Q, dQ^T += K^T·dS^T
// dK and dV have one writer; each key chunk's dQ share is added to an fp32 accumulator in a fixed
// chunk order (deterministic, no atomic adds), then dQ is written out (by the chunk itself where a
// head is one chunk).
//
// This file is compiled once per instruction-set path, each time with that path's flags and
// FMHA_CPU_ISA naming its namespace (src/cpu/isa.h); src/cpu/dispatch.cpp calls the one chosen.
#include "cpu/kernels.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/numeric.h"
#include "common/paged.h"
#include "common/parallel.h"
#include "common/problem.h"
#include "common/tensor_access.h"
// Last of the shared headers: from here on the code is compiled for this path's instruction set.
#include "cpu/isa_target.h"
#include "cpu/simd.h"

namespace fmha::cpu::FMHA_CPU_ISA {
namespace {

constexpr int64_t kTileM = 64;             // query rows per tile
constexpr int64_t kTileN = kWideCols;      // keys per tile: one 64-wide register row
constexpr int kVecsN = int(kTileN / kLanes);
// The lane-wise max of `init` and the kTileN key rows of an S^T tile [kTileN keys, kTileM
// queries], over the kLanes queries from q0 (NaN entries are passed over). The rows go in
// kMaxChains independent chains (a max is exact in any order): one chain of dependent maxes would
// wait on the unit's latency at every row.
constexpr int kMaxChains = 4;
vf key_rows_max(const float* st, int64_t q0, vf init) {
  vf chain[kMaxChains];
  for (int i = 0; i < kMaxChains; ++i) chain[i] = init;
  for (int64_t c = 0; c < kTileN; c += kMaxChains)
    for (int i = 0; i < kMaxChains; ++i) {
      const vf x = load(st + (c + i) * kTileM + q0);
      chain[i] = x > chain[i] ? x : chain[i];
    }
  vf m = chain[0];
  for (int i = 1; i < kMaxChains; ++i) m = chain[i] > m ? chain[i] : m;
  return m;
}

void round_tile_to_tf32(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_tf32(x[i]);
}

// The head dim padded for a transposed operand, whose rows are head-dim elements: the A operand
// of dQ^T = K^T·dS^T has as many rows, and the matmul takes rows in blocks of kRowBlock.
constexpr int64_t kDimRows = std::max<int64_t>(kLanes, kRowBlock);

int64_t tiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }
int64_t align_down(int64_t x, int64_t m) { return x / m * m; }
Range intersect(Range a, Range b) {
  Range r{std::max(a.begin, b.begin), std::min(a.end, b.end)};
  return r.empty() ? Range{r.begin, r.begin} : r;
}

// One head's rows of a [B, S, H, dim] tensor lie H rows apart: with several heads, each row is a
// short run (a few cache lines) in its own stretch of memory, often its own page, which the
// hardware prefetcher does not follow across pages. Panel loads ask for the row kPrefetchRows
// ahead while they convert the current one.
constexpr int64_t kPrefetchRows = 8;
constexpr int64_t kCacheLine = 64;

// The rows a panel reads: one head's rows of sequence b of a [B, S, H, dim] tensor (TensorRows),
// or key rows that lie in a sequence's pages (PagedRows: a piece of a paged call, kernels.h
// KeyPages). The loads are templates over the two, so that a tensor's rows compile as plain
// strided rows.
struct TensorRows {
  const Tensor* t = nullptr;
  int64_t b = 0;
  int64_t offset(int64_t r, int64_t h) const { return offset4(*t, b, r, h, 0); }  // element offset
  // Whether rows [r, r + n) lie one row stride (t->stride[1]) after another from row r.
  static constexpr bool rows_follow(int64_t, int64_t) { return true; }
};
struct PagedRows {
  const Tensor* t = nullptr;  // a [1, n, H, dim] view at the page pool's base
  const int32_t* table = nullptr;
  int64_t table_stride = 1, page_size = 1, first_key = 0, num_pages = 1, page_stride = 0;
  PagedRows(const Tensor& tensor, const KeyPages& pages, bool values)
      : t(&tensor),
        table(pages.table),
        table_stride(pages.table_stride),
        page_size(pages.page_size),
        first_key(pages.first_key),
        num_pages(pages.num_pages),
        page_stride(values ? pages.v_page_stride : pages.k_page_stride) {}
  int64_t offset(int64_t r, int64_t h) const {
    const int64_t key = first_key + r;
    return clamp_page(table[key / page_size * table_stride], num_pages) * page_stride +
           key % page_size * t->stride[1] + h * t->stride[2];
  }
  bool rows_follow(int64_t r, int64_t n) const {
    return (first_key + r) / page_size == (first_key + r + n - 1) / page_size;
  }
};
// f(K rows, V rows) of a call: its own, or through `pages` where it has a table.
template <class F>
void with_key_rows(const Params& p, int64_t b, const KeyPages* pages, F&& f) {
  if (pages != nullptr && pages->table != nullptr) f(PagedRows(p.k, *pages, false), PagedRows(p.v, *pages, true));
  else f(TensorRows{&p.k, b}, TensorRows{&p.v, b});
}

// The row of t at element `offset`, `dim` elements. Not a template: GCC 12 deems a template
// whose body is only prefetches free of effects and drops its calls (measured: a panel loader
// through such a template lost every prefetch and ran 1.4x slower).
void prefetch_row(const Tensor& t, int64_t offset, int64_t dim) {
  const int64_t element = t.dtype == DType::fp32 ? 4 : 2;
  const char* row = static_cast<const char*>(t.data) + offset * element;
  for (int64_t i = 0; i < dim * element; i += kCacheLine) __builtin_prefetch(row + i);
}

// Rows [rows.begin, rows.end) of one head of a [B, S, H, dim] tensor converted to fp32, once, for
// many tiles to read. The panel starts at a multiple of the tile size (so every tile that starts
// at a multiple of 64 sits at a 64-byte aligned offset) and is zero outside `rows` and `dim`.
//   row-major:  element (r, d) at data[(r - first) * ld + d], ld = dim rounded up to kLanes
//   transposed: element (r, d) at data[d * ld + (r - first)], ld = row span rounded up to 64,
//               plus one vector; dim rounded up to kDimRows rows
struct Panel {
  Scratch buffer;
  int64_t first = 0, ld = 0, span = 0;
  bool transposed = false;

  // Row-major (transposed panels come from row-major ones: transpose_of).
  void load(const Tensor& t, int64_t b, int64_t h, Range rows, int64_t dim, bool tf32) {
    load(TensorRows{&t, b}, h, rows, dim, tf32);
  }
  template <class Rows>
  void load(const Rows& src, int64_t h, Range rows, int64_t dim, bool tf32) {
    transposed = false;
    first = align_down(rows.begin, kTileN);
    span = round_up(std::max<int64_t>(rows.end - first, 1), kTileN);
    ld = round_up(dim, kLanes);
    float* data = buffer.reserve(span * ld);
    // Zero where no row is read: the rows outside `rows`, the columns past dim.
    std::fill_n(data, (rows.begin - first) * ld, 0.0f);
    std::fill_n(data + (rows.end - first) * ld, (first + span - rows.end) * ld, 0.0f);
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      if (r + kPrefetchRows < rows.end) prefetch_row(*src.t, src.offset(r + kPrefetchRows, h), dim);
      float* row = data + (r - first) * ld;
      read_row(*src.t, src.offset(r, h), dim, row, tf32);
      std::fill_n(row + dim, ld - dim, 0.0f);
    }
  }
  // The transposed panel of a row-major one (the same rows, `dim` its head dim), formed from it in
  // the cache, a register block at a time: one read of the tensor's rows from memory serves both
  // panels. Its rows are read one after another by the matmul's k loop; a row length of a multiple
  // of 4 KiB would map them all to the same L1 sets, so it is padded by one vector.
  void transpose_of(const Panel& rows_panel, int64_t dim) {
    transposed = true;
    first = rows_panel.first;
    span = rows_panel.span;
    ld = span + kLanes;
    const int64_t dim_padded = rows_panel.ld, dim_rows = round_up(dim, kDimRows);
    float* data = buffer.reserve(dim_rows * ld);
    transpose(rows_panel.buffer.get(), rows_panel.ld, span, dim_padded, data, ld);
    for (int64_t d = 0; d < dim_padded; ++d) std::fill_n(data + d * ld + span, ld - span, 0.0f);
    std::fill_n(data + dim_padded * ld, (dim_rows - dim_padded) * ld, 0.0f);
  }
  void trim(int64_t max_floats) { buffer.trim(max_floats); }
  // The tile whose first row is `row` (a multiple of 64 at or after `first`).
  const float* tile(int64_t row) const {
    return transposed ? buffer.get() + (row - first) : buffer.get() + (row - first) * ld;
  }
};

// Rows [rows.begin, rows.end) of one head of a bf16 [B, S, H, dim] tensor, copied as stored (no
// conversion) into an operand of the bf16 matmul (src/cpu/simd.h, AVX-512 BF16 only), zero outside
// `rows` and `dim`; `first` as in Panel:
//   rows:            element (r, d) at data[(r - first) * ld + d], ld = dim rounded up to kLanes
//                    (the A operand: Q)
//   pairs_over_dim:  element (r, d) at data[(d / 2) * ld + 2 * (r - first) + d % 2], ld = twice the
//                    row span plus one vector (the B operand of Q·K^T: K)
//   pairs_over_rows: element (r, d) at data[((r - first) / 2) * ld + 2 * d + r % 2],
//                    ld = 2 * (dim rounded up to kLanes) (the B operand of P·V: V)
//   columns:         element (r, d) at data[d * ld + (r - first)], ld = the row span plus one
//                    vector, dim rounded up to kDimRows rows (the A operand of dQ^T = K^T·dS^T: K)
enum class Bf16Layout { rows, pairs_over_dim, pairs_over_rows, columns };

#if FMHA_CPU_LEVEL >= 2
// The transposing layouts' copy, a square block of kWords x kWords words (16-bit values for
// `columns`, bf16 pairs for `pairs_over_dim`) at a time: dst row j, word i = src row i, word j.
// log2(kWords) rounds swap the off-diagonal halves of ever smaller square blocks (half the block,
// then a quarter, ..., then single words): in the round of size b, rows i and i + b (i with bit b
// clear) exchange row i's words with bit b set for row i + b's with it clear, one two-source
// permute (vpermt2w / vpermt2d) for each new row. Element by element the copy costs a load and a
// store per word; this, log2(kWords) permutes per register of kWords words.
template <class Word>
struct RegisterTranspose {
  static_assert(sizeof(Word) == 2 || sizeof(Word) == 4);
  static constexpr int kWords = 64 / sizeof(Word);  // words per 64-byte register
  static constexpr int kRounds = sizeof(Word) == 2 ? 5 : 4;
  static constexpr int kRows = kWords;                           // source rows a call copies
  static constexpr int kDims = kWords * int(sizeof(Word) / 2);  // 16-bit values of each
  __m512i low[kRounds], high[kRounds];  // each round's permutes: the new rows i and i + b
  RegisterTranspose() {
    for (int round = 0, b = kWords / 2; b >= 1; ++round, b /= 2) {
      alignas(64) Word lo[kWords], hi[kWords];
      for (int c = 0; c < kWords; ++c) {
        lo[c] = Word((c & b) ? kWords + c - b : c);  // row i + b's word c - b, or row i's own
        hi[c] = Word((c & b) ? kWords + c : c + b);  // row i + b's own, or row i's word c + b
      }
      low[round] = _mm512_load_si512(lo);
      high[round] = _mm512_load_si512(hi);
    }
  }
  static __m512i permute(__m512i a, __m512i index, __m512i b) {
    if constexpr (sizeof(Word) == 2) return _mm512_permutex2var_epi16(a, index, b);
    else return _mm512_permutex2var_epi32(a, index, b);
  }
  // Strides in bytes: the rows of src and of dst need no alignment.
  void operator()(const void* src, int64_t src_stride, void* dst, int64_t dst_stride) const {
    __m512i r[kWords];
    for (int i = 0; i < kWords; ++i) r[i] = _mm512_loadu_si512(static_cast<const char*>(src) + i * src_stride);
    for (int round = 0, b = kWords / 2; b >= 1; ++round, b /= 2)
      for (int i = 0; i < kWords; ++i)
        if ((i & b) == 0) {
          const __m512i x = r[i], y = r[i + b];
          r[i] = permute(x, low[round], y);
          r[i + b] = permute(x, high[round], y);
        }
    for (int i = 0; i < kWords; ++i) _mm512_storeu_si512(static_cast<char*>(dst) + i * dst_stride, r[i]);
  }
};

// The pairs_over_rows layout's copy: 32 16-bit words of two consecutive rows, interleaved word by
// word into 64 (row i's word, then row i + 1's), two two-source permutes. The call takes
// RegisterTranspose's arguments (dst's stride unused: the 64 words are one run).
struct RowInterleave {
  static constexpr int kWords = 32;  // words of each row per call
  static constexpr int kRows = 2, kDims = kWords;
  __m512i low, high;                 // the first and the second 32 words of the result
  RowInterleave() {
    alignas(64) uint16_t lo[kWords], hi[kWords];
    for (int c = 0; c < kWords; ++c) {
      lo[c] = uint16_t((c % 2) * kWords + c / 2);
      hi[c] = uint16_t((c % 2) * kWords + kWords / 2 + c / 2);
    }
    low = _mm512_load_si512(lo);
    high = _mm512_load_si512(hi);
  }
  void operator()(const void* src, int64_t src_stride, void* dst, int64_t /*dst_stride*/) const {
    const __m512i x = _mm512_loadu_si512(src);
    const __m512i y = _mm512_loadu_si512(static_cast<const char*>(src) + src_stride);
    _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(x, low, y));
    _mm512_storeu_si512(static_cast<uint16_t*>(dst) + kWords, _mm512_permutex2var_epi16(x, high, y));
  }
};
#endif

struct Bf16Panel {
  Scratch buffer;  // fp32 words, two bf16 values each
  Scratch staged;  // a block of paged rows that crosses pages, gathered to be transposed as one
  int64_t first = 0, ld = 0;
  Bf16Layout layout = Bf16Layout::rows;

  void load(const Tensor& t, int64_t b, int64_t h, Range rows, int64_t dim, Bf16Layout how) {
    load(TensorRows{&t, b}, h, rows, dim, how);
  }
  template <class Rows>
  void load(const Rows& src, int64_t h, Range rows, int64_t dim, Bf16Layout how) {
    layout = how;
    first = align_down(rows.begin, kTileN);
    const int64_t span = round_up(std::max<int64_t>(rows.end - first, 1), kTileN);
    const int64_t dim_padded = round_up(dim, kLanes);
    int64_t size = 0;
    switch (layout) {
      case Bf16Layout::rows: ld = dim_padded, size = span * ld; break;
      // Padded by one vector for the same reason as a transposed Panel: rows read one after another.
      case Bf16Layout::pairs_over_dim: ld = 2 * (span + kLanes), size = dim_padded / 2 * ld; break;
      case Bf16Layout::pairs_over_rows: ld = 2 * dim_padded, size = span / 2 * ld; break;
      case Bf16Layout::columns: ld = span + 2 * kLanes, size = round_up(dim, kDimRows) * ld; break;
    }
    uint16_t* data = reinterpret_cast<uint16_t*>(buffer.reserve((size + 1) / 2));
    zero_unwritten(data, size, rows.begin - first, rows.end - first, dim);
    const uint16_t* const elements = static_cast<const uint16_t*>(src.t->data);
    const auto copy_row = [&](int64_t row) {  // one row element by element (rows: as one run)
      const uint16_t* from = elements + src.offset(row, h);
      const int64_t i = row - first;
      if (layout == Bf16Layout::rows) std::copy_n(from, dim, data + i * ld);
      else for (int64_t d = 0; d < dim; ++d) data[index(i, d)] = from[d];
    };
    int64_t r = rows.begin;
#if FMHA_CPU_LEVEL >= 2
    // The layouts other than rows: blocks of copy::kRows rows by copy::kDims dims through
    // registers, the dims past the last whole block element by element, the rows past the last
    // whole block below. pairs_over_rows starts on a pair's first row.
    const auto blocks = [&](const auto& copy) {
      constexpr int64_t kRows = std::remove_reference_t<decltype(copy)>::kRows;
      constexpr int64_t kDims = std::remove_reference_t<decltype(copy)>::kDims;
      constexpr int64_t kAhead = std::max(kRows, kPrefetchRows);  // rows prefetched ahead
      const int64_t row_stride = src.t->stride[1], block_dims = dim / kDims * kDims;
      for (; r + kRows <= rows.end; r += kRows) {
        for (int64_t i = r + kAhead; i < std::min(r + kAhead + kRows, rows.end); ++i)
          prefetch_row(*src.t, src.offset(i, h), dim);
        // Row r + i at block + i * stride: in place, or (a block that crosses into another page)
        // gathered into `staged` first, a copy of the block's rows that stays in L1.
        const uint16_t* block = elements + src.offset(r, h);
        int64_t stride = row_stride;
        if (!src.rows_follow(r, kRows)) {
          uint16_t* rows_here = reinterpret_cast<uint16_t*>(staged.reserve((kRows * dim + 1) / 2));
          for (int64_t i = 0; i < kRows; ++i) std::copy_n(elements + src.offset(r + i, h), dim, rows_here + i * dim);
          block = rows_here;
          stride = dim;
        }
        for (int64_t d = 0; d < block_dims; d += kDims)
          copy(block + d, stride * int64_t(sizeof(uint16_t)), data + index(r - first, d),
               ld * int64_t(sizeof(uint16_t)));
        for (int64_t i = 0; i < kRows; ++i)
          for (int64_t d = block_dims; d < dim; ++d) data[index(r + i - first, d)] = block[i * stride + d];
      }
    };
    if (layout == Bf16Layout::pairs_over_rows && (r - first) % 2 != 0 && r < rows.end) {
      copy_row(r);
      ++r;
    }
    switch (layout) {
      case Bf16Layout::rows: break;
      case Bf16Layout::columns: blocks(RegisterTranspose<uint16_t>()); break;         // dst row d: rows r..
      case Bf16Layout::pairs_over_dim: blocks(RegisterTranspose<uint32_t>()); break;  // dst row d / 2: pairs
      case Bf16Layout::pairs_over_rows: blocks(RowInterleave()); break;               // dst row i / 2: i, i + 1
    }
#endif
    for (; r < rows.end; ++r) {
      if (r + kPrefetchRows < rows.end) prefetch_row(*src.t, src.offset(r + kPrefetchRows, h), dim);
      copy_row(r);
    }
  }
  // Zeroes the words of data[0, size) that the copy of rows [lo, hi) (counted from `first`) and
  // dims [0, dim) leaves alone: the padding the matmuls read. Zeroing the whole panel instead
  // wrote it twice (a decoding call's panels serve a few query rows: 6 % of its time went to
  // that memset; docs/PERF.md). A line of the layout (a pair of dims, a pair of rows, a dim)
  // whose elements the copy writes only in part is zeroed whole before the copy.
  void zero_unwritten(uint16_t* data, int64_t size, int64_t lo, int64_t hi, int64_t dim) const {
    constexpr uint16_t kZero = 0;
    // The line of `length` words at word `at`: the copy writes its words [w0, w1) when `whole`, else none.
    const auto line = [&](int64_t at, int64_t length, bool whole, int64_t w0, int64_t w1) {
      if (!whole || w1 <= w0) {
        std::fill_n(data + at, length, kZero);
        return;
      }
      std::fill_n(data + at, w0, kZero);
      std::fill_n(data + at + w1, length - w1, kZero);
    };
    switch (layout) {
      case Bf16Layout::rows:  // line = a row, written in dims [0, dim)
        for (int64_t i = 0; i * ld < size; ++i) line(i * ld, ld, i >= lo && i < hi, 0, dim);
        break;
      case Bf16Layout::pairs_over_dim:  // line = a pair of dims, written in rows [lo, hi)
        for (int64_t pair = 0; pair * ld < size; ++pair) line(pair * ld, ld, 2 * pair + 1 < dim, 2 * lo, 2 * hi);
        break;
      case Bf16Layout::pairs_over_rows:  // line = a pair of rows, written in dims [0, dim)
        for (int64_t pair = 0; pair * ld < size; ++pair)
          line(pair * ld, ld, 2 * pair >= lo && 2 * pair + 1 < hi, 0, 2 * dim);
        break;
      case Bf16Layout::columns:  // line = a dim, written in rows [lo, hi)
        for (int64_t d = 0; d * ld < size; ++d) line(d * ld, ld, d < dim, lo, hi);
        break;
    }
  }
  // Where element (row first + i, d) lies in the buffer, in 16-bit words.
  int64_t index(int64_t i, int64_t d) const {
    switch (layout) {
      case Bf16Layout::rows: return i * ld + d;
      case Bf16Layout::pairs_over_dim: return (d / 2) * ld + 2 * i + d % 2;
      case Bf16Layout::pairs_over_rows: return (i / 2) * ld + 2 * d + i % 2;
      case Bf16Layout::columns: break;
    }
    return d * ld + i;
  }
  void trim(int64_t max_floats) { buffer.trim(max_floats); }
  // The tile whose first row is `row` (a multiple of 64 at or after `first`).
  const uint16_t* tile(int64_t row) const {
    const uint16_t* data = reinterpret_cast<const uint16_t*>(buffer.get());
    switch (layout) {
      case Bf16Layout::rows: return data + (row - first) * ld;
      case Bf16Layout::pairs_over_dim: return data + 2 * (row - first);
      case Bf16Layout::columns: return data + (row - first);
      case Bf16Layout::pairs_over_rows: break;
    }
    return data + (row - first) / 2 * ld;
  }
};

float score_sign(const Problem& s) { return s.scale < 0.0f ? -1.0f : 1.0f; }

// A 64-wide score row (keys col0..) made ready for the row max: x = sign(scale)·(q·k) on the keys
// in `visible`, -inf elsewhere. Multiplying by ±1 is exact.
void sign_and_mask_row(float* s, float sign, int64_t col0, Range visible, bool full) {
  if (full) {
    if (sign < 0.0f)
      for (int v = 0; v < kVecsN; ++v) store(s + v * kLanes, -load(s + v * kLanes));
    return;
  }
  for (int64_t c = 0; c < kTileN; ++c) {
    const int64_t key = col0 + c;
    s[c] = (key >= visible.begin && key < visible.end) ? s[c] * sign : kNegInf;
  }
}

// How the work of one head is cut: chunks of `chunk_tiles` tiles, enough chunks overall to keep
// every thread busy, at most config.max_chunk_tiles tiles each (bounding per-chunk state). The
// key and query blocks (how many rows are converted at once) come from the config too
// (src/cpu/cpu_config.h); they are multiples of both tile sizes.
constexpr int64_t kItemsPerThread = 4;  // dynamic scheduling slack
static_assert(kTileM == 64 && kTileN == 64, "cpu_config.h's blocks are multiples of 64");

// `whole`: a head may be one chunk whatever its length, which it is where the heads alone give
// every thread its items: kItemsPerThread of them, or one or more each with the threads busy for
// at least kWholeHeadBalance of the rounds they take. The fused backward then forms its own
// statistics (takes_own_statistics) and saves a sixth to two sevenths of its matmuls. Where the heads
// balance the threads so, a chunk is also never cut shorter than the head (up to
// max_chunk_tiles): cutting a short head in two only loads its K/V panels twice (B1 H4 S192 D128
// fp32 on 2 threads: forward +10-14 %, backward +15-19 %; docs/PERF.md).
constexpr double kWholeHeadBalance = 0.85;

int64_t chunk_tiles(int64_t tiles_per_head, int64_t heads_total, int threads, const CpuConfig& config,
                    bool whole = false) {
  const int64_t wanted = kItemsPerThread * threads;
  const int64_t chunks_per_head = std::max<int64_t>(1, (wanted + heads_total - 1) / std::max<int64_t>(heads_total, 1));
  const int64_t rounds = (heads_total + threads - 1) / threads;
  const bool balanced = heads_total >= threads && double(heads_total) >= kWholeHeadBalance * double(rounds * threads);
  if (whole && (chunks_per_head == 1 || balanced)) return std::max<int64_t>(1, tiles_per_head);
  if (balanced) return std::clamp<int64_t>(tiles_per_head, 1, config.max_chunk_tiles);
  return std::clamp<int64_t>((tiles_per_head + chunks_per_head - 1) / chunks_per_head, 1, config.max_chunk_tiles);
}

// ------------------------------------------------------------------------------------------------
// Forward: one item = (batch, KV head, chunk of query tiles), for every query head of the group.
// ------------------------------------------------------------------------------------------------

struct ForwardScratch {
  Panel q;                 // [group heads x chunk rows, dp] queries (one panel per head, reloaded)
  Panel k, v, vt;          // [key block, dp], [key block, dvp] as read; V^T [dvr, key block]
  Panel kt;                // K^T [dp, key block] (forward_chunk_rows)
  Scratch q_all;           // [group][chunk rows][dp] the item's query rows, then
  Scratch q_cols;          // [dp][total + kLanes] them as columns: Q^T, the B operand of S^T = K·Q^T
  Scratch s;               // [kTileN keys, kTileM queries] S^T, then P^T (exp2 domain)
  Scratch acc;             // [total / kTileM][dvr][kTileM] unnormalised O^T, tile by tile
  Scratch row_max, row_sum;  // [total]
  Scratch rows;            // [kTileM][dvp] one tile's O, back in rows
  Scratch row;             // one row of O (the merge of decode's key parts)
  // bf16 operands (kBf16: bf16 storage on a path with vdpbf16ps)
  Bf16Panel q_bf16, k_bf16, v_bf16;  // one head's queries (pairs over dim), K rows, V columns
  Scratch q_cols_bf16;     // [dp / 2 pairs][total + kLanes columns][2] Q^T over the item's query rows
  Scratch p_bf16;          // [kTileN / 2 pairs][kTileM][2] P^T rounded to bf16, pairs over the keys

  void trim(int64_t max_floats) {
    for (Panel* panel : {&q, &k, &v, &vt, &kt}) panel->trim(max_floats);
    for (Bf16Panel* panel : {&q_bf16, &k_bf16, &v_bf16}) panel->trim(max_floats);
    for (Scratch* buffer : {&q_all, &q_cols, &s, &acc, &row_max, &row_sum, &rows, &row, &q_cols_bf16, &p_bf16})
      buffer->trim(max_floats);
  }
};

// Per-thread scratch, kept across calls: the pool's threads live on (common/parallel.h), so a
// short call finds its buffers allocated and their pages mapped. A buffer larger than
// kKeptScratchFloats is given back at the thread's first use in a later parallel_for call, so
// that one large call does not hold its memory for the life of the process.
constexpr int64_t kKeptScratchFloats = int64_t(1) << 20;  // 4 MiB

template <class T>
T& thread_scratch() {
  thread_local T scratch;
  thread_local uint64_t epoch = 0;
  const uint64_t now = parallel_call_epoch();
  if (epoch != now) {
    epoch = now;
    scratch.trim(kKeptScratchFloats);
  }
  return scratch;
}

// The tile registers of a work item's bf16 matmuls: a TileSession (src/cpu/simd.h; configured on
// the amxbf16 path, nothing on the others) where the item multiplies bf16, nothing otherwise.
struct NoTiles {};
template <bool kBf16>
using ItemTiles = std::conditional_t<kBf16, TileSession, NoTiles>;

// kBf16: bf16 storage multiplied as stored, with fp32 accumulation (vdpbf16ps; tdpbf16ps on the
// amxbf16 path): S = Q·K^T on the stored values, and O += P·V with P rounded to bf16 (as the GPU
// tiers' bf16 tensor-core matmuls do); the softmax stays in fp32. Otherwise every operand is
// converted to fp32 first.
//
// Where a forward item's result goes: nullptr, the output tensors; otherwise one part of a call
// whose keys are split (decode-shaped calls, see key_parts), merged into the outputs later.
struct ForwardPart {
  float* acc = nullptr;      // [group][rows][dvp] the unnormalised output over this part's keys
  float* row_max = nullptr;  // [group][rows] its running max (of x, unscaled), -inf where no key was visible
  float* row_sum = nullptr;  // [group][rows] its sum of exp2((x - max)·|scale_log2|)
};

// The forward's tile of kTileM consecutive rows from `first` of an item's group rows (head g's
// query rows.begin + r at row g * n + r; n = rows rounded up to whole tiles, or, packed, n =
// rows): rows [0, valid) hold queries, which span `queries`; query_of(r) is row r's query.
struct GroupTile {
  int64_t valid;
  Range queries;
  int64_t first, n, rows_begin;

  GroupTile(Range rows, int64_t group, int64_t n_, bool packed, int64_t first_)
      : first(first_), n(n_), rows_begin(rows.begin) {
    const int64_t g = first / n, r_off = first % n;
    valid = packed ? std::min(kTileM, group * n - first) : std::min(kTileM, rows.size() - r_off);
    queries = packed && (first + valid - 1) / n != g ? rows  // rows of two or more heads
                                                      : Range{rows.begin + r_off, rows.begin + r_off + valid};
  }
  int64_t query_of(int64_t r) const { return rows_begin + (first + r) % n; }
};

// One query row's forward result (query `query` of head h): its unnormalised output `a` (the head
// dim rounded up to kLanes, normalised in place), running max and sum. To row j of the part
// buffers where the call's keys are split (the merge normalises), else O = a / sum and LSE =
// ln(sum) + max·|scale|; a row that saw nothing gets 0 and -inf.
void finish_forward_row(const Params& p, const Problem& s, const ForwardPart* part, int64_t b, int64_t h,
                        int64_t query, int64_t j, float* a, float row_max, float row_sum) {
  if (part) {
    const int64_t dvp = round_up(s.head_dim_v, kLanes);
    std::copy_n(a, dvp, part->acc + j * dvp);
    part->row_max[j] = row_max;
    part->row_sum[j] = row_sum;
    return;
  }
  const float inv = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
  for (int64_t d = 0; d < s.head_dim_v; ++d) a[d] *= inv;
  write_row(p.o, offset4(p.o, b, query, h, 0), s.head_dim_v, a);
  if (p.lse.defined()) {
    const float lse = row_sum > 0.0f ? row_max * std::abs(s.scale) + std::log(row_sum) : kNegInf;
    static_cast<float*>(p.lse.data)[offset3(p.lse, b, h, query)] = lse;
  }
}

// The forward of an item whose tiles hold at most kRowBlock queries (decode: a query or a few per
// head): row-major S = Q·K^T tiles and a softmax per row, as a query-major tile would be kLanes
// queries wide and mostly padding. forward_chunk takes every other item.
// Its K and V panels serve only the item's few rows, so a key block larger than a core's L2 buys
// no reuse and misses it: the key block is cut to kRowsPanelBytes of panels (fp32 D128 decoding at
// 2,048 keys a block ran 1.3x slower than at 512; docs/PERF.md).
inline constexpr int64_t kRowsPanelBytes = int64_t(512) << 10;
template <bool kBf16>
void forward_chunk_rows(const Params& p, const Problem& s, const CpuConfig& config, int64_t b, int64_t kv_head, Range rows,
                   Range key_part, const ForwardPart* part, const KeyPages* pages, ForwardScratch& t) {
  [[maybe_unused]] const ItemTiles<kBf16> tile_session{};
  const int64_t dp = round_up(s.head_dim, kLanes), dvp = round_up(s.head_dim_v, kLanes);
  const int64_t panel_key_bytes = (dp + dvp) * int64_t(kBf16 ? sizeof(uint16_t) : sizeof(float));
  const int64_t key_block =
      std::min(config.key_block, std::max(kTileN, align_down(kRowsPanelBytes / panel_key_bytes, kTileN)));
  // The group's query rows one after another, head by head: row g * n + r is query rows.begin + r
  // of head kv_head * group + g. With a tile or more of rows per head each head's rows are padded
  // to whole tiles (n = rows rounded up); with fewer (decode: a query or a few per head) they are
  // packed (n = rows), so that one tile holds the rows of several heads: one matmul over K and
  // one over V per key tile serve the whole group, instead of one nearly empty tile per head.
  const bool packed = rows.size() < kTileM && s.group > 1;
  const int64_t n = packed ? rows.size() : round_up(rows.size(), kTileM);
  const int64_t total = round_up(s.group * n, kTileM);  // every tile's rows, padding included
  // The rows the matmuls read and write: each tile's valid rows rounded up to half a register
  // block (decode's 4 packed rows stay 4, not the tile's 64, zeroed for every item).
  const int64_t used = round_up(s.group * n, kHalfRowBlock);
  float* acc = t.acc.reserve(total * dvp);  // [total][dvp] O, row-major
  float* row_max = t.row_max.reserve(total);
  float* row_sum = t.row_sum.reserve(total);
  float* q_all = kBf16 ? nullptr : t.q_all.reserve(total * dp);
  uint16_t* q_all_bf16 = kBf16 ? reinterpret_cast<uint16_t*>(t.q_cols_bf16.reserve(total * dp / 2)) : nullptr;
  uint16_t* p_bf16 = kBf16 ? reinterpret_cast<uint16_t*>(t.p_bf16.reserve(kTileM * kTileN / 2)) : nullptr;
  float* scores = t.s.reserve(kTileM * kTileN);
  const float sign = score_sign(s), scale_log2 = std::abs(s.scale_log2);
  std::fill_n(acc, used * dvp, 0.0f);
  std::fill_n(row_max, total, kNegInf);
  std::fill_n(row_sum, total, 0.0f);
  const Range keys = intersect(s.mask.keys(rows), key_part);

  if (!keys.empty()) {
    if constexpr (kBf16) std::fill_n(q_all_bf16, used * dp, uint16_t{0});
    else std::fill_n(q_all, used * dp, 0.0f);
  }
  if (!keys.empty())
    for (int64_t g = 0; g < s.group; ++g) {
      if constexpr (kBf16) {
        t.q_bf16.load(p.q, b, kv_head * s.group + g, rows, s.head_dim, Bf16Layout::rows);
        uint16_t* dst = q_all_bf16 + g * n * dp;
        for (int64_t r = 0; r < rows.size(); ++r) std::copy_n(t.q_bf16.tile(rows.begin + r), dp, dst + r * dp);
        continue;
      }
      t.q.load(p.q, b, kv_head * s.group + g, rows, s.head_dim, s.tf32);
      float* dst = q_all + g * n * dp;
      for (int64_t r = 0; r < rows.size(); ++r) std::copy_n(t.q.tile(rows.begin + r), dp, dst + r * dp);
    }

  for (int64_t block0 = align_down(keys.begin, key_block); block0 < keys.end; block0 += key_block) {
    const Range block = intersect(keys, Range{block0, block0 + key_block});
    with_key_rows(p, b, pages, [&](const auto& k_rows, const auto& v_rows) {
      if constexpr (kBf16) {
        t.k_bf16.load(k_rows, kv_head, block, s.head_dim, Bf16Layout::pairs_over_dim);
        t.v_bf16.load(v_rows, kv_head, block, s.head_dim_v, Bf16Layout::pairs_over_rows);
      } else {
        t.k.load(k_rows, kv_head, block, s.head_dim, s.tf32);
        t.kt.transpose_of(t.k, s.head_dim);
        t.v.load(v_rows, kv_head, block, s.head_dim_v, s.tf32);
      }
    });
    // Tiles of kTileM consecutive rows of the group's (padded or packed) rows.
    for (int64_t first = 0; first < s.group * n; first += kTileM) {
      const GroupTile tile(rows, s.group, n, packed, first);
      const int64_t valid = tile.valid;
      const Range tile_rows = tile.queries;
      const auto query_of = [&](int64_t r) { return tile.query_of(r); };
      const int64_t active = round_up(valid, kHalfRowBlock);
      const Range tile_keys = intersect(s.mask.keys(tile_rows), block);
      const int64_t q_tile = first * dp;  // offset in q_all / q_all_bf16
      float* acc_tile = acc + first * dvp;
      float* max_tile = row_max + first;
      float* sum_tile = row_sum + first;
      for (int64_t col0 = align_down(tile_keys.begin, kTileN); col0 < tile_keys.end; col0 += kTileN) {
        const Range cols{col0, col0 + kTileN};
        // Load K tile (from the panel); S = Q·K^T  [kTileM, kTileN]
        if constexpr (kBf16)
          gemm_bf16(active, kTileN, dp / 2, q_all_bf16 + q_tile, dp, t.k_bf16.tile(col0), t.k_bf16.ld, scores, kTileN,
                    false);
        else
          gemm(active, kTileN, dp, q_all + q_tile, dp, t.kt.tile(col0), t.kt.ld, scores, kTileN, false);
        const bool full = valid == kTileM && cols.end <= block.end && cols.begin >= block.begin &&
                          s.mask.tile_is_full(tile_rows, cols);
        for (int64_t r = 0; r < active; ++r) {
          float* srow = scores + r * kTileN;
          // Mask, row max, exp2, row sum, rescale.
          const Range visible = r < valid ? intersect(s.mask.keys(query_of(r)), block) : Range{};
          sign_and_mask_row(srow, sign, col0, visible, full);
          vf m = load(srow);
          for (int v = 1; v < kVecsN; ++v) {
            const vf x = load(srow + v * kLanes);
            m = x > m ? x : m;
          }
          const float new_max = std::max(max_tile[r], horizontal_max(m));
          const float base = new_max == kNegInf ? 0.0f : new_max;  // nothing visible yet
          vf sum{};
          for (int v = 0; v < kVecsN; ++v) {
            const vf prob = exp2_nonpositive((load(srow + v * kLanes) - base) * scale_log2);
            store(srow + v * kLanes, prob);
            sum += prob;
          }
          // A row whose max did not grow keeps its scale: exp2(0) is 1 exactly, so the common case
          // skips evaluating it.
          const float rescale =
              new_max == max_tile[r] ? 1.0f : exp2_nonpositive(splat((max_tile[r] - base) * scale_log2))[0];
          sum_tile[r] = sum_tile[r] * rescale + horizontal_sum(sum);
          max_tile[r] = new_max;
          if (rescale != 1.0f) {
            float* a = acc_tile + r * dvp;
            for (int64_t d = 0; d < dvp; d += kLanes) store(a + d, load(a + d) * rescale);
          }
        }
        // Load V tile (from the panel); O += P·V
        if constexpr (kBf16) {
          to_bf16(scores, p_bf16, active * kTileN);
          gemm_bf16(active, dvp, kTileN / 2, p_bf16, kTileN, t.v_bf16.tile(col0), t.v_bf16.ld, acc_tile, dvp, true);
        } else {
          if (s.tf32) round_tile_to_tf32(scores, active * kTileN);
          gemm(active, dvp, kTileN, scores, kTileN, t.v.tile(col0), dvp, acc_tile, dvp, true);
        }
      }
    }
  }

  // Epilogue: O = acc / row_sum, LSE = ln(row_sum) + max; rows that saw nothing get 0 and -inf.
  for (int64_t g = 0; g < s.group; ++g)
    for (int64_t r = 0; r < rows.size(); ++r) {
      const int64_t i = g * n + r;
      finish_forward_row(p, s, part, b, kv_head * s.group + g, rows.begin + r, g * rows.size() + r, acc + i * dvp,
                         row_max[i], row_sum[i]);
    }
}

// The forward works on S^T tiles [kTileN keys, kTileM queries] (S^T = K·Q^T, O^T += V^T·P^T): a
// vector holds kLanes queries, so the softmax (mask, max, exp2, sums, rescale) is lane-wise over
// the tile's key rows, with no reduction across lanes and no scalar work per query. The products
// are those of S = Q·K^T and O += P·V, each output's terms summed in the same order.
//
// One query tile's online-softmax update over one S^T tile: lanes [0, active) are the tile's
// queries, lane r sees the keys col0 + [lo[r], hi[r]) (relative, clamped to [0, kTileN]; every key
// where `full`). max_tile and sum_tile are the queries' running max (of x = sign(scale)·s,
// unscaled) and sum of exp2((x - max)·|scale_log2|); rescale gets what each query's O^T column
// must be multiplied by. Returns whether any factor is not 1. P^T goes to `pairs` as the bf16
// B operand of the V matmul (kPairs: element (c, q) at pairs[(c / 2) * 2 * kTileM + 2 * q + c % 2],
// as to_bf16_pairs lays it out), else over S^T in place.
//
// The running max is allowed to trail the true one by up to kStaleMaxLog2 (in exp2's units): a
// query keeps its max, and O^T its column, unless a tile's scores pass it by more, so that P is
// at most 2^kStaleMaxLog2 and fp32 holds P, the sums and O^T with room to spare, while the
// rescale of O^T (a pass over the accumulator, which the V matmul then waits to read back) runs
// only where a max moves that far; with a max that grows a little now and then, as a row's
// running max does over random scores, that is about a query's first tile only. O and the LSE
// are the same function of the max and the sum whichever max the sum is taken against.
constexpr float kStaleMaxLog2 = 8.0f;

template <bool kPairs>
bool forward_softmax_step(float* st, int64_t active, const int32_t* lo, const int32_t* hi, bool full, float sign,
                          float* max_tile, float* sum_tile, float* rescale, float scale_log2, uint16_t* pairs) {
  bool any_rescale = false;
  for (int64_t q0 = 0; q0 < active; q0 += kLanes) {
    if (!full) {
      vi lo_v, hi_v;
      std::memcpy(&lo_v, lo + q0, sizeof lo_v);
      std::memcpy(&hi_v, hi + q0, sizeof hi_v);
      for (int32_t c = 0; c < int32_t(kTileN); ++c) {
        float* x = st + c * kTileM + q0;
        store(x, (lo_v <= c && hi_v > c) ? load(x) * sign : splat(kNegInf));  // exact: sign is ±1
      }
    } else if (sign < 0.0f) {
      for (int64_t c = 0; c < kTileN; ++c) store(st + c * kTileM + q0, -load(st + c * kTileM + q0));
    }
    const vf old_max = load(max_tile + q0);
    const vf tile_max = key_rows_max(st, q0, old_max);  // at least old_max
    // A query that has seen keys keeps its max unless this tile passes it by more than
    // kStaleMaxLog2; one that has not takes the tile's (-inf while it still sees none).
    const vf m = old_max != kNegInf && (tile_max - old_max) * scale_log2 <= kStaleMaxLog2 ? old_max : tile_max;
    const vf base = m == kNegInf ? splat(0.0f) : m;  // nothing visible yet
    vf sum{};
    for (int64_t c = 0; c < kTileN; c += 2) {
      float* x = st + c * kTileM + q0;
      const vf even = exp2_clamped<false>((load(x) - base) * scale_log2);  // arguments <= kStaleMaxLog2
      const vf odd = exp2_clamped<false>((load(x + kTileM) - base) * scale_log2);
      sum += even;
      sum += odd;
      if constexpr (kPairs) {
        store_bf16_pairs(pairs + c * kTileM + 2 * q0, even, odd);
      } else {
        store(x, even);
        store(x + kTileM, odd);
      }
    }
    // O^T's column and the sum move to the new max where it moved from a finite one: most tiles
    // skip the exp2. (A query that saw nothing before has a sum and a column of zeros.)
    bool moved = false;
    for (int l = 0; l < kLanes; ++l) moved |= old_max[l] != m[l] && old_max[l] != kNegInf;
    const vf factor = !moved ? splat(1.0f)
                             : old_max == m || old_max == kNegInf ? splat(1.0f)
                                                                  : exp2_nonpositive((old_max - base) * scale_log2);
    store(sum_tile + q0, load(sum_tile + q0) * factor + sum);
    store(max_tile + q0, m);
    store(rescale + q0, factor);
    any_rescale |= moved;
  }
  return any_rescale;
}

template <bool kBf16>
void forward_chunk(const Params& p, const Problem& s, const CpuConfig& config, int64_t b, int64_t kv_head, Range rows,
                   Range key_part, const ForwardPart* part, const KeyPages* pages, ForwardScratch& t) {
  const bool packed = rows.size() < kTileM && s.group > 1;
  if ((packed ? s.group * rows.size() : rows.size()) <= kRowBlock)  // before this item's tile session
    return forward_chunk_rows<kBf16>(p, s, config, b, kv_head, rows, key_part, part, pages, t);
  [[maybe_unused]] const ItemTiles<kBf16> tile_session{};
  const int64_t key_block = config.key_block;
  const int64_t dp = round_up(s.head_dim, kLanes), dvp = round_up(s.head_dim_v, kLanes);
  const int64_t dvr = round_up(s.head_dim_v, kDimRows);  // O^T's rows: the matmul's row blocks
  // The group's query rows one after another, head by head: row g * n + r is query rows.begin + r
  // of head kv_head * group + g. With a tile or more of rows per head each head's rows are padded
  // to whole tiles (n = rows rounded up); with fewer (decode: a query or a few per head) they are
  // packed (n = rows), so that one tile holds the rows of several heads: one matmul over K and
  // one over V per key tile serve the whole group, instead of one nearly empty tile per head.
  const int64_t n = packed ? rows.size() : round_up(rows.size(), kTileM);
  const int64_t total = round_up(s.group * n, kTileM);  // every tile's rows, padding included
  const int64_t ldq = total + kLanes;  // Q^T's row length: see Panel::load on padding by a vector
  float* acc = t.acc.reserve(total * dvr);
  float* row_max = t.row_max.reserve(total);
  float* row_sum = t.row_sum.reserve(total);
  float* q_all = kBf16 ? nullptr : t.q_all.reserve(total * dp);
  float* q_cols = kBf16 ? nullptr : t.q_cols.reserve(dp * ldq);
  uint16_t* q_cols_bf16 = kBf16 ? reinterpret_cast<uint16_t*>(t.q_cols_bf16.reserve((dp * ldq + 1) / 2)) : nullptr;
  uint16_t* p_bf16 = kBf16 ? reinterpret_cast<uint16_t*>(t.p_bf16.reserve(kTileM * kTileN / 2)) : nullptr;
  float* scores = t.s.reserve(kTileM * kTileN);
  float* out_rows = t.rows.reserve(kTileM * std::max(dvp, dvr));
  const float sign = score_sign(s), scale_log2 = std::abs(s.scale_log2);
  std::fill_n(acc, total * dvr, 0.0f);
  std::fill_n(row_max, total, kNegInf);
  std::fill_n(row_sum, total, 0.0f);
  const Range keys = intersect(s.mask.keys(rows), key_part);

  if (!keys.empty()) {
    if constexpr (kBf16) {
      std::fill_n(q_cols_bf16, dp * ldq, uint16_t{0});
      // Each head's queries as Q^T pairs over the head dim, placed at columns g * n on.
      for (int64_t g = 0; g < s.group; ++g) {
        t.q_bf16.load(p.q, b, kv_head * s.group + g, rows, s.head_dim, Bf16Layout::pairs_over_dim);
        const uint16_t* src = t.q_bf16.tile(rows.begin);
        for (int64_t pair = 0; pair < dp / 2; ++pair)
          std::copy_n(src + pair * t.q_bf16.ld, 2 * rows.size(), q_cols_bf16 + pair * 2 * ldq + 2 * g * n);
      }
    } else {
      std::fill_n(q_all, total * dp, 0.0f);
      for (int64_t g = 0; g < s.group; ++g) {
        t.q.load(p.q, b, kv_head * s.group + g, rows, s.head_dim, s.tf32);
        float* dst = q_all + g * n * dp;
        for (int64_t r = 0; r < rows.size(); ++r) std::copy_n(t.q.tile(rows.begin + r), dp, dst + r * dp);
      }
      transpose(q_all, dp, total, dp, q_cols, ldq);
    }
  }

  alignas(kAlign) int32_t lo[kTileM], hi[kTileM];
  alignas(kAlign) float rescale[kTileM];
  for (int64_t block0 = align_down(keys.begin, key_block); block0 < keys.end; block0 += key_block) {
    const Range block = intersect(keys, Range{block0, block0 + key_block});
    with_key_rows(p, b, pages, [&](const auto& k_rows, const auto& v_rows) {
      if constexpr (kBf16) {
        t.k_bf16.load(k_rows, kv_head, block, s.head_dim, Bf16Layout::rows);
        t.v_bf16.load(v_rows, kv_head, block, s.head_dim_v, Bf16Layout::columns);
      } else {
        t.k.load(k_rows, kv_head, block, s.head_dim, s.tf32);
        t.v.load(v_rows, kv_head, block, s.head_dim_v, s.tf32);
        t.vt.transpose_of(t.v, s.head_dim_v);
      }
    });
    // Tiles of kTileM consecutive rows of the group's (padded or packed) rows.
    for (int64_t first = 0; first < s.group * n; first += kTileM) {
      const GroupTile tile(rows, s.group, n, packed, first);
      const int64_t valid = tile.valid;
      const Range tile_rows = tile.queries;
      const auto query_of = [&](int64_t r) { return tile.query_of(r); };
      const int64_t active = round_up(valid, kLanes);
      const Range tile_keys = intersect(s.mask.keys(tile_rows), block);
      float* acc_tile = acc + first * dvr;  // [dvr][kTileM]
      float* max_tile = row_max + first;
      float* sum_tile = row_sum + first;
      for (int64_t col0 = align_down(tile_keys.begin, kTileN); col0 < tile_keys.end; col0 += kTileN) {
        const Range cols{col0, col0 + kTileN};
        // Load K tile (from the panel); S^T = K·Q^T  [kTileN keys, active queries]
        if constexpr (kBf16)
          gemm_bf16(kTileN, active, dp / 2, t.k_bf16.tile(col0), t.k_bf16.ld, q_cols_bf16 + 2 * first, 2 * ldq, scores,
                    kTileM, false);
        else
          gemm(kTileN, active, dp, t.k.tile(col0), t.k.ld, q_cols + first, ldq, scores, kTileM, false);
        // Mask, max, exp2, sums, rescale: every query of the tile at once.
        const bool full = valid == kTileM && cols.end <= block.end && cols.begin >= block.begin &&
                          s.mask.tile_is_full(tile_rows, cols);
        if (!full)
          for (int64_t r = 0; r < active; ++r) {
            const Range visible = r < valid ? intersect(intersect(s.mask.keys(query_of(r)), block), cols) : Range{};
            lo[r] = int32_t(visible.empty() ? 0 : visible.begin - col0);
            hi[r] = int32_t(visible.empty() ? 0 : visible.end - col0);
          }
        if (forward_softmax_step<kBf16>(scores, active, lo, hi, full, sign, max_tile, sum_tile, rescale, scale_log2,
                                        p_bf16))
          for (int64_t d = 0; d < dvr; ++d)
            for (int64_t q0 = 0; q0 < active; q0 += kLanes)
              store(acc_tile + d * kTileM + q0, load(acc_tile + d * kTileM + q0) * load(rescale + q0));
        // Load V tile (from the panel); O^T += V^T·P^T
        if constexpr (kBf16) {
          gemm_bf16(dvr, active, kTileN / 2, t.v_bf16.tile(col0), t.v_bf16.ld, p_bf16, 2 * kTileM, acc_tile, kTileM,
                    true);
        } else {
          if (s.tf32) round_tile_to_tf32(scores, kTileN * kTileM);
          gemm(dvr, active, kTileN, t.vt.tile(col0), t.vt.ld, scores, kTileM, acc_tile, kTileM, true);
        }
      }
    }
  }

  // Epilogue: O = acc / row_sum, LSE = ln(row_sum) + max; rows that saw nothing get 0 and -inf.
  for (int64_t first = 0; first < s.group * n; first += kTileM) {
    transpose(acc + first * dvr, kTileM, dvp, kTileM, out_rows, dvp);  // this tile's O^T back to rows
    for (int64_t r = 0; r < kTileM && first + r < s.group * n; ++r) {
      const int64_t i = first + r, g = i / n, q = i % n;
      if (q >= rows.size()) continue;  // a padding row
      finish_forward_row(p, s, part, b, kv_head * s.group + g, rows.begin + q, g * rows.size() + q,
                         out_rows + r * dvp, row_max[i], row_sum[i]);
    }
  }
}

// Decode-shaped calls (a few query rows, many keys) have fewer query tiles than the threads need:
// their keys are then cut into parts that run on different threads, each a forward over its keys
// that keeps its running max, sum and unnormalised output, merged afterwards in part order as the
// online softmax merges key tiles (no detour through a rounded LSE, which would cost large logits
// their precision). The number of parts, 1 when the query tiles are enough, depends on the
// machine's thread count, not on the count asked for, so that a call's result does not either.
constexpr int64_t kMinPartTiles = 4;  // 256 keys: a part's fixed cost (Q conversion, epilogue) stays small

int64_t key_parts(const std::vector<Problem>& problems, int threads) {
  int64_t items = 0, key_tiles = 0;
  for (const Problem& s : problems) {
    items += s.batch * s.kv_heads * tiles(s.seqlen_q, kTileM);
    key_tiles = std::max(key_tiles, tiles(s.seqlen_k, kTileN));
  }
  const int64_t wanted = kItemsPerThread * threads;
  if (items >= wanted || items == 0) return 1;
  return std::clamp<int64_t>((wanted + items - 1) / items, 1, std::max<int64_t>(1, key_tiles / kMinPartTiles));
}

// One (batch, KV head) of a split call: merges its `parts` results (ForwardPart, laid out
// [parts][group][seqlen_q](...)) row by row into O and LSE, as forward_chunk's epilogue writes them.
void merge_parts(const Params& p, const Problem& s, int64_t b, int64_t kv_head, int64_t parts, const float* part_acc,
                 const float* part_max, const float* part_sum, float* row) {
  const int64_t dvp = round_up(s.head_dim_v, kLanes), rows = s.group * s.seqlen_q;
  const float scale_log2 = std::abs(s.scale_log2);
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t g = j / s.seqlen_q, r = j % s.seqlen_q, h = kv_head * s.group + g;
    float row_max = kNegInf;
    for (int64_t k = 0; k < parts; ++k) row_max = std::max(row_max, part_max[k * rows + j]);
    float row_sum = 0.0f;
    std::fill_n(row, dvp, 0.0f);
    if (row_max != kNegInf)
      for (int64_t k = 0; k < parts; ++k) {
        const float m = part_max[k * rows + j];
        if (m == kNegInf) continue;  // the part saw no key of this row
        // The rescale of the online softmax, part by part in order.
        const vf weight = exp2(splat((m - row_max) * scale_log2));
        row_sum += part_sum[k * rows + j] * weight[0];
        const float* a = part_acc + (k * rows + j) * dvp;
        for (int64_t d = 0; d < dvp; d += kLanes) store(row + d, load(row + d) + load(a + d) * weight);
      }
    const float inv = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
    for (int64_t d = 0; d < s.head_dim_v; ++d) row[d] *= inv;
    write_row(p.o, offset4(p.o, b, r, h, 0), s.head_dim_v, row);
    if (p.lse.defined()) {
      const float lse = row_sum > 0.0f ? row_max * std::abs(s.scale) + std::log(row_sum) : kNegInf;
      static_cast<float*>(p.lse.data)[offset3(p.lse, b, h, r)] = lse;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Backward
// ------------------------------------------------------------------------------------------------

// Per-row statistics of the backward. The softmax is not recovered from the stored LSE: an fp32
// LSE of magnitude ~100 (peaked softmax: large logits) is off by ~|LSE|·2^-24 in the exponent,
// an error in every P the recomputation forms, while a plain fp32 softmax gets the dominant P
// exactly (exp(s - max) = 1). So a statistics pass recomputes each row's max and sum online (as
// the forward does) from the very scores the fused pass forms again bit for bit (the matmul sums
// over the head dim in the same order whichever operand is A), and the fused pass takes
// P = exp2((x - max)·|scale|·log2 e) / sum from them: the dominant P is 1/sum exactly as in a
// plain softmax. That costs one matmul (S = Q·K^T) of the five the fused pass does.
//
// Scores enter the exp2 as (x - max)·|scale_log2| with x = sign(scale)·(q·k), not as
// x·scale_log2 - lse_log2: the difference of two unscaled scores is exact (Sterbenz) where it
// matters, so the exp2 argument carries a relative error of ~2^-24 of itself, not of |x|.
struct RowStats {
  std::vector<float> row_max;  // [B, H, Sq]: max of sign(scale)·(q·k) over the visible keys
  std::vector<float> inv_sum;  // [B, H, Sq]: 1 / sum of exp2((x - max)·|scale_log2|); 0 if none visible
  std::vector<float> delta;    // [B, H, Sq]: rowsum(dO ∘ O); for fp16/bf16 storage rowsum(P ∘ dP)
  // lse_factor's bound on how far another order of the same dot products may move a score:
  std::vector<float> q_norm;        // [B, H, Sq]: |q| of each query row
  std::vector<float> key_norm_max;  // [B, Hkv]: the largest |k| over a KV head's keys
};

// Room for the statistics: Δ (preprocess) and the rows' max and sum (the statistics pass).
RowStats allocate_stats(const Problem& s) {
  RowStats st;
  const int64_t n = s.batch * s.heads * s.seqlen_q;
  st.row_max.assign(size_t(n), kNegInf);
  st.inv_sum.assign(size_t(n), 0.0f);
  st.delta.resize(size_t(n));
  st.q_norm.resize(size_t(n));
  st.key_norm_max.assign(size_t(s.batch * s.kv_heads), 0.0f);
  return st;
}

// |x| of an fp32 row, summed in double (a bound's ingredient, not an operand) over kNormChains
// interleaved partial sums: independent chains, not one chain of dependent adds.
constexpr int kNormChains = 8;
double norm_of(const float* x, int64_t n) {
  double part[kNormChains] = {};
  int64_t i = 0;
  for (; i + kNormChains <= n; i += kNormChains)
    for (int c = 0; c < kNormChains; ++c) part[c] += double(x[i + c]) * double(x[i + c]);
  for (; i < n; ++i) part[0] += double(x[i]) * double(x[i]);
  double sum = 0.0;
  for (double v : part) sum += v;
  return std::sqrt(sum);
}

// Δ = rowsum(dO ∘ O) of one query row: dO rounded as the matmul operands are (tf32) and summed in
// the matmuls' order (one fused multiply-add per head dim element, first to last): where a row
// sees one key, O is that key's V as the matmuls see it and Δ equals dP bit for bit, so dS =
// P·(dP - Δ) is exactly 0, as it is in exact arithmetic. `deltas` takes kPreprocessRows rows at a
// time, their chains interleaved (each row's own order unchanged): one row's chain of dependent
// fused multiply-adds waits on the unit's latency at every step. Row r of dO at dout + r * ld_do,
// of O at o + r * ld_o.
constexpr int64_t kPreprocessRows = 8;
void deltas(const float* dout, int64_t ld_do, const float* o, int64_t ld_o, int64_t count, int64_t dv, float* out) {
  for (int64_t i0 = 0; i0 < count; i0 += kPreprocessRows) {
    const int64_t rows = std::min(kPreprocessRows, count - i0);
    float delta[kPreprocessRows] = {};
    for (int64_t d = 0; d < dv; ++d)
      for (int64_t r = 0; r < rows; ++r)
        delta[r] = multiply_add(dout[(i0 + r) * ld_do + d], o[(i0 + r) * ld_o + d], delta[r]);
    std::copy_n(delta, rows, out + i0);
  }
}

// Δ and each query row's |q| for the rows `rows` of head h (batch b) into `st`, from dO and Q as
// read (tf32 rounding applied where the call asks; row r of each at its panel's row r - first).
void query_row_stats(const Params& p, const Problem& s, RowStats& st, int64_t b, int64_t h, Range rows,
                     const float* dout, int64_t ld_do, const float* q, int64_t ld_q, int64_t first, float* o_rows) {
  const size_t stat0 = size_t((b * s.heads + h) * s.seqlen_q);
  for (int64_t i0 = rows.begin; i0 < rows.end; i0 += kPreprocessRows) {
    const int64_t count = std::min(kPreprocessRows, rows.end - i0);
    for (int64_t r = 0; r < count; ++r)
      read_row(p.o, offset4(p.o, b, i0 + r, h, 0), s.head_dim_v, o_rows + r * s.head_dim_v, false);
    deltas(dout + (i0 - first) * ld_do, ld_do, o_rows, s.head_dim_v, count, s.head_dim_v, st.delta.data() + stat0 + i0);
    for (int64_t r = 0; r < count; ++r)
      st.q_norm[stat0 + size_t(i0 + r)] = float(norm_of(q + (i0 + r - first) * ld_q, s.head_dim));
  }
}

// The largest |k| of KV head kv_head's keys (batch b): lse_factor's bound; key j's row at row_of(j).
template <class RowOf>
void key_row_stats(const Problem& s, RowStats& st, int64_t b, int64_t kv_head, RowOf&& row_of) {
  double key_norm_max = 0.0;
  for (int64_t j = 0; j < s.seqlen_k; ++j) key_norm_max = std::max(key_norm_max, norm_of(row_of(j), s.head_dim));
  st.key_norm_max[size_t(b * s.kv_heads + kv_head)] = float(key_norm_max);
}

// The statistics that come before the backward's passes, read from the tensors: Δ and |q| for
// query rows `rows` of head h (preprocess_rows), the largest |k| of KV head kv_head's keys
// (preprocess_keys).
void preprocess_rows(const Params& p, const Problem& s, RowStats& st, int64_t b, int64_t h, Range rows) {
  const int64_t dv = s.head_dim_v, dk = s.head_dim;
  std::vector<float> o_rows(size_t(kPreprocessRows * dv)), do_rows(size_t(kPreprocessRows * dv));
  std::vector<float> q_rows(size_t(kPreprocessRows * dk));
  for (int64_t i0 = rows.begin; i0 < rows.end; i0 += kPreprocessRows) {
    const int64_t count = std::min(kPreprocessRows, rows.end - i0);
    for (int64_t r = 0; r < count; ++r) {
      read_row(p.dout, offset4(p.dout, b, i0 + r, h, 0), dv, do_rows.data() + r * dv, s.tf32);
      read_row(p.q, offset4(p.q, b, i0 + r, h, 0), dk, q_rows.data() + r * dk, s.tf32);
    }
    query_row_stats(p, s, st, b, h, Range{i0, i0 + count}, do_rows.data(), dv, q_rows.data(), dk, i0, o_rows.data());
  }
}
void preprocess_keys(const Params& p, const Problem& s, RowStats& st, int64_t b, int64_t kv_head) {
  std::vector<float> k_row(static_cast<size_t>(s.head_dim));
  key_row_stats(s, st, b, kv_head, [&](int64_t j) {
    read_row(p.k, offset4(p.k, b, j, kv_head, 0), s.head_dim, k_row.data(), s.tf32);
    return static_cast<const float*>(k_row.data());
  });
}

// The statistics that come before the backward's passes, for one (batch, head) of a call (item =
// b * heads + h): Δ and |q| per query row, and (the item of a KV head's first query head) the
// largest |k| of its keys. A fused item that forms its own statistics computes these itself,
// from the panels it loads where they are fp32 (backward_chunk), and the call skips this pass.
void preprocess(const Params& p, const Problem& s, int64_t item, RowStats& st) {
  const int64_t b = item / s.heads, h = item % s.heads;
  preprocess_rows(p, s, st, b, h, Range{0, s.seqlen_q});
  if (h % s.group == 0) preprocess_keys(p, s, st, b, h / s.group);
}

// One key row of an S^T tile (queries row0.. as its columns) made ready for the softmax:
// x = sign(scale)·(q·k) where the query (in `rows`) and the key (in `cols`: the panels loaded) see
// each other, -inf elsewhere; `full` when the whole tile is visible. Multiplying by ±1 is exact.
void sign_and_mask_key_row(float* srow, const Problem& pr, float sign, int64_t key, int64_t row0, Range rows,
                           Range cols, bool full) {
  if (full) {
    if (sign < 0.0f)
      for (int v = 0; v < kVecsN; ++v) store(srow + v * kLanes, -load(srow + v * kLanes));
    return;
  }
  const Range visible = key >= cols.begin && key < cols.end ? intersect(pr.mask.queries(key), rows) : Range{};
  for (int64_t r = 0; r < kTileM; ++r) {
    const int64_t row = row0 + r;
    srow[r] = row >= visible.begin && row < visible.end ? srow[r] * sign : kNegInf;
  }
}

bool transposed_tile_is_full(const Problem& pr, Range rows, Range cols) {
  return rows.size() == kTileM && cols.size() == kTileN && pr.mask.tile_is_full(rows, cols);
}

// sign_and_mask_key_row over a whole S^T tile; rows and cols within the tile's.
void sign_and_mask_transposed(float* s, const Problem& pr, int64_t row0, int64_t col0, Range rows, Range cols) {
  const bool full = transposed_tile_is_full(pr, rows, cols);
  const float sign = score_sign(pr);
  for (int64_t c = 0; c < kTileN; ++c) sign_and_mask_key_row(s + c * kTileM, pr, sign, col0 + c, row0, rows, cols, full);
}

// The softmax of a backward tile is taken in two factors, each query's exponentials on its own
// max within the tile (the tile's base: 0 where the query sees none of the tile's keys), then one
// factor per query to its row's final max and sum:
//   E = exp2((x - tile base)·|scale_log2|),  P = E · exp2((tile base - max)·|scale_log2|) / sum.
// The statistics form E anyway (statistics_step); a fused item that forms its own statistics
// keeps them and needs one exp2 per query, not one per entry, for P (probabilities_from_exponents),
// and a fused item that does not forms the same E again (probabilities): the same bits either way.
// Where a query's max sits, its tile's base is that max, so that entry is 1/sum exactly.
vf probability_factor(vf tile_base, vf row_max, vf inv_sum, float scale_log2) {
  // A query that sees no key has max -inf and inv_sum 0: exp2 clamps the +inf argument, so 0.
  return exp2((tile_base - row_max) * scale_log2) * inv_sum;
}

// The max over a masked S^T tile's key rows of vector v of its kTileM queries (-inf where a query
// sees none of them), and the tile base taken from it (0 there).
vf tile_max(const float* s, int v) { return key_rows_max(s, v * kLanes, splat(kNegInf)); }
vf base_of(vf max) { return max == kNegInf ? splat(0.0f) : max; }

// P^T on a 64 x 64 tile of S^T (rows are keys col0.., columns queries row0..), masked, from the
// rows' statistics (RowStats; row_max and inv_sum indexed by query - row0). Only queries in
// `queries` and keys in `keys` count (the panels loaded).
void probabilities(float* s, const Problem& pr, int64_t row0, int64_t col0, Range queries, Range keys,
                   const float* row_max, const float* inv_sum) {
  const Range rows = intersect(queries, Range{row0, row0 + kTileM});
  const Range cols = intersect(keys, Range{col0, col0 + kTileN});
  const bool full = transposed_tile_is_full(pr, rows, cols);
  const float sign = score_sign(pr), scale_log2 = std::abs(pr.scale_log2);
  for (int64_t c = 0; c < kTileN; ++c) sign_and_mask_key_row(s + c * kTileM, pr, sign, col0 + c, row0, rows, cols, full);
  for (int v = 0; v < kVecsN; ++v) {
    const vf base = base_of(tile_max(s, v));
    const vf factor = probability_factor(base, load(row_max + v * kLanes), load(inv_sum + v * kLanes), scale_log2);
    for (int64_t c = 0; c < kTileN; ++c) {
      float* x = s + c * kTileM + v * kLanes;
      store(x, exp2_nonpositive((load(x) - base) * scale_log2) * factor);
    }
  }
}

// P^T in place of a tile of statistics_step's exponents E (masked entries 0), `base` its tile
// bases: P = E · probability_factor.
void probabilities_from_exponents(float* e, const float* base, const float* row_max, const float* inv_sum,
                                  float scale_log2) {
  for (int v = 0; v < kVecsN; ++v) {
    const vf factor = probability_factor(load(base + v * kLanes), load(row_max + v * kLanes),
                                         load(inv_sum + v * kLanes), scale_log2);
    for (int64_t c = 0; c < kTileN; ++c) store(e + c * kTileM + v * kLanes, load(e + c * kTileM + v * kLanes) * factor);
  }
}

// dS = P ∘ (dP - Δ), in place over P; Δ is per query: per row, or per column when transposed.
void score_gradient(float* p_to_ds, const float* dprob, const float* delta, bool transposed) {
  for (int64_t a = 0; a < kTileM; ++a)
    for (int64_t c = 0; c < kTileN; ++c) p_to_ds[a * kTileN + c] *= dprob[a * kTileN + c] - (transposed ? delta[c] : delta[a]);
}

static_assert(kTileM == kTileN, "the backward swaps the roles of score rows and columns");

// The backward's matmuls on fp32 operands (Panel), or with kBf16 on bf16 operands as stored
// (Bf16Panel, vdpbf16ps) with P and dS rounded to bf16 (as the GPU tiers' bf16 backward does);
// accumulation, softmax and dS arithmetic stay fp32 either way. A panel's role:
//   a:            the A operand, rows as stored (Panel row-major / Bf16Layout::rows)
//   b_rows:       a B operand whose matmul depth runs along the tensor's rows (row-major / pairs_over_rows)
//   b_dim:        a B operand whose depth runs along the head dim (transposed / pairs_over_dim)
//   a_transposed: the A operand of the tensor transposed, depth along its rows (transposed / columns)
enum class Role { a, b_rows, b_dim, a_transposed };

// fp32 panels of the row-major roles (a, b_rows); the transposed ones come from them
// (load_transposed, load_through_rows).
void load_operand(Panel& panel, const Tensor& t, int64_t b, int64_t h, Range rows, int64_t dim,
                  [[maybe_unused]] Role role, bool tf32) {
  assert(role == Role::a || role == Role::b_rows);
  panel.load(t, b, h, rows, dim, tf32);
}
[[maybe_unused]]  // on paths with kBf16Dot only
void load_operand(Bf16Panel& panel, const Tensor& t, int64_t b, int64_t h, Range rows, int64_t dim, Role role,
                  bool) {
  constexpr Bf16Layout kLayouts[] = {Bf16Layout::rows, Bf16Layout::pairs_over_rows, Bf16Layout::pairs_over_dim,
                                     Bf16Layout::columns};  // by Role
  panel.load(t, b, h, rows, dim, kLayouts[int(role)]);
}

// `panel` in a transposed role (b_dim, a_transposed) over the rows that `rows_panel` holds as read
// (Role a or b_rows, the same rows of the same tensor): fp32 panels transpose it in the cache
// (Panel::transpose_of); bf16 panels, whose layouts pair elements differently, read the tensor.
void load_transposed(Panel& panel, const Panel& rows_panel, const Tensor&, int64_t, int64_t, Range, int64_t dim, Role,
                     bool) {
  panel.transpose_of(rows_panel, dim);
}
[[maybe_unused]]  // on paths with kBf16Dot only
void load_transposed(Bf16Panel& panel, const Bf16Panel&, const Tensor& t, int64_t b, int64_t h, Range rows,
                     int64_t dim, Role role, bool tf32) {
  load_operand(panel, t, b, h, rows, dim, role, tf32);
}
// `panel` in a transposed role, through `stage` where the panels are fp32: the rows read as they
// are stored, then transposed in the cache (a row at a time, the transposed store would touch one
// cache line per element).
void load_through_rows(Panel& panel, Panel& stage, const Tensor& t, int64_t b, int64_t h, Range rows, int64_t dim,
                       Role role, bool tf32) {
  load_operand(stage, t, b, h, rows, dim, role == Role::b_dim ? Role::b_rows : Role::a, tf32);
  panel.transpose_of(stage, dim);
}
[[maybe_unused]]  // on paths with kBf16Dot only
void load_through_rows(Bf16Panel& panel, Bf16Panel&, const Tensor& t, int64_t b, int64_t h, Range rows, int64_t dim,
                       Role role, bool tf32) {
  load_operand(panel, t, b, h, rows, dim, role, tf32);
}

// C[rows][width] (+)= A[rows][depth] · B on either kind of operand (depth in elements).
template <class T>
void tile_gemm(int64_t rows, int64_t width, int64_t depth, const T* a, int64_t lda, const T* b, int64_t ldb, float* c,
               int64_t ldc, bool accumulate) {
  if constexpr (std::is_same_v<T, uint16_t>) gemm_bf16(rows, width, depth / 2, a, lda, b, ldb, c, ldc, accumulate);
  else gemm(rows, width, depth, a, lda, b, ldb, c, ldc, accumulate);
}

// A [kTileM, kTileN] fp32 tile as an A operand: itself, or rounded to bf16 (kBf16) or to tf32
// into `scratch`.
template <bool kBf16>
auto tile_operand(const float* x, Scratch& scratch, bool tf32 = false) {
  if constexpr (kBf16) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(scratch.reserve(kTileM * kTileN / 2));
    to_bf16(x, dst, kTileM * kTileN);
    return static_cast<const uint16_t*>(dst);
  } else {
    if (!tf32) return x;
    float* dst = scratch.reserve(kTileM * kTileN);
    for (int64_t i = 0; i < kTileM * kTileN; ++i) dst[i] = round_to_tf32(x[i]);
    return static_cast<const float*>(dst);
  }
}

// A [kTileN, kTileM] fp32 tile as a B operand (depth along its rows): itself (already rounded to
// tf32 where the call asks for it), or rounded to bf16 in pair-interleaved form into `scratch`;
// the B operand's ld, in elements, goes to `ld`.
template <bool kBf16>
auto tile_b_operand(const float* x, Scratch& scratch, int64_t& ld) {
  if constexpr (kBf16) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(scratch.reserve(kTileN * kTileM / 2));
    to_bf16_pairs(x, dst, kTileN, kTileM);
    ld = 2 * kTileM;
    return static_cast<const uint16_t*>(dst);
  } else {
    ld = kTileM;
    return x;
  }
}

template <bool kBf16>
struct BackwardScratch {
  using Operand = std::conditional_t<kBf16, Bf16Panel, Panel>;
  Operand k, v, kt;            // key chunk: K a, V a, K a_transposed               (fused pass)
  Operand q, qt, dout, doutt;  // query block: Q b_rows, Q b_dim, dO b_rows, dO b_dim (fused pass)
  Operand kb, vb;              // key block: K a, V a                               (statistics pass)
  Operand qc, doc;             // chunk rows of one head: Q b_dim, dO b_dim         (statistics pass)
  Operand stage;               // rows as read, transposed into qc or doc (fp32 panels)
  Scratch s, dprob;            // [64, 64] probabilities then dS; dP
  Scratch operand, b_operand;  // [64, 64] P or dS rounded to bf16 (or tf32) as an A / a B operand
  Scratch dk, dv, dq;          // fp32 accumulators
  Scratch delta_sum;           // statistics pass, fp16/bf16 storage: rowsum(E ∘ dP) (Δ's correction)
  Scratch row_max, inv_sum, delta;  // per-query statistics of the current block, padded
  Scratch row_sum;                  // statistics pass: running sums of exp2
  Scratch kept;                     // own statistics: a query tile's E (and dP^T) tiles
  Scratch kept_bases;               // own statistics: their tile bases, kTileM a tile
  Scratch tile_stats;               // own statistics: a query tile's running max, sum and Δ sum
  Scratch o_rows;                   // own statistics: O rows read for Δ

  void trim(int64_t max_floats) {
    for (Operand* panel : {&k, &v, &kt, &q, &qt, &dout, &doutt, &kb, &vb, &qc, &doc, &stage}) panel->trim(max_floats);
    for (Scratch* buffer : {&s, &dprob, &operand, &b_operand, &dk, &dv, &dq, &delta_sum, &row_max, &inv_sum, &delta,
                            &row_sum, &kept, &kept_bases, &tile_stats, &o_rows})
      buffer->trim(max_floats);
  }
};

// The factor that turns this call's own softmax (the row's recomputed max and sum) into the one
// the given LSE defines: P = exp(S - lse). It is 1 where lse is this call's own (equal to
// max·|scale| + log(sum) within what rounding leaves: the precise path, RowStats says why), and
// exp(own - lse) where lse is larger, as when the call is one part of the keys and lse the merged
// one (fmha::merge; ring attention's backward): P is then the part's share of the whole softmax.
// A row whose lse is -inf sees nothing and gets zero gradients.
// "What rounding leaves": kOwnUlps fp32 units of |lse| (its own formation), plus kDotUnits fp32
// unit roundoffs of |scale|·|q|·max|k| (Cauchy-Schwarz over sum_d |q_d·k_d|): an LSE formed
// elsewhere (another backend's forward, the oracle, another library) forms its scores in another
// order, which moves a score by units of sum_d |q_d·k_d|, not of the score. Where the products
// cancel (a score near 0 from terms of ~10) that is many units of lse, and a tolerance of units of
// lse alone took such a row's own softmax for a part of a larger one: P = 1 became 1 ± 1e-5 on a
// row that sees one key. A true part whose share lies within the bound of 1 is taken as whole.
float lse_factor(float row_max, float row_sum, float abs_scale, float lse, float q_norm, float key_norm_max) {
  constexpr double kOwnUlps = 4.0;
  constexpr double kDotUnits = 16.0;
  constexpr double kFp32Unit = std::numeric_limits<float>::epsilon() / 2.0;  // 2^-24
  if (!(row_sum > 0.0f)) return 1.0f;  // P is 0 anyway
  if (lse == kNegInf) return 0.0f;
  const double own = double(row_max) * abs_scale + std::log(double(row_sum));
  const double tolerance = kOwnUlps * std::numeric_limits<float>::epsilon() * std::max(1.0, std::abs(double(lse))) +
                           kDotUnits * kFp32Unit * double(abs_scale) * double(q_norm) * double(key_norm_max);
  if (std::abs(own - double(lse)) <= tolerance) return 1.0f;
  return float(std::exp(own - double(lse)));
}

// One row's statistics into `st`, from its max and sum over all of its keys (and, fp16/bf16
// storage, rowsum(E ∘ dP) over them: Δ's correction, see backward_stats_chunk).
void finish_row_stats(const Params& p, const Problem& s, RowStats& st, int64_t b, int64_t h, int64_t row,
                      float row_max, float row_sum, float delta_sum) {
  const float given = static_cast<const float*>(p.lse.data)[offset3(p.lse, b, h, row)];
  const size_t idx = size_t((b * s.heads + h) * s.seqlen_q + row);
  const float normalisation = lse_factor(row_max, row_sum, std::abs(s.scale), given, st.q_norm[idx],
                                         st.key_norm_max[size_t(b * s.kv_heads + h / s.group)]);
  const float inv = row_sum > 0.0f ? normalisation / row_sum : 0.0f;
  st.row_max[idx] = row_max;
  st.inv_sum[idx] = inv;
  // Δ from this call's own P and dP only where P is this call's own softmax (not a part of a
  // larger one: there Δ belongs to the merged O, as stored).
  if (s.dtype != DType::fp32 && normalisation == 1.0f) st.delta[idx] = delta_sum * inv;
}

// Where a statistics item's result goes: nullptr, `st` (finished); otherwise one part of a call
// whose keys are split (decode-shaped calls, key_parts), merged by merge_stats_parts.
struct StatsPart {
  float* row_max = nullptr;    // [group][rows] running max over the part's keys
  float* row_sum = nullptr;    // [group][rows] sum of exp2((x - max)·|scale_log2|) over them
  float* delta_sum = nullptr;  // [group][rows] rowsum(E ∘ dP) over them (fp16/bf16 storage)
};

// Short calls: the statistics pass's exponent tiles (statistics_step's E of each S^T tile, with
// their tile bases) kept for the fused pass, which then takes them instead of forming S^T = K·Q^T
// and E again (one of its six matmuls per tile pair, an exp2 per entry, and the K and Q^T operand
// panels that only this matmul reads). Worth it while the tiles stay in the caches: only calls
// whose tiles, every (batch, head) together, fit config.score_cache_bytes (cpu_config.h) keep
// them. A kept tile is E as the fused pass would form it, bit for bit (same operands, same
// kernel, same mask: entries outside the panels' rows are masked by both passes; same steps), so
// the result does not depend on whether the call keeps its tiles.
constexpr int64_t kTileFloats = kTileM * kTileN;

struct ScoreCache {
  float* data = nullptr;             // [batch * heads][key tiles][query tiles][kTileN keys, kTileM queries]
  float* bases = nullptr;            // [batch * heads][key tiles][query tiles][kTileM] each tile's bases
  std::vector<uint8_t> present;      // 1 where the statistics pass left the tile
  int64_t key_tiles = 0, query_tiles = 0;

  static int64_t tiles_for(const Problem& s) {
    return s.batch * s.heads * tiles(s.seqlen_k, kTileN) * tiles(s.seqlen_q, kTileM);
  }
  int64_t slot(int64_t bh, int64_t col0, int64_t row0) const {
    return (bh * key_tiles + col0 / kTileN) * query_tiles + row0 / kTileM;
  }
  float* tile(int64_t bh, int64_t col0, int64_t row0) const { return data + slot(bh, col0, row0) * kTileFloats; }
  float* base(int64_t bh, int64_t col0, int64_t row0) const { return bases + slot(bh, col0, row0) * kTileM; }
  // The kept tile of keys col0.. and queries row0.., or nullptr. The fused pass turns it into P^T
  // and dS^T in place: each tile pair is its item's, once.
  float* find(int64_t bh, int64_t col0, int64_t row0) const {
    return present[size_t(slot(bh, col0, row0))] ? tile(bh, col0, row0) : nullptr;
  }
};

// One S^T tile [kTileN keys, kTileM queries] of x = sign(scale)·(q·k), masked, in the online
// statistics of its queries (vector-aligned running max, sum and, 16-bit storage, Δ's sum of
// rowsum(E ∘ dP)): E = exp2((x - tile base)·|scale_log2|) in place of x (the tile bases of
// probability_factor, left in `base_tile`), summed per query; the running sums rescaled to the new
// running max and the tile's sum added at its factor exp2((tile base - running max)·|scale_log2|),
// left in `factor_tile` for delta_step. A vector holds kLanes queries, so all of it is lane-wise
// over the tile's key rows.
void statistics_step(float* scores, float* max_tile, float* sum_tile, float* delta_sum_tile, float* base_tile,
                     float* factor_tile, float scale_log2) {
  constexpr int kVecsM = int(kTileM / kLanes);
  for (int v = 0; v < kVecsM; ++v) {
    const vf max = tile_max(scores, v), base = base_of(max), old_max = load(max_tile + v * kLanes);
    vf sum{};
    for (int64_t c = 0; c < kTileN; ++c) {
      float* x = scores + c * kTileM + v * kLanes;
      const vf e = exp2_nonpositive((load(x) - base) * scale_log2);
      store(x, e);
      sum += e;
    }
    const vf new_max = max > old_max ? max : old_max;
    const vf running = new_max == kNegInf ? splat(0.0f) : new_max;  // nothing visible yet
    const vf rescale = exp2((old_max - running) * scale_log2);
    const vf factor = exp2((base - running) * scale_log2);
    store(sum_tile + v * kLanes, load(sum_tile + v * kLanes) * rescale + sum * factor);
    store(max_tile + v * kLanes, new_max);
    store(delta_sum_tile + v * kLanes, load(delta_sum_tile + v * kLanes) * rescale);
    store(base_tile + v * kLanes, base);
    store(factor_tile + v * kLanes, factor);
  }
}

// rowsum(E ∘ dP) of one tile (E from statistics_step, dP^T as S^T) added to Δ's running sums at
// the tile's factors.
void delta_step(const float* e, const float* dprob, const float* factor_tile, float* delta_sum_tile) {
  constexpr int kVecsM = int(kTileM / kLanes);
  vf sum_v[kVecsM] = {};
  for (int64_t c = 0; c < kTileN; ++c)
    for (int v = 0; v < kVecsM; ++v) sum_v[v] += load(e + c * kTileM + v * kLanes) * load(dprob + c * kTileM + v * kLanes);
  for (int v = 0; v < kVecsM; ++v)
    store(delta_sum_tile + v * kLanes, load(delta_sum_tile + v * kLanes) + sum_v[v] * load(factor_tile + v * kLanes));
}

// Statistics pass: one item = (batch, KV head, chunk of query tiles), over every query head of the
// group. Each row's softmax max and sum, online over the keys as the forward forms them, go to
// `st` as row_max and inv_sum (RowStats says why they are not taken from LSE), for the fused pass.
// The pass works on S^T tiles [kTileN keys, kTileM queries], formed exactly as the fused pass forms
// them (same operands, same matmul): a vector then holds kLanes queries, so the row max, the exp2
// sums and the online rescale are lane-wise over the key rows of the tile, with no horizontal
// reduction and no scalar exp2 per row. Each query's sum still runs over its keys in key order.
template <bool kBf16>
void backward_stats_chunk(const Params& p, const Problem& s, const CpuConfig& config, RowStats& st, int64_t b,
                          int64_t kv_head, Range rows, Range key_part, const StatsPart* part, ScoreCache* cache,
                          BackwardScratch<kBf16>& t) {
  [[maybe_unused]] const ItemTiles<kBf16> tile_session{};
  const int64_t key_block = config.key_block;
  const int64_t dp = round_up(s.head_dim, kLanes), dvp = round_up(s.head_dim_v, kLanes);
  const int64_t n = round_up(rows.size(), kTileM);
  const float scale_log2 = std::abs(s.scale_log2);
  float* scores = t.s.reserve(kTileM * kTileN);
  float* dprob = t.dprob.reserve(kTileM * kTileN);
  // [group][n] each, vector-aligned per tile (n and tile offsets are multiples of kTileM)
  float* row_max = t.row_max.reserve(s.group * n);
  float* row_sum = t.row_sum.reserve(s.group * n);
  // fp16/bf16 storage: Δ = rowsum(dO ∘ O) from O as stored is off by O's rounding (2^-9 for bf16),
  // and where logits are large that offset swamps dS = P ∘ (dP - Δ). The pass therefore also
  // forms Δ = rowsum(P ∘ dP) from its own P and dP, as a plain softmax backward does (one more
  // product, dP^T = V·dO^T), and the fused pass takes that Δ instead.
  const bool correct_delta = s.dtype != DType::fp32;
  float* delta_sum = t.delta_sum.reserve(s.group * n);
  std::fill_n(delta_sum, s.group * n, 0.0f);
  std::fill_n(row_max, s.group * n, kNegInf);
  std::fill_n(row_sum, s.group * n, 0.0f);
  const Range keys = intersect(s.mask.keys(rows), key_part);
  alignas(kAlign) float base_tile[kTileM], factor_tile[kTileM];  // statistics_step's, per tile
  for (int64_t block0 = align_down(keys.begin, key_block); block0 < keys.end; block0 += key_block) {
    const Range block = intersect(keys, Range{block0, block0 + key_block});
    load_operand(t.kb, p.k, b, kv_head, block, s.head_dim, Role::a, s.tf32);
    if (correct_delta) load_operand(t.vb, p.v, b, kv_head, block, s.head_dim_v, Role::a, s.tf32);
    for (int64_t g = 0; g < s.group; ++g) {
      const int64_t h = kv_head * s.group + g;
      load_through_rows(t.qc, t.stage, p.q, b, h, rows, s.head_dim, Role::b_dim, s.tf32);
      if (correct_delta)
        load_through_rows(t.doc, t.stage, p.dout, b, h, rows, s.head_dim_v, Role::b_dim, s.tf32);
      for (int64_t row0 = rows.begin; row0 < rows.end; row0 += kTileM) {
        const Range tile_rows{row0, std::min(row0 + kTileM, rows.end)};
        const Range tile_keys = intersect(s.mask.keys(tile_rows), block);
        // No key: nothing to add, and no tile to keep (the aligned loop below would form one over
        // an empty panel, which a part of the keys that does see the tile's keys must not meet).
        if (tile_keys.empty()) continue;
        const int64_t r_off = row0 - rows.begin;
        float* max_tile = row_max + g * n + r_off;
        float* sum_tile = row_sum + g * n + r_off;
        float* delta_sum_tile = delta_sum + g * n + r_off;
        for (int64_t col0 = align_down(tile_keys.begin, kTileN); col0 < tile_keys.end; col0 += kTileN) {
          // S^T = K·Q^T  [kTileN keys, kTileM queries]; x = sign(scale)·(q·k), -inf where masked;
          // E in its place (in the cache's tile where the call keeps them)
          const int64_t bh = b * s.heads + h;
          float* tile = cache ? cache->tile(bh, col0, row0) : scores;
          tile_gemm(kTileN, kTileM, dp, t.kb.tile(col0), t.kb.ld, t.qc.tile(row0), t.qc.ld, tile, kTileM, false);
          sign_and_mask_transposed(tile, s, row0, col0, tile_rows, intersect(block, Range{col0, col0 + kTileN}));
          statistics_step(tile, max_tile, sum_tile, delta_sum_tile, cache ? cache->base(bh, col0, row0) : base_tile,
                          factor_tile, scale_log2);
          if (cache) cache->present[size_t(cache->slot(bh, col0, row0))] = 1;
          if (!correct_delta) continue;
          // dP^T = V·dO^T; rowsum(E ∘ dP), per query
          tile_gemm(kTileN, kTileM, dvp, t.vb.tile(col0), t.vb.ld, t.doc.tile(row0), t.doc.ld, dprob, kTileM, false);
          delta_step(tile, dprob, factor_tile, delta_sum_tile);
        }
      }
    }
  }
  for (int64_t g = 0; g < s.group; ++g)
    for (int64_t r = 0; r < rows.size(); ++r) {
      const int64_t i = g * n + r;
      if (part) {
        const int64_t j = g * rows.size() + r;
        part->row_max[j] = row_max[i];
        part->row_sum[j] = row_sum[i];
        part->delta_sum[j] = delta_sum[i];
        continue;
      }
      finish_row_stats(p, s, st, b, kv_head * s.group + g, rows.begin + r, row_max[i], row_sum[i], delta_sum[i]);
    }
}

// One (batch, KV head) of a call whose statistics pass split its keys: merges the `parts` results
// (StatsPart, laid out [parts][group][seqlen_q]) in part order, rescaled to the common max as the
// online softmax rescales, and finishes each row's statistics.
void merge_stats_parts(const Params& p, const Problem& s, RowStats& st, int64_t b, int64_t kv_head, int64_t parts,
                       const float* part_max, const float* part_sum, const float* part_delta_sum) {
  const int64_t rows = s.group * s.seqlen_q;
  const float scale_log2 = std::abs(s.scale_log2);
  for (int64_t j = 0; j < rows; ++j) {
    float row_max = kNegInf, row_sum = 0.0f, delta_sum = 0.0f;
    for (int64_t k = 0; k < parts; ++k) row_max = std::max(row_max, part_max[k * rows + j]);
    if (row_max != kNegInf)
      for (int64_t k = 0; k < parts; ++k) {
        const float m = part_max[k * rows + j];
        if (m == kNegInf) continue;  // the part saw no key of this row
        const float weight = exp2(splat((m - row_max) * scale_log2))[0];
        row_sum += part_sum[k * rows + j] * weight;
        delta_sum += part_delta_sum[k * rows + j] * weight;
      }
    finish_row_stats(p, s, st, b, kv_head * s.group + j / s.seqlen_q, j % s.seqlen_q, row_max, row_sum, delta_sum);
  }
}

// Own statistics (backward_chunk): the floats kept per key tile of a query tile's row: the
// exponents E of S^T (statistics_step's), and for fp16/bf16 storage dP^T after them (the kTileM
// tile bases E was taken on go to their own array, t.kept_bases).
int64_t kept_tile_floats(const Problem& s) { return s.dtype == DType::fp32 ? kTileFloats : 2 * kTileFloats; }

// Whether a fused item over `keys` forms its own statistics: its keys are all of the call's
// (every key its queries see), and a query tile's row of kept tiles fits row_score_bytes.
bool takes_own_statistics(const Problem& s, const CpuConfig& config, Range keys) {
  const int64_t bytes = tiles(s.seqlen_k, kTileN) * kept_tile_floats(s) * int64_t(sizeof(float));
  return keys.begin == 0 && keys.end == s.seqlen_k && s.seqlen_k > 0 && bytes <= config.row_score_bytes;
}

// Own statistics: query tile [row0, row0 + kTileM) of head h, its rows in `tile_rows`, over
// `row_keys` (every key those rows see) in key order, as the statistics pass forms them
// (backward_stats_chunk: the same S^T tiles, the same steps), finished into `st`. The tile row's
// exponents (statistics_step's E of each S^T tile, with its tile bases) and for fp16/bf16 storage
// its dP^T tiles go to t.kept, key tile by key tile from align_down(row_keys.begin), for
// probabilities_from_exponents. Takes the fused pass's panels (K, Q^T, and V, dO^T), loaded.
template <bool kBf16>
void own_tile_statistics(const Params& p, const Problem& s, RowStats& st, int64_t b, int64_t h, int64_t row0,
                         Range tile_rows, Range row_keys, BackwardScratch<kBf16>& t) {
  const bool correct_delta = s.dtype != DType::fp32;
  const int64_t dp = round_up(s.head_dim, kLanes), dvp = round_up(s.head_dim_v, kLanes);
  const int64_t first = align_down(row_keys.begin, kTileN), stride = kept_tile_floats(s);
  const int64_t kept_tiles = std::max<int64_t>(1, tiles(row_keys.end - first, kTileN));
  float* kept = t.kept.reserve(kept_tiles * stride);
  float* kept_bases = t.kept_bases.reserve(kept_tiles * kTileM);
  alignas(kAlign) float factor_tile[kTileM];
  float* max_tile = t.tile_stats.reserve(3 * kTileM);
  float* sum_tile = max_tile + kTileM;
  float* delta_sum_tile = max_tile + 2 * kTileM;
  std::fill_n(max_tile, kTileM, kNegInf);
  std::fill_n(sum_tile, 2 * kTileM, 0.0f);
  const float scale_log2 = std::abs(s.scale_log2);
  for (int64_t col0 = first; col0 < row_keys.end; col0 += kTileN) {
    float* tile = kept + (col0 - first) / kTileN * stride;
    tile_gemm(kTileN, kTileM, dp, t.k.tile(col0), t.k.ld, t.qt.tile(row0), t.qt.ld, tile, kTileM, false);
    sign_and_mask_transposed(tile, s, row0, col0, tile_rows, intersect(row_keys, Range{col0, col0 + kTileN}));
    statistics_step(tile, max_tile, sum_tile, delta_sum_tile, kept_bases + (col0 - first) / kTileN * kTileM,
                    factor_tile, scale_log2);
    if (!correct_delta) continue;
    tile_gemm(kTileN, kTileM, dvp, t.v.tile(col0), t.v.ld, t.doutt.tile(row0), t.doutt.ld, tile + kTileFloats, kTileM,
              false);
    delta_step(tile, tile + kTileFloats, factor_tile, delta_sum_tile);
  }
  for (int64_t r = tile_rows.begin; r < tile_rows.end; ++r)
    finish_row_stats(p, s, st, b, h, r, max_tile[r - row0], sum_tile[r - row0], delta_sum_tile[r - row0]);
}

// dQ: every key chunk adds its share into one fp32 accumulator per call, [batch * heads][head_dim
// padded][ld] (transposed: the fused pass computes dQ^T tiles), in a fixed order of the chunks of
// each (batch, KV head), so that the sum is the same on every run whatever the thread count.
// `turn[b * kv_heads + kv_head]` counts the chunks of that head already added.
// `direct`: every (batch, KV head) of the call is one chunk, so a chunk's share is the whole of
// dQ^T and the chunk writes it out itself (write_dq_rows): no accumulator to clear, add into and
// read back (at long sequences three passes over a tensor the size of dQ, from memory).
struct DqAccumulator {
  Scratch data;  // vector-aligned, as the adds load and store whole vectors
  int64_t ld = 0, dp = 0;  // dp: the head dim rounded up to kDimRows
  bool direct = false;
  std::vector<std::atomic<int64_t>> turn;
  float* head(int64_t bh) { return data.get() + bh * dp * ld; }
};

// dQ = scale · (dQ^T)^T for every query row of head (b, h): `src` holds dQ^T [dp][ld], its
// columns the queries from `first`, `width` of them; rows outside them get 0. `rows_buffer` holds
// kTileM rows of dp floats.
void write_dq_rows(const Params& p, const Problem& s, int64_t b, int64_t h, const float* src, int64_t ld, int64_t dp,
                   int64_t first, int64_t width, float* rows_buffer) {
  for (int64_t row0 = 0; row0 < s.seqlen_q; row0 += kTileM) {
    const int64_t rows = std::min(kTileM, s.seqlen_q - row0);
    // [kTileM, dp] a block of rows gathered from the transposed dQ^T, zero outside its columns
    const Range inside = intersect(Range{row0, row0 + rows}, Range{first, first + width});
    std::fill_n(rows_buffer, rows * dp, 0.0f);
    for (int64_t d = 0; d < s.head_dim; ++d)
      for (int64_t r = inside.begin; r < inside.end; ++r)
        rows_buffer[(r - row0) * dp + d] = src[d * ld + (r - first)] * s.scale;
    for (int64_t r = 0; r < rows; ++r) write_row(p.dq, offset4(p.dq, b, row0 + r, h, 0), s.head_dim, rows_buffer + r * dp);
  }
}

// Fused pass: one item = (batch, KV head, chunk of key tiles), over every query head of the group
// and every query tile the mask lets the chunk see. For each (key tile, query tile) pair, P and dS
// are computed once and feed all three gradients (five matmuls):
//   S^T = K·Q^T, P^T from the rows' statistics, dV += P^T·dO, dP^T = V·dO^T,
//   dS^T = P^T∘(dP^T - Δ), dK += dS^T·Q, dQ^T += K^T·dS^T
// S^T is the statistics pass's S bit for bit (the matmul sums over the head dim in the same order
// whichever operand is A), and P^T is formed from the same exponents (probability_factor), so the
// dominant P is 1/sum exactly as in a plain softmax. dK and dV
// have one writer (this item); the chunk's share of dQ^T is summed in scratch and added to the
// call's accumulator when the chunk's turn comes (the `ordinal`-th chunk of this head).
//
// Own statistics (`own_stats`: the item's keys are every key its queries see, and a query tile's
// row of tiles fits config.row_score_bytes): the item forms its queries' statistics itself, one
// query tile at a time, as the statistics pass would (the same S^T tiles, the same online steps
// in the same key order, so the same bits), keeps that tile row's exponents E with their tile
// bases (and, 16-bit storage, the dP^T the statistics form too), and the fused steps take them:
// S^T, E (and dP^T) formed once, not twice, and the tiles still in L2.
template <bool kBf16>
void backward_chunk(const Params& p, const Problem& s, const CpuConfig& config, RowStats& st, int64_t b,
                    int64_t kv_head, Range keys, int64_t ordinal, DqAccumulator& dq_acc,
                    const std::atomic<bool>& abandoned, const ScoreCache* cache, bool own_stats,
                    BackwardScratch<kBf16>& t) {
  [[maybe_unused]] const ItemTiles<kBf16> tile_session{};
  const int64_t query_block = config.query_block;
  const int64_t dp = round_up(s.head_dim, kLanes), dvp = round_up(s.head_dim_v, kLanes);
  const int64_t n = round_up(keys.size(), kTileN);
  float* dk = t.dk.reserve(n * dp);
  float* dv = t.dv.reserve(n * dvp);
  float* scores = t.s.reserve(kTileM * kTileN);
  float* dprob = t.dprob.reserve(kTileM * kTileN);
  float* row_max = t.row_max.reserve(query_block + kTileM);
  float* inv_sum = t.inv_sum.reserve(query_block + kTileM);
  float* delta = t.delta.reserve(query_block + kTileM);
  std::fill_n(dk, n * dp, 0.0f);
  std::fill_n(dv, n * dvp, 0.0f);
  const Range queries = s.mask.queries(Range{0, s.seqlen_q}, keys);
  // [group][dq_acc.dp][dq_ld] the chunk's share of dQ^T for the queries it sees, columns from
  // dq_first; the row length is padded by one vector for the reason a transposed Panel's is.
  const int64_t dq_rows = dq_acc.dp;  // the head dim rounded up to kDimRows
  const int64_t dq_first = align_down(queries.begin, kTileM);
  const int64_t dq_width = queries.empty() ? 0 : round_up(queries.end - dq_first, kTileM);
  const int64_t dq_ld = dq_width + kLanes;
  float* dq_share = t.dq.reserve(s.group * dq_rows * dq_ld);
  std::fill_n(dq_share, s.group * dq_rows * dq_ld, 0.0f);
  // Q^T only forms S^T: loaded at the first tile the cache lacks. K^T, Q^T and dO^T are the row
  // panels K, Q and dO transposed in the cache (load_transposed): each tensor is read once.
  bool qt_loaded = false;
  if (!queries.empty()) {
    load_operand(t.k, p.k, b, kv_head, keys, s.head_dim, Role::a, s.tf32);
    load_transposed(t.kt, t.k, p.k, b, kv_head, keys, s.head_dim, Role::a_transposed, s.tf32);
    load_operand(t.v, p.v, b, kv_head, keys, s.head_dim_v, Role::a, s.tf32);
  }
  // Own statistics: the call skipped the preprocess; this item, the only one of its KV head, forms
  // what it would have (the same values from the same rows: bit for bit), from its panels where
  // they hold fp32 rows (the largest |k| here, Δ and |q| per query block below).
  float* o_rows = own_stats ? t.o_rows.reserve(kPreprocessRows * s.head_dim_v) : nullptr;
  if (own_stats) {
    if constexpr (kBf16) preprocess_keys(p, s, st, b, kv_head);
    else if (queries.empty()) preprocess_keys(p, s, st, b, kv_head);
    else key_row_stats(s, st, b, kv_head, [&](int64_t j) { return t.k.buffer.get() + (j - t.k.first) * t.k.ld; });
  }
  for (int64_t g = 0; g < s.group; ++g) {
    const int64_t h = kv_head * s.group + g;
    float* dq_head = dq_share + g * dq_rows * dq_ld;
    for (int64_t qb0 = align_down(queries.begin, query_block); qb0 < queries.end; qb0 += query_block) {
      const Range block = intersect(queries, Range{qb0, qb0 + query_block});
      load_operand(t.q, p.q, b, h, block, s.head_dim, Role::b_rows, s.tf32);
      qt_loaded = false;
      load_operand(t.dout, p.dout, b, h, block, s.head_dim_v, Role::b_rows, s.tf32);
      load_transposed(t.doutt, t.dout, p.dout, b, h, block, s.head_dim_v, Role::b_dim, s.tf32);
      if (own_stats) {
        if constexpr (kBf16) preprocess_rows(p, s, st, b, h, block);
        else
          query_row_stats(p, s, st, b, h, block, t.dout.buffer.get(), t.dout.ld, t.q.buffer.get(), t.q.ld, t.q.first,
                          o_rows);
      }
      // Statistics indexed from the panel's first row; rows outside the block see nothing.
      const size_t stat0 = size_t((b * s.heads + h) * s.seqlen_q);
      auto take_stats = [&](int64_t first, int64_t end) {
        for (int64_t r = first; r < end; ++r) {
          const bool in = r >= block.begin && r < block.end;
          row_max[r - t.q.first] = in ? st.row_max[stat0 + size_t(r)] : kNegInf;
          inv_sum[r - t.q.first] = in ? st.inv_sum[stat0 + size_t(r)] : 0.0f;
          delta[r - t.q.first] = in ? st.delta[stat0 + size_t(r)] : 0.0f;
        }
      };
      if (!own_stats) take_stats(t.q.first, t.q.first + round_up(block.end - t.q.first, kTileM));
      // Query tiles outside, key tiles inside: one query tile's four operand tiles stay in L1 while
      // the chunk's key panels and dK/dV accumulators stay in L2, instead of the whole query block
      // (four panels of up to query_block rows, more than an L2) streaming by for every key tile.
      // Each accumulator still sums its terms in the same order (dK, dV over ascending query
      // tiles; dQ^T over ascending key tiles): the result is the same bit for bit.
      for (int64_t row0 = align_down(block.begin, kTileM); row0 < block.end; row0 += kTileM) {
        // Own statistics: the tile row's E (and dP^T) kept from here, key tiles from kept_first.
        const Range tile_rows = intersect(block, Range{row0, row0 + kTileM});
        const Range row_keys = s.mask.keys(tile_rows);
        const int64_t kept_first = align_down(row_keys.begin, kTileN);
        if (own_stats) {
          if (!qt_loaded) load_transposed(t.qt, t.q, p.q, b, h, block, s.head_dim, Role::b_dim, s.tf32);
          qt_loaded = true;
          own_tile_statistics(p, s, st, b, h, row0, tile_rows, row_keys, t);
          take_stats(row0, row0 + kTileM);
        }
        for (int64_t col0 = keys.begin; col0 < keys.end; col0 += kTileN) {
          const Range tile_keys{col0, std::min(col0 + kTileN, keys.end)};
          const Range tile_queries = s.mask.queries(block, tile_keys);
          float* dk_tile = dk + (col0 - keys.begin) * dp;
          float* dv_tile = dv + (col0 - keys.begin) * dvp;
          if (row0 < align_down(tile_queries.begin, kTileM) || row0 >= tile_queries.end) continue;
          const int64_t stat = row0 - t.q.first;
          // S^T = K·Q^T  [kTileN keys, kTileM queries], then P^T (or P^T from the exponents the
          // statistics kept: an own statistics tile or a ScoreCache tile becomes P^T and dS^T in
          // place, these steps being its last use)
          float* tile = scores;
          const float* kept_dprob = nullptr;
          if (own_stats) {
            tile = t.kept.get() + (col0 - kept_first) / kTileN * kept_tile_floats(s);
            if (s.dtype != DType::fp32) kept_dprob = tile + kTileFloats;
            probabilities_from_exponents(tile, t.kept_bases.get() + (col0 - kept_first) / kTileN * kTileM,
                                         row_max + stat, inv_sum + stat, std::abs(s.scale_log2));
          } else if (float* kept = cache ? cache->find(b * s.heads + h, col0, row0) : nullptr) {
            tile = kept;
            probabilities_from_exponents(tile, cache->base(b * s.heads + h, col0, row0), row_max + stat,
                                         inv_sum + stat, std::abs(s.scale_log2));
          } else {
            if (!qt_loaded) load_transposed(t.qt, t.q, p.q, b, h, block, s.head_dim, Role::b_dim, s.tf32);
            qt_loaded = true;
            tile_gemm(kTileN, kTileM, dp, t.k.tile(col0), t.k.ld, t.qt.tile(row0), t.qt.ld, scores, kTileM, false);
          }
          if (tile == scores) probabilities(tile, s, row0, col0, block, tile_keys, row_max + stat, inv_sum + stat);
          // dV += P^T·dO (P rounded to the operand format in a copy: dS below is formed from the
          // unrounded P, so that it is rounded once, not twice)
          tile_gemm(kTileN, dvp, kTileM, tile_operand<kBf16>(tile, t.operand, s.tf32), kTileM, t.dout.tile(row0),
                    t.dout.ld, dv_tile, dvp, true);
          // dP^T = V·dO^T (or as the statistics kept it); dS^T = P^T ∘ (dP^T - Δ)
          if (!kept_dprob)
            tile_gemm(kTileN, kTileM, dvp, t.v.tile(col0), t.v.ld, t.doutt.tile(row0), t.doutt.ld, dprob, kTileM,
                      false);
          score_gradient(tile, kept_dprob ? kept_dprob : dprob, delta + stat, true);
          if (!kBf16 && s.tf32) round_tile_to_tf32(tile, kTileN * kTileM);
          // dK += dS^T·Q
          tile_gemm(kTileN, dp, kTileM, tile_operand<kBf16>(tile, t.operand), kTileM, t.q.tile(row0), t.q.ld, dk_tile,
                    dp, true);
          // dQ^T += K^T·dS^T  [dq_rows, kTileM queries]
          int64_t ds_ld = 0;
          const auto ds = tile_b_operand<kBf16>(tile, t.b_operand, ds_ld);
          tile_gemm(dq_rows, kTileM, kTileN, t.kt.tile(col0), t.kt.ld, ds, ds_ld, dq_head + (row0 - dq_first), dq_ld,
                    true);
        }
      }
    }
  }
  for (int64_t c = 0; c < keys.size(); ++c) {
    float* dk_row = dk + c * dp;
    for (int64_t d = 0; d < s.head_dim; ++d) dk_row[d] *= s.scale;
    write_row(p.dk, offset4(p.dk, b, keys.begin + c, kv_head, 0), s.head_dim, dk_row);
    write_row(p.dv, offset4(p.dv, b, keys.begin + c, kv_head, 0), s.head_dim_v, dv + c * dvp);
  }
  if (dq_acc.direct) {  // the share is the whole of dQ^T
    float* rows_buffer = t.s.reserve(kTileM * dq_rows);
    for (int64_t g = 0; g < s.group; ++g)
      write_dq_rows(p, s, b, kv_head * s.group + g, dq_share + g * dq_rows * dq_ld, dq_ld, dq_rows, dq_first,
                    dq_width, rows_buffer);
    return;
  }
  // The share joins the accumulator in chunk order: wait for the chunks before this one.
  std::atomic<int64_t>& turn = dq_acc.turn[size_t(b * s.kv_heads + kv_head)];
  if (!wait_for_turn(turn, ordinal, abandoned)) return;
  for (int64_t g = 0; g < s.group && dq_width > 0; ++g) {
    float* dst = dq_acc.head(b * s.heads + kv_head * s.group + g) + dq_first;
    const float* src = dq_share + g * dq_rows * dq_ld;
    for (int64_t d = 0; d < s.head_dim; ++d)
      for (int64_t r = 0; r < dq_width; r += kLanes)
        store(dst + d * dq_acc.ld + r, load(dst + d * dq_acc.ld + r) + load(src + d * dq_ld + r));
  }
  turn.store(ordinal + 1, std::memory_order_release);
}

// The fused pass's last step, per (batch, head) `bh`: dQ = scale · (dQ^T)^T, written out.
void write_dq(const Params& p, const Problem& s, int64_t bh, DqAccumulator& dq_acc, float* rows_buffer) {
  write_dq_rows(p, s, bh / s.heads, bh % s.heads, dq_acc.head(bh), dq_acc.ld, dq_acc.dp, 0, dq_acc.ld, rows_buffer);
}

// Items of several calls in one pool: item `i` of the call at position `c` of the pool is flat
// item first[c] + i. A varlen batch arrives as one dense call per sequence, so short sequences
// share the threads and no tile covers padding.
struct ItemPool {
  std::vector<int64_t> first;  // [calls + 1]

  explicit ItemPool(const std::vector<int64_t>& counts) : first(counts.size() + 1, 0) {
    for (size_t c = 0; c < counts.size(); ++c) first[c + 1] = first[c] + counts[c];
  }
  int64_t size() const { return first.back(); }
  // The position of flat item `item`: the last call that starts at or before it (calls without
  // items start where the next one does, and upper_bound skips them).
  size_t call(int64_t item) const {
    return size_t(std::upper_bound(first.begin(), first.end(), item) - first.begin()) - 1;
  }
};

}  // namespace

#if FMHA_CPU_LEVEL == 3
namespace {
// Multiply-adds per second of `step` (one instruction on each of kAccumulators independent
// registers, kMacs multiply-adds each), best of kRounds rounds of kIterations.
template <int kMacs, class Step>
double multiply_add_rate(Step step) {
  constexpr int kAccumulators = 12, kRounds = 3;
  constexpr long kIterations = 20000;
  double best = 0.0;
  for (int round = 0; round < kRounds; ++round) {
    __m512 acc[kAccumulators];
    for (int k = 0; k < kAccumulators; ++k) acc[k] = _mm512_set1_ps(float(k));
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kIterations; ++i) {
#pragma GCC unroll 12
      for (int k = 0; k < kAccumulators; ++k) acc[k] = step(acc[k]);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The sums keep the loop's results alive.
    float sum = 0.f;
    for (int k = 0; k < kAccumulators; ++k) sum += _mm512_cvtss_f32(acc[k]);
    volatile float sink = sum;
    (void)sink;
    if (seconds > 0.0) best = std::max(best, double(kIterations) * kAccumulators * kMacs / seconds);
  }
  return best;
}
}  // namespace

DotAndFmaRates measure_dot_and_fma() {
  const __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
  const __m512bh a = __m512bh(_mm512_set1_epi32(0x3f803f80));  // bf16 pairs of 1.0
  DotAndFmaRates rates;
  rates.fma = multiply_add_rate<16>([&](__m512 acc) { return _mm512_fmadd_ps(acc, x, y); });
  rates.dot = multiply_add_rate<32>([&](__m512 acc) { return _mm512_dpbf16_ps(acc, a, a); });
  return rates;
}
#endif

Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config,
                   const KeyPages* pages) {
  if (count <= 0) return Status::success();
  std::vector<Problem> problems(static_cast<size_t>(count));
  for (int64_t c = 0; c < count; ++c) problems[size_t(c)] = Problem::of(calls[c]);
  const int threads = resolve_threads(calls[0].num_threads);
  int64_t heads_total = 0;
  for (const Problem& s : problems) heads_total += s.batch * s.kv_heads;
  // The calls by decreasing work (longest sequences first): the threads then finish together
  // instead of one of them taking the longest sequence last.
  std::vector<size_t> order(static_cast<size_t>(count));
  for (size_t c = 0; c < order.size(); ++c) order[c] = c;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return problems[x].seqlen_q * problems[x].seqlen_k > problems[y].seqlen_q * problems[y].seqlen_k;
  });
  // Items are (call, batch, KV head, chunk); chunks of one head run next to each other, in order of
  // position or, `reversed`, last chunk first; the body gets the chunk's rank in that order. The
  // chunk size is computed for `chunk_threads` threads: the fused backward's dQ sums depend on how
  // the keys are cut, so it passes a count that does not vary with the threads asked for.
  // `whole[c]`: call c's heads may be single chunks (chunk_tiles); empty: none.
  auto for_chunks = [&](auto length_of, int64_t tile, int chunk_threads, bool reversed, const std::vector<char>& whole,
                        auto&& body) {
    std::vector<int64_t> per_chunk(static_cast<size_t>(count)), chunks(static_cast<size_t>(count)), items(static_cast<size_t>(count));
    for (size_t c = 0; c < size_t(count); ++c) {
      const Problem& s = problems[c];
      const int64_t length = length_of(s);
      per_chunk[c] = chunk_tiles(tiles(length, tile), heads_total, chunk_threads, config, !whole.empty() && whole[c]) *
                     tile;
      chunks[c] = tiles(length, per_chunk[c]);
    }
    for (size_t i = 0; i < order.size(); ++i) items[i] = problems[order[i]].batch * problems[order[i]].kv_heads * chunks[order[i]];
    const ItemPool pool(items);
    parallel_for(pool.size(), threads, [&](int, int64_t item) {
      const size_t position = pool.call(item), c = order[position];
      const Problem& s = problems[c];
      const int64_t local = item - pool.first[position], head = local / chunks[c], rank = local % chunks[c];
      const int64_t chunk = reversed ? chunks[c] - 1 - rank : rank;
      body(calls[c], s, c, head / s.kv_heads, head % s.kv_heads,
           Range{chunk * per_chunk[c], std::min(chunk * per_chunk[c] + per_chunk[c], length_of(s))}, rank);
    });
  };
  const auto seqlen_q = [](const Problem& s) { return s.seqlen_q; };
  const auto seqlen_k = [](const Problem& s) { return s.seqlen_k; };
  const bool bf16_dot = kBf16Dot && problems[0].dtype == DType::bf16;
  // Decode-shaped pools split their keys (key_parts) in the forward and in the backward's
  // statistics pass: items are then (call, batch, KV head, part), each over all of the call's
  // queries, and each part leaves per row a running max, a sum and one more quantity (the
  // unnormalised output, or rowsum(E ∘ dP)), the parts of one head side by side:
  // [head][part][group][seqlen_q](...). Then one item per (call, batch, KV head) merges them.
  const int64_t parts = key_parts(problems, hardware_threads());
  std::vector<int64_t> part_keys(static_cast<size_t>(count)), part_count(static_cast<size_t>(count)),
      part_items(static_cast<size_t>(count)), heads(static_cast<size_t>(count));
  std::vector<Scratch> part_acc(static_cast<size_t>(count)), part_max(static_cast<size_t>(count)),
      part_sum(static_cast<size_t>(count));
  if (parts > 1)
    for (size_t c = 0; c < size_t(count); ++c) {
      const Problem& s = problems[c];
      // At least one tile: a call of the pool may have no keys at all (a packed sequence).
      part_keys[c] = std::max(kTileN, round_up((s.seqlen_k + parts - 1) / parts, kTileN));
      part_count[c] = std::max<int64_t>(1, tiles(s.seqlen_k, part_keys[c]));
      heads[c] = s.batch * s.kv_heads;
      part_items[c] = heads[c] * part_count[c];
      const int64_t rows = part_items[c] * s.group * s.seqlen_q;
      part_acc[c].reserve(rows * (direction == Direction::forward ? round_up(s.head_dim_v, kLanes) : 1));
      part_max[c].reserve(rows);
      part_sum[c].reserve(rows);
    }
  // body(call, batch, KV head, keys of the part, part item within the call)
  auto for_parts = [&](auto&& body) {
    const ItemPool pool(part_items);
    parallel_for(pool.size(), threads, [&](int, int64_t item) {
      const size_t c = pool.call(item);
      const Problem& s = problems[c];
      const int64_t local = item - pool.first[c], head = local / part_count[c], k = local % part_count[c];
      body(c, head / s.kv_heads, head % s.kv_heads,
           Range{k * part_keys[c], std::min(k * part_keys[c] + part_keys[c], s.seqlen_k)}, local);
    });
  };
  // body(call, batch, KV head, the head's first row in the part buffers)
  auto for_heads = [&](auto&& body) {
    const ItemPool pool(heads);
    parallel_for(pool.size(), threads, [&](int, int64_t item) {
      const size_t c = pool.call(item);
      const Problem& s = problems[c];
      const int64_t head = item - pool.first[c];
      body(c, head / s.kv_heads, head % s.kv_heads, head * part_count[c] * s.group * s.seqlen_q);
    });
  };
  if (direction == Direction::forward) {
    auto run = [&](size_t c, int64_t b, int64_t kv_head, Range rows, Range keys, const ForwardPart* part) {
      ForwardScratch& scratch = thread_scratch<ForwardScratch>();
      const Params& p = calls[c];
      const Problem& s = problems[c];
      const KeyPages* call_pages = pages != nullptr ? &pages[c] : nullptr;
      if (bf16_dot) forward_chunk<kBf16Dot>(p, s, config, b, kv_head, rows, keys, part, call_pages, scratch);
      else forward_chunk<false>(p, s, config, b, kv_head, rows, keys, part, call_pages, scratch);
    };
    if (parts == 1) {
      // Heads are cut in chunks (not kept whole, as the backward keeps them): each chunk loads its
      // head's K and V panels again, but on 16 threads whole heads left B4 H4 S4096 (16 heads) one
      // item a thread and ran 1.3-1.5x slower (docs/PERF.md); on 2 threads they gained 2-7 %.
      for_chunks(seqlen_q, kTileM, threads, false, {},
                 [&](const Params&, const Problem& s, size_t c, int64_t b, int64_t kv_head, Range rows,
                     int64_t) { run(c, b, kv_head, rows, Range{0, s.seqlen_k}, nullptr); });
      return Status::success();
    }
    for_parts([&](size_t c, int64_t b, int64_t kv_head, Range keys, int64_t local) {
      const Problem& s = problems[c];
      const int64_t rows = s.group * s.seqlen_q;
      const ForwardPart part{part_acc[c].get() + local * rows * round_up(s.head_dim_v, kLanes),
                             part_max[c].get() + local * rows, part_sum[c].get() + local * rows};
      run(c, b, kv_head, Range{0, s.seqlen_q}, keys, &part);
    });
    for_heads([&](size_t c, int64_t b, int64_t kv_head, int64_t first) {
      const Problem& s = problems[c];
      merge_parts(calls[c], s, b, kv_head, part_count[c], part_acc[c].get() + first * round_up(s.head_dim_v, kLanes),
                  part_max[c].get() + first, part_sum[c].get() + first,
                  thread_scratch<ForwardScratch>().row.reserve(round_up(s.head_dim_v, kLanes)));
    });
    return Status::success();
  }
  // Short calls keep their exponent tiles (ScoreCache) in a buffer of the calling thread's, kept
  // for its later calls (at most config.score_cache_bytes of tiles).
  std::vector<ScoreCache> caches(static_cast<size_t>(count));
  int64_t cache_tiles = 0;
  for (const Problem& s : problems) cache_tiles += ScoreCache::tiles_for(s);
  // The budget counts the tiles; their bases (a 64th more) come on top.
  const bool keep_scores = cache_tiles * kTileFloats * int64_t(sizeof(float)) <= config.score_cache_bytes;
  if (keep_scores) {
    thread_local Scratch cache_buffer;
    float* data = cache_buffer.reserve(cache_tiles * (kTileFloats + kTileM));
    float* bases = data + cache_tiles * kTileFloats;
    for (size_t c = 0; c < size_t(count); ++c) {
      const Problem& s = problems[c];
      caches[c].data = data;
      caches[c].bases = bases;
      caches[c].key_tiles = tiles(s.seqlen_k, kTileN);
      caches[c].query_tiles = tiles(s.seqlen_q, kTileM);
      caches[c].present.assign(size_t(ScoreCache::tiles_for(s)), 0);
      data += ScoreCache::tiles_for(s) * kTileFloats;
      bases += ScoreCache::tiles_for(s) * kTileM;
    }
  }
  auto cache_of = [&](size_t c) { return keep_scores ? &caches[c] : nullptr; };
  // The fused pass's key chunks (for_chunks below, sized for hardware_threads()): a call whose
  // items each span all its keys forms its statistics there (takes_own_statistics), and the
  // statistics pass leaves it out.
  std::vector<char> own_stats(static_cast<size_t>(count), 0), whole(static_cast<size_t>(count), 0);
  for (size_t c = 0; c < size_t(count) && parts == 1 && !keep_scores; ++c)
    whole[c] = takes_own_statistics(problems[c], config, Range{0, problems[c].seqlen_k});
  std::vector<DqAccumulator> dq(static_cast<size_t>(count));
  std::vector<int64_t> dq_items(static_cast<size_t>(count));
  for (size_t c = 0; c < size_t(count); ++c) {
    const Problem& s = problems[c];
    const int64_t per_chunk =
        chunk_tiles(tiles(s.seqlen_k, kTileN), heads_total, hardware_threads(), config, whole[c]) * kTileN;
    own_stats[c] = whole[c] && per_chunk >= s.seqlen_k;
    dq[c].direct = s.seqlen_k > 0 && per_chunk >= s.seqlen_k;  // one chunk per (batch, KV head)
    dq[c].dp = round_up(s.head_dim, kDimRows);
    dq[c].ld = round_up(s.seqlen_q, kTileM) + kLanes;
    if (dq[c].direct) continue;
    const int64_t size = s.batch * s.heads * dq[c].dp * dq[c].ld;
    std::fill_n(dq[c].data.reserve(size), size, 0.0f);
    dq[c].turn = std::vector<std::atomic<int64_t>>(size_t(s.batch * s.kv_heads));
    dq_items[c] = s.batch * s.heads;
  }
  // The preprocess, for the calls whose fused items do not compute it themselves (own_stats).
  std::vector<RowStats> stats(static_cast<size_t>(count));
  std::vector<int64_t> stat_items(static_cast<size_t>(count));
  for (size_t c = 0; c < size_t(count); ++c) {
    stats[c] = allocate_stats(problems[c]);
    stat_items[c] = own_stats[c] ? 0 : problems[c].batch * problems[c].heads;
  }
  const ItemPool stat_pool(stat_items);
  parallel_for(stat_pool.size(), threads, [&](int, int64_t item) {
    const size_t c = stat_pool.call(item);
    preprocess(calls[c], problems[c], item - stat_pool.first[c], stats[c]);
  });
  std::atomic<bool> abandoned{false};
  auto backward = [&](auto bf16_tag) {
    constexpr bool kBf16 = decltype(bf16_tag)::value;
    // The statistics first: the fused pass forms P from them.
    if (parts == 1) {
      for_chunks(seqlen_q, kTileM, threads, false, {},
                 [&](const Params& p, const Problem& s, size_t c, int64_t b, int64_t kv_head, Range rows,
                     int64_t) {
                   if (own_stats[c]) return;
                   backward_stats_chunk<kBf16>(p, s, config, stats[c], b, kv_head, rows, Range{0, s.seqlen_k},
                                               nullptr, cache_of(c), thread_scratch<BackwardScratch<kBf16>>());
                 });
    } else {
      for_parts([&](size_t c, int64_t b, int64_t kv_head, Range keys, int64_t local) {
        const Problem& s = problems[c];
        const int64_t rows = s.group * s.seqlen_q;
        const StatsPart part{part_max[c].get() + local * rows, part_sum[c].get() + local * rows,
                             part_acc[c].get() + local * rows};
        backward_stats_chunk<kBf16>(calls[c], s, config, stats[c], b, kv_head, Range{0, s.seqlen_q}, keys, &part,
                                    cache_of(c), thread_scratch<BackwardScratch<kBf16>>());
      });
      for_heads([&](size_t c, int64_t b, int64_t kv_head, int64_t first) {
        merge_stats_parts(calls[c], problems[c], stats[c], b, kv_head, part_count[c], part_max[c].get() + first,
                          part_sum[c].get() + first, part_acc[c].get() + first);
      });
    }
    // Key chunks run last first: under a causal mask the last keys see the fewest queries, so the
    // lighter chunks come first and a chunk rarely waits for its turn behind a heavier one.
    for_chunks(seqlen_k, kTileN, hardware_threads(), true, whole,
               [&](const Params& p, const Problem& s, size_t c, int64_t b, int64_t kv_head, Range keys,
                   int64_t rank) {
                 try {
                   backward_chunk<kBf16>(p, s, config, stats[c], b, kv_head, keys, rank, dq[c], abandoned,
                                         cache_of(c), own_stats[c] != 0, thread_scratch<BackwardScratch<kBf16>>());
                 } catch (...) {
                   abandoned.store(true);  // the chunks after this one would wait for it forever
                   throw;
                 }
               });
  };
  if (bf16_dot) backward(std::bool_constant<kBf16Dot>{});
  else backward(std::false_type{});
  const ItemPool dq_pool(dq_items);
  parallel_for(dq_pool.size(), threads, [&](int, int64_t item) {
    const size_t c = dq_pool.call(item);
    float* rows_buffer = thread_scratch<Scratch>().reserve(kTileM * dq[c].dp);
    write_dq(calls[c], problems[c], item - dq_pool.first[c], dq[c], rows_buffer);
  });
  return Status::success();
}

}  // namespace fmha::cpu::FMHA_CPU_ISA
