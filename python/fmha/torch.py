"""PyTorch integration: fmha.torch.attention and attention_varlen with autograd, and
attention_with_kvcache, as torch.library custom ops.

    fmha::attention_fwd(q, k, v, ...) -> (out, lse)
    fmha::attention_bwd(dout, q, k, v, out, lse, ...) -> (dq, dk, dv)
    fmha::attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)
    fmha::attention_varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, ..., max_seqlen_k, ...)
    fmha::attention_with_kvcache(q, k_cache, v_cache, block_table, cache_seqlens, ...) -> (out, lse)
    fmha::append_kv(k_cache!, v_cache!, k, v, cache_seqlens, block_table)

All have fake (meta) implementations and each differentiable forward an autograd formula that
runs its backward op, so torch.compile(fullgraph=True) captures them without a graph break. Every
buffer (outputs, workspace) comes from torch.empty on the inputs' device, i.e. from PyTorch's
caching allocator, and the kernels run on torch's current stream with no synchronization, so the
ops can be captured in CUDA graphs.
"""

from typing import NamedTuple, Optional, Tuple

import torch

from . import _C
from ._api import (
    _DENSE_LAYOUT,
    _PACKED_LAYOUT,
    _PAGED_LAYOUT,
    _require_rank,
    _torch_grad_wanted,
    check_new_rows,
    grown_lengths,
    max_seqlen,
    options_from_parsed,
    parse_options,
    result_shapes,
    seqlen_new,
)
from ._frameworks import current_torch_stream

__all__ = [
    "attention", "attention_backward", "attention_varlen", "attention_varlen_backward", "attention_with_kvcache",
]

_to_dlpack = torch._C._to_dlpack
_Tensor = torch.Tensor
_NO_TABLES: dict = {}  # a dense call's extra arguments to the extension: none

# Options objects by (op arguments, stream): a model reuses a handful of them.
_options_cache: dict = {}


def _options(scale, causal, window_left, window_right, q_offset, precision, deterministic, backend, device):
    stream, threads = _stream_and_threads(device)
    key = (scale, causal, window_left, window_right, q_offset, precision, deterministic, backend, stream, threads)
    options = _options_cache.get(key)
    if options is None:
        if len(_options_cache) >= 256:
            _options_cache.clear()
        parsed = (causal, window_left, window_right, scale, q_offset, precision, backend, deterministic)
        options = _options_cache[key] = options_from_parsed(parsed, stream, threads)
    return options


def _stream_and_threads(device):
    """(cudaStream_t of torch's current stream, 0) for CUDA tensors; (0, torch's intra-op thread
    count) for CPU tensors."""
    if device.type == "cuda":
        return current_torch_stream(torch, device.index), 0
    return 0, torch.get_num_threads()


class _DeviceGuard:
    """Makes the tensors' CUDA device current for the call when it is not already."""

    __slots__ = ("index", "previous")

    def __init__(self, device):
        self.index = device.index if device.type == "cuda" else None
        self.previous = None

    def __enter__(self):
        if self.index is not None:
            current = torch.cuda.current_device()
            if current != self.index:
                self.previous = current
                torch.cuda.set_device(self.index)

    def __exit__(self, *exc):
        if self.previous is not None:
            torch.cuda.set_device(self.previous)


def _export(tables):
    """The extension's keyword arguments for a call's tables (sequence tables, a KV cache's block
    table and lengths): tensors exported afresh (a DLPack capsule is consumed by one call)."""
    if not tables:
        return tables
    return {name: _to_dlpack(value) if isinstance(value, _Tensor) else value for name, value in tables.items()}


def _run_with_workspace(run, device):
    """run(None) returns the workspace bytes the call needs (0: it ran, CPU calls always); then
    run with a workspace from torch's caching allocator (graph-private memory while a CUDA graph
    is captured), on the tensors' device."""
    with _DeviceGuard(device):
        needed = run(None)
        if needed:
            run(_to_dlpack(torch.empty((needed,), dtype=torch.uint8, device=device)))


