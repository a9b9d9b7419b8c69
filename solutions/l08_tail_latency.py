"""Lesson 08: debugging a broken latency tail. Split the tail by metric, attribute each request's time to
where it went, then name the first suspect in the order that is cheapest to check and most often right:
the per-replica split first (one slow replica is the textbook flat-p50, broken-p99 fleet), then the engine's
own suspects.

Records are plain dicts, as a latency dashboard and an engine's step log would hold them (the engine's
RequestMetrics and StepStats; reference_engine/sim/faults.py builds them from a replay). Times in seconds on
one clock per replica:

    request: {"arrival", "first_scheduled", "token_times": [...], "finish", "num_preemptions",
              "prompt_tokens", "replica"}       finish == token_times[-1]
    step:    {"start", "end", "prefill_tokens", "decode_tokens", "preempted", "running", "waiting"}

Steps of one replica are in time order and never overlap; a time between one step's end and the next
step's start is idle host time (the engine loop was doing something other than running the GPU). Every
token time is exactly the "end" of the step that produced it.

The bottom of the file holds the replay harness the notebook uses (given, not an exercise).
"""
from __future__ import annotations

import bisect
import math
from typing import Sequence

import numpy as np

CAUSES = ("queueing", "prefill_interference", "preemption", "host_stall", "bad_replica")
# the order first_suspect tries them in: the per-replica split first, then the engine's own suspects
SUSPECT_ORDER = ("bad_replica", "queueing", "prefill_interference", "preemption", "host_stall")
COMPONENTS = ("queue_s", "prefill_stall_s", "preempted_s", "host_gap_s")
# the suspect each attributed component points at, in the order they are ruled out
SUSPECT_OF = {"queue_s": "queueing", "prefill_stall_s": "prefill_interference", "preempted_s": "preemption",
              "host_gap_s": "host_stall"}


# -- 1. split the tail -------------------------------------------------------------------------------

def tail_summary(requests: Sequence[dict], q: float = 99) -> dict[str, tuple[float, float]]:
    """Exercise 1.1: the median and the q-th percentile of TTFT, ITL and end-to-end latency.

    TTFT = token_times[0] - arrival; E2E = finish - arrival (one value per request); ITL = every gap
    between consecutive token times, pooled over all requests (one value per gap, as vLLM's serving
    benchmark pools them; a request with one token adds none). Percentiles as np.percentile (linear).

    Returns {"ttft": (p50, pq), "itl": (p50, pq), "e2e": (p50, pq)}, floats; (nan, nan) for a metric with no
    values (when every request has one token there is no gap, so no ITL).

    >>> r = [{"arrival": 0.0, "token_times": [0.5, 0.6, 1.0], "finish": 1.0},
    ...      {"arrival": 1.0, "token_times": [1.2], "finish": 1.2}]
    >>> {k: tuple(round(x, 4) for x in v) for k, v in tail_summary(r, 100).items()}
    {'ttft': (0.35, 0.5), 'itl': (0.25, 0.4), 'e2e': (0.6, 1.0)}
    """
    ### BEGIN SOLUTION
    ttft = [r["token_times"][0] - r["arrival"] for r in requests]
    e2e = [r["finish"] - r["arrival"] for r in requests]
    itl = [b - a for r in requests for a, b in zip(r["token_times"], r["token_times"][1:])]
    return {name: (float(np.percentile(x, 50)), float(np.percentile(x, q))) if x else (math.nan, math.nan)
            for name, x in (("ttft", ttft), ("itl", itl), ("e2e", e2e))}
    ### END SOLUTION


# -- 2. where did the time go ------------------------------------------------------------------------

