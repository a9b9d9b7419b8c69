"""Checks for lesson 08: the tail split by metric, per-request attribution of where the time went, the
tail's shares, the straggler replica, and the first suspect for a broken tail.

Data come from real replays of the Azure LLM inference trace 2023 through the reference engine on the
modeled H100 clock, two replicas behind a round-robin router, each replay with one injected fault
(reference_engine/faults.py; the model's forward is skipped, which leaves every modeled timestamp
unchanged). The grader runs the replays (engine code, not the learner's) and keeps them; the learner's
functions get the records as plain dicts, rebuilt in the learner's process from numpy columns, every call
on one replay in one round trip (call_on_replay). The verdicts are made here. The diagnosis check names the injected fault as the answer, on visible replays
(workload seed 2) and hidden ones (other workload seeds, tested in tests/test_l08_tail_latency.py to be
diagnosed right by the reference). Wrong answers are named by running the usual wrong versions (the
grader's own copies, below) on the same data.
"""
from __future__ import annotations

import bisect
import functools
import math

import numpy as np

from autograder.core import check

CAUSES = ("queueing", "prefill_interference", "preemption", "host_stall", "bad_replica")
COMPONENTS = ("queue_s", "prefill_stall_s", "preempted_s", "host_gap_s")
# The visible seed is one whose six replays show every named mistake (tests/test_l08_tail_latency.py); the
# hidden ones are the workload seeds whose replays the reference diagnoses right (tested too).
VISIBLE_SEED = 2
HIDDEN_SEEDS = (0, 3, 4, 5, 6, 7)
# The graded replays are half the notebook's (150 requests, not 300: each replay costs half the CPU), with
# the two faults that depend on the length resized to match: the burst squeezes 120 requests from t = 0.5 s
# (most of the replay, as 150 of 300 from t = 2 s do), a host pause every 100 steps (as many pauses as one
# every 200 in a replay twice as long). Every other fault keeps FaultSpec's defaults.
N_REQUESTS, RPS = 150, 60.0
GRADING_SPEC = {"burst_at": 0.5, "burst_size": 120, "pause_every": 100}


@functools.lru_cache(maxsize=8)
def workload(seed: int) -> tuple:
    """The workload of one seed (lesson 08's workload()): every cause replays the same one, so it is read
    from the trace once per seed, not once per replay."""
    from reference_engine import trace as tr

    reqs = tr.with_rate(tr.scale_to_context(tr.sample(N_REQUESTS, seed=seed, trace="conv"), 512), RPS)
    return tuple(reqs), tuple(tuple(p) for p in tr.prompt_token_ids(reqs, vocab_size=2048, seed=seed, exclude=(0,)))


@functools.lru_cache(maxsize=64)  # every replay a check can draw (7 seeds x 6 causes) stays in memory
def replay(cause: str, seed: int) -> dict:
    """One replay with one fault (lesson 08's replay_fault(cause, N_REQUESTS, RPS, seed, **GRADING_SPEC),
    built here from the engine): plain records."""
    from reference_engine.faults import FaultSpec, run_fault

    reqs, prompts = workload(seed)
    spec = FaultSpec(cause=cause, seed=seed, **GRADING_SPEC)
    return run_fault(spec, list(reqs), [list(p) for p in prompts], compute=False)


# -- the wire: a replay travels as columns, and the learner's calls on it loop over there -----------------

STEP_FIELDS = ("start", "end", "prefill_tokens", "decode_tokens", "preempted", "running", "waiting")
REQUEST_FIELDS = ("arrival", "first_scheduled", "finish", "num_preemptions", "prompt_tokens", "replica")


def to_columns(data: dict) -> dict:
    """A replay's records as numpy columns (a few blobs on the wire instead of thousands of small dicts):
    each step field per replica, each request field, and the token times flat with their counts."""
    rs = data["requests"]
    return {"steps": [{k: np.array([s[k] for s in steps]) for k in STEP_FIELDS} for steps in data["steps"]],
            "requests": {k: np.array([r[k] for r in rs]) for k in REQUEST_FIELDS},
            "token_times": np.array([x for r in rs for x in r["token_times"]]),
            "num_tokens": np.array([len(r["token_times"]) for r in rs])}


