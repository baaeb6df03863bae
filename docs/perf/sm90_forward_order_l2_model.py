#!/usr/bin/env python3
"""How many bytes of K and V the sm90 forward reads from DRAM under its two walks of the work tiles.

A model, not a measurement. The forward is persistent: `grid` blocks take (query tile, head) work
tiles from a counter in walk order (the dynamic schedule), and each work tile streams its head's
K/V tiles from the first to the last. The L2 is modelled as one LRU cache of `l2_mb` megabytes
that every K/V tile, query tile and output tile passes through. A work tile lasts as many steps as
its head has K/V tiles, each step stretched by a random factor in [1 - jitter, 1 + jitter] (blocks
never run in exact lock step).

Two walks (sm90_tile_scheduler.cuh):
  heads  the heads of an L2 section vary fastest (TileScheduler's default): the first wave starts
         every query tile of its heads together, but later work tiles are taken as blocks finish,
         so one head's tiles, spread over the whole section in the walk, start spread over a
         whole wave's finishing times;
  tiles  each head's query tiles are adjacent (TileScheduler::tiles_fastest, FMHA_SM90_FWD_ORDER=tiles):
         the next blocks to finish take them, within a few finishing times of each other.

Run 59 (Nsight Compute, D256 2k, B8 H8, bf16; docs/PERF.md) measured fmha's forward moving 368 MB
through DRAM where cuDNN's moved 263 MB (Q, K, V and O are 67 MB each). Usage:
    python3 docs/perf/sm90_forward_order_l2_model.py
"""
import collections
import heapq
import random

GRID = 132
TILE_M = 128          # query rows a work tile
KV_TILE = 128         # keys a K/V step
BUDGET = 32 * 2**20   # the forward's L2 section budget (sm90_dispatch.cpp kL2SectionBytes)
TOKENS, HIDDEN = 16384, 2048  # the fa sweep: 16k tokens a call, hidden 2048
last_makespan = 0.0           # the last dram_reads call's makespan, in K/V steps


