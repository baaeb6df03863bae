// The simt backward kernels: exact fp32 arithmetic from fp32, fp16 or bf16 storage (T).
//   bwd_stats_kernel: one block per (query tile, head, batch), before the others. Each row's
//                  softmax max and sum, online over the keys it sees as the forward forms them,
//                  from the scores the other kernels form again bit for bit. P is not recovered
//                  from the given LSE: an fp32 LSE of magnitude ~100 (peaked softmax: large
//                  logits) is off by ~|LSE|·2^-24, and 2^(S·scale_log2 - LSE·log2 e) adds two
//                  more roundings of that size, an error in every P (dV ~60x a plain fp32
//                  softmax's on such rows; dQ, dK 3-10x) where a plain softmax gets the dominant
//                  P exactly (exp(s - max) = 1). With the row's own max, the exp2 argument
//                  (x - max)·|scale_log2| is exact near the max. Costs one S = Q·K^T product (of
//                  the five the backward forms) and one exp2 per score; query tiles with a peaked
//                  row also form Δ = rowsum(P ∘ dP) (kOwnDeltaMinPeak), two products more.
//   bwd_kernel:    one block per (key tile, KV head, batch). Loops over the group's query heads and
//                  the query tiles that see the key tile, accumulating dK and dV in registers (no
//                  atomics, GQA sums included); adds dS·K into the fp32 dQ accumulator with
//                  atomics unless dq_accum is null (deterministic mode).
//   bwd_dq_kernel: deterministic mode's dQ: one block per (query tile, head, batch), looping over
//                  the key tiles it sees, like the forward; one writer per dQ element.
//   micro_bwd_kernel: bwd_kernel's contract with register micro-tiles (fp32 storage only,
//                  simt_bwd_micro_mainloop.cuh); the next query tile's loads overlap the dQ step.
// In a packed call the batch index is the sequence's (args.h sequence()), and a key tile
// (query tile, for bwd_dq_kernel) past that sequence's length exits at once.
#pragma once

#include "cuda/common/block_sequence.cuh"
#include "cuda/simt/simt_bwd_mainloop.cuh"
#include "cuda/simt/simt_bwd_micro_mainloop.cuh"

