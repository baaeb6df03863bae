"""Per-call overhead of fmha's Python entry points above the C++ call itself.

On a tiny CPU problem, times (wall clock; the median and the best of many calls — the best is the
figure least disturbed by other load on the machine):
  raw C++       fmha::forward alone, timed inside the extension (fmha._C.time_forward)
  _C.forward    the binding: DLPack import of five NumPy arrays, options, the call
  numpy         fmha.attention on NumPy arrays (allocation of out and lse included)
  torch op      torch.ops.fmha.attention_fwd on CPU tensors (dispatcher, allocation)
  torch         fmha.torch.attention, no grad
  torch+grad    fmha.torch.attention with inputs that require grad (autograd recording)
and prints each one's overhead: its time minus the raw C++ time.

    python bench/python_overhead.py [--iterations 20000] [--threads 1]
"""

import argparse
import statistics
import time

import numpy as np

import fmha
from fmha import _C


def call_seconds(fn, iterations):
    """(median, minimum) seconds per call over batches of 10 calls."""
    for _ in range(min(1000, iterations)):
        fn()
    samples = []
    clock = time.perf_counter
    # Batches of 10 calls keep the clock's own cost out of the per-call figure.
    for _ in range(iterations // 10):
        start = clock()
        fn(); fn(); fn(); fn(); fn(); fn(); fn(); fn(); fn(); fn()  # noqa: E702
        samples.append((clock() - start) / 10)
    return statistics.median(samples), min(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per call (1 keeps thread start-up out of the timings)")
    parser.add_argument("--shape", default="1,4,4,2,2,16,16",
                        help="batch,seqlen_q,seqlen_k,heads,kv_heads,head_dim,head_dim_v")
    args = parser.parse_args()
    batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, head_dim_v = map(int, args.shape.split(","))

    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, seqlen_q, heads, head_dim), dtype=np.float32)
    k = rng.standard_normal((batch, seqlen_k, kv_heads, head_dim), dtype=np.float32)
    v = rng.standard_normal((batch, seqlen_k, kv_heads, head_dim_v), dtype=np.float32)
    out = np.empty((batch, seqlen_q, heads, head_dim_v), dtype=np.float32)
    lse = np.empty((batch, heads, seqlen_q), dtype=np.float32)
    options = _C.Options()
    options.causal = 2
    options.num_threads = args.threads

    raw_samples = _C.time_forward(q, k, v, out, lse, options, args.iterations)
    raw = (statistics.median(raw_samples), min(raw_samples))
    rows = [("raw C++ (fmha::forward)", raw)]
    rows.append(("_C.forward (numpy)", call_seconds(
        lambda: _C.forward(q, k, v, out, lse, None, options), args.iterations)))
    rows.append(("fmha.attention (numpy)", call_seconds(
        lambda: fmha.attention(q, k, v, causal="bottom-right", num_threads=args.threads, return_lse=True),
        args.iterations)))

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        import fmha.torch as ft

        # fmha.torch runs CPU calls with torch.get_num_threads() threads.
        torch.set_num_threads(args.threads)
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        op = torch.ops.fmha.attention_fwd
        rows.append(("torch.ops.fmha.attention_fwd", call_seconds(
            lambda: op(tq, tk, tv, 0.0, 2, -1, -1, 0, 0, False, "auto"), args.iterations)))
        rows.append(("fmha.torch.attention", call_seconds(
            lambda: ft.attention(tq, tk, tv, causal="bottom-right"), args.iterations)))
        gq, gk, gv = (x.clone().requires_grad_() for x in (tq, tk, tv))
        rows.append(("fmha.torch.attention (grad)", call_seconds(
            lambda: ft.attention(gq, gk, gv, causal="bottom-right"), args.iterations)))

    print("shape %s fp32 CPU, %d thread(s), %d calls; median and best (minimum) per call"
          % (args.shape, args.threads, args.iterations))
    print("%-32s %9s %9s %14s %12s" % ("entry point", "median us", "best us", "overhead med", "overhead best"))
    for name, (median, best) in rows:
        print("%-32s %9.2f %9.2f %14.2f %12.2f"
              % (name, median * 1e6, best * 1e6, (median - raw[0]) * 1e6, (best - raw[1]) * 1e6))

if __name__ == "__main__":
    main()
