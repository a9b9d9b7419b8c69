"""Checks for lesson 05: TTFT, TPOT, ITL, percentiles, the latency summary, SLOs and goodput.

Hidden cases are traces drawn from t.rng: Poisson-like arrivals that do not start at 0, queueing
before the first schedule, one-token requests, ITL stalls (a decode waiting behind a prefill), and
SLOs set exactly at some request's TTFT or TPOT, so ties at the SLO occur. Every timestamp lies on
a grid of 2**-10 s, so differences of timestamps are exact in floating point and a TTFT or TPOT
computed in any order lands on the same float as the reference: a tie stays a tie.

Wrong answers named in the messages are computed here by small wrong implementations (the
`_wrong_*` functions), on the same inputs as the expected values.
"""
from __future__ import annotations

import math
import random

from autograder.core import check

GRID = 2.0 ** -10  # seconds


def _on_grid(x: float, at_least: int = 1) -> float:
    return max(at_least, round(x / GRID)) * GRID


# -- traces -----------------------------------------------------------------------------------

def make_request(ref, arrival: float, queue: float, prefill: float, gaps: list[float]):
    """A request arriving at `arrival`, scheduled `queue` s later, first token `prefill` s after
    that, then one token per gap. All inputs are already on the grid."""
    times = [arrival + queue + prefill]
    for g in gaps:
        times.append(times[-1] + g)
    return ref.RequestTimes(arrival=arrival, token_times=times, finish=times[-1], scheduled=arrival + queue)


def random_request(ref, rng: random.Random, arrival: float, one_token: bool = False):
    queue = 0.0 if rng.random() < 0.3 else _on_grid(rng.uniform(0.0, 0.4))
    prefill = _on_grid(rng.uniform(0.01, 0.25))
    n = 1 if one_token else rng.randint(2, 20)
    gaps = [_on_grid(rng.uniform(0.08, 0.3)) if rng.random() < 0.1 else _on_grid(rng.uniform(0.005, 0.04))
            for _ in range(n - 1)]  # ~10% stalls: a decode step that waited behind someone's prefill
    return make_request(ref, arrival, queue, prefill, gaps)


def random_trace(ref, rng: random.Random, n: int, one_token_share: float = 0.2) -> list:
    t = _on_grid(rng.uniform(1.0, 500.0))  # a clock that does not start at 0
    out = []
    for _ in range(n):
        out.append(random_request(ref, rng, t, rng.random() < one_token_share))
        t += _on_grid(rng.expovariate(rng.uniform(2.0, 20.0)), at_least=0)
    return out


def _describe(r) -> str:
    times = ", ".join(f"{x:g}" for x in r.token_times[:6]) + (", ..." if len(r.token_times) > 6 else "")
    return (f"RequestTimes(arrival={r.arrival:g}, scheduled={r.scheduled:g}, token_times=[{times}] "
            f"({len(r.token_times)} token{'s' if len(r.token_times) != 1 else ''}), finish={r.finish:g})")


def _as_list(x):
    """Accept a numpy array or tuple where a list is asked for."""
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple)):
        return x.tolist()
    return list(x) if isinstance(x, tuple) else x


def _as_bool(x):
    """numpy's bool_ is a fine answer for a bool."""
    return bool(x) if type(x).__name__ == "bool_" else x


def _differs(wrong: dict, expected) -> dict:
    """Only the mistakes whose value is not the right answer can be told apart from it."""
    from autograder.compare import compare
    out = {}
    for k, v in wrong.items():
        try:
            if compare(v, expected) is not None:
                out[k] = v
        except Exception:  # noqa: BLE001 - a mistake of another shape simply differs
            out[k] = v
    return out


# A request that queues: arrives at 2.0, scheduled at 2.25, tokens at 2.5, 2.625, 2.875, 2.9375.
def visible_request(ref):
    return ref.RequestTimes(arrival=2.0, token_times=[2.5, 2.625, 2.875, 2.9375], finish=2.9375,
                            scheduled=2.25)


def one_token_request(ref):
    return ref.RequestTimes(arrival=7.0, token_times=[7.375], finish=7.375, scheduled=7.125)


# -- 1.1 TTFT ---------------------------------------------------------------------------------