namespace fmha::cuda::simt {

// The statistics kernel's tiles, Grid16 (the deterministic dQ kernel's shapes): Q and K for the
// rows' max and sum; dO and V besides for the Δ pass.
template <int HD, int BM, int BN>
struct StatsTiles {
  static_assert(BM % 16 == 0 && BN % 16 == 0 && HD % 16 == 0, "Grid16 tiles are multiples of 16");
  using QTile = tile::SmemTile<float, BM, HD, kRowPad>;   // [BM, HD] queries, or dO (head_dim_v <= HD)
  using KVTile = tile::SmemTile<float, BN, HD, kRowPad>;  // [BN, HD] keys, or values
  static constexpr int kWarps = tile::Grid16::kThreads / 32;
  static_assert(BN <= tile::Grid16::kThreads, "a thread per key of the tile (key norms)");
  struct SharedStorage {
    tile::SmemArray<QTile> q, dout;
    tile::SmemArray<KVTile> k, v;
    float key_norm2[kWarps];  // [warps] each warp's largest |k|^2 over the block's keys (lse_factor)
  };
  using Scores = tile::RegTile<float, BM / 16, BN / 16>;  // [BM, BN] x = sign(scale)·(q·k), or dP
};

// |k|^2 of key `key` of the K tile, over the head dim (zero past head_dim): [HD] FMAs of one thread.
template <int HD, class KTile>
__device__ __forceinline__ float key_norm2(KTile k, int key) {
  float n2 = 0.f;
#pragma unroll 8
  for (int d = 0; d < HD; ++d) n2 = fmaf(k(key, d), k(key, d), n2);
  return n2;
}

// Δ = rowsum(dO ∘ O) cancels against dP = dO·V^T only to O's rounding: where one key dominates a
// row (P near 1), dS = P·(dP - Δ) keeps that residue, and dQ and dK reach 2-3x a plain fp32
// softmax's error (whose Δ = rowsum(P ∘ dP) cancels exactly). A query tile with a row whose
// largest P is at least this forms Δ = rowsum(P ∘ dP) from its own P and dP (a second pass over
// its keys: S and dP again); the others keep the preprocess's Δ.
inline constexpr float kOwnDeltaMinPeak = 0.5f;

// The factor that turns the row's own softmax (its recomputed max and sum) into the one the given
// LSE defines, P = exp(scale·s - lse): 1 where lse is the row's own, within what the forward's
// rounding and its differently ordered scores leave; exp(own - lse) where lse is larger, as when the
// call is one part of the keys and lse the merged softmax's (fmha::merge; ring attention): P is then
// the part's share. 0 where lse is -inf (no key seen).
// What "within the forward's rounding" means: the forward forms each score in its own order (Q
// pre-scaled by scale·log2 e, or S scaled after; the LSE as (max + log2 sum)·ln 2), so its scores
// differ from these by up to a few fp32 units of |scale|·sum_d |q_d·k_d|, not of the score: where the
// products cancel (a score near 0 from terms of ~10, as on a row that sees one key of a large-logit
// call) that is many units of lse. A tolerance of units of lse alone then took such a row's own
// softmax for a part of a larger one and scaled its P = 1 by exp(own - lse) = 1 ± 1e-5: dV = P·dO
// off by that on one-key rows (the fuzz's 1- and 2-key failures). The bound adds kDotUnits fp32 units
// of |scale|·|q|·max|k| (Cauchy-Schwarz over sum_d |q_d·k_d|, the row's query against the longest
// key it sees); an emulation of the forward's and this kernel's orders against each other peaked at
// 5 units of it (head dims 32-256, inputs of std 0.25-3, scales 0.01-2). A true part whose share
// of the merged softmax lies within the bound of 1 is taken as whole: an error in its P no larger
// than the one recovering P from the LSE would leave.
__device__ __forceinline__ float lse_factor(float row_max, float row_sum, float abs_scale, float lse, float q_norm,
                                            float key_norm_max) {
  constexpr double kOwnUlps = 32.0;   // fp32 epsilons of |lse|: the LSE's own formation
  constexpr double kDotUnits = 16.0;  // fp32 unit roundoffs of |scale|·|q|·max|k|: the scores'
  constexpr double kFp32Epsilon = 1.1920928955078125e-7;  // 2^-23
  constexpr double kFp32Unit = kFp32Epsilon / 2;           // 2^-24
  if (lse == tile::kNegInf) return 0.f;
  const double own = double(row_max) * abs_scale + log(double(row_sum));
  const double tolerance = kOwnUlps * kFp32Epsilon * fmax(1.0, fabs(double(lse))) +
                           kDotUnits * kFp32Unit * abs_scale * double(q_norm) * double(key_norm_max);
  if (fabs(own - double(lse)) <= tolerance) return 1.f;
  return float(exp(own - double(lse)));
}

// x = sign(scale)·(q·k) of one (query tile, key tile) pair, -inf where masked: the scores of
// score_gradients and micro_bwd_scores bit for bit (the same fp32 operands, summed over the head
// dim first to last, one FMA per element).
template <class Tiles, int HD, int BM, int BN>
__device__ __forceinline__ void stats_scores(const AttentionArgs& args, const Mask& mask,
                                             typename Tiles::SharedStorage& shared, Range rows, Range cols,
                                             tile::Grid16 g, typename Tiles::Scores& x) {
  x.fill(0.f);
  tile::thread::mma_nt<HD>(x, shared.q.tile(), shared.k.tile(), g);
  tile::thread::scale(x, score_sign(args));
  if (!(rows.size() == BM && cols.size() == BN && mask.tile_is_full(rows, cols)))
    tile::thread::mask_scores(
        x, mask, [&](int i) { return rows.begin + g.row(i); }, [&](int j) { return cols.begin + g.col(j); });
}

template <class T, int HD, int BM, int BN, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) bwd_stats_kernel(const AttentionArgs args) {
  using Tiles = StatsTiles<HD, BM, BN>;
  constexpr int kRows = BM / 16;  // query rows per thread
  constexpr int kLanes = tile::Grid16::kSide;  // lanes per query row
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const tile::Grid16 g = tile::Grid16::of_thread();
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int h = blockIdx.y;
  const int kv_head = h / args.group;
  const int64_t row0 = int64_t(blockIdx.x) * BM;
  if (row0 >= mask.seqlen_q) return;  // past a packed sequence's end
  const Range rows{row0, row0 + BM < mask.seqlen_q ? row0 + BM : mask.seqlen_q};
  const Range keys = mask.keys(rows);
  const float scale_log2 = fabsf(args.scale_log2);
  const auto key_tile = [&](int64_t col0) { return Range{col0, col0 + BN < keys.end ? col0 + BN : keys.end}; };
  const auto load_keys = [&](Range cols, bool values) {
    load_fp32_tile(shared.k.tile(), args.k.at<const T>(seq.k, cols.begin, kv_head), args.k.seq_stride,
                   int(cols.size()), args.head_dim);
    if (values)
      load_fp32_tile(shared.v.tile(), args.v.at<const T>(seq.k, cols.begin, kv_head), args.v.seq_stride,
                     int(cols.size()), args.head_dim_v);
    tile::block::commit();
    tile::block::wait<0>();
    __syncthreads();
  };

  // Pass 1: each row's max of x and sum of 2^((x - max)·|scale_log2|), online over its keys.
  float max[kRows], sum[kRows];  // running max (reduced over the row's lanes); this thread's share of the sum
  float key_norm2_max = 0.f;     // the largest |k|^2 of the keys this thread measured (a key per thread)
#pragma unroll
  for (int i = 0; i < kRows; ++i) max[i] = tile::kNegInf, sum[i] = 0.f;
  if (!keys.empty()) {
    load_fp32_tile(shared.q.tile(), args.q.at<const T>(seq.q, rows.begin, h), args.q.seq_stride, int(rows.size()),
                   args.head_dim);  // joins the first key tile's group
    for (int64_t col0 = keys.begin; col0 < keys.end; col0 += BN) {
      const Range cols = key_tile(col0);
      load_keys(cols, false);
      if (int(threadIdx.x) < cols.size())
        key_norm2_max = fmaxf(key_norm2_max, key_norm2<HD>(shared.k.tile(), int(threadIdx.x)));
      typename Tiles::Scores x;  // [BM, BN]
      stats_scores<Tiles, HD, BM, BN>(args, mask, shared, rows, cols, g, x);
      float tile_max[kRows];
      tile::warp::row_max<kLanes>(tile_max, x);
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const float new_max = fmaxf(max[i], tile_max[i]);
        const float base = new_max == tile::kNegInf ? 0.f : new_max;  // nothing visible yet: 0, not NaN
        float part = 0.f;
#pragma unroll
        for (int j = 0; j < BN / 16; ++j) part += tile::exp2_exact((x(i, j) - base) * scale_log2);
        sum[i] = sum[i] * tile::exp2_exact((max[i] - base) * scale_log2) + part;
        max[i] = new_max;
      }
      __syncthreads();  // K is overwritten by the next key tile
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) sum[i] = tile::warp::row_sum<kLanes>(sum[i]);

  // lse_factor's bound on the forward's rounding of a score: each row's |q| and the longest key's
  // |k| (over the block's keys: at least the row's). Q is still in shared memory.
  float q_norm[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    float part = 0.f;  // this lane's dims of the row: tx, tx + 16, ...
    if (!keys.empty()) {
#pragma unroll
      for (int c = 0; c < HD / kLanes; ++c) {
        const float q = shared.q.tile()(g.row(i), g.tx + kLanes * c);
        part = fmaf(q, q, part);
      }
    }
    q_norm[i] = sqrtf(tile::warp::row_sum<kLanes>(part));
  }
  key_norm2_max = tile::warp::row_max<32>(key_norm2_max);
  if (threadIdx.x % 32 == 0) shared.key_norm2[threadIdx.x / 32] = key_norm2_max;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < Tiles::kWarps; ++w) key_norm2_max = fmaxf(key_norm2_max, shared.key_norm2[w]);
  const float key_norm_max = sqrtf(key_norm2_max);

  // The rows' statistics. `own`: P is this row's own softmax (not a part of a merged one), so a
  // Δ from its own P and dP is the right one.
  bool own[kRows], peaked = false;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t row = rows.begin + g.row(i);
    own[i] = false;
    if (row >= rows.end) continue;
    const int64_t stat = args.stat_index(seq.q, h, row);
    if (!(sum[i] > 0.f)) {  // sees no key: P = 2^(x - inf)·0 = 0
      if (g.tx == 0) args.row_max[stat] = __int_as_float(0x7f800000), args.row_inv_sum[stat] = 0.f;
      continue;
    }
    const float lse = args.lse[seq.q * args.lse_batch_stride + h * args.lse_head_stride + row * args.lse_seq_stride];
    const float factor = lse_factor(max[i], sum[i], fabsf(args.scale), lse, q_norm[i], key_norm_max);
    if (g.tx == 0) args.row_max[stat] = max[i], args.row_inv_sum[stat] = factor / sum[i];
    own[i] = factor == 1.f;
    peaked = peaked || (own[i] && 1.f / sum[i] >= kOwnDeltaMinPeak);  // the largest P is 1/sum
  }

  // Pass 2, where a row is peaked: Δ = rowsum(P ∘ dP) over the same keys (kOwnDeltaMinPeak).
  if (!__syncthreads_or(peaked)) return;
  load_fp32_tile(shared.dout.tile(), args.dout.at<const T>(seq.q, rows.begin, h), args.dout.seq_stride,
                 int(rows.size()), args.head_dim_v);  // joins the first key tile's group
  float delta[kRows];  // this thread's share of rowsum(2^((x - max)·|scale_log2|) ∘ dP)
