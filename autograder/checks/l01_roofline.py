"""Checks for lesson 01: the roofline of prefill vs decode.

Visible cases use the lesson's Llama-3 shapes and datasheet chips; hidden ones draw made-up
models, token counts, contexts, number formats and chips from t.rng, so no table can be
hard-coded. Expected values always come from the reference (t.ref); the `mistakes` are the
same formula with one typical error put in.
"""
from __future__ import annotations

import math

from autograder import compare as cmp
from autograder.core import check

GiB = 2**30


def _merge(mistakes: dict) -> dict:
    """Join mistakes that give the same value here ("..., or ..."): the message then names both."""
    groups: list[list] = []
    for name, value in mistakes.items():
        for g in groups:
            try:
                same = cmp.compare(value, g[1], rtol=1e-9) is None
            except Exception:  # noqa: BLE001 - values of different kinds never match
                same = False
            if same:
                g[0] += f", or {name}"
                break
        else:
            groups.append([name, value])
    return {name: value for name, value in groups}


def _expect(t, got, expected, what: str, mistakes: dict | None = None, **kw):
    t.expect(got, expected, what, mistakes=_merge(mistakes or {}), **kw)


# ---------------------------------------------------------------- case generators


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


def _nbytes(t, dtype: str) -> float:
    return t.ref.DTYPE_BITS[dtype] / 8


def _kv_per_token(t, model: dict, kv_dtype: str, heads_key: str = "kv_heads", kv_factor: int = 2) -> float:
    return kv_factor * model["layers"] * model[heads_key] * model["head_dim"] * _nbytes(t, kv_dtype)


# ---------------------------------------------------------------- 1. the cost of a forward pass


@check(points=2, section="1.1", timeout=10)
def matmul_cost(t):
    """FLOPs and bytes of one matmul."""
    cases = [("[1, 4096] @ [4096, 4096] in bf16 (one token)", (1, 4096, 4096, "bf16")),
             ("[2000, 4096] @ [4096, 4096] in bf16 (2000 tokens)", (2000, 4096, 4096, "bf16"))]
    for _ in range(3):
        m, n, k = (t.rng.randint(1, 8192) for _ in range(3))
        dtype = t.rng.choice(["fp32", "fp16", "bf16", "fp8"])
        cases.append((f"hidden: [{m}, {k}] @ [{k}, {n}] in {dtype}", (m, n, k, dtype)))
    for label, (m, n, k, dtype) in cases:
        with t.case(label):
            expected = t.ref.matmul_cost(m, n, k, dtype)
            got = t.call("matmul_cost", m, n, k, dtype)
            f, b, elems = expected["flops"], _nbytes(t, dtype), m * k + k * n + m * n
            _expect(t, got, expected, f"matmul_cost({m}, {n}, {k}, {dtype!r})", rtol=1e-9, mistakes={
                "counts a multiply-add as one FLOP (it is two: a multiply and an add)":
                    {"flops": m * n * k, "bytes": expected["bytes"]},
                "leaves out writing the output C": {"flops": f, "bytes": (m * k + k * n) * b},
                "counts only the weight matrix B, not reading A and writing C": {"flops": f, "bytes": k * n * b},
                "counts elements, not bytes": {"flops": f, "bytes": elems},
                "uses bits instead of bytes (DTYPE_BITS / 8 is bytes)": {"flops": f, "bytes": elems * b * 8},
            })


def _pass_cases(t, n_hidden: int) -> list:
    """(label, model, new_tokens, cached) for one sequence's forward pass."""
    m8, m70 = t.ref.LLAMA_3_8B, t.ref.LLAMA_3_70B
    cases = [("Llama-3-8B decode: 1 new token, 2000 cached", m8, 1, 2000),
             ("Llama-3-8B prefill: 2000 new tokens, none cached", m8, 2000, 0),
             ("Llama-3-70B: a 512-token chunk after 1536 cached", m70, 512, 1536)]
    for i in range(n_hidden):
        model = _random_model(t.rng)
        new = 1 if i == 0 else t.rng.randint(2, 4096)
        cached = t.rng.randint(0, 32768) if i != 2 else 0
        cases.append((f"hidden: {_fmt_model(model)}, {new} new, {cached} cached", model, new, cached))
    return cases


