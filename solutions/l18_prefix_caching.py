"""Lesson 18: prefix caching, by content hash (vLLM) and with a radix tree (SGLang's RadixAttention).

Many requests start with the same tokens: a system prompt, the conversation so far, an agent's trace up
to the branch it is exploring. Their KV is the same too (it depends only on the tokens before it), so a
server that keeps it can skip recomputing it. Two ways to find it again:

- Section 1: vLLM's automatic prefix caching keys every FULL KV block by a hash chain: a block's hash
  covers its parent block's hash and its own token ids, so equal hashes mean equal whole prefixes.
- Section 2: SGLang's radix tree stores the cached token sequences as a tree of segments of whole pages
  (page_size is a parameter: SGLang's default is 1 token, vLLM's block 16) whose values are KV block ids; one walk from the root finds the longest cached prefix, reference counts
  protect the paths running requests use, and LRU eviction of unlocked leaves frees memory on demand.
- Section 3: a cache-aware admission order (longest cached prefix first, SGLang's "lpm").
- Section 4 (given): three synthetic workloads on the Azure trace's arrival times and lengths, and a
  replay that drives a tree with a block budget, to measure hit rate and the prefill saved.
- Section 5 (given): the multi-turn chat through the real engine with your tree as its prefix cache
  (`engine_chat`), timed on this CPU (`SkipIdleClock`) and on the modeled GPU clock.

Units: token counts; a page is one KV block of `page_size` tokens (the engine's block_size).
"""
from __future__ import annotations

import hashlib
import heapq
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple, Sequence

# ---------------------------------------------------------------- 1. hashing full blocks

ROOT_PARENT = bytes(32)  # the "parent digest" of the first block: 32 zero bytes


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[str]:
    """Exercise 1.1: the hash chain of the FULL blocks of token_ids, as vLLM's prefix caching keys them.

    Block i holds token_ids[i * block_size:(i + 1) * block_size]; only full blocks get a hash (a partly
    filled last block still changes, so it is never shared). Its hash is

        digest_i = sha256(parent_i + tokens_i).digest()
        parent_0 = 32 zero bytes (ROOT_PARENT);  parent_i = digest_{i-1} (the 32 raw bytes)
        tokens_i = the block's ids, each as an 8-byte little-endian SIGNED int: struct.pack(f"<{n}q", *ids)
                   (signed, so that a negative placeholder id such as -1 packs too)

    Returns [digest_i.hex() for each full block]: 64-character hex strings. Because the parent's digest
    is inside, equal hashes mean equal WHOLE prefixes, not just equal blocks; and sha256 of bytes is the
    same in every process (Python's hash() of str/bytes is salted per process).

    >>> h = block_hashes([7, 7, 7, 7, 1], 2); len(h), h[0] == h[1]   # the partial [1] gets none
    (2, False)
    """
    ### BEGIN SOLUTION
    out, parent = [], ROOT_PARENT
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = [int(t) for t in token_ids[start:start + block_size]]
        parent = hashlib.sha256(parent + struct.pack(f"<{len(block)}q", *block)).digest()
        out.append(parent.hex())
    return out
    ### END SOLUTION


def hash_table_match(token_ids: Sequence[int], table: dict[str, int], block_size: int) -> list[int]:
    """The block ids of the longest cached prefix in a vLLM-style table {block hash: block id}: walk the
    chain of full-block hashes until one is missing (a helper, given; it uses your block_hashes)."""
    out = []
    for h in block_hashes(token_ids, block_size):
        if h not in table:
            break
        out.append(table[h])
    return out


# ---------------------------------------------------------------- 2. the radix tree


class TreeNode:
    """One segment of cached tokens (given; use it, or write your own node class with the same fields: the
    checks read your tree through them).

    tokens:      this segment's token ids, a whole number of pages (len == len(blocks) * page_size);
    blocks:      one KV block id per page of the segment;
    children:    child nodes keyed by their FIRST PAGE, tuple(child.tokens[:page_size]) (two children
                 never start with the same page: they would share it);
    parent:      None only for the root (which holds no tokens);
    lock_ref:    how many running requests hold a path through this node (0: evictable);
    last_access: the tree's clock at the last match_prefix / insert that walked through it.

    A plain class on purpose: the grader receives a node as a reference to your object. A dataclass or
    NamedTuple would be sent as data (its parent and children too).
    """

    def __init__(self, tokens=None, blocks=None, parent: TreeNode | None = None, lock_ref: int = 0,
                 last_access: int = 0):
        self.tokens: list[int] = list(tokens or [])
        self.blocks: list[int] = list(blocks or [])
        self.children: dict[tuple, TreeNode] = {}
        self.parent, self.lock_ref, self.last_access = parent, lock_ref, last_access

    def __repr__(self):
        return (f"TreeNode({len(self.blocks)} page(s), tokens {self.tokens[:4]}{'...' if len(self.tokens) > 4 else ''}, "
                f"lock_ref {self.lock_ref}, last_access {self.last_access})")


