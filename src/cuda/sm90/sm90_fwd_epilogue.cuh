// The sm90 forward's epilogue, per consumer warpgroup: O = acc / rowsum in the storage type,
// written with stmatrix into the warpgroup's rows of the staging buffer (in the swizzled layout
// the O tensor map expects), then one thread stores them with TMA (rows past seqlen_q and columns
// past head_dim_v are dropped by the copy engine). With a staging buffer of its own, the store
// runs on while the next work tile starts, and the next epilogue first waits until it has read
// the buffer; staged over Q, the query tile is released once the store has read it. LSE goes
// straight from registers. A row that sees no key gets O = 0, LSE = -inf.
#pragma once

#include "cuda/sm90/sm90_fwd_mainloop.cuh"
#include "cuda/sm90/sm90_fwd_params.h"

namespace fmha::cuda::sm90 {

template <class Mainloop>
struct FwdEpilogue {
  using T = typename Mainloop::Element;
  using Shared = typename Mainloop::Shared;
  using Tiles = typename Mainloop::Tiles;

  __device__ static void run(const FwdParams& params, Shared& shared, int warpgroup, int thread, WorkTile work,
                             Range rows, typename Tiles::Output& o, typename Tiles::Softmax& softmax) {
    const AttentionArgs& args = params.args;
    const int barrier = int(NamedBarrier::epilogue_first) + warpgroup;
    softmax.finish();
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
      const int chunks = (args.head_dim_v + kChunkCols - 1) / kChunkCols;
      for (int c = 0; c < chunks; ++c)
        tile::tma::store(&params.o, c * kChunkCols, int(rows.begin), work.head, work.batch,
                         staging + c * Shared::kQChunkBytes);
      tile::tma::store_commit();
      if constexpr (!Mainloop::kSeparateO) {
        tile::tma::store_wait_read();
        shared.q_empty.arrive();
      }
    }
    if (args.lse != nullptr && thread % 4 == 0) {
#pragma unroll
      for (int i = 0; i < Tiles::Output::kRows; ++i) {
        const int64_t row = rows.begin + Tiles::Output::row(i, thread);
        if (row < args.seqlen_q)
          args.lse[work.batch * args.lse_batch_stride + work.head * args.lse_head_stride + row * args.lse_seq_stride] =
              softmax.lse(i);
      }
    }
  }
};

}  // namespace fmha::cuda::sm90
