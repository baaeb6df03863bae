#!/usr/bin/env python3
"""How much of the sm90 deterministic backward's extra time its block order's tail can explain.

A model, not a measurement. The backward launches one block per (key tile, batch · KV head pair);
blocks start in launch order on `sms` multiprocessors as earlier blocks finish (list scheduling),
with no waits between blocks (the turn protocol left out, as in scripts/gpu_det_probe.sh's
`nopass` probe). Under a causal mask with square tiles, key tile n of T walks T - n query tiles
(one step each); without a mask every block walks T.

Two launch orders (src/cuda/sm90/sm90_bwd_blocks.h, BwdBlockOrder):
  default        the default kernel's 3-D grid: one pair's key tiles ascending (longest first
                 under causal masks), then the next pair's;
  deterministic  sections of `section` pairs, the pairs of a section fastest, key tiles
                 descending (the shortest first under causal masks, the longest last);
  staggered      each pair's key tiles descending, pair p's started `offset` · p / pairs of a
                 pair's blocks after pair 0's (offset a quarter, half or all of a pair's blocks).

Prints each order's makespan in steps against the work's even share of the multiprocessors.

With --delta D (> 0) it also models the turns: a block's add into query tile m is issued once its
step is computed and the previous turn's add into m is done, and is done D steps later; the
block's next step cannot finish before that add is issued (one dQ buffer). Three designs:
  free           the default kernel (ascending launch, no turns);
  descending     the deterministic kernel's (descending launch and turns, query tiles ascending);
  ascending      a candidate (ascending launch and turns, each block's query tiles descending:
                 the longest blocks start first, and a block waits only on blocks launched
                 before it, so it cannot deadlock).
With --ramp (and --delta), calls without a mask only: the descending design's makespan by the
number of pairs a section, against the free kernel's. The blocks of one pair that start together
take their turns at each query tile one after another, so the more of a pair's blocks a wave
holds, the further the last of them runs behind.
Usage: python3 sm90_bwd_det_tail_model.py [--tiles 64] [--pairs 32] [--sms 132] [--delta 0.2]
       python3 sm90_bwd_det_tail_model.py --ramp --tiles 256 --key-tiles 128 --pairs 16 --delta 0.3
"""
import argparse
import heapq


def makespan(order, steps, sms):
    free = [0.0] * sms
    end = 0.0
    for block in order:
        start = heapq.heappop(free)
        finish = start + steps[block]
        end = max(end, finish)
        heapq.heappush(free, finish)
    return end


def turns_makespan(t, pairs, design, delta, causal, sms, section=None, key_tiles=None):
    # key_tiles (default t): blocks per pair; without a mask each walks t query tiles (with
    # one, square tiles: key_tiles = t). section (default every pair): the deterministic
    # order's pairs per section.
    k = key_tiles or t
    section = section or pairs
    if design == "descending":
        order = [(n, p) for s0 in range(0, pairs, section) for n in reversed(range(k))
                 for p in range(s0, min(pairs, s0 + section))]
    else:
        order = [(n, p) for p in range(pairs) for n in range(k)]
    done = {}  # (pair, key tile, query tile) -> the add's completion
    free = [0.0] * sms
    end = 0.0
    for n, p in order:
        start = heapq.heappop(free)
        tiles = list(range(n, t)) if causal else list(range(t))
        if design == "ascending":
            tiles.reverse()
        computed = issued = last = start
        for m in tiles:
            computed = max(computed, issued) + 1.0
            before = 0.0
            if design == "descending" and n + 1 < k and (not causal or n + 1 <= m):
                before = done[(p, n + 1, m)]
            elif design == "ascending" and n > 0:
                before = done[(p, n - 1, m)]
            issued = max(computed, before)
            last = done[(p, n, m)] = issued + delta
        end = max(end, last)
        heapq.heappush(free, last)
    return end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", type=int, default=64, help="key (and query) tiles: seqlen / 64")
    ap.add_argument("--pairs", type=int, default=32, help="batch * KV heads")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--delta", type=float, default=0.0, help="an add's latency in steps (0: no turn model)")
    ap.add_argument("--ramp", action="store_true",
                    help="without a mask only: the turns' makespan by pairs a section (with --delta; "
                         "--key-tiles blocks a pair, each walking --tiles query tiles)")
    ap.add_argument("--key-tiles", type=int, default=0, help="blocks per pair for --ramp (default --tiles)")
    args = ap.parse_args()
    if args.ramp:
        k = args.key_tiles or args.tiles
        free = turns_makespan(args.tiles, args.pairs, "free", args.delta, False, args.sms, key_tiles=k)
        print(f"no mask, {k} blocks a pair of {args.tiles} steps, add latency {args.delta} steps: "
              f"free {free:.1f}")
        for section in sorted({1, 2, 3, 4, 8, 16, args.pairs}):
            if section > args.pairs:
                continue
            span = turns_makespan(args.tiles, args.pairs, "descending", args.delta, False, args.sms, section, k)
            together = min(k, -(-args.sms // section))
            print(f"  {section:3d} pairs a section ({together:3d} blocks of a pair a wave): {span:8.1f} "
                  f"({(span / free - 1) * 100:+.1f} %)")
        return
    t, pairs = args.tiles, args.pairs
    for causal in (False, True):
        steps = {(n, p): (t - n if causal else t) for p in range(pairs) for n in range(t)}
        share = sum(steps.values()) / args.sms
        default = [(n, p) for p in range(pairs) for n in range(t)]
        print(f"{'causal' if causal else 'no mask'}: even share {share:.1f} steps")
        print(f"  default order        {makespan(default, steps, args.sms):7.1f}")
        for section in (1, 4, 8, pairs):
            order = [(n, p) for s0 in range(0, pairs, section) for n in reversed(range(t))
                     for p in range(s0, min(pairs, s0 + section))]
            print(f"  deterministic, {section:2d} pairs a section {makespan(order, steps, args.sms):7.1f}")
        for frac in (0.25, 0.5, 1.0):
            keyed = sorted((i + p * frac * t / pairs, p, t - 1 - i) for p in range(pairs) for i in range(t))
            order = [(n, p) for _, p, n in keyed]
            print(f"  staggered by {frac:4.2f} of a pair  {makespan(order, steps, args.sms):7.1f}")
        if args.delta > 0:
            for design in ("free", "descending", "ascending"):
                span = turns_makespan(t, pairs, design, args.delta, causal, args.sms)
                print(f"  turns, {design:10s} (add latency {args.delta} steps) {span:7.1f}")


if __name__ == "__main__":
    main()