def _forward(q, k, v, scale, causal, window_left, window_right, q_offset, precision, deterministic, backend,
             with_lse=True, tables=_NO_TABLES):
    """out and lse (None when with_lse is False: an inference call that needs no LSE skips it).
    tables: the extension's keyword arguments beyond the dense call's (see _export)."""
    device = q.device
    out_shape, lse_shape = result_shapes(q.shape, v.shape)
    out = torch.empty(out_shape, dtype=q.dtype, device=device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=device) if with_lse else None
    options = _options(scale, causal, window_left, window_right, q_offset, precision, deterministic, backend, device)

    if device.type != "cuda":  # CPU backends need no workspace (and the call is the hot path)
        _C.forward(_to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out), _to_dlpack(lse) if with_lse else None,
                   None, options, **_export(tables))
        return out, lse

    def run(workspace):
        return _C.forward(_to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out),
                          _to_dlpack(lse) if with_lse else None, workspace, options, **_export(tables))

    _run_with_workspace(run, device)
    return out, lse


def _backward_impl(dout, q, k, v, out, lse, scale, causal, window_left, window_right, q_offset, precision,
                   deterministic, backend, tables=_NO_TABLES):
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    device = q.device
    options = _options(scale, causal, window_left, window_right, q_offset, precision, deterministic, backend, device)
    args = (q, k, v, out, dout, lse, dq, dk, dv)

    def run(workspace):
        return _C.backward(*[_to_dlpack(t) for t in args], workspace, options, **_export(tables))

    _run_with_workspace(run, device)
    return dq, dk, dv


def _varlen_tables(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    return dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k)


