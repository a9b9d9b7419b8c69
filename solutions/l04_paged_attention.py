"""Lesson 04: PagedAttention, the KV cache in fixed-size blocks found through a block table.

- Section 1: how much KV memory reserve-the-maximum allocation wastes, replayed on the Azure
  LLM inference trace 2023 (pure arithmetic: token counts only).
- Section 2: a ref-counted block allocator (fork shares blocks, append_slot copies on write) that
  plugs into the course engine as LLM(..., block_allocator=PagedBlockAllocator).
- Section 3: the slot mapping, block table -> cache slot of every token.
- Section 4: paged decode attention, in torch and as a Triton kernel reading K/V through the table.

KV cache layout (the engine's, per layer): [num_blocks, block_size, num_kv_heads, head_dim]; token p
of a sequence lives in block block_table[p // block_size] at offset p % block_size.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from reference_engine.kernels.launch import launch
from reference_engine.kernels.triton_compat import tl, triton  # Triton; without it (macOS) a stand-in: see there

# ---------------------------------------------------------------- 1. the waste, on a trace

LLAMA_3_8B_KV_BYTES = 2 * 32 * 8 * 128 * 2  # K and V x 32 layers x 8 KV heads x head_dim 128 x bf16
LLAMA_3_8B_WEIGHT_BYTES = 8.03e9 * 2        # 8.03B parameters in bf16
H100_BANDWIDTH = 3.35e12  # H100 SXM datasheet: 3.35 TB/s (memory: the driver-reported gpu_model.H100.memory_bytes, lesson 06's convention)


@dataclass
class ReplayResult:
    """Per-step series of a KV-memory replay (all lists have one entry per step)."""
    mode: str
    time_s: list[float]
    running: list[int]          # requests holding KV memory
    tokens: list[int]           # tokens whose K/V are stored
    allocated: list[int]        # token slots reserved or allocated (what the memory manager gave out)
    capacity: int               # token slots in the whole KV pool
    finished: int               # requests completed within the replay
    preemptions: int


def _slots_at_admission(mode: str, prompt: int, total: int, generated: int, max_context: int,
                        block_size: int) -> int:
    """Token slots replay_kv gives a request when it is admitted (or readmitted after a preemption, with
    `generated` tokens already made): the maximum context, its exact total, or the blocks its tokens so far
    plus the next one fill."""
    if mode == "max":
        return max_context
    if mode == "oracle":
        return total
    return -(-(prompt + generated + 1) // block_size) * block_size


def _take_block(r: list[int], running: list[list[int]], queue: deque, used: int, capacity_tokens: int,
                block_size: int, out: ReplayResult) -> int:
    """replay_kv's paged mode when request r's new token spills into a block it does not hold: preempt the
    newest requests (their blocks freed, each back at the queue's front) until one block fits, then give r
    that block. If r is the newest and still nothing fits, r waits: its token is taken back. Returns the
    token slots allocated afterwards."""
    while used + block_size > capacity_tokens and running[-1] is not r:
        victim = running.pop()
        used -= victim[3]
        victim[3] = 0
        queue.appendleft(victim)
        out.preemptions += 1
    if used + block_size > capacity_tokens:  # alone and still no room: wait
        r[2] -= 1
        return used
    r[3] += block_size
    return used + block_size


def replay_kv(requests, capacity_tokens: int, mode: str, max_context: int = 8192, block_size: int = 16,
              kv_bytes_per_token: int = LLAMA_3_8B_KV_BYTES, weight_bytes: float = LLAMA_3_8B_WEIGHT_BYTES,
              bandwidth: float = H100_BANDWIDTH, max_steps: int = 20000) -> ReplayResult:
    """Replay trace requests (reference_engine.sim.trace.Request) through one KV pool, FCFS (a helper).

    mode "max": each admitted request reserves max_context token slots up front (engines before
    vLLM: the maximum sequence length, because the output length is unknown);
    "oracle": reserves exactly prompt + output tokens (knowing the future: the best a
    reserve-up-front scheme can do); "paged": holds ceil(tokens / block_size) blocks and takes
    one more only when a token spills into it; when none is free the newest request is preempted
    (its blocks freed, it re-enters the queue's front and later recomputes its tokens).
    A step adds one token to every running request (a newly admitted one gets its whole prompt
    plus its first token). Step time is the memory roofline of a decode step: (weights + K/V of
    all stored tokens) / bandwidth; prefill compute is ignored. Requests longer than max_context
    are clipped to it.
    """
    if mode not in ("max", "oracle", "paged"):
        raise ValueError(f"mode must be 'max', 'oracle' or 'paged', got {mode!r}")
    pending = deque(sorted(requests, key=lambda r: r.arrival))
    queue: deque = deque()
    running: list[list[int]] = []   # [prompt, output, generated, reserved_slots]
    out = ReplayResult(mode, [], [], [], [], capacity_tokens, 0, 0)
    used, now = 0, 0.0

    for _ in range(max_steps):
        if not (pending or queue or running):
            break
        while pending and pending[0].arrival <= now:
            r = pending.popleft()
            p = min(r.prompt_tokens, max_context - 1)
            queue.append([p, min(r.output_tokens, max_context - p), 0, 0])
        while queue:  # FCFS admission: nobody skips the head of the queue
            p, o, g, _ = queue[0]
            n = _slots_at_admission(mode, p, p + o, g, max_context, block_size)
            if used + n > capacity_tokens:
                break
            queue.popleft()
            running.append([p, o, g, n])
            used += n
        for r in list(running):  # the step: one token each
            if r[3] == 0:  # preempted earlier in this step
                continue
            r[2] += 1
            if mode == "paged" and r[0] + r[2] > r[3]:  # the token spills into a new block
                used = _take_block(r, running, queue, used, capacity_tokens, block_size, out)
        tokens = sum(r[0] + r[2] for r in running)
        out.time_s.append(now)
        out.running.append(len(running))
        out.tokens.append(tokens)
        out.allocated.append(used)
        done = [r for r in running if r[2] >= r[1]]
        running = [r for r in running if r[2] < r[1]]
        used -= sum(r[3] for r in done)
        out.finished += len(done)
        now += (weight_bytes + tokens * kv_bytes_per_token) / bandwidth
        if not running and not queue and pending:
            now = max(now, pending[0].arrival)
    return out


# ---------------------------------------------------------------- 2. the block allocator


class PagedBlockAllocator:
    """Exercise 2.1: a pool of num_blocks KV-cache blocks, ids 0 .. num_blocks - 1, with ref counts.

    Implements reference_engine.interfaces.BlockAllocator, so that
    LLM(path, block_allocator=PagedBlockAllocator) runs the engine on it. A block's ref count is
    the number of block tables (sequences) holding it; it is free exactly when the count is 0.
    Which free block allocate() returns is up to you (the engine's uses a FIFO free list).

    >>> a = PagedBlockAllocator(4)
    >>> t = [a.allocate(), a.allocate()]; a.num_free(), a.can_allocate(2), a.can_allocate(3)
    (2, True, False)
    >>> child = a.fork(t); a.ref_count(t[1])        # shared, not copied
    2
    >>> new, old = a.append_slot(child); old == t[1], new != old, a.ref_count(old)
    (True, True, 1)
    """

    def __init__(self, num_blocks: int):
        ### BEGIN SOLUTION
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._free = deque(range(num_blocks))
        ### END SOLUTION

    def allocate(self) -> int:
        """A free block, now with ref count 1 (raise RuntimeError if none is free)."""
        ### BEGIN SOLUTION
        if not self._free:
            raise RuntimeError("out of KV-cache blocks: check can_allocate() first")
        block = self._free.popleft()
        self._ref[block] = 1
        return block
        ### END SOLUTION

    def free(self, block_id: int) -> None:
        """Drop one reference; at 0 the block is free again. Freeing a free block raises RuntimeError."""
        ### BEGIN SOLUTION
        if self._ref[block_id] <= 0:
            raise RuntimeError(f"block {block_id} is already free")
        self._ref[block_id] -= 1
        if self._ref[block_id] == 0:
            self._free.append(block_id)
        ### END SOLUTION

    def incref(self, block_id: int) -> None:
        """One more table holds this allocated block (raise RuntimeError if it is free)."""
        ### BEGIN SOLUTION
        if self._ref[block_id] <= 0:
            raise RuntimeError(f"incref of free block {block_id}")
        self._ref[block_id] += 1
        ### END SOLUTION

    def ref_count(self, block_id: int) -> int:
        """How many tables hold block_id (0: free)."""
        ### BEGIN SOLUTION
        return self._ref[block_id]
        ### END SOLUTION

    def fork(self, block_table: list[int]) -> list[int]:
        """Parallel sampling: a new table for a child sequence holding the SAME blocks, each incref'd.

        block_table itself is left unchanged. No block is copied here: copies happen later, and
        only for a shared block that is about to be written (append_slot).
        """
        ### BEGIN SOLUTION
        for b in block_table:
            self.incref(b)
        return list(block_table)
        ### END SOLUTION

    def append_slot(self, block_table: list[int]) -> tuple[int, int | None]:
        """Make the last block of block_table writable before a token is written into it.

        If it is shared (ref count > 1): allocate a new block, drop this table's reference to the
        old one, set block_table[-1] = new (in place) and return (new, old); the engine then copies
        old's K/V into new (copy-on-write). If not shared: return (block_table[-1], None).
        The engine calls it only when can_allocate(1) holds for a shared last block.
        """
        ### BEGIN SOLUTION
        last = block_table[-1]
        if self._ref[last] == 1:
            return last, None
        new = self.allocate()
        self.free(last)
        block_table[-1] = new
        return new, last
        ### END SOLUTION

    def num_free(self) -> int:
        """Blocks with ref count 0."""
        ### BEGIN SOLUTION
        return len(self._free)
        ### END SOLUTION

    def can_allocate(self, n: int) -> bool:
        """True if n allocate() calls in a row would succeed now."""
        ### BEGIN SOLUTION
        return n <= len(self._free)
        ### END SOLUTION


# ---------------------------------------------------------------- 3. slot mapping


def slot_mapping(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Exercise 3.1: the cache slot of each token position of one sequence.

    block_table: [num_blocks_of_seq] int tensor, the sequence's physical block ids in order;
    positions:   [T] int64 tensor, token positions in the sequence (each < len(block_table) * block_size);
    Returns [T] int64: slot = block_table[p // block_size] * block_size + p % block_size, the row
    of the cache viewed as [num_blocks * block_size, num_kv_heads, head_dim] (what write_kv and
    the engine's slot_mapping use).

    >>> slot_mapping(torch.tensor([7, 2]), torch.tensor([0, 3, 4, 5]), 4)
    tensor([28, 31,  8,  9])
    """
    ### BEGIN SOLUTION
    positions = positions.long()
    blocks = block_table.long()[positions // block_size]
    return blocks * block_size + positions % block_size
    ### END SOLUTION


# ---------------------------------------------------------------- 4. paged decode attention


def paged_decode_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Exercise 4.1: one decode step of attention over the paged KV cache, in plain torch.

    q:            [num_seqs, num_heads, head_dim], one new query token per sequence;
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], shared by all sequences;
    block_tables: [num_seqs, max_blocks] int32; row s lists sequence s's blocks in order, padded
                  past its last block with arbitrary valid ids (junk: never attend to it);
    context_lens: [num_seqs] int32, tokens of sequence s in the cache (the new one included);
    scale:        the softmax scale, 1/sqrt(head_dim) for Llama.
    Returns [num_seqs, num_heads, head_dim] in q's dtype (compute in float32).

    Query head h reads KV head h // (num_heads // num_kv_heads) (grouped-query attention).
    The engine's own version is reference_engine.kernels.paged_decode_torch (same contract).

    >>> q, kc = torch.randn(2, 4, 8), torch.randn(5, 4, 2, 8)
    >>> paged_decode_torch(q, kc, kc, torch.tensor([[3, 1], [0, 0]]), torch.tensor([6, 2]), 8 ** -0.5).shape
    torch.Size([2, 4, 8])
    """
    ### BEGIN SOLUTION
    B, H, D = q.shape
    _, bs, H_kv, _ = k_cache.shape
    group = H // H_kv
    nb = block_tables.shape[1]
    idx = block_tables.long()
    k = k_cache[idx].reshape(B, nb * bs, H_kv, D).float()             # gather: [B, L, H_kv, D]
    v = v_cache[idx].reshape(B, nb * bs, H_kv, D).float()
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)  # head h -> h // group
    s = torch.einsum("bhd,blhd->bhl", q.float(), k) * scale
    past = torch.arange(nb * bs, device=q.device)[None, :] >= context_lens.to(q.device).long()[:, None]
    s = s.masked_fill(past[:, None, :], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", s.softmax(-1), v).to(q.dtype)
    ### END SOLUTION


@triton.jit
def paged_decode_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, scale, max_blocks,
                        stride_qs, stride_qh, stride_kb, stride_kt, stride_kh, stride_bt,
                        stride_os, stride_oh,
                        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                        HEAD_DIM: tl.constexpr):
    """Exercise 4.2: paged decode, one program per (sequence, KV head) serving its GROUP query heads.

    Grid (num_seqs, num_kv_heads). Program (s, j):
    - loads the queries of heads j*GROUP .. j*GROUP + GROUP - 1 as a [GROUP_PAD, HEAD_DIM] tile
      (rows >= GROUP masked; GROUP_PAD is GROUP rounded up to a power of two);
    - for each logical block b = 0 .. cdiv(ctx_len, BLOCK_SIZE) - 1: reads the physical block id
      from the table, bt_ptr + s * stride_bt + b (stride_bt is the table's row stride: it need not
      equal max_blocks, the table's width, when the table is a view of a wider buffer), then that
      block's [BLOCK_SIZE, HEAD_DIM] K and V of KV head j, tokens at or past ctx_len masked;
    - scores = q . k * scale (tl.sum of a broadcast product works at any size; tl.dot needs >= 16),
      -inf past ctx_len; online softmax across blocks (running max m, sum l, accumulator acc);
    - stores acc / l for the GROUP real rows in out's dtype. Everything accumulates in float32.
    Element (s, h, i) of q is at q_ptr + s*stride_qs + h*stride_qh + i; element (blk, t, j, i) of
    the K cache at k_ptr + blk*stride_kb + t*stride_kt + j*stride_kh + i (V has the same strides);
    out like q. ctx_ptr holds context_lens (int32).
    """
    ### BEGIN SOLUTION
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    ctx_len = tl.load(ctx_ptr + seq)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    t = tl.arange(0, BLOCK_SIZE)
    gmask = g < GROUP
    heads = kvh * GROUP + g  # the query heads h with h // GROUP == kvh
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :],
                mask=gmask[:, None], other=0.0).to(tl.float32)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for b in range(0, tl.cdiv(ctx_len, BLOCK_SIZE)):
        block = tl.load(bt_ptr + seq * stride_bt + b).to(tl.int64)  # logical block b -> physical block
        valid = b * BLOCK_SIZE + t < ctx_len
        off = block * stride_kb + t[:, None] * stride_kt + kvh * stride_kh + d[None, :]
        k = tl.load(k_ptr + off, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + off, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_PAD, BLOCK_SIZE]
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
    ### END SOLUTION


def launch_paged_decode(kernel, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Run a paged decode `kernel` (paged_decode_kernel's signature) on grid (num_seqs, num_kv_heads)."""
    B, H, D = q.shape
    _, bs, H_kv, _ = k_cache.shape
    if H % H_kv or D & (D - 1) or bs & (bs - 1):
        raise ValueError(f"need num_heads % num_kv_heads == 0 and head_dim, block_size powers of two; "
                         f"got num_heads={H}, num_kv_heads={H_kv}, head_dim={D}, block_size={bs}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or block_tables.stride(-1) != 1:
        raise ValueError("k_cache and v_cache need the same strides, contiguous last dims, and block_tables "
                         "contiguous rows")
    q = q.contiguous()
    out = torch.empty_like(q)
    ctx = context_lens.to(device=q.device, dtype=torch.int32).contiguous()
    group = H // H_kv
    launch(kernel, (B, H_kv), q, k_cache, v_cache, block_tables, ctx, out, scale, block_tables.shape[1],
           q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
           block_tables.stride(0), out.stride(0), out.stride(1),
           GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_SIZE=bs, HEAD_DIM=D,
           stub="Exercise 4.2 (paged_decode_kernel): see section 4.2 of lessons/l04_paged_attention.ipynb")
    return out


def paged_decode_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """paged_decode_torch's contract, computed by paged_decode_kernel (a helper: the kernel is the exercise)."""
    return launch_paged_decode(paged_decode_kernel, q, k_cache, v_cache, block_tables, context_lens, scale)


class DecodeBackend:
    """An engine AttentionBackend whose decode is `decode_fn` (yours); write_kv and prefill are the engine's.

    LLM(path, attention_backend=DecodeBackend(paged_decode_torch)) runs every decode step through it.
    """

    name = "learner-decode"

    def __init__(self, decode_fn):
        from reference_engine.attention import TorchBackend
        self._engine, self.decode_fn = TorchBackend(), decode_fn

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
        self._engine.write_kv(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale):
        return self.decode_fn(q, k_cache, v_cache, block_tables, context_lens, scale)

    def prefill(self, q, k, v, k_cache, v_cache, meta, scale):
        return self._engine.prefill(q, k, v, k_cache, v_cache, meta, scale)


# ---------------------------------------------------------------- 5. preemption: swap or recompute

# PCIe Gen5 x16 moves about 63 GB/s in each direction (reference-facts.md); the H100 SXM's dense bf16 peak
# (NVIDIA datasheet). Lesson 01's model dict: nominal parameters and the attention shape from config.json.
PCIE_GEN5_X16_BYTES_PER_S = 63e9
H100_DENSE_BF16_FLOPS = 989e12
LLAMA_3_8B = {"name": "Llama-3-8B", "params": 8.03e9, "layers": 32, "heads": 32, "kv_heads": 8, "head_dim": 128}


def preemption_cost(model: dict, context_tokens: int, kv_bytes: float = 2,
                    pcie_bytes_per_s: float = PCIE_GEN5_X16_BYTES_PER_S,
                    flops_per_s: float = H100_DENSE_BF16_FLOPS) -> dict:
    """Exercise 5.1: the cost of bringing back one preempted sequence that had `context_tokens` tokens
    cached, by swapping its K/V out to host memory or by recomputing them.

    model: lesson 01's dict ("params", "layers", "heads" = query heads, "kv_heads", "head_dim");
    kv_bytes: bytes per cache element (2 for bf16, 1 for fp8).
      swap:      when the sequence is preempted its K/V go to host memory, and when it resumes they come
                 back: two transfers, each of context_tokens * 2 (K and V) * layers * kv_heads * head_dim *
                 kv_bytes bytes, over a link of pcie_bytes_per_s in each direction. swap_s = both.
      recompute: its blocks are freed, and when it resumes its tokens are prefilled again as one prompt:
                 2 * params FLOPs per token (every weight once) plus causal attention, 4 * head_dim FLOPs
                 per (query, key) pair and query head in every layer, token i (from 0) seeing i + 1 keys.
                 recompute_s = those FLOPs / flops_per_s (a long prefill is compute-bound; pass the FLOP/s
                 it sustains, the dense peak by default).
    Returns {"transfer_bytes": bytes of one transfer, "swap_s": seconds, "recompute_flops": FLOPs,
             "recompute_s": seconds, "cheaper": "swap" or "recompute" (less time; "recompute" on a tie,
             since it needs no host memory)}. Raises ValueError for context_tokens < 0.

    >>> c = preemption_cost(LLAMA_3_8B, 1)
    >>> c["transfer_bytes"], c["recompute_flops"], c["cheaper"]
    (131072, 16060524288.0, 'swap')
    >>> round(c["swap_s"] * 1e6, 2), round(c["recompute_s"] * 1e6, 2)   # microseconds
    (4.16, 16.24)
    """
    ### BEGIN SOLUTION
    if context_tokens < 0:
        raise ValueError(f"context_tokens must be >= 0, got {context_tokens}")
    n = context_tokens
    one_way = n * 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * kv_bytes
    pairs = n * (n + 1) // 2
    flops = 2 * model["params"] * n + 4 * model["layers"] * model["heads"] * model["head_dim"] * pairs
    swap_s, recompute_s = 2 * one_way / pcie_bytes_per_s, flops / flops_per_s
    return {"transfer_bytes": one_way, "swap_s": swap_s, "recompute_flops": flops, "recompute_s": recompute_s,
            "cheaper": "swap" if swap_s < recompute_s else "recompute"}
    ### END SOLUTION
