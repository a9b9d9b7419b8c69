"""Lesson 03 beyond the shared tests: the closed form against brute force, the simulators against
each other and against the engine, and the checks' wrong-answer variants against the mutants."""
import itertools
import math
import random

import pytest

from autograder.checks import l03_continuous_batching as checks
from solutions import l03_continuous_batching as S

R = S.Request


def test_expected_max_matches_enumeration():
    rng = random.Random(7)
    for _ in range(100):
        ks = rng.sample(range(1, 30), rng.randint(1, 4))
        ws = [rng.random() + 0.01 for _ in ks]
        pmf = {k: w / sum(ws) for k, w in zip(ks, ws)}
        B = rng.randint(1, 5)
        brute = sum(max(c) * math.prod(pmf[x] for x in c) for c in itertools.product(pmf, repeat=B))
        assert math.isclose(S.expected_max(pmf, B), brute, rel_tol=1e-12)
        assert math.isclose(checks.cdf_sum(pmf, B, 0), brute, rel_tol=1e-12)


def test_long_run_static_gain_approaches_the_closed_form():
    """Many full batches of i.i.d. lengths: static/continuous steps -> E[max]/E[L]."""
    rng = random.Random(3)
    pmf = {1: 0.5, 4: 0.3, 20: 0.2}
    lens = rng.choices(list(pmf), weights=list(pmf.values()), k=8 * 600)
    reqs = [R(0, n) for n in lens]
    ratio = S.simulate_static(reqs, 8)["total_steps"] / S.simulate_continuous(reqs, 8)["total_steps"]
    assert ratio == pytest.approx(S.batching_gain(pmf, 8)["gain"], rel=0.03)


def test_simulators_conserve_work_and_respect_limits():
    rng = random.Random(11)
    for _ in range(200):
        B = rng.randint(1, 6)
        reqs = checks.random_requests(rng, rng.randint(1, 20), rng.choice([0, 5, 30]))
        for sim in (S.simulate_static, S.simulate_continuous):
            res = sim(reqs, B)
            assert sum(res["slots_used"]) == sum(r.output_len for r in reqs)
            assert max(res["slots_used"]) <= B and len(res["slots_used"]) == res["total_steps"]
            assert all(f >= r.arrival + r.output_len for f, r in zip(res["finish"], reqs))
        # with everything waiting, continuous never takes longer than static
        offline = [R(0, r.output_len) for r in reqs]
        assert S.simulate_continuous(offline, B)["total_steps"] <= S.simulate_static(offline, B)["total_steps"]


def test_check_variants_reproduce_the_reference():
    rng = random.Random(5)
    for _ in range(100):
        B = rng.randint(1, 5)
        reqs = checks.random_requests(rng, rng.randint(1, 15), rng.choice([0, 10]))
        assert checks.static_variant(reqs, B) == S.simulate_static(reqs, B)
        assert checks.drive(reqs, B) == S.simulate_continuous(reqs, B)


def test_engine_steps_equal_the_simulations():
    """With enough KV blocks and no chunking, one engine step is one simulation step."""
    reqs, prompts = S.trace_workload(12, seed=1, max_context=128)
    lens = [r.output_tokens for r in reqs]
    sim = [R(0, n) for n in lens]
    cont = S.run_engine(S.load_llm(None, max_num_seqs=4), prompts, lens)
    stat = S.run_engine(S.load_llm(S.StaticPolicy(4), max_num_seqs=4), prompts, lens)
    assert cont["slots_used"] == S.simulate_continuous(sim, 4)["slots_used"]
    assert stat["slots_used"] == S.simulate_static(sim, 4)["slots_used"]
    assert stat["tokens"] == cont["tokens"]
