"""Plausible wrong answers for lesson 18; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here are
prefixed `_m_`. A wrong RadixTree is a subclass of the right one with one method changed, given as a
factory function of the class's name (the check calls RadixTree(page_size))."""
import hashlib
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


# -- 2.1 match and insert ---------------------------------------------------------------------------

def _m_nodes(root):
    stack, out = [root], []
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


class _m_PartialPages(sol.RadixTree):
    """Matches token by token, keyed by a child's first token: a page that matches only partly counts."""

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
            child.last_access = self._clock
            blocks += child.blocks[:-(-n // P)]  # rounds the matched tokens UP to pages
            if n < len(child.tokens):
                return blocks, child
            node, pos = child, pos + n
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
