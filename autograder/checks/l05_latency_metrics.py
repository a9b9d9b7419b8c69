"""Checks for lesson 05: TTFT, TPOT, ITL, percentiles, the latency summary, SLOs, goodput, and what an
open- or closed-loop load generator logs.

Hidden cases are traces drawn from t.rng: Poisson-like arrivals that do not start at 0, queueing
before the first schedule, one-token requests, ITL stalls (a decode waiting behind a prefill),
requests that finish after their last token (the response still being sent), and SLOs set exactly
at some request's TTFT or TPOT, so ties at the SLO occur. Every timestamp lies on a grid of
2**-10 s, so differences of timestamps are exact in floating point and a TTFT or TPOT computed in
any order lands on the same float as the reference: a tie stays a tie. The visible cases hold one
of each of these, so every mistake named below is tested on every seed.

Wrong answers named in the messages are computed here from the definitions (`_ttft`, `_tpot`,
`_itl`) with one mistake put in, on the same inputs as the expected values. That code is `@answer_code`
(autograder/reference.py): a student's copy holds its name and docstring, and replays its results on the
visible cases.
"""
from __future__ import annotations

import contextlib
import functools
import math
import random

from autograder import compare as cmp
from autograder.checks._configs import non_default
from autograder.core import CaseFailed, check
from autograder.reference import answer_code
from autograder.wire import Record

GRID = 2.0 ** -10  # seconds


def _on_grid(x: float, at_least: int = 1) -> float:
    return max(at_least, round(x / GRID)) * GRID


# -- requests ---------------------------------------------------------------------------------
# A request crosses to the learner as a Record, which arrives there as the learner's own RequestTimes
# (and comes back as a Record, so that an argument changed in place shows). The expected values come
# from the reference, run on its own RequestTimes (`_ref`); the wrong answers from the definitions here.

def R(arrival: float, token_times: list[float], finish: float | None = None, scheduled: float | None = None) -> Record:
    """A RequestTimes as data; finish defaults to the last token's time."""
    return Record("RequestTimes", {"arrival": arrival, "token_times": list(token_times),
                                   "finish": token_times[-1] if finish is None else finish, "scheduled": scheduled})


def _as_ref(ref, x):
    if isinstance(x, Record):
        return ref.RequestTimes(**x.fields)
    if isinstance(x, (list, tuple)) and any(isinstance(v, Record) for v in x):
        return [_as_ref(ref, v) for v in x]
    return x


def _on_ref(ref, name: str, *args):
    """ref.<name>(*args) with every request rebuilt as the reference's own RequestTimes."""
    return getattr(ref, name)(*(_as_ref(ref, a) for a in args))


def _ref(t, name: str, *args):
    return t.reference(_on_ref, name, *args)


@answer_code
def _ttft(r) -> float:
    return r.token_times[0] - r.arrival


@answer_code
def _tpot(r, end: str = "finish") -> float | None:
    """TPOT by its definition, or (end="last") the usual mistake: up to the last token, not the finish."""
    n = len(r.token_times)
    if n < 2:
        return None
    stop = r.finish if end == "finish" else r.token_times[-1]
    return (stop - r.arrival - _ttft(r)) / (n - 1)


@answer_code
def _itl(r) -> list[float]:
    ts = r.token_times
    return [b - a for a, b in zip(ts, ts[1:])]


# -- what a check depends on ------------------------------------------------------------------
# tpot may call the learner's ttft; latency_summary their ttft, tpot, itl and percentile; meets_slo their
# ttft and tpot; goodput all of those and meets_slo. A wrong upstream answer makes every downstream answer
# wrong too, and the downstream mistake models would then name a downstream mistake that is not there. So
# when a downstream case fails, the check asks the learner's upstream exercises for their answers on that
# case's inputs (the reference's answers were computed up front) and, if one of them is wrong, says that
# the case depends on it, which fails, instead of naming a downstream mistake.

def _calls_on_ref(ref, calls: list) -> list:
    """The reference's answer to each (exercise name, args) of `calls`."""
    return [_on_ref(ref, name, *args) for name, args in calls]


def _upstream_calls(reqs: list, *names: str) -> list:
    """(name, (request,)) for each exercise in `names` (upstream first) and each request."""
    return [(name, (r,)) for name in names for r in reqs]


def _normalized(name: str, value):
    return _as_bool(value) if name == "meets_slo" else _as_list(value) if name == "itl" else value


def _show(x) -> str:
    if isinstance(x, Record):
        return f"the request arriving at {x.fields['arrival']:g}"
    return repr(x) if len(repr(x)) <= 60 else repr(x)[:57] + "..."


