"""Triton kernels over the paged KV cache: decode, prefill, and the cache write.

Import through reference_engine.kernels.triton_kernels(), which turns on the interpreter when there
is no GPU. Only long-standing triton.language features are used, so the same code compiles on CUDA.
"""
import torch
import triton
import triton.language as tl

# The engine's decode kernel (split context, tensor-core tiles); paged_decode_triton below is the simple one lesson 04
# builds and times a learner's kernel against.
from .flash_decode_triton import MAX_QUERY_ROWS, flash_decode_triton  # noqa: F401
from .layout import check_layout


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, scale,
    stride_qs, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_bt,
    stride_os, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    # One program per (sequence, KV head): it loads each K/V block once for all GROUP query heads
    # that share it, and keeps a running (online) softmax across blocks.
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    ctx_len = tl.load(ctx_ptr + seq)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    t = tl.arange(0, BLOCK_SIZE)
    gmask = g < GROUP
    dmask = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    for b in range(0, tl.cdiv(ctx_len, BLOCK_SIZE)):
        block = tl.load(bt_ptr + seq * stride_bt + b).to(tl.int64)
        tmask = b * BLOCK_SIZE + t < ctx_len
        k_off = block * stride_kb + t[:, None] * stride_kt + kvh * stride_kh + d[None, :]
        v_off = block * stride_vb + t[:, None] * stride_vt + kvh * stride_vh + d[None, :]
        kv_mask = tmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + k_off, mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_SIZE, D]
        v = tl.load(v_ptr + v_off, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_PAD, BLOCK_SIZE]
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = acc / l[:, None]
    tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])


def paged_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale):
    """Same contract as kernels.paged_decode_torch: q [B, H, D] -> [B, H, D]."""
    B, H, D = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    check_layout(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables)
    group = H // kv_heads
    out = torch.empty_like(q)
    _paged_decode_kernel[(B, kv_heads)](
        q, k_cache, v_cache, block_tables, context_lens, out, scale,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_SIZE=block_size,
        HEAD_DIM=D, HEAD_DIM_PAD=triton.next_power_of_2(D),
    )
    return out


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, cu_ptr, ctx_ptr, out_ptr, scale,
    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_bt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, IEEE: tl.constexpr,
):
    # One program per (sequence, tile of BLOCK_M query tokens, query head); K/V come from the cache
    # through the block table, so earlier chunks of the same prompt are seen like this one.
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(cu_ptr + seq)
    q_len = tl.load(cu_ptr + seq + 1) - q_start
    if tile * BLOCK_M < q_len:
        ctx_len = tl.load(ctx_ptr + seq)
        kvh = h // GROUP
        mi = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, HEAD_DIM_PAD)
        t = tl.arange(0, BLOCK_SIZE)
        mmask = mi < q_len
        dmask = d < HEAD_DIM
        qpos = ctx_len - q_len + mi  # absolute position of each query row
        q = tl.load(q_ptr + (q_start + mi)[:, None] * stride_qt + h * stride_qh + d[None, :],
                    mask=mmask[:, None] & dmask[None, :], other=0.0)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
        last = tl.minimum(ctx_len - q_len + tile * BLOCK_M + BLOCK_M, ctx_len)  # causal: no key past the tile's last row
        for b in range(0, tl.cdiv(last, BLOCK_SIZE)):
            block = tl.load(bt_ptr + seq * stride_bt + b).to(tl.int64)
            kpos = b * BLOCK_SIZE + t
            k_off = block * stride_kb + t[:, None] * stride_kt + kvh * stride_kh + d[None, :]
            v_off = block * stride_vb + t[:, None] * stride_vt + kvh * stride_vh + d[None, :]
            kv_mask = (kpos < ctx_len)[:, None] & dmask[None, :]
            k = tl.load(k_ptr + k_off, mask=kv_mask, other=0.0).to(q.dtype)
            v = tl.load(v_ptr + v_off, mask=kv_mask, other=0.0).to(q.dtype)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * scale
            s = tl.where((kpos[None, :] <= qpos[:, None]) & (kpos[None, :] < ctx_len), s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)  # every row sees key 0 in block 0, so m_new is finite
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m = m_new
        out = acc / l[:, None]
        tl.store(out_ptr + (q_start + mi)[:, None] * stride_ot + h * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & dmask[None, :])


def prefill_triton(q, k, v, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, scale, max_query_len=None, block_m=16):
    """Same contract as kernels.prefill_torch; cu_seqlens_q and context_lens may be lists or int32 tensors.

    tl.dot needs tiles of at least 16: block_size >= 16 (head_dim is padded up to 16).
    """
    T, H, D = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    check_layout(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables)
    if block_size < 16:
        raise ValueError(f"prefill_triton needs block_size >= 16 (tl.dot's smallest tile), got {block_size}")
    cu = torch.as_tensor(cu_seqlens_q, dtype=torch.int32, device=q.device)
    ctx = torch.as_tensor(context_lens, dtype=torch.int32, device=q.device)
    max_q = max_query_len or int((cu[1:] - cu[:-1]).max())  # pass it to avoid a device sync
    out = torch.empty_like(q)
    grid = (len(ctx), triton.cdiv(max_q, block_m), H)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu, ctx, out, scale,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=H // kv_heads, BLOCK_M=block_m, BLOCK_SIZE=block_size, HEAD_DIM=D,
        HEAD_DIM_PAD=max(16, triton.next_power_of_2(D)), IEEE=q.dtype == torch.float32,
    )
    return out


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                     BLOCK_SIZE: tl.constexpr, KV_HEADS: tl.constexpr, KV_HEADS_PAD: tl.constexpr,
                     HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    # One program per token: copy its [kv_heads, head_dim] K and V into block slot // BLOCK_SIZE at
    # offset slot % BLOCK_SIZE, each tensor addressed through its own strides.
    i = tl.program_id(0)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    h = tl.arange(0, KV_HEADS_PAD)[:, None]
    d = tl.arange(0, HEAD_DIM_PAD)[None, :]
    mask = (h < KV_HEADS) & (d < HEAD_DIM)
    k = tl.load(k_ptr + i * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + i * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(kc_ptr + block * stride_kcb + offset * stride_kct + h * stride_kch + d, k, mask=mask)
    tl.store(vc_ptr + block * stride_vcb + offset * stride_vct + h * stride_vch + d, v, mask=mask)


def write_kv_triton(k, v, k_cache, v_cache, slot_mapping):
    """Same contract as kernels.write_kv_torch: k, v [T, kv_heads, D] into caches [num_blocks, block_size,
    kv_heads, D]. Any strides except the last dimension's, which must be 1 for all four tensors."""
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    check_layout(k=k, v=v, k_cache=k_cache, v_cache=v_cache)
    T, kv_heads, D = k.shape
    _write_kv_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                           *k_cache.stride()[:3], *v_cache.stride()[:3], BLOCK_SIZE=k_cache.shape[1],
                           KV_HEADS=kv_heads, KV_HEADS_PAD=triton.next_power_of_2(kv_heads),
                           HEAD_DIM=D, HEAD_DIM_PAD=triton.next_power_of_2(D))
