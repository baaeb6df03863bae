"""PyTorch integration: fmha.torch.attention with autograd, as torch.library custom ops.

    fmha::attention_fwd(q, k, v, ...) -> (out, lse)
    fmha::attention_bwd(dout, q, k, v, out, lse, ...) -> (dq, dk, dv)

Both have fake (meta) implementations, the forward has an autograd formula that runs
fmha::attention_bwd, so torch.compile(fullgraph=True) captures them without a graph break. Every
buffer (outputs, workspace) comes from torch.empty on the inputs' device, i.e. from PyTorch's
caching allocator, and the kernels run on torch's current stream with no synchronization, so the
ops can be captured in CUDA graphs.
"""

from typing import Optional, Tuple

import torch

from . import _C
from ._api import options_from_parsed, parse_options
from ._frameworks import current_torch_stream

__all__ = ["attention", "attention_backward"]

_to_dlpack = torch._C._to_dlpack
_Tensor = torch.Tensor

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


def _forward(q, k, v, scale, causal, window_left, window_right, q_offset, precision, deterministic, backend,
             with_lse=True):
    """out and lse (None when with_lse is False: an inference call that needs no LSE skips it)."""
    batch, seqlen_q, heads, _ = q.shape
    device = q.device
    out = torch.empty((batch, seqlen_q, heads, v.shape[3]), dtype=q.dtype, device=device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=device) if with_lse else None
    lse_arg = _to_dlpack(lse) if with_lse else None
    options = _options(scale, causal, window_left, window_right, q_offset, precision, deterministic, backend, device)
    if device.type != "cuda":
        _C.forward(_to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out), lse_arg, None, options)
        return out, lse
    with _DeviceGuard(device):
        needed = _C.forward(_to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out), lse_arg, None, options)
        if needed:
            workspace = torch.empty((needed,), dtype=torch.uint8, device=device)
            _C.forward(_to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out),
                       _to_dlpack(lse) if with_lse else None, _to_dlpack(workspace), options)
    return out, lse


def _backward_impl(dout, q, k, v, out, lse, scale, causal, window_left, window_right, q_offset, precision,
                   deterministic, backend):
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    device = q.device
    options = _options(scale, causal, window_left, window_right, q_offset, precision, deterministic, backend, device)
    args = (q, k, v, out, dout, lse, dq, dk, dv)
    with _DeviceGuard(device):
        needed = _C.backward(*[_to_dlpack(t) for t in args], None, options)
        if needed:
            workspace = torch.empty((needed,), dtype=torch.uint8, device=device)
            _C.backward(*[_to_dlpack(t) for t in args], _to_dlpack(workspace), options)
    return dq, dk, dv


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


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, scale, causal, window_left, window_right, q_offset, precision, deterministic,
                        backend):
    batch, seqlen_q, heads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, heads, v.shape[3]))
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)
    return out, lse


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


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, scale, causal, window_left, window_right, q_offset, precision,
                        deterministic, backend):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = inputs[3:]


def _backward(ctx, grad_out, grad_lse):
    # lse is handed out detached (see attention()), so grad_lse carries nothing.
    q, k, v, out, lse = ctx.saved_tensors
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    dq, dk, dv = attention_bwd(grad_out, q, k, v, out, lse, *ctx.options)
    return (dq, dk, dv) + (None,) * len(ctx.options)


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The same forward and backward as the ops, for eager calls that record gradients: skips the
    dispatcher round trips of a Python custom op (see attention())."""

    @staticmethod
    def forward(ctx, q, k, v, *options):
        out, lse = _forward(q, k, v, *options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        dq, dk, dv = _backward_impl(grad_out, q, k, v, out, lse, *ctx.options)
        return (dq, dk, dv) + (None,) * len(ctx.options)


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled


def _eager_fast_path(q, k, v):
    """True for plain tensors outside torch.compile and outside any dispatch or function mode: then
    calling the implementation directly is indistinguishable from calling the op."""
    return (
        not _is_compiling()
        and type(q) in _PLAIN_TENSORS
        and type(k) in _PLAIN_TENSORS
        and type(v) in _PLAIN_TENSORS
        and not _dispatch_modes()
        and not _function_modes()
    )


def _check_tensors(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
        if t.dim() != 4:
            raise ValueError("%s: expected a 4-d tensor [batch, seqlen, heads, head_dim], got %d-d" % (name, t.dim()))


def _last_dim_contiguous(t):
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


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
    causal_code, window_left, window_right, scale_value, q_offset, precision_code, backend, deterministic = (
        parse_options(causal, window, scale, q_offset, precision, backend, deterministic)
    )
    try:
        well_formed = q.dim() == 4 and k.dim() == 4 and v.dim() == 4
    except AttributeError:
        well_formed = False
    if not well_formed:
        _check_tensors(q, k, v)
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    options = (scale_value, causal_code, window_left, window_right, q_offset, precision_code, deterministic, backend)
    if not _eager_fast_path(q, k, v):
        out, lse = attention_fwd(q, k, v, *options)
    elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _EagerAttention.apply(q, k, v, *options)
    else:
        out, lse = _forward(q, k, v, *options, with_lse=return_lse)
    if return_lse:
        return out, lse.detach()
    return out


def attention_backward(
    q, k, v, out, dout, lse, *, causal=None, window=None, scale=None, q_offset=0, precision=None, backend="auto",
    deterministic=False,
):
    """(dq, dk, dv) through the fmha::attention_bwd op (traceable by torch.compile)."""
    causal_code, window_left, window_right, scale_value, q_offset, precision_code, backend, deterministic = (
        parse_options(causal, window, scale, q_offset, precision, backend, deterministic)
    )
    return attention_bwd(
        _last_dim_contiguous(dout), q, k, v, out, lse, scale_value, causal_code, window_left, window_right,
        q_offset, precision_code, deterministic, backend,
    )
