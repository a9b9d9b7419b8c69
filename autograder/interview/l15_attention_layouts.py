"""Lesson 15 questions: cache per token of MHA, GQA and MLA, the spread between them, and tokens per node."""
from __future__ import annotations

from .pools import CHIPS, GB, describe, hypothetical_config, memory_text, pick
from .question import Numeric, Open, fmt, template

STEM = "l15_attention_layouts"
KiB = 1024


def is_mla(cfg: dict) -> bool:
    return bool(cfg.get("kv_lora_rank"))


def naive(cfg: dict) -> dict:
    """An MLA config read as if it were GQA: its 128 KV heads, each K of nope + rope and V of v_head_dim elements
    (head_dim set to their mean, so 2 x head_dim = K + V)."""
    return {**cfg, "kv_lora_rank": None,
            "head_dim": (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] + cfg["v_head_dim"]) // 2}


def shape_text(cfg: dict) -> str:
    if is_mla(cfg):
        return (f"{cfg['name']} (MLA: {cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} heads, "
                f"kv_lora_rank {cfg['kv_lora_rank']}, qk_rope_head_dim {cfg['qk_rope_head_dim']}, qk_nope_head_dim "
                f"{cfg['qk_nope_head_dim']}, v_head_dim {cfg['v_head_dim']}; its config also says "
                f"num_key_value_heads {cfg['num_key_value_heads']})")
    return f"{cfg['name']} ({describe(cfg)})"


def hypothetical_mla(rng) -> dict:
    """An MLA config that is no released model (DeepSeek-V2/V3's field names; 128 heads as they have)."""
    return {"name": "a hypothetical MLA model", "num_hidden_layers": pick(rng, [27, 40, 48, 60, 61, 80]),
            "hidden_size": 5120, "num_attention_heads": 128, "num_key_value_heads": 128,
            "kv_lora_rank": pick(rng, [256, 384, 512, 1024]), "qk_nope_head_dim": 128,
            "qk_rope_head_dim": pick(rng, [32, 64]), "v_head_dim": 128}


def any_layout(rng, ref, mla: bool | None = None) -> dict:
    """One of the lesson's configs, or a hypothetical one (GQA from pools, or MLA); mla=True/False restricts."""
    named = [c for c in ref.MODELS if mla is None or is_mla(c) == mla]
    if rng.random() < 0.6:
        return pick(rng, named)
    if mla or (mla is None and rng.random() < 0.5):
        return hypothetical_mla(rng)
    return {"name": "a hypothetical GQA model", **hypothetical_config(rng)}


def per_token_steps(ref, cfg: dict, db: int) -> list[str]:
    b = ref.kv_bytes_per_token(cfg, db)
    if is_mla(cfg):
        return [f"MLA caches, per layer, one latent of kv_lora_rank {cfg['kv_lora_rank']} shared by all heads plus one "
                f"RoPE key of {cfg['qk_rope_head_dim']}: {cfg['kv_lora_rank'] + cfg['qk_rope_head_dim']} elements",
                f"x {cfg['num_hidden_layers']} layers x {db} byte(s) = {fmt(b)} bytes = {fmt(b / KiB)} KiB"]
    return [f"K and V per KV head per layer: {describe(cfg)}",
            f"2 x layers x KV heads x head_dim x {db} byte(s) = {fmt(b)} bytes = {fmt(b / KiB)} KiB"]


@template(STEM, "cache per token by layout")
def per_token(rng, ref):
    cfg = any_layout(rng, ref)

    def ask(db, prompt):
        b = ref.kv_bytes_per_token(cfg, db)
        wrong = {"counts only K, not K and V": b / 2 / KiB}
        if is_mla(cfg):
            wrong = {"applies the per-head K/V formula to the config's 128 KV heads": ref.kv_bytes_per_token(naive(cfg), db) / KiB}
        else:
            wrong["uses the query heads (as if MHA)"] = ref.kv_bytes_per_token(
                {**cfg, "num_key_value_heads": cfg["num_attention_heads"]}, db) / KiB
        return Numeric(prompt, "KiB", b / KiB, per_token_steps(ref, cfg, db),
                       "The layout, not the parameter count, sets the cache: KV heads x head_dim, or one shared latent.",
                       rtol=0.01, mistakes=wrong)

    q = ask(2, f"{shape_text(cfg)}. Attention cache per token, all layers, bf16, in KiB (1,024 bytes)?")
    q.follow_ups.append(ask(1, "Now the cache is fp8: KiB per token?"))
    return q


