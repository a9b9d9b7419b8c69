"""Triton kernels == torch references (under the Triton interpreter when there is no GPU), and paged == contiguous."""
import pytest
import torch
import torch.nn.functional as F

from reference_engine.device import ensure_triton_mode

ensure_triton_mode()  # before triton is imported: interpreter on CPU-only machines
pytest.importorskip("triton")

from reference_engine.kernels import paged_decode_torch, prefill_torch, triton_kernels, write_kv_torch  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=2e-5, rtol=1e-4) if DEV == "cpu" else dict(atol=2e-3, rtol=2e-3)  # fp32 dots are exact on CPU
tk = triton_kernels()


def make_cache(num_blocks, block_size, kv_heads, head_dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    return k.to(DEV), v.to(DEV)


def scattered_tables(context_lens, block_size, num_blocks, seed=0):
    """Each sequence gets distinct, shuffled (non-contiguous) blocks; padding entries repeat block 0."""
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    need = [-(-c // block_size) for c in context_lens]
    width, rows, at = max(need), [], 0
    for n in need:
        rows.append(perm[at:at + n] + [0] * (width - n))
        at += n
    return torch.tensor(rows, dtype=torch.int32, device=DEV)


def contiguous_kv(cache, table, length, block_size):
    """The first `length` tokens of a sequence, read slot by slot (no paging tricks)."""
    return torch.stack([cache[table[t // block_size], t % block_size] for t in range(length)])


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("head_dim", [16, 24])
def test_paged_decode_triton_matches_torch(group, head_dim):
    kv_heads, bs = 2, 16
    ctx = [1, 15, 16, 17, 40, 64]  # partial last blocks, exact multiples, a single token
    k_cache, v_cache = make_cache(32, bs, kv_heads, head_dim)
    bt = scattered_tables(ctx, bs, 32)
    q = torch.randn(len(ctx), kv_heads * group, head_dim, generator=torch.Generator().manual_seed(1)).to(DEV)
    cl = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    ref = paged_decode_torch(q, k_cache, v_cache, bt, cl, head_dim ** -0.5)
    out = tk.paged_decode_triton(q, k_cache, v_cache, bt, cl, head_dim ** -0.5)
    torch.testing.assert_close(out, ref, **TOL)


# (block size, KV heads, query heads per KV head): MHA, GQA 4 and 8, MQA (one KV head)
FLASH_LAYOUTS = [(16, 4, 1), (16, 2, 4), (32, 2, 8), (32, 1, 8), (16, 1, 4)]


@pytest.mark.parametrize("bs, kv_heads, group", FLASH_LAYOUTS)
@pytest.mark.parametrize("splits", [3])
def test_flash_decode_matches_torch_on_ragged_batches(bs, kv_heads, group, splits):
    """The split-context kernel == the torch reference: a single token, partial and exact blocks, contexts that end
    inside, at and before a split's edge (splits of whole 64-key iterations), one sequence of thousands."""
    D = 32
    ctx = [1, 15, 16, 17, 64, 65, 200, 2500]
    nb = sum(-(-c // bs) for c in ctx) + 4
    k_cache, v_cache = make_cache(nb, bs, kv_heads, D, seed=bs + group)
    bt = scattered_tables(ctx, bs, nb, seed=group)
    q = torch.randn(len(ctx), kv_heads * group, D, generator=torch.Generator().manual_seed(7)).to(DEV)
    cl = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    ref = paged_decode_torch(q, k_cache, v_cache, bt, cl, D ** -0.5)
    out = tk.flash_decode_triton(q, k_cache, v_cache, bt, cl, D ** -0.5, splits=splits)
    torch.testing.assert_close(out, ref, **TOL)


def test_flash_decode_splits_a_long_context_and_merges_by_log_sum_exp():
    """Each split is plain attention over its slice; the merge weights split s by exp(lse_s - lse): any number of
    splits gives the same output, including more splits than a short sequence has keys."""
    bs, kv_heads, group, D = 16, 2, 4, 16
    ctx = [3, 700]
    k_cache, v_cache = make_cache(64, bs, kv_heads, D, seed=11)
    bt = scattered_tables(ctx, bs, 64, seed=11)
    q = torch.randn(2, kv_heads * group, D, generator=torch.Generator().manual_seed(3)).to(DEV)
    cl = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    ref = paged_decode_torch(q, k_cache, v_cache, bt, cl, D ** -0.5)
    for splits in (1, 2, 5, 11):
        torch.testing.assert_close(tk.flash_decode_triton(q, k_cache, v_cache, bt, cl, D ** -0.5, splits=splits),
                                   ref, **TOL)


@pytest.mark.parametrize("bs, kv_heads, group", [(16, 2, 4), (32, 1, 8)])
def test_flash_decode_takes_speculative_verification_rows(bs, kv_heads, group):
    """gamma + 1 rows a sequence (ragged: 1 to 5), causal among themselves after the cached context: the same
    as the prefill reference on those rows."""
    D = 16
    chunks = [(1, 9), (5, 5), (3, 40), (5, 130), (2, 1100)]  # (rows, context after the rows)
    ctx = [c for _, c in chunks]
    nb = sum(-(-c // bs) for c in ctx) + 2
    k_cache, v_cache = make_cache(nb, bs, kv_heads, D, seed=13)
    bt = scattered_tables(ctx, bs, nb, seed=13)
    q, k, v, cu, ctx = chunk_batch(chunks, k_cache, v_cache, bt, bs, kv_heads * group, D)
    ref = prefill_torch(q, k, v, k_cache, v_cache, cu, ctx, bt, D ** -0.5)
    for splits in (None, 4):
        out = tk.flash_decode_triton(q, k_cache, v_cache, bt, torch.tensor(ctx, dtype=torch.int32, device=DEV),
                                     D ** -0.5, cu_seqlens_q=cu, splits=splits)
        torch.testing.assert_close(out, ref, **TOL)


def test_flash_decode_refuses_prompt_chunks():
    k_cache, v_cache = make_cache(4, 16, 1, 16)
    bt = scattered_tables([40], 16, 4)
    with pytest.raises(ValueError, match="at most 16 query rows"):
        tk.flash_decode_triton(torch.zeros(17, 1, 16, device=DEV), k_cache, v_cache, bt, [40], 0.25,
                               cu_seqlens_q=[0, 17])


def test_flash_decode_split_count_fills_the_chip_without_tiny_splits():
    from reference_engine.kernels.flash_decode_triton import num_splits

    class FakeCuda:
        type = "cuda"
    import reference_engine.kernels.flash_decode_triton as fd
    real = fd._sm_count
    fd._sm_count = lambda device: 132  # an H100 SXM / H200
    try:
        assert num_splits(8, 8, 4096, FakeCuda()) == 5  # 64 programs -> 5 splits: 320 programs, two waves of 132+
        assert num_splits(64, 8, 4096, FakeCuda()) == 1  # 512 programs already fill the chip
        assert num_splits(1, 8, 300, FakeCuda()) == 1  # no split under 256 keys
        assert num_splits(1, 8, 4096, FakeCuda()) == 16  # 8 programs want 33 splits; 4096 keys allow 16
    finally:
        fd._sm_count = real
    assert num_splits(8, 8, 4096, torch.device("cpu")) == 1


def test_paged_decode_equals_contiguous_attention():
    kv_heads, group, D, bs = 2, 2, 16, 8
    ctx = [3, 8, 21]
    k_cache, v_cache = make_cache(16, bs, kv_heads, D, seed=4)
    bt = scattered_tables(ctx, bs, 16, seed=4)
    q = torch.randn(len(ctx), kv_heads * group, D).to(DEV)
    out = paged_decode_torch(q, k_cache, v_cache, bt, torch.tensor(ctx, device=DEV), D ** -0.5)
    for i, n in enumerate(ctx):
        k = contiguous_kv(k_cache, bt[i].tolist(), n, bs).repeat_interleave(group, dim=1)  # [n, H, D]
        v = contiguous_kv(v_cache, bt[i].tolist(), n, bs).repeat_interleave(group, dim=1)
        w = torch.einsum("hd,nhd->hn", q[i], k) * D ** -0.5
        ref = torch.einsum("hn,nhd->hd", w.softmax(-1), v)
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=1e-5)


def chunk_batch(chunks, k_cache, v_cache, bt, bs, H, D, seed=2):
    """chunks: (chunk_len, context_len) per sequence; K/V of each chunk are read back from the cache."""
    cu = [0]
    for n, _ in chunks:
        cu.append(cu[-1] + n)
    q = torch.randn(cu[-1], H, D, generator=torch.Generator().manual_seed(seed)).to(DEV)
    k = torch.cat([contiguous_kv(k_cache, bt[i].tolist(), c, bs)[c - n:] for i, (n, c) in enumerate(chunks)])
    v = torch.cat([contiguous_kv(v_cache, bt[i].tolist(), c, bs)[c - n:] for i, (n, c) in enumerate(chunks)])
    return q, k, v, cu, [c for _, c in chunks]


@pytest.mark.parametrize("group", [1, 2, 4])
def test_prefill_triton_matches_torch(group):
    kv_heads, D, bs = 2, 16, 16
    chunks = [(5, 5), (17, 17), (1, 30), (20, 37), (33, 64)]  # whole prompts, then chunks after cached context
    k_cache, v_cache = make_cache(40, bs, kv_heads, D, seed=3)
    bt = scattered_tables([c for _, c in chunks], bs, 40, seed=3)
    q, k, v, cu, ctx = chunk_batch(chunks, k_cache, v_cache, bt, bs, kv_heads * group, D)
    ref = prefill_torch(q, k, v, k_cache, v_cache, cu, ctx, bt, D ** -0.5)
    out = tk.prefill_triton(q, k, v, k_cache, v_cache, cu, ctx, bt, D ** -0.5)
    torch.testing.assert_close(out, ref, **TOL)


def test_prefill_chunk_equals_causal_attention_over_whole_sequence():
    """A chunk after cached context gives the rows full causal attention gives at those positions."""
    kv_heads, group, D, bs, L = 2, 2, 16, 8, 29
    k_cache, v_cache = make_cache(8, bs, kv_heads, D, seed=5)
    bt = scattered_tables([L], bs, 8, seed=5)
    q_all, k_all, v_all, _, _ = chunk_batch([(L, L)], k_cache, v_cache, bt, bs, kv_heads * group, D)
    full = F.scaled_dot_product_attention(q_all.transpose(0, 1), k_all.transpose(0, 1).repeat_interleave(group, 0),
                                          v_all.transpose(0, 1).repeat_interleave(group, 0), is_causal=True).transpose(0, 1)
    for start in (0, 7, 8, 20):
        out = prefill_torch(q_all[start:], k_all[start:], v_all[start:], k_cache, v_cache, [0, L - start], [L], bt, D ** -0.5)
        torch.testing.assert_close(out, full[start:], atol=1e-5, rtol=1e-5)


def test_write_kv_triton_matches_torch():
    kv_heads, D, bs = 2, 16, 16
    k_cache, v_cache = make_cache(8, bs, kv_heads, D, seed=6)
    slots = torch.randperm(8 * bs, generator=torch.Generator().manual_seed(6))[:37].to(DEV)
    k, v = torch.randn(2, 37, kv_heads, D).to(DEV)
    a_k, a_v, b_k, b_v = k_cache.clone(), v_cache.clone(), k_cache.clone(), v_cache.clone()
    write_kv_torch(k, v, a_k, a_v, slots)
    tk.write_kv_triton(k, v, b_k, b_v, slots)
    assert torch.equal(a_k, b_k) and torch.equal(a_v, b_v)
    flat = a_k.view(-1, kv_heads, D)
    assert torch.equal(flat[slots], k)  # slot = block_id * block_size + offset


# ---- layouts: K and V are each read through their own strides; only head_dim must be unit-stride ---------------

def relayout(cache, kind):
    """The same values in another memory layout, shape unchanged: "heads_major" stores [blocks, kv_heads,
    block_size, D]; "padded" pads head_dim in memory (a view of a wider buffer)."""
    if kind == "heads_major":
        return cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    wide = torch.full((*cache.shape[:-1], cache.shape[-1] + 8), float("nan"), device=cache.device)
    wide[..., :cache.shape[-1]] = cache
    return wide[..., :cache.shape[-1]]


LAYOUTS = [("contiguous", "heads_major"), ("heads_major", "contiguous"), ("padded", "heads_major")]


@pytest.mark.parametrize("k_kind, v_kind", LAYOUTS)
def test_paged_decode_triton_reads_v_through_its_own_strides(k_kind, v_kind):
    kv_heads, group, D, bs = 2, 2, 16, 16
    ctx = [5, 16, 33]
    k_cache, v_cache = make_cache(12, bs, kv_heads, D, seed=7)
    bt = scattered_tables(ctx, bs, 12, seed=7)
    q = torch.randn(len(ctx), kv_heads * group, D, generator=torch.Generator().manual_seed(7)).to(DEV)
    cl = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    ref = paged_decode_torch(q, k_cache, v_cache, bt, cl, D ** -0.5)
    kc = k_cache if k_kind == "contiguous" else relayout(k_cache, k_kind)
    vc = v_cache if v_kind == "contiguous" else relayout(v_cache, v_kind)
    assert kc.stride() != vc.stride()
    out = tk.paged_decode_triton(q, kc, vc, bt, cl, D ** -0.5)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("k_kind, v_kind", LAYOUTS)
def test_prefill_triton_reads_v_through_its_own_strides(k_kind, v_kind):
    kv_heads, group, D, bs = 2, 2, 16, 16
    chunks = [(7, 7), (5, 21)]
    k_cache, v_cache = make_cache(8, bs, kv_heads, D, seed=8)
    bt = scattered_tables([c for _, c in chunks], bs, 8, seed=8)
    q, k, v, cu, ctx = chunk_batch(chunks, k_cache, v_cache, bt, bs, kv_heads * group, D)
    ref = prefill_torch(q, k, v, k_cache, v_cache, cu, ctx, bt, D ** -0.5)
    kc = k_cache if k_kind == "contiguous" else relayout(k_cache, k_kind)
    vc = v_cache if v_kind == "contiguous" else relayout(v_cache, v_kind)
    out = tk.prefill_triton(q, k, v, kc, vc, cu, ctx, bt, D ** -0.5)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("k_kind, v_kind", LAYOUTS)
def test_write_kv_triton_writes_through_each_caches_strides(k_kind, v_kind):
    kv_heads, D, bs = 2, 16, 4
    k_cache, v_cache = make_cache(6, bs, kv_heads, D, seed=9)
    slots = torch.randperm(6 * bs, generator=torch.Generator().manual_seed(9))[:11].to(DEV)
    k, v = torch.randn(2, 11, kv_heads, D).to(DEV)
    v = v.transpose(0, 1).contiguous().transpose(0, 1)  # new V rows with their own strides too
    a_k, a_v = k_cache.clone(), v_cache.clone()
    write_kv_torch(k, v, a_k, a_v, slots)
    b_k = k_cache.clone() if k_kind == "contiguous" else relayout(k_cache, k_kind)
    b_v = v_cache.clone() if v_kind == "contiguous" else relayout(v_cache, v_kind)
    tk.write_kv_triton(k, v, b_k, b_v, slots)
    assert torch.equal(b_k, a_k) and torch.equal(b_v, a_v)


def test_kernels_refuse_a_cache_whose_head_dim_is_not_unit_stride():
    kv_heads, D, bs = 2, 16, 16
    k_cache, v_cache = make_cache(4, bs, kv_heads, D)
    bad = v_cache.transpose(-1, -2).contiguous().transpose(-1, -2)  # head_dim stride = kv_heads
    bt = torch.tensor([[0, 1]], dtype=torch.int32, device=DEV)
    q = torch.randn(1, kv_heads, D).to(DEV)
    cl = torch.tensor([20], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=r"v_cache \[num_blocks, block_size, kv_heads, head_dim\] needs a contiguous last"):
        tk.paged_decode_triton(q, k_cache, bad, bt, cl, D ** -0.5)
    with pytest.raises(ValueError, match="k_cache .* needs a contiguous last"):
        tk.prefill_triton(q, q[:, :kv_heads], q[:, :kv_heads], bad, v_cache, [0, 1], [1], bt, D ** -0.5)
    with pytest.raises(ValueError, match="v_cache .* needs a contiguous last"):
        tk.write_kv_triton(q[:, :kv_heads], q[:, :kv_heads], k_cache, bad, torch.tensor([3], device=DEV))


def test_the_default_backend_falls_back_to_torch_for_blocks_too_small_for_triton():
    """The Triton prefill kernel tiles a cache block with tl.dot (16 rows at least): on CUDA the default backend
    is Triton from block_size 16 and torch below it (teaching configurations use 4 or 8); asking for Triton
    with smaller blocks is refused when the engine is built, not at its first prefill."""
    from reference_engine.attention import TorchBackend, TritonBackend, get_backend
    cuda = torch.device("cuda")
    assert isinstance(get_backend(None, cuda, 16), TritonBackend)
    assert isinstance(get_backend(None, cuda, 8), TorchBackend)
    assert isinstance(get_backend(None, torch.device("cpu"), 16), TorchBackend)
    with pytest.raises(ValueError, match="block_size >= 16"):
        get_backend("triton", cuda, 8)