def attribute_request(request: dict, steps: Sequence[dict]) -> dict[str, float]:
    """Exercise 2.1: split one request's life into the four waits a tail is made of (seconds each).

    steps: the steps of the request's replica, in time order. finish = token_times[-1].
      "host_gap_s":      idle time between consecutive steps (a step's end to the next one's start) that
                         falls inside [arrival, finish]; only the overlap counts.
      "queue_s":         first_scheduled - arrival, less the host gaps inside [arrival, first_scheduled]
                         (waiting for admission while steps ran for others).
      "preempted_s":     for each pair of consecutive tokens k-1, k: the durations (end - start) of the steps
                         that ended strictly between token_times[k-1] and token_times[k]. A decoding request
                         gets a token in every step it is part of, so those are steps it sat out: evicted from
                         the batch by a preemption, then recomputing its cache.
      "prefill_stall_s": for each token k >= 1, the step that produced it (its "end" equals token_times[k]):
                         if it computed prompt tokens (prefill_tokens > 0: other requests' prompts; after a
                         preemption, also this request's recompute), what it took beyond a plain decode step,
                         max(0, duration - base), with base the median (np.median) duration of this replica's
                         decode-only steps (prefill_tokens == 0); base = 0 when there is none.
    The first token's own prefill is not split: with the rest of the decode steps it is the request's work.

    >>> steps = [{"start": 0.0, "end": 1.0, "prefill_tokens": 10, "decode_tokens": 0},
    ...          {"start": 1.125, "end": 2.125, "prefill_tokens": 9, "decode_tokens": 1},
    ...          {"start": 2.125, "end": 2.875, "prefill_tokens": 8, "decode_tokens": 2},
    ...          {"start": 2.875, "end": 3.375, "prefill_tokens": 0, "decode_tokens": 2}]
    >>> attribute_request({"arrival": 0.5, "first_scheduled": 1.125, "token_times": [2.125, 2.875, 3.375],
    ...                    "finish": 3.375}, steps)
    {'queue_s': 0.5, 'prefill_stall_s': 0.25, 'preempted_s': 0.0, 'host_gap_s': 0.125}
    """
    ### BEGIN SOLUTION
    arrival, sched, times = request["arrival"], request["first_scheduled"], request["token_times"]
    finish = times[-1]
    idle = [(a["end"], b["start"]) for a, b in zip(steps, steps[1:]) if b["start"] > a["end"]]  # host gaps
    host = sum(max(0.0, min(hi, finish) - max(lo, arrival)) for lo, hi in idle)  # only the overlap counts
    host_queued = sum(max(0.0, min(hi, sched) - max(lo, arrival)) for lo, hi in idle)

    by_end = {s["end"]: s for s in steps}
    ends = [s["end"] for s in steps]  # increasing: steps are in time order and never overlap
    plain = [s["end"] - s["start"] for s in steps if s["prefill_tokens"] == 0]
    base = float(np.median(plain)) if plain else 0.0
    preempted = stall = 0.0
    for prev, cur in zip(times, times[1:]):
        sat_out = steps[bisect.bisect_right(ends, prev):bisect.bisect_left(ends, cur)]  # prev < end < cur
        preempted += sum(s["end"] - s["start"] for s in sat_out)
        s = by_end[cur]
        if s["prefill_tokens"] > 0:
            stall += max(0.0, s["end"] - s["start"] - base)
    return {"queue_s": sched - arrival - host_queued, "prefill_stall_s": stall,
            "preempted_s": preempted, "host_gap_s": host}
    ### END SOLUTION


def tail_shares(requests: Sequence[dict], steps_by_replica: Sequence[Sequence[dict]], q: float = 90) -> dict[str, float]:
    """Exercise 2.2: what the slow requests spent their time on.

    The tail: requests whose E2E (finish - arrival) is >= np.percentile(all E2Es, q). For each component
    of attribute_request (each request judged against the steps of its own replica,
    steps_by_replica[request["replica"]]): its sum over the tail divided by the tail's summed E2E.

    Returns {"queue_s": share, "prefill_stall_s": ..., "preempted_s": ..., "host_gap_s": ...}, each in [0, 1].
    """
    ### BEGIN SOLUTION
    e2e = [r["finish"] - r["arrival"] for r in requests]
    cut = np.percentile(e2e, q)
    tail = [r for r, x in zip(requests, e2e) if x >= cut]
    total = sum(r["finish"] - r["arrival"] for r in tail)
    sums = dict.fromkeys(COMPONENTS, 0.0)
    for r in tail:
        for k, v in attribute_request(r, steps_by_replica[r["replica"]]).items():
            sums[k] += v
    return {k: v / total for k, v in sums.items()}
    ### END SOLUTION


# -- 3. one bad replica, and the first suspect -------------------------------------------------------

def straggler_replica(latencies_by_replica: Sequence[Sequence[float]], ratio: float = 1.5) -> int | None:
    """Exercise 3.1: the replica that is slow for everyone it serves, or None.

    For each replica, the median of its latencies; a replica is a straggler when its median is more than
    `ratio` times the median of the other replicas' medians (np.median). Replicas with no latencies are
    left out (and do not count among the others). Returns the straggler with the largest median over the
    others' (the lowest index on a tie), or None when there is none or fewer than two replicas have data.

    >>> straggler_replica([[1.0, 1.2, 0.9], [3.0, 2.8, 3.3], [1.1, 1.0]])
    1
    """
    ### BEGIN SOLUTION
    meds = {i: float(np.median(x)) for i, x in enumerate(latencies_by_replica) if len(x)}
    if len(meds) < 2:
        return None
    best, best_excess = None, ratio
    for i, m in meds.items():
        others = float(np.median([v for j, v in meds.items() if j != i]))
        excess = m / others if others > 0 else math.inf
        if excess > best_excess:
            best, best_excess = i, excess
    return best
    ### END SOLUTION


