"""Checks of lesson 18: the block hash chain, the radix tree (op by op against a brute-force trie), and
the longest-prefix-match admission order.

The learner's tree lives in the learner's process. The driver below sends each operation there and runs
the same one here on `BruteTrie`, the spec written the slow way: a dict from every cached page-aligned
prefix (a tuple of token ids) to its page's block id, stamp and lock count. After every operation it
compares what a caller sees (the blocks match_prefix returns, insert's already-cached count, evict's
freed blocks, total_size, evictable_size) and the tree itself, read through the given TreeNode's fields
by a harness (`tree_view`): the pages it holds, each page's lock_ref and stamp, and the tokens each node
handle match_prefix returned still spans. Node layout stays the learner's business (everything is
compared page by page), and of the stamps only their ORDER counts: any clock that ticks once per
match_prefix and per insert passes.

A wrong value is named only when exactly one mistake, computed from the state before the operation,
gives it, and no earlier answer of the same code ruled that mistake out (`_Drive.judge`). Scripted
visible sequences offer every named mistake on every seed; hidden cases are random operation sequences
drawn from t.rng on a three-token alphabet (so that sequences share prefixes and diverge inside pages
and nodes).

The engine check (5.1) runs the learner's tree as the engine's prefix cache. When a run goes wrong there, the
message names the RadixTree method that is wrong, found by replaying the tree op by op on the visible scripts
of 2.1 and 2.2 (`replay_cause`), and then says what the engine saw: an engine error alone cannot tell a missing
split from a wrong eviction.
"""
from __future__ import annotations

import contextlib
import hashlib
import random
import struct
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from autograder.checks._drive import Differential
from autograder.checks._engine import known_error
from autograder.core import CaseFailed, NotStarted, check
from autograder.harnesses.l18_prefix_caching import NODE_FIELDS, lpm_harness, stand_in_tree, tree_view
from autograder.mistakes import looks_like
from autograder.reference import NotRecorded, answer_code

# ---------------------------------------------------------------- the spec, the slow way


class _Page(NamedTuple):
    block: int
    stamp: int   # the clock at the last match_prefix / insert that walked through the page
    locks: int
    born: int    # the clock when the page was inserted (for naming an insertion-time LRU)
    ins: int     # the clock at the last INSERT through it (for naming "a match is not an access")


