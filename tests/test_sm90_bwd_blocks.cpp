// The sm90 backward's block order and deterministic turns (src/cuda/sm90/sm90_bwd_blocks.h), on
// the host: the functions the kernel runs, checked over masks and shapes without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/sm90/sm90_bwd_blocks.h"

namespace fmha::cuda::sm90 {
namespace {

// Every grid index names one (key tile, KV head, batch) and every block is named once; inside a
// pair the key tiles start from the last (DESCENDING) or the first; inside a section the pairs
// vary fastest.
template <bool DESCENDING>
void check_order(int key_tiles, int kv_heads, int batch, int section) {
  BwdBlockOrder order;
  order.key_tiles = key_tiles, order.kv_heads = kv_heads, order.pairs = batch * kv_heads, order.section = section;
  const std::string what = "key_tiles " + std::to_string(key_tiles) + " kv_heads " + std::to_string(kv_heads) +
                           " batch " + std::to_string(batch) + " section " + std::to_string(section);
  ASSERT_EQ(order.blocks(), int64_t(key_tiles) * batch * kv_heads) << what;
  std::vector<int> seen(size_t(order.blocks()), -1);
  std::vector<int> last_tile(size_t(order.pairs), -1);  // per pair, the key tile of its latest block
  for (int i = 0; i < int(order.blocks()); ++i) {
    const BwdBlock b = order.get<DESCENDING>(i);
    ASSERT_TRUE(b.key_tile >= 0 && b.key_tile < key_tiles && b.kv_head >= 0 && b.kv_head < kv_heads && b.batch >= 0 &&
                b.batch < batch)
        << what << " index " << i;
    const int pair = b.batch * kv_heads + b.kv_head;
    const size_t id = size_t(pair) * size_t(key_tiles) + size_t(b.key_tile);
    ASSERT_EQ(seen[id], -1) << what << ": index " << i << " repeats index " << seen[id] << "'s block";
    seen[id] = i;
    // A pair's key tiles in order, one after another.
    const int expected = last_tile[size_t(pair)] < 0 ? (DESCENDING ? key_tiles - 1 : 0)
                                                     : last_tile[size_t(pair)] + (DESCENDING ? -1 : 1);
    ASSERT_EQ(b.key_tile, expected) << what << " index " << i;
    last_tile[size_t(pair)] = b.key_tile;
    // Pairs vary fastest inside a section: the next index is the next pair of the section (or
    // the section's first pair again, one key tile on).
    if (i + 1 < int(order.blocks())) {
      const BwdBlock n = order.get<DESCENDING>(i + 1);
      const int next_pair = n.batch * kv_heads + n.kv_head;
      const int first = pair / section * section, width = std::min(section, order.pairs - first);
      if (b.key_tile != (DESCENDING ? 0 : key_tiles - 1) || pair + 1 < first + width)
        EXPECT_EQ(next_pair, pair + 1 < first + width ? pair + 1 : first) << what << " index " << i;
      else
        EXPECT_EQ(next_pair, first + width) << what << " index " << i << ": the next section";
    }
  }
}

TEST(Sm90BackwardBlocks, OrderNamesEveryBlockOnce) {
  for (int key_tiles : {1, 2, 5, 16})
    for (int kv_heads : {1, 3, 8})
      for (int batch : {1, 2, 7}) {
        const int pairs = kv_heads * batch;
        for (int section : {1, 2, 5, pairs}) {
          if (section > pairs) continue;
          check_order<true>(key_tiles, kv_heads, batch, section);
          check_order<false>(key_tiles, kv_heads, batch, section);
        }
      }
}

struct MaskCase {
  Causal causal;
  int64_t window_left, window_right, q_offset, seqlen_q, seqlen_k;
};

std::vector<MaskCase> mask_cases() {
  std::vector<MaskCase> cases;
  const std::pair<int64_t, int64_t> lengths[] = {{1, 1}, {1, 300}, {150, 400}, {400, 150}, {1000, 1000},
                                                 {777, 1300}, {1300, 777}, {64, 64}, {65, 129}};
  for (const auto& [sq, sk] : lengths) {
    for (Causal c : {Causal::none, Causal::top_left, Causal::bottom_right}) cases.push_back({c, -1, -1, 0, sq, sk});
    cases.push_back({Causal::bottom_right, 100, -1, 0, sq, sk});  // causal sliding window
    cases.push_back({Causal::none, 64, 64, 0, sq, sk});            // local window
    cases.push_back({Causal::none, 0, 0, 0, sq, sk});              // one key a row
    cases.push_back({Causal::top_left, -1, -1, 200, sq, sk});      // query offset
    cases.push_back({Causal::none, 10, 300, -250, sq, sk});        // offset window, rows that see nothing
  }
  return cases;
}

std::string describe(const MaskCase& mc) {
  return "causal " + std::to_string(int(mc.causal)) + " window (" + std::to_string(mc.window_left) + ", " +
         std::to_string(mc.window_right) + ") q_offset " + std::to_string(mc.q_offset) + " seqlen_q " +
         std::to_string(mc.seqlen_q) + " seqlen_k " + std::to_string(mc.seqlen_k);
}

// For each query tile m, the key tiles that add into it take turns 0, 1, ... from the last key
// tile down, and each turn's holder is a block that starts before the next turn's holder in the
// deterministic kernel's order (so a block waits only for blocks already started: no deadlock
// however few blocks run at once).
template <int KEYS, int ROWS>
void check_turns(const MaskCase& mc) {
  const Mask mask = Mask::make(mc.causal, mc.window_left, mc.window_right, mc.q_offset, mc.seqlen_q, mc.seqlen_k);
  const std::string what = describe(mc) +
                           " keys " + std::to_string(KEYS) + " rows " + std::to_string(ROWS);
  const int key_tiles = int((mc.seqlen_k + KEYS - 1) / KEYS);
  const int query_tiles = int((mc.seqlen_q + ROWS - 1) / ROWS);
  BwdBlockOrder order;
  order.key_tiles = key_tiles, order.kv_heads = 2, order.pairs = 6, order.section = 4;  // a partial last section
  std::map<std::pair<int, int>, int> index;  // (pair, key tile) -> grid index
  for (int i = 0; i < int(order.blocks()); ++i) {
    const BwdBlock b = order.get<true>(i);
    index[{b.batch * order.kv_heads + b.kv_head, b.key_tile}] = i;
  }
  for (int m = 0; m < query_tiles; ++m) {
    std::vector<int> adders;  // key tiles whose blocks add into m, descending
    for (int n = key_tiles - 1; n >= 0; --n) {
      const Range t = bwd_query_tiles<ROWS>(mask, bwd_key_tile<KEYS>(mask, n));
      if (t.begin <= m && m < t.end) adders.push_back(n);
    }
    // The rows of tile m see keys in one run of key tiles.
    for (size_t i = 1; i < adders.size(); ++i) ASSERT_EQ(adders[i], adders[i - 1] - 1) << what << " tile " << m;
    // They cover exactly the keys the tile's rows see.
    const Range rows{int64_t(m) * ROWS, std::min<int64_t>((int64_t(m) + 1) * ROWS, mc.seqlen_q)};
    const Range seen = mask.keys(rows);
    if (seen.empty()) {
      EXPECT_TRUE(adders.empty()) << what << " tile " << m;
      continue;
    }
    ASSERT_FALSE(adders.empty()) << what << " tile " << m;
    EXPECT_EQ(int64_t(adders.back()), seen.begin / KEYS) << what << " tile " << m;
    EXPECT_EQ(int64_t(adders.front()), (seen.end - 1) / KEYS) << what << " tile " << m;
    for (size_t turn = 0; turn < adders.size(); ++turn) {
      EXPECT_EQ((bwd_turn<KEYS, ROWS>(mask, m, adders[turn])), int(turn))
          << what << " tile " << m << " key tile " << adders[turn];
      if (turn > 0)
        for (int pair = 0; pair < order.pairs; ++pair)
          EXPECT_LT(index[std::make_pair(pair, adders[turn - 1])], index[std::make_pair(pair, adders[turn])])
              << what << " tile " << m << ": turn " << turn << " waits for a block that starts later";
    }
  }
}

TEST(Sm90BackwardBlocks, TurnsRunFromTheLastKeyTileAndWaitOnlyForEarlierBlocks) {
  for (const MaskCase& mc : mask_cases()) {
    check_turns<128, kBwdRows>(mc);
    check_turns<128, kBwdWideRows>(mc);
    check_turns<64, kBwdRows>(mc);
  }
}

// Under a causal mask, descending turns cost the blocks that start together no waiting: a block
// reaches each query tile it shares with the next key tile after that tile's block, started at
// the same time, has passed it. A step-by-step model of the blocks of one wave (every block one
// query tile a step, a turn passed on the step after its addition) finds no block waiting.
template <int KEYS, int ROWS>
void check_causal_turns_do_not_stall() {
  for (int64_t seqlen : {512, 2048, 4096}) {
    const Mask mask = Mask::make(Causal::bottom_right, -1, -1, 0, seqlen, seqlen);
    const int key_tiles = int(seqlen / KEYS);
    // done[n][m]: the step at whose end key tile n's block added query tile m.
    std::vector<std::map<int, int>> done(static_cast<size_t>(key_tiles));
    int waits = 0;
    for (int n = key_tiles - 1; n >= 0; --n) {  // the turn order: later key tiles first
      const Range tiles = bwd_query_tiles<ROWS>(mask, bwd_key_tile<KEYS>(mask, n));
      int step = 0;
      for (int m = int(tiles.begin); m < int(tiles.end); ++m, ++step) {
        int ready = step;  // every block starts at step 0 and takes a tile a step
        if (bwd_turn<KEYS, ROWS>(mask, m, n) > 0) ready = std::max(ready, done[size_t(n + 1)].at(m) + 1);
        waits += ready - step;
        step = ready;
        done[size_t(n)][m] = step;
      }
    }
    EXPECT_EQ(waits, 0) << "seqlen " << seqlen << " keys " << KEYS << " rows " << ROWS;
  }
}
TEST(Sm90BackwardBlocks, CausalTurnsDoNotStallBlocksThatStartTogether) {
  check_causal_turns_do_not_stall<128, kBwdRows>();
  check_causal_turns_do_not_stall<128, kBwdWideRows>();
  check_causal_turns_do_not_stall<64, kBwdRows>();  // head dims 192 and 256
}

// The whole protocol, run by the functions the kernel runs: blocks start in grid order, at most
// `resident` at a time (a block leaves only when it has walked all its query tiles), and a block
// adds into a query tile only when the tile's counter reaches its turn, then passes the turn on.
// Whatever the residency, every block finishes (no deadlock), and every query tile receives its
// additions in descending key-tile order, each once.
template <int KEYS, int ROWS>
void check_protocol(const MaskCase& mc, int resident) {
  const Mask mask = Mask::make(mc.causal, mc.window_left, mc.window_right, mc.q_offset, mc.seqlen_q, mc.seqlen_k);
  const std::string what = describe(mc) +
                           " keys " + std::to_string(KEYS) + " resident " + std::to_string(resident);
  BwdBlockOrder order;
  order.key_tiles = int((mc.seqlen_k + KEYS - 1) / KEYS), order.kv_heads = 1, order.pairs = 3, order.section = 2;
  const int query_tiles = int((mc.seqlen_q + ROWS - 1) / ROWS);
  std::vector<std::vector<int>> counter(size_t(order.pairs), std::vector<int>(size_t(query_tiles), 0));
  std::vector<std::vector<std::vector<int>>> added(size_t(order.pairs),
                                                   std::vector<std::vector<int>>(size_t(query_tiles)));
  struct Running {
    BwdBlock block;
    Range tiles;
    int step;
  };
  std::vector<Running> running;
  int next = 0;
  while (next < int(order.blocks()) || !running.empty()) {
    while (int(running.size()) < resident && next < int(order.blocks())) {
      const BwdBlock b = order.get<true>(next++);
      running.push_back({b, bwd_query_tiles<ROWS>(mask, bwd_key_tile<KEYS>(mask, b.key_tile)), 0});
    }
    bool progressed = false;
    for (size_t r = 0; r < running.size();) {
      Running& run = running[r];
      if (run.step < int(run.tiles.size())) {
        const int m = int(run.tiles.begin) + run.step;
        const int pair = run.block.batch * order.kv_heads + run.block.kv_head;
        int& turn = counter[size_t(pair)][size_t(m)];
        if (turn == bwd_turn<KEYS, ROWS>(mask, m, run.block.key_tile)) {
          added[size_t(pair)][size_t(m)].push_back(run.block.key_tile);
          ++turn;
          ++run.step;
          progressed = true;
        }
      }
      if (run.step == int(run.tiles.size())) {
        running.erase(running.begin() + std::ptrdiff_t(r));
        progressed = true;
      } else {
        ++r;
      }
    }
    ASSERT_TRUE(progressed) << what << ": every resident block waits (deadlock), " << next << " of "
                            << order.blocks() << " blocks started";
  }
  for (int pair = 0; pair < order.pairs; ++pair)
    for (int m = 0; m < query_tiles; ++m) {
      std::vector<int> expected;  // the key tiles that add into m, in turn order (descending)
      for (int n = 0; n < order.key_tiles; ++n) {
        const Range t = bwd_query_tiles<ROWS>(mask, bwd_key_tile<KEYS>(mask, n));
        if (t.begin <= m && m < t.end) expected.push_back(n);
      }
      std::reverse(expected.begin(), expected.end());
      EXPECT_EQ(added[size_t(pair)][size_t(m)], expected) << what << " pair " << pair << " tile " << m;
    }
}

TEST(Sm90BackwardBlocks, TurnsNeverDeadlockAndAddInKeyTileOrderAtAnyResidency) {
  for (const MaskCase& mc : mask_cases())
    for (int resident : {1, 2, 5, 64}) {
      check_protocol<128, kBwdRows>(mc, resident);
      check_protocol<64, kBwdRows>(mc, resident);
    }
}

}  // namespace
}  // namespace fmha::cuda::sm90