#pragma unroll
  for (int i = 0; i < kRows; ++i) delta[i] = 0.f;
  for (int64_t col0 = keys.begin; col0 < keys.end; col0 += BN) {
    const Range cols = key_tile(col0);
    load_keys(cols, true);
    typename Tiles::Scores x, dp;  // [BM, BN] each
    stats_scores<Tiles, HD, BM, BN>(args, mask, shared, rows, cols, g, x);
    dp.fill(0.f);
    tile::thread::mma_nt<HD>(dp, shared.dout.tile(), shared.v.tile(), g);  // dP = dO·V^T, as the main kernels form it
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const float base = max[i] == tile::kNegInf ? 0.f : max[i];
#pragma unroll
      for (int j = 0; j < BN / 16; ++j) delta[i] = fmaf(tile::exp2_exact((x(i, j) - base) * scale_log2), dp(i, j), delta[i]);
    }
    __syncthreads();  // K and V are overwritten by the next key tile
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    delta[i] = tile::warp::row_sum<kLanes>(delta[i]);
    const int64_t row = rows.begin + g.row(i);
    if (own[i] && g.tx == 0) args.delta[args.stat_index(seq.q, h, row)] = delta[i] / sum[i];
  }
}

template <class T, int HD, int BM, int BN, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) bwd_kernel(const AttentionArgs args) {
  using Tiles = BwdTiles<HD, BM, BN>;
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const tile::Grid16 g = tile::Grid16::of_thread();
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int kv_head = blockIdx.y;
  const int64_t col0 = int64_t(blockIdx.x) * BN;
  if (col0 >= mask.seqlen_k) return;  // past a packed sequence's end
  const Range cols{col0, col0 + BN < mask.seqlen_k ? col0 + BN : mask.seqlen_k};
  const Range rows_all = mask.queries(Range{0, mask.seqlen_q}, cols);

  typename Tiles::KeyAcc dk, dv;  // [BN, HD] fp32 each
  dk.fill(0.f);
  dv.fill(0.f);

  if (!rows_all.empty()) {
    load_key_side<T, Tiles>(args, shared, seq.k, kv_head, cols);
    for (int member = 0; member < args.group; ++member) {
      const int h = kv_head * args.group + member;
      for (int64_t row0 = rows_all.begin; row0 < rows_all.end; row0 += BM) {
        const Range rows{row0, row0 + BM < rows_all.end ? row0 + BM : rows_all.end};
        load_query_side<T, Tiles, BM>(args, shared, seq.q, h, rows);
        tile::block::wait<0>();
        __syncthreads();

        typename Tiles::Scores p, ds;  // [BM, BN] P and dS
        score_gradients<Tiles, HD, BM, BN>(args, mask, shared, rows, cols, g, p, ds);
        tile::thread::store(shared.p.tile(), p, g);
        tile::thread::store(shared.ds.tile(), ds, g);
        __syncthreads();

        tile::thread::mma_tn<BM>(dv, shared.p.tile(), shared.dout.tile(), g);  // dV += P^T·dO
        tile::thread::mma_tn<BM>(dk, shared.ds.tile(), shared.q.tile(), g);    // dK += dS^T·Q
        if (args.dq_accum != nullptr) {
          typename Tiles::QueryAcc dq;  // [BM, HD] this key tile's share of dQ (unscaled)
          dq.fill(0.f);
          tile::thread::mma_nn<BN>(dq, shared.ds.tile(), shared.k.tile(), g);
#pragma unroll
          for (int i = 0; i < BM / 16; ++i) {
            if (g.row(i) >= rows.size()) continue;
            float* accum = args.dq_accum + args.row_index(seq.q, h, rows.begin + g.row(i)) * args.head_dim;
#pragma unroll
            for (int j = 0; j < HD / 16; ++j)
              if (g.col(j) < args.head_dim) atomicAdd(accum + g.col(j), dq(i, j));
          }
        }
        __syncthreads();  // Q, dO, P, dS are overwritten by the next query tile
      }
    }
  }

#pragma unroll
  for (int i = 0; i < BN / 16; ++i) {
    const int64_t key = cols.begin + g.row(i);
    if (key >= cols.end) continue;
    T* dk_row = args.dk.at<T>(seq.k, key, kv_head);
    T* dv_row = args.dv.at<T>(seq.k, key, kv_head);
#pragma unroll
    for (int j = 0; j < HD / 16; ++j) {
      if (g.col(j) < args.head_dim) dk_row[g.col(j)] = tile::from_float<T>(dk(i, j) * args.scale);
      if (g.col(j) < args.head_dim_v) dv_row[g.col(j)] = tile::from_float<T>(dv(i, j));
    }
  }
}

