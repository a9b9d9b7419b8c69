# Lesson 05 exercises: replace each `raise NotImplementedError` with your code.
# Check your work with `course check 05`. (Generated from solutions/l05_latency_metrics.py by
# `course sync`; keep the names and signatures.)
"""Lesson 05: TTFT, TPOT, ITL, percentiles and goodput, from per-request timestamps.

Every metric here is computed from one record per request, `RequestTimes`: when the request
arrived, when each of its output tokens was produced, and when it finished, all in seconds on
one clock. The definitions follow vLLM's serving benchmark, `vllm bench serve` (its code is
vllm/benchmarks/serve.py, `calculate_metrics`; the old benchmarks/benchmark_serving.py script now only
points there), and DistServe (OSDI 2024) for goodput:

    TTFT = first token time - arrival
    TPOT = (latency - TTFT) / (output tokens - 1),  latency = finish - arrival
    ITL  = the gaps between successive output tokens after the first
    goodput = requests meeting BOTH the TTFT and the TPOT SLO, per second of the run

Here every token has its own timestamp. vLLM's client has one per streamed message
(vllm/benchmarks/lib/endpoint_request_func.py), and a message may carry several tokens: its ITL list
holds one gap per message, while its TPOT divides by the token count the server reports.

The bottom of the file holds the measurement harness the notebook uses (a trace replay through
the reference engine); it is given, not an exercise.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Sequence

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestTimes:
    """One request's timestamps, in seconds on one clock (any origin).

    arrival:     when the request reached the server (a benchmark client: when it sent it).
    token_times: when each output token was produced, in order; one entry per output token,
                 so len(token_times) is the number of output tokens (at least 1).
    finish:      when the request completed; the reference engine finishes a request at its
                 last token, so finish == token_times[-1] there.
    scheduled:   when the engine first scheduled the request (None if unknown). The span
                 arrival -> scheduled is time spent queueing; TTFT includes it.

    >>> r = RequestTimes(arrival=10.0, token_times=[10.5, 10.625, 11.0], finish=11.0, scheduled=10.25)
    >>> r.output_tokens
    3
    """
    arrival: float
    token_times: list[float]
    finish: float
    scheduled: float | None = None

    @property
    def output_tokens(self) -> int:
        return len(self.token_times)

    @classmethod
    def from_metrics(cls, metrics, origin: float = 0.0) -> "RequestTimes":
        """From the engine's RequestMetrics (reference_engine.sequence), times shifted by -origin."""
        sched = metrics.first_scheduled_time
        return cls(arrival=metrics.arrival_time - origin,
                   token_times=[t - origin for t in metrics.token_times],
                   finish=metrics.finish_time - origin,
                   scheduled=None if sched is None else sched - origin)


# -- 1. per-request latencies ----------------------------------------------------------------

def ttft(r: RequestTimes) -> float:
    """Exercise 1.1: time to first token, in seconds: first output token time - arrival.

    Measured from the arrival, not from when the engine first scheduled the request: a user
    waits through the queue too (vLLM's benchmark starts the clock when it sends the request).

    >>> ttft(RequestTimes(arrival=10.0, token_times=[10.5, 10.625], finish=10.625, scheduled=10.25))
    0.5
    """
    raise NotImplementedError("Exercise 1.1 (ttft): see section 1.1 of lessons/l05_latency_metrics.ipynb")


def tpot(r: RequestTimes) -> float | None:
    """Exercise 1.2: time per output token after the first, in seconds, as vLLM's benchmark does:

        TPOT = (latency - TTFT) / (output_tokens - 1),   latency = finish - arrival

    i.e. the mean time between tokens once the first one is out. A request with one output
    token has no such gap: return None (vLLM leaves those requests out of its TPOT statistics).

    >>> tpot(RequestTimes(arrival=0.0, token_times=[0.5, 0.625, 1.0], finish=1.0))  # (1.0 - 0.5) / 2
    0.25
    >>> tpot(RequestTimes(arrival=0.0, token_times=[0.5], finish=0.5)) is None
    True
    """
    raise NotImplementedError("Exercise 1.2 (tpot): see section 1.2 of lessons/l05_latency_metrics.ipynb")


def itl(r: RequestTimes) -> list[float]:
    """Exercise 1.3: inter-token latencies, in seconds: the gaps between successive output tokens.

    One gap per token after the first, so len = output_tokens - 1 (an empty list for a
    one-token request). The wait for the first token is TTFT, not an ITL. Returns a list.

    >>> itl(RequestTimes(arrival=0.0, token_times=[0.5, 0.625, 1.0], finish=1.0))
    [0.125, 0.375]
    """
    raise NotImplementedError("Exercise 1.3 (itl): see section 1.3 of lessons/l05_latency_metrics.ipynb")


