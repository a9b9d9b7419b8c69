"""Automatic prefix caching: same tokens as without it, exact hit accounting, no leaks, no eviction of a block
in use, prefill skipping the cached tokens, and a pluggable cache (a simple page-dict tree written here) that
gives the same tokens and hits as the engine's hash-chain cache."""
import hashlib
import struct
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine.block_manager import BlockAllocator, ConsistencyError
from reference_engine.prefix_cache import CachingBlockManager, HashPrefixCache, LongestPrefixFirst, hash_chain

# ---- a simple correct prefix cache, the slow way ------------------------------------------------------


class PageDictTree:
    """interfaces.PrefixCache spelled out: {every cached page-aligned prefix (a tuple): [block, stamp, locks]}.
    A node handle is the prefix tuple where a match ended (() for none)."""

    def __init__(self, page_size):
        self.P, self.pages, self.clock = page_size, {}, 0

    def _prefixes(self, tokens):
        return [tuple(tokens[:k * self.P]) for k in range(1, len(tokens) // self.P + 1)]

    def match_prefix(self, tokens):
        self.clock += 1
        blocks, end = [], ()
        for key in self._prefixes(tokens):
            if key not in self.pages:
                break
            self.pages[key][1] = self.clock
            blocks.append(self.pages[key][0])
            end = key
        return blocks, end

    def insert(self, tokens, block_ids):
        self.clock += 1
        cached = 0
        for i, key in enumerate(self._prefixes(tokens)):
            if key in self.pages:
                self.pages[key][1] = self.clock
                cached += self.P
            else:
                self.pages[key] = [int(block_ids[i]), self.clock, 0]
        return cached

    def lock(self, end):
        for key in self._prefixes(end):
            self.pages[key][2] += 1

    def unlock(self, end):
        if end and self.pages[end][2] <= 0:
            raise RuntimeError("unlock of a node that is not locked")
        for key in self._prefixes(end):
            self.pages[key][2] -= 1

    def _evictable_leaves(self):
        parents = {k[:-self.P] for k in self.pages}
        return [k for k, (_, _, locks) in self.pages.items() if locks == 0 and k not in parents]

    def evict(self, num_tokens):
        freed = []
        while len(freed) < -(-num_tokens // self.P):
            leaves = self._evictable_leaves()
            if not leaves:
                break
            freed.append(self.pages.pop(min(leaves, key=lambda k: self.pages[k][1]))[0])
        return freed

    def evictable_size(self):
        return self.P * sum(locks == 0 for _, _, locks in self.pages.values())

    def total_size(self):
        return self.P * len(self.pages)


# ---- the hash chain and the hash cache on their own ---------------------------------------------------


def test_hash_chain_keys_whole_prefixes():
    B = 4
    tokens = [5, 6, 7, 8, 5, 6, 7, 8, 9]
    got = list(hash_chain(tokens, B))
    d0 = hashlib.sha256(bytes(32) + struct.pack("<4q", 5, 6, 7, 8)).digest()
    d1 = hashlib.sha256(d0 + struct.pack("<4q", 5, 6, 7, 8)).digest()
    assert got == [d0, d1], "digest_i = sha256(digest_(i-1) + the block's ids as 8-byte ints), 32 zero bytes first"
    assert got[0] != got[1], "the same tokens after a different prefix must get a different key"
    assert len(got) == 2, "the partial last block [9] must not be keyed: it still changes"


def _op_strategy():
    tokens = st.lists(st.integers(0, 2), min_size=0, max_size=14)
    return st.lists(st.one_of(
        st.tuples(st.just("insert"), tokens),
        st.tuples(st.just("match"), tokens),
        st.tuples(st.just("lock"), st.integers(0, 50)),
        st.tuples(st.just("unlock"), st.integers(0, 50)),
        st.tuples(st.just("evict"), st.integers(0, 12)),
    ), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=_op_strategy(), page_size=st.sampled_from([1, 2, 3]))
def test_hash_cache_behaves_as_the_page_dict_tree(ops, page_size):
    """Op for op on a three-token alphabet (prefixes shared, divergence inside pages): the same blocks,
    already-cached counts, evictions and sizes. Block ids are handed out fresh, as the engine does."""
    ours, spec = HashPrefixCache(page_size), PageDictTree(page_size)
    handles, locked, next_block = [], [], 0
    for op, arg in ops:
        if op == "insert":
            ids = list(range(next_block, next_block + len(arg) // page_size))
            next_block += len(ids)
            assert ours.insert(arg, ids) == spec.insert(arg, ids)
        elif op == "match":
            (b1, n1), (b2, n2) = ours.match_prefix(arg), spec.match_prefix(arg)
            assert b1 == b2
            handles.append((n1, n2))
        elif op == "lock" and handles:
            pair = handles[arg % len(handles)]
            ours.lock(pair[0])
            spec.lock(pair[1])
            locked.append(pair)
        elif op == "unlock" and locked:
            n1, n2 = locked.pop(arg % len(locked))
            ours.unlock(n1)
            spec.unlock(n2)
        elif op == "evict":
            assert sorted(ours.evict(arg)) == sorted(spec.evict(arg))
            handles = list(locked)  # an unlocked handle may name an evicted page now: the engine drops those too
        assert (ours.evictable_size(), ours.total_size()) == (spec.evictable_size(), spec.total_size())


def test_unlock_of_an_unlocked_node_raises():
    c = HashPrefixCache(2)
    c.insert([1, 2, 3, 4], [0, 1])
    _, node = c.match_prefix([1, 2, 3, 4])
    with pytest.raises(RuntimeError, match="not locked"):
        c.unlock(node)


class _Seq:
    """What the block manager reads of a Sequence (hashable by identity, as Sequence is)."""

    def __init__(self, i, tokens):
        self.seq_id, self.token_ids, self.num_computed_tokens, self.block_table = i, list(tokens), 0, []
        self.metrics = SimpleNamespace(num_preemptions=0, num_cached_tokens=0)

    @property
    def num_tokens(self):
        return len(self.token_ids)


def test_forked_children_pin_the_blocks_they_share():
    """A parent's last prefill chunk fills a block; it forks (the child shares that block) and finishes at once
    (say its first token was a stop token). Its finish hands the block to the cache and unlocks its own path:
    the child, still running, must have the block pinned already, or the next eviction would free it."""
    bm = CachingBlockManager(BlockAllocator(8), 4, 8, HashPrefixCache(4))
    parent = _Seq(0, range(1, 9))
    bm.lookup([parent])
    bm.commit([parent])
    bm.reserve(parent, 8)
    parent.num_computed_tokens = 8  # two full blocks, computed this step, not published yet
    child = _Seq(1, parent.token_ids)
    bm.fork(parent, child)
    child.num_computed_tokens = 8
    parent.token_ids.append(0)
    bm.free(parent)
    bm.check_consistency([child])  # the shared blocks are cached and locked by the child
    assert bm.num_free() == 6 and bm.cache.evictable_size() == 0
    bm.free(child)
    bm.check_consistency([])
    assert bm.num_free() == 8 and bm.cache.total_size() == 8


# ---- the engine --------------------------------------------------------------------------------------

pytest.importorskip("transformers")
from reference_engine import LLM, LLMEngine, SamplingParams  # noqa: E402
from reference_engine.tools.testing import drive_events, save_tiny_model  # noqa: E402

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = save_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", seed=5, num_hidden_layers=1)
    return path


def shared_prompts(seed=0, n=12):
    """Prompts built from three 24-token bases: cut at random lengths, then a fresh tail; some repeat whole."""
    g = torch.Generator().manual_seed(seed)
    bases = [torch.randint(1, 256, (24,), generator=g).tolist() for _ in range(3)]
    out = []
    for i in range(n):
        cut = int(torch.randint(0, 25, (1,), generator=g))
        tail = torch.randint(1, 256, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        out.append(bases[i % 3][:cut] + tail)
    return out


def finished_clean(llm):
    """After every request ended: each block is free or held only by the cache, and nothing is locked."""
    bm = llm.engine.block_manager
    bm.check_consistency([])
    assert bm.allocator.num_free() + len(bm.owned) == bm.num_blocks
    assert bm.cache.evictable_size() == bm.cache.total_size(), "a finished request left its prefix locked"
    assert bm.num_free() == bm.num_blocks


@pytest.mark.parametrize("tight", [False, True], ids=["roomy", "preempting"])
def test_outputs_identical_with_cache_on_and_off(model_dir, tight):
    """Greedy, shared prefixes, chunked prefill (budget 8) and, when tight, a 14-block cache that preempts
    and evicts. Run twice on the same engine: the second pass hits what the first left behind."""
    ps = shared_prompts()
    kw = dict(block_size=4, max_num_seqs=4, max_num_batched_tokens=8, num_blocks=14 if tight else 64)
    params = [SamplingParams(max_tokens=6 + i % 5, **GREEDY) for i in range(len(ps))]
    ref = [o.token_ids for o in LLM(model_dir, **kw).generate(ps, params)]
    llm = LLM(model_dir, enable_prefix_caching=True, **kw)
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(ps, params)] == ref
    stats, steps = llm.engine.prefix_cache_stats, llm.engine.step_stats
    assert stats.hits > 0, "shared prefixes should have hit the cache"
    if tight:
        assert sum(s.num_preempted for s in steps) > 0 and stats.evicted_blocks > 0
        assert stats.preempted_hits > 0, "a preempted request should find its own published blocks again"
    finished_clean(llm)


def test_parallel_sampling_and_seeded_sampling_unchanged(model_dir):
    """n = 3 forks share (and copy-on-write) blocks that are also cached; seeded draws are unchanged."""
    ps = shared_prompts(seed=1, n=6)
    params = [SamplingParams(n=3, temperature=1.0, seed=i, max_tokens=7, ignore_eos=True) for i in range(len(ps))]
    kw = dict(block_size=4, max_num_seqs=6, max_num_batched_tokens=16, num_blocks=40)
    ref = [[c.token_ids for c in o.outputs] for o in LLM(model_dir, **kw).generate(ps, params)]
    llm = LLM(model_dir, enable_prefix_caching=True, **kw)
    for _ in range(2):
        assert [[c.token_ids for c in o.outputs] for o in llm.generate(ps, params)] == ref
    assert llm.engine.prefix_cache_stats.hits > 0
    finished_clean(llm)


def test_hit_accounting_on_a_hand_computed_workload(model_dir):
    """Block size 4, one request at a time, so the cache state is known. A finished request leaves the full
    blocks of prompt + output[:-1] (the last sampled token never got KV); a lookup uses prompt[:-1] (the last
    prompt token is always computed, for its logits)."""
    g = torch.Generator().manual_seed(3)
    p1 = torch.randint(1, 256, (10,), generator=g).tolist()
    fresh = torch.randint(1, 256, (5,), generator=g).tolist()
    llm = LLM(model_dir, enable_prefix_caching=True, block_size=4, max_num_batched_tokens=64)
    sp = SamplingParams(max_tokens=3, **GREEDY)
    [o1] = llm.generate(p1, sp)  # leaves 10 + 2 = 12 tokens of KV: 3 full blocks
    cases = [  # (prompt, cached tokens, why)
        (p1 + o1.token_ids[:2] + fresh, 12, "17 tokens: lookup of 16, the 3 cached blocks hit"),
        (p1, 8, "10 tokens: lookup of 9 covers 2 full blocks"),
        (p1[:8], 4, "8 tokens, block-aligned: lookup of 7 covers 1 block; the 2nd is recomputed"),
        (fresh, 0, "an unrelated prompt"),
        (p1[:3], 0, "shorter than a block"),
    ]
    for prompt, want, why in cases:
        steps_before = len(llm.engine.step_stats)
        [out] = llm.generate(prompt, sp)
        assert out.num_cached_tokens == out.metrics.num_cached_tokens == want, why
        steps = llm.engine.step_stats[steps_before:]
        assert sum(s.num_cached_tokens for s in steps) == want
        assert sum(s.num_prefill_tokens for s in steps) == len(prompt) - want, \
            f"{why}: prefill must compute only the {len(prompt) - want} uncached prompt tokens"
    s = llm.engine.prefix_cache_stats
    assert (s.requests, s.queries, s.hits) == (6, 10 + sum(len(c[0]) for c in cases), 12 + 8 + 4)
    assert s.hit_rate == pytest.approx(24 / s.queries)
    finished_clean(llm)


def test_cached_blocks_are_never_written(model_dir):
    """A request that hits cached blocks reads them but never writes into them: their K/V is bit-identical
    before and after it ran (a write would have to copy the block first)."""
    g = torch.Generator().manual_seed(4)
    p = torch.randint(1, 256, (21,), generator=g).tolist()
    llm = LLM(model_dir, enable_prefix_caching=True, block_size=4)
    llm.generate(p, SamplingParams(max_tokens=4, **GREEDY))
    bm, runner = llm.engine.block_manager, llm.engine.runner
    cached = sorted(bm.owned)
    before = runner.k_cache[:, cached].clone(), runner.v_cache[:, cached].clone()
    [out] = llm.generate([p, p[:16] + [7, 7, 7]], SamplingParams(max_tokens=6, **GREEDY))[:1]
    assert out.num_cached_tokens == 20
    assert torch.equal(runner.k_cache[:, cached], before[0]) and torch.equal(runner.v_cache[:, cached], before[1])


def test_pluggable_tree_gives_the_same_tokens_and_hits(model_dir):
    """The same workload (evicting and preempting) through the built-in hash cache and through a simple
    page-dict tree: identical tokens, per-request and per-step hits, totals and evictions."""
    ps = shared_prompts(seed=2, n=16)
    params = [SamplingParams(max_tokens=5 + i % 4, **GREEDY) for i in range(len(ps))]
    kw = dict(block_size=4, max_num_seqs=4, max_num_batched_tokens=8, num_blocks=16, enable_prefix_caching=True)
    runs = []
    for cache in (None, PageDictTree):
        llm = LLM(model_dir, prefix_cache=cache, **kw)
        outs = llm.generate(ps, params) + llm.generate(ps[::-1], params[::-1])
        runs.append(([o.token_ids for o in outs], [o.num_cached_tokens for o in outs],
                     [s.num_cached_tokens for s in llm.engine.step_stats], llm.engine.prefix_cache_stats))
        finished_clean(llm)
    assert isinstance(llm.engine.block_manager.cache, PageDictTree)
    assert runs[0] == runs[1]
    assert runs[0][3].evicted_blocks > 0 and runs[0][3].hits > 0


class IgnoresLocks(PageDictTree):
    """A broken cache: evict takes the oldest leaves whether locked or not."""

    def _evictable_leaves(self):
        parents = {k[:-self.P] for k in self.pages}
        return [k for k in self.pages if k not in parents]

    def evictable_size(self):
        return self.total_size()


def test_a_cache_that_evicts_a_block_in_use_is_caught(model_dir):
    ps = shared_prompts(seed=5, n=10)
    llm = LLM(model_dir, enable_prefix_caching=True, prefix_cache=IgnoresLocks, block_size=4, max_num_seqs=4,
              max_num_batched_tokens=8, num_blocks=14)
    with pytest.raises(ConsistencyError, match="still uses it|ref count"):
        for _ in range(3):
            llm.generate(ps, SamplingParams(max_tokens=8, **GREEDY))
            llm.engine.block_manager.check_consistency([])


def test_prefix_cache_arguments_are_checked(model_dir):
    with pytest.raises(ValueError, match="enable_prefix_caching=True"):
        LLMEngine(model_dir, prefix_cache=PageDictTree)
    with pytest.raises(TypeError, match="lacks .*evict"):
        LLMEngine(model_dir, enable_prefix_caching=True, prefix_cache=lambda page_size: object())


def test_longest_prefix_first_admits_the_longest_cached_prefix_first(model_dir):
    """One slot: an unrelated request waits before one whose prompt extends a cached conversation. FCFS
    admits the unrelated one first, lpm the cached one; each request's tokens stay the same."""
    g = torch.Generator().manual_seed(6)
    history, other, turn = (torch.randint(1, 256, (n,), generator=g).tolist() for n in (32, 20, 4))
    order, tokens = {}, {}
    for policy in (None, LongestPrefixFirst):
        eng = LLMEngine(model_dir, enable_prefix_caching=True, block_size=4, max_num_seqs=1, scheduler_policy=policy)
        LLM.from_engine(eng).generate(history, SamplingParams(max_tokens=2, **GREEDY))
        a = eng.add_request(other, SamplingParams(max_tokens=3, **GREEDY))
        b = eng.add_request(history + turn, SamplingParams(max_tokens=3, **GREEDY))
        done = []
        while eng.has_unfinished():
            done += [o.output for o in eng.step() if o.output]
        order[policy] = [o.request_id for o in done]
        tokens[policy] = {o.request_id: o.token_ids for o in done}
        assert {o.request_id: o.num_cached_tokens for o in done} == {a: 0, b: 32}
    assert order[None] == ["1", "2"] and order[LongestPrefixFirst] == ["2", "1"]
    assert tokens[None] == tokens[LongestPrefixFirst]


# ---- random request streams: no leak, no eviction of a block in use -----------------------------------

events = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 30), st.integers(1, 12), st.integers(1, 2)),
    st.tuples(st.just("abort"), st.integers(0, 100)),
    st.tuples(st.just("step"), st.integers(1, 4)),
), min_size=1, max_size=25)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=events, num_blocks=st.integers(6, 14), block_size=st.sampled_from([2, 4]),
       budget=st.sampled_from([8, 32]), tree=st.booleans())
