// The sm90 forward's persistent tile scheduler: a grid of at most one block per SM walks the
// (query tile, head, batch) work items with a static stride. Heads are grouped into L2 sections
// (as many heads as keep their K and V within a share of the L2): inside a section the heads
// vary fastest, so the blocks in flight read the same K/V; the query heads of one GQA group are
// adjacent. Under causal masks query tiles run from the last (the most keys) to the first, so
// the longest work items start first and the short ones fill the tail. With `tiles_fastest` (the
// dispatch's default for calls that walk their tiles in order) each head's query tiles are
// adjacent in the walk instead, so a dynamic schedule starts them within a few blocks' finishing
// times of each other rather than spread over a wave's (docs/perf/sm90_forward_order_l2_model.py).
// Packed calls walk their sequences with PackedTileCursor (sm90_packed_tiles.h) instead.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/sm90_packed_tiles.h"
#include "cuda/sm90/sm90_sections.h"

namespace fmha::cuda::sm90 {

struct TileScheduler {
  int m_blocks = 0;     // query tiles per head
  int heads = 0;
  int batch_heads = 0;  // batch · heads
  int section = 1;      // (batch, head) pairs per L2 section
  int total = 0;        // m_blocks · batch_heads
  bool longest_first = false;
  bool tiles_fastest = false;  // a head's query tiles adjacent (not with longest_first)

  __host__ __device__ __forceinline__ WorkTile get(int tile) const {
    SectionedIndex at;
    if (tiles_fastest) {
      const int unit = tile / m_blocks;  // m_blocks > 0 wherever a tile exists
      at = {tile - unit * m_blocks, unit};
    } else {
      at = sectioned_index(tile, m_blocks, batch_heads, section);
    }
    WorkTile w;
    w.m_block = longest_first ? m_blocks - 1 - at.item : at.item;
    w.batch = at.unit / heads;
    w.head = at.unit - w.batch * heads;
    return w;
  }
};

}  // namespace fmha::cuda::sm90
