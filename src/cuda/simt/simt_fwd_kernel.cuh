// The simt forward kernels (Grid16 and micro-tile): one block per (query tile, head, batch). Loads the query tile, runs
// the mainloop over the key tiles the mask lets it see, and writes O = acc / rowsum and
// LSE = ln(rowsum) + max; a row that sees no key gets O = 0 and LSE = -inf. In a packed call
// the batch index is the sequence's, and a query tile past that sequence's length exits at once.
#pragma once

#include "cuda/common/block_sequence.cuh"
#include "cuda/simt/simt_fwd_micro_mainloop.cuh"
#include "cuda/simt/simt_fwd_mainloop.cuh"

namespace fmha::cuda::simt {

template <int HD, int BM, int BN, int STAGES, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) fwd_kernel(const AttentionArgs args) {
  using Tiles = FwdTiles<HD, BM, BN, STAGES>;
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

  typename Tiles::Output acc;  // [BM, HD] fp32
  acc.fill(0.f);
  typename Tiles::Softmax softmax;
  softmax.init();

  if (!keys.empty()) {
    tile::block::load_async<1, kThreads>(shared.q.tile(), args.q.at<const float>(seq.q, row0, h), args.q.seq_stride,
                                         int(rows.size()), args.head_dim);
    tile::block::commit();
    fwd_mainloop<Tiles, HD, BM, BN, STAGES>(args, mask, shared, seq.k, kv_head, rows, keys, acc, softmax, g);
  }

  // Epilogue.
  softmax.finish();
#pragma unroll
  for (int i = 0; i < BM / 16; ++i) {
    const int64_t row = rows.begin + g.row(i);
    if (row >= rows.end) continue;
    const float inv = softmax.inv_sum(i);
    float* o = args.o.at<float>(seq.q, row, h);
#pragma unroll
    for (int j = 0; j < HD / 16; ++j)
      if (g.col(j) < args.head_dim_v) o[g.col(j)] = acc(i, j) * inv;
    if (args.lse != nullptr && g.tx == 0)
      args.lse[seq.q * args.lse_batch_stride + h * args.lse_head_stride + row * args.lse_seq_stride] = softmax.lse(i);
  }
}

// The micro-tile forward (simt_fwd_micro_mainloop.cuh): same contract as fwd_kernel.
template <int HD, int BM, int BN, int STAGES, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) micro_fwd_kernel(const AttentionArgs args) {
  using Tiles = MicroFwdTiles<HD, BM, BN, STAGES>;
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const int tx = int(threadIdx.x) % kMicroSide, ty = int(threadIdx.x) / kMicroSide;
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int h = blockIdx.y;
  const int kv_head = h / args.group;
  const int64_t row0 = int64_t(blockIdx.x) * BM;
  if (row0 >= mask.seqlen_q) return;  // past a packed sequence's end
  const Range rows{row0, row0 + BM < mask.seqlen_q ? row0 + BM : mask.seqlen_q};
  const Range keys = mask.keys(rows);

  typename Tiles::Output acc;  // [BM, HD] fp32, Micro layout
  acc.fill(0.f);
  typename Tiles::Softmax softmax;
  softmax.init();
  if (!keys.empty()) {
    load_q_transposed<Tiles, HD, BM>(args, shared.qt.tile(), seq.q, h, rows);
    micro_fwd_mainloop<Tiles, HD, BM, BN, STAGES>(args, mask, shared, seq.k, kv_head, rows, keys, acc, softmax);
  }

  // Epilogue: a thread's dims of one row are float4 groups, consecutive across the half warp.
  softmax.finish();
#pragma unroll
  for (int i = 0; i < Tiles::kRows; ++i) {
    const int64_t row = rows.begin + Tiles::row(i, ty);
    if (row >= rows.end) continue;
    const float inv = softmax.inv_sum(i);
    float* o = args.o.at<float>(seq.q, row, h);
#pragma unroll
    for (int c = 0; c < Tiles::kDims; ++c) {
      const int d = Tiles::dim(c, tx);
      if (d < args.head_dim_v) o[d] = acc(i, c) * inv;
    }
    if (args.lse != nullptr && tx == 0)
      args.lse[seq.q * args.lse_batch_stride + h * args.lse_head_stride + row * args.lse_seq_stride] = softmax.lse(i);
  }
}

}  // namespace fmha::cuda::simt
