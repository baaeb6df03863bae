// See paged.h. A sequence's visible keys are cut into pieces of at most a target length; each
// piece is a dense batch-1 call straight on the cache's memory (no copy), with the mask moved to
// the piece's first key: on a contiguous cache a view of its rows, on pages a view at the pool's
// base whose rows the fast path finds through the sequence's block-table row (kernels.h
// KeyPages), so that a piece spans as many pages as it needs. The pieces of all sequences run as
// one pool of the fast path's kernels, so one sequence with a long cache still gives every thread
// work (split-KV), and their fp32 partial outputs and LSEs are merged (common/merge.h) into o and
// lse.
#include "cpu/paged.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/merge.h"
#include "common/numeric.h"
#include "common/paged.h"
#include "common/parallel.h"
#include "common/problem.h"
#include "common/tensor_access.h"

namespace fmha::cpu {
namespace {

// Items (piece x KV head) per thread that the piece length aims for: slack for dynamic scheduling,
// as the dense path's chunking has.
constexpr int64_t kItemsPerThread = 4;
// The shortest piece cut for balance alone: below it a piece's fixed costs (its query panel, its
// share of the merge) outweigh its keys.
constexpr int64_t kMinPieceKeys = 256;
// The longest piece, for a few query rows: its K and V panels (fp32 on the CPU but for bf16,
// which the dot-product and AMX paths read as stored) stay in the core's L2 while its matmuls
// read them (longer pieces of one long sequence ran 1.2-1.4x slower on a 2-core Xeon with AMX).
// Each piece also writes a partial output per query row that the merge reads again, so beyond
// kPieceRows (bf16: kPieceRowsBf16) rows a KV head (seqlen_q · group) the longest piece grows with them
// (docs/PERF.md: with 16 queries at GQA 4, 512-key bf16 pieces ran 1.26x slower than 8,192).
constexpr int64_t kMaxPieceKeys = 256;
constexpr int64_t kMaxPieceKeysBf16 = 512;
constexpr int64_t kPieceRows = 16;
constexpr int64_t kPieceRowsBf16 = 8;
// Partial results held at once; the pieces run in waves whose partials fit.
constexpr int64_t kWaveBytes = int64_t(64) << 20;

// Keys [key_begin, key_end) of one sequence.
struct Piece {
  int64_t sequence = 0, key_begin = 0, key_end = 0;
};

// Rows [start, start + n) of a cache tensor as a dense [1, n, Hkv, dim] view (row 0 of page 0 for
// a paged piece: its rows are found through KeyPages).
Tensor cache_rows(const Tensor& t, CacheRow start, int64_t n) {
  Tensor out = t;
  out.shape[0] = 1;
  out.shape[1] = n;
  out.stride[0] = 0;
  out.data = static_cast<char*>(t.data) +
             (start.page * t.stride[0] + start.row * t.stride[1]) * int64_t(dtype_size(t.dtype));
  return out;
}

// Sequence b of a dense [B, ...] tensor as a [1, ...] view.
Tensor batch_row(const Tensor& t, int64_t b) {
  if (!t.defined()) return t;
  Tensor out = t;
  out.shape[0] = 1;
  out.stride[0] = 0;
  out.data = static_cast<char*>(t.data) + b * t.stride[0] * int64_t(dtype_size(t.dtype));
  return out;
}

}  // namespace

Status run_paged(const Params& p, const DenseRunner& run_dense) {
  const Problem s = Problem::of(p);
  if (s.empty()) return Status::success();
  const PagedCache cache = PagedCache::of(p);
  const int threads = resolve_threads(p.num_threads);
  const bool table = p.block_table.defined();

  // Each sequence's keys that any of its rows sees; the rest are never read.
  std::vector<Range> visible(size_t(s.batch));
  int64_t total_keys = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    visible[size_t(b)] = sequence_mask(p, s.seqlen_q, cache.length(b)).keys(Range{0, s.seqlen_q});
    total_keys += visible[size_t(b)].size();
  }
  const int64_t wanted = std::max<int64_t>(1, (kItemsPerThread * threads + s.kv_heads - 1) / std::max<int64_t>(s.kv_heads, 1));
  const bool bf16 = p.q.dtype == DType::bf16;
  const int64_t rows = s.seqlen_q * s.group;  // a KV head's query rows
  const int64_t longest = bf16 ? kMaxPieceKeysBf16 * std::max<int64_t>(1, rows / kPieceRowsBf16)
                               : kMaxPieceKeys * std::max<int64_t>(1, rows / kPieceRows);
  const int64_t target = std::min(longest, std::max(kMinPieceKeys, (total_keys + wanted - 1) / wanted));

