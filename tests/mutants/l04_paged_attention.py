"""Plausible wrong answers for lesson 04 (PagedAttention)."""
import torch

from reference_engine.kernels.triton_compat import tl, triton  # on CPU: Triton's interpreter, set before @triton.jit
from solutions import l04_paged_attention as sol
from tests.mutants import mutant

_m_Base = sol.PagedBlockAllocator


# ---------------------------------------------------------------- 2. the allocator
# Each wrong allocator is a helper class; the mutant is a factory of the same name as the solution's
# class (the engine and the checks accept any callable num_blocks -> allocator). Class mutants of one
# name cannot be told apart by their source lines, functions can.


class _m_FreesShared(_m_Base):
    def free(self, block_id):  # no ref counting: one free releases the block for every holder
        if self._ref[block_id] <= 0:
            raise RuntimeError("double free")
        self._ref[block_id] = 0
        self._free.append(block_id)


class _m_ForkCopies(_m_Base):
    def fork(self, block_table):
        return [self.allocate() for _ in block_table]


class _m_NeverCopies(_m_Base):
    def append_slot(self, block_table):
        return block_table[-1], None


class _m_AlwaysCopies(_m_Base):
    def append_slot(self, block_table):
        old = block_table[-1]
        new = self.allocate()
        self.free(old)
        block_table[-1] = new
        return new, old


class _m_CanAllocateOffByOne(_m_Base):
    def can_allocate(self, n):
        return n < self.num_free()


class _m_LeaksOnCopy(_m_Base):
    def append_slot(self, block_table):  # forgets to drop the table's reference to the old block
        last = block_table[-1]
        if self._ref[last] == 1:
            return last, None
        new = self.allocate()
        block_table[-1] = new
        return new, last


class _m_CopiesTheTable(_m_Base):
    def append_slot(self, block_table):  # rebinds a copy: the caller's table keeps the shared block
        last = block_table[-1]
        if self._ref[last] == 1:
            return last, None
        new = self.allocate()
        self.free(last)
        block_table = block_table[:-1] + [new]
        return new, last


class _m_DoubleFreeSilent(_m_Base):
    def free(self, block_id):
        self._ref[block_id] = max(0, self._ref[block_id] - 1)
        if self._ref[block_id] == 0 and block_id not in self._free:
            self._free.append(block_id)


class _m_ForkAliases(_m_Base):
    def fork(self, block_table):  # increfs, but hands back the parent's own list
        for b in block_table:
            self.incref(b)
        return block_table


class _m_IncrefFree(_m_Base):
    def incref(self, block_id):  # no check that the block is held
        self._ref[block_id] += 1


class _m_NumFreeTypo(_m_Base):
    def num_free(self):  # a name the class never set: AttributeError on the first query after an operation
        return len(self.free_list)


class _m_EmptyIndexError(_m_Base):
    def allocate(self):  # pops an empty deque: IndexError, not the interface's RuntimeError
        block = self._free.popleft()
        self._ref[block] = 1
        return block


@mutant(check="block_allocator", message="returns the parent's own list from fork")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_ForkAliases(num_blocks)


@mutant(check="block_allocator", message="incref of a free block")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_IncrefFree(num_blocks)


@mutant(check="block_allocator", message="lets IndexError escape")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_EmptyIndexError(num_blocks)


@mutant(check="block_allocator", message="frees a shared block")
def PagedBlockAllocator(num_blocks):
    return _m_FreesShared(num_blocks)


@mutant(check="block_allocator", message="copies blocks in fork instead of sharing them")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_ForkCopies(num_blocks)


@mutant(check="block_allocator", message="never copies in append_slot")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_NeverCopies(num_blocks)


@mutant(check="block_allocator", message="copies in append_slot although the last block is not shared")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_AlwaysCopies(num_blocks)


@mutant(check="block_allocator", message="off by one in can_allocate")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_CanAllocateOffByOne(num_blocks)


@mutant(check="block_allocator", message="leaks the old block on copy-on-write")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_LeaksOnCopy(num_blocks)


