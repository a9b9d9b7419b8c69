"""Lesson 06 questions: parameters, weight bytes (bf16/fp8/int4), KV per GPU under TP, users per TP group."""
from __future__ import annotations

import math

from reference_engine.sim import gpu_model as gm

from .pools import CHIPS, GB, SHAPES, GiB, describe, group_text, hf_config, hypothetical_llama, pick
from .question import Numeric, Open, fmt, template

STEM = "l06_capacity_planning"


def config_text(name, cfg) -> str:
    return (f"{name} ({describe(cfg)}, hidden {cfg['hidden_size']}, intermediate {cfg['intermediate_size']}, "
            f"vocab {cfg['vocab_size']}, {'tied' if cfg['tie_word_embeddings'] else 'untied'} embeddings)")


def any_llama(rng) -> tuple[str, dict]:
    """(name, config): a Llama-3 shape or, one time in two, a hypothetical Llama-style model."""
    if rng.random() < 0.5:
        shape = pick(rng, SHAPES)
        return shape.name, hf_config(shape)
    return "a Llama-style model", hypothetical_llama(rng)


@template(STEM, "parameter count")
def params(rng, ref):
    name, cfg = any_llama(rng)

    def ask(c, prompt):
        n = ref.param_count(c)
        h, layers = c["hidden_size"], c["num_hidden_layers"]
        layer = ref.param_count({**c, "num_hidden_layers": 1, "vocab_size": 0}) - h
        return Numeric(
            prompt, "billion parameters", n / 1e9,
            [f"per layer (q, k, v, o projections; gate, up, down; two norms): {fmt(layer)}",
             f"x {layers} layers = {fmt(layers * layer)}",
             f"+ embeddings {c['vocab_size']:,} x {h}" + ("" if c["tie_word_embeddings"] else " + lm_head (untied), the same size")
             + f" + final norm = {fmt(n)}"],
            "Parameters are the sum of a few matrix shapes read off config.json; the vocabulary matrices are not small.",
            rtol=0.005, mistakes={"counts K and V projections at the query heads' width":
                                  ref.param_count({**c, "num_key_value_heads": c["num_attention_heads"]}) / 1e9,
                                  "leaves out the untied lm_head": ref.param_count({**c, "tie_word_embeddings": True}) / 1e9})

    q = ask(cfg, f"{config_text(name, cfg)}, no biases. How many parameters?")
    q.follow_ups.append(ask({**cfg, "tie_word_embeddings": True},
                            "Now the same model with tie_word_embeddings true: how many parameters?"))
    q.follow_ups[0].why = "Tying reuses the embedding matrix as the lm_head: one vocab x hidden matrix fewer."
    return q


@template(STEM, "weight bytes")
def weights(rng, ref):
    name, cfg = any_llama(rng)
    n = ref.param_count(cfg)
    dtype = pick(rng, ["bf16", "fp8"])
    w = ref.weight_bytes(n, dtype)
    q = Numeric(
        f"{name} has {n:,} parameters. How many GB (1e9 bytes) of weights in {dtype}?", "GB", w / GB,
        [f"{ref.DTYPE_BITS[dtype]} bits = {ref.DTYPE_BITS[dtype] // 8} byte(s) per weight",
         f"{n:,} x {ref.DTYPE_BITS[dtype] // 8} = {fmt(w)} bytes = {fmt(w / GB)} GB"],
        "Bytes per weight times parameters: the fixed slice of every GPU's memory.",
        mistakes={"counts bits, not bytes": 8 * w / GB, "gives GiB where GB is asked": w / GiB})
    g = pick(rng, [64, 128])
    w4 = ref.weight_bytes(n, "int4", g)
    q.follow_ups.append(Numeric(
        f"Now int4 weights with one fp16 scale per group of {g}: GB?", "GB", w4 / GB,
        [f"weights: {n:,} x 0.5 byte = {fmt(n / 2 / GB)} GB", f"scales: ceil({n:,} / {g}) x 2 bytes = "
         f"{fmt((w4 - n / 2) / GB)} GB", f"total {fmt(w4 / GB)} GB"],
        "int4 is 4.25 bits or so per weight once the group scales are counted, not 4.", rtol=0.005,
        mistakes={"forgets the group scales": n / 2 / GB}))
    return q


