"""Lesson 03 beyond the shared tests: the closed form against brute force, the simulators against
each other and against the engine, and the checks' wrong-answer variants against the mutants."""
import itertools
import math
import random

import pytest

from autograder.checks import l03_continuous_batching as checks
from autograder.compare import compare
from autograder.core import Trial
from autograder.harnesses.engine import run_engine
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


# -- every mistake a check names shows in a visible case (so on every seed) ------------------------------

def _exercised(cases, expected_fn, mistakes_fn) -> set:
    """The mistakes whose value differs from the expected one on at least one of `cases`."""
    seen = set()
    for _, args in cases:
        expected = expected_fn(*args)
        seen |= {name for name, wrong in mistakes_fn(*args).items() if compare(wrong, expected, rtol=1e-9)}
    return seen


def test_every_named_simulation_mistake_shows_in_a_visible_case():
    static = _exercised(checks.STATIC_CASES, S.simulate_static, lambda reqs, B: {
        name: checks.static_variant(reqs, B, **kw) for name, kw in checks.STATIC_MISTAKES.items()})
    assert static == set(checks.STATIC_MISTAKES)
    step = _exercised(checks.STEP_CASES, S.continuous_step, lambda *a: {
        name: checks.step_variant(*a, v) for name, v in checks.STEP_MISTAKES.items()})
    assert step == set(checks.STEP_MISTAKES)
    cont = _exercised(checks.CONTINUOUS_CASES, S.simulate_continuous, checks.continuous_mistakes)
    assert cont == set(checks.continuous_mistakes(*checks.CONTINUOUS_CASES[0][1]))
    emax = _exercised(checks.EMAX_CASES, S.expected_max, checks.emax_mistakes)
    assert emax == set(checks.emax_mistakes(*checks.EMAX_CASES[0][1]))
    for part, key in ((0, "gain"), (1, "padding_waste")):
        seen = _exercised(checks.GAIN_CASES, lambda pmf, B, key=key: S.batching_gain(pmf, B)[key],
                          lambda pmf, B, part=part: checks.gain_mistakes(pmf, B)[part])
        assert seen == set(checks.gain_mistakes({1: 1.0}, 1)[part])


def test_check_step_variants_leave_their_arguments_alone():
    running, waiting = [(0, 0), (1, 2)], [2, 3]
    for v in [""] + list(checks.STEP_MISTAKES.values()):
        checks.step_variant(running, waiting, [R(0, 1), R(0, 3), R(0, 3), R(9, 1)], 2, 4, v)
    assert running == [(0, 0), (1, 2)] and waiting == [2, 3]


def _visible_engine_cases():
    return checks.engine_cases(Trial(None, None, 0, False, visible_only=True))


@pytest.mark.parametrize("static", [False, True])
def test_every_wrong_policy_shows_in_a_visible_engine_case(static):
    """Each named wrong policy changes the run (schedule, or an engine error) of a visible case, and the
    chunked visible case makes a static policy keep chunking the prompt its batch started."""
    variants = checks.STATIC_VARIANTS if static else checks.CONTINUOUS_VARIANTS
    seen = set()
    for _, (prompts, lens, kw) in _visible_engine_cases():
        expected = checks._static_reference(S, prompts, lens, kw) if static else run_engine(prompts, lens, kw, model=checks.MODEL)
        assert expected["finished"] and expected["leak"] is None
        for name, v in variants.items():
            run = checks._variant_run(prompts, lens, kw, 10_000, v(kw["max_num_seqs"]))
            if checks._outcome(run) != checks._outcome(expected):
                seen.add(name)
    assert seen == set(variants)


def test_the_cuda_graph_section_claims():
    """Section 4.5's text, on vLLM v0.33.0's default capture sizes (the interview's copy of the rule): a batch of 37
    runs the 40 graph, the worst padded share of a small graph is close to half, at most 15 rows are padded past 256,
    and on the modeled H100 padding costs well under 1% of a decode step."""
    from autograder.interview.l03_continuous_batching import padded_rows, vllm_capture_sizes
    from reference_engine.sim import gpu_model
    sizes = vllm_capture_sizes()
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 512 and 248 in sizes and 264 not in sizes
    assert padded_rows(37, sizes) == 3 and padded_rows(600, sizes) == 0
    shares = [padded_rows(b, sizes) / (b + padded_rows(b, sizes)) for b in range(1, 513)]
    assert 0.4 < max(shares) < 0.5
    assert max(padded_rows(b, sizes) for b in range(257, 513)) == 15
    for b in (3, 37, 257, 500):
        pad = padded_rows(b, sizes)
        real, padded = (gpu_model.step_time(gpu_model.LLAMA_3_8B, gpu_model.H100,
                                            gpu_model.Composition(decodes=(1024,) * b + (1,) * p)).time_s
                        for p in (0, pad))
        assert (padded - real) / real < 0.01