@mutant(check="block_allocator", message="lets a free block be freed again")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_DoubleFreeSilent(num_blocks)


@mutant(check="block_allocator", message="puts the new block into a copy of the table")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_CopiesTheTable(num_blocks)


@mutant(check="allocator_in_engine", message="writing into a shared block without a copy")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_NeverCopies(num_blocks)


@mutant(check="allocator_in_engine", message="after every request finished")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_LeaksOnCopy(num_blocks)


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

def _m_decode(q, k_cache, v_cache, block_tables, context_lens, scale, kv_map="div", lens=lambda n, bs: n,
              tables=lambda bt: bt, upcast=True):
    """The solution's paged decode with one thing changed (what each keyword says)."""
    B, H, D = q.shape
    _, bs, H_kv, _ = k_cache.shape
    nb = block_tables.shape[1]
    out_dtype = q.dtype
    idx = tables(block_tables).long()
    k = k_cache[idx].reshape(B, nb * bs, H_kv, D)
    v = v_cache[idx].reshape(B, nb * bs, H_kv, D)
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    heads = torch.arange(H)
    kv = heads // (H // H_kv) if kv_map == "div" else heads % H_kv
    s = torch.einsum("bhd,blhd->bhl", q, k[:, :, kv]) * scale
    n = lens(context_lens.long(), bs)
    if n is not None:
        s = s.masked_fill((torch.arange(nb * bs)[None, :] >= n[:, None])[:, None], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", s.softmax(-1), v[:, :, kv]).to(out_dtype)


@mutant(check="paged_decode_torch", message="ignores context_lens")
def paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):
    return _m_decode(q, k_cache, v_cache, block_tables, context_lens, scale, lens=lambda n, bs: None)


@mutant(check="paged_decode_torch", message="maps query head h to KV head h % num_kv_heads")
def paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return _m_decode(q, k_cache, v_cache, block_tables, context_lens, scale, kv_map="mod")


@mutant(check="paged_decode_torch", message="misses the softmax scale")
def paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return _m_decode(q, k_cache, v_cache, block_tables, context_lens, 1.0)


@mutant(check="paged_decode_torch", message="ignores the `scale` argument")
def paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return _m_decode(q, k_cache, v_cache, block_tables, context_lens, q.shape[-1] ** -0.5)


@mutant(check="paged_decode_torch", message="drops the newest token")
def paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return _m_decode(q, k_cache, v_cache, block_tables, context_lens, scale, lens=lambda n, bs: n - 1)


@mutant(check="paged_decode_torch", message="attends to one position too many")
def paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return _m_decode(q, k_cache, v_cache, block_tables, context_lens, scale, lens=lambda n, bs: n + 1)


@mutant(check="paged_decode_torch", message="masks whole blocks only")
def paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return _m_decode(q, k_cache, v_cache, block_tables, context_lens, scale, lens=lambda n, bs: (n + bs - 1) // bs * bs)


@mutant(check="paged_decode_torch", message="reads logical block b of the cache")
def paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return _m_decode(q, k_cache, v_cache, block_tables, context_lens, scale,
                     tables=lambda bt: torch.arange(bt.shape[1]).expand(bt.shape[0], -1))


@mutant(check="paged_decode_torch", message="reads every sequence's blocks from row 0")
def paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return _m_decode(q, k_cache, v_cache, block_tables, context_lens, scale,
                     tables=lambda bt: bt[:1].expand(bt.shape[0], -1))


@mutant(check="paged_decode_torch", message="computes the scores and softmax in bf16")
def paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return _m_decode(q, k_cache, v_cache, block_tables, context_lens, scale, upcast=False)


# ---------------------------------------------------------------- 4.2 paged decode (Triton)

def _m_bad_kernel_src(q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, scale, max_blocks,
                  stride_qs, stride_qh, stride_kb, stride_kt, stride_kh, stride_bt, stride_os, stride_oh,
                  GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                  HEAD_DIM: tl.constexpr, MODE: tl.constexpr):
    # MODE 1: row stride = max_blocks; 2: heads h % kv; 3: no length mask; 4: whole blocks only;
    # 6: every sequence reads row 0 of the table
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
        elif MODE == 6:
            block = tl.load(bt_ptr + b).to(tl.int64)
        else:
            block = tl.load(bt_ptr + seq * stride_bt + b).to(tl.int64)
        valid = b * BLOCK_SIZE + t < ctx_len
        if MODE == 3 or MODE == 4:
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


# Jitted by a call, not a decorator: a mutant's source keeps its helpers' bodies but not their decorators.
_m_bad_kernel = triton.jit(_m_bad_kernel_src)


class _m_Mode:
    """Stands in for a kernel: kernel[grid](...) runs _m_bad_kernel with MODE set."""

    def __init__(self, mode):
        self.mode = mode

    def __getitem__(self, grid):
        return lambda *a, **kw: _m_bad_kernel[grid](*a, MODE=self.mode, **kw)


@mutant(check="paged_decode_triton", message="reads the block table with the wrong stride")
def paged_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale):
    return sol.launch_paged_decode(_m_Mode(1), q, k_cache, v_cache, block_tables, context_lens, scale)


