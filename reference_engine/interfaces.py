"""The three hooks lessons plug learner code into. Each is a typing.Protocol: implement the methods,
no subclassing needed, and pass the object (or class) to LLM(...) / LLMEngine(...).

    LLM(path, block_allocator=MyAllocator)       # a class or any callable num_blocks -> allocator
    LLM(path, scheduler_policy=MyPolicy())       # an instance, or a class to instantiate
    LLM(path, attention_backend=MyBackend())     # or "torch" / "triton"
    LLM(path, enable_prefix_caching=True, prefix_cache=MyTree)  # a class or callable block_size -> cache
    LLM(path, speculative_config={..., "verifier": my_verifier})  # any object (or module) with both methods

The engine's own implementations: block_manager.BlockAllocator, scheduler.FCFSPolicy,
attention.TorchBackend / attention.TritonBackend, prefix_cache.HashPrefixCache,
spec_decode.RejectionVerifier.
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
    With prefix caching the cache holds one more reference on each block it owns, and those blocks
    count as held (prefix_cache.CachingBlockManager.check_consistency).
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


@runtime_checkable
class PrefixCache(Protocol):
    """Cached KV blocks found by token prefix: lesson 18's RadixTree, or the engine's HashPrefixCache.

    Called by: prefix_cache.CachingBlockManager only, when the engine runs with enable_prefix_caching=True.
    Units: tokens, matched in whole pages of page_size tokens (a page is one KV block of block_size); the
    values are the engine's KV block ids, one per page. The cache OWNS the blocks it was given by insert()
    and hands them back only through evict(); a node handle is opaque to the engine (it only passes it
    back to lock/unlock), and must stay valid while locked.

    Semantics, page by page (both implementations behave the same, so they give the same hits):
      * the cached pages form a set of page-aligned token sequences closed under prefixes;
      * a clock ticks once per match_prefix and once per insert; each stamps every page it walks;
      * a page is locked while some lock(node) whose path covers it is not undone by unlock(node);
      * evict frees unlocked leaf pages (no cached page after them), least recently stamped first.

    How the engine calls it:
      admission  blocks, node = match_prefix(tokens[:-1]); lock(node) if admitted: the sequence's table
                 starts with `blocks`, their tokens count as computed (the last token is always computed)
      as blocks fill (each step, before scheduling) and at finish / abort / preemption:
                 had = insert(tokens_with_kv, block_table); the blocks past `had` tokens now belong to
                 the cache; _, node = match_prefix(those tokens); lock(node); unlock(previous node)
      pool short evict(n * block_size) -> block ids, returned to the pool; evictable_size() (tokens) counts
                 as free space when the scheduler budgets blocks
    """

    def __init__(self, page_size: int): ...

    def match_prefix(self, tokens: list[int]) -> tuple[list[int], object]:
        """(block ids of the longest cached prefix of tokens, in whole pages; the node where it ends)."""

    def insert(self, tokens: list[int], block_ids: list[int]) -> int:
        """Cache the full pages of tokens, page i in block_ids[i] unless already cached. Returns the
        number of leading tokens that were cached before the call (a multiple of page_size)."""

    def lock(self, node) -> None:
        """Pin every page from the first to node: none of them may be evicted until unlock(node)."""

    def unlock(self, node) -> None:
        """Undo one lock(node); unlocking a node that is not locked raises RuntimeError."""

    def evict(self, num_tokens: int) -> list[int]:
        """Free ceil(num_tokens / page_size) unlocked leaf pages, least recently used first (all there
        are, if fewer); returns their block ids."""

    def evictable_size(self) -> int:
        """Tokens in unlocked pages (what evict could free now)."""

    def total_size(self) -> int:
        """Tokens cached, locked or not."""


@runtime_checkable
class SpeculativeVerifier(Protocol):
    """Decides which draft tokens a sequence keeps (lesson 14's verify / verify_greedy).

    Called by: spec_decode.SpecDecoder.verify(), once per sequence per step that verified drafts, after
    the target's forward scored its k + 1 positions. Row i (i < k) of the target's tensors is the target's
    prediction for draft i given everything before it; row k predicts the token after the last draft.
    Return the tokens to emit, a list of 1 to k + 1 Python ints: the kept drafts in order (a prefix of
    draft_tokens), then exactly one token of the target's own. The engine rejects anything else (its cache
    holds the drafts' K/V at the kept positions) and rolls back every position after the kept drafts.
    Do not modify the arguments.
    """

    def verify_greedy(self, target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> list[int]:
        """Temperature 0. target_logits [k + 1, V] float32 raw logits; draft_tokens [k] int64. Plain greedy
        decoding's next tokens: keep drafts while each equals its row's argmax, then that row's argmax."""

    def verify(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
               generator: torch.Generator | None) -> list[int]:
        """Sampling. target_probs [k + 1, V] float64: the distributions the target samples from (temperature,
        top-k, top-p applied; spec_decode.sampling_distribution); draft_probs [k, V] float64: the ones the
        drafts were drawn from (one-hot rows for the ngram proposer); generator: the request's own
        (None without SamplingParams.seed), the only randomness to use. The engine's rule (spec_decode.verify):
        per draft one torch.rand, keep with probability min(1, p/q); on the first rejection one
        torch.multinomial from norm(max(0, p - q)); all kept: one torch.multinomial from p_k. A verifier
        making the same draws in the same order emits the same tokens as the engine's own."""