class Upstream:
    """The exercises a check's function may call, on one case's inputs, with the reference's answers."""

    def __init__(self, t, what: str, calls: list):
        self.t, self.what, self.calls = t, what, calls
        self.expected = t.reference(_calls_on_ref, calls)  # up front: a student's copy replays it

    def blame(self):
        """Fail the case naming the first upstream exercise whose answer is wrong here, if any (t.blame_upstream)."""
        for (name, args), expected in zip(self.calls, self.expected):
            self.t.blame_upstream(self.what, name, [(args, expected)], rtol=None, show=_show,
                                  normalize=functools.partial(_normalized, name))

    @contextlib.contextmanager
    def judging(self):
        """Judge the case's own answer inside this block; a failure is put down to an upstream exercise
        when one of them is wrong on the same inputs."""
        try:
            yield
        except CaseFailed:
            self.blame()
            raise


# -- traces -----------------------------------------------------------------------------------

def make_request(arrival: float, queue: float, prefill: float, gaps: list[float], tail: float = 0.0) -> Record:
    """A request arriving at `arrival`, scheduled `queue` s later, first token `prefill` s after
    that, then one token per gap, finishing `tail` s after its last token. All inputs on the grid."""
    times = [arrival + queue + prefill]
    for g in gaps:
        times.append(times[-1] + g)
    return R(arrival, times, finish=times[-1] + tail, scheduled=arrival + queue)


def random_request(rng: random.Random, arrival: float, one_token: bool = False) -> Record:
    queue = 0.0 if rng.random() < 0.3 else _on_grid(rng.uniform(0.0, 0.4))
    prefill = _on_grid(rng.uniform(0.01, 0.25))
    n = 1 if one_token else rng.randint(2, 20)
    gaps = [_on_grid(rng.uniform(0.08, 0.3)) if rng.random() < 0.1 else _on_grid(rng.uniform(0.005, 0.04))
            for _ in range(n - 1)]  # ~10% stalls: a decode step that waited behind someone's prefill
    tail = 0.0 if rng.random() < 0.6 else _on_grid(rng.uniform(0.001, 0.05))  # sending the response
    return make_request(arrival, queue, prefill, gaps, tail)


def random_trace(rng: random.Random, n: int, one_token_share: float = 0.2) -> list[Record]:
    t = _on_grid(rng.uniform(1.0, 500.0))  # a clock that does not start at 0
    out = []
    for _ in range(n):
        out.append(random_request(rng, t, rng.random() < one_token_share))
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


# A request that queues: arrives at 2.0, scheduled at 2.25, tokens at 2.5, 2.625, 2.875, 2.9375, and
# finishes (the response sent) at 3.0, after its last token.
VISIBLE = R(2.0, [2.5, 2.625, 2.875, 2.9375], finish=3.0, scheduled=2.25)
ONE_TOKEN = R(7.0, [7.375], scheduled=7.125)
ENDS_AT_LAST_TOKEN = R(0.5, [0.75, 1.25], scheduled=0.5)


# -- 1.1 TTFT ---------------------------------------------------------------------------------

def _random_request(rng) -> Record:
    return random_request(rng, _on_grid(rng.uniform(1, 900)))


@answer_code
def ttft_mistakes(r, expected: float) -> dict:
    """The usual wrong TTFTs of request r (`expected`: the reference's)."""
    first = r.token_times[0]
    return {"measures from when the request was first scheduled, not from its arrival (the user "
            "waits through the queue too)": first - r.scheduled,
            "returns the first token's timestamp, not the time since arrival": first,
            "measures to the end of the request (that is the end-to-end latency, not TTFT)":
                r.finish - r.arrival,
            "returns milliseconds (every function here works in seconds)": 1000 * expected}


@check(points=1, section="1.1")
def ttft(t):
    """First token time - arrival (not - scheduled time)."""
    visible = [("a request that queued 0.25 s", VISIBLE), ("a one-token request", ONE_TOKEN)]
    for label, r in t.cases(visible, _random_request, n=3):
        with t.case(f"{label}: {_describe(r)}"):
            expected = _ref(t, "ttft", r)
            t.expect(t.call("ttft", r), expected, "TTFT (s)", mistakes=ttft_mistakes(r, expected))


# -- 1.2 TPOT ---------------------------------------------------------------------------------

@answer_code
def tpot_mistakes(r) -> dict:
    n, latency = len(r.token_times), r.finish - r.arrival
    if n < 2:
        return {"returns 0 for a one-token request (it has no TPOT: return None)": 0.0}
    return {
        "divides by output_tokens instead of output_tokens - 1 (the first token is not a decode step)":
            (latency - _ttft(r)) / n,
        "includes the TTFT in the numerator (TPOT is (latency - TTFT) / (output_tokens - 1))": latency / (n - 1),
        "divides the whole latency by the number of tokens (TTFT included, and by output_tokens)": latency / n,
        "measures the latency from the scheduling time, not from the arrival":
            (r.finish - r.scheduled - _ttft(r)) / (n - 1),
        "measures up to the last token instead of the finish time (latency = finish - arrival; the "
        "request is not done until it finishes)": _tpot(r, end="last"),
    }