@template(STEM, "KV per token per GPU under TP")
def kv_tp(rng, ref):
    shape = pick(rng, SHAPES)
    cfg = hf_config(shape)
    tp, dtype = pick(rng, [2, 4, 8]), pick(rng, ["bf16", "fp8"])
    whole = ref.kv_bytes_per_token_per_gpu(cfg, dtype, 1)

    def ask(t, prompt, wrong):
        b = ref.kv_bytes_per_token_per_gpu(cfg, dtype, t)
        per_rank = math.ceil(cfg["num_key_value_heads"] / t)
        return Numeric(
            prompt, "bytes", b,
            [f"whole model: 2 x {cfg['num_hidden_layers']} layers x {cfg['num_key_value_heads']} KV heads x 128 x "
             f"{ref.DTYPE_BITS[dtype] // 8} = {fmt(whole)} bytes",
             f"each rank keeps its own KV heads: ceil({cfg['num_key_value_heads']} / {t}) = {per_rank} per GPU "
             "(a head cannot be split; past one head per rank they are replicated)",
             f"{fmt(whole)} x {per_rank} / {cfg['num_key_value_heads']} = {fmt(b)} bytes per token per GPU"],
            "Tensor parallelism splits the KV heads across GPUs, down to one head per GPU and no further.",
            rtol=0, mistakes=wrong)

    q = ask(tp, f"{shape.name} ({describe(cfg)}), {dtype} KV cache, tensor parallel over {tp} GPUs. KV bytes one token "
                "takes on each GPU?", {"forgets the TP split": whole})
    q.follow_ups.append(ask(16, "Now TP is 16: bytes per token per GPU?",
                            {"splits below one KV head": whole / 16, "forgets the TP split": whole}))
    q.follow_ups[0].why = "With 8 KV heads, TP 16 replicates each head on two GPUs: no saving over TP 8."
    return q


def deployment(rng):
    """(shape, chip, gpus) whose bf16 weights fit with room for at least one user at 32k."""
    while True:
        shape, chip, n = pick(rng, SHAPES), pick(rng, CHIPS), pick(rng, [1, 2, 4, 8])
        if gm.weight_bytes_per_rank(shape, n) < 0.6 * chip.memory_bytes:
            return shape, chip, n


@template(STEM, "users per TP group")
def users(rng, ref):
    shape, chip, n = deployment(rng)
    cfg = hf_config(shape)
    ctx = pick(rng, [8192, 16384, 32768])
    mem = chip.memory_bytes

    def ask(dt, prompt):
        r = ref.max_users(cfg, mem, n, ctx, dt, dt)
        return Numeric(
            prompt, "users", r["users"],
            [f"weights per GPU: {fmt(ref.weight_bytes(ref.param_count(cfg), dt) / GB)} GB / {n} = "
             f"{fmt(r['weight_bytes_per_gpu'] / GB)} GB",
             f"free per GPU: 0.9 x {fmt(mem / GB)} - {fmt(r['weight_bytes_per_gpu'] / GB)} - 2 GiB = "
             f"{fmt(r['free_kv_bytes_per_gpu'] / GB)} GB",
             f"KV per token per GPU ({dt}, TP {n}): {fmt(r['kv_bytes_per_token_per_gpu'])} bytes; x {ctx:,} = "
             f"{fmt(r['kv_bytes_per_token_per_gpu'] * ctx / GB)} GB per user",
             f"users = floor({fmt(r['free_kv_bytes_per_gpu'] / GB)} / {fmt(r['kv_bytes_per_token_per_gpu'] * ctx / GB)}) = {r['users']}"],
            "Do the budget per GPU: each GPU holds 1/TP of the weights and of every user's cache.",
            rtol=0, mistakes={
                "forgets that TP splits the KV cache too": math.floor(r["free_kv_bytes_per_gpu"] / (ref.kv_bytes_per_token_per_gpu(cfg, dt, 1) * ctx)),
                "forgets the runtime reserve": ref.max_users(cfg, mem, n, ctx, dt, dt, reserve_gib=0)["users"],
                "uses all of the memory (ignores gpu_memory_utilization)": ref.max_users(cfg, mem, n, ctx, dt, dt, 1.0)["users"]})

    q = ask("bf16", f"{shape.name} ({describe(cfg)}) on {group_text(n, chip)}. The engine uses 0.9 of each GPU's memory "
                    f"and keeps 2 GiB per GPU in reserve. Weights and KV cache in bf16: how many users of {ctx:,} tokens "
                    "fit at once?")
    q.follow_ups.append(ask("fp8", "Now weights and KV cache are both fp8: how many users?"))
    q.follow_ups[0].why = "fp8 halves the per-token bill and frees half the weights' slice: about twice the users, or more."
    return q


