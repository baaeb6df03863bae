// The sm90 forward's epilogue, per consumer warpgroup: O = acc / rowsum in the storage type,
// written with stmatrix into the warpgroup's rows of the staging buffer (in the swizzled layout
// the O tensor map expects), then one thread stores them with TMA (rows past seqlen_q and columns
// past head_dim_v are dropped by the copy engine). With a staging buffer of its own, the store
// runs on while the next work tile starts, and the next epilogue first waits until it has read
// the buffer; staged over Q, the query tile is released once the store has read it. LSE goes
// straight from registers. A row that sees no key gets O = 0, LSE = -inf.
//
// Packed calls: the TMA store's box of 64 rows would run into the next sequence where a
// sequence ends inside it, so those rows (the sequence's last, partial, 64) are stored from
// registers by plain stores bounded by the sequence's length; full boxes still go by TMA, at the
// row where the sequence starts in the packed [1, total, H, Dv] map.
#pragma once

#include "cuda/sm90/sm90_fwd_mainloop.cuh"
#include "cuda/sm90/sm90_fwd_params.h"

namespace fmha::cuda::sm90 {

template <class Mainloop>
struct FwdEpilogue {
  using T = typename Mainloop::Element;
  using Shared = typename Mainloop::Shared;
  using Tiles = typename Mainloop::Tiles;

  // rows: the warpgroup's rows that are stored (counted from the sequence's first; dense calls
  // clamp them to seqlen_q, packed ones to the sequence's length), start: the sequence's first row
  // (dense: the batch index).
  template <bool PACKED>
  __device__ static void run(const FwdParams& params, Shared& shared, int warpgroup, int thread, WorkTile work,
                             SequenceStart start, Range rows, typename Tiles::Output& o,
                             typename Tiles::Softmax& softmax) {
    const AttentionArgs& args = params.args;
    const int barrier = int(NamedBarrier::epilogue_first) + warpgroup;
    softmax.finish();
    if (PACKED && rows.size() < kConsumerRows) {
      store_bounded(args, work, start, rows, o, softmax, thread);
      if constexpr (!Mainloop::kSeparateO) {  // the query tile is free once every warp is past its wgmma
        tile::named_sync(barrier, wg::kThreads);
        if (thread == 0) shared.q_empty[0].arrive();
      }
      store_lse(args, work, start, rows, softmax, thread);
      return;
    }
    // Before the staging rows are overwritten: the previous work tile's store has read them (its
    // issuing thread waits), and every warp is past its last wgmma on Q rows that O overwrites.
    if (Mainloop::kSeparateO && thread == 0) tile::tma::store_wait_read();
    tile::named_sync(barrier, wg::kThreads);
    char* staging = reinterpret_cast<char*>(shared.output()) + warpgroup * kConsumerRows * wg::kSwizzleBytes;
    const float inv_sum[Tiles::Output::kRows] = {softmax.inv_sum(0), softmax.inv_sum(1)};
    wg::store_swizzled<T>(o, inv_sum, static_cast<uint32_t>(__cvta_generic_to_shared(staging)), Shared::kQChunkBytes,
                          thread);
    tile::fence_async_shared();
    tile::named_sync(barrier, wg::kThreads);
    if (thread == 0) {
      const int chunks = (args.head_dim_v + Shared::kChunkCols - 1) / Shared::kChunkCols;
      // Dense: (row, head, batch) of [B, Sq, H, Dv]; packed: (first row + row, head, 0) of the
      // packed tensor as [1, total_q, H, Dv].
      const int row = int(PACKED ? start.q + rows.begin : rows.begin);
      const int batch = PACKED ? 0 : work.batch;
      for (int c = 0; c < chunks; ++c)
        tile::tma::store(&params.o, c * Shared::kChunkCols, row, work.head, batch, staging + c * Shared::kQChunkBytes);
      tile::tma::store_commit();
      if constexpr (!Mainloop::kSeparateO) {
        tile::tma::store_wait_read();
        shared.q_empty[0].arrive();
      }
    }
    store_lse(args, work, start, rows, softmax, thread);
  }

  // LSE of the rows before rows.end, from the thread that holds each row's first columns.
  __device__ __forceinline__ static void store_lse(const AttentionArgs& args, WorkTile work, SequenceStart start,
                                                   Range rows, typename Tiles::Softmax& softmax, int thread) {
    if (args.lse != nullptr && thread % 4 == 0) {
#pragma unroll
      for (int i = 0; i < Tiles::Output::kRows; ++i) {
        const int64_t row = rows.begin + Tiles::Output::row(i, thread);
        if (row < rows.end)
          args.lse[start.q * args.lse_batch_stride + work.head * args.lse_head_stride + row * args.lse_seq_stride] =
              softmax.lse(i);
      }
    }
  }

  // O = acc / rowsum of the rows before rows.end (and the columns before head_dim_v), by plain
  // stores from the accumulator's registers: no byte past the sequence's last row is written.
  __device__ static void store_bounded(const AttentionArgs& args, WorkTile work, SequenceStart start, Range rows,
                                       const typename Tiles::Output& o, typename Tiles::Softmax& softmax,
                                       int thread) {
    using O = typename Tiles::Output;
#pragma unroll
    for (int i = 0; i < O::kRows; ++i) {
      const int64_t row = rows.begin + O::row(i, thread);
      if (row >= rows.end) continue;
      const float inv_sum = softmax.inv_sum(i);
      T* out = args.o.at<T>(start.q, row, work.head);
#pragma unroll
      for (int j = 0; j < O::kCols; ++j) {
        const int col = O::col(j, thread);
        if (col < args.head_dim_v) out[col] = tile::from_float<T>(o(i, j) * inv_sum);
      }
    }
  }
};

}  // namespace fmha::cuda::sm90
