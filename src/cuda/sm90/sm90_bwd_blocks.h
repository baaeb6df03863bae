// The sm90 backward's blocks: which key tile, KV head and batch a grid index takes, which query
// tiles a key tile's block walks, and in the deterministic mode a block's turn at a query tile.
// Plain C++ (host and device), so that the CPU tests check the very functions the kernel runs
// (tests/test_sm90_bwd_blocks.cpp).
#pragma once

#include <cstdint>

#include "cuda/sm90/sm90_sections.h"
#include "fmha/mask.h"

namespace fmha::cuda::sm90 {

// Query rows per step: kBwdRows, or kBwdWideRows where the head dim is small (BwdConfig::rows,
// sm90_config.h). Host-side sizes that must hold for every kernel (the deterministic turn
// counters, one per query tile) count tiles of kBwdRows, the least.
inline constexpr int kBwdRows = 64;
inline constexpr int kBwdWideRows = 128;

// One block of the main kernel: its key tile, KV head and batch (packed calls: sequence).
struct BwdBlock {
  int key_tile = 0, kv_head = 0, batch = 0;
};

// Which block a grid index takes. Blocks start in index order, so the order decides which blocks
// run together. The (batch, KV head) pairs are taken in sections of `section` pairs; inside a
// section the pairs vary fastest, then the key tiles (section 1: every key tile of one pair, then
// the next pair's). The deterministic kernel walks the key tiles from the last (DESCENDING): its
// dQ adds go in descending key-tile order, so a block only ever waits for blocks that started
// before it, and under causal or window masks a later key tile, whose first query tile comes
// later, is never behind the earlier tiles that wait for it. Its sections span as many pairs as
// keep their Q, dO and dQ rows in a share of the L2, so that the blocks of one pair start a
// section apart instead of together (together, they would reach each query tile at once and
// take their turns one after another).
//
// Ascending turns (`ascending`, FMHA_SM90_BWD_TURNS=ascending; docs/PERF.md, the tail model):
// the mirror image. dQ is added in ascending key-tile order, the key tiles launch from the first
// (under causal masks the longest blocks first, as the default kernel's grid starts them, so no
// long block is left to run alone at the end), and each block walks its query tiles from the last
// (bwd_walk_tile), so that blocks started together reach each query tile together and queue
// there by at most an addition each, instead of each waiting for the first key tile's block to
// walk up to its diagonal. A block still waits only for blocks that started before it.
struct BwdBlockOrder {
  int key_tiles = 0;  // blocks per pair
  int kv_heads = 1;
  int pairs = 0;    // batch · kv_heads
  int section = 1;  // pairs per section, 1 to pairs
  int ascending = 0;  // deterministic turn order: 0 descending key tiles, 1 ascending

  FMHA_HOST_DEVICE int64_t blocks() const { return int64_t(key_tiles) * pairs; }
  // The deterministic kernel's block at grid index `index`, in its turn order's launch order.
  FMHA_HOST_DEVICE BwdBlock get(int index) const { return ascending ? get<false>(index) : get<true>(index); }
  template <bool DESCENDING>
  FMHA_HOST_DEVICE BwdBlock get(int index) const {
    const SectionedIndex at = sectioned_index(index, key_tiles, pairs, section);  // blocks() <= INT32_MAX
    BwdBlock b;
    b.key_tile = DESCENDING ? key_tiles - 1 - at.item : at.item;
    b.batch = at.unit / kv_heads;
    b.kv_head = at.unit - b.batch * kv_heads;
    return b;
  }
};

// The lengths are the mask's (mask.seqlen_q, mask.seqlen_k): the call's for dense calls, the
// block's sequence's for packed ones.
// Key tile n's KEYS keys (block n's), clamped to seqlen_k (empty past it: a packed call's blocks
// past their sequence's keys).
template <int KEYS>
FMHA_HOST_DEVICE Range bwd_key_tile(const Mask& mask, int n) {
  const int64_t begin = int64_t(n) * KEYS;
  return {begin, begin + KEYS < mask.seqlen_k ? begin + KEYS : mask.seqlen_k};
}

// Query tiles of ROWS rows [begin, end) whose rows see any of `keys` (the same for every head).
template <int ROWS>
FMHA_HOST_DEVICE Range bwd_query_tiles(const Mask& mask, Range keys) {
  const Range rows = mask.queries(Range{0, mask.seqlen_q}, keys);
  if (rows.empty()) return {0, 0};
  return {rows.begin / ROWS, (rows.end + ROWS - 1) / ROWS};
}

// Deterministic: block n's turn at query tile m (of ROWS rows), for a block that adds into it: how many key
// tiles after n add into m (they add first: descending key-tile order, BwdBlockOrder). The key
// tiles that see a query tile form one run (every mask row sees one interval of keys, and the
// intervals move forward with the row), so over [n, tiles) "tile m is among its query tiles" is
// true, then false: a binary search with the very test the blocks use finds the run's end.
// Ascending turns: how many key tiles before n add into m, found as the run's start.
template <int KEYS, int ROWS>
FMHA_HOST_DEVICE int bwd_turn(const Mask& mask, int m, int n, bool ascending = false) {
  auto adds = [&](int tile) {
    const Range t = bwd_query_tiles<ROWS>(mask, bwd_key_tile<KEYS>(mask, tile));
    return t.begin <= m && m < t.end;
  };
  if (ascending) {
    int lo = 0, hi = n;  // the first key tile adding into m is in [lo, hi]
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (adds(mid)) hi = mid;
      else lo = mid + 1;
    }
    return n - lo;
  }
  int lo = n, hi = int((mask.seqlen_k + KEYS - 1) / KEYS) - 1;  // the last key tile adding into m is in [lo, hi]
  while (lo < hi) {
    const int mid = hi - (hi - lo) / 2;
    if (adds(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo - n;
}

// The query tile of step i of a block's walk over `tiles`: from the first, or from the last
// (the deterministic kernel under ascending turns).
FMHA_HOST_DEVICE int bwd_walk_tile(Range tiles, int i, bool from_last) {
  return int(from_last ? tiles.end - 1 - i : tiles.begin + i);
}

}  // namespace fmha::cuda::sm90