@template(STEM, "free KV memory per GPU")
def free_kv(rng, ref):
    shape, chip, n = deployment(rng)
    cfg = hf_config(shape)
    mem = chip.memory_bytes

    def ask(g, prompt):
        r = ref.max_users(cfg, mem, g, 8192)
        total = ref.weight_bytes(ref.param_count(cfg), "bf16")
        return Numeric(
            prompt, "GB", r["free_kv_bytes_per_gpu"] / GB,
            [f"usable: 0.9 x {fmt(mem / GB)} GB = {fmt(0.9 * mem / GB)} GB",
             f"weights: {fmt(total / GB)} GB / {g} = {fmt(r['weight_bytes_per_gpu'] / GB)} GB per GPU",
             f"reserve: 2 GiB = {fmt(2 * GiB / GB)} GB", f"free for KV: {fmt(r['free_kv_bytes_per_gpu'] / GB)} GB per GPU"],
            "Every GPU of the group pays the reserve and its share of the weights before the cache gets a byte.",
            rtol=0.01, mistakes={"does not divide the weights across the GPUs": (0.9 * mem - total - 2 * GiB) / GB,
                                 "forgets the 2 GiB reserve": (r["free_kv_bytes_per_gpu"] + 2 * GiB) / GB})

    q = ask(n, f"{shape.name} in bf16 on {group_text(n, chip)}; the engine uses 0.9 of each GPU's memory and keeps 2 GiB "
               "per GPU in reserve. How many GB per GPU are left for the KV cache?")
    n2 = 2 * n if n < 8 else n // 2
    q.follow_ups.append(ask(n2, f"Now TP over {n2} GPUs: GB left per GPU?"))
    return q