template <class T, int HD, int BM, int BN, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) bwd_dq_kernel(const AttentionArgs args) {
  using Tiles = BwdTiles<HD, BM, BN>;
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const tile::Grid16 g = tile::Grid16::of_thread();
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int h = blockIdx.y;
  const int kv_head = h / args.group;
  const int64_t row0 = int64_t(blockIdx.x) * BM;
  if (row0 >= mask.seqlen_q) return;  // past a packed sequence's end
  const Range rows{row0, row0 + BM < mask.seqlen_q ? row0 + BM : mask.seqlen_q};
  const Range keys = mask.keys(rows);

  typename Tiles::QueryAcc dq;  // [BM, HD] fp32, unscaled
  dq.fill(0.f);
  if (!keys.empty()) {
    load_query_side<T, Tiles, BM>(args, shared, seq.q, h, rows);
    for (int64_t col0 = keys.begin; col0 < keys.end; col0 += BN) {
      const Range cols{col0, col0 + BN < keys.end ? col0 + BN : keys.end};
      load_key_side<T, Tiles>(args, shared, seq.k, kv_head, cols);
      tile::block::wait<0>();
      __syncthreads();
      typename Tiles::Scores p, ds;  // [BM, BN] P and dS
      score_gradients<Tiles, HD, BM, BN>(args, mask, shared, rows, cols, g, p, ds);
      tile::thread::store(shared.ds.tile(), ds, g);
      __syncthreads();
      tile::thread::mma_nn<BN>(dq, shared.ds.tile(), shared.k.tile(), g);  // dQ += dS·K
      __syncthreads();  // K, V, dS are overwritten by the next key tile
    }
  }
#pragma unroll
  for (int i = 0; i < BM / 16; ++i) {
    const int64_t row = rows.begin + g.row(i);
    if (row >= rows.end) continue;
    T* dq_row = args.dq.at<T>(seq.q, row, h);
#pragma unroll
    for (int j = 0; j < HD / 16; ++j)
      if (g.col(j) < args.head_dim) dq_row[g.col(j)] = tile::from_float<T>(dq(i, j) * args.scale);
  }
}

