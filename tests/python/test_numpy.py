"""fmha on NumPy arrays (CPU) against the float64 oracle in reference.py, and its error messages."""

import numpy as np
import pytest

import fmha
import reference

try:
    import ml_dtypes
except ImportError:  # bfloat16 tests need ml_dtypes
    ml_dtypes = None

# Tolerance: |fmha - oracle| <= factor * eps(dtype) * max(1, max|oracle|), the oracle being fed the
# same (rounded) inputs. The factor covers fp32 accumulation over the key length and, for 16-bit
# storage, the rounding of P before P·V and of the outputs themselves.
EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
FORWARD_FACTOR = {"float32": 256, "float16": 8, "bfloat16": 8}
BACKWARD_FACTOR = {"float32": 2048, "float16": 32, "bfloat16": 32}


def assert_close(actual, expected, dtype_name, factor, what):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, what
    if actual.size == 0:
        return
    finite = np.isfinite(expected)
    assert np.array_equal(np.isfinite(actual), finite), what + ": non-finite entries differ"
    assert np.array_equal(actual[~finite], expected[~finite]), what + ": infinities differ"
    tolerance = factor * EPS[dtype_name] * max(1.0, float(np.abs(expected[finite]).max(initial=0.0)))
    error = float(np.abs(actual[finite] - expected[finite]).max(initial=0.0))
    assert error <= tolerance, "%s: max error %.3g > %.3g" % (what, error, tolerance)


def make(shape, dtype, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    if dtype == "bfloat16":
        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype)


def inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, head_dim_v, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    q = make((batch, seqlen_q, heads, head_dim), dtype, rng)
    k = make((batch, seqlen_k, kv_heads, head_dim), dtype, rng)
    v = make((batch, seqlen_k, kv_heads, head_dim_v), dtype, rng)
    dout = make((batch, seqlen_q, heads, head_dim_v), dtype, rng)
    return q, k, v, dout


def f64(x):
    return np.asarray(x).astype(np.float64)


# (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, head_dim_v)
SHAPES = [
    (1, 1, 1, 1, 1, 8, 8),
    (2, 15, 63, 4, 2, 16, 16),
    (1, 63, 15, 8, 1, 32, 24),
    (2, 33, 70, 8, 8, 64, 64),
    (1, 130, 17, 2, 2, 40, 72),
]

# (causal, window, q_offset)
MASKS = [
    (None, None, 0),
    ("top-left", None, 0),
    ("bottom-right", None, 0),
    (None, (3, 5), 0),
    (None, (0, 0), 0),
    (None, (None, 2), 0),
    ("top-left", (4, None), 0),
    ("bottom-right", (7, 0), 0),
    ("top-left", None, 5),
    ("bottom-right", None, -3),
    (None, (2, 1), -4),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "%s-%s-%s" % m)
def test_forward_backward_fp32(shape, mask):
    causal, window, q_offset = mask
    q, k, v, dout = inputs(*shape)
    out, lse = fmha.attention(q, k, v, causal=causal, window=window, q_offset=q_offset, return_lse=True)
    ref_out, ref_lse = reference.forward(q, k, v, causal, window, None, q_offset)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    assert_close(out, ref_out, "float32", FORWARD_FACTOR["float32"], "out")
    assert_close(lse, ref_lse, "float32", FORWARD_FACTOR["float32"], "lse")

    dq, dk, dv = fmha.attention_backward(q, k, v, out, dout, lse, causal=causal, window=window, q_offset=q_offset)
    ref = reference.backward(q, k, v, dout, causal, window, None, q_offset)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert_close(got, want, "float32", BACKWARD_FACTOR["float32"], name)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("mask", [(None, None, 0), ("bottom-right", None, 0), (None, (3, 2), 1)],
                         ids=lambda m: "%s-%s-%s" % m)
def test_16bit(dtype, mask):
    if dtype == "bfloat16" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed (NumPy has no bfloat16 of its own)")
    causal, window, q_offset = mask
    q, k, v, dout = inputs(2, 37, 29, 4, 2, 32, 32, dtype=dtype)
    out, lse = fmha.attention(q, k, v, causal=causal, window=window, q_offset=q_offset, return_lse=True)
    assert out.dtype == q.dtype
    ref_out, ref_lse = reference.forward(f64(q), f64(k), f64(v), causal, window, None, q_offset)
    assert_close(f64(out), ref_out, dtype, FORWARD_FACTOR[dtype], "out")
    assert_close(lse, ref_lse, "float32", 4096, "lse")
    dq, dk, dv = fmha.attention_backward(q, k, v, out, dout, lse, causal=causal, window=window, q_offset=q_offset)
    ref = reference.backward(f64(q), f64(k), f64(v), f64(dout), causal, window, None, q_offset)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert got.dtype == q.dtype
        assert_close(f64(got), want, dtype, BACKWARD_FACTOR[dtype], name)


