// What a walk over a packed (varlen) sequence table must hand out, for the tests of the sm90
// packed tile cursor on the host (tests/test_varlen.cpp) and on the device (tests/gpu/tile_test.cu):
// sequence b's query tiles, as the kernels clamp its length, times the heads, numbered in
// sequence order.
#pragma once

#include <algorithm>
#include <climits>
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

// The walks both cursors are checked on (host: tests/test_varlen.cpp; device:
// tests/gpu/tile_test.cu): check(table, total_q, max_seqlen, heads, tile_m, longest_first, grid,
// dynamic) per case.
// Lengths 37, 0, 1, 130, 64, 5, 0, 300, 129 (empty sequences, one row, tiles split unevenly) at
// each tile height, order, grid and schedule; 1,000 sequences of 0 ... 8 rows; no sequence, and
// only empty ones (no work tile).
template <class Check>
void for_each_packed_walk(Check&& check) {
  const std::vector<int32_t> mixed = {0, 37, 37, 38, 168, 232, 237, 237, 537, 666};
  for (int tile_m : {128, 192})
    for (bool reverse : {false, true})
      for (int grid : {1, 7, 132})
        for (bool dynamic : {false, true}) check(mixed, 666, 300, 3, tile_m, reverse, grid, dynamic);
  std::vector<int32_t> many = {0};
  for (int b = 0; b < 1000; ++b) many.push_back(many.back() + (b * 7) % 9);
  check(many, many.back(), 8, 2, 128, true, 132, true);
  check(std::vector<int32_t>{0}, 0, 0, 2, 128, false, 4, false);
  check(std::vector<int32_t>{0, 0, 0}, 0, 0, 2, 128, false, 4, true);
}
// Tables that break the promise (decreasing, negative, past the total, INT32_MAX).
template <class Check>
void for_each_broken_packed_walk(Check&& check) {
  const std::vector<int32_t> broken = {7, 300, 10, INT32_MAX, -5, 480, 3};
  for (int64_t max_seqlen : {int64_t(16), int64_t(1000)})
    for (bool dynamic : {false, true}) check(broken, 480, max_seqlen, 2, 128, true, 5, dynamic);
}

}  // namespace fmha::test
