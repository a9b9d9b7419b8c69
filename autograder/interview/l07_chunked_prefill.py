"""Lesson 07 questions: the stall of an unchunked prompt, step times, a step's plan, a short request behind a long
prompt (FCFS chunking against vLLM's partial-prefill controls), the budget for an ITL SLO, and the stall vLLM's
default budget allows."""
from __future__ import annotations

import math
from types import SimpleNamespace

from .pools import pick
from .question import Numeric, Open, fmt, template

STEM = "l07_chunked_prefill"


def random_cost(rng) -> dict:
    """A linear step-cost model of the size a 7-8B model has on one GPU (overhead ~ a decode step's weight read)."""
    return {"overhead_s": round(rng.uniform(3, 8), 1) * 1e-3, "per_token_s": rng.randrange(20, 81, 5) * 1e-6,
            "per_attn_s": pick(rng, [0.5, 1.0, 2.0]) * 1e-9}


def cost_text(c: dict) -> str:
    return (f"a step costs {c['overhead_s'] * 1e3:g} ms + {c['per_token_s'] * 1e6:g} us per token computed + "
            f"{c['per_attn_s'] * 1e9:g} ns per (query token, key) pair attended")


@template(STEM, "step time")
def step(rng, ref):
    c = random_cost(rng)
    d, ctx, chunk = pick(rng, [8, 16, 32, 64]), rng.randrange(500, 4001, 100), pick(rng, [256, 512, 1024])
    start = chunk * rng.randrange(2, 10)

    def ask(s, prompt):
        t = ref.step_time(c, d, ctx, chunk, s)
        pairs = chunk * s + chunk * (chunk + 1) // 2
        return Numeric(
            prompt, "ms", t * 1e3,
            [f"tokens: {d} decodes + {chunk} prompt tokens = {d + chunk}: {fmt((d + chunk) * c['per_token_s'] * 1e3)} ms",
             f"pairs: decodes {d} x {ctx:,}; the chunk's tokens at positions {s:,}..{s + chunk - 1:,} see p + 1 keys each: "
             f"{fmt(pairs)}; total {fmt(d * ctx + pairs)} pairs: {fmt((d * ctx + pairs) * c['per_attn_s'] * 1e3)} ms",
             f"+ overhead {c['overhead_s'] * 1e3:g} ms = {fmt(t * 1e3)} ms"],
            "A chunk late in a long prompt costs more than an early one: its tokens attend to everything before them.",
            rtol=0.01, mistakes={"forgets that the chunk attends to the earlier chunks": ref.step_time(c, d, ctx, chunk, 0) * 1e3,
                      "forgets the decode tokens in the step": ref.step_time(c, 0, 0, chunk, s) * 1e3})

    q = ask(start, f"Cost model: {cost_text(c)}. One step holds {d} decode tokens (each attending {ctx:,} cached tokens) "
                   f"and a prefill chunk of {chunk} prompt tokens at positions {start:,} to {start + chunk - 1:,}. Its time?")
    last = 20_000 - chunk
    q.follow_ups.append(ask(last, f"Now the chunk is the last one of a 20,000-token prompt (positions {last:,} on): its step time?"))
    return q


