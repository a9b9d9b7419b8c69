"""Checks for lesson 08: the tail split by metric, per-request attribution of where the time went, the
tail's shares, the straggler replica, and the first suspect for a broken tail.

Data come from real replays of the Azure LLM inference trace 2023 through the reference engine on the
modeled H100 clock, two replicas behind a round-robin router, each replay with one injected fault
(reference_engine/sim/faults.py; the model's forward is skipped, which leaves every modeled timestamp
unchanged). The replays are engine code, not the learner's: stored with the course (autograder/checks/data/
l08_replays, recomputed from the engine and compared by a test) and read by the grader; the learner's
functions get the records as plain dicts, rebuilt in the learner's process from numpy columns, every call
on one replay in one round trip (call_on_replay). The verdicts are made here. The diagnosis check names the injected fault as the answer, on visible replays
(workload seed 2) and hidden ones (other workload seeds, tested in tests/test_l08_tail_latency.py to be
diagnosed right by the reference). Wrong answers are named by running the usual wrong versions (the
grader's own copies, below) on the same data. Small hand-made records add what the replays never show:
docstring-sized steps for attribute_request's edges, and synthetic fleets (fleet(), binary-fraction times, so
every sum is exact) for a tie at the tail's cut, a share exactly at min_share, a preempted request outside
the tail, two signals at once, and q, min_share and ratio passed on. The grader's code that computes an
answer or a mistake's value (the variants, the attribution and its step index) is `@answer_code`
(autograder/reference.py): a student's copy holds its name and docstring, and replays its results on the
visible cases.
"""
from __future__ import annotations

import bisect
import functools
import gzip
import json
import math
from pathlib import Path

import numpy as np

from autograder.core import check
from autograder.harnesses.l08_tail_latency import _resolve, call_on_replay, to_columns
from autograder.reference import answer_code

CAUSES = ("queueing", "prefill_interference", "preemption", "host_stall", "bad_replica")
SUSPECT_ORDER = ("bad_replica", "queueing", "prefill_interference", "preemption", "host_stall")
COMPONENTS = ("queue_s", "prefill_stall_s", "preempted_s", "host_gap_s")
# The visible seed is one whose six replays show every named mistake (tests/test_l08_tail_latency.py); the
# hidden ones are workload seeds drawn at random from 2**31 whose replays the reference diagnoses right (tested
# too). They and their replays are the instructor's: a student's copy holds neither (INSTRUCTOR_ONLY_DATA), so
# that no table of the hidden replays' causes can be made from it (small seeds could be enumerated).
VISIBLE_SEED = 2
HIDDEN_SEEDS_FILE = Path(__file__).with_name("data") / "l08_hidden_seeds.json"
HIDDEN_SEED_COUNT = 6


def _hidden_seeds() -> tuple[int, ...]:
    """The hidden seeds; in a student's copy, placeholders as many (hidden cases are drawn there too, never
    graded: the draws keep the visible cases' randomness the same in both)."""
    try:
        seeds = tuple(json.loads(HIDDEN_SEEDS_FILE.read_text()))
    except OSError:  # a student's copy: the hidden cases are graded by the instructor
        return (VISIBLE_SEED,) * HIDDEN_SEED_COUNT
    if len(seeds) != HIDDEN_SEED_COUNT:
        raise RuntimeError(f"{HIDDEN_SEEDS_FILE} holds {len(seeds)} seeds, not HIDDEN_SEED_COUNT = {HIDDEN_SEED_COUNT}")
    return seeds


HIDDEN_SEEDS = _hidden_seeds()
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
    from reference_engine.sim import trace as tr

    reqs = tr.with_rate(tr.scale_to_context(tr.sample(N_REQUESTS, seed=seed, trace="conv"), 512), RPS)
    return tuple(reqs), tuple(tuple(p) for p in tr.prompt_token_ids(reqs, vocab_size=2048, seed=seed, exclude=(0,)))


@functools.lru_cache(maxsize=64)  # every replay a check can draw (7 seeds x 6 causes) stays in memory
def replay(cause: str, seed: int) -> dict:
    """One replay with one fault (lesson 08's replay_fault(cause, N_REQUESTS, RPS, seed, **GRADING_SPEC)):
    plain records. Every replay a check can draw is stored with the course (REPLAYS_DIR, written by
    `python -m autograder.checks.l08_tail_latency`; tests/test_l08_tail_latency.py recomputes each one from
    the engine and compares), so a check reads it instead of replaying (42 replays: about 5 s of engine
    steps). Any other replay is computed."""
    stored = _stored_replay(cause, seed)
    return stored if stored is not None else compute_replay(cause, seed)


def replay_keys() -> list[tuple[str, int]]:
    """(cause, seed) of every replay a check can draw: each cause and none, on the visible and hidden seeds."""
    return [(cause, seed) for seed in (VISIBLE_SEED, *HIDDEN_SEEDS) for cause in ("none", *CAUSES)]


REPLAYS_DIR = Path(__file__).with_name("data") / "l08_replays"


def _replay_file(cause: str, seed: int, root: Path = REPLAYS_DIR) -> Path:
    return root / f"{cause}-{seed}.json.gz"


# What `course release` leaves out of a student's copy: the hidden seeds and their replays.
INSTRUCTOR_ONLY_DATA = [HIDDEN_SEEDS_FILE] + [_replay_file(cause, seed) for cause, seed in replay_keys()
                                              if seed != VISIBLE_SEED]


