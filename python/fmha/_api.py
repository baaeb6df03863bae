"""fmha.attention and fmha.attention_backward for any framework's arrays."""

from __future__ import annotations

from . import _C
from ._frameworks import adapter_for

_CAUSAL = {None: 0, False: 0, "none": 0, "top-left": 1, "top_left": 1, "bottom-right": 2, "bottom_right": 2}
_PRECISION = {None: 0, "ieee": 0, "tf32": 1, "tf32x3": 2}

# Options objects by their Python arguments; an attention loop reuses a handful of them.
_options_cache: dict = {}
_OPTIONS_CACHE_LIMIT = 256


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _window_side(value, side):
    if value is None:
        return -1
    if not _is_int(value):
        raise TypeError("window: the %s bound must be an int or None, got %s" % (side, type(value).__name__))
    if value < -1:
        raise ValueError("window: the %s bound is %d, expected >= 0, or -1/None for unbounded" % (side, value))
    return value


def parse_options(causal, window, scale, q_offset, precision, backend, deterministic):
    """Checks the keyword options and turns them into the compiled core's encoding.
    Returns (causal, window_left, window_right, scale, q_offset, precision, backend, deterministic)."""
    if causal is True:
        raise ValueError(
            "causal: True is ambiguous; pass 'top-left' (the first query sees the first key, as PyTorch's "
            "is_causal) or 'bottom-right' (the last query sees the last key, as with a KV cache)"
        )
    try:
        causal_code = _CAUSAL[causal]
    except (KeyError, TypeError):
        raise ValueError("causal: expected None, 'top-left' or 'bottom-right', got %r" % (causal,)) from None
    if window is None:
        window_left = window_right = -1
    else:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError("window: expected a pair (left, right) of ints (-1 or None: unbounded), got %r" % (window,))
        window_left = _window_side(window[0], "left")
        window_right = _window_side(window[1], "right")
    if scale is None:
        scale_value = 0.0
    else:
        if isinstance(scale, bool):
            raise TypeError("scale: expected a float, got bool")
        try:
            scale_value = float(scale)
        except (TypeError, ValueError):
            raise TypeError("scale: expected a float or None, got %s" % type(scale).__name__) from None
        if scale_value == 0.0 or scale_value != scale_value or abs(scale_value) == float("inf"):
            raise ValueError("scale: is %r, expected a finite non-zero float (None: 1/sqrt(head_dim))" % (scale,))
    if not _is_int(q_offset):
        raise TypeError("q_offset: expected an int, got %s" % type(q_offset).__name__)
    try:
        precision_code = _PRECISION[precision]
    except (KeyError, TypeError):
        raise ValueError("precision: expected None, 'ieee', 'tf32' or 'tf32x3', got %r" % (precision,)) from None
    if not isinstance(backend, str):
        raise TypeError("backend: expected a backend name (str), got %s" % type(backend).__name__)
    if not isinstance(deterministic, bool):
        raise TypeError("deterministic: expected a bool, got %s" % type(deterministic).__name__)
    return (causal_code, window_left, window_right, scale_value, q_offset, precision_code, backend, deterministic)


def _check_num_threads(num_threads):
    if not _is_int(num_threads) or num_threads < 0:
        raise ValueError("num_threads: expected an int >= 0 (0: all hardware threads), got %r" % (num_threads,))


def make_options(causal, window, scale, q_offset, precision, backend, deterministic, stream=0, num_threads=0):
    """The compiled core's Options for these keyword arguments (cached)."""
    try:
        key = (causal, window, scale, q_offset, precision, backend, deterministic, stream, num_threads)
        return _options_cache[key]
    except (KeyError, TypeError):
        pass
    parsed = parse_options(causal, window, scale, q_offset, precision, backend, deterministic)
    _check_num_threads(num_threads)
    options = options_from_parsed(parsed, stream, num_threads)
    try:
        if len(_options_cache) >= _OPTIONS_CACHE_LIMIT:
            _options_cache.clear()
        _options_cache[key] = options
    except TypeError:  # an unhashable argument (a window given as a list)
        pass
    return options


