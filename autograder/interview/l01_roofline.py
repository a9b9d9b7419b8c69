"""Lesson 01 questions: ridge points, the intensity and time of prefill and decode, the decode crossover."""
from __future__ import annotations

from reference_engine.sim import gpu_model as gm

from .pools import CHIPS, SHAPES, any_chip, chip_text, hypothetical_config, other, pick
from .question import Numeric, Open, fmt, template

STEM = "l01_roofline"


def model(shape: gm.ModelShape) -> dict:
    """The lesson's model dict; params is the exact count of the shape (gpu_model.param_count)."""
    return {"name": shape.name, "params": float(gm.param_count(shape)), "layers": shape.layers,
            "heads": shape.heads, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim}


def any_model(rng) -> dict:
    """A Llama shape two times in three, else a hypothetical one (its parameter count about 12 x layers x hidden^2
    plus untied embeddings of a 128k vocabulary: an input the question states, not a fact)."""
    if rng.random() < 2 / 3:
        return model(pick(rng, SHAPES))
    cfg = hypothetical_config(rng)
    h = cfg["hidden_size"]
    params = round((12 * cfg["num_hidden_layers"] * h * h + 2 * 128256 * h) / 1e8) * 1e8
    return {"name": "a hypothetical model", "params": params, "layers": cfg["num_hidden_layers"],
            "heads": cfg["num_attention_heads"], "kv_heads": cfg["num_key_value_heads"], "head_dim": h // cfg["num_attention_heads"]}


def chip(c: gm.Chip, tflops: float | None = None, gb_per_s: float | None = None) -> dict:
    return {"dense_tflops": c.dense_tflops if tflops is None else tflops,
            "hbm_gb_per_s": c.hbm_gb_per_s if gb_per_s is None else gb_per_s}


def model_text(m: dict) -> str:
    return (f"{m['name']} ({m['params'] / 1e9:.2f}B parameters, {m['layers']} layers, {m['heads']} query heads, "
            f"{m['kv_heads']} KV heads, head_dim {m['head_dim']})")


@template(STEM, "matmul intensity")
def matmul(rng, ref):
    n, k = pick(rng, [4096, 8192, 14336]), pick(rng, [4096, 8192])
    m, dtype = pick(rng, [1, 4, 16, 64]), pick(rng, ["bf16", "fp8", "fp32"])

    def ask(rows, prompt):
        c = ref.matmul_cost(rows, n, k, dtype)
        ab = ref.matmul_cost(rows, n, k, dtype)["bytes"] - ref.matmul_cost(rows, n, 0, dtype)["bytes"]  # A and B only
        return Numeric(
            prompt, "FLOP/byte", c["flops"] / c["bytes"],
            [f"FLOPs = 2 x m x n x k = 2 x {rows} x {n:,} x {k:,} = {fmt(c['flops'])} (a multiply-add is 2 FLOPs)",
             f"bytes = (m x k + k x n + m x n) x {ref.DTYPE_BITS[dtype] // 8} ({dtype}) = {fmt(c['bytes'])}",
             f"intensity = {fmt(c['flops'] / c['bytes'])} FLOP/byte"],
            "While m is small the weight read dominates the bytes, so intensity grows about linearly with the tokens m.",
            mistakes={"counts bits, not bytes": c["flops"] / (8 * c["bytes"]),
                      "counts a multiply-add as one FLOP": c["flops"] / 2 / c["bytes"],
                      "leaves out the write of C": c["flops"] / ab})

    q = ask(m, f"C[m, n] = A[m, k] @ B[k, n] with m = {m}, n = {n:,}, k = {k:,}, every element {dtype}. Reading A and B "
               "once and writing C once, what is its arithmetic intensity?")
    q.follow_ups.append(ask(64 * m, f"Now m = {64 * m:,} (64x the rows, say a prefill chunk): the intensity?"))
    return q


@template(STEM, "ridge point")
def ridge(rng, ref):
    c = any_chip(rng)
    c2 = other(rng, CHIPS, c)

    def ask(x, prompt):
        r = ref.ridge_point(chip(x))
        return Numeric(
            prompt, "FLOP/byte", r,
            [f"peak = {x.dense_tflops:g}e12 FLOP/s (dense: the sparse figure beside it assumes 2:4 sparsity)",
             f"bandwidth = {x.hbm_gb_per_s:g}e9 bytes/s (datasheet GB are powers of ten)",
             f"ridge = peak / bandwidth = {fmt(r)} FLOP/byte"],
            f"A pass doing fewer than {r:.0f} FLOPs per byte it moves waits on memory on this chip; more, on arithmetic.",
            mistakes={"uses the sparse TFLOP/s figure": ref.ridge_point(chip(x, tflops=2 * x.dense_tflops)),
                      "reads the bandwidth's GB as GiB": ref.ridge_point(chip(x, gb_per_s=x.hbm_gb_per_s * 2**30 / 1e9))})

    q = ask(c, f"{chip_text(c)}: what is its ridge point?")
    q.follow_ups.append(ask(c2, f"Now the {chip_text(c2)}: its ridge point?"))
    q.follow_ups[0].why = ("The ridge is a ratio: more bandwidth lowers it (more work becomes compute-bound), more "
                           "compute raises it. Compare the two numbers, not the chips' names.")
    return q


@template(STEM, "decode intensity")
def decode_intensity(rng, ref):
    m, c = any_model(rng), any_chip(rng)
    ctx = pick(rng, [512, 1000, 2000, 4096, 8192, 16384])

    def ask(wd, prompt):
        f, b = ref.forward_flops(m, 1, ctx), ref.forward_bytes(m, 1, ctx, wd, "bf16")
        r = ref.roofline(f, b, chip(c))
        ridge = ref.ridge_point(chip(c))
        return Numeric(
            prompt, "FLOP/byte", r["intensity"],
            [f"FLOPs = 2 x params + attention over {ctx + 1:,} keys = {fmt(f)}",
             f"bytes = weights ({wd}) + KV cache of {ctx:,} tokens read + 1 token written = {fmt(b)}",
             f"intensity = {fmt(f)} / {fmt(b)} = {fmt(r['intensity'])} FLOP/byte",
             f"the {c.name} ridge is {fmt(ridge)}: {r['bound']}-bound, {ridge / r['intensity']:.0f}x below it"],
            "Decode reads every weight to do one multiply-add with it: about one FLOP per byte, far below any ridge.",
            mistakes={"counts bits, not bytes": f / (8 * b), "counts a multiply-add as one FLOP": f / 2 / b})

    q = ask("bf16", f"One decode step, batch 1, of {model_text(m)}: bf16 weights and KV cache, {ctx:,} tokens "
                    "already cached. Counting 2 FLOPs per parameter per token plus attention, and the bytes of the "
                    "weights plus the KV cache read and written, what is the step's arithmetic intensity?")
    q.follow_ups.append(ask("fp8", "Now the weights are fp8 (the KV cache stays bf16): the intensity?"))
    q.follow_ups[0].why = "Fewer weight bytes raise the intensity, but it stays far below any ridge: still memory-bound."
    return q


@template(STEM, "decode step time")
def decode_time(rng, ref):
    m, c = any_model(rng), any_chip(rng)
    batch, ctx = pick(rng, [8, 16, 32, 64]), pick(rng, [512, 1024, 2048, 4096])

    def ask(b, kv, prompt):
        cost = ref.decode_step_cost(m, b, ctx, "bf16", kv)
        r = ref.roofline(cost["flops"], cost["bytes"], chip(c))
        one = ref.decode_step_cost(m, 1, ctx, "bf16", kv)
        weights = ref.forward_bytes(m, 0, 0, "bf16", kv)
        return Numeric(
            prompt, "ms", r["time_s"] * 1e3,
            [f"bytes = weights once ({fmt(weights)}) + {b} sequences x KV of {ctx + 1:,} tokens ({kv}) = {fmt(cost['bytes'])}",
             f"FLOPs = {b} x one token's FLOPs = {fmt(cost['flops'])}",
             f"memory time {fmt(cost['bytes'] / (c.hbm_gb_per_s * 1e9) * 1e3)} ms, compute time "
             f"{fmt(cost['flops'] / (c.dense_tflops * 1e12) * 1e3)} ms: {r['bound']}-bound",
             f"roofline time = the larger = {fmt(r['time_s'] * 1e3)} ms"],
            "The weights are read once per step however many sequences ride along; each sequence adds only its own KV.",
            mistakes={"reads the weights once per sequence, not once per step":
                      ref.roofline(b * one["flops"], b * one["bytes"], chip(c))["time_s"] * 1e3,
                      "takes FLOPs / peak (treats decode as compute-bound)": cost["flops"] / (c.dense_tflops * 1e12) * 1e3})

    q = ask(batch, "bf16", f"A decode step of {batch} sequences of {model_text(m)} on one {chip_text(c)}: bf16 weights "
                           f"and KV cache, each sequence with {ctx:,} cached tokens. Roofline time of the step?")
    q.follow_ups.append(ask(4 * batch, "bf16", f"Now the batch is {4 * batch} (4x): the step time?"))
    ratio = q.follow_ups[0].answer / q.answer
    q.follow_ups[0].why = (f"Four times the tokens for {ratio:.2f}x the time: the weight read is shared, only the caches "
                           "grow with the batch. That is why servers batch decode.")
    q.follow_ups.append(ask(batch, "fp8", f"Back to {batch} sequences, now with an fp8 KV cache: the step time?"))
    cost = ref.decode_step_cost(m, batch, ctx, "bf16", "bf16")
    share = 1 - ref.forward_bytes(m, 0, 0, "bf16", "bf16") / cost["bytes"]
    q.follow_ups[1].why = (f"fp8 KV halves only the caches' share of the bytes, {share:.0%} here; the weight read is "
                           "untouched.")
    return q


@template(STEM, "prefill time")
def prefill_time(rng, ref):
    m, c = any_model(rng), pick(rng, CHIPS)  # real chips: a prefill this long is compute-bound on each
    c2 = other(rng, CHIPS, c)
    tokens = pick(rng, [1000, 2000, 4096, 8192])

    def ask(x, prompt):
        f, b = ref.forward_flops(m, tokens, 0), ref.forward_bytes(m, tokens, 0, "bf16", "bf16")
        r = ref.roofline(f, b, chip(x))
        return Numeric(
            prompt, "ms", r["time_s"] * 1e3,
            [f"FLOPs = 2 x params x {tokens:,} + causal attention = {fmt(f)}",
             f"bytes = weights once + {tokens:,} tokens' K and V written = {fmt(b)}",
             f"intensity {fmt(r['intensity'])} FLOP/byte vs ridge {fmt(ref.ridge_point(chip(x)))}: {r['bound']}-bound",
             f"time = FLOPs / peak = {fmt(f)} / {x.dense_tflops:g}e12 = {fmt(r['time_s'] * 1e3)} ms"],
            "One weight read serves every prompt token, so prefill is limited by arithmetic, not bandwidth.",
            mistakes={"takes bytes / bandwidth (decode's bound)": b / (x.hbm_gb_per_s * 1e9) * 1e3,
                      "uses the sparse TFLOP/s figure": ref.roofline(f, b, chip(x, tflops=2 * x.dense_tflops))["time_s"] * 1e3})

    q = ask(c, f"Prefill of a {tokens:,}-token prompt (nothing cached) through {model_text(m)} in bf16 on one "
               f"{chip_text(c)}. Roofline time?")
    q.follow_ups.append(ask(c2, f"Now the same prefill on the {chip_text(c2)}: its roofline time?"))
    q.follow_ups[0].why = "A compute-bound pass follows the TFLOP/s, not the bandwidth: H100 and H200 take the same time."
    return q


@template(STEM, "decode crossover batch")
def crossover(rng, ref):
    m, c = any_model(rng), any_chip(rng)
    ctx = pick(rng, [1000, 2000, 4096, 8192])
    ch = chip(c)

    def ask(wd, prompt):
        b = ref.decode_crossover_batch(m, ch, 0, wd, "bf16", include_kv=False)
        per_param = ref.forward_bytes(m, 0, 0, wd, "bf16") / m["params"]
        return Numeric(
            prompt, "sequences", b,
            [f"per step: B x 2 x params FLOPs against one read of the weights ({per_param:g} byte(s) per parameter)",
             f"intensity = 2B / {per_param:g} FLOP/byte; set it >= the ridge {fmt(ref.ridge_point(ch))}",
             f"B >= ridge x {per_param:g} / 2: smallest whole B = {b}"],
            "Each extra sequence reuses the same weight read, so intensity grows with the batch until it meets the ridge.",
            rtol=0.02,
            mistakes={"counts a multiply-add as one FLOP":
                      ref.decode_crossover_batch(m, chip(c, tflops=2 * c.dense_tflops), 0, wd, "bf16", include_kv=False),
                      "counts bits, not bytes, per weight":
                      ref.decode_crossover_batch(m, chip(c, gb_per_s=c.hbm_gb_per_s / 8), 0, wd, "bf16", include_kv=False)})

    q = ask("bf16", f"{model_text(m)} on one {chip_text(c)}, bf16 weights, short contexts (count only the weight "
                    "matmuls and the weight read). From what decode batch size is a step compute-bound?")
    q.follow_ups.append(ask("fp8", "Now the weights are fp8: the crossover batch?"))
    q.follow_ups[0].why = "Half the bytes per weight, half the batch needed to hide them."
    one = ref.decode_step_cost(m, 1, ctx, "bf16", "bf16")
    weights = ref.forward_bytes(m, 0, 0, "bf16", "bf16")
    cap = one["flops"] / (one["bytes"] - weights)
    q.follow_ups.append(Numeric(
        f"Now count the KV cache too: each sequence has {ctx:,} cached tokens (bf16). As the batch grows without "
        "bound, what intensity does a decode step approach?", "FLOP/byte", cap,
        [f"per sequence: {fmt(one['flops'])} FLOPs and {fmt(one['bytes'] - weights)} bytes of its own KV",
         f"(B x F) / (W + B x K) -> F / K = {fmt(cap)} FLOP/byte as B grows",
         f"ridge {fmt(ref.ridge_point(ch))}: " + ("never compute-bound at this context" if cap < ref.ridge_point(ch)
                                                  else "still reachable, at a larger batch")],
        "Every sequence reads its own cache, so those bytes grow with the batch as fast as the FLOPs: intensity levels off.",
        mistakes={"keeps the weights in the denominator (batch 1's intensity)": one["flops"] / one["bytes"]}))
    return q


@template(STEM, "attention vs weight FLOPs")
def attention_share(rng, ref):
    m = any_model(rng)
    ctx = pick(rng, [2000, 8192, 32768, 131072])
    per_key = ref.attention_flops(m, 1, 0)
    even = 2 * m["params"] / per_key
    q = Numeric(
        f"{model_text(m)}. A decode token's attention costs 4 x head_dim FLOPs per (query head, key) pair per layer; "
        "its weight matmuls cost 2 x params. At about what context length are the two equal?", "tokens", even,
        [f"attention per key seen = 4 x {m['layers']} layers x {m['heads']} query heads x {m['head_dim']} = {fmt(per_key)} FLOPs",
         f"weights = 2 x {fmt(m['params'])} = {fmt(2 * m['params'])} FLOPs",
         f"equal at {fmt(2 * m['params'])} / {fmt(per_key)} = {fmt(even)} keys"],
        "Attention FLOPs only matter at long contexts; attention's bytes (the KV cache) matter far sooner.",
        mistakes={"uses the KV heads (GQA shrinks the cache, not the score work)":
                  2 * m["params"] / ref.attention_flops({**m, "heads": m["kv_heads"]}, 1, 0)})
    att, tot = ref.attention_flops(m, 1, ctx), ref.forward_flops(m, 1, ctx)
    q.follow_ups.append(Numeric(
        f"At {ctx:,} cached tokens, what share of a decode token's FLOPs is attention?", "%", 100 * att / tot,
        [f"attention over {ctx + 1:,} keys = {fmt(att)} FLOPs", f"total = {fmt(tot)} FLOPs",
         f"share = {fmt(100 * att / tot)}%"],
        "The attention share grows linearly with the context; the weight FLOPs per token do not."))
    return q


@template(STEM, "other accelerators")
def other_accelerators(rng, ref):
    name = pick(rng, sorted(ref.OTHER_CHIPS))
    x = ref.OTHER_CHIPS[name]
    m, wd = any_model(rng), pick(rng, ["bf16", "fp8"])
    w = ref.forward_bytes(m, 0, 0, wd, "bf16")
    fits = w <= x["hbm_gb"] * 1e9
    q = Numeric(
        f"The {name}'s datasheet gives {x['dense_tflops']:g} dense bf16 TFLOP/s ({x['sparse_tflops']:g} with 2:4 "
        f"sparsity), {x['hbm_gb_per_s'] / 1000:g} TB/s of HBM and {x['hbm_gb']} GB. {model_text(m)} with {wd} weights "
        "decodes at batch 1 with a short context on one of them: at least how many milliseconds per step does "
        "reading the weights take?", "ms", w / (x["hbm_gb_per_s"] * 1e9) * 1e3,
        [f"weights = {ref.DTYPE_BITS[wd] // 8} byte(s) x {fmt(m['params'])} parameters = {fmt(w)} bytes "
         f"({'they fit in' if fits else 'more than'} the card's {x['hbm_gb']} GB)",
         f"time >= {fmt(w)} / {x['hbm_gb_per_s']:g}e9 bytes/s = {fmt(w / (x['hbm_gb_per_s'] * 1e9) * 1e3)} ms"],
        "A decode step streams every weight once: bandwidth, not TFLOP/s, sets its floor.",
        mistakes={"divides the FLOPs by the TFLOP/s (decode is memory-bound)":
                  2 * m["params"] / (x["dense_tflops"] * 1e12) * 1e3,
                  "reads the TB/s as TiB/s": w / (x["hbm_gb_per_s"] * 2**40 / 1000) * 1e3})
    r = ref.ridge_point(x)
    q.follow_ups.append(Numeric(
        f"What is the {name}'s ridge point?", "FLOP/byte", r,
        [f"peak = {x['dense_tflops']:g}e12 FLOP/s (dense; the sparse figure assumes 2:4 structured sparsity)",
         f"bandwidth = {x['hbm_gb_per_s']:g}e9 bytes/s",
         f"ridge = {fmt(r)} FLOP/byte, against the H100 SXM's {fmt(ref.ridge_point(ref.CHIPS['H100 SXM']))}"],
        "Compute and bandwidth grew together, so the ridge barely moved: decode is as memory-bound as on Hopper.",
        mistakes={"uses the sparse TFLOP/s figure": x["sparse_tflops"] * 1e12 / (x["hbm_gb_per_s"] * 1e9)}))
    return q


@template(STEM, "tensor-parallel all-reduce")
def tp_allreduce(rng, ref):
    m = pick(rng, [ref.LLAMA_3_70B, ref.LLAMA_3_8B])
    n, tokens = pick(rng, [2, 4, 8]), pick(rng, [16, 32, 64, 128, 256])
    payload = tokens * m["hidden"] * 2
    calls = 2 * m["layers"]
    sent = calls * 2 * (n - 1) / n * payload
    q = Numeric(
        f"{m['name']} ({m['layers']} layers, hidden {m['hidden']:,}) decodes {tokens} tokens per step, bf16, tensor "
        f"parallel over {n} GPUs. Each layer all-reduces the activations after the attention output projection and "
        "after the MLP. With a ring all-reduce, how many megabytes does each GPU send per step?", "MB", sent / 1e6,
        [f"payload per all-reduce = tokens x hidden x 2 bytes = {tokens} x {m['hidden']:,} x 2 = {fmt(payload)} bytes",
         f"a ring all-reduce sends 2(n-1)/n = {2 * (n - 1) / n:g}x the payload from each GPU",
         f"{calls} all-reduces per step (2 per layer): {fmt(sent / 1e6)} MB"],
        "The payload is the activations, tokens x hidden, not the weights: small at decode, so the call count matters.",
        mistakes={"counts one all-reduce per layer, not two": sent / 2e6,
                  "sends the payload once per all-reduce (a ring sends 2(n-1)/n of it)": calls * payload / 1e6,
                  "counts the weights instead of the activations": calls * 2 * (n - 1) / n * 2 * m["params"] / n / 1e6})
    link = ref.NVLINK_GB_PER_S["H100 SXM"] * 1e9
    per_call = 40e-6
    t = (sent / link + calls * per_call) * 1e3
    q.follow_ups.append(Numeric(
        f"On H100 SXMs, NVLink gives {link / 1e9:g} GB/s per GPU each way (900 GB/s both ways together), and each "
        f"all-reduce costs a fixed {per_call * 1e6:g} us besides its bytes. How many milliseconds per step?", "ms", t,
        [f"bytes: {fmt(sent)} / {link / 1e9:g}e9 = {fmt(sent / link * 1e3)} ms",
         f"calls: {calls} x {per_call * 1e6:g} us = {fmt(calls * per_call * 1e3)} ms",
         f"total {fmt(t)} ms"],
        "At decode sizes the fixed cost per call dominates: fewer, fused or faster all-reduces matter more than bandwidth.",
        mistakes={"leaves out the fixed cost per call": sent / link * 1e3,
                  "uses the both-ways 900 GB/s for one direction": (sent / (2 * link) + calls * per_call) * 1e3}))
    return q


@template(STEM, "explain prefill vs decode")
def explain(rng, ref):
    return Open(
        "Explain why prefill is limited by arithmetic and decode by memory bandwidth, and what that means for how "
        "a server should batch.",
        ["time = max(FLOPs / peak, bytes / bandwidth); compare a pass's FLOPs per byte with the ridge, peak / bandwidth",
         "a forward pass reads every weight once, however many tokens it carries",
         "prefill: the prompt's tokens share one weight read, so its intensity is about the prompt length, above the ridge",
         "decode: one token per sequence does one multiply-add per weight read, about 1 FLOP/byte in bf16",
         "batching decode shares the weight read, but each sequence reads its own KV cache, so intensity levels off",
         "so batch decode as wide as KV memory allows, and schedule prefill in chunks beside it"],
        "It is bookkeeping: count FLOPs and bytes, divide, compare with one number per chip.")