@template(STEM, "stall of an unchunked prompt")
def stall(rng, ref):
    c = random_cost(rng)
    d, ctx, p = pick(rng, [16, 32, 64]), rng.randrange(500, 3001, 100), rng.randrange(4000, 12001, 500)

    def ask(n, prompt):
        t = ref.step_time(c, d, ctx, n, 0)
        return Numeric(
            prompt, "ms", t * 1e3,
            [f"one step holds the whole prompt: {n:,} + {d} tokens x {c['per_token_s'] * 1e6:g} us = "
             f"{fmt((n + d) * c['per_token_s'] * 1e3)} ms",
             f"attention: the prompt's causal pairs n(n + 1)/2 = {fmt(n * (n + 1) // 2)} plus the decodes' {fmt(d * ctx)}: "
             f"{fmt((n * (n + 1) // 2 + d * ctx) * c['per_attn_s'] * 1e3)} ms",
             f"+ overhead: {fmt(t * 1e3)} ms, during which no stream gets a token"],
            "Without chunking one prompt's prefill is one step, and every decode stream waits for the whole of it.",
            rtol=0.01, mistakes={"forgets the attention term": ref.step_time({**c, "per_attn_s": 0.0}, d, ctx, n, 0) * 1e3,
                                 "counts every (query, key) pair, not the causal half":
                                 ref.step_time({**c, "per_attn_s": 2 * c["per_attn_s"]}, d, ctx // 2, n, 0) * 1e3})

    q = ask(p, f"Cost model: {cost_text(c)}. {d} streams are decoding (each at {ctx:,} cached tokens) when a {p:,}-token "
               "prompt arrives, and the engine prefills it in one step with the decodes. How long do the streams wait "
               "for their next token?")
    q.follow_ups.append(ask(20_000, "Now the prompt is 20,000 tokens: the stall?"))
    q.follow_ups[0].why = "The stall grows faster than the prompt: attention adds a quadratic term."
    return q


def prefill_steps(ref, d: int, prompt: int, budget: int) -> int:
    """Steps to prefill `prompt` tokens with `d` decodes riding along, each step planned by plan_step."""
    decodes, done, steps = [f"d{i}" for i in range(d)], 0, 0
    while done < prompt:
        plan = dict(ref.plan_step(decodes, [{"id": "p", "prompt_len": prompt, "computed": done, "arrival": 0.0}], budget))
        done, steps = done + plan["p"], steps + 1
    return steps


@template(STEM, "steps to prefill under a budget")
def chunk_steps(rng, ref):
    while True:  # an instance where forgetting the decodes changes the count
        d, p, budget = pick(rng, [16, 32, 64, 128]), rng.randrange(2000, 20001, 250), pick(rng, [256, 512, 1024])
        if budget > 2 * d and math.ceil(p / (budget - d)) != math.ceil(p / budget):
            break

    def ask(b, prompt):
        n = prefill_steps(ref, d, p, b)
        return Numeric(
            prompt, "steps", n,
            [f"each step: {d} decode tokens first, leaving {b} - {d} = {b - d} for the prompt",
             f"ceil({p:,} / {b - d}) = {n} steps"],
            "Decodes come first in every step; the prompt gets what the budget leaves.", rtol=0,
            mistakes={"forgets that the decode tokens spend the budget": prefill_steps(ref, 0, p, b)})

    q = ask(budget, f"A token budget of {budget} per step (decode tokens included, as vLLM's max_num_batched_tokens). "
                    f"{d} streams are decoding when a {p:,}-token prompt arrives. How many steps does its prefill take?")
    q.follow_ups.append(ask(2 * budget, f"Now the budget is {2 * budget}: how many steps?"))
    return q


@template(STEM, "a step's plan")
def plan(rng, ref):
    d = pick(rng, [2, 4, 8, 16])
    ids = ["a", "b", "c"]
    arrivals = rng.sample([round(0.1 * i, 1) for i in range(1, 60)], 3)
    while sorted(arrivals) == arrivals:
        rng.shuffle(arrivals)
    remaining = [rng.randrange(20, 400), rng.randrange(d + 50, 1500), rng.randrange(20, 1500)]
    by_arrival = sorted(range(3), key=lambda i: arrivals[i])
    first, target = by_arrival[0], by_arrival[1]
    rem = {by_arrival[k]: remaining[k] for k in range(3)}
    x = rng.randrange(1, rem[target] - d)
    budget = d + rem[first] + x
    queue = []
    for i in range(3):
        total = rem[i] + rng.randrange(0, 2000)
        queue.append({"id": ids[i], "prompt_len": total, "computed": total - rem[i], "arrival": arrivals[i]})
    decodes = [f"d{i}" for i in range(d)]

    def got(dec, qu):
        return dict(ref.plan_step(dec, qu, budget)).get(ids[target], 0)

    listed = [{**r, "arrival": float(i)} for i, r in enumerate(queue)]
    table = "; ".join(f"{r['id']}: arrived {r['arrival']:g} s, {r['prompt_len']:,} prompt tokens of which "
                      f"{r['computed']:,} are cached" for r in queue)
    ans = got(decodes, queue)
    return Numeric(
        f"Budget {budget} tokens per step; {d} running decodes. Prompts waiting, in queue order: {table}. With decodes "
        f"first and then prompt chunks first come first served, how many tokens does '{ids[target]}' get this step?",
        "tokens", ans,
        [f"decodes: {d} tokens; left {budget - d}",
         f"by arrival: {', '.join(ids[i] for i in by_arrival)}; '{ids[first]}' needs {rem[first]} more: it gets them; "
         f"left {budget - d - rem[first]}", f"'{ids[target]}' gets min({rem[target]}, {budget - d - rem[first]}) = {ans}"],
        "First come first served by arrival, whatever order the queue holds them in; a chunk takes what is left.",
        rtol=0, mistakes={"serves the queue in list order, not arrival order": got(decodes, listed),
                          "forgets the decode tokens": got([], queue)},
        follow_ups=[Numeric(
            f"Now the budget is {budget + rem[target]}: tokens for '{ids[target]}'?", "tokens",
            dict(ref.plan_step(decodes, queue, budget + rem[target])).get(ids[target], 0),
            [f"after the decodes and '{ids[first]}': {budget + rem[target] - d - rem[first]} left, more than its "
             f"{rem[target]} remaining: it finishes its prefill"],
            "A chunk never exceeds what the prompt has left: the rest of the budget flows to the next prompt.", rtol=0)])


class _Tokens:
    """A scheduler Budget for a question: tokens only (batch slots and KV blocks are no limit)."""

    def __init__(self, tokens: int):
        self.tokens, self.chunked_prefill = tokens, True

    def try_take(self, seq, n: int) -> bool:
        if not 0 < n <= min(self.tokens, seq.num_uncomputed_tokens):
            return False
        self.tokens -= n
        return True


def prefill_done_steps(policy, prompts: list[int], budget: int, decodes: int) -> list[int]:
    """The step in which each prompt's prefill ends (its first token), all arriving together while `decodes`
    streams decode (a fixed count), each step planned by `policy` (a SchedulerPolicy) on what they leave."""
    seqs = [SimpleNamespace(i=i, num_prompt_tokens=n, num_uncomputed_tokens=n, is_waiting=True, num_slots=1)
            for i, n in enumerate(prompts)]
    done, step = [None] * len(seqs), 0
    while None in done:
        step += 1
        started = [s for s in seqs if not s.is_waiting and s.num_uncomputed_tokens]
        for s, n in policy.schedule(started + [s for s in seqs if s.is_waiting], _Tokens(budget - decodes)):
            s.num_uncomputed_tokens, s.is_waiting = s.num_uncomputed_tokens - n, False
            if s.num_uncomputed_tokens == 0:
                done[s.i] = step
    return done


@template(STEM, "a short request behind a long prompt")
def behind_long(rng, ref):
    from reference_engine.scheduler import FCFSPolicy  # the engine's FCFS chunking: exercise 1.1's rule

    while True:  # a threshold the short request is under, leaving room for it beside the long prompt's chunk
        d, budget = pick(rng, [16, 32, 64]), pick(rng, [512, 1024, 2048])
        p, short = rng.randrange(4000, 20001, 250), rng.randrange(50, 301, 10)
        fits = [t for t in (128, 256, 512, 1024) if short <= t and t + short <= budget - d]
        if fits:
            threshold = pick(rng, fits)
            break
    fcfs = prefill_done_steps(FCFSPolicy(), [p, short], budget, d)
    capped = prefill_done_steps(ref.ChunkedPrefillPolicy(threshold, 1), [p, short], budget, d)
    share = budget - d
    return Numeric(
        f"A token budget of {budget} per step (decode tokens included), {d} streams decoding. A {p:,}-token prompt "
        f"arrives, and right behind it a {short}-token request. With plain FCFS chunking (decodes first, then prompt "
        "chunks oldest first), in which step does the short request get its first token? (Count the arrival step as "
        "step 1; keep the decode count fixed.)", "steps", fcfs[1],
        [f"each step: {d} decode tokens, leaving {budget} - {d} = {share} for prompts",
         f"the long prompt is first in line and takes all {share} until its last chunk: ceil({p:,} / {share}) = "
         f"{fcfs[0]} steps",
         f"the short request gets only what the long prompt's last chunk leaves: its prefill ends in step {fcfs[1]}"],
        "FCFS chunking makes a short request's TTFT hostage to the prompt in front of it (head-of-line blocking).",
        rtol=0, mistakes={"forgets that the decode tokens spend the budget": prefill_done_steps(
                              FCFSPolicy(), [p, short], budget + d, d)[1],
                          "lets the short request go first": 1},
        follow_ups=[
            Numeric(f"Now the scheduler runs with vLLM's long_prefill_token_threshold={threshold} and "
                    "(as V0's scheduler had it) max_long_partial_prefills=1: in which step does the short request get its first token?", "steps",
                    capped[1],
                    [f"the long prompt has more than {threshold} tokens to compute: it is long, and its chunk is capped "
                     f"at {threshold}", f"{share} - {threshold} = {share - threshold} tokens are left in the step: the "
                     f"{short}-token request (short: at most {threshold}) takes them: step {capped[1]}"],
                    "A chunk cap lets short prompts share every step with the long one instead of waiting for it.",
                    rtol=0, mistakes={"keeps FCFS order": fcfs[1]}),
            Numeric("And how many steps does the long prompt's prefill take now?", "steps", capped[0],
                    [f"at most {threshold} tokens a step: ceil({p:,} / {threshold}) = {capped[0]} steps, "
                     f"against {fcfs[0]} under FCFS"],
                    "The long prompt pays for the others' TTFT; past the GPU's knee its smaller steps are also cheaper, "
                    "so it loses less time than steps.", rtol=0,
                    mistakes={"divides by the budget's share, not the threshold": fcfs[0]})])


def first_chunk_budget(ref, c, slo, p, d, ctx) -> int | None:
    """The largest budget whose FIRST chunk meets the SLO (the mistake of ignoring the later chunks' attention)."""
    for b in range(d + p, d, -1):
        if ref.step_time(c, d, ctx, min(b - d, p), 0) <= slo:
            return b
    return None


@template(STEM, "budget for an ITL SLO")
def budget(rng, ref):
    while True:
        c = random_cost(rng)
        d, ctx, p = pick(rng, [16, 32, 64]), rng.randrange(500, 3001, 100), rng.randrange(1000, 3001, 100)
        base = ref.step_time(c, d, ctx, 0, 0)
        slo = round(base * rng.uniform(1.5, 3.5), 4)
        try:
            r = ref.choose_budget(c, slo, p, d, ctx)
        except ValueError:
            continue
        q = Numeric(
            f"Cost model: {cost_text(c)}. {d} streams decode at {ctx:,} cached tokens each; the ITL SLO is "
            f"{slo * 1e3:g} ms. A {p:,}-token prompt arrives. Largest token budget (decodes included) whose every step "
            "meets the SLO?", "tokens", r["budget"],
            [f"budget B gives the prompt B - {d} tokens a step, ceil({p:,} / (B - {d})) chunks",
             "each chunk's step time grows with its position (its tokens attend to the earlier chunks): the LAST one must "
             "meet the SLO", f"largest B with every step <= {slo * 1e3:g} ms: {r['budget']} "
             f"({r['num_steps']} steps, slowest {fmt(r['max_step_s'] * 1e3)} ms)"],
            "The budget trades TTFT against ITL: as large as the slowest step allows, because TTFT falls as it grows.",
            rtol=0.01, mistakes={"quotes the prompt's share, forgetting the decode tokens": r["budget"] - d,
                                 "holds only the first chunk to the SLO": first_chunk_budget(ref, c, slo, p, d, ctx)})
        if q.mistakes:
            break
    q.follow_ups.append(Numeric(
        "With that budget, the prompt's TTFT (it arrives at a step boundary)?", "ms", r["ttft_s"] * 1e3,
        [f"{r['num_steps']} steps, each computed by the cost model at its chunk's position: sum = {fmt(r['ttft_s'] * 1e3)} ms"],
        "Then check the TTFT against its own SLO: if it misses, no budget meets both and the fleet needs capacity.",
        rtol=0.01, mistakes={"counts one step per chunk at the first chunk's time": r["num_steps"] * ref.step_time(
            c, d, ctx, min(r["budget"] - d, p), 0) * 1e3}))
    return q


def chunk_steps_of(ref, c, d, ctx, p, chunk) -> list[float]:
    """Step times (s) of a p-token prompt prefilled in chunks of `chunk` tokens, d decodes riding along."""
    return [ref.step_time(c, d, ctx, min(chunk, p - s), s) for s in range(0, p, chunk)]


@template(STEM, "vLLM's default budget")
def vllm_default(rng, ref):
    """vLLM v0.33.0 defaults (vllm/engine/arg_utils.py get_batch_defaults; vllm/config/scheduler.py): chunked
    prefill on, max_num_batched_tokens 8192 for `vllm serve` on an H100, long_prefill_token_threshold 0 (no cap)."""
    c = random_cost(rng)
    d, ctx, p = pick(rng, [16, 32, 64]), rng.randrange(500, 3001, 100), rng.randrange(12000, 30001, 1000)
    budget, threshold = 8192, pick(rng, [512, 1024, 2048])
    share = budget - d
    times = chunk_steps_of(ref, c, d, ctx, p, share)
    worst = max(times)
    k = times.index(worst)
    capped = chunk_steps_of(ref, c, d, ctx, p, threshold)
    return Numeric(
        f"A server runs vLLM v0.33.0 on one H100 with its defaults: chunked prefill on, max_num_batched_tokens=8192 "
        f"(the `vllm serve` default on a GPU of 70 GiB or more that is not an A100), long_prefill_token_threshold=0. "
        f"Cost model: {cost_text(c)}. {d} streams decode at {ctx:,} cached tokens each when a {p:,}-token prompt "
        "arrives. How long is the worst step while it is prefilled (the longest gap every stream sees)?", "ms",
        worst * 1e3,
        ["threshold 0 means no chunk cap: the prompt takes all the budget the decodes leave",
         f"chunks of 8,192 - {d} = {share:,} tokens: {len(times)} steps",
         f"each step's time by the cost model at its chunk's position; the slowest is chunk {k + 1} "
         f"(positions {k * share:,}..{min(p, (k + 1) * share) - 1:,}): {fmt(worst * 1e3)} ms"],
        "By default only the budget bounds a step: a big budget is a big stall for every stream.",
        rtol=0.01, mistakes={
            "assumes a long_prefill_token_threshold of 4% of an 8k context (327 tokens); that default only applied "
            "with max_num_partial_prefills > 1, which V1 never ran": max(chunk_steps_of(ref, c, d, ctx, p, 327)) * 1e3,
            "forgets the decode tokens in the budget (the chunk is 8,192 - decodes)":
                max(chunk_steps_of(ref, c, d, ctx, p, budget)) * 1e3,
            "quotes the first chunk's step; later chunks attend the earlier ones and are slower": times[0] * 1e3},
        follow_ups=[Numeric(
            f"Now the server sets --long-prefill-token-threshold {threshold} and other requests are waiting, so the cap "
            "applies. The worst step during this prompt's prefill?", "ms", max(capped) * 1e3,
            [f"every chunk is capped at {threshold} tokens (less than the {share:,} the budget leaves): "
             f"{len(capped)} steps", f"the slowest is the last full chunk, which attends the most keys: "
             f"{fmt(max(capped) * 1e3)} ms"],
            "The threshold bounds one prompt's share of a step whatever the budget; the long prompt pays with more "
            "steps.", rtol=0.01, mistakes={"keeps the budget's share as the chunk (the cap ignored)": worst * 1e3})])


@template(STEM, "explain the budget")
def explain(rng, ref):
    return Open(
        "One request with a 20,000-token prompt arrives while dozens of users are streaming, and every stream stops for "
        "most of a second. Why, how does chunked prefill fix it, and how do you choose the token budget?",
        ["without chunking the whole prompt is prefilled in one step, and every decode waits for that step",
         "a per-step token budget: decodes first, then prompt chunks first come first served",
         "every step now costs at most about the budget, so the ITL stays bounded",
         "a smaller budget means more steps, each paying the fixed overhead: TTFT of the long prompt grows",
         "later chunks attend to all earlier ones: hold the slowest (last) chunk to the ITL SLO, not the average",
         "pick the largest budget meeting the ITL SLO, then check TTFT; if both cannot be met, add capacity"],
        "Chunking turns one long stall into many short steps; the budget sets the exchange rate between ITL and TTFT.")
