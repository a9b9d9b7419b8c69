"""Lesson 08 beyond the shared tests: the fault injection and the router, the schedule-only replay against
the full engine, the reference diagnosis on every replay the checks use (visible and hidden seeds), the
checks' own copies of the rules against the solutions, and every named mistake shown by a visible case."""
import random
from dataclasses import replace

import numpy as np
import pytest

from autograder.checks import l08_tail_latency as checks
from autograder.harnesses import l08_tail_latency as harness
from reference_engine.sim import faults, router
from reference_engine.sim import trace as tr
from reference_engine.sim.gpu_model import H100
from solutions import l08_tail_latency as S

# -- the engine side -----------------------------------------------------------------------------------


def _reqs(n=40, seed=0):
    return tr.with_rate(tr.scale_to_context(tr.sample(n, seed=seed), 512), 20.0)


def test_burst_squeezes_arrivals_and_keeps_order():
    reqs = _reqs()
    out = faults.burst(reqs, at=0.5, size=10, width=0.01)
    first = next(i for i, r in enumerate(reqs) if r.arrival >= 0.5)
    assert len(out) == len(reqs)
    assert [r.arrival for r in out] == sorted(r.arrival for r in out)
    assert all(0.5 <= out[i].arrival < 0.51 for i in range(first, first + 10))
    assert out[:first] == reqs[:first] and out[first + 10:] == reqs[first + 10:]


def test_long_prompt_flood_is_seeded_and_fits_the_context():
    reqs = _reqs(200)
    a = faults.long_prompt_flood(reqs, 0.5, 500, 512, seed=3)
    assert a == faults.long_prompt_flood(reqs, 0.5, 500, 512, seed=3)
    hit = [r for r, o in zip(a, reqs) if r != o]
    assert 60 < len(hit) < 140
    assert all(r.prompt_tokens == 500 and 1 <= r.output_tokens <= 12 for r in hit)


def test_host_pause_charges_the_modeled_clock_every_nth_step():
    class Eng:
        def __init__(self):
            from reference_engine.sim.gpu_model import LLAMA_3_8B, ModeledClock
            self.clock = ModeledClock(LLAMA_3_8B, H100)

    eng, hook = Eng(), faults.HostPause(every=3, pause_s=0.25)
    for _ in range(7):
        hook(eng)
    assert hook.pauses == 2 and eng.clock() == pytest.approx(0.5)


def test_slow_chip_and_round_robin():
    slow = faults.slow_chip(H100, 2.0)
    assert slow.dense_tflops == H100.dense_tflops / 2 and slow.hbm_gb_per_s == H100.hbm_gb_per_s / 2
    assert router.round_robin(5, 2) == [0, 1, 0, 1, 0]
    with pytest.raises(ValueError):
        router.round_robin(3, 0)


def test_schedule_only_replay_has_the_full_engines_timestamps():
    a = S.replay_fault("host_stall", n=30, compute=True)
    b = S.replay_fault("host_stall", n=30, compute=False)
    assert a["requests"] == b["requests"] and a["steps"] == b["steps"]


def test_token_times_are_step_ends_and_steps_do_not_overlap():
    data = checks.replay("preemption", checks.VISIBLE_SEED)
    for steps in data["steps"]:
        assert all(a["end"] <= b["start"] for a, b in zip(steps, steps[1:]))
    for r in data["requests"]:
        ends = {s["end"] for s in data["steps"][r["replica"]]}
        assert all(t in ends for t in r["token_times"])
    assert sum(r["num_preemptions"] for r in data["requests"]) > 0


# -- the diagnosis the checks rely on ------------------------------------------------------------------

CASES = checks.replay_keys()  # every replay a check can draw


@pytest.mark.parametrize("cause,seed", CASES)
def test_the_reference_names_every_injected_fault(cause, seed):
    """first_suspect's answer is the injected cause on every replay the check can draw; the grader's copy of
    the procedure agrees with the solution."""
    data = checks.replay(cause, seed)
    assert S.first_suspect(data["requests"], data["steps"]) == cause
    assert checks.suspect_variant(data["requests"], data["steps"]) == cause


# -- the checks' copies and their mistakes ---------------------------------------------------------------