def per_token_latency(request: dict) -> float:
    """A request's E2E per output token: comparable across replicas whatever the mix of lengths each got."""
    return (request["finish"] - request["arrival"]) / len(request["token_times"])


def fanout_slow_fraction(p_slow: float, fanout: int) -> float:
    """The chance that a request touching `fanout` independent servers meets at least one slow one, each slow
    with probability p_slow: 1 - (1 - p_slow) ** fanout (Dean and Barroso, "The Tail at Scale", 2013)."""
    return 1.0 - (1.0 - p_slow) ** fanout


def first_suspect(requests: Sequence[dict], steps_by_replica: Sequence[Sequence[dict]], q: float = 90,
                  min_share: float = 0.06, ratio: float = 1.5) -> str:
    """Exercise 3.2: the first suspect to report for a tail, or "none".

    Before any of this, ask what changed (a deploy, a config, the traffic mix): the data here cannot. Then
    go through the suspects in this order (SUSPECT_ORDER) and return the first whose test passes:
      "bad_replica":          straggler_replica(per-replica lists of per_token_latency, ratio) is some replica
                              b, and no request that ran on b was preempted (a replica whose own requests were
                              preempted is slow because its KV pool ran out: that is "preemption", below);
    and with shares = tail_shares(requests, steps_by_replica, q):
      "queueing":             shares["queue_s"] >= min_share and no request was preempted (num_preemptions
                              all 0: with preemptions the queue is a symptom of a full KV pool, not of load);
      "prefill_interference": shares["prefill_stall_s"] >= min_share;
      "preemption":           shares["preempted_s"] >= min_share, or any request (in the tail or not) was
                              preempted;
      "host_stall":           shares["host_gap_s"] >= min_share.
    Otherwise "none".
    """
    ### BEGIN SOLUTION
    n = 1 + max(r["replica"] for r in requests)
    per_replica = [[per_token_latency(r) for r in requests if r["replica"] == i] for i in range(n)]
    slow = straggler_replica(per_replica, ratio)
    if slow is not None and not any(r["num_preemptions"] > 0 for r in requests if r["replica"] == slow):
        return "bad_replica"
    shares = tail_shares(requests, steps_by_replica, q)
    preempted = any(r["num_preemptions"] > 0 for r in requests)
    if shares["queue_s"] >= min_share and not preempted:
        return "queueing"
    if shares["prefill_stall_s"] >= min_share:
        return "prefill_interference"
    if shares["preempted_s"] >= min_share or preempted:
        return "preemption"
    if shares["host_gap_s"] >= min_share:
        return "host_stall"
    return "none"
    ### END SOLUTION


# -- the replay harness (given) ----------------------------------------------------------------------

def workload(n: int = 300, rps: float = 60.0, seed: int = 0, trace: str = "conv", max_context: int = 512):
    """n consecutive requests of the Azure LLM inference trace 2023, sizes scaled into the shipped model's
    context, arrivals stretched to `rps` (burstiness kept); with seeded prompts: (requests, prompt ids)."""
    from reference_engine.sim import trace as tr

    reqs = tr.with_rate(tr.scale_to_context(tr.sample(n, seed=seed, trace=trace), max_context), rps)
    return reqs, tr.prompt_token_ids(reqs, vocab_size=2048, seed=seed, exclude=(0,))


def replay_fault(cause: str = "none", n: int = 300, rps: float = 60.0, seed: int = 0, compute: bool = False,
                 **spec) -> dict:
    """Replay workload(n, rps, seed) with one injected fault (reference_engine/sim/faults.py; spec overrides
    FaultSpec's fields) on the modeled H100 clock. compute=False skips the model's forward: the timestamps
    are the same. Returns {"cause", "requests", "steps" (per replica), "replicas"}."""
    from reference_engine.sim.faults import FaultSpec, run_fault

    reqs, prompts = workload(n, rps, seed)
    return run_fault(FaultSpec(cause=cause, seed=seed, **spec), reqs, prompts, compute=compute)
