"""Lesson 07 beyond the shared tests: the checks' copies of the rules against the solutions, the
recorded policy calls against the engine's own policy, and every named mistake shown by a visible case."""
import random

import pytest

from autograder.checks import l07_chunked_prefill as checks
from autograder.compare import compare
from autograder.engine_harness import run_engine, stopped
from solutions import l07_chunked_prefill as S


def _plan_mistakes_seen(seed: int) -> set:
    seen = set()

    def plan(decoding, queue, budget, step):
        expected = S.plan_step(decoding, queue, budget)
        seen.update(n for n, w in checks.plan_mistakes(decoding, queue, budget).items() if w != expected)
        return expected

    for _, (budget, reqs) in checks.PLAN_CASES:
        computed = checks.simulate(budget, reqs, random.Random(seed), plan)
        assert all(computed[r["id"]] == r["prompt_len"] for r in reqs)
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2, 12345])
def test_every_plan_mistake_shows_in_the_visible_runs_on_any_seed(seed):
    assert _plan_mistakes_seen(seed) == set(checks.plan_mistakes([], [], 1))


def test_hidden_runs_keep_the_decodes_within_the_budget():
    rng = random.Random(3)
    for _ in range(50):
        budget, reqs = checks.scenario(rng)

        def plan(decoding, queue, budget, step):
            assert len(decoding) <= budget
            return S.plan_step(decoding, queue, budget)

        checks.simulate(budget, reqs, rng, plan)


def _fcfs_runs():
    rng = random.Random(0)
    cases = [case for _, case in checks.ENGINE_CASES] + [checks.random_engine_case(rng) for _ in range(3)]
    return [run_engine(prompts, 6, kwargs, record_policy=True) for kwargs, prompts in cases]


@pytest.fixture(scope="module")
def fcfs_runs():
    return _fcfs_runs()


def test_recorded_calls_replay_the_engines_own_policy(fcfs_runs):
    """The grader's replay of a recorded call (its Budget from the recorded numbers) picks what the
    engine's FCFSPolicy picked, on every call of every run."""
    for run in fcfs_runs:
        assert run["finished"] and run["error"] is None and run["policy_calls"]
        for call in run["policy_calls"]:
            assert checks.rule(*checks.replay(call, run["block_size"])) == call["picks"]


def test_every_wrong_rule_shows_in_a_visible_engine_case(fcfs_runs):
    seen = set()
    for run in fcfs_runs[:len(checks.ENGINE_CASES)]:
        for call in run["policy_calls"]:
            for name, kw in checks.POLICY_MISTAKES.items():
                if checks.rule(*checks.replay(call, run["block_size"]), **kw) != call["picks"]:
                    seen.add(name)
    assert seen == set(checks.POLICY_MISTAKES)


def test_run_engine_returns_errors_as_data_but_not_a_stub():
    class Raises:
        def schedule(self, candidates, budget):
            return {}["oops"]

    class Stub:
        def schedule(self, candidates, budget):
            raise NotImplementedError("Exercise 1.2")

    kwargs, prompts = checks.ENGINE_CASES[0][1]
    run = run_engine(prompts, 6, kwargs, make={"scheduler_policy": (Raises,)}, record_policy=True, catch=True)
    assert run["error"]["type"] == "KeyError" and not run["finished"]
    assert run["policy_calls"][-1]["picks"] is None
    assert "KeyError" in stopped(run) and "stopped at step 0" in stopped(run)
    with pytest.raises(NotImplementedError):
        run_engine(prompts, 6, kwargs, make={"scheduler_policy": (Stub,)}, catch=True)


def test_every_step_time_mistake_shows_in_a_visible_case():
    seen = set()
    for _, args in checks.STEP_CASES:
        expected = S.step_time(*args)
        assert checks.cost_model(*args) == pytest.approx(expected, rel=1e-12)
        seen |= {n for n, w in checks.step_time_mistakes(*args).items() if compare(w, expected, rtol=1e-6)}
    assert seen == set(checks.step_time_mistakes(*checks.STEP_CASES[0][1]))


def test_every_budget_mistake_shows_in_a_visible_case_and_the_right_rule_is_the_reference():
    seen = set()
    rng = random.Random(1)
    cases = [case for _, case in checks.BUDGET_CASES]
    for k, case in enumerate(cases + [checks.budget_case(rng) for _ in range(20)]):
        expected = S.choose_budget(*case)
        assert compare(checks.wrong_choice(*case), expected, rtol=1e-9) is None
        if k < len(cases):
            seen |= {n for n, kw in checks.BUDGET_MISTAKES.items()
                     if compare(checks.wrong_choice(*case, **kw), expected, rtol=1e-6)}
    assert seen == set(checks.BUDGET_MISTAKES)


def test_the_boundary_case_is_met_exactly():
    cost, slo, P, d, ctx = checks.BUDGET_CASES[2][1]
    r = S.choose_budget(cost, slo, P, d, ctx)
    assert r["budget"] == 104 and r["max_step_s"] == slo
    # any order of the sum gives the same time: every term is a multiple of 2**-27, far from 2**-53
    for chunk, start in ((100, 400), (12, 500)):
        pairs = d * ctx + chunk * start + chunk * (chunk + 1) // 2
        assert (cost["per_attn_s"] * pairs + cost["per_token_s"] * (d + chunk) + cost["overhead_s"]
                == S.step_time(cost, d, ctx, chunk, start))
