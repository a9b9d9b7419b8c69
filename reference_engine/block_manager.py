"""Paged KV-cache bookkeeping: a ref-counted block pool, and per-sequence block tables on top of it.

BlockAllocator knows nothing of tokens: it hands out block ids and counts references (a block shared
by forked sequences has one reference per table holding it). BlockManager knows the block size and
turns "sequence s will hold n more tokens" into allocations and copy-on-write.
"""
from __future__ import annotations

from collections import Counter, deque


class ConsistencyError(RuntimeError):
    """The block pool disagrees with the block tables: a leaked, double-held or miscounted block."""


class BlockAllocator:
    """The engine's implementation of interfaces.BlockAllocator: a FIFO free list and a ref-count array."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._free = deque(range(num_blocks))

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("out of KV-cache blocks: check can_allocate() first")
        block = self._free.popleft()
        self._ref[block] = 1
        return block

    def free(self, block_id: int) -> None:
        """Drop one reference; the block returns to the pool when none is left."""
        if self._ref[block_id] <= 0:
            raise RuntimeError(f"block {block_id} freed more times than it was referenced")
        self._ref[block_id] -= 1
        if self._ref[block_id] == 0:
            self._free.append(block_id)

    def incref(self, block_id: int) -> None:
        if self._ref[block_id] <= 0:
            raise RuntimeError(f"incref of free block {block_id}")
        self._ref[block_id] += 1

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def fork(self, block_table: list[int]) -> list[int]:
        for b in block_table:
            self.incref(b)
        return list(block_table)

    def append_slot(self, block_table: list[int]) -> tuple[int, int | None]:
        """Make the last block of block_table writable: if it is shared, replace it (in place) by a
        fresh block and return (new, old) so the caller copies old's K/V into new; else (last, None)."""
        last = block_table[-1]
        if self._ref[last] == 1:
            return last, None
        new = self.allocate()
        self.free(last)
        block_table[-1] = new
        return new, last

    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)


class BlockManager:
    """Per-sequence block tables (seq.block_table) over any BlockAllocator.

    Invariant between steps: seq.block_table covers exactly ceil(seq.num_computed_tokens / block_size)
    blocks. reserve() extends it to cover the tokens scheduled this step before the forward runs.
    """

    def __init__(self, allocator, block_size: int, num_blocks: int):
        self.allocator, self.block_size, self.num_blocks = allocator, block_size, num_blocks

    def _writes_shared_block(self, seq) -> bool:
        return seq.num_computed_tokens % self.block_size != 0 and self.allocator.ref_count(seq.block_table[-1]) > 1

    def blocks_needed(self, seq, num_tokens: int) -> int:
        """New blocks reserve(seq, num_tokens) would take: whole new blocks plus one copy of a shared last block."""
        total = -(-(seq.num_computed_tokens + num_tokens) // self.block_size)
        return total - len(seq.block_table) + self._writes_shared_block(seq)

    def can_reserve(self, seq, num_tokens: int) -> bool:
        return self.allocator.can_allocate(self.blocks_needed(seq, num_tokens))

    def reserve(self, seq, num_tokens: int) -> list[tuple[int, int]]:
        """Make room for num_tokens more tokens; returns (src, dst) block copies the cache must do first."""
        copies = []
        if seq.num_computed_tokens % self.block_size:  # the first new token lands in the last, partly filled block
            new, old = self.allocator.append_slot(seq.block_table)
            if old is not None:
                copies.append((old, new))
        total = -(-(seq.num_computed_tokens + num_tokens) // self.block_size)
        while len(seq.block_table) < total:
            seq.block_table.append(self.allocator.allocate())
        return copies

    def fork(self, parent, child) -> None:
        child.block_table = self.allocator.fork(parent.block_table)

    def free(self, seq) -> None:
        for b in reversed(seq.block_table):  # reversed: a later prefix cache would evict tails first
            self.allocator.free(b)
        seq.block_table = []

    def trim(self, seq) -> None:
        """Speculative decoding's rollback: after num_computed_tokens went back past rejected draft tokens,
        free the blocks beyond ceil(num_computed_tokens / block_size). Their slots held only rejected
        tokens; a kept partly filled block is simply overwritten from its first free slot on."""
        keep = -(-seq.num_computed_tokens // self.block_size)
        for b in reversed(seq.block_table[keep:]):
            self.allocator.free(b)
        del seq.block_table[keep:]

    def num_free(self) -> int:
        return self.allocator.num_free()

    # Prefix-caching hooks the scheduler calls; without a prefix cache they do nothing (prefix_cache.py's
    # CachingBlockManager implements them).
    def publish(self, seqs) -> None:
        """Offer each running sequence's computed full blocks to the prefix cache."""

    def lookup(self, seqs) -> None:
        """Tentatively give each waiting sequence its cached prefix (block_table, num_computed_tokens)."""

    def forget(self, seqs) -> None:
        """Undo lookup() for sequences the scheduler did not admit."""

    def commit(self, seqs) -> int:
        """Make lookup() final for admitted sequences; returns the tokens they found cached."""
        return 0

    def check_consistency(self, live_seqs) -> None:
        """Raise ConsistencyError unless ref counts equal table membership and free + used = all blocks.

        A real exception, not `assert`: python -O strips asserts, and a leak must never pass silently."""
        held = Counter(b for s in live_seqs for b in s.block_table)
        for s in live_seqs:
            if len(set(s.block_table)) != len(s.block_table):
                raise ConsistencyError(f"seq {s.seq_id} holds a block twice: {s.block_table}")
        for b in range(self.num_blocks):
            if self.allocator.ref_count(b) != held[b]:
                raise ConsistencyError(f"block {b}: ref count {self.allocator.ref_count(b)}, held by {held[b]} tables")
        if self.allocator.num_free() != self.num_blocks - len(held):
            raise ConsistencyError(f"{self.allocator.num_free()} free blocks, expected {self.num_blocks - len(held)}")