class BruteTrie:
    """RadixTree's semantics page by page: `pages` maps every cached prefix, as a tuple of whole pages of
    token ids, to its last page's state (a `_Page`). A node handle is the prefix tuple where a match ended.

    The state (page_size, clock, pages) is plain data, and every operation is a function of it (the `trie_*`
    functions below, the grader's answer code: a student's copy replays their results); this class holds the
    state between operations."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.pages: dict[tuple, _Page] = {}
        self.clock = 0

    def _prefixes(self, tokens) -> list[tuple]:
        return page_prefixes(self.page_size, tokens)

    def match_prefix(self, tokens):
        self.pages, self.clock, blocks, end = trie_match(self.page_size, self.clock, self.pages, tokens)
        return blocks, end

    def insert(self, tokens, block_ids) -> int:
        self.pages, self.clock, cached = trie_insert(self.page_size, self.clock, self.pages, tokens, block_ids)
        return cached

    def lock(self, end: tuple):
        self.pages = trie_lock(self.page_size, self.pages, end, 1)

    def unlock(self, end: tuple):
        self.pages = trie_lock(self.page_size, self.pages, end, -1)

    def evict(self, num_tokens: int, by: str = "stamp", need: int | None = None) -> list[int]:
        """Free ceil(num_tokens / page_size) unlocked leaf pages (or `need`), the oldest first by `by`:
        "stamp" (the spec), "born" (insertion time), "ins" (the last insert only), "mru" (newest first),
        "inherit" (a page that becomes a leaf competes with the stamp of the child page just freed)."""
        self.pages, freed = trie_evict(self.page_size, self.pages, num_tokens, by, need)
        return freed

    def total_size(self) -> int:
        return trie_total_size(self.page_size, self.pages)

    def evictable_size(self) -> int:
        return trie_evictable_size(self.page_size, self.pages)

    def copy(self) -> BruteTrie:
        c = BruteTrie(self.page_size)
        c.clock = self.clock
        c.pages = dict(self.pages)  # its _Pages are immutable: the trie_* functions build new ones
        return c

    def token_level_blocks(self, tokens) -> list[int]:
        """What a match that also takes PARTLY matching pages returns: the blocks covering the longest
        common token prefix of `tokens` with a cached sequence (the partly matching page included)."""
        return trie_token_level_blocks(self.page_size, self.pages, tokens)


@answer_code
def page_prefixes(P: int, tokens) -> list[tuple]:
    """The page-aligned prefixes of `tokens` (whole pages of P tokens), shortest first."""
    return [tuple(tokens[:k * P]) for k in range(1, len(tokens) // P + 1)]


@answer_code
def trie_match(P: int, clock: int, pages: dict, tokens) -> tuple:
    """match_prefix on the trie (P, clock, pages): (pages, clock, blocks, end) after it."""
    clock += 1
    pages = dict(pages)
    blocks, end = [], ()
    for key in page_prefixes(P, tokens):
        if key not in pages:
            break
        p = pages[key]
        pages[key] = _Page(p.block, clock, p.locks, p.born, p.ins)
        blocks.append(p.block)
        end = key
    return pages, clock, blocks, end


@answer_code
def trie_insert(P: int, clock: int, pages: dict, tokens, block_ids) -> tuple:
    """insert on the trie (P, clock, pages): (pages, clock, tokens already cached) after it."""
    clock += 1
    pages = dict(pages)
    cached = 0
    for i, key in enumerate(page_prefixes(P, tokens)):
        p = pages.get(key)
        if p is None:  # the set is closed under prefixes: every longer key is missing too
            pages[key] = _Page(block_ids[i], clock, 0, clock, clock)
        else:
            pages[key] = _Page(p.block, clock, p.locks, p.born, clock)
            cached += P
    return pages, clock, cached


@answer_code
def trie_lock(P: int, pages: dict, end: tuple, step: int) -> dict:
    """The pages after lock (step 1) or unlock (step -1) of the path ending at `end`."""
    if step < 0 and end and pages[end].locks <= 0:
        raise RuntimeError("unlock of a node that is not locked")
    pages = dict(pages)
    for key in page_prefixes(P, end):
        p = pages[key]
        pages[key] = _Page(p.block, p.stamp, p.locks + step, p.born, p.ins)
    return pages


@answer_code
def _evictable(P: int, pages: dict) -> list[tuple]:
    """The unlocked leaves: pages no other page extends (a page's parent is its key less one page)."""
    parents = {k[:-P] for k in pages}
    return [k for k, p in pages.items() if p.locks == 0 and k not in parents]


@answer_code
def trie_evict(P: int, pages: dict, num_tokens: int, by: str = "stamp", need: int | None = None) -> tuple:
    """(pages, freed blocks) after evict(num_tokens) on the trie, with the order `by` (BruteTrie.evict)."""
    pages = dict(pages)
    need = max(0, -(-num_tokens // P)) if need is None else need
    inherited: dict[tuple, int] = {}

    def age(key: tuple) -> int:
        page = pages[key]
        if by == "mru":
            return -page.stamp
        if by == "inherit":
            return inherited.get(key, page.stamp)
        return getattr(page, by)

    freed = []
    while len(freed) < need:
        leaves = _evictable(P, pages)
        if not leaves:
            break
        key = min(leaves, key=lambda k: (age(k), -len(k), k))
        page = pages.pop(key)
        freed.append(page.block)
        if by == "inherit" and key[:-P] in pages:
            inherited[key[:-P]] = page.stamp
    return pages, freed


@answer_code
def trie_total_size(P: int, pages: dict) -> int:
    return P * len(pages)


@answer_code
def trie_evictable_size(P: int, pages: dict) -> int:
    return P * sum(p.locks == 0 for p in pages.values())


@answer_code
def trie_token_level_blocks(P: int, pages: dict, tokens) -> list[int]:
    """BruteTrie.token_level_blocks on the trie's pages."""
    best, best_key = 0, ()
    for key in pages:
        n = 0
        while n < min(len(key), len(tokens)) and key[n] == tokens[n]:
            n += 1
        if n > best or (n == best and len(key) < len(best_key)):
            best, best_key = n, key
    n_pages = -(-best // P)
    return [pages[best_key[:j * P]].block for j in range(1, n_pages + 1)]


# ---------------------------------------------------------------- 1.1 the hash chain


@answer_code
def _digest(parent: bytes, block, fmt: str = "q") -> bytes:
    return hashlib.sha256(parent + struct.pack(f"<{len(block)}{fmt}", *block)).digest()


@answer_code
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
    ("visible: a negative id (ids pack as SIGNED 8-byte ints)", ([-1, 5, 7, -1, 2], 2)),
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
                       "it matched (a cache hit is a use)",
                "mru": "frees the MOST recently used pages first; LRU frees the least recently used (the oldest "
                       "last_access) first",
                "inherit": "lets a parent that becomes a leaf compete with the stamp of the child just freed; it "
                           "competes with its own last_access (it may have been used after the child)"}
NEED_MISTAKES = {"floor": "frees floor(num_tokens / page_size) pages; free ceil(num_tokens / page_size), so that at "
                          "least num_tokens tokens are freed",
                 "min one": "frees a page even for evict(0): ceil(0 / page_size) = 0 pages",
                 "plus one": "frees one page too many when num_tokens is a multiple of page_size (num_tokens // "
                             "page_size + 1); free ceil(num_tokens / page_size)"}
WHOLE_NODES = ("frees whole nodes: free exactly ceil(num_tokens / page_size) pages, one at a time from the end of "
               "the least recently used unlocked leaf")
PARTIAL = ("matches partial pages: a page matches only if all its page_size tokens do, and a partial last "
           "page of the query never matches")
NO_SPLIT = ("does not split a node where the query diverges: it returns the whole node the match ends in; split "
            "the node there and return only the pages that match")
NO_SPLIT_INSERT = ("does not split a node where the inserted sequence diverges: insert hangs the new pages below the "
                   "whole node, after tokens the sequence does not have; split the node at the divergence (_split) "
                   "and hang the new pages below its first part")
COMMON_TOKENS = ("counts matching TOKENS where pages are meant (_common_pages returns whole pages: tokens // "
                 "page_size), so a match skips or takes the wrong pages")
TOTAL_MISTAKES = {"partial": "caches the partial last page: only len(tokens) // page_size whole pages are cached "
                             "(a partly filled block still changes, so it is never shared)",
                  "all": "adds every whole page of the inserted sequence to total_size, the ones already cached "
                         "too: add only the new pages",
                  "insert unchanged": "does not add the pages insert caches to total_size",
                  "evict unchanged": "does not take the pages evict frees off total_size",
                  "pages": "counts pages, not tokens, in total_size"}
EV_MISTAKES = {"total": "returns total_size: evictable_size counts only the tokens of pages no running request "
                        "has locked",
               "pages": "counts pages, not tokens, in evictable_size",
               "locked": "returns the LOCKED tokens; evictable_size is the unlocked ones",
               "leaves": "counts only the tokens of unlocked LEAF nodes; every unlocked page counts (evict frees an "
                         "inner page once the pages after it are gone)",
               "every lock": "counts a node's tokens as locked on every lock; they leave the evictable count only "
                             "when its lock_ref goes from 0 to 1 (a second request on the same path locks nothing "
                             "new)",
               "lock no count": "does not take the tokens lock protects off the evictable count (when a node's "
                                "lock_ref goes from 0 to 1)",
               "unlock no count": "does not give tokens back to the evictable count when unlock brings a node's "
                                  "lock_ref to 0"}
LOCK_MISTAKES = {"lock node only": "leaves matched pages unlocked: lock must add a reference to every node from "
                                   "`node` up to the root (lock(node) protects the whole matched path)",
                 "set one": "sets lock_ref to 1 instead of adding one: two requests holding the same path need two "
                            "references, or the first unlock releases the second request's pages",
                 "unlock node only": "releases only `node` itself: unlock must walk from node up to the root, as "
                                     "lock does"}
FIELDS_NOTE = ("The grader reads your tree through the fields of the given TreeNode (tree.root; each node's "
               f"{', '.join(NODE_FIELDS)}): keep those names if you write your own node class.")


# -- the learner's tree as data ----------------------------------------------------------------------
# (read in the learner's process by tree_view: autograder/harnesses/l18_prefix_caching.py)


@dataclass
class _View:
    """tree_view's answer, page by page: pages maps every cached prefix to {block, stamp, locks, node}."""
    nodes: list
    handles: list
    pages: dict
    problem: str = ""  # the first way the tree breaks TreeNode's invariants, if any


# _read_view keeps every node's path from the root, and every page's: their sizes add up to the sum, over nodes,
# of the tokens from the root to the node. These cases cache a few sequences of at most ~10 pages (a tree of some
# 10^4 path tokens); a chain of 19 000 one-page nodes (1.8 * 10^8 of them) took this process to 6 GB in a minute.
MAX_PATH_TOKENS = 1_000_000


def _path_tokens(nodes: list) -> int:
    """The sum over nodes of the tokens on the path from the root to the node (tree_view lists parents first)."""
    depth = []
    for n in nodes:
        depth.append((depth[n["parent"]] if n["parent"] >= 0 else 0) + len(n["tokens"]))
    return sum(depth)


def _read_view(data: dict, P: int) -> _View:
    nodes, pages, paths, problem = data["nodes"], {}, {0: ()}, ""
    if nodes[0]["tokens"] or nodes[0]["blocks"]:
        problem = "the root holds tokens or blocks: it holds none (every cached sequence starts below it)"
    for i, n in enumerate(nodes[1:], 1):
        start = paths[n["parent"]]
        paths[i] = start + tuple(n["tokens"])
        if problem:
            continue
        if not n["parent_ok"]:
            problem = (f"the node holding {_short(n['tokens'])} has a `parent` that is not the node whose children "
                       "hold it: set child.parent whenever a node is created, split or moved")
        elif not n["blocks"]:
            problem = (f"a node with no pages (tokens {_short(n['tokens'])}) hangs in the tree: an emptied leaf "
                       "leaves the tree (delete it from its parent's children)")
        elif len(n["tokens"]) != len(n["blocks"]) * P:
            problem = (f"a node holds {len(n['tokens'])} tokens but {len(n['blocks'])} block id(s) (page_size {P}): "
                       "a node's tokens are whole pages, one block id per page")
        for j, block in enumerate(n["blocks"]):
            key = paths[i][:len(start) + (j + 1) * P]
            if key in pages and not problem:
                problem = (f"two nodes hold the page ending at token {len(key)} of {_short(list(key))}: two "
                           "children of one node never start with the same page (a divergence inside a node "
                           "splits it)")
            pages[key] = {"block": block, "stamp": n["last_access"], "locks": n["lock_ref"], "node": i}
    return _View(nodes, data["handles"], pages, problem)


def _on_learner_tree(fn, view: _View, fields: tuple, *args):
    """fn(nodes, *args), an answer-code function of the learner's tree as read, given of each node only `fields`
    (the root: nothing), so that a tree that differs from the solution's only where fn does not look asks the
    question the release stored. None where a student's copy holds no answer for it (a tree laid out otherwise
    than the solution's, at this point): the mistake goes unnamed there, the case is still judged."""
    nodes = [{}] + [{f: n[f] for f in fields} for n in view.nodes[1:]]
    try:
        return fn(nodes, *args)
    except NotRecorded:
        return None


def match_variant(view: _View | None, tokens: list, P: int, mode: str):
    """The blocks match_prefix(tokens) returns on the learner's tree as it was (`view`) with one mistake:
    mode "no split" (a match that ends inside a node takes the whole node) or "tokens" (_common_pages
    returns matching tokens, used as pages). None when the tree was not read (or, in a student's copy, when
    the release asked nothing of a tree like this one)."""
    if view is None:
        return None
    return _on_learner_tree(match_on_nodes, view, ("parent", "tokens", "blocks"), list(tokens), P, mode)


@answer_code
def match_on_nodes(view_nodes: list, tokens: list, P: int, mode: str) -> list:
    """match_variant on the nodes of the learner's tree as read (_View.nodes; the root's entry unread)."""
    nodes = {i: (n.get("tokens", []), n.get("blocks", [])) for i, n in enumerate(view_nodes)}
    kids: dict = {i: {} for i in nodes}
    for i, n in enumerate(view_nodes[1:], 1):
        kids[n["parent"]][tuple(n["tokens"][:P])] = (n["tokens"], n["blocks"], kids[i])
    here, pos, blocks = kids[0], 0, []
    while pos + P <= len(tokens):
        child = here.get(tuple(tokens[pos:pos + P]))
        if child is None:
            break
        ct, cb, ck = child
        k = 0
        while (k < len(cb) and pos + (k + 1) * P <= len(tokens)
               and list(tokens[pos + k * P:pos + (k + 1) * P]) == ct[k * P:(k + 1) * P]):
            k += 1
        if mode == "tokens":
            k *= P
        if k < len(cb):
            if mode == "no split":
                return blocks + list(cb)
            blocks += cb[:k]  # a split after k pages: the walk goes on into the rest of the node
            here, pos = {tuple(ct[k * P:k * P + P]): (ct[k * P:], cb[k:], ck)}, pos + k * P
        else:
            blocks += cb
            here, pos = ck, pos + k * P
    return blocks


def insert_variant(view: _View | None, tokens: list, P: int):
    """The cached prefixes (sorted, as lists) of the learner's tree as it was (`view`) after an insert(tokens) that
    never splits a node where the sequence diverges (NO_SPLIT_INSERT). None when the tree was not read (or, in a
    student's copy, when the release asked nothing of a tree like this one)."""
    if view is None:
        return None
    return _on_learner_tree(insert_no_split_on_nodes, view, ("parent", "tokens", "blocks"), list(tokens), P)


@answer_code
def insert_no_split_on_nodes(view_nodes: list, tokens: list, P: int) -> list:
    """insert_variant on the nodes of the learner's tree as read (_View.nodes; the root's entry unread)."""
    paths: dict = {0: []}
    kids: dict = {0: {}}
    keys = []
    for i, n in enumerate(view_nodes[1:], 1):
        start = paths[n["parent"]]
        paths[i], kids[i] = start + list(n["tokens"]), {}
        kids[n["parent"]][tuple(n["tokens"][:P])] = i
        keys += [start + list(n["tokens"][:(j + 1) * P]) for j in range(len(n["blocks"]))]
    node, page, n_pages = 0, 0, len(tokens) // P
    while page < n_pages:
        i = kids[node].get(tuple(tokens[page * P:(page + 1) * P]))
        if i is None:  # the rest becomes one new node below `node`
            keys += [list(tokens[:(q + 1) * P]) for q in range(page, n_pages)]
            break
        ct, cb = view_nodes[i]["tokens"], view_nodes[i]["blocks"]
        k = 0
        while k < len(cb) and page + k < n_pages and list(tokens[(page + k) * P:(page + k + 1) * P]) == list(ct[k * P:(k + 1) * P]):
            k += 1
        if k < len(cb):
            if page + k < n_pages:  # diverges inside the node: the new pages hang below all of it
                keys += [paths[i] + list(tokens[(page + k) * P:(q + 1) * P]) for q in range(page + k, n_pages)]
            break
        node, page = i, page + k
    return sorted(keys)


def evict_whole_nodes(view: _View | None, need: int):
    """The blocks an evict that frees WHOLE unlocked leaf nodes, oldest first, frees from the learner's tree
    as it was, until at least `need` pages are free. None if the order is not determined (equal stamps), the
    tree was not read (or, in a student's copy, the release asked nothing of a tree like this one)."""
    if view is None:
        return None
    return _on_learner_tree(whole_nodes_on, view, ("parent", "blocks", "last_access", "lock_ref"), need)


@answer_code
def whole_nodes_on(nodes: list, need: int):
    """evict_whole_nodes on the nodes of the learner's tree as read (_View.nodes; the root's entry unread)."""
    kids = [0] * len(nodes)
    for n in nodes[1:]:
        kids[n["parent"]] += 1
    alive, freed = set(range(1, len(nodes))), []
    while len(freed) < need:
        leaves = sorted((nodes[i]["last_access"], i) for i in alive if kids[i] == 0 and nodes[i]["lock_ref"] == 0)
        if not leaves:
            break
        if len(leaves) > 1 and leaves[0][0] == leaves[1][0]:
            return None
        i = leaves[0][1]
        freed += nodes[i]["blocks"]
        alive.remove(i)
        kids[nodes[i]["parent"]] -= 1
    return freed


def _page(key: tuple, P: int) -> str:
    return f"the page ending at token {len(key)} of {_short(list(key))}"


class _Drive(Differential):
    """Runs the same operations on the learner's RadixTree and on BruteTrie, comparing what a caller sees
    and the tree itself (see the module docstring) after each.

    full=False (check 2.1): insert, match_prefix and total_size only. full=True (2.2): also lock, unlock,
    evict and evictable_size, and requests that match + lock at admission and insert + unlock at the end.
    `refuted` (shared by a check's cases): mistakes an earlier right answer of this code ruled out.
    """
    cls = "RadixTree"

    def __init__(self, t, page_size: int, full: bool, refuted: set | None = None):
        self.P, self.full = page_size, full
        super().__init__(t, page_size, refuted=refuted)
        self.next_block = 100
        self.ref = BruteTrie(page_size)
        self.running: list[tuple] = []  # (tokens, learner node, brute end, blocks used)
        self.handles: list[tuple] = []  # (learner node, brute end, the call that returned it): still valid
        self.view: _View | None = None  # the learner's tree after the last operation

    def where(self) -> str:
        ops = "\n    ".join(self.log[-8:]) or "none yet"
        return f"\n  (page_size={self.P}; the operations so far, last 8:\n    {ops})"

    def show(self, arg) -> str:
        return _short(arg)

    def raised_hint(self, e) -> str:
        if e.type_name == "WireError" and "nested too deeply" in e.tb_text:
            return ("\n  Your node reached the grader as data, not as a reference: a dataclass or NamedTuple is sent "
                    "field by field (its parent and children too). Use a plain class, such as the given TreeNode.")
        return ""

    def fresh(self, n: int) -> list[int]:
        self.next_block += n
        return list(range(self.next_block - n, self.next_block))

    # -- after every operation -----------------------------------------------
    def after(self, kind: str, before: BruteTrie, tokens=(), cached: int = 0, end=None, node=None):
        """Everything a caller and the tree show, after an operation of `kind` ("insert", "match", "lock",
        "unlock", "evict", "refused insert", "refused unlock"); `before`: the brute trie before it."""
        self.check_total(kind, before, tokens, cached)
        view = self.read_view(node)
        self.check_pages(view, kind, tokens)
        self.check_handles(view, kind)
        if self.full:
            self.check_locks(view, kind, before, end)
        self.check_stamps(view, kind, before)
        if self.full:
            self.check_evictable(view, kind, before, end)
        self.view = view

    def check_total(self, kind, before, tokens, cached):
        total, want, was = self.m("total_size"), self.ref.total_size(), before.total_size()
        mistakes = {TOTAL_MISTAKES["pages"]: want // self.P}
        if kind == "insert":
            if len(tokens) % self.P:
                mistakes[TOTAL_MISTAKES["partial"]] = was + len(tokens) - cached
            mistakes[TOTAL_MISTAKES["all"]] = was + len(tokens) // self.P * self.P
            mistakes[TOTAL_MISTAKES["insert unchanged"]] = was
        if kind == "evict":
            mistakes[TOTAL_MISTAKES["evict unchanged"]] = was
        ok, names = self.judge(total, want, mistakes)
        if not ok:
            self.fail(f"total_size() = {total!r} after {self.log[-1]}, expected {want} tokens.", names)

    def read_view(self, node=None) -> _View:
        handles = [_handle(h) for h, _, _ in self.handles] + ([_handle(node)] if node is not None else [])
        data, raised = self.t.attempt(self.t.run, tree_view, self.mine.handle, handles,
                                      what="reading your tree (tree_view)")
        if raised:
            self.fail(f"reading your tree after {self.log[-1]} raised:\n{raised.tb_text}\n  {FIELDS_NOTE}")
        if "error" in data:
            self.fail(f"after {self.log[-1]}: {data['error']}. {FIELDS_NOTE}")
        held = _path_tokens(data["nodes"])
        if held > MAX_PATH_TOKENS:
            self.fail(f"after {self.log[-1]}, your tree's {len(data['nodes'])} nodes spell paths of {held:,} tokens "
                      f"in all (the tokens from the root to each node, summed): these cases cache a few sequences "
                      f"of at most a few dozen pages, far under {MAX_PATH_TOKENS:,}.", "keeps adding nodes it should "
                      "not (a chain that never ends, pages cached again)", end="")
        return _read_view(data, self.P)

    def check_pages(self, view: _View, kind: str, tokens=()):
        mine, want = view.pages, self.ref.pages
        if kind == "insert":  # where the tree went after an insert, page by page (a wrong shape is named here)
            ok, names = self.judge(sorted(map(list, mine)), sorted(map(list, want)),
                                   {NO_SPLIT_INSERT: insert_variant(self.view, list(tokens), self.P)})
            if not ok and names:
                extra = sorted(set(mine) - set(want), key=len)
                lacks = sorted(set(want) - set(mine), key=len)
                self.fail(f"after {self.log[-1]}, your tree "
                          + (f"holds {_page(extra[0], self.P)}, which is not cached" if extra else "")
                          + (" and " if extra and lacks else "")
                          + (f"lacks {_page(lacks[0], self.P)}" if lacks else "") + ".", names)
        if view.problem:
            self.fail(f"after {self.log[-1]}, {view.problem}.", "pops the freed pages' block ids but leaves their "
                      "tokens: evict drops both" if kind == "evict" and "tokens but" in view.problem else None)
        for key in sorted(set(mine) | set(want), key=len):
            if key not in mine:
                self.fail(f"after {self.log[-1]}, your tree lacks {_page(key, self.P)} (block {want[key].block}).")
            if key not in want:
                self.fail(f"after {self.log[-1]}, your tree holds {_page(key, self.P)} (block {mine[key]['block']}), "
                          "which is not cached.")
            if mine[key]["block"] != want[key].block:
                self.fail(f"after {self.log[-1]}, your tree keeps block {mine[key]['block']} for {_page(key, self.P)}, "
                          f"expected {want[key].block}: a page keeps the block id it was first cached with (pages "
                          "already cached keep the tree's own block ids).")

    def check_handles(self, view: _View, kind: str):
        """Every node match_prefix returned still spans the tokens of its match (splits keep it whole)."""
        for i, ((_, end, origin), got) in enumerate(zip(self.handles, view.handles)):
            want, span = list(end), got["tokens"]
            if span == want and got["reaches_root"]:
                continue
            fresh = kind == "match" and i == len(self.handles) - 1
            who = f"the node {origin} returned"
            if not got["reaches_root"]:
                self.fail(f"{who} is not in the tree: walking its `parent`s does not reach the root.")
            if fresh and len(span) > len(want) and span[:len(want)] == want:
                self.fail(f"{who} ends after {len(span)} tokens, but the match ends after {len(want)}: when a match "
                          "ends inside a node, split the node there so that the node returned ends exactly at the "
                          "match (else lock(node) locks more than the match).")
            if fresh and len(span) < len(want) and want[:len(span)] == span:
                self.fail(f"{who} ends after {len(span)} tokens, but the match covers {len(want)}: return the node "
                          "where the match ends (the last node matched, after a split), not one above it.")
            if fresh:
                self.fail(f"{who} spans the tokens {_short(span)}, not the matched {_short(want)}.")
            if len(span) < len(want) and want[:len(span)] == span:
                self.fail(f"{who} spanned {len(want)} tokens then; after {self.log[-1]} it spans {len(span)}. "
                          + looks_like("node no longer ends where its match ended: when _split divides a node, the "
                                       "ORIGINAL node must keep the second half (the new node takes the first), so "
                                       "that a running request's handle still spans its whole path and unlock "
                                       "releases all of it", who="your code's"))
            self.fail(f"{who} spanned {len(want)} tokens then; after {self.log[-1]} it spans {_short(span)}: a node "
                      "handle keeps ending at the same token across later splits.")

    def check_locks(self, view: _View, kind: str, before: BruteTrie, end):
        mine = {k: p["locks"] for k, p in view.pages.items()}
        want = {k: p.locks for k, p in self.ref.pages.items()}
        mistakes = {}
        if kind in ("lock", "unlock") and end:
            base = {k: p.locks for k, p in before.pages.items()}
            step = 1 if kind == "lock" else -1
            own = [k for k, p in view.pages.items() if p["node"] == view.handles[-1]["node"]]
            node_only = dict(base)
            for k in own:
                node_only[k] += step
            mistakes[LOCK_MISTAKES[f"{kind} node only"]] = node_only
            if kind == "lock":
                path = before._prefixes(end)
                mistakes[LOCK_MISTAKES["set one"]] = {k: 1 if k in path else v for k, v in base.items()}
        ok, names = self.judge(mine, want, mistakes)
        if ok:
            return
        key = next(k for k in sorted(want, key=len) if mine[k] != want[k])
        msg = (f"after {self.log[-1]}, {_page(key, self.P)} has lock_ref {mine[key]!r}, expected {want[key]} (the "
               "running requests whose locked path runs through it).")
        if not names and kind in ("insert", "match"):
            msg += (" insert and match_prefix change no lock counts; when they split a locked node, the new node "
                    "(its first part) inherits the node's lock_ref: a running request still holds those pages.")
        elif not names and kind == "refused unlock":
            names = ["changes lock counts before it refuses: check that node is locked first, and raise before "
                     "changing anything"]
        self.fail(msg, names)

    def check_stamps(self, view: _View, kind: str, before: BruteTrie):
        """Stamps in order only: the pages a match_prefix / insert walks share one stamp newer than every stamp
        before it; no other page's stamp changes (lock, unlock and evict change none)."""
        new = {k: p["stamp"] for k, p in view.pages.items()}
        if any(not isinstance(v, (int, float)) for v in new.values()):
            self.fail(f"after {self.log[-1]}, a node's last_access is {next(v for v in new.values() if not isinstance(v, (int, float)))}: "
                      "it holds the tree's clock (a number) at the last match_prefix / insert through it.")
        old = {k: p["stamp"] for k, p in self.view.pages.items()} if self.view else {}
        walked = {k for k, p in self.ref.pages.items() if p.stamp == self.ref.clock} if kind in ("insert", "match") else set()
        op = "match_prefix" if kind == "match" else kind
        moved = [k for k in sorted(new, key=len) if k not in walked and k in old and new[k] != old[k]]
        if moved:
            k = moved[0]
            msg = f"after {self.log[-1]}, {_page(k, self.P)} has a new stamp (last_access {old[k]} -> {new[k]})"
            if kind.startswith("refused"):
                self.fail(f"{msg}.", "changes stamps before it refuses: raise before changing anything")
            if not walked:
                self.fail(f"{msg}.", f"stamps pages in {op}: lock, unlock and evict leave stamps alone (only "
                          "match_prefix and insert are accesses)")
            old_node = {key: p["node"] for key, p in self.view.pages.items()}
            if all(any(old_node[m] == old_node.get(w) for w in walked) for m in moved):
                self.fail(f"{msg}, but {op} did not walk through it.", f"stamps the whole node where the {op} ends "
                          "inside it: split the node there first, then stamp only the pages walked (the rest keeps its "
                          "older stamp)")
            self.fail(f"{msg}, but {op} did not walk through it: {op} stamps only the pages it walks through.")
        if not walked:
            return
        values = {new[k] for k in walked}
        top = max([new[k] for k in new if k not in walked] + list(old.values()), default=None)
        v = min(values)
        if len(values) == 1 and (top is None or v > top):
            return
        existing = [k for k in walked if k in before.pages]
        kept = [k for k in existing if new[k] == old.get(k)]
        changed = len(kept) < len(existing) or len(existing) < len(walked)  # some walked page got a new stamp
        where = (f"after {self.log[-1]}, the pages it walked have last_access {sorted(values)}, the newest stamp before "
                 f"was {top}")
        # Without a tick every walked page gets the clock's last value, which is >= every stamp before it; so a
        # kept stamp older than that, or walked pages left with different stamps, means they were not stamped.
        unstamped = kept and len(kept) == len(existing) and (len(values) > 1 or v < top)
        if kind == "match" and unstamped:
            self.fail(f"{where}.", "does not count a match as an access: match_prefix must stamp the pages it "
                      "matched with a new tick (a cache hit is a use)")
        if kind == "insert" and unstamped:
            self.fail(f"{where}.", "does not stamp the already-cached pages insert walks through: every page of the "
                      "path is a use (stamp them with the new tick too)")
        if len(values) == 1 and v == top and changed:
            self.fail(f"{where}.", f"does not tick the clock in {op}: each match_prefix and insert ticks it once, "
                      "then stamps with the new tick (newer than every stamp before)")
        if len(values) == 1 and v == top:
            self.fail(f"{where}: {op} left them as they were. It must tick the clock, then stamp every page it walks "
                      "with the new tick (newer than every stamp before): either it does not stamp them, or it does "
                      "not tick first.")
        self.fail(f"{where}: each match_prefix and insert ticks the clock once and stamps every page it walks "
                  "with the new tick (newer than every stamp before).")

    def check_evictable(self, view: _View, kind: str, before: BruteTrie, end):
        ev, want, total = self.m("evictable_size"), self.ref.evictable_size(), self.ref.total_size()
        was = before.evictable_size()
        parents = {n["parent"] for n in view.nodes[1:]}
        leaves = sum(len(n["tokens"]) for i, n in enumerate(view.nodes[1:], 1) if i not in parents and n["lock_ref"] == 0)
        mistakes = {EV_MISTAKES["total"]: total, EV_MISTAKES["pages"]: want // self.P,
                    EV_MISTAKES["locked"]: total - want, EV_MISTAKES["leaves"]: leaves}
        if kind == "lock" and end:
            mistakes[EV_MISTAKES["every lock"]] = was - len(end)
            mistakes[EV_MISTAKES["lock no count"]] = was
        if kind == "unlock" and end:
            mistakes[EV_MISTAKES["unlock no count"]] = was
        ok, names = self.judge(ev, want, mistakes)
        if ok:
            return
        fact = ""  # it tells apart the mistakes named together, and stands for the one not named
        if kind in ("lock", "unlock") and ev == was and len(names) != 1:
            fact = (f" {kind}(node) made {abs(was - want)} tokens {'un' if kind == 'lock' else ''}evictable, but "
                    "evictable_size() did not change.")
        self.fail(f"evictable_size() = {ev!r} after {self.log[-1]}, expected {want} tokens ({total} cached, "
                  f"{total - want} of them locked).{fact}", names)

    # -- operations ----------------------------------------------------------
    def insert(self, tokens: list[int], blocks: list[int] | None = None) -> int:
        blocks = self.fresh(len(tokens) // self.P) if blocks is None else blocks
        self.log.append(f"insert({tokens}, {blocks})")
        before = self.ref.copy()
        got = self.m("insert", tokens, blocks)
        expected = self.ref.insert(tokens, blocks)
        n_full = len(tokens) // self.P * self.P
        mistakes = {"returns the number of NEW tokens it added; insert returns how many leading tokens were "
                    "ALREADY cached (the caller frees its duplicates of those)": n_full - expected,
                    "counts pages, not tokens (the count is in tokens: a multiple of page_size)": expected // self.P}
        if expected == n_full:
            mistakes["counts the partial last page as cached: only whole pages are cached, so the count is a "
                     "multiple of page_size"] = len(tokens)
        self.check_value(got, expected, f"insert({tokens}, ...) returned", mistakes)
        self.after("insert", before, tokens=tokens, cached=expected)
        return expected

    def refused_insert(self, tokens: list[int], blocks: list[int]):
        """insert with fewer block ids than whole pages: ValueError, and nothing changes."""
        self.log.append(f"insert({tokens}, {blocks}) (too few block ids: must raise)")
        before = self.ref.copy()
        self.t.expect_raises(ValueError, self.method("insert"), tokens, blocks, what="RadixTree.insert",
                             why=f"{len(tokens)} tokens fill {len(tokens) // self.P} pages but only {len(blocks)} "
                                 "block ids are given; refuse (ValueError) before changing anything")
        self.after("refused insert", before)

    def match(self, tokens: list[int]):
        self.log.append(f"match_prefix({tokens})")
        before = self.ref.copy()
        got = self.m("match_prefix", tokens)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            self.fail(f"match_prefix({tokens}) returned {_short(got)}: expected a pair (block_ids, node)")
        blocks, node = got
        exp_blocks, end = self.ref.match_prefix(tokens)
        hint = ""
        if isinstance(blocks, (list, tuple)) and len(blocks) > len(exp_blocks) and list(blocks[:len(exp_blocks)]) == exp_blocks:
            hint = (f"The first {len(exp_blocks)} are right; the others are pages whose tokens do not all match"
                    + (f": the query has only {len(tokens) // self.P} whole page(s), and its partial last page never "
                       "matches." if len(blocks) > len(tokens) // self.P else "."))
        self.check_value(blocks, exp_blocks, f"the block ids match_prefix({tokens}) returned",
                         {PARTIAL: before.token_level_blocks(tokens),
                          NO_SPLIT: match_variant(self.view, tokens, self.P, "no split"),
                          COMMON_TOKENS: match_variant(self.view, tokens, self.P, "tokens")}, hint=hint)
        self.handles.append((node, end, f"match_prefix({_short(tokens)})"))
        self.after("match", before)
        return node, end, exp_blocks

    def lock(self, node, end):
        self.log.append(f"lock(the node of the match ending after {len(end)} tokens)")
        before = self.ref.copy()
        self.m("lock", _handle(node))
        self.ref.lock(end)
        self.after("lock", before, end=end, node=node)

    def unlock(self, node, end):
        self.log.append(f"unlock(the node of the match ending after {len(end)} tokens)")
        before = self.ref.copy()
        self.m("unlock", _handle(node))
        self.ref.unlock(end)
        self.after("unlock", before, end=end, node=node)

    def double_unlock(self, node, end):
        """unlock of a node that is not locked (any more): RuntimeError, and nothing changes."""
        self.log.append(f"unlock(the node of the match ending after {len(end)} tokens) again (must raise)")
        before = self.ref.copy()
        raised = self.refused("unlock", _handle(node))
        if raised:
            if not raised.is_a(RuntimeError):
                self.fail(f"unlock of a node that is not locked raised {raised.type_name}, expected RuntimeError")
            self.after("refused unlock", before, end=end, node=node)
            return
        self.fail("unlock of a node that is not locked did not raise.", "lets a lock count go below zero: raise "
                  "RuntimeError (a double unlock would let another request's pages be evicted)", end="")

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
            self.fail(f"evict({num_tokens}) freed {sorted(got)}, which includes locked pages.", LOCKED)
        inner = [k for k in freed if any(len(c) == len(k) + self.P and c[:len(k)] == k and c not in freed
                                         for c in before.pages)]
        if inner:
            self.fail(f"evict({num_tokens}) freed {sorted(got)}, but block {before.pages[inner[0]].block} holds a "
                      "page whose next page is still cached.", NOT_LEAVES)
        need = -(-num_tokens // self.P)
        needs = {"floor": num_tokens // self.P, "min one": max(1, need), "plus one": num_tokens // self.P + 1 if num_tokens > 0 else 0}
        mistakes = {name: sorted(before.copy().evict(num_tokens, by=by)) for by, name in LRU_MISTAKES.items()}
        mistakes.update({name: sorted(before.copy().evict(num_tokens, need=needs[k])) for k, name in NEED_MISTAKES.items()})
        whole = evict_whole_nodes(self.view, need)
        mistakes[WHOLE_NODES] = None if whole is None else sorted(whole)
        ok, names = self.judge(sorted(got), sorted(expected), mistakes)
        if not ok:
            short = f" and only {len(expected)} are evictable" if len(expected) < need else ""
            self.fail(f"evict({num_tokens}) freed {len(got)} page(s), blocks {sorted(got)}; expected {sorted(expected)} "
                      f"(ceil({num_tokens} / {self.P}) = {need} page(s) asked for{short})."
                      + ("" if names else " evict frees the unlocked leaf pages with the oldest last access first, one "
                         "page at a time."), names)
        # a handle on an unlocked path may lose pages now; the running requests' handles stay whole
        self.handles = [h for h in self.handles if not h[1] or (h[1] in self.ref.pages and self.ref.pages[h[1]].locks > 0)]
        self.after("evict", before)

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
Y = [31, 32, 33, 34]
Z = [41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56]
W = [71, 72, 73, 74]


def _script_split(d: _Drive):
    d.insert(A + X)                       # one node of 5 pages
    d.insert(Y)
    d.match(A + X)                        # its node must keep spanning all 5 pages across the splits below
    d.match(A[:4] + [30, 31, 32, 33])     # diverges after 1 page: split there
    d.match(A + [40, 41, 42, 43])         # diverges after 3 pages
    d.insert(A[:8] + [50, 51, 52, 53, 54])  # a second branch after page 2; its partial page is not cached
    d.match(A[:8] + [50, 51, 52, 53, 9])
    d.match(A + X)
    d.match(A)                            # page-aligned, its last page a node of its own


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


def _script_stamps(d: _Drive):
    d.insert(A)                           # stamps A's 3 pages
    d.insert(X)
    d.match(A[:4] + [99, 99, 99, 99])     # a new tick for A's first page only, newer than X's
    d.insert(A[:8])                       # ends inside A's rest: its last page keeps its old stamp
    d.match(X + [7])
    d.insert(A + Y)


def _script_refusals(d: _Drive):
    d.t.expect_raises(ValueError, "RadixTree", 0, why="a page holds at least one token: page_size must be >= 1")
    d.insert(A[:4])
    d.refused_insert(A + X, [200, 201])   # 5 pages, 2 block ids
    d.match(A)


def _script_locks(d: _Drive):
    d.insert(A[:4])
    d.insert(A)                           # two nodes: [page 1] -> [pages 2, 3]
    d.insert(X)
    d.evict(0)                            # nothing
    d.admit(A[:8] + [60, 61])             # locks A's first 2 pages: two nodes, after a split
    d.evict(100)                          # everything evictable: X, and A's unlocked last page
    d.finish(0, [62, 63, 64, 65, 66, 67])  # inserts A[:8] + 8 more tokens, unlocks
    d.evict(3)                            # 1 page: the last of the newest node
    d.evict(4)                            # 1 page
    d.evict(5)                            # 2 pages


def _script_split_locked(d: _Drive):
    d.insert(A)
    d.admit(A + [80])                     # a running request locks the node holding all of A
    d.insert(A[:4] + X)                   # another sequence splits that node after page 1 ...
    d.insert(A[:8] + [90, 91, 92, 93])    # ... and after page 2
    d.finish(0, [81, 82, 83])             # unlock through the handle taken before the splits
    d.evict(100)


def _script_lru(d: _Drive):
    d.insert(Y)
    d.insert(X)
    d.insert(W)
    d.insert(Z)                           # the biggest leaf
    d.insert(A[:8])
    d.insert(Y)                           # a re-insert is a use
    d.match(X)                            # so is a match
    d.match(A[:8])
    d.evict(4)                            # W: the least recently used (not the first inserted, Y, nor the biggest)
    d.evict(16)                           # Z
    d.insert(X[:4])                       # splits X: its first page is now newer than its second
    d.match(Y)
    d.evict(8)                            # X's second page, then A's second: X's first page, a leaf now,
    d.evict(100)                          # competes with its own (newer) stamp


def _script_leaves(d: _Drive):
    d.insert(A + X)                       # one call: every page has the same stamp
    d.insert(A + [70, 71, 72, 73])        # splits after A
    d.match(A + X)
    d.evict(4)                            # the branch [70..73] is the oldest leaf
    d.evict(4)                            # then X's LAST page, not A's
    d.evict(20)


def _script_unlock(d: _Drive):
    node, end, _ = d.match(A)             # nothing cached: the root, which lock and unlock leave alone
    d.lock(node, end)
    d.unlock(node, end)
    d.insert(A)
    d.insert(A[:8] + [5])                 # every whole page already cached, plus a partial one
    d.match(A[:6])                        # the query's partial last page does not match
    node, end, _ = d.match(A[:8])
    d.lock(node, end)
    d.unlock(node, end)
    d.double_unlock(node, end)
    node, end, _ = d.match(A)
    d.lock(node, end)
    d.lock(node, end)                     # a second request on the same path
    d.evict(12)
    d.unlock(node, end)
    d.evict(12)                           # still locked by the second
    d.unlock(node, end)
    d.evict(12)


MATCH_SCRIPTS = {"a query diverging inside a cached node (split there)": _script_split,
                 "only whole pages match": _script_pages,
                 "insert's already-cached count": _script_insert_counts,
                 "a tick per match_prefix / insert, stamping exactly the pages walked": _script_stamps,
                 "bad page_size and too few block ids are refused": _script_refusals}
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
    refuted: set = set()  # mistakes this code's right answers ruled out, in any case
    for label, (kind, what, P) in cases:
        name = label if kind == "script" else f"{label}: 40 random operations, page_size {P}"
        with t.case(name):
            d = _Drive(t, P, full, refuted)
            if kind == "script":
                what(d)
            else:
                _random_ops(d, random.Random(what), 40)


@check(points=4, section="2.1", timeout=60, cost=0.4)
def radix_match_insert(t):
    """insert / match_prefix / total_size against a brute-force trie: whole pages, splits, cached counts,
    the node match_prefix returns, the stamps both give."""
    _tree_check(t, MATCH_SCRIPTS, full=False)


@check(points=4, section="2.2", timeout=60, cost=0.6)
def radix_lock_evict(t):
    """lock / unlock / evict / evictable_size against a brute-force trie: LRU unlocked leaves, page by page."""
    _tree_check(t, EVICT_SCRIPTS, full=True)


# ---------------------------------------------------------------- 3.1 longest prefix match first


def _build(page_size: int, cached: list) -> BruteTrie:
    """The sequences `cached` in a BruteTrie, as the harness's stand_in_tree holds them (the same blocks)."""
    trie = BruteTrie(page_size)
    n = 0
    for seq in cached:
        k = len(seq) // page_size
        trie.insert(seq, list(range(n, n + k)))
        n += k
    return trie


def _lpm_reference(ref, page_size: int, cached: list, waiting: list):
    """The reference order and lookups (for t.reference: plain data in and out)."""
    tree = stand_in_tree(page_size, cached)
    return {"order": list(ref.lpm_order(tree, [list(w) for w in waiting])), "lookups": tree.lookups}


@answer_code
def _matched(page_size: int, cached: list, waiting: list) -> list[int]:
    trie = _build(page_size, cached)
    return [len(trie.match_prefix(w)[0]) for w in waiting]


@answer_code
def lpm_mistakes(page_size: int, cached: list, waiting: list) -> dict:
    m, idx = _matched(page_size, cached, waiting), range(len(waiting))
    capped = [min(k, (len(w) - 1) // page_size) for k, w in zip(m, waiting)]
    return {"admits the SHORTEST cached prefix first; lpm admits the longest first": sorted(idx, key=lambda i: m[i]),
            "orders by prompt length, not by the cached prefix (match_prefix each prompt)":
                sorted(idx, key=lambda i: -len(waiting[i])),
            "breaks ties in reverse arrival order; equal matches keep their arrival order (a stable sort)":
                sorted(idx, key=lambda i: (-m[i], -i)),
            "orders by the cached FRACTION of each prompt; lpm orders by the cached length itself":
                sorted(idx, key=lambda i: (-m[i] * page_size / len(waiting[i]), i)),
            "caps each match at len(prompt) - 1 tokens before ordering; lpm orders by the blocks match_prefix "
            "returns (keeping a token to compute is the admission's business, afterwards)":
                sorted(idx, key=lambda i: -capped[i])}


DEDUP = ("looks a repeated prompt up only once: every waiting request is looked up with match_prefix, once, "
         "and each lookup is an access for LRU")
_S = [1, 2, 3, 4, 5, 6]  # 3 pages of 2
LPM_CASES = [
    ("visible: three prefix lengths and a tie", (2, [_S], [[9, 8, 7, 6, 5, 4, 3, 2], _S[:4] + [7], _S + [8],
                                                           _S[:4] + [9, 9]])),
    ("visible: a short prompt almost all cached vs a long one with more cached", (2, [_S], [_S[:4] + [7],
                                                                                        _S + [8] * 10])),
    ("visible: a prompt cached in full, twice", (2, [_S], [_S[:4] + [7], _S, _S[:2] + [9], _S])),
    ("visible: two ties among five", (2, [_S], [[9, 9], _S[:2] + [9], _S + [8], _S + [7], [8, 8]])),
]


def random_lpm_case(rng):
    P = rng.choice([1, 2, 4])
    cached = [[rng.randint(1, 3) for _ in range(rng.randint(P, 6 * P))] for _ in range(rng.randint(1, 3))]
    waiting = []
    for _ in range(rng.randint(3, 7)):
        base = rng.choice(cached)
        waiting.append(base[:rng.randint(0, len(base))] + [rng.randint(4, 6) for _ in range(rng.randint(1, 2 * P))])
    return P, cached, waiting


def _tie_hint(got, matched: list[int]) -> str:
    """Says so when `got` orders by the match but puts equal matches out of arrival order."""
    if not (isinstance(got, list) and all(type(i) is int for i in got) and sorted(got) == list(range(len(matched)))):
        return ""
    if all(matched[a] >= matched[b] for a, b in zip(got, got[1:])):
        return ("Your order is longest match first, but equal matches are out of arrival order: keep them in "
                "arrival order (a stable sort: sorted(), or np.argsort(..., kind='stable')).")
    return ""


@check(points=2, section="3.1", timeout=30)
def lpm_order(t):
    """The admission order: longest cached prefix first (matched through the tree), ties by arrival."""
    refuted: set = set()  # mistakes an earlier right order of this code ruled out
    for label, (P, cached, waiting) in t.cases(visible=LPM_CASES, hidden=random_lpm_case, n=3):
        with t.case(f"{label}: page_size {P}, cached {cached}, waiting {waiting}"):
            expected = t.reference(_lpm_reference, P, cached, waiting)
            got = t.run(lpm_harness, t.learner("lpm_order"), P, cached, waiting,
                        what="lpm_order on a tree holding the cached sequences,")
            if got["waiting"] != waiting:
                t.fail("lpm_order changed `waiting` in place; the caller's queue stays in arrival order: return the "
                       "order of its indices and leave the list as it is")
            mistakes = lpm_mistakes(P, cached, waiting)
            right = got["order"] == expected["order"]
            t.expect(got["order"], expected["order"], "the admission order (indices into waiting)",
                     mistakes={name: v for name, v in mistakes.items() if right or name not in refuted},
                     hint=_tie_hint(got["order"], _matched(P, cached, waiting)))
            refuted.update(name for name, v in mistakes.items() if v != expected["order"])
            unique = [list(w) for i, w in enumerate(waiting) if list(w) not in [list(v) for v in waiting[:i]]]
            t.expect(sorted(got["lookups"]), sorted(expected["lookups"]),
                     "the prompts lpm_order looked up with match_prefix (sorted)", mistakes={DEDUP: sorted(unique)})


# ---------------------------------------------------------------- 5.1 your tree as the engine's prefix cache

# A small pool (16 blocks of 4 tokens) and three batch slots, and the first request generates 24 tokens: later
# requests find what earlier ones inserted, the pool runs short, and the engine evicts from the tree while
# running requests (the long one among them, its pages the oldest) hold locked paths in it.
ENGINE_KW = {"block_size": 4, "num_blocks": 16, "max_num_seqs": 3, "max_num_batched_tokens": 16,
             "enable_chunked_prefill": True}
ENGINE_MODEL = "draft"  # the tree is judged, not the model: the small shipped model, on both sides

# What the engine's own checks of a prefix cache (prefix_cache.CachingBlockManager) saw the tree do:
# (phrase in its error, read after "your code"). Facts the engine verified, so they are named even when the
# root cause (which method is wrong) can be one of several.
CACHE_ERRORS = [
    ("while a running sequence still uses it", "returned from evict() a block a running request still holds: "
                                               "evict frees only unlocked leaves (lock_ref == 0 on the path)"),
    ("which it was never given", "returned from evict() a block id that insert() was never given"),
    ("blocks asked for", "freed fewer pages in evict() than asked for, although evictable_size() said there were "
                         "enough: evict and evictable_size disagree (evict skips an unlocked leaf, or "
                         "evictable_size counts pages evict cannot free: locked ones, or inner ones)"),
    ("already cached, yet insert() said only", "returned from insert() fewer already-cached tokens than the tree "
                                               "held (so the engine handed it blocks for pages it had): insert "
                                               "returns the length of the prefix cached before the call"),
    ("total_size()", "kept total_size() out of step with the pages it holds (insert adds new pages, evict "
                     "removes them)"),
    ("more pages are evictable", "counted pages a running request holds in evictable_size()"),
    ("admitted nothing although nothing runs", "left the engine stuck: nothing runs and requests wait, yet the "
                                               "engine found no room for the first of them (in the free pool or "
                                               "in what your tree says it can evict)"),
    ("not locked", "was asked by the engine to unlock a node it had locked, and said it was not locked (lock and "
                   "unlock must walk the same path)"),
]


def engine_workload(rng) -> tuple[list[list[int]], list[int]]:
    """(prompts, output lengths): five requests behind a shared 3-page system prompt, a conversation of four
    turns (each prompt extends the last), three unrelated prompts, shuffled; the first request generates 24
    tokens, the others 2 to 6. Token ids avoid EOS (0)."""
    ids = lambda n: [rng.randrange(1, 2048) for _ in range(n)]
    system, turn = ids(12), ids(9)
    prompts = [system + ids(rng.randint(2, 9)) for _ in range(5)]
    for _ in range(4):
        prompts.append(list(turn))
        turn = turn + ids(rng.randint(3, 7))
    prompts += [ids(rng.randint(6, 14)) for _ in range(3)]
    rng.shuffle(prompts)
    lens = [rng.randint(2, 6) for _ in prompts]
    lens[0] = 24
    return prompts, lens


# Two seeded workloads: between them, every mistake tests/mutants names for this check changes the run.
VISIBLE_WORKLOADS = [("visible workload A", engine_workload(random.Random(34))),
                     ("visible workload B", engine_workload(random.Random(36)))]


def _cached_reference(ref, prompts: list, lens: list) -> dict:
    """The engine run with the reference RadixTree as its prefix cache (for t.reference: plain data)."""
    from autograder.harnesses.engine import run_engine
    return run_engine(prompts, lens, {**ENGINE_KW, "enable_prefix_caching": True, "prefix_cache": ref.RadixTree},
                      catch=True, model=ENGINE_MODEL)


@answer_code
def _plain_run(prompts: list, lens: list) -> dict:
    """The engine run with no prefix cache, here in the grader."""
    from autograder.harnesses.engine import run_engine
    return run_engine(prompts, lens, ENGINE_KW, model=ENGINE_MODEL)


def _both_references(t, prompts: list, lens: list) -> tuple[dict, dict]:
    """(the run with the reference tree, the run with no prefix cache): the tokens must not change."""
    return t.reference(_cached_reference, prompts, lens), _plain_run(prompts, lens)


def _first_request_differing(got: list, expected: list) -> str:
    i = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    return "" if i is None else f" (first difference: request {i}, yours {got[i]!r}, expected {expected[i]!r})"


# Where the engine run went wrong, the method that is wrong is found by replaying the learner's tree op by op
# against BruteTrie: the visible scripts of checks 2.1 and 2.2 (the same operations, so a student's copy answers
# them from the same recorded questions). An engine error or a wrong count says what the engine saw; the replay
# says which method did it (a match_prefix that does not split, say, leaves the engine stuck, which no eviction
# message could explain).
REPLAY_SCRIPTS = [(MATCH_SCRIPTS, False), (EVICT_SCRIPTS, True)]


def replay_cause(t) -> str:
    """The first failure of the op-by-op drive on the learner's RadixTree over the visible scripts of 2.1 and 2.2
    (page_size 4), or "" when they all pass."""
    for scripts, full in REPLAY_SCRIPTS:
        for name, script in scripts.items():
            try:
                script(_Drive(t, 4, full))
            except CaseFailed as e:
                return f"replaying your RadixTree op by op against the spec (script: {name}): {e}"
            except NotStarted:  # a method the engine run never reached is still a stub: no verdict from here
                return ""
    return ""


@contextlib.contextmanager
def blamed_on_method(t, run: dict, causes: dict):
    """Judges an engine run (`run`, the learner's); if the case fails, the failure names the RadixTree method the
    replay finds wrong first, then what the engine saw (so a tree that, say, never splits is told so, not that its
    eviction looks wrong). When the replay finds nothing, the engine's own verdict stands. `causes` keeps the
    replay's answer for the check's later cases (the same code, the same scripts)."""
    try:
        yield
    except CaseFailed as e:
        if "cause" not in causes:
            causes["cause"] = replay_cause(t)
        cause = causes["cause"]
        if not cause:
            raise
        if run["error"] is None:
            saw = str(e)
        else:
            fact = known_error(run, CACHE_ERRORS)
            saw = ((f"your tree {fact}; " if fact else "")
                   + f"the engine stopped at step {run['steps']}:\n{run['error']['tb']}")
        t.fail(f"The engine's run with your RadixTree went wrong; {cause}\n  What the engine saw: {saw}")


@check(points=3, section="5.1", timeout=120, cost=0.5)
def tree_in_engine(t):
    """LLM(..., enable_prefix_caching=True, prefix_cache=RadixTree): the same tokens as without a cache, the same
    cached tokens per request and the same hits and evictions as with the reference tree, nothing leaked."""
    from autograder.checks._engine import judged
    from autograder.harnesses.engine import run_engine
    kw = {**ENGINE_KW, "enable_prefix_caching": True, "prefix_cache": t.learner("RadixTree")}
    causes: dict = {}  # the op-by-op replay's verdict, made once (blamed_on_method)
    for label, (prompts, lens) in t.cases(visible=VISIBLE_WORKLOADS, hidden=engine_workload, n=1,
                                           label="random workload"):
        with t.case(f"{label}: {len(prompts)} prompts sharing a system prompt and a conversation, "
                    f"{ENGINE_KW['num_blocks']} KV blocks of {ENGINE_KW['block_size']}, "
                    f"{ENGINE_KW['max_num_seqs']} slots, chunked prefill"):
            got, (expected, plain) = t.run_against(partial(_both_references, t, prompts, lens), run_engine,
                                                   prompts, lens, kw, catch=True, model=ENGINE_MODEL,
                                                   what="the engine, running with your RadixTree,")
            with blamed_on_method(t, got, causes), judged(t, got, CACHE_ERRORS, who="with your RadixTree as its prefix cache"):
                t.expect(got["tokens"], plain["tokens"], "generated token ids per request: a prefix cache must not "
                         "change them (a hit reuses the KV of exactly those tokens)"
                         + _first_request_differing(got["tokens"], plain["tokens"]))
                t.expect(got["cached"], expected["cached"], "prompt tokens found in your tree, per request "
                         "(num_cached_tokens: match_prefix at admission, after the requests before it inserted and "
                         "the engine evicted)" + _first_request_differing(got["cached"], expected["cached"]))
                for key in ("hits", "queries", "evicted_blocks"):
                    t.expect(got["cache_stats"][key], expected["cache_stats"][key], f"the engine's prefix-cache {key}")
