"""fmha.torch.attention_varlen (autograd, torch.compile, CUDA graphs) and
fmha.torch.attention_with_kvcache (torch.compile, CUDA graphs): packed batches against a float64
PyTorch reference run per sequence and against dense fmha.torch.attention per sequence, finite
differences, opcheck of the ops, compiled against eager. CPU tensors wherever PyTorch is
installed; CUDA tensors where a GPU, a CUDA build of fmha and a GPU backend for the call exist."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fmha  # noqa: E402
import fmha.torch as ft  # noqa: E402
import reference  # noqa: E402
from test_kvcache import paged_cache  # noqa: E402
from test_torch import DEVICES, cuda_only  # noqa: E402

FORWARD_TOLERANCE = dict(atol=2e-5, rtol=1e-4)  # fp32 against float64, as test_torch
BACKWARD_TOLERANCE = dict(atol=2e-4, rtol=1e-3)


def packed(lengths_q, lengths_k, heads, kv_heads, head_dim, head_dim_v, device="cpu", dtype=torch.float32, seed=0):
    """q, k, v (leaves that require grad), dout, and the int32 tables cu_seqlens_q, cu_seqlens_k."""
    generator = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    shapes = [(total_q, heads, head_dim), (total_k, kv_heads, head_dim), (total_k, kv_heads, head_dim_v),
              (total_q, heads, head_dim_v)]
    q, k, v, dout = (torch.randn(s, generator=generator).to(device=device, dtype=dtype) for s in shapes)
    tables = [torch.tensor(np.concatenate([[0], np.cumsum(n)]), dtype=torch.int32, device=device)
              for n in (lengths_q, lengths_k)]
    return [x.requires_grad_() for x in (q, k, v)] + [dout] + tables


def require_backend(q, k, v, direction="forward", **options):
    """Skips when no backend runs this call on q's device. select_backend sees the dense shape of
    one sequence: a packed call runs where the dense call does, except on the tiers that refuse
    packed calls, which `auto` passes over."""
    try:
        return fmha.select_backend(*(x.detach()[None] for x in (q, k, v)), direction=direction, **options)
    except ValueError as error:
        pytest.skip("no fmha backend for this call: %s" % error)


def attention_float64(q, k, v, causal=None, window=None, q_offset=0):
    """One sequence, q [Sq, H, D], k [Sk, Hkv, D], v [Sk, Hkv, Dv] as float64 PyTorch ops, so
    autograd gives the reference gradients: (out [Sq, H, Dv], lse [H, Sq]); a row that sees no
    key gets out 0 and lse -inf."""
    q, k, v = q.double(), k.double(), v.double()
    heads = q.shape[1]
    k, v = (x.repeat_interleave(heads // x.shape[1], dim=1) for x in (k, v))
    mask = torch.from_numpy(reference.visible(q.shape[0], k.shape[0], causal, window, q_offset)).to(q.device)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    seen = mask.any(dim=-1, keepdim=True)
    probabilities = torch.softmax(scores.masked_fill(~seen, 0.0), dim=-1) * seen  # no NaN from unseen rows
    return torch.einsum("hqk,khd->qhd", probabilities, v), lse


def per_sequence(function, q, k, v, cu_q, cu_k, **options):
    """function(q_b, k_b, v_b) over the sequences of a packed batch, out and lse packed again."""
    outs, lses = [], []
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        out, lse = function(q[rows], k[keys], v[keys], **options)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


# lengths_q, lengths_k, heads, kv_heads, head_dim, head_dim_v, causal, window, q_offset
CASES = [
    ([17, 0, 40, 1, 9], [30, 12, 0, 1, 70], 4, 2, 16, 8, "bottom-right", None, 0),  # empty sequences, GQA
    ([17, 0, 40, 1, 9], [30, 12, 0, 1, 70], 4, 2, 16, 8, "top-left", (5, None), 2),
    ([33, 5, 64], [33, 80, 20], 8, 1, 32, 32, None, None, 0),  # MQA
    ([1], [1], 2, 2, 8, 8, "top-left", None, 0),  # a single sequence of length 1
    ([12, 30], [12, 30], 6, 3, 16, 24, None, (4, 3), 0),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "%dseq-h%d/%d-%s-%s-%s" % ((len(c[0]),) + c[2:4] + c[6:]))
def test_matches_float64_per_sequence(device, case):
    lengths_q, lengths_k, heads, kv_heads, head_dim, head_dim_v, causal, window, q_offset = case
    q, k, v, dout, cu_q, cu_k = packed(lengths_q, lengths_k, heads, kv_heads, head_dim, head_dim_v, device)
    options = dict(causal=causal, window=window, q_offset=q_offset)
    require_backend(q[:1], k[:1], v[:1], direction="backward", **options)
    out, lse = ft.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), return_lse=True, **options)
    assert out.shape == (sum(lengths_q), heads, head_dim_v) and lse.shape == (heads, sum(lengths_q))
    assert out.grad_fn is not None and not lse.requires_grad

    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    expected, expected_lse = per_sequence(attention_float64, q64, k64, v64, cu_q, cu_k, **options)
    torch.testing.assert_close(out.double(), expected, **FORWARD_TOLERANCE)
    torch.testing.assert_close(lse.double(), expected_lse, **FORWARD_TOLERANCE)

    grads = torch.autograd.grad(out, (q, k, v), dout)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), dout.double())
    for name, got, want in zip(("dq", "dk", "dv"), grads, expected_grads):
        torch.testing.assert_close(got.double(), want, **BACKWARD_TOLERANCE, msg=lambda m: name + ": " + m)


@pytest.mark.parametrize("device", DEVICES)
def test_matches_dense_attention_per_sequence(device):
    """A packed batch gives each sequence what fmha.torch.attention gives it alone: values and
    gradients (keys of sequences without query rows get zero gradients)."""
    lengths_q, lengths_k = [9, 0, 21, 4], [15, 6, 21, 0]
    q, k, v, dout, cu_q, cu_k = packed(lengths_q, lengths_k, 4, 2, 16, 16, device, seed=1)
    options = dict(causal="bottom-right", window=(7, None))
    require_backend(q[:1], k[:1], v[:1], direction="backward", **options)
    out = ft.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), **options)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    def dense(q, k, v, **options):
        if q.shape[0] == 0 or k.shape[0] == 0:  # nothing to run densely: rows see no key
            return q.new_zeros(q.shape), q.new_full((q.shape[1], q.shape[0]), -math.inf)
        out, lse = ft.attention(q[None], k[None], v[None], return_lse=True, **options)
        return out[0], lse[0]

    expected, _ = per_sequence(dense, q, k, v, cu_q, cu_k, **options)
    expected_grads = torch.autograd.grad(expected, (q, k, v), dout, allow_unused=True, materialize_grads=True)
    torch.testing.assert_close(out, expected, **FORWARD_TOLERANCE)
    for name, got, want in zip(("dq", "dk", "dv"), grads, expected_grads):
        torch.testing.assert_close(got, want, **BACKWARD_TOLERANCE, msg=lambda m: name + ": " + m)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_finite_differences(device):
    """As test_torch's gradcheck: float64 inputs rounded to fp32 in the wrapper, so the finite
    differences see fmha's forward and the analytical Jacobian is fmha's backward. Sequences of
    length 0 on either side included."""
    q, k, v, _, cu_q, cu_k = packed([2, 0, 3, 2], [3, 2, 4, 0], 2, 1, 4, 3, device, dtype=torch.float64, seed=3)
    require_backend(q[:1].float(), k[:1].float(), v[:1].float(), direction="backward")

    def attention_fp32(q, k, v):
        return ft.attention_varlen(q.float(), k.float(), v.float(), cu_q, cu_k, 3, 4, causal="bottom-right").double()

    assert torch.autograd.gradcheck(attention_fp32, (q, k, v), eps=1e-3, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("lengths", [([0, 0], [3, 4]), ([2, 3], [0, 0]), ([0], [0])], ids=str)
def test_batches_without_queries_or_keys(lengths):
    """No query rows at all, or no keys at all: empty or zero results, -inf lse, zero gradients."""
    q, k, v, dout, cu_q, cu_k = packed(*lengths, 2, 1, 8, 8)
    out, lse = ft.attention_varlen(q, k, v, cu_q, cu_k, causal="bottom-right", return_lse=True)
    assert out.shape == (sum(lengths[0]), 2, 8) and lse.shape == (2, sum(lengths[0]))
    assert torch.all(out == 0) and torch.all(lse == -math.inf)
    for grad in torch.autograd.grad(out, (q, k, v), dout):
        assert torch.all(grad == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_op_and_eager_paths_agree(device):
    """The eager path (plain function, autograd.Function) and the registered op with its autograd
    formula give the same values and gradients, bit for bit."""
    q, k, v, dout, cu_q, cu_k = packed([5, 0, 11], [7, 3, 11], 4, 2, 16, 8, device, seed=2)
    require_backend(q[:1], k[:1], v[:1], direction="backward")
    eager = ft.attention_varlen(q, k, v, cu_q, cu_k, 11, 11, causal="top-left", window=(3, None), q_offset=2)
    eager_grads = torch.autograd.grad(eager, (q, k, v), dout)
    op_out, _ = torch.ops.fmha.attention_varlen_fwd(q, k, v, cu_q, cu_k, 11, 11, 0.0, 1, 3, -1, 2, 0, False, "auto")
    op_grads = torch.autograd.grad(op_out, (q, k, v), dout)
    torch.testing.assert_close(op_out, eager, rtol=0, atol=0)
    for got, want in zip(op_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, k, v, dout, cu_q, cu_k = packed([5, 0, 7], [6, 2, 9], 4, 2, 8, 8, device)
    require_backend(q[:1], k[:1], v[:1], direction="backward")
    options = (0.0, 2, -1, -1, 0, 0, False, "auto")
    args = (q, k, v, cu_q, cu_k, 7, 9) + options
    torch.library.opcheck(torch.ops.fmha.attention_varlen_fwd.default, args)
    out, lse = torch.ops.fmha.attention_varlen_fwd(*args)
    detached = tuple(x.detach() for x in (q, k, v, out, lse))
    torch.library.opcheck(torch.ops.fmha.attention_varlen_bwd.default,
                          (dout,) + detached + (cu_q, cu_k, 7, 9) + options)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(device, compiler):
    """The compiled forward runs fmha::attention_varlen_fwd and its backward graph
    fmha::attention_varlen_bwd (counted), with eager's values and gradients."""
    q, k, v, _, cu_q, cu_k = packed([13, 0, 29, 4], [20, 5, 29, 1], 4, 2, 16, 16, device)
    require_backend(q[:1], k[:1], v[:1], direction="backward")
    torch._dynamo.reset()

    def loss_fn(q, k, v, cu_q, cu_k):
        out = ft.attention_varlen(q, k, v, cu_q, cu_k, 29, 29, causal="bottom-right", window=(6, None))
        return (out * out).sum()

    compiled = torch.compile(loss_fn, fullgraph=True, backend=compiler)
    with count_calls() as calls:
        loss = compiled(q, k, v, cu_q, cu_k)
        grads = torch.autograd.grad(loss, (q, k, v))
    assert calls == {"fwd": 1, "bwd": 1}
    eager_loss = loss_fn(q, k, v, cu_q, cu_k)
    eager_grads = torch.autograd.grad(eager_loss, (q, k, v))
    torch.testing.assert_close(loss, eager_loss)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want)


