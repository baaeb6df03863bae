// The fast CPU path: FlashAttention-2 style tiled online softmax, forward and backward, fp32
// accumulation for fp32/fp16/bf16 storage, multi-threaded over (batch, head, tile).
//
// Forward, per (batch, head, query tile): for each key tile the mask lets it see,
//   load K tile, S = Q·K^T, mask, row max, exp2, row sum, rescale, load V, O += P·V.
// Backward runs two passes so that every output has one writer (deterministic, no atomics):
//   dK/dV pass, per (batch, KV head, key tile): over the group's query heads and query tiles,
//     P = exp2(S - LSE), dV += P^T·dO, dP = dO·V^T, dS = P∘(dP - Δ), dK += dS^T·Q
//   dQ pass, per (batch, head, query tile): over key tiles, dQ += dS·K
// with Δ = rowsum(dO∘O) computed first (the preprocess step).
#include "cpu/fast_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/numeric.h"
#include "common/parallel.h"
#include "common/problem.h"
#include "common/tensor_access.h"
#include "cpu/simd.h"

namespace fmha::cpu {
namespace {

constexpr int64_t kTileM = 64;             // query rows per tile
constexpr int64_t kTileN = kWideCols;      // keys per tile: one 64-wide register row
constexpr int kVecsN = int(kTileN / kLanes);
constexpr float kLn2 = 0.6931471805599453f;

// Converts n elements of one row of `t` (starting at element `offset`) to fp32.
void read_row(const Tensor& t, int64_t offset, int64_t n, float* dst, bool tf32) {
  switch (t.dtype) {
    case DType::fp32: std::memcpy(dst, static_cast<const float*>(t.data) + offset, size_t(n) * sizeof(float)); break;
    case DType::fp16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(src[i]);
      break;
    }
    case DType::bf16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
      break;
    }
  }
  if (tf32)
    for (int64_t i = 0; i < n; ++i) dst[i] = round_to_tf32(dst[i]);
}

void write_row(const Tensor& t, int64_t offset, int64_t n, const float* src) {
  switch (t.dtype) {
    case DType::fp32: std::memcpy(static_cast<float*>(t.data) + offset, src, size_t(n) * sizeof(float)); break;
    case DType::fp16: {
      uint16_t* dst = static_cast<uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_fp16(src[i]);
      break;
    }
    case DType::bf16: {
      uint16_t* dst = static_cast<uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
      break;
    }
  }
}

// A row tile of a [B, S, H, dim] tensor: dst[r][0:dim] for r < count, zero rows up to `rows`.
// Columns past `dim` are left as they are (zero since allocation).
void load_tile(const Tensor& t, int64_t b, int64_t first, int64_t count, int64_t h, int64_t dim,
               int64_t rows, float* dst, int64_t ld, bool tf32) {
  for (int64_t r = 0; r < count; ++r) read_row(t, offset4(t, b, first + r, h, 0), dim, dst + r * ld, tf32);
  for (int64_t r = count; r < rows; ++r) std::fill_n(dst + r * ld, dim, 0.0f);
}

// The transpose of a row tile: dst[d][r] for d < dim, r < count; zero for r in [count, kTileN).
void load_tile_transposed(const Tensor& t, int64_t b, int64_t first, int64_t count, int64_t h,
                          int64_t dim, float* dst, float* row_buffer, bool tf32) {
  for (int64_t r = 0; r < count; ++r) {
    read_row(t, offset4(t, b, first + r, h, 0), dim, row_buffer, tf32);
    for (int64_t d = 0; d < dim; ++d) dst[d * kTileN + r] = row_buffer[d];
  }
  for (int64_t d = 0; d < dim; ++d) std::fill(dst + d * kTileN + count, dst + (d + 1) * kTileN, 0.0f);
}

void round_tile_to_tf32(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_tf32(x[i]);
}

