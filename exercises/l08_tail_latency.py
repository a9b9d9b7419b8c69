# Lesson 08 exercises: replace each `raise NotImplementedError` with your code.
# Check your work with `course check 08`. (Generated from solutions/l08_tail_latency.py by
# `course sync`; keep the names and signatures.)
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
    raise NotImplementedError("Exercise 1.1 (tail_summary): see section 1.1 of lessons/l08_tail_latency.ipynb")


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
    raise NotImplementedError("Exercise 2.1 (attribute_request): see section 2.1 of lessons/l08_tail_latency.ipynb")


def tail_shares(requests: Sequence[dict], steps_by_replica: Sequence[Sequence[dict]], q: float = 90) -> dict[str, float]:
    """Exercise 2.2: what the slow requests spent their time on.

    The tail: requests whose E2E (finish - arrival) is >= np.percentile(all E2Es, q). For each component
    of attribute_request (each request judged against the steps of its own replica,
    steps_by_replica[request["replica"]]): its sum over the tail divided by the tail's summed E2E.

    Returns {"queue_s": share, "prefill_stall_s": ..., "preempted_s": ..., "host_gap_s": ...}, each in [0, 1].
    """
    raise NotImplementedError("Exercise 2.2 (tail_shares): see section 2.2 of lessons/l08_tail_latency.ipynb")


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
    raise NotImplementedError("Exercise 3.1 (straggler_replica): see section 3.1 of lessons/l08_tail_latency.ipynb")


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
    raise NotImplementedError("Exercise 3.2 (first_suspect): see section 3.2 of lessons/l08_tail_latency.ipynb")


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
