"""fmha against PyTorch's SDPA backends, in one process: TFLOP/s, agreement, CSV and a plot.

Sweeps
  fa    bf16 and fp16; 16k tokens per batch (batch = 16384 / seqlen), hidden 2048 (heads = 2048 /
        head_dim); head_dim 64, 128, 256; seqlen 512 ... 16k; causal and not; forward and backward
  seed  batch 4, heads 4, seqlen 4096, head_dim 64; fp32, tf32, tf32x3 and bf16; forward and backward

Providers: fmha (backend --fmha-backend, default auto) and torch's SDPA through
torch.nn.attention.sdpa_kernel: flash (FlashAttention-2), cudnn, efficient (memory-efficient) and
math (only where its [B, H, S, S] scores fit in --math-limit-gb). A point a provider cannot run is
recorded as n/a.

Timing: CUDA events around each call, --warmup calls first, the median of --repeats, rotating
over --input-sets input sets (each larger than the L2 cache) so no call finds its inputs cached.
With --min-time S, a point's short calls repeat until about S seconds of them are timed (at most
--max-repeats), so that a call of 0.2 ms is the median of hundreds of samples, not of five.
Backward times the backward alone (the forward's results are computed beforehand).
FLOPs: forward 4·B·H·Sq·Sk·D, halved when causal; backward 2.5× the forward.

Agreement: fmha's output (and gradients) against the reference provider's (the first that ran of
math, efficient, flash, cudnn), as max |a - b| / max |b|.

    python bench/compare_torch.py --sweep fa --out out/compare
    python bench/compare_torch.py --sweep fa --dtypes bf16 --providers fmha,flash,cudnn
    python bench/compare_torch.py --sweep seed
    python bench/compare_torch.py --smoke --device cpu     # tiny sizes: checks the script itself
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
import fmha.torch as ft

TORCH_PROVIDERS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
REFERENCE_ORDER = ["math", "efficient", "flash", "cudnn"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32,
          "tf32x3": torch.float32}


def flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal, direction):
    forward = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    if causal:
        forward /= 2
    return forward * (2.5 if direction == "bwd" else 1.0)


def sweep_points(name):
    """(sweep, dtype, batch, heads, seqlen, head_dim, causal) for each point."""
    points = []
    if name == "fa":
        for dtype in ("bf16", "fp16"):
            for head_dim in (64, 128, 256):
                for causal in (False, True):
                    for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
                        points.append(("fa", dtype, 16384 // seqlen, 2048 // head_dim, seqlen, head_dim, causal))
    elif name == "seed":
        for dtype in ("fp32", "tf32", "tf32x3", "bf16"):
            points.append(("seed", dtype, 4, 4, 4096, 64, False))
    elif name == "smoke":
        for dtype in ("fp32", "bf16"):
            for causal in (False, True):
                for seqlen in (64, 128):
                    points.append(("smoke", dtype, 2, 2, seqlen, 32, causal))
    else:
        raise SystemExit("unknown sweep %r (fa, seed)" % name)
    return points


class Timer:
    def __init__(self, device, min_time=0.0, max_repeats=1000):
        self.cuda = device.type == "cuda"
        self.min_time = min_time
        self.max_repeats = max_repeats

    def once(self, fn, inputs):
        """Seconds of one fn(inputs), timed alone."""
        if self.cuda:
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(inputs)
            stop.record()
            torch.cuda.synchronize()
            return start.elapsed_time(stop) / 1e3
        start = time.perf_counter()
        fn(inputs)
        return time.perf_counter() - start

    def repeats_for(self, seconds_per_call, repeats):
        """repeats, raised (up to max_repeats) until the timed calls take about min_time seconds."""
        if self.min_time <= 0 or seconds_per_call <= 0:
            return repeats
        wanted = int(self.min_time / seconds_per_call + 0.5)
        return max(repeats, min(self.max_repeats, wanted))

    def time(self, fn, input_sets, warmup, repeats):
        """Median seconds of fn(inputs), rotating over the input sets."""
        for i in range(warmup):
            fn(input_sets[i % len(input_sets)])
        if self.min_time > 0:
            repeats = self.repeats_for(self.once(fn, input_sets[0]), repeats)
        samples = []
        if self.cuda:
            torch.cuda.synchronize()
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(repeats)]
            for i, (start, stop) in enumerate(events):
                inputs = input_sets[i % len(input_sets)]
                start.record()
                fn(inputs)
                stop.record()
            torch.cuda.synchronize()
            samples = [start.elapsed_time(stop) / 1e3 for start, stop in events]
        else:
            for i in range(repeats):
                inputs = input_sets[i % len(input_sets)]
                start = time.perf_counter()
                fn(inputs)
                samples.append(time.perf_counter() - start)
        return statistics.median(samples)


def make_inputs(count, batch, heads, seqlen, head_dim, dtype, device, seed):
    generator = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, seqlen, heads, head_dim)
    return [{name: torch.randn(shape, generator=generator, device=device, dtype=dtype)
             for name in ("q", "k", "v", "dout")} for _ in range(count)]


def rel_err(a, b):
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def run_torch(provider, inputs, causal, tf32):
    """SDPA on [B, S, H, D] inputs (transposed views to torch's [B, H, S, D])."""
    q, k, v = (inputs[n].transpose(1, 2) for n in ("q", "k", "v"))
    with sdpa_kernel(TORCH_PROVIDERS[provider]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2)


def provider_calls(provider, fmha_options, causal, tf32):
    """(forward(inputs) -> out, backward(inputs) -> (dq, dk, dv)) for one provider; backward reads
    what prepare_backward left in inputs["saved"]."""
    if provider == "fmha":
        def forward(inputs):
            return ft.attention(inputs["q"], inputs["k"], inputs["v"], **fmha_options)

        def backward(inputs):
            out, lse = inputs["saved"]
            return ft.attention_backward(inputs["q"], inputs["k"], inputs["v"], out, inputs["dout"], lse,
                                         **fmha_options)
    else:
        def forward(inputs):
            with torch.no_grad():
                return run_torch(provider, inputs, causal, tf32)

        def backward(inputs):
            out, leaves = inputs["saved"]
            return torch.autograd.grad(out, leaves, inputs["dout"], retain_graph=True)
    return forward, backward


def prepare_backward(provider, inputs, fmha_options, causal, tf32):
    if provider == "fmha":
        return ft.attention(inputs["q"], inputs["k"], inputs["v"], return_lse=True, **fmha_options)
    leaves = tuple(inputs[n].detach().requires_grad_() for n in ("q", "k", "v"))
    out = run_torch(provider, dict(zip(("q", "k", "v"), leaves)), causal, tf32)
    return out, leaves


def bench_point(point, args, device, timer):
    sweep, dtype_name, batch, heads, seqlen, head_dim, causal = point
    dtype = DTYPES[dtype_name]
    tf32 = dtype_name == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    # torch's is_causal is top-left aligned; with Sq == Sk both alignments agree. tf32x3: fmha's
    # split tf32 beside PyTorch in exact fp32, the accuracy it matches.
    precision = dtype_name if dtype_name in ("tf32", "tf32x3") else None
    fmha_options = dict(causal="top-left" if causal else None, precision=precision, backend=args.fmha_backend)
    sets = make_inputs(args.input_sets, batch, heads, seqlen, head_dim, dtype, device, seed=len(args.rows))
    results = {}  # provider -> {"fwd": s, "bwd": s, "out": tensor, "grads": tuple} or {"error": str}

    providers = ["fmha"] + [p for p in args.providers if p != "fmha"]
    for provider in providers:
        entry = {}
        results[provider] = entry
        if provider == "math":
            score_bytes = batch * heads * seqlen * seqlen * 4 * 3
            if score_bytes > args.math_limit_gb * 2**30:
                entry["error"] = "math: [B, H, S, S] scores need %.0f GiB" % (score_bytes / 2**30)
                continue
        forward, backward = provider_calls(provider, fmha_options, causal, tf32)
        # Forward: results for the agreement check, then the timing.
        try:
            if provider == "fmha":
                entry["backend"] = fmha.select_backend(sets[0]["q"], sets[0]["k"], sets[0]["v"], **fmha_options)
            entry["out"] = forward(sets[0])
            entry["fwd"] = timer.time(forward, sets, args.warmup, args.repeats)
        except (RuntimeError, ValueError, TypeError) as error:
            entry["error"] = "fwd: " + str(error).splitlines()[0][:110]
            continue
        if "bwd" not in args.directions:
            continue
        # Backward: each input set keeps what its backward needs (fmha: out and lse; torch: the
        # autograd graph), so only the backward itself is timed.
        try:
            if provider == "fmha":
                fmha.select_backend(sets[0]["q"], sets[0]["k"], sets[0]["v"], direction="backward",
                                    **fmha_options)
            for inputs in sets:
                inputs["saved"] = prepare_backward(provider, inputs, fmha_options, causal, tf32)
            entry["grads"] = backward(sets[0])
            entry["bwd"] = timer.time(backward, sets, args.warmup, args.repeats)
        except (RuntimeError, ValueError, TypeError) as error:
            entry["error"] = "bwd: " + str(error).splitlines()[0][:110]
        finally:
            for inputs in sets:
                inputs.pop("saved", None)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    reference = next((p for p in REFERENCE_ORDER if "out" in results.get(p, {})), None)
    rows = []
    for direction in [d for d in ("fwd", "bwd") if d in args.directions]:
        work = flops(batch, heads, seqlen, seqlen, head_dim, causal, direction)
        fmha_entry = results.get("fmha", {})
        for provider, entry in results.items():
            seconds = entry.get(direction)
            agreement = ""
            if provider == "fmha" and reference and "out" in entry:
                ref = results[reference]
                if direction == "fwd":
                    agreement = "%.2e" % rel_err(entry["out"], ref["out"])
                elif "grads" in entry and "grads" in ref:
                    agreement = "%.2e" % max(rel_err(a, b) for a, b in zip(entry["grads"], ref["grads"]))
            ratio = ""
            if provider != "fmha" and seconds and fmha_entry.get(direction):
                ratio = "%.2f" % (seconds / fmha_entry[direction])  # > 1: fmha is faster
            rows.append({
                "sweep": sweep, "dtype": dtype_name, "batch": batch, "heads": heads, "seqlen": seqlen,
                "head_dim": head_dim, "causal": int(causal), "direction": direction, "provider": provider,
                "fmha_backend": entry.get("backend", ""),
                "ms": "%.4f" % (seconds * 1e3) if seconds else "n/a",
                "tflops": "%.4g" % (work / seconds / 1e12) if seconds else "n/a",
                "speedup_of_fmha": ratio,
                "rel_err_vs_reference": agreement, "reference": reference or "",
                "note": entry.get("error", ""),
                "device": args.device_name,
            })
    return rows


ROW_FORMAT = "%-5s %-4s %5s %5s %6s %4s %3s %-14s %10s %8s %7s %9s %s"


def print_header():
    print(ROW_FORMAT % ("sweep", "type", "batch", "heads", "seqlen", "hdim", "cau", "provider/dir", "ms", "TFLOP/s",
                        "fmha_x", "rel_err", "note"))


def print_rows(rows):
    for r in rows:
        print(ROW_FORMAT % (r["sweep"], r["dtype"], r["batch"], r["heads"], r["seqlen"], r["head_dim"], r["causal"],
                            r["provider"] + "/" + r["direction"], r["ms"], r["tflops"], r["speedup_of_fmha"],
                            r["rel_err_vs_reference"], r["note"][:60]))
    sys.stdout.flush()


def read_rows(path):
    """Rows of an earlier run's CSV, with the numeric columns plot() groups by as ints."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for key in ("batch", "heads", "seqlen", "head_dim", "causal"):
            r[key] = int(r[key])
    return rows


def plot(rows, out_dir):
    """One PNG per (sweep, dtype, direction): a panel per head_dim × causal, grouped bars of
    TFLOP/s per seqlen, one bar per provider."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots")
        return []
    written = []
    groups = sorted({(r["sweep"], r["dtype"], r["direction"]) for r in rows})
    for sweep, dtype, direction in groups:
        sel = [r for r in rows if (r["sweep"], r["dtype"], r["direction"]) == (sweep, dtype, direction)]
        head_dims = sorted({r["head_dim"] for r in sel})
        causals = sorted({r["causal"] for r in sel})
        providers = [p for p in ["fmha"] + list(TORCH_PROVIDERS) if any(r["provider"] == p for r in sel)]
        fig, axes = plt.subplots(len(causals), len(head_dims), squeeze=False,
                                 figsize=(5.5 * len(head_dims), 3.8 * len(causals)))
        for row_index, causal in enumerate(causals):
            for col_index, head_dim in enumerate(head_dims):
                ax = axes[row_index][col_index]
                cell = [r for r in sel if r["causal"] == causal and r["head_dim"] == head_dim]
                seqlens = sorted({r["seqlen"] for r in cell})
                width = 0.8 / max(1, len(providers))
                for i, provider in enumerate(providers):
                    values = []
                    for s in seqlens:
                        match = [r for r in cell if r["provider"] == provider and r["seqlen"] == s]
                        values.append(float(match[0]["tflops"]) if match and match[0]["tflops"] != "n/a" else 0.0)
                    xs = [j + (i - (len(providers) - 1) / 2) * width for j in range(len(seqlens))]
                    bars = ax.bar(xs, values, width, label=provider)
                    for bar, value in zip(bars, values):
                        if value > 0:
                            ax.annotate("%.0f" % value if value >= 10 else "%.2g" % value,
                                        (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom",
                                        fontsize=6)
                ax.set_xticks(range(len(seqlens)))
                ax.set_xticklabels([("%dk" % (s // 1024)) if s >= 1024 else str(s) for s in seqlens])
                ax.set_xlabel("sequence length")
                ax.set_ylabel("TFLOP/s")
                ax.set_title("head dim %d, %s" % (head_dim, "causal" if causal else "not causal"), fontsize=10)
                ax.grid(axis="y", alpha=0.3)
        axes[0][0].legend(fontsize=8)
        device = sel[0].get("device") or "unknown device"
        fig.suptitle("Attention %s, %s, %s (%s sweep)" % ("forward" if direction == "fwd" else "backward",
                                                        dtype, device, sweep))
        fig.tight_layout()
        path = os.path.join(out_dir, "%s_%s_%s.png" % (sweep, dtype, direction))
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default="fa", choices=["fa", "seed", "all"])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, few repeats: checks the script itself")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--providers", default="fmha,flash,cudnn,efficient,math")
    parser.add_argument("--dtypes", default="", help="comma-separated subset of the sweep's dtypes (default: all)")
    parser.add_argument("--fmha-backend", default="auto")
    parser.add_argument("--directions", default="fwd,bwd", help="comma-separated: fwd, bwd or both")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--min-time", type=float, default=0.0,
                        help="seconds of timed calls per point and direction: short calls repeat more "
                             "than --repeats to fill them (default 0: --repeats alone)")
    parser.add_argument("--max-repeats", type=int, default=1000, help="the most repeats --min-time may ask for")
    parser.add_argument("--input-sets", type=int, default=3)
    parser.add_argument("--math-limit-gb", type=float, default=24.0)
    parser.add_argument("--out", default="out/compare_torch")
    parser.add_argument("--plot-only", metavar="CSV", help="draw the plots of an earlier run's CSV into --out")
    args = parser.parse_args()
    if args.min_time < 0 or args.max_repeats < 1 or args.repeats < 1:
        parser.error("--min-time must be >= 0, --repeats and --max-repeats >= 1")
    if args.plot_only:
        os.makedirs(args.out, exist_ok=True)
        for path in plot(read_rows(args.plot_only), args.out):
            print("wrote", path)
        return
    args.providers = args.providers.split(",")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device; use --device cpu (with --smoke)")
    if args.smoke:
        sweeps, args.warmup, args.repeats, args.input_sets = ["smoke"], 1, 3, 2
    else:
        sweeps = ["fa", "seed"] if args.sweep == "all" else [args.sweep]
    os.makedirs(args.out, exist_ok=True)
    args.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print("fmha %s, backends %s; torch %s; device %s" % (
        fmha.__version__, ",".join(fmha.info()["backends"]), torch.__version__, args.device_name))

    timer = Timer(device, args.min_time, args.max_repeats)
    args.rows = []
    csv_path = os.path.join(args.out, "compare_torch.csv")
    csv_file = open(csv_path, "w", newline="")
    writer = None
    print_header()
    args.directions = [d for d in args.directions.split(",") if d]
    if not args.directions or set(args.directions) - {"fwd", "bwd"}:
        raise SystemExit("--directions: expected fwd, bwd or fwd,bwd")
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = sorted(set(dtypes) - set(DTYPES))
    if unknown:
        raise SystemExit("--dtypes: unknown %s (choose from %s)" % (",".join(unknown), ",".join(DTYPES)))
    for sweep in sweeps:
        for point in sweep_points(sweep):
            if dtypes and point[1] not in dtypes:
                continue
            rows = bench_point(point, args, device, timer)
            print_rows(rows)
            args.rows.extend(rows)
            # Each point is written as it completes, so an interrupted sweep keeps what it measured.
            if writer is None:
                writer = csv.DictWriter(csv_file, fieldnames=list(rows[0].keys()))
                writer.writeheader()
            writer.writerows(rows)
            csv_file.flush()
    csv_file.close()
    print("wrote", csv_path)
    print("fmha_x: the provider's time over fmha's (> 1: fmha is faster); rel_err: fmha against the reference "
          "provider, max |a - b| / max |b|")
    for path in plot(args.rows, args.out):
        print("wrote", path)


if __name__ == "__main__":
    main()