def _with_num_splits(options, num_splits):
    """A copy of (possibly cached, so shared) options with Params::num_splits set."""
    copy = _C.Options()
    for field in ("causal", "window_left", "window_right", "scale", "q_offset", "precision", "backend",
                  "deterministic", "stream", "num_threads"):
        setattr(copy, field, getattr(options, field))
    copy.num_splits = num_splits
    return copy


def options_from_parsed(parsed, stream=0, num_threads=0):
    causal, window_left, window_right, scale, q_offset, precision, backend, deterministic = parsed
    options = _C.Options()
    options.causal = causal
    options.window_left = window_left
    options.window_right = window_right
    options.scale = scale
    options.q_offset = q_offset
    options.precision = precision
    options.backend = backend
    options.deterministic = deterministic
    options.stream = stream
    options.num_threads = num_threads
    return options


def _require_rank(array, name, dims):
    try:
        shape = tuple(array.shape)
    except AttributeError:
        raise TypeError("%s: expected an array, got %s" % (name, type(array).__name__)) from None
    if len(shape) != len(dims):
        raise ValueError(
            "%s: expected a %d-d array [%s], got %d-d with shape %s" % (name, len(dims), ", ".join(dims), len(shape), shape)
        )
    return shape


# The dims of q, k and v, dense and packed (varlen).
_DENSE_LAYOUT = (
    ("q", ("batch", "seqlen_q", "heads", "head_dim")),
    ("k", ("batch", "seqlen_k", "kv_heads", "head_dim")),
    ("v", ("batch", "seqlen_k", "kv_heads", "head_dim_v")),
)
_PACKED_LAYOUT = (
    ("q", ("total_q", "heads", "head_dim")),
    ("k", ("total_k", "kv_heads", "head_dim")),
    ("v", ("total_k", "kv_heads", "head_dim_v")),
)


def _torch_grad_wanted(tensors):
    import torch

    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# The extension's table arguments (a packed batch's sequence tables, a KV cache's block table and
# lengths). They travel unexported and are exported by each run, as the tensors are: a DLPack
# capsule is consumed by the call that imports it, and a call that first asks for its workspace
# size runs twice.
_TABLE_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "block_table", "cache_seqlens")


def _exported(tables, export):
    if not tables:
        return {}
    return {name: export(value) if name in _TABLE_ARGS and value is not None else value
            for name, value in tables.items()}


def _with_workspace(adapter, like, run):
    """run(None) returns the workspace bytes the call needs (0: it ran); then run with one."""
    needed = run(None)
    if needed:
        run(adapter.workspace(like, needed))


def _call_forward(adapter, q, k, v, out, lse, options, stream_handle, tables=None):
    """The forward through the extension; returns out (and lse where one was given), wrapped.
    tables: the extension's keyword arguments beyond a dense call's (_TABLE_ARGS and the lengths)."""
    export = adapter.export

    def run(workspace):
        args = (export(q), export(k), export(v), export(out), None if lse is None else export(lse),
                None if workspace is None else export(workspace))
        return _C.forward(*args, options, adapter.raw_bf16, **_exported(tables, export))

    _with_workspace(adapter, q, run)
    adapter.finish(stream_handle)
    if lse is not None:
        return adapter.wrap(out), adapter.wrap(lse)
    return adapter.wrap(out)


def _call_backward(adapter, inputs, grads, options, stream_handle, tables=None):
    """The backward through the extension: inputs (q, k, v, out, dout, lse), grads (dq, dk, dv)."""
    export = adapter.export

    def run(workspace):
        args = tuple(export(x) for x in inputs + grads) + (None if workspace is None else export(workspace),)
        return _C.backward(*args, options, adapter.raw_bf16, **_exported(tables, export))

    _with_workspace(adapter, inputs[0], run)
    adapter.finish(stream_handle)
    return tuple(adapter.wrap(g) for g in grads)


