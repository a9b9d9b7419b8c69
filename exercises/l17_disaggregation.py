# Lesson 17 exercises: replace each `raise NotImplementedError` with your code.
# Check your work with `course check 17`. (Generated from solutions/l17_disaggregation.py by
# `course sync`; keep the names and signatures.)
"""Lesson 17: disaggregated prefill and decode.

One GPU that serves both phases makes every running decode wait whenever a prompt is prefilled next to it
(chunked prefill bounds the wait per step, it does not remove it). Disaggregation gives prompts to a prefill
pool and generation to a decode pool; the price is the KV cache of every prompt crossing the network. This
lesson counts those bytes, times them on a link, ships them for real (pack and unpack, plugged into the
engine's KV transfer), derives the link speed from which disaggregation wins, and sizes the two pools.

Conventions:
- Models are keys of reference_engine.sim.gpu_model.MODELS ("llama-3-8b", "llama-3-70b"), chips keys of
  gpu_model.CHIPS ("H100", "H200", "A100"); step times come from gpu_model.step_time (the modeled clock,
  its default per-step overhead included).
- Link speeds are in gigabits per second (1e9 bits/s), as network cards are sold; sizes in bytes.
- Paged KV caches have ModelRunner's layout [layers, num_blocks, block_size, kv_heads, head_dim], K and V
  apart; a packed buffer is [layers, 2, num_tokens, kv_heads, head_dim] with K at index 0 of dim 1.

The bottom of the file holds the replay harness the notebook uses (given, not an exercise).
"""
from __future__ import annotations

import math
import random

import torch

from reference_engine.sim import gpu_model as gm

MAX_DECODE_BATCH = 1024  # the largest decode batch plan_pools considers

# -- 1. what crosses the link ------------------------------------------------------------------------


def kv_transfer_bytes(prompt_len: int, num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype_bytes: int,
                      tp_prefill: int = 1, tp_decode: int = 1) -> int:
    """Exercise 1.1: bytes one request's prompt KV puts on the network, prefill pool to decode pool.

    Every layer holds a K and a V vector of head_dim elements per KV head per prompt token. Under tensor
    parallelism a rank holds num_kv_heads / tp heads when tp divides num_kv_heads; when tp is a multiple of
    num_kv_heads, each rank holds ONE head and every head is replicated on tp / num_kv_heads ranks (vLLM
    shards Llama this way). Any other tp is refused with ValueError, and so is a tp that is not a positive
    int (0, -8, 8.0: a GPU count is a whole number of GPUs).

    What is counted: every decode rank receives, over the network, the K and V of each head it holds, from a
    prefill rank that holds that head. So a head replicated on the decode side is sent once per replica
    (each GPU receives into its own memory), while a head replicated on the prefill side is still sent once
    per decode rank that needs it (the sender picks one replica). Total = 2 * layers * prompt_len *
    max(num_kv_heads, tp_decode) * head_dim * kv_dtype_bytes; tp_prefill only has to be valid.

    >>> kv_transfer_bytes(8192, 80, 8, 128, 2)                 # Llama-3-70B, 8k prompt, bf16: 2.68 GB
    2684354560
    >>> kv_transfer_bytes(8192, 80, 8, 128, 2, tp_decode=16)   # each head lands on two decode GPUs
    5368709120
    """
    raise NotImplementedError("Exercise 1.1 (kv_transfer_bytes): see section 1.1 of lessons/l17_disaggregation.ipynb")


def transfer_time(nbytes: float, bandwidth_gbps: float, latency_s: float = 0.0, num_messages: int = 1) -> float:
    """Exercise 1.2: seconds to move nbytes over a link of bandwidth_gbps gigabits per second (1e9 bits/s),
    sent as num_messages messages (one per layer, say) that each pay latency_s once (setup, completion
    notice), one after the other: nbytes * 8 / (bandwidth_gbps * 1e9) + num_messages * latency_s.

    >>> round(transfer_time(2684354560, 100), 4)   # the 70B / 8k prompt on 100 Gb/s
    0.2147
    """
    raise NotImplementedError("Exercise 1.2 (transfer_time): see section 1.2 of lessons/l17_disaggregation.ipynb")


