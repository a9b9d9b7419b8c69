# Lesson 03 exercises: replace each `raise NotImplementedError` with your code.
# Check your work with `course check 03`. (Generated from solutions/l03_continuous_batching.py by
# `course sync`; keep the names and signatures.)
"""Lesson 03: static vs continuous (iteration-level) batching.

The model of time used by every simulation here: the engine runs in steps; in one step every
occupied batch slot produces one output token. A request admitted at step s with output length L
produces its tokens in steps s .. s + L - 1 (the admission step prefills the prompt and samples the
first token, as the reference engine does without chunked prefill), so its slot is busy for L
slot-steps. A request can be admitted at step s only if it has arrived: arrival <= s.

    static batching:     take the next B requests in arrival order; the batch starts when the previous
                         one has ended and all B have arrived, runs max(L) steps, returns together.
    continuous batching: every step, free the slots of finished requests and fill free slots from the
                         waiting queue (first come, first served, at most B running).

Slot occupancy = useful slot-steps / (B * total steps) = sum(L) / (B * total_steps).

The bottom of the file holds the engine harness the notebook uses (given, not an exercise).
"""
from __future__ import annotations

import time
from collections import Counter
from typing import NamedTuple, Sequence


class Request(NamedTuple):
    arrival: int      # first step at which the request may be admitted
    output_len: int   # tokens it generates = steps it occupies a slot (>= 1)


def _result(finish: list[int], slots_used: list[int], requests: Sequence[Request], B: int) -> dict:
    total = len(slots_used)
    useful = sum(r.output_len for r in requests)
    return {"finish": finish, "total_steps": total,
            "occupancy": useful / (B * total) if total else 0.0, "slots_used": slots_used}


# -- 1. static batching -----------------------------------------------------------------------------

def simulate_static(requests: Sequence[Request], B: int) -> dict:
    """Exercise 1.1: simulate static batching of `requests` (sorted by arrival) in batches of B.

    Batch k holds requests k*B .. k*B + B - 1 (the last may be smaller). It starts at
    max(end of batch k - 1, latest arrival among its requests) and runs for the longest output
    length in it; every request of the batch is returned when the batch ends.

    Returns a dict:
      "finish":      list[int], per request (input order), the step count at which it is returned
                     (= its batch's end step);
      "total_steps": int, the end of the last batch (steps from 0, idle steps included);
      "occupancy":   float, sum(output_len) / (B * total_steps);
      "slots_used":  list[int] of length total_steps, how many slots produce a useful token in each
                     step (0 while waiting for arrivals).

    Example: [Request(0, 1), Request(0, 3), Request(0, 2)], B=2 -> batch [0, 1] runs steps 0-2, batch
    [2] runs steps 3-4: finish [3, 3, 5], total_steps 5, slots_used [2, 1, 1, 1, 1], occupancy 6/10.
    """
    raise NotImplementedError("Exercise 1.1 (simulate_static): see section 1.1 of lessons/l03_continuous_batching.ipynb")


# -- 2. continuous batching -------------------------------------------------------------------------

