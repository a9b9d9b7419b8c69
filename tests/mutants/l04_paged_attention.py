"""Plausible wrong answers for lesson 04 (PagedAttention)."""
import torch

from solutions import l04_paged_attention as sol  # sets TRITON_INTERPRET on CPU first
from tests.mutants import mutant

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

Base = sol.PagedBlockAllocator


# ---------------------------------------------------------------- 2. the allocator

@mutant(check="block_allocator", message="frees a shared block")
class PagedBlockAllocator(Base):
    def free(self, block_id):  # no ref counting: one free releases the block for every holder
        if self._ref[block_id] <= 0:
            raise RuntimeError("double free")
        self._ref[block_id] = 0
        self._free.append(block_id)


@mutant(check="block_allocator", message="copies blocks in fork instead of sharing them")
class PagedBlockAllocator(Base):  # noqa: F811
    def fork(self, block_table):
        return [self.allocate() for _ in block_table]


@mutant(check="block_allocator", message="never copies in append_slot")
class PagedBlockAllocator(Base):  # noqa: F811
    def append_slot(self, block_table):
        return block_table[-1], None


@mutant(check="block_allocator", message="copies in append_slot although the last block is not shared")
class PagedBlockAllocator(Base):  # noqa: F811
    def append_slot(self, block_table):
        old = block_table[-1]
        new = self.allocate()
        self.free(old)
        block_table[-1] = new
        return new, old


@mutant(check="block_allocator", message="off by one in can_allocate")
class PagedBlockAllocator(Base):  # noqa: F811
    def can_allocate(self, n):
        return n < self.num_free()


@mutant(check="block_allocator", message="leaks the old block on copy-on-write")
class PagedBlockAllocator(Base):  # noqa: F811
    def append_slot(self, block_table):
        last = block_table[-1]
        if self._ref[last] == 1:
            return last, None
        new = self.allocate()
        block_table[-1] = new
        return new, last


@mutant(check="block_allocator", message="lets a free block be freed again")
class PagedBlockAllocator(Base):  # noqa: F811
    def free(self, block_id):
        self._ref[block_id] = max(0, self._ref[block_id] - 1)
        if self._ref[block_id] == 0 and block_id not in self._free:
            self._free.append(block_id)


@mutant(check="allocator_in_engine", message="writing into a shared block without a copy")
class PagedBlockAllocator(Base):  # noqa: F811
    def append_slot(self, block_table):
        return block_table[-1], None


@mutant(check="allocator_in_engine", message="after every request finished")
class PagedBlockAllocator(Base):  # noqa: F811
    def append_slot(self, block_table):  # leaks the old block's reference
        last = block_table[-1]
        if self._ref[last] == 1:
            return last, None
        new = self.allocate()
        block_table[-1] = new
        return new, last


# ---------------------------------------------------------------- 3. slot mapping

@mutant(check="slot_mapping", message="uses the position as the slot")
def slot_mapping(block_table, positions, block_size):
    return positions.long().clone()


@mutant(check="slot_mapping", message="indexes the block table by position")
def slot_mapping(block_table, positions, block_size):  # noqa: F811
    p = positions.long()
    return block_table.long()[p % len(block_table)] * block_size + p % block_size


@mutant(check="slot_mapping", message="multiplies by block size 16")
def slot_mapping(block_table, positions, block_size):  # noqa: F811
    p = positions.long()
    return block_table.long()[p // block_size] * 16 + p % block_size


# ---------------------------------------------------------------- 4.1 paged decode (torch)

def _torch_variant(kv_map="div", ignore_lens=False, scale_one=False):
    def fn(q, k_cache, v_cache, block_tables, context_lens, scale):
        B, H, D = q.shape
        _, bs, H_kv, _ = k_cache.shape
        nb = block_tables.shape[1]
        idx = block_tables.long()
        k = k_cache[idx].reshape(B, nb * bs, H_kv, D).float()
        v = v_cache[idx].reshape(B, nb * bs, H_kv, D).float()
        heads = torch.arange(H)
        kv = heads // (H // H_kv) if kv_map == "div" else heads % H_kv
        s = torch.einsum("bhd,blhd->bhl", q.float(), k[:, :, kv]) * (1.0 if scale_one else scale)
        if not ignore_lens:
            s = s.masked_fill((torch.arange(nb * bs)[None, :] >= context_lens.long()[:, None])[:, None], float("-inf"))
        return torch.einsum("bhl,blhd->bhd", s.softmax(-1), v[:, :, kv]).to(q.dtype)
    fn.__name__ = "paged_decode_torch"
    return fn


mutant(check="paged_decode_torch", message="ignores context_lens")(_torch_variant(ignore_lens=True))
mutant(check="paged_decode_torch", message="maps query head h to KV head h % num_kv_heads")(_torch_variant(kv_map="mod"))
mutant(check="paged_decode_torch", message="misses the softmax scale")(_torch_variant(scale_one=True))


# ---------------------------------------------------------------- 4.2 paged decode (Triton)

@triton.jit
def _bad_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, scale, max_blocks,
                stride_qs, stride_qh, stride_kb, stride_kt, stride_kh, stride_bt, stride_os, stride_oh,
                GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                HEAD_DIM: tl.constexpr, MODE: tl.constexpr):
    # MODE 1: row stride = max_blocks; 2: heads h % kv; 3: no length mask; 4: whole blocks only
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    ctx_len = tl.load(ctx_ptr + seq)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    t = tl.arange(0, BLOCK_SIZE)
    gmask = g < GROUP
    if MODE == 2:
        heads = g * (tl.num_programs(1)) + kvh  # heads with h % num_kv_heads == kvh
    else:
        heads = kvh * GROUP + g
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :],
                mask=gmask[:, None], other=0.0).to(tl.float32)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    n_blocks = tl.cdiv(ctx_len, BLOCK_SIZE)
    if MODE == 3:
        n_blocks = max_blocks
    for b in range(0, n_blocks):
        if MODE == 1:
            block = tl.load(bt_ptr + seq * max_blocks + b).to(tl.int64)
        else:
            block = tl.load(bt_ptr + seq * stride_bt + b).to(tl.int64)
        valid = b * BLOCK_SIZE + t < ctx_len
        if MODE >= 3:
            valid = t >= 0
        off = block * stride_kb + t[:, None] * stride_kt + kvh * stride_kh + d[None, :]
        k = tl.load(k_ptr + off, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + off, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = acc / l[:, None]
    tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=gmask[:, None])


class _Mode:
    def __init__(self, mode):
        self.mode = mode

    def __getitem__(self, grid):
        return lambda *a, **kw: _bad_kernel[grid](*a, MODE=self.mode, **kw)


def _triton_variant(mode):
    def paged_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale):
        return sol.launch_paged_decode(_Mode(mode), q, k_cache, v_cache, block_tables, context_lens, scale)
    return paged_decode_triton


mutant(check="paged_decode_triton", message="reads the block table with the wrong stride")(_triton_variant(1))
mutant(check="paged_decode_triton", message="maps query head h to KV head h % num_kv_heads")(_triton_variant(2))
mutant(check="paged_decode_triton", message="ignores context_lens")(_triton_variant(3))
mutant(check="paged_decode_triton", message="masks whole blocks only")(_triton_variant(4))
