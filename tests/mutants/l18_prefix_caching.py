"""Plausible wrong answers for lesson 18; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here are
prefixed `_m_`. A wrong RadixTree is a subclass of the right one with one method changed, given as a
factory function of the class's name (the check calls RadixTree(page_size))."""
import hashlib
import heapq
import struct

from solutions import l18_prefix_caching as sol  # graded as source, this line becomes `sol = sol`
from tests.mutants import mutant

# -- 1.1 block hashes -------------------------------------------------------------------------------


@mutant(check="block_hashes", message="ignores the parent")
def block_hashes(token_ids, block_size):
    out = []
    for s in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[s:s + block_size]  # hashed alone: no parent digest in it
        out.append(hashlib.sha256(bytes(32) + struct.pack(f"<{block_size}q", *block)).hexdigest())
    return out


@mutant(check="block_hashes", message="hashes the partial last block")
def block_hashes(token_ids, block_size):  # noqa: F811 - one mutant per definition
    out, parent = [], bytes(32)
    for s in range(0, len(token_ids), block_size):  # the last, partial block too
        block = token_ids[s:s + block_size]
        parent = hashlib.sha256(parent + struct.pack(f"<{len(block)}q", *block)).digest()
        out.append(parent.hex())
    return out


@mutant(check="block_hashes", message="chains the parent's hex text")
def block_hashes(token_ids, block_size):  # noqa: F811
    out, parent = [], bytes(32)
    for s in range(0, len(token_ids) - block_size + 1, block_size):
        h = hashlib.sha256(parent + struct.pack(f"<{block_size}q", *token_ids[s:s + block_size])).hexdigest()
        out.append(h)
        parent = h.encode()
    return out


@mutant(check="block_hashes", message="ids pack as SIGNED")
def block_hashes(token_ids, block_size):  # noqa: F811
    out, parent = [], bytes(32)
    for s in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[s:s + block_size]  # unsigned: the same bytes as "<q" for ids >= 0, an error below 0
        parent = hashlib.sha256(parent + struct.pack(f"<{block_size}Q", *block)).digest()
        out.append(parent.hex())
    return out


# -- 2.1 match and insert ---------------------------------------------------------------------------

def _m_nodes(root):
    stack, out = [root], []
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