// Scales one 64-wide score row into the exp2 domain and applies the mask: keys outside
// [visible.begin, visible.end) (absolute indices; the tile starts at key `col0`) get -inf.
void scale_and_mask_row(float* s, float scale_log2, int64_t col0, Range visible, bool full) {
  if (full) {
    for (int v = 0; v < kVecsN; ++v) store(s + v * kLanes, load(s + v * kLanes) * scale_log2);
    return;
  }
  for (int64_t c = 0; c < kTileN; ++c) {
    const int64_t key = col0 + c;
    s[c] = (key >= visible.begin && key < visible.end) ? s[c] * scale_log2 : kNegInf;
  }
}

struct Work {
  int64_t b, h, tile;
};

// ------------------------------------------------------------------------------------------------
// Forward
// ------------------------------------------------------------------------------------------------

struct ForwardScratch {
  int64_t dp, dvp;   // head dims padded to a multiple of 16
  Scratch q;         // [kTileM, dp]        queries, fp32
  Scratch kt;        // [dp, kTileN]        keys, transposed
  Scratch v;         // [kTileN, dvp]       values
  Scratch s;         // [kTileM, kTileN]    scores, then probabilities (exp2 domain)
  Scratch acc;       // [kTileM, dvp]       unnormalised output
  Scratch row;       // [max(dp, dvp)]      one converted row
  ForwardScratch(int64_t d, int64_t dv)
      : dp(round_up(d, kLanes)), dvp(round_up(dv, kLanes)), q(kTileM * dp), kt(dp * kTileN),
        v(kTileN * dvp), s(kTileM * kTileN), acc(kTileM * dvp), row(std::max(dp, dvp)) {}
};

