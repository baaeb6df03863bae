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
struct BwdBlockOrder {
  int key_tiles = 0;  // blocks per pair
  int kv_heads = 1;
  int pairs = 0;    // batch · kv_heads
  int section = 1;  // pairs per section, 1 to pairs

  FMHA_HOST_DEVICE int64_t blocks() const { return int64_t(key_tiles) * pairs; }
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
template <int KEYS, int ROWS>
FMHA_HOST_DEVICE int bwd_turn(const Mask& mask, int m, int n) {
  int lo = n, hi = int((mask.seqlen_k + KEYS - 1) / KEYS) - 1;  // the last key tile adding into m is in [lo, hi]
  while (lo < hi) {
    const int mid = hi - (hi - lo) / 2;
    const Range t = bwd_query_tiles<ROWS>(mask, bwd_key_tile<KEYS>(mask, mid));
    if (t.begin <= m && m < t.end) lo = mid;
    else hi = mid - 1;
  }
  return lo - n;
}

}  // namespace fmha::cuda::sm90
