"""Lesson 02 questions: KV bytes per token (with config.json defaults), per user, users per GPU, decode reads."""
from __future__ import annotations

import json
import math

from reference_engine.sim import gpu_model as gm

from .pools import CHIPS, GB, SHAPES, GiB, describe, hf_config, hypothetical_config, memory_text, pick
from .question import Numeric, Open, fmt, template

STEM = "l02_kv_cache"
NAMED = {"Llama-3-8B": gm.LLAMA_3_8B, "Llama-3-70B": gm.LLAMA_3_70B}


def any_config(rng) -> tuple[str, dict]:
    """A released Llama shape or a hypothetical one: (how the prompt names it, config)."""
    if rng.random() < 0.5:
        name = pick(rng, sorted(NAMED))
        return f"{name} ({describe(hf_config(NAMED[name]))})", hf_config(NAMED[name])
    cfg = hypothetical_config(rng)
    return f"A model with {describe(cfg)}", cfg


def per_token_steps(ref, cfg, dtype) -> list[str]:
    layer = ref.kv_bytes_per_token({**cfg, "num_hidden_layers": 1}, dtype)
    return [f"per layer: K and V, {describe(cfg).split(', ', 2)[2]}, {ref.dtype_bytes(dtype)} byte(s) per element "
            f"({dtype}): 2 x KV heads x head_dim x bytes = {fmt(layer)} bytes",
            f"x {cfg['num_hidden_layers']} layers = {fmt(ref.kv_bytes_per_token(cfg, dtype))} bytes per token"]


@template(STEM, "KV bytes per token")
def per_token(rng, ref):
    name, cfg = any_config(rng)
    mha = {**cfg, "num_key_value_heads": cfg["num_attention_heads"]}

    def ask(dtype, prompt):
        b = ref.kv_bytes_per_token(cfg, dtype)
        return Numeric(prompt, "bytes", b, per_token_steps(ref, cfg, dtype),
                       "Every token leaves a key and a value in every layer, one per KV head, not per query head.",
                       rtol=0.01, mistakes={"counts only K, not K and V": b / 2, "counts bits, not bytes": 8 * b,
                                            "uses the query heads (GQA caches KV heads only)": ref.kv_bytes_per_token(mha, dtype)})

    q = ask("bf16", f"{name}. How many bytes of KV cache does one token take, over all layers, in bf16?")
    q.follow_ups.append(ask("fp8", "Now the KV cache is fp8: bytes per token?"))
    q.follow_ups[0].why = "The cache's dtype is its own choice, independent of the weights': fp8 halves it."
    return q