  std::vector<Piece> pieces;
  for (int64_t b = 0; b < s.batch; ++b) {
    const Range keys = visible[size_t(b)];
    for (int64_t j = keys.begin; j < keys.end;) {
      const int64_t end = std::min(keys.end, j + target);
      pieces.push_back({b, j, end});
      j = end;
    }
  }

  // Accumulators: [B, Sq, H, Dv] outputs and [B, H, Sq] LSEs in fp32, starting empty (lse -inf).
  const int64_t rows_per_sequence = s.seqlen_q * s.heads;
  std::vector<float> acc_o(size_t(s.batch * rows_per_sequence * s.head_dim_v), 0.0f);
  std::vector<float> acc_lse(size_t(s.batch * rows_per_sequence), -INFINITY);
  const Tensor acc_o_view =
      make_tensor(acc_o.data(), DType::fp32, {s.batch, s.seqlen_q, s.heads, s.head_dim_v});
  const Tensor acc_lse_view = make_tensor(acc_lse.data(), DType::fp32, {s.batch, s.heads, s.seqlen_q});

  const int64_t piece_floats = rows_per_sequence * (s.head_dim_v + 1);
  const int64_t per_wave = std::max<int64_t>(1, kWaveBytes / int64_t(sizeof(float)) / std::max<int64_t>(piece_floats, 1));
  std::vector<float> part_o, part_lse;
  std::vector<Params> calls;
  std::vector<KeyPages> pages;
  for (size_t wave = 0; wave < pieces.size(); wave += size_t(per_wave)) {
    const size_t wave_end = std::min(pieces.size(), wave + size_t(per_wave));
    const int64_t count = int64_t(wave_end - wave);
    part_o.resize(size_t(count * rows_per_sequence * s.head_dim_v));
    part_lse.resize(size_t(count * rows_per_sequence));
    calls.assign(size_t(count), p);
    pages.assign(size_t(count), KeyPages{});
    for (int64_t i = 0; i < count; ++i) {
      const Piece& piece = pieces[wave + size_t(i)];
      Params& call = calls[size_t(i)];
      call.block_table = call.cache_seqlens = Tensor{};
      call.q = batch_row(p.q, piece.sequence);
      const int64_t n = piece.key_end - piece.key_begin;
      const CacheRow start = table ? CacheRow{0, 0} : cache.row_of(piece.sequence, piece.key_begin);
      call.k = cache_rows(p.k, start, n);
      call.v = cache_rows(p.v, start, n);
      if (table) {
        KeyPages& at = pages[size_t(i)];
        at.table = static_cast<const int32_t*>(p.block_table.data) + piece.sequence * p.block_table.stride[0];
        at.table_stride = p.block_table.stride[1];
        at.page_size = cache.page_size;
        at.first_key = piece.key_begin;
        at.num_pages = cache.num_pages;
        at.k_page_stride = p.k.stride[0];
        at.v_page_stride = p.v.stride[0];
      }
      call.o = make_tensor(part_o.data() + i * rows_per_sequence * s.head_dim_v, DType::fp32,
                           {1, s.seqlen_q, s.heads, s.head_dim_v});
      call.lse = make_tensor(part_lse.data() + i * rows_per_sequence, DType::fp32, {1, s.heads, s.seqlen_q});
      // The sequence's mask seen from the piece's first key: the same positions, shifted. Causal
      // masking becomes top-left (no alignment term: the shift already holds it).
      const Mask mask = sequence_mask(p, s.seqlen_q, cache.length(piece.sequence));
      call.causal = p.causal == Causal::none ? Causal::none : Causal::top_left;
      call.q_offset = mask.shift - piece.key_begin;
    }
    if (Status st = run_dense(calls.data(), count, table ? pages.data() : nullptr); !st.ok()) return st;

    // Merge the wave's parts into the accumulators, row by row: a row's parts are its sequence's
    // pieces of this wave, in key order.
    std::vector<size_t> first_piece(size_t(s.batch), wave_end), end_piece(size_t(s.batch), wave_end);
    for (size_t i = wave; i < wave_end; ++i) {
      const size_t b = size_t(pieces[i].sequence);
      if (first_piece[b] == wave_end) first_piece[b] = i;
      end_piece[b] = i + 1;
    }
    parallel_for(s.batch * rows_per_sequence, threads, [&](int, int64_t item) {
      const int64_t b = item / rows_per_sequence, h = item % s.heads, row = (item / s.heads) % s.seqlen_q;
      float* out = acc_o.data() + offset4(acc_o_view, b, row, h, 0);
      float& lse = acc_lse[size_t(offset3(acc_lse_view, b, h, row))];
      for (size_t i = first_piece[size_t(b)]; i < end_piece[size_t(b)]; ++i) {
        const int64_t local = int64_t(i - wave);
        const float part = part_lse[size_t(local * rows_per_sequence + h * s.seqlen_q + row)];
        const MergeWeights w = merge_weights(lse, part);
        const float* part_row = part_o.data() + local * rows_per_sequence * s.head_dim_v + (row * s.heads + h) * s.head_dim_v;
        // A side of weight 0 is not read (an empty accumulator, a part that saw no key): one
        // branch a part, so that each loop below is a plain vector loop.
        const int64_t dv = s.head_dim_v;
        if (w.a != 0.f && w.b != 0.f) {
          for (int64_t d = 0; d < dv; ++d) out[d] = w.a * out[d] + w.b * part_row[d];
        } else if (w.b != 0.f) {
          for (int64_t d = 0; d < dv; ++d) out[d] = w.b * part_row[d];
        } else if (w.a != 0.f) {
          for (int64_t d = 0; d < dv; ++d) out[d] = w.a * out[d];
        } else {
          std::fill_n(out, dv, 0.f);
        }
        lse = w.lse;
      }
    });
  }