// One block per (key tile, KV head, batch), like bwd_kernel. The steps run over (group member,
// query tile) in one sequence, so that each step's Q/dO load is issued before the previous
// step's dQ products and overlaps them.
template <int HD, int BM, int BN, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) micro_bwd_kernel(const AttentionArgs args) {
  using Tiles = MicroBwdTiles<HD, BM, BN>;
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const int tx = int(threadIdx.x) % kMicroSide, ty = int(threadIdx.x) / kMicroSide;
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int kv_head = blockIdx.y;
  const int64_t col0 = int64_t(blockIdx.x) * BN;
  if (col0 >= mask.seqlen_k) return;  // past a packed sequence's end
  const Range cols{col0, col0 + BN < mask.seqlen_k ? col0 + BN : mask.seqlen_k};
  const Range rows_all = mask.queries(Range{0, mask.seqlen_q}, cols);

  typename Tiles::KeyAcc dk, dv;  // [BN, HD] fp32 each, MicroBwd; dK unscaled
  dk.fill(0.f);
  dv.fill(0.f);

  if (!rows_all.empty()) {
    const bool vec = bwd_vectorizable(args);
    // int: a step count above 2^31 would need more than 2^37 query rows of one KV head.
    const int row_tiles = int((rows_all.size() + BM - 1) / BM);
    const int steps = row_tiles * args.group;
    const auto head_of = [&](int t) { return kv_head * args.group + t / row_tiles; };
    const auto rows_of = [&](int t) {
      const int64_t row0 = rows_all.begin + int64_t(t % row_tiles) * BM;
      return Range{row0, row0 + BM < rows_all.end ? row0 + BM : rows_all.end};
    };
    load_micro_key_side<Tiles>(args, shared, seq.k, kv_head, cols, vec);
    load_micro_query_side<Tiles, BM>(args, shared, seq.q, head_of(0), rows_of(0), vec);
    for (int t = 0; t < steps; ++t) {
      const int h = head_of(t);
      const Range rows = rows_of(t);
      tile::block::wait<0>();
      __syncthreads();  // this step's Q, dO, LSE, Δ (and K, V) landed; last step's dQ reads of dS^T are done

      micro_bwd_scores<Tiles, HD, BM, BN>(args, mask, shared, rows, cols, tx, ty);
      __syncthreads();  // P^T and dS^T complete
      micro_bwd_key_grads<Tiles, BM>(shared, dk, dv, tx, ty);
      __syncthreads();  // Q, dO, LSE and Δ are free for the next step's loads

      if (t + 1 < steps) load_micro_query_side<Tiles, BM>(args, shared, seq.q, head_of(t + 1), rows_of(t + 1), vec);
      if (args.dq_accum != nullptr) micro_bwd_query_grads<Tiles, BN>(args, shared, seq.q, h, rows, tx, ty);
    }
  }

  // Epilogue: a thread's dims of one key are float4 groups, consecutive across the half warp.
#pragma unroll
  for (int i = 0; i < Tiles::kKeyRows; ++i) {
    const int64_t key = cols.begin + Tiles::key_row(i, ty);
    if (key >= cols.end) continue;
    float* dk_row = args.dk.at<float>(seq.k, key, kv_head);
    float* dv_row = args.dv.at<float>(seq.k, key, kv_head);
#pragma unroll
    for (int c = 0; c < Tiles::kDims; ++c) {
      const int d = Tiles::dim(c, tx);
      if (d < args.head_dim) dk_row[d] = dk(i, c) * args.scale;
      if (d < args.head_dim_v) dv_row[d] = dv(i, c);
    }
  }
}

}  // namespace fmha::cuda::simt