@template(STEM, "spread between layouts")
def spread(rng, ref):
    a = pick(rng, [c for c in ref.MODELS if not is_mla(c)])
    b = any_layout(rng, ref, mla=True)

    def ask(db_b, prompt):
        ka, kb = ref.kv_bytes_per_token(a, 2), ref.kv_bytes_per_token(b, db_b)
        return Numeric(
            prompt, "x", ka / kb,
            [f"{a['name']}: {fmt(ka)} bytes per token (bf16)", f"{b['name']}: {fmt(kb)} bytes per token",
             f"ratio {fmt(ka / kb)}x = (per layer: {fmt(ka / a['num_hidden_layers'])} vs {fmt(kb / b['num_hidden_layers'])} "
             f"bytes) x (layers: {a['num_hidden_layers']} vs {b['num_hidden_layers']})"],
            "Per layer, GQA keeps K and V per KV head while MLA keeps one latent all heads share; then multiply by layers.",
            mistakes={"applies the per-head K/V formula to the MLA model's 128 KV heads":
                      ka / ref.kv_bytes_per_token(naive(b), db_b),
                      "compares per layer, ignoring the layer counts":
                      (ka / a["num_hidden_layers"]) / (kb / b["num_hidden_layers"])})

    q = ask(2, f"{shape_text(a)} against {shape_text(b)}, both caching in bf16. How many times more cache per token "
               f"does {a['name']} keep?")
    q.follow_ups.append(ask(1, f"Now {b['name']} caches in fp8 and {a['name']} stays bf16: the factor?"))
    return q


def deployment(rng, ref, cfg=None, counts=(4, 8, 16)):
    """(config, weight bytes per parameter, parameters, chip, GPUs) whose weights fit in the GPUs' memory."""
    while True:
        c = cfg or pick(rng, [ref.LLAMA_3_8B, ref.LLAMA_3_70B, ref.DEEPSEEK_V2, ref.DEEPSEEK_V3])
        wb = 1 if c is ref.DEEPSEEK_V3 else 2  # V3 ships fp8 weights; in bf16 it does not fit on 8 GPUs
        n, chip, gpus = ref.param_count(c), pick(rng, CHIPS), pick(rng, counts)
        if n * wb < 0.95 * gpus * chip.memory_bytes:
            return c, wb, n, chip, gpus


@template(STEM, "tokens of cache a deployment holds")
def capacity(rng, ref):
    cfg, wb, n, chip, gpus = deployment(rng, ref)

    def ask(kv, copies, prompt):
        t = ref.kv_capacity_tokens(cfg, n, wb, kv, gpus, chip.memory_bytes, copies)
        return Numeric(
            prompt, "million tokens", t / 1e6,
            [f"weights: {fmt(n)} parameters x {wb} byte(s) = {fmt(n * wb / GB)} GB, stored once across the {gpus} GPUs",
             f"left: {gpus} x {fmt(chip.memory_bytes / GB)} - {fmt(n * wb / GB)} = "
             f"{fmt((gpus * chip.memory_bytes - n * wb) / GB)} GB",
             f"per token: {fmt(ref.kv_bytes_per_token(cfg, kv))} bytes" + (f" x {copies} copies" if copies > 1 else ""),
             f"tokens = {fmt(t)} = {fmt(t / 1e6)} M"],
            "Capacity is what the weights leave, divided by the cache per token, times how many copies each token needs.",
            mistakes={"forgets the weights": ref.kv_capacity_tokens(cfg, 0, wb, kv, gpus, chip.memory_bytes, copies) / 1e6,
                      **({"applies the per-head K/V formula to the config's 128 KV heads":
                          ref.kv_capacity_tokens(naive(cfg), n, wb, kv, gpus, chip.memory_bytes, copies) / 1e6}
                         if is_mla(cfg) else {"counts only K, not K and V":
                                              ref.kv_capacity_tokens(cfg, n, wb, kv / 2, gpus, chip.memory_bytes, copies) / 1e6})})

    q = ask(2, 1, f"{shape_text(cfg)}, {fmt(n / 1e9)}B parameters, weights in {'fp8' if wb == 1 else 'bf16'}, on {gpus} x "
                  f"{chip.name} ({memory_text(chip)} each). bf16 cache, each token's cache stored once across the GPUs, "
                  "activations ignored. How many tokens of cache fit, in millions?")
    if is_mla(cfg):
        q.follow_ups.append(ask(2, gpus, "Now plain tensor parallelism: the latent has no heads to split, so every GPU "
                                         "keeps its own copy. Millions of tokens?"))
        q.follow_ups[0].why = f"Under plain TP an MLA cache is copied {gpus} times; data-parallel attention stores it once."
    else:
        q.follow_ups.append(ask(1, 1, "Now the cache is fp8: millions of tokens?"))
    return q


