"""fmha's packed (variable-length) attention beside PyTorch's SDPA on the padded equivalent, in one
process: TFLOP/s counting only real work, and CSV.

The batch: --sequences sequences with lengths drawn log-uniformly from --min-length to --max-length
(fixed --seed, so every run and machine gets the same lengths), --heads heads of --head-dim, causal
(each sequence attends within itself; queries and keys of a sequence are equally long, so
PyTorch's top-left causal mask and fmha's bottom-right one agree). Providers:

  fmha         fmha.torch.attention_varlen on the packed [total, H, D] tensors
  fmha-dense   fmha.torch.attention on the dense batch of the same count at the mean length
               (what the packed throughput is measured against)
  flash, cudnn, efficient
               torch's SDPA (torch.nn.attention.sdpa_kernel) on the batch padded to the longest
               sequence, [B, max, H, D]

Work is that of the real tokens for every provider but fmha-dense (its own batch): forward
4·H·D·sum(L²)/2, backward 2.5× that. Backward is timed alone, through autograd on a kept graph
(fmha too). Agreement: fmha's packed output against the first torch provider's on the real rows,
max |a - b| / max |b|.

    python bench/compare_varlen.py --out out/compare_varlen
    python bench/compare_varlen.py --smoke --device cpu     # tiny sizes: checks the script itself
"""

import argparse
import csv
import math
import os
import random
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import Timer  # noqa: E402

import fmha.torch as ft  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TORCH_PROVIDERS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def lengths_of(count, shortest, longest, seed):
    rng = random.Random(seed)
    return [int(math.exp(rng.uniform(math.log(shortest), math.log(longest)))) for _ in range(count)]


def real_flops(lengths, heads, head_dim, direction):
    forward = 4.0 * heads * head_dim * sum(n * n for n in lengths) / 2  # causal
    return forward * (2.5 if direction == "bwd" else 1.0)


class Batch:
    """One set of inputs: packed tensors with their tables, and the same values padded."""

    def __init__(self, lengths, heads, head_dim, dtype, device, generator):
        self.lengths = lengths
        total, longest = sum(lengths), max(lengths)
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        self.cu = torch.tensor(offsets, dtype=torch.int32, device=device)
        self.longest = longest
        self.packed = {name: torch.randn((total, heads, head_dim), generator=generator, device=device, dtype=dtype)
                       for name in ("q", "k", "v", "dout")}
        self.padded = {}
        for name, t in self.packed.items():
            p = torch.zeros((len(lengths), longest, heads, head_dim), device=device, dtype=dtype)
            for b, n in enumerate(lengths):
                p[b, :n] = t[offsets[b]:offsets[b] + n]
            self.padded[name] = p
        self.offsets = offsets

    def real_rows(self, padded_out):
        """The padded output's rows of real tokens, packed."""
        return torch.cat([padded_out[b, :n] for b, n in enumerate(self.lengths)])


def provider_fns(provider):
    """(run(inputs) -> out, inputs factory) where inputs are the leaves a call reads."""
    if provider == "fmha":
        def run(x):
            return ft.attention_varlen(x["q"], x["k"], x["v"], x["cu"], x["cu"], x["longest"], x["longest"],
                                       causal="bottom-right")
    elif provider == "fmha-dense":
        def run(x):
            return ft.attention(x["q"], x["k"], x["v"], causal="bottom-right")
    else:
        backend = TORCH_PROVIDERS[provider]

        def run(x):
            q, k, v = (x[n].transpose(1, 2) for n in ("q", "k", "v"))
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    return run