def _stored_replay(cause: str, seed: int) -> dict | None:
    try:
        with gzip.open(_replay_file(cause, seed), "rt") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_replays(root: Path = REPLAYS_DIR) -> None:
    """Compute every replay of replay_keys() from the engine and store each in its own file (JSON keeps every
    float exactly; a check reads only the replays it draws)."""
    root.mkdir(parents=True, exist_ok=True)
    for cause, seed in replay_keys():
        with gzip.open(_replay_file(cause, seed, root), "wt", compresslevel=9) as f:
            json.dump(compute_replay(cause, seed), f, separators=(",", ":"))


def compute_replay(cause: str, seed: int) -> dict:
    """replay(), built from the engine."""
    from reference_engine.sim.faults import FaultSpec, run_fault

    reqs, prompts = workload(seed)
    spec = FaultSpec(cause=cause, seed=seed, **GRADING_SPEC)
    return run_fault(spec, list(reqs), [list(p) for p in prompts], compute=False)


# -- the wire: a replay travels as columns, and the learner's calls on it loop over there -----------------
# (the columns and the loop: autograder/harnesses/l08_tail_latency.py)


def call_hinted(t, name: str, *args):
    """t.call(name, *args), with a teaching message for a KeyError on a time: a token time looked up among
    steps that did not produce it (the traceback alone only shows `by_end[t]`)."""
    from autograder.core import LearnerRaised

    try:
        return t.call(name, *args)
    except LearnerRaised as e:
        msg = str(e.info.get("message") or "")
        if e.not_implemented or not e.is_a(KeyError) or not _is_number(msg):
            raise
        t.fail(f"{name}() raised KeyError {msg}: a token time that is the end of no step in the steps it was "
               "looked up in.", "judges a request against another replica's steps; each request ran on "
               "steps_by_replica[request[\"replica\"]]", end=f".\n{e.tb_text}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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
        return [functools.partial(call_hinted, t, name, *args_here(spec)) for spec in calls]

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


# -- synthetic fleets: small plain records where each signal is placed by hand ----------------------------

STEP = 1 / 64  # one plain decode step of the synthetic fleet (s): binary fractions keep every sum exact


def fleet(lengths=(6, 7, 8, 9, 10, 11, 12, 16), replicas=2, slow=None, queue=None, sat_out=None, preempted=(),
          flood=None, host=None):
    """A synthetic fleet (requests, steps_by_replica), for the cases that need two signals at once, a
    preempted request outside the tail, a share exactly at min_share, a tie at the tail's cut: cheaper and
    more exact than a replay. Replica r admits its request k at step 4k (that step computes its prompt) and
    gives it one token per step for lengths[k] tokens (lengths: one tuple for every replica, or one per
    replica); every step lasts STEP times slow[r]. Faults, keyed (replica, request) or (replica, step):
    queue: steps waited before admission; sat_out: (first step, count) of steps the request sits out (and
    num_preemptions 1); preempted: requests counted as preempted (num_preemptions 1) that sat nothing out;
    flood: extra STEPs a prefill-heavy step lasts; host: idle STEPs before a step."""
    slow, queue, sat_out, flood, host = slow or {}, queue or {}, sat_out or {}, flood or {}, host or {}
    per_replica = isinstance(lengths[0], (tuple, list))
    requests, steps_by_replica = [], []
    for r in range(replicas):
        plan = []
        for k, n in enumerate(lengths[r] if per_replica else lengths):
            a, c = sat_out.get((r, k), (0, 0))
            plan.append((k, [j for j in range(4 * k, 4 * k + n + c) if not a <= j < a + c]))
        steps, clock, unit = [], 0.0, STEP * slow.get(r, 1)
        for j in range(1 + max(toks[-1] for _, toks in plan)):
            clock += host.get((r, j), 0) * unit
            end = clock + (1 + flood.get((r, j), 0)) * unit
            prefill = 32 * sum(4 * k == j for k, _ in plan) + (512 if (r, j) in flood else 0)
            steps.append({"start": clock, "end": end, "prefill_tokens": prefill, "decode_tokens": 1,
                          "preempted": 0, "running": 1, "waiting": 0})
            clock = end
        for k, toks in plan:
            times = [steps[j]["end"] for j in toks]
            requests.append({"arrival": steps[4 * k]["start"] - queue.get((r, k), 0) * STEP,
                             "first_scheduled": steps[4 * k]["start"], "token_times": times, "finish": times[-1],
                             "num_preemptions": int((r, k) in sat_out or (r, k) in preempted),
                             "prompt_tokens": 32, "replica": r})
        steps_by_replica.append(steps)
    requests.sort(key=lambda x: (x["arrival"], x["replica"]))
    return requests, steps_by_replica


# -- 1.1 tail_summary ----------------------------------------------------------------------------------

@answer_code
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


@answer_code
def summary_mistakes(requests, q) -> dict:
    """The usual wrong tail_summary results on these inputs, each a whole result dict."""
    return {name: summary_variant(requests, q, **kw) for name, kw in SUMMARY_MISTAKES.items()}


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


# every request has one token: no gap, so no ITL value at all (the docstring asks for (nan, nan))
ONE_TOKEN = [{"arrival": 0.0, "first_scheduled": 0.25, "token_times": [0.5], "finish": 0.5},
             {"arrival": 1.0, "first_scheduled": 1.0, "token_times": [1.25], "finish": 1.25},
             {"arrival": 2.0, "first_scheduled": 2.5, "token_times": [3.0], "finish": 3.0}]


def one_token_case(t):

    with t.case("visible: every request has one token (no gap, so no ITL value at all)"):
        expected = t.ref.tail_summary(ONE_TOKEN, 99)
        got, raised = t.attempt(t.call, "tail_summary", ONE_TOKEN, 99)
        if raised:
            t.fail(f"tail_summary() raised {raised.type_name} on requests of one token each. With no gap there is no "
                   "ITL value (np.percentile of an empty list raises); the docstring asks for (nan, nan) for a "
                   f"metric with no values.\n{raised.tb_text}")
        itl = got.get("itl") if isinstance(got, dict) else None
        t.expect_true(isinstance(itl, (tuple, list)) and len(itl) == 2
                      and all(isinstance(x, float) and math.isnan(x) for x in itl),
                      f"the ITL pair: got {itl!r}, expected (nan, nan): with no gap there is no ITL value, and the "
                      "docstring asks for (nan, nan) for a metric with no values")
        keys = ("ttft", "e2e")
        mistakes = {name: {k: wrong[k] for k in keys} for name, wrong in summary_mistakes(ONE_TOKEN, 99).items()}
        t.expect({k: got.get(k) for k in keys}, {k: expected[k] for k in keys}, "the TTFT and E2E pairs", rtol=1e-9,
                 atol=1e-12, mistakes=mistakes)


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
            t.expect(got, expected, "the (p50, pq) pairs", rtol=1e-9, atol=1e-12, mistakes=summary_mistakes(requests, q))
    one_token_case(t)


# -- 2.1 attribute_request -----------------------------------------------------------------------------

class StepIndex:
    """What attribute() needs of one replica's steps, computed once: the step ends (increasing), the step
    of each end, each step's duration and its cumulative sum, the idle gaps between steps with their
    cumulative lengths, and the bases (median and mean of the decode-only steps, median of all)."""

    @answer_code  # the methods run only inside attribute(): never a question of their own
    def __init__(self, steps):
        self.ends = [s["end"] for s in steps]
        self.by_end = {s["end"]: s for s in steps}
        dur = [s["end"] - s["start"] for s in steps]
        self.dur_cum = [0.0, *np.cumsum(dur).tolist()]
        self.gap_lo = [a["end"] for a in steps[:-1]]
        self.gap_hi = [b["start"] for b in steps[1:]]
        self.gap_cum = [0.0, *np.cumsum([max(0.0, h - lo) for lo, h in zip(self.gap_lo, self.gap_hi)]).tolist()]
        self.gaps = [(lo, h) for lo, h in zip(self.gap_lo, self.gap_hi) if h > lo]  # the idle ones
        plain = [d for s, d in zip(steps, dur) if s["prefill_tokens"] == 0]
        self.base = {"median": float(np.median(plain)) if plain else 0.0, "none": float(np.median(plain)) if plain else math.nan,
                     "mean": float(np.mean(plain)) if plain else 0.0, "all": float(np.median(dur)) if dur else 0.0}

    @answer_code
    def idle_before(self, x: float) -> float:
        """Idle time between steps before time x (gaps are in time order and disjoint)."""
        k = bisect.bisect_right(self.gap_hi, x)  # gaps 0..k-1 end at or before x
        part = max(0.0, x - self.gap_lo[k]) if k < len(self.gap_lo) else 0.0
        return self.gap_cum[k] + part

    @answer_code
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


@answer_code
def attribute(request, steps, gaps_everywhere=False, queue_with_gaps=False, inclusive=False, whole_step=False,
              mean_base=False, base_all=False, host="overlap", first_step=False, clamp=True, no_fallback=False):
    """attribute_request (the grader's copy) and its usual wrong versions, one keyword each: host gaps of
    the whole run (not clipped to the request's life), queue time with the host gaps left in, the token step
    counted as sat out (<= instead of <), the whole prefill step as stall (no base), the base as a mean, or
    the base over every step; host="whole" counts a gap that overlaps [arrival, finish] whole, "contained"
    only the gaps wholly inside it, "from_sched" the overlap with [first_scheduled, finish]; first_step counts the first token's own prefill step as stall;
    clamp=False lets a step faster than the base subtract; no_fallback leaves the base nan (np.median of no
    decode-only step), which Python's max(0.0, nan) turns into no stall at all. The same sums as the
    solution, taken from the cumulative sums of StepIndex."""
    arrival, sched, times = request["arrival"], request["first_scheduled"], request["token_times"]
    finish = times[-1]
    ix = step_index(steps)
    base = 0.0 if whole_step else ix.base["mean" if mean_base else "all" if base_all else "none" if no_fallback else "median"]
    preempted = stall = 0.0
    firsts = [times[0]] if first_step else []
    for prev, cur in zip(times, times[1:]):
        hi = (bisect.bisect_right if inclusive else bisect.bisect_left)(ix.ends, cur)
        lo = bisect.bisect_right(ix.ends, prev)
        preempted += ix.dur_cum[hi] - ix.dur_cum[lo] if hi > lo else 0.0
    for cur in firsts + times[1:]:
        s = ix.by_end.get(cur)  # None only for a wrong version judging a request against another replica
        if s is not None and s["prefill_tokens"] > 0:
            d = s["end"] - s["start"] - base
            stall += max(0.0, d) if clamp else d
    if host == "whole":
        host = sum((h - lo for lo, h in ix.gaps if h > arrival and lo < finish), 0.0)
    elif host == "contained":
        host = sum((h - lo for lo, h in ix.gaps if lo >= arrival and h <= finish), 0.0)
    elif host == "from_sched":
        host = ix.idle(sched, finish)
    else:
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
    "counts a host gap the request arrived in whole; only its part after arrival (the overlap with "
    "[arrival, finish]) is this request's": dict(host="whole"),
    "counts only the host gaps wholly inside [arrival, finish]; a gap the request arrived in counts from "
    "arrival on": dict(host="contained"),
    "counts host gaps from first_scheduled on; the request's life, and its host time, starts at arrival":
        dict(host="from_sched"),
    "counts the first token's own prefill step as stall; the first token's prefill is the request's own "
    "work, only the steps of tokens k >= 1 can stall it": dict(first_step=True),
    "lets a prefill step faster than the base count negative; each step adds max(0, duration - base)":
        dict(clamp=False),
    "has no base when the replica has no decode-only step (np.median([]) is nan, and max(0.0, nan) drops "
    "every stall); the base is then 0": dict(no_fallback=True),
}