def _refuse_jax_outputs(adapter, outputs):
    """JAX arrays are immutable: output arguments ((name, value) pairs) must not be given."""
    if adapter.name == "jax" and any(value is not None for _, value in outputs):
        names = [name for name, _ in outputs]
        raise TypeError("%s: JAX arrays are immutable; call without %s and use the returned array%s"
                        % (names[0], "/".join(name + "=" for name in names), "s" if len(names) > 1 else ""))


def _check_call(adapter, q, k, v, layout, options, stream, num_threads, tables):
    """What every attention entry point checks, in one order: the ranks of q, k and v against the
    layout, the stream, the options (make_options' keyword arguments before the stream) and, for
    a packed batch, the sequence tables (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k).
    Returns (shapes of q, k, v; stream handle; Options; the extension's varlen arguments or None)."""
    shapes = tuple(_require_rank(x, name, dims) for x, (name, dims) in zip((q, k, v), layout))
    stream_handle = adapter.stream(q, stream)
    options = make_options(*options, stream_handle, num_threads)
    varlen = None if tables is None else _varlen_args(*tables)
    return shapes, stream_handle, options, varlen


def result_shapes(q_shape, v_shape):
    """The shapes of a forward's out and lse, dense ([batch, seqlen_q, heads, head_dim]) or packed
    ([total_q, heads, head_dim]) alike: out is q's shape with v's head_dim_v; lse is q's shape
    without head_dim, heads before the query rows ([batch, heads, seqlen_q] or [heads, total_q])."""
    if len(q_shape) == 3:
        rows, heads, _ = q_shape
        return (rows, heads, v_shape[-1]), (heads, rows)
    batch, rows, heads, _ = q_shape
    return (batch, rows, heads, v_shape[-1]), (batch, heads, rows)


def _forward(adapter, q, k, v, out, return_lse, layout, options, stream, num_threads, tables=None):
    """attention and attention_varlen after their framework checks."""
    _refuse_jax_outputs(adapter, (("out", out),))
    (q_shape, _, v_shape), stream_handle, options, varlen = _check_call(adapter, q, k, v, layout, options, stream,
                                                                        num_threads, tables)
    out_shape, lse_shape = result_shapes(q_shape, v_shape)
    if out is None:
        out = adapter.empty(q, out_shape)
    lse = adapter.empty_f32(q, lse_shape) if return_lse else None
    return _call_forward(adapter, q, k, v, out, lse, options, stream_handle, varlen)


def _backward(q, k, v, out, dout, lse, grads, layout, options, stream, num_threads, tables=None):
    """attention_backward and attention_varlen_backward: grads (dq, dk, dv), each None for a new
    array shaped like q, k or v."""
    adapter = adapter_for(q)
    _refuse_jax_outputs(adapter, tuple(zip(("dq", "dk", "dv"), grads)))
    shapes, stream_handle, options, varlen = _check_call(adapter, q, k, v, layout, options, stream, num_threads,
                                                         tables)
    grads = tuple(adapter.empty(q, shape) if grad is None else grad for grad, shape in zip(grads, shapes))
    return _call_backward(adapter, (q, k, v, out, dout, lse), grads, options, stream_handle, varlen)