def test_grader_copies_match_the_solutions():
    for cause in ("host_stall", "preemption", "bad_replica"):
        data = checks.replay(cause, checks.VISIBLE_SEED)
        rs, steps = data["requests"], data["steps"]
        for i in checks.pick_requests(rs):
            r = rs[i]
            # the grader's copy sums through cumulative sums: the same values up to rounding
            assert checks.attribute(r, steps[r["replica"]]) == pytest.approx(S.attribute_request(r, steps[r["replica"]]),
                                                                             rel=1e-9, abs=1e-12)
        assert checks.shares_variant(rs, steps, 90) == pytest.approx(S.tail_shares(rs, steps, 90))
        assert checks.summary_variant(rs, 99) == S.tail_summary(rs, 99)
    rng = random.Random(0)
    for _ in range(200):
        lats, ratio = checks.random_latencies(rng)
        assert checks.straggler_variant(lats, ratio) == S.straggler_replica(lats, ratio)
    for _, (lats, ratio) in checks.STRAGGLER_CASES:
        assert checks.straggler_variant(lats, ratio) == S.straggler_replica(lats, ratio)


def test_attribution_adds_up_within_the_request():
    """The four components never exceed the request's E2E, and none is negative."""
    data = checks.replay("host_stall", checks.VISIBLE_SEED)
    for r in data["requests"]:
        a = S.attribute_request(r, data["steps"][r["replica"]])
        assert min(a.values()) >= -1e-12
        assert sum(a.values()) <= r["finish"] - r["arrival"] + 1e-9