def continuous_step(running: list[tuple[int, int]], waiting: list[int], requests: Sequence[Request],
                    B: int, step: int) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Exercise 2.1: one step of iteration-level scheduling. Do not modify the arguments.

    running: (request id, tokens still to generate) for each occupied slot, in admission order; an
             entry with 0 left finished in the previous step and still holds its slot.
    waiting: request ids not yet admitted, in arrival order (some may not have arrived yet).
    requests[i]: Request(arrival, output_len); step: the index of this step.

    In this order: 1. retire every running entry with 0 tokens left; 2. admit waiting requests that
    have arrived (arrival <= step), first come first served, while fewer than B run; 3. decode: every
    running entry (old and newly admitted) generates one token.
    Returns (new running, new waiting, ids retired this step, in running order).

    Example: running [(0, 0), (1, 2)], waiting [2, 3], requests[2].arrival = 0, output_len 3,
    requests[3].arrival = 9, B=2, step=4 -> ([(1, 1), (2, 2)], [3], [0]).
    """
    raise NotImplementedError("Exercise 2.1 (continuous_step): see section 2.1 of lessons/l03_continuous_batching.ipynb")


def simulate_continuous(requests: Sequence[Request], B: int) -> dict:
    """Exercise 2.2: simulate continuous batching with your continuous_step; same dict as
    simulate_static.

    Start with nothing running and every request waiting (ids 0 .. n-1 in order); call
    continuous_step for step = 0, 1, 2, ... A request retired at step s finished at the end of step
    s - 1: its "finish" is s. Stop when nothing runs or waits; the last, empty step (it only retires)
    is not counted, so total_steps = max(finish). "slots_used"[s] = requests decoding in step s.

    Example: [Request(0, 1), Request(0, 3), Request(0, 2)], B=2 -> finish [1, 3, 3], total_steps 3,
    slots_used [2, 2, 2], occupancy 1.0.
    """
    raise NotImplementedError("Exercise 2.2 (simulate_continuous): see section 2.2 of lessons/l03_continuous_batching.ipynb")


# -- 3. the closed form for i.i.d. output lengths ---------------------------------------------------

def expected_max(pmf: dict[int, float], B: int) -> float:
    """Exercise 3.1: E[max(L_1, ..., L_B)] for B i.i.d. output lengths with distribution `pmf`.

    pmf maps a length (int >= 1, tokens) to its probability (they sum to 1). Exact, no sampling:
    for integers, E[M] = sum over k >= 1 of P(M >= k) = sum_k (1 - F(k - 1)^B), F the CDF.

    Example: pmf {1: 0.5, 3: 0.5}, B=2 -> P(M=1) = 0.25, P(M=3) = 0.75 -> 2.5.
    """
    raise NotImplementedError("Exercise 3.1 (expected_max): see section 3.1 of lessons/l03_continuous_batching.ipynb")


def batching_gain(pmf: dict[int, float], B: int) -> dict[str, float]:
    """Exercise 3.2: what static batching wastes, and what continuous batching wins back.

    Offline (every request waiting), full batches of B i.i.d. lengths, and a step whose cost does not
    depend on how many slots are useful (decode on a GPU is memory-bound: true to first order):
      "padding_waste": expected fraction of a static batch's slot-steps spent on finished requests,
                       1 - E[L] / E[max of B]  (a ratio of expectations: the long-run fraction);
      "gain":          continuous over static throughput, E[max of B] / E[L] (continuous batching
                       keeps all B slots useful).

    Example: pmf {1: 0.5, 3: 0.5}, B=2 -> E[L] = 2, E[max] = 2.5 -> waste 0.2, gain 1.25.
    """
    raise NotImplementedError("Exercise 3.2 (batching_gain): see section 3.2 of lessons/l03_continuous_batching.ipynb")


def empirical_pmf(lengths: Sequence[int]) -> dict[int, float]:
    """The distribution of observed lengths (each value's share of the samples)."""
    counts = Counter(int(x) for x in lengths)
    return {k: c / len(lengths) for k, c in sorted(counts.items())}


# -- 4. scheduler policies for the reference engine -------------------------------------------------

class ContinuousPolicy:
    """Exercise 4.1: iteration-level admission for reference_engine (a SchedulerPolicy).

    The engine calls schedule() every step, after every running request got its decode token.
    candidates: sequences oldest first (partly prefilled prompts, then the waiting queue).
    Admit candidates in that order while the budget allows (budget.try_take(seq, n) checks and spends
    tokens, batch slots and KV blocks); stop at the first that does not fit (FCFS: nobody overtakes).
    Each takes all its uncomputed tokens, or, with budget.chunked_prefill, at most budget.tokens.
    Returns [(seq, num_tokens), ...].
    """

    def schedule(self, candidates, budget):
        raise NotImplementedError("Exercise 4.1 (ContinuousPolicy.schedule): see section 4.1 of lessons/l03_continuous_batching.ipynb")


class StaticPolicy:
    """Exercise 4.2: static batching as a SchedulerPolicy: admit new requests only into an empty
    batch, i.e. when no sequence is running (budget.slots == max_num_seqs), then FCFS as in 4.1.
    While a batch runs, prompts it already started (candidates with is_waiting False) still get their
    next chunk, so it also works with chunked prefill.
    """

    def __init__(self, max_num_seqs: int):
        self.max_num_seqs = max_num_seqs  # the engine's B: all slots free means nothing runs

    def schedule(self, candidates, budget):
        raise NotImplementedError("Exercise 4.2 (StaticPolicy.schedule): see section 4.2 of lessons/l03_continuous_batching.ipynb")


# -- the engine harness (given) ---------------------------------------------------------------------

def load_llm(policy=None, max_num_seqs: int = 8, num_blocks: int | None = None, threads: int = 1):
    """The shipped ~3M-parameter target model, fp32, no chunked prefill and a token budget that admits
    a whole batch of prompts in one step (so one engine step = one step of the simulations above)."""
    import torch

    from reference_engine.llm import LLM
    from reference_engine.shipped import TARGET

    torch.set_num_threads(threads)
    return LLM(model=str(TARGET), max_num_seqs=max_num_seqs,
               num_blocks=num_blocks, enable_chunked_prefill=False, max_num_batched_tokens=4096,
               scheduler_policy=policy, dtype=torch.float32)


def load_modeled_llm(policy=None, max_num_seqs: int = 8, chip: str = "H100", model: str = "llama-3-8b",
                     threads: int = 1):
    """load_llm on the modeled GPU clock (reference_engine/sim/gpu_model.py): the engine still computes real
    tokens with the shipped model on this machine, but every timestamp (and StepStats.wall_time) is the time
    the same step would take for `model`'s shape on `chip` (an estimate, not a measurement). The scheduler
    sees that GPU's KV capacity in blocks, capped at gpu_model.DEFAULT_MAX_BLOCKS (65,536 tokens: more than
    the lesson's workloads hold at once) so that the small model's real cache stays small in RAM."""
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
               enable_chunked_prefill=False, max_num_batched_tokens=4096, scheduler_policy=policy,
               dtype=torch.float32, **kw)