# -- 2. pack and unpack ------------------------------------------------------------------------------


def pack_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: list[int], num_tokens: int) -> torch.Tensor:
    """Exercise 2.1: gather one sequence's KV from the paged caches into one contiguous buffer.

    k_cache, v_cache: [layers, num_blocks, block_size, kv_heads, head_dim] (any dtype; the engine passes
    uint8 views of float8 caches). Token p of the sequence sits in block block_table[p // block_size], slot
    p % block_size; the table may list the blocks in any order, and the last block used may be partial.
    Returns a new contiguous tensor [layers, 2, num_tokens, kv_heads, head_dim] of the caches' dtype:
    out[l, 0, p] is layer l's K of token p, out[l, 1, p] its V. The caches are not changed.
    """
    raise NotImplementedError("Exercise 2.1 (pack_kv): see section 2.1 of lessons/l17_disaggregation.ipynb")


def unpack_kv(buf: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: list[int]) -> None:
    """Exercise 2.2: the inverse, on the receiving side: write a pack_kv buffer [layers, 2, num_tokens,
    kv_heads, head_dim] into k_cache and v_cache (in place) at the blocks of block_table, token p into block
    block_table[p // block_size], slot p % block_size. Slots of the last block past num_tokens, and every
    other block, keep what they held. Returns None.
    """
    raise NotImplementedError("Exercise 2.2 (unpack_kv): see section 2.2 of lessons/l17_disaggregation.ipynb")


# -- 3. the break-even -------------------------------------------------------------------------------


def prefill_stall(model: str, chip: str, prompt_len: int, chunk: int, batch: int, context: int, tp: int = 1) -> float:
    """Exercise 3.1: seconds a colocated engine with chunked prefill adds to its running decodes' token gaps
    while it prefills one prompt of prompt_len tokens.

    The prompt goes in chunks of `chunk` tokens (the last one shorter if chunk does not divide prompt_len),
    one chunk per step, each riding with `batch` decode tokens at `context` cached tokens each. Chunk i starts
    after i * chunk prompt tokens are cached (its chunk_context). Each such step takes longer than the same
    decode step alone; the stall is the sum over the chunks of
        step_time(decodes + chunk i) - step_time(decodes alone),
    both from gm.step_time(gm.MODELS[model], gm.CHIPS[chip], Composition, tp=tp) (.time_s), with
    gm.Composition.decode_batch(batch, context, chunk=..., chunk_context=...).
    """
    raise NotImplementedError("Exercise 3.1 (prefill_stall): see section 3.1 of lessons/l17_disaggregation.ipynb")


def break_even_gbps(model: str, chip: str, prompt_len: int, chunk: int, batch: int, context: int,
                    latency_s: float = 0.0, tp: int = 1) -> float:
    """Exercise 3.2: the link bandwidth (Gb/s) from which shipping a prompt's KV costs less time than
    prefilling it next to the decodes.

    Colocated, the prompt stalls every running decode by prefill_stall(...) seconds. Disaggregated, no decode
    waits for it; the prompt's own request waits transfer_time(bytes, bw, latency_s) for its KV, bytes being
    kv_transfer_bytes of the model's shape (layers, kv_heads, head_dim, kv_bytes of gm.MODELS[model]) with
    tp on both sides, sent as one message. Break-even: the bandwidth at which the two are equal; any faster
    link makes the transfer the smaller delay. Returns float("inf") when the latency alone is at least the
    stall (no bandwidth is enough).
    """
    raise NotImplementedError("Exercise 3.2 (break_even_gbps): see section 3.2 of lessons/l17_disaggregation.ipynb")


# -- 4. sizing the pools ---------------------------------------------------------------------------------


