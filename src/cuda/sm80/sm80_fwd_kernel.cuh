// The sm80 forward kernel: one block of WARPS warps per (query tile, head, batch), each warp
// owning 16 · WARP_BLOCKS query rows. Loads the query tile, runs the mainloop over the key tiles
// the mask lets it see, and writes O = acc / rowsum and LSE = ln(rowsum) + max (O = 0,
// LSE = -inf for a row that sees no key). In a packed call the batch index is the sequence's
// (args.h sequence()), and a query tile past that sequence's length exits at once.
#pragma once

#include "cuda/common/block_sequence.cuh"
#include "cuda/sm80/sm80_fwd_mainloop.cuh"

namespace fmha::cuda::sm80 {

template <class T, int HD, int WARPS, int WARP_BLOCKS, int BN, int STAGES, int MIN_BLOCKS, bool kPacked>
__global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) fwd_kernel(const AttentionArgs args) {
  constexpr int kBlockThreads = WARPS * 32;
  constexpr int BM = WARPS * kMmaRows * WARP_BLOCKS;
  using Tiles = FwdTiles<T, HD, BM, BN, STAGES, WARP_BLOCKS>;
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);
  const BlockSequence<kPacked> block(args);
  const SequenceStart seq = block.start();
  const Mask& mask = block.mask();  // the block's sequence: its lengths and its mask
  const int h = blockIdx.y;
  const int kv_head = h / args.group;
  const int64_t row0 = int64_t(blockIdx.x) * BM;
  if (row0 >= mask.seqlen_q) return;  // past a packed sequence's end
  const Range rows{row0, row0 + BM < mask.seqlen_q ? row0 + BM : mask.seqlen_q};
  const Range keys = mask.keys(rows);

  typename Tiles::Output acc;  // [16·WARP_BLOCKS, HD] fp32 per warp
  acc.fill(0.f);
  typename Tiles::Softmax softmax;
  softmax.init();
  if (!keys.empty()) {
    tile::block::load_async<Tiles::kVec, kBlockThreads>(shared.q.tile(), args.q.at<const T>(seq.q, row0, h),
                                                        args.q.seq_stride, int(rows.size()), args.head_dim);
    tile::block::commit();
    fwd_mainloop<T, Tiles, HD, BM, BN, STAGES, kBlockThreads>(args, mask, shared, seq.k, kv_head, rows, keys, acc,
                                                              softmax);
  }

  // Epilogue: each lane stores column pairs of rows g and g + 8 of each of its warp's row blocks.
  softmax.finish();
  const int warp = int(threadIdx.x) / 32;
  const int g = lane_id() / 4, t = lane_id() % 4;
#pragma unroll
  for (int i = 0; i < Tiles::Output::kRows; ++i) {
    const int64_t row = rows.begin + warp * Tiles::kWarpRows + Tiles::Output::row(i, g);
    if (row >= rows.end) continue;
    const float inv = softmax.inv_sum(i);
    T* o = args.o.at<T>(seq.q, row, h);
#pragma unroll
    for (int j = 0; j < Tiles::Output::kCols; ++j) {
      const int d = Tiles::Output::col(j, t);
      if (d < args.head_dim_v) o[d] = tile::from_float<T>(acc(i, j) * inv);
    }
    if (args.lse != nullptr && t == 0)
      args.lse[seq.q * args.lse_batch_stride + h * args.lse_head_stride + row * args.lse_seq_stride] = softmax.lse(i);
  }
}

}  // namespace fmha::cuda::sm80
