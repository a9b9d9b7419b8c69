"""Lesson 19 questions: packing without padding, the varlen mask, batches under a budget, the batching window,
the largest batch that fits."""
from __future__ import annotations

import math

from .pools import GB, SHAPES, describe, hf_config, pick
from .question import Numeric, Open, fmt, template

STEM = "l19_offline_batch"


def lengths_of(ref, lengths: list[int]) -> dict:
    return ref.pack_prompts([[1] * n for n in lengths])


@template(STEM, "padding a packed batch avoids")
def padding(rng, ref):
    lengths = [rng.randrange(10, 2001) for _ in range(rng.randrange(4, 9))]

    def ask(ls, prompt):
        b = lengths_of(ref, ls)
        total, longest = int(b["cu_seqlens"][-1]), b["max_seqlen"]
        share = 100 * (1 - total / (len(ls) * longest))
        return Numeric(
            prompt, "%", share,
            [f"packed: T = {' + '.join(map(str, ls))} = {total:,} tokens (cu_seqlens ends at {total:,})",
             f"padded: {len(ls)} x the longest {longest:,} = {len(ls) * longest:,}",
             f"padding = 1 - {total:,} / {len(ls) * longest:,} = {fmt(share)}%"],
            "Packing concatenates ragged prompts and keeps their boundaries in cu_seqlens: no token is padding.",
            mistakes={"divides the padding by the real tokens, not the padded batch": 100 * (len(ls) * longest - total) / total})

    q = ask(lengths, f"Prompts of {lengths} tokens go into one batch. Padded to the longest, what share of the batch's "
                     "tokens is padding?")
    extra = 2 * max(lengths)
    q.follow_ups.append(ask(lengths + [extra], f"Now one more prompt of {extra:,} tokens joins: the padding share?"))
    q.follow_ups[0].why = "One long prompt makes every other row pad to it: padding grows with the spread of lengths."
    return q


@template(STEM, "pairs the varlen mask allows")
def mask_pairs(rng, ref):
    import torch

    lengths = [rng.randrange(2, 41) for _ in range(rng.randrange(3, 6))]

    def ask(ls, prompt):
        cu = lengths_of(ref, ls)["cu_seqlens"]
        n = int(ref.varlen_causal_mask(cu).sum())
        total = int(cu[-1])
        one = int(ref.varlen_causal_mask(torch.tensor([0, total], dtype=torch.int32)).sum())
        return Numeric(
            prompt, "pairs", n,
            [f"cu_seqlens = {cu.tolist()}: the mask is block-diagonal, one causal block per sequence",
             f"a block of n tokens allows n(n + 1)/2 pairs: {' + '.join(str(x * (x + 1) // 2) for x in ls)} = {n}"],
            "Each sequence sees only itself: cross-sequence pairs are masked, which is what a varlen kernel skips.",
            rtol=0, mistakes={"uses one causal mask over the whole packed batch": one,
                              "lets each sequence see all of itself (no causal mask)": sum(x * x for x in ls)})

    q = ask(lengths, f"Prompts of {lengths} tokens are packed into one batch. How many (query, key) pairs does its "
                     "attention mask allow?")
    extra = rng.randrange(2, 41)
    q.follow_ups.append(ask(lengths + [extra], f"A prompt of {extra} tokens joins the batch: how many pairs now?"))
    return q