@answer_code
def attribute_mistakes(request, steps) -> dict:
    """The usual wrong attributions of `request` on its replica's `steps`."""
    return {name: attribute(request, steps, **kw) for name, kw in ATTRIBUTE_MISTAKES.items()}


DOC_STEPS = [{"start": 0.0, "end": 1.0, "prefill_tokens": 10, "decode_tokens": 0},
             {"start": 1.125, "end": 2.125, "prefill_tokens": 9, "decode_tokens": 1},
             {"start": 2.125, "end": 2.875, "prefill_tokens": 8, "decode_tokens": 2},
             {"start": 2.875, "end": 3.375, "prefill_tokens": 0, "decode_tokens": 2}]
DOC_REQUEST = {"arrival": 0.5, "first_scheduled": 1.125, "token_times": [2.125, 2.875, 3.375], "finish": 3.375}
# a prefill step (0.25 s) faster than the decode-only base (0.5 s): it adds no stall, and takes none away
FAST_STEPS = [{"start": 0.0, "end": 1.0, "prefill_tokens": 10, "decode_tokens": 0},
              {"start": 1.0, "end": 1.25, "prefill_tokens": 4, "decode_tokens": 1},
              {"start": 1.25, "end": 1.75, "prefill_tokens": 0, "decode_tokens": 1},
              {"start": 1.75, "end": 2.25, "prefill_tokens": 0, "decode_tokens": 1}]