def from_columns(cols: dict) -> tuple[list[dict], list[list[dict]]]:
    """to_columns undone: (requests, steps_by_replica) as plain dicts of Python floats and ints, equal to
    the replay's records (tolist() gives back the very floats)."""
    steps = [[dict(zip(STEP_FIELDS, row)) for row in zip(*(c[k].tolist() for k in STEP_FIELDS))]
             for c in cols["steps"]]
    times, counts = cols["token_times"].tolist(), cols["num_tokens"].tolist()
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    rows = zip(*(cols["requests"][k].tolist() for k in REQUEST_FIELDS))
    requests = []
    for i, row in enumerate(rows):
        r = dict(zip(REQUEST_FIELDS, row))
        r["token_times"] = times[bounds[i]:bounds[i + 1]]
        requests.append({k: r[k] for k in ("arrival", "first_scheduled", "token_times", "finish",
                                            "num_preemptions", "prompt_tokens", "replica")})
    return requests, steps


def call_on_replay(fn, cols: dict, calls: list) -> list:
    """Harness (runs in the learner's process): `fn` called once per entry of `calls` on the replay `cols`,
    in one round trip. An entry is a list of arguments, each a literal or one of ["$request", i] (request
    i), ["$steps_of", i] (the steps of request i's replica), ["$requests"] and ["$steps"] (all of them).
    Every call gets fresh records, so a call that edits its arguments cannot change the next one. Returns
    [value, index of the first argument the call changed or None] per call."""
    out = []
    for spec in calls:
        requests, steps = from_columns(cols)
        args = [_resolve(a, requests, steps) for a in spec]
        value = fn(*args)
        fresh = [_resolve(a, *from_columns(cols)) for a in spec]
        changed = next((i for i, (a, b) in enumerate(zip(args, fresh)) if a != b), None)
        out.append([value, changed])
    return out


def _resolve(arg, requests, steps):
    if isinstance(arg, list) and arg and isinstance(arg[0], str) and arg[0].startswith("$"):
        kind = arg[0]
        if kind == "$request":
            return requests[arg[1]]
        if kind == "$steps_of":
            return steps[requests[arg[1]]["replica"]]
        return requests if kind == "$requests" else steps
    return arg


def learner_calls(t, name: str, cause: str, seed: int, calls: list, args_here) -> list:
    """The learner's `name` on each of `calls` (see call_on_replay) of replay (cause, seed), in one round
    trip. Returns one zero-argument function per call that gives its value inside a case (failing it if
    the call changed an argument). If the learner's code raised anywhere, each call is made on its own
    instead (t.call with args_here(spec), the records themselves), so that only the cases whose call
    raises fail, with the learner's traceback."""
    from autograder.core import LearnerRaised

    try:
        got = t.run(call_on_replay, t.learner(name), columns(cause, seed), calls, what=name)
    except LearnerRaised:
        return [functools.partial(t.call, name, *args_here(spec)) for spec in calls]

    def value(v, changed):
        if changed is not None:
            t.fail(f"{name}() modified its argument #{changed + 1} in place; callers (the dashboard, the "
                   "next check) still need the original: work on a copy")
        return v
    return [functools.partial(value, v, changed) for v, changed in got]


@functools.lru_cache(maxsize=64)
def columns(cause: str, seed: int) -> dict:
    return to_columns(replay(cause, seed))


def here(data: dict):
    """args_here for learner_calls: the records themselves for each argument of a call spec."""
    return lambda spec: [_resolve(a, data["requests"], data["steps"]) for a in spec]


# -- 1.1 tail_summary ----------------------------------------------------------------------------------

