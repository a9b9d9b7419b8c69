"""Lesson 07 beyond the shared tests: the checks' copies of the rules against the solutions, the
recorded policy calls against the reference policy, every named mistake shown by a visible case, and the
policy's contract on small cases and in the engine (short prompts get past a long one)."""
import random

import pytest

from autograder.checks import l07_chunked_prefill as checks
from autograder.checks._engine import stopped
from autograder.compare import compare
from autograder.harnesses.engine import run_engine
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


def _reference_runs():
    rng = random.Random(0)
    cases = [case for _, case in checks.ENGINE_CASES] + [checks.random_engine_case(rng) for _ in range(4)]
    return [(policy, checks.reference_run(S, prompts, 6, kwargs, policy)) for kwargs, policy, prompts in cases]


@pytest.fixture(scope="module")
def reference_runs():
    return _reference_runs()


def test_recorded_calls_replay_the_reference_policy(reference_runs):
    """The grader's replay of a recorded call (its Budget from the recorded numbers) picks what the
    reference ChunkedPrefillPolicy picked, on every call of every run, visible and hidden."""
    for policy, run in reference_runs:
        assert run["finished"] and run["error"] is None and run["policy_calls"]
        for call in run["policy_calls"]:
            assert checks.rule(*checks.replay(call, run["block_size"]), *policy) == call["picks"]


def test_every_wrong_rule_shows_in_a_visible_engine_case(reference_runs):
    seen = set()
    for policy, run in reference_runs[:len(checks.ENGINE_CASES)]:
        for call in run["policy_calls"]:
            expected = checks.rule(*checks.replay(call, run["block_size"]), *policy)
            seen |= {name for name, kw in checks.POLICY_MISTAKES.items()
                     if checks.rule(*checks.replay(call, run["block_size"]), *policy, **kw) != expected}
    assert seen == set(checks.POLICY_MISTAKES)


def test_the_visible_cases_let_short_prompts_past_long_ones(reference_runs):
    """What the chunked cases are there for: a short prompt gets tokens in a step that leaves an older long
    prompt unfinished; and where two or more prompts are long, some step holds one back while a short one
    behind it goes."""
    def short_past_long(threshold, call):
        picks, cands = dict(call["picks"]), call["candidates"]
        return any(a["uncomputed"] > picks.get(a["seq_id"], 0) and b["seq_id"] in picks and b["uncomputed"] <= threshold
                   for i, a in enumerate(cands) for b in cands[i + 1:])

    def held_for_short(threshold, call):
        picks, cands = dict(call["picks"]), call["candidates"]
        held = [i for i, c in enumerate(cands) if c["uncomputed"] > threshold and c["seq_id"] not in picks]
        return bool(held) and any(c["seq_id"] in picks for c in cands[held[0] + 1:])

    chunked = [(p, r) for p, r in reference_runs[:len(checks.ENGINE_CASES)] if r["policy_calls"][0]["chunked"]]
    assert len(chunked) == len(checks.ENGINE_CASES) - 1
    for (threshold, _), run in chunked:
        assert any(short_past_long(threshold, c) for c in run["policy_calls"])
    for (threshold, _), run in chunked[1:3]:  # two long prompts; three long ones
        assert any(held_for_short(threshold, c) for c in run["policy_calls"])


class _Seq:
    def __init__(self, seq_id, uncomputed, prompt, waiting=True):
        self.seq_id, self.num_uncomputed_tokens, self.num_prompt_tokens = seq_id, uncomputed, prompt
        self.is_waiting, self.num_slots = waiting, 1


class _Tokens:
    """A Budget that only counts tokens (the rule's other limits are the engine's)."""

    def __init__(self, tokens, chunked=True):
        self.tokens, self.chunked_prefill = tokens, chunked

    def try_take(self, seq, n):
        if not 0 < n <= min(self.tokens, seq.num_uncomputed_tokens):
            return False
        self.tokens -= n
        return True


def _picks(policy, seqs, tokens, chunked=True):
    return [(s.seq_id, n) for s, n in policy.schedule(seqs, _Tokens(tokens, chunked))]


