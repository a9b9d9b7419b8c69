"""Lesson 10 beyond the shared tests: the checks' variants against the solution, every named mistake shown
by a visible case, the fleet model's invariants, and the tuned policy's margin on many hidden traffics."""
import math
import random

import pytest

from autograder.checks import l10_autoscaling as C
from autograder.compare import compare
from solutions import l10_autoscaling as S


def _same(a, b):
    return compare(a, b, rtol=1e-12, atol=1e-12) is None


def test_variants_with_no_mistake_are_the_solution():
    rng = random.Random(3)
    for _ in range(150):
        conc, ready, cfg = C.random_kpa_case(rng)
        assert C.drive_kpa(S.kpa_decide, conc, ready, cfg) == C.drive_kpa(C.kpa_variant, conc, ready, cfg)
        args = C.random_util_case(rng)
        assert S.utilization_decide(*args) == C.util_variant(*args)
        jobs, fleet, scaler = C.random_fleet_case(rng)
        assert _same(S.simulate_fleet(jobs, fleet, scaler), C.fleet_variant(jobs, fleet, scaler))
        sim, slo = C.random_report_case(rng)
        assert _same(S.fleet_report(sim, slo), C.report_variant(sim, slo))
        args = C.random_headroom_case(rng)
        assert _same(S.min_headroom(*args), C.headroom_variant(*args))


def _shown(cases, expected_fn, mistakes_fn) -> set:
    seen = set()
    for _, args in cases:
        expected = expected_fn(*args)
        seen |= {name for name, wrong in mistakes_fn(*args).items()
                 if compare(wrong, expected, rtol=1e-9, atol=1e-12) is not None}
    return seen


def test_every_named_mistake_shows_in_a_visible_case():
    kpa = _shown(C.KPA_CASES, lambda c, r, cfg: C.drive_kpa(S.kpa_decide, c, r, cfg), lambda c, r, cfg: {
        n: C.drive_kpa(lambda *a, kw=kw: C.kpa_variant(*a, **kw), c, r, cfg) for n, kw in C.KPA_MISTAKES.items()})
    assert kpa == set(C.KPA_MISTAKES)
    for cases, ref, variant, names in [
            (C.UTIL_CASES, S.utilization_decide, C.util_variant, C.UTIL_MISTAKES),
            (C.FLEET_CASES, S.simulate_fleet, C.fleet_variant, C.FLEET_MISTAKES),
            (C.REPORT_CASES, S.fleet_report, C.report_variant, C.REPORT_MISTAKES),
            (C.HEADROOM_CASES, S.min_headroom, C.headroom_variant, C.HEADROOM_MISTAKES)]:
        seen = _shown(cases, ref, lambda *a, v=variant, ns=names: {n: v(*a, **kw) for n, kw in ns.items()})
        assert seen == set(names)


def test_docstring_examples():
    cfg = S.KPAConfig(target=10, utilization=1.0)
    desired, state = S.kpa_decide([(2, 10), (4, 10), (6, 13)], 6, 1, cfg, S.KPAState())
    assert desired == 2 and state.panic_since == 6
    assert S.utilization_decide([(2.0, 1.0)], 2.0, 4, S.UtilConfig()) == 6
    rep = S.fleet_report({"ttft": [0.1, 0.2, math.inf], "replicas": [(0, 3600), (1800, 3600)], "end": 3600}, 0.15)
    assert rep == {"gpu_hours": 1.5, "mean_replicas": 1.5, "p99_ttft": math.inf, "late": 1, "dropped": 1,
                   "slo_met": False}
    h = S.min_headroom(0.5, 60, 1.5, 12)
    assert h["lead_s"] == 65 and h["concurrency"] == pytest.approx(48.75) and h["replicas"] == 5