def attention(
    q,
    k,
    v,
    *,
    causal=None,
    window=None,
    scale=None,
    q_offset=0,
    precision=None,
    backend="auto",
    deterministic=False,
    return_lse=False,
    out=None,
    stream=None,
    num_threads=0,
):
    """Fused multi-head attention: softmax(scale * q k^T + mask) v, per batch and head.

    q: [batch, seqlen_q, heads, head_dim]; k: [batch, seqlen_k, kv_heads, head_dim];
    v: [batch, seqlen_k, kv_heads, head_dim_v] — NumPy, PyTorch, CuPy or JAX arrays (or any
    DLPack array on the CPU) of float32, float16 or bfloat16; other layouts through strides, with
    the last dimension contiguous. heads must be a multiple of kv_heads (GQA/MQA).

    causal: None, 'top-left' or 'bottom-right'. window: (left, right) keys around each query's
    position, -1 or None for unbounded. scale: default 1/sqrt(head_dim). q_offset: position of
    query row 0. precision: None/'ieee', 'tf32' or 'tf32x3' (float32 only; 'tf32x3' is split tf32:
    fp32 accuracy from tf32 tensor cores on the sm80 and sm90 tiers, exact fp32 elsewhere; under
    backend='auto' an 'ieee' call runs as split tf32 where that is measured faster, on H100/H200:
    every forward and the backward at head dim 64 and above 128; backend='simt' keeps exact fp32 arithmetic). backend: 'auto' or a name from
    fmha.info()['backends']. return_lse: also return the float32 log-sum-exp [batch, heads,
    seqlen_q]. out: write the result there. stream: CUDA stream to run on (int or stream object;
    default: the framework's current stream). num_threads: CPU backends, 0 = all.

    Returns out, or (out, lse) with return_lse. Rows that see no key get 0 and lse = -inf.
    PyTorch tensors go through fmha.torch.attention (autograd, torch.compile) unless out= or
    stream= is given.
    """
    adapter = adapter_for(q)
    fmha_torch = _torch_module(adapter, (q, k, v), out, stream, num_threads, "attention")
    if fmha_torch is not None:
        return fmha_torch.attention(
            q, k, v, causal=causal, window=window, scale=scale, q_offset=q_offset, precision=precision,
            backend=backend, deterministic=deterministic, return_lse=return_lse,
        )
    return _forward(adapter, q, k, v, out, return_lse, _DENSE_LAYOUT,
                    (causal, window, scale, q_offset, precision, backend, deterministic), stream, num_threads)


def attention_backward(
    q,
    k,
    v,
    out,
    dout,
    lse,
    *,
    causal=None,
    window=None,
    scale=None,
    q_offset=0,
    precision=None,
    backend="auto",
    deterministic=False,
    dq=None,
    dk=None,
    dv=None,
    stream=None,
    num_threads=0,
):
    """Gradients of fmha.attention: returns (dq, dk, dv) for the upstream gradient dout.

    out and lse are the forward's results (attention(..., return_lse=True)); the options must be
    the forward's. dk/dv are summed over the query heads that share a KV head. dq, dk, dv: write
    the gradients there (not for JAX). deterministic: bitwise reproducible (no atomics).
    """
    return _backward(q, k, v, out, dout, lse, (dq, dk, dv), _DENSE_LAYOUT,
                     (causal, window, scale, q_offset, precision, backend, deterministic), stream, num_threads)


def _torch_module(adapter, inputs, out, stream, num_threads, name):
    """fmha.torch, whose `name` (autograd, torch.compile) takes PyTorch tensors called without out=,
    stream= or num_threads=; None for other calls, which run here and record no gradients (refused
    when the inputs want them)."""
    if adapter.name != "torch":
        return None
    if out is None and stream is None and num_threads == 0:
        from . import torch as fmha_torch

        return fmha_torch
    if _torch_grad_wanted(inputs):
        raise ValueError(
            "out: calls with out=, stream= or num_threads= do not record gradients; detach the inputs, or "
            "drop those arguments to get autograd through fmha.torch.%s" % name
        )
    return None


def _refuse_torch_grad(adapter, tensors, what, why="records no gradients yet (no autograd through fmha.torch); "
                      "detach the inputs and call the backward function explicitly"):
    if adapter.name == "torch" and _torch_grad_wanted(tensors):
        raise ValueError("%s: %s" % (what, why))


def max_seqlen(table, given, name):
    """The longest sequence of a table: `given`, or read off a table in host memory."""
    if given is not None:
        if not _is_int(given) or given < 0:
            raise ValueError("%s: expected an int >= 0, got %r" % (name, given))
        return given
    import numpy

    try:
        cu = numpy.asarray(table)
    except Exception:  # a device array: reading it would synchronise, so the caller must say
        raise ValueError("%s: required when the sequence tables are in device memory" % name) from None
    if cu.ndim != 1:
        raise ValueError("cu_seqlens: expected a 1-d int32 array [batch + 1], got %d-d" % cu.ndim)
    return int(numpy.diff(cu.astype(numpy.int64)).max(initial=0))