def test_torch_compile_dynamic_shapes():
    """One graph for packed batches of any total length, count of sequences and longest length
    (dynamic=True): the fakes and the autograd formula work on symbolic sizes."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()

    def loss_fn(q, k, v, cu_q, cu_k, max_q, max_k):
        return (ft.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal="bottom-right") ** 2).sum()

    compiled = torch.compile(loss_fn, fullgraph=True, backend=counter, dynamic=True)
    for seed, (lengths_q, lengths_k) in enumerate([([5, 0, 9], [7, 2, 9]), ([12, 3], [12, 30]),
                                                   ([1, 1, 1, 1], [4, 3, 2, 1])]):
        q, k, v, _, cu_q, cu_k = packed(lengths_q, lengths_k, 6, 3, 16, 16, seed=seed)
        args = (q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k))
        got = torch.autograd.grad(compiled(*args), (q, k, v))
        for x, y in zip(got, torch.autograd.grad(loss_fn(*args), (q, k, v))):
            torch.testing.assert_close(x, y, atol=0, rtol=0)
    assert counter.frame_count == 1


class count_calls:
    """Counts the calls of the packed ops' implementations ('fwd', 'bwd') within the block (the
    dict is the context value). The eager path runs the same functions through _PACKED's own
    references, which stay uncounted: a count means the op ran."""

    def __enter__(self):
        self.calls = {"fwd": 0, "bwd": 0}
        self.saved = ft._varlen_forward, ft._varlen_backward

        def counted(name, function):
            def call(*args, **kwargs):
                self.calls[name] += 1
                return function(*args, **kwargs)
            return call

        ft._varlen_forward = counted("fwd", self.saved[0])
        ft._varlen_backward = counted("bwd", self.saved[1])
        return self.calls

    def __exit__(self, *exc):
        ft._varlen_forward, ft._varlen_backward = self.saved


def test_compiled_call_needs_max_seqlen():
    q, k, v, _, cu_q, cu_k = packed([3, 4], [3, 4], 2, 2, 8, 8)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: ft.attention_varlen(q, k, v, cu_q, cu_k), fullgraph=True,
                             backend="aot_eager")
    with pytest.raises(Exception, match="max_seqlen_q: required under torch.compile"):
        compiled(q, k, v)


def test_generic_entry_point_and_errors():
    q, k, v, dout, cu_q, cu_k = packed([3, 0, 5], [4, 2, 5], 4, 2, 8, 8)
    out = fmha.attention_varlen(q, k, v, cu_q, cu_k)  # max_seqlen read off the CPU tables
    assert out.grad_fn is not None  # routed through fmha.torch
    buffer = torch.empty_like(out)
    with torch.no_grad():
        assert fmha.attention_varlen(q, k, v, cu_q, cu_k, out=buffer) is buffer
    torch.testing.assert_close(buffer, out.detach(), atol=0, rtol=0)
    with pytest.raises(ValueError, match="out:.*fmha.torch.attention_varlen"):
        fmha.attention_varlen(q, k, v, cu_q, cu_k, out=buffer)
    with torch.no_grad():
        out, lse = ft.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True)
    expected = torch.autograd.grad(fmha.attention_varlen(q, k, v, cu_q, cu_k), (q, k, v), dout)
    detached = (q.detach(), k.detach(), v.detach(), out, dout, lse, cu_q, cu_k)
    for backward in (fmha.attention_varlen_backward, ft.attention_varlen_backward):
        for got, want in zip(backward(*detached), expected):
            torch.testing.assert_close(got, want, atol=0, rtol=0)

    with pytest.raises(TypeError, match="cu_seqlens_k: expected an int32 torch.Tensor, got list"):
        ft.attention_varlen(q, k, v, cu_q, [0, 4, 6, 11])
    with pytest.raises(TypeError, match="cu_seqlens_q: dtype int64 is not supported; expected int32"):
        ft.attention_varlen(q, k, v, cu_q.long(), cu_k)
    with pytest.raises(ValueError, match="q: expected a 3-d array"):
        ft.attention_varlen(q[None], k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match="cu_seqlens_k: last entry is 10, expected 11"):
        ft.attention_varlen(q, k, v, cu_q, torch.tensor([0, 4, 6, 10], dtype=torch.int32), max_seqlen_k=5)
    with pytest.raises(ValueError, match="above max_seqlen_q = 4"):
        ft.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=4)


@cuda_only
def test_cuda_graph_capture_and_replay():
    """Device tables and the max lengths given: no host read, so the forward and backward are
    captured in a CUDA graph and replayed on new values of q, k, v and new tables."""
    lengths_q, lengths_k = [100, 0, 37, 64], [128, 9, 40, 64]
    q, k, v, dout, cu_q, cu_k = packed(lengths_q, lengths_k, 4, 2, 64, 64, "cuda")
    require_backend(q[:1], k[:1], v[:1], direction="backward")
    with pytest.raises(ValueError, match="max_seqlen_q: required when the sequence tables are in device memory"):
        ft.attention_varlen(q, k, v, cu_q, cu_k)  # reading them would synchronize

    def step():
        out = ft.attention_varlen(q, k, v, cu_q, cu_k, 128, 128, causal="bottom-right")
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up outside the graph
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        cu_q.copy_(torch.tensor([0, 90, 90, 127, 201], dtype=torch.int32))  # same totals, other lengths
        cu_k.copy_(torch.tensor([0, 128, 128, 177, 241], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, step()):
        torch.testing.assert_close(got, want)


@cuda_only
def test_torch_compile_with_cuda_graphs():
    """torch.compile's mode="reduce-overhead" records the compiled forward and backward in CUDA
    graphs and replays them."""
    q, k, v, dout, cu_q, cu_k = packed([50, 0, 64, 7], [64, 3, 64, 20], 4, 2, 64, 64, "cuda", seed=5)
    require_backend(q[:1], k[:1], v[:1], direction="backward")
    torch._dynamo.reset()

    def loss_fn(q, k, v, cu_q, cu_k):
        return (ft.attention_varlen(q, k, v, cu_q, cu_k, 64, 64, causal="bottom-right") * dout).sum()

    compiled = torch.compile(loss_fn, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # warm-up, recording, replay
        grads = [g.clone() for g in torch.autograd.grad(compiled(q, k, v, cu_q, cu_k), (q, k, v))]
    for got, want in zip(grads, torch.autograd.grad(loss_fn(q, k, v, cu_q, cu_k), (q, k, v))):
        torch.testing.assert_close(got, want)


# attention_with_kvcache: forward only.

def kvcache_inputs(device="cpu", seed=4):
    lengths = [33, 1, 0, 47]
    k_cache, v_cache, table, cache_seqlens = paged_cache(lengths, 16, 2, 16, 16, spare_pages=6, seed=seed)
    # Room for one new row per sequence: a spare page where a sequence's last page is full.
    used = set(table[table >= 0].tolist())
    spare = [p for p in range(k_cache.shape[0]) if p not in used]
    for b, length in enumerate(lengths):
        if table[b, length // 16] < 0:
            table[b, length // 16] = spare.pop()
    rng = np.random.default_rng(seed + 1)
    q = rng.standard_normal((len(lengths), 2, 4, 16)).astype(np.float32)
    k_new, v_new = (rng.standard_normal((len(lengths), 1, 2, 16)).astype(np.float32) for _ in range(2))
    return [torch.from_numpy(x).to(device) for x in (q, k_cache, v_cache, table, cache_seqlens, k_new, v_new)]


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_kvcache_torch_compile_fullgraph(compiler):
    """Attention on a paged cache, then appending a row and attending again, compiled as one
    graph: the same cache writes and results as the eager calls (and as NumPy's)."""
    q, k_cache, v_cache, table, cache_seqlens, k_new, v_new = kvcache_inputs()
    torch._dynamo.reset()

    def decode(q, k_cache, v_cache, table, cache_seqlens, k_new, v_new):
        before, lse = ft.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, causal="bottom-right",
                                                return_lse=True)
        after = ft.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, k=k_new, v=v_new,
                                          causal="bottom-right", window=(20, None))
        return before, lse, after

    eager_cache = (k_cache.clone(), v_cache.clone())
    compiled = torch.compile(decode, fullgraph=True, backend=compiler)
    got = compiled(q, k_cache, v_cache, table, cache_seqlens, k_new, v_new)
    want = decode(q, *eager_cache, table, cache_seqlens, k_new, v_new)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, atol=0, rtol=0)
    torch.testing.assert_close(k_cache, eager_cache[0], atol=0, rtol=0)  # the compiled call wrote the cache
    torch.testing.assert_close(v_cache, eager_cache[1], atol=0, rtol=0)
    assert not torch.equal(k_cache, kvcache_inputs()[1])
    out_np = fmha.attention_with_kvcache(*(x.numpy() for x in kvcache_inputs()[:5]), causal="bottom-right")
    np.testing.assert_array_equal(got[0].numpy(), out_np)


