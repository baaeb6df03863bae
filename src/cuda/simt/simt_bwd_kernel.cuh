// The simt backward kernels: exact fp32 arithmetic from fp32, fp16 or bf16 storage (T).
//   bwd_stats_kernel: one block per (query tile, head, batch), before the others. Each row's
//                  softmax max and sum, online over the keys it sees, from the scores the other
//                  kernels form again bit for bit (cuda/common/own_softmax.cuh says why P is not
//                  recovered from the given LSE). Costs one S = Q·K^T product (of the five the
//                  backward forms), one exp2 per score and the key and query norms of lse_factor's
//                  bound; query tiles with a peaked row also form Δ = rowsum(P ∘ dP)
//                  (kOwnDeltaMinPeak), two products more.
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
      for (int i = 0; i < kRows; ++i)
        own_softmax_step(max[i], sum[i], tile_max[i], scale_log2, [&](float base) {
          float part = 0.f;
#pragma unroll
          for (int j = 0; j < BN / 16; ++j) part += tile::exp2_exact((x(i, j) - base) * scale_log2);
          return part;
        });
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
    own[i] = store_own_row_stats(args, args.stat_index(seq.q, h, row), max[i], sum[i], q_norm[i], key_norm_max,
                                 g.tx == 0, [&] { return given_lse(args, seq.q, h, row); });
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