# two host pauses before admission: one the request arrived in (it counts from arrival), one wholly after
PAUSED_STEPS = [{"start": 0.0, "end": 1.0, "prefill_tokens": 10, "decode_tokens": 0},
                {"start": 1.125, "end": 2.125, "prefill_tokens": 9, "decode_tokens": 1},
                {"start": 2.25, "end": 2.75, "prefill_tokens": 8, "decode_tokens": 1},
                {"start": 2.75, "end": 3.25, "prefill_tokens": 0, "decode_tokens": 2},
                {"start": 3.25, "end": 3.75, "prefill_tokens": 0, "decode_tokens": 2}]
# no decode-only step: the base is 0, so each later prefill step stalls the request by its whole duration
PREFILL_ONLY_STEPS = [{"start": 0.0, "end": 0.25, "prefill_tokens": 10, "decode_tokens": 0},
                      {"start": 0.25, "end": 0.75, "prefill_tokens": 9, "decode_tokens": 1},
                      {"start": 0.75, "end": 1.75, "prefill_tokens": 8, "decode_tokens": 1}]
SMALL_ATTRIBUTE_CASES = [
    ("visible: the docstring's example", (DOC_REQUEST, DOC_STEPS)),
    ("visible: a request that arrived during a host pause (1.0 to 1.125 s) at 1.0625 s and queued past another",
     ({"arrival": 1.0625, "first_scheduled": 2.25, "token_times": [2.75, 3.25, 3.75], "finish": 3.75}, PAUSED_STEPS)),
    ("visible: three prefill-carrying steps of 0.25, 0.5 and 1.0 s, no decode-only step (base 0)",
     ({"arrival": 0.0, "first_scheduled": 0.0, "token_times": [0.25, 0.75, 1.75], "finish": 1.75}, PREFILL_ONLY_STEPS)),
    ("visible: a 0.25 s prefill step against a 0.5 s decode-only base",
     ({"arrival": 0.0, "first_scheduled": 0.0, "token_times": [1.0, 1.25, 1.75, 2.25], "finish": 2.25}, FAST_STEPS)),
]


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
            t.expect(got, expected, "the attribution (seconds)", rtol=1e-6, atol=1e-9,
                     mistakes=attribute_mistakes(r, steps))


@check(points=3, section="2.1", timeout=90, cost=0.3)
def attribute_request(t):
    """Queue, prefill stall, preempted and host-gap seconds of single requests of real replays."""
    for label, (request, steps) in SMALL_ATTRIBUTE_CASES:
        with t.case(label):
            got, expected = t.both("attribute_request", request, steps)
            t.expect(got, expected, "the attribution (seconds)", rtol=1e-9,
                     mistakes=attribute_mistakes(request, steps))
    visible = [("visible: host-stall replay", ("host_stall", VISIBLE_SEED)),
               ("visible: small-KV-pool replay", ("preemption", VISIBLE_SEED)),
               ("visible: long-prompt-flood replay", ("prefill_interference", VISIBLE_SEED))]
    hidden = lambda rng: (rng.choice(CAUSES), rng.choice(HIDDEN_SEEDS))  # noqa: E731
    for label, (cause, seed) in t.cases(visible=visible, hidden=hidden, n=1):
        attribute_cases(t, cause, seed, label if label.startswith("visible") else f"{label} ({cause} replay)")


# -- 2.2 tail_shares -----------------------------------------------------------------------------------

