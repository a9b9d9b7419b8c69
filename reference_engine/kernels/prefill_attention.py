"""Prefill attention over a ragged batch, torch reference (SDPA per sequence).

A prefill chunk of n tokens for a sequence with context_len tokens in the cache (the chunk included,
since K/V are written before attention) holds positions context_len - n .. context_len - 1; query i
attends to cached positions 0 .. context_len - n + i. With no earlier context this is plain causal
attention on the chunk's own K/V, which needs no gather.
"""
import functools

import torch
import torch.nn.functional as F

from .paged_attention import gather_kv


@functools.cache
def sdpa_has_gqa() -> bool:
    """Whether this torch's SDPA takes enable_gqa (torch >= 2.5). Probed by a call: SDPA is a builtin with no
    inspectable signature."""
    x = torch.zeros(1, 2, 1, 4)
    try:
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
    except TypeError:
        return False
    return True


def sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """SDPA with q [..., H, n, D] and k/v [..., kv_heads, L, D]: enable_gqa where torch has it; elsewhere
    (torch < 2.5, e.g. 2.2 on Intel Macs) each KV head repeated for its H / kv_heads query heads, the same
    pairing enable_gqa makes (query head h reads KV head h // (H / kv_heads))."""
    if sdpa_has_gqa():
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    group = q.shape[-3] // k.shape[-3]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def prefill_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  cu_seqlens_q: list[int], context_lens: list[int], block_tables: torch.Tensor, scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [T, kv_heads, D] (this step's tokens, already in the cache); cu_seqlens_q: prefix sums of
    chunk lengths (len num_seqs + 1); context_lens [num_seqs]; block_tables [num_seqs, max_blocks]. Returns [T, H, D]."""
    out = torch.empty_like(q)
    for i, ctx in enumerate(context_lens):
        s, e = cu_seqlens_q[i], cu_seqlens_q[i + 1]
        n = e - s
        qi = q[s:e].transpose(0, 1)[None]  # [1, H, n, D]: SDPA's fast CPU kernel wants 4-D (3-D takes the slow path)
        if ctx == n:  # whole sequence in this chunk
            ki, vi, mask, causal = k[s:e], v[s:e], None, True
        else:
            nb = (ctx + k_cache.shape[1] - 1) // k_cache.shape[1]
            ki = gather_kv(k_cache, block_tables[i:i + 1, :nb])[0, :ctx].to(q.dtype)
            vi = gather_kv(v_cache, block_tables[i:i + 1, :nb])[0, :ctx].to(q.dtype)
            qpos = torch.arange(ctx - n, ctx, device=q.device)
            mask, causal = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None], False
        oi = sdpa_gqa(qi, ki.transpose(0, 1)[None], vi.transpose(0, 1)[None], attn_mask=mask, is_causal=causal,
                      scale=scale)
        out[s:e] = oi[0].transpose(0, 1)
    return out