def test_scale_and_reference_backend():
    q, k, v, dout = inputs(1, 9, 11, 2, 1, 16, 8)
    for backend in ("cpu", "reference"):
        out, lse = fmha.attention(q, k, v, scale=0.3, backend=backend, return_lse=True)
        ref_out, ref_lse = reference.forward(q, k, v, scale=0.3)
        assert_close(out, ref_out, "float32", 64, backend + " out")
        assert_close(lse, ref_lse, "float32", 64, backend + " lse")
        grads = fmha.attention_backward(q, k, v, out, dout, lse, scale=0.3, backend=backend)
        for name, got, want in zip(("dq", "dk", "dv"), grads, reference.backward(q, k, v, dout, scale=0.3)):
            assert_close(got, want, "float32", 1024, backend + " " + name)


def test_tf32_precision():
    q, k, v, _ = inputs(1, 20, 24, 2, 2, 32, 32)
    out = fmha.attention(q, k, v, precision="tf32")
    ref_out, _ = reference.forward(q, k, v)
    # tf32 keeps 10 mantissa bits of each matmul operand.
    assert_close(out, ref_out, "float16", 8, "out")
    assert not np.array_equal(out, fmha.attention(q, k, v, precision="ieee"))


def test_tf32x3_precision():
    # Split tf32: fp32 accuracy; the CPU backends compute it in exact fp32.
    q, k, v, dout = inputs(1, 20, 24, 2, 2, 32, 32)
    out, lse = fmha.attention(q, k, v, precision="tf32x3", return_lse=True)
    ref_out, _ = reference.forward(q, k, v)
    assert_close(out, ref_out, "float32", 1024, "out")
    grads = fmha.attention_backward(q, k, v, out, dout, lse, precision="tf32x3")
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference.backward(q, k, v, dout)):
        assert_close(got, want, "float32", 1024, name)


def test_deterministic_backward_is_reproducible():
    q, k, v, dout = inputs(2, 40, 50, 4, 2, 16, 16)
    out, lse = fmha.attention(q, k, v, causal="top-left", return_lse=True)
    first = fmha.attention_backward(q, k, v, out, dout, lse, causal="top-left", deterministic=True)
    second = fmha.attention_backward(q, k, v, out, dout, lse, causal="top-left", deterministic=True)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


def test_strided_bhsd_inputs():
    """[B, H, S, D] storage passed as [B, S, H, D] views (strides), including the outputs."""
    q, k, v, dout = inputs(2, 19, 23, 4, 2, 16, 16)
    as_bhsd = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # noqa: E731
    qs, ks, vs, douts = (as_bhsd(x) for x in (q, k, v, dout))
    assert not qs.flags.c_contiguous and qs.strides[3] == 4
    out_bhsd = np.empty((2, 4, 19, 16), dtype=np.float32)
    out = out_bhsd.transpose(0, 2, 1, 3)
    result, lse = fmha.attention(qs, ks, vs, causal="bottom-right", out=out, return_lse=True)
    assert result is out
    ref_out, ref_lse = reference.forward(q, k, v, "bottom-right")
    assert_close(out_bhsd.transpose(0, 2, 1, 3), ref_out, "float32", 256, "out")
    dq = as_bhsd(np.zeros_like(q))
    grads = fmha.attention_backward(qs, ks, vs, out, douts, lse, causal="bottom-right", dq=dq)
    assert grads[0] is dq
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference.backward(q, k, v, dout, "bottom-right")):
        assert_close(got, want, "float32", 2048, name)


def test_fully_masked_rows():
    # bottom-right with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see no key.
    q, k, v, dout = inputs(1, 12, 5, 2, 2, 8, 8)
    out, lse = fmha.attention(q, k, v, causal="bottom-right", return_lse=True)
    assert np.all(out[:, :7] == 0)
    assert np.all(lse[:, :, :7] == -np.inf)
    assert np.all(np.isfinite(lse[:, :, 7:]))
    dq, dk, dv = fmha.attention_backward(q, k, v, out, dout, lse, causal="bottom-right")
    assert np.all(dq[:, :7] == 0)
    ref = reference.backward(q, k, v, dout, "bottom-right")
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert_close(got, want, "float32", 2048, name)
    # a window placed entirely before the first key: every row is empty.
    out, lse = fmha.attention(q, k, v, window=(2, 2), q_offset=-20, return_lse=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)


