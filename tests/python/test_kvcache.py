"""fmha.attention_with_kvcache and fmha.append_kv on NumPy arrays (PyTorch where installed): a paged
cache with shuffled pages, a shared prefix, partly filled last pages and lengths 0 and 1 against the
float64 oracle run per sequence on the gathered keys; the contiguous cache; appending new rows;
bad input refused with the argument named; num_splits; the GPU decode kernel through PyTorch CUDA
tensors where present."""

import numpy as np
import pytest

import fmha
import reference
from test_numpy import FORWARD_FACTOR, assert_close, make, ml_dtypes


def paged_cache(lengths, page_size, kv_heads, head_dim, head_dim_v, dtype="float32", shared_prefix_pages=0,
                spare_pages=2, seed=0):
    """(k_cache, v_cache, block_table, cache_seqlens): every sequence's pages drawn in a random order
    from one pool; sequences after the first reuse its first `shared_prefix_pages` pages; table
    entries past a sequence's pages are -1."""
    rng = np.random.default_rng(seed)
    pages_of = [-(-length // page_size) for length in lengths]
    shared = min(shared_prefix_pages, pages_of[0]) if lengths else 0  # only pages sequence 0 has
    needed = pages_of[0] + sum(max(0, p - shared) for p in pages_of[1:]) if lengths else 0
    num_pages = needed + spare_pages
    order = rng.permutation(num_pages)
    pages_per_seq = max(pages_of, default=0) + 1
    table = np.full((len(lengths), pages_per_seq), -1, dtype=np.int32)
    next_page = 0
    for b, count in enumerate(pages_of):
        for i in range(count):
            if b > 0 and i < shared:
                table[b, i] = table[0, i]
            else:
                table[b, i] = order[next_page]
                next_page += 1
    k_cache = make((num_pages, page_size, kv_heads, head_dim), dtype, rng)
    v_cache = make((num_pages, page_size, kv_heads, head_dim_v), dtype, rng)
    return k_cache, v_cache, table, np.asarray(lengths, dtype=np.int32)


def gather(cache, table, b, length):
    """Sequence b's first `length` rows of a paged cache as a dense [1, length, kv_heads, dim] array."""
    page_size = cache.shape[1]
    rows = [cache[table[b, j // page_size], j % page_size] for j in range(length)]
    return np.asarray(rows, dtype=np.float64).reshape((1, length) + cache.shape[2:])


def check_against_oracle(q, k_cache, v_cache, table, lengths, out, lse, dtype, causal, window, q_offset):
    for b, length in enumerate(lengths):
        k = gather(k_cache, table, b, int(length)) if table is not None else np.asarray(
            k_cache[b:b + 1, :length], dtype=np.float64)
        v = gather(v_cache, table, b, int(length)) if table is not None else np.asarray(
            v_cache[b:b + 1, :length], dtype=np.float64)
        ref_out, ref_lse = reference.forward(np.asarray(q[b:b + 1], dtype=np.float64), k, v, causal, window, None,
                                             q_offset)
        assert_close(out[b:b + 1], ref_out, dtype, FORWARD_FACTOR[dtype], "out of sequence %d" % b)
        assert_close(lse[b:b + 1], ref_lse, "float32", FORWARD_FACTOR["float32"] * 4, "lse of sequence %d" % b)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", [
    # page_size, heads, kv_heads, seqlen_q, causal, window, q_offset
    (16, 4, 4, 1, "bottom-right", None, 0),
    (32, 8, 2, 4, "bottom-right", (20, 0), 0),
    (64, 16, 1, 16, None, None, 0),
    (16, 6, 3, 3, "top-left", None, 5),
], ids=lambda c: "page%d-h%d/%d-sq%d-%s" % c[:5])
def test_paged_matches_oracle(backend, dtype, case):
    if dtype == "bfloat16" and ml_dtypes is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    page_size, heads, kv_heads, seqlen_q, causal, window, q_offset = case
    lengths = [0, 1, page_size, 3 * page_size + 7, 50]
    k_cache, v_cache, table, cache_seqlens = paged_cache(lengths, page_size, kv_heads, 32, 24, dtype,
                                                         shared_prefix_pages=1, seed=page_size)
    q = make((len(lengths), seqlen_q, heads, 32), dtype, np.random.default_rng(1))
    out, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, causal=causal, window=window,
                                           q_offset=q_offset, backend=backend, return_lse=True)
    assert out.shape == (len(lengths), seqlen_q, heads, 24) and lse.shape == (len(lengths), heads, seqlen_q)
    check_against_oracle(q, k_cache, v_cache, table, lengths, out, lse, dtype, causal, window, q_offset)


def test_contiguous_cache_with_lengths():
    rng = np.random.default_rng(3)
    lengths = np.asarray([40, 0, 7], dtype=np.int32)
    k_cache = rng.standard_normal((3, 48, 2, 16)).astype(np.float32)
    v_cache = rng.standard_normal((3, 48, 2, 16)).astype(np.float32)
    q = rng.standard_normal((3, 2, 4, 16)).astype(np.float32)
    out, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, None, lengths, causal="bottom-right",
                                           return_lse=True)
    check_against_oracle(q, k_cache, v_cache, None, lengths, out, lse, "float32", "bottom-right", None, 0)
    # Without lengths the whole contiguous cache is read: fmha.attention's dense call.
    dense = fmha.attention(q, k_cache, v_cache, causal="bottom-right", backend="cpu")
    np.testing.assert_allclose(fmha.attention_with_kvcache(q, k_cache, v_cache, causal="bottom-right"), dense,
                               rtol=0, atol=1e-6)


def test_append_then_attend():
    page_size, kv_heads, dim = 16, 2, 16
    lengths = [15, 0, 32]
    k_cache, v_cache, table, cache_seqlens = paged_cache(lengths, page_size, kv_heads, dim, dim, spare_pages=4,
                                                         seed=7)
    # Pages for the new rows: the spare pages of the pool.
    used = set(table[table >= 0].tolist())
    spare = [p for p in range(k_cache.shape[0]) if p not in used]
    for b, length in enumerate(lengths):
        if table[b, length // page_size] < 0:
            table[b, length // page_size] = spare.pop()
    rng = np.random.default_rng(8)
    k_new = rng.standard_normal((3, 1, kv_heads, dim)).astype(np.float32)
    v_new = rng.standard_normal((3, 1, kv_heads, dim)).astype(np.float32)
    q = rng.standard_normal((3, 1, 4, dim)).astype(np.float32)
    before = k_cache.copy()
    out, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, k=k_new, v=v_new,
                                           causal="bottom-right", return_lse=True)
    for b, length in enumerate(lengths):
        page, row = table[b, length // page_size], length % page_size
        np.testing.assert_array_equal(k_cache[page, row], k_new[b, 0])
        np.testing.assert_array_equal(v_cache[page, row], v_new[b, 0])
        before[page, row] = k_new[b, 0]
    np.testing.assert_array_equal(k_cache, before)  # nothing else written
    np.testing.assert_array_equal(cache_seqlens, lengths)  # read, not updated
    check_against_oracle(q, k_cache, v_cache, table, [n + 1 for n in lengths], out, lse, "float32", "bottom-right",
                         None, 0)


def test_bad_input_names_the_argument():
    k_cache, v_cache, table, cache_seqlens = paged_cache([20, 5], 16, 2, 16, 16)
    q = np.zeros((2, 1, 4, 16), dtype=np.float32)
    bad = table.copy()
    bad[1, 0] = k_cache.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[1\]\[0\]"):
        fmha.attention_with_kvcache(q, k_cache, v_cache, bad, cache_seqlens)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\]"):
        fmha.attention_with_kvcache(q, k_cache, v_cache, table, np.asarray([-1, 5], dtype=np.int32))
    with pytest.raises(TypeError, match="block_table"):
        fmha.attention_with_kvcache(q, k_cache, v_cache, table.astype(np.int64), cache_seqlens)
    with pytest.raises(ValueError, match="cache_seqlens"):
        fmha.attention_with_kvcache(q, k_cache, v_cache, table, None)
    small = np.zeros((k_cache.shape[0], 8, 2, 16), dtype=np.float32)
    with pytest.raises(ValueError, match="page_size"):
        fmha.attention_with_kvcache(q, small, small.copy(), table, cache_seqlens)
    with pytest.raises(ValueError, match="k, v"):
        fmha.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, k=np.zeros((2, 1, 2, 16), np.float32))
    # Sequence 1's new rows reach its page 1, whose entry is -1: refused, the cache untouched.
    k_new = np.ones((2, 12, 2, 16), dtype=np.float32)
    before = k_cache.copy()
    with pytest.raises(ValueError, match=r"block_table\[1\]\[1\]"):
        fmha.append_kv(k_cache, v_cache, k_new, k_new.copy(), cache_seqlens, table)
    np.testing.assert_array_equal(k_cache, before)


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    k_cache, v_cache, table, cache_seqlens = paged_cache([33, 1, 0], 16, 2, 16, 16, seed=4)
    q = np.random.default_rng(5).standard_normal((3, 2, 4, 16)).astype(np.float32)
    out_np = fmha.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, causal="bottom-right")
    out_torch = fmha.attention_with_kvcache(torch.from_numpy(q), torch.from_numpy(k_cache), torch.from_numpy(v_cache),
                                            torch.from_numpy(table), torch.from_numpy(cache_seqlens),
                                            causal="bottom-right")
    np.testing.assert_array_equal(out_torch.numpy(), out_np)