class RadixTree:
    """Exercise 2.1 and 2.2: a prefix cache of KV blocks as a radix tree (SGLang's RadixAttention).

    Keys are token ids matched in whole PAGES of page_size tokens (a page is one KV block); values are KV
    block ids, one per page. Each node holds a segment of one or more pages (TreeNode); the path from the
    root to a node spells a cached token sequence. A node is split where two cached sequences diverge.

    Semantics, page by page (what the checks compare, so any node layout that behaves the same is right):
    - the tree caches a set of page-aligned token sequences closed under prefixes;
    - a clock ticks once per match_prefix and once per insert; each of those calls stamps every page it
      walks through (matched or inserted) with the new tick; lock, unlock and evict leave stamps alone;
    - a page is locked while some lock(node) whose path covers it is not yet undone by unlock(node);
    - evict frees unlocked LEAF pages (pages with no cached successor), least recently stamped first, one
      page at a time; when a node's last page goes, its parent's last page may become a leaf.
    RadixTree(page_size) raises ValueError if page_size < 1. The checks read the tree itself through the
    fields of TreeNode (self.root; each node's tokens, blocks, children, parent, lock_ref, last_access)
    and compare it page by page: the pages held, each page's lock_ref and stamp, and the tokens each node
    match_prefix returned still ends at. Of the stamps only their ORDER counts (start the clock anywhere).

    How an engine uses it as its prefix cache (block ids are the engine's KV blocks; the tree OWNS the
    blocks it holds and gives them back only through evict):
      admission:   blocks, node = tree.match_prefix(prompt); tree.lock(node)
                   the request's block table starts with (some of) `blocks`: their tokens count as computed,
                   so prefill skips them (keep at least the last prompt token to compute: its logits give the
                   first output token). When the pool lacks free blocks: pool.extend(tree.evict(tokens)).
      finish:      cached = tree.insert(tokens_with_kv, block_table)   # the tree takes the new full pages
                   free the request's own duplicates, block_table[used : cached // page_size], where `used`
                   = how many of the matched blocks it took over; free its partly filled last block;
                   tree.unlock(node)                                  # the node from admission
      (chunked prefill, or a long decode: insert when blocks fill, then lock the new node and unlock the
      old one; a node handle stays valid across later splits: it always ends at the same token.)
    """

    def __init__(self, page_size: int):
        ### BEGIN SOLUTION
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.root = TreeNode(lock_ref=1)  # the root holds nothing and is never evicted
        self._clock = 0
        self._total = 0    # tokens cached
        self._locked = 0   # tokens in nodes with lock_ref > 0 (root excluded)
        ### END SOLUTION

    def _common_pages(self, node: TreeNode, tokens: Sequence[int], start: int) -> int:
        """Exercise 2.1 (a helper you may use): how many whole pages of node.tokens equal tokens[start:]
        page by page, from the node's first page on (0 if the first page already differs)."""
        ### BEGIN SOLUTION
        P = self.page_size
        n = min(len(node.blocks), (len(tokens) - start) // P)
        if list(tokens[start:start + n * P]) == node.tokens[:n * P]:
            return n  # the common case, compared in one go
        k = 0
        while k < n and list(tokens[start + k * P:start + (k + 1) * P]) == node.tokens[k * P:(k + 1) * P]:
            k += 1
        return k
        ### END SOLUTION

    def _split(self, node: TreeNode, n_pages: int) -> TreeNode:
        """Exercise 2.1 (a helper you may use): split `node` after its first n_pages pages
        (0 < n_pages < its page count) and return the new node holding those first pages.

        The new node takes node's place under its parent and becomes node's parent; it inherits node's
        lock_ref and last_access. `node` itself keeps the REST of the pages: a handle a running request
        holds on `node` then still ends at the same token, and unlock(node) still walks the whole path.
        (Only lock sets lock_ref, so check 2.2 is the one that tests its inheritance.)
        """
        ### BEGIN SOLUTION
        P = self.page_size
        head = TreeNode(tokens=node.tokens[:n_pages * P], blocks=node.blocks[:n_pages], parent=node.parent,
                        lock_ref=node.lock_ref, last_access=node.last_access)
        node.parent.children[tuple(head.tokens[:P])] = head
        node.tokens, node.blocks = node.tokens[n_pages * P:], node.blocks[n_pages:]
        node.parent = head
        head.children = {tuple(node.tokens[:P]): node}
        return head
        ### END SOLUTION

    def match_prefix(self, tokens: Sequence[int]) -> tuple[list[int], TreeNode]:
        """Exercise 2.1: the longest cached prefix of `tokens`, in whole pages.

        Returns (block_ids, node): the block ids of the matched pages, in order (len(block_ids) *
        page_size tokens matched), and the node where the match ends (the root if nothing matched). A
        page matches only if ALL its page_size tokens do; a partial last page of `tokens` never matches.
        If the match ends inside a node, split it there, so that `node` ends exactly at the match (lock
        then protects exactly the matched pages). Ticks the clock and stamps the matched pages.

        >>> t = RadixTree(2); t.insert([1, 2, 3, 4], [10, 11])
        0
        >>> t.match_prefix([1, 2, 3, 9])[0], t.match_prefix([1, 2, 3])[0]
        ([10], [10])
        """
        ### BEGIN SOLUTION
        self._clock += 1
        node, pos, blocks = self.root, 0, []
        node.last_access = self._clock
        P = self.page_size
        while pos + P <= len(tokens):
            child = node.children.get(tuple(tokens[pos:pos + P]))
            if child is None:
                break
            k = self._common_pages(child, tokens, pos)
            if k < len(child.blocks):
                child = self._split(child, k)  # the suffix keeps its own (older) stamp
            child.last_access = self._clock
            blocks += child.blocks
            node, pos = child, pos + k * P
        return blocks, node
        ### END SOLUTION

    def insert(self, tokens: Sequence[int], block_ids: Sequence[int]) -> int:
        """Exercise 2.1: cache the full pages of `tokens`, page i's KV in block_ids[i].

        Only the first len(tokens) // page_size pages are cached (block_ids must have at least that many
        entries, else ValueError before anything changes; extra ones, such as a partly filled last block,
        are ignored: the caller keeps them).
        Pages already cached keep the tree's own block ids; a divergence inside a node splits it; the
        new pages become one new node. Ticks the clock and stamps every page of the path.
        Returns how many leading tokens were ALREADY cached (a multiple of page_size): the caller frees
        its own copies of those pages (except the ones it got from match_prefix: those are the tree's).

        >>> t = RadixTree(2); t.insert([1, 2, 3, 4, 5], [10, 11, 12]), t.insert([1, 2, 7, 8], [20, 21])
        (0, 2)
        """
        ### BEGIN SOLUTION
        P = self.page_size
        n = len(tokens) // P
        if len(block_ids) < n:
            raise ValueError(f"{len(tokens)} tokens fill {n} pages of {P} but only {len(block_ids)} block ids given")
        self._clock += 1
        node, page = self.root, 0
        node.last_access = self._clock
        while page < n:
            child = node.children.get(tuple(tokens[page * P:(page + 1) * P]))
            if child is None:
                new = TreeNode(tokens=[int(x) for x in tokens[page * P:n * P]],
                               blocks=[int(b) for b in block_ids[page:n]], parent=node, last_access=self._clock)
                node.children[tuple(new.tokens[:P])] = new
                self._total += (n - page) * P
                return page * P
            k = self._common_pages(child, tokens, page * P)
            if k < len(child.blocks):
                child = self._split(child, k)
            child.last_access = self._clock
            node, page = child, page + k
        return n * P
        ### END SOLUTION

    def lock(self, node: TreeNode) -> None:
        """Exercise 2.2: a running request uses the path root -> node: add one reference to every node on
        it (the root excluded), so that none of its pages can be evicted. lock(root) does nothing."""
        ### BEGIN SOLUTION
        while node is not self.root:
            if node.lock_ref == 0:
                self._locked += len(node.tokens)
            node.lock_ref += 1
            node = node.parent
        ### END SOLUTION

    def unlock(self, node: TreeNode) -> None:
        """Exercise 2.2: undo one lock(node). Raises RuntimeError (changing nothing) if node is not locked
        (a double unlock would let another request's pages be evicted). unlock(root) does nothing."""
        ### BEGIN SOLUTION
        if node is not self.root and node.lock_ref <= 0:
            raise RuntimeError("unlock of a node that is not locked")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._locked -= len(node.tokens)
            node = node.parent
        ### END SOLUTION

    def evict(self, num_tokens: int) -> list[int]:
        """Exercise 2.2: free at least num_tokens tokens of KV, the least recently used first.

        Frees ceil(num_tokens / page_size) pages (none for evict(0); all evictable ones if fewer), one page
        at a time: always the last page of the unlocked leaf node (no children, lock_ref 0) with the oldest
        last_access. A leaf gives up its pages from its end; an emptied leaf leaves the tree, and its parent
        may become a leaf (then it competes with its own stamp). Locked pages and pages with a cached
        successor are never freed. Returns the freed block ids (their order does not matter); the caller
        reuses them.
        """
        ### BEGIN SOLUTION
        P = self.page_size
        need = max(0, -(-num_tokens // P))
        heap, stack = [], [self.root]  # heap of (last_access, tiebreak, leaf): unlocked leaves, oldest first
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n is not self.root and not n.children and n.lock_ref == 0:
                heapq.heappush(heap, (n.last_access, id(n), n))
        freed: list[int] = []
        while len(freed) < need and heap:
            _, _, leaf = heapq.heappop(heap)
            key = tuple(leaf.tokens[:P])
            take = min(need - len(freed), len(leaf.blocks))
            for _ in range(take):
                freed.append(leaf.blocks.pop())
            del leaf.tokens[len(leaf.tokens) - take * P:]
            self._total -= take * P
            if leaf.blocks:
                continue  # still a leaf, still the oldest: the loop ends here (need is met)
            parent = leaf.parent
            del parent.children[key]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed
        ### END SOLUTION

    def evictable_size(self) -> int:
        """Exercise 2.2: tokens in unlocked pages (what evict could free now)."""
        ### BEGIN SOLUTION
        return self._total - self._locked
        ### END SOLUTION

    def total_size(self) -> int:
        """Exercise 2.1: tokens cached in the tree (locked or not)."""
        ### BEGIN SOLUTION
        return self._total
        ### END SOLUTION

    def pretty(self, max_tokens: int = 6) -> str:
        """The tree as indented text: each node's first token ids, pages, lock_ref and last_access (given)."""
        lines = []

        def walk(n: TreeNode, depth: int):
            for child in n.children.values():
                head = ", ".join(map(str, child.tokens[:max_tokens])) + (", ..." if len(child.tokens) > max_tokens else "")
                lines.append(f"{'  ' * depth}[{head}]  {len(child.blocks)} page(s), blocks {child.blocks[:4]}"
                             f"{'...' if len(child.blocks) > 4 else ''}, lock_ref {child.lock_ref}, "
                             f"last_access {child.last_access}")
                walk(child, depth + 1)

        walk(self.root, 0)
        return "\n".join(lines) or "(empty)"


# ---------------------------------------------------------------- 3. cache-aware admission


def lpm_order(tree, waiting: Sequence[Sequence[int]]) -> list[int]:
    """Exercise 3.1: SGLang's "lpm" (longest prefix match) admission order.

    tree: a prefix cache with match_prefix(tokens) -> (block_ids, node) (your RadixTree); use only
          match_prefix (and page_size): the check passes a stand-in tree that has nothing else;
    waiting: the waiting requests' prompts (token id lists), in arrival order; leave the list as it is.
    Returns the indices of `waiting` in the order to admit them: the longest cached prefix first (the
    number of matched blocks as match_prefix returns them; the same order as matched tokens), ties in
    arrival order. Requests that share a cached prefix then run while it is cached, before other
    requests' pages push it out. Look each prompt up with match_prefix exactly once, a repeated prompt
    too: the lookups count as accesses for LRU (as in SGLang).

    Example: cached prefixes of 0, 3 and 3 blocks -> [1, 2, 0].
    """
    ### BEGIN SOLUTION
    matched = [len(tree.match_prefix(list(p))[0]) for p in waiting]
    return sorted(range(len(waiting)), key=lambda i: -matched[i])
    ### END SOLUTION


# ---------------------------------------------------------------- 4. workloads on the Azure trace (given)


class Call(NamedTuple):
    """One LLM call of a synthetic workload. arrival: seconds (the trace's); prompt / output: token ids;
    after: the index of the call whose answer this prompt extends (-1: none); it cannot start before that
    call has finished (a user answers a reply only once it has arrived)."""
    arrival: float
    prompt: list[int]
    output: list[int]
    after: int


VOCAB = 32_000  # synthetic token ids are drawn from 1 .. VOCAB - 1 (0 is left out, as an EOS id would be)


def _rows(n: int, seed: int, trace_name: str):
    from reference_engine.sim import trace
    return trace.sample(n, seed=seed, trace=trace_name)


def _chained_workload(n: int, seed: int, continue_p: float, branch_p: float, trace_name: str) -> list[Call]:
    """Calls that extend earlier calls: see multi_turn_workload and agent_workload."""
    import numpy as np

    rng = np.random.default_rng(seed)
    calls: list[Call] = []
    ends: list[int] = []          # per call: len(prompt) + len(output), the context a continuation extends
    groups: list[list[int]] = []  # per conversation / agent task: its calls, oldest first
    for row in _rows(n, seed, trace_name):
        out = rng.integers(1, VOCAB, row.output_tokens).tolist()
        limit = row.prompt_tokens  # a call can extend an earlier one only if that one is shorter than this prompt
        if branch_p:
            open_groups = [g for g in groups if any(ends[i] < limit for i in g)]
        else:
            open_groups = [g for g in groups if ends[g[-1]] < limit]
        if open_groups and rng.random() < continue_p:
            g = open_groups[int(rng.integers(len(open_groups)))]
            options = [i for i in g if ends[i] < limit]
            parent = options[int(rng.integers(len(options)))] if rng.random() < branch_p else options[-1]
            history = calls[parent].prompt + calls[parent].output
            prompt = history + rng.integers(1, VOCAB, limit - len(history)).tolist()
            g.append(len(calls))
        else:
            parent, prompt = -1, rng.integers(1, VOCAB, limit).tolist()
            groups.append([len(calls)])
        calls.append(Call(row.arrival, prompt, out, parent))
        ends.append(len(prompt) + len(out))
    return calls


def multi_turn_workload(n: int = 300, seed: int = 0, mean_turns: float = 4.0, trace_name: str = "conv") -> list[Call]:
    """Multi-turn chat on n consecutive Azure trace requests (seeded window; arrivals, prompt and output
    lengths kept exactly). Each request is one turn. With probability 1 - 1/mean_turns it continues a
    conversation, picked at random among those whose last turn (prompt + answer) is shorter than this
    request's prompt: its prompt is that whole conversation plus a new user message filling the rest of
    the trace's prompt length; otherwise it opens a new conversation. A turn waits for the turn it
    extends to finish. Token ids are seeded random (content does not matter, only which tokens repeat)."""
    return _chained_workload(n, seed, 1.0 - 1.0 / mean_turns, 0.0, trace_name)


def agent_workload(n: int = 300, seed: int = 0, mean_calls: float = 8.0, branch_p: float = 0.4,
                   trace_name: str = "conv") -> list[Call]:
    """A branching agent: tasks whose calls form a TREE of continuations. Like multi_turn_workload (each
    trace request is one call, lengths and arrivals kept), but a call continues a task with probability
    1 - 1/mean_calls, and then extends, with probability branch_p, a random earlier call of that task
    (a retry, another tool, a search branch) instead of the latest one; so siblings share their parent's
    whole context. A call waits for the call it extends to finish."""
    return _chained_workload(n, seed, 1.0 - 1.0 / mean_calls, branch_p, trace_name)


def system_prompt_workload(n: int = 300, seed: int = 0, system_tokens: int = 2000, num_prompts: int = 4,
                           trace_name: str = "conv") -> list[Call]:
    """A shared system prompt: num_prompts applications, each with its own system prompt of system_tokens
    tokens, chosen per request with Zipf weights 1, 1/2, 1/3, ... (a few popular apps). Each request is
    one of n consecutive Azure trace requests (arrival and output length kept): its prompt is the app's
    system prompt followed by a user part as long as the trace's prompt. No call waits for another."""
    import numpy as np

    rng = np.random.default_rng(seed)
    systems = [rng.integers(1, VOCAB, system_tokens).tolist() for _ in range(num_prompts)]
    w = np.array([1.0 / (k + 1) for k in range(num_prompts)])
    calls = []
    for row in _rows(n, seed, trace_name):
        app = int(rng.choice(num_prompts, p=w / w.sum()))
        prompt = systems[app] + rng.integers(1, VOCAB, row.prompt_tokens).tolist()
        calls.append(Call(row.arrival, prompt, rng.integers(1, VOCAB, row.output_tokens).tolist(), -1))
    return calls


WORKLOADS = {"multi-turn chat": multi_turn_workload, "shared system prompt": system_prompt_workload,
             "branching agent": agent_workload}


def shared_upper_bound(calls: Sequence[Call], block_size: int = 16) -> float:
    """An upper bound on the hit rate: for each call, the longest page-aligned prefix of its prompt already
    seen in an EARLIER call's prompt + answer (at most prompt - 1 tokens), over all prompt tokens; as if
    every call's KV were cached the moment it arrived and never evicted (a server caches a call's pages
    only once it computed them, so calls running at the same time miss each other). Computed with a set
    of block hashes (your block_hashes)."""
    seen: set[str] = set()
    hit = total = 0
    for c in calls:
        hs = block_hashes(c.prompt, block_size)
        k = 0
        while k < len(hs) and hs[k] in seen:
            k += 1
        hit += min(k, (len(c.prompt) - 1) // block_size) * block_size
        total += len(c.prompt)
        seen.update(block_hashes(c.prompt + c.output[:-1], block_size))
    return hit / total if total else 0.0


# ---------------------------------------------------------------- 4. the replay (given)


@dataclass
class _Running:
    call: int
    table: list[int]     # KV block ids: the tree's blocks it took over, then its own
    used: int            # how many of those are the tree's (matched pages it took over)
    node: object         # what lock() was given at admission (None without a tree)
    generated: int = 0


def _release(tree, node) -> None:
    """A call that is not admitted after all gives its lock back."""
    if tree is not None:
        tree.unlock(node)


def prefill_seconds(tokens: int, cached: int, model: str = "llama-3-8b", chip: str = "H100") -> float:
    """Modeled seconds of one prefill of `tokens` new tokens after `cached` cached ones, alone in a step,
    without the fixed per-step overhead (reference_engine.sim.gpu_model.step_time)."""
    from reference_engine.sim.gpu_model import CHIPS, MODELS, Composition, step_time
    if tokens <= 0:
        return 0.0
    return step_time(MODELS[model], CHIPS[chip], Composition(prefills=((tokens, cached),)), overhead_s=0.0).time_s


def _give_back(tree, call: Call, r: _Running, free: deque, P: int) -> None:
    """A finished call's blocks: with a tree, it inserts prompt + output[:-1] (the tokens whose KV exists: the
    last sampled token was never fed back), which takes the new full pages; the call frees its duplicates of
    pages the tree already held and its partly filled last block (and any unused), then unlocks. Without a
    tree every block goes back to the pool."""
    if tree is None:
        free.extend(r.table)
        return
    tokens = call.prompt + call.output[:-1]
    have = tree.insert(tokens, r.table) // P
    free.extend(r.table[r.used:max(have, r.used)])    # duplicates of pages the tree already held
    free.extend(r.table[len(tokens) // P:])           # the partly filled last block (and unused)
    tree.unlock(r.node)


def _retire_finished(calls: Sequence[Call], running: dict, tree, free: deque, P: int, done: list[bool],
                     finish: list[float], now: float) -> bool:
    """Step (1) of replay: every call that generated its whole output leaves `running` at `now` and gives its
    blocks back (_give_back). Returns whether any did."""
    finished = [i for i, r in running.items() if r.generated == len(calls[i].output)]
    for i in finished:
        r = running.pop(i)
        finish[i] = now
        _give_back(tree, calls[i], r, free, P)
        done[i] = True
    return bool(finished)


def _ready_calls(calls: Sequence[Call], waiting: list[int], done: list[bool], tree, policy: str) -> list[int]:
    """The waiting calls that may be sent (no parent, or a parent that finished), in admission order:
    arrival ("fcfs"), or lpm_order over their prompts ("lpm", with a tree)."""
    ready = [i for i in waiting if calls[i].after < 0 or done[calls[i].after]]
    if policy == "lpm" and tree is not None and len(ready) > 1:
        ready = [ready[k] for k in lpm_order(tree, [calls[i].prompt for i in ready])]
    return ready


def _match(tree, prompt: Sequence[int]) -> tuple[list[int], object]:
    """A call's cached prefix at admission: the tree's blocks for it and their node, now locked (without a
    tree: none)."""
    if tree is None:
        return [], None
    blocks, node = tree.match_prefix(prompt)
    tree.lock(node)
    return blocks, node


def _evict_for(tree, free: deque, need: int, P: int) -> int:
    """Evict from the tree into the pool until `need` blocks are free, if the tree has that many unlocked;
    returns how many blocks were evicted."""
    if len(free) >= need or tree is None:
        return 0
    got = tree.evict((need - len(free)) * P)
    free.extend(got)
    return len(got)


def _run_step(calls: Sequence[Call], running: dict, prefills: list, shape, gpu, first: list[float],
              now: float) -> float:
    """Step (3) of replay: the calls admitted this step prefill their uncached tokens, the others decode one
    token; each call's first token is sampled at the end of the step that prefilled it. Returns the time
    the step ends."""
    from reference_engine.sim.gpu_model import Composition, step_time
    admitted = {i for i in running if running[i].generated == 0}
    decodes = [len(calls[i].prompt) + r.generated - 1 for i, r in running.items() if i not in admitted]
    now += step_time(shape, gpu, Composition(prefills=tuple(prefills), decodes=tuple(decodes))).time_s
    for i in admitted:
        first[i] = now  # its whole prefill ran in this step, which samples its first token
    for r in running.values():
        r.generated += 1
    return now


def _replay_totals(calls: Sequence[Call], cached: list[int], first: list[float], finish: list[float],
                   evicted: int, steps: int, now: float, model: str, chip: str) -> dict:
    """What replay returns: the totals and the per-call lists (see replay)."""
    prompt_tokens = sum(len(c.prompt) for c in calls)
    return {"prompt_tokens": prompt_tokens, "cached_tokens": sum(cached),
            "hit_rate": sum(cached) / prompt_tokens if prompt_tokens else 0.0, "evicted_blocks": evicted,
            "steps": steps, "modeled_s": now,
            "prefill_s": sum(prefill_seconds(len(c.prompt) - k, k, model, chip) for c, k in zip(calls, cached)),
            "prefill_s_nocache": sum(prefill_seconds(len(c.prompt), 0, model, chip) for c in calls),
            "cached": cached, "prompt": [len(c.prompt) for c in calls],
            "ttft": [first[i] - max(c.arrival, finish[c.after] if c.after >= 0 else 0.0) for i, c in enumerate(calls)]}


def replay(calls: Sequence[Call], tree=None, num_blocks: int = 30_000, block_size: int = 16, max_running: int = 64,
           max_batched_tokens: int = 16_384, policy: str = "fcfs", model: str = "llama-3-8b",
           chip: str = "H100") -> dict:
    """Replay `calls` through a prefix cache `tree` (a fresh RadixTree(block_size), or None: no cache)
    with a pool of num_blocks KV blocks, on the modeled GPU clock. Not the engine: a simple admission loop.

    Every step: (1) finished calls insert prompt + output[:-1] (the tokens whose KV exists: the last sampled
    token was never fed back) into the tree, free their duplicate and partial blocks and unlock; (2) calls
    that have arrived (and whose `after` call has finished) are admitted in `policy` order ("fcfs": arrival;
    "lpm": your lpm_order) while fewer than max_running run and their new prompt tokens fit
    max_batched_tokens (the first always does): match_prefix + lock; cached = the matched pages, at most
    prompt - 1 tokens; the call reserves blocks for its whole prompt + output at once (a replay knows the
    output length), evicting from the tree when the pool is short, and waits (unlocking) if that is not
    enough; FCFS stops at the first that does not fit; (3) the step runs: the admitted prefill their
    uncached tokens, the others decode one token; its time is gpu_model.step_time of that composition.
    Arrivals are the trace's seconds on that clock.

    Returns totals: prompt_tokens, cached_tokens, hit_rate (their ratio), evicted_blocks, steps,
    modeled_s (the makespan), prefill_s / prefill_s_nocache (each call's prefill alone, with and without
    its cached prefix, summed: prefill_seconds), and per call lists "cached", "prompt" and "ttft" (modeled
    seconds from when the call could be sent, its arrival or its parent's finish if later, to the end of
    the step that prefilled it: queueing included, the coarse admission of this loop, not the engine's).
    """
    from reference_engine.sim.gpu_model import CHIPS, MODELS
    if policy not in ("fcfs", "lpm"):
        raise ValueError(f"policy must be 'fcfs' or 'lpm', got {policy!r}")
    P, shape, gpu = block_size, MODELS[model], CHIPS[chip]
    free = deque(range(num_blocks))
    pending = deque(sorted(range(len(calls)), key=lambda i: calls[i].arrival))
    waiting: list[int] = []
    running: dict[int, _Running] = {}
    done = [False] * len(calls)
    cached = [0] * len(calls)
    first, finish = [0.0] * len(calls), [0.0] * len(calls)  # modeled seconds: first token, last token
    now, steps, evicted, changed, ready = 0.0, 0, 0, True, []
    while pending or waiting or running:
        changed = _retire_finished(calls, running, tree, free, P, done, finish, now) or changed
        while pending and calls[pending[0]].arrival <= now:
            waiting.append(pending.popleft())
            changed = True
        if changed:  # reorder only when the queue or the cache changed since the last step
            ready = _ready_calls(calls, waiting, done, tree, policy)
        changed, prefills, budget = False, [], max_batched_tokens
        for i in list(ready):
            if len(running) >= max_running:
                break
            c = calls[i]
            blocks, node = _match(tree, c.prompt)
            used = min(len(blocks), (len(c.prompt) - 1) // P)  # the matched pages it takes over: keep a token to compute
            need = -(-(len(c.prompt) + len(c.output)) // P) - used
            new_tokens = len(c.prompt) - used * P
            if prefills and new_tokens > budget:
                _release(tree, node)
                break
            got = _evict_for(tree, free, need, P)
            evicted += got
            changed = changed or got > 0
            if len(free) < need:
                _release(tree, node)
                break
            running[i] = _Running(i, list(blocks[:used]) + [free.popleft() for _ in range(need)], used, node)
            waiting.remove(i)
            ready.remove(i)
            cached[i] = used * P
            prefills.append((new_tokens, used * P))
            budget -= new_tokens
            changed = True
        if not running:
            if pending:
                now = max(now, calls[pending[0]].arrival)
                continue
            if not waiting:
                break  # the last calls retired
            raise RuntimeError("a call needs more KV blocks than the pool holds, even with the cache empty")
        now = _run_step(calls, running, prefills, shape, gpu, first, now)
        steps += 1
    held = tree.total_size() // P if tree is not None else 0
    if len(free) + held != num_blocks:
        raise RuntimeError(f"block accounting is off: {len(free)} free + {held} in the tree != {num_blocks}: "
                           "does insert return the already-cached count, and evict the block ids it frees?")
    return _replay_totals(calls, cached, first, finish, evicted, steps, now, model, chip)


# ---------------------------------------------------------------- 5. the engine (given)


class SkipIdleClock:
    """An engine clock in wall seconds (time.perf_counter) that skips idle time: advance_to(t), which a
    replay calls when nothing runs before the next arrival, jumps forward instead of sleeping. Steps are
    timed for real; the trace's quiet seconds cost nothing (and no step runs in them, so no latency
    changes)."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        return time.perf_counter() + self.offset

    def advance_to(self, t: float) -> None:
        self.offset += max(0.0, t - self())


def engine_chat(engine, calls: Sequence[Call], vocab: int) -> dict:
    """Replay `calls` (a multi_turn_workload or agent_workload) through an LLMEngine on its clock, as users
    would send them: call i is sent at its trace arrival, or when the call it extends has finished if that
    is later. A continuation's prompt is what its parent was sent, then the answer the ENGINE generated for
    it (in place of the workload's synthetic answer, of the same length), then its own new tokens; so a
    cached conversation is found again exactly as a chat client resends it. Token ids are mapped into the
    model's vocabulary as 1 + id % (vocab - 1) (0 stays unused, as EOS). Greedy, EOS ignored: call i
    generates len(output) tokens.

    Returns per call "ttft" (first token time - send time, engine clock seconds), "cached" (prompt tokens
    found in the prefix cache) and "prompt" (its length); "prefill_tokens" (prompt tokens the engine
    computed, from its step stats) and "seconds" (the run, on the engine's clock)."""
    from reference_engine import SamplingParams
    from reference_engine.sim.replay import _wait_until

    n = len(calls)
    mapped = [[1 + t % (vocab - 1) for t in c.prompt] for c in calls]
    sent, answer, finish = [None] * n, [None] * n, [None] * n
    results, index, pending = {}, {}, sorted(range(n), key=lambda i: calls[i].arrival)
    t0 = engine.clock()

    def send_time(i):  # None while the call it extends is still running
        p = calls[i].after
        if p < 0:
            return calls[i].arrival
        return None if finish[p] is None else max(calls[i].arrival, finish[p])

    while len(results) < n:
        now = engine.clock() - t0
        for i in [i for i in pending if send_time(i) is not None and send_time(i) <= now]:
            pending.remove(i)
            p, prompt = calls[i].after, mapped[i]
            if p >= 0:  # what the parent was sent + the parent's real answer + this turn's own tokens
                prompt = sent[p] + answer[p] + prompt[len(calls[p].prompt) + len(calls[p].output):]
            sent[i] = prompt
            params = SamplingParams(temperature=0, max_tokens=len(calls[i].output), ignore_eos=True)
            index[engine.add_request(prompt, params, arrival_time=t0 + send_time(i))] = i
        if engine.has_unfinished():
            for out in engine.step():
                if out.output is not None and out.request_id in index:
                    i, m = index[out.request_id], out.output.metrics
                    answer[i], finish[i] = list(out.output.token_ids), m.finish_time - t0
                    results[i] = {"ttft": m.first_token_time - m.arrival_time, "cached": m.num_cached_tokens,
                                  "prompt": len(sent[i])}
        else:
            _wait_until(engine.clock, t0 + min(t for t in map(send_time, pending) if t is not None))
    return {"ttft": [results[i]["ttft"] for i in range(n)], "cached": [results[i]["cached"] for i in range(n)],
            "prompt": [results[i]["prompt"] for i in range(n)],
            "prefill_tokens": sum(s.num_prefill_tokens for s in engine.step_stats),
            "seconds": engine.clock() - t0}