def plan_pools(model: str, chip: str, rate_rps: float, prompt_len: int, output_len: int, ttft_slo_s: float,
               tpot_slo_s: float, tp: int = 1, transfer_s: float = 0.0) -> dict:
    """Exercise 4.1: how many prefill and how many decode instances (each tp GPUs) serve rate_rps requests of
    prompt_len prompt and output_len output tokens (output_len >= 2) within both SLOs, as DistServe sizes
    them: each pool alone, from one instance's rate.

    Prefill instance: one prompt per step (a long prompt already fills the GPU's compute; batching prompts
    adds nothing), t_p = step_time of Composition(prefills=((prompt_len, 0),)). Arrivals are random, so
    prompts queue: as an M/D/1 queue its mean TTFT is t_p + rho * t_p / (2 * (1 - rho)) at load rho = rate *
    t_p. The TTFT left to it is ttft_slo_s - transfer_s (the KV still has to travel); with x = that / t_p,
    the largest load meeting it is rho = 2 (x - 1) / (2 x - 1): prefill_rps = rho / t_p.
    Decode instance: the largest batch B <= MAX_DECODE_BATCH whose decode step
    (Composition.decode_batch(B, context)) takes <= tpot_slo_s, at the mean context of a generating request,
    context = prompt_len + output_len // 2, and whose B full requests (prompt_len + output_len tokens each)
    fit the instance's KV cache (gm.kv_capacity(shape, chip, tp=tp)["tokens"]). Each request spends
    output_len - 1 steps there (the prefill instance sampled the first token): decode_rps = B /
    ((output_len - 1) * step time).
    Returns {"n_prefill", "n_decode" (ceil(rate / per-instance rate) each), "prefill_rps", "decode_rps",
    "decode_batch", "prefill_s" (t_p), "decode_step_s" (the chosen B's step, <= tpot_slo_s)}. ValueError when
    an SLO cannot be met by any load (TTFT budget <= t_p, equality included: x = 1 allows no load; or not even
    B = 1 within TPOT and memory).
    """
    raise NotImplementedError("Exercise 4.1 (plan_pools): see section 4.1 of lessons/l17_disaggregation.ipynb")


# -- the prefill pool's tail (given) ---------------------------------------------------------------


def prefill_pool_ttft(prefill_s: float, rate_rps: float, n_instances: int, n: int = 20_000, seed: int = 0,
                      transfer_s: float = 0.0, shared_queue: bool = False) -> list[float]:
    """TTFT samples (seconds) of a prefill pool as plan_pools models it, simulated so that its percentiles can be
    read, not only its mean: Poisson arrivals at rate_rps (seeded), each request sent to one of n_instances at
    random (so each instance sees Poisson arrivals at rate_rps / n_instances), served first come first served,
    one prompt at a time, in prefill_s each (an M/D/1 queue per instance); its KV then travels for transfer_s.
    TTFT = queueing + prefill_s + transfer_s, for each of n requests. shared_queue=True: one queue for the pool
    instead, each request taken by the instance that frees first (an M/D/c queue)."""
    rng = random.Random(seed)
    free_at = [0.0] * n_instances
    now, out = 0.0, []
    for _ in range(n):
        now += rng.expovariate(rate_rps)
        pick = rng.randrange(n_instances)  # drawn either way: both dispatches see the same arrivals
        i = min(range(n_instances), key=free_at.__getitem__) if shared_queue else pick
        free_at[i] = max(now, free_at[i]) + prefill_s
        out.append(free_at[i] - now + transfer_s)
    return out


# -- the replay harness (given) ----------------------------------------------------------------------


def workload(n: int = 300, rps: float = 4.0, seed: int = 0, trace: str = "conv", max_context: int = 8192):
    """n consecutive requests of the Azure LLM inference trace 2023 (Splitwise, ISCA 2024), arrivals stretched
    to `rps` (burstiness kept), sizes kept (only a request longer than max_context is shrunk to it), with
    seeded prompts: (requests, prompt ids). For the timing-only engines below, which lift the shipped model's
    512-token limit."""
    from reference_engine.sim import trace as tr

    reqs = tr.with_rate(tr.scale_to_context(tr.sample(n, seed=seed, trace=trace), max_context), rps)
    return reqs, tr.prompt_token_ids(reqs, vocab_size=2048, seed=seed, exclude=(0,))