def trace_workload(n: int, seed: int = 0, max_context: int = 256, trace: str = "conv"):
    """n consecutive Azure LLM inference 2023 requests, sizes scaled into max_context tokens:
    (trace requests, random prompt token ids of each prompt length)."""
    from reference_engine.sim import trace as tr

    reqs = tr.scale_to_context(tr.sample(n, seed=seed, trace=trace), max_context)
    return reqs, tr.prompt_token_ids(reqs, vocab_size=2048, seed=seed, exclude=(0,))


def run_engine(llm, prompts: Sequence[list[int]], output_lens: Sequence[int]) -> dict:
    """Run every prompt (all arriving at once), greedy, exactly output_lens[i] tokens each.

    Returns tokens (per request), steps, wall_s, output_tokens, tok_per_s and slots_used per step
    (sequences that produced a token: decodes + prefills)."""
    from reference_engine import SamplingParams

    eng = llm.engine
    first = len(eng.step_stats)
    params = [SamplingParams(temperature=0, max_tokens=int(n), ignore_eos=True) for n in output_lens]
    start = time.perf_counter()
    outs = llm.generate(list(prompts), params)
    wall = time.perf_counter() - start
    stats = eng.step_stats[first:]
    tokens = sum(len(o.token_ids) for o in outs)
    return {"tokens": [o.token_ids for o in outs], "steps": len(stats), "wall_s": wall,
            "output_tokens": tokens, "tok_per_s": tokens / wall,
            "slots_used": [s.num_decode_seqs + s.num_prefill_seqs for s in stats]}
