"""Lesson 17 questions: the KV bytes a request ships between pools, their time on a link, the modeled prefill
stall of a colocated engine, the break-even link speed, the prefill:decode pool ratio, and a prefill pool sized for
its p99 TTFT rather than its mean."""
from __future__ import annotations

import math

from reference_engine.sim import gpu_model as gm

from .pools import GB, pick
from .question import Numeric, Open, fmt, template

STEM = "l17_disaggregation"
_KEYS = {gm.LLAMA_3_8B: "llama-3-8b", gm.LLAMA_3_70B: "llama-3-70b"}


def _bytes(ref, shape, prompt: int, kv_bytes: int, tp_p: int = 1, tp_d: int = 1) -> int:
    return ref.kv_transfer_bytes(prompt, shape.layers, shape.kv_heads, shape.head_dim, kv_bytes, tp_p, tp_d)


@template(STEM, "KV bytes a request ships")
def kv_bytes(rng, ref):
    shape = pick(rng, [gm.LLAMA_3_8B, gm.LLAMA_3_70B])
    prompt = pick(rng, [2048, 4096, 6000, 8192, 32768])
    kv_bytes = pick(rng, [2, 1])
    q = _bytes_q(ref, shape, prompt, kv_bytes, 1)
    q.follow_ups.append(_bytes_q(ref, shape, prompt, kv_bytes, 16))
    return q


def _bytes_q(ref, shape, prompt: int, kv_bytes: int, tp_d: int) -> Numeric:
    n = _bytes(ref, shape, prompt, kv_bytes, 8 if tp_d > 1 else 1, tp_d)
    plain = _bytes(ref, shape, prompt, kv_bytes)
    where = "" if tp_d == 1 else (f" The prefill pool runs TP 8, the decode pool TP {tp_d}: with {shape.kv_heads} KV heads, "
                                  f"each head lives on {tp_d // shape.kv_heads} decode GPUs.")
    dtype = {2: "bf16", 1: "fp8"}[kv_bytes]
    return Numeric(f"{shape.name} ({shape.layers} layers, {shape.kv_heads} KV heads of {shape.head_dim}), {dtype} KV cache, a "
                   f"{fmt(prompt)}-token prompt is prefilled on one pool and decoded on another.{where} How many GB "
                   "(1e9 bytes) of KV cross the network for this request?", "GB", n / GB,
                   [f"per token: 2 x {shape.layers} x {shape.kv_heads} x {shape.head_dim} x {kv_bytes} bytes = "
                    f"{fmt(plain // prompt)} bytes", f"x {fmt(prompt)} tokens = {fmt(plain / GB)} GB"]
                   + ([f"each decode GPU receives its own copy of its head: x {tp_d // shape.kv_heads} = {fmt(n / GB)} GB"]
                      if tp_d > shape.kv_heads else []),
                   "Bytes per token are fixed by the model; replicas on the receiving side multiply them.",
                   mistakes={"counts only K": n / 2 / GB, "counts one decode GPU's share": n / tp_d / GB})


@template(STEM, "transfer time on a link")
def link_time(rng, ref):
    shape = pick(rng, [gm.LLAMA_3_8B, gm.LLAMA_3_70B])
    prompt = pick(rng, [4096, 8192, 16384])
    gbps = pick(rng, [100, 200])
    q = _time_q(ref, shape, prompt, gbps)
    q.follow_ups.append(_time_q(ref, shape, prompt, 400))
    return q


def _time_q(ref, shape, prompt: int, gbps: int) -> Numeric:
    n = _bytes(ref, shape, prompt, 2)
    t = ref.transfer_time(n, gbps)
    return Numeric(f"{shape.name}, a {fmt(prompt)}-token prompt, bf16 KV ({fmt(n / GB)} GB). How many milliseconds does "
                   f"its KV take on a {gbps} Gb/s link (bandwidth only)?", "ms", t * 1e3,
                   [f"{gbps} Gb/s = {fmt(gbps / 8)} GB/s", f"{fmt(n / GB)} GB / {fmt(gbps / 8)} GB/s = {fmt(t * 1e3)} ms"],
                   "Network links are sold in bits per second: divide by 8 for bytes.",
                   mistakes={"reads Gb/s as GB/s": t * 1e3 / 8})