@answer_code
def shares_variant(requests, steps_by_replica, q, everyone=False, per_request=False, replica0=False, strict=False,
                   top_k=None, by_ttft=False):
    """tail_shares with one thing changed: every request as the tail, the mean of per-request shares, every
    request judged against replica 0's steps, the tail as E2E > the cut (strict), or as a count of the
    slowest requests, top_k="floor" or "ceil" of n * (1 - q/100), or the tail chosen by TTFT (by_ttft)."""
    key = [r["token_times"][0] - r["arrival"] if by_ttft else r["finish"] - r["arrival"] for r in requests]
    cut = np.percentile(key, q)
    if top_k:
        k = (math.floor if top_k == "floor" else math.ceil)(len(requests) * (1 - q / 100))
        order = sorted(range(len(requests)), key=lambda i: -key[i])[:k]
        tail = [requests[i] for i in sorted(order)]
    else:
        tail = [r for r, x in zip(requests, key) if everyone or (x > cut if strict else x >= cut)]
    if not tail:
        return None  # a wrong version that divides by zero
    parts = [(attribute(r, steps_by_replica[0 if replica0 else r["replica"]]), r["finish"] - r["arrival"]) for r in tail]
    if per_request:
        return {k: sum(a[k] / d for a, d in parts) / len(parts) for k in COMPONENTS}
    total = sum(d for _, d in parts)
    return {k: sum(a[k] for a, _ in parts) / total for k in COMPONENTS}


SHARES_MISTAKES = {
    "averages over every request; the shares are the tail's (E2E >= the q-th percentile)": dict(everyone=True),
    "averages per-request shares; the share is the tail's summed component over its summed E2E": dict(per_request=True),
    "judges every request against replica 0's steps; each request ran on its own replica": dict(replica0=True),
    "takes the tail as E2E > the cut; a request exactly at the q-th percentile belongs to it (>=)":
        dict(strict=True),
    "takes the int(n * (1 - q/100)) slowest requests; the tail is every request with E2E >= "
    "np.percentile(E2Es, q) (a count from floats rounds badly: for example 150 * (1 - 0.9) is 14.999999999999996, "
    "so int() gives 14)": dict(top_k="floor"),
    "takes the ceil(n * (1 - q/100)) slowest requests; the tail is every request with E2E >= "
    "np.percentile(E2Es, q) (a count from floats rounds badly: for example 20 * (1 - 0.85) is 3.0000000000000004, "
    "so ceil() gives 4)": dict(top_k="ceil"),
    "chooses the tail by TTFT; the tail is the requests slowest end to end (E2E >= its q-th percentile)":
        dict(by_ttft=True),
}


@answer_code
def shares_mistakes(requests, steps_by_replica, q) -> dict:
    """The usual wrong tail_shares results on these inputs (None for a version that divides by zero)."""
    return {name: shares_variant(requests, steps_by_replica, q, **kw) for name, kw in SHARES_MISTAKES.items()}


# 20 requests whose 2nd and 3rd slowest tie (21 STEPs): at q=90 the cut is their E2E exactly, so ">" drops
# them; at q=85, 20 * (1 - 0.85) rounds up past 3. Replica 1 runs 1.25x slower (its step ends differ).
SHARES_FLEET = dict(lengths=((5, 6, 7, 8, 9, 10, 11, 12, 13, 18), (5, 6, 7, 8, 9, 10, 11, 12, 14, 15)),
                    queue={(0, 9): 2, (1, 8): 2.25, (1, 9): 1}, flood={(0, 38): 2}, host={(1, 37): 1}, slow={1: 1.25})


@check(points=2, section="2.2", timeout=90)
def tail_shares(t):
    """Summed components over summed E2E, for the requests at or above the q-th E2E percentile."""
    requests, steps = fleet(**SHARES_FLEET)
    for q, label in ((85, "visible: 20 synthetic requests, q=85"),
                     (90, "visible: 20 synthetic requests, q=90: the cut is the E2E of two tied requests")):
        with t.case(label):
            expected = t.ref.tail_shares(requests, steps, q)
            got = call_hinted(t, "tail_shares", requests, steps, q)
            t.expect(got, expected, "the tail's shares", rtol=1e-9, atol=1e-12,
                     mistakes=shares_mistakes(requests, steps, q))
    visible = [("visible: burst replay, q=90", ("queueing", VISIBLE_SEED, 90)),
               ("visible: slow-replica replay, q=95", ("bad_replica", VISIBLE_SEED, 95))]
    hidden = lambda rng: (rng.choice(CAUSES), rng.choice(HIDDEN_SEEDS), rng.choice([90, 95]))  # noqa: E731
    for label, (cause, seed, q) in t.cases(visible=visible, hidden=hidden, n=1):
        data = replay(cause, seed)
        call, = learner_calls(t, "tail_shares", cause, seed, [[["$requests"], ["$steps"], q]], here(data))
        with t.case(label if label.startswith("visible") else f"{label} ({cause} replay, q={q})"):
            expected = t.ref.tail_shares(data["requests"], data["steps"], q)
            got = call()
            t.expect(got, expected, "the tail's shares", rtol=1e-6, atol=1e-9,
                     mistakes=shares_mistakes(data["requests"], data["steps"], q))


# -- 3.1 straggler_replica ---------------------------------------------------------------------------