def _differs(a, b) -> bool:
    """a differs from b beyond the checks' tolerance (rtol 1e-6, atol 1e-9): what t.expect offers."""
    if isinstance(a, dict):
        return any(_differs(a[k], b[k]) for k in b)
    if isinstance(a, (tuple, list)):
        return any(_differs(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return not (a == b or (np.isnan(a) and np.isnan(b)) or abs(a - b) <= 1e-9 + 1e-6 * abs(b))
    return a != b


def _offered(mistakes: dict, expected) -> set:
    return {name for name, v in mistakes.items() if _differs(v, expected)}


def test_every_mistake_shows_in_a_visible_case():
    seen = set()
    rs = checks.replay("none", 0)["requests"]
    seen |= _offered({n: checks.summary_variant(rs, 99, **kw) for n, kw in checks.SUMMARY_MISTAKES.items()}, S.tail_summary(rs, 99))
    assert seen == set(checks.SUMMARY_MISTAKES)

    seen = set()
    for _, (request, st) in checks.SMALL_ATTRIBUTE_CASES:
        seen |= _offered({n: checks.attribute(request, st, **kw) for n, kw in checks.ATTRIBUTE_MISTAKES.items()},
                         S.attribute_request(request, st))
    for cause in ("host_stall", "preemption", "prefill_interference"):
        data = checks.replay(cause, checks.VISIBLE_SEED)
        for i in checks.pick_requests(data["requests"]):
            r = data["requests"][i]
            st = data["steps"][r["replica"]]
            seen |= _offered({n: checks.attribute(r, st, **kw) for n, kw in checks.ATTRIBUTE_MISTAKES.items()},
                             S.attribute_request(r, st))
    assert seen == set(checks.ATTRIBUTE_MISTAKES)

    seen = set()
    rs, st = checks.fleet(**checks.SHARES_FLEET)
    for q in (90, 85):
        seen |= _offered({n: checks.shares_variant(rs, st, q, **kw) for n, kw in checks.SHARES_MISTAKES.items()},
                         S.tail_shares(rs, st, q))
    for cause, q in (("queueing", 90), ("bad_replica", 95)):
        data = checks.replay(cause, checks.VISIBLE_SEED)
        expected = S.tail_shares(data["requests"], data["steps"], q)
        for n, kw in checks.SHARES_MISTAKES.items():
            got = checks.shares_variant(data["requests"], data["steps"], q, **kw)
            if any(abs(got[k] - expected[k]) > 1e-6 * abs(expected[k]) + 1e-9 for k in expected):
                seen.add(n)
    assert seen == set(checks.SHARES_MISTAKES)

    seen = set()
    for _, (lats, ratio) in checks.STRAGGLER_CASES:
        seen |= _offered(checks.straggler_mistakes(lats, ratio), S.straggler_replica(lats, ratio))
    assert seen == {*checks.STRAGGLER_MISTAKES, checks.RATIO_IGNORED}

    seen = set()
    for cause in ("none", *checks.CAUSES):
        data = checks.replay(cause, checks.VISIBLE_SEED)
        seen |= _offered(checks.suspect_mistakes(data["requests"], data["steps"]), cause)
    for _, fleet_faults, args in checks.SUSPECT_CASES:
        rs, st = checks.fleet(**fleet_faults)
        seen |= _offered(checks.suspect_mistakes(rs, st, *args), S.first_suspect(rs, st, *args))
    assert seen == {*checks.SUSPECT_MISTAKES, *checks.ARGUMENT_IGNORED.values()}


def _named_alone(mistakes: dict, expected) -> set:
    """The mistakes a learner making them would see named alone: wrong, and unlike every other mistake."""
    wrong = {n: v for n, v in mistakes.items() if _differs(v, expected)}
    return {n for n, v in wrong.items() if all(_differs(v, w) for m, w in wrong.items() if m != n)}


# Mistakes no single case can tell from another one (each is named with it, "X; or your code Y"): asking
# "was anything preempted?" of the tail only gives what judging preemption by its share gives when the
# preempted request is outside the tail, and what dropping the guard on queueing gives when the tail also
# queued; a big queue with preemptions named preemption at once differs from the right order only where
# ruling out preemption before prefill interference does too; E2E > the cut keeps the same requests as the
# int(n * (1 - q/100)) slowest whenever the cut is a request's E2E.
# (a fleet-wide preemption guard answers as "checks the replicas last" wherever it is wrong: a preemption anywhere
# makes the later suspects end at preemption before a replicas-last order reaches bad_replica)
INSEPARABLE = {"asks whether a request was preempted of the tail only", "names preemption as soon as a big queue",
               "takes the tail as E2E > the cut", "rules out bad_replica when any request in the fleet"}


def test_the_new_visible_cases_name_each_mistake_alone():
    """Each mistake of the synthetic cases is named on its own by some visible case (but the inseparable)."""
    alone = set()
    for _, (request, st) in checks.SMALL_ATTRIBUTE_CASES:
        alone |= _named_alone({n: checks.attribute(request, st, **kw) for n, kw in checks.ATTRIBUTE_MISTAKES.items()},
                              S.attribute_request(request, st))
    rs, st = checks.fleet(**checks.SHARES_FLEET)
    for q in (90, 85):
        alone |= _named_alone({n: checks.shares_variant(rs, st, q, **kw) for n, kw in checks.SHARES_MISTAKES.items()},
                              S.tail_shares(rs, st, q))
    for _, (lats, ratio) in checks.STRAGGLER_CASES:
        alone |= _named_alone(checks.straggler_mistakes(lats, ratio), S.straggler_replica(lats, ratio))
    for _, fleet_faults, args in checks.SUSPECT_CASES:
        rs, st = checks.fleet(**fleet_faults)
        alone |= _named_alone(checks.suspect_mistakes(rs, st, *args), S.first_suspect(rs, st, *args))
    every = {*checks.ATTRIBUTE_MISTAKES, *checks.SHARES_MISTAKES, *checks.STRAGGLER_MISTAKES, checks.RATIO_IGNORED,
             *checks.SUSPECT_MISTAKES, *checks.ARGUMENT_IGNORED.values()}
    # the replays name the rest (the older mistakes, some of them only there)
    older = {"counts every host gap of the run", "leaves the host gaps in queue_s", "counts the step that produced",
             "takes the mean of the decode-only", "averages over every request", "averages per-request shares",
             "judges every request against replica 0", "includes the replica itself", "names queueing although",
             "judges preemption by its share", "names the largest share", "checks the replicas last",
             "names a straggler bad_replica",
             "takes the int(n", "counts a whole prefill-carrying step", "chooses the tail by TTFT"}
    missing = {n for n in every - alone if not any(n.startswith(p) for p in INSEPARABLE | older)}
    assert not missing, missing


def test_the_synthetic_fleets_are_well_formed_and_the_grader_copies_agree():
    cases = [checks.SHARES_FLEET] + [f for _, f, _ in checks.SUSPECT_CASES]
    for fleet_faults in cases:
        rs, st = checks.fleet(**fleet_faults)
        for steps in st:
            assert all(a["end"] <= b["start"] for a, b in zip(steps, steps[1:]))
        for r in rs:
            steps = st[r["replica"]]
            assert set(r["token_times"]) <= {s["end"] for s in steps}
            assert r["arrival"] <= r["first_scheduled"] <= r["token_times"][0] and r["finish"] == r["token_times"][-1]
            assert checks.attribute(r, steps) == pytest.approx(S.attribute_request(r, steps), rel=1e-9, abs=1e-12)
    for _, fleet_faults, args in checks.SUSPECT_CASES:
        rs, st = checks.fleet(**fleet_faults)
        assert checks.suspect_variant(rs, st, *args) == S.first_suspect(rs, st, *args)
    rs, st = checks.fleet(**checks.SHARES_FLEET)
    for q in (85, 90):
        assert checks.shares_variant(rs, st, q) == pytest.approx(S.tail_shares(rs, st, q))


def test_the_edge_cases_the_synthetic_fleets_are_built_for():
    # a share exactly at min_share: binary fractions make it exact whatever the order of the sums
    _, fleet_faults, (q, min_share, _) = next(c for c in checks.SUSPECT_CASES if "exactly min_share" in c[0])
    rs, st = checks.fleet(**fleet_faults)
    assert S.tail_shares(rs, st, q)["queue_s"] == min_share
    # the only preempted request is outside the tail
    rs, st = checks.fleet(**checks.SUSPECT_CASES[0][1])
    cut = np.percentile([r["finish"] - r["arrival"] for r in rs], 90)
    assert [r["finish"] - r["arrival"] < cut for r in rs if r["num_preemptions"]] == [True]
    # the q=90 cut of SHARES_FLEET is the E2E of two tied requests; at q=85 ceil(20 * 0.15) is 4, not 3
    rs, _ = checks.fleet(**checks.SHARES_FLEET)
    e2e = sorted(r["finish"] - r["arrival"] for r in rs)
    assert np.percentile(e2e, 90) == e2e[-2] == e2e[-3] < e2e[-1]
    assert sum(x >= np.percentile(e2e, 85) for x in e2e) == 3 and int(np.ceil(20 * (1 - 85 / 100))) == 4


def test_one_token_requests_have_no_itl():
    out = S.tail_summary(checks.ONE_TOKEN, 99)
    assert all(np.isnan(x) for x in out["itl"]) and not any(np.isnan(x) for x in out["ttft"] + out["e2e"])


def test_tail_summary_docstring_and_edge_cases():
    r = [{"arrival": 0.0, "token_times": [0.5, 0.6, 1.0], "finish": 1.0},
         {"arrival": 1.0, "token_times": [1.2], "finish": 1.2}]
    out = S.tail_summary(r, 100)
    assert out["itl"] == pytest.approx((0.25, 0.4)) and out["ttft"] == pytest.approx((0.35, 0.5))
    one = S.tail_summary([{"arrival": 0.0, "token_times": [0.1], "finish": 0.1}])
    assert np.isnan(one["itl"][0])


def test_straggler_edge_cases():
    assert S.straggler_replica([[1.0], []]) is None
    assert S.straggler_replica([[1.0, 1.0], [1.6, 1.6]]) == 1
    assert S.straggler_replica([[0.0], [1.0]]) == 1  # others' median 0: infinitely slower


def test_fault_spec_refuses_unknown_causes():
    with pytest.raises(ValueError):
        faults.FaultSpec(cause="cosmic_rays")
    assert replace(faults.FaultSpec(), cause="queueing").cause == "queueing"


# -- the wire: columns and one round trip ---------------------------------------------------------------


def test_columns_give_back_the_very_records():
    data = checks.replay("preemption", checks.VISIBLE_SEED)
    requests, steps = harness.from_columns(harness.to_columns(data))
    assert requests == data["requests"] and steps == data["steps"]
    assert [list(r) for r in requests[:3]] == [list(r) for r in data["requests"][:3]]  # same key order


def test_call_on_replay_matches_direct_calls_and_flags_edits():
    data = checks.replay("host_stall", checks.VISIBLE_SEED)
    cols, rs, st = harness.to_columns(data), data["requests"], data["steps"]
    picked = checks.pick_requests(rs)
    got = harness.call_on_replay(S.attribute_request, cols, [[["$request", i], ["$steps_of", i]] for i in picked])
    assert got == [[S.attribute_request(rs[i], st[rs[i]["replica"]]), None] for i in picked]
    assert harness.call_on_replay(S.tail_shares, cols, [[["$requests"], ["$steps"], 95]]) == [[S.tail_shares(rs, st, 95), None]]

    def edits_steps(requests, steps_by_replica):
        steps_by_replica[0].pop()
        return "none"

    def edits_request(request, steps):
        request["token_times"].append(0.0)
        return {}

    assert harness.call_on_replay(edits_steps, cols, [[["$requests"], ["$steps"]]] * 2) == [["none", 1]] * 2
    assert harness.call_on_replay(edits_request, cols, [[["$request", 0], ["$steps_of", 0]]]) == [[{}, 0]]


@pytest.mark.slow
def test_the_stored_replays_are_the_engines():
    """Every replay a check can draw is stored with the course and read instead of replayed: each must equal
    the engine's replay computed now, float for float. After a change to the engine, the router, the fault
    injection or the modeled clock, write them again: python -m autograder.checks.l08_tail_latency"""
    for cause, seed in checks.replay_keys():
        stored = checks._stored_replay(cause, seed)
        assert stored is not None, f"no stored replay {cause}/{seed} in {checks.REPLAYS_DIR}"
        assert stored == checks.compute_replay(cause, seed), (
            f"the stored replay {cause}/{seed} is not the engine's any more: run "
            "python -m autograder.checks.l08_tail_latency")