@check(points=3, section="1.2", timeout=10)
def attention_flops(t):
    """Attention score/value FLOPs under the causal mask, with a KV cache."""
    for label, model, new, cached in _pass_cases(t, 3):
        with t.case(label):
            expected = t.ref.attention_flops(model, new, cached)
            got = t.call("attention_flops", model, new, cached)
            L, h, kvh, d = model["layers"], model["heads"], model["kv_heads"], model["head_dim"]
            causal = new * cached + new * (new + 1) // 2
            _expect(t, got, expected, f"attention_flops({model['name']}, {new}, {cached})", rtol=1e-9, mistakes={
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
    for label, model, new, cached in _pass_cases(t, 2):
        with t.case(label):
            expected = t.ref.forward_flops(model, new, cached)
            got = t.call("forward_flops", model, new, cached)
            P, attn = model["params"], t.ref.attention_flops(model, new, cached)
            _expect(t, got, expected, f"forward_flops({model['name']}, {new}, {cached})", rtol=1e-9, mistakes={
                "counts a multiply-add as one FLOP in the weight matmuls (2 * params * tokens)": P * new + attn,
                "leaves out the attention term": 2 * P * new,
                "does not scale the weight FLOPs with the number of new tokens": 2 * P + attn,
            }, hint="forward_flops is 2 * params * new_tokens plus your attention_flops: "
                    "make the attention_flops check pass first.")


@check(points=2, section="1.4", timeout=10)
def forward_bytes(t):
    """HBM bytes of one forward pass: weights once, KV read and written."""
    cases = [(label, model, new, cached, "bf16", "bf16") for label, model, new, cached in _pass_cases(t, 0)[:2]]
    cases.append(("Llama-3-70B decode: 1 new, 8000 cached, fp8 weights, bf16 KV", t.ref.LLAMA_3_70B, 1, 8000,
                  "fp8", "bf16"))
    for label, model, new, cached in _pass_cases(t, 3)[3:]:
        wd = t.rng.choice(["fp32", "bf16", "fp8", "int4"])
        kd = t.rng.choice([d for d in ("fp32", "bf16", "fp8") if d != wd])
        cases.append((f"{label}, {wd} weights, {kd} KV", model, new, cached, wd, kd))
    for label, model, new, cached, wd, kd in cases:
        with t.case(label):
            expected = t.ref.forward_bytes(model, new, cached, wd, kd)
            got = t.call("forward_bytes", model, new, cached, wd, kd)
            W, K = model["params"] * _nbytes(t, wd), _kv_per_token(t, model, kd)
            _expect(t, got, expected, f"forward_bytes({model['name']}, {new}, {cached}, {wd!r}, {kd!r})",
                     rtol=1e-9, mistakes={
                         "counts the weights once per token instead of once per pass": new * W + (cached + new) * K,
                         "ignores the KV cache read of the cached tokens": W + new * K,
                         "leaves out writing K and V of the new tokens": W + cached * K,
                         "counts only K, not K and V": W + (cached + new) * K / 2,
                         "sizes the KV cache with the query heads (GQA stores only kv_heads)":
                             W + (cached + new) * _kv_per_token(t, model, kd, "heads"),
                         "uses the weight dtype for the KV cache too": W + (cached + new) * _kv_per_token(t, model, wd),
                         "uses bits instead of bytes (DTYPE_BITS / 8 is bytes)": 8 * expected,
                     })


# ---------------------------------------------------------------- 2. the roofline


@check(points=1, section="2.1", timeout=10)
def ridge_point(t):
    """Ridge point of a chip, from its dense peak and HBM bandwidth."""
    chips = [_named(t, name) for name in t.ref.CHIPS] + [_random_chip(t.rng) for _ in range(2)]
    for i, chip in enumerate(chips):
        with t.case(("hidden: " if i >= len(t.ref.CHIPS) else "") + _fmt_chip(chip)):
            expected = t.ref.ridge_point(chip)
            got = t.call("ridge_point", chip)
            dense, sparse, gbs = chip["dense_tflops"], chip["sparse_tflops"], chip["hbm_gb_per_s"]
            _expect(t, got, expected, "ridge point (FLOP/byte)", rtol=1e-9, mistakes={
                "uses the sparse TFLOP/s: that figure assumes 2:4 structured sparsity, dense matmuls "
                "never reach it": sparse * 1e12 / (gbs * 1e9),
                "mixes GB and GiB: 1 GB/s is 1e9 bytes/s, not 2**30": dense * 1e12 / (gbs * GiB),
                "divides bandwidth by peak instead of peak by bandwidth": gbs * 1e9 / (dense * 1e12),
                "divides TFLOP/s by GB/s without converting both to base units (off by 1000)": dense / gbs,
            })


def _roof(flops, nbytes, peak, bw, *, add_times=False, flip=False, no_cap=False) -> dict:
    ai = flops / nbytes
    compute = ai >= peak / bw
    return {"intensity": ai, "attainable_flops_per_s": ai * bw if no_cap else min(peak, ai * bw),
            "bound": "compute" if compute != flip else "memory",
            "time_s": flops / peak + nbytes / bw if add_times else max(flops / peak, nbytes / bw)}


@check(points=3, section="2.2", timeout=10)
def roofline(t):
    """Intensity, attainable FLOP/s, bound and predicted time of a pass."""
    ref, m8 = t.ref, t.ref.LLAMA_3_8B
    h100, a100 = _named(t, "H100 SXM"), _named(t, "A100 SXM 80GB")
    cases = [("Llama-3-8B prefill of 2000 tokens on H100 SXM",
              ref.forward_flops(m8, 2000, 0), ref.forward_bytes(m8, 2000, 0, "bf16", "bf16"), h100),
             ("Llama-3-8B decode step (batch 1, 2000 cached) on H100 SXM",
              ref.forward_flops(m8, 1, 2000), ref.forward_bytes(m8, 1, 2000, "bf16", "bf16"), h100),
             ("2e12 FLOPs over 1e10 bytes on A100 SXM 80GB", 2e12, 1e10, a100),
             ("2e12 FLOPs over 1e10 bytes on H100 SXM", 2e12, 1e10, h100)]
    for _ in range(3):
        chip = _random_chip(t.rng)
        nbytes = 10 ** t.rng.uniform(6, 12)
        flops = nbytes * ref.ridge_point(chip) * 10 ** t.rng.uniform(-2, 2)
        cases.append((f"hidden: {flops:.4g} FLOPs over {nbytes:.4g} bytes on {_fmt_chip(chip)}", flops, nbytes, chip))
    for label, flops, nbytes, chip in cases:
        with t.case(label):
            expected = ref.roofline(flops, nbytes, chip)
            got = t.call("roofline", flops, nbytes, chip)
            peak, bw = chip["dense_tflops"] * 1e12, chip["hbm_gb_per_s"] * 1e9
            _expect(t, got, expected, "roofline(...)", rtol=1e-9, mistakes={
                "uses the sparse TFLOP/s: dense matmuls never reach it": _roof(flops, nbytes, 2 * peak, bw),
                "mixes GB and GiB: 1 GB/s is 1e9 bytes/s, not 2**30": _roof(flops, nbytes, peak,
                                                                            chip["hbm_gb_per_s"] * GiB),
                "uses TFLOP/s and GB/s as if they were FLOP/s and bytes/s": _roof(
                    flops, nbytes, chip["dense_tflops"], chip["hbm_gb_per_s"]),
                "adds the compute time and the memory time: the roofline assumes they overlap, "
                "so the time is the larger of the two": _roof(flops, nbytes, peak, bw, add_times=True),
                "gets the bound backwards: an intensity above the ridge point is compute-bound":
                    _roof(flops, nbytes, peak, bw, flip=True),
                "leaves the compute roof out: attainable FLOP/s is min(peak, intensity * bandwidth)":
                    _roof(flops, nbytes, peak, bw, no_cap=True),
            })


# ---------------------------------------------------------------- 3. batching decode


@check(points=2, section="3.1", timeout=10)
def decode_step_cost(t):
    """FLOPs and bytes of one decode step of a batch: weights shared, KV per sequence."""
    m8, m70 = t.ref.LLAMA_3_8B, t.ref.LLAMA_3_70B
    cases = [("Llama-3-8B, batch 1, 2000 cached, bf16", m8, 1, 2000, "bf16", "bf16"),
             ("Llama-3-8B, batch 64, 2000 cached, bf16", m8, 64, 2000, "bf16", "bf16"),
             ("Llama-3-70B, batch 32, 1000 cached, fp8 weights, bf16 KV", m70, 32, 1000, "fp8", "bf16")]
    for _ in range(3):
        model, batch, ctx = _random_model(t.rng), t.rng.randint(2, 1024), t.rng.randint(0, 16384)
        wd, kd = t.rng.choice(["bf16", "fp8", "int4"]), t.rng.choice(["bf16", "fp8"])
        cases.append((f"hidden: {_fmt_model(model)}, batch {batch}, {ctx} cached, {wd} weights, {kd} KV",
                      model, batch, ctx, wd, kd))
    for label, model, batch, ctx, wd, kd in cases:
        with t.case(label):
            expected = t.ref.decode_step_cost(model, batch, ctx, wd, kd)
            got = t.call("decode_step_cost", model, batch, ctx, wd, kd)
            f, b = expected["flops"], expected["bytes"]
            W, K = model["params"] * _nbytes(t, wd), _kv_per_token(t, model, kd)
            _expect(t, got, expected, "decode_step_cost(...)", rtol=1e-9, mistakes={
                "counts the weights once per sequence: the whole batch shares one read of the weights":
                    {"flops": f, "bytes": batch * (W + (ctx + 1) * K)},
                "ignores the KV cache read (each sequence reads its own cached K and V)":
                    {"flops": f, "bytes": W + batch * K},
                "reads one KV cache for the whole batch: each sequence has its own":
                    {"flops": f, "bytes": W + (ctx + 1) * K},
                "leaves out the attention FLOPs": {"flops": batch * 2 * model["params"], "bytes": b},
                "forgets to multiply the FLOPs by the batch size": {"flops": f / batch, "bytes": b},
                "uses bits instead of bytes (DTYPE_BITS / 8 is bytes)": {"flops": f, "bytes": 8 * b},
            })


def _crossover(t, model, chip, ctx, wd, kd, include_kv, *, flop_factor=2.0, peak_key="dense_tflops",
               gb=1e9, byte_scale=1.0, per_seq_weights=False, rounding="ceil"):
    """The crossover batch with one typical error put in (defaults: the right answer)."""
    ridge = chip[peak_key] * 1e12 / (chip["hbm_gb_per_s"] * gb)
    W = model["params"] * _nbytes(t, wd) * byte_scale
    F = flop_factor * model["params"]
    K = 0.0
    if include_kv:
        F += flop_factor / 2 * t.ref.attention_flops(model, 1, ctx)
        K = (ctx + 1) * _kv_per_token(t, model, kd) * byte_scale
    if per_seq_weights:
        K, W = K + W, 0.0  # intensity F / (W + K) does not grow with B
        return None if F < ridge * K else 1
    margin = F - ridge * K
    if margin <= 0:
        return None
    x = ridge * W / margin
    return {"ceil": max(1, math.ceil(x)), "floor": math.floor(x), "real": x}[rounding]


def _crossover_cases(t) -> list:
    m8, m70 = t.ref.LLAMA_3_8B, t.ref.LLAMA_3_70B
    h100, a100 = _named(t, "H100 SXM"), _named(t, "A100 SXM 80GB")
    cases = [("Llama-3-8B on H100 SXM, bf16 weights, weights only (include_kv=False)",
              m8, h100, 0, "bf16", "bf16", False),
             ("Llama-3-8B on H100 SXM, fp8 weights, weights only (include_kv=False)",
              m8, h100, 0, "fp8", "bf16", False),
             ("Llama-3-8B on H100 SXM, bf16, 128 cached tokens per sequence", m8, h100, 128, "bf16", "bf16", True),
             ("Llama-3-70B on A100 SXM 80GB, bf16, 512 cached tokens per sequence",
              m70, a100, 512, "bf16", "bf16", True),
             ("Llama-3-8B on H100 SXM, bf16, 2000 cached tokens per sequence", m8, h100, 2000, "bf16", "bf16", True)]
    while len(cases) < 9:
        model, chip = _random_model(t.rng), _random_chip(t.rng)
        wd, kd = t.rng.choice(["bf16", "fp8", "int4", "fp32"]), t.rng.choice(["bf16", "fp8"])
        include_kv = len(cases) != 5  # one hidden weights-only case, the rest with the KV term
        # Contexts up to 1.5x the longest one that still has a crossover: mostly finite answers.
        ridge = t.ref.ridge_point(chip)
        per_ctx = ridge * _kv_per_token(t, model, kd) - 4 * model["layers"] * model["heads"] * model["head_dim"]
        longest = 2 * model["params"] / per_ctx if per_ctx > 0 else 50000
        ctx = t.rng.randint(0, int(min(1.5 * longest, 100000))) if include_kv else 0
        x = _crossover(t, model, chip, ctx, wd, kd, include_kv, rounding="real")
        if x is not None and (x > 1e7 or abs(x - round(x)) < 1e-6 * max(1.0, x)):
            continue  # too close to a whole number to ask for its ceiling exactly; draw again
        cases.append((f"hidden: {_fmt_model(model)} on {_fmt_chip(chip)}, {wd} weights, {kd} KV, "
                      + (f"{ctx} cached" if include_kv else "weights only"), model, chip, ctx, wd, kd, include_kv))
    return cases


@check(points=3, section="3.2", timeout=10)
def decode_crossover_batch(t):
    """The decode batch size at which a step turns compute-bound (or None)."""
    for label, model, chip, ctx, wd, kd, include_kv in _crossover_cases(t):
        with t.case(label):
            expected = t.ref.decode_crossover_batch(model, chip, ctx, wd, kd, include_kv)
            got = t.call("decode_crossover_batch", model, chip, ctx, wd, kd, include_kv)
            args = (t, model, chip, ctx, wd, kd, include_kv)
            wrong = {
                "forgets the factor 2 in the FLOPs (a multiply-add is 2 FLOPs)": _crossover(*args, flop_factor=1.0),
                "uses the sparse TFLOP/s: dense matmuls never reach it": _crossover(*args, peak_key="sparse_tflops"),
                "mixes GB and GiB: 1 GB/s is 1e9 bytes/s, not 2**30": _crossover(*args, gb=GiB),
                "uses bits instead of bytes (DTYPE_BITS / 8 is bytes)": _crossover(*args, byte_scale=8.0),
                "rounds down: that batch is still just memory-bound; take the smallest whole B at or "
                "above the crossover (round up)": _crossover(*args, rounding="floor"),
                "returns the real-valued crossover; return the smallest whole batch size (round up)":
                    _crossover(*args, rounding="real"),
            }
            if include_kv:
                wrong["ignores the KV cache read (only right for very short contexts)"] = \
                    _crossover(t, model, chip, ctx, wd, kd, False)
            if expected is not None:
                wrong["counts the weights once per sequence instead of once per step, so batching "
                      "never raises the intensity"] = _crossover(*args, per_seq_weights=True)
            else:
                wrong["returns infinity: return None when no batch size gets there"] = math.inf
            _expect(t, got, expected, "crossover batch size",
                     mistakes={k: v for k, v in wrong.items() if v != expected},
                     hint="" if expected is not None else
                     "With this much context the KV read grows with the batch as fast as the FLOPs: "
                     "no batch size is compute-bound, return None.")