def test_kvcache_opcheck_and_refusals():
    q, k_cache, v_cache, table, cache_seqlens, k_new, v_new = kvcache_inputs()
    options = (0.0, 2, -1, -1, 0, 0, "auto")
    torch.library.opcheck(torch.ops.fmha.attention_with_kvcache.default, (q, k_cache, v_cache, table, cache_seqlens)
                          + options)
    torch.library.opcheck(torch.ops.fmha.attention_with_kvcache.default, (q, k_cache[:4 * 3].reshape(4, 48, 2, 16),
                          v_cache[:4 * 3].reshape(4, 48, 2, 16), None, None) + options)
    torch.library.opcheck(torch.ops.fmha.append_kv.default, (k_cache, v_cache, k_new, v_new, cache_seqlens, table))
    with pytest.raises(ValueError, match="attention_with_kvcache: is forward only"):
        ft.attention_with_kvcache(q.requires_grad_(), k_cache, v_cache, table, cache_seqlens)
    with pytest.raises(ValueError, match="attention_with_kvcache: is forward only"):
        fmha.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens)
    q = q.detach()
    with pytest.raises(ValueError, match="k, v: pass both"):
        ft.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, k=k_new)
    with pytest.raises(ValueError, match=r"block_table\[0\]\[0\]"):
        ft.attention_with_kvcache(q, k_cache, v_cache, torch.full_like(table, 10_000), cache_seqlens)
    with pytest.raises(ValueError, match="k_cache: expected a 4-d array"):
        ft.attention_with_kvcache(q, k_cache[0], v_cache, table, cache_seqlens)


@cuda_only
def test_kvcache_cuda_graph_capture_and_replay():
    """A decoding step (append a row, attend) captured in a CUDA graph and replayed with new
    inputs. Skips while the GPU tiers refuse a KV cache."""
    q, k_cache, v_cache, table, cache_seqlens, k_new, v_new = kvcache_inputs("cuda")
    try:
        ft.attention_with_kvcache(q, k_cache.clone(), v_cache.clone(), table, cache_seqlens, k=k_new, v=v_new)
    except ValueError as error:
        pytest.skip("no GPU backend for a KV cache: %s" % error)

    def step():
        return ft.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, k=k_new, v=v_new,
                                         causal="bottom-right")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        for x in (q, k_new, v_new):
            x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, step())
