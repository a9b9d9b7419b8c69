"""Lesson 04: the solutions agree with the engine's own slot mapping, and the KV replay keeps its books."""
import random
from types import SimpleNamespace

import torch

from solutions import l04_paged_attention as L
from reference_engine import trace
from reference_engine.model_runner import ModelRunner
from reference_engine.scheduler import ScheduledSeq, SchedulerOutput


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