def test_the_policy_on_small_cases():
    p = S.ChunkedPrefillPolicy(16)
    long_a, long_b = _Seq("a", 100, 100, waiting=False), _Seq("b", 80, 80)
    short = _Seq("s", 10, 10)
    assert _picks(p, [long_a, long_b, short], 64) == [("a", 16), ("s", 10)]  # b held back, s goes past it
    assert _picks(S.ChunkedPrefillPolicy(16, 2), [long_a, long_b, short], 64) == [("a", 16), ("b", 16), ("s", 10)]
    last = _Seq("a", 16, 100, waiting=False)  # a long prompt's last chunk: 16 left, not more than 16: short
    assert _picks(p, [last, long_b, short], 64) == [("a", 16), ("b", 16), ("s", 10)]
    assert _picks(p, [long_a, short], 12) == [("a", 12)]  # the budget left caps a chunk too, then FCFS stops
    assert _picks(p, [long_a, long_b, short], 64, chunked=False) == []  # whole or wait: 100 > 64
    assert _picks(p, [_Seq("x", 30, 30), _Seq("y", 30, 30), short], 64, chunked=False) == [("x", 30), ("y", 30)]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None])
def test_the_policy_refuses_a_bad_threshold_or_cap(bad):
    with pytest.raises(ValueError):
        S.ChunkedPrefillPolicy(bad)
    with pytest.raises(ValueError):
        S.ChunkedPrefillPolicy(16, bad)


def test_with_no_prompt_long_the_policy_is_the_engines_fcfs():
    """A threshold above every prompt: nothing is long or capped, and the run is the engine's own FCFS one."""
    for kwargs, _, prompts in [case for _, case in checks.ENGINE_CASES]:
        fcfs = run_engine(prompts, 6, kwargs, model=checks.MODEL)
        mine = checks.reference_run(S, prompts, 6, kwargs, (10_000, 1))
        assert mine["schedule"] == fcfs["schedule"] and mine["tokens"] == fcfs["tokens"]


def test_short_prompts_behind_a_long_one_get_their_first_token_sooner():
    """The lesson's claim, in engine steps: FCFS makes short prompts wait for a long prefill, the policy not."""
    rng = random.Random(7)
    prompts = [[rng.randrange(1, 2048) for _ in range(n)] for n in (200, 12, 12, 12)]
    kwargs = dict(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=48)

    def first_token_steps(make):
        from autograder.harnesses.engine import build_llm
        from reference_engine import SamplingParams
        engine = build_llm(kwargs, make).engine
        ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)) for p in prompts]
        first, step = {}, 0
        while engine.has_unfinished():
            step += 1
            for out in engine.step():
                first.setdefault(out.request_id, step)
        return [first[i] for i in ids]

    fcfs = first_token_steps({})
    capped = first_token_steps({"scheduler_policy": (S.ChunkedPrefillPolicy, 24)})
    assert max(capped[1:]) < min(fcfs[1:])  # every short prompt is served before FCFS serves any
    assert capped[0] > fcfs[0]  # the price: the long prompt's chunks are capped at 24 tokens


def test_run_engine_returns_errors_as_data_but_not_a_stub():
    class Raises:
        def schedule(self, candidates, budget):
            return {}["oops"]

    class Stub:
        def schedule(self, candidates, budget):
            raise NotImplementedError("Exercise 1.2")

    kwargs, _, prompts = checks.ENGINE_CASES[0][1]
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


def _modeled_prefill(prompt_len, budget, decodes=64, ctx=1024):
    from reference_engine.sim.gpu_model import H100, LLAMA_3_8B, Composition, step_time
    share = budget - decodes
    return [step_time(LLAMA_3_8B, H100, Composition(prefills=((min(share, prompt_len - s), s),),
                                                    decodes=(ctx,) * decodes)).time_s
            for s in range(0, prompt_len, share)]


def test_the_default_budget_section_matches_the_modeled_clock():
    """Section 2.3's text: at vLLM's `vllm serve` H100 default (8,192) the worst step of a 20k prompt is about 25
    decode steps, the middle (8,128-token) chunk is the slowest, and TTFT barely changes between 2,048 and 16,384."""
    from reference_engine.sim.gpu_model import H100, LLAMA_3_8B, Composition, step_time
    decode = step_time(LLAMA_3_8B, H100, Composition.decode_batch(64, 1024)).time_s
    t = _modeled_prefill(20000, 8192)
    assert 23 <= max(t) / decode <= 27 and t.index(max(t)) == 1
    ttfts = [sum(_modeled_prefill(20000, b)) for b in (2048, 8192, 16384)]
    assert max(ttfts) / min(ttfts) < 1.1
