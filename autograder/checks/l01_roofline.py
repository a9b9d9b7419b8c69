"""Checks for lesson 01: the roofline of prefill vs decode.

Visible cases use the lesson's Llama-3 shapes and datasheet chips; hidden ones draw made-up
models, token counts, contexts, number formats and chips from t.rng, so no table can be
hard-coded. Expected values always come from the reference (t.ref); the `mistakes` are the
same formula with one typical error put in.
"""
from __future__ import annotations

import math

from autograder import compare as cmp
from autograder.checks._configs import non_default
from autograder.core import check
from autograder.reference import answer_code

GiB = 2**30


# ---------------------------------------------------------------- case generators


TWO_BYTE_WEIGHTS = ("uses 2 bytes per weight whatever weight_dtype (bf16's size): a weight takes "
                    "DTYPE_BITS[weight_dtype] / 8 bytes")


def _fmt_model(m: dict) -> str:
    return (f"{m['name']} (P={m['params']:.3g}, {m['layers']} layers, {m['heads']} heads / "
            f"{m['kv_heads']} KV heads, head_dim {m['head_dim']})")


def _fmt_chip(c: dict) -> str:
    return f"{c['name']} ({c['dense_tflops']:g} dense TFLOP/s, {c['hbm_gb_per_s']:g} GB/s)"


def _random_model(rng) -> dict:
    heads = rng.choice([8, 16, 24, 32, 40, 64, 96, 128])
    return {"name": "made-up model", "params": rng.randint(10**9, 4 * 10**11),
            "layers": rng.randint(4, 126), "heads": heads,
            "kv_heads": rng.choice([g for g in (1, 2, 4, 8, 16, heads) if heads % g == 0 and g < heads]),
            "head_dim": rng.choice([64, 96, 128, 256])}


def _random_chip(rng) -> dict:
    dense = round(rng.uniform(40.0, 3000.0), 1)
    return {"name": "made-up chip", "dense_tflops": dense, "sparse_tflops": 2 * dense,
            "hbm_gb_per_s": round(rng.uniform(400.0, 12000.0), 1)}


def _named(t, name: str) -> dict:
    return dict(t.ref.CHIPS[name], name=name)


def _nbytes(bits: dict, dtype: str) -> float:
    return bits[dtype] / 8


@answer_code
def _kv_per_token(bits: dict, model: dict, kv_dtype: str, heads_key: str = "kv_heads", kv_factor: int = 2) -> float:
    return kv_factor * model["layers"] * model[heads_key] * model["head_dim"] * _nbytes(bits, kv_dtype)


# ---------------------------------------------------------------- 1. the cost of a forward pass


@check(points=2, section="1.1", timeout=10)
def matmul_cost(t):
    """FLOPs and bytes of one matmul."""
    def hidden(rng):
        return tuple(rng.randint(1, 8192) for _ in range(3)) + (rng.choice(["fp32", "fp16", "bf16", "fp8"]),)
    visible = [("one token", (1, 4096, 4096, "bf16")), ("2000 tokens", (2000, 4096, 4096, "bf16"))]
    for label, (m, n, k, dtype) in t.cases(visible, hidden, n=3):
        label = f"{label}: [{m}, {k}] @ [{k}, {n}] in {dtype}"
        with t.case(label):
            got, expected = t.both("matmul_cost", m, n, k, dtype)
            f, b, elems = expected["flops"], _nbytes(t.ref.DTYPE_BITS, dtype), m * k + k * n + m * n
            t.expect(got, expected, f"matmul_cost({m}, {n}, {k}, {dtype!r})", rtol=1e-9, mistakes={
                "counts a multiply-add as one FLOP (it is two: a multiply and an add)":
                    {"flops": m * n * k, "bytes": expected["bytes"]},
                "leaves out writing the output C": {"flops": f, "bytes": (m * k + k * n) * b},
                "counts only the weight matrix B, not reading A and writing C": {"flops": f, "bytes": k * n * b},
                "counts elements, not bytes": {"flops": f, "bytes": elems},
                "uses bits instead of bytes (DTYPE_BITS / 8 is bytes)": {"flops": f, "bytes": elems * b * 8},
            })


def _random_pass(rng, kind: str) -> tuple:
    """(model, new_tokens, cached) of a made-up model: a "decode" (1 new token), a "prefill" (nothing
    cached) or a "chunk" (some new tokens after some cached ones)."""
    model = _random_model(rng)
    new = 1 if kind == "decode" else rng.randint(2, 4096)
    return model, new, 0 if kind == "prefill" else rng.randint(0, 32768)


def _pass_cases(t, hidden_kinds: list[str]) -> list:
    """(label, model, new_tokens, cached) for one sequence's forward pass: the lesson's three passes,
    then one hidden pass of each kind in `hidden_kinds`."""
    m8, m70 = t.ref.LLAMA_3_8B, t.ref.LLAMA_3_70B
    visible = [("Llama-3-8B decode", (m8, 1, 2000)), ("Llama-3-8B prefill", (m8, 2000, 0)),
               ("Llama-3-70B chunk", (m70, 512, 1536))]
    hidden = [_random_pass(t.rng, kind) for kind in hidden_kinds]
    return [(f"{label}: {_fmt_model(m)}, {new} new, {cached} cached", m, new, cached)
            for label, (m, new, cached) in t.cases(visible, hidden)]