def summary_variant(requests, q, ttft_from="arrival", itl="pooled", e2e_from="arrival", method="linear"):
    """tail_summary with one thing changed: TTFT measured from first_scheduled, ITL as one mean per request,
    E2E from the first token, or a nearest-rank percentile."""
    ttft = [r["token_times"][0] - r[ttft_from] for r in requests]
    e2e = [r["finish"] - (r["token_times"][0] if e2e_from == "first_token" else r["arrival"]) for r in requests]
    if itl == "pooled":
        itls = [b - a for r in requests for a, b in zip(r["token_times"], r["token_times"][1:])]
    else:
        itls = [(r["token_times"][-1] - r["token_times"][0]) / (len(r["token_times"]) - 1)
                for r in requests if len(r["token_times"]) > 1]

    def pair(x):
        return (float(np.percentile(x, 50, method=method)), float(np.percentile(x, q, method=method))) if x else (math.nan,) * 2

    return {"ttft": pair(ttft), "itl": pair(itls), "e2e": pair(e2e)}


SUMMARY_MISTAKES = {
    "measures TTFT from first_scheduled; the user waits from arrival, queueing included": dict(ttft_from="first_scheduled"),
    "averages the gaps within each request (one value per request, like TPOT); ITL pools every gap": dict(itl="mean"),
    "measures E2E from the first token; it runs from arrival to finish": dict(e2e_from="first_token"),
    "takes a nearest-rank percentile; use np.percentile's linear interpolation": dict(method="nearest"),
}


def _small_requests(rng, n=12):
    out = []
    for _ in range(n):
        arrival = round(rng.uniform(0, 5), 3)
        sched = arrival + round(rng.expovariate(20), 4)
        t = sched + round(rng.uniform(0.01, 0.05), 4)
        times = [t]
        for _ in range(rng.randint(0, 8)):
            t += round(rng.choice([0.006, 0.006, 0.007, rng.uniform(0.01, 0.2)]), 4)
            times.append(t)
        out.append({"arrival": arrival, "first_scheduled": sched, "token_times": times, "finish": times[-1]})
    return out


@check(points=2, section="1.1", timeout=60)
def tail_summary(t):
    """p50 and p99 of TTFT, pooled ITL and E2E."""
    visible = [(f"visible: the clean replay (workload seed {VISIBLE_SEED})", ("none", VISIBLE_SEED, 99)),
               ("visible: the host-stall replay, p90", ("host_stall", VISIBLE_SEED, 90))]
    for label, case in t.cases(visible=visible, hidden=lambda rng: ("small", rng.randint(0, 10**6), rng.choice([90, 99])), n=2):
        if case[0] == "small":
            import random
            requests, q = _small_requests(random.Random(case[1])), case[2]
            call = functools.partial(t.call, "tail_summary", requests, q)
        else:
            requests, q = replay(case[0], case[1])["requests"], case[2]
            call, = learner_calls(t, "tail_summary", case[0], case[1], [[["$requests"], q]], here(replay(*case[:2])))
        with t.case(f"{label} ({len(requests)} requests, q={q})"):
            expected = t.ref.tail_summary(requests, q)
            got = call()
            mistakes = {name: summary_variant(requests, q, **kw) for name, kw in SUMMARY_MISTAKES.items()}
            t.expect(got, expected, "the (p50, pq) pairs", rtol=1e-9, atol=1e-12, mistakes=mistakes)


# -- 2.1 attribute_request -----------------------------------------------------------------------------

class StepIndex:
    """What attribute() needs of one replica's steps, computed once: the step ends (increasing), the step
    of each end, each step's duration and its cumulative sum, the idle gaps between steps with their
    cumulative lengths, and the bases (median and mean of the decode-only steps, median of all)."""

    def __init__(self, steps):
        self.ends = [s["end"] for s in steps]
        self.by_end = {s["end"]: s for s in steps}
        dur = [s["end"] - s["start"] for s in steps]
        self.dur_cum = [0.0, *np.cumsum(dur).tolist()]
        self.gap_lo = [a["end"] for a in steps[:-1]]
        self.gap_hi = [b["start"] for b in steps[1:]]
        self.gap_cum = [0.0, *np.cumsum([max(0.0, h - lo) for lo, h in zip(self.gap_lo, self.gap_hi)]).tolist()]
        plain = [d for s, d in zip(steps, dur) if s["prefill_tokens"] == 0]
        self.base = {"median": float(np.median(plain)) if plain else 0.0,
                     "mean": float(np.mean(plain)) if plain else 0.0, "all": float(np.median(dur)) if dur else 0.0}

    def idle_before(self, x: float) -> float:
        """Idle time between steps before time x (gaps are in time order and disjoint)."""
        k = bisect.bisect_right(self.gap_hi, x)  # gaps 0..k-1 end at or before x
        part = max(0.0, x - self.gap_lo[k]) if k < len(self.gap_lo) else 0.0
        return self.gap_cum[k] + part

    def idle(self, lo: float, hi: float) -> float:
        return max(0.0, self.idle_before(hi) - self.idle_before(lo)) if hi > lo else 0.0


