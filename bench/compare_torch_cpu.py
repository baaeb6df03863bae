"""fmha's `cpu` backend beside PyTorch's CPU SDPA (its flash-attention CPU kernel), in one process.

Both run on the same number of threads (--threads: fmha's num_threads and torch.set_num_threads).
Each (case, dtype, direction) times fmha and torch alternately, --rounds times, each time the
median of --repeats calls after --warmup calls; a round runs every provider once, so a busy or a
quiet minute of a shared machine falls on both alike. The table gives the median GFLOP/s over the
rounds with the range, and the ratio fmha / torch per round (> 1: fmha is faster).

Cases, fp32 and bf16: the issue's three long ones (B4 H4 S4096 D64; B2 H8 S2048 D128 causal;
B1 H32 S1024 D128), forward and backward; three short calls (B1 H4 S192 D128; B1 H16 S256 D64
causal; B8 H8 S128 D64), forward and backward, where the fixed cost of a call shows; and three
decode-shaped GQA calls (1 or 16 query rows per head against 8k-32k keys, 32 query heads over 8
KV heads or 8 over 1), forward only and unmasked (a single row sees every key; PyTorch's is_causal
aligns top-left, fmha's decode masks bottom-right, so neither mask is used). PyTorch gets the GQA
shapes with enable_gqa=True; where its flash kernel refuses them, K and V repeated per query head
(outside the timing), and the table says so. FLOPs by FlashAttention's convention: forward
4·B·H·Sq·Sk·D, halved when causal; backward 2.5x the forward. The backward is timed alone (fmha:
from the forward's out and LSE; torch: autograd.grad through a kept graph).

Timing: each timing is the median of --repeats calls or more: calls go on until --min-time
seconds have passed, so that a call of a millisecond is timed over many calls.

Agreement: max |fmha - torch| / max |torch| of the output and of each gradient, once per case.

    python bench/compare_torch_cpu.py --threads 2 --rounds 3 --min-time 0.2 --out out/compare_cpu
    python bench/compare_torch_cpu.py --set short,decode --min-time 0.5
    python bench/compare_torch_cpu.py --smoke      # tiny sizes: checks the script itself
"""

import argparse
import csv
import os
import statistics
import sys
import time

DTYPES = ("fp32", "bf16")
# (set, name, batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, causal, directions)
CASES = [
    ("long", "B4 H4 S4096 D64", 4, 4, 4, 4096, 4096, 64, False, ("fwd", "bwd")),
    ("long", "B2 H8 S2048 D128 causal", 2, 8, 8, 2048, 2048, 128, True, ("fwd", "bwd")),
    ("long", "B1 H32 S1024 D128", 1, 32, 32, 1024, 1024, 128, False, ("fwd", "bwd")),
    ("short", "B1 H4 S192 D128", 1, 4, 4, 192, 192, 128, False, ("fwd", "bwd")),
    ("short", "B1 H16 S256 D64 causal", 1, 16, 16, 256, 256, 64, True, ("fwd", "bwd")),
    ("short", "B8 H8 S128 D64", 8, 8, 8, 128, 128, 64, False, ("fwd", "bwd")),
    ("decode", "B1 H8/1 Sq1 Sk32768 D128", 1, 8, 1, 1, 32768, 128, False, ("fwd",)),
    ("decode", "B4 H32/8 Sq1 Sk8192 D128", 4, 32, 8, 1, 8192, 128, False, ("fwd",)),
    ("decode", "B1 H32/8 Sq16 Sk8192 D128", 1, 32, 8, 16, 8192, 128, False, ("fwd",)),
]
SETS = ("long", "short", "decode")
SMOKE_CASES = [
    ("smoke", "B2 H2 S128 D64 causal", 2, 2, 2, 128, 128, 64, True, ("fwd", "bwd")),
    ("smoke", "B1 H4 S192 D128", 1, 4, 4, 192, 192, 128, False, ("fwd", "bwd")),
    ("smoke", "B1 H8/2 Sq1 Sk1000 D64", 1, 8, 2, 1, 1000, 64, False, ("fwd",)),
]
PROVIDERS = ("fmha", "torch")