@answer_code
def straggler_variant(lats, ratio, center="median", include_self=False, first=False, at_least=False,
                      empty_as_zero=False, renumber=False, others="median", last_on_tie=False, difference=False,
                      empty_as_nan=False):
    """straggler_replica with one thing changed: means instead of medians, the others' median taken with
    the replica itself included, the first straggler instead of the worst, >= ratio instead of >, an empty
    replica as median 0, the index counted among the non-empty replicas (renumber), the others combined by
    "mean", "min" or "pooled" (the median of all their latencies), a tie to the last, m - others > ratio, or
    an empty replica kept with median nan (np.median([])): a nan among the others' medians makes their median
    nan, which fails `> 0`, so the excess over it counts as infinite."""
    f = np.mean if center == "mean" else np.median
    meds = {i: float(f(x)) if len(x) else (math.nan if empty_as_nan else 0.0) for i, x in enumerate(lats)
            if len(x) or empty_as_zero or empty_as_nan}
    if len(meds) < 2:
        return None
    if renumber:
        meds = dict(enumerate(meds.values()))
    combine = {"median": np.median, "mean": np.mean, "min": np.min}.get(others)
    best, best_excess = None, ratio
    for i, m in meds.items():
        if combine is None:  # pooled
            base = float(np.median([v for j, x in enumerate(lats) if j != i for v in x]))
        else:
            base = float(combine([v for j, v in meds.items() if include_self or j != i]))
        excess = m - base if difference else m / base if base > 0 else math.inf
        flagged = excess >= ratio if at_least else excess > ratio
        better = best is None or (excess >= best_excess if last_on_tie else excess > best_excess)
        if flagged and better and not (first and best is not None):
            best, best_excess = i, excess
    return best


STRAGGLER_MISTAKES = {
    "compares means; one very slow request drags a mean, the median is what everyone on the replica sees":
        dict(center="mean"),
    "includes the replica itself in the median it is compared with": dict(include_self=True),
    "returns the first straggler found, not the one furthest above the others": dict(first=True),
    "flags a replica exactly ratio times the others; a straggler is more than ratio times slower": dict(at_least=True),
    "counts an empty replica among the others as median 0; a replica with no latencies is left out":
        dict(empty_as_zero=True),
    "returns the straggler's position among the non-empty replicas; the index is its place in the list given "
    "(empty replicas included)": dict(renumber=True),
    "combines the others' medians by their mean; it is their median (np.median), which one more slow replica "
    "cannot drag": dict(others="mean"),
    "compares with the fastest other replica; it is the median of the others' medians": dict(others="min"),
    "takes the median of the others' pooled latencies; it is the median of their medians (a replica with many "
    "requests would outvote the rest)": dict(others="pooled"),
    "returns the last of two equally slow stragglers; a tie goes to the lowest index": dict(last_on_tie=True),
    "compares the difference m - others with ratio; ratio is a factor: m / others > ratio": dict(difference=True),
    "keeps an empty replica: np.median([]) is nan, and one nan among the others' medians makes their median nan; "
    "a replica with no latencies is left out": dict(empty_as_nan=True),
}
# passed a ratio, the learner's code may use its default instead: named when the case's ratio is not 1.5
RATIO_IGNORED = "uses ratio 1.5 whatever ratio it is given"

STRAGGLER_CASES = [
    ("visible: the docstring's three replicas", ([[1.0, 1.2, 0.9], [3.0, 2.8, 3.3], [1.1, 1.0]], 1.5)),
    ("visible: one request of 40 s on a healthy replica (a mean would flag it)", ([[1.0, 1.1, 40.0, 0.9, 1.0], [1.0, 1.2, 1.1], [0.9, 1.0]], 1.5)),
    ("visible: two slow replicas of four, the second slower", ([[1.0, 1.0], [2.0, 2.2], [1.1, 0.9], [3.0, 3.1]], 1.5)),
    ("visible: exactly 1.5 times the others", ([[1.0, 1.0], [1.5, 1.5], [1.0, 1.0]], 1.5)),
    ("visible: two replicas, 2.5 and 1.0 s; an empty third", ([[2.5, 2.5, 2.5], [1.0, 1.0, 1.0], []], 2.0)),
    ("visible: one replica only", ([[5.0, 6.0]], 1.5)),
    ("visible: an empty replica before the straggler", ([[], [1.0], [3.0]], 1.5)),
    ("visible: two replicas with data, two empty", ([[1.0], [1.1], [], []], 1.5)),
    ("visible: five replicas, two equally slow", ([[10.0], [10.0], [10.0], [17.5], [17.5]], 1.5)),
    ("visible: a replica of two latencies beside two of one", ([[1.0, 3.0], [2.0], [1.0]], 1.5)),
    ("visible: one fast replica and two at twice its latency", ([[1.0], [2.0], [2.0]], 1.5)),
    ("visible: a replica 1.8 times the others", ([[1.8, 1.8], [1.0, 1.0], [1.0]], 2.0)),
    ("visible: latencies of a tenth of a second, one replica 5 times the others", ([[0.1, 0.1], [0.5, 0.5], [0.1]], 1.5)),
    ("visible: an empty replica between the healthy ones and the straggler", ([[1.0], [1.0], [], [3.0]], 1.5)),
    ("visible: two empty replicas, and a replica 1.2 times the others", ([[1.0], [1.2], [1.0], [], []], 1.5)),
]


def random_latencies(rng):
    n = rng.randint(2, 6)
    lats = [[round(rng.lognormvariate(0, 0.3), 4) for _ in range(rng.randint(3, 12))] for _ in range(n)]
    if rng.random() < 0.7:
        slow = rng.randrange(n)
        lats[slow] = [x * rng.uniform(1.2, 3.0) for x in lats[slow]]
    return lats, rng.choice([1.3, 1.5, 2.0])