class _m_PartialPages(sol.RadixTree):
    """Compares token by token and rounds the matched tokens UP to pages: a page that matches only partly
    (the query's partial last page too) counts."""

    def match_prefix(self, tokens):
        self._clock += 1
        node, pos, blocks, P = self.root, 0, [], self.page_size
        while pos < len(tokens):
            child = next((c for c in node.children.values() if c.tokens[0] == tokens[pos]), None)
            if child is None:
                break
            n = 0
            while n < len(child.tokens) and pos + n < len(tokens) and child.tokens[n] == tokens[pos + n]:
                n += 1
            k = -(-n // P)
            if k < len(child.blocks):
                child = self._split(child, k)
            child.last_access = self._clock
            blocks += child.blocks
            node, pos = child, pos + k * P
            if n < k * P:
                break
        return blocks, node


class _m_NoSplit(sol.RadixTree):
    """Never splits in match_prefix: a match ending inside a node returns the whole node's blocks."""

    def match_prefix(self, tokens):
        self._clock += 1
        node, pos, blocks, P = self.root, 0, [], self.page_size
        while pos + P <= len(tokens):
            child = node.children.get(tuple(tokens[pos:pos + P]))
            if child is None:
                break
            k = self._common_pages(child, tokens, pos)
            child.last_access = self._clock
            blocks += child.blocks
            node, pos = child, pos + k * P
            if k < len(child.blocks):
                break
        return blocks, node


class _m_InsertCountsNew(sol.RadixTree):
    def insert(self, tokens, block_ids):
        cached = super().insert(tokens, block_ids)
        return len(tokens) // self.page_size * self.page_size - cached  # the tokens it added


class _m_InsertPartial(sol.RadixTree):
    """Caches the partial last page too (rounds the page count up)."""

    def insert(self, tokens, block_ids):
        P = self.page_size
        n = -(-len(tokens) // P)
        self._clock += 1
        node, page = self.root, 0
        while page < n:
            child = node.children.get(tuple(tokens[page * P:(page + 1) * P]))
            if child is None:
                new = sol.TreeNode(tokens[page * P:], block_ids[page:n], node, 0, self._clock)
                node.children[tuple(new.tokens[:P])] = new
                self._total += len(new.tokens)
                return page * P
            k = self._common_pages(child, tokens, page * P)
            if k < len(child.blocks):
                child = self._split(child, k)
            child.last_access = self._clock
            node, page = child, page + max(k, 1)
        return len(tokens)


@mutant(check="radix_match_insert", message="matches partial pages")
def RadixTree(page_size):
    return _m_PartialPages(page_size)


@mutant(check="radix_match_insert", message="does not split a node where the query diverges")
def RadixTree(page_size):  # noqa: F811
    return _m_NoSplit(page_size)


@mutant(check="radix_match_insert", message="returns the number of NEW tokens")
def RadixTree(page_size):  # noqa: F811
    return _m_InsertCountsNew(page_size)


@mutant(check="radix_match_insert", message="caches the partial last page")
def RadixTree(page_size):  # noqa: F811
    return _m_InsertPartial(page_size)


class _m_NoPageSizeCheck(sol.RadixTree):
    def __init__(self, page_size):
        self.page_size = page_size  # page_size 0 accepted
        self.root = sol.TreeNode(lock_ref=1)
        self._clock, self._total, self._locked = 0, 0, 0


class _m_InsertFewIds(sol.RadixTree):
    """Caches only as many pages as it got block ids for, silently."""

    def insert(self, tokens, block_ids):
        n = min(len(tokens) // self.page_size, len(block_ids))
        return super().insert(tokens[:n * self.page_size], block_ids)


class _m_MatchNoTick(sol.RadixTree):
    def match_prefix(self, tokens):
        self._clock -= 1  # the solution's tick below only brings the clock back: stamps reuse the last tick
        return super().match_prefix(tokens)


class _m_StampBeforeSplit(sol.RadixTree):
    """Stamps a node before splitting it, so the unmatched rest of the node gets the new stamp too."""

    def match_prefix(self, tokens):
        self._clock += 1
        node, pos, blocks, P = self.root, 0, [], self.page_size
        while pos + P <= len(tokens):
            child = node.children.get(tuple(tokens[pos:pos + P]))
            if child is None:
                break
            k = self._common_pages(child, tokens, pos)
            child.last_access = self._clock
            if k < len(child.blocks):
                child = self._split(child, k)
            blocks += child.blocks
            node, pos = child, pos + k * P
        return blocks, node


class _m_ReturnsParent(sol.RadixTree):
    def match_prefix(self, tokens):
        blocks, node = super().match_prefix(tokens)
        return blocks, node.parent or node  # one node too high


class _m_InsertNoStampPath(sol.RadixTree):
    """Stamps only the node insert creates: the cached pages it walks through keep their stamps."""

    def insert(self, tokens, block_ids):
        saved = {id(n): n.last_access for n in _m_nodes(self.root)}
        out = super().insert(tokens, block_ids)
        for n in _m_nodes(self.root):
            if id(n) in saved:
                n.last_access = saved[id(n)]
            elif n.children:  # a head split off by this insert: the stamp its pages had
                n.last_access = saved[id(next(iter(n.children.values())))]
        return out


class _m_InsertNoTick(sol.RadixTree):
    def insert(self, tokens, block_ids):
        self._clock -= 1
        return super().insert(tokens, block_ids)


class _m_InsertNoSplitAtEnd(sol.RadixTree):
    """Splits only where the inserted sequence diverges, not where it ends inside a node: the whole node is
    stamped."""

    def insert(self, tokens, block_ids):
        P = self.page_size
        n = len(tokens) // P
        self._clock += 1
        node, page = self.root, 0
        while page < n:
            child = node.children.get(tuple(tokens[page * P:(page + 1) * P]))
            if child is None:
                new = sol.TreeNode(tokens[page * P:n * P], block_ids[page:n], node, 0, self._clock)
                node.children[tuple(new.tokens[:P])] = new
                self._total += (n - page) * P
                return page * P
            k = self._common_pages(child, tokens, page * P)
            if k < len(child.blocks) and page + k < n:
                child = self._split(child, k)
            child.last_access = self._clock
            node, page = child, page + k
            if k < len(child.blocks):
                break
        return n * P


class _m_InsertNoSplit(sol.RadixTree):
    """Never splits in insert: where the new sequence diverges inside a node, its new pages hang below that whole
    node, as if the node ended at the divergence."""

    def insert(self, tokens, block_ids):
        P = self.page_size
        n = len(tokens) // P
        if len(block_ids) < n:
            raise ValueError("too few block ids")
        self._clock += 1
        node, page = self.root, 0
        while page < n:
            child = node.children.get(tuple(tokens[page * P:(page + 1) * P]))
            if child is None:
                new = sol.TreeNode(list(tokens[page * P:n * P]), list(block_ids[page:n]), node, 0, self._clock)
                node.children[tuple(new.tokens[:P])] = new
                self._total += (n - page) * P
                return page * P
            k = self._common_pages(child, tokens, page * P)
            child.last_access = self._clock
            if k < len(child.blocks) and page + k < n:  # diverges mid-node: no split, the rest goes below it
                new = sol.TreeNode(list(tokens[(page + k) * P:n * P]), list(block_ids[page + k:n]), child, 0,
                                   self._clock)
                child.children[tuple(new.tokens[:P])] = new
                self._total += (n - page - k) * P
                return (page + k) * P
            if k < len(child.blocks):
                child = self._split(child, k)
                child.last_access = self._clock
            node, page = child, page + k
        return n * P


class _m_InsertTotalAll(sol.RadixTree):
    def insert(self, tokens, block_ids):
        total = self._total
        cached = super().insert(tokens, block_ids)
        if self._total != total:
            self._total += cached  # counts the already-cached pages of the sequence again
        return cached


class _m_CommonTokens(sol.RadixTree):
    def _common_pages(self, node, tokens, start):
        return super()._common_pages(node, tokens, start) * self.page_size  # tokens, not pages


@mutant(check="radix_match_insert", message="page_size must be >= 1")
def RadixTree(page_size):  # noqa: F811
    return _m_NoPageSizeCheck(page_size)


@mutant(check="radix_match_insert", message="instead of raising ValueError")
def RadixTree(page_size):  # noqa: F811
    return _m_InsertFewIds(page_size)


@mutant(check="radix_match_insert", message="the ORIGINAL node must keep the second half")
def RadixTree(page_size):  # noqa: F811
    return _m_SplitKeepsHead(page_size)


@mutant(check="radix_match_insert", message="split the node there so that the node returned ends exactly")
def RadixTree(page_size):  # noqa: F811
    return _m_NoSplitLocksMore(page_size)


@mutant(check="radix_match_insert", message="does not count a match as an access")
def RadixTree(page_size):  # noqa: F811
    return _m_MatchNotAccess(page_size)


@mutant(check="radix_match_insert", message="does not tick the clock in match_prefix")
def RadixTree(page_size):  # noqa: F811
    return _m_MatchNoTick(page_size)


@mutant(check="radix_match_insert", message="stamps the whole node where the match_prefix ends inside it")
def RadixTree(page_size):  # noqa: F811
    return _m_StampBeforeSplit(page_size)


@mutant(check="radix_match_insert", message="return the node where the match ends")
def RadixTree(page_size):  # noqa: F811
    return _m_ReturnsParent(page_size)


@mutant(check="radix_match_insert", message="does not stamp the already-cached pages insert walks through")
def RadixTree(page_size):  # noqa: F811
    return _m_InsertNoStampPath(page_size)


@mutant(check="radix_match_insert", message="does not tick the clock in insert")
def RadixTree(page_size):  # noqa: F811
    return _m_InsertNoTick(page_size)


@mutant(check="radix_match_insert", message="stamps the whole node where the insert ends inside it")
def RadixTree(page_size):  # noqa: F811
    return _m_InsertNoSplitAtEnd(page_size)


@mutant(check="radix_match_insert", message="adds every whole page of the inserted sequence to total_size")
def RadixTree(page_size):  # noqa: F811
    return _m_InsertTotalAll(page_size)


@mutant(check="radix_match_insert", message="counts matching TOKENS where pages are meant")
def RadixTree(page_size):  # noqa: F811
    return _m_CommonTokens(page_size)


# -- 2.2 lock, unlock, evict ------------------------------------------------------------------------

class _m_NoSplitLocksMore(sol.RadixTree):
    """Returns the right blocks but does not split: the node it returns runs past the match."""

    def match_prefix(self, tokens):
        self._clock += 1
        node, pos, blocks, P = self.root, 0, [], self.page_size
        while pos + P <= len(tokens):
            child = node.children.get(tuple(tokens[pos:pos + P]))
            if child is None:
                break
            k = self._common_pages(child, tokens, pos)
            child.last_access = self._clock
            blocks += child.blocks[:k]
            node, pos = child, pos + k * P
            if k < len(child.blocks):
                break
        return blocks, node


class _m_IgnoresLocks(sol.RadixTree):
    def evict(self, num_tokens):
        locked = [(n, n.lock_ref) for n in _m_nodes(self.root) if n is not self.root]
        for n, _ in locked:
            n.lock_ref = 0  # "a leaf is a leaf": locks are not looked at
        try:
            return super().evict(num_tokens)
        finally:
            for n, ref in locked:
                n.lock_ref = ref


class _m_InnerFirst(sol.RadixTree):
    """Evicts any unlocked node by its stamp, leaves or not; ties go to the first found (parents first)."""

    def evict(self, num_tokens):
        P, need, freed = self.page_size, -(-num_tokens // self.page_size), []
        while len(freed) < need:
            nodes = [n for n in _m_nodes_bfs(self.root) if n is not self.root and n.lock_ref == 0 and n.blocks]
            if not nodes:
                break
            n = min(nodes, key=lambda x: x.last_access)  # min keeps the first of equal stamps: a parent
            freed.append(n.blocks.pop())
            del n.tokens[-P:]
            self._total -= P
            if not n.blocks:
                n.parent.children = {k: c for k, c in n.parent.children.items() if c is not n}
                for c in n.children.values():  # its children hang on, now unreachable
                    c.parent = n.parent
        return freed


def _m_nodes_bfs(root):
    out, i = [root], 0
    while i < len(out):
        out.extend(out[i].children.values())
        i += 1
    return out


class _m_WholeNodes(sol.RadixTree):
    """Frees whole leaves (as SGLang does), not page by page."""

    def evict(self, num_tokens):
        freed = []
        while len(freed) * self.page_size < num_tokens:
            leaves = [n for n in _m_nodes(self.root) if n is not self.root and not n.children and n.lock_ref == 0]
            if not leaves:
                break
            leaf = min(leaves, key=lambda n: n.last_access)
            freed += self.evict_whole(leaf)
        return freed

    def evict_whole(self, leaf):
        del leaf.parent.children[tuple(leaf.tokens[:self.page_size])]
        self._total -= len(leaf.tokens)
        return leaf.blocks


class _m_InsertionLRU(sol.RadixTree):
    """Evicts by when a page was inserted: the stamps of later matches and inserts are ignored."""

    def _split(self, node, n_pages):
        head = super()._split(node, n_pages)
        head.born = getattr(node, "born", 0)
        return head

    def insert(self, tokens, block_ids):
        out = super().insert(tokens, block_ids)
        for n in _m_nodes(self.root):
            if not hasattr(n, "born"):
                n.born = self._clock
        return out

    def evict(self, num_tokens):
        nodes = _m_nodes(self.root)
        saved = [n.last_access for n in nodes]
        for n in nodes:
            n.last_access = getattr(n, "born", 0)
        try:
            return super().evict(num_tokens)
        finally:
            for n, s in zip(nodes, saved):
                n.last_access = s


class _m_MatchNotAccess(sol.RadixTree):
    """Stamps pages on insert only: a match leaves the stamps as they were."""

    def match_prefix(self, tokens):
        saved = {id(n): n.last_access for n in _m_nodes(self.root)}
        out = super().match_prefix(tokens)
        for n in _m_nodes(self.root):
            if id(n) in saved:
                n.last_access = saved[id(n)]
            else:  # a head split off during this match: the stamp its pages had
                n.last_access = saved[id(next(iter(n.children.values())))]
        return out


class _m_LockNodeOnly(sol.RadixTree):
    def lock(self, node):
        if node is not self.root:
            if node.lock_ref == 0:
                self._locked += len(node.tokens)
            node.lock_ref += 1  # the node only, not its ancestors

    def unlock(self, node):
        if node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._locked -= len(node.tokens)


class _m_UnlockBelowZero(sol.RadixTree):
    def unlock(self, node):
        while node is not self.root:  # no check: a second unlock goes below zero
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._locked -= len(node.tokens)
            node = node.parent


class _m_SplitKeepsHead(sol.RadixTree):
    """Splits by shortening the original node to the first part and moving the rest to a new child."""

    def _split(self, node, n_pages):
        P = self.page_size
        tail = sol.TreeNode(node.tokens[n_pages * P:], node.blocks[n_pages:], node, node.lock_ref, node.last_access)
        tail.children = node.children
        for c in tail.children.values():
            c.parent = tail
        node.tokens, node.blocks = node.tokens[:n_pages * P], node.blocks[:n_pages]
        node.children = {tuple(tail.tokens[:P]): tail}
        return node


@mutant(check="radix_lock_evict", message="locks more than the match")
def RadixTree(page_size):  # noqa: F811
    return _m_NoSplitLocksMore(page_size)


@mutant(check="radix_lock_evict", message="evicts a locked node")
def RadixTree(page_size):  # noqa: F811
    return _m_IgnoresLocks(page_size)


@mutant(check="radix_lock_evict", message="evicts an inner node before its leaves")
def RadixTree(page_size):  # noqa: F811
    return _m_InnerFirst(page_size)


@mutant(check="radix_lock_evict", message="frees whole nodes")
def RadixTree(page_size):  # noqa: F811
    return _m_WholeNodes(page_size)


@mutant(check="radix_lock_evict", message="orders eviction by insertion time")
def RadixTree(page_size):  # noqa: F811
    return _m_InsertionLRU(page_size)


@mutant(check="radix_lock_evict", message="does not count a match as an access")
def RadixTree(page_size):  # noqa: F811
    return _m_MatchNotAccess(page_size)


@mutant(check="radix_lock_evict", message="leaves matched pages unlocked")
def RadixTree(page_size):  # noqa: F811
    return _m_LockNodeOnly(page_size)


@mutant(check="radix_lock_evict", message="lets a lock count go below zero")
def RadixTree(page_size):  # noqa: F811
    return _m_UnlockBelowZero(page_size)


@mutant(check="radix_lock_evict", message="the ORIGINAL node must keep the second half")
def RadixTree(page_size):  # noqa: F811
    return _m_SplitKeepsHead(page_size)


class _m_LockStamps(sol.RadixTree):
    """Treats a lock as an access: ticks the clock and stamps the locked path."""

    def lock(self, node):
        self._clock += 1
        n = node
        while n is not self.root:
            n.last_access = self._clock
            n = n.parent
        super().lock(node)


class _m_EvictMinOne(sol.RadixTree):
    def evict(self, num_tokens):
        return super().evict(max(num_tokens, 1))  # at least one page


class _m_EvictPlusOne(sol.RadixTree):
    def evict(self, num_tokens):
        P = self.page_size
        return super().evict((num_tokens // P + 1) * P if num_tokens > 0 else 0)  # floor + 1 pages


def _m_evict(tree, num_tokens, parent_key, trim=True):
    """The solution's evict with two knobs: the stamp a parent that becomes a leaf competes with, and whether
    a freed page's tokens go with its block id."""
    P = tree.page_size
    need = max(0, -(-num_tokens // P))
    heap, stack = [], [tree.root]
    while stack:
        n = stack.pop()
        stack.extend(n.children.values())
        if n is not tree.root and not n.children and n.lock_ref == 0:
            heapq.heappush(heap, (n.last_access, id(n), n))
    freed = []
    while len(freed) < need and heap:
        _, _, leaf = heapq.heappop(heap)
        key = tuple(leaf.tokens[:P])
        take = min(need - len(freed), len(leaf.blocks))
        for _ in range(take):
            freed.append(leaf.blocks.pop())
        if trim:
            del leaf.tokens[len(leaf.tokens) - take * P:]
        tree._total -= take * P
        if leaf.blocks:
            continue
        parent = leaf.parent
        del parent.children[key]
        if parent is not tree.root and not parent.children and parent.lock_ref == 0:
            heapq.heappush(heap, (parent_key(parent, leaf), id(parent), parent))
    return freed


class _m_EvictChildStamp(sol.RadixTree):
    def evict(self, num_tokens):
        return _m_evict(self, num_tokens, lambda parent, leaf: leaf.last_access)  # the child's stamp


class _m_EvictKeepsTokens(sol.RadixTree):
    def evict(self, num_tokens):
        return _m_evict(self, num_tokens, lambda parent, leaf: parent.last_access, trim=False)


class _m_EvictMRU(sol.RadixTree):
    def evict(self, num_tokens):
        nodes = _m_nodes(self.root)
        for n in nodes:
            n.last_access = -n.last_access  # the newest first
        try:
            return super().evict(num_tokens)
        finally:
            for n in nodes:
                n.last_access = -n.last_access


class _m_EvictBiggest(sol.RadixTree):
    def evict(self, num_tokens):
        nodes = _m_nodes(self.root)
        saved = [n.last_access for n in nodes]
        for n in nodes:
            n.last_access = -len(n.blocks)  # the biggest leaf first
        try:
            return super().evict(num_tokens)
        finally:
            for n, s in zip(nodes, saved):
                n.last_access = s


class _m_LockCountsEvery(sol.RadixTree):
    def lock(self, node):
        while node is not self.root:
            self._locked += len(node.tokens)  # also when the node was locked already
            node.lock_ref += 1
            node = node.parent


class _m_LockSetOne(sol.RadixTree):
    def lock(self, node):
        while node is not self.root:
            if node.lock_ref == 0:
                self._locked += len(node.tokens)
            node.lock_ref = 1
            node = node.parent


class _m_UnlockRaisesLate(sol.RadixTree):
    def unlock(self, node):
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref < 0:  # noticed only after changing it
                raise RuntimeError("unlock of a node that is not locked")
            if node.lock_ref == 0:
                self._locked -= len(node.tokens)
            node = node.parent


class _m_UnlockNodeOnly(sol.RadixTree):
    def unlock(self, node):
        if node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("unlock of a node that is not locked")
            node.lock_ref -= 1  # the node only, not its ancestors
            if node.lock_ref == 0:
                self._locked -= len(node.tokens)


class _m_UnlockNoCount(sol.RadixTree):
    def unlock(self, node):
        if node is not self.root and node.lock_ref <= 0:
            raise RuntimeError("unlock of a node that is not locked")
        while node is not self.root:
            node.lock_ref -= 1  # the tokens never come back to the evictable count
            node = node.parent


class _m_EvictableTotal(sol.RadixTree):
    def evictable_size(self):
        return self._total


class _m_SplitDropsLock(sol.RadixTree):
    def _split(self, node, n_pages):
        head = super()._split(node, n_pages)
        head.lock_ref = 0  # the new node starts unlocked
        return head


@mutant(check="radix_lock_evict", message="stamps pages in lock")
def RadixTree(page_size):  # noqa: F811
    return _m_LockStamps(page_size)


@mutant(check="radix_lock_evict", message="frees a page even for evict(0)")
def RadixTree(page_size):  # noqa: F811
    return _m_EvictMinOne(page_size)


@mutant(check="radix_lock_evict", message="frees one page too many")
def RadixTree(page_size):  # noqa: F811
    return _m_EvictPlusOne(page_size)


@mutant(check="radix_lock_evict", message="compete with the stamp of the child just freed")
def RadixTree(page_size):  # noqa: F811
    return _m_EvictChildStamp(page_size)


@mutant(check="radix_lock_evict", message="pops the freed pages' block ids but leaves their tokens")
def RadixTree(page_size):  # noqa: F811
    return _m_EvictKeepsTokens(page_size)


@mutant(check="radix_lock_evict", message="frees the MOST recently used pages first")
def RadixTree(page_size):  # noqa: F811
    return _m_EvictMRU(page_size)


@mutant(check="radix_lock_evict", message="evict frees the unlocked leaf pages with the oldest last access first")
def RadixTree(page_size):  # noqa: F811
    return _m_EvictBiggest(page_size)


@mutant(check="radix_lock_evict", message="counts a node's tokens as locked on every lock")
def RadixTree(page_size):  # noqa: F811
    return _m_LockCountsEvery(page_size)


@mutant(check="radix_lock_evict", message="sets lock_ref to 1 instead of adding one")
def RadixTree(page_size):  # noqa: F811
    return _m_LockSetOne(page_size)


@mutant(check="radix_lock_evict", message="changes lock counts before it refuses")
def RadixTree(page_size):  # noqa: F811
    return _m_UnlockRaisesLate(page_size)


@mutant(check="radix_lock_evict", message="releases only `node` itself")
def RadixTree(page_size):  # noqa: F811
    return _m_UnlockNodeOnly(page_size)


@mutant(check="radix_lock_evict", message="does not give tokens back to the evictable count")
def RadixTree(page_size):  # noqa: F811
    return _m_UnlockNoCount(page_size)


@mutant(check="radix_lock_evict", message="but evictable_size() did not change")
def RadixTree(page_size):  # noqa: F811
    return _m_EvictableTotal(page_size)


@mutant(check="radix_lock_evict", message="inherits the node's lock_ref")
def RadixTree(page_size):  # noqa: F811
    return _m_SplitDropsLock(page_size)


# -- 3.1 admission order ----------------------------------------------------------------------------

@mutant(check="lpm_order", message="SHORTEST cached prefix first")
def lpm_order(tree, waiting):
    m = [len(tree.match_prefix(list(p))[0]) for p in waiting]
    return sorted(range(len(waiting)), key=lambda i: m[i])


@mutant(check="lpm_order", message="orders by prompt length")
def lpm_order(tree, waiting):  # noqa: F811
    return sorted(range(len(waiting)), key=lambda i: -len(waiting[i]))


@mutant(check="lpm_order", message="reverse arrival order")
def lpm_order(tree, waiting):  # noqa: F811
    m = [len(tree.match_prefix(list(p))[0]) for p in waiting]
    return sorted(range(len(waiting)), key=lambda i: (m[i], i), reverse=True)


@mutant(check="lpm_order", message="caps each match at len(prompt) - 1 tokens")
def lpm_order(tree, waiting):  # noqa: F811
    P = tree.page_size
    m = [min(len(tree.match_prefix(list(p))[0]), (len(p) - 1) // P) for p in waiting]  # the replay's cap, too early
    return sorted(range(len(waiting)), key=lambda i: -m[i])


@mutant(check="lpm_order", message="looks a repeated prompt up only once")
def lpm_order(tree, waiting):  # noqa: F811
    seen = {}
    for p in waiting:
        if tuple(p) not in seen:
            seen[tuple(p)] = len(tree.match_prefix(list(p))[0])
    return sorted(range(len(waiting)), key=lambda i: -seen[tuple(waiting[i])])


@mutant(check="lpm_order", message="changed `waiting` in place")
def lpm_order(tree, waiting):  # noqa: F811
    m = [len(tree.match_prefix(list(p))[0]) for p in waiting]
    order = sorted(range(len(waiting)), key=lambda i: -m[i])
    waiting[:] = [waiting[i] for i in order]  # the caller's queue, reordered too
    return order


def _m_quicksort(a, key, lo, hi):
    """Hoare's quicksort: fast, and not stable."""
    if lo >= hi:
        return
    pivot, i, j = key(a[(lo + hi) // 2]), lo, hi
    while i <= j:
        while key(a[i]) < pivot:
            i += 1
        while key(a[j]) > pivot:
            j -= 1
        if i <= j:
            a[i], a[j] = a[j], a[i]
            i, j = i + 1, j - 1
    _m_quicksort(a, key, lo, j)
    _m_quicksort(a, key, i, hi)


@mutant(check="lpm_order", message="arrival order")
def lpm_order(tree, waiting):  # noqa: F811
    m = [len(tree.match_prefix(list(p))[0]) for p in waiting]
    order = list(range(len(waiting)))
    _m_quicksort(order, lambda i: -m[i], 0, len(order) - 1)
    return order


@mutant(check="lpm_order", message="has match_prefix(tokens) and page_size only")
def lpm_order(tree, waiting):  # noqa: F811
    def walk(p):  # reads the tree instead of looking the prompt up: no LRU access
        node, pos, k, P = tree.root, 0, 0, tree.page_size
        while pos + P <= len(p):
            child = node.children.get(tuple(p[pos:pos + P]))
            if child is None:
                break
            j = tree._common_pages(child, p, pos)
            k, pos, node = k + j, pos + j * P, child
            if j < len(child.blocks):
                break
        return k
    m = [walk(list(p)) for p in waiting]
    return sorted(range(len(waiting)), key=lambda i: -m[i])


# -- 5.1 the tree in the engine (the same wrong trees, as the engine's prefix cache): the message names the
# method the op-by-op replay finds wrong, not only what the engine saw -------------------------------------


@mutant(check="tree_in_engine", message="evicts a locked node")
def RadixTree(page_size):  # noqa: F811
    return _m_IgnoresLocks(page_size)


@mutant(check="tree_in_engine", message="returns the number of NEW tokens it added")
def RadixTree(page_size):  # noqa: F811
    return _m_InsertCountsNew(page_size)


@mutant(check="tree_in_engine", message="leaves matched pages unlocked")
def RadixTree(page_size):  # noqa: F811
    return _m_LockNodeOnly(page_size)


@mutant(check="tree_in_engine", message="match_prefix([1, 2, 3, 4, 30, 31, 32, 33]) returned: got [100, 101, 102, 103, 104], expected [100]. Looks like your code does not split a node where the query diverges")
def RadixTree(page_size):  # noqa: F811
    return _m_NoSplit(page_size)


@mutant(check="tree_in_engine", message="match_prefix must stamp the pages it matched")
def RadixTree(page_size):  # noqa: F811
    return _m_MatchNotAccess(page_size)


@mutant(check="tree_in_engine", message="frees one page too many")
def RadixTree(page_size):  # noqa: F811
    return _m_EvictPlusOne(page_size)


# -- hostile: a chain of 19 000 one-page nodes hung under a leaf (its paths took the grader to 6 GB) --------


class _m_EndlessChain(sol.RadixTree):  # noqa: F821
    def insert(self, tokens, blocks):
        out = super().insert(tokens, blocks)
        node = self.root
        while node.children:
            node = next(iter(node.children.values()))
        for i in range(19_000):
            child = TreeNode([7] * self.page_size, [10**6 + i], parent=node)  # noqa: F821
            node.children[tuple(child.tokens[:self.page_size])] = child
            node = child
        return out


@mutant(check="radix_match_insert", message="spell paths of")
def RadixTree(page_size):  # noqa: F811
    return _m_EndlessChain(page_size)


@mutant(check="radix_match_insert", message="does not split a node where the inserted sequence diverges")
def RadixTree(page_size):  # noqa: F811
    return _m_InsertNoSplit(page_size)