@template(STEM, "MLA against a dense 70B")
def mla_vs_dense(rng, ref):
    d3, _, n3, chip, gpus = deployment(rng, ref, ref.DEEPSEEK_V3, counts=(8, 12, 16, 24, 32))
    n70 = ref.param_count(ref.LLAMA_3_70B)
    kv = pick(rng, [2, 1])

    def ask(copies, prompt):
        t3 = ref.kv_capacity_tokens(d3, n3, 1, kv, gpus, chip.memory_bytes, copies)
        t70 = ref.kv_capacity_tokens(ref.LLAMA_3_70B, n70, 2, kv, gpus, chip.memory_bytes, 1)
        return Numeric(
            prompt, "x", t3 / t70,
            [f"Llama-3-70B: {fmt(n70 * 2 / GB)} GB of bf16 weights; {fmt(ref.kv_bytes_per_token(ref.LLAMA_3_70B, kv))} "
             f"bytes per token: {fmt(t70)} tokens",
             f"DeepSeek-V3: {fmt(n3 / GB)} GB of fp8 weights; {fmt(ref.kv_bytes_per_token(d3, kv))} bytes per token"
             + (f" x {copies} copies" if copies > 1 else "") + f": {fmt(t3)} tokens",
             f"ratio {fmt(t3 / t70)}x"],
            "Per token MLA is several times smaller, but the MoE weights eat most of the node: compare totals, not per-token.",
            mistakes={"compares the cache per token only": ref.kv_bytes_per_token(ref.LLAMA_3_70B, 2) / ref.kv_bytes_per_token(d3, 2)})

    q = ask(1, f"On {gpus} x {chip.name} ({memory_text(chip)} each): Llama-3-70B with bf16 weights against DeepSeek-V3 "
               f"({fmt(n3 / 1e9)}B parameters) with fp8 weights, both caching in {'bf16' if kv == 2 else 'fp8'}, each "
               "token's cache stored once. How many times as many tokens of cache does DeepSeek-V3 hold?")
    q.follow_ups.append(ask(8, "Now DeepSeek-V3 runs plain tensor parallelism (every GPU copies the latent): the factor?"))
    return q


@template(STEM, "a hypothetical MLA layout")
def mla_layout(rng, ref):
    layers, rank, rope = pick(rng, [27, 40, 48, 60, 61, 80]), pick(rng, [256, 384, 512, 1024]), pick(rng, [32, 64])
    cfg = {"name": "this MLA model", "num_hidden_layers": layers, "hidden_size": 5120, "num_attention_heads": 128,
           "num_key_value_heads": 128, "kv_lora_rank": rank, "qk_nope_head_dim": 128, "qk_rope_head_dim": rope,
           "v_head_dim": 128}
    b = ref.kv_bytes_per_token(cfg, 2)
    q = Numeric(
        f"An MLA model: {layers} layers, 128 heads, kv_lora_rank {rank}, qk_rope_head_dim {rope}, qk_nope_head_dim 128, "
        "v_head_dim 128 (its config lists num_key_value_heads 128). Cache bytes per token, bf16?", "bytes", b,
        per_token_steps(ref, cfg, 2), "MLA's cache per layer is the latent plus one RoPE key, whatever the head count.",
        rtol=0.01, mistakes={"applies the per-head K/V formula to the 128 KV heads": ref.kv_bytes_per_token(naive(cfg), 2),
                             "forgets the decoupled RoPE key": b * rank / (rank + rope),
                             "caches a latent for K and another for V": 2 * b})
    kv = pick(rng, [4, 8])
    gqa = {"name": "GQA", "num_hidden_layers": layers, "num_attention_heads": 64, "num_key_value_heads": kv,
           "hidden_size": 8192}
    g = ref.kv_bytes_per_token(gqa, 2)
    q.follow_ups.append(Numeric(
        f"A GQA model with the same {layers} layers, {kv} KV heads of head_dim 128: how many times the MLA model's cache "
        "per token does it keep?", "x", g / b,
        [f"GQA per layer: 2 x {kv} x 128 = {2 * kv * 128} elements; MLA: {rank} + {rope} = {rank + rope}",
         f"ratio {fmt(g / b)}x (the layers cancel)"],
        "Same depth, so the factor is per layer: K and V per KV head against one shared latent.",
        mistakes={"counts only K for the GQA model": g / 2 / b}))
    return q