def test_num_splits_checked_and_ignored_on_the_cpu():
    k_cache, v_cache, table, cache_seqlens = paged_cache([40, 3], 16, 2, 16, 16, seed=6)
    q = np.random.default_rng(7).standard_normal((2, 1, 4, 16)).astype(np.float32)
    plain = fmha.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, causal="bottom-right")
    split = fmha.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, causal="bottom-right", num_splits=3)
    np.testing.assert_array_equal(split, plain)
    with pytest.raises(ValueError, match="num_splits"):
        fmha.attention_with_kvcache(q, k_cache, v_cache, table, cache_seqlens, num_splits=-1)


def test_torch_cuda_decode_kernel_and_append():
    """The sm80 decode kernel through PyTorch CUDA tensors (bfloat16), with new rows appended on the
    GPU first, against the same call on the CPU; split counts forced and chosen."""
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and fmha.info()["cuda"]):
        pytest.skip("needs a CUDA GPU and a CUDA build of fmha")
    k_cache, v_cache, table, cache_seqlens = paged_cache([300, 1, 0, 77], 16, 2, 64, 64, spare_pages=8, seed=8)
    rng = np.random.default_rng(9)
    q = torch.from_numpy(rng.standard_normal((4, 3, 8, 64)).astype(np.float32)).bfloat16()
    k_new = torch.from_numpy(rng.standard_normal((4, 2, 2, 64)).astype(np.float32)).bfloat16()
    v_new = torch.from_numpy(rng.standard_normal((4, 2, 2, 64)).astype(np.float32)).bfloat16()
    for b in range(4):  # the page each sequence's new rows reach
        last = (int(cache_seqlens[b]) + 1) // 16
        if table[b, last] < 0:
            table[b, last] = k_cache.shape[0] - 1 - b
    cpu = [torch.from_numpy(x).bfloat16() for x in (k_cache, v_cache)]
    args = dict(causal="bottom-right", return_lse=True)
    want, want_lse = fmha.attention_with_kvcache(q, cpu[0], cpu[1], torch.from_numpy(table),
                                                 torch.from_numpy(cache_seqlens), k=k_new, v=v_new, **args)
    for splits in (0, 1, 4):
        gpu = [torch.from_numpy(x).bfloat16().cuda() for x in (k_cache, v_cache)]
        got, got_lse = fmha.attention_with_kvcache(q.cuda(), gpu[0], gpu[1], torch.from_numpy(table).cuda(),
                                                   torch.from_numpy(cache_seqlens).cuda(), k=k_new.cuda(),
                                                   v=v_new.cuda(), num_splits=splits, **args)
        torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(got_lse.cpu(), want_lse, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(gpu[0].cpu(), cpu[0])  # the appended rows, as the CPU wrote them
