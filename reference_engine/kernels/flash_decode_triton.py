"""Flash-decoding over the paged KV cache: short queries (a decode token, or a few speculative verification rows)
against a long cached context, with the context split across programs.

The simple decode kernel (attention_triton.paged_decode_triton) runs one program per (sequence, KV head) that walks
the whole context: at batch 8 with 8 KV heads that is 64 programs on a chip with 132 SMs, each reading its context
one 16-token block at a time with fp32 multiply-sums. This kernel does what FlashDecoding (Dao et al., 2023) and
vLLM's and SGLang's split-KV decode paths do:

- **Split-K over the context.** Program (sequence, KV head, split) attends to one slice of the context and writes a
  partial output and its log-sum-exp; a second kernel merges the splits (exp(lse_s - lse) weights). The number of
  splits is chosen so that enough programs exist to fill the chip (`num_splits`).
- **The query heads of a KV head as one tensor-core tile.** The GROUP query heads that share a KV head, times the
  query rows of the sequence (1 for decode, gamma + 1 for verification), form the M side of `tl.dot`, padded to 16
  (the MMA minimum); K/V are loaded once for all of them.
- **Several pages per iteration.** Each iteration gathers PAGES cache blocks (PAGES * BLOCK_SIZE keys, 64 by
  default) through the block table, in the cache's dtype (bf16 loads on a GPU), and the loop is software-pipelined
  by the compiler (`num_stages`).

Query row i of a sequence with q_len rows and ctx_len cached tokens (its own rows included) sits at position
ctx_len - q_len + i and attends to keys 0..that position (causal within the rows).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .layout import check_layout

MAX_QUERY_ROWS = 16  # rows per sequence this kernel takes (decode: 1; speculative verification: gamma + 1)


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, cu_ptr, ctx_ptr, po_ptr, pl_ptr, scale,
    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_bt,
    stride_pot, stride_poh, stride_pos, stride_plt, stride_plh,
    SPLIT_TOKENS, GROUP: tl.constexpr, QROWS: tl.constexpr, M_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    PAGES: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, IEEE: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(cu_ptr + seq)
    q_len = tl.load(cu_ptr + seq + 1) - q_start
    ctx_len = tl.load(ctx_ptr + seq)
    r = tl.arange(0, M_PAD)  # tile row r: query head kvh * GROUP + r // QROWS, query row r % QROWS
    g = r // QROWS
    i = r % QROWS
    d = tl.arange(0, HEAD_DIM_PAD)
    rmask = (g < GROUP) & (i < q_len)
    dmask = d < HEAD_DIM
    head = kvh * GROUP + g
    qpos = ctx_len - q_len + i
    q = tl.load(q_ptr + (q_start + i)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)
    start = split * SPLIT_TOKENS
    end = tl.minimum(start + SPLIT_TOKENS, ctx_len)
    n = tl.arange(0, BLOCK_SIZE * PAGES)
    m = tl.full([M_PAD], float("-inf"), tl.float32)
    l = tl.zeros([M_PAD], tl.float32)
    acc = tl.zeros([M_PAD, HEAD_DIM_PAD], tl.float32)
    for tok0 in range(start, end, BLOCK_SIZE * PAGES):
        kpos = tok0 + n
        kmask = kpos < end
        block = tl.load(bt_ptr + seq * stride_bt + kpos // BLOCK_SIZE, mask=kmask, other=0).to(tl.int64)
        off = kpos % BLOCK_SIZE
        kv_mask = kmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + block[:, None] * stride_kb + off[:, None] * stride_kt + kvh * stride_kh + d[None, :],
                    mask=kv_mask, other=0.0).to(q.dtype)
        v = tl.load(v_ptr + block[:, None] * stride_vb + off[:, None] * stride_vt + kvh * stride_vh + d[None, :],
                    mask=kv_mask, other=0.0).to(q.dtype)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(kmask[None, :] & (kpos[None, :] <= qpos[:, None]), s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet (causal rows, padding)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new
    has = l > 0
    out = acc / tl.where(has, l, 1.0)[:, None]
    lse = tl.where(has, m + tl.log(tl.where(has, l, 1.0)), float("-inf"))
    rows = q_start + i
    tl.store(po_ptr + rows[:, None] * stride_pot + head[:, None] * stride_poh + split * stride_pos + d[None, :],
             out, mask=rmask[:, None] & dmask[None, :])
    tl.store(pl_ptr + rows * stride_plt + head * stride_plh + split, lse, mask=rmask)


@triton.jit
def _merge_kernel(po_ptr, pl_ptr, out_ptr, num_splits, stride_pot, stride_poh, stride_pos, stride_plt, stride_plh,
                  stride_ot, stride_oh, SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    # One program per (query row, head): out = sum_s exp(lse_s - lse) * out_s, lse = logsumexp_s lse_s.
    row = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    smask = s < num_splits
    lse = tl.load(pl_ptr + row * stride_plt + h * stride_plh + s, mask=smask, other=float("-inf"))
    top = tl.max(lse, axis=0)
    w = tl.where(smask & (lse > float("-inf")), tl.exp(lse - top), 0.0)
    part = tl.load(po_ptr + row * stride_pot + h * stride_poh + s[:, None] * stride_pos + d[None, :],
                   mask=smask[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    out = tl.sum(part * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + row * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@functools.lru_cache(maxsize=8)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def num_splits(batch: int, kv_heads: int, max_context: int, device: torch.device, tokens_per_iter: int = 64,
               min_tokens_per_split: int = 256) -> int:
    """Splits of the context per (sequence, KV head): enough programs for about two waves on the chip's SMs, but no
    split shorter than min_tokens_per_split keys (a short split's fixed cost, the q load and the merge, dominates).
    1 on CPU: the interpreter gains nothing from splitting (tests pass num_splits to exercise it)."""
    programs = batch * kv_heads
    want = -(-2 * _sm_count(device) // programs)
    most = max(1, max_context // max(min_tokens_per_split, tokens_per_iter))
    return max(1, min(want, most))


def flash_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale, *, cu_seqlens_q=None,
                        max_context: int | None = None, max_query_len: int | None = None, splits: int | None = None,
                        pages: int | None = None):
    """Attention of short queries against the paged cache, the context split across programs.

    q [T, H, D]. Decode (cu_seqlens_q None): one row per sequence, the contract of kernels.paged_decode_torch.
    With cu_seqlens_q ([num_seqs + 1] offsets of each sequence's rows, at most MAX_QUERY_ROWS rows each): the rows
    of a sequence are its last q_len tokens, causal among themselves (speculative verification). context_lens
    [num_seqs]: tokens in the cache, this step's rows included. max_context: a host-side bound on the contexts
    (default: the block table's width in tokens); max_query_len: the most rows of a sequence (pass it with
    cu_seqlens_q to avoid a device sync). splits: context splits per sequence (default: num_splits()). pages: cache
    blocks gathered per iteration (default: 64 keys' worth)."""
    T, H, D = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    check_layout(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables)
    group = H // kv_heads
    if cu_seqlens_q is None:
        cu = torch.arange(T + 1, dtype=torch.int32, device=q.device)
        max_query_len = 1
    else:
        cu = torch.as_tensor(cu_seqlens_q, dtype=torch.int32, device=q.device)
        max_query_len = max_query_len or int((cu[1:] - cu[:-1]).max())
    if max_query_len > MAX_QUERY_ROWS:
        raise ValueError(f"flash_decode_triton takes at most {MAX_QUERY_ROWS} query rows a sequence, got "
                         f"{max_query_len}: use prefill_triton for prompt chunks")
    ctx = torch.as_tensor(context_lens, dtype=torch.int32, device=q.device)
    num_seqs = len(ctx)
    # The block table's width bounds every context without reading context_lens back from the device (no sync,
    # and the same launch for every step of a captured CUDA graph); splits past a sequence's end exit at once.
    max_context = max_context or block_tables.shape[1] * block_size
    pages = pages or max(1, 64 // block_size)
    per_iter = block_size * pages
    splits = splits or num_splits(num_seqs, kv_heads, max_context, q.device, per_iter)
    split_tokens = -(-max(max_context, 1) // splits)
    split_tokens = -(-split_tokens // per_iter) * per_iter  # whole iterations per split
    splits = -(-max(max_context, 1) // split_tokens)
    qrows = triton.next_power_of_2(max_query_len)
    m_pad = max(16, triton.next_power_of_2(group * qrows))
    part_out = torch.empty(T, H, splits, D, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(T, H, splits, dtype=torch.float32, device=q.device)
    extra = {"num_warps": 4, "num_stages": 3} if q.is_cuda else {}
    _split_kernel[(num_seqs, kv_heads, splits)](
        q, k_cache, v_cache, block_tables, cu, ctx, part_out, part_lse, scale,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], block_tables.stride(0),
        *part_out.stride()[:3], *part_lse.stride()[:2], split_tokens,
        GROUP=group, QROWS=qrows, M_PAD=m_pad, BLOCK_SIZE=block_size, PAGES=pages, HEAD_DIM=D,
        HEAD_DIM_PAD=max(16, triton.next_power_of_2(D)), IEEE=q.dtype == torch.float32, **extra)
    out = torch.empty_like(q)
    _merge_kernel[(T, H)](part_out, part_lse, out, splits, *part_out.stride()[:3], *part_lse.stride()[:2],
                          out.stride(0), out.stride(1), SPLITS_PAD=max(2, triton.next_power_of_2(splits)),
                          HEAD_DIM=D, HEAD_DIM_PAD=triton.next_power_of_2(D))
    return out
