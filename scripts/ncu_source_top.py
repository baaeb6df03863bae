#!/usr/bin/env python3
"""Where a kernel's warps wait, from an Nsight Compute source page (`ncu -i REPORT --page source
--csv --print-source sass`, as scripts/gpu_profile_peers.sh SOURCE=1 writes it; .csv or .csv.gz).

For each kernel in the file: its stall samples in total, by reason, by opcode (the mnemonic
without modifiers; with each opcode's samples and warp-level instructions executed), and the
instructions with the most samples, each with its main reasons.

    python3 scripts/ncu_source_top.py peers_fwd64s_fmha_source.csv [--top 25]
    python3 scripts/ncu_source_top.py --self-test   # the parser on a made-up page (a CTest)
"""
import argparse
import collections
import csv
import gzip
import io
import sys


def open_text(path):
    return io.TextIOWrapper(gzip.open(path), encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")


def kernels(rows):
    """(kernel name, header, instruction rows) for each kernel section of the page."""
    name, header, body = None, None, []
    for row in rows:
        if row and row[0] == "Kernel Name":
            if header:
                yield name, header, body
            name, header, body = row[1] if len(row) > 1 else "?", None, []
        elif header is None and row and row[0] == "Address":
            header = row
        elif header is not None and len(row) == len(header):
            body.append(row)
    if header:
        yield name, header, body


def number(text):
    try:
        return float(text)
    except ValueError:
        return 0.0


def opcode(text):
    """The mnemonic of a SASS line without its predicate guard and modifiers."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def summarise(name, header, body, top, out):
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    samples = col.get("Warp Stall Sampling (All Samples)")
    if samples is None:
        print(f"{name}: no stall samples on this page", file=out)
        return
    total = sum(number(r[samples]) for r in body) or 1.0
    executed = col.get("Instructions Executed")
    by_reason = collections.Counter()
    by_opcode = collections.Counter()
    executed_by_opcode = collections.Counter()  # warp-level instructions executed
    opcode_reasons = collections.defaultdict(collections.Counter)
    for r in body:
        op = opcode(r[col["Source"]].strip())
        by_opcode[op] += number(r[samples])
        if executed is not None:
            executed_by_opcode[op] += number(r[executed])
        for reason in reasons:
            v = number(r[col[reason]])
            by_reason[reason] += v
            opcode_reasons[op][reason] += v
    print(f"== {name[:160]}", file=out)
    print(f"samples {int(total)}, instructions {len(body)}, executed {int(sum(executed_by_opcode.values()))}",
          file=out)
    print("by reason: " + ", ".join(f"{k[6:]} {100 * v / total:.1f}%" for k, v in by_reason.most_common(10) if v), file=out)
    print("by opcode:", file=out)
    for op, v in by_opcode.most_common(top):
        main = ", ".join(f"{k[6:]} {100 * x / total:.1f}" for k, x in opcode_reasons[op].most_common(3) if x)
        print(f"  {op:<12} {100 * v / total:5.1f}%  {int(v):>7} samples  {int(executed_by_opcode[op]):>11} executed  ({main})",
              file=out)
    print("by instruction:", file=out)
    ranked = sorted(body, key=lambda r: -number(r[samples]))[:top]
    for r in ranked:
        v = number(r[samples])
        main = sorted(((number(r[col[k]]), k[6:]) for k in reasons), reverse=True)[:2]
        why = ", ".join(f"{k} {int(x)}" for x, k in main if x)
        execs = r[col["Instructions Executed"]] if "Instructions Executed" in col else "?"
        print(f"  {r[col['Address']][-5:]} {100 * v / total:5.1f}%  {r[col['Source']].strip()[:60]:<60} exec {execs} ({why})",
              file=out)


SELF_TEST_PAGE = """"Kernel Name","void k1(int)",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait","stall_mio","stall_wait (Not Issued)"
"0x10","      FFMA R1, R2, R3, R4 ;","2","64","2","0","1"
"0x20","      MUFU.EX2 R5, R1 ;","6","64","1","5","0"
"0x30","@!P0  MUFU.EX2 R6, R1 ;","2","32","0","2","0"
"Kernel Name","void k2(int)",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait"
"0x40","      BRA 0x40 ;","1","8","1"
"""


def self_test():
    found = list(kernels(csv.reader(io.StringIO(SELF_TEST_PAGE))))
    assert [n for n, _, _ in found] == ["void k1(int)", "void k2(int)"], found
    assert [len(b) for _, _, b in found] == [3, 1]
    assert opcode("@!P0  MUFU.EX2 R6, R1 ;") == "MUFU" and opcode("FFMA R1, R2, R3, R4 ;") == "FFMA"
    out = io.StringIO()
    summarise(*found[0], top=5, out=out)
    text = out.getvalue()
    assert "samples 10, instructions 3, executed 160" in text, text
    assert "by reason: mio 70.0%, wait 30.0%" in text, text  # the Not Issued columns are left out
    assert "MUFU          80.0%        8 samples           96 executed" in text, text
    print("ncu_source_top self-test passed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--self-test", action="store_true", help="check the parser on a made-up page")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return
    if not a.csv:
        ap.error("a source page (.csv or .csv.gz) is needed")
    with open_text(a.csv) as f:
        found = False
        for name, header, body in kernels(csv.reader(f)):
            found = True
            summarise(name, header, body, a.top, sys.stdout)
    if not found:
        sys.exit(f"{a.csv}: no source page (no 'Address' header)")


if __name__ == "__main__":
    main()
