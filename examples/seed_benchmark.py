"""The seed shape — batch 4, heads 4, seqlen 4096, head_dim 64 — forward and backward in fp32,
tf32 and bf16, timed and printed as a table.

On a GPU (PyTorch with CUDA, fmha built with CUDA): CUDA events, warm-up, median of repeats.
Otherwise on the CPU with NumPy (bf16 through ml_dtypes): wall time, fewer repeats.
A mode no backend supports is printed as n/a.

    python examples/seed_benchmark.py [--device cpu|cuda] [--repeats N] [--seqlen S]
"""

import argparse
import statistics
import time

import numpy as np

import fmha

MODES = [("fp32", "float32", None), ("tf32", "float32", "tf32"), ("bf16", "bfloat16", None)]


def forward_flops(batch, heads, seqlen, head_dim):
    return 4.0 * batch * heads * seqlen * seqlen * head_dim


def gpu_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and fmha.info()["cuda"]


def make_inputs(shape, dtype_name, device):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape, dtype=np.float32) for _ in range(4)]  # q, k, v, dout
    if device == "cuda":
        import torch

        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
        return [torch.from_numpy(a).to("cuda", dtype) for a in arrays]
    if dtype_name == "bfloat16":
        import ml_dtypes  # NumPy has no bfloat16 of its own

        return [a.astype(ml_dtypes.bfloat16) for a in arrays]
    return arrays


def time_calls(fn, device, warmup, repeats):
    for _ in range(warmup):
        fn()
    if device == "cuda":
        import torch

        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        torch.cuda.synchronize()
        for start, stop in events:
            start.record()
            fn()
            stop.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(stop) / 1e3 for start, stop in events)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if gpu_available() else "cpu")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=None, help="default: 5 on a GPU, 1 on the CPU")
    parser.add_argument("--repeats", type=int, default=None, help="default: 20 on a GPU, 3 on the CPU")
    args = parser.parse_args()
    warmup = args.warmup if args.warmup is not None else (5 if args.device == "cuda" else 1)
    repeats = args.repeats if args.repeats is not None else (20 if args.device == "cuda" else 3)
    shape = (args.batch, args.seqlen, args.heads, args.head_dim)
    flops = forward_flops(args.batch, args.heads, args.seqlen, args.head_dim)

    print("fmha %s on %s: batch %d, heads %d, seqlen %d, head_dim %d (%s, median of %d)" % (
        fmha.__version__, args.device, args.batch, args.heads, args.seqlen, args.head_dim,
        "CUDA events" if args.device == "cuda" else "wall time", repeats))
    print("%-5s %-9s %-10s %10s %9s" % ("mode", "direction", "backend", "ms", "TFLOP/s"))
    for mode, dtype_name, precision in MODES:
        try:
            q, k, v, dout = make_inputs(shape, dtype_name, args.device)
        except ImportError as error:
            for direction in ("forward", "backward"):
                print("%-5s %-9s %-10s %10s %9s  (%s)" % (mode, direction, "n/a", "n/a", "n/a", error))
            continue
        options = dict(precision=precision)
        state = {}

        def forward():
            state["out"], state["lse"] = fmha.attention(q, k, v, return_lse=True, **options)

        def backward():
            fmha.attention_backward(q, k, v, state["out"], dout, state["lse"], **options)

        for direction, fn, work in (("forward", forward, flops), ("backward", backward, 2.5 * flops)):
            try:
                backend = fmha.select_backend(q, k, v, direction=direction, **options)
                if "out" not in state:
                    forward()
                seconds = time_calls(fn, args.device, warmup, repeats)
            except (ValueError, RuntimeError) as error:
                print("%-5s %-9s %-10s %10s %9s  (%s)" % (mode, direction, "n/a", "n/a", "n/a", str(error)[:80]))
                continue
            print("%-5s %-9s %-10s %10.3f %9.3f" % (mode, direction, backend, seconds * 1e3, work / seconds / 1e12))


if __name__ == "__main__":
    main()
