"""Fault injection for trace replays: the usual causes of a broken latency tail, one at a time.

Every fault is seeded and deterministic on the modeled clock (gpu_model.ModeledClock): nothing sleeps,
and the same fault on the same trace gives the same timestamps on every machine.

    burst                 arrivals squeezed: `size` requests from time `at` on arrive within `width` s
    long_prompt_flood     a seeded fraction of the requests get a long prompt (output kept, fitted to context)
    small KV pool         an engine with few KV blocks (FaultSpec.small_pool): admission stalls, preemptions
    HostPause             a step hook: every `every` steps the host stalls `pause_s` before the step (a GC
                          pause, a tokenizer holding the GIL); charged on the clock, so it is in every timestamp
    slow replica          the last replica behind a round-robin router runs on a throttled chip (slow_chip)

run_fault(spec, requests, prompts) replays a workload with one fault and returns plain records
(request_records, step_records): what a latency dashboard and an engine's step log would hold.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace

import numpy as np

from ..shipped import TARGET
from .gpu_model import CHIPS, MODELS, Chip, engine_kwargs
from .trace import Request

# The causes a diagnosis names, in the order a tail is usually ruled out (lesson 08 explains the order).
CAUSES = ("queueing", "prefill_interference", "preemption", "host_stall", "bad_replica")
NONE = "none"


def burst(requests: list[Request], at: float, size: int, width: float) -> list[Request]:
    """Squeeze the `size` requests arriving first at or after `at` into [at, at + width): the k-th of them
    arrives at at + width * k / size. Everything else is unchanged; the list stays in arrival order (every
    squeezed arrival moves earlier, to no earlier than `at`)."""
    if size < 1 or width < 0:
        raise ValueError(f"burst needs size >= 1 and width >= 0, got size={size}, width={width}")
    first = next((i for i, r in enumerate(requests) if r.arrival >= at), len(requests))
    out = list(requests)
    for k, i in enumerate(range(first, min(first + size, len(requests)))):
        out[i] = replace(out[i], arrival=at + width * k / size)
    return out


def long_prompt_flood(requests: list[Request], fraction: float, prompt_tokens: int, max_context: int,
                      seed: int = 0) -> list[Request]:
    """Give each request, independently with probability `fraction` (seeded), a prompt of `prompt_tokens`
    tokens; its output is cut so that prompt + output <= max_context (at least 1 token)."""
    if not 0 < prompt_tokens < max_context:
        raise ValueError(f"prompt_tokens must be in 1..{max_context - 1}, got {prompt_tokens}")
    hit = np.random.default_rng(seed).random(len(requests)) < fraction
    return [replace(r, prompt_tokens=prompt_tokens, output_tokens=max(1, min(r.output_tokens, max_context - prompt_tokens)))
            if h else r for r, h in zip(requests, hit)]


class HostPause:
    """A step hook for replay.replay: before every `every`-th step (the every-th, 2*every-th, ...), the host
    stalls pause_s seconds. On a modeled clock the stall moves the clock on (advance_to), on the wall clock it
    sleeps. `pauses` counts the stalls charged so far."""

    def __init__(self, every: int, pause_s: float):
        if every < 1 or pause_s < 0:
            raise ValueError(f"HostPause needs every >= 1 and pause_s >= 0, got {every}, {pause_s}")
        self.every, self.pause_s, self.calls, self.pauses = every, pause_s, 0, 0

    def __call__(self, engine) -> None:
        self.calls += 1
        if self.calls % self.every:
            return
        self.pauses += 1
        from ..engine_config import IdleClock
        clock = engine.clock
        if isinstance(clock, IdleClock):
            clock.advance_to(clock() + self.pause_s)
        else:
            time.sleep(self.pause_s)


def slow_chip(chip: Chip, factor: float) -> Chip:
    """The same chip throttled `factor` times (compute and memory bandwidth both divided): a GPU held at a
    low clock by heat or a power cap, or one sharing its node with a noisy neighbour."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    return replace(chip, name=f"{chip.name} throttled x{factor:g}", dense_tflops=chip.dense_tflops / factor,
                   hbm_gb_per_s=chip.hbm_gb_per_s / factor)


