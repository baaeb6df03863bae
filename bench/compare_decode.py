"""fmha's decode calls beside PyTorch's SDPA backends, in one process: TB/s, the same run's device
copy, agreement, CSV.

Cases (--cases, default all): bf16, one query token, 32 query heads over 8 KV heads, head dim 128,
batch × KV length 1 × 8k, 1 × 128k, 16 × 8k, 16 × 32k, 64 × 8k. Bandwidth counts the bytes of Q, K,
V and O once (K and V of the 8 KV heads, not of the 32 query heads that read them).

Providers:
  fmha         fmha.torch.attention_with_kvcache on a contiguous cache [B, S, Hkv, D] (fmha's
               layout: one key row holds every KV head)
  fmha-bhsd    the same call on a cache laid out [B, Hkv, S, D] in memory (PyTorch's layout),
               passed as the strided view [B, S, Hkv, D]
  fmha-paged   pages [num_pages, --page-size, Hkv, D] in shuffled order through a block table
  flash, cudnn, efficient, math
               torch's SDPA (torch.nn.attention.sdpa_kernel) on q [B, H, 1, D] and k, v [B, Hkv,
               S, D] with enable_gqa=True; a backend that refuses the call is recorded as n/a with
               its reason

Timing: each provider's calls, rotating over input sets (together larger than the L2 cache, so no
call finds its K/V cached), are captured in one CUDA graph; the graph is replayed --repeats times
between CUDA events and the median replay divided by the calls in it, so the host's launch cost is
not timed (a provider whose calls cannot be captured is timed the same way without the graph, and
the note says so). fmha's calls are given their workspace up front by the custom op and allocate
nothing in the graph. Copy: torch's device-to-device copy of a --copy-gib GiB buffer, read plus
written bytes over time, the median of the same repeats.

Agreement: each fmha provider's output against the first torch provider that ran, max |a - b| /
max |b|.

    python bench/compare_decode.py --out out/compare_decode
    python bench/compare_decode.py --cases 16x8192,16x32768 --providers fmha,fmha-paged,cudnn
    python bench/compare_decode.py --smoke --device cpu     # tiny sizes: checks the script itself
"""

import argparse
import csv
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import TORCH_PROVIDERS, rel_err  # noqa: E402

import fmha  # noqa: E402
import fmha.torch as ft  # noqa: E402

FMHA_PROVIDERS = ("fmha", "fmha-bhsd", "fmha-paged")
CASES = ((1, 8192), (1, 131072), (16, 8192), (16, 32768), (64, 8192))
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
L2_BYTES = 64 << 20  # above the L2 cache of every GPU this compares on (H100 50 MiB, H200 60 MiB)


def case_bytes(batch, heads, kv_heads, seqlen_k, head_dim, element):
    """Q and O once per query head, K and V once per KV head."""
    return element * batch * head_dim * (2 * heads + 2 * kv_heads * seqlen_k)


class InputSet:
    """One set of inputs in PyTorch's layout (q [B, H, 1, D], k, v [B, Hkv, S, D]); each fmha
    layout is made from it when its provider runs (make_layout) and dropped afterwards."""

    def __init__(self, batch, seqlen_k, heads, kv_heads, head_dim, dtype, device, generator):
        self.q = torch.randn(batch, heads, 1, head_dim, generator=generator, device=device, dtype=dtype)
        self.k = torch.randn(batch, kv_heads, seqlen_k, head_dim, generator=generator, device=device, dtype=dtype)
        self.v = torch.randn(batch, kv_heads, seqlen_k, head_dim, generator=generator, device=device, dtype=dtype)
        self.seqlens = torch.full((batch,), seqlen_k, dtype=torch.int32, device=device)


def make_layout(provider, inputs, page_size, generator):
    """The (q, k_cache, v_cache, block_table) of an fmha provider, from an input set."""
    q = inputs.q.transpose(1, 2)  # [B, 1, H, D], a view
    if provider == "fmha-bhsd":
        return q, inputs.k.transpose(1, 2), inputs.v.transpose(1, 2), None
    k = inputs.k.transpose(1, 2).contiguous()  # [B, S, Hkv, D]
    v = inputs.v.transpose(1, 2).contiguous()
    if provider == "fmha":
        return q, k, v, None
    batch, seqlen_k = k.shape[0], k.shape[1]
    if seqlen_k % page_size:
        raise ValueError("--page-size %d does not divide the KV length %d" % (page_size, seqlen_k))
    per_seq = seqlen_k // page_size
    # Page i of sequence b goes to pool slot order[b · per_seq + i]: pages in shuffled order.
    order = torch.randperm(batch * per_seq, generator=generator, device="cpu").to(k.device)
    pool_k = torch.empty((batch * per_seq, page_size) + tuple(k.shape[2:]), dtype=k.dtype, device=k.device)
    pool_v = torch.empty_like(pool_k)
    pool_k[order] = k.reshape(pool_k.shape)
    pool_v[order] = v.reshape(pool_v.shape)
    table = order.to(torch.int32).reshape(batch, per_seq).contiguous()
    return q, pool_k, pool_v, table


