// What a walk over a packed (varlen) sequence table must hand out, for the tests of the sm90
// packed tile cursor on the host (tests/test_varlen.cpp) and on the device (tests/gpu/tile_test.cu):
// sequence b's query tiles, as the kernels clamp its length, times the heads, numbered in
// sequence order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/common/args.h"

namespace fmha::test {

struct PackedWalkPlan {
  cuda::AttentionArgs args;  // the call's packed view of `table` (host pointers)
  std::vector<int> first;    // first[b]: index of sequence b's first work tile
  std::vector<int> blocks;   // blocks[b]: sequence b's query tiles
  int tiles = 0;             // work tiles in all
};

// table: cu_seqlens_q as given (broken ones included); lengths are read as the kernels read them.
inline PackedWalkPlan plan_packed_walk(const std::vector<int32_t>& table, int64_t total_q, int64_t max_seqlen,
                                       int heads, int tile_m) {
  PackedWalkPlan p;
  cuda::AttentionArgs& args = p.args;
  args.batch = int(table.size()) - 1;
  args.heads = heads;
  args.seqlen_q = std::min(max_seqlen, total_q);
  args.packed.total_q = args.packed.total_k = total_q;
  args.packed.cu_seqlens_q = args.packed.cu_seqlens_k = table.data();
  p.first.resize(size_t(args.batch));
  p.blocks.resize(size_t(args.batch));
  for (int b = 0; b < args.batch; ++b) {
    p.first[size_t(b)] = p.tiles;
    p.blocks[size_t(b)] = int((args.sequence(b).mask.seqlen_q + tile_m - 1) / tile_m);
    p.tiles += p.blocks[size_t(b)] * heads;
  }
  return p;
}

}  // namespace fmha::test
