"""Checks of lesson 06: parameters, weight bytes, KV per GPU under TP, concurrent users."""
from __future__ import annotations

import math

from autograder.checks import _configs
from autograder.checks._configs import NULL_FIELDS_7B, call, describe, non_default, shape
from autograder.core import check
from autograder.reference import answer_code

GiB = 2**30

# Visible configs. Llama-3.2-1B ties its embeddings; Mistral-Nemo (a Llama-style architecture)
# sets a head_dim that is not hidden / heads; the Llama-1-style 7B file predates GQA and has no
# num_key_value_heads (so: multi-head attention).
LLAMA_3_2_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                "vocab_size": 128256, "tie_word_embeddings": True}
MISTRAL_NEMO_12B = {"hidden_size": 5120, "intermediate_size": 14336, "num_hidden_layers": 40,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                    "vocab_size": 131072, "tie_word_embeddings": False}
LLAMA_1_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "vocab_size": 32000}


def random_config(rng, force_gqa: bool = False) -> dict:
    """A Llama-style config of random shape (the shared generator's traps), KV head counts that are not
    powers of two among them, so that some TP degrees go past the KV heads."""
    return _configs.random_config(rng, kv_heads=(1, 2, 4, 5, 8, 10, 16),
                                  groups=(2, 4, 8) if force_gqa else (1, 2, 4, 8), layers=(2, 96))


def valid_tps(cfg: dict) -> list[int]:
    """TP degrees vLLM accepts: they divide the heads and divide or are multiples of the KV heads."""
    s = shape(cfg)
    return [tp for tp in range(1, s.heads + 1) if s.heads % tp == 0 and (s.kv_heads % tp == 0 or tp % s.kv_heads == 0)]


# ---------------------------------------------------------------- 1.1


@answer_code
def _count(cfg, gqa=True, mlp_mats=3, layer_norms=2, final_norm=True, lm_head=None, head_dim=None):
    """Parameter count with one convention changed: the values of the typical mistakes."""
    h, inter, vocab, layers = (cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"],
                               cfg["num_hidden_layers"])
    s = shape(cfg)
    heads, d = s.heads, head_dim or s.head_dim
    kv = s.kv_heads if gqa else heads
    attn = 2 * h * heads * d + 2 * h * kv * d
    tied = cfg.get("tie_word_embeddings", False)
    lm = (0 if tied else vocab * h) if lm_head is None else lm_head * vocab * h
    return layers * (attn + mlp_mats * h * inter + layer_norms * h) + vocab * h + final_norm * h + lm