_INDEX: dict[int, tuple] = {}


def step_index(steps) -> StepIndex:
    """StepIndex of `steps`, kept while the list lives (the replays are cached, so each is built once)."""
    hit = _INDEX.get(id(steps))
    if hit is None or hit[0] is not steps:
        if len(_INDEX) > 256:
            _INDEX.clear()
        hit = _INDEX[id(steps)] = (steps, StepIndex(steps))
    return hit[1]


def attribute(request, steps, gaps_everywhere=False, queue_with_gaps=False, inclusive=False, whole_step=False,
              mean_base=False, base_all=False):
    """attribute_request (the grader's copy) and its usual wrong versions, one keyword each: host gaps of
    the whole run (not clipped to the request's life), queue time with the host gaps left in, the token step
    counted as sat out (<= instead of <), the whole prefill step as stall (no base), the base as a mean, or
    the base over every step. The same sums as the solution, taken from the cumulative sums of StepIndex."""
    arrival, sched, times = request["arrival"], request["first_scheduled"], request["token_times"]
    finish = times[-1]
    ix = step_index(steps)
    base = 0.0 if whole_step else ix.base["mean" if mean_base else "all" if base_all else "median"]
    preempted = stall = 0.0
    for prev, cur in zip(times, times[1:]):
        hi = (bisect.bisect_right if inclusive else bisect.bisect_left)(ix.ends, cur)
        lo = bisect.bisect_right(ix.ends, prev)
        preempted += ix.dur_cum[hi] - ix.dur_cum[lo] if hi > lo else 0.0
        s = ix.by_end.get(cur)  # None only for a wrong version judging a request against another replica
        if s is not None and s["prefill_tokens"] > 0:
            stall += max(0.0, s["end"] - s["start"] - base)
    host = ix.gap_cum[-1] if gaps_everywhere else ix.idle(arrival, finish)
    queue = sched - arrival - (0.0 if queue_with_gaps else ix.gap_cum[-1] if gaps_everywhere else ix.idle(arrival, sched))
    return {"queue_s": queue, "prefill_stall_s": stall, "preempted_s": preempted, "host_gap_s": host}


ATTRIBUTE_MISTAKES = {
    "counts every host gap of the run; only the overlap with [arrival, finish] is this request's":
        dict(gaps_everywhere=True),
    "leaves the host gaps in queue_s; a gap inside [arrival, first_scheduled] is host time, not queueing":
        dict(queue_with_gaps=True),
    "counts the step that produced token k as sat out too; only steps ending strictly between two tokens are":
        dict(inclusive=True),
    "counts a whole prefill-carrying step as stall; only what it took beyond a plain decode step (the "
    "median decode-only step) is": dict(whole_step=True),
    "takes the mean of the decode-only steps as the base; the median is robust to the stalls themselves":
        dict(mean_base=True),
    "takes the base over every step; it is the median of the decode-only steps (prefill_tokens == 0)":
        dict(base_all=True),
}

DOC_STEPS = [{"start": 0.0, "end": 1.0, "prefill_tokens": 10, "decode_tokens": 0},
             {"start": 1.125, "end": 2.125, "prefill_tokens": 9, "decode_tokens": 1},
             {"start": 2.125, "end": 2.875, "prefill_tokens": 8, "decode_tokens": 2},
             {"start": 2.875, "end": 3.375, "prefill_tokens": 0, "decode_tokens": 2}]
