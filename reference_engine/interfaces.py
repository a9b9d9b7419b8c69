"""The three hooks lessons plug learner code into. Each is a typing.Protocol: implement the methods,
no subclassing needed, and pass the object (or class) to LLM(...) / LLMEngine(...).

    LLM(path, block_allocator=MyAllocator)       # a class or any callable num_blocks -> allocator
    LLM(path, scheduler_policy=MyPolicy())       # an instance, or a class to instantiate
    LLM(path, attention_backend=MyBackend())     # or "torch" / "triton"

The engine's own implementations: block_manager.BlockAllocator, scheduler.FCFSPolicy,
attention.TorchBackend / attention.TritonBackend.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from .attention import AttentionMetadata
    from .scheduler import Budget
    from .sequence import Sequence


@runtime_checkable
class BlockAllocator(Protocol):
    """A pool of num_blocks KV-cache block ids, 0 .. num_blocks - 1, with reference counts.

    Called by: block_manager.BlockManager only (which knows the block size and the sequences).
    Invariants the engine checks in tests (BlockManager.check_consistency):
      * ref_count(b) == number of live block tables holding b; a block is free iff its count is 0;
      * no block is handed out by allocate() while its count is > 0 (never twice);
      * num_free() + number of distinct held blocks == num_blocks; when every request has ended,
        num_free() == num_blocks (nothing leaks).
    """

    def __init__(self, num_blocks: int): ...

    def allocate(self) -> int:
        """A free block with ref count 1. Only called after can_allocate() said yes."""

    def free(self, block_id: int) -> None:
        """Drop one reference; at 0 the block is free again. Freeing a free block is an error."""

    def incref(self, block_id: int) -> None:
        """One more table holds this (allocated) block."""

    def ref_count(self, block_id: int) -> int: ...

    def fork(self, block_table: list[int]) -> list[int]:
        """Parallel sampling: a copy of block_table for a child sequence, each block incref'd (shared, not copied)."""

    def append_slot(self, block_table: list[int]) -> tuple[int, int | None]:
        """Called before a token is written into the last, partly filled block of block_table.
        If that block is shared (ref count > 1): allocate a new block, drop one reference to the old,
        put the new id in block_table[-1] (in place) and return (new, old): the engine then copies
        old's K/V into new (copy-on-write). Otherwise return (block_table[-1], None)."""

    def num_free(self) -> int: ...

    def can_allocate(self, n: int) -> bool:
        """True if n allocate() calls would succeed now."""


@runtime_checkable
class SchedulerPolicy(Protocol):
    """Decides each step which prefills run and how many tokens each computes.

    Called by: scheduler.Scheduler.schedule(), once a step (again after a preemption if it picked
    nothing), after every running decode got its one token. Lessons 03 (continuous batching) and
    07 (chunked prefill) ask for one.
    """

    def schedule(self, candidates: list[Sequence], budget: Budget) -> list[tuple[Sequence, int]]:
        """Return (sequence, num_tokens) pairs, in batch order.

        candidates: oldest first; prompts already partly prefilled (seq.is_waiting False), then the
        waiting queue (seq.is_waiting True; preempted sequences are at its front). Useful fields:
        seq.num_uncomputed_tokens (what it still needs), seq.num_prompt_tokens,
        seq.metrics.arrival_time, seq.num_slots (batch slots a new one takes, n for parallel sampling).
        budget: budget.tokens (token budget left after decodes), budget.slots (new sequences that may
        still join the batch), budget.free_blocks, budget.chunked_prefill; budget.fits(seq, n) checks
        all of them, budget.take(seq, n) spends them, budget.try_take(seq, n) does both.
        Rules (the scheduler raises RuntimeError naming the broken one): each pair's seq is a
        candidate, at most once; 1 <= num_tokens <= seq.num_uncomputed_tokens; num_tokens is all of
        it when chunked prefill is off; totals stay within the budget. Returning nothing while
        nothing else runs and requests wait is an error too (the engine would never progress), and
        so is leaving out a started prompt whose next chunk fits while nothing else runs (it would
        starve: preempted and prefilled again forever).
        """


@runtime_checkable
class AttentionBackend(Protocol):
    """Attention over the paged KV cache for one layer. Called by: attention.run_attention() in every
    layer's forward: write_kv first, then decode on the first meta.num_decode_tokens rows and prefill
    on the rest. All shapes are per layer:
      k_cache, v_cache  [num_blocks, block_size, num_kv_heads, head_dim]
      slot_mapping      [T] int64, slot = block_id * block_size + offset in block
      block_tables      [num_seqs, max_blocks] int32, padded with any valid block id
    Query heads h share KV head h // (num_heads // num_kv_heads) (grouped-query attention).
    """

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """k, v [T, num_kv_heads, head_dim]: store row t at slot slot_mapping[t] of both caches."""

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
               context_lens: torch.Tensor, scale: float) -> torch.Tensor:
        """q [num_seqs, num_heads, head_dim], one token per sequence; context_lens [num_seqs] counts the
        cached tokens including this one (already written). Returns [num_seqs, num_heads, head_dim]."""

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Ragged chunks: q [T, num_heads, head_dim], k/v [T, num_kv_heads, head_dim] (also in the cache).
        Sequence i owns rows meta.prefill_cu_seqlens[i]:[i+1] at positions context_len - n .. context_len - 1,
        context_len = meta.prefill_context_lens[i]; causal attention over all its cached tokens
        (meta.prefill_block_tables[i]). Returns [T, num_heads, head_dim]."""