@check(points=3, section="1.2", timeout=10)
def attention_flops(t):
    """Attention score/value FLOPs under the causal mask, with a KV cache."""
    for label, model, new, cached in _pass_cases(t, ["decode", "chunk", "prefill"]):
        with t.case(label):
            got, expected = t.both("attention_flops", model, new, cached)
            L, h, kvh, d = model["layers"], model["heads"], model["kv_heads"], model["head_dim"]
            causal = new * cached + new * (new + 1) // 2
            t.expect(got, expected, f"attention_flops({model['name']}, {new}, {cached})", rtol=1e-9, mistakes={
                "uses the KV heads: Q K^T and P V run once per query head (GQA shares K and V, not the work)":
                    4 * L * kvh * d * causal,
                "ignores the causal mask: new token i sees only cached + i + 1 keys":
                    4 * L * h * d * new * (cached + new),
                "drops the diagonal: a token also attends to itself (cached + i + 1 keys, not cached + i)":
                    4 * L * h * d * (new * cached + new * (new - 1) // 2),
                "counts 2 FLOPs per key and head_dim instead of 4 (Q K^T and P V are two matmuls, "
                "2 FLOPs per multiply-add each)": 2 * L * h * d * causal,
                "leaves out the number of layers": 4 * h * d * causal,
                "ignores the cached context: the new tokens attend to the cached keys too":
                    4 * L * h * d * new * (new + 1) // 2,
            })


@check(points=2, section="1.3", timeout=10)
def forward_flops(t):
    """Total FLOPs of one forward pass: weight matmuls plus attention."""
    for label, model, new, cached in _pass_cases(t, ["decode", "chunk"]):
        with t.case(label):
            got, expected = t.both("forward_flops", model, new, cached)
            P, attn = model["params"], t.ref.attention_flops(model, new, cached)
            t.expect(got, expected, f"forward_flops({model['name']}, {new}, {cached})", rtol=1e-9, mistakes={
                "counts a multiply-add as one FLOP in the weight matmuls (2 * params * tokens)": P * new + attn,
                "leaves out the attention term": 2 * P * new,
                "does not scale the weight FLOPs with the number of new tokens": 2 * P + attn,
            }, hint="forward_flops is 2 * params * new_tokens plus your attention_flops: "
                    "make the attention_flops check pass first.")


@check(points=2, section="1.4", timeout=10)
def forward_bytes(t):
    """HBM bytes of one forward pass: weights once, KV read and written."""
    def hidden(rng):
        wd = rng.choice(["fp32", "bf16", "fp8", "int4"])
        return _random_pass(rng, rng.choice(["decode", "chunk", "prefill"])) + (
            wd, rng.choice([d for d in ("fp32", "bf16", "fp8") if d != wd]))
    m8, m70 = t.ref.LLAMA_3_8B, t.ref.LLAMA_3_70B
    visible = [("Llama-3-8B decode", (m8, 1, 2000, "bf16", "bf16")),
               ("Llama-3-8B prefill", (m8, 2000, 0, "bf16", "bf16")),
               ("Llama-3-70B decode", (m70, 1, 8000, "fp8", "bf16"))]
    cases = [(f"{label}: {_fmt_model(m)}, {new} new, {cached} cached, {wd} weights, {kd} KV", m, new, cached, wd, kd)
             for label, (m, new, cached, wd, kd) in t.cases(visible, hidden, n=3)]
    for label, model, new, cached, wd, kd in cases:
        with t.case(label):
            got, expected = t.both("forward_bytes", model, new, cached, wd, kd)
            W, K = model["params"] * _nbytes(t.ref.DTYPE_BITS, wd), _kv_per_token(t.ref.DTYPE_BITS, model, kd)
            t.expect(got, expected, f"forward_bytes({model['name']}, {new}, {cached}, {wd!r}, {kd!r})",
                     rtol=1e-9, mistakes={
                         "counts the weights once per token instead of once per pass": new * W + (cached + new) * K,
                         "ignores the KV cache read of the cached tokens": W + new * K,
                         "leaves out writing K and V of the new tokens": W + cached * K,
                         "counts only K, not K and V": W + (cached + new) * K / 2,
                         "sizes the KV cache with the query heads (GQA stores only kv_heads)":
                             W + (cached + new) * _kv_per_token(t.ref.DTYPE_BITS, model, kd, "heads"),
                         "uses the weight dtype for the KV cache too": W + (cached + new) * _kv_per_token(t.ref.DTYPE_BITS, model, wd),
                         "uses bits instead of bytes (DTYPE_BITS / 8 is bytes)": 8 * expected,
                         **({TWO_BYTE_WEIGHTS: 2 * model["params"] + (cached + new) * K} if wd != "bf16" else {}),
                     })


# ---------------------------------------------------------------- 2. the roofline


@answer_code
def _ridge(chip: dict) -> float:
    """The ridge point by its definition, for drawing cases near it (the expected value is t.ref's)."""
    return chip["dense_tflops"] * 1e12 / (chip["hbm_gb_per_s"] * 1e9)


# A made-up chip whose ridge point is exactly 250 FLOP/byte in floating point (1e15 / 4e12), so that
# a pass can sit exactly on it: the boundary between the two bounds.
RIDGE_250 = {"name": "made-up chip", "dense_tflops": 1000.0, "sparse_tflops": 2000.0, "hbm_gb_per_s": 4000.0}
# A toy whose KV for one token is large beside its weights (as in the course's tiny model): counting the new
# token's own key with include_kv=False moves the answer (262, not 296 on an H100).
TOY_32_LAYERS = {"name": "a 2M-parameter toy", "params": 2_000_000, "layers": 32, "heads": 8, "kv_heads": 8,
                 "head_dim": 64}


@check(points=1, section="2.1", timeout=10)
def ridge_point(t):
    """Ridge point of a chip, from its dense peak and HBM bandwidth."""
    for label, chip in t.cases([(name, _named(t, name)) for name in t.ref.CHIPS], _random_chip, n=2):
        with t.case(f"{label}: {_fmt_chip(chip)}"):
            got, expected = t.both("ridge_point", chip)
            dense, sparse, gbs = chip["dense_tflops"], chip["sparse_tflops"], chip["hbm_gb_per_s"]
            t.expect(got, expected, "ridge point (FLOP/byte)", rtol=1e-9, mistakes={
                "uses the sparse TFLOP/s: that figure assumes 2:4 structured sparsity, dense matmuls "
                "never reach it": sparse * 1e12 / (gbs * 1e9),
                "mixes GB and GiB: 1 GB/s is 1e9 bytes/s, not 2**30": dense * 1e12 / (gbs * GiB),
                "divides bandwidth by peak instead of peak by bandwidth": gbs * 1e9 / (dense * 1e12),
                "divides TFLOP/s by GB/s without converting both to base units (off by 1000)": dense / gbs,
            })


@answer_code
def _roof(flops, nbytes, peak, bw, *, add_times=False, flip=False, no_cap=False, strict=False) -> dict:
    ai = flops / nbytes
    compute = ai > peak / bw if strict else ai >= peak / bw
    return {"intensity": ai, "attainable_flops_per_s": ai * bw if no_cap else min(peak, ai * bw),
            "bound": "compute" if compute != flip else "memory",
            "time_s": flops / peak + nbytes / bw if add_times else max(flops / peak, nbytes / bw)}


def _random_pass_on_chip(rng) -> tuple:
    """(flops, bytes, chip): a made-up chip and a pass within 100x of its ridge point either way."""
    chip = _random_chip(rng)
    nbytes = 10 ** rng.uniform(6, 12)
    return nbytes * _ridge(chip) * 10 ** rng.uniform(-2, 2), nbytes, chip


@check(points=3, section="2.2", timeout=10)
def roofline(t):
    """Intensity, attainable FLOP/s, bound and predicted time of a pass."""
    ref, m8 = t.ref, t.ref.LLAMA_3_8B
    h100, a100 = _named(t, "H100 SXM"), _named(t, "A100 SXM 80GB")
    visible = [("Llama-3-8B prefill of 2000 tokens",
                (ref.forward_flops(m8, 2000, 0), ref.forward_bytes(m8, 2000, 0, "bf16", "bf16"), h100)),
               ("Llama-3-8B decode step (batch 1, 2000 cached)",
                (ref.forward_flops(m8, 1, 2000), ref.forward_bytes(m8, 1, 2000, "bf16", "bf16"), h100)),
               ("a memory-bound pass", (2e12, 1e10, a100)), ("the same pass on another chip", (2e12, 1e10, h100)),
               ("intensity exactly at the ridge point (250 FLOP/byte)", (2.5e12, 1e10, RIDGE_250))]
    for label, (flops, nbytes, chip) in t.cases(visible, _random_pass_on_chip, n=3):
        with t.case(f"{label}: {flops:.4g} FLOPs over {nbytes:.4g} bytes on {_fmt_chip(chip)}"):
            expected = ref.roofline(flops, nbytes, chip)
            got = t.call("roofline", flops, nbytes, chip)
            peak, bw = chip["dense_tflops"] * 1e12, chip["hbm_gb_per_s"] * 1e9
            t.expect(got, expected, "roofline(...)", rtol=1e-9, mistakes={
                "uses the sparse TFLOP/s: dense matmuls never reach it": _roof(flops, nbytes, 2 * peak, bw),
                "mixes GB and GiB: 1 GB/s is 1e9 bytes/s, not 2**30": _roof(flops, nbytes, peak,
                                                                            chip["hbm_gb_per_s"] * GiB),
                "uses TFLOP/s and GB/s as if they were FLOP/s and bytes/s": _roof(
                    flops, nbytes, chip["dense_tflops"], chip["hbm_gb_per_s"]),
                "adds the compute time and the memory time: the roofline assumes they overlap, "
                "so the time is the larger of the two": _roof(flops, nbytes, peak, bw, add_times=True),
                "gets the bound backwards: an intensity above the ridge point is compute-bound":
                    _roof(flops, nbytes, peak, bw, flip=True),
                "calls an intensity exactly at the ridge point memory-bound: there the two roofs meet and "
                "the pass reaches the peak, so intensity >= ridge is compute-bound (>=, not >)":
                    _roof(flops, nbytes, peak, bw, strict=True),
                "leaves the compute roof out: attainable FLOP/s is min(peak, intensity * bandwidth)":
                    _roof(flops, nbytes, peak, bw, no_cap=True),
            })


# ---------------------------------------------------------------- 3. batching decode


def _random_step(rng) -> tuple:
    """(model, batch, context, weight dtype, KV dtype) of a made-up decode step."""
    return (_random_model(rng), rng.randint(2, 1024), rng.randint(0, 16384), rng.choice(["bf16", "fp8", "int4"]),
            rng.choice(["bf16", "fp8"]))


@check(points=2, section="3.1", timeout=10)
def decode_step_cost(t):
    """FLOPs and bytes of one decode step of a batch: weights shared, KV per sequence."""
    m8, m70 = t.ref.LLAMA_3_8B, t.ref.LLAMA_3_70B
    visible = [("batch 1", (m8, 1, 2000, "bf16", "bf16")), ("batch 64", (m8, 64, 2000, "bf16", "bf16")),
               ("batch 32, fp8 weights", (m70, 32, 1000, "fp8", "bf16"))]
    for label, (model, batch, ctx, wd, kd) in t.cases(visible, _random_step, n=3):
        with t.case(f"{label}: {_fmt_model(model)}, batch {batch}, {ctx} cached, {wd} weights, {kd} KV"):
            got, expected = t.both("decode_step_cost", model, batch, ctx, wd, kd)
            f, b = expected["flops"], expected["bytes"]
            W, K = model["params"] * _nbytes(t.ref.DTYPE_BITS, wd), _kv_per_token(t.ref.DTYPE_BITS, model, kd)
            t.expect(got, expected, "decode_step_cost(...)", rtol=1e-9, mistakes={
                "counts the weights once per sequence: the whole batch shares one read of the weights":
                    {"flops": f, "bytes": batch * (W + (ctx + 1) * K)},
                "ignores the KV cache read (each sequence reads its own cached K and V)":
                    {"flops": f, "bytes": W + batch * K},
                "reads one KV cache for the whole batch: each sequence has its own":
                    {"flops": f, "bytes": W + (ctx + 1) * K},
                "leaves out the attention FLOPs": {"flops": batch * 2 * model["params"], "bytes": b},
                "forgets to multiply the FLOPs by the batch size": {"flops": f / batch, "bytes": b},
                "uses bits instead of bytes (DTYPE_BITS / 8 is bytes)": {"flops": f, "bytes": 8 * b},
                **({TWO_BYTE_WEIGHTS: {"flops": f, "bytes": b - W + 2 * model["params"]}} if wd != "bf16" else {}),
            })


@answer_code
def _crossover(bits, model, chip, ctx, wd, kd, include_kv, *, flop_factor=2.0, peak_key="dense_tflops",
               gb=1e9, byte_scale=1.0, per_seq_weights=False, rounding="ceil", kv_bytes_always=False,
               own_key_flops=False):
    """The crossover batch with one typical error put in (defaults: the right answer)."""
    ridge = chip[peak_key] * 1e12 / (chip["hbm_gb_per_s"] * gb)
    W = model["params"] * _nbytes(bits, wd) * byte_scale
    F = flop_factor * model["params"]
    K = 0.0
    if include_kv or own_key_flops:  # attention of one new token over ctx + 1 keys: 4 * layers * heads * head_dim each
        F += flop_factor / 2 * 4 * model["layers"] * model["heads"] * model["head_dim"] * (ctx + 1 if include_kv else 1)
    if include_kv or kv_bytes_always:
        K = (ctx + 1) * _kv_per_token(bits, model, kd) * byte_scale
    if per_seq_weights:
        K, W = K + W, 0.0  # intensity F / (W + K) does not grow with B
        return None if F < ridge * K else 1
    margin = F - ridge * K
    if margin <= 0:
        return None
    x = ridge * W / margin
    return {"ceil": max(1, math.ceil(x)), "floor": math.floor(x), "real": x, "past": math.floor(x) + 1}[rounding]


def _random_crossover(t, include_kv: bool, cached_without_kv: bool = False) -> tuple:
    """(model, chip, context, weight dtype, KV dtype, include_kv), drawn again while the real-valued
    crossover is too close to a whole number to ask for its ceiling exactly. With include_kv=False the
    context is 0, or with cached_without_kv a cached context that the answer must leave out."""
    rng = t.rng
    while True:
        model, chip = _random_model(rng), _random_chip(rng)
        wd, kd = rng.choice(["bf16", "fp8", "int4", "fp32"]), rng.choice(["bf16", "fp8"])
        # Contexts up to 1.5x the longest one that still has a crossover: mostly finite answers.
        per_ctx = _ridge(chip) * _kv_per_token(t.ref.DTYPE_BITS, model, kd) - 4 * model["layers"] * model["heads"] * model["head_dim"]
        longest = 2 * model["params"] / per_ctx if per_ctx > 0 else 50000
        ctx = rng.randint(0, int(min(1.5 * longest, 100000))) if include_kv else 0
        if cached_without_kv:
            ctx = rng.randint(256, 32768)
        x = _crossover(t.ref.DTYPE_BITS, model, chip, ctx, wd, kd, include_kv, rounding="real")
        if x is None or (x <= 1e7 and abs(x - round(x)) >= 1e-6 * max(1.0, x)):
            return model, chip, ctx, wd, kd, include_kv


def _crossover_cases(t) -> list:
    """(label, model, chip, context, weight dtype, KV dtype, include_kv)."""
    m8, m70 = t.ref.LLAMA_3_8B, t.ref.LLAMA_3_70B
    h100, a100 = _named(t, "H100 SXM"), _named(t, "A100 SXM 80GB")
    visible = [("bf16 weights, weights only", (m8, h100, 0, "bf16", "bf16", False)),
               ("fp8 weights, weights only", (m8, h100, 0, "fp8", "bf16", False)),
               ("bf16, 128 cached tokens per sequence", (m8, h100, 128, "bf16", "bf16", True)),
               ("bf16, 512 cached tokens per sequence", (m70, a100, 512, "bf16", "bf16", True)),
               ("bf16, 2000 cached tokens per sequence", (m8, h100, 2000, "bf16", "bf16", True)),
               ("2000 cached tokens per sequence, but include_kv=False: the approximation leaves them out",
                (m8, h100, 2000, "bf16", "bf16", False)),
               ("ridge point 250, weights only: the crossover is exactly B = 250",
                (m8, RIDGE_250, 0, "bf16", "bf16", False)),
               ("a toy model, weights only: one token's KV is not small beside its weights",
                (TOY_32_LAYERS, h100, 0, "bf16", "bf16", False))]
    hidden = [_random_crossover(t, include_kv) for include_kv in (False, True, True, True)]
    hidden.append(_random_crossover(t, False, cached_without_kv=True))
    return [(f"{label}: {model['name']} on {_fmt_chip(chip)}, {wd} weights, {kd} KV, "
             + (f"{ctx} cached" if include_kv else
                f"{ctx} cached, " * (ctx > 0) + "weights only (include_kv=False)"), model, chip, ctx, wd, kd, include_kv)
            for label, (model, chip, ctx, wd, kd, include_kv) in t.cases(visible, hidden)]


@check(points=3, section="3.2", timeout=10)
def decode_crossover_batch(t):
    """The decode batch size at which a step turns compute-bound (or None)."""
    for label, model, chip, ctx, wd, kd, include_kv in _crossover_cases(t):
        with t.case(label):
            expected = t.ref.decode_crossover_batch(model, chip, ctx, wd, kd, include_kv)
            # include_kv=True is the default: leave it out, as a caller would
            got = t.call("decode_crossover_batch", model, chip, ctx, wd, kd, **non_default(include_kv=(include_kv, True)))
            args = (t.ref.DTYPE_BITS, model, chip, ctx, wd, kd, include_kv)
            wrong = {
                "forgets the factor 2 in the FLOPs (a multiply-add is 2 FLOPs)": _crossover(*args, flop_factor=1.0),
                "uses the sparse TFLOP/s: dense matmuls never reach it": _crossover(*args, peak_key="sparse_tflops"),
                "mixes GB and GiB: 1 GB/s is 1e9 bytes/s, not 2**30": _crossover(*args, gb=GiB),
                "uses bits instead of bytes (DTYPE_BITS / 8 is bytes)": _crossover(*args, byte_scale=8.0),
                "rounds down: that batch is still just memory-bound; take the smallest whole B at or "
                "above the crossover (round up)": _crossover(*args, rounding="floor"),
                "returns the real-valued crossover; return the smallest whole batch size (round up)":
                    _crossover(*args, rounding="real"),
                "takes the first batch strictly past the crossover (int(x) + 1, or intensity > ridge): a step "
                "whose intensity equals the ridge point is already compute-bound, so round up with math.ceil":
                    _crossover(*args, rounding="past"),
            }
            if wd != "bf16":
                wrong[TWO_BYTE_WEIGHTS] = _crossover(t.ref.DTYPE_BITS, model, chip, ctx, "bf16", kd, include_kv)
            if include_kv:
                wrong["ignores the KV cache read (only right for very short contexts)"] = \
                    _crossover(t.ref.DTYPE_BITS, model, chip, ctx, wd, kd, False)
            else:
                wrong["with include_kv=False still counts the new token's own key (its KV read and attention, as "
                      "decode_step_cost at context 0 does): the weights-only approximation counts only the "
                      "weights"] = _crossover(t.ref.DTYPE_BITS, model, chip, 0, wd, kd, True)
                wrong["with include_kv=False still counts the attention FLOPs over the new token's own key: the "
                      "weights-only approximation counts only the weight matmuls (2 x params)"] = \
                    _crossover(*args, own_key_flops=True)
            if not include_kv and ctx:
                wrong["ignores include_kv=False: it counts the cached context's KV read and attention "
                      "anyway (the weights-only approximation leaves both out)"] = \
                    _crossover(t.ref.DTYPE_BITS, model, chip, ctx, wd, kd, True)
                wrong["adds the KV cache bytes even with include_kv=False (the weights-only approximation "
                      "counts only the weight read and the weight FLOPs)"] = _crossover(*args, kv_bytes_always=True)
            if expected is not None:
                wrong["counts the weights once per sequence instead of once per step, so batching "
                      "never raises the intensity"] = _crossover(*args, per_seq_weights=True)
            else:
                wrong["returns infinity: return None when no batch size gets there"] = math.inf
            t.expect(got, expected, "crossover batch size", mistakes=wrong,
                     hint="" if expected is not None else
                     "With this much context the KV read grows with the batch as fast as the FLOPs: "
                     "no batch size is compute-bound, return None.")


# ---------------------------------------------------------------- 3.3 per kernel

GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")


@answer_code
def _kernels(bits, model, chip, batch, ctx, wd, kd, chunk, chunk_ctx, *, qkv="gqa", swiglu=True, chunk_in_gemms=True,
             per_layer=True, lm_head_layers=False, lm_head_rows="seqs", add_times=False, kv_heads_key="kv_heads",
             write_new=True, whole_batch=True, chunk_sees_context=True) -> dict:
    """The kernels of a step with one typical error put in (defaults: the right answer). The grader's own
    copy of the formulas, so that each wrong value differs from the right one only by its error."""
    h, d, layers = model["hidden"], model["head_dim"], model["layers"]
    peak, bw = chip["dense_tflops"] * 1e12, chip["hbm_gb_per_s"] * 1e9
    calls = layers if per_layer else 1
    m = batch + chunk if chunk_in_gemms else batch
    seqs = {"seqs": batch + (1 if chunk else 0), "tokens": batch + chunk}[lm_head_rows]
    q_out = {"gqa": model["heads"] + 2 * model["kv_heads"], "mha": 3 * model["heads"], "q_only": model["heads"]}[qkv]
    gemms = {"qkv_proj": (m, q_out * d, h, calls), "o_proj": (m, h, model["heads"] * d, calls),
             "gate_up_proj": (m, (2 if swiglu else 1) * model["intermediate"], h, calls),
             "down_proj": (m, h, model["intermediate"], calls),
             "lm_head": (seqs, model["vocab"], h, layers if lm_head_layers else 1)}
    b = _nbytes(bits, wd)
    work = {name: (c * 2 * mm * n * k, c * (mm * k + k * n + mm * n) * b) for name, (mm, n, k, c) in gemms.items()}
    kv = _kv_per_token(bits, model, kd, kv_heads_key) * (1 if per_layer else 1 / layers)
    per_pair = 4 * model["heads"] * d * (layers if per_layer else 1)
    seqs_attn = batch if whole_batch else 1
    work["attn_decode"] = (seqs_attn * per_pair * (ctx + 1), seqs_attn * (ctx + (1 if write_new else 0)) * kv)
    if chunk:
        c = chunk_ctx if chunk_sees_context else 0
        pairs = chunk * c + chunk * (chunk + 1) // 2
        work["attn_prefill"] = (per_pair * pairs, (c + (chunk if write_new else 0)) * kv)
    out = {}
    for name, (flops, nbytes) in work.items():
        r = _roof(flops, nbytes, peak, bw, add_times=add_times)
        out[name] = {"flops": flops, "bytes": nbytes, "time_s": r["time_s"], "bound": r["bound"]}
    return out


KERNEL_MISTAKES = {
    "sizes K and V in qkv_proj with the query heads (GQA: K and V have kv_heads * head_dim columns each)":
        dict(qkv="mha"),
    "leaves K and V out of qkv_proj (it produces Q, K and V: (heads + 2 * kv_heads) * head_dim columns)":
        dict(qkv="q_only"),
    "gives the MLP one up matrix (SwiGLU has a gate and an up projection: 2 * intermediate columns)":
        dict(swiglu=False),
    "runs the weight GEMMs on the decode tokens only (the chunk's tokens go through every weight too: "
    "m = batch + chunk)": dict(chunk_in_gemms=False),
    "counts each kernel once, not once per layer": dict(per_layer=False),
    "runs lm_head once per layer (it runs once per step, after the last layer)": dict(lm_head_layers=True),
    "runs lm_head on every token of the chunk (only the last position of each sequence needs logits: "
    "one row per sequence)": dict(lm_head_rows="tokens"),
    "adds the compute time and the memory time (the roofline takes the larger of the two)": dict(add_times=True),
    "sizes the KV cache with the query heads (GQA stores only kv_heads)": dict(kv_heads_key="heads"),
    "leaves out writing the new tokens' K and V": dict(write_new=False),
    "counts one sequence's decode attention, not the whole batch's (each sequence reads its own KV cache)":
        dict(whole_batch=False),
    "lets the chunk attend only to itself (it attends to its prompt's cached tokens too, and reads their K/V)":
        dict(chunk_sees_context=False),
}


def _random_shape(rng) -> dict:
    """A made-up model with the sizes of every weight matrix."""
    model = _random_model(rng)
    hidden = rng.choice([1024, 2048, 3072, 4096, 5120, 6144, 8192])
    return dict(model, hidden=hidden, intermediate=rng.randint(2 * hidden // 128, 4 * hidden // 128) * 128,
                vocab=rng.randint(30_000, 260_000))


def _random_mixed_step(rng) -> tuple:
    """(model, chip, batch, context, weight dtype, KV dtype, chunk, chunk context)."""
    chunk = rng.choice([0, rng.randint(1, 4096)])
    return (_random_shape(rng), _random_chip(rng), rng.randint(1, 1024), rng.randint(0, 16384),
            rng.choice(["bf16", "fp8", "int4"]), rng.choice(["bf16", "fp8"]), chunk,
            rng.randint(0, 8192) if chunk else 0)


@check(points=3, section="3.3", timeout=10)
def step_kernels(t):
    """A decode (or mixed) step split into its kernels: each one's FLOPs, bytes, time and bound."""
    m8, m70 = t.ref.LLAMA_3_8B, t.ref.LLAMA_3_70B
    h100, a100 = _named(t, "H100 SXM"), _named(t, "A100 SXM 80GB")
    visible = [("Llama-3-8B decode, batch 1", (m8, h100, 1, 2000, "bf16", "bf16", 0, 0)),
               ("Llama-3-8B decode, batch 512: the GEMMs past the ridge", (m8, h100, 512, 1024, "bf16", "bf16", 0, 0)),
               ("Llama-3-8B mixed step: a decode batch of 64 and a 512-token chunk",
                (m8, h100, 64, 1024, "bf16", "bf16", 512, 1024)),
               ("Llama-3-70B decode, batch 256, fp8 weights", (m70, a100, 256, 4000, "fp8", "bf16", 0, 0))]
    for label, (model, chip, batch, ctx, wd, kd, chunk, cc) in t.cases(visible, _random_mixed_step, n=2):
        step = f"batch {batch} at {ctx} cached" + (f" + a {chunk}-token chunk after {cc} cached" if chunk else "")
        with t.case(f"{label}: {model['name']} on {_fmt_chip(chip)}, {step}, {wd} weights, {kd} KV"):
            expected = t.ref.step_kernels(model, chip, batch, ctx, wd, kd, chunk, cc)
            got = t.call("step_kernels", model, chip, batch, ctx, wd, kd,
                         **non_default(chunk=(chunk, 0), chunk_context=(cc, 0)))
            if not isinstance(got, dict):
                t.fail(f"step_kernels returned {type(got).__name__}; expected a dict {{kernel name: {{...}}}}")
            if (types := cmp.key_types(got)) is not None:
                t.fail(f"step_kernels should return a dict keyed by kernel name (str), got keys of types {types}")
            t.expect(sorted(got), sorted(expected), "the kernel names", hint=(
                "One entry per GEMM (qkv_proj, o_proj, gate_up_proj, down_proj, lm_head), attn_decode, and "
                "attn_prefill only when chunk > 0."))
            args = (t.ref.DTYPE_BITS, model, chip, batch, ctx, wd, kd, chunk, cc)
            wrong = {name: _kernels(*args, **kw) for name, kw in KERNEL_MISTAKES.items()}
            for name in expected:
                t.expect(got[name], expected[name], f"kernel {name}", rtol=1e-9,
                         mistakes={m: w[name] for m, w in wrong.items()})


# ---------------------------------------------------------------- 5.1 the overhead roof


def _random_overhead_case(rng) -> tuple:
    """(flops, bytes, chip, overhead_s): a pass near its chip's ridge, and an overhead within 10x of its
    roofline time either way."""
    flops, nbytes, chip = _random_pass_on_chip(rng)
    roof = max(flops / (chip["dense_tflops"] * 1e12), nbytes / (chip["hbm_gb_per_s"] * 1e9))
    return flops, nbytes, chip, roof * 10 ** rng.uniform(-1, 1)


@answer_code
def _bound(flops, nbytes, peak, bw, overhead, *, add=False, ignore=False, roof_bound=False, vs_compute=False) -> dict:
    r = _roof(flops, nbytes, peak, bw)
    if ignore:
        return {"time_s": r["time_s"], "bound": r["bound"]}
    if add:
        return {"time_s": r["time_s"] + overhead, "bound": "overhead" if overhead > r["time_s"] else r["bound"]}
    over = overhead > (flops / peak if vs_compute else r["time_s"])
    return {"time_s": max(r["time_s"], overhead), "bound": "overhead" if over and not roof_bound else r["bound"]}


@check(points=2, section="5.1", timeout=10)
def step_bound(t):
    """Compute, memory or host overhead: the slowest of the three sets a pass's time."""
    ref, m8, h100 = t.ref, t.ref.LLAMA_3_8B, _named(t, "H100 SXM")
    tiny = 3.34e6  # parameters of the course's shipped target model
    visible = [("a 3.3M-parameter model's decode token in bf16 on an H100, 0.3 ms of host time",
                (2 * tiny, 2 * tiny, h100, 3e-4)),
               ("Llama-3-8B decode (batch 1, 2000 cached), 0.3 ms of host time",
                (ref.forward_flops(m8, 1, 2000), ref.forward_bytes(m8, 1, 2000, "bf16", "bf16"), h100, 3e-4)),
               ("Llama-3-8B prefill of 2000 tokens, 0.3 ms of host time",
                (ref.forward_flops(m8, 2000, 0), ref.forward_bytes(m8, 2000, 0, "bf16", "bf16"), h100, 3e-4))]
    for label, (flops, nbytes, chip, overhead) in t.cases(visible, _random_overhead_case, n=3):
        with t.case(f"{label}: {flops:.4g} FLOPs, {nbytes:.4g} bytes, {overhead:.3g} s overhead on {_fmt_chip(chip)}"):
            got, expected = t.both("step_bound", flops, nbytes, chip, overhead)
            args = (flops, nbytes, chip["dense_tflops"] * 1e12, chip["hbm_gb_per_s"] * 1e9, overhead)
            t.expect(got, expected, "step_bound(...)", rtol=1e-9, mistakes={
                "adds the overhead to the roofline time (the host issues work while the chip runs earlier "
                "work: the slower of the two sets the time)": _bound(*args, add=True),
                "ignores the overhead: a pass shorter than the host's work waits for the host":
                    _bound(*args, ignore=True),
                "keeps the roofline's bound when the overhead sets the time (that pass is overhead-bound)":
                    _bound(*args, roof_bound=True),
                "compares the overhead with the compute time only (the roofline time is the larger of the "
                "compute and the memory time)": _bound(*args, vs_compute=True),
            })


# ---------------------------------------------------------------- 5.2 MoE decode


@answer_code
def _moe(bits, model, batch, ctx, wd, kd, *, read="uniform", all_expert_flops=False, per_layer=True) -> dict:
    """moe_decode_cost with one typical error put in (defaults: the right answer)."""
    e, k, per, layers = model["experts"], model["top_k"], model["expert_params"], model["layers"]
    read_per_layer = {"uniform": e * (1 - (1 - k / e) ** batch), "active": k, "all": e,
                      "distinct": min(e, batch * k), "with_replacement": e * (1 - (1 - 1 / e) ** (batch * k))}[read]
    dense = model["params"] - layers * e * per
    active = model["params"] if all_expert_flops else dense + layers * k * per
    attn = 4 * layers * model["heads"] * model["head_dim"] * (ctx + 1)
    weights = (dense + (layers if per_layer else 1) * read_per_layer * per) * _nbytes(bits, wd)
    return {"experts_read": read_per_layer, "flops": batch * (2 * active + attn),
            "bytes": weights + batch * (ctx + 1) * _kv_per_token(bits, model, kd)}


def _random_moe(rng) -> tuple:
    """(model, batch, context, weight dtype, KV dtype) of a made-up MoE decode step."""
    model = _random_model(rng)
    experts = rng.choice([8, 16, 32, 64, 128, 256])
    top_k = rng.choice([k for k in (1, 2, 4, 6, 8) if k < experts])
    per = rng.randint(10**6, 5 * 10**8)
    model.update(name="made-up MoE", experts=experts, top_k=top_k, expert_params=per,
                 params=model["layers"] * experts * per + rng.randint(10**8, 2 * 10**10))
    return model, rng.randint(1, 512), rng.randint(0, 16384), rng.choice(["bf16", "fp8", "int4"]), \
        rng.choice(["bf16", "fp8"])


@check(points=2, section="5.2", timeout=10)
def moe_decode_cost(t):
    """An MoE decode step: the experts a batch reads, its FLOPs and bytes."""
    mix = t.ref.MIXTRAL_8X7B
    visible = [("batch 1", (mix, 1, 0, "bf16", "bf16")), ("batch 8", (mix, 8, 1024, "bf16", "bf16")),
               ("batch 64, fp8 weights", (mix, 64, 4096, "fp8", "bf16"))]
    for label, (model, batch, ctx, wd, kd) in t.cases(visible, _random_moe, n=3):
        with t.case(f"{label}: {_fmt_model(model)}, {model['experts']} experts, top {model['top_k']}, "
                    f"batch {batch}, {ctx} cached, {wd} weights, {kd} KV"):
            got, expected = t.both("moe_decode_cost", model, batch, ctx, wd, kd)
            args = (t.ref.DTYPE_BITS, model, batch, ctx, wd, kd)
            t.expect(got, expected, "moe_decode_cost(...)", rtol=1e-9, mistakes={
                **({TWO_BYTE_WEIGHTS: _moe(t.ref.DTYPE_BITS, model, batch, ctx, "bf16", kd)} if wd != "bf16" else {}),
                "reads only the top_k experts a token runs, whatever the batch (the batch's tokens pick "
                "different experts)": _moe(*args, read="active"),
                "reads every expert at any batch size (a batch of one reads only its top_k)": _moe(*args, read="all"),
                "assumes the batch's tokens pick different experts until all are read (min(experts, batch * "
                "top_k)): tokens share experts by chance": _moe(*args, read="distinct"),
                "treats a token's top_k picks as independent draws (a token's experts are distinct: it misses "
                "a given one with probability 1 - top_k / experts)": _moe(*args, read="with_replacement"),
                "counts the FLOPs of every expert (a token runs only its top_k)": _moe(*args, all_expert_flops=True),
                "reads the experts of one layer only (experts_read is per layer)": _moe(*args, per_layer=False),
            })