def forward_section(kv_bytes, m_blocks, pairs, wide=False):
    """sm90_sections.h forward_section for GQA group 1; `wide`: a longest-first walk of more
    than kWaveSectionTiles query tiles a head, which keeps the budget's section."""
    fit = 1
    while fit * 2 <= max(int(BUDGET // kv_bytes), 1):
        fit *= 2
    if 0 < m_blocks <= GRID and not wide:
        fit = min(fit, max(GRID // m_blocks, 1))
    return min(fit, pairs)


def walk(order, pairs, m_blocks, section, causal=False):
    """(pair, query tile) in walk order; causal walks take the longest (last) query tiles first."""
    tile = (lambda t: m_blocks - 1 - t) if causal else (lambda t: t)
    if order == "tiles":
        return [(p, tile(t)) for p in range(pairs) for t in range(m_blocks)]
    out = []
    for first in range(0, pairs, section):
        width = min(section, pairs - first)
        out += [(first + u, tile(t)) for t in range(m_blocks) for u in range(width)]
    return out


def dram_reads(order, head_dim, seqlen, l2_mb, jitter, seed=1, section=None, causal=False):
    """(K/V bytes read from DRAM, K/V bytes the call needs) under `order`; `section` overrides
    the forward's section rule (heads a section); `causal`: query tile m reads K/V steps 0..m
    (equal lengths), longest first."""
    pairs = TOKENS // seqlen * HIDDEN // head_dim
    m_blocks = seqlen // TILE_M
    kv_steps = seqlen // KV_TILE
    kv_tile_bytes = KV_TILE * head_dim * 2 * 2      # K and V, 16-bit
    q_tile_bytes = TILE_M * head_dim * 2
    if section is None:
        section = forward_section(seqlen * head_dim * 2 * 2, m_blocks, pairs, causal and m_blocks > 8)
    order_of_tiles = walk(order, pairs, m_blocks, section, causal)
    rng = random.Random(seed)
    cache, used, kv_read = collections.OrderedDict(), 0, 0

    def touch(key, size):
        nonlocal used, kv_read
        if key in cache:
            cache.move_to_end(key)
            return
        if key[0] == "kv":
            kv_read += size
        cache[key] = size
        used += size
        while used > l2_mb * 1e6:
            used -= cache.popitem(last=False)[1]

    events = [(rng.uniform(0, 0.05), block, None) for block in range(GRID)]
    heapq.heapify(events)
    taken, end = 0, 0.0
    while events:
        now, block, state = heapq.heappop(events)
        end = max(end, now)
        if state is None:                            # the block takes the next work tile
            if taken == len(order_of_tiles):
                continue
            pair, m = order_of_tiles[taken]
            taken += 1
            touch(("q", pair, m), q_tile_bytes)
            state = (pair, m, 0, 1 + rng.uniform(-jitter, jitter))
        pair, m, step, stretch = state
        touch(("kv", pair, step), kv_tile_bytes)
        last = m * TILE_M // KV_TILE if causal else kv_steps - 1
        if step < last:
            heapq.heappush(events, (now + stretch, block, (pair, m, step + 1, stretch)))
        else:                                        # the output tile leaves through the L2
            touch(("o", pair, m), q_tile_bytes)
            heapq.heappush(events, (now + stretch, block, None))
    global last_makespan
    last_makespan = end  # in K/V steps: when the last block finished (a step's cost fixed)
    return kv_read, pairs * seqlen * head_dim * 2 * 2  # causal calls also need every K/V tile


def main():
    print("K/V bytes read from DRAM / the call's K/V bytes (1.00: each byte once)")
    print("head_dim seqlen  L2 MB  jitter   heads-fastest  tiles-fastest")
    for head_dim, seqlen in ((256, 1024), (256, 2048), (256, 4096), (256, 8192), (128, 512), (128, 2048),
                             (128, 16384), (64, 512), (64, 4096), (64, 16384)):
        for l2_mb in (50, 25):
            for jitter in (0.02, 0.10):
                ratio = {}
                for order in ("heads", "tiles"):
                    read, once = dram_reads(order, head_dim, seqlen, l2_mb, jitter)
                    ratio[order] = read / once
                print(f"{head_dim:8d} {seqlen:6d} {l2_mb:6d} {jitter:7.2f} {ratio['heads']:15.2f} {ratio['tiles']:14.2f}")


def causal_table():
    """Causal calls (longest first): K/V reads and the makespan (K/V steps, against a perfect
    spread of the work over the grid) at a 25 MB L2, under the sections of a 32 MB budget (the
    default), of a 16 MB one (FMHA_SM90_L2_SECTION_MB=16), and with each head's tiles together."""
    global BUDGET
    print("\ncausal (bottom-right, equal lengths), L2 25 MB: K/V reads, makespan / the perfect spread")
    print("head_dim seqlen   sections 32 MB   sections 16 MB   tiles fastest")
    for head_dim, seqlen in ((64, 2048), (64, 16384), (128, 2048), (128, 16384), (256, 2048), (256, 8192)):
        pairs, m_blocks = TOKENS // seqlen * HIDDEN // head_dim, seqlen // TILE_M
        perfect = pairs * sum(m * TILE_M // KV_TILE + 1 for m in range(m_blocks)) / GRID
        cells = []
        for order, budget_mb in (("heads", 32), ("heads", 16), ("tiles", 32)):
            BUDGET = budget_mb * 2**20
            read, once = dram_reads(order, head_dim, seqlen, 25, 0.05, causal=True)
            cells.append(f"{read / once:5.2f}, {last_makespan / perfect:5.3f}")
        BUDGET = 32 * 2**20
        print(f"{head_dim:8d} {seqlen:6d}   " + "   ".join(cells))


def check_against_measurements():
    """The model beside the two measured cases (K/V read = (DRAM bytes - Q - O) / K/V bytes)."""
    print("\nagainst Nsight Compute (docs/PERF.md), heads-fastest walk:")
    cases = (("run 51, D128 512, sections of 128 heads (before the wave bound): measured 3.0", 128, 512, 128),
             ("run 59, D256 2k, the section rule: measured 1.75", 256, 2048, None))
    for label, head_dim, seqlen, section in cases:
        model = []
        for l2_mb in (50, 25):
            read, once = dram_reads("heads", head_dim, seqlen, l2_mb, 0.05, section=section)
            model.append(f"{read / once:.2f} at {l2_mb} MB")
        print(f"  {label}; model {', '.join(model)}")


if __name__ == "__main__":
    main()
    causal_table()
    check_against_measurements()