@answer_code
def straggler_mistakes(lats, ratio) -> dict:
    out = {name: straggler_variant(lats, ratio, **kw) for name, kw in STRAGGLER_MISTAKES.items()}
    out[RATIO_IGNORED] = straggler_variant(lats, 1.5)
    return out


@check(points=2, section="3.1")
def straggler_replica(t):
    """The replica whose median latency is more than ratio x the other replicas' median, the worst one."""
    for label, (lats, ratio) in t.cases(visible=STRAGGLER_CASES, hidden=random_latencies, n=3):
        with t.case(f"{label} (ratio {ratio})"):
            got, expected = t.both("straggler_replica", lats, ratio)
            t.expect(got, expected, "the straggler (replica index or None)", mistakes=straggler_mistakes(lats, ratio))
    # the real thing: the slow-replica replay, by per-token latency
    data = replay("bad_replica", VISIBLE_SEED)
    lats = [[(r["finish"] - r["arrival"]) / len(r["token_times"]) for r in data["requests"] if r["replica"] == i]
            for i in range(len(data["steps"]))]
    with t.case("visible: the slow-replica replay's per-token latencies (replica 1 is throttled)"):
        got, expected = t.both("straggler_replica", lats, 1.5)
        t.expect(got, expected, "the straggler (replica index or None)")


# -- 3.2 first_suspect ---------------------------------------------------------------------------------

@answer_code
def suspect_variant(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5, order=None, guard=True,
                    count_preempted=True, largest=False, tail_only=False, raw_e2e=False, strict=False,
                    queue_is_preemption=False, replica_guard=True, fleet_guard=False):
    """first_suspect with one thing changed: another order of the suspects, no preemption guard on
    queueing, preemption judged by its share only, the largest share named whatever the order, "was any
    request preempted" asked of the tail only, the replicas compared by raw E2E (not per output token),
    shares tested with > min_share, a big queue with preemptions named preemption at once, a straggler
    named bad_replica although its own requests were preempted (replica_guard=False), or a straggler not named
    because a request on any replica was preempted (fleet_guard=True)."""
    shares = shares_variant(requests, steps_by_replica, q)
    e2e = [r["finish"] - r["arrival"] for r in requests]
    cut = np.percentile(e2e, q)
    preempted = any(r["num_preemptions"] > 0 for r, x in zip(requests, e2e) if not tail_only or x >= cut)
    big = {k: v > min_share if strict else v >= min_share for k, v in shares.items()}
    tests = {"queueing": big["queue_s"] and not (guard and preempted),
             "prefill_interference": big["prefill_stall_s"],
             "preemption": big["preempted_s"] or (count_preempted and preempted),
             "host_stall": big["host_gap_s"]}
    n = 1 + max(r["replica"] for r in requests)
    lats = [[(r["finish"] - r["arrival"]) / (1 if raw_e2e else len(r["token_times"])) for r in requests
             if r["replica"] == i] for i in range(n)]
    slow = straggler_variant(lats, ratio)
    tests["bad_replica"] = slow is not None and not (
        replica_guard and any(r["num_preemptions"] > 0 for r in requests
                              if fleet_guard or r["replica"] == slow))
    if largest:
        k = max(COMPONENTS, key=lambda c: shares[c])
        return {"queue_s": "queueing", "prefill_stall_s": "prefill_interference", "preempted_s": "preemption",
                "host_gap_s": "host_stall"}[k] if big[k] else ("bad_replica" if tests["bad_replica"] else "none")
    for name in order or SUSPECT_ORDER:
        if name == "queueing" and queue_is_preemption and big["queue_s"] and preempted:
            return "preemption"
        if tests[name]:
            return name
    return "none"


ORDER_TEXT = "bad replica (the per-replica split), then queueing, prefill interference, preemption, host stall"
SUSPECT_MISTAKES = {
    "names queueing although requests were preempted; with preemptions the queue is a symptom of a full KV "
    "pool": dict(guard=False),
    "judges preemption by its share of the tail alone; any preemption at all means the KV pool ran out "
    "(the queue it causes is counted as queueing)": dict(count_preempted=False),
    f"names the largest share whatever the order; the order is the procedure ({ORDER_TEXT})": dict(largest=True),
    "checks the replicas last; the per-replica split is the first and cheapest test (one slow replica is the "
    "textbook flat p50 and broken p99 of a fleet)": dict(order=CAUSES),
    "names a straggler bad_replica although its own requests were preempted; that replica's KV pool ran out, "
    "which is preemption": dict(replica_guard=False),
    "asks whether a request was preempted of the tail only; any preempted request, in the tail or not, means "
    "the KV pool ran out": dict(tail_only=True),
    "rules out bad_replica when any request in the fleet was preempted; only the slow replica's own requests "
    "tell whether its KV pool ran out": dict(fleet_guard=True),
    f"tests prefill interference before queueing; the order is {ORDER_TEXT}":
        dict(order=("bad_replica", "prefill_interference", "queueing", "preemption", "host_stall")),
    "compares the replicas by raw E2E; a replica that got longer outputs is not slower: compare "
    "per_token_latency": dict(raw_e2e=True),
    "tests the shares with > min_share; a share equal to min_share passes (>=)": dict(strict=True),
    f"rules out preemption before prefill interference; the order is {ORDER_TEXT}":
        dict(order=("bad_replica", "queueing", "preemption", "prefill_interference", "host_stall")),
    "names preemption as soon as a big queue comes with preemptions, skipping the prefill test; the guard only "
    "rules out queueing, the order goes on": dict(queue_is_preemption=True),
    f"rules out host stall before preemption; the order is {ORDER_TEXT}":
        dict(order=("bad_replica", "queueing", "prefill_interference", "host_stall", "preemption")),
}
# passed on unchanged or not: named on the cases whose argument is not the default
ARGUMENT_IGNORED = {"q": "does not pass q on to tail_shares (it keeps tail_shares' default 90)",
                    "min_share": "uses min_share 0.06 whatever min_share it is given",
                    "ratio": "does not pass ratio on to straggler_replica (it keeps the default 1.5)"}
