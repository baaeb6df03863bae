"""fmha.tune, fmha.selected_variant and autotuning on the CPU, each test with a cache file of its own."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fmha

CPU_VARIANTS = ["k2048", "k512", "k1024", "k4096", "c2", "c16"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "fmha" / "tune.json"
    monkeypatch.setenv("FMHA_TUNE_CACHE", str(path))
    monkeypatch.delenv("FMHA_CPU_CONFIG", raising=False)
    fmha.clear_tune_cache()  # also makes this process read the cache at the new path
    yield path
    fmha.set_autotune(False)
    fmha.clear_tune_cache()


def arrays(seqlen=128, head_dim=32):
    q = np.random.default_rng(0).standard_normal((1, seqlen, 2, head_dim)).astype(np.float32)
    return q, q.copy(), q.copy()


def test_tune_records_the_fastest_variant_and_calls_use_it(cache):
    q, k, v = arrays()
    assert fmha.tune_cache_path() == str(cache)
    assert fmha.selected_variant(q, k, v, backend="cpu") == ("k2048", "default")
    result = fmha.tune(q, k, v, backend="cpu", iters=1, warmup=0)
    assert result["problem_class"] == "cpu fwd fp32 d32 none g1 q128 k128"
    assert result["default"] == "k2048"
    assert [entry["variant"] for entry in result["variants"]] == CPU_VARIANTS
    for entry in result["variants"]:
        assert entry["agrees"], entry
        assert entry["ms"] > 0 and entry["difference"] <= 1e-5, entry
    assert result["winner"] in CPU_VARIANTS
    written = json.loads(cache.read_text())
    assert written["devices"][result["device"]][result["problem_class"]]["variant"] == result["winner"]
    assert fmha.selected_variant(q, k, v, backend="cpu") == (result["winner"], "cache")
    out = fmha.attention(q, k, v, backend="cpu")  # runs the winner
    assert np.isfinite(out).all()
    # A variable overrides the cache.
    os.environ["FMHA_CPU_CONFIG"] = "c16"
    try:
        assert fmha.selected_variant(q, k, v, backend="cpu") == ("c16", "variable")
    finally:
        del os.environ["FMHA_CPU_CONFIG"]
    fmha.clear_tune_cache()
    assert not cache.exists()
    assert fmha.selected_variant(q, k, v, backend="cpu") == ("k2048", "default")


def test_tune_backward_dry_run_writes_nothing(cache):
    q, k, v = arrays(seqlen=70)
    result = fmha.tune(q, k, v, direction="backward", causal="bottom-right", backend="cpu", iters=1, warmup=0,
                       write_cache=False)
    assert result["problem_class"] == "cpu bwd fp32 d32 causal g1 q128 k128"
    assert not cache.exists()


def test_autotune_is_opt_in(cache):
    q, k, v = arrays(seqlen=64)
    assert not fmha.autotune_enabled()
    fmha.attention(q, k, v, backend="cpu", causal="top-left")
    assert not cache.exists()
    fmha.set_autotune(True)
    assert fmha.autotune_enabled()
    fmha.attention(q, k, v, backend="cpu", causal="top-left")
    assert cache.exists()
    variant, source = fmha.selected_variant(q, k, v, backend="cpu", causal="top-left")
    assert source == "cache" and variant in CPU_VARIANTS


def test_autotune_from_the_environment(tmp_path):
    path = tmp_path / "tune.json"
    env = dict(os.environ, FMHA_AUTOTUNE="1", FMHA_TUNE_CACHE=str(path))
    env.pop("FMHA_CPU_CONFIG", None)
    code = (
        "import numpy as np, fmha\n"
        "q = np.ones((1, 64, 1, 16), np.float32)\n"
        "assert fmha.autotune_enabled()\n"
        "fmha.attention(q, q, q, backend='cpu')\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert "cpu fwd fp32 d16 none g1 q64 k64" in json.loads(path.read_text())["devices"].popitem()[1]


def test_tune_refuses_bad_arguments(cache):
    q, k, v = arrays(seqlen=64)
    with pytest.raises(ValueError, match="iters"):
        fmha.tune(q, k, v, iters=0)
    with pytest.raises(TypeError, match="write_cache"):
        fmha.tune(q, k, v, write_cache="yes")
    with pytest.raises(ValueError, match="direction"):
        fmha.tune(q, k, v, direction="sideways")
    with pytest.raises(ValueError, match="no variants"):
        fmha.tune(q, k, v, backend="reference")
    with pytest.raises(ValueError, match="kv_heads"):
        fmha.tune(q, np.ones((1, 64, 3, 32), np.float32), np.ones((1, 64, 3, 32), np.float32))
    with pytest.raises(TypeError, match="enabled"):
        fmha.set_autotune(1)
    assert not cache.exists()