@template(STEM, "config.json defaults")
def config_defaults(rng, ref):
    cfg = hypothetical_config(rng)
    heads = cfg["num_attention_heads"]
    if rng.random() < 0.5:  # head_dim given and not hidden_size // heads: it wins
        cfg["head_dim"] = pick(rng, [d for d in (64, 96, 128, 160, 256) if d != cfg["hidden_size"] // heads])
        wrong = {"ignores head_dim and uses hidden_size // num_attention_heads":
                 ref.kv_bytes_per_token({k: v for k, v in cfg.items() if k != "head_dim"}, "bf16")}
        twist = {**cfg, "num_key_value_heads": None}
        twist_text = "Now num_key_value_heads is null in the same config: bytes per token?"
    else:  # no num_key_value_heads: multi-head attention
        del cfg["num_key_value_heads"]
        wrong = {"treats a missing num_key_value_heads as one KV head": ref.kv_bytes_per_token({**cfg, "num_key_value_heads": 1}, "bf16"),
                 "treats a missing num_key_value_heads as 8 KV heads": ref.kv_bytes_per_token({**cfg, "num_key_value_heads": 8}, "bf16")}
        twist = {**cfg, "num_key_value_heads": pick(rng, [k for k in (1, 2, 4, 8) if heads % k == 0 and k < heads])}
        twist_text = f"Now the config adds \"num_key_value_heads\": {twist['num_key_value_heads']}: bytes per token?"
    b = ref.kv_bytes_per_token(cfg, "bf16")
    q = Numeric(
        f"A config.json holds {json.dumps(cfg)}. Bytes of KV cache per token, all layers, bf16?", "bytes", b,
        [f"defaults: a missing or null num_key_value_heads means one KV head per query head; a present head_dim wins "
         f"over hidden_size // heads. Here: {describe(cfg)}", *per_token_steps(ref, cfg, "bf16")],
        "Read the config the way the engine does: its defaults decide the cache size, not the names you expect.",
        rtol=0.01, mistakes=wrong)
    tb = ref.kv_bytes_per_token(twist, "bf16")
    q.follow_ups.append(Numeric(twist_text, "bytes", tb, per_token_steps(ref, twist, "bf16"),
                                "Only the KV heads and head_dim that the engine will actually allocate count.",
                                rtol=0.01, mistakes={"counts only K, not K and V": tb / 2}))
    return q


@template(STEM, "KV per conversation")
def per_user(rng, ref):
    name, cfg = any_config(rng)
    ctx, users = pick(rng, [4096, 8192, 16384, 32768, 131072]), pick(rng, [16, 32, 64])

    def ask(n, prompt):
        b = ref.kv_cache_bytes(cfg, "bf16", n, ctx)
        return Numeric(
            prompt, "GB", b / GB,
            [*per_token_steps(ref, cfg, "bf16"),
             f"x {ctx:,} tokens x {n} running request(s) = {fmt(b)} bytes = {fmt(b / GB)} GB (1 GB = 1e9 bytes)"],
            "The cache grows linearly with every token of every running request. When a request finishes, the engine "
            "frees its cache; only a prefix cache (vLLM's automatic prefix caching, SGLang's RadixAttention) keeps it "
            "for the conversation's next turn, and only until it is evicted.",
            mistakes={"gives GiB (2**30 bytes) where GB is asked": b / GiB, "counts only K, not K and V": b / 2 / GB})

    q = ask(1, f"{name}, KV cache in bf16. A conversation's latest request runs with {ctx:,} tokens in its context "
               "(the history and the new tokens). How many GB of KV cache does it hold while it runs?")
    q.follow_ups.append(ask(users, f"Now {users} such requests run at once: GB of KV cache?"))
    return q


@template(STEM, "users in free memory")
def users_in_free(rng, ref):
    name, cfg = any_config(rng)
    ctx = pick(rng, [4096, 8192, 16384, 32768])
    per = ref.kv_cache_bytes(cfg, "bf16", 1, ctx)
    free = round(per * (rng.randrange(3, 60) + rng.uniform(0.2, 0.8)) / GB, 1) * GB

    def ask(dtype, prompt):
        n = ref.max_users(cfg, dtype, ctx, free)
        one = ref.kv_cache_bytes(cfg, dtype, 1, ctx)
        return Numeric(
            prompt, "users", n,
            [f"one user: {fmt(ref.kv_bytes_per_token(cfg, dtype))} bytes/token x {ctx:,} = {fmt(one)} bytes",
             f"{fmt(free)} / {fmt(one)} = {fmt(free / one)}: round down to {n} (a sequence is admitted whole or not at all)"],
            "Users = free memory / (bytes per token x context), rounded down.",
            rtol=0, mistakes={"rounds up": math.ceil(free / one),
                              "reads the free GB as GiB": ref.max_users(cfg, dtype, ctx, free / GB * GiB)})

    q = ask("bf16", f"{name}, KV cache in bf16, {free / GB:g} GB (1e9 bytes each) free for it. How many conversations "
                    f"of {ctx:,} tokens fit, whole?")
    q.follow_ups.append(ask("fp8", "Now the KV cache is fp8: how many fit?"))
    return q


@template(STEM, "users per GPU")
def users_per_gpu(rng, ref):
    shape, chip = pick(rng, SHAPES), pick(rng, CHIPS)
    cfg, params = hf_config(shape), gm.param_count(shape)
    wd = "bf16" if 2 * params < 0.8 * chip.memory_bytes else "fp8"
    ctx = pick(rng, [4096, 8192, 16384, 32768])

    def ask(kv, prompt):
        n = ref.users_per_gpu(cfg, params, ctx, chip.memory_bytes, wd, kv)
        weights = params * ref.dtype_bytes(wd)
        free = chip.memory_bytes - weights
        return Numeric(
            prompt, "users", n,
            [f"weights: {fmt(params)} x {ref.dtype_bytes(wd)} bytes ({wd}) = {fmt(weights / GB)} GB",
             f"left for KV: {fmt(chip.memory_bytes / GB)} - {fmt(weights / GB)} = {fmt(free / GB)} GB",
             f"one user: {fmt(ref.kv_cache_bytes(cfg, kv, 1, ctx) / GB)} GB at {ctx:,} tokens ({kv} cache)",
             f"users = floor({fmt(free / GB)} / {fmt(ref.kv_cache_bytes(cfg, kv, 1, ctx) / GB)}) = {n}"],
            "Weights come first; the cache gets what is left, and that remainder is what caps the users.",
            rtol=0, mistakes={"forgets the weights": ref.max_users(cfg, kv, ctx, chip.memory_bytes),
                              "counts only K, not K and V": ref.max_users(cfg, kv, ctx, 2 * free)})

    q = ask("bf16", f"{shape.name} ({fmt(params)} parameters, {describe(cfg)}) on one {chip.name} with "
                    f"{memory_text(chip)}, all of it usable. Weights in {wd}, KV cache in bf16. How many "
                    f"conversations of {ctx:,} tokens does it hold? (Ignore activations.)")
    q.follow_ups.append(ask("fp8", "Now the KV cache is fp8 too: how many?"))
    q.follow_ups[0].why = "Halving the cache's bytes doubles the users once the weights are paid for."
    return q


@template(STEM, "decode step reads")
def decode_reads(rng, ref):
    shape, chip = pick(rng, SHAPES), pick(rng, CHIPS)
    cfg, params = hf_config(shape), gm.param_count(shape)
    users, ctx = pick(rng, [8, 16, 32, 64]), pick(rng, [2048, 4096, 8192])

    def ask(c, prompt):
        kv = ref.kv_cache_bytes(cfg, "bf16", users, c)
        weights = params * ref.dtype_bytes("bf16")
        t = (kv + weights) / (chip.hbm_gb_per_s * 1e9) * 1e3
        return Numeric(
            prompt, "ms", t,
            [f"weights, read once per step: {fmt(weights / GB)} GB",
             f"KV caches, each read once: {users} x {c:,} tokens x {fmt(ref.kv_bytes_per_token(cfg, 'bf16'))} bytes "
             f"= {fmt(kv / GB)} GB",
             f"({fmt(weights / GB)} + {fmt(kv / GB)}) GB / {chip.hbm_gb_per_s:g} GB/s = {fmt(t)} ms"],
            "A decode step streams the weights and every live cache; the arithmetic on them is tiny by comparison.",
            mistakes={"forgets the KV cache reads": weights / (chip.hbm_gb_per_s * 1e9) * 1e3})

    q = ask(ctx, f"{shape.name} ({fmt(params)} parameters, {describe(cfg)}), bf16 weights and cache, on one "
                 f"{chip.name} ({chip.hbm_gb_per_s:g} GB/s). A decode step for {users} users each {ctx:,} tokens in: "
                 "how long does reading the bytes it needs take, at full bandwidth?")
    q.follow_ups.append(ask(4 * ctx, f"Now every user is {4 * ctx:,} tokens in: the step's read time?"))
    kv = ref.kv_cache_bytes(cfg, "bf16", users, 4 * ctx)
    share = kv / (kv + params * ref.dtype_bytes("bf16"))
    q.follow_ups[0].why = (f"The caches grow with every user's context, the weights do not: here the caches are "
                           f"{share:.0%} of the step's reads.")
    return q


@template(STEM, "explain memory not arithmetic")
def explain(rng, ref):
    return Open(
        "You serve a 70B model. Why is it memory, not arithmetic, that caps how many long conversations one GPU keeps "
        "resident? Walk through the numbers you would compute.",
        ["KV per token = 2 (K and V) x layers x KV heads x head_dim x bytes per element",
         "per conversation = that x its tokens; GB (1e9) and GiB (2**30) kept apart",
         "held while its request runs; between turns the engine frees it, unless a prefix cache keeps it (until "
         "evicted) so that the next turn does not prefill the history again",
         "weights first; the cache gets what is left, and users = floor(left / per conversation)",
         "GQA is why it is that small: per query head it would be several times larger",
         "a decode step reads the weights and every cache but does about one FLOP per byte: the arithmetic idles",
         "levers: fp8 KV, paged allocation, shared prefixes, tensor parallelism, MLA"],
        "The cache per token times the context is the bill; memory pays it, arithmetic waits.")