SUSPECT_DEFAULTS = {"q": 90, "min_share": 0.06, "ratio": 1.5}


@answer_code
def suspect_mistakes(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5) -> dict:
    args = dict(q=q, min_share=min_share, ratio=ratio)
    out = {name: suspect_variant(requests, steps_by_replica, **args, **kw) for name, kw in SUSPECT_MISTAKES.items()}
    for arg, name in ARGUMENT_IGNORED.items():
        out[name] = suspect_variant(requests, steps_by_replica, **{**args, arg: SUSPECT_DEFAULTS[arg]})
    return out


T0, T1 = (0, 7), (1, 7)  # the slowest request of each replica of the default fleet (16 tokens): the q=90 tail
# (label, the fleet's faults, (q, min_share, ratio)): the signals the replays never show alone or together
SUSPECT_CASES = [
    ("a request outside the tail was preempted (it sat out 2 steps); nothing else",
     dict(sat_out={(0, 1): (6, 2)}), (90, 0.06, 1.5)),
    ("the tail queued; the only preempted request is outside it",
     dict(queue={T0: 2, T1: 2}, sat_out={(0, 1): (6, 2)}), (90, 0.06, 1.5)),
    ("the requests that queued are in the q=50 tail, not in the q=90 one; q=50",
     dict(queue={(0, 5): 4, (1, 5): 4}), (50, 0.06, 1.5)),
    ("replica 1 runs 1.75x slower; ratio 2.0", dict(slow={1: 1.75}), (90, 0.06, 2.0)),
    ("the tail queued 3% of its time; min_share 0.02", dict(queue={T0: 1}), (90, 0.02, 1.5)),
    ("replica 0 got 3x longer outputs, at the same speed per token",
     dict(lengths=((18, 20, 22, 24, 26, 28, 30, 34), (6, 7, 8, 9, 10, 11, 12, 14))), (90, 0.06, 1.5)),
    ("the tail's queue share is exactly min_share (0.2)", dict(queue={T0: 4, T1: 4}), (90, 0.2, 1.5)),
    ("the tail queued and was stalled by a prefill flood; a request outside it was preempted",
     dict(queue={T0: 4, T1: 4}, preempted=[(0, 2)], flood={(0, 30): 3, (1, 30): 3}), (90, 0.06, 1.5)),
    ("a prefill flood stalled the tail; a request outside it was preempted",
     dict(preempted=[(0, 2)], flood={(0, 30): 3, (1, 30): 3}), (90, 0.06, 1.5)),
    ("a tail request sat out 5 steps (preempted) and the host paused 2 steps' time",
     dict(sat_out={T0: (32, 5)}, host={(0, 34): 2, (1, 34): 2}), (90, 0.06, 1.5)),
    ("replica 1 runs 2x slower and the tail queued", dict(slow={1: 2}, queue={T0: 4, T1: 4}), (90, 0.06, 1.5)),
    ("replica 1 runs 2x slower; a request on replica 0 was preempted",
     dict(slow={1: 2}, preempted=[(0, 2)]), (90, 0.06, 1.5)),
    ("the tail queued and was stalled by a prefill flood; nothing was preempted",
     dict(queue={T0: 4, T1: 4}, flood={(0, 30): 3, (1, 30): 3}), (90, 0.06, 1.5)),
]


@check(points=4, section="3.2", timeout=180, cost=0.5)
def first_suspect(t):
    """The injected fault named, on a clean replay and one replay per fault; then small synthetic fleets with
    two signals at once, a preemption outside the tail, a share at min_share and q, min_share, ratio passed."""
    visible = [(f"visible: {cause} injected (workload seed {VISIBLE_SEED})", (cause, VISIBLE_SEED))
               for cause in ("none", *CAUSES)]
    hidden = lambda rng: (rng.choice(("none", *CAUSES)), rng.choice(HIDDEN_SEEDS))  # noqa: E731
    for label, (cause, seed) in t.cases(visible=visible, hidden=hidden, n=2):
        data = replay(cause, seed)
        call, = learner_calls(t, "first_suspect", cause, seed, [[["$requests"], ["$steps"]]], here(data))
        with t.case(label if label.startswith("visible") else f"{label}: one fault injected (or none)"):
            got = call()
            t.expect(got, cause, "the first suspect", mistakes=suspect_mistakes(data["requests"], data["steps"]))
    for label, faults, args in SUSPECT_CASES:
        requests, steps = fleet(**faults)
        with t.case(f"visible: synthetic fleet, {label} (q={args[0]}, min_share={args[1]}, ratio={args[2]})"):
            expected = t.ref.first_suspect(requests, steps, *args)
            got = call_hinted(t, "first_suspect", requests, steps, *args)
            t.expect(got, expected, "the first suspect", mistakes=suspect_mistakes(requests, steps, *args))


if __name__ == "__main__":
    write_replays()
    print(f"wrote {len(replay_keys())} replays to {REPLAYS_DIR}")