def provider_call(provider, layouts, inputs_list):
    """fn(i) -> out of call i (on input set i)."""
    if provider in FMHA_PROVIDERS:
        def call(i):
            q, k, v, table = layouts[i]
            return ft.attention_with_kvcache(q, k, v, table, inputs_list[i].seqlens)
        return call
    backend = TORCH_PROVIDERS[provider]

    def call(i):
        x = inputs_list[i]
        with sdpa_kernel(backend), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a backend's refusal is recorded from its error
            return F.scaled_dot_product_attention(x.q, x.k, x.v, enable_gqa=True).transpose(1, 2)
    return call


def time_calls(call, count, device, warmup, repeats, calls_per_graph):
    """(seconds per call, note): a CUDA graph of calls_per_graph calls rotating over the `count`
    input sets, replayed `repeats` times; eager calls where capture fails or on the CPU."""
    for i in range(warmup):
        call(i % count)
    if device.type != "cuda":
        samples = []
        for r in range(repeats):
            start = time.perf_counter()
            call(r % count)
            samples.append(time.perf_counter() - start)
        return statistics.median(samples), ""
    torch.cuda.synchronize()
    note = ""
    try:
        graph = torch.cuda.CUDAGraph()
        capture_stream = torch.cuda.Stream()
        capture_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(capture_stream):
            call(0)  # outside the graph: anything lazily set up on first use, on this stream
        torch.cuda.current_stream().wait_stream(capture_stream)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            for i in range(calls_per_graph):
                call(i % count)
        run = graph.replay
    except RuntimeError as error:
        note = "eager (no graph: %s)" % str(error).splitlines()[0][:60]
        torch.cuda.synchronize()

        def run():
            for i in range(calls_per_graph):
                call(i % count)
    run()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, stop in events:
        start.record()
        run()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) / 1e3 for start, stop in events) / calls_per_graph, note


def copy_bandwidth(device, gib, repeats):
    """Bytes read plus written per second by torch's device-to-device copy (median)."""
    if device.type != "cuda":
        return None
    src = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, stop in events:
        start.record()
        dst.copy_(src)
        stop.record()
    torch.cuda.synchronize()
    seconds = statistics.median(start.elapsed_time(stop) / 1e3 for start, stop in events)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * gib * 2**30 / seconds