def modeled_engine(model: str = "llama-3-8b", chip: str = "H100", max_num_seqs: int = 64,
                   max_num_batched_tokens: int = 512):
    """A timing-only LLMEngine whose clock is `model` on `chip` (gpu_model.ModeledClock), chunked prefill with
    max_num_batched_tokens per step. The forward is skipped (faults.skip_forward): the schedule, and so every
    modeled timestamp, is what the full engine would produce, and since the shipped model never runs, its
    512-position limit is lifted to what the KV blocks hold, so the trace's real lengths are scheduled and
    priced."""
    import warnings

    from reference_engine.engine import LLMEngine
    from reference_engine.shipped import TARGET
    from reference_engine.sim.faults import skip_forward

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # engine_kwargs warns when it caps the block count: intended
        kw = gm.engine_kwargs(gm.MODELS[model], gm.CHIPS[chip])
    engine = LLMEngine(str(TARGET), dtype=torch.float32, kv_cache_dtype="fp8",
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, **kw)
    skip_forward(engine)
    engine.max_model_len = engine.max_seq_len = engine.num_blocks * engine.block_size
    return engine


def request_latencies(arrival: float, token_times: list[float]) -> dict:
    """TTFT, TPOT and the inter-token gaps of one request (lesson 05's definitions)."""
    gaps = [b - a for a, b in zip(token_times, token_times[1:])]
    tpot = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else 0.0
    return {"ttft": token_times[0] - arrival, "tpot": tpot, "itl": gaps}


def summarize(rows: list[dict], ttft_slo_s: float, tpot_slo_s: float) -> dict:
    """p50/p99 TTFT and ITL, and goodput (requests meeting both SLOs per second of the run, DistServe)."""
    import numpy as np

    ttft = np.array([r["ttft"] for r in rows])
    itl = np.array([g for r in rows for g in r["itl"]] or [0.0])
    met = sum(r["ttft"] <= ttft_slo_s and r["tpot"] <= tpot_slo_s for r in rows)
    span = max(r["end"] for r in rows) - min(r["arrival"] for r in rows)
    return {"ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
            "itl_p50": float(np.percentile(itl, 50)), "itl_p99": float(np.percentile(itl, 99)),
            "attainment": met / len(rows), "goodput_rps": met / span}


def replay_colocated(requests, prompts, gpus: int = 2, **engine_kw) -> list[dict]:
    """`gpus` colocated replicas (chunked prefill), requests dealt round robin, each replayed on its own
    modeled clock. Per request: arrival, ttft, tpot, itl, end."""
    from reference_engine.sim.replay import replay
    from reference_engine.sim.trace import rebase

    rows: list[dict | None] = [None] * len(requests)
    for g in range(gpus):
        idx = list(range(g, len(requests), gpus))
        mine = [requests[i] for i in idx]
        offset = mine[0].arrival
        outs, t0, _ = replay(modeled_engine(**engine_kw), rebase(mine), [prompts[i] for i in idx])
        for i, out in zip(idx, outs):
            times = [t - t0 + offset for t in out.metrics.token_times]
            rows[i] = {"arrival": requests[i].arrival, **request_latencies(requests[i].arrival, times), "end": times[-1]}
    return rows


def replay_disagg(requests, prompts, n_prefill: int = 1, n_decode: int = 1, gbps: float = 100.0,
                  latency_s: float = 0.0, model: str = "llama-3-8b", **engine_kw) -> list[dict]:
    """A prefill pool of n_prefill and a decode pool of n_decode instances (one GPU each), the KV of each prompt
    taking transfer_time(kv_transfer_bytes(prompt of the modeled model), gbps, latency_s) between them
    (reference_engine.disagg.replay_disaggregated). Per request: arrival, ttft, tpot, itl, end."""
    from reference_engine.disagg import replay_disaggregated

    s = gm.MODELS[model]

    def shipping(n: int) -> float:
        return transfer_time(kv_transfer_bytes(n, s.layers, s.kv_heads, s.head_dim, s.kv_bytes), gbps, latency_s)

    prefill = [modeled_engine(model, **engine_kw) for _ in range(n_prefill)]
    decode = [modeled_engine(model, **engine_kw) for _ in range(n_decode)]
    out = replay_disaggregated(prefill, decode, requests, prompts, shipping)
    return [{"arrival": o["arrival"], **request_latencies(o["arrival"], o["token_times"]), "end": o["token_times"][-1]}
            for o in out]
