"""Lesson 18 beyond the shared tests: the hash chain's properties, the radix tree against the checks'
brute-force trie on many random operation sequences (and its own structure), the workload generators
against the trace, the replay's accounting, and the checks' helpers."""
import os
import random
import subprocess
import sys

import pytest

from autograder.checks import l18_prefix_caching as checks
from autograder.harnesses import l18_prefix_caching as harness
from autograder.runner import Target, grade_lesson
from reference_engine.sim import trace
from solutions import l18_prefix_caching as S

# -- 1. hashes ----------------------------------------------------------------------------------------


def test_block_hashes_chain_properties():
    rng = random.Random(0)
    for _ in range(200):
        B = rng.randint(1, 8)
        toks = [rng.randrange(0, 5) for _ in range(rng.randint(0, 40))]
        h = S.block_hashes(toks, B)
        assert len(h) == len(toks) // B and all(len(x) == 64 for x in h)
        cut = rng.randint(0, len(toks))
        assert S.block_hashes(toks[:cut], B) == h[:cut // B]  # a prefix's hashes are a prefix of the hashes
        assert h == checks.hash_variant(toks, B)               # the checks' copy of the formula agrees
    # equal blocks after different prefixes differ; equal prefixes agree whatever follows
    a, b = S.block_hashes([1, 2, 9, 9], 2), S.block_hashes([3, 4, 9, 9], 2)
    assert a[1] != b[1]
    assert S.block_hashes([1, 2, 3, 4, 5], 2) == S.block_hashes([1, 2, 3, 4, 6], 2)


def test_block_hashes_are_the_same_in_another_process():
    """sha256 of bytes, not Python's salted hash(): another interpreter with another hash seed agrees."""
    code = "from solutions.l18_prefix_caching import block_hashes; print(block_hashes(list(range(40)), 16))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout.strip()
    assert out == str(S.block_hashes(list(range(40)), 16))


def test_hash_table_match_equals_the_tree_on_page_aligned_prefixes():
    rng = random.Random(1)
    tree, table, P = S.RadixTree(4), {}, 4
    for i in range(60):
        seq = [rng.randint(1, 3) for _ in range(rng.randint(1, 24))]
        blocks, _ = tree.match_prefix(seq)
        assert blocks == S.hash_table_match(seq, table, P)
        ids = list(range(100 * i, 100 * i + len(seq) // P))
        tree.insert(seq, ids)
        have = dict(zip(S.block_hashes(seq, P), ids))
        table.update({h: b for h, b in have.items() if h not in table})  # existing entries keep their block


# -- 2. the tree against the brute-force trie ------------------------------------------------------------


def _structure(tree: S.RadixTree):
    """The node layout's invariants: whole pages, first-page keys, parent links, counts."""
    P, total, locked, stack = tree.page_size, 0, 0, [tree.root]
    while stack:
        n = stack.pop()
        for key, c in n.children.items():
            assert c.parent is n and key == tuple(c.tokens[:P])
            assert c.blocks and len(c.tokens) == len(c.blocks) * P
            assert 0 <= c.lock_ref <= n.lock_ref or n is tree.root
            assert c.last_access <= n.last_access or n is tree.root  # a parent is stamped with its child
            total += len(c.tokens)
            locked += len(c.tokens) * (c.lock_ref > 0)
            stack.append(c)
    assert total == tree.total_size() and total - locked == tree.evictable_size()


def _run(seed: int, steps: int = 80) -> dict:
    """Random operations on the solution's tree and the brute-force trie, compared after each; counts how
    often the interesting paths ran."""
    rng = random.Random(seed)
    P = rng.choice([1, 2, 3, 4])
    tree, ref, pool, running = S.RadixTree(P), checks.BruteTrie(P), [], []
    seen = {"evict_with_locks": 0, "page_by_page": 0, "cached_inserts": 0}
    nxt = [0]

    def fresh(k):
        nxt[0] += k
        return list(range(nxt[0] - k, nxt[0]))

    for _ in range(steps):
        op = rng.choice(["insert", "match", "admit", "evict"] + ["finish"] * bool(running))
        seq = checks._sequence(rng, pool, P)
        if op == "insert":
            ids = fresh(len(seq) // P)
            got, want = tree.insert(seq, ids), ref.insert(seq, ids)
            assert got == want
            seen["cached_inserts"] += want > 0
        elif op in ("match", "admit"):
            (got, node), (want, end) = tree.match_prefix(seq), ref.match_prefix(seq)
            assert got == want
            if op == "admit":
                tree.lock(node)
                ref.lock(end)
                running.append((seq, node, end, got))
        elif op == "evict":
            n = rng.randint(1, 3 * P)
            locks = any(p.locks for p in ref.pages.values())
            by_block = {p.block: k for k, p in ref.pages.items()}
            got, want = tree.evict(n), ref.evict(n)
            assert sorted(got) == sorted(want)
            seen["evict_with_locks"] += locks and bool(want)
            # a freed page whose previous page stays cached: eviction page by page, from a leaf's end
            seen["page_by_page"] += any(len(by_block[b]) > P and by_block[b][:-P] in ref.pages for b in want)
        else:
            seq, node, end, blocks = running.pop(rng.randrange(len(running)))
            full = seq + [rng.randint(1, 3) for _ in range(rng.randint(0, 2 * P))]
            table = blocks + fresh(len(full) // P - len(blocks))
            assert tree.insert(full, table) == ref.insert(full, table)
            tree.unlock(node)
            ref.unlock(end)
        assert tree.total_size() == ref.total_size() and tree.evictable_size() == ref.evictable_size()
        _structure(tree)
    for _seq, node, end, _ in running:
        tree.unlock(node)
        ref.unlock(end)
    everything = tree.evict(tree.total_size() + P)
    assert sorted(everything) == sorted(ref.evict(10**9)) and tree.total_size() == 0
    return seen


def test_tree_agrees_with_the_brute_force_trie_on_random_operations():
    totals = {}
    for seed in range(150):
        for k, v in _run(seed).items():
            totals[k] = totals.get(k, 0) + v
    # the random sequences reach the paths that matter: evictions next to locked pages, pages freed while
    # the page before them stays, inserts of partly cached sequences
    assert totals["evict_with_locks"] > 100 and totals["page_by_page"] > 100 and totals["cached_inserts"] > 500


def test_splits_keep_a_locked_handle_whole():
    t = S.RadixTree(2)
    t.insert([1, 2, 3, 4, 5, 6], [10, 11, 12])
    blocks, node = t.match_prefix([1, 2, 3, 4, 5, 6])
    t.lock(node)
    t.insert([1, 2, 9, 9], [20, 21])        # splits the locked node after page 1
    assert node.tokens == [3, 4, 5, 6] and node.parent.tokens == [1, 2] and node.parent.lock_ref == 1
    assert t.evict(100) == [21] and t.evictable_size() == 0
    t.unlock(node)
    assert sorted(t.evict(100)) == [10, 11, 12]
    with pytest.raises(RuntimeError):
        t.unlock(node)


def test_lpm_order_example():
    t = S.RadixTree(1)
    t.insert([1, 2, 3], [0, 1, 2])
    assert S.lpm_order(t, [[9], [1, 2, 3, 8], [1, 2, 3, 7]]) == [1, 2, 0]


# -- 4. workloads and the replay ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(S.WORKLOADS))
def test_workloads_keep_the_trace_and_extend_their_parents(name):
    calls = S.WORKLOADS[name](120, seed=3)
    rows = trace.sample(120, seed=3)
    assert [c.arrival for c in calls] == [r.arrival for r in rows]
    assert [len(c.output) for c in calls] == [r.output_tokens for r in rows]
    extra = 2000 if name == "shared system prompt" else 0
    assert [len(c.prompt) for c in calls] == [r.prompt_tokens + extra for r in rows]
    for i, c in enumerate(calls):
        if c.after >= 0:
            p = calls[c.after]
            assert c.after < i and c.prompt[:len(p.prompt) + len(p.output)] == p.prompt + p.output
    assert calls == S.WORKLOADS[name](120, seed=3)  # seeded
    if name != "shared system prompt":
        assert sum(c.after >= 0 for c in calls) > 30


@pytest.mark.parametrize("name", list(S.WORKLOADS))
def test_replay_accounting_and_the_upper_bound(name):
    calls = S.WORKLOADS[name](80, seed=1)
    bound = S.shared_upper_bound(calls)
    big = S.replay(calls, S.RadixTree(16), num_blocks=40_000)
    tight = S.replay(calls, S.RadixTree(16), num_blocks=1_200, policy="lpm")
    none = S.replay(calls, None, num_blocks=40_000)
    assert none["cached_tokens"] == 0 and none["prefill_s"] == pytest.approx(none["prefill_s_nocache"])
    # the bound counts every earlier call's pages; the replay only those of calls already finished
    assert 0 < tight["hit_rate"] <= bound + 1e-12 and 0 < big["hit_rate"] <= bound + 1e-12
    assert tight["evicted_blocks"] > 0 and big["evicted_blocks"] == 0
    assert big["prefill_s"] < big["prefill_s_nocache"]
    assert big["cached_tokens"] == sum(big["cached"]) and all(c < p for c, p in zip(big["cached"], big["prompt"]))


# -- the checks' own helpers ----------------------------------------------------------------------------


def test_every_named_mistake_is_offered_by_a_visible_case():
    """What the visible cases alone offer equals what full runs offer on several seeds (so it is every seed)."""
    target = Target.for_lesson("l18_prefix_caching", solutions=True)
    visible = {r.name: set(r.mistakes_tested) for r in grade_lesson("l18_prefix_caching", target, 0, visible_only=True)}
    for seed in (0, 7, 99):
        for r in grade_lesson("l18_prefix_caching", target, seed):
            assert set(r.mistakes_tested) <= visible[r.name], (seed, r.name, set(r.mistakes_tested) - visible[r.name])
    assert visible["lpm_order"] == set(checks.lpm_mistakes(*checks.LPM_CASES[0][1])) | {checks.DEDUP}
    assert visible["block_hashes"] == set(checks.HASH_MISTAKES)
    evict_names = {*checks.LRU_MISTAKES.values(), *checks.NEED_MISTAKES.values(), checks.WHOLE_NODES,
                   *checks.EV_MISTAKES.values(), *checks.LOCK_MISTAKES.values(), checks.TOTAL_MISTAKES["evict unchanged"]}
    assert evict_names <= visible["radix_lock_evict"], evict_names - visible["radix_lock_evict"]
    match_names = {checks.PARTIAL, checks.NO_SPLIT, checks.COMMON_TOKENS,
                   *(v for k, v in checks.TOTAL_MISTAKES.items() if k != "evict unchanged")}
    assert match_names <= visible["radix_match_insert"], match_names - visible["radix_match_insert"]


def test_brute_trie_token_level_blocks():
    b = checks.BruteTrie(4)
    b.insert([1, 2, 3, 4, 5, 6, 7, 8], [10, 11])
    assert b.token_level_blocks([1, 2, 3, 4, 5, 6, 0, 0]) == [10, 11]
    assert b.token_level_blocks([1, 2, 3]) == [10]
    assert b.match_prefix([1, 2, 3, 4, 5, 6, 0, 0])[0] == [10]


def test_lpm_visible_cases_tell_every_mistake_apart():
    seen = set()
    for _, (P, cached, waiting) in checks.LPM_CASES:
        expected = checks._lpm_reference(S, P, cached, waiting)
        seen |= {name for name, v in checks.lpm_mistakes(P, cached, waiting).items() if v != expected}
    assert seen == set(checks.lpm_mistakes(*checks.LPM_CASES[0][1]))


def _view(tree, handles=()):
    return checks._read_view(checks.tree_view(tree, list(handles)), tree.page_size)


def test_tree_view_reads_the_solution_page_by_page():
    """What the checks read of a tree (pages, their lock counts and stamps, the span of each handle) agrees
    with the brute-force trie on random operations; stamps agree in order."""
    for seed in range(40):
        rng = random.Random(seed)
        P = rng.choice([1, 2, 3, 4])
        tree, ref, pool, handles, nxt = S.RadixTree(P), checks.BruteTrie(P), [], [], 0
        for _ in range(40):
            seq = checks._sequence(rng, pool, P)
            op = rng.choice(["insert", "match", "lock"])
            if op == "insert":
                ids = list(range(nxt, nxt + len(seq) // P))
                nxt += len(ids)
                tree.insert(seq, ids)
                ref.insert(seq, ids)
            else:
                (_, node), (_, end) = tree.match_prefix(seq), ref.match_prefix(seq)
                handles.append((node, end))
                if op == "lock":
                    tree.lock(node)
                    ref.lock(end)
            view = _view(tree, [h for h, _ in handles])
            assert not view.problem
            assert {k: p["block"] for k, p in view.pages.items()} == {k: p.block for k, p in ref.pages.items()}
            assert {k: p["locks"] for k, p in view.pages.items()} == {k: p.locks for k, p in ref.pages.items()}
            order = sorted(ref.pages, key=lambda k: ref.pages[k].stamp)
            assert [view.pages[k]["stamp"] for k in order] == sorted(view.pages[k]["stamp"] for k in order)
            assert all((ref.pages[a].stamp < ref.pages[b].stamp) == (view.pages[a]["stamp"] < view.pages[b]["stamp"])
                       for a, b in zip(order, order[1:]))
            assert [h["tokens"] for h in view.handles] == [list(end) for _, end in handles]
            assert all(h["reaches_root"] for h in view.handles)


def test_tree_view_names_a_broken_tree():
    t = S.RadixTree(2)
    t.insert([1, 2, 3, 4], [10, 11])
    node = t.root.children[(1, 2)]
    node.tokens.append(5)                     # tokens and blocks disagree
    assert "tokens but" in _view(t).problem
    node.tokens.pop()
    node.parent = None                        # a child whose parent link is wrong
    assert "parent" in _view(t).problem
    assert "root" in checks.tree_view(object(), [])["error"]


def test_match_variant_and_whole_nodes_on_the_learners_layout():
    t = S.RadixTree(4)
    t.insert(checks.A + checks.X, [100, 101, 102, 103, 104])  # one node of 5 pages
    view, query = _view(t), checks.A[:4] + [30, 31, 32, 33]
    assert checks.match_variant(view, query, 4, "no split") == [100, 101, 102, 103, 104]
    assert checks.match_variant(view, query, 4, "tokens") == [100, 101, 102, 103]  # a split after 4 "pages"
    assert checks.match_variant(view, checks.A, 4, "no split") == [100, 101, 102, 103, 104]
    t.insert(checks.A[:4] + checks.Y, [100, 105])            # splits after page 1: [A1] -> {[A2..X2], [Y]}
    assert checks.evict_whole_nodes(_view(t), 1) == [101, 102, 103, 104]  # the older leaf, all 4 pages
    t.match_prefix(checks.A + checks.X)
    assert checks.evict_whole_nodes(_view(t), 2) == [105, 101, 102, 103, 104]  # Y, then the whole rest of A+X
    t.lock(t.match_prefix(checks.A + checks.X)[1])
    assert checks.evict_whole_nodes(_view(t), 5) == [105]


def test_brute_trie_evict_variants():
    b = checks.BruteTrie(1)
    b.insert([1, 2], [10, 11])     # stamp 1
    b.insert([3], [12])            # stamp 2
    b.insert([1], [10])            # stamp 3: [1] is newer than [3], [1, 2] older
    assert b.copy().evict(2) == [11, 12]
    assert b.copy().evict(2, by="inherit") == [11, 10]  # [1] competes with [1, 2]'s stamp 1
    assert b.copy().evict(1, by="mru") == [12]
    assert b.copy().evict(1, by="born") == [11]
    assert b.copy().evict(3, need=1) == [11] and b.copy().evict(0) == []


def test_lpm_stand_in_tree_and_harness():
    stand_in = harness.LookupOnly(checks._build(2, [[1, 2, 3, 4]]))
    assert stand_in.match_prefix([1, 2, 9])[0] == [0] and stand_in.page_size == 2
    with pytest.raises(AttributeError, match="match_prefix"):
        stand_in.root  # noqa: B018 - the attribute access is what is tested

    def reorders(tree, waiting):
        order = S.lpm_order(tree, waiting)
        waiting.sort()
        return order

    out = harness.lpm_harness(reorders, 2, [[1, 2, 3, 4]], [[9, 9], [1, 2, 3]])
    assert out["order"] == [1, 0] and out["lookups"] == [[9, 9], [1, 2, 3]] and out["waiting"] == [[1, 2, 3], [9, 9]]


class _FakeTrial:
    def __init__(self):
        self.offered = set()


def test_judge_names_one_unrefuted_mistake():
    d = object.__new__(checks._Drive)
    d.t, d.refuted = _FakeTrial(), set()
    assert d.judge(3, 3, {"a": 4, "b": 3}) == (True, [])          # b made no difference here
    assert d.refuted == {"a"} and d.t.offered == {"a"}
    assert d.judge(4, 3, {"a": 4, "b": 4}) == (False, ["b"])      # a was ruled out by the right answer above
    assert d.judge(5, 3, {"c": 5, "d": 5}) == (False, ["c", "d"])  # two mistakes give 5: named together
    assert d.judge([1, 2], [1], {"e": (1, 2)}) == (False, ["e"])  # lists and tuples alike


# -- 5. the engine -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("label, case", checks.VISIBLE_WORKLOADS)
def test_visible_engine_workloads_hit_evict_and_keep_the_tokens(label, case):
    """Each visible workload of tree_in_engine makes the engine find cached prefixes and evict from the tree,
    and with the reference tree it generates what it generates without a cache."""
    from autograder.harnesses.engine import run_engine
    prompts, lens = case
    ref = checks._cached_reference(S, prompts, lens)
    plain = run_engine(prompts, lens, checks.ENGINE_KW, model=checks.ENGINE_MODEL)
    assert ref["error"] is None and ref["finished"] and ref["leak"] is None
    assert ref["tokens"] == plain["tokens"]
    assert ref["cache_stats"]["hits"] > 0 and ref["cache_stats"]["evicted_blocks"] > 0


def test_engine_chat_resends_the_engines_own_answers():
    """A continuation's prompt is what its parent was sent + the parent's engine output + its own tokens, and
    it is sent only after its parent finished; with the cache it finds the whole resent conversation."""
    import torch

    from reference_engine.engine import LLMEngine
    rows = trace.scale_to_context(trace.load("conv"), 512)
    calls = S.multi_turn_workload(12, seed=3, mean_turns=100.0, trace_name=rows)  # nearly all turns continue
    assert sum(c.after >= 0 for c in calls) >= 6
    from autograder.harnesses.engine import DRAFT
    eng = LLMEngine(str(DRAFT), dtype=torch.float32, enable_prefix_caching=True,
                    prefix_cache=S.RadixTree, clock=S.SkipIdleClock(), num_blocks=512, block_size=16)
    sent = []
    add = eng.add_request
    eng.add_request = lambda prompt, params, **kw: sent.append(list(prompt)) or add(prompt, params, **kw)
    out = S.engine_chat(eng, calls, eng.config.vocab_size)
    assert out["prompt"] == [len(c.prompt) for c in calls]
    assert all(t > 0 for t in out["ttft"])
    assert sum(out["cached"]) > 0
    by_len = {len(p): p for p in sent}
    for i, c in enumerate(calls):
        if c.after >= 0:
            parent, child = by_len[len(calls[c.after].prompt)], by_len[len(c.prompt)]
            assert child[:len(parent)] == parent  # the parent's prompt is resent as it was sent
            # each cached prefix is at most the whole resent history, in whole pages
            assert out["cached"][i] <= len(calls[c.after].prompt) + len(calls[c.after].output)


def test_skip_idle_clock_jumps_instead_of_sleeping():
    clock = S.SkipIdleClock()
    t = clock()
    clock.advance_to(t + 100.0)
    assert 100.0 <= clock() - t < 101.0
    clock.advance_to(t)  # never back
    assert clock() - t >= 100.0


def test_replay_ttft_is_measured_from_when_a_turn_can_be_sent():
    calls = S.multi_turn_workload(60, seed=1)
    r = S.replay(calls, S.RadixTree(16))
    assert len(r["ttft"]) == len(calls) and all(t > 0 for t in r["ttft"])
    no_cache = S.replay(calls, None)
    assert sorted(r["ttft"])[len(calls) // 2] <= sorted(no_cache["ttft"])[len(calls) // 2]