@mutant(check="paged_decode_triton", message="maps query head h to KV head h % num_kv_heads")
def paged_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return sol.launch_paged_decode(_m_Mode(2), q, k_cache, v_cache, block_tables, context_lens, scale)


@mutant(check="paged_decode_triton", message="ignores context_lens")
def paged_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return sol.launch_paged_decode(_m_Mode(3), q, k_cache, v_cache, block_tables, context_lens, scale)


@mutant(check="paged_decode_triton", message="masks whole blocks only")
def paged_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return sol.launch_paged_decode(_m_Mode(4), q, k_cache, v_cache, block_tables, context_lens, scale)


@mutant(check="paged_decode_triton", message="ignores the `scale` argument")
def paged_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    # as a kernel that computes 1/sqrt(HEAD_DIM) itself instead of using its `scale` argument
    return sol.launch_paged_decode(sol.paged_decode_kernel, q, k_cache, v_cache, block_tables, context_lens,
                                   q.shape[-1] ** -0.5)


@mutant(check="paged_decode_triton", message="reads every sequence's blocks from row 0")
def paged_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale):  # noqa: F811
    return sol.launch_paged_decode(_m_Mode(6), q, k_cache, v_cache, block_tables, context_lens, scale)


# ---------------------------------------------------------------- 5. swap or recompute

_m_PCIE, _m_FLOPS = sol.PCIE_GEN5_X16_BYTES_PER_S, sol.H100_DENSE_BF16_FLOPS