@check(points=1, section="1.1")
def ttft(t):
    """First token time - arrival (not - scheduled time)."""
    rng = t.rng
    cases = [("a request that queued 0.25 s", visible_request(t.ref)),
             ("a one-token request", one_token_request(t.ref))]
    cases += [("hidden", random_request(t.ref, rng, _on_grid(rng.uniform(1, 900)))) for _ in range(3)]
    for label, r in cases:
        with t.case(f"{label}: {_describe(r)}"):
            expected = t.ref.ttft(r)
            first = r.token_times[0]
            wrong = {"measures from when the request was first scheduled, not from its arrival (the user "
                     "waits through the queue too)": first - r.scheduled,
                     "returns the first token's timestamp, not the time since arrival": first,
                     "measures to the last token (that is the end-to-end latency, not TTFT)": r.finish - r.arrival,
                     "returns milliseconds (every function here works in seconds)": 1000 * expected}
            t.expect(t.call("ttft", r), expected, "TTFT (s)", mistakes=_differs(wrong, expected))


# -- 1.2 TPOT ---------------------------------------------------------------------------------

def tpot_mistakes(r, expected) -> dict:
    n, latency = len(r.token_times), r.finish - r.arrival
    ttft_ = r.token_times[0] - r.arrival
    if n < 2:
        return {"returns 0 for a one-token request (it has no TPOT: return None)": 0.0}
    return _differs({
        "divides by output_tokens instead of output_tokens - 1 (the first token is not a decode step)":
            (latency - ttft_) / n,
        "includes the TTFT in the numerator (TPOT is (latency - TTFT) / (output_tokens - 1))":
            latency / (n - 1),
        "divides the whole latency by the number of tokens (TTFT included, and by output_tokens)": latency / n,
        "measures the latency from the scheduling time, not from the arrival":
            (r.finish - r.scheduled - ttft_) / (n - 1),
    }, expected)


@check(points=2, section="1.2")
def tpot(t):
    """(latency - TTFT) / (output tokens - 1); None for one output token."""
    rng = t.rng
    two = t.ref.RequestTimes(arrival=0.5, token_times=[0.75, 1.25], finish=1.25, scheduled=0.5)
    cases = [("a request of 4 tokens that queued", visible_request(t.ref)),
             ("a request of 2 tokens", two),
             ("a one-token request (no TPOT)", one_token_request(t.ref))]
    cases += [("hidden", random_request(t.ref, rng, _on_grid(rng.uniform(1, 900)))) for _ in range(3)]
    cases.append(("hidden one-token request", random_request(t.ref, rng, _on_grid(rng.uniform(1, 900)), True)))
    for label, r in cases:
        with t.case(f"{label}: {_describe(r)}"):
            expected = t.ref.tpot(r)
            got = t.call("tpot", r)
            hint = ("a request with one output token has no time between tokens: return None (vLLM leaves it "
                    "out of the TPOT statistics)") if expected is None else ""
            t.expect(got, expected, "TPOT (s)", mistakes=tpot_mistakes(r, expected), hint=hint)


# -- 1.3 ITL ----------------------------------------------------------------------------------

@check(points=1, section="1.3")
def itl(t):
    """The gaps between successive tokens, after the first."""
    rng = t.rng
    cases = [("a request of 4 tokens", visible_request(t.ref)),
             ("a one-token request (no gaps)", one_token_request(t.ref))]
    cases += [("hidden", random_request(t.ref, rng, _on_grid(rng.uniform(1, 900)))) for _ in range(3)]
    for label, r in cases:
        with t.case(f"{label}: {_describe(r)}"):
            expected = t.ref.itl(r)
            first = r.token_times[0]
            wrong = {"includes the TTFT gap (arrival to first token); ITL starts after the first token":
                         [first - r.arrival] + expected,
                     "includes the gap from scheduling to the first token; ITL starts after the first token":
                         [first - r.scheduled] + expected,
                     "returns each token's time since the first token, not the gaps between tokens":
                         [x - first for x in r.token_times[1:]]}
            got = _as_list(t.call("itl", r))
            t.expect(got, expected, "ITL gaps (s)", mistakes=_differs(wrong, expected))