@dataclass(frozen=True)
class FaultSpec:
    """One replay's deployment and its one fault. cause: one of CAUSES or "none" (the clean replay).
    Engine: max_num_seqs, max_num_batched_tokens (chunked prefill on), num_blocks (None: what the modeled chip
    holds), replicas behind a round-robin router (the slow one, for "bad_replica", is the last, throttled by
    slow_factor). burst_* / flood_* / pause_* parameterise their faults; the clock is `model` on `chip`."""
    cause: str = NONE
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    num_blocks: int | None = None  # None: what the modeled chip holds; "preemption" uses small_pool instead
    small_pool: int = 40  # KV blocks for "preemption": 640 tokens, barely above one full-length sequence
    replicas: int = 2
    slow_factor: float = 2.0
    burst_at: float = 2.0
    burst_size: int = 150
    burst_width: float = 0.05
    flood_fraction: float = 0.8
    flood_prompt: int = 500
    pause_every: int = 200
    pause_s: float = 0.1
    chip: str = "H100"
    model: str = "llama-3-8b"
    max_context: int = 512
    seed: int = 0

    def __post_init__(self):
        if self.cause not in (*CAUSES, NONE):
            raise ValueError(f"cause must be one of {(*CAUSES, NONE)}, got {self.cause!r}")
        if self.cause == "bad_replica" and self.replicas < 2:
            raise ValueError("a bad replica needs healthy ones to stand out from: replicas >= 2")


def skip_forward(engine) -> None:
    """Make `engine` skip the model's forward when only timing matters: its runner's execute() returns one
    zero logit per row ([n, 1]: greedy picks token 0, and nothing allocates or scans a vocabulary-wide row;
    replays ignore EOS). On a modeled clock a step's time depends only on the
    schedule, and with every output length fixed the schedule never depends on the tokens, so every
    timestamp equals the full engine's (tests/test_l08_tail_latency.py compares the two)."""
    import torch

    zero = torch.zeros(1, 1)

    def execute(so):  # an expanded view: no allocation a step, and writing into it would raise
        return zero.expand(sum(s.num_logits for s in so.scheduled), 1)

    engine.runner.execute = execute  # this instance only; the KV cache stays allocated, never written


def make_engine(spec: FaultSpec, chip: Chip | None = None, compute: bool = True):
    """An LLMEngine on the shipped target model (fp32, this CPU) whose clock is spec.model on `chip`
    (default spec.chip), with spec's batch, budget and KV pool. compute=False skips the model's forward
    (skip_forward) and allocates the never-used KV cache in fp8 (same block count; the modeled clock
    prices the KV cache of spec.model, not this cache): same timestamps, a fraction of the CPU time."""
    import torch

    from ..engine import LLMEngine

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # engine_kwargs warns when it caps the block count: intended
        kw = engine_kwargs(MODELS[spec.model], chip or CHIPS[spec.chip])
    if spec.num_blocks is not None:
        kw["num_blocks"] = spec.num_blocks
    if spec.cause == "preemption":
        kw["num_blocks"] = spec.small_pool
    if not compute:  # the cache is never written: a 1-byte one is a quarter of the memory to allocate and zero
        kw["kv_cache_dtype"] = "fp8"
    engine = LLMEngine(str(TARGET), max_num_seqs=spec.max_num_seqs,
                       max_num_batched_tokens=spec.max_num_batched_tokens, dtype=torch.float32, **kw)
    if not compute:
        skip_forward(engine)
    return engine