def _varlen_args(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    return dict(
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen(cu_seqlens_q, max_seqlen_q, "max_seqlen_q"),
        max_seqlen_k=max_seqlen(cu_seqlens_k, max_seqlen_k, "max_seqlen_k"),
    )


def attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    *,
    causal=None,
    window=None,
    scale=None,
    q_offset=0,
    precision=None,
    backend="auto",
    deterministic=False,
    return_lse=False,
    out=None,
    stream=None,
    num_threads=0,
):
    """fmha.attention over a packed batch of sequences of different lengths.

    q: [total_q, heads, head_dim]; k: [total_k, kv_heads, head_dim]; v: [total_k, kv_heads,
    head_dim_v], the sequences one after another. cu_seqlens_q / cu_seqlens_k: int32 [batch + 1]
    on the arrays' device, sequence b being rows cu_seqlens[b] ... cu_seqlens[b+1] - 1 (the first
    entry 0, the last the total). max_seqlen_q / max_seqlen_k: the longest sequence of each; read
    off host tables when None, required for tables in device memory. Each sequence is its own
    problem: causal alignment, window and q_offset apply within it. Sequences may be empty.

    Returns out [total_q, heads, head_dim_v], or (out, lse) with lse [heads, total_q] float32.
    Runs on the reference and cpu backends and on the simt, sm80 and sm90 GPU tiers (backend="auto"
    picks the tier it would pick for a dense call). PyTorch tensors go through
    fmha.torch.attention_varlen (autograd, torch.compile) unless out=, stream= or num_threads= is
    given.
    """
    adapter = adapter_for(q)
    fmha_torch = _torch_module(adapter, (q, k, v), out, stream, num_threads, "attention_varlen")
    if fmha_torch is not None:
        return fmha_torch.attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, window=window,
            scale=scale, q_offset=q_offset, precision=precision, backend=backend, deterministic=deterministic,
            return_lse=return_lse,
        )
    return _forward(adapter, q, k, v, out, return_lse, _PACKED_LAYOUT,
                    (causal, window, scale, q_offset, precision, backend, deterministic), stream, num_threads,
                    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


def attention_varlen_backward(
    q,
    k,
    v,
    out,
    dout,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    *,
    causal=None,
    window=None,
    scale=None,
    q_offset=0,
    precision=None,
    backend="auto",
    deterministic=False,
    dq=None,
    dk=None,
    dv=None,
    stream=None,
    num_threads=0,
):
    """Gradients of fmha.attention_varlen: returns (dq, dk, dv), packed like q, k, v.

    out and lse ([heads, total_q]) are the forward's results; the tables and options must be the
    forward's.
    """
    return _backward(q, k, v, out, dout, lse, (dq, dk, dv), _PACKED_LAYOUT,
                     (causal, window, scale, q_offset, precision, backend, deterministic), stream, num_threads,
                     (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


# The dims of q and of a KV cache's pages (attention_with_kvcache).
_PAGED_LAYOUT = (
    ("q", ("batch", "seqlen_q", "heads", "head_dim")),
    ("k_cache", ("num_pages", "page_size", "kv_heads", "head_dim")),
    ("v_cache", ("num_pages", "page_size", "kv_heads", "head_dim_v")),
)


def append_kv(k_cache, v_cache, k, v, cache_seqlens, block_table=None, *, stream=None, num_threads=0):
    """Writes new keys and values into a KV cache, in place.

    For each sequence b, rows k[b, i] and v[b, i] (k: [batch, seqlen_new, kv_heads, head_dim], v:
    [batch, seqlen_new, kv_heads, head_dim_v], the cache's dtype) go to key position
    cache_seqlens[b] + i of the cache: paged (k_cache [num_pages, page_size, kv_heads, head_dim]
    with block_table int32 [batch, max_pages_per_seq]) or contiguous (k_cache [batch, capacity,
    kv_heads, head_dim], block_table None). cache_seqlens (int32 [batch]) is read, not updated.
    Every page a new row falls in must be in the table, and no two sequences may write one row.
    CPU or CUDA arrays (on CUDA, one kernel on `stream`, default the framework's current stream;
    tables in device memory are clamped into the cache). Returns (k_cache, v_cache).
    """
    adapter = adapter_for(k_cache)
    if adapter.name == "jax":
        raise TypeError("k_cache: JAX arrays are immutable; append_kv writes the cache in place")
    _check_num_threads(num_threads)
    stream_handle = adapter.stream(k_cache, stream)
    export = adapter.export
    _C.append_kv(export(k_cache), export(v_cache), export(k), export(v),
                 None if block_table is None else export(block_table), export(cache_seqlens), stream_handle,
                 num_threads, adapter.raw_bf16)
    adapter.finish(stream_handle)
    return k_cache, v_cache


def check_new_rows(k, v, cache_seqlens):
    """attention_with_kvcache's new rows: both k and v or neither, and with them cache_seqlens."""
    if (k is None) != (v is None):
        raise ValueError("k, v: pass both new-row arrays or neither")
    if k is not None and cache_seqlens is None:
        raise ValueError("cache_seqlens: required with k, v (where each sequence's new rows go)")


def seqlen_new(k):
    """The rows per sequence of attention_with_kvcache's new keys k."""
    return _require_rank(k, "k", _DENSE_LAYOUT[1][1])[1]


def grown_lengths(cache_seqlens, seqlen_new):
    """cache_seqlens + seqlen_new, still int32."""
    grown = cache_seqlens + seqlen_new
    dtype = getattr(grown, "dtype", None)
    if dtype is not None and "int32" not in str(dtype):
        grown = grown.astype("int32") if hasattr(grown, "astype") else grown.to(cache_seqlens.dtype)
    return grown


def attention_with_kvcache(
    q,
    k_cache,
    v_cache,
    block_table=None,
    cache_seqlens=None,
    *,
    k=None,
    v=None,
    causal=None,
    window=None,
    scale=None,
    q_offset=0,
    precision=None,
    backend="auto",
    return_lse=False,
    out=None,
    stream=None,
    num_threads=0,
    num_splits=0,
):
    """fmha.attention of new queries against a KV cache (decoding).

    q: [batch, seqlen_q, heads, head_dim] (seqlen_q small: 1 for decoding, a few for speculative
    decoding). k_cache / v_cache: a paged cache [num_pages, page_size, kv_heads, head_dim(_v)]
    (page_size 16 to 256) with block_table int32 [batch, max_pages_per_seq] listing each
    sequence's pages in order (pages may be shared, e.g. a common prefix, and be in any order), or
    a contiguous cache [batch, capacity, kv_heads, head_dim(_v)] with block_table None.
    cache_seqlens: int32 [batch], the keys each sequence has (None: all of a contiguous cache).
    k, v: new rows [batch, seqlen_new, kv_heads, head_dim(_v)] to append first (fmha.append_kv;
    the cache is written in place); the attention then sees cache_seqlens + seqlen_new keys.
    Options as fmha.attention; causal and window apply per sequence with its own length, so
    'bottom-right' aligns the last query with the last cached key.

    num_splits: the GPU decode kernel's CTAs per sequence's keys (0: chosen from the shape and
    the GPU; 1 to 256 forces a count; ignored on the CPU).

    Returns out [batch, seqlen_q, heads, head_dim_v], or (out, lse) with return_lse. Forward only;
    runs on the reference and cpu backends, and on CUDA arrays on the sm80 tier's decode kernel
    (float16, bfloat16). PyTorch tensors go through fmha.torch.attention_with_kvcache
    (torch.compile) unless out=, stream=, num_threads= or num_splits= is given.
    """
    adapter = adapter_for(q)
    _refuse_torch_grad(adapter, (q, k_cache, v_cache), "attention_with_kvcache",
                       "is forward only (no gradients); detach the inputs")
    fmha_torch = None if num_splits else _torch_module(adapter, (), out, stream, num_threads, "attention_with_kvcache")
    if fmha_torch is not None:
        return fmha_torch.attention_with_kvcache(
            q, k_cache, v_cache, block_table, cache_seqlens, k=k, v=v, causal=causal, window=window, scale=scale,
            q_offset=q_offset, precision=precision, backend=backend, return_lse=return_lse,
        )
    check_new_rows(k, v, cache_seqlens)
    if k is not None:
        append_kv(k_cache, v_cache, k, v, cache_seqlens, block_table, stream=stream, num_threads=num_threads)
        cache_seqlens = grown_lengths(cache_seqlens, seqlen_new(k))
    layout = _PAGED_LAYOUT if block_table is not None else _DENSE_LAYOUT
    _refuse_jax_outputs(adapter, (("out", out),))
    (q_shape, _, v_shape), stream_handle, options, _ = _check_call(
        adapter, q, k_cache, v_cache, layout, (causal, window, scale, q_offset, precision, backend, False), stream,
        num_threads, None)
    out_shape, lse_shape = result_shapes(q_shape, v_shape)
    if num_splits:
        options = _with_num_splits(options, num_splits)
    if out is None:
        out = adapter.empty(q, out_shape)
    lse = adapter.empty_f32(q, lse_shape) if return_lse else None
    cache = dict(block_table=block_table, cache_seqlens=cache_seqlens)
    return _call_forward(adapter, q, k_cache, v_cache, out, lse, options, stream_handle, cache)


def merge_attention(out_a, lse_a, out_b, lse_b, *, out=None, lse=None, stream=None, num_threads=0):
    """The attention over the union of two disjoint key sets, from each set's (out, lse).

    out_a, out_b: [batch, seqlen, heads, head_dim_v] with lse_a, lse_b [batch, heads, seqlen]
    (float32), or packed [total, heads, head_dim_v] with lse [heads, total], as fmha.attention
    (return_lse=True) and fmha.attention_varlen return them. Computed in float32 for any lse: a
    row with lse = -inf on one side takes the other side unchanged, and -inf on both sides gives
    out = 0, lse = -inf. out / lse: write the result there; out=out_a, lse=lse_a accumulates in
    place (the outputs may have another float dtype than the inputs, e.g. a float32 accumulator).

    Returns (out, lse).
    """
    adapter = adapter_for(out_a)
    _refuse_torch_grad(adapter, (out_a, lse_a, out_b, lse_b), "merge_attention")
    _refuse_jax_outputs(adapter, (("out", out), ("lse", lse)))
    try:
        out_shape, lse_shape = tuple(out_a.shape), tuple(lse_a.shape)
    except AttributeError:
        raise TypeError("out_a, lse_a: expected arrays, got %s and %s"
                        % (type(out_a).__name__, type(lse_a).__name__)) from None
    stream_handle = adapter.stream(out_a, stream)
    _check_num_threads(num_threads)
    if out is None:
        out = adapter.empty(out_a, out_shape)
    if lse is None:
        lse = adapter.empty_f32(out_a, lse_shape)
    export = adapter.export
    _C.merge(export(out_a), export(lse_a), export(out_b), export(lse_b), export(out), export(lse),
             stream_handle, num_threads, adapter.raw_bf16)
    adapter.finish(stream_handle)
    return adapter.wrap(out), adapter.wrap(lse)


def select_backend(q, k, v, *, direction="forward", causal=None, window=None, scale=None, q_offset=0,
                   precision=None, backend="auto", deterministic=False):
    """The backend that fmha.attention (direction='forward') or fmha.attention_backward
    ('backward') would run for these arrays and options. Raises ValueError, with the reason, when
    none supports the call. Runs nothing."""
    adapter = adapter_for(q)
    options = make_options(causal, window, scale, q_offset, precision, backend, deterministic)
    name, reason = _C.select_backend(direction, adapter.export(q), adapter.export(k), adapter.export(v), options,
                                     adapter.raw_bf16)
    if name is None:
        raise ValueError(reason)
    return name


def tune(q, k, v, *, direction="forward", causal=None, window=None, scale=None, q_offset=0, precision=None,
         backend="auto", deterministic=False, warmup=None, iters=None, write_cache=True):
    """Tunes the class of a call on arrays shaped like q, k, v (their data are not read: the tuner
    times every variant of the backend on inputs of its own, checks each against the default's
    output, and records the fastest in the tuning cache, which later calls use). Returns a dict:
    problem_class, device, default, winner, default_ms, winner_ms, and variants (one dict per
    variant: variant, is_default, agrees, ms, difference, status)."""
    adapter = adapter_for(q)
    options = make_options(causal, window, scale, q_offset, precision, backend, deterministic)
    for name, value in (("warmup", warmup), ("iters", iters)):
        if value is not None and (not _is_int(value) or value < (1 if name == "iters" else 0)):
            raise ValueError("%s: expected an int >= %d or None, got %r" % (name, 1 if name == "iters" else 0, value))
    if not isinstance(write_cache, bool):
        raise TypeError("write_cache: expected a bool, got %s" % type(write_cache).__name__)
    return _C.tune(direction, adapter.export(q), adapter.export(k), adapter.export(v), options, adapter.raw_bf16,
                   -1 if warmup is None else warmup, -1 if iters is None else iters, write_cache)


def computed_precision(q, k, v, *, direction="forward", causal=None, window=None, scale=None, q_offset=0,
                       precision=None, backend="auto", deterministic=False):
    """The arithmetic a call on these arrays runs in: 'ieee' (exact fp32 for float32; for float16
    and bfloat16 their own products with fp32 accumulation), 'tf32' or 'tf32x3' (split tf32) --
    the last also where backend='auto' meets a float32 call that asks for exact fp32 with split
    tf32, as accurate and faster there (on H100/H200: every forward and the backward above head
    dim 128). Runs nothing; raises ValueError as select_backend does."""
    adapter = adapter_for(q)
    options = make_options(causal, window, scale, q_offset, precision, backend, deterministic)
    return _C.computed_precision(direction, adapter.export(q), adapter.export(k), adapter.export(v), options,
                                 adapter.raw_bf16)


def selected_variant(q, k, v, *, direction="forward", causal=None, window=None, scale=None, q_offset=0,
                     precision=None, backend="auto", deterministic=False):
    """(variant, source): the variant of its backend a call on these arrays runs, and what chose
    it: 'variable' (an FMHA_*_CONFIG environment variable), 'cache' (a tuned winner) or 'default'.
    ('', '') for the reference backend, which has no variants."""
    adapter = adapter_for(q)
    options = make_options(causal, window, scale, q_offset, precision, backend, deterministic)
    return tuple(_C.selected_variant(direction, adapter.export(q), adapter.export(k), adapter.export(v), options,
                                     adapter.raw_bf16))


def set_autotune(enabled):
    """Autotuning: when on, the first call of a class the cache has no winner for tunes it first
    (then runs with the winner). Off by default; FMHA_AUTOTUNE=1 turns it on for the process."""
    if not isinstance(enabled, bool):
        raise TypeError("enabled: expected a bool, got %s" % type(enabled).__name__)
    _C.set_autotune(enabled)


def autotune_enabled():
    """Whether autotuning is on (set_autotune, else FMHA_AUTOTUNE)."""
    return _C.autotune_enabled()


def tune_cache_path():
    """The tuning cache file: $FMHA_TUNE_CACHE, $XDG_CACHE_HOME/fmha/tune.json or ~/.cache/fmha/tune.json."""
    return _C.tune_cache_path()


def clear_tune_cache():
    """Removes the tuning cache file."""
    _C.clear_tune_cache()


def info():
    """{'version', 'backends': compiled backends, 'devices': [...], 'cuda': built with CUDA}."""
    return _C.info()
