"""Checks of lesson 18: the block hash chain, the radix tree (op by op against a brute-force trie), and
the longest-prefix-match admission order.

The learner's tree lives in the learner's process. The driver below sends each operation there and runs
the same one here on `BruteTrie`, the spec written the slow way: a dict from every cached page-aligned
prefix (a tuple of token ids) to its page's block id, stamp and lock count. Node layout is the
learner's business; what is compared is what a caller can observe: the blocks match_prefix returns,
insert's already-cached count, evict's freed blocks, total_size and evictable_size. Scripted visible
sequences name the usual mistakes; hidden cases are random operation sequences drawn from t.rng on a
three-token alphabet (so that sequences share prefixes and diverge inside pages and nodes).
"""
from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass

from autograder.core import CaseFailed, LearnerRaised, check

# ---------------------------------------------------------------- the spec, the slow way


@dataclass
class _Page:
    block: int
    stamp: int   # the clock at the last match_prefix / insert that walked through the page
    locks: int
    born: int    # the clock when the page was inserted (for naming an insertion-time LRU)
    ins: int     # the clock at the last INSERT through it (for naming "a match is not an access")


class BruteTrie:
    """RadixTree's semantics page by page: `pages` maps every cached prefix, as a tuple of whole pages of
    token ids, to its last page's state. A node handle is the prefix tuple where a match ended."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.pages: dict[tuple, _Page] = {}
        self.clock = 0

    def _prefixes(self, tokens) -> list[tuple]:
        P = self.page_size
        return [tuple(tokens[:k * P]) for k in range(1, len(tokens) // P + 1)]

    def match_prefix(self, tokens):
        self.clock += 1
        blocks, end = [], ()
        for key in self._prefixes(tokens):
            if key not in self.pages:
                break
            self.pages[key].stamp = self.clock
            blocks.append(self.pages[key].block)
            end = key
        return blocks, end

    def insert(self, tokens, block_ids) -> int:
        self.clock += 1
        cached = 0
        for i, key in enumerate(self._prefixes(tokens)):
            page = self.pages.get(key)
            if page is None:  # the set is closed under prefixes: every longer key is missing too
                self.pages[key] = _Page(block_ids[i], self.clock, 0, self.clock, self.clock)
            else:
                page.stamp = page.ins = self.clock
                cached += self.page_size
        return cached

    def lock(self, end: tuple):
        for key in self._prefixes(end):
            self.pages[key].locks += 1

    def unlock(self, end: tuple):
        if end and self.pages[end].locks <= 0:
            raise RuntimeError("unlock of a node that is not locked")
        for key in self._prefixes(end):
            self.pages[key].locks -= 1

    def is_leaf(self, key: tuple) -> bool:
        return not any(len(k) == len(key) + self.page_size and k[:len(key)] == key for k in self.pages)

    def evictable(self) -> list[tuple]:
        return [k for k, p in self.pages.items() if p.locks == 0 and self.is_leaf(k)]

    def evict(self, num_tokens: int, by: str = "stamp") -> list[int]:
        """Free ceil(num_tokens / page_size) unlocked leaf pages, the oldest `by` stamp first."""
        need, freed = max(0, -(-num_tokens // self.page_size)), []
        while len(freed) < need:
            leaves = self.evictable()
            if not leaves:
                break
            key = min(leaves, key=lambda k: (getattr(self.pages[k], by), -len(k), k))
            freed.append(self.pages.pop(key).block)
        return freed

    def total_size(self) -> int:
        return self.page_size * len(self.pages)

    def evictable_size(self) -> int:
        return self.page_size * sum(p.locks == 0 for p in self.pages.values())

    def copy(self) -> BruteTrie:
        c = BruteTrie(self.page_size)
        c.clock = self.clock
        c.pages = {k: _Page(**vars(p)) for k, p in self.pages.items()}
        return c

    def token_level_blocks(self, tokens) -> list[int]:
        """What a match that also takes PARTLY matching pages returns: the blocks covering the longest
        common token prefix of `tokens` with a cached sequence (the partly matching page included)."""
        best, best_key = 0, ()
        for key in self.pages:
            n = 0
            while n < min(len(key), len(tokens)) and key[n] == tokens[n]:
                n += 1
            if n > best or (n == best and len(key) < len(best_key)):
                best, best_key = n, key
        pages = -(-best // self.page_size)
        return [self.pages[best_key[:j * self.page_size]].block for j in range(1, pages + 1)]


# ---------------------------------------------------------------- 1.1 the hash chain


def _digest(parent: bytes, block, fmt: str = "q") -> bytes:
    return hashlib.sha256(parent + struct.pack(f"<{len(block)}{fmt}", *block)).digest()


def hash_variant(tokens, B, parent_mode: str = "chain", partial: bool = False, fmt: str = "q",
                 root: bytes = bytes(32)) -> list[str]:
    """The hash chain with one thing changed (parent_mode "chain": the spec; "none": every block hashed
    alone; "hex": the parent's hex text instead of its bytes)."""
    out, parent = [], root
    stop = len(tokens) if partial else len(tokens) - len(tokens) % B
    for s in range(0, stop, B):
        d = _digest(root if parent_mode == "none" else parent, tokens[s:s + B], fmt)
        out.append(d.hex())
        parent = d.hex().encode() if parent_mode == "hex" else d
    return out


HASH_MISTAKES = {
    "ignores the parent: each block is hashed alone, so two blocks with the same tokens at different "
    "prefixes get the same hash (and a lookup would reuse KV computed after other tokens)": dict(parent_mode="none"),
    "hashes the partial last block: only FULL blocks get a hash (a partly filled block still changes)":
        dict(partial=True),
    "chains the parent's hex text; chain its 32 raw digest bytes (bytes.fromhex, or keep .digest())":
        dict(parent_mode="hex"),
    "packs token ids as 4-byte ints; the spec packs each as an 8-byte little-endian signed int (\"<q\")":
        dict(fmt="i"),
    "starts the chain from no parent bytes; the first block's parent is 32 zero bytes": dict(root=b""),
}

HASH_CASES = [
    ("visible: the same block after two different prefixes", ([5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8], 4)),
    ("visible: a partial last block", ([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], 4)),
    ("visible: fewer tokens than one block", ([11, 12, 13], 16)),
    ("visible: block_size 1", ([9, 9, 9], 1)),
]


def random_hash_case(rng):
    B = rng.choice([2, 3, 4, 16])
    base = [rng.randrange(0, 50_000) for _ in range(B)]
    tokens = []
    for _ in range(rng.randint(1, 5)):  # repeated blocks: equal tokens at different prefixes
        tokens += base if rng.random() < 0.5 else [rng.randrange(0, 50_000) for _ in range(B)]
    return tokens + [rng.randrange(0, 50_000) for _ in range(rng.randint(0, B - 1))], B


@check(points=2, section="1.1")
def block_hashes(t):
    """The hash chain of full blocks: sha256(parent digest + the block's ids), a partial block gets none."""
    for label, (tokens, B) in t.cases(visible=HASH_CASES, hidden=random_hash_case, n=3):
        with t.case(f"{label}: block_size {B}, token_ids {tokens}"):
            got, expected = t.both("block_hashes", tokens, B)
            t.expect(got, expected, "block hashes",
                     mistakes={name: hash_variant(tokens, B, **kw) for name, kw in HASH_MISTAKES.items()},
                     hint="Follow the docstring's formula exactly: sha256(parent digest + struct.pack('<nq', *ids)).")


# ---------------------------------------------------------------- 2. the tree, op by op

NOT_LEAVES = ("evicts an inner node before its leaves: a page whose successor is still cached is not a leaf "
              "(free an unlocked leaf's pages from its END; its parent becomes a leaf only when it is empty)")
LOCKED = ("evicts a locked node: pages on a path a running request locked (lock(node) covers the whole path "
          "from the root to node) must never be freed until unlock")
LRU_MISTAKES = {"born": "orders eviction by insertion time, not by last access: every match_prefix and insert must "
                        "refresh the stamp of each page it walks through",
                "ins": "does not count a match as an access: match_prefix must refresh the stamps of the pages "
                       "it matched (a cache hit is a use)"}
PARTIAL = ("matches partial pages: a page matches only if all its page_size tokens do, and a partial last "
           "page of the query never matches")
TOO_LONG = ("Looks like your code does not split a node where the query diverges: it returns blocks past the "
            "divergence; split the node there and return only the pages that match.")


class _Drive:
    """Runs the same operations on the learner's RadixTree and on BruteTrie, comparing what a caller sees.

    full=False (check 2.1): insert, match_prefix and total_size only. full=True (2.2): also lock, unlock,
    evict and evictable_size, and requests that match + lock at admission and insert + unlock at the end.
    """

    def __init__(self, t, page_size: int, full: bool):
        self.t, self.P, self.full = t, page_size, full
        self.log: list[str] = []
        self._methods: dict = {}
        self.next_block = 100
        self.mine = self._call(t.fn("RadixTree"), page_size, what="RadixTree")
        self.ref = BruteTrie(page_size)
        self.running: list[tuple] = []  # (tokens, learner node, brute end, blocks used)

    # -- plumbing ------------------------------------------------------------
    def fail(self, msg: str):
        ops = "\n    ".join(self.log[-8:]) or "none yet"
        self.t.fail(f"{msg}\n  (page_size={self.P}; the operations so far, last 8:\n    {ops})")

    def _call(self, fn, *args, what: str):
        try:
            return self.t.call_fn(fn, *args, what=what)
        except LearnerRaised as e:
            if e.info.get("not_implemented"):
                raise
            hint = ""
            if e.type_name == "WireError" and "nested too deeply" in e.tb_text:
                hint = ("\n  Your node reached the grader as data, not as a reference: a dataclass or NamedTuple is "
                        "sent field by field (its parent and children too). Use a plain class, such as the given "
                        "TreeNode.")
            self.fail(f"{what}({', '.join(map(_short, args))}) raised:\n{e.tb_text}{hint}")

    def method(self, name: str):
        if name not in self._methods:
            try:
                self._methods[name] = getattr(self.mine, name)
            except LearnerRaised as e:
                self.fail(f"your RadixTree has no working `{name}`:\n{e.tb_text}")
        return self._methods[name]

    def m(self, name: str, *args):
        return self._call(self.method(name), *args, what=f"RadixTree.{name}")

    def fresh(self, n: int) -> list[int]:
        self.next_block += n
        return list(range(self.next_block - n, self.next_block))

    def expect(self, got, expected, what: str, mistakes: dict | None = None, hint: str = ""):
        """t.expect, with the operations that led here added to a failure's message."""
        try:
            self.t.expect(got, expected, what, mistakes=mistakes, hint=hint)
        except CaseFailed as e:
            self.fail(str(e))

    # -- invariants ----------------------------------------------------------
    def sizes(self, after: str):
        total = self.m("total_size")
        if total != self.ref.total_size():
            tail = self.log[-1]
            extra = ""
            if after == "insert" and isinstance(total, int) and total > self.ref.total_size():
                extra = (" Looks like your code caches the partial last page: only len(tokens) // page_size whole "
                         "pages are cached (a partly filled block still changes, so it is never shared).")
            self.fail(f"total_size() = {total!r} after {tail}, expected {self.ref.total_size()} tokens.{extra}")
        if not self.full:
            return
        ev, want = self.m("evictable_size"), self.ref.evictable_size()
        if ev != want:
            why = ""
            if after == "lock" and isinstance(ev, int) and ev < want:
                why = (" Looks like your code locks more than the match: when a match ends inside a node, split "
                       "it so that the node match_prefix returns ends exactly at the match.")
            elif after == "lock" and isinstance(ev, int) and ev > want:
                why = (" Looks like your code leaves matched pages unlocked: lock must add a reference to every "
                       "node from `node` up to the root.")
            elif after == "unlock" and isinstance(ev, int) and ev < want:
                why = (" Looks like your code's node no longer ends where its match ended: when _split divides a "
                       "node, the ORIGINAL node must keep the second half (the new node takes the first), so that a "
                       "running request's handle still spans its whole path and unlock releases all of it.")
            elif after == "unlock" and isinstance(ev, int):
                why = " unlock must undo exactly one lock(node), along the same path."
            self.fail(f"evictable_size() = {ev!r} after {self.log[-1]}, expected {want} tokens "
                      f"({self.ref.total_size()} cached, {self.ref.total_size() - want} of them locked).{why}")

    # -- operations ----------------------------------------------------------
    def insert(self, tokens: list[int], blocks: list[int] | None = None) -> int:
        blocks = self.fresh(len(tokens) // self.P) if blocks is None else blocks
        self.log.append(f"insert({tokens}, {blocks})")
        got = self.m("insert", tokens, blocks)
        expected = self.ref.insert(tokens, blocks)
        n_full = len(tokens) // self.P * self.P
        mistakes = {"returns the number of NEW tokens it added; insert returns how many leading tokens were "
                    "ALREADY cached (the caller frees its duplicates of those)": n_full - expected,
                    "counts pages, not tokens (the count is in tokens: a multiple of page_size)": expected // self.P}
        if expected == n_full:
            mistakes["counts the partial last page as cached: only whole pages are cached, so the count is a "
                     "multiple of page_size"] = len(tokens)
        self.expect(got, expected, f"insert({tokens}, ...) returned", mistakes=mistakes)
        self.sizes("insert")
        return expected

    def match(self, tokens: list[int]):
        self.log.append(f"match_prefix({tokens})")
        before = self.ref.copy()
        got = self.m("match_prefix", tokens)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            self.fail(f"match_prefix({tokens}) returned {_short(got)}: expected a pair (block_ids, node)")
        blocks, node = got
        exp_blocks, end = self.ref.match_prefix(tokens)
        partial = before.token_level_blocks(tokens)
        long = (isinstance(blocks, (list, tuple)) and len(blocks) > len(exp_blocks)
                and list(blocks[:len(exp_blocks)]) == exp_blocks)
        self.expect(blocks, exp_blocks, f"the block ids match_prefix({tokens}) returned",
                    mistakes={PARTIAL: partial}, hint=TOO_LONG if long else "")
        self.sizes("match_prefix")
        return node, end, exp_blocks

    def lock(self, node, end):
        self.log.append(f"lock(the node of the match ending after {len(end)} tokens)")
        self.m("lock", _handle(node))
        self.ref.lock(end)
        self.sizes("lock")

    def unlock(self, node, end):
        self.log.append(f"unlock(the node of the match ending after {len(end)} tokens)")
        self.m("unlock", _handle(node))
        self.ref.unlock(end)
        self.sizes("unlock")

    def double_unlock(self, node, end):
        """unlock of a node that is not locked (any more): RuntimeError, and nothing changes."""
        self.log.append(f"unlock(the node of the match ending after {len(end)} tokens) again (must raise)")
        try:
            self.t.call_fn(self.method("unlock"), _handle(node), what="RadixTree.unlock")
        except LearnerRaised as e:
            if e.info.get("not_implemented"):
                raise
            if not e.is_a(RuntimeError):
                self.fail(f"unlock of a node that is not locked raised {e.type_name}, expected RuntimeError")
            self.sizes("a refused unlock")
            return
        self.fail("unlock of a node that is not locked did not raise. Looks like your code lets a lock count go "
                  "below zero: raise RuntimeError (a double unlock would let another request's pages be evicted)")

    def evict(self, num_tokens: int):
        self.log.append(f"evict({num_tokens})")
        before = self.ref.copy()
        got = self.m("evict", num_tokens)
        expected = self.ref.evict(num_tokens)
        if not (isinstance(got, (list, tuple)) and all(type(b) is int for b in got)):
            self.fail(f"evict({num_tokens}) returned {_short(got)}: expected a list of block ids (ints)")
        by_block = {p.block: k for k, p in before.pages.items()}
        strangers = [b for b in got if b not in by_block]
        if strangers:
            self.fail(f"evict({num_tokens}) returned {list(got)}, but {strangers} {'is' if len(strangers) == 1 else 'are'} "
                      "not among the blocks the tree holds")
        if len(set(got)) != len(got):
            self.fail(f"evict({num_tokens}) returned {list(got)}: a block id twice (each page is freed once)")
        freed = {by_block[b] for b in got}
        if any(before.pages[k].locks > 0 for k in freed):
            self.fail(f"evict({num_tokens}) freed {sorted(got)}, which includes locked pages. Looks like your code {LOCKED}.")
        inner = [k for k in freed if any(len(c) == len(k) + self.P and c[:len(k)] == k and c not in freed
                                         for c in before.pages)]
        if inner:
            self.fail(f"evict({num_tokens}) freed {sorted(got)}, but block {before.pages[inner[0]].block} holds a "
                      f"page whose next page is still cached. Looks like your code {NOT_LEAVES}.")
        need = -(-num_tokens // self.P)
        if len(got) > len(expected):
            self.fail(f"evict({num_tokens}) freed {len(got)} pages; {need} page(s) were asked for"
                      f"{f' and only {len(expected)} are evictable' if len(expected) < need else ''}. Looks like your "
                      "code frees whole nodes: free exactly ceil(num_tokens / page_size) pages, one at a time "
                      "from the end of the least recently used unlocked leaf")
        mistakes = {}
        for by, name in LRU_MISTAKES.items():
            mistakes[name] = sorted(before.copy().evict(num_tokens, by=by))
        self.expect(sorted(got), sorted(expected), f"the blocks evict({num_tokens}) freed (sorted)", mistakes=mistakes,
                    hint="evict frees the unlocked leaf pages with the oldest last access first.")
        self.sizes("evict")

    # -- requests, as an engine would run them ---------------------------------
    def admit(self, tokens: list[int]):
        node, end, blocks = self.match(tokens)
        self.lock(node, end)
        self.running.append((tokens, node, end, blocks))

    def finish(self, i: int, extra: list[int]):
        tokens, node, end, blocks = self.running.pop(i)
        full = tokens + extra
        table = blocks + self.fresh(len(full) // self.P - len(blocks))
        self.insert(full, table)
        self.unlock(node, end)


def _handle(node):
    """What to send for a node the learner's code returned: its handle, or plain data as it came."""
    return getattr(node, "handle", node)


def _short(x) -> str:
    s = repr(x)
    return s if len(s) < 120 else s[:117] + "..."


# -- scripted sequences (visible) ---------------------------------------------------------------------

A = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]  # 3 pages of 4
X = [21, 22, 23, 24, 25, 26, 27, 28]


def _script_split(d: _Drive):
    d.insert(A + X)                       # one node of 5 pages
    d.match(A[:8] + [30, 31, 32, 33])     # diverges after 2 pages: split there
    d.match(A + [40, 41, 42, 43])         # diverges after 3 pages
    d.insert(A[:8] + [50, 51, 52, 53, 54])  # a second branch after page 2; its partial page is not cached
    d.match(A[:8] + [50, 51, 52, 53, 9])
    d.match(A + X)


def _script_pages(d: _Drive):
    d.insert(A)
    d.match([1, 2, 3, 4, 5, 6, 99, 99])   # page 2 matches only half
    d.match([1, 2, 3, 4, 5, 6])           # the query's partial last page
    d.match([1, 2, 3])                    # less than a page
    d.match([2, 3, 4, 5])                 # no page at all


def _script_insert_counts(d: _Drive):
    d.insert(A[:6])                       # 1 page + a partial one
    d.insert(A)                           # page 1 already cached
    d.insert(A + X[:2])                   # all 3 whole pages cached, 2 tokens of a partial page
    d.insert(A[:4] + X)                   # diverges after page 1
    d.insert(A[:4] + X)


def _script_locks(d: _Drive):
    d.insert(A[:4])
    d.insert(A)                           # two nodes: [page 1] -> [pages 2, 3]
    d.insert(X)
    d.admit(A[:8] + [60, 61])             # locks A's first 2 pages: two nodes, after a split
    d.evict(100)                          # everything evictable: X, and A's unlocked last page
    d.finish(0, [62, 63, 64, 65, 66, 67])  # inserts A[:8] + 8 more tokens, unlocks
    d.evict(4)


def _script_split_locked(d: _Drive):
    d.insert(A)
    d.admit(A + [80])                     # a running request locks the node holding all of A
    d.insert(A[:4] + X)                   # another sequence splits that node after page 1 ...
    d.insert(A[:8] + [90, 91, 92, 93])    # ... and after page 2
    d.finish(0, [81, 82, 83])             # unlock through the handle taken before the splits
    d.evict(100)


def _script_lru(d: _Drive):
    d.insert(A)
    d.insert(X)
    d.insert(A)                           # a re-insert is a use: X is now the oldest
    d.evict(4)
    d.match(X)                            # so is a match: now A is the oldest
    d.evict(4)


def _script_leaves(d: _Drive):
    d.insert(A + X)                       # one call: every page has the same stamp
    d.insert(A + [70, 71, 72, 73])        # splits after A
    d.match(A + X)
    d.evict(4)                            # the branch [70..73] is the oldest leaf
    d.evict(4)                            # then X's LAST page, not A's
    d.evict(20)


def _script_unlock(d: _Drive):
    d.insert(A)
    d.insert(A[:8] + [5])                 # every whole page already cached, plus a partial one
    d.match(A[:6])                        # the query's partial last page does not match
    node, end, _ = d.match(A[:8])
    d.lock(node, end)
    d.unlock(node, end)
    d.double_unlock(node, end)
    node, end, _ = d.match(A)
    d.lock(node, end)
    d.evict(12)
    d.unlock(node, end)
    d.evict(12)


MATCH_SCRIPTS = {"a query diverging inside a cached node (split there)": _script_split,
                 "only whole pages match": _script_pages,
                 "insert's already-cached count": _script_insert_counts}
EVICT_SCRIPTS = {"a locked path is never evicted": _script_locks,
                 "a running request's node stays whole across splits": _script_split_locked,
                 "least recently USED first (a match and a re-insert are uses)": _script_lru,
                 "leaves first, a leaf's pages from its end": _script_leaves,
                 "unlock undoes one lock; a second unlock raises": _script_unlock}


# -- random sequences (hidden) ------------------------------------------------------------------------

def _sequence(rng: random.Random, pool: list[list[int]], P: int) -> list[int]:
    """A token sequence on the alphabet {1, 2, 3}: often a cut of an earlier one (at any token, so inside
    pages too) plus a random tail, so that sequences share prefixes and diverge anywhere."""
    if pool and rng.random() < 0.75:
        base = rng.choice(pool)
        seq = base[:rng.randint(0, len(base))]
    else:
        seq = []
    seq = seq + [rng.randint(1, 3) for _ in range(rng.randint(0, 3 * P))]
    seq = seq[:7 * P] or [rng.randint(1, 3) for _ in range(P)]
    pool.append(seq)
    return seq


def _random_ops(d: _Drive, rng: random.Random, steps: int):
    pool: list[list[int]] = []
    for _ in range(steps):
        ops = ["insert"] * 3 + ["match"] * 3
        if d.full:
            ops += ["admit"] * 2 + ["evict"] * 2 + ["finish"] * (2 * bool(d.running))
        op = rng.choice(ops)
        if op == "insert":
            d.insert(_sequence(rng, pool, d.P))
        elif op == "match":
            d.match(_sequence(rng, pool, d.P))
        elif op == "admit":
            d.admit(_sequence(rng, pool, d.P))
        elif op == "evict":
            d.evict(rng.randint(1, 3 * d.P))
        else:
            d.finish(rng.randrange(len(d.running)), [rng.randint(1, 3) for _ in range(rng.randint(0, 2 * d.P))])
    while d.full and d.running:
        d.finish(0, [])
    if d.full:
        d.evict(d.ref.total_size() + d.P)  # everything: the tree must give back every block it holds


def _tree_check(t, scripts: dict, full: bool):
    cases = t.cases(visible=[(f"visible: {name}", ("script", fn, 4)) for name, fn in scripts.items()],
                    hidden=lambda rng: ("random", rng.randrange(2**31), rng.choice([1, 2, 3, 4])), n=3)
    for label, (kind, what, P) in cases:
        name = label if kind == "script" else f"{label}: 40 random operations, page_size {P}"
        with t.case(name):
            d = _Drive(t, P, full)
            if kind == "script":
                what(d)
            else:
                _random_ops(d, random.Random(what), 40)


@check(points=4, section="2.1", timeout=60)
def radix_match_insert(t):
    """insert / match_prefix / total_size against a brute-force trie: whole pages, splits, cached counts."""
    _tree_check(t, MATCH_SCRIPTS, full=False)


@check(points=4, section="2.2", timeout=60)
def radix_lock_evict(t):
    """lock / unlock / evict / evictable_size against a brute-force trie: LRU unlocked leaves, page by page."""
    _tree_check(t, EVICT_SCRIPTS, full=True)


# ---------------------------------------------------------------- 3.1 longest prefix match first


def _build(page_size: int, cached: list) -> BruteTrie:
    trie = BruteTrie(page_size)
    n = 0
    for seq in cached:
        k = len(seq) // page_size
        trie.insert(seq, list(range(n, n + k)))
        n += k
    return trie


def lpm_harness(lpm_order, page_size: int, cached: list, waiting: list):
    """(A harness: runs in the learner's process under `t.run`.) Your lpm_order on a brute-force trie
    holding `cached`; returns its answer as plain data."""
    out = lpm_order(_build(page_size, cached), [list(w) for w in waiting])
    return list(out) if isinstance(out, (list, tuple)) else out


def _lpm_reference(ref, page_size: int, cached: list, waiting: list):
    """The reference order (for t.reference: plain data in and out)."""
    return list(ref.lpm_order(_build(page_size, cached), [list(w) for w in waiting]))


def lpm_mistakes(page_size: int, cached: list, waiting: list) -> dict:
    trie = _build(page_size, cached)
    m = [len(trie.match_prefix(w)[0]) for w in waiting]
    idx = range(len(waiting))
    return {"admits the SHORTEST cached prefix first; lpm admits the longest first": sorted(idx, key=lambda i: m[i]),
            "orders by prompt length, not by the cached prefix (match_prefix each prompt)":
                sorted(idx, key=lambda i: -len(waiting[i])),
            "breaks ties in reverse arrival order; equal matches keep their arrival order (a stable sort)":
                sorted(idx, key=lambda i: (-m[i], -i)),
            "orders by the cached FRACTION of each prompt; lpm orders by the cached length itself":
                sorted(idx, key=lambda i: (-m[i] * page_size / len(waiting[i]), i))}


_S = [1, 2, 3, 4, 5, 6]  # 3 pages of 2
LPM_CASES = [
    ("visible: three prefix lengths and a tie", (2, [_S], [[9, 8, 7, 6, 5, 4, 3, 2], _S[:4] + [7], _S + [8],
                                                           _S[:4] + [9, 9]])),
    ("visible: a short prompt almost all cached vs a long one with more cached", (2, [_S], [_S[:4] + [7],
                                                                                        _S + [8] * 10])),
]


def random_lpm_case(rng):
    P = rng.choice([1, 2, 4])
    cached = [[rng.randint(1, 3) for _ in range(rng.randint(P, 6 * P))] for _ in range(rng.randint(1, 3))]
    waiting = []
    for _ in range(rng.randint(3, 7)):
        base = rng.choice(cached)
        waiting.append(base[:rng.randint(0, len(base))] + [rng.randint(4, 6) for _ in range(rng.randint(1, 2 * P))])
    return P, cached, waiting


@check(points=2, section="3.1", timeout=30)
def lpm_order(t):
    """The admission order: longest cached prefix first (matched through the tree), ties by arrival."""
    for label, (P, cached, waiting) in t.cases(visible=LPM_CASES, hidden=random_lpm_case, n=3):
        with t.case(f"{label}: page_size {P}, cached {cached}, waiting {waiting}"):
            expected = t.reference(_lpm_reference, P, cached, waiting)
            got = t.run(lpm_harness, t.learner("lpm_order"), P, cached, waiting,
                        what="lpm_order on a tree holding the cached sequences,")
            t.expect(got, expected, "the admission order (indices into waiting)", mistakes=lpm_mistakes(P, cached, waiting))
