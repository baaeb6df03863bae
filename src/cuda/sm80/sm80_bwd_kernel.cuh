// The sm80 backward kernels (tensor cores), between the shared preprocess and convert kernels of
// cuda/common/bwd_common.cuh:
//   bwd_kernel:    one block per (key tile, KV head, batch), WARPS warps of 16 keys each. Loads K and V once, loops over the
//                  group's query heads and the query tiles that see the key tile, accumulates dK
//                  and dV in registers (GQA sums included, no atomics) and writes them once; adds
//                  dS·K into the fp32 dQ accumulator with atomics unless dq_accum is null.
//   bwd_dq_kernel: deterministic mode's dQ: one block per (query tile, head, batch) over the key
//                  tiles it sees; one writer per dQ element, so results are bitwise reproducible.
// In a packed call the batch index is the sequence's (args.h sequence()), and a key tile
// (query tile, for bwd_dq_kernel) past that sequence's length exits at once.
#pragma once

#include "cuda/common/block_sequence.cuh"
#include "cuda/sm80/sm80_bwd_mainloop.cuh"

namespace fmha::cuda::sm80 {

template <class T, int HD, int BM, int BN, int STAGES, int HEAD_SPLITS, int WARPS, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) bwd_kernel(const AttentionArgs args) {
  using Tiles = BwdTiles<T, HD, BM, BN, STAGES, HEAD_SPLITS, WARPS>;
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int kv_head = blockIdx.y;
  const int64_t col0 = int64_t(blockIdx.x) * BN;
  if (col0 >= mask.seqlen_k) return;  // past a packed sequence's end
  const Range cols{col0, col0 + BN < mask.seqlen_k ? col0 + BN : mask.seqlen_k};
  const Range rows_all = mask.queries(Range{0, mask.seqlen_q}, cols);

  typename Tiles::KeyAcc dk, dv;  // [16 keys, HD / HEAD_SPLITS] per warp, fp32
  dk.fill(0.f);
  dv.fill(0.f);
  if (!rows_all.empty()) {
    const int valid = int(cols.size());
    tile::block::load_async<Tiles::kVec, Tiles::kThreads>(
        shared.k.tile(), args.k.at<const T>(seq.k, cols.begin, kv_head), args.k.seq_stride, valid, args.head_dim);
    tile::block::load_async<Tiles::kVec, Tiles::kThreads>(
        shared.v.tile(), args.v.at<const T>(seq.k, cols.begin, kv_head), args.v.seq_stride, valid, args.head_dim_v);
    tile::block::commit();
    bwd_mainloop<T, Tiles, HD, BM, BN, STAGES, HEAD_SPLITS>(args, mask, shared, seq.q, kv_head, cols, rows_all, dk, dv);
  }

  // Epilogue: each lane stores column pairs of keys g and g + 8 of its warp; keys no query sees
  // store the zeros they were initialised with.
  const int warp = int(threadIdx.x) / 32;
  const int g = lane_id() / 4, t = lane_id() % 4;
  const int key_row0 = (warp / HEAD_SPLITS) * kRowsPerWarp;
  const int head_col0 = (warp % HEAD_SPLITS) * Tiles::kHeadCols;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t key = cols.begin + key_row0 + g + 8 * i;
    if (key >= cols.end) continue;
    T* dk_row = args.dk.at<T>(seq.k, key, kv_head);
    T* dv_row = args.dv.at<T>(seq.k, key, kv_head);
#pragma unroll
    for (int j = 0; j < Tiles::KeyAcc::kCols; ++j) {
      const int d = head_col0 + Tiles::KeyAcc::col(j, t);
      if (d < args.head_dim) dk_row[d] = tile::from_float<T>(dk(i, j) * args.scale);
      if (d < args.head_dim_v) dv_row[d] = tile::from_float<T>(dv(i, j));
    }
  }
}

template <class T, int HD, int BN, int STAGES, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) bwd_dq_kernel(const AttentionArgs args) {
  using Tiles = DqTiles<T, HD, BN, STAGES>;
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int h = blockIdx.y;
  const int kv_head = h / args.group;
  const int64_t row0 = int64_t(blockIdx.x) * Tiles::kRows;
  if (row0 >= mask.seqlen_q) return;  // past a packed sequence's end
  const Range rows{row0, row0 + Tiles::kRows < mask.seqlen_q ? row0 + Tiles::kRows : mask.seqlen_q};
  const Range keys = mask.keys(rows);

  typename Tiles::Output dq;  // [16, HD] per warp, fp32, unscaled
  dq.fill(0.f);
  if (!keys.empty()) {
    const int valid = int(rows.size());
    tile::block::load_async<Tiles::kVec, kThreads>(shared.q.tile(), args.q.at<const T>(seq.q, rows.begin, h),
                                                   args.q.seq_stride, valid, args.head_dim);
    tile::block::load_async<Tiles::kVec, kThreads>(shared.dout.tile(), args.dout.at<const T>(seq.q, rows.begin, h),
                                                   args.dout.seq_stride, valid, args.head_dim_v);
    tile::block::commit();
    const int64_t stat0 = args.stat_index(seq.q, h, rows.begin);
    tile::block::load_vector<Tiles::kRows, kThreads>(shared.lse_log2, args.lse_log2 + stat0, valid, kPosInf);
    tile::block::load_vector<Tiles::kRows, kThreads>(shared.delta, args.delta + stat0, valid, 0.f);
    dq_mainloop<T, Tiles, HD, BN, STAGES>(args, mask, shared, seq.k, kv_head, rows, keys, dq);
  }

  const int warp = int(threadIdx.x) / 32;
  const int g = lane_id() / 4, t = lane_id() % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t row = rows.begin + warp * kRowsPerWarp + g + 8 * i;
    if (row >= rows.end) continue;
    T* dq_row = args.dq.at<T>(seq.q, row, h);
#pragma unroll
    for (int j = 0; j < Tiles::Output::kCols; ++j) {
      const int d = Tiles::Output::col(j, t);
      if (d < args.head_dim) dq_row[d] = tile::from_float<T>(dq(i, j) * args.scale);
    }
  }
}

}  // namespace fmha::cuda::sm80