@template(STEM, "batches under a token budget")
def batches(rng, ref):
    while True:  # an instance where first-fit decreasing needs more than the lower bound
        budget = pick(rng, [1024, 2048, 4096])
        costs = [rng.randrange(budget // 10, budget * 3 // 4) for _ in range(rng.randrange(6, 12))]
        packed = len(ref.form_batches(costs, budget))
        if packed != math.ceil(sum(costs) / budget):
            break
    q = Numeric(
        f"A job's requests occupy {costs} tokens each (prompt + max output). Batches of at most {budget} tokens, packed "
        "(a batch's size is the sum of its members'), formed first-fit decreasing. How many batches?", "batches", packed,
        [f"sorted by cost, largest first: {sorted(costs, reverse=True)}",
         f"each goes into the first open batch it fits: {[[costs[i] for i in b] for b in ref.form_batches(costs, budget)]}",
         f"{packed} batches (the bound sum / budget = {fmt(sum(costs) / budget)} is not always reachable)"],
        "Bin packing: first-fit decreasing is the standard heuristic; compare it with the lower bound to see the waste.",
        rtol=0, mistakes={"gives the lower bound ceil(total / budget)": math.ceil(sum(costs) / budget)})
    padded = ref.form_batches(costs, budget, padded=True)
    q.follow_ups.append(Numeric(
        "Now padded batches (a batch's size is its member count x its largest member): how many?", "batches", len(padded),
        [f"first-fit decreasing, size = count x max: {[[costs[i] for i in b] for b in padded]}", f"{len(padded)} batches"],
        "Padding charges every member the longest one's length, so fewer fit in a budget.", rtol=0,
        mistakes={"keeps the packed count": packed}))
    return q


@template(STEM, "what a batching window costs")
def window(rng, ref):
    w = pick(rng, [50, 100, 200, 500])
    arrivals = sorted(round(rng.uniform(0, 6 * w)) for _ in range(rng.randrange(6, 12)))

    def ask(cap, prompt):
        r = ref.batch_window_delays([a / 1e3 for a in arrivals], w / 1e3, cap)
        return Numeric(
            prompt, "ms", r["mean"] * 1e3,
            [f"batches dispatch at (ms): {sorted(set(round(d * 1e3, 3) for d in r['dispatch']))}, sizes {r['batch_sizes']}",
             f"each request waits dispatch - arrival: {[fmt(d * 1e3) for d in r['delay']]} ms",
             f"mean {fmt(r['mean'] * 1e3)} ms, max {fmt(r['max'] * 1e3)} ms"],
            "A window of W costs each request up to W; the first in a batch pays all of it, the last almost nothing.",
            rtol=0.01, mistakes={"takes half the window": w / 2, "charges everyone the whole window": w})

    q = ask(None, f"Requests arrive at {arrivals} ms. A batcher opens a batch at the first waiting arrival and dispatches it "
                  f"{w} ms later with everything that arrived by then. Mean wait the window adds?")
    cap = pick(rng, [2, 3])
    q.follow_ups.append(ask(cap, f"Now a batch also leaves as soon as it holds {cap} requests: mean wait?"))
    q.follow_ups[0].why = "A size cap cuts the wait under load; offline, with everything there at t = 0, use no window at all."
    return q


@template(STEM, "largest batch in memory")
def max_batch(rng, ref):
    shape = pick(rng, SHAPES)
    cfg = hf_config(shape)
    free = rng.randrange(20, 121) * GB
    p, o = pick(rng, [512, 1024, 1536, 2048, 4096]), pick(rng, [128, 256, 512, 1024])

    def ask(db, act, prompt):
        n = ref.max_batch_in_memory(cfg, db, free, p, o, act, 16)
        kv = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * (cfg["hidden_size"] // cfg["num_attention_heads"]) * db
        return Numeric(
            prompt, "sequences", n,
            [f"KV per token: {fmt(kv)} bytes ({describe(cfg)}, {db} byte(s) per element)",
             f"per sequence: ceil(({p:,} + {o:,}) / 16) x 16 tokens x {fmt(kv)}"
             + (f" + {p:,} x {fmt(act)} activation bytes" if act else "") + " bytes",
             f"floor({fmt(free / GB)} GB / that) = {n}"],
            "Memory, not compute, caps a static batch: every sequence holds its whole prompt + output of KV at the end.",
            rtol=0, mistakes={"forgets the output tokens' KV": ref.max_batch_in_memory(cfg, db, free, p, 0, act, 16),
                              "counts only K, not K and V": ref.max_batch_in_memory(cfg, db, 2 * free, p, o, act, 16)})

    q = ask(2, 0.0, f"{shape.name} ({describe(cfg)}), bf16 KV cache in 16-token blocks, {free / GB:g} GB free after the "
                    f"weights. Every sequence has a {p:,}-token prompt and {o:,} output tokens. Largest static batch?")
    q.follow_ups.append(ask(1, 0.0, "Now the KV cache is fp8: the largest batch?"))
    act = 2 * (2 * cfg["hidden_size"] + 2 * cfg["intermediate_size"])
    q.follow_ups.append(ask(2, float(act), f"Back to bf16, and the whole batch is prefilled in one forward, needing {act:,} "
                                           "bytes of activations per prompt token alongside: the largest batch?"))
    q.follow_ups[1].why = "A one-shot prefill's activations rival the cache; chunking the prefill takes them off the bill."
    return q


@template(STEM, "a shared prefix across the batch")
def shared_prefix(rng, ref):
    groups, per = pick(rng, [2, 4, 5, 8, 10]), pick(rng, [50, 100, 200, 250])
    prefix, suffix = pick(rng, [500, 1000, 2000, 4000]), pick(rng, [100, 200, 300, 500])
    n = groups * per
    prefix_of = [i % groups for i in range(n)]              # the job's order: the prefixes take turns
    suffixes = [suffix] * n
    grouped = sorted(range(n), key=lambda i: prefix_of[i])

    def tokens(order, slots):
        return ref.prefill_tokens(order, prefix_of, prefix, suffixes, slots)

    none = tokens(list(range(n)), 0)
    q = Numeric(
        f"An offline job of {n:,} prompts: each starts with one of {groups} instructions of {prefix:,} tokens "
        f"({per} prompts each) and ends with {suffix} tokens of its own. With prefix caching and the prompts sorted "
        "so that each instruction's prompts run together, how many prompt tokens does the engine prefill, in thousands?",
        "thousand tokens", tokens(grouped, 1) / 1e3,
        [f"without a prefix cache: {n:,} x ({prefix:,} + {suffix}) = {fmt(none)} tokens",
         f"sorted: each instruction once, {groups} x {prefix:,}, plus every suffix, {n:,} x {suffix}",
         f"= {fmt(tokens(grouped, 1))} tokens, {fmt(100 * tokens(grouped, 1) / none)}% of no cache"],
        "A cached prefix is prefilled once per stay in the cache; sorting makes that once per instruction.",
        rtol=0.01, mistakes={"counts the prefix as free for every prompt, even the first of each instruction":
                             n * suffix / 1e3,
                             "forgets the per-prompt suffixes": groups * prefix / 1e3})
    slots = pick(rng, [1, max(1, groups // 2)])
    q.follow_ups.append(Numeric(
        f"Now the prompts run in the job's order, the instructions taking turns (1, 2, ..., {groups}, 1, 2, ...), and "
        f"the cache holds the KV of {slots} instruction(s), least recently used evicted first. Thousands of prompt "
        "tokens prefilled?", "thousand tokens", tokens(list(range(n)), slots) / 1e3,
        [f"with {groups} instructions taking turns and room for {slots}, each one is evicted before it comes back",
         f"so every prompt prefills its instruction: {fmt(tokens(list(range(n)), slots))} tokens, as with no cache"],
        "Order matters as much as the cache: interleaved prefixes thrash an LRU cache smaller than their number.",
        rtol=0.01, mistakes={"assumes the cache keeps every instruction": tokens(grouped, 1) / 1e3}))
    return q


@template(STEM, "explain the offline speedup")
def explain(rng, ref):
    return Open(
        "A nightly job takes about 50 s sent one prompt at a time and about 4 s handed to the engine all at once. Where "
        "does the factor come from, and what limits it?",
        ["sequential decode does one token per step; batched, one step decodes every live sequence",
         "a decode step's cost is mostly shared (on a GPU, reading the weights once), so a bigger batch is nearly free",
         "pack ragged prompts with cu_seqlens and per-sequence positions; attention needs a block-diagonal causal mask",
         "form batches under a token budget (first-fit decreasing), or better, a continuous-batching engine",
         "a batching window costs each request up to its length in latency; offline, use none",
         "memory caps the batch: KV of prompt + output per sequence (plus prefill activations unless chunked)",
         "more GPUs: data-parallel replicas scale throughput once each has a full batch, with no per-layer all-reduce",
         "offline engines take bigger steps (vLLM's LLM class: a larger max_num_batched_tokens than vllm serve), "
         "sort prompts by shared prefix for the prefix cache, and hosted batch APIs trade a 24 h window for half price"],
        "Batching amortizes the weight read over many sequences until memory, or compute, runs out.")
