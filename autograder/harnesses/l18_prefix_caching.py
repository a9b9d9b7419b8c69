"""The learner side of lesson 18's checks (autograder/harnesses/__init__.py): the learner's radix tree read through
TreeNode's fields as plain data (tree_view), and the learner's lpm_order run on a stand-in prefix cache that records
every lookup (lpm_harness)."""
from __future__ import annotations

from autograder.harnesses import harness

NODE_FIELDS = ("tokens", "blocks", "children", "parent", "last_access", "lock_ref")


def _number(x):
    """A stamp or lock count as plain data (numpy numbers included); anything else as its repr."""
    try:
        return int(x) if int(x) == x else float(x)
    except (TypeError, ValueError, OverflowError):
        return repr(x)


@harness
def tree_view(tree, handles: list) -> dict:
    """(A harness: runs in the learner's process under `t.run`.) The learner's tree read through the given
    TreeNode's fields, as plain data: every node reachable from tree.root, parents before children, with
    its tokens, blocks, last_access and lock_ref, the index of the node whose children hold it and whether
    its `parent` says so; and for each handle (a node match_prefix returned) the tokens of its path from
    the root, its node's index and whether walking its parents reaches the root. {"error": why} when the
    tree cannot be read that way."""
    root = getattr(tree, "root", None)
    if root is None:
        return {"error": "your RadixTree has no `root`"}
    objs, nodes, index, stack = [], [], {}, [(root, -1)]
    while stack:
        node, parent = stack.pop()
        if id(node) in index:
            return {"error": "a node is reachable twice from the root (a cycle, or one node in two nodes' children)"}
        missing = [f for f in NODE_FIELDS if not hasattr(node, f)]
        if missing:
            return {"error": f"a node ({type(node).__name__}) has no {', '.join(missing)}"}
        if not isinstance(node.children, dict):
            return {"error": f"a node's children is a {type(node.children).__name__}, not a dict"}
        if len(nodes) >= 20_000:
            return {"error": "more than 20000 nodes are reachable from the root"}
        try:
            record = {"parent": parent, "parent_ok": node.parent is (objs[parent] if parent >= 0 else None),
                      "tokens": [int(x) for x in node.tokens], "blocks": [int(b) for b in node.blocks],
                      "last_access": _number(node.last_access), "lock_ref": _number(node.lock_ref)}
        except (TypeError, ValueError) as e:
            return {"error": f"a node's tokens or blocks are not lists of ints ({e})"}
        index[id(node)] = len(nodes)
        objs.append(node)
        nodes.append(record)
        stack.extend((child, len(nodes) - 1) for child in node.children.values())
    paths = []
    for h in handles:
        tokens, n, steps = [], h, 0
        while n is not None and n is not root and steps <= len(nodes):
            tokens[:0] = [int(x) for x in getattr(n, "tokens", [])]
            n, steps = getattr(n, "parent", None), steps + 1
        paths.append({"tokens": tokens, "node": index.get(id(h), -1), "reaches_root": n is root})
    return {"nodes": nodes, "handles": paths}


class LookupOnly:
    """The tree lpm_order gets in the checks: match_prefix (each call recorded) and page_size, nothing else."""

    def __init__(self, trie):
        self._trie, self.page_size, self.lookups = trie, trie.page_size, []

    def match_prefix(self, tokens):
        self.lookups.append([int(x) for x in tokens])
        return self._trie.match_prefix(list(tokens))

    def __getattr__(self, name):
        raise AttributeError(f"the tree lpm_order gets has match_prefix(tokens) and page_size only, no `{name}`: "
                             "look each prompt up with match_prefix (a lookup is also an access for LRU)")


def stand_in_tree(page_size: int, cached: list):
    """The prefix cache lpm_order is given in the checks: the engine's own (reference_engine.prefix_cache.
    HashPrefixCache, which a learner may read), holding the whole pages of each sequence of `cached` in turn, page
    blocks numbered in that order (a page already cached keeps its block), behind LookupOnly."""
    from reference_engine.prefix_cache import HashPrefixCache

    cache, n = HashPrefixCache(page_size), 0
    for seq in cached:
        k = len(seq) // page_size
        cache.insert(list(seq), list(range(n, n + k)))
        n += k
    return LookupOnly(cache)


@harness
def lpm_harness(lpm_order, page_size: int, cached: list, waiting: list):
    """(A harness: runs in the learner's process under `t.run`.) Your lpm_order on a stand-in tree holding
    `cached`; returns its answer, the prompts it looked up and `waiting` as it left it, as plain data."""
    tree, queue = stand_in_tree(page_size, cached), [list(w) for w in waiting]
    out = lpm_order(tree, queue)
    return {"order": list(out) if isinstance(out, (list, tuple)) else out, "lookups": tree.lookups,
            "waiting": queue}