def test_panic_mode_never_scales_down_until_a_stable_window_passes():
    cfg = S.KPAConfig(target=10, utilization=1.0, stable_window=20, panic_window_pct=20)
    conc = [5] * 5 + [80] * 3 + [5] * 20
    out = C.drive_kpa(S.kpa_decide, conc, [1] * len(conc), cfg)
    peak = out.index(max(out))
    calm = next(i for i in range(peak, len(out)) if out[i] < max(out))
    assert all(x == max(out) for x in out[peak:calm]) and (calm - 7) * 2 > cfg.stable_window


def test_fleet_invariants():
    rng = random.Random(5)
    for _ in range(100):
        jobs, fleet, scaler = C.random_fleet_case(rng)
        sim = S.simulate_fleet(jobs, fleet, scaler)
        served = [x for x in sim["ttft"] if x != math.inf]
        assert all(x >= j.prefill_s - 1e-12 for x, j in zip(sim["ttft"], jobs) if x != math.inf)
        assert all(x - j.prefill_s <= fleet.timeout_s + 1e-9 for x, j in zip(sim["ttft"], jobs) if x != math.inf)
        assert len(served) <= len(jobs)
        assert all(launch <= stop <= sim["end"] for launch, stop in sim["replicas"])
        assert all(row[2] <= len(sim["replicas"]) for row in sim["timeline"])


def test_a_static_schedule_serves_like_a_fixed_fleet():
    """With every replica up from t = 0 and never removed, GPU-hours are replicas * end."""
    jobs = S.trace_jobs([(0, 5.0)], 120.0, seed=2, slots=8)
    fleet = S.Fleet(slots=8, initial=4)
    sim = S.simulate_fleet(jobs, fleet, [(0.0, 4)])
    assert S.fleet_report(sim, 2.0)["gpu_hours"] == pytest.approx(4 * sim["end"] / 3600)


def test_warp_follows_the_profile():
    arrivals = [i * 0.5 for i in range(2001)]  # 2 rps, evenly
    out = S.warp(arrivals, [(0, 4.0), (100, 4.0), (200, 8.0)])
    assert out[400] == pytest.approx(100.0, abs=0.1)  # 400 arrivals at 4 rps
    assert sum(100 <= t < 200 for t in out) == pytest.approx(600, abs=2)  # mean rate 6 rps on the ramp


@pytest.mark.parametrize("seed", range(8))
def test_tuned_policy_passes_hidden_traffic_with_margin_and_utilization_loses(seed):
    spec = C.traffic(random.Random(1000 + seed))
    prof, s, slots, boot, initial = spec
    fleet = S.Fleet(slots=slots, boot_s=boot, initial=initial)
    jobs = S.trace_jobs(prof, C.DURATION_S, seed=s, slots=slots)
    bound = S.GPU_HOURS_BOUND * S.oracle_gpu_hours(jobs, fleet)
    rep = S.fleet_report(S.simulate_fleet(jobs, fleet, S.tuned_kpa(fleet)), S.TTFT_SLO_S)
    assert rep["p99_ttft"] <= 0.75 * S.TTFT_SLO_S and rep["gpu_hours"] <= 0.9 * bound, (spec, rep, bound)
    util = S.fleet_report(S.simulate_fleet(jobs, fleet, S.UtilConfig(max_replicas=64)), S.TTFT_SLO_S)
    assert not (util["slo_met"] and util["gpu_hours"] <= bound)


def test_hidden_traffic_is_one_the_lessons_settings_meet_with_margin():
    """Seed 134449537 once drew a 3x ramp behind 90 s boots that the lesson's own tuned KPA missed by a hair
    (p99 2.08 s for a 2 s SLO): hidden cases now take the first of a few candidates those settings meet with a
    10% margin, so a learner who followed the lesson does not fail on the draw."""
    from autograder.runner import Target, grade_lesson
    (r,) = grade_lesson("l10_autoscaling", Target.for_lesson("l10_autoscaling", solutions=True), 134449537,
                        only=["tuned_kpa"])
    assert r.status == "passed", r.message