@check(points=2, section="1.2")
def tpot(t):
    """(latency - TTFT) / (output tokens - 1), latency to the finish time; None for one output token."""
    visible = [("a request of 4 tokens that queued and finished after its last token", VISIBLE),
               ("a request of 2 tokens", ENDS_AT_LAST_TOKEN), ("a one-token request (no TPOT)", ONE_TOKEN)]
    hidden = [_random_request(t.rng) for _ in range(3)]
    hidden.append(random_request(t.rng, _on_grid(t.rng.uniform(1, 900)), True))
    for label, r in t.cases(visible, hidden):
        with t.case(f"{label}: {_describe(r)}"):
            expected = _ref(t, "tpot", r)
            upstream = Upstream(t, "tpot", [("ttft", (r,))])
            got = t.call("tpot", r)
            hint = ("a request with one output token has no time between tokens: return None (vLLM leaves it "
                    "out of the TPOT statistics)") if expected is None else ""
            with upstream.judging():
                t.expect(got, expected, "TPOT (s)", mistakes=tpot_mistakes(r), hint=hint)


# -- 1.3 ITL ----------------------------------------------------------------------------------

@answer_code
def itl_mistakes(r, expected: list) -> dict:
    """The usual wrong ITL lists of request r (`expected`: the reference's)."""
    first = r.token_times[0]
    return {"includes the TTFT gap (arrival to first token); ITL starts after the first token":
                [first - r.arrival] + expected,
            "includes the gap from scheduling to the first token; ITL starts after the first token":
                [first - r.scheduled] + expected,
            "returns each token's time since the first token, not the gaps between tokens":
                [x - first for x in r.token_times[1:]],
            "counts a gap from the last token to the finish (ITL is between tokens only)":
                expected + [r.finish - r.token_times[-1]]}


@check(points=1, section="1.3")
def itl(t):
    """The gaps between successive tokens, after the first."""
    visible = [("a request of 4 tokens", VISIBLE), ("a one-token request (no gaps)", ONE_TOKEN)]
    for label, r in t.cases(visible, _random_request, n=3):
        with t.case(f"{label}: {_describe(r)}"):
            expected = _ref(t, "itl", r)
            got = _as_list(t.call("itl", r))
            t.expect(got, expected, "ITL gaps (s)", mistakes=itl_mistakes(r, expected))


# -- 2.1 percentiles --------------------------------------------------------------------------

@answer_code
def _lerp(s, k):
    """Linear interpolation at fractional position k of s (clamped to the ends)."""
    k = min(max(k, 0.0), len(s) - 1)
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (k - lo) * (s[hi] - s[lo])


@answer_code
def percentile_mistakes(values, q) -> dict:
    """Indexing without interpolating, interpolating at the wrong position or with the weights swapped."""
    s, n = sorted(float(v) for v in values), len(values)
    k = (n - 1) * q / 100
    lo, frac = math.floor(k), k - math.floor(k)
    idx = "sorts and indexes without interpolating"
    return {
        f"{idx} (s[int(n * q / 100)])": s[min(n - 1, int(n * q / 100))],
        f"{idx} (s[floor((n - 1) * q / 100)])": s[lo],
        f"{idx} (s[round((n - 1) * q / 100)])": s[round(k)],
        f"{idx} (s[ceil((n - 1) * q / 100)])": s[math.ceil(k)],
        f"{idx} (nearest rank, s[ceil(n * q / 100) - 1])": s[max(0, math.ceil(n * q / 100) - 1)],
        "interpolates at position n * q / 100; numpy's position is k = (n - 1) * q / 100": _lerp(s, n * q / 100),
        "interpolates at position (n + 1) * q / 100 - 1 (Excel's PERCENTILE.EXC); numpy's position is "
        "k = (n - 1) * q / 100": _lerp(s, (n + 1) * q / 100 - 1),
        "weights the two neighbours the wrong way round: the fraction k - floor(k) scales "
        "s[floor(k) + 1] - s[floor(k)], added to s[floor(k)]": s[lo] + (1 - frac) * (s[min(lo + 1, n - 1)] - s[lo]),
        "does not sort the values first": _lerp([float(v) for v in values], k),
        "returns the mean, not the percentile": sum(values) / n,
    }


