"""A float64 NumPy oracle for the tests, written from the definition of attention.

The mask follows include/fmha/mask.h: query row i sits at key position
    pos(i) = i + q_offset (+ seqlen_k - seqlen_q for bottom-right causal)
and sees key j when pos(i) - window_left <= j <= pos(i) + window_right (-1: unbounded side);
causal masking fixes window_right at 0.
"""

import numpy as np


def visible(seqlen_q, seqlen_k, causal=None, window=None, q_offset=0):
    """[seqlen_q, seqlen_k] bool: which keys each query row sees."""
    left, right = window if window is not None else (-1, -1)
    left = -1 if left is None else left
    right = -1 if right is None else right
    if causal is not None:
        right = 0
    shift = q_offset + (seqlen_k - seqlen_q if causal == "bottom-right" else 0)
    pos = np.arange(seqlen_q)[:, None] + shift
    key = np.arange(seqlen_k)[None, :]
    mask = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        mask &= key >= pos - left
    if right >= 0:
        mask &= key <= pos + right
    return mask


def _expand_kv(x, heads):
    """[B, S, Hkv, D] -> [B, S, H, D]: query head h reads KV head h // (H // Hkv)."""
    return np.repeat(x, heads // x.shape[2], axis=2)


def _probabilities(q, k, scale, mask):
    """Scaled scores and softmax in float64: (scores [B,H,Sq,Sk], P, lse [B,H,Sq])."""
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    scores = np.where(mask, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(scores - safe_max)
    denom = weights.sum(axis=-1, keepdims=True)
    p = np.where(denom > 0, weights / np.where(denom > 0, denom, 1.0), 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(denom[..., 0] > 0, np.log(np.where(denom[..., 0] > 0, denom[..., 0], 1.0)) + safe_max[..., 0],
                       -np.inf)
    return p, lse


def forward(q, k, v, causal=None, window=None, scale=None, q_offset=0):
    """(out [B,Sq,H,Dv], lse [B,H,Sq]) in float64."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    heads = q.shape[2]
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    k, v = _expand_kv(k, heads), _expand_kv(v, heads)
    mask = visible(q.shape[1], k.shape[1], causal, window, q_offset)
    p, lse = _probabilities(q, k, scale, mask)
    out = np.einsum("bhqk,bkhd->bqhd", p, v)
    return out, lse


def backward(q, k, v, dout, causal=None, window=None, scale=None, q_offset=0):
    """(dq, dk, dv) in float64; dk/dv summed over the query heads sharing a KV head."""
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    heads, kv_heads = q.shape[2], k.shape[2]
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    ke, ve = _expand_kv(k, heads), _expand_kv(v, heads)
    mask = visible(q.shape[1], k.shape[1], causal, window, q_offset)
    p, _ = _probabilities(q, ke, scale, mask)
    dv_full = np.einsum("bhqk,bqhd->bkhd", p, dout)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, ve)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = np.einsum("bhqk,bkhd->bqhd", ds, ke) * scale
    dk_full = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    group = heads // kv_heads if kv_heads else 1

    def reduce(x):
        b, s, _, d = x.shape
        return x.reshape(b, s, kv_heads, group, d).sum(axis=3)

    return dq, reduce(dk_full), reduce(dv_full)