  // The merged result in o's dtype; rows that saw no key are 0 with lse -inf.
  parallel_for(s.batch * rows_per_sequence, threads, [&](int, int64_t item) {
    const int64_t b = item / rows_per_sequence, h = item % s.heads, row = (item / s.heads) % s.seqlen_q;
    write_row(p.o, offset4(p.o, b, row, h, 0), s.head_dim_v, acc_o.data() + offset4(acc_o_view, b, row, h, 0));
    if (p.lse.defined())
      static_cast<float*>(p.lse.data)[offset3(p.lse, b, h, row)] = acc_lse[size_t(offset3(acc_lse_view, b, h, row))];
  });
  return Status::success();
}

void append_kv(const Params& p) {
  const PagedCache cache = PagedCache::of(p);
  const int64_t batch = p.k_new.shape[0], seqlen_new = p.k_new.shape[1], kv_heads = p.k.shape[2];
  const int64_t head_dim = p.k.shape[3], head_dim_v = p.v.shape[3];
  const int64_t element = int64_t(dtype_size(p.k.dtype));
  // Rows are copied as stored: the cache and the new rows share a dtype, so no rounding happens.
  auto copy_row = [&](const Tensor& dst, CacheRow at, const Tensor& src, int64_t b, int64_t i, int64_t h, int64_t dim) {
    std::copy_n(static_cast<const char*>(src.data) + offset4(src, b, i, h, 0) * element, dim * element,
                static_cast<char*>(dst.data) + offset4(dst, at.page, at.row, h, 0) * element);
  };
  parallel_for(batch * seqlen_new, resolve_threads(p.num_threads), [&](int, int64_t item) {
    const int64_t b = item / seqlen_new, i = item % seqlen_new;
    const CacheRow at = cache.row_of(b, cache.raw_length(b) + i);
    for (int64_t h = 0; h < kv_heads; ++h) {
      copy_row(p.k, at, p.k_new, b, i, h, head_dim);
      copy_row(p.v, at, p.v_new, b, i, h, head_dim_v);
    }
  });
}

}  // namespace fmha::cpu