def _random_sample(rng) -> tuple:
    n = rng.randint(3, 60)
    pool = [round(rng.lognormvariate(-3, 1), 4) for _ in range(max(1, n // 3))]  # few distinct: ties
    values = [rng.choice(pool) if rng.random() < 0.5 else round(rng.lognormvariate(-3, 1), 4) for _ in range(n)]
    return values, rng.choice([50, 90, 95, 99, 99.9, round(rng.uniform(0, 100), 2)])


@check(points=2, section="2.1")
def percentile(t):
    """numpy's linear interpolation between the order statistics, written by hand."""
    visible = [("five unsorted values, q=70 (k = 2.8)", ([50, 15, 40, 20, 35], 70)),
               ("five values, q=40 (k = 1.6)", ([15, 20, 35, 40, 50], 40)),
               ("a skewed sample, the median of an even count", ([1.0, 2.0, 3.0, 10.0], 50)),
               ("unsorted values, q=90", ([5.0, 1.0, 4.0, 2.0, 3.0], 90)),
               ("ties", ([7, 7, 7, 1, 9, 7], 25)),
               ("two values, q=99", ([2.0, 4.0], 99)),
               ("one value", ([3.5], 99)),
               ("q=0 is the minimum", ([0.25, 0.125, 0.5], 0)),
               ("q=100 is the maximum", ([0.25, 0.125, 0.5], 100))]
    for label, (values, q) in t.cases(visible, _random_sample, n=4):
        shown = values if len(values) <= 12 else values[:12] + ["..."]
        with t.case(f"{label}: percentile({shown}, {q})"):
            expected = t.ref.percentile(values, q)
            t.expect(t.call("percentile", values, q), expected, f"p{q:g}", mistakes=percentile_mistakes(values, q))
    with t.case("no values raises ValueError"):
        t.expect_raises(ValueError, "percentile", [], 50, what="percentile",
                        why="a percentile of nothing is undefined; a dashboard must not show 0 for it")
    with t.case("q outside [0, 100] raises ValueError"):
        t.expect_raises(ValueError, "percentile", [1.0, 2.0], 150, what="percentile",
                        why="q is a percent (0-100); 150 is a caller's bug")
    with t.case("a negative q raises ValueError"):
        t.expect_raises(ValueError, "percentile", [1.0, 2.0], -5, what="percentile",
                        why="q is a percent (0-100); -5 is a caller's bug")


# -- 2.2 the latency summary ------------------------------------------------------------------

@answer_code
def _percentile(xs, q) -> float:
    """The reference's percentile (numpy's linear interpolation), the same float operations."""
    s = sorted(float(v) for v in xs)
    return _lerp(s, (len(s) - 1) * q / 100)


@answer_code
def _row(xs, percentiles):
    if not xs:
        return None
    row = {"count": len(xs), "mean": sum(xs) / len(xs)}
    for q in percentiles:
        row[f"p{q:g}"] = _percentile(xs, q)
    return row


@answer_code
def summary_mistakes(requests, percentiles) -> dict[str, dict[str, dict | None]]:
    """For each metric, wrong rows by the mistake that produces them."""
    per_request = [g for g in (_itl(r) for r in requests) if g]
    averaged = None
    if per_request:
        averaged = {"count": len(per_request), "mean": sum(sum(g) / len(g) for g in per_request) / len(per_request)}
        for q in percentiles:
            averaged[f"p{q:g}"] = sum(_percentile(g, q) for g in per_request) / len(per_request)
    two_plus = [r for r in requests if len(r.token_times) > 1]
    return {
        "ttft": {"measures TTFT from the scheduling time, not the arrival":
                 _row([r.token_times[0] - r.scheduled for r in requests], percentiles)},
        "tpot": {"counts one-token requests in TPOT as 0 (vLLM leaves them out)":
                 _row([_tpot(r) or 0.0 for r in requests], percentiles),
                 "measures TPOT up to the last token instead of the finish time":
                 _row([_tpot(r, end="last") for r in two_plus], percentiles)},
        "itl": {"averages per-request ITL statistics instead of pooling every gap of every request": averaged,
                "includes the TTFT gap in ITL": _row([x for r in requests for x in [_ttft(r)] + _itl(r)], percentiles)},
        "e2el": {"measures the end-to-end latency from the first token, not the arrival":
                 _row([r.finish - r.token_times[0] for r in requests], percentiles),
                 "measures the end-to-end latency to the last token instead of the finish time":
                 _row([r.token_times[-1] - r.arrival for r in requests], percentiles)},
    }


def _expect_row(t, got_row, exp_row, metric, wrong_rows, percentiles, default):
    if exp_row is None:
        t.expect_true(got_row is None, f"[{metric!r}]: expected None (no values to summarise), "
                                       f"got {str(got_row)[:80]}")
        return
    if not isinstance(got_row, dict):
        t.fail(f"[{metric!r}]: expected a dict like {{'count': ..., 'mean': ..., 'p50': ...}}, "
               f"got {type(got_row).__name__} ({str(got_row)[:60]})")
    if (types := cmp.key_types(got_row)) is not None:
        t.fail(f"[{metric!r}]: expected a dict keyed by str ('count', 'mean', 'p50', ...), got keys of types {types}; "
               "a percentile's key is f'p{q:g}': 'p50', 'p99.9'")
    for key in exp_row:
        if key not in got_row:
            if {k for k in got_row if k.startswith("p")} == {f"p{q:g}" for q in default}:
                t.fail(f"[{metric!r}]: missing key {key!r} (asked for percentiles={tuple(percentiles)}).",
                       "ignores the percentiles argument and uses PERCENTILES", end="")
            plain = {f"p{q}" for q in percentiles}
            if plain - {f"p{q:g}" for q in percentiles} and plain <= set(got_row):
                t.fail(f"[{metric!r}]: missing key {key!r}; your keys are {sorted(got_row)}.", "names the keys with "
                       "f'p{q}', which writes 50.0 as 'p50.0': use f'p{q:g}' ('p50', 'p99.9')", end="")
            t.fail(f"[{metric!r}]: missing key {key!r} (keys are 'count', 'mean' and f'p{{q:g}}' per percentile)")
        wrong = {name: row[key] for name, row in wrong_rows.items() if row is not None and key in row}
        if key == "p50":
            wrong["reports the mean where the median (p50) belongs"] = exp_row["mean"]
        t.expect(got_row[key], exp_row[key], f"[{metric!r}][{key!r}]", mistakes=wrong)


def _summary_upstream(reqs: list, percentiles) -> list:
    """latency_summary's upstream calls: ttft, tpot and itl of each request, then percentile of a sample
    (the requests' end-to-end latencies, a list no upstream mistake changes) at each percentile asked."""
    e2el = [r.fields["finish"] - r.fields["arrival"] for r in reqs]
    return _upstream_calls(reqs, "ttft", "tpot", "itl") + [("percentile", (e2el, q)) for q in percentiles if e2el]


SUMMARY_TRACE = [VISIBLE, ONE_TOKEN, R(3.0, [3.125, 3.25, 3.375], scheduled=3.0),
                 R(3.5, [4.5, 4.5625, 5.5625, 5.625, 5.6875, 5.75, 5.8125, 5.875], finish=5.90625, scheduled=4.0),
                 R(6.0, [6.0625, 6.125], scheduled=6.0)]


@check(points=2, section="2.2")
def latency_summary(t):
    """count, mean and percentiles of TTFT, TPOT (two+ tokens), pooled ITL and E2EL."""
    default = tuple(t.ref.PERCENTILES)
    visible = [("five requests, one of them a single token", (SUMMARY_TRACE, default)),
               ("the same five requests, percentiles=(50, 95, 99.9)", (SUMMARY_TRACE, (50, 95, 99.9))),
               ("the same five requests, float percentiles=(50.0, 90.0, 99.5)", (SUMMARY_TRACE, (50.0, 90.0, 99.5))),
               ("every request has one output token (no TPOT, no ITL)", ([ONE_TOKEN, R(8.0, [8.25], scheduled=8.0)], default)),
               ("an empty trace", ([], default))]
    hidden = [(random_trace(t.rng, t.rng.randint(6, 20)), default),
              (random_trace(t.rng, t.rng.randint(6, 20), one_token_share=0.4), default),
              (random_trace(t.rng, t.rng.randint(6, 20)), (50, 95, 99.9))]
    for label, (reqs, pcts) in t.cases(visible, hidden):
        with t.case(f"{label} ({len(reqs)} requests)"):
            expected = _ref(t, "latency_summary", reqs, pcts)
            upstream = Upstream(t, "latency_summary", _summary_upstream(reqs, pcts))
            got = t.call("latency_summary", reqs, **non_default(percentiles=(tuple(pcts), default)))
            metrics = list(expected)
            t.expect_true(isinstance(got, dict), f"expected a dict with keys {metrics}, got {type(got).__name__}")
            wrong = summary_mistakes(reqs, pcts)
            for metric in metrics:
                t.expect_true(metric in got, f"missing key {metric!r} (expected keys {metrics})")
                with upstream.judging():
                    _expect_row(t, got[metric], expected[metric], metric, wrong[metric], pcts, default)


# -- 3.1 SLOs ---------------------------------------------------------------------------------

@answer_code
def _slo_variants(r, ttft_slo, tpot_slo) -> dict[str, bool]:
    """What plausible wrong versions of meets_slo answer for one request."""
    a, p, last = _ttft(r), _tpot(r), _tpot(r, end="last")
    one = p is None
    ttft_ok, tpot_ok = a <= ttft_slo, one or p <= tpot_slo
    return {
        "counts a request that meets either SLO as good (it must meet both)": ttft_ok or tpot_ok,
        "checks only the TTFT SLO": ttft_ok,
        "checks only the TPOT SLO": tpot_ok,
        "treats a value exactly at its SLO as a miss (<= meets it)": a < ttft_slo and (one or p < tpot_slo),
        "fails a one-token request on TPOT (it has no TPOT: only its TTFT is judged)": ttft_ok and not one and tpot_ok,
        "judges TPOT up to the last token instead of the finish time": ttft_ok and (one or last <= tpot_slo),
    }


@answer_code
def _slo_mistakes(reqs, ttft_slo, tpot_slo) -> dict:
    per = [_slo_variants(r, ttft_slo, tpot_slo) for r in reqs]
    return {name: [v[name] for v in per] for name in per[0]} if per else {}


SLO_TTFT, SLO_TPOT = 0.25, 0.03125


def slo_trace():
    """Requests by what they meet under TTFT SLO 0.25 s and TPOT SLO 0.03125 s (2**-5)."""
    return {
        "both": R(10.0, [10.125, 10.140625, 10.15625], scheduled=10.0),          # TTFT .125, TPOT 1/64
        "ttft only": R(11.0, [11.125, 11.1875, 11.25], scheduled=11.0),            # TPOT 1/16
        "tpot only": R(12.0, [12.5, 12.515625, 12.53125], scheduled=12.25),        # TTFT .5
        "neither": R(13.0, [13.5, 13.5625, 13.625], scheduled=13.25),
        "at the TTFT SLO": R(14.0, [14.25, 14.265625], scheduled=14.0),
        "at the TPOT SLO": R(15.0, [15.125, 15.15625, 15.1875], scheduled=15.0),
        "at both SLOs": R(16.0, [16.25, 16.28125, 16.3125], scheduled=16.125),
        "one token, TTFT met": R(17.0, [17.125], scheduled=17.0),
        "one token, TTFT missed": R(18.0, [18.5], scheduled=18.25),
        # TPOT 1/32 to the last token, but 1/16 to the finish: it misses the TPOT SLO
        "finishes after its last token": R(19.0, [19.125, 19.15625, 19.1875], finish=19.25, scheduled=19.0),
    }


def _random_slo_case(rng, n: int, one_token_share: float, lowest: int, share: int) -> tuple:
    """A random trace with SLOs equal to some requests' own TTFT and TPOT: exact ties at the SLO."""
    reqs = random_trace(rng, n, one_token_share=one_token_share)
    ttfts, tpots = _sorted_metrics(reqs)
    return reqs, rng.choice(ttfts[lowest:]), rng.choice(tpots[len(tpots) // share:])


@answer_code
def _sorted_metrics(reqs) -> tuple[list, list]:
    """The requests' TTFTs and TPOTs (two+ tokens; [0.02] if none), each sorted: the SLOs are drawn from them."""
    ttfts = sorted(_ttft(r) for r in reqs)
    tpots = sorted(x for x in (_tpot(r) for r in reqs) if x is not None) or [0.02]
    return ttfts, tpots


@check(points=1, section="3.1")
def meets_slo(t):
    """TTFT <= SLO and TPOT (to the finish) <= SLO; one-token requests judged on TTFT alone."""
    tr = slo_trace()
    groups = [("meets both / only TTFT / only TPOT / neither", ["both", "ttft only", "tpot only", "neither"]),
              ("exactly at the TTFT SLO / the TPOT SLO / both", ["at the TTFT SLO", "at the TPOT SLO", "at both SLOs"]),
              ("one output token, TTFT met / missed", ["one token, TTFT met", "one token, TTFT missed"]),
              ("a request that finishes after its last token", ["finishes after its last token", "both"])]
    visible = [(f"{label} (TTFT SLO {SLO_TTFT}, TPOT SLO {SLO_TPOT})", ([tr[k] for k in keys], SLO_TTFT, SLO_TPOT))
               for label, keys in groups]
    hidden = [_random_slo_case(t.rng, 10, 0.25, 2, 3) for _ in range(2)]
    for label, (reqs, ttft_slo, tpot_slo) in t.cases(visible, hidden):
        if label.startswith("hidden"):
            label += f" (10 requests, SLOs {ttft_slo:g} s and {tpot_slo:g} s, equal to some requests' values)"
        with t.case(label):
            expected = [_ref(t, "meets_slo", r, ttft_slo, tpot_slo) for r in reqs]
            upstream = Upstream(t, "meets_slo", _upstream_calls(reqs, "ttft", "tpot"))
            got = [_as_bool(t.call("meets_slo", r, ttft_slo, tpot_slo)) for r in reqs]
            with upstream.judging():
                t.expect(got, expected, "meets_slo, request by request",
                         mistakes=_slo_mistakes(reqs, ttft_slo, tpot_slo))


# -- 3.2 goodput ------------------------------------------------------------------------------

@answer_code
def _summary_with(reqs, met: int, duration: float) -> dict:
    """A goodput dict with the given count and duration (the shape of the expected answer)."""
    n = len(reqs)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    return {"requests": n, "met": met, "attainment": met / n if n else 0.0, "duration_s": duration,
            "goodput_rps": per_s(met), "request_rps": per_s(n),
            "output_tok_s": per_s(sum(len(r.token_times) for r in reqs))}


@answer_code
def goodput_mistakes(reqs, ttft_slo, tpot_slo, expected) -> dict[str, dict]:
    if not reqs:
        return {}
    per = [_slo_variants(r, ttft_slo, tpot_slo) for r in reqs]
    duration = expected["duration_s"]
    wrong = {name: _summary_with(reqs, sum(v[name] for v in per), duration) for name in per[0]}
    met = expected["met"]
    wrong["divides by the number of requests instead of the duration (that is attainment, not a rate)"] = \
        dict(expected, goodput_rps=met / len(reqs))
    start = min(r.arrival for r in reqs)
    wrong["measures the run from the first to the last arrival (it lasts until the last request finishes)"] = \
        _summary_with(reqs, met, max(r.arrival for r in reqs) - start)
    wrong["measures the run from time 0, not from the first arrival"] = \
        _summary_with(reqs, met, max(r.finish for r in reqs))
    wrong["measures the run to the last token, not to the last finish"] = \
        _summary_with(reqs, met, max(r.token_times[-1] for r in reqs) - start)
    return wrong


def goodput_trace() -> list[Record]:
    """13 requests under TTFT SLO 0.25 s, TPOT SLO 2**-5 s: 6 meet both (3 clearly, 2 one-token,
    1 exactly at both SLOs), 2 meet TTFT only, 2 TPOT only, 2 neither, and the last to finish meets
    TPOT only up to its last token (it finishes 1/16 s later). Starts at t = 100 s."""
    out = []
    for i, (ttft_, gaps, tail) in enumerate([
            (0.125, [0.015625, 0.015625], 0), (0.1875, [0.0078125] * 4, 0),
            (0.0625, [0.015625, 0.0234375, 0.015625], 0),
            (0.125, [0.0625, 0.0625], 0), (0.1875, [0.046875] * 3, 0),          # TTFT only
            (0.5, [0.015625, 0.015625], 0),                                      # TPOT only
            (0.375, [0.0625, 0.125], 0), (1.0, [0.046875] * 5, 0),              # neither
            (0.125, [], 0), (0.1875, [], 0),                                     # one token, TTFT met
            (0.25, [0.03125, 0.03125, 0.03125], 0),                              # exactly at both
            (0.4375, [0.015625, 0.015625], 0),                                   # TPOT only
            (0.125, [0.03125, 0.03125], 0.0625)]):                               # TTFT only, by the finish
        out.append(make_request(100.0 + 0.25 * i, ttft_ / 2, ttft_ / 2, gaps, tail))
    return out


@check(points=3, section="3.2")
def goodput(t):
    """Requests meeting both SLOs per second from first arrival to last finish; attainment."""
    base = goodput_trace()
    visible = [("13 requests: 6 meet both SLOs, one of them exactly at both", (base, SLO_TTFT, SLO_TPOT)),
               ("the same trace under SLOs nobody meets", (base, 0.001, 0.001)),
               ("an empty trace", ([], SLO_TTFT, SLO_TPOT))]
    hidden = [_random_slo_case(t.rng, t.rng.randint(8, 25), 0.2, 1, 4) for _ in range(2)]
    for label, (reqs, ttft_slo, tpot_slo) in t.cases(visible, hidden):
        with t.case(f"{label} ({len(reqs)} requests); TTFT SLO {ttft_slo:g} s, TPOT SLO {tpot_slo:g} s"):
            expected = _ref(t, "goodput", reqs, ttft_slo, tpot_slo)
            upstream = Upstream(t, "goodput", _upstream_calls(reqs, "ttft", "tpot") +
                                [("meets_slo", (r, ttft_slo, tpot_slo)) for r in reqs])
            got = t.call("goodput", reqs, ttft_slo, tpot_slo)
            t.expect_true(isinstance(got, dict), f"expected a dict with keys {list(expected)}, got "
                                                 f"{type(got).__name__}")
            wrong = goodput_mistakes(reqs, ttft_slo, tpot_slo, expected)
            hint = "an empty run has nothing to divide: return 0 everywhere" if not reqs else ""
            for key in expected:
                t.expect_true(key in got, f"missing key {key!r} (expected keys {list(expected)})")
                with upstream.judging():
                    t.expect(got[key], expected[key], f"[{key!r}]", hint=hint,
                             mistakes={n: w[key] for n, w in wrong.items()})


# -- 5.1 open and closed loop -----------------------------------------------------------------

@answer_code
def client_variant(plan, service, closed_loop: bool, queue: bool = True, closed_send: str = "plan",
                   measured: str = "send") -> dict:
    """client_latencies with one thing changed, to name a wrong answer: `queue` False serves each request
    at its send time, whatever the server is doing; `closed_send` "finish" sends the closed loop's next
    request at the previous finish, ignoring the plan; `measured` "plan" logs finish - plan in the
    closed loop, "service" logs the service time alone."""
    send, finish, prev = [], [], -math.inf
    for i, (p, work) in enumerate(zip(plan, service)):
        if not closed_loop:
            sent = p
        elif closed_send == "finish" and i > 0:
            sent = prev
        else:
            sent = max(p, prev)
        prev = (max(sent, prev) if queue else sent) + work
        send.append(sent)
        finish.append(prev)
    logged = {"send": [f - s for s, f in zip(send, finish)], "service": list(service),
              "plan": [f - p for p, f in zip(plan, finish)] if closed_loop else [f - s for s, f in zip(send, finish)]}
    return {"send": send, "finish": finish, "measured": logged[measured],
            "from_plan": [f - p for p, f in zip(plan, finish)]}


CLIENT_MISTAKES = {
    "measures the closed loop's latency from the plan; the client logs finish - send (its clock starts "
    "when it sends, which is what hides the wait)": dict(measured="plan"),
    "sends the closed loop's next request at the previous finish, ignoring the plan: a user who gets an "
    "answer early still waits for the next planned time, send[i] = max(plan[i], finish[i - 1])":
        dict(closed_send="finish"),
    "serves each request at its send time, as if the server had no queue (finish = send + service): the "
    "server starts request i at max(send[i], finish[i - 1])": dict(queue=False),
    "logs the service time as the measured latency; the client logs finish - send, which includes the "
    "time the request waited in the server's queue": dict(measured="service"),
}

@answer_code
def client_mistakes(plan, service, closed_loop: bool) -> dict:
    """The usual wrong client_latencies results on these inputs, each a whole result dict."""
    return {name: client_variant(plan, service, closed_loop, **kw) for name, kw in CLIENT_MISTAKES.items()}


# The lesson's example: request 1 stalls the server for 2.5 s. Open loop, requests 2 and 3 queue behind
# it; closed loop, request 1 is sent into an idle server at its planned time, and 2 and 3 late.
STALL = ([0.0, 1.0, 2.0, 3.0], [0.5, 2.5, 0.5, 0.5])
# Two requests planned at the same time, an idle gap, then a burst: every rule above differs somewhere.
BURST = ([10.0, 10.0, 10.25, 12.0, 12.0625, 12.125], [0.25, 0.125, 0.5, 0.0625, 0.375, 0.125])


def random_plan(rng) -> tuple[list[float], list[float]]:
    """A schedule on the 2**-10 s grid (exact differences), with a stall now and then."""
    n = rng.randint(5, 25)
    t0, plan = _on_grid(rng.uniform(0.0, 100.0), at_least=0), []
    for _ in range(n):
        plan.append(t0)
        t0 += _on_grid(rng.expovariate(1 / 0.05), at_least=0)
    service = [_on_grid(rng.uniform(0.5, 1.5) if rng.random() < 0.1 else rng.uniform(0.005, 0.08)) for _ in plan]
    return plan, service


@check(points=2, section="5.1")
def client_latencies(t):
    """Open loop sends on the plan; closed loop waits for each answer; measured from send, and from the plan."""
    visible = []
    for name, (plan, service) in [("the lesson's stall", STALL), ("a burst after an idle gap", BURST)]:
        for closed in (False, True):
            visible.append((f"visible: {name}, {'closed' if closed else 'open'} loop", (plan, service, closed)))
    hidden = []
    for _ in range(2):
        plan, service = random_plan(t.rng)
        hidden += [(plan, service, False), (plan, service, True)]
    for label, (plan, service, closed) in t.cases(visible, hidden):
        shown = f"plan={plan}, service_s={service}" if len(plan) <= 8 else \
            f"{len(plan)} requests planned from {plan[0]:g} s to {plan[-1]:g} s, service {min(service):g}-{max(service):g} s"
        with t.case(f"{label}: {shown}, closed_loop={closed}"):
            got, expected = t.both("client_latencies", plan, service, closed)
            t.expect_dict(got, expected, "client_latencies", mistakes=client_mistakes(plan, service, closed),
                          rtol=1e-9, atol=1e-12,
                          keys=("send", "finish", "measured", "from_plan"))
    with t.case("lists of different lengths raise ValueError"):
        t.expect_raises(ValueError, "client_latencies", [0.0, 1.0, 2.0], [0.5, 0.5], False,
                        why="three planned sends for two service times is a caller's bug; zip would drop "
                            "the third request without a word")
    with t.case("a plan that goes back in time raises ValueError"):
        t.expect_raises(ValueError, "client_latencies", [0.0, 2.0, 1.0], [0.5, 0.5, 0.5], True,
                        why="the plan is a schedule, non-decreasing; a decreasing one is a caller's bug")
