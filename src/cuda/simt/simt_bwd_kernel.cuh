// The simt backward kernels: exact fp32 arithmetic from fp32, fp16 or bf16 storage (T).
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
