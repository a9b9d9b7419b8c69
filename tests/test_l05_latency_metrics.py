"""Lesson 05 beyond the shared tests: the reference agrees with numpy and with vLLM's benchmark
formulas, the checks' traces keep ties exact, and the replay harness records real engine runs."""
import math
import random

import numpy as np
import pytest

from autograder.checks import l05_latency_metrics as checks
from solutions import l05_latency_metrics as S


def _own(records):
    """The checks' requests (Records, as they cross to the learner) as the reference's RequestTimes."""
    return [S.RequestTimes(**r.fields) for r in records]

# -- percentiles ----------------------------------------------------------------------------------

def test_percentile_matches_numpys_default_on_random_samples():
    rng = random.Random(5)
    for _ in range(500):
        n = rng.randint(1, 80)
        pool = [rng.uniform(0, 3) for _ in range(rng.randint(1, 10))]
        xs = [rng.choice(pool) if rng.random() < 0.4 else rng.lognormvariate(-3, 1) for _ in range(n)]
        q = rng.choice([0, 1, 25, 50, 90, 95, 99, 99.9, 100, rng.uniform(0, 100)])
        assert math.isclose(S.percentile(xs, q), float(np.percentile(xs, q)), rel_tol=1e-12, abs_tol=1e-15)


def test_percentile_edges():
    assert S.percentile([15, 20, 35, 40, 50], 40) == 29.0
    assert S.percentile([3.0], 0) == S.percentile([3.0], 100) == 3.0
    for bad in [([], 50), ([1.0], -1), ([1.0], 100.5)]:
        with pytest.raises(ValueError):
            S.percentile(*bad)


# -- per-request metrics against vLLM's formulas ---------------------------------------------------

def _vllm_style(requests, ttft_slo, tpot_slo):
    """vLLM `vllm bench serve` (vllm/benchmarks/serve.py, calculate_metrics): tpot = 0 for one-token requests in the goodput
    check, a request is good when every SLO >= its value, goodput = good / duration."""
    ttfts = [r.token_times[0] - r.arrival for r in requests]
    all_tpots = []
    for r, ttft in zip(requests, ttfts):
        n, latency = len(r.token_times), r.finish - r.arrival
        all_tpots.append((latency - ttft) / (n - 1) if n > 1 else 0)
    good = sum(all(s >= v for s, v in zip((ttft_slo, tpot_slo), m)) for m in zip(ttfts, all_tpots))
    duration = max(r.finish for r in requests) - min(r.arrival for r in requests)
    return good, good / duration


@pytest.mark.parametrize("seed", range(20))
def test_goodput_agrees_with_vllms_rule_on_random_traces(seed):
    rng = random.Random(seed)
    reqs = _own(checks.random_trace(rng, rng.randint(1, 30), one_token_share=0.3))
    ttfts = sorted(S.ttft(r) for r in reqs)
    tpots = sorted(x for x in (S.tpot(r) for r in reqs) if x is not None) or [0.02]
    ttft_slo, tpot_slo = rng.choice(ttfts), rng.choice(tpots)   # ties on purpose
    good, rate = _vllm_style(reqs, ttft_slo, tpot_slo)
    g = S.goodput(reqs, ttft_slo, tpot_slo)
    assert g["met"] == good and g["goodput_rps"] == pytest.approx(rate, rel=1e-12)
    assert g["attainment"] == pytest.approx(good / len(reqs))


def test_goodput_of_an_empty_run_is_zero():
    assert set(S.goodput([], 1.0, 1.0).values()) == {0}


def test_tpot_is_the_mean_itl_and_ties_are_exact_on_the_check_grid():
    """The checks put every timestamp on a 2**-10 s grid so that SLO ties survive any formula order."""
    rng = random.Random(1)
    for _ in range(300):
        (r,) = _own([checks.random_request(rng, checks._on_grid(rng.uniform(1, 900)))])
        gaps = S.itl(r)
        assert len(gaps) == r.output_tokens - 1
        assert S.tpot(r) == (r.finish - r.token_times[0]) / (r.output_tokens - 1)           # exact
        if r.finish == r.token_times[-1]:
            assert S.tpot(r) == float(np.mean(gaps))                                         # exact too
        assert S.ttft(r) == r.token_times[0] - r.arrival


def test_latency_summary_matches_numpy():
    rng = random.Random(2)
    reqs = _own(checks.random_trace(rng, 25, one_token_share=0.3))
    s = S.latency_summary(reqs, (50, 90, 99))
    pooled = [b - a for r in reqs for a, b in zip(r.token_times, r.token_times[1:])]
    tpots = [(r.finish - r.token_times[0]) / (r.output_tokens - 1) for r in reqs if r.output_tokens > 1]
    for name, xs in [("itl", pooled), ("tpot", tpots), ("ttft", [r.token_times[0] - r.arrival for r in reqs])]:
        assert s[name]["count"] == len(xs)
        assert s[name]["mean"] == pytest.approx(np.mean(xs))
        for q in (50, 90, 99):
            assert s[name][f"p{q}"] == pytest.approx(np.percentile(xs, q))
    assert S.latency_summary([]) == {m: None for m in S.METRICS}


def test_the_visible_goodput_trace_tells_every_mistake_apart():
    """The designed 13-request trace gives a different count for each wrong SLO rule, and its last
    request to finish does so after its last token."""
    reqs = checks.goodput_trace()
    per = [checks._slo_variants(r, checks.SLO_TTFT, checks.SLO_TPOT) for r in reqs]
    counts = {name: sum(v[name] for v in per) for name in per[0]}
    right = sum(S.meets_slo(r, checks.SLO_TTFT, checks.SLO_TPOT) for r in _own(reqs))
    assert right == 6
    assert len(set(counts.values()) | {right}) == len(counts) + 1
    assert max(r.finish for r in reqs) > max(r.token_times[-1] for r in reqs)


# -- the replay harness on the real engine ----------------------------------------------------------

def test_replay_records_real_engine_timestamps():
    llm = S.load_llm(max_num_seqs=4)
    reqs, prompts = S.workload(6, seed=3, max_context=128)
    rp = S.replay(llm, reqs, prompts, rate_rps=50.0)
    assert len(rp.requests) == len(reqs) and rp.wall_s > 0 and rp.steps
    for want, r in zip(reqs, rp.requests):
        assert r.output_tokens == want.output_tokens          # EOS ignored: exactly the trace length
        assert r.arrival <= r.scheduled <= r.token_times[0] <= r.finish == r.token_times[-1]
        assert all(a < b for a, b in zip(r.token_times, r.token_times[1:]))
        for t in r.token_times:                               # each token was stamped inside a step
            start, wall, _, _ = rp.step_at(t)
            assert start <= t <= start + wall + 1e-9
    arrivals = [r.arrival for r in rp.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] == pytest.approx(0.0, abs=1e-9)