def inputs_for(provider, batch, dense):
    if provider == "fmha":
        x = dict(batch.packed)
        x.update(cu=batch.cu, longest=batch.longest)
        return x
    if provider == "fmha-dense":
        return dict(dense)
    return dict(batch.padded)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--min-length", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--providers", default="fmha,fmha-dense,flash,cudnn")
    parser.add_argument("--directions", default="fwd,bwd")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--input-sets", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script itself")
    parser.add_argument("--out", default="out/compare_varlen")
    args = parser.parse_args()
    if args.smoke:
        args.sequences, args.min_length, args.max_length, args.heads, args.head_dim = 5, 3, 70, 2, 32
        args.warmup, args.repeats, args.input_sets = 1, 2, 1
        if args.device == "cpu":
            args.providers = "fmha,fmha-dense,math"  # the fused SDPA kernels are CUDA's
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device; use --device cpu (with --smoke)")
    providers = [p for p in args.providers.split(",") if p]
    unknown = sorted(set(providers) - {"fmha", "fmha-dense"} - set(TORCH_PROVIDERS))
    if unknown:
        raise SystemExit("--providers: unknown %s" % ",".join(unknown))
    directions = [d for d in args.directions.split(",") if d]
    if not directions or set(directions) - {"fwd", "bwd"}:
        raise SystemExit("--directions: expected fwd, bwd or fwd,bwd")

    dtype = DTYPES[args.dtype]
    lengths = lengths_of(args.sequences, args.min_length, args.max_length, args.seed)
    mean = sum(lengths) // len(lengths)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    batches = [Batch(lengths, args.heads, args.head_dim, dtype, device, generator) for _ in range(args.input_sets)]
    dense_sets = [{name: torch.randn((len(lengths), mean, args.heads, args.head_dim), generator=generator,
                                     device=device, dtype=dtype) for name in ("q", "k", "v", "dout")}
                  for _ in range(args.input_sets)]
    print("fmha packed beside torch %s on the padded batch; %s; %d sequences, %d tokens (mean %d, longest %d), "
          "H%d D%d %s causal" % (torch.__version__, torch.cuda.get_device_name(device) if device.type == "cuda"
                                 else "CPU", len(lengths), sum(lengths), mean, max(lengths), args.heads,
                                 args.head_dim, args.dtype))

    timer = Timer(device)
    rows, outputs = [], {}
    for provider in providers:
        run = provider_fns(provider)
        sets = [inputs_for(provider, b, d) for b, d in zip(batches, dense_sets)]
        for direction in directions:
            work = (real_flops([mean] * len(lengths), args.heads, args.head_dim, direction) if provider == "fmha-dense"
                    else real_flops(lengths, args.heads, args.head_dim, direction))
            note, seconds = "", None
            try:
                if direction == "fwd":
                    with torch.no_grad():
                        outputs[provider] = run(sets[0])
                        seconds = timer.time(run, sets, args.warmup, args.repeats)
                else:
                    for x in sets:
                        leaves = {n: x[n].detach().requires_grad_() for n in ("q", "k", "v")}
                        x["graph"] = (run({**x, **leaves}), tuple(leaves.values()))

                    def backward(x):
                        out, leaves = x["graph"]
                        return torch.autograd.grad(out, leaves, x["dout"], retain_graph=True)
                    seconds = timer.time(backward, sets, args.warmup, args.repeats)
            except (RuntimeError, ValueError, TypeError) as error:
                note = str(error).splitlines()[0][:110]
            finally:
                for x in sets:
                    x.pop("graph", None)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rows.append({"provider": provider, "direction": direction,
                         "layout": {"fmha": "packed", "fmha-dense": "dense at the mean"}.get(provider, "padded"),
                         "ms": "%.4f" % (seconds * 1e3) if seconds else "n/a",
                         "tflops": "%.4g" % (work / seconds / 1e12) if seconds else "n/a", "note": note})
            print("%-10s %-3s %-17s %10s ms %9s TFLOP/s %s" % (provider, direction, rows[-1]["layout"], rows[-1]["ms"],
                                                            rows[-1]["tflops"], note))

    reference = next((p for p in providers if p in TORCH_PROVIDERS and p in outputs), None)
    if "fmha" in outputs and reference:
        got = outputs["fmha"].float()
        want = batches[0].real_rows(outputs[reference]).float()
        print("agreement: fmha packed against %s on the real rows: %.2e" % (
            reference, float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "compare_varlen.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    print("wrote", path)


if __name__ == "__main__":
    main()
