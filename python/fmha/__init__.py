"""fmha: fused multi-head attention, forward and backward, for NumPy, PyTorch, CuPy and JAX arrays.

    out = fmha.attention(q, k, v, causal="bottom-right")
    dq, dk, dv = fmha.attention_backward(q, k, v, out, dout, lse)
    fmha.tune(q, k, v, causal="bottom-right")     # time every variant, cache the fastest
    out = fmha.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k)   # packed sequences
    out, lse = fmha.merge_attention(out_a, lse_a, out_b, lse_b)         # over disjoint key sets
    out = fmha.attention_with_kvcache(q, k_cache, v_cache, block_table, cache_seqlens)  # decoding

fmha.torch.attention and fmha.torch.attention_varlen are the differentiable PyTorch ops (autograd,
torch.compile, CUDA graphs); fmha.torch.attention_with_kvcache is captured by torch.compile.
"""

from ._api import (
    append_kv,
    attention,
    attention_backward,
    attention_varlen,
    attention_varlen_backward,
    attention_with_kvcache,
    autotune_enabled,
    clear_tune_cache,
    computed_precision,
    info,
    merge_attention,
    select_backend,
    selected_variant,
    set_autotune,
    tune,
    tune_cache_path,
)

__version__ = info()["version"]
__all__ = [
    "append_kv",
    "attention",
    "attention_backward",
    "attention_varlen",
    "attention_varlen_backward",
    "attention_with_kvcache",
    "autotune_enabled",
    "clear_tune_cache",
    "computed_precision",
    "info",
    "merge_attention",
    "select_backend",
    "selected_variant",
    "set_autotune",
    "tune",
    "tune_cache_path",
    "__version__",
]


def __getattr__(name):
    # fmha.torch imports PyTorch; load it only when asked for.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'fmha' has no attribute %r" % name)