@pytest.mark.parametrize("shape", [(0, 5, 7, 2, 1, 8, 8), (2, 0, 7, 2, 1, 8, 8), (2, 5, 0, 2, 1, 8, 8)])
def test_empty(shape):
    q, k, v, dout = inputs(*shape)
    out, lse = fmha.attention(q, k, v, return_lse=True)
    assert out.shape == (shape[0], shape[1], shape[3], shape[6])
    assert lse.shape == (shape[0], shape[3], shape[1])
    if shape[2] == 0:  # no keys: every row is fully masked
        assert np.all(out == 0) and np.all(lse == -np.inf)
    dq, dk, dv = fmha.attention_backward(q, k, v, out, dout, lse)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    if shape[1] == 0:  # no queries: no gradient reaches k and v
        assert np.all(dk == 0) and np.all(dv == 0)


def test_out_arguments_are_written_and_returned():
    q, k, v, dout = inputs(1, 6, 6, 2, 2, 8, 8)
    out = np.full((1, 6, 2, 8), np.nan, dtype=np.float32)
    assert fmha.attention(q, k, v, out=out) is out
    assert_close(out, reference.forward(q, k, v)[0], "float32", 64, "out")
    _, lse = fmha.attention(q, k, v, return_lse=True)
    dq, dk, dv = (np.full_like(x, np.nan) for x in (q, k, v))
    result = fmha.attention_backward(q, k, v, out, dout, lse, dq=dq, dk=dk, dv=dv)
    assert result[0] is dq and result[1] is dk and result[2] is dv
    assert np.all(np.isfinite(dq)) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_any_dlpack_object():
    class Wrapped:
        def __init__(self, array):
            self.array = array
            self.shape = array.shape

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    q, k, v, _ = inputs(1, 4, 4, 1, 1, 8, 8)
    out = fmha.attention(Wrapped(q), Wrapped(k), Wrapped(v))
    assert isinstance(out, np.ndarray)
    assert_close(out, reference.forward(q, k, v)[0], "float32", 64, "out")


def test_info_and_select_backend():
    info = fmha.info()
    assert info["version"] == fmha.__version__
    assert "cpu" in info["backends"] and "reference" in info["backends"]
    assert info["devices"][0]["device"] == "cpu"
    q, k, v, _ = inputs(1, 4, 4, 1, 1, 8, 8)
    assert fmha.select_backend(q, k, v) == "cpu"
    assert fmha.select_backend(q, k, v, direction="backward", backend="reference") == "reference"


def test_computed_precision():
    """The arithmetic a call runs in: the call's own on the CPU (exact fp32 for every float32
    precision but tf32, which the CPU emulates)."""
    q, k, v, _ = inputs(1, 40, 40, 2, 2, 32, 32)
    assert fmha.computed_precision(q, k, v) == "ieee"
    assert fmha.computed_precision(q, k, v, precision="tf32") == "tf32"
    assert fmha.computed_precision(q, k, v, direction="backward", precision="tf32x3") == "tf32x3"
    with pytest.raises(ValueError, match="precision"):
        fmha.computed_precision(q, k, v, precision="tf32x4")


# ---- Bad input: the right exception, and a message that names the argument ----------------------

def _qkv():
    return inputs(1, 4, 5, 4, 2, 8, 8)[:3]


def _call(**overrides):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v)
    options = {}
    for key, value in overrides.items():
        (args if key in args else options)[key] = value
    return fmha.attention(args["q"], args["k"], args["v"], **options)


BAD_FORWARD = [
    (dict(q=np.zeros((1, 4, 4, 8), np.float64)), TypeError, "q: dtype float64"),
    (dict(k=np.zeros((1, 5, 2, 8), np.float16)), TypeError, "k: dtype"),
    (dict(q=[[1.0]]), TypeError, "q:"),
    (dict(q=np.zeros((4, 4, 8), np.float32)), ValueError, "q: expected a 4-d"),
    (dict(k=np.zeros((1, 5, 2, 6), np.float32)), ValueError, "k: head_dim"),
    (dict(k=np.zeros((1, 5, 3, 8), np.float32), v=np.zeros((1, 5, 3, 8), np.float32)), ValueError, "k: kv_heads"),
    (dict(v=np.zeros((1, 6, 2, 8), np.float32)), ValueError, "v: seqlen_k"),
    (dict(q=np.zeros((1, 4, 4, 16), np.float32)[..., ::2]), ValueError, "q: the last dimension"),
    (dict(causal=True), ValueError, "causal:"),
    (dict(causal="diagonal"), ValueError, "causal:"),
    (dict(window=(1, 2, 3)), ValueError, "window:"),
    (dict(window=(-2, 0)), ValueError, "window:"),
    (dict(window=(1.5, 0)), TypeError, "window:"),
    (dict(causal="top-left", window=(3, 2)), ValueError, "window_right"),
    (dict(scale=0.0), ValueError, "scale:"),
    (dict(scale=float("nan")), ValueError, "scale:"),
    (dict(scale="big"), TypeError, "scale:"),
    (dict(q_offset=1.5), TypeError, "q_offset:"),
    (dict(precision="fp8"), ValueError, "precision:"),
    (dict(backend="fastest"), ValueError, "backend:"),
    (dict(backend=3), TypeError, "backend:"),
    (dict(deterministic="yes"), TypeError, "deterministic:"),
    (dict(num_threads=-1), ValueError, "num_threads:"),
    (dict(out=np.zeros((1, 4, 4, 7), np.float32)), ValueError, "out: head_dim_v"),
    (dict(out=np.zeros((1, 4, 4, 8), np.float16)), TypeError, "out: dtype"),
    (dict(stream="now"), TypeError, "stream:"),
]