@template(STEM, "cache of a sliding-window hybrid")
def sliding_hybrid(rng, ref):
    cfg = pick(rng, [ref.GEMMA_3_27B, ref.GPT_OSS_120B])
    S = pick(rng, [8192, 16384, 32768, 65536, 131072])
    local = ref.windowed_layers(cfg)
    n_local, n_global, W = sum(local), len(local) - sum(local), cfg["sliding_window"]
    per = ref.gqa_kv_bytes_per_token(cfg, 2) // cfg["num_hidden_layers"]
    every = {**cfg, "sliding_window": None}
    pattern = ("5 sliding-window layers before each global one" if "sliding_window_pattern" in cfg
               else "sliding-window and global layers alternating")

    def ask(ctx, prompt):
        b = ref.window_kv_bytes(cfg, ctx, 2)
        return Numeric(
            prompt, "GB", b / GB,
            [f"per layer and token: 2 x {cfg['num_key_value_heads']} KV heads x {cfg['head_dim']} x 2 bytes = {fmt(per)} B",
             f"{n_global} global layers x {ctx:,} tokens + {n_local} window layers x min({ctx:,}, {W:,}) tokens",
             f"= {fmt(b)} bytes = {fmt(b / GB)} GB"],
            "A window layer's cache stops at the window; the global layers still grow with the context and dominate.",
            mistakes={"counts every layer at the full context": ref.window_kv_bytes(every, ctx, 2) / GB,
                      "caps every layer at the window": len(local) * per * min(ctx, W) / GB})

    q = ask(S, f"{cfg['name']}: {cfg['num_hidden_layers']} layers, {pattern} (window {W:,} tokens), "
               f"{cfg['num_key_value_heads']} KV heads of head_dim {cfg['head_dim']}. KV cache of one sequence of "
               f"{S:,} tokens in bf16, in GB?")
    S2 = 4 * S if S <= 32768 else S // 4
    q.follow_ups.append(ask(S2, f"And at {S2:,} tokens, in GB?"))
    q.follow_ups[0].why = "Past the window, the cache grows only through the global layers: n_global / layers of an all-global one."
    return q


@template(STEM, "explain MLA")
def explain(rng, ref):
    return Open(
        "Decoders of about the same size differ by more than 30x in cache per token, depending only on their attention "
        "layout. Where does the factor come from, how does MLA get its cache so small, and what does it cost at decode?",
        ["MHA caches K and V for every head; GQA for every KV head (divide by the group size); MQA for one",
         "MLA caches one compressed latent per layer shared by all heads, plus one small decoupled RoPE key",
         "trap: an MLA config still lists num_key_value_heads; the per-head formula overstates its cache ~70x",
         "node capacity compares totals: MoE weights eat memory, so the per-token factor overstates the context gain",
         "under plain TP the headless latent is copied on every GPU; data-parallel attention stores it once",
         "decode absorbs W_UK/W_UV into the query and output to attend on the latent: more FLOPs per cached byte",
         "RoPE is decoupled because a position-dependent rotation cannot be absorbed into the projections",
         "newer levers: an fp8 latent with per-128 scales (656 B per layer), DSA reading only the top-2,048 tokens, "
         "sliding-window layers whose cache stops at the window"],
        "Cache = what each layer keeps per token x layers; MLA keeps one shared latent and pays for it in decode FLOPs.")