def flops(case, direction):
    _, _, batch, heads, _, seqlen_q, seqlen_k, head_dim, causal, _ = case
    forward = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    if causal:
        forward /= 2
    return forward * (2.5 if direction == "bwd" else 1.0)


def median_seconds(fn, warmup, repeats, min_time):
    """The median of at least `repeats` calls, more until `min_time` seconds have passed."""
    for _ in range(warmup):
        fn()
    samples = []
    begin = time.perf_counter()
    while len(samples) < repeats or time.perf_counter() - begin < min_time:
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def rel_err(a, b):
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


class Case:
    """One (case, dtype): inputs in fmha's [B, S, H, D] layout, and a forward and a backward call
    per provider. torch gets transposed views ([B, H, S, D], strided), as a model calling both
    with the same tensors would pass them."""

    def __init__(self, case, dtype, threads, seed):
        _, self.name, batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, self.causal, directions = case
        generator = torch.Generator().manual_seed(seed)
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        q_shape, kv_shape = (batch, seqlen_q, heads, head_dim), (batch, seqlen_k, kv_heads, head_dim)
        self.q, self.dout = (torch.randn(q_shape, generator=generator, dtype=dt) for _ in range(2))
        self.k, self.v = (torch.randn(kv_shape, generator=generator, dtype=dt) for _ in range(2))
        # The long and short cases are square: top-left and bottom-right causal agree there.
        self.options = dict(causal="top-left" if self.causal else None, backend="cpu", num_threads=threads)
        self.out, self.lse = fmha.attention(self.q, self.k, self.v, return_lse=True, **self.options)
        # torch's K and V: GQA by enable_gqa where its flash kernel takes it, else repeated per query head.
        self.torch_kv_note = ""
        self.torch_kwargs = dict(is_causal=self.causal)
        k, v = self.k, self.v
        if kv_heads != heads:
            self.torch_kwargs["enable_gqa"] = True
            try:
                with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    F.scaled_dot_product_attention(self.q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   **self.torch_kwargs)
            except (RuntimeError, TypeError):
                del self.torch_kwargs["enable_gqa"]
                k, v = (x.repeat_interleave(heads // kv_heads, dim=2) for x in (k, v))
                self.torch_kv_note = " (torch: K/V repeated)"
        self.leaves = tuple(x.detach().transpose(1, 2).requires_grad_() for x in (self.q, k, v))
        # torch's graph for its backward, kept across calls (retain_graph); forward-only cases keep none.
        with torch.set_grad_enabled("bwd" in directions), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            self.torch_out = F.scaled_dot_product_attention(*self.leaves, **self.torch_kwargs)
        self.torch_dout = self.dout.transpose(1, 2)

    def call(self, provider, direction):
        if provider == "fmha" and direction == "fwd":
            return lambda: fmha.attention(self.q, self.k, self.v, **self.options)
        if provider == "fmha":
            return lambda: fmha.attention_backward(self.q, self.k, self.v, self.out, self.dout, self.lse,
                                                   **self.options)
        if direction == "fwd":
            def forward():
                with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(*(x.detach() for x in self.leaves), **self.torch_kwargs)
            return forward
        return lambda: torch.autograd.grad(self.torch_out, self.leaves, self.torch_dout, retain_graph=True)

    def agreement(self, directions):
        """max rel. difference fmha vs torch: output, then the worst of dq, dk, dv (None: not run)."""
        fwd = rel_err(self.out, self.torch_out.detach().transpose(1, 2))
        if "bwd" not in directions:
            return fwd, None
        ours = self.call("fmha", "bwd")()
        theirs = self.call("torch", "bwd")()
        bwd = max(rel_err(a, b.transpose(1, 2)) for a, b in zip(ours, theirs))
        return fwd, bwd


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="calls per timing at least (the median is kept)")
    parser.add_argument("--min-time", type=float, default=0.0,
                        help="seconds per timing at least: more calls than --repeats where they are short")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--directions", default="fwd,bwd")
    parser.add_argument("--set", default=",".join(SETS), help="comma-separated case sets: long, short, decode")
    parser.add_argument("--cases", default="",
                        help="comma-separated case numbers 1-%d of all sets (default: those of --set)" % len(CASES))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round: checks the script itself")
    parser.add_argument("--out", default="out/compare_torch_cpu")
    args = parser.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    directions = [d for d in args.directions.split(",") if d]
    sets = [x for x in args.set.split(",") if x]
    if not dtypes or set(dtypes) - set(DTYPES):
        raise SystemExit("--dtypes: expected a comma-separated subset of %s" % ",".join(DTYPES))
    if not directions or set(directions) - {"fwd", "bwd"}:
        raise SystemExit("--directions: expected fwd, bwd or fwd,bwd")
    if not sets or set(sets) - set(SETS):
        raise SystemExit("--set: expected a comma-separated subset of %s" % ",".join(SETS))
    if args.threads < 1 or args.rounds < 1 or args.repeats < 1 or args.warmup < 0 or args.min_time < 0:
        raise SystemExit("--threads, --rounds, --repeats: expected >= 1; --warmup, --min-time >= 0")
    cases = [c for c in CASES if c[0] in sets]
    if args.cases:
        try:
            cases = [CASES[int(i) - 1] for i in args.cases.split(",")]
        except (ValueError, IndexError):
            raise SystemExit("--cases: expected numbers from 1 to %d" % len(CASES))
    if args.smoke:
        cases, args.rounds, args.repeats, args.warmup = SMOKE_CASES, 1, 2, 1
    import_frameworks()
    torch.set_num_threads(args.threads)
    info = fmha.info()
    # The path itself is named by `fmha info`; FMHA_CPU_ISA forces one.
    print("fmha %s (FMHA_CPU_ISA=%s); torch %s; %d threads; %d rounds x median of %d calls or %.2f s" % (
        info["version"], os.environ.get("FMHA_CPU_ISA", "") or "auto", torch.__version__, args.threads, args.rounds,
        args.repeats, args.min_time))

    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "compare_torch_cpu.csv")
    rows = []
    with open(csv_path, "w", newline="") as csv_file:
        writer = csv.writer(csv_file)
        writer.writerow(["case", "dtype", "direction", "round", "provider", "threads", "ms", "gflops"])
        for case in cases:
            case_directions = [d for d in directions if d in case[-1]]
            if not case_directions:
                continue
            for dtype in dtypes:
                bench = Case(case, dtype, args.threads, seed=len(rows))
                seconds = {(p, d): [] for p in PROVIDERS for d in case_directions}
                for round_index in range(args.rounds):
                    for direction in case_directions:
                        for provider in PROVIDERS:
                            t = median_seconds(bench.call(provider, direction), args.warmup, args.repeats,
                                               args.min_time)
                            seconds[provider, direction].append(t)
                            writer.writerow([case[1], dtype, direction, round_index, provider, args.threads,
                                             "%.3f" % (t * 1e3), "%.1f" % (flops(case, direction) / t / 1e9)])
                            csv_file.flush()
                fwd_err, bwd_err = bench.agreement(case_directions)
                for direction in case_directions:
                    work = flops(case, direction)
                    gf = {p: [work / t / 1e9 for t in seconds[p, direction]] for p in PROVIDERS}
                    ms = {p: statistics.median(seconds[p, direction]) * 1e3 for p in PROVIDERS}
                    ratios = [b / a for a, b in zip(seconds["fmha", direction], seconds["torch", direction])]
                    rows.append((case[1], dtype, direction, gf, ms, ratios,
                                 fwd_err if direction == "fwd" else bwd_err, bench.torch_kv_note))
                    print_row(rows[-1])
    print("wrote", csv_path)


def import_frameworks():
    """torch and fmha, imported once the arguments are known (so that --help needs neither)."""
    global torch, F, SDPBackend, sdpa_kernel, fmha
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fmha


def print_row(row):
    name, dtype, direction, gf, ms, ratios, err, note = row
    span = lambda xs: "%6.1f (%5.1f-%5.1f)" % (statistics.median(xs), min(xs), max(xs))
    print("%-26s %-4s %-3s  fmha %s  torch %s GFLOP/s  (%.3f / %.3f ms)  fmha/torch %.2f (%.2f-%.2f)  rel_diff %.1e%s" % (
        name, dtype, direction, span(gf["fmha"]), span(gf["torch"]), ms["fmha"], ms["torch"],
        statistics.median(ratios), min(ratios), max(ratios), err, note))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