# -- 2. percentiles --------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """Exercise 2.1: the q-th percentile (0 <= q <= 100) of `values`, by linear interpolation.

    The convention is numpy's default (np.percentile, method="linear"), which vLLM's benchmark
    uses: sort the n values into s[0] <= ... <= s[n-1], go to the fractional position
    k = (n - 1) * q / 100 and interpolate between its neighbours:

        s[floor(k)] + (k - floor(k)) * (s[floor(k) + 1] - s[floor(k)])

    So q = 0 is the minimum, q = 100 the maximum and q = 50 the median. Write the interpolation
    yourself (no np.percentile / np.quantile / statistics.quantiles). Returns a float. Raises
    ValueError for no values or a q outside [0, 100].

    >>> percentile([15, 20, 35, 40, 50], 40)      # k = 1.6: 20 + 0.6 * (35 - 20)
    29.0
    >>> percentile([3.0], 99)
    3.0
    """
    raise NotImplementedError("Exercise 2.1 (percentile): see section 2.1 of lessons/l05_latency_metrics.ipynb")


def latency_summary(requests: Sequence[RequestTimes],
                    percentiles: Sequence[float] = PERCENTILES) -> dict[str, dict | None]:
    """Exercise 2.2: the latency rows of a benchmark report, one per metric.

    Returns {"ttft": row, "tpot": row, "itl": row, "e2el": row} where e2el is the end-to-end
    latency finish - arrival, and each row is

        {"count": number of values, "mean": ..., "p50": ..., "p90": ..., "p99": ...}

    (one "p<q>" key per entry of `percentiles`, named with f"p{q:g}": 99.9 -> "p99.9"), in
    seconds, or None when the metric has no values (an empty trace; TPOT and ITL when every
    request has one output token). The values pooled for each metric:
      ttft, e2el: one per request;
      tpot:       one per request with at least two output tokens (vLLM's rule);
      itl:        every gap of every request, pooled into one list (not a per-request average).
    Use your percentile().

    >>> reqs = [RequestTimes(0.0, [0.5, 0.625, 1.0], 1.0), RequestTimes(1.0, [1.25], 1.25)]
    >>> s = latency_summary(reqs)
    >>> s["ttft"]["p50"], s["tpot"]["count"], s["itl"]["count"], s["itl"]["p50"]
    (0.375, 1, 2, 0.25)
    """
    raise NotImplementedError("Exercise 2.2 (latency_summary): see section 2.2 of lessons/l05_latency_metrics.ipynb")


# -- 3. SLOs and goodput ---------------------------------------------------------------------

def meets_slo(r: RequestTimes, ttft_slo: float, tpot_slo: float) -> bool:
    """Exercise 3.1: does this request meet BOTH service-level objectives (seconds)?

    TTFT <= ttft_slo and TPOT <= tpot_slo; a value exactly at its SLO meets it. A request with
    one output token has no TPOT, so only its TTFT is judged (vLLM's benchmark counts its TPOT
    as 0 for goodput). Returns a bool.

    >>> r = RequestTimes(arrival=0.0, token_times=[0.5, 0.625, 1.0], finish=1.0)   # TPOT 0.25
    >>> meets_slo(r, ttft_slo=0.5, tpot_slo=0.25), meets_slo(r, ttft_slo=0.5, tpot_slo=0.2)
    (True, False)
    """
    raise NotImplementedError("Exercise 3.1 (meets_slo): see section 3.1 of lessons/l05_latency_metrics.ipynb")


def goodput(requests: Sequence[RequestTimes], ttft_slo: float, tpot_slo: float) -> dict[str, float]:
    """Exercise 3.2: goodput and SLO attainment of a finished run, with its throughput alongside.

    The run lasts from the first arrival to the last finish (duration_s). Returns
      "requests":         number of requests (all of them completed),
      "met":              how many meet both SLOs (your meets_slo),
      "attainment":       met / requests, a fraction in [0, 1],
      "duration_s":       last finish - first arrival, in seconds,
      "goodput_rps":      met / duration_s, requests per second that met both SLOs (DistServe),
      "request_rps":      requests / duration_s,
      "output_tok_s":     output tokens of all requests / duration_s.
    An empty run returns 0 (0.0 for the floats) everywhere.

    >>> reqs = [RequestTimes(0.0, [0.5, 0.625, 1.0], 1.0), RequestTimes(1.0, [1.25], 1.25)]
    >>> g = goodput(reqs, ttft_slo=0.5, tpot_slo=0.2)   # the first misses TPOT, the second is fine
    >>> g["met"], g["attainment"], g["duration_s"], g["goodput_rps"]
    (1, 0.5, 1.25, 0.8)
    """
    raise NotImplementedError("Exercise 3.2 (goodput): see section 3.2 of lessons/l05_latency_metrics.ipynb")


# -- 5. what a load generator measures ---------------------------------------------------------

def client_latencies(plan: Sequence[float], service_s: Sequence[float], closed_loop: bool) -> dict[str, list[float]]:
    """Exercise 5.1: what a load generator records, open or closed loop, against a server that serves one
    request at a time, first come first served.

    plan[i]:      when request i is meant to be sent, in seconds (non-decreasing): the benchmark's schedule.
    service_s[i]: how long the server works on request i once it starts it.
    The server starts request i at max(send[i], finish[i - 1]) and finishes it service_s[i] later.
    The client:
      open loop (closed_loop=False): sends every request at its planned time, whatever the server is
          doing (a benchmark with a request rate, and this lesson's replay): send[i] = plan[i];
      closed loop (closed_loop=True): one user who waits for each answer before sending the next:
          send[0] = plan[0], send[i] = max(plan[i], finish[i - 1]).
    Returns lists, one entry per request, in order:
      "send", "finish": seconds;
      "measured":  finish - send, the latency the client logs;
      "from_plan": finish - plan, what a user who arrived on schedule waited.
    Raises ValueError when the lists differ in length or plan decreases.

    >>> plan, service = [0.0, 1.0, 2.0, 3.0], [0.5, 2.5, 0.5, 0.5]     # request 1 stalls the server
    >>> client_latencies(plan, service, closed_loop=False)["measured"]
    [0.5, 2.5, 2.0, 1.5]
    >>> c = client_latencies(plan, service, closed_loop=True)
    >>> c["send"], c["measured"], c["from_plan"]
    ([0.0, 1.0, 3.5, 4.0], [0.5, 2.5, 0.5, 0.5], [0.5, 2.5, 2.0, 1.5])
    """
    raise NotImplementedError("Exercise 5.1 (client_latencies): see section 5.1 of lessons/l05_latency_metrics.ipynb")


# -- measurement harness (given) ---------------------------------------------------------------

@dataclass
class Replay:
    """One trace replay: the workload's request rate, every request's timestamps, and the engine's
    steps as (start s, duration s, prompt tokens in the step, decode tokens in the step)."""
    rate_rps: float
    requests: list[RequestTimes] = field(default_factory=list)
    wall_s: float = 0.0
    steps: list[tuple[float, float, int, int]] = field(default_factory=list)

    def step_at(self, t: float) -> tuple[float, float, int, int] | None:
        """The step that produced a token stamped at time t (tokens are stamped inside their step)."""
        i = bisect.bisect_right([s[0] for s in self.steps], t) - 1
        return self.steps[i] if i >= 0 else None


def load_llm(max_num_seqs: int = 16, threads: int = 1):
    """The shipped ~3M-parameter target model in the reference engine, fp32, on the CPU/GPU default."""
    import torch

    from reference_engine.llm import LLM
    from reference_engine.shipped import TARGET

    torch.set_num_threads(threads)
    return LLM(model=str(TARGET), max_num_seqs=max_num_seqs,
               dtype=torch.float32)


def load_modeled_llm(max_num_seqs: int = 16, chip: str = "H100", model: str = "llama-3-8b", threads: int = 1):
    """load_llm on the modeled GPU clock (reference_engine/sim/gpu_model.py): the engine still computes real
    tokens with the shipped model on this machine, but every timestamp is the time the same step would take
    for `model`'s shape on `chip` (an estimate, not a measurement), so replay() and every metric of this
    lesson come out in modeled seconds; replay() skips idle gaps on that clock instead of sleeping. The
    scheduler sees that GPU's KV capacity in blocks, capped at gpu_model.DEFAULT_MAX_BLOCKS (65,536 tokens)
    so that the small model's real cache stays small in RAM."""
    import warnings

    import torch

    from reference_engine.llm import LLM
    from reference_engine.shipped import TARGET
    from reference_engine.sim.gpu_model import CHIPS, MODELS, engine_kwargs

    torch.set_num_threads(threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # engine_kwargs warns that it caps the block count: intended here
        kw = engine_kwargs(MODELS[model], CHIPS[chip])
    return LLM(model=str(TARGET), max_num_seqs=max_num_seqs,
               dtype=torch.float32, **kw)


def workload(n: int, seed: int = 0, trace: str = "conv", max_context: int = 512):
    """n consecutive requests of the Azure LLM inference trace 2023, sizes scaled to max_context,
    with seeded random prompts of each request's length: (requests, prompt token ids)."""
    from reference_engine.sim import trace as tr

    reqs = tr.scale_to_context(tr.sample(n, seed=seed, trace=trace), max_context)
    return reqs, tr.prompt_token_ids(reqs, vocab_size=2048, seed=seed, exclude=(0,))


def replay(llm, requests, prompts, rate_rps: float) -> Replay:
    """Replay `requests` (trace.Request) at `rate_rps` (the trace's burstiness kept) through the
    engine's step API on the engine's clock (the wall clock, or a modeled one: load_modeled_llm), the way
    a serving benchmark would drive a server.

    Between steps, every request whose arrival time has passed is added, stamped with its
    scheduled arrival, so time spent waiting for a running step counts against its TTFT. Greedy
    decoding with EOS ignored: each request produces exactly its trace output length.
    Timestamps come back relative to the start of the replay."""
    from reference_engine.sim import trace as tr
    from reference_engine.sim.replay import replay as replay_requests

    eng = llm.engine
    first_step = len(eng.step_stats)
    outputs, t0, wall = replay_requests(eng, tr.with_rate(requests, rate_rps), prompts)
    steps = [(s.start_time - t0, s.wall_time, s.num_prefill_tokens, s.num_decode_tokens)
             for s in eng.step_stats[first_step:]]
    return Replay(rate_rps, [RequestTimes.from_metrics(o.metrics, t0) for o in outputs], wall, steps)
