"""fmha.torch: agreement with PyTorch's SDPA math in float64, gradients, opcheck, torch.compile,
CUDA graphs and streams. CPU tensors wherever PyTorch is installed; CUDA tensors where a GPU, a
CUDA build of fmha and a GPU backend for the call exist."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fmha  # noqa: E402
import fmha.torch as ft  # noqa: E402
import reference  # noqa: E402

F = torch.nn.functional
HAS_CUDA = torch.cuda.is_available() and fmha.info()["cuda"]
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and a CUDA build of fmha")


def require_backend(q, k, v, direction="forward", **options):
    try:
        return fmha.select_backend(q.detach(), k.detach(), v.detach(), direction=direction, **options)
    except ValueError as error:
        pytest.skip("no fmha backend for this call: %s" % error)


def qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, head_dim_v, device="cpu", dtype=torch.float32,
        seed=0, requires_grad=False):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, seqlen_q, heads, head_dim), (batch, seqlen_k, kv_heads, head_dim),
              (batch, seqlen_k, kv_heads, head_dim_v)]
    return [torch.randn(s, generator=generator).to(device=device, dtype=dtype).requires_grad_(requires_grad)
            for s in shapes]


def sdpa_float64(q, k, v, causal=None, window=None, q_offset=0, scale=None):
    """PyTorch's SDPA (math) in float64 on [B, S, H, D] tensors, with the equivalent boolean mask."""
    heads = q.shape[2]
    mask = torch.from_numpy(reference.visible(q.shape[1], k.shape[1], causal, window, q_offset)).to(q.device)
    expand = lambda x: x.double().repeat_interleave(heads // x.shape[2], dim=2).transpose(1, 2)  # noqa: E731
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q.double().transpose(1, 2), expand(k), expand(v), attn_mask=mask,
                                             scale=scale)
    return out.transpose(1, 2)


CASES = [
    # (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, head_dim_v), causal, window, q_offset
    ((2, 17, 33, 4, 2, 16, 16), None, None, 0),
    ((1, 33, 17, 8, 1, 32, 24), "top-left", None, 0),
    ((2, 20, 45, 8, 8, 64, 64), "bottom-right", None, 0),
    ((1, 31, 31, 2, 2, 16, 16), None, (4, 3), 0),
    ((1, 24, 40, 4, 4, 32, 32), "bottom-right", (6, 0), 0),
    ((1, 12, 30, 2, 1, 8, 8), "top-left", None, 7),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "%s-%s-%s" % c[1:])
def test_matches_sdpa_float64(device, case):
    shape, causal, window, q_offset = case
    q, k, v = qkv(*shape, device=device, requires_grad=True)
    options = dict(causal=causal, window=window, q_offset=q_offset)
    require_backend(q, k, v, **options)
    out = ft.attention(q, k, v, **options)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    expected = sdpa_float64(q64, k64, v64, **options)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-4)

    dout = torch.randn_like(out)
    out.backward(dout)
    expected.backward(dout.double())
    for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=1e-3, msg=lambda m: name + ": " + m)