@pytest.mark.parametrize("overrides,error,message", BAD_FORWARD, ids=[m for _, _, m in BAD_FORWARD])
def test_bad_forward_input(overrides, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(")):
        _call(**overrides)


def test_tf32_needs_fp32():
    q, k, v, _ = inputs(1, 4, 4, 1, 1, 8, 8, dtype="float16")
    with pytest.raises(ValueError, match="precision: tf32"):
        fmha.attention(q, k, v, precision="tf32")
    with pytest.raises(ValueError, match="precision: tf32x3"):
        fmha.attention(q, k, v, precision="tf32x3")


def test_read_only_output():
    q, k, v = _qkv()
    out = np.zeros((1, 4, 4, 8), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        fmha.attention(q, k, v, out=out)


def test_read_only_inputs_are_fine():
    q, k, v = _qkv()
    for x in (q, k, v):
        x.flags.writeable = False
    assert np.all(np.isfinite(fmha.attention(q, k, v)))


def test_gpu_backend_on_cpu_arrays():
    q, k, v = _qkv()
    error = ValueError if fmha.info()["cuda"] else RuntimeError
    with pytest.raises(error, match="backend"):
        fmha.attention(q, k, v, backend="sm80")


def test_bad_backward_input():
    q, k, v, dout = inputs(1, 4, 5, 4, 2, 8, 8)
    out, lse = fmha.attention(q, k, v, return_lse=True)
    with pytest.raises(TypeError, match="lse: dtype"):
        fmha.attention_backward(q, k, v, out, dout, lse.astype(np.float16))
    with pytest.raises(ValueError, match="lse: seqlen_q"):
        fmha.attention_backward(q, k, v, out, dout, lse[:, :, :3])
    with pytest.raises(ValueError, match="dout: head_dim_v"):
        fmha.attention_backward(q, k, v, out, dout[..., :4], lse)
    with pytest.raises(ValueError, match="dq: seqlen_q"):
        fmha.attention_backward(q, k, v, out, dout, lse, dq=np.zeros((1, 3, 4, 8), np.float32))
    with pytest.raises(TypeError, match="dk: dtype"):
        fmha.attention_backward(q, k, v, out, dout, lse, dk=np.zeros(k.shape, np.float16))
    with pytest.raises(ValueError, match="direction"):
        fmha.select_backend(q, k, v, direction="sideways")


def test_tables_are_exported_afresh_when_a_call_runs_twice(monkeypatch):
    """A DLPack capsule is consumed by the call that imports it, and a GPU call runs twice (its
    workspace size first, then the call): each run must export the sequence tables and a KV
    cache's tables again, as it does the tensors. Here every export makes a capsule and the
    extension, replaced by a fake, asks for a workspace once per call."""
    import fmha._api as api
    from fmha._frameworks import NumpyAdapter

    monkeypatch.setattr(NumpyAdapter, "export", lambda self, array: array.__dlpack__())
    runs = []

    def extension_call(*args, **tables):
        runs.append(tables)
        return 256 if len(runs) % 2 == 1 else 0  # the first run of each call asks for a workspace

    monkeypatch.setattr(api._C, "forward", extension_call)
    monkeypatch.setattr(api._C, "backward", extension_call)

    def fresh(names):
        first, second = runs[-2], runs[-1]
        for name in names:
            assert type(first[name]).__name__ == "PyCapsule", name
            assert first[name] is not second[name], name + ": the second run got the first run's capsule"

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((7, 2, 16)).astype(np.float32) for _ in range(3))
    cu = np.array([0, 3, 7], dtype=np.int32)
    fmha.attention_varlen(q, k, v, cu, cu)
    fresh(("cu_seqlens_q", "cu_seqlens_k"))
    lse = np.zeros((2, 7), dtype=np.float32)
    fmha.attention_varlen_backward(q, k, v, q.copy(), q.copy(), lse, cu, cu)
    fresh(("cu_seqlens_q", "cu_seqlens_k"))
    cache = rng.standard_normal((2, 16, 2, 16)).astype(np.float32)  # 2 pages of 16 rows
    fmha.attention_with_kvcache(q.reshape(7, 1, 2, 16)[:2], cache, cache, block_table=np.array([[0], [1]], np.int32),
                                cache_seqlens=np.array([5, 9], np.int32))
    fresh(("block_table", "cache_seqlens"))
