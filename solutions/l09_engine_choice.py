"""Lesson 09: choosing an engine on the roofline.

An engine's step costs host time (scheduling, block tables, input preparation, sampling, Python) and
device time (the kernels). Which of the three an engine reaches first on a workload, the host floor,
the memory roof or the compute roof, decides what makes it faster there; the decision table in
section 3 turns that into a recommendation with the condition that would reverse it.

Conventions:
- Step statistics are dicts with the fields of reference_engine.sequence.StepStats (stats_dicts()
  makes them from an engine): wall_time and forward_time in seconds, forward_time None for a step
  that ran no forward. host = wall_time - forward_time.
- Device time is the modeled GPU clock's (reference_engine/sim/gpu_model.py): the sum of the kernels'
  roofline times at the chip's achievable fractions, with no per-step overhead (overhead_s=0). Models
  are keys of gpu_model.MODELS ("llama-3-8b", "llama-3-70b"), chips keys of gpu_model.CHIPS ("H100",
  "H200", "A100").
- Units: seconds, tokens, sequences.

The bottom of the file holds the measuring harness the notebook uses (given, not an exercise).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import NamedTuple

from reference_engine.sim import gpu_model as gm

MAX_BATCH = 4096  # the largest decode batch the searches below look at
ENGINES = ("vLLM", "SGLang", "TensorRT-LLM")
# The releases the decision table describes (section 3.2 cites what each row rests on, release by release).
ENGINE_VERSIONS = {"vLLM": "v0.11", "SGLang": "v0.5", "TensorRT-LLM": "1.0"}
# Feature fit: a need that rules an engine out, and the engine it rules out. TensorRT-LLM runs on NVIDIA GPUs
# only; vLLM and SGLang also run on AMD GPUs, TPUs and other accelerators. (Model turnover no longer rules it
# out: since 1.0 its default PyTorch backend loads a Hugging Face checkpoint with no engine build.)
EXCLUDES = {"multi_vendor": "TensorRT-LLM"}

def device_time(model: str, chip: str, batch: int, context: int, chunk: int = 0, chunk_context: int = 0,
                tp: int = 1) -> float:
    """Modeled seconds of the kernels of one step (given): `batch` decode tokens at `context` cached tokens
    each, plus one prefill chunk of `chunk` tokens after `chunk_context` cached ones if chunk > 0, on one
    GPU of a tensor-parallel group of tp (its shard, and the all-reduces); no host overhead
    (gpu_model.step_time with overhead_s=0)."""
    comp = gm.Composition.decode_batch(batch, context, chunk, chunk_context)
    return gm.step_time(gm.MODELS[model], gm.CHIPS[chip], comp, tp=tp, overhead_s=0.0).time_s


def stats_dicts(engine) -> list[dict]:
    """An engine's StepStats as plain dicts (given): the input of section 1's functions."""
    return [dataclasses.asdict(s) for s in engine.step_stats]


# ---------------------------------------------------------------- 1. the measured step


def step_split(steps: list[dict]) -> dict:
    """Exercise 1.1: split measured steps into host time and forward (device) time.

    Only steps that ran a forward count: a step whose forward_time is None (it only preempted) is left
    out entirely; a forward_time of 0.0 is a forward that ran (too short for the clock) and counts. For the
    steps that count:
      "steps":         how many there are
      "wall_s":        sum of wall_time
      "forward_s":     sum of forward_time
      "host_s":        sum of (wall_time - forward_time)
      "host_fraction": host_s / wall_s, the share of the engine's time the device could not be working
                       (a ratio of sums: long steps weigh more, as they do in the run's total time)
    Raises ValueError when no step ran a forward.

    Example: [{"wall_time": 0.010, "forward_time": 0.006}, {"wall_time": 0.002, "forward_time": None},
              {"wall_time": 0.030, "forward_time": 0.026}] -> steps 2, wall_s 0.04, forward_s 0.032,
              host_s 0.008, host_fraction 0.2
    """
    ### BEGIN SOLUTION
    ran = [s for s in steps if s["forward_time"] is not None]
    if not ran:
        raise ValueError("no step ran a forward (every forward_time is None): nothing to split")
    wall = sum(s["wall_time"] for s in ran)
    forward = sum(s["forward_time"] for s in ran)
    host = sum(s["wall_time"] - s["forward_time"] for s in ran)
    return {"steps": len(ran), "wall_s": wall, "forward_s": forward, "host_s": host, "host_fraction": host / wall}
    ### END SOLUTION


def split_by_batch(steps: list[dict]) -> dict[int, dict]:
    """Exercise 1.2: host and forward time of a decode step, per batch size.

    Use the pure decode steps only: a forward ran (forward_time not None) and no prefill token was in it
    (num_prefill_tokens == 0); a step with a prefill chunk costs more for reasons that are not the batch.
    Group them by num_decode_seqs (the batch the step ran; num_running counts the batch after it). For
    each batch size b:
      {"n": steps in the group, "host_s": median of wall_time - forward_time, "forward_s": median of
       forward_time}
    Medians, not means: a measured step now and then waits for the OS or the garbage collector, and one
    such step would move a mean far more than the typical step.

    Returns {b: {...}} with the batch sizes in increasing order.
    Example: two decode steps of batch 4 with (wall, forward) = (0.010, 0.006) and (0.012, 0.008) ->
             {4: {"n": 2, "host_s": 0.004, "forward_s": 0.007}}
    """
    ### BEGIN SOLUTION
    groups: dict[int, list[dict]] = {}
    for s in steps:
        if s["forward_time"] is not None and s["num_prefill_tokens"] == 0:
            groups.setdefault(s["num_decode_seqs"], []).append(s)
    return {b: {"n": len(g), "host_s": statistics.median(s["wall_time"] - s["forward_time"] for s in g),
                "forward_s": statistics.median(s["forward_time"] for s in g)}
            for b, g in sorted(groups.items())}
    ### END SOLUTION


# ---------------------------------------------------------------- 2. where a step sits on the roofline


def regime(model: str, chip: str, batch: int, context: int, host_overhead_s: float,
           chunk: int = 0, chunk_context: int = 0, tp: int = 1) -> str:
    """Exercise 2.1: which roof sets the time of one step: "overhead", "memory" or "compute".

    The host prepares a step while the device runs the previous one, so the slower of the two sets the
    step time (lesson 01's third roof). The step is:
      "overhead" when host_overhead_s > its device time (device_time(...) above: kernels only);
      otherwise "compute" when the kernels that are compute-bound take more than half of the device
      time, and "memory" when they do not. Take the kernels from gpu_model.step_time(gm.MODELS[model],
      gm.CHIPS[chip], composition, tp=tp, overhead_s=0.0).kernels: each KernelTime has time_s and bound
      (under tensor parallelism the all-reduces count as neither: their bound is "network").
    Every kernel counts, attention included: a long-context decode step can have compute-bound GEMMs
    and still spend most of its time reading the KV cache.

    Example: regime("llama-3-8b", "H100", 1, 1024, 1e-3) == "memory" (5.4 ms of kernels, 1 ms of host)
    """
    ### BEGIN SOLUTION
    comp = gm.Composition.decode_batch(batch, context, chunk, chunk_context)
    st = gm.step_time(gm.MODELS[model], gm.CHIPS[chip], comp, tp=tp, overhead_s=0.0)
    if host_overhead_s > st.time_s:
        return "overhead"
    compute = sum(k.time_s for k in st.kernels if k.bound == "compute")
    return "compute" if compute > st.time_s / 2 else "memory"
    ### END SOLUTION


def overhead_bound_batch(model: str, chip: str, context: int, host_overhead_s: float,
                         max_batch: int = MAX_BATCH) -> int | None:
    """Exercise 2.2: the batch below which a decode step is overhead-bound.

    A decode step of b sequences at `context` cached tokens each takes device_time(model, chip, b,
    context) on the device, which grows with b. Return the smallest b in 1 .. max_batch whose device
    time is at least host_overhead_s: every batch below it is overhead-bound (the device waits for the
    host), from it on the kernels set the time. 1 when no batch is overhead-bound; None when every batch
    up to max_batch is. device_time never decreases with b, so a bisection is enough.

    Example: overhead_bound_batch("llama-3-8b", "H100", 1024, 0.010) == 93
    """
    ### BEGIN SOLUTION
    if device_time(model, chip, max_batch, context) < host_overhead_s:
        return None
    lo, hi = 1, max_batch  # invariant: device_time(hi) >= overhead; every batch below lo is below it
    while lo < hi:
        mid = (lo + hi) // 2
        if device_time(model, chip, mid, context) >= host_overhead_s:
            hi = mid
        else:
            lo = mid + 1
    return lo
    ### END SOLUTION


# ---------------------------------------------------------------- 3. the decision table


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a deployment has to serve.

    concurrency: sequences decoding at once (the decode batch of a step); prompt_tokens, output_tokens:
    per request; prefix_share: fraction of each prompt already cached from earlier requests (a shared
    system prompt, the history of a multi-turn chat), 0 .. 1; tpot_slo_s: the time-per-output-token
    target in seconds, None when only throughput matters; host_overhead_s: host time per step of the
    engine as you run it now (measure it: step_split); model: a key of gpu_model.MODELS; chip: a key of
    gpu_model.CHIPS; tp: GPUs per replica (tensor parallel; whether the weights and the cache fit is
    lesson 06's question, not this table's); features: the deployment's needs, as strings; only those
    that are keys of EXCLUDES ("multi_vendor") rule an engine out, any other (say "fast_model_turnover")
    rules nothing out.
    """
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    prefix_share: float = 0.0
    tpot_slo_s: float | None = None
    host_overhead_s: float = 0.0
    model: str = "llama-3-8b"
    chip: str = "H100"
    tp: int = 1
    features: tuple[str, ...] = ()


class Reversal(NamedTuple):
    """The change of one workload field that reverses a row: `field op value`, and the engine the table
    picks after it (None: no engine meets the SLO)."""
    field: str
    op: str       # "<=", ">" or "has" (features gains value)
    value: object
    engine: str | None


class Recommendation(NamedTuple):
    engine: str | None  # one of ENGINES; None when the engine does not decide (rows "slo" and "overhead")
    row: str            # the row of the table that decided: "slo", "overhead", "compute", "default"
    regime: str         # regime() of the workload's steady step
    reversal: Reversal


def steady_step(w: Workload) -> dict:
    """Exercise 3.1: the step a workload settles into, with chunked prefill.

    Every step each of the `concurrency` sequences decodes one token, so a sequence finishes every
    output_tokens steps and, in a steady state, concurrency / output_tokens new requests start per step.
    Each brings prompt_tokens * (1 - prefix_share) tokens to prefill (the cached share is not computed)
    after prompt_tokens * prefix_share cached ones. The decode tokens see on average the prompt and half
    the output. So:
      "batch":         concurrency
      "context":       prompt_tokens + output_tokens // 2
      "chunk":         round(concurrency * prompt_tokens * (1 - prefix_share) / output_tokens)
      "chunk_context": round(prompt_tokens * prefix_share)
    (ints; round() as Python rounds).

    Example: Workload(64, 2000, 200, prefix_share=0.75) -> {"batch": 64, "context": 2100, "chunk": 160,
             "chunk_context": 1500}
    """
    ### BEGIN SOLUTION
    return {"batch": w.concurrency, "context": w.prompt_tokens + w.output_tokens // 2,
            "chunk": round(w.concurrency * w.prompt_tokens * (1 - w.prefix_share) / w.output_tokens),
            "chunk_context": round(w.prompt_tokens * w.prefix_share)}
    ### END SOLUTION


def recommend(w: Workload) -> Recommendation:
    """Exercise 3.2: the lesson's decision table, with the condition that reverses its answer.

    The table describes the releases in ENGINE_VERSIONS. s = steady_step(w) (prefix reuse is already in it:
    at these releases every engine reuses a cached prefix by default, so a shared prefix moves the step on
    the roofline and picks no engine by itself); its device time d = device_time(w.model, w.chip,
    s["batch"], s["context"], s["chunk"], s["chunk_context"], w.tp) and its regime r = regime(...,
    w.host_overhead_s, ..., w.tp). An engine named in EXCLUDES for one of w.features is ruled out. The first
    row that applies decides:

      row        applies when                               engine           reversal (field, op, value)
      "slo"      tpot_slo_s is set and d > tpot_slo_s        None             ("concurrency", "<=", b) with b the
                                                                              largest batch whose steady step
                                                                              meets the SLO (its d <= tpot_slo_s,
                                                                              a tie meets it); if even batch 1
                                                                              misses it: ("tpot_slo_s", ">=", d)
      "overhead" r == "overhead"                             None             ("host_overhead_s", "<=", d)
      "compute"  r == "compute", TensorRT-LLM not ruled out  "TensorRT-LLM"   ("features", "has", "multi_vendor")
      "default"  always                                      "vLLM"           ("host_overhead_s", ">", d)

    None is "the engine does not decide": no engine beats its kernels (slo), or every engine overlaps the
    host with the device and the host still takes longer (overhead). "Batch b" in the slo row means the
    workload with concurrency = b (its chunk changes with it). The reversal's engine is recommend() of the
    workload after the change: the field set to the value ("has": the value added to features), except for
    ">", where the field is set to math.nextafter(value, math.inf), the next float above the value.

    Example: recommend(Workload(32, 1000, 300, prefix_share=0.8)) ->
             Recommendation("vLLM", "default", "memory", Reversal("host_overhead_s", ">", d, None)), d = 7.23 ms
    """
    ### BEGIN SOLUTION
    # Two passes of the table: the workload itself, then the workload its reversal changes it into.
    v, first, rev = w, None, None
    while True:
        s = steady_step(v)
        d = device_time(v.model, v.chip, s["batch"], s["context"], s["chunk"], s["chunk_context"], v.tp)
        r = regime(v.model, v.chip, s["batch"], s["context"], v.host_overhead_s, s["chunk"], s["chunk_context"], v.tp)
        excluded = {EXCLUDES[f] for f in v.features if f in EXCLUDES}
        if v.tpot_slo_s is not None and d > v.tpot_slo_s:
            engine, row = None, "slo"
        elif r == "overhead":
            engine, row = None, "overhead"
        elif r == "compute" and "TensorRT-LLM" not in excluded:
            engine, row = "TensorRT-LLM", "compute"
        else:
            engine, row = "vLLM", "default"
        if first is not None:  # second pass: the engine the table picks after the reversal
            return Recommendation(*first, rev._replace(engine=engine))
        first = (engine, row, r)
        if row == "slo":
            # The steady step's device time never falls as the batch grows: bisect. lo meets the SLO (or is 0).
            lo, hi = 0, w.concurrency
            while hi - lo > 1:
                mid = (lo + hi) // 2
                m = steady_step(dataclasses.replace(w, concurrency=mid))
                d_mid = device_time(w.model, w.chip, m["batch"], m["context"], m["chunk"], m["chunk_context"], w.tp)
                lo, hi = (mid, hi) if d_mid <= w.tpot_slo_s else (lo, mid)
            rev, change = ((Reversal("concurrency", "<=", lo, None), {"concurrency": lo}) if lo else
                           (Reversal("tpot_slo_s", ">=", d, None), {"tpot_slo_s": d}))
        elif row == "overhead":
            rev, change = Reversal("host_overhead_s", "<=", d, None), {"host_overhead_s": d}
        elif row == "compute":
            rev = Reversal("features", "has", "multi_vendor", None)
            change = {"features": tuple(sorted(set(w.features) | {"multi_vendor"}))}
        else:
            rev, change = Reversal("host_overhead_s", ">", d, None), {"host_overhead_s": math.nextafter(d, math.inf)}
        v = dataclasses.replace(w, **change)
    ### END SOLUTION


# ---------------------------------------------------------------- the measuring harness (given)


def load_engine(max_num_seqs: int = 64, threads: int = 1):
    """The shipped ~3.3M-parameter target model in fp32 on this machine (the engine's own clock)."""

    import torch

    from reference_engine.llm import LLM
    from reference_engine.shipped import TARGET

    torch.set_num_threads(threads)
    return LLM(model=str(TARGET), dtype=torch.float32,
               max_num_seqs=max_num_seqs, max_num_batched_tokens=max(512, max_num_seqs))


def measure_batches(llm, batches: list[int], prompt_len: int = 16, output_len: int = 12, seed: int = 0) -> list[dict]:
    """For each batch size b: b requests of prompt_len random tokens arriving together, each generating
    exactly output_len tokens (greedy), so the engine runs steps of b decodes. Returns the step stats of all
    the runs (stats_dicts), in order."""
    import random

    from reference_engine import SamplingParams

    rng = random.Random(seed)
    vocab = llm.engine.config.vocab_size
    first = len(llm.engine.step_stats)
    for b in batches:
        prompts = [[rng.randrange(1, vocab) for _ in range(prompt_len)] for _ in range(b)]
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True))
    return stats_dicts(llm.engine)[first:]
