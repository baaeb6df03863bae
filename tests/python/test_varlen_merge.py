"""fmha.attention_varlen and fmha.merge_attention on NumPy arrays: packed sequences against the
float64 oracle run per sequence, and merged partial results against the oracle over the union."""

import numpy as np
import pytest

import fmha
import reference
from test_numpy import BACKWARD_FACTOR, FORWARD_FACTOR, assert_close


def packed_inputs(lengths_q, lengths_k, heads, kv_heads, head_dim, head_dim_v, seed=0):
    rng = np.random.default_rng(seed)
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q = rng.standard_normal((total_q, heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((total_k, kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((total_k, kv_heads, head_dim_v)).astype(np.float32)
    dout = rng.standard_normal((total_q, heads, head_dim_v)).astype(np.float32)
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    return q, k, v, dout, cu_q, cu_k


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("mask", [(None, None, 0), ("bottom-right", None, 0), ("top-left", (5, 0), 2)],
                         ids=lambda m: "%s-%s-%s" % m)
def test_varlen_matches_oracle_per_sequence(backend, mask):
    causal, window, q_offset = mask
    lengths_q, lengths_k = [17, 0, 40, 1, 9], [30, 12, 0, 1, 70]
    q, k, v, dout, cu_q, cu_k = packed_inputs(lengths_q, lengths_k, 4, 2, 16, 8)
    options = dict(causal=causal, window=window, q_offset=q_offset, backend=backend)
    out, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **options)
    assert out.shape == (q.shape[0], 4, 8) and lse.shape == (4, q.shape[0])
    dq, dk, dv = fmha.attention_varlen_backward(q, k, v, out, dout, lse, cu_q, cu_k, **options)
    for b in range(len(lengths_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ref_out, ref_lse = reference.forward(q[None, rows], k[None, keys], v[None, keys], causal, window, None, q_offset)
        assert_close(out[rows], ref_out[0], "float32", FORWARD_FACTOR["float32"], "out of sequence %d" % b)
        assert_close(lse[:, rows], ref_lse[0], "float32", FORWARD_FACTOR["float32"], "lse of sequence %d" % b)
        ref = reference.backward(q[None, rows], k[None, keys], v[None, keys], dout[None, rows], causal, window, None,
                                 q_offset)
        for name, got, want in zip(("dq", "dk", "dv"), (dq[rows], dk[keys], dv[keys]), ref):
            assert_close(got, want[0], "float32", BACKWARD_FACTOR["float32"], "%s of sequence %d" % (name, b))


def test_varlen_bad_tables_are_refused():
    q, k, v, _, cu_q, cu_k = packed_inputs([3, 4], [5, 2], 2, 2, 8, 8)
    with pytest.raises(ValueError, match="cu_seqlens_q: last entry is 6, expected 7"):
        fmha.attention_varlen(q, k, v, np.array([0, 3, 6], np.int32), cu_k, max_seqlen_q=4)
    with pytest.raises(ValueError, match="cu_seqlens_k: not non-decreasing"):
        fmha.attention_varlen(q, k, v, cu_q, np.array([0, 5, 4], np.int32), max_seqlen_k=5)
    with pytest.raises(ValueError, match="above max_seqlen_q = 3"):
        fmha.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=3)
    with pytest.raises(TypeError, match="cu_seqlens_q: dtype int64 is not supported; expected int32"):
        fmha.attention_varlen(q, k, v, cu_q.astype(np.int64), cu_k)
    with pytest.raises(ValueError, match="q: expected a 3-d array"):
        fmha.attention_varlen(q[None], k, v, cu_q, cu_k)


def test_merge_of_two_key_sets_is_attention_over_the_union():
    q = np.random.default_rng(1).standard_normal((2, 19, 4, 16)).astype(np.float32)
    kv = np.random.default_rng(2).standard_normal((2, 50, 2, 16)).astype(np.float32)
    split = 21
    # top-left causal: the second part's keys sit `split` positions on, so its queries shift back.
    out_a, lse_a = fmha.attention(q, kv[:, :split], kv[:, :split], causal="top-left", q_offset=10, return_lse=True)
    out_b, lse_b = fmha.attention(q, kv[:, split:], kv[:, split:], causal="top-left", q_offset=10 - split,
                                  return_lse=True)
    out, lse = fmha.merge_attention(out_a, lse_a, out_b, lse_b)
    ref_out, ref_lse = reference.forward(q, kv, kv, "top-left", None, None, 10)
    assert_close(out, ref_out, "float32", FORWARD_FACTOR["float32"], "out")
    assert_close(lse, ref_lse, "float32", FORWARD_FACTOR["float32"], "lse")
    # In place: the accumulate form writes over a.
    result = fmha.merge_attention(out_a, lse_a, out_b, lse_b, out=out_a, lse=lse_a)
    assert result[0] is out_a and result[1] is lse_a
    np.testing.assert_array_equal(out_a, out)
    np.testing.assert_array_equal(lse_a, lse)


def test_merge_handles_minus_infinity_and_refuses_bad_input():
    out_a = np.ones((1, 3, 1, 2), np.float32)
    out_b = np.full((1, 3, 1, 2), np.nan, np.float32)
    lse_a = np.array([[[0.0, -np.inf, -np.inf]]], np.float32)
    lse_b = np.full((1, 1, 3), -np.inf, np.float32)
    out, lse = fmha.merge_attention(out_a, lse_a, out_b, lse_b)
    np.testing.assert_array_equal(lse, lse_a)
    np.testing.assert_array_equal(out[0, :, 0], [[1, 1], [0, 0], [0, 0]])
    with pytest.raises(ValueError, match="lse_b: seqlen_q is 2, expected 3"):
        fmha.merge_attention(out_a, lse_a, out_b, lse_b[..., :2])
    buffer = np.ones(8, np.float32)
    shifted_a, shifted_out = buffer[:6].reshape(1, 3, 1, 2), buffer[2:].reshape(1, 3, 1, 2)
    with pytest.raises(ValueError, match="out: overlaps out_a"):
        fmha.merge_attention(shifted_a, lse_a, out_b, lse_b, out=shifted_out)
    np.testing.assert_array_equal(buffer, np.ones(8, np.float32))  # nothing written