@answer_code
def _param_mistakes(cfg) -> dict:
    return {"gives K and V as many heads as Q (ignores num_key_value_heads: GQA)": _count(cfg, gqa=False),
            "counts two MLP matrices; SwiGLU has three (gate, up, down)": _count(cfg, mlp_mats=2),
            "leaves out the RMSNorm weights": _count(cfg, layer_norms=0, final_norm=False),
            "counts one RMSNorm per layer; there are two": _count(cfg, layer_norms=1),
            "leaves out the final RMSNorm": _count(cfg, final_norm=False),
            "leaves out the lm_head, which is a separate matrix unless tie_word_embeddings is true":
                _count(cfg, lm_head=0),
            "counts a separate lm_head although tie_word_embeddings is true": _count(cfg, lm_head=1),
            "ignores the config's head_dim and uses hidden_size / num_attention_heads":
                _count(cfg, head_dim=cfg["hidden_size"] // cfg["num_attention_heads"])}


@check(points=3, section="1.1")
def param_count(t):
    """Parameter count of a Llama-style config.json."""
    visible = [("Llama-3-70B", t.ref.LLAMA_3_70B), ("Llama-3-8B", t.ref.LLAMA_3_8B),
               ("Llama-3.2-1B (tied embeddings, explicit head_dim)", LLAMA_3_2_1B),
               ("Mistral-Nemo-12B (head_dim 128, hidden / heads = 160)", MISTRAL_NEMO_12B),
               ("Llama-1-7B-style (no num_key_value_heads: MHA)", LLAMA_1_7B),
               ("a 7B MHA config with num_key_value_heads and head_dim null", NULL_FIELDS_7B)]
    for label, cfg in t.cases(visible, random_config, n=3):
        with t.case(f"{label}: {describe(cfg)}"):
            expected = t.ref.param_count(cfg)
            t.expect(call(t, "param_count", cfg), expected, "parameters", mistakes=_param_mistakes(cfg))


# ---------------------------------------------------------------- 2.1 / 2.2


@answer_code
def _int4_mistakes(out_f, in_f, g, zp) -> dict:
    groups = out_f * math.ceil(in_f / g)
    zero = 0.5 if zp else 0.0
    weights = out_f * in_f / 2
    right = weights + groups * (2 + zero)
    return {"returns bits, not bytes": right * 8,
            "forgets the fp16 group scales": weights + groups * zero,
            "forgets the group scales and zero points": weights,
            "counts each 4-bit weight as 4 bytes (bits vs bytes)": out_f * in_f * 4 + groups * (2 + zero),
            "stores one scale per row instead of one per group of group_size weights":
                weights + out_f * (2 + zero),
            "stores the zero point in 2 bytes; it is packed in 4 bits": weights + groups * (2 + 2 * zp),
            "ignores zero_point": weights + groups * 2,
            "rounds the groups per row down, dropping the short last group":
                weights + out_f * (in_f // g) * (2 + zero),
            "floor-divides the bits by 8, dropping a half byte: an odd count of 4-bit values (weights and zero "
            "points) takes a half byte, so the bytes may be fractional": (out_f * in_f * 4 + groups * (16 + 4 * zp)) // 8}


@check(points=2, section="2.1")
def quantized_linear_bytes(t):
    """Bytes of one int4 matrix with its group scales."""
    visible = [("a square matrix", (8192, 8192, 128, False)), ("an MLP matrix", (8192, 28672, 128, False)),
               ("groups of 64 with zero points", (1024, 8192, 64, True)), ("a short last group", (1000, 1000, 128, False)),
               ("one row of 100 weights with a zero point (a half byte)", (1, 100, 128, True))]

    def hidden(rng):
        return (rng.randint(1, 64) * 128, rng.randint(1, 400) * 64 + rng.choice([0, 0, 17]),
                rng.choice([32, 64, 128, 256]), rng.random() < 0.5)
    for label, (o, n, g, zp) in t.cases(visible, hidden, n=3):
        with t.case(f"{label}: W[{o}, {n}], group_size={g}, zero_point={zp}"):
            expected = t.ref.quantized_linear_bytes(o, n, g, zp)
            t.expect(t.call("quantized_linear_bytes", o, n, **non_default(group_size=(g, 128), zero_point=(zp, False))),
                     expected, "bytes", mistakes=_int4_mistakes(o, n, g, zp))


@check(points=2, section="2.2")
def weight_bytes(t):
    """Bytes of a parameter count in bf16, fp8, int8, int4 (with scales)."""
    n70 = t.ref.param_count(t.ref.LLAMA_3_70B)
    visible = [("Llama-3-70B", (n70, "bf16", 128, False)), ("Llama-3-70B", (n70, "fp8", 128, False)),
               ("Llama-3-70B", (n70, "int4", 128, False)), ("Llama-3-8B", (8_030_261_248, "int4", 64, True)),
               ("a small count with a short last group", (1000, "int4", 128, False))]

    def hidden(rng):
        return (rng.randint(10**8, 4 * 10**11), rng.choice(["fp32", "bf16", "fp16", "fp8", "int8", "int4", "int4"]),
                rng.choice([32, 64, 128, 256]), rng.random() < 0.5)
    for label, (n, dtype, g, zp) in t.cases(visible, hidden, n=4):
        with t.case(f"{label}: {n:,} weights in {dtype}" + (f" (group_size={g}, zero_point={zp})" if dtype == "int4" else "")):
            expected = t.ref.weight_bytes(n, dtype, g, zp)
            bits = t.ref.DTYPE_BITS[dtype]
            mistakes = {"returns bits, not bytes": expected * 8,
                        "uses the bit width as bytes per weight": n * bits}
            if dtype == "int4":  # a count has no rows: the per-row mistake does not apply
                mistakes.update({k: v for k, v in _int4_mistakes(1, n, g, zp).items() if not k.startswith("stores one scale per row")})
            got = t.call("weight_bytes", n, dtype, **non_default(group_size=(g, 128), zero_point=(zp, False)))
            t.expect(got, expected, "bytes", mistakes=mistakes)


# ---------------------------------------------------------------- 3.1


@answer_code
def _kv_mistakes(cfg, tp, whole) -> dict:
    """The usual wrong splits of `whole`, the model's KV bytes per token (the given helper's value)."""
    s = shape(cfg)
    per_head = whole // s.kv_heads
    return {"does not divide the KV heads across the TP ranks": whole,
            "divides the whole model's bytes by TP, which past the KV-head count splits heads into "
            "fractions: a rank holds at least one whole head": whole / tp,
            "rounds the KV heads per rank down (to 0 past the KV-head count); it is ceil(kv_heads / tp)":
                per_head * (s.kv_heads // tp),
            "uses the query heads, not the KV heads": per_head * math.ceil(s.heads / tp),
            "takes one head's bytes as the whole model's / num_attention_heads; the whole counts only the "
            "KV heads, so divide by num_key_value_heads": whole // s.heads * math.ceil(s.kv_heads / tp)}


def _random_tp(rng, past_kv_heads: bool) -> tuple:
    """(cfg, tp): a random config and a TP degree vLLM accepts, past its KV-head count when asked and possible."""
    cfg = random_config(rng, force_gqa=past_kv_heads)
    tps, kv = valid_tps(cfg), shape(cfg).kv_heads
    beyond = [tp for tp in tps if tp > kv]
    return cfg, rng.choice(beyond) if (past_kv_heads and beyond) else rng.choice(tps)


@check(points=3, section="3.1")
def kv_bytes_per_token_per_gpu(t):
    """KV bytes per token per GPU: the whole model's (given) split by KV head, replicated when TP > KV heads."""
    m70, m8 = t.ref.LLAMA_3_70B, t.ref.LLAMA_3_8B
    visible = [("Llama-3-70B", (m70, "bf16", 1)), ("Llama-3-70B", (m70, "bf16", 8)),
               ("Llama-3-70B", (m70, "bf16", 16)), ("Llama-3-70B", (m70, "fp8", 4)),
               ("Llama-3-8B", (m8, "bf16", 2)), ("Llama-1-7B-style (MHA)", (LLAMA_1_7B, "bf16", 4)),
               ("a 7B MHA config with num_key_value_heads and head_dim null", (NULL_FIELDS_7B, "fp8", 8))]
    hidden = [(cfg, t.rng.choice(["bf16", "fp8", "fp32"]), tp) for cfg, tp in (_random_tp(t.rng, i == 0) for i in range(3))]
    for label, (cfg, dtype, tp) in t.cases(visible, hidden):
        with t.case(f"{label}, {dtype}, TP={tp}: {describe(cfg)}"):
            expected = t.ref.kv_bytes_per_token_per_gpu(cfg, dtype, tp)
            got = call(t, "kv_bytes_per_token_per_gpu", cfg, **non_default(kv_dtype=(dtype, "bf16"), tp=(tp, 1)))
            t.expect(got, expected, "KV bytes per token per GPU",
                     mistakes=_kv_mistakes(cfg, tp, t.ref.kv_bytes_per_token(cfg, dtype)), count=True)


# ---------------------------------------------------------------- 4.1

KEYS = ("weight_bytes_per_gpu", "kv_bytes_per_token_per_gpu", "free_kv_bytes_per_gpu", "users", "reason")
DEFAULTS = {"weight_dtype": "bf16", "kv_dtype": "bf16", "gpu_memory_utilization": 0.9, "reserve_gib": 2.0}


@answer_code
def _free_mistakes(mem, util, w, reserve) -> dict:
    r = reserve * GiB
    return {"does not subtract the runtime reserve": mem * util - w,
            "treats reserve_gib as GB (1e9 bytes); a GiB is 2**30 bytes": mem * util - w - reserve * 1e9,
            "ignores gpu_memory_utilization": mem - w - r,
            "ignores gpu_memory_utilization and the reserve": mem - w,
            "uses gpu_memory_utilization=0.9 whatever the caller passes": mem * 0.9 - w - r,
            "uses reserve_gib=2 whatever the caller passes": mem * util - w - 2 * GiB}


def _expect_reason(t, got, exp, ctx):
    """None when users fit; else a sentence naming which of the two causes it is."""
    reason = got["reason"]
    if exp["users"] > 0:
        t.expect_true(reason is None, f"reason should be None when users fit; got {reason!r}")
        return
    weights_fail = exp["free_kv_bytes_per_gpu"] <= 0
    t.expect_true(isinstance(reason, str) and reason.strip() != "",
                  "when no user fits, reason should be a sentence saying why ("
                  + ("the weights and the reserve do not fit" if weights_fail else
                     f"the weights fit, but one sequence of {ctx} tokens needs more KV than is free") + f"); got {reason!r}")
    text = reason.lower()
    if weights_fail and "weight" not in text:
        t.fail(f"reason: {reason!r} does not say that the weights (with the reserve) do not fit, which is why "
               f"no user fits here (free KV bytes per GPU: {exp['free_kv_bytes_per_gpu']:.4g})")
    if not weights_fail and not any(w in text for w in ("sequence", "token", "context", "kv", "user")):
        t.fail(f"reason: {reason!r}.", "gives the same reason for both causes: here the weights fit "
               f"({exp['free_kv_bytes_per_gpu']:.4g} bytes of KV free per GPU), but one sequence of {ctx} tokens "
               "needs more KV than that; say so (the sequence, its tokens or its KV)", end="")


def _users_case(t, label, cfg, mem, n, ctx, wd, kd, util, reserve):
    args = (cfg, mem, n, ctx, wd, kd, util, reserve)
    with t.case(label):
        exp = t.ref.max_users(*args)
        got = call(t, "max_users", cfg, mem, n, ctx, **non_default(**{k: (v, DEFAULTS[k]) for k, v in zip(DEFAULTS, args[4:])}))
        t.expect_true(isinstance(got, dict) and all(k in got for k in KEYS),
                      f"max_users should return a dict with keys {list(KEYS)}; got {type(got).__name__}"
                      + (f" with keys {sorted(got)}" if isinstance(got, dict) else ""))
        params = t.ref.param_count(cfg)
        w_mistakes = {"puts the whole model's weights on every GPU; TP splits them": t.ref.weight_bytes(params, wd)}
        if wd != "bf16":
            w_mistakes["ignores weight_dtype (sizes the weights in bf16)"] = t.ref.weight_bytes(params, "bf16") / n
        t.expect(got["weight_bytes_per_gpu"], exp["weight_bytes_per_gpu"], "weight_bytes_per_gpu", mistakes=w_mistakes)
        kv_tp1 = t.ref.kv_bytes_per_token_per_gpu(cfg, kd, 1)
        kv_mistakes = {"counts the KV per token of the whole model on every GPU": kv_tp1,
                       "splits the KV heads into fractions of a head": kv_tp1 / n}
        if kd != "bf16":
            kv_mistakes["ignores kv_dtype (sizes the cache in bf16)"] = t.ref.kv_bytes_per_token_per_gpu(cfg, "bf16", n)
        t.expect(got["kv_bytes_per_token_per_gpu"], exp["kv_bytes_per_token_per_gpu"],
                 "kv_bytes_per_token_per_gpu", mistakes=kv_mistakes)
        t.expect(got["free_kv_bytes_per_gpu"], exp["free_kv_bytes_per_gpu"], "free_kv_bytes_per_gpu",
                 mistakes=_free_mistakes(mem, util, exp["weight_bytes_per_gpu"], reserve))
        exact = exp["free_kv_bytes_per_gpu"] / (exp["kv_bytes_per_token_per_gpu"] * ctx)
        if exp["users"] == 0 and isinstance(got["users"], (int, float)) and got["users"] < 0:
            t.fail(f"users: got {got['users']}, expected 0.", "reports a negative user count when the weights do "
                   "not fit; it should be 0")
        t.expect(got["users"], exp["users"], "users",
                 mistakes={"does not round the user count down to a whole number": exact,
                           "rounds the user count to the nearest integer; a partial user does not fit":
                               round(exact)}, count=True)
        _expect_reason(t, got, exp, ctx)


def _random_users_case(t, i: int) -> tuple:
    """A random TP group and workload (the first one with TP past the KV heads when the config allows),
    on GPUs from 0.85x to 4x what the weights and reserve need: mostly fits, sometimes not."""
    rng = t.rng
    cfg, tp = _random_tp(rng, i == 0)
    wd, kd = rng.choice(["bf16", "fp8", "int4"]), rng.choice(["bf16", "fp8"])
    util, reserve = rng.choice([0.8, 0.85, 0.9, 0.92, 0.95]), rng.choice([0.5, 1.0, 2.0, 3.5])
    ctx = rng.choice([1024, 4096, 8192, 32768, 131072]) + rng.choice([0, 0, 100])
    need = (t.ref.weight_bytes(t.ref.param_count(cfg), wd) / tp + reserve * GiB) / util
    mem = max(1, round(need * rng.uniform(0.85, 4.0) / 1e9)) * 1e9
    return (f"{mem / 1e9:g} GB x {tp} GPUs ({shape(cfg).kv_heads} KV heads), weights {wd}, KV {kd}, {ctx} tokens, "
            f"util {util}, reserve {reserve} GiB", cfg, mem, tp, ctx, wd, kd, util, reserve)


@check(points=4, section="4.1")
def max_users(t):
    """Concurrent users at a context length on a TP group; a reason for each of the two ways none fits."""
    m70, m8, H100, H200 = t.ref.LLAMA_3_70B, t.ref.LLAMA_3_8B, 80e9, 141e9
    visible = [("Llama-3-70B, 8xH100, bf16, 8k (the defaults)", (m70, H100, 8, 8192, "bf16", "bf16", 0.9, 2.0)),
               ("Llama-3-70B, 1xH200, bf16: the weights do not fit", (m70, H200, 1, 8192, "bf16", "bf16", 0.9, 2.0)),
               ("Llama-3-70B, 1xH200, fp8, 8k", (m70, H200, 1, 8192, "fp8", "fp8", 0.9, 2.0)),
               ("Llama-3-70B, 16xH100, bf16, 32k (TP > KV heads)", (m70, H100, 16, 32768, "bf16", "bf16", 0.9, 2.0)),
               ("Llama-3-8B, 1xH100, bf16, 8k, util 0.8, reserve 1.5 GiB",
                (m8, H100, 1, 8192, "bf16", "bf16", 0.8, 1.5)),
               ("Llama-3-70B, 2xH100, fp8 weights: they fit, but one 1M-token sequence does not",
                (m70, H100, 2, 1_048_576, "fp8", "bf16", 0.95, 1.0))]
    hidden = [_random_users_case(t, i) for i in range(4)]
    shown = {f"hidden {i + 1}": h[0] for i, h in enumerate(hidden)}
    for label, case in t.cases(visible, [h[1:] for h in hidden]):
        _users_case(t, f"{label}: {shown[label]}" if label in shown else label, *case)