void forward_tile(const Params& p, const Problem& s, const Work& w, ForwardScratch& t) {
  const int64_t kv_head = w.h / s.group;
  const Range rows{w.tile * kTileM, std::min(w.tile * kTileM + kTileM, s.seqlen_q)};
  const int64_t count = rows.size();
  const int64_t active = round_up(count, kRowBlock);
  const Range keys = s.mask.keys(rows);

  float row_max[kTileM], row_sum[kTileM];
  std::fill_n(row_max, kTileM, kNegInf);
  std::fill_n(row_sum, kTileM, 0.0f);
  std::fill_n(t.acc.get(), kTileM * t.dvp, 0.0f);

  if (!keys.empty()) load_tile(p.q, w.b, rows.begin, count, w.h, s.head_dim, active, t.q.get(), t.dp, s.tf32);
  for (int64_t col0 = keys.begin; col0 < keys.end; col0 += kTileN) {
    const Range cols{col0, std::min(col0 + kTileN, keys.end)};
    // Load K tile (transposed, [dp, kTileN]); S = Q·K^T  [kTileM, kTileN]
    load_tile_transposed(p.k, w.b, cols.begin, cols.size(), kv_head, s.head_dim, t.kt.get(), t.row.get(), s.tf32);
    gemm(active, kTileN, t.dp, t.q.get(), t.dp, t.kt.get(), kTileN, t.s.get(), kTileN, false);
    const bool full = cols.size() == kTileN && s.mask.tile_is_full(rows, cols);
    for (int64_t r = 0; r < active; ++r) {
      float* srow = t.s.get() + r * kTileN;
      // Mask, row max, exp2, row sum, rescale.
      scale_and_mask_row(srow, s.scale_log2, col0, r < count ? s.mask.keys(rows.begin + r) : Range{}, full);
      v16f m = load(srow);
      for (int v = 1; v < kVecsN; ++v) {
        const v16f x = load(srow + v * kLanes);
        m = x > m ? x : m;
      }
      const float tile_max = horizontal_max(m);
      const float new_max = std::max(row_max[r], tile_max);
      const float base = new_max == kNegInf ? 0.0f : new_max;  // a row with nothing visible yet
      v16f sum{};
      for (int v = 0; v < kVecsN; ++v) {
        const v16f prob = exp2(load(srow + v * kLanes) - base);
        store(srow + v * kLanes, prob);
        sum += prob;
      }
      const float rescale = exp2(splat(row_max[r] - base))[0];
      row_sum[r] = row_sum[r] * rescale + horizontal_sum(sum);
      row_max[r] = new_max;
      if (rescale != 1.0f) {
        float* acc = t.acc.get() + r * t.dvp;
        for (int64_t d = 0; d < t.dvp; d += kLanes) store(acc + d, load(acc + d) * rescale);
      }
    }
    if (s.tf32) round_tile_to_tf32(t.s.get(), active * kTileN);
    // Load V tile [kTileN, dvp]; O += P·V
    load_tile(p.v, w.b, cols.begin, cols.size(), kv_head, s.head_dim_v, kTileN, t.v.get(), t.dvp, s.tf32);
    gemm(active, t.dvp, kTileN, t.s.get(), kTileN, t.v.get(), t.dvp, t.acc.get(), t.dvp, true);
  }

  // Epilogue: O = acc / row_sum, LSE = ln(row_sum) + max; rows that saw nothing get 0 and -inf.
  for (int64_t r = 0; r < count; ++r) {
    float* acc = t.acc.get() + r * t.dvp;
    const float inv = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
    for (int64_t d = 0; d < s.head_dim_v; ++d) acc[d] *= inv;
    write_row(p.o, offset4(p.o, w.b, rows.begin + r, w.h, 0), s.head_dim_v, acc);
    if (p.lse.defined()) {
      const float lse = row_sum[r] > 0.0f ? (row_max[r] + std::log2(row_sum[r])) * kLn2 : kNegInf;
      static_cast<float*>(p.lse.data)[offset3(p.lse, w.b, w.h, rows.begin + r)] = lse;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Backward
// ------------------------------------------------------------------------------------------------

struct BackwardScratch {
  int64_t dp, dvp;
  Scratch q, qt;     // [kTileM, dp], [dp, kTileM]       queries and their transpose
  Scratch k, kt;     // [kTileN, dp], [dp, kTileN]       keys and their transpose
  Scratch v, vt;     // [kTileN, dvp], [dvp, kTileN]     values and their transpose
  Scratch dout, doutt; // [kTileM, dvp], [dvp, kTileM]   output gradient and its transpose
  Scratch s, dprob;    // [64, 64]                         probabilities, then dS; dP
  Scratch dk, dv;    // [kTileN, dp], [kTileN, dvp]      fp32 accumulators (dK/dV pass)
  Scratch dq;        // [kTileM, dp]                     fp32 accumulator (dQ pass)
  Scratch row;
  BackwardScratch(int64_t d, int64_t dv_)
      : dp(round_up(d, kLanes)), dvp(round_up(dv_, kLanes)), q(kTileM * dp), qt(dp * kTileM),
        k(kTileN * dp), kt(dp * kTileN), v(kTileN * dvp), vt(dvp * kTileN), dout(kTileM * dvp),
        doutt(dvp * kTileM), s(kTileM * kTileN), dprob(kTileM * kTileN), dk(kTileN * dp), dv(kTileN * dvp),
        dq(kTileM * dp), row(std::max(dp, dvp)) {}
};

static_assert(kTileM == kTileN, "the backward transposes score tiles in place of each other");

struct RowStats {
  std::vector<float> lse_log2;  // [B, H, Sq]: LSE in the exp2 domain; +inf for rows that see nothing
  std::vector<float> delta;     // [B, H, Sq]: rowsum(dO ∘ O)
};

RowStats preprocess(const Params& p, const Problem& s, int threads) {
  RowStats st;
  const int64_t n = s.batch * s.heads * s.seqlen_q;
  st.lse_log2.resize(size_t(n));
  st.delta.resize(size_t(n));
  parallel_for(s.batch * s.heads, threads, [&](int, int64_t item) {
    const int64_t b = item / s.heads, h = item % s.heads;
    std::vector<float> o_row(size_t(s.head_dim_v)), do_row(size_t(s.head_dim_v));
    for (int64_t i = 0; i < s.seqlen_q; ++i) {
      const size_t idx = size_t(item * s.seqlen_q + i);
      const float lse = static_cast<const float*>(p.lse.data)[offset3(p.lse, b, h, i)];
      st.lse_log2[idx] = lse == kNegInf ? INFINITY : float(double(lse) * kLog2e);
      read_row(p.o, offset4(p.o, b, i, h, 0), s.head_dim_v, o_row.data(), false);
      read_row(p.dout, offset4(p.dout, b, i, h, 0), s.head_dim_v, do_row.data(), false);
      float delta = 0.0f;
      for (int64_t d = 0; d < s.head_dim_v; ++d) delta += o_row[size_t(d)] * do_row[size_t(d)];
      st.delta[idx] = delta;
    }
  });
  return st;
}

// P = exp2(S·scale_log2 - lse) masked, for a [rows, cols] score tile stored row-major with rows
// indexed by query. `transposed`: the tile is [key][query] instead.
void probabilities(float* s, const Problem& pr, Range rows, Range cols, const float* lse_log2,
                   bool transposed) {
  const bool full = rows.size() == kTileM && cols.size() == kTileN && pr.mask.tile_is_full(rows, cols);
  if (!transposed) {
    for (int64_t r = 0; r < kTileM; ++r) {
      float* srow = s + r * kTileN;
      if (r >= rows.size()) {
        std::fill_n(srow, kTileN, 0.0f);
        continue;
      }
      scale_and_mask_row(srow, pr.scale_log2, cols.begin, pr.mask.keys(rows.begin + r), full);
      const float lse = lse_log2[r];
      for (int v = 0; v < kVecsN; ++v) store(srow + v * kLanes, exp2(load(srow + v * kLanes) - lse));
    }
    return;
  }
  // [key c][query r]: the mask is per query, i.e. per column here.
  for (int64_t c = 0; c < kTileN; ++c) {
    float* srow = s + c * kTileM;
    if (c >= cols.size()) {
      std::fill_n(srow, kTileM, 0.0f);
      continue;
    }
    const Range visible_rows = full ? Range{rows.begin, rows.begin + kTileM} : pr.mask.queries(cols.begin + c);
    for (int64_t r = 0; r < kTileM; ++r) {
      const int64_t row = rows.begin + r;
      const bool on = r < rows.size() && row >= visible_rows.begin && row < visible_rows.end;
      srow[r] = on ? srow[r] * pr.scale_log2 - lse_log2[r] : kNegInf;
    }
    for (int v = 0; v < kVecsN; ++v) store(srow + v * kLanes, exp2(load(srow + v * kLanes)));
  }
}

// dS = P ∘ (dP - Δ); `transposed` as above (Δ is per query: per row, or per column when transposed).
void score_gradient(float* ds_inout_p, const float* dprob, const float* delta, bool transposed) {
  for (int64_t a = 0; a < kTileM; ++a)
    for (int64_t c = 0; c < kTileN; ++c) {
      const float d = transposed ? delta[c] : delta[a];
      ds_inout_p[a * kTileN + c] *= dprob[a * kTileN + c] - d;
    }
}

void backward_kv_tile(const Params& p, const Problem& s, const RowStats& st, int64_t b, int64_t kv_head,
                      int64_t tile, BackwardScratch& t) {
  const Range cols{tile * kTileN, std::min(tile * kTileN + kTileN, s.seqlen_k)};
  std::fill_n(t.dk.get(), kTileN * t.dp, 0.0f);
  std::fill_n(t.dv.get(), kTileN * t.dvp, 0.0f);
  const Range rows_all = s.mask.queries(Range{0, s.seqlen_q}, cols);
  if (!rows_all.empty()) {
    load_tile(p.k, b, cols.begin, cols.size(), kv_head, s.head_dim, kTileN, t.k.get(), t.dp, s.tf32);
    load_tile(p.v, b, cols.begin, cols.size(), kv_head, s.head_dim_v, kTileN, t.v.get(), t.dvp, s.tf32);
  }
  float lse_tile[kTileM], delta_tile[kTileM];
  for (int64_t g = 0; g < s.group; ++g) {
    const int64_t h = kv_head * s.group + g;
    for (int64_t row0 = rows_all.begin; row0 < rows_all.end; row0 += kTileM) {
      const Range rows{row0, std::min(row0 + kTileM, rows_all.end)};
      const int64_t count = rows.size();
      const size_t stat0 = size_t((b * s.heads + h) * s.seqlen_q + row0);
      for (int64_t r = 0; r < kTileM; ++r) {
        lse_tile[r] = r < count ? st.lse_log2[stat0 + size_t(r)] : INFINITY;
        delta_tile[r] = r < count ? st.delta[stat0 + size_t(r)] : 0.0f;
      }
      load_tile(p.q, b, rows.begin, count, h, s.head_dim, kTileM, t.q.get(), t.dp, s.tf32);
      load_tile_transposed(p.q, b, rows.begin, count, h, s.head_dim, t.qt.get(), t.row.get(), s.tf32);
      load_tile(p.dout, b, rows.begin, count, h, s.head_dim_v, kTileM, t.dout.get(), t.dvp, s.tf32);
      load_tile_transposed(p.dout, b, rows.begin, count, h, s.head_dim_v, t.doutt.get(), t.row.get(), s.tf32);
      // S^T = K·Q^T  [kTileN keys, kTileM queries]; P^T
      gemm(kTileN, kTileM, t.dp, t.k.get(), t.dp, t.qt.get(), kTileM, t.s.get(), kTileM, false);
      probabilities(t.s.get(), s, rows, cols, lse_tile, true);
      if (s.tf32) round_tile_to_tf32(t.s.get(), kTileN * kTileM);
      // dV += P^T·dO
      gemm(kTileN, t.dvp, kTileM, t.s.get(), kTileM, t.dout.get(), t.dvp, t.dv.get(), t.dvp, true);
      // dP^T = V·dO^T; dS^T = P^T ∘ (dP^T - Δ)
      gemm(kTileN, kTileM, t.dvp, t.v.get(), t.dvp, t.doutt.get(), kTileM, t.dprob.get(), kTileM, false);
      score_gradient(t.s.get(), t.dprob.get(), delta_tile, true);
      if (s.tf32) round_tile_to_tf32(t.s.get(), kTileN * kTileM);
      // dK += dS^T·Q
      gemm(kTileN, t.dp, kTileM, t.s.get(), kTileM, t.q.get(), t.dp, t.dk.get(), t.dp, true);
    }
  }
  for (int64_t c = 0; c < cols.size(); ++c) {
    float* dk_row = t.dk.get() + c * t.dp;
    for (int64_t d = 0; d < s.head_dim; ++d) dk_row[d] *= s.scale;
    write_row(p.dk, offset4(p.dk, b, cols.begin + c, kv_head, 0), s.head_dim, dk_row);
    write_row(p.dv, offset4(p.dv, b, cols.begin + c, kv_head, 0), s.head_dim_v, t.dv.get() + c * t.dvp);
  }
}

void backward_q_tile(const Params& p, const Problem& s, const RowStats& st, const Work& w, BackwardScratch& t) {
  const int64_t kv_head = w.h / s.group;
  const Range rows{w.tile * kTileM, std::min(w.tile * kTileM + kTileM, s.seqlen_q)};
  const int64_t count = rows.size();
  const Range keys = s.mask.keys(rows);
  std::fill_n(t.dq.get(), kTileM * t.dp, 0.0f);
  float lse_tile[kTileM], delta_tile[kTileM];
  const size_t stat0 = size_t((w.b * s.heads + w.h) * s.seqlen_q + rows.begin);
  for (int64_t r = 0; r < kTileM; ++r) {
    lse_tile[r] = r < count ? st.lse_log2[stat0 + size_t(r)] : INFINITY;
    delta_tile[r] = r < count ? st.delta[stat0 + size_t(r)] : 0.0f;
  }
  if (!keys.empty()) {
    load_tile(p.q, w.b, rows.begin, count, w.h, s.head_dim, kTileM, t.q.get(), t.dp, s.tf32);
    load_tile(p.dout, w.b, rows.begin, count, w.h, s.head_dim_v, kTileM, t.dout.get(), t.dvp, s.tf32);
  }
  for (int64_t col0 = keys.begin; col0 < keys.end; col0 += kTileN) {
    const Range cols{col0, std::min(col0 + kTileN, keys.end)};
    load_tile_transposed(p.k, w.b, cols.begin, cols.size(), kv_head, s.head_dim, t.kt.get(), t.row.get(), s.tf32);
    load_tile(p.k, w.b, cols.begin, cols.size(), kv_head, s.head_dim, kTileN, t.k.get(), t.dp, s.tf32);
    load_tile_transposed(p.v, w.b, cols.begin, cols.size(), kv_head, s.head_dim_v, t.vt.get(), t.row.get(), s.tf32);
    // S = Q·K^T; P
    gemm(kTileM, kTileN, t.dp, t.q.get(), t.dp, t.kt.get(), kTileN, t.s.get(), kTileN, false);
    probabilities(t.s.get(), s, rows, cols, lse_tile, false);
    // dP = dO·V^T; dS = P ∘ (dP - Δ)
    gemm(kTileM, kTileN, t.dvp, t.dout.get(), t.dvp, t.vt.get(), kTileN, t.dprob.get(), kTileN, false);
    score_gradient(t.s.get(), t.dprob.get(), delta_tile, false);
    if (s.tf32) round_tile_to_tf32(t.s.get(), kTileM * kTileN);
    // dQ += dS·K
    gemm(kTileM, t.dp, kTileN, t.s.get(), kTileN, t.k.get(), t.dp, t.dq.get(), t.dp, true);
  }
  for (int64_t r = 0; r < count; ++r) {
    float* dq_row = t.dq.get() + r * t.dp;
    for (int64_t d = 0; d < s.head_dim; ++d) dq_row[d] *= s.scale;
    write_row(p.dq, offset4(p.dq, w.b, rows.begin + r, w.h, 0), s.head_dim, dq_row);
  }
}

int64_t tiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

}  // namespace

Status supports(const Params& p, Direction) {
  if (p.q.shape[3] > kMaxHeadDim)
    return {Code::unsupported, "q: head_dim " + std::to_string(p.q.shape[3]) + " is above the cpu backend's limit of " +
                                   std::to_string(kMaxHeadDim)};
  if (p.v.shape[3] > kMaxHeadDim)
    return {Code::unsupported, "v: head_dim_v " + std::to_string(p.v.shape[3]) +
                                   " is above the cpu backend's limit of " + std::to_string(kMaxHeadDim)};
  return Status::success();
}

Status run(const Params& p, Direction direction) {
  const Problem s = Problem::of(p);
  const int threads = resolve_threads(p.num_threads);
  const int64_t q_tiles = tiles(s.seqlen_q, kTileM);
  if (direction == Direction::forward) {
    const int64_t n = s.batch * s.heads * q_tiles;
    std::vector<std::unique_ptr<ForwardScratch>> scratch(size_t(std::max(threads, 1)));
    parallel_for(n, threads, [&](int worker, int64_t item) {
      auto& t = scratch[size_t(worker)];
      if (!t) t = std::make_unique<ForwardScratch>(s.head_dim, s.head_dim_v);
      // Tiles of one head run next to each other; causal rows with more keys come first.
      const Work w{item / (s.heads * q_tiles), (item / q_tiles) % s.heads, q_tiles - 1 - item % q_tiles};
      forward_tile(p, s, w, *t);
    });
    return Status::success();
  }

  const RowStats stats = preprocess(p, s, threads);
  std::vector<std::unique_ptr<BackwardScratch>> scratch(size_t(std::max(threads, 1)));
  auto scratch_for = [&](int worker) -> BackwardScratch& {
    auto& t = scratch[size_t(worker)];
    if (!t) t = std::make_unique<BackwardScratch>(s.head_dim, s.head_dim_v);
    return *t;
  };
  const int64_t k_tiles = tiles(s.seqlen_k, kTileN);
  parallel_for(s.batch * s.kv_heads * k_tiles, threads, [&](int worker, int64_t item) {
    backward_kv_tile(p, s, stats, item / (s.kv_heads * k_tiles), (item / k_tiles) % s.kv_heads, item % k_tiles,
                     scratch_for(worker));
  });
  parallel_for(s.batch * s.heads * q_tiles, threads, [&](int worker, int64_t item) {
    const Work w{item / (s.heads * q_tiles), (item / q_tiles) % s.heads, q_tiles - 1 - item % q_tiles};
    backward_q_tile(p, s, stats, w, scratch_for(worker));
  });
  return Status::success();
}

}  // namespace fmha::cpu
