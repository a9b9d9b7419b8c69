"""Automatic prefix caching: full KV blocks outlive their request and are found again by content.

The KV of a token depends only on the tokens up to it, so a block that holds KV for tokens t0..t(k-1) is
valid in every request whose first k tokens are t0..t(k-1). Three pieces:

  HashPrefixCache     the engine's prefix cache: full blocks keyed by a hash chain, sha256(parent's
                      digest + the block's token ids), as vLLM keys them; free cached blocks are
                      evicted least recently used first, leaves (the end of a cached prefix) only.
  CachingBlockManager the BlockManager the engine uses with enable_prefix_caching=True. It drives ANY
                      object with the interfaces.PrefixCache methods (the hash cache above, or lesson
                      18's RadixTree) and keeps the pool's reference counts right: the cache holds one
                      reference on every block it owns; a request holding a cached block holds another.
  LongestPrefixFirst  a SchedulerPolicy that admits the waiting request with the longest cached prefix
                      first (SGLang's "lpm").

When it acts (Scheduler.schedule): at the start of a step every running sequence publishes the full
blocks it has computed (insert); a waiting request is looked up (match_prefix) before the policy
decides, so the policy sees only what is left to compute; admitted ones lock their prefix; when the
pool is short, unlocked blocks are evicted; a finished, aborted or preempted sequence publishes its full
blocks and unlocks. A cached block is never written: hits end on a block boundary and at least the
last token is always recomputed (its logits give the next token); a shared block that would be
written is copied first (BlockManager.reserve's copy-on-write).
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
import struct
from collections import Counter
from dataclasses import dataclass

from .block_manager import BlockManager, ConsistencyError
from .scheduler import FCFSPolicy

ROOT_DIGEST = bytes(32)  # the "parent" of a sequence's first block


def hash_chain(token_ids, block_size: int):
    """Yield the digest of each FULL block of token_ids, in order, computed lazily (a lookup stops at its
    first miss): digest_i = sha256(digest_(i-1) + block i's ids as 8-byte little-endian ints), digest_-1 =
    32 zero bytes. The parent's digest inside makes equal digests mean equal whole prefixes."""
    pack, parent = struct.Struct(f"<{block_size}q").pack, ROOT_DIGEST
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hashlib.sha256(parent + pack(*token_ids[start:start + block_size])).digest()
        yield parent


class _Page:
    """One cached full block. parent: the page before it (the root sentinel for a first block)."""
    __slots__ = ("digest", "block", "parent", "num_children", "lock_ref", "last_access", "alive")

    def __init__(self, digest: bytes, block: int, parent: _Page | None, last_access: int = 0):
        self.digest, self.block, self.parent = digest, block, parent
        self.num_children, self.lock_ref, self.last_access, self.alive = 0, 0, last_access, True


class HashPrefixCache:
    """The engine's interfaces.PrefixCache: a dict {block digest: page}, pages linked to their parent.

    Same observable behaviour as a radix tree over pages (lesson 18's RadixTree), so either can serve
    the engine and both give the same hits: a clock ticks once per match_prefix and per insert, each
    stamping every page it walks; lock(node) pins the pages from the first block to `node`; evict takes
    unlocked leaf pages (no cached page after them), the least recently stamped first, one at a time,
    so a prefix is always evicted from its end and what stays cached is still reachable. A node handle
    is the last page of a match (the root sentinel for none).
    """

    def __init__(self, page_size: int):
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
        self.page_size = page_size
        self.root = _Page(ROOT_DIGEST, -1, None)
        self._pages: dict[bytes, _Page] = {}
        self._clock = 0
        self._num_locked = 0  # pages with lock_ref > 0
        self._heap: list = []  # (last_access, tiebreak, page) for pages that were unlocked leaves when pushed
        self._tiebreak = itertools.count()

    def match_prefix(self, tokens) -> tuple[list[int], _Page]:
        """(block ids of the longest cached prefix of `tokens` in whole pages, the node where it ends)."""
        self._clock += 1
        node, blocks = self.root, []
        for digest in hash_chain(tokens, self.page_size):
            page = self._pages.get(digest)
            if page is None:
                break
            page.last_access = self._clock
            blocks.append(page.block)
            node = page
        self._push_if_evictable(node)
        return blocks, node

    def insert(self, tokens, block_ids) -> int:
        """Cache the full pages of `tokens`, page i's KV in block_ids[i] (pages already cached keep their
        block). Returns how many leading tokens were cached before the call (a multiple of page_size)."""
        n = len(tokens) // self.page_size
        if len(block_ids) < n:
            raise ValueError(f"{len(tokens)} tokens fill {n} pages but only {len(block_ids)} block ids were given")
        self._clock += 1
        node, cached = self.root, None
        for i, digest in enumerate(hash_chain(tokens, self.page_size)):
            page = self._pages.get(digest)
            if page is None:  # cached prefixes are closed under prefixes: every later page is new too
                cached = i if cached is None else cached
                page = self._pages[digest] = _Page(digest, int(block_ids[i]), node)
                node.num_children += 1
            page.last_access = self._clock
            node = page
        self._push_if_evictable(node)
        return (n if cached is None else cached) * self.page_size

    def lock(self, node: _Page) -> None:
        while node is not self.root:
            self._num_locked += node.lock_ref == 0
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: _Page) -> None:
        if node is not self.root and node.lock_ref <= 0:
            raise RuntimeError("unlock of a node that is not locked")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._num_locked -= 1
                self._push_if_evictable(node)
            node = node.parent

    def evict(self, num_tokens: int) -> list[int]:
        """Free ceil(num_tokens / page_size) unlocked leaf pages (all there are, if fewer), least recently
        stamped first; returns their block ids."""
        need, freed = -(-num_tokens // self.page_size), []
        while len(freed) < need and self._heap:
            stamp, _, page = heapq.heappop(self._heap)
            if not self._evictable(page) or page.last_access != stamp:
                continue  # stale: evicted, locked, grown a child or touched since it was pushed
            del self._pages[page.digest]
            page.alive = False
            freed.append(page.block)
            page.parent.num_children -= 1
            self._push_if_evictable(page.parent)
        return freed

    def evictable_size(self) -> int:
        return (len(self._pages) - self._num_locked) * self.page_size

    def total_size(self) -> int:
        return len(self._pages) * self.page_size

    def _evictable(self, page: _Page) -> bool:
        return page.alive and page.lock_ref == 0 and page.num_children == 0 and page is not self.root

    def _push_if_evictable(self, page: _Page) -> None:
        """Every time a page becomes an evictable leaf or is stamped as one, it goes on the heap; evict skips the
        entries that went stale since. Rebuilt when stale entries dominate, so it stays O(pages)."""
        if self._evictable(page):
            heapq.heappush(self._heap, (page.last_access, next(self._tiebreak), page))
        if len(self._heap) > 4 * len(self._pages) + 64:
            self._heap = [(p.last_access, next(self._tiebreak), p) for p in self._pages.values() if self._evictable(p)]
            heapq.heapify(self._heap)


@dataclass
class PrefixCacheStats:
    """Engine totals, in tokens as vLLM counts them. A lookup happens when a request is admitted: queries
    counts its tokens then, hits the ones found cached (computed without a forward). Re-admissions after a
    preemption are counted apart (preempted_*): their hits are mostly the request's own blocks."""
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        """hits / queries over first admissions (0 before any)."""
        return self.hits / self.queries if self.queries else 0.0


class CachingBlockManager(BlockManager):
    """A BlockManager whose full blocks outlive their sequence in a prefix cache (interfaces.PrefixCache).

    Ownership: the cache holds one reference on each block it owns (it took the block at insert and
    gives it back only through evict); every sequence whose table holds a block holds one more. A
    sequence holding cached blocks keeps its path locked (the node of its last lookup or publish), so
    evict never returns a block in use; that is checked, not trusted. Free blocks for admission =
    the pool's free blocks + the cache's unlocked ones (evicted when an allocation needs them).

    Lookups are tentative until the scheduler commits them: lookup() puts a waiting sequence's cached
    blocks in its table without taking references, so the scheduler policy sees what is left to compute
    and blocks_needed() counts the cached blocks it would pull out of the evictable pool; commit() takes
    the references and the lock; forget() undoes a lookup that was not admitted.
    """

    def __init__(self, allocator, block_size: int, num_blocks: int, cache):
        super().__init__(allocator, block_size, num_blocks)
        self.cache = cache
        self.stats = PrefixCacheStats()
        self.owned: set[int] = set()  # blocks the cache holds a reference on
        self._node: dict = {}         # sequence -> the node it holds locked
        self._published: dict = {}    # sequence -> full blocks of its table the cache has seen
        self._tentative: dict = {}    # sequence -> node of an uncommitted lookup
        self._evictable_pages: int | None = 0  # cached evictable_size() // block_size; None: ask again

    # ---- admission ----------------------------------------------------------------------------------
    def lookup(self, seqs) -> None:
        for seq in seqs:
            if seq.block_table or seq.num_computed_tokens:
                continue
            # At most num_tokens - 1 tokens: the last one is computed for its logits.
            blocks, node = self.cache.match_prefix(seq.token_ids[:-1])
            seq.block_table = [int(b) for b in blocks]
            seq.num_computed_tokens = len(blocks) * self.block_size
            self._tentative[seq] = node

    def forget(self, seqs) -> None:
        for seq in seqs:
            if self._tentative.pop(seq, None) is not None:
                seq.block_table, seq.num_computed_tokens = [], 0

    def commit(self, seqs) -> int:
        """Admit looked-up sequences: take their cached blocks and lock their prefix. Returns the tokens hit."""
        total = 0
        for seq in seqs:
            node = self._tentative.pop(seq)
            self._lock(node)
            for b in seq.block_table:
                self.allocator.incref(b)
            self._node[seq], self._published[seq] = node, len(seq.block_table)
            hits, s = seq.num_computed_tokens, self.stats
            if seq.metrics.num_preemptions:
                s.preempted_requests, s.preempted_queries, s.preempted_hits = (
                    s.preempted_requests + 1, s.preempted_queries + seq.num_tokens, s.preempted_hits + hits)
            else:
                s.requests, s.queries, s.hits = s.requests + 1, s.queries + seq.num_tokens, s.hits + hits
                seq.metrics.num_cached_tokens = hits
            total += hits
        return total

    def publish(self, seqs) -> None:
        """Hand each sequence's newly computed full blocks to the cache and move its lock to their end."""
        for seq in seqs:
            n = seq.num_computed_tokens // self.block_size
            if n <= self._published.get(seq, 0):
                continue
            tokens = seq.token_ids[:n * self.block_size]
            had = self.cache.insert(tokens, seq.block_table[:n]) // self.block_size
            for b in seq.block_table[had:n]:  # the pages the cache did not have now live in our blocks
                if b in self.owned:
                    raise ConsistencyError(f"prefix cache: block {b} is already cached, yet insert() said only "
                                           f"{had} of {n} pages were: insert must return the already-cached count")
                self.allocator.incref(b)
                self.owned.add(b)
            _, node = self.cache.match_prefix(tokens)
            self._lock(node)
            if seq in self._node:
                self._unlock(self._node[seq])  # after the new lock: the shared pages stay pinned throughout
            self._node[seq], self._published[seq] = node, n

    # ---- the BlockManager interface ------------------------------------------------------------------
    def blocks_needed(self, seq, num_tokens: int) -> int:
        need = super().blocks_needed(seq, num_tokens)
        if seq in self._tentative:  # cached blocks only the cache holds would leave the evictable pool
            need += sum(self.allocator.ref_count(b) == 1 for b in seq.block_table)
        return need

    def can_reserve(self, seq, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free()

    def reserve(self, seq, num_tokens: int) -> list[tuple[int, int]]:
        short = super().blocks_needed(seq, num_tokens) - self.allocator.num_free()
        if short > 0:
            self._evict(short)
        return super().reserve(seq, num_tokens)

    def fork(self, parent, child) -> None:
        # Publish first: then every full block the two share is cached under the node both lock.
        self.publish([parent])
        super().fork(parent, child)
        if parent in self._node:
            self._lock(self._node[parent])
            self._node[child], self._published[child] = self._node[parent], self._published[parent]

    def free(self, seq) -> None:
        if seq in self._tentative:
            self.forget([seq])
            return
        self.publish([seq])
        super().free(seq)
        node = self._node.pop(seq, None)
        self._published.pop(seq, None)
        if node is not None:
            self._unlock(node)

    def num_free(self) -> int:
        if self._evictable_pages is None:
            self._evictable_pages = self.cache.evictable_size() // self.block_size
        return self.allocator.num_free() + self._evictable_pages

    def check_consistency(self, live_seqs) -> None:
        """BlockManager's check, with the cache's reference counted: ref_count(b) = tables holding b + (1 if
        the cache owns b); every block is free, held, or cached; the cache holds exactly the blocks it took."""
        held = Counter(b for s in live_seqs for b in s.block_table)
        for s in live_seqs:
            if len(set(s.block_table)) != len(s.block_table):
                raise ConsistencyError(f"seq {s.seq_id} holds a block twice: {s.block_table}")
        for b in range(self.num_blocks):
            want = held[b] + (b in self.owned)
            if self.allocator.ref_count(b) != want:
                raise ConsistencyError(f"block {b}: ref count {self.allocator.ref_count(b)}, held by {held[b]} tables"
                                       f"{' and the prefix cache' if b in self.owned else ''}")
        used = len(set(held) | self.owned)
        if self.allocator.num_free() != self.num_blocks - used:
            raise ConsistencyError(f"{self.allocator.num_free()} free blocks, expected {self.num_blocks - used}")
        if self.cache.total_size() != len(self.owned) * self.block_size:
            raise ConsistencyError(f"prefix cache total_size() is {self.cache.total_size()} tokens but it was given "
                                   f"{len(self.owned)} blocks of {self.block_size}")
        if self.cache.evictable_size() // self.block_size > len(self.owned - set(held)):
            raise ConsistencyError("prefix cache: more pages are evictable than there are cached blocks no "
                                   "sequence holds: a running request's pages are unlocked")

    # ---- internals --------------------------------------------------------------------------------------
    def _lock(self, node) -> None:
        self.cache.lock(node)
        self._evictable_pages = None

    def _unlock(self, node) -> None:
        self.cache.unlock(node)
        self._evictable_pages = None

    def _evict(self, num_blocks: int) -> None:
        freed = [int(b) for b in self.cache.evict(num_blocks * self.block_size)]
        self._evictable_pages = None
        for b in freed:
            if b not in self.owned:
                raise ConsistencyError(f"prefix cache evict() returned block {b}, which it was never given")
            self.owned.discard(b)
            self.allocator.free(b)
            if self.allocator.ref_count(b):
                raise ConsistencyError(f"prefix cache evicted block {b} while a running sequence still uses it: "
                                       "a locked page (or one before it) was freed; lock/unlock or evict is wrong")
        self.stats.evicted_blocks += len(freed)
        if len(freed) < num_blocks:
            raise ConsistencyError(f"prefix cache evict() freed {len(freed)} of the {num_blocks} blocks asked for "
                                   "although evictable_size() promised them")


def make_block_manager(allocator, block_size: int, num_blocks: int, enable_prefix_caching: bool = False,
                       prefix_cache=None) -> BlockManager:
    """The engine's BlockManager: plain, or caching with `prefix_cache` (a class or any callable
    page_size -> an interfaces.PrefixCache; default HashPrefixCache)."""
    if not enable_prefix_caching:
        if prefix_cache is not None:
            raise ValueError("prefix_cache was given but enable_prefix_caching is False: pass "
                             "enable_prefix_caching=True to use it")
        return BlockManager(allocator, block_size, num_blocks)
    cache = (prefix_cache or HashPrefixCache)(block_size)
    missing = [m for m in ("match_prefix", "insert", "lock", "unlock", "evict", "evictable_size", "total_size")
               if not callable(getattr(cache, m, None))]
    if missing:
        raise TypeError(f"prefix_cache(block_size) returned {type(cache).__name__}, which lacks {', '.join(missing)} "
                        "(see interfaces.PrefixCache)")
    return CachingBlockManager(allocator, block_size, num_blocks, cache)


class LongestPrefixFirst(FCFSPolicy):
    """SGLang's "lpm" admission order as a SchedulerPolicy: prompts already started keep going first; then
    waiting requests with the longest cached prefix (their num_computed_tokens when the policy runs, which
    the prefix cache's lookup set), ties in arrival order, filled as FCFS fills. Requests sharing a cached
    prefix then run while it is cached. Without prefix caching every hit is 0 and this is FCFS. Like
    SGLang's, it can starve a request no cached prefix favours while others keep arriving."""

    def schedule(self, candidates, budget):
        started = [s for s in candidates if not s.is_waiting]
        waiting = sorted((s for s in candidates if s.is_waiting), key=lambda s: -s.num_computed_tokens)
        return super().schedule(started + waiting, budget)