@pytest.mark.parametrize("device", DEVICES)
def test_half_precision(device):
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = qkv(2, 19, 27, 4, 2, 32, 32, device=device, dtype=dtype, requires_grad=True)
        try:
            fmha.select_backend(q.detach(), k.detach(), v.detach())
        except ValueError:
            continue
        out = ft.attention(q, k, v, causal="bottom-right")
        assert out.dtype == dtype
        expected = sdpa_float64(q, k, v, causal="bottom-right")
        tolerance = 1e-2 if dtype == torch.float16 else 6e-2
        torch.testing.assert_close(out.double(), expected, atol=tolerance, rtol=tolerance)
        out.sum().backward()
        assert q.grad.dtype == dtype and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_finite_differences(device):
    """fmha computes in fp32 (no float64 storage); gradcheck perturbs the float64 inputs of a
    wrapper that rounds them to fp32, so the finite differences see fmha's forward and the
    analytical Jacobian is fmha's backward."""
    q, k, v = qkv(1, 3, 5, 2, 1, 4, 3, device=device, dtype=torch.float64, seed=3, requires_grad=True)
    require_backend(q.float(), k.float(), v.float(), direction="backward")

    def attention_fp32(q, k, v):
        return ft.attention(q.float(), k.float(), v.float(), causal="bottom-right", window=(3, 0)).double()

    assert torch.autograd.gradcheck(attention_fp32, (q, k, v), eps=1e-3, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_lse_and_fully_masked_rows(device):
    q, k, v = qkv(1, 9, 4, 2, 2, 8, 8, device=device, requires_grad=True)
    require_backend(q, k, v)
    out, lse = ft.attention(q, k, v, causal="bottom-right", return_lse=True)
    assert not lse.requires_grad
    assert torch.all(out[:, :5] == 0) and torch.all(lse[:, :, :5] == -float("inf"))
    ref_out, ref_lse = reference.forward(*(x.detach().cpu().numpy() for x in (q, k, v)), causal="bottom-right")
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse.astype(np.float32), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert torch.all(q.grad[:, :5] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_bhsd_layout_and_gradient_layout(device):
    q, k, v = qkv(2, 13, 13, 4, 4, 16, 16, device=device)
    q_bhsd, k_bhsd, v_bhsd = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    require_backend(q, k, v)
    out = ft.attention(q_bhsd.transpose(1, 2), k_bhsd.transpose(1, 2), v_bhsd.transpose(1, 2), causal="top-left")
    torch.testing.assert_close(out.double(), sdpa_float64(q, k, v, causal="top-left"), atol=2e-5, rtol=1e-4)
    out.sum().backward()
    assert q_bhsd.grad.shape == q_bhsd.shape


@pytest.mark.parametrize("device", DEVICES)
def test_generic_entry_point_on_tensors(device):
    q, k, v = qkv(1, 7, 9, 2, 1, 8, 8, device=device, requires_grad=True)
    require_backend(q, k, v)
    out, lse = fmha.attention(q, k, v, return_lse=True)
    assert out.grad_fn is not None  # routed through the autograd op
    buffer = torch.empty_like(out)
    with torch.no_grad():
        assert fmha.attention(q, k, v, out=buffer) is buffer
    torch.testing.assert_close(buffer, out.detach())
    with pytest.raises(ValueError, match="out:"):
        fmha.attention(q, k, v, out=buffer)
    dq, dk, dv = fmha.attention_backward(q.detach(), k.detach(), v.detach(), out.detach(), torch.ones_like(out),
                                         lse)
    out.sum().backward()
    torch.testing.assert_close(dq, q.grad)
    torch.testing.assert_close(dk, k.grad)
    torch.testing.assert_close(dv, v.grad)


def test_errors_carry_the_argument():
    q, k, v = qkv(1, 4, 4, 2, 2, 8, 8)
    with pytest.raises(TypeError, match="k: dtype"):
        ft.attention(q, k.half(), v)
    with pytest.raises(ValueError, match="k: kv_heads"):
        ft.attention(q, k[:, :, :1].expand(1, 4, 3, 8).contiguous(), v[:, :, :1].expand(1, 4, 3, 8).contiguous())
    with pytest.raises(ValueError, match="causal:"):
        ft.attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="q: expected a 4-d"):
        ft.attention(q[0], k, v)
    with pytest.raises(TypeError, match="q: dtype float64"):
        ft.attention(q.double(), k.double(), v.double())


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, k, v = qkv(1, 5, 7, 4, 2, 8, 8, device=device, requires_grad=True)
    require_backend(q, k, v, direction="backward")
    args = (q, k, v, 0.0, 2, -1, -1, 0, 0, False, "auto")
    torch.library.opcheck(torch.ops.fmha.attention_fwd.default, args)
    out, lse = torch.ops.fmha.attention_fwd(*args)
    bwd_args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), 0.0, 2, -1, -1, 0, 0,
                False, "auto")
    torch.library.opcheck(torch.ops.fmha.attention_bwd.default, bwd_args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(device, compiler):
    q, k, v = qkv(2, 11, 19, 4, 2, 16, 16, device=device, requires_grad=True)
    require_backend(q, k, v, direction="backward")
    torch._dynamo.reset()

    def loss_fn(q, k, v):
        out = ft.attention(q, k, v, causal="bottom-right", window=(5, None))
        return (out * out).sum()

    compiled = torch.compile(loss_fn, fullgraph=True, backend=compiler)
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    eager_loss = loss_fn(q, k, v)
    eager_grads = torch.autograd.grad(eager_loss, (q, k, v))
    torch.testing.assert_close(loss, eager_loss)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want)


@cuda_only
def test_cuda_graph_capture_and_replay():
    q, k, v = qkv(2, 64, 64, 4, 4, 64, 64, device="cuda", requires_grad=True)
    require_backend(q, k, v, direction="backward")
    dout = torch.randn(2, 64, 4, 64, device="cuda")

    def step():
        out = ft.attention(q, k, v, causal="top-left")
        grads = torch.autograd.grad(out, (q, k, v), dout)
        return out, grads

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up outside the graph
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out, graph_grads = step()
    with torch.no_grad():
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    eager_out, eager_grads = step()
    torch.testing.assert_close(graph_out, eager_out)
    for got, want in zip(graph_grads, eager_grads):
        torch.testing.assert_close(got, want)


@cuda_only
def test_runs_on_the_current_stream():
    """Inputs produced late on a side stream: fmha must run on that stream (torch's current one)
    to see them; a call on any other stream would read the stale values."""
    q, k, v = qkv(1, 256, 256, 4, 4, 64, 64, device="cuda")
    require_backend(q, k, v)
    expected = sdpa_float64(q * 2, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy
        q2 = q * 2
        out = ft.attention(q2, k, v)
        assert not side.query()
    side.synchronize()
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-4)
    # The generic entry point with an explicit stream.
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        q3 = q * 2
    out2 = fmha.attention(q3, k, v, stream=side)
    side.synchronize()
    torch.testing.assert_close(out2.double(), expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_op_and_eager_paths_agree(device):
    """fmha.torch.attention's eager path and the registered op (with its autograd formula) give
    the same values and gradients."""
    q, k, v = qkv(2, 9, 14, 4, 2, 16, 8, device=device, requires_grad=True)
    require_backend(q, k, v, direction="backward")
    dout = torch.randn(2, 9, 4, 8, device=device)
    eager = ft.attention(q, k, v, causal="top-left", window=(3, None), q_offset=2)
    eager_grads = torch.autograd.grad(eager, (q, k, v), dout)
    op_out, _ = torch.ops.fmha.attention_fwd(q, k, v, 0.0, 1, 3, -1, 2, 0, False, "auto")
    op_grads = torch.autograd.grad(op_out, (q, k, v), dout)
    torch.testing.assert_close(op_out, eager, rtol=0, atol=0)
    for got, want in zip(op_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