def inject(spec: FaultSpec, requests: list[Request], prompts: list[list[int]]) -> tuple[list[Request], list[list[int]]]:
    """The workload with spec's arrival or prompt fault applied (other causes leave it unchanged). Flooded
    requests get seeded random prompts of the new length (token ids 1..2047: no EOS/BOS)."""
    if spec.cause == "queueing":
        return burst(requests, spec.burst_at, spec.burst_size, spec.burst_width), prompts
    if spec.cause == "prefill_interference":
        flooded = long_prompt_flood(requests, spec.flood_fraction, spec.flood_prompt, spec.max_context, spec.seed)
        rng = np.random.default_rng(spec.seed + 1)
        prompts = [p if r.prompt_tokens == len(p) else rng.integers(1, 2048, size=r.prompt_tokens).tolist()
                   for r, p in zip(flooded, prompts)]
        return flooded, prompts
    return list(requests), prompts


def run_fault(spec: FaultSpec, requests: list[Request], prompts: list[list[int]], threads: int = 1,
              compute: bool = True) -> dict:
    """Replay the workload with spec's one fault on spec.replicas engines behind a round-robin router
    (compute=False: without the model's forward, see make_engine).
    Returns {"cause", "requests": request_records(...), "steps": [step_records(...) per replica],
    "replicas": engines' chip names}."""
    import torch

    from .router import replay_replicas

    torch.set_num_threads(threads)
    requests, prompts = inject(spec, requests, prompts)
    chips = [CHIPS[spec.chip]] * spec.replicas
    if spec.cause == "bad_replica":
        chips[-1] = slow_chip(CHIPS[spec.chip], spec.slow_factor)
    engines = [make_engine(spec, chip, compute) for chip in chips]
    hooks = [HostPause(spec.pause_every, spec.pause_s) if spec.cause == "host_stall" else None for _ in engines]
    outputs, assignment, starts = replay_replicas(engines, requests, prompts, step_hooks=hooks)
    steps = [step_records(e.step_stats, t0) for e, t0 in zip(engines, starts)]
    ends = [np.array([s["end"] for s in st]) for st in steps]  # once per replica, not once per request
    reqs = [request_records(o, r, requests[i].prompt_tokens, starts[r], steps[r], ends[r])
            for i, (o, r) in enumerate(zip(outputs, assignment))]
    return {"cause": spec.cause, "requests": reqs, "steps": steps, "replicas": [c.name for c in chips]}


def step_records(step_stats, origin: float = 0.0) -> list[dict]:
    """The engine's StepStats as plain dicts, times shifted by -origin: start, end (seconds), prefill_tokens,
    decode_tokens, preempted (sequences preempted in the step), running and waiting (after it)."""
    return [{"start": s.start_time - origin, "end": s.start_time - origin + s.wall_time,
             "prefill_tokens": s.num_prefill_tokens, "decode_tokens": s.num_decode_tokens,
             "preempted": s.num_preempted, "running": s.num_running, "waiting": s.num_waiting} for s in step_stats]


def request_records(output, replica: int, prompt_tokens: int, origin: float, steps: list[dict],
                    ends: np.ndarray | None = None) -> dict:
    """One finished request as a plain dict, times shifted by -origin: arrival, first_scheduled, token_times,
    finish, num_preemptions, prompt_tokens, replica. Each token time is snapped to the end of the step that
    produced it (they are the same clock reading, up to the rounding of start + wall_time), so a token time
    equals its step's "end" exactly. ends: the steps' ends as an array, when the caller has it already."""
    m = output.metrics
    ends = np.array([s["end"] for s in steps]) if ends is None else ends

    def snap(t: float) -> float:
        t -= origin
        i = int(np.searchsorted(ends, t))
        near = [j for j in (i - 1, i) if 0 <= j < len(ends) and abs(ends[j] - t) <= 1e-9 * max(1.0, abs(t))]
        return float(ends[near[0]]) if near else t

    times = [snap(t) for t in m.token_times]
    return {"arrival": m.arrival_time - origin, "first_scheduled": m.first_scheduled_time - origin,
            "token_times": times, "finish": times[-1], "num_preemptions": m.num_preemptions,
            "prompt_tokens": prompt_tokens, "replica": replica}
