"""Lesson 04: the solutions agree with the engine's own slot mapping, the KV replay keeps its books, and
the kernel launcher and the checks' harnesses do what the checks rely on."""
import random
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from autograder.checks import l04_paged_attention as C
from reference_engine.kernels.launch import launch
from reference_engine.model_runner import ModelRunner
from reference_engine.scheduler import ScheduledSeq, SchedulerOutput
from reference_engine.sim import trace
from solutions import l04_paged_attention as L


def test_slot_mapping_matches_the_engines_model_runner():
    rng = random.Random(0)
    bs = 4
    scheduled, expected = [], []
    for _ in range(3):
        n_tok = rng.randint(2, 20)
        table = rng.sample(range(40), -(-n_tok // bs))
        computed = rng.randint(0, n_tok - 1)
        seq = SimpleNamespace(num_computed_tokens=computed, block_table=table, token_ids=list(range(n_tok)),
                              num_tokens=n_tok)
        scheduled.append(ScheduledSeq(seq, n_tok - computed))
        expected.append(L.slot_mapping(torch.tensor(table), torch.arange(computed, n_tok), bs))
    runner = ModelRunner.__new__(ModelRunner)
    runner.block_size, runner.device = bs, torch.device("cpu")
    _, _, meta, _ = runner.prepare(SchedulerOutput(prefills=scheduled))
    assert torch.equal(meta.slot_mapping, torch.cat(expected))


def test_replay_books_balance():
    reqs = trace.with_rate(trace.sample(300, seed=1), 100.0)
    cap = 200_000
    res = {m: L.replay_kv(reqs, cap, m, max_steps=50_000) for m in ("max", "oracle", "paged")}
    for m, r in res.items():
        assert r.finished == len(reqs), m
        assert all(t <= a <= cap for t, a in zip(r.tokens, r.allocated)), m
    assert max(res["max"].running) <= cap // 8192
    # paged waste is below one block per running request
    assert all(a - t < 16 * n for t, a, n in zip(res["paged"].tokens, res["paged"].allocated, res["paged"].running))
    assert max(res["paged"].running) > 2 * max(res["max"].running)


def test_launch_reports_a_stub_kernel_as_the_stubs_own_error():
    msg = "Exercise 9.9 (stub_kernel): see section 9.9 of lessons/l99.ipynb"

    @triton.jit
    def stub_kernel(x_ptr, N: tl.constexpr):
        raise NotImplementedError("Exercise 9.9 (stub_kernel): see section 9.9 of lessons/l99.ipynb")

    @triton.jit
    def other_kernel(x_ptr, N: tl.constexpr):
        raise NotImplementedError("an operation this Triton lacks")

    with pytest.raises(NotImplementedError) as e:
        launch(stub_kernel, (1,), torch.zeros(4), N=4, stub=msg)
    assert str(e.value) == msg
    with pytest.raises(Exception) as e:  # not the stub: re-raised as it came, whatever Triton wrapped it in
        launch(other_kernel, (1,), torch.zeros(4), N=4, stub=msg)
    assert "Exercise" not in str(e.value)


def test_strided_table_harness_hands_the_learner_a_view():
    wide = torch.arange(12, dtype=torch.int32).view(2, 6)
    seen = {}

    def fn(q, k, v, bt, lens, scale):
        seen["stride"], seen["table"] = bt.stride(0), bt.tolist()

    C.call_with_table_view(fn, None, None, None, wide, 4, None, 1.0)
    assert seen == {"stride": 6, "table": [[0, 1, 2, 3], [6, 7, 8, 9]]}


def test_engine_harnesses_agree_with_the_solution_allocator():
    """The allocator check's sampling run copies on write, and the solution's allocator gives the engine's tokens."""
    greedy, parallel = C.engine_workload(random.Random(4))
    ref = C.sample_in_engine(parallel, C.ENGINE_KW, **C.SAMPLING)
    mine = C.sample_in_engine(parallel, {**C.ENGINE_KW, "block_allocator": L.PagedBlockAllocator}, **C.SAMPLING)
    assert mine == ref and ref["leak"] is None and ref["free_blocks"] == ref["num_blocks"]
    assert all(len(p) % C.ENGINE_KW["block_size"] for p in parallel)  # the forked children copy on write