def test_request_streams_never_leak_or_evict_blocks_in_use(model_dir, events, num_blocks, block_size, budget, tree):
    """Arrivals with shared prefixes, aborts, forks, preemption and eviction; after every step the pool and the
    cache agree (CachingBlockManager.check_consistency: ref counts = tables + cache, no unlocked page held);
    the cache itself raises if it is asked to free a block a sequence still uses. At the end every block is
    free or cached and unlocked."""
    eng = LLMEngine(model_dir, enable_prefix_caching=True, prefix_cache=PageDictTree if tree else None,
                    num_blocks=num_blocks, block_size=block_size, max_num_seqs=4, max_num_batched_tokens=budget)
    bm, sched = eng.block_manager, eng.scheduler
    g = torch.Generator().manual_seed(0)
    bases = [torch.randint(1, 256, (40,), generator=g).tolist() for _ in range(4)]

    def check():
        bm.check_consistency(sched.running + list(sched.waiting))
        assert all(s.block_table == [] and s.num_computed_tokens == 0 for s in sched.waiting)

    def add(ev, i):
        _, base, cut, extra, n = ev
        prompt = (bases[base][:cut] + torch.randint(1, 256, (extra,), generator=g).tolist())[:eng.max_seq_len - 1]
        sp = SamplingParams(n=n, temperature=1.0 if n > 1 else 0, seed=i, max_tokens=extra, ignore_eos=True)
        return eng.add_request(prompt, sp)

    drive_events(eng, events, add, check)
    assert not eng.requests
    bm.check_consistency([])
    assert bm.allocator.num_free() + len(bm.owned) == num_blocks
    assert bm.cache.evictable_size() == bm.cache.total_size()