def _m_preemption(model, n, kv_bytes, pcie, flops, transfers=2, tensors=2, heads="heads",
                  pairs=lambda n: n * (n + 1) // 2, on_tie="recompute", check=True):
    if check and n < 0:
        raise ValueError("negative context")
    one_way = n * tensors * model["layers"] * model["kv_heads"] * model["head_dim"] * kv_bytes
    total = 2 * model["params"] * n + 4 * model["layers"] * model[heads] * model["head_dim"] * pairs(n)
    swap_s, recompute_s = transfers * one_way / pcie, total / flops
    if swap_s == recompute_s:
        cheaper = on_tie
    else:
        cheaper = "swap" if swap_s < recompute_s else "recompute"
    return {"transfer_bytes": one_way, "swap_s": swap_s, "recompute_flops": total, "recompute_s": recompute_s,
            "cheaper": cheaper}


@mutant(check="preemption_cost", message="counts one PCIe transfer")
def preemption_cost(model, context_tokens, kv_bytes=2, pcie_bytes_per_s=_m_PCIE, flops_per_s=_m_FLOPS):
    return _m_preemption(model, context_tokens, kv_bytes, pcie_bytes_per_s, flops_per_s, transfers=1)


@mutant(check="preemption_cost", message="counts only K")
def preemption_cost(model, context_tokens, kv_bytes=2, pcie_bytes_per_s=_m_PCIE, flops_per_s=_m_FLOPS):  # noqa: F811
    return _m_preemption(model, context_tokens, kv_bytes, pcie_bytes_per_s, flops_per_s, tensors=1)


@mutant(check="preemption_cost", message="uses kv_heads in the attention FLOPs")
def preemption_cost(model, context_tokens, kv_bytes=2, pcie_bytes_per_s=_m_PCIE, flops_per_s=_m_FLOPS):  # noqa: F811
    return _m_preemption(model, context_tokens, kv_bytes, pcie_bytes_per_s, flops_per_s, heads="kv_heads")


@mutant(check="preemption_cost", message="counts n * n (query, key) pairs")
def preemption_cost(model, context_tokens, kv_bytes=2, pcie_bytes_per_s=_m_PCIE, flops_per_s=_m_FLOPS):  # noqa: F811
    return _m_preemption(model, context_tokens, kv_bytes, pcie_bytes_per_s, flops_per_s, pairs=lambda n: n * n)


@mutant(check="preemption_cost", message="counts n(n-1)/2 (query, key) pairs")
def preemption_cost(model, context_tokens, kv_bytes=2, pcie_bytes_per_s=_m_PCIE, flops_per_s=_m_FLOPS):  # noqa: F811
    return _m_preemption(model, context_tokens, kv_bytes, pcie_bytes_per_s, flops_per_s,
                         pairs=lambda n: n * (n - 1) / 2)  # true division: a float count of pairs


@mutant(check="preemption_cost", message="leaves out the attention FLOPs")
def preemption_cost(model, context_tokens, kv_bytes=2, pcie_bytes_per_s=_m_PCIE, flops_per_s=_m_FLOPS):  # noqa: F811
    return _m_preemption(model, context_tokens, kv_bytes, pcie_bytes_per_s, flops_per_s, pairs=lambda n: 0)


@mutant(check="preemption_cost", message='picks "swap" on a tie')
def preemption_cost(model, context_tokens, kv_bytes=2, pcie_bytes_per_s=_m_PCIE, flops_per_s=_m_FLOPS):  # noqa: F811
    # "swap" if swap_s <= recompute_s: right everywhere but at a tie
    return _m_preemption(model, context_tokens, kv_bytes, pcie_bytes_per_s, flops_per_s, on_tie="swap")


@mutant(check="preemption_cost", message="instead of raising ValueError")
def preemption_cost(model, context_tokens, kv_bytes=2, pcie_bytes_per_s=_m_PCIE, flops_per_s=_m_FLOPS):  # noqa: F811
    return _m_preemption(model, context_tokens, kv_bytes, pcie_bytes_per_s, flops_per_s, check=False)


@mutant(check="preemption_cost", message="ignores the kv_bytes argument")
def preemption_cost(model, context_tokens, kv_bytes=2, pcie_bytes_per_s=_m_PCIE, flops_per_s=_m_FLOPS):  # noqa: F811
    return _m_preemption(model, context_tokens, 2, pcie_bytes_per_s, flops_per_s)


@mutant(check="preemption_cost", message="ignores the flops_per_s argument")
def preemption_cost(model, context_tokens, kv_bytes=2, pcie_bytes_per_s=_m_PCIE, flops_per_s=_m_FLOPS):  # noqa: F811
    return _m_preemption(model, context_tokens, kv_bytes, pcie_bytes_per_s, _m_FLOPS)


# ---------------------------------------------------------------- malformed return values

class _m_CopyAsList(_m_Base):
    def append_slot(self, block_table):  # the copy's id wrapped in a list: ([new], old), table[-1] = [new]
        new, old = super().append_slot(block_table)
        if old is None:
            return new, old
        block_table[-1] = [new]
        return [new], old


@mutant(check="block_allocator", message="the block in it must be a block id (an int in 0..")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_CopyAsList(num_blocks)


@mutant(check="block_allocator", message="PagedBlockAllocator.num_free() raised")
def PagedBlockAllocator(num_blocks):  # noqa: F811
    return _m_NumFreeTypo(num_blocks)