# -- 2.1 percentiles --------------------------------------------------------------------------

def _lerp(s, q):
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (k - lo) * (s[hi] - s[lo])


def percentile_mistakes(values, q, expected) -> dict:
    s, n = sorted(values), len(values)
    idx = "sorts and indexes without interpolating"
    return _differs({
        f"{idx} (s[int(n * q / 100)])": float(s[min(n - 1, int(n * q / 100))]),
        f"{idx} (s[floor((n - 1) * q / 100)])": float(s[math.floor((n - 1) * q / 100)]),
        f"{idx} (s[round((n - 1) * q / 100)])": float(s[round((n - 1) * q / 100)]),
        f"{idx} (nearest rank, s[ceil(n * q / 100) - 1])": float(s[max(0, math.ceil(n * q / 100) - 1)]),
        "does not sort the values first": float(_lerp(list(values), q)),
        "returns the mean, not the percentile": sum(values) / n,
    }, expected)


@check(points=2, section="2.1")
def percentile(t):
    """numpy's linear interpolation between the order statistics, written by hand."""
    rng = t.rng
    cases = [("five values, q=40 (k = 1.6)", [15, 20, 35, 40, 50], 40),
             ("a skewed sample, the median of an even count", [1.0, 2.0, 3.0, 10.0], 50),
             ("unsorted values, q=90", [5.0, 1.0, 4.0, 2.0, 3.0], 90),
             ("ties", [7, 7, 7, 1, 9, 7], 25),
             ("two values, q=99", [2.0, 4.0], 99),
             ("one value", [3.5], 99),
             ("q=0 is the minimum", [0.25, 0.125, 0.5], 0),
             ("q=100 is the maximum", [0.25, 0.125, 0.5], 100)]
    for _ in range(4):
        n = rng.randint(3, 60)
        pool = [round(rng.lognormvariate(-3, 1), 4) for _ in range(max(1, n // 3))]  # few distinct: ties
        values = [rng.choice(pool) if rng.random() < 0.5 else round(rng.lognormvariate(-3, 1), 4) for _ in range(n)]
        q = rng.choice([50, 90, 95, 99, 99.9, round(rng.uniform(0, 100), 2)])
        cases.append((f"hidden ({n} values)", values, q))
    for label, values, q in cases:
        shown = values if len(values) <= 12 else values[:12] + ["..."]
        with t.case(f"{label}: percentile({shown}, {q})"):
            expected = t.ref.percentile(values, q)
            t.expect(t.call("percentile", values, q), expected, f"p{q:g}",
                     mistakes=percentile_mistakes(values, q, expected))
    with t.case("no values raises ValueError"):
        t.expect_raises(ValueError, "percentile", [], 50, what="percentile",
                      why="a percentile of nothing is undefined; a dashboard must not show 0 for it")
    with t.case("q outside [0, 100] raises ValueError"):
        t.expect_raises(ValueError, "percentile", [1.0, 2.0], 150, what="percentile",
                      why="q is a percent (0-100); 150 is a caller's bug")


# -- 2.2 the latency summary ------------------------------------------------------------------

def _row(ref, xs, percentiles):
    if not xs:
        return None
    row = {"count": len(xs), "mean": sum(xs) / len(xs)}
    for q in percentiles:
        row[f"p{q:g}"] = ref.percentile(xs, q)
    return row


def summary_mistakes(ref, requests, percentiles) -> dict[str, dict[str, dict | None]]:
    """For each metric, wrong rows by the mistake that produces them."""
    gaps = [ref.itl(r) for r in requests]
    per_request = [g for g in gaps if g]
    averaged = None
    if per_request:
        averaged = {"count": len(per_request),
                    "mean": sum(sum(g) / len(g) for g in per_request) / len(per_request)}
        for q in percentiles:
            averaged[f"p{q:g}"] = sum(ref.percentile(g, q) for g in per_request) / len(per_request)
    tpot_zero = [0.0 if ref.tpot(r) is None else ref.tpot(r) for r in requests]
    return {
        "ttft": {"measures TTFT from the scheduling time, not the arrival":
                 _row(ref, [r.token_times[0] - r.scheduled for r in requests], percentiles)},
        "tpot": {"counts one-token requests in TPOT as 0 (vLLM leaves them out)":
                 _row(ref, tpot_zero, percentiles)},
        "itl": {"averages per-request ITL statistics instead of pooling every gap of every request": averaged,
                "includes the TTFT gap in ITL":
                _row(ref, [x for r in requests for x in [ref.ttft(r)] + ref.itl(r)], percentiles)},
        "e2el": {"measures the end-to-end latency from the first token, not the arrival":
                 _row(ref, [r.finish - r.token_times[0] for r in requests], percentiles)},
    }


def _expect_row(t, got_row, exp_row, metric, wrong_rows):
    if exp_row is None:
        t.expect_true(got_row is None, f"[{metric!r}]: expected None (no values to summarise), "
                                       f"got {str(got_row)[:80]}")
        return
    if not isinstance(got_row, dict):
        t.fail(f"[{metric!r}]: expected a dict like {{'count': ..., 'mean': ..., 'p50': ...}}, "
               f"got {type(got_row).__name__} ({str(got_row)[:60]})")
    for key in exp_row:
        if key not in got_row:
            t.fail(f"[{metric!r}]: missing key {key!r} (keys are 'count', 'mean' and f'p{{q:g}}' per percentile)")
        wrong = {name: row[key] for name, row in wrong_rows.items() if row is not None and key in row}
        if key == "p50":
            wrong["reports the mean where the median (p50) belongs"] = exp_row["mean"]
        t.expect(got_row[key], exp_row[key], f"[{metric!r}][{key!r}]", mistakes=_differs(wrong, exp_row[key]))


@check(points=2, section="2.2")
def latency_summary(t):
    """count, mean and percentiles of TTFT, TPOT (two+ tokens), pooled ITL and E2EL."""
    ref, rng = t.ref, t.rng
    R = ref.RequestTimes
    visible = [visible_request(ref), one_token_request(ref),
               R(arrival=3.0, token_times=[3.125, 3.25, 3.375], finish=3.375, scheduled=3.0),
               R(arrival=3.5, token_times=[4.5, 4.5625, 5.5625, 5.625, 5.6875, 5.75, 5.8125, 5.875], finish=5.875,
                 scheduled=4.0),
               R(arrival=6.0, token_times=[6.0625, 6.125], finish=6.125, scheduled=6.0)]
    cases = [("five requests, one of them a single token", visible, ref.PERCENTILES),
             ("every request has one output token (no TPOT, no ITL)",
              [one_token_request(ref), R(8.0, [8.25], 8.25, 8.0)], ref.PERCENTILES),
             ("an empty trace", [], ref.PERCENTILES),
             ("hidden", random_trace(ref, rng, rng.randint(6, 20)), ref.PERCENTILES),
             ("hidden", random_trace(ref, rng, rng.randint(6, 20), one_token_share=0.4), ref.PERCENTILES),
             ("hidden, percentiles=(50, 95, 99.9)", random_trace(ref, rng, rng.randint(6, 20)), (50, 95, 99.9))]
    for label, reqs, pcts in cases:
        with t.case(f"{label} ({len(reqs)} requests)"):
            expected = ref.latency_summary(reqs, pcts)
            args = (reqs,) if pcts == ref.PERCENTILES else (reqs, pcts)
            got = t.call("latency_summary", *args)
            t.expect_true(isinstance(got, dict), f"expected a dict with keys {list(ref.METRICS)}, "
                                                 f"got {type(got).__name__}")
            wrong = summary_mistakes(ref, reqs, pcts)
            for metric in ref.METRICS:
                t.expect_true(metric in got, f"missing key {metric!r} (expected keys {list(ref.METRICS)})")
                _expect_row(t, got[metric], expected[metric], metric, wrong[metric])


# -- 3.1 SLOs ---------------------------------------------------------------------------------

def _slo_variants(ref, r, ttft_slo, tpot_slo) -> dict[str, bool]:
    """What plausible wrong versions of meets_slo answer for one request."""
    a, p = ref.ttft(r), ref.tpot(r)
    one = p is None
    ttft_ok, tpot_ok = a <= ttft_slo, one or p <= tpot_slo
    return {
        "counts a request that meets either SLO as good (it must meet both)": ttft_ok or tpot_ok,
        "checks only the TTFT SLO": ttft_ok,
        "checks only the TPOT SLO": tpot_ok,
        "treats a value exactly at its SLO as a miss (<= meets it)": a < ttft_slo and (one or p < tpot_slo),
        "fails a one-token request on TPOT (it has no TPOT: only its TTFT is judged)": ttft_ok and not one and tpot_ok,
    }


def _slo_mistakes(ref, reqs, ttft_slo, tpot_slo, expected) -> dict:
    per = [_slo_variants(ref, r, ttft_slo, tpot_slo) for r in reqs]
    return _differs({name: [v[name] for v in per] for name in per[0]}, expected) if per else {}


def slo_trace(ref):
    """Requests by what they meet under TTFT SLO 0.25 s and TPOT SLO 0.03125 s (2**-5)."""
    R = ref.RequestTimes
    return {
        "both": R(10.0, [10.125, 10.140625, 10.15625], 10.15625, 10.0),          # TTFT .125, TPOT 1/64
        "ttft only": R(11.0, [11.125, 11.1875, 11.25], 11.25, 11.0),            # TPOT 1/16
        "tpot only": R(12.0, [12.5, 12.515625, 12.53125], 12.53125, 12.25),     # TTFT .5
        "neither": R(13.0, [13.5, 13.5625, 13.625], 13.625, 13.25),
        "at the TTFT SLO": R(14.0, [14.25, 14.265625], 14.265625, 14.0),
        "at the TPOT SLO": R(15.0, [15.125, 15.15625, 15.1875], 15.1875, 15.0),
        "at both SLOs": R(16.0, [16.25, 16.28125, 16.3125], 16.3125, 16.125),
        "one token, TTFT met": R(17.0, [17.125], 17.125, 17.0),
        "one token, TTFT missed": R(18.0, [18.5], 18.5, 18.25),
    }


SLO_TTFT, SLO_TPOT = 0.25, 0.03125


@check(points=1, section="3.1")
def meets_slo(t):
    """TTFT <= SLO and TPOT <= SLO; one-token requests judged on TTFT alone."""
    ref, rng = t.ref, t.rng
    tr = slo_trace(ref)
    groups = [("meets both / only TTFT / only TPOT / neither", ["both", "ttft only", "tpot only", "neither"]),
              ("exactly at the TTFT SLO / the TPOT SLO / both", ["at the TTFT SLO", "at the TPOT SLO", "at both SLOs"]),
              ("one output token, TTFT met / missed", ["one token, TTFT met", "one token, TTFT missed"])]
    cases = [(f"{label} (TTFT SLO {SLO_TTFT}, TPOT SLO {SLO_TPOT})", [tr[k] for k in keys], SLO_TTFT, SLO_TPOT)
             for label, keys in groups]
    for _ in range(2):
        reqs = random_trace(ref, rng, 10, one_token_share=0.25)
        ttfts = sorted(ref.ttft(r) for r in reqs)
        tpots = sorted(x for x in (ref.tpot(r) for r in reqs) if x is not None) or [0.02]
        # SLOs at some request's own value: exact ties are part of the hidden cases
        cases.append(("hidden (10 requests, SLOs equal to some requests' values)", reqs,
                      rng.choice(ttfts[2:]), rng.choice(tpots[len(tpots) // 3:])))
    for label, reqs, ttft_slo, tpot_slo in cases:
        with t.case(label):
            expected = [ref.meets_slo(r, ttft_slo, tpot_slo) for r in reqs]
            got = [_as_bool(t.call("meets_slo", r, ttft_slo, tpot_slo)) for r in reqs]
            t.expect(got, expected, "meets_slo, request by request",
                     mistakes=_slo_mistakes(ref, reqs, ttft_slo, tpot_slo, expected))


# -- 3.2 goodput ------------------------------------------------------------------------------

def _summary_with(ref, reqs, met: int, duration: float) -> dict:
    """A goodput dict with the given count and duration (the shape of the expected answer)."""
    n = len(reqs)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    return {"requests": n, "met": met, "attainment": met / n if n else 0.0, "duration_s": duration,
            "goodput_rps": per_s(met), "request_rps": per_s(n),
            "output_tok_s": per_s(sum(len(r.token_times) for r in reqs))}


def goodput_mistakes(ref, reqs, ttft_slo, tpot_slo, expected) -> dict[str, dict]:
    if not reqs:
        return {}
    per = [_slo_variants(ref, r, ttft_slo, tpot_slo) for r in reqs]
    duration = expected["duration_s"]
    wrong = {name: _summary_with(ref, reqs, sum(v[name] for v in per), duration) for name in per[0]}
    met = expected["met"]
    per_request = dict(expected, goodput_rps=met / len(reqs))
    wrong["divides by the number of requests instead of the duration (that is attainment, not a rate)"] = per_request
    arrivals = max(r.arrival for r in reqs) - min(r.arrival for r in reqs)
    wrong["measures the run from the first to the last arrival (it lasts until the last request finishes)"] = \
        _summary_with(ref, reqs, met, arrivals)
    wrong["measures the run from time 0, not from the first arrival"] = \
        _summary_with(ref, reqs, met, max(r.finish for r in reqs))
    return wrong


def goodput_trace(ref):
    """11 requests under TTFT SLO 0.25 s, TPOT SLO 2**-5 s: 6 meet both (3 clearly, 2 one-token,
    1 exactly at both SLOs), 2 meet TTFT only, 1 TPOT only, 2 neither. Starts at t = 100 s."""
    out = []
    for i, (ttft_, gaps) in enumerate([
            (0.125, [0.015625, 0.015625]), (0.1875, [0.0078125] * 4), (0.0625, [0.015625, 0.0234375, 0.015625]),
            (0.125, [0.0625, 0.0625]), (0.1875, [0.046875] * 3),            # TTFT only
            (0.5, [0.015625, 0.015625]),                                     # TPOT only
            (0.375, [0.0625, 0.125]), (1.0, [0.046875] * 5),                # neither
            (0.125, []), (0.1875, []),                                       # one token, TTFT met
            (0.25, [0.03125, 0.03125, 0.03125])]):                           # exactly at both
        arrival = 100.0 + 0.25 * i
        out.append(make_request(ref, arrival, ttft_ / 2, ttft_ / 2, gaps))
    return out


@check(points=3, section="3.2")
def goodput(t):
    """Requests meeting both SLOs per second from first arrival to last finish; attainment."""
    ref, rng = t.ref, t.rng
    base = goodput_trace(ref)
    cases = [("11 requests: 6 meet both SLOs, one of them exactly at both", base, SLO_TTFT, SLO_TPOT),
             ("the same trace under SLOs nobody meets", base, 0.001, 0.001),
             ("an empty trace", [], SLO_TTFT, SLO_TPOT)]
    for _ in range(2):
        reqs = random_trace(ref, rng, rng.randint(8, 25), one_token_share=0.2)
        ttfts = sorted(ref.ttft(r) for r in reqs)
        tpots = sorted(x for x in (ref.tpot(r) for r in reqs) if x is not None) or [0.02]
        cases.append((f"hidden ({len(reqs)} requests, SLOs equal to some requests' values)", reqs,
                      rng.choice(ttfts[1:]), rng.choice(tpots[len(tpots) // 4:])))
    for label, reqs, ttft_slo, tpot_slo in cases:
        with t.case(f"{label}; TTFT SLO {ttft_slo:g} s, TPOT SLO {tpot_slo:g} s"):
            expected = ref.goodput(reqs, ttft_slo, tpot_slo)
            got = t.call("goodput", reqs, ttft_slo, tpot_slo)
            t.expect_true(isinstance(got, dict), f"expected a dict with keys {list(expected)}, got "
                                                 f"{type(got).__name__}")
            wrong = goodput_mistakes(ref, reqs, ttft_slo, tpot_slo, expected)
            hint = "an empty run has nothing to divide: return 0 everywhere" if not reqs else ""
            for key in expected:
                t.expect_true(key in got, f"missing key {key!r} (expected keys {list(expected)})")
                t.expect(got[key], expected[key], f"[{key!r}]", hint=hint,
                         mistakes=_differs({n: w[key] for n, w in wrong.items()}, expected[key]))
