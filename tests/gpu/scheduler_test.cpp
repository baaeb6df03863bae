// Host logic of the sm90 tier: the persistent tile scheduler's order (every work tile exactly
// once, L2 sections, longest query tiles first under causal masks) and the pipeline positions the
// producer and consumers walk. Runs without a GPU.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>

#include "cuda/sm90/sm90_config.h"
#include "cuda/sm90/sm90_sections.h"
#include "cuda/sm90/sm90_tile_scheduler.cuh"
#include "cuda/tile/pipeline.h"

namespace fmha::cuda::sm90 {
namespace {

TileScheduler make(int m_blocks, int batch, int heads, int section, bool longest_first, bool tiles_fastest = false) {
  TileScheduler s;
  s.tiles_fastest = tiles_fastest;
  s.m_blocks = m_blocks;
  s.heads = heads;
  s.batch_heads = batch * heads;
  s.section = section;
  s.total = m_blocks * batch * heads;
  s.longest_first = longest_first;
  return s;
}

TEST(TileScheduler, EveryWorkTileOnce) {
  // Sections that divide the (batch, head) pairs, and ones that leave a short last section.
  for (int section : {1, 2, 3, 4, 8, 64})
    for (bool longest_first : {false, true})
      for (bool tiles_fastest : {false, true}) {
        const TileScheduler s = make(5, 3, 4, section, longest_first, tiles_fastest);
        std::set<std::tuple<int, int, int>> seen;
        for (int t = 0; t < s.total; ++t) {
          const WorkTile w = s.get(t);
          ASSERT_GE(w.m_block, 0);
          ASSERT_LT(w.m_block, 5);
          ASSERT_GE(w.head, 0);
          ASSERT_LT(w.head, 4);
          ASSERT_GE(w.batch, 0);
          ASSERT_LT(w.batch, 3);
          EXPECT_TRUE(seen.insert({w.m_block, w.head, w.batch}).second)
              << "tile " << t << " repeats (m " << w.m_block << ", head " << w.head << ", batch " << w.batch
              << ") with section " << section << (tiles_fastest ? ", tiles fastest" : "");
        }
        EXPECT_EQ(int(seen.size()), s.total);
      }
}

TEST(TileScheduler, TilesFastestTakesEachHeadsTilesTogether) {
  // A head's query tiles are consecutive in the walk, in order, whatever the section; then the
  // next (batch, head) pair, so the heads of a GQA group follow each other.
  const TileScheduler s = make(6, 2, 4, 2, false, true);
  for (int t = 0; t < s.total; ++t) {
    const WorkTile w = s.get(t);
    EXPECT_EQ(w.m_block, t % 6) << "tile " << t;
    EXPECT_EQ(w.batch * 4 + w.head, t / 6) << "tile " << t;
  }
}

TEST(TileScheduler, SectionsKeepHeadsTogetherAndLongestFirst) {
  // Inside a section the (batch, head) pairs vary fastest, so consecutive tiles (the blocks in
  // flight together) share a few heads' K/V; with longest_first the last query tile comes first.
  const TileScheduler s = make(4, 2, 8, 4, true);
  for (int t = 0; t < 4; ++t) {
    const WorkTile w = s.get(t);
    EXPECT_EQ(w.m_block, 3) << "the first wave takes the longest (last) query tiles";
    EXPECT_EQ(w.batch * 8 + w.head, t) << "heads vary fastest inside a section";
  }
  // The first section (pairs 0..3) is done before any tile of the second starts.
  for (int t = 0; t < 16; ++t) EXPECT_LT(s.get(t).batch * 8 + s.get(t).head, 4);
  EXPECT_EQ(s.get(16).batch * 8 + s.get(16).head, 4);
  const TileScheduler forward = make(4, 2, 8, 4, false);
  EXPECT_EQ(forward.get(0).m_block, 0);
  EXPECT_EQ(forward.get(s.total - 1).m_block, 3);
}

TEST(TileScheduler, ShortCallsTakeAWaveOfWholeHeadsASection) {
  constexpr double kBudget = 32.0 * 1024 * 1024;
  constexpr int kGrid = 132;
  const double kv512 = 512.0 * (128 + 128) * 2;  // one KV head's K and V: 512 keys, D128, bf16
  // Without the wave bound the budget would take 128 heads (32 MB / 256 KB): 4 query tiles a head
  // then fill a wave with one query tile of 132 heads.
  EXPECT_EQ(forward_section(kv512, kBudget, 200, kGrid, 1, 512, false), 128) << "a head's tiles exceed a wave";
  EXPECT_EQ(forward_section(kv512, kBudget, 4, kGrid, 1, 512, false), 33);
  EXPECT_EQ(forward_section(kv512, kBudget, 4, kGrid, 1, 512, true), 33) << "short causal calls too";
  EXPECT_EQ(forward_section(kv512, kBudget, 16, kGrid, 1, 512, true), 128) << "longer causal calls keep the spread";
  EXPECT_EQ(forward_section(kv512, kBudget, 16, kGrid, 1, 512, false), 8);
  EXPECT_EQ(forward_section(kv512, kBudget, 4, kGrid, 4, 512, false), 32) << "whole GQA groups";
  EXPECT_EQ(forward_section(kv512, kBudget, 4, kGrid, 1, 20, false), 20) << "no more than the pairs";
  EXPECT_EQ(forward_section(kv512, kBudget, 132, kGrid, 8, 512, false), 8) << "at least one group";
  EXPECT_EQ(forward_section(64.0 * kBudget, kBudget, 500, kGrid, 2, 512, false), 2) << "a head over the budget";
  // Whatever the shape: whole groups, within [group, pairs], and a section's tiles fill at most a
  // wave where a head's tiles fit in one (so every tile of its heads is in flight together).
  for (int m_blocks : {1, 2, 3, 4, 7, 8, 9, 16, 33, 64, 131, 132, 133, 1000})
    for (int group : {1, 2, 4, 8})
      for (bool longest_first : {false, true}) {
        const int section = forward_section(kv512, kBudget, m_blocks, kGrid, group, 4096, longest_first);
        EXPECT_EQ(section % group, 0);
        EXPECT_GE(section, group);
        if (m_blocks * group <= kGrid && (!longest_first || m_blocks <= kWaveSectionTiles))
          EXPECT_LE(section * m_blocks, kGrid) << m_blocks << " tiles, group " << group;
      }
}

TEST(TileScheduler, SectionBudgetFromTheEnvironmentsText) {
  constexpr double kMiB = 1024.0 * 1024.0, kFallback = 32.0 * kMiB;
  EXPECT_EQ(l2_section_budget(nullptr, kFallback), kFallback) << "unset";
  EXPECT_EQ(l2_section_budget("", kFallback), kFallback);
  EXPECT_EQ(l2_section_budget("16", kFallback), 16.0 * kMiB);
  EXPECT_EQ(l2_section_budget("0.5", kFallback), 0.5 * kMiB);
  for (const char* ignored : {"0", "-8", "abc", "16MB", "1e"}) {
    std::string warning;
    EXPECT_EQ(l2_section_budget(ignored, kFallback, &warning), kFallback) << ignored;
    EXPECT_NE(warning.find(std::string("FMHA_SM90_L2_SECTION_MB=") + ignored), std::string::npos) << warning;
  }
  std::string none;
  EXPECT_EQ(l2_section_budget("24", kFallback, &none), 24.0 * kMiB);
  EXPECT_EQ(l2_section_budget(nullptr, kFallback, &none), kFallback);
  EXPECT_TRUE(none.empty()) << none;
}

// The forward's work-tile bookkeeping with one and two query buffers: tile n's buffer and phase
// are those of a PipelineState advanced n times (the barriers' protocol), and its slot, which
// the producer rewrites once tile n − buffers has released its queries, is none of the slots of
// tiles n − 1 ... n − buffers that the consumers may still be reading.
TEST(Sm90Config, WorkTileBufferPhaseAndSlot) {
  auto check = [](auto pipe, int buffers) {
    for (unsigned n = 0; n < 20; ++n) {
      EXPECT_EQ(fwd_query_buffer(n, buffers), pipe.index) << buffers << " buffers, tile " << n;
      EXPECT_EQ(fwd_query_phase(n, buffers), pipe.phase) << buffers << " buffers, tile " << n;
      EXPECT_LT(fwd_work_slot(n, buffers), 2 * buffers);
      for (unsigned back = 1; back <= unsigned(buffers) && back <= n; ++back)
        EXPECT_NE(fwd_work_slot(n, buffers), fwd_work_slot(n - back, buffers)) << buffers << " buffers, tile " << n;
      pipe.advance();
    }
  };
  check(tile::PipelineState<1>{}, 1);
  check(tile::PipelineState<2>{}, 2);
}

TEST(Pipeline, RingPositionAndPhase) {
  tile::PipelineState<3> p;
  for (int step = 0; step < 10; ++step) {
    EXPECT_EQ(p.index, step % 3);
    EXPECT_EQ(p.phase, uint32_t((step / 3) % 2)) << "the phase flips each time the ring wraps";
    p.advance();
  }
}

TEST(Sm90Config, EveryVariantFitsSharedMemoryAndTheRegisterFile) {
  for (int head_dim : {64, 96, 128, 192, 256})
    for (int v = 0; v < kFwdVariants; ++v) {
      const FwdConfig c = fwd_config(head_dim, v);
      const int d = padded_head_dim(head_dim);
      const size_t bytes = size_t(2) * (size_t(c.tile_m()) * d + size_t(2) * c.stages * c.tile_n * d);
      EXPECT_LE(bytes + 1024 + 1024, kSharedLimit) << "head_dim " << head_dim << " variant " << kFwdVariantNames[v];
      EXPECT_LE(c.tile_m(), 256) << "a TMA box has at most 256 rows";
      EXPECT_LE(c.tile_n, 256);
      EXPECT_EQ(c.tile_n % 16, 0) << "P·V runs k16 steps over the keys";
      // Within the block's pool (what __launch_bounds__ gives it), not merely the register file:
      // setmaxnreg.inc waits for registers the pool does not have.
      EXPECT_LE(kWarpgroupThreads * (producer_registers(c.consumers) + c.consumers * consumer_registers(c.consumers)),
                register_pool(c.threads()));
      for (bool packed : {false, true})
        EXPECT_LE(kWarpgroupThreads * (producer_registers(c.consumers, packed) +
                                       c.consumers * consumer_registers(c.consumers, packed)),
                  register_pool(c.threads()))
            << "head_dim " << head_dim << (packed ? " packed" : "");
    }
}

// The pool a block holds under __launch_bounds__(threads, 1): 168 registers a thread for 384
// threads (64,512, not the whole file), 128 for 512.
TEST(Sm90Config, RegisterPoolIsTheLaunchCapTimesTheThreads) {
  EXPECT_EQ(register_pool(384), 168 * 384);
  EXPECT_EQ(register_pool(512), 128 * 512);
  for (bool wide : {false, true})
    EXPECT_LE(kWarpgroupThreads * (bwd_producer_registers(wide) + kBwdConsumers * bwd_consumer_registers(wide)),
              register_pool((kBwdConsumers + 1) * kWarpgroupThreads));
}

// The tf32 forward (fp32 storage): its default configuration at the head dims it takes fits
// shared memory with Q, the K and Vᵀ rings and V's landing buffer in fp32 (O staged over Q where
// a buffer of its own does not fit), its key tiles are whole 32-key chunks of Vᵀ, and its register
// split (the producer raised for the transposing warps) fits the block's pool.
TEST(Sm90Config, Tf32ForwardFitsAndTakesWholeKeyChunks) {
  for (int head_dim : {64, 96, 128}) {
    ASSERT_TRUE(tf32_head_dim(head_dim)) << head_dim;
    const FwdConfig c = fwd_config(head_dim, kFwdDefault, 4);
    const size_t d = size_t(padded_head_dim(head_dim));
    const size_t bytes = 4 * (size_t(c.tile_m()) * d + size_t(2) * c.stages * c.tile_n * d + size_t(c.tile_n) * d);
    EXPECT_LE(bytes + 1024 + 1024, kSharedLimit) << "head_dim " << head_dim;
    EXPECT_EQ(c.tile_n % chunk_cols(4), 0) << "Vᵀ holds whole chunks of 32 keys";
    EXPECT_EQ(c.tile_n % 8, 0) << "P·V runs k8 steps over the keys";
    EXPECT_TRUE(c.pingpong && c.lazy_rescale && c.chain_turns) << "the tf32 forward runs the default schedule";
    for (bool packed : {false, true})
      EXPECT_LE(kWarpgroupThreads * (producer_registers(c.consumers, packed, true) +
                                     c.consumers * consumer_registers(c.consumers, packed, true)),
                register_pool(c.threads()))
          << "head_dim " << head_dim << (packed ? " packed" : "");
  }
  EXPECT_EQ(producer_registers(2, false, true), 40) << "the transposing warps' budget";
  // The 16-bit forward's split: 24 / 240 for dense calls, 40 / 232 for packed ones at every head
  // dim (their producer walks the sequence table; at 24 it spilled at head dims 192 and 256).
  EXPECT_EQ(producer_registers(2, false), 24);
  EXPECT_EQ(consumer_registers(2, false), 240);
  EXPECT_EQ(producer_registers(2, true), 40);
  EXPECT_EQ(consumer_registers(2, true), 232);
  EXPECT_FALSE(tf32_head_dim(32));
  EXPECT_FALSE(tf32_head_dim(192));
  EXPECT_FALSE(tf32_head_dim(256));
  EXPECT_EQ(chunk_cols(2), kChunkCols);
  EXPECT_EQ(chunk_cols(4), 32);
}

TEST(Sm90Config, DefaultVariantByShape) {
  // spec for dense calls at head dims 64, 128 and 256; pingpong for packed calls and at the others.
  for (int head_dim : {64, 128, 256}) {
    EXPECT_EQ(default_fwd_variant(head_dim, false), kFwdSpeculate) << head_dim;
    EXPECT_EQ(default_fwd_variant(head_dim, true), kFwdDefault) << head_dim;
  }
  for (int head_dim : {96, 192})
    for (bool packed : {false, true}) EXPECT_EQ(default_fwd_variant(head_dim, packed), kFwdDefault);
  EXPECT_TRUE(fwd_config(128, kFwdSpeculate).speculate && fwd_config(128, kFwdSpeculate).lazy_rescale);
  // The variants' schedules: pingpong with lazy rescaling and carried turns but where a variant
  // takes one of them away.
  for (int v = 0; v < kFwdVariants; ++v) {
    const FwdConfig c = fwd_config(128, v);
    EXPECT_EQ(c.consumers, 2) << kFwdVariantNames[v];
    EXPECT_EQ(c.pingpong, v != kFwdOverlap && v != kFwdSerial) << kFwdVariantNames[v];
    EXPECT_EQ(c.overlap, v != kFwdSerial) << kFwdVariantNames[v];
    EXPECT_EQ(c.lazy_rescale, v == kFwdDefault || v == kFwdPoly8 || v == kFwdN144 || v == kFwdSpeculate)
        << kFwdVariantNames[v];
    EXPECT_EQ(c.tile_n, v == kFwdN144 ? kWideKeys : 128) << kFwdVariantNames[v];
  }
  EXPECT_EQ(fwd_config(128, kFwdPoly8).poly_every, 8);
  // What a build compiles at a head dim: every variant where it is tuned; else the default, and
  // spec where FMHA_SM90_SPEC_HEAD_DIMS names it (a request for another is ignored there).
  for (int v = 0; v < kFwdVariants; ++v) {
    EXPECT_TRUE(fwd_variant_built(v, true, false)) << kFwdVariantNames[v];
    EXPECT_EQ(fwd_variant_built(v, false, false), v == kFwdDefault) << kFwdVariantNames[v];
    EXPECT_EQ(fwd_variant_built(v, false, true), v == kFwdDefault || v == kFwdSpeculate) << kFwdVariantNames[v];
  }
  EXPECT_FALSE(fwd_config(128, kFwdDefault).speculate);
  for (int v = 0; v < kFwdVariants; ++v)
    EXPECT_TRUE(fwd_config(64, v).pingpong == (std::string(kFwdVariantNames[v]) != "overlap" &&
                                               std::string(kFwdVariantNames[v]) != "serial"))
        << kFwdVariantNames[v];
}

}  // namespace
}  // namespace fmha::cuda::sm90
