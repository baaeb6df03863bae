"""bench/compare_torch.py's timing: --min-time raises the repeats of short calls up to --max-repeats
(the Timer alone, and the script's smoke sweep on the CPU). Needs PyTorch; skips without it."""

import csv
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
import compare_torch  # noqa: E402


def test_repeats_follow_min_time():
    timer = compare_torch.Timer(torch.device("cpu"), min_time=0.05, max_repeats=1000)
    assert timer.repeats_for(0.001, 5) == 50  # 50 calls of 1 ms fill 50 ms
    assert timer.repeats_for(0.1, 5) == 5  # a long call keeps --repeats
    assert timer.repeats_for(1e-7, 5) == 1000  # capped by --max-repeats
    assert compare_torch.Timer(torch.device("cpu")).repeats_for(0.001, 5) == 5  # no --min-time


def test_time_runs_the_raised_repeats():
    calls = []

    def call(inputs):
        calls.append(inputs)
        time.sleep(0.002)

    timer = compare_torch.Timer(torch.device("cpu"), min_time=0.04, max_repeats=100)
    median = timer.time(call, [1, 2], warmup=2, repeats=3)
    assert 0.0015 < median < 0.02
    # 2 warm-up calls, one to estimate the call's time, then about 0.04 / 0.002 = 20 timed ones
    # (fewer where sleeping overshoots), never just --repeats.
    assert len(calls) >= 2 + 1 + 10, len(calls)
    assert set(calls) == {1, 2}  # the input sets rotate


def test_smoke_sweep_with_min_time(tmp_path):
    out = tmp_path / "compare"
    subprocess.run([sys.executable, os.path.join(BENCH, "compare_torch.py"), "--smoke", "--device", "cpu",
                    "--providers", "fmha,math", "--min-time", "0.01", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=600)
    with open(out / "compare_torch.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["provider"] in ("fmha", "math") for r in rows)
    assert any(r["provider"] == "fmha" and r["ms"] not in ("", "n/a") for r in rows)


def test_min_time_refuses_bad_values(tmp_path):
    result = subprocess.run([sys.executable, os.path.join(BENCH, "compare_torch.py"), "--smoke", "--device", "cpu",
                             "--min-time", "-1", "--out", str(tmp_path / "x")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and "--min-time must be >= 0" in result.stderr