DOC_REQUEST = {"arrival": 0.5, "first_scheduled": 1.125, "token_times": [2.125, 2.875, 3.375], "finish": 3.375}


def pick_requests(requests: list[dict], k: int = 4) -> list[int]:
    """The k slowest requests by E2E (the tail is where the faults show), the median one, the one with the
    longest TTFT (after a burst or a host pause it waited longest to start), and the one preempted most
    often (if any was)."""
    order = sorted(range(len(requests)), key=lambda i: requests[i]["finish"] - requests[i]["arrival"])
    ttft = max(range(len(requests)), key=lambda i: requests[i]["token_times"][0] - requests[i]["arrival"])
    most = max(range(len(requests)), key=lambda i: requests[i]["num_preemptions"])
    extra = [most] if requests[most]["num_preemptions"] else []
    return list(dict.fromkeys(order[-k:][::-1] + [order[len(order) // 2], ttft] + extra))


def attribute_cases(t, cause: str, seed: int, label: str):
    data = replay(cause, seed)
    picked = pick_requests(data["requests"])
    calls = learner_calls(t, "attribute_request", cause, seed, [[["$request", i], ["$steps_of", i]] for i in picked],
                          here(data))
    for i, got in zip(picked, calls):
        r = data["requests"][i]
        steps = data["steps"][r["replica"]]
        with t.case(f"{label}: request {i} (E2E {r['finish'] - r['arrival']:.4f} s, {r['num_preemptions']} "
                    f"preemption(s), replica {r['replica']})"):
            expected = t.ref.attribute_request(r, steps)
            got = got()
            mistakes = {name: attribute(r, steps, **kw) for name, kw in ATTRIBUTE_MISTAKES.items()}
            t.expect(got, expected, "the attribution (seconds)", rtol=1e-6, atol=1e-9, mistakes=mistakes)


@check(points=3, section="2.1", timeout=90)
def attribute_request(t):
    """Queue, prefill stall, preempted and host-gap seconds of single requests of real replays."""
    with t.case("visible: the docstring's example"):
        got, expected = t.both("attribute_request", DOC_REQUEST, DOC_STEPS)
        t.expect(got, expected, "the attribution (seconds)", rtol=1e-9,
                 mistakes={name: attribute(DOC_REQUEST, DOC_STEPS, **kw) for name, kw in ATTRIBUTE_MISTAKES.items()})
    visible = [("visible: host-stall replay", ("host_stall", VISIBLE_SEED)),
               ("visible: small-KV-pool replay", ("preemption", VISIBLE_SEED)),
               ("visible: long-prompt-flood replay", ("prefill_interference", VISIBLE_SEED))]
    hidden = lambda rng: (rng.choice(CAUSES), rng.choice(HIDDEN_SEEDS))  # noqa: E731
    for label, (cause, seed) in t.cases(visible=visible, hidden=hidden, n=1):
        attribute_cases(t, cause, seed, label if label.startswith("visible") else f"{label} ({cause} replay)")


# -- 2.2 tail_shares -----------------------------------------------------------------------------------

def shares_variant(requests, steps_by_replica, q, everyone=False, per_request=False, replica0=False):
    """tail_shares with one thing changed: every request as the tail, the mean of per-request shares, or
    every request judged against replica 0's steps."""
    e2e = [r["finish"] - r["arrival"] for r in requests]
    cut = np.percentile(e2e, q)
    tail = [r for r, x in zip(requests, e2e) if everyone or x >= cut]
    parts = [(attribute(r, steps_by_replica[0 if replica0 else r["replica"]]), r["finish"] - r["arrival"]) for r in tail]
    if per_request:
        return {k: sum(a[k] / d for a, d in parts) / len(parts) for k in COMPONENTS}
    total = sum(d for _, d in parts)
    return {k: sum(a[k] for a, _ in parts) / total for k in COMPONENTS}


SHARES_MISTAKES = {
    "averages over every request; the shares are the tail's (E2E >= the q-th percentile)": dict(everyone=True),
    "averages per-request shares; the share is the tail's summed component over its summed E2E": dict(per_request=True),
    "judges every request against replica 0's steps; each request ran on its own replica": dict(replica0=True),
}


@check(points=2, section="2.2", timeout=90)
def tail_shares(t):
    """Summed components over summed E2E, for the requests at or above the q-th E2E percentile."""
    visible = [("visible: burst replay, q=90", ("queueing", VISIBLE_SEED, 90)),
               ("visible: slow-replica replay, q=95", ("bad_replica", VISIBLE_SEED, 95))]
    hidden = lambda rng: (rng.choice(CAUSES), rng.choice(HIDDEN_SEEDS), rng.choice([90, 95]))  # noqa: E731
    for label, (cause, seed, q) in t.cases(visible=visible, hidden=hidden, n=1):
        data = replay(cause, seed)
        call, = learner_calls(t, "tail_shares", cause, seed, [[["$requests"], ["$steps"], q]], here(data))
        with t.case(label if label.startswith("visible") else f"{label} ({cause} replay, q={q})"):
            expected = t.ref.tail_shares(data["requests"], data["steps"], q)
            got = call()
            mistakes = {name: shares_variant(data["requests"], data["steps"], q, **kw) for name, kw in SHARES_MISTAKES.items()}
            t.expect(got, expected, "the tail's shares", rtol=1e-6, atol=1e-9, mistakes=mistakes)


# -- 3.1 straggler_replica ---------------------------------------------------------------------------

def straggler_variant(lats, ratio, center="median", include_self=False, first=False, at_least=False):
    """straggler_replica with one thing changed: means instead of medians, the others' median taken with
    the replica itself included, the first straggler instead of the worst, or >= instead of >."""
    f = np.mean if center == "mean" else np.median
    meds = {i: float(f(x)) for i, x in enumerate(lats) if len(x)}
    if len(meds) < 2:
        return None
    best, best_excess = None, ratio
    for i, m in meds.items():
        others = float(np.median([v for j, v in meds.items() if include_self or j != i]))
        excess = m / others if others > 0 else math.inf
        if (excess >= best_excess if at_least else excess > best_excess) and not (first and best is not None):
            best, best_excess = i, excess
    return best


STRAGGLER_MISTAKES = {
    "compares means; one very slow request drags a mean, the median is what everyone on the replica sees":
        dict(center="mean"),
    "includes the replica itself in the median it is compared with": dict(include_self=True),
    "returns the first straggler found, not the one furthest above the others": dict(first=True),
    "flags a replica exactly ratio times the others; a straggler is more than ratio times slower": dict(at_least=True),
}

STRAGGLER_CASES = [
    ("visible: the docstring's three replicas", ([[1.0, 1.2, 0.9], [3.0, 2.8, 3.3], [1.1, 1.0]], 1.5)),
    ("visible: one request of 40 s on a healthy replica (a mean would flag it)", ([[1.0, 1.1, 40.0, 0.9, 1.0], [1.0, 1.2, 1.1], [0.9, 1.0]], 1.5)),
    ("visible: two slow replicas of four, the second slower", ([[1.0, 1.0], [2.0, 2.2], [1.1, 0.9], [3.0, 3.1]], 1.5)),
    ("visible: exactly 1.5 times the others", ([[1.0, 1.0], [1.5, 1.5], [1.0, 1.0]], 1.5)),
    ("visible: two replicas, 2.5 and 1.0 s; an empty third", ([[2.5, 2.5, 2.5], [1.0, 1.0, 1.0], []], 2.0)),
    ("visible: one replica only", ([[5.0, 6.0]], 1.5)),
]


def random_latencies(rng):
    n = rng.randint(2, 6)
    lats = [[round(rng.lognormvariate(0, 0.3), 4) for _ in range(rng.randint(3, 12))] for _ in range(n)]
    if rng.random() < 0.7:
        slow = rng.randrange(n)
        lats[slow] = [x * rng.uniform(1.2, 3.0) for x in lats[slow]]
    return lats, rng.choice([1.3, 1.5, 2.0])


@check(points=2, section="3.1")
def straggler_replica(t):
    """The replica whose median latency is more than ratio x the other replicas' median, the worst one."""
    for label, (lats, ratio) in t.cases(visible=STRAGGLER_CASES, hidden=random_latencies, n=3):
        with t.case(f"{label} (ratio {ratio})"):
            got, expected = t.both("straggler_replica", lats, ratio)
            mistakes = {name: straggler_variant(lats, ratio, **kw) for name, kw in STRAGGLER_MISTAKES.items()}
            t.expect(got, expected, "the straggler (replica index or None)", mistakes=mistakes)
    # the real thing: the slow-replica replay, by per-token latency
    data = replay("bad_replica", VISIBLE_SEED)
    lats = [[(r["finish"] - r["arrival"]) / len(r["token_times"]) for r in data["requests"] if r["replica"] == i]
            for i in range(len(data["steps"]))]
    with t.case("visible: the slow-replica replay's per-token latencies (replica 1 is throttled)"):
        got, expected = t.both("straggler_replica", lats, 1.5)
        t.expect(got, expected, "the straggler (replica index or None)")


# -- 3.2 first_suspect ---------------------------------------------------------------------------------

def suspect_variant(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5, order=None, guard=True,
                    count_preempted=True, largest=False):
    """first_suspect with one thing changed: another order of the suspects, no preemption guard on
    queueing, preemption judged by its share only, or the largest share named whatever the order."""
    shares = shares_variant(requests, steps_by_replica, q)
    preempted = any(r["num_preemptions"] > 0 for r in requests)
    tests = {"queueing": shares["queue_s"] >= min_share and not (guard and preempted),
             "prefill_interference": shares["prefill_stall_s"] >= min_share,
             "preemption": shares["preempted_s"] >= min_share or (count_preempted and preempted),
             "host_stall": shares["host_gap_s"] >= min_share}
    n = 1 + max(r["replica"] for r in requests)
    lats = [[(r["finish"] - r["arrival"]) / len(r["token_times"]) for r in requests if r["replica"] == i] for i in range(n)]
    tests["bad_replica"] = straggler_variant(lats, ratio) is not None
    if largest:
        k = max(COMPONENTS, key=lambda c: shares[c])
        return {"queue_s": "queueing", "prefill_stall_s": "prefill_interference", "preempted_s": "preemption",
                "host_gap_s": "host_stall"}[k] if shares[k] >= min_share else ("bad_replica" if tests["bad_replica"] else "none")
    for name in order or CAUSES:
        if tests[name]:
            return name
    return "none"


SUSPECT_MISTAKES = {
    "names queueing although requests were preempted; with preemptions the queue is a symptom of a full KV "
    "pool": dict(guard=False),
    "judges preemption by its share of the tail alone; any preemption at all means the KV pool ran out "
    "(the queue it causes is counted as queueing)": dict(count_preempted=False),
    "names the largest share whatever the order; the order is the procedure (queueing, prefill "
    "interference, preemption, host stall, bad replica)": dict(largest=True),
    "checks the replicas before the engine's own suspects; a straggler test comes last":
        dict(order=("bad_replica", "queueing", "prefill_interference", "preemption", "host_stall")),
}


@check(points=4, section="3.2", timeout=180)
def first_suspect(t):
    """The injected fault named, on a clean replay and one replay per fault."""
    visible = [(f"visible: {cause} injected (workload seed {VISIBLE_SEED})", (cause, VISIBLE_SEED))
               for cause in ("none", *CAUSES)]
    hidden = lambda rng: (rng.choice(("none", *CAUSES)), rng.choice(HIDDEN_SEEDS))  # noqa: E731
    for label, (cause, seed) in t.cases(visible=visible, hidden=hidden, n=2):
        data = replay(cause, seed)
        call, = learner_calls(t, "first_suspect", cause, seed, [[["$requests"], ["$steps"]]], here(data))
        with t.case(label if label.startswith("visible") else f"{label}: one fault injected (or none)"):
            got = call()
            mistakes = {name: suspect_variant(data["requests"], data["steps"], **kw) for name, kw in SUSPECT_MISTAKES.items()}
            t.expect(got, cause, "the first suspect", mistakes=mistakes)
