"""fmha's `cpu` backend beside PyTorch's CPU SDPA (its flash-attention CPU kernel), in one process.

Both run on the same number of threads (--threads: fmha's num_threads and torch.set_num_threads).
Each (case, dtype, direction) times fmha and torch alternately, --rounds times, each time the
median of --repeats calls after --warmup calls; a round runs every provider once, so a busy or a
quiet minute of a shared machine falls on both alike. The table gives the median GFLOP/s over the
rounds with the range, and the ratio fmha / torch per round (> 1: fmha is faster).

Cases (the issue's): B4 H4 S4096 D64; B2 H8 S2048 D128 causal; B1 H32 S1024 D128; fp32 and bf16;
forward and backward. FLOPs by FlashAttention's convention: forward 4·B·H·Sq·Sk·D, halved when
causal; backward 2.5x the forward. The backward is timed alone (fmha: from the forward's out and
LSE; torch: autograd.grad through a kept graph).

Agreement: max |fmha - torch| / max |torch| of the output and of each gradient, once per case.

    python bench/compare_torch_cpu.py --threads 2 --rounds 3 --out out/compare_cpu
    python bench/compare_torch_cpu.py --smoke      # tiny sizes: checks the script itself
"""

import argparse
import csv
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# (name, batch, heads, seqlen, head_dim, causal)
CASES = [
    ("B4 H4 S4096 D64", 4, 4, 4096, 64, False),
    ("B2 H8 S2048 D128 causal", 2, 8, 2048, 128, True),
    ("B1 H32 S1024 D128", 1, 32, 1024, 128, False),
]
SMOKE_CASES = [("B2 H2 S128 D64 causal", 2, 2, 128, 64, True), ("B1 H4 S192 D128", 1, 4, 192, 128, False)]
PROVIDERS = ("fmha", "torch")


def flops(batch, heads, seqlen, head_dim, causal, direction):
    forward = 4.0 * batch * heads * seqlen * seqlen * head_dim
    if causal:
        forward /= 2
    return forward * (2.5 if direction == "bwd" else 1.0)


def median_seconds(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
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
        self.name, batch, heads, seqlen, head_dim, self.causal = case
        generator = torch.Generator().manual_seed(seed)
        shape = (batch, seqlen, heads, head_dim)
        self.q, self.k, self.v, self.dout = (torch.randn(shape, generator=generator, dtype=DTYPES[dtype])
                                             for _ in range(4))
        self.options = dict(causal="top-left" if self.causal else None, backend="cpu", num_threads=threads)
        self.out, self.lse = fmha.attention(self.q, self.k, self.v, return_lse=True, **self.options)
        # torch's graph for its backward, kept across calls (retain_graph).
        self.leaves = tuple(x.detach().transpose(1, 2).requires_grad_() for x in (self.q, self.k, self.v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            self.torch_out = F.scaled_dot_product_attention(*self.leaves, is_causal=self.causal)
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
                    return F.scaled_dot_product_attention(*(x.detach() for x in self.leaves), is_causal=self.causal)
            return forward
        return lambda: torch.autograd.grad(self.torch_out, self.leaves, self.torch_dout, retain_graph=True)

    def agreement(self):
        """max rel. difference fmha vs torch: output, then the worst of dq, dk, dv."""
        fwd = rel_err(self.out, self.torch_out.detach().transpose(1, 2))
        ours = self.call("fmha", "bwd")()
        theirs = self.call("torch", "bwd")()
        bwd = max(rel_err(a, b.transpose(1, 2)) for a, b in zip(ours, theirs))
        return fwd, bwd


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="calls per timing (the median is kept)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--directions", default="fwd,bwd")
    parser.add_argument("--cases", default="", help="comma-separated case numbers 1-3 (default: all)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round: checks the script itself")
    parser.add_argument("--out", default="out/compare_torch_cpu")
    args = parser.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    directions = [d for d in args.directions.split(",") if d]
    if not dtypes or set(dtypes) - set(DTYPES):
        raise SystemExit("--dtypes: expected a comma-separated subset of %s" % ",".join(DTYPES))
    if not directions or set(directions) - {"fwd", "bwd"}:
        raise SystemExit("--directions: expected fwd, bwd or fwd,bwd")
    if args.threads < 1 or args.rounds < 1 or args.repeats < 1 or args.warmup < 0:
        raise SystemExit("--threads, --rounds, --repeats: expected >= 1; --warmup >= 0")
    cases = CASES
    if args.cases:
        try:
            cases = [CASES[int(i) - 1] for i in args.cases.split(",")]
        except (ValueError, IndexError):
            raise SystemExit("--cases: expected numbers from 1 to %d" % len(CASES))
    if args.smoke:
        cases, args.rounds, args.repeats, args.warmup = SMOKE_CASES, 1, 2, 1
    torch.set_num_threads(args.threads)
    info = fmha.info()
    # The path itself is named by `fmha info`; FMHA_CPU_ISA forces one.
    print("fmha %s (FMHA_CPU_ISA=%s); torch %s; %d threads; %d rounds x median of %d" % (
        info["version"], os.environ.get("FMHA_CPU_ISA", "") or "auto", torch.__version__, args.threads, args.rounds,
        args.repeats))

    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "compare_torch_cpu.csv")
    rows = []
    with open(csv_path, "w", newline="") as csv_file:
        writer = csv.writer(csv_file)
        writer.writerow(["case", "dtype", "direction", "round", "provider", "threads", "ms", "gflops"])
        for case in cases:
            for dtype in dtypes:
                bench = Case(case, dtype, args.threads, seed=len(rows))
                seconds = {(p, d): [] for p in PROVIDERS for d in directions}
                for round_index in range(args.rounds):
                    for direction in directions:
                        for provider in PROVIDERS:
                            t = median_seconds(bench.call(provider, direction), args.warmup, args.repeats)
                            seconds[provider, direction].append(t)
                            work = flops(*case[1:], direction)
                            writer.writerow([case[0], dtype, direction, round_index, provider, args.threads,
                                             "%.3f" % (t * 1e3), "%.1f" % (work / t / 1e9)])
                            csv_file.flush()
                fwd_err, bwd_err = bench.agreement()
                for direction in directions:
                    work = flops(*case[1:], direction)
                    gf = {p: [work / t / 1e9 for t in seconds[p, direction]] for p in PROVIDERS}
                    ratios = [b / a for a, b in zip(seconds["fmha", direction], seconds["torch", direction])]
                    rows.append((case[0], dtype, direction, gf, ratios, fwd_err if direction == "fwd" else bwd_err))
                    print_row(rows[-1])
    print("wrote", csv_path)


def print_row(row):
    name, dtype, direction, gf, ratios, err = row
    span = lambda xs: "%6.0f (%4.0f-%4.0f)" % (statistics.median(xs), min(xs), max(xs))
    print("%-24s %-4s %-3s  fmha %s  torch %s GFLOP/s  fmha/torch %.2f (%.2f-%.2f)  rel_diff %.1e" % (
        name, dtype, direction, span(gf["fmha"]), span(gf["torch"]), statistics.median(ratios), min(ratios),
        max(ratios), err))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