def _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *options, with_lse=True):
    return _forward(q, k, v, *options, with_lse=with_lse,
                    tables=_varlen_tables(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


def _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *options):
    return _backward_impl(dout, q, k, v, out, lse, *options,
                          tables=_varlen_tables(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


def _kvcache_forward(q, k_cache, v_cache, block_table, cache_seqlens, scale, causal, window_left, window_right,
                     q_offset, precision, backend, with_lse=True):
    # deterministic (False) only concerns a backward.
    return _forward(q, k_cache, v_cache, scale, causal, window_left, window_right, q_offset, precision, False,
                    backend, with_lse=with_lse, tables=dict(block_table=block_table, cache_seqlens=cache_seqlens))


# The ops. Their schemas put the tensors first (q, k, v, then any tables), the options after; the
# backward ops take (dout, q, k, v, out, lse) followed by the forward's arguments after q, k, v.
# One fake per direction serves every layout, its shapes being result_shapes'.

@torch.library.custom_op("fmha::attention_fwd", mutates_args=())
def attention_fwd(
    q: _Tensor,
    k: _Tensor,
    v: _Tensor,
    scale: float,
    causal: int,
    window_left: int,
    window_right: int,
    q_offset: int,
    precision: int,
    deterministic: bool,
    backend: str,
) -> Tuple[_Tensor, _Tensor]:
    return _forward(q, k, v, scale, causal, window_left, window_right, q_offset, precision, deterministic, backend)


@torch.library.custom_op("fmha::attention_bwd", mutates_args=())
def attention_bwd(
    dout: _Tensor,
    q: _Tensor,
    k: _Tensor,
    v: _Tensor,
    out: _Tensor,
    lse: _Tensor,
    scale: float,
    causal: int,
    window_left: int,
    window_right: int,
    q_offset: int,
    precision: int,
    deterministic: bool,
    backend: str,
) -> Tuple[_Tensor, _Tensor, _Tensor]:
    return _backward_impl(dout, q, k, v, out, lse, scale, causal, window_left, window_right, q_offset, precision,
                          deterministic, backend)


@torch.library.custom_op("fmha::attention_varlen_fwd", mutates_args=())
def attention_varlen_fwd(
    q: _Tensor,
    k: _Tensor,
    v: _Tensor,
    cu_seqlens_q: _Tensor,
    cu_seqlens_k: _Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
    causal: int,
    window_left: int,
    window_right: int,
    q_offset: int,
    precision: int,
    deterministic: bool,
    backend: str,
) -> Tuple[_Tensor, _Tensor]:
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal,
                           window_left, window_right, q_offset, precision, deterministic, backend)


@torch.library.custom_op("fmha::attention_varlen_bwd", mutates_args=())
def attention_varlen_bwd(
    dout: _Tensor,
    q: _Tensor,
    k: _Tensor,
    v: _Tensor,
    out: _Tensor,
    lse: _Tensor,
    cu_seqlens_q: _Tensor,
    cu_seqlens_k: _Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
    causal: int,
    window_left: int,
    window_right: int,
    q_offset: int,
    precision: int,
    deterministic: bool,
    backend: str,
) -> Tuple[_Tensor, _Tensor, _Tensor]:
    return _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                            causal, window_left, window_right, q_offset, precision, deterministic, backend)


@torch.library.custom_op("fmha::attention_with_kvcache", mutates_args=())
def attention_with_kvcache_fwd(
    q: _Tensor,
    k_cache: _Tensor,
    v_cache: _Tensor,
    block_table: Optional[_Tensor],
    cache_seqlens: Optional[_Tensor],
    scale: float,
    causal: int,
    window_left: int,
    window_right: int,
    q_offset: int,
    precision: int,
    backend: str,
) -> Tuple[_Tensor, _Tensor]:
    return _kvcache_forward(q, k_cache, v_cache, block_table, cache_seqlens, scale, causal, window_left, window_right,
                            q_offset, precision, backend)


@torch.library.custom_op("fmha::append_kv", mutates_args=("k_cache", "v_cache"))
def append_kv_op(
    k_cache: _Tensor, v_cache: _Tensor, k: _Tensor, v: _Tensor, cache_seqlens: _Tensor, block_table: Optional[_Tensor]
) -> None:
    _append_kv(k_cache, v_cache, k, v, cache_seqlens, block_table)


def _fake_forward(q, k, v, *tables_and_options):
    out_shape, lse_shape = result_shapes(q.shape, v.shape)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


def _fake_backward(dout, q, k, v, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


for _op in (attention_fwd, attention_varlen_fwd, attention_with_kvcache_fwd):
    _op.register_fake(_fake_forward)
for _op in (attention_bwd, attention_varlen_bwd):
    _op.register_fake(_fake_backward)
append_kv_op.register_fake(lambda *args: None)


class _Layout(NamedTuple):
    """A differentiable layout (dense or packed): its forward and backward, as ops (what
    torch.compile traces) and as plain functions (what eager calls run), and how many tensors (the
    sequence tables) follow q, k, v among the forward's arguments."""

    forward_op: object
    backward_op: object
    forward: object
    backward: object
    num_tables: int


_DENSE = _Layout(attention_fwd, attention_bwd, _forward, _backward_impl, 0)
_PACKED = _Layout(attention_varlen_fwd, attention_varlen_bwd, _varlen_forward, _varlen_backward, 2)


def _save(ctx, inputs, output, num_tables):
    """Keeps what the backward needs: q, k, v, the tables, out and lse as saved tensors, the rest
    of the forward's arguments (the options) as they are."""
    ctx.save_for_backward(*inputs[:3 + num_tables], *output)
    ctx.options = inputs[3 + num_tables:]
    ctx.num_inputs = len(inputs)


def _gradients(ctx, backward, grad_out):
    """(dq, dk, dv) and None for every other argument of the forward, by `backward` (an op or its
    plain function) on what _save kept."""
    saved = ctx.saved_tensors
    q, k, v = saved[:3]
    tables = saved[3:-2]
    out, lse = saved[-2:]
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    dq, dk, dv = backward(grad_out, q, k, v, out, lse, *tables, *ctx.options)
    return (dq, dk, dv) + (None,) * (ctx.num_inputs - 3)


def _register_autograd(layout):
    def setup_context(ctx, inputs, output):
        _save(ctx, inputs, output, layout.num_tables)

    def backward(ctx, grad_out, grad_lse):
        # lse is handed out detached (see _attend), so grad_lse carries nothing.
        return _gradients(ctx, layout.backward_op, grad_out)

    layout.forward_op.register_autograd(backward, setup_context=setup_context)


_register_autograd(_DENSE)
_register_autograd(_PACKED)


class _EagerAttention(torch.autograd.Function):
    """The same forward and backward as a layout's ops, for eager calls that record gradients:
    skips the dispatcher round trips of a Python custom op (see _attend)."""

    @staticmethod
    def forward(ctx, layout, q, k, v, *tables_and_options):
        out, lse = layout.forward(q, k, v, *tables_and_options)
        _save(ctx, (q, k, v) + tables_and_options, (out, lse), layout.num_tables)
        ctx.layout = layout
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return (None,) + _gradients(ctx, ctx.layout.backward, grad_out)


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled


def _eager_fast_path(tensors):
    """True for plain tensors (or None) outside torch.compile and outside any dispatch or function
    mode: then calling the implementation directly is indistinguishable from calling the op."""
    if _is_compiling() or _dispatch_modes() or _function_modes():
        return False
    for t in tensors:
        if t is not None and type(t) not in _PLAIN_TENSORS:
            return False
    return True


def _check_tensors(tensors, layout):
    """Each of `tensors` a torch.Tensor of its rank in `layout` (_api's (name, dims) pairs)."""
    for t, (name, dims) in zip(tensors, layout):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
        _require_rank(t, name, dims)


def _check_tables(**tables):
    for name, t in tables.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: expected an int32 torch.Tensor, got %s" % (name, type(t).__name__))


def _last_dim_contiguous(t):
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _op_options(causal, window, scale, q_offset, precision, backend, deterministic):
    """The keyword options checked and in the ops' order: (scale, causal, window_left,
    window_right, q_offset, precision, deterministic, backend)."""
    causal_code, window_left, window_right, scale_value, q_offset, precision_code, backend, deterministic = (
        parse_options(causal, window, scale, q_offset, precision, backend, deterministic)
    )
    return (scale_value, causal_code, window_left, window_right, q_offset, precision_code, deterministic, backend)


def _attend(layout, q, k, v, tables, options, return_lse):
    """A differentiable layout's forward on q, k, v and its tables: the op under torch.compile,
    tensor subclasses or dispatch/function modes; otherwise the same implementation called
    directly (through _EagerAttention when gradients are recorded), which saves the dispatcher's
    round trips into Python."""
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    args = (q, k, v) + tables + options
    if not _eager_fast_path(args[:3 + layout.num_tables]):
        out, lse = layout.forward_op(*args)
    elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _EagerAttention.apply(layout, *args)
    else:
        out, lse = layout.forward(*args, with_lse=return_lse)
    if return_lse:
        return out, lse.detach()
    return out


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: Optional[str] = None,
    window=None,
    scale: Optional[float] = None,
    q_offset: int = 0,
    precision: Optional[str] = None,
    backend: str = "auto",
    deterministic: bool = False,
    return_lse: bool = False,
):
    """fmha.attention for PyTorch tensors, differentiable (the backward runs fmha's backward).

    Same arguments as fmha.attention; runs on torch's current stream (CUDA) or with
    torch.get_num_threads() threads (CPU). Inputs whose last dimension is not contiguous are
    copied. With return_lse, lse is returned detached (no gradient flows through it).
    `deterministic` applies to the backward.

    Under torch.compile, tensor subclasses or dispatch/function modes this calls the custom op
    torch.ops.fmha.attention_fwd; plain eager calls run the same implementation directly (and an
    equivalent autograd.Function when gradients are recorded), which saves the dispatcher's
    round trips into Python.
    """
    options = _op_options(causal, window, scale, q_offset, precision, backend, deterministic)
    try:
        well_formed = q.dim() == 4 and k.dim() == 4 and v.dim() == 4
    except AttributeError:
        well_formed = False
    if not well_formed:
        _check_tensors((q, k, v), _DENSE_LAYOUT)
    return _attend(_DENSE, q, k, v, (), options, return_lse)


def attention_backward(
    q, k, v, out, dout, lse, *, causal=None, window=None, scale=None, q_offset=0, precision=None, backend="auto",
    deterministic=False,
):
    """(dq, dk, dv) through the fmha::attention_bwd op (traceable by torch.compile)."""
    options = _op_options(causal, window, scale, q_offset, precision, backend, deterministic)
    return attention_bwd(_last_dim_contiguous(dout), q, k, v, out, lse, *options)


def _max_seqlen(table, given, name):
    """max_seqlen_q / max_seqlen_k: as given, or read off a CPU table in an eager call (under
    torch.compile reading the table's data would stop the graph, on a GPU it would synchronize)."""
    if given is None and _is_compiling():
        raise ValueError("%s: required under torch.compile (the graph cannot read it off the table)" % name)
    return max_seqlen(table, given, name)


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    *,
    causal: Optional[str] = None,
    window=None,
    scale: Optional[float] = None,
    q_offset: int = 0,
    precision: Optional[str] = None,
    backend: str = "auto",
    deterministic: bool = False,
    return_lse: bool = False,
):
    """fmha.attention_varlen for PyTorch tensors, differentiable (the backward runs fmha's packed
    backward; dq, dk, dv come packed like q, k, v; the tables get no gradient).

    Same arguments as fmha.attention_varlen and the same conduct as attention() (stream, threads,
    copies, detached lse; the custom op torch.ops.fmha.attention_varlen_fwd under torch.compile).
    max_seqlen_q / max_seqlen_k are required for CUDA tables (reading them would synchronize) and
    under torch.compile; given, nothing reads the tables on the host, so the call can be captured
    in a CUDA graph.
    """
    options = _op_options(causal, window, scale, q_offset, precision, backend, deterministic)
    _check_tensors((q, k, v), _PACKED_LAYOUT)
    _check_tables(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    tables = (cu_seqlens_q, cu_seqlens_k, _max_seqlen(cu_seqlens_q, max_seqlen_q, "max_seqlen_q"),
              _max_seqlen(cu_seqlens_k, max_seqlen_k, "max_seqlen_k"))
    return _attend(_PACKED, q, k, v, tables, options, return_lse)


def attention_varlen_backward(
    q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, *, causal=None,
    window=None, scale=None, q_offset=0, precision=None, backend="auto", deterministic=False,
):
    """(dq, dk, dv) of a packed batch through the fmha::attention_varlen_bwd op (traceable by
    torch.compile); the tables and options must be the forward's."""
    options = _op_options(causal, window, scale, q_offset, precision, backend, deterministic)
    _check_tables(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return attention_varlen_bwd(
        _last_dim_contiguous(dout), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
        _max_seqlen(cu_seqlens_q, max_seqlen_q, "max_seqlen_q"),
        _max_seqlen(cu_seqlens_k, max_seqlen_k, "max_seqlen_k"), *options,
    )


def _append_kv(k_cache, v_cache, k, v, cache_seqlens, block_table):
    _C.append_kv(_to_dlpack(k_cache), _to_dlpack(v_cache), _to_dlpack(k), _to_dlpack(v),
                 None if block_table is None else _to_dlpack(block_table), _to_dlpack(cache_seqlens),
                 _stream_and_threads(k_cache.device)[1])


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[torch.Tensor] = None,
    *,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    causal: Optional[str] = None,
    window=None,
    scale: Optional[float] = None,
    q_offset: int = 0,
    precision: Optional[str] = None,
    backend: str = "auto",
    return_lse: bool = False,
):
    """fmha.attention_with_kvcache for PyTorch tensors, forward only.

    Same arguments as fmha.attention_with_kvcache. New rows k, v are written into the cache by the
    custom op torch.ops.fmha.append_kv (which declares the cache mutated), the attention runs as
    torch.ops.fmha.attention_with_kvcache: both are captured by torch.compile(fullgraph=True). The
    call reads no table on the host and allocates only its results (and cache_seqlens +
    seqlen_new with new rows) through PyTorch's allocator, on torch's current stream.
    """
    scale_value, causal_code, window_left, window_right, q_offset, precision_code, _, backend = _op_options(
        causal, window, scale, q_offset, precision, backend, False)
    _check_tensors((q, k_cache, v_cache), _PAGED_LAYOUT if block_table is not None else _DENSE_LAYOUT)
    if _torch_grad_wanted((q, k_cache, v_cache)):
        raise ValueError("attention_with_kvcache: is forward only (no gradients); detach the inputs")
    check_new_rows(k, v, cache_seqlens)
    fast = _eager_fast_path((q, k_cache, v_cache, block_table, cache_seqlens, k, v))
    if k is not None:
        (_append_kv if fast else append_kv_op)(k_cache, v_cache, k, v, cache_seqlens, block_table)
        cache_seqlens = grown_lengths(cache_seqlens, seqlen_new(k))
    args = (q, k_cache, v_cache, block_table, cache_seqlens, scale_value, causal_code, window_left, window_right,
            q_offset, precision_code, backend)
    if fast:
        out, lse = _kvcache_forward(*args, with_lse=return_lse)
    else:
        out, lse = attention_with_kvcache_fwd(*args)
    return (out, lse) if return_lse else out