@template(STEM, "MoE weights per GPU")
def moe_weights(rng, ref):
    ds = ref.DEEPSEEK_V3
    dtype, n = pick(rng, ["fp8", "bf16", "int4"]), pick(rng, [4, 8, 16, 32])
    chip = pick(rng, CHIPS)
    total = ref.weight_bytes(int(ds["params"]), dtype)
    per_gpu = total / n
    q = Numeric(
        f"{ds['name']} has {ds['params'] / 1e9:.0f}B parameters, of which {ds['active_params'] / 1e9:.0f}B run for each "
        f"token (its technical report). Served in {dtype} with its weights spread evenly over {n} GPUs (experts by "
        "expert parallelism, the rest split alike), how many GB of weights does each GPU hold?", "GB", per_gpu / GB,
        [f"every expert must be resident: {fmt(ds['params'])} parameters in {dtype} = {fmt(total / GB)} GB"
         + (" (int4: half a byte per weight plus one fp16 scale per group of 128)" if dtype == "int4" else ""),
         f"over {n} GPUs: {fmt(per_gpu / GB)} GB each"],
        "An MoE's memory follows its total parameters; its FLOPs and per-token reads follow the active ones.",
        rtol=0.01,
        mistakes={"sizes the weights by the active parameters": ref.weight_bytes(int(ds["active_params"]), dtype) / n / GB,
                  "does not divide the weights across the GPUs": total / GB})
    mem = chip.memory_bytes
    free = 0.9 * mem - per_gpu - 2 * GiB
    q.follow_ups.append(Numeric(
        f"Each GPU is an {chip.name} ({mem / GB:.2f} GB as its driver reports it); the engine uses 0.9 of it and keeps "
        "2 GiB in reserve. How many GB per GPU are left for the KV cache (negative: the weights do not fit)?", "GB",
        free / GB,
        [f"usable: 0.9 x {fmt(mem / GB)} = {fmt(0.9 * mem / GB)} GB", f"weights: {fmt(per_gpu / GB)} GB",
         f"reserve: {fmt(2 * GiB / GB)} GB", f"left: {fmt(free / GB)} GB"],
        "Check the fit per GPU: the weights' share and the reserve come first.",
        rtol=0.01,
        mistakes={"uses the datasheet label (1e9-byte GB) instead of the driver's total":
                  (0.9 * {"A100 SXM 80GB": 80e9, "H100 SXM": 80e9, "H200 SXM": 141e9}[chip.name] - per_gpu - 2 * GiB) / GB,
                  "forgets the 2 GiB reserve": (free + 2 * GiB) / GB}))
    return q


@template(STEM, "int4 matrix with scales")
def int4_matrix(rng, ref):
    out, inp = pick(rng, [4096, 8192, 14336, 28672]), pick(rng, [4096, 8192, 14336])
    g = pick(rng, [32, 64, 128])

    def ask(zp, prompt):
        b = ref.quantized_linear_bytes(out, inp, g, zp)
        groups = out * math.ceil(inp / g)
        return Numeric(
            prompt, "MB", b / 1e6,
            [f"weights: {out:,} x {inp:,} x 4 bits = {fmt(out * inp / 2)} bytes",
             f"groups: {out:,} rows x ceil({inp:,} / {g}) = {fmt(groups)}; each an fp16 scale (2 bytes)"
             + (" and a 4-bit zero point (0.5 byte)" if zp else ""),
             f"total {fmt(b)} bytes = {fmt(b / 1e6)} MB"],
            "The smaller the group, the better the accuracy and the more the scales cost.", rtol=0.005,
            mistakes={"forgets the group scales": out * inp / 2 / 1e6, "counts 4 bytes per weight": out * inp * 4 / 1e6})

    q = ask(False, f"One int4 weight matrix of {out:,} x {inp:,} (out x in), GPTQ-style: groups of {g} along the input "
                   "dimension, one fp16 scale per group. How many MB (1e6 bytes)?")
    q.follow_ups.append(ask(True, "Now asymmetric, with a 4-bit zero point per group as well: MB?"))
    return q


@template(STEM, "explain the split")
def explain(rng, ref):
    return Open(
        "A 70B model on one H200 or on 2, 4 or 8 H100s: why does the number of users change with how the model is split, "
        "by more than the extra memory explains?",
        ["do the budget per GPU: 0.9 x memory - weights / TP - a runtime reserve",
         "the KV cache splits by KV head across the TP ranks, so each GPU holds 1/TP of every user's cache",
         "past one KV head per rank (TP > KV heads) heads are replicated: no further saving",
         "every GPU pays the reserve, and smaller groups mean more copies of the weights in a fleet",
         "weights that do not fit give zero users, whatever the memory elsewhere",
         "fp8 weights and KV roughly double what is left and halve the per-token bill"],
        "Memory is a per-GPU budget: the split decides how much of each GPU the weights and each user's cache take.")
