"""fmha on JAX and CuPy arrays: results come back as the caller's arrays, and agree with the
float64 oracle. Each framework's tests skip when it is not installed (CuPy, and JAX on a GPU, also
need a GPU, a CUDA build of fmha and a GPU backend for the call)."""

import numpy as np
import pytest

import fmha
import reference


def oracle_inputs(seed=0, shape=(2, 21, 34, 4, 2, 32, 16)):
    batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, head_dim_v = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, seqlen_q, heads, head_dim), dtype=np.float32)
    k = rng.standard_normal((batch, seqlen_k, kv_heads, head_dim), dtype=np.float32)
    v = rng.standard_normal((batch, seqlen_k, kv_heads, head_dim_v), dtype=np.float32)
    dout = rng.standard_normal((batch, seqlen_q, heads, head_dim_v), dtype=np.float32)
    return q, k, v, dout


def check_against_oracle(to_numpy, out, lse, grads, q, k, v, dout, causal):
    ref_out, ref_lse = reference.forward(q, k, v, causal)
    np.testing.assert_allclose(to_numpy(out), ref_out, atol=5e-5, rtol=1e-4)
    np.testing.assert_allclose(to_numpy(lse), ref_lse, atol=5e-5, rtol=1e-4)
    for got, want in zip(grads, reference.backward(q, k, v, dout, causal)):
        np.testing.assert_allclose(to_numpy(got), want, atol=5e-4, rtol=1e-3)


def skip_without_backend(*arrays):
    try:
        fmha.select_backend(*arrays[:3])
        fmha.select_backend(*arrays[:3], direction="backward")
    except (ValueError, RuntimeError) as error:
        pytest.skip("no fmha backend for these arrays: %s" % error)


# ---- JAX ---------------------------------------------------------------------------------------

def jax_devices():
    jax = pytest.importorskip("jax")
    devices = [("cpu", jax.devices("cpu")[0])]
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if gpus and fmha.info()["cuda"]:
        devices.append(("gpu", gpus[0]))
    return devices


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_jax_arrays(platform):
    jax = pytest.importorskip("jax")
    devices = dict(jax_devices())
    if platform not in devices:
        pytest.skip("no JAX GPU device (or fmha built without CUDA)")
    q, k, v, dout = oracle_inputs()
    qj, kj, vj, dj = (jax.device_put(x, devices[platform]) for x in (q, k, v, dout))
    skip_without_backend(qj, kj, vj)
    out, lse = fmha.attention(qj, kj, vj, causal="bottom-right", return_lse=True)
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    assert next(iter(out.devices())) == devices[platform]
    grads = fmha.attention_backward(qj, kj, vj, out, dj, lse, causal="bottom-right")
    assert all(isinstance(g, jax.Array) for g in grads)
    check_against_oracle(np.asarray, out, lse, grads, q, k, v, dout, "bottom-right")
    # The result is an ordinary JAX array: JAX can compute with it.
    np.testing.assert_allclose(np.asarray(jax.numpy.sum(out * 2)), 2 * np.asarray(out).sum(), rtol=1e-5)


def test_jax_bfloat16_and_immutability():
    jax = pytest.importorskip("jax")
    q, k, v, _ = oracle_inputs(shape=(1, 9, 9, 2, 2, 16, 16))
    qj, kj, vj = (jax.numpy.asarray(x, dtype=jax.numpy.bfloat16) for x in (q, k, v))
    skip_without_backend(qj, kj, vj)
    out = fmha.attention(qj, kj, vj)
    assert out.dtype == jax.numpy.bfloat16
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    np.testing.assert_allclose(f64(out), reference.forward(f64(qj), f64(kj), f64(vj))[0], atol=5e-2, rtol=5e-2)
    with pytest.raises(TypeError, match="out: JAX arrays are immutable"):
        fmha.attention(qj, kj, vj, out=out)


# ---- CuPy --------------------------------------------------------------------------------------

def cupy_or_skip():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    if not fmha.info()["cuda"]:
        pytest.skip("fmha was built without CUDA")
    return cupy


def test_cupy_arrays():
    cupy = cupy_or_skip()
    q, k, v, dout = oracle_inputs()
    qc, kc, vc, dc = (cupy.asarray(x) for x in (q, k, v, dout))
    skip_without_backend(qc, kc, vc)
    out, lse = fmha.attention(qc, kc, vc, causal="top-left", return_lse=True)
    assert isinstance(out, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    grads = fmha.attention_backward(qc, kc, vc, out, dc, lse, causal="top-left")
    assert all(isinstance(g, cupy.ndarray) for g in grads)
    check_against_oracle(cupy.asnumpy, out, lse, grads, q, k, v, dout, "top-left")
    buffer = cupy.empty_like(out)
    assert fmha.attention(qc, kc, vc, causal="top-left", out=buffer) is buffer
    cupy.testing.assert_array_equal(buffer, out)


def test_cupy_current_stream():
    """Inputs produced late on a non-blocking CuPy stream: fmha must run on CuPy's current stream
    to see them."""
    cupy = cupy_or_skip()
    q, k, v, _ = oracle_inputs(shape=(1, 256, 256, 4, 4, 64, 64))
    qc, kc, vc = (cupy.asarray(x) for x in (q, k, v))
    skip_without_backend(qc, kc, vc)
    expected = reference.forward(2 * q, k, v)[0]
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        busy = cupy.ones((2048, 2048), dtype=cupy.float64)
        for _ in range(20):  # keep the stream busy for a while
            busy = busy @ busy * (1.0 / 2048)
        q2 = qc * 2
        out = fmha.attention(q2, kc, vc)
    stream.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(out), expected, atol=5e-5, rtol=1e-4)
    # An explicit stream= while another stream is current.
    with stream:
        busy = busy @ busy
        q3 = qc * 2
    out = fmha.attention(q3, kc, vc, stream=stream)
    stream.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(out), expected, atol=5e-5, rtol=1e-4)