@template(STEM, "modeled prefill stall")
def stall(rng, ref):
    shape = pick(rng, [gm.LLAMA_3_8B, gm.LLAMA_3_70B])
    tp = 1 if shape is gm.LLAMA_3_8B else pick(rng, [4, 8])
    prompt, batch = pick(rng, [4096, 8192]), pick(rng, [32, 64, 128])
    q = _stall_q(ref, shape, tp, prompt, 512, batch)
    q.follow_ups.append(_stall_q(ref, shape, tp, prompt, 2048, batch))
    return q


def _stall_q(ref, shape, tp: int, prompt: int, chunk: int, batch: int) -> Numeric:
    s = ref.prefill_stall(_KEYS[shape], "H100", prompt, chunk, batch, 2048, tp)
    alone = gm.step_time(shape, gm.H100, gm.Composition.decode_batch(batch, 2048), tp=tp).time_s
    n = -(-prompt // chunk)
    return Numeric(f"{shape.name} on {tp} x H100 (TP {tp}), colocated with chunked prefill of {chunk} tokens a step, "
                   f"{batch} requests decoding at a 2048-token context. A {fmt(prompt)}-token prompt arrives. On the "
                   "course's modeled clock, how many milliseconds does its prefill add, in total, to each running "
                   "request's token gaps?", "ms", s * 1e3,
                   [f"decode step alone: {fmt(alone * 1e3)} ms", f"{n} chunks, each step longer by what the chunk adds",
                    f"sum over chunks: {fmt(s * 1e3)} ms"],
                   "Chunking bounds each step, not the total: the prompt's compute lands on the decodes either way.",
                   rtol=0.05, mistakes={"counts the whole mixed steps": (s + n * alone) * 1e3})


@template(STEM, "break-even link speed")
def break_even(rng, ref):
    shape = pick(rng, [gm.LLAMA_3_8B, gm.LLAMA_3_70B])
    tp = 1 if shape is gm.LLAMA_3_8B else pick(rng, [4, 8])
    batch = pick(rng, [32, 64, 128, 256])
    q = _break_q(ref, shape, tp, batch, 0.0)
    q.follow_ups.append(_break_q(ref, shape, tp, batch, 2e-3))
    return q


def _break_q(ref, shape, tp: int, batch: int, lat: float) -> Numeric:
    key = _KEYS[shape]
    bw = ref.break_even_gbps(key, "H100", 8192, 512, batch, 2048, lat, tp)
    s = ref.prefill_stall(key, "H100", 8192, 512, batch, 2048, tp)
    n = _bytes(ref, shape, 8192, 2, tp, tp)
    return Numeric(f"{shape.name} on {tp} x H100, chunks of 512 tokens, {batch} decodes at a 2048-token context, an "
                   f"8192-token prompt, {fmt(lat * 1e3)} ms latency per transfer. From what link speed (Gb/s) does "
                   "shipping its KV to a decode pool cost less time than the stall its prefill causes colocated "
                   "(modeled clock)?", "Gb/s", bw,
                   [f"stall (modeled): {fmt(s * 1e3)} ms", f"bytes: {fmt(n / GB)} GB",
                    f"bandwidth = {fmt(n / GB)} GB x 8 / ({fmt(s * 1e3)} - {fmt(lat * 1e3)}) ms = {fmt(bw)} Gb/s"],
                   "Both grow with the prompt, so the break-even is nearly a property of model and GPU.",
                   rtol=0.05, mistakes={"answers in GB/s": bw / 8})


@template(STEM, "prefill and decode instance rates")
def pools(rng, ref):
    prompt, out = pick(rng, [(8192, 256), (8192, 512), (4096, 512), (2048, 128)])
    rate = pick(rng, [2.0, 4.0, 8.0, 16.0])
    plan = ref.plan_pools("llama-3-70b", "H100", rate, prompt, out, 1.5, 0.08, 4, 0.0)
    q = _prefill_rate_q(plan, rate, prompt, out)
    q.follow_ups.append(_decode_rate_q(plan, rate, prompt, out))
    return q


def _setting(rate: float, prompt: int, out: int) -> str:
    return (f"Llama-3-70B, instances of 4 x H100, {fmt(rate)} req/s of {fmt(prompt)} prompt / {fmt(out)} output tokens, "
            "TTFT SLO 1.5 s (mean), TPOT SLO 80 ms, each pool sized alone on the course's modeled clock.")


def _prefill_rate_q(plan: dict, rate: float, prompt: int, out: int) -> Numeric:
    t_p, lam = plan["prefill_s"], plan["prefill_rps"]
    x = 1.5 / t_p
    return Numeric(f"{_setting(rate, prompt, out)} A prefill instance takes {fmt(t_p * 1e3)} ms per prompt and arrivals "
                   "are Poisson (an M/D/1 queue). How many requests per second can one prefill instance take while its "
                   "mean TTFT stays within the SLO?", "req/s", lam,
                   [f"x = SLO / t_p = {fmt(x)}", f"mean TTFT = t_p + rho t_p / (2 (1 - rho)) <= SLO gives rho <= "
                    f"2 (x - 1) / (2 x - 1) = {fmt(lam * t_p)}", f"rate = rho / t_p = {fmt(lam)} req/s -> "
                    f"{plan['n_prefill']} prefill instance(s) for {fmt(rate)} req/s"],
                   "Random arrivals queue: a prefill instance run near 100% load blows the TTFT SLO.",
                   rtol=0.02, mistakes={"ignores queueing (loads it to 100%)": 1 / t_p})


def _decode_rate_q(plan: dict, rate: float, prompt: int, out: int) -> Numeric:
    b, st, mu = plan["decode_batch"], plan["decode_step_s"], plan["decode_rps"]
    return Numeric(f"{_setting(rate, prompt, out)} The largest decode batch within the TPOT SLO and the KV memory is "
                   f"{b}, at {fmt(st * 1e3)} ms a step. How many requests per second does one decode instance finish "
                   "(the first token came from the prefill instance)?", "req/s", mu,
                   [f"each request spends {out - 1} decode steps", f"{b} / ({out - 1} x {fmt(st * 1e3)} ms) = {fmt(mu)} req/s",
                    f"-> {plan['n_decode']} decode instance(s) for {fmt(rate)} req/s: ratio {plan['n_prefill']} : "
                    f"{plan['n_decode']}"],
                   "Long prompts with short answers want prefill GPUs; short prompts with long answers want decode GPUs.",
                   rtol=0.02, mistakes={"counts output_len decode steps": b / (out * st)})


@template(STEM, "prefill pool sized for the p99")
def tail_pool(rng, ref):
    shape, prompt = pick(rng, [gm.LLAMA_3_8B, gm.LLAMA_3_70B]), pick(rng, [1024, 2048, 3072, 4096, 8192])
    tp = 1 if shape is gm.LLAMA_3_8B else 4
    t_p = ref.plan_pools(_KEYS[shape], "H100", 1.0, prompt, 256, 100.0, 0.1, tp, 0.0)["prefill_s"]
    slo = pick(rng, [x for x in (0.5, 1.0, 1.5, 2.0, 3.0, 5.0) if x >= 6 * t_p])
    mu, tail = 1 / t_p, math.log(100)
    lam_mean, lam_p99 = mu - 1 / slo, mu - tail / slo
    assert lam_p99 > 0, (prompt, slo, t_p)
    rate = round(rng.uniform(2.2, 6.0) * lam_mean, 1)  # a few instances' worth
    setting = (f"{shape.name} on {tp} x H100, {fmt(prompt)}-token prompts; a prefill instance takes {fmt(t_p * 1e3)} ms per "
               "prompt (modeled H100 clock). Model each prefill instance as an M/M/1 queue (Poisson arrivals, "
               "exponential service of that mean), so a request's time in it is exponential with mean 1 / (mu - lambda).")
    q = Numeric(
        f"{setting} The instance is loaded so that its MEAN TTFT equals the {fmt(slo)} s SLO. What is its p99 TTFT, in s?",
        "s", tail * slo,
        [f"mean = 1 / (mu - lambda) = {fmt(slo)} s at that load",
         "an exponential's p-quantile is -ln(1 - p) x its mean: p99 = ln(100) x mean = 4.61 x mean",
         f"p99 = 4.61 x {fmt(slo)} = {fmt(tail * slo)} s"],
        "A queue's tail is a multiple of its mean: sizing on the mean misses a percentile SLO.", rtol=0.02,
        mistakes={"takes the p99 to be the mean": slo,
                  "uses -ln(0.99) (the 1st percentile) instead of -ln(0.01)": -math.log(0.99) * slo,
                  "uses the normal distribution's 2.33 standard deviations above the mean": slo + 2.33 * slo})
    q.follow_ups.append(Numeric(
        f"Size it for the p99 instead: the largest arrival rate one instance takes with p99 TTFT <= {fmt(slo)} s, in "
        "req/s?", "req/s", lam_p99,
        [f"mu = 1 / {fmt(t_p * 1e3)} ms = {fmt(mu)} req/s",
         f"p99 = ln(100) / (mu - lambda) <= {fmt(slo)} s gives lambda <= mu - 4.61 / {fmt(slo)} = {fmt(lam_p99)} req/s",
         f"(sized on the mean: mu - 1 / {fmt(slo)} = {fmt(lam_mean)} req/s)"],
        "The tail bound leaves the instance idle more often: that idle time is what keeps the p99 short.", rtol=0.02,
        mistakes={"sizes on the mean TTFT (lambda = mu - 1 / SLO)": lam_mean,
                  "loads the instance to 100% (lambda = mu)": mu}))
    n_p99, n_mean = math.ceil(rate / lam_p99), math.ceil(rate / lam_mean)
    q.follow_ups.append(Numeric(
        f"The service receives {fmt(rate)} req/s, split evenly at random over the prefill instances. How many instances "
        "keep the p99 TTFT within the SLO?", "instances", n_p99,
        [f"ceil({fmt(rate)} / {fmt(lam_p99)}) = {n_p99} instances",
         f"sized on the mean it would be ceil({fmt(rate)} / {fmt(lam_mean)}) = {n_mean}"],
        "Size pools on the percentile the SLO names; a shared queue (first free instance) needs fewer than random "
        "dispatch.", rtol=0,
        mistakes={"sizes on the mean TTFT": n_mean, "loads each instance to 100%": math.ceil(rate / mu)}))
    return q


@template(STEM, "should we disaggregate")
def should_we(rng, ref):
    return Open(
        "Your team wants to split prefill and decode onto separate pools. What would you measure first, what "
        "does it cost, and when would you say no?",
        ["the symptom: ITL/TPOT tail spikes when long prompts arrive (prefill interference), not plain overload",
         "cost: every request's KV over the network, 2 x layers x KV heads x head_dim x bytes per token (320 KiB for "
         "Llama-3-70B bf16); 8k tokens = 2.7 GB, ~215 ms at 100 Gb/s, ~54 ms at 400 Gb/s",
         "break-even: transfer time vs the stall the prefill causes; overlap the transfer with prefill layer by layer",
         "size pools per SLO (DistServe): prefill for TTFT with queueing, decode for TPOT within KV memory",
         "no for short prompts, small fleets, slow links, or when a colocated engine with chunked prefill meets the SLO",
         "DistServe (OSDI 2024) up to 7.4x goodput; Splitwise (ISCA 2024) up to 1.4x throughput at 20% lower cost"],
        "Disaggregation trades network bytes for decode isolation; it pays when the stall costs more than the bytes.")