def bench_case(case, args, device, copy_bytes_per_s):
    batch, seqlen_k = case
    dtype = torch.bfloat16
    element = 2
    size = case_bytes(batch, args.heads, args.kv_heads, seqlen_k, args.head_dim, element)
    # Enough input sets that one round of them exceeds the L2 cache (at least two).
    count = max(2, -(-L2_BYTES * 2 // size)) if device.type == "cuda" else 2
    generator = torch.Generator(device=device).manual_seed(1000 * batch + seqlen_k)
    sets = [InputSet(batch, seqlen_k, args.heads, args.kv_heads, args.head_dim, dtype, device, generator)
            for _ in range(count)]
    calls_per_graph = max(count, min(64, -(-args.graph_bytes // size)))
    results = {}
    for provider in args.providers:
        entry = {}
        results[provider] = entry
        layouts = None
        try:
            if provider in FMHA_PROVIDERS:
                page_generator = torch.Generator().manual_seed(seqlen_k)
                layouts = [make_layout(provider, x, args.page_size, page_generator) for x in sets]
            call = provider_call(provider, layouts, sets)
            entry["out"] = call(0).clone()
            entry["seconds"], entry["note"] = time_calls(call, count, device, args.warmup, args.repeats,
                                                         calls_per_graph)
        except (RuntimeError, ValueError, TypeError) as error:
            entry["error"] = str(error).splitlines()[0][:110]
        finally:
            del layouts
            if device.type == "cuda":
                torch.cuda.empty_cache()
    reference = next((p for p in args.providers if p in TORCH_PROVIDERS and "out" in results[p]), None)
    fmha_seconds = results.get("fmha", {}).get("seconds")
    rows = []
    for provider, entry in results.items():
        seconds = entry.get("seconds")
        agreement = ""
        if provider in FMHA_PROVIDERS and reference and "out" in entry:
            agreement = "%.2e" % rel_err(entry["out"], results[reference]["out"])
        rate = size / seconds if seconds else None
        rows.append({
            "batch": batch, "seqlen_k": seqlen_k, "heads": args.heads, "kv_heads": args.kv_heads,
            "head_dim": args.head_dim, "dtype": "bf16", "provider": provider,
            "us": "%.2f" % (seconds * 1e6) if seconds else "n/a",
            "tb_per_s": "%.3f" % (rate / 1e12) if rate else "n/a",
            "of_copy": "%.2f" % (rate / copy_bytes_per_s) if rate and copy_bytes_per_s else "",
            "speedup_of_fmha": "%.2f" % (seconds / fmha_seconds) if seconds and fmha_seconds and provider != "fmha"
            else "",
            "rel_err_vs_reference": agreement, "reference": reference or "",
            "copy_tb_per_s": "%.3f" % (copy_bytes_per_s / 1e12) if copy_bytes_per_s else "",
            "note": entry.get("error", entry.get("note", "")),
            "device": args.device_name,
        })
    return rows


ROW_FORMAT = "%5s %7s %-11s %10s %8s %7s %7s %9s %s"


def print_rows(rows):
    for r in rows:
        print(ROW_FORMAT % (r["batch"], r["seqlen_k"], r["provider"], r["us"], r["tb_per_s"], r["of_copy"],
                            r["speedup_of_fmha"], r["rel_err_vs_reference"], r["note"][:70]))
    sys.stdout.flush()


def parse_cases(text):
    cases = []
    for item in (c for c in text.split(",") if c):
        try:
            batch, seqlen_k = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise SystemExit("--cases: expected BATCHxKV_LENGTH items such as 16x8192, got %r" % item)
        if batch < 1 or seqlen_k < 1:
            raise SystemExit("--cases: batch and KV length must be positive, got %r" % item)
        cases.append((batch, seqlen_k))
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join("%dx%d" % c for c in CASES),
                        help="comma-separated BATCHxKV_LENGTH (default: the five of the docstring)")
    parser.add_argument("--providers", default="fmha,fmha-bhsd,fmha-paged,flash,cudnn,efficient")
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, few repeats: checks the script itself")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--graph-bytes", type=int, default=1 << 30,
                        help="calls per graph: enough that their bytes reach this (at most 64)")
    parser.add_argument("--copy-gib", type=float, default=2.0)
    parser.add_argument("--out", default="out/compare_decode")
    args = parser.parse_args()
    args.providers = [p for p in args.providers.split(",") if p]
    unknown = sorted(set(args.providers) - set(FMHA_PROVIDERS) - set(TORCH_PROVIDERS))
    if unknown:
        raise SystemExit("--providers: unknown %s (choose from %s)" % (
            ",".join(unknown), ",".join(FMHA_PROVIDERS + tuple(TORCH_PROVIDERS))))
    if args.page_size < 1:
        raise SystemExit("--page-size must be positive")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device; use --device cpu (with --smoke)")
    args.heads, args.kv_heads, args.head_dim = HEADS, KV_HEADS, HEAD_DIM
    cases = parse_cases(args.cases)
    if args.smoke:
        cases, args.page_size, args.warmup, args.repeats = [(2, 256), (1, 512)], 16, 1, 3
        args.heads, args.kv_heads, args.head_dim = 8, 2, 64
    os.makedirs(args.out, exist_ok=True)
    args.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print("fmha %s; torch %s; device %s" % (fmha.__version__, torch.__version__, args.device_name))
    copy_rate = copy_bandwidth(device, args.copy_gib, args.repeats)
    if copy_rate:
        print("device copy: %.3f TB/s (%.1f GiB read and written)" % (copy_rate / 1e12, args.copy_gib))
    print(ROW_FORMAT % ("batch", "kv_len", "provider", "us", "TB/s", "of_copy", "fmha_x", "rel_err", "note"))
    csv_path = os.path.join(args.out, "compare_decode.csv")
    with open(csv_path, "w", newline="") as f:
        writer = None
        for case in cases:
            rows = bench_case(case, args, device, copy_rate)
            print_rows(rows)
            if writer is None:
                writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
                writer.writeheader()
            writer.writerows(rows)
            f.flush()
    print("wrote", csv_path)
    print("TB/s: Q, K, V and O bytes once over the time of one call; of_copy: that over the device copy's; "
          "fmha_x: the provider's time over fmha's (> 1: fmha is faster)")


if __name__ == "__main__":
    main()
