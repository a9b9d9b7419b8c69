"""The paged-cache bookkeeping never leaks, never hands a block out twice, keeps ref counts exact."""
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine.block_manager import BlockAllocator, BlockManager, ConsistencyError


def seq(i):
    return SimpleNamespace(seq_id=i, num_computed_tokens=0, block_table=[])


def test_allocator_basics():
    a = BlockAllocator(3)
    b0, b1 = a.allocate(), a.allocate()
    assert b0 != b1 and a.num_free() == 1 and a.can_allocate(1) and not a.can_allocate(2)
    table = a.fork([b0, b1])
    assert [a.ref_count(b) for b in table] == [2, 2]
    new, old = a.append_slot(table)  # shared last block: copy-on-write
    assert old == b1 and new not in (b0, b1) and table == [b0, new] and a.ref_count(b1) == 1
    assert a.append_slot(table) == (new, None)  # now exclusively owned
    for b in (b0, b0, b1, new):
        a.free(b)
    assert a.num_free() == 3
    with pytest.raises(RuntimeError, match="freed more times"):
        a.free(b0)
    with pytest.raises(RuntimeError, match="incref of free block"):
        a.incref(b0)


def test_copy_on_write_only_for_a_partly_filled_shared_block():
    bm = BlockManager(BlockAllocator(8), block_size=4, num_blocks=8)
    parent = seq(0)
    bm.reserve(parent, 6)
    parent.num_computed_tokens = 6  # blocks: [full, half]
    child = seq(1)
    bm.fork(parent, child)
    child.num_computed_tokens = 6
    assert bm.blocks_needed(child, 1) == 1
    copies = bm.reserve(child, 1)
    assert copies == [(parent.block_table[1], child.block_table[1])] and child.block_table[0] == parent.block_table[0]
    assert bm.reserve(parent, 1) == []  # the parent's half block is its own again
    full = seq(2)
    bm.fork(parent, full)
    parent.num_computed_tokens = full.num_computed_tokens = 8  # exactly two full blocks: nothing to copy
    assert bm.blocks_needed(full, 1) == 1 and bm.reserve(full, 1) == []
    bm.check_consistency([parent, child, full])
    for s in (parent, child, full):
        bm.free(s)
    assert bm.num_free() == 8


def test_inconsistencies_raise_consistency_error():
    """A real exception (a RuntimeError), not `assert`: python -O must not silence a leak."""
    bm = BlockManager(BlockAllocator(4), block_size=4, num_blocks=4)
    s = seq(0)
    bm.reserve(s, 6)
    with pytest.raises(ConsistencyError, match="block .*: ref count 1, held by 0"):
        bm.check_consistency([])  # s's blocks leak when it is forgotten
    bm.check_consistency([s])
    s.block_table.append(s.block_table[0])
    with pytest.raises(ConsistencyError, match="holds a block twice"):
        bm.check_consistency([s])
    s.block_table.pop()
    bm.allocator._free.append(s.block_table[0])  # a held block also on the free list
    with pytest.raises(ConsistencyError, match="free blocks, expected"):
        bm.check_consistency([s])
    assert issubclass(ConsistencyError, RuntimeError)


ops = st.lists(st.tuples(st.sampled_from(["new", "grow", "fork", "free"]), st.integers(0, 1000), st.integers(1, 40)),
               min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=ops, block_size=st.sampled_from([1, 4, 16]), num_blocks=st.integers(1, 24))
def test_block_manager_random_streams_keep_invariants(ops, block_size, num_blocks):
    bm = BlockManager(BlockAllocator(num_blocks), block_size, num_blocks)
    live, next_id = [], 0
    for op, pick, n in ops:
        if op == "new" or not live:
            s = seq(next_id)
            next_id += 1
            if bm.can_reserve(s, n):
                bm.reserve(s, n)
                s.num_computed_tokens = n
                live.append(s)
        elif op == "grow":
            s = live[pick % len(live)]
            if bm.can_reserve(s, n):
                before = bm.num_free()
                need = bm.blocks_needed(s, n)
                for src, dst in bm.reserve(s, n):
                    assert src != dst and dst in s.block_table and src not in s.block_table
                assert before - bm.num_free() == need
                s.num_computed_tokens += n
        elif op == "fork":
            parent, child = live[pick % len(live)], seq(next_id)
            next_id += 1
            bm.fork(parent, child)
            child.num_computed_tokens = parent.num_computed_tokens
            live.append(child)
        else:
            bm.free(live.pop(pick % len(live)))
        for s in live:
            assert len(s.block_table) == -(-s.num_computed_tokens // block_size)
        bm.check_consistency(live)
    for s in live:
        bm.free(s)
    bm.check_consistency([])
    assert bm.num_free() == num_blocks


# ---- the same invariants through the whole engine: arrivals, aborts, preemption, forks -----------

pytest.importorskip("transformers")
from reference_engine import LLMEngine, SamplingParams  # noqa: E402
from reference_engine.tools.testing import drive_events, save_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory):
    path, _ = save_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", seed=3, num_hidden_layers=1)
    return lambda **kw: LLMEngine(path, **kw)


events = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 60), st.integers(1, 25), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("abort"), st.integers(0, 100)),
    st.tuples(st.just("step"), st.integers(1, 4)),
), min_size=1, max_size=25)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=events, num_blocks=st.integers(5, 12), block_size=st.sampled_from([4, 16]), budget=st.sampled_from([8, 32]))
def test_engine_request_streams_never_leak_blocks(engine_factory, events, num_blocks, block_size, budget):
    eng = engine_factory(num_blocks=num_blocks, block_size=block_size, max_num_seqs=4, max_num_batched_tokens=budget)
    bm, sched, g = eng.block_manager, eng.scheduler, torch.Generator().manual_seed(0)

    def check():
        bm.check_consistency(sched.running + list(sched.waiting))
        assert all(s.block_table == [] for s in sched.waiting)  # waiting ones hold nothing (preempted: freed)

    def add(ev, i):
        _, plen, max_tokens, n, sampled = ev
        plen = min(plen, eng.max_seq_len - 1)
        prompt = torch.randint(0, 256, (plen,), generator=g).tolist()
        sp = SamplingParams(n=n, temperature=1.0 if sampled else 0, seed=i, max_tokens=max_tokens, ignore_eos=True)
        return eng.add_request(prompt, sp)

    drive_events(eng, events, add, check)
    assert bm.num_free() == num_blocks and not eng.requests
