#!/usr/bin/env python3
"""The fa sweep of a bench/compare_torch.py CSV as markdown tables, one per dtype and direction:
TFLOP/s of fmha / FlashAttention-2 / cuDNN at each head dim, mask and length, with fmha ÷ cuDNN,
then how many points are below 1.0 (all, and from 2k keys).

    python3 scripts/side_by_side_table.py out/fa/compare_torch.csv
    python3 scripts/side_by_side_table.py --self-test
"""
import argparse
import csv
import sys


def tables(rows):
    """rows: dicts of the CSV. Returns the markdown text."""
    tflops = {}
    for r in rows:
        if r["sweep"] != "fa" or r["tflops"] in ("", "n/a"):
            continue
        key = (r["dtype"], r["direction"], int(r["head_dim"]), r["causal"], int(r["seqlen"]), r["provider"])
        tflops[key] = float(r["tflops"])
    out = []
    for dtype in sorted({k[0] for k in tflops}):
        for direction in ("fwd", "bwd"):
            keys = [k for k in tflops if k[0] == dtype and k[1] == direction]
            if not keys:
                continue
            lengths = sorted({k[4] for k in keys})
            dims = sorted({k[2] for k in keys})
            out.append("| %s %s | %s |" % (dtype, direction, " | ".join(str(s) for s in lengths)))
            out.append("|---" * (len(lengths) + 1) + "|")
            ratios = []
            for d in dims:
                for causal in ("0", "1"):
                    cells = []
                    for s in lengths:
                        get = lambda p: tflops.get((dtype, direction, d, causal, s, p))
                        f, fa2, cu = get("fmha"), get("flash"), get("cudnn")
                        if f is None or cu is None:
                            cells.append("n/a")
                            continue
                        ratios.append((s, f / cu))
                        cells.append("%.0f / %s / %.0f (%.2f)" % (f, "%.0f" % fa2 if fa2 else "n/a", cu, f / cu))
                    out.append("| D%d%s | %s |" % (d, " causal" if causal == "1" else "", " | ".join(cells)))
            out.append("")
            if ratios:
                below = [r for _, r in ratios if r < 1.0]
                long_below = [r for s, r in ratios if s >= 2048 and r < 1.0]
                out.append("%s %s: fmha/cuDNN min %.2f max %.2f, below 1.0: %d of %d (%d of %d from 2k)" % (
                    dtype, direction, min(r for _, r in ratios), max(r for _, r in ratios), len(below),
                    len(ratios), len(long_below), sum(1 for s, _ in ratios if s >= 2048)))
            else:
                out.append("%s %s: no point with both fmha and cuDNN" % (dtype, direction))
            out.append("")
    return "\n".join(out)


def self_test():
    rows = []
    for provider, t in (("fmha", 99.0), ("flash", 50.0), ("cudnn", 100.0)):
        for s in (512, 4096):
            rows.append(dict(sweep="fa", dtype="bf16", direction="fwd", head_dim="64", causal="0", seqlen=str(s),
                             provider=provider, tflops=str(t if s == 512 else t + 2)))
    text = tables(rows)
    assert "| D64 | 99 / 50 / 100 (0.99) | 101 / 52 / 102 (0.99) |" in text, text
    assert "below 1.0: 2 of 2 (1 of 1 from 2k)" in text, text
    # A sweep without cuDNN (a provider left out, or refused): its cells and summary say so.
    text = tables([r for r in rows if r["provider"] != "cudnn"])
    assert "| D64 | n/a | n/a |" in text and "no point with both fmha and cuDNN" in text, text
    print("side_by_side_table self-test passed")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", nargs="?")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        self_test()
    elif args.csv:
        with open(args.csv, newline="") as f:
            print(tables(list(csv.DictReader(f))))
    else:
        parser.error("a CSV or --self-test")
