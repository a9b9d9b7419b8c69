"""Lesson 16 questions: bytes of an int4 model, fp8 scales, where a quantized GEMM turns compute-bound, a W4A16
GEMM's speedup by batch (Marlin's regime), the modeled decode speedup of weight-only int4, and the tokens an fp8 KV
cache adds."""
from __future__ import annotations

from dataclasses import replace

from reference_engine.sim import gpu_model as gm

from .pools import CHIPS, GB, SHAPES, pick
from .question import Numeric, Open, fmt, template

STEM = "l16_quantization"


@template(STEM, "int4 model bytes")
def int4_bytes(rng, ref):
    params = pick(rng, [1.1e9, 3.0e9, 7.0e9, 8.03e9, 13.0e9, 34.0e9, 70.6e9, 405.0e9])
    group = pick(rng, [64, 128])
    q = _int4_q(params, group)
    other = 32 if group == 64 else 64
    q.follow_ups.append(_int4_q(params, other))
    return q


def _int4_q(params: float, group: int) -> Numeric:
    bits = 4 + 16 / group + 8 / group  # a 4-bit code, plus an fp16 scale and a uint8 zero point per group
    gb = params * bits / 8 / GB
    return Numeric(f"A {fmt(params / 1e9)}B-parameter model is quantized to int4 weight-only, asymmetric, groups of "
                   f"{group} weights with one fp16 scale and one uint8 zero point each. Weight memory in GB (1e9 bytes), "
                   "counting every weight as quantized?", "GB", gb,
                   [f"bits per weight = 4 + 16/{group} + 8/{group} = {fmt(bits)}",
                    f"{fmt(params / 1e9)}e9 x {fmt(bits)} / 8 = {fmt(gb)} GB"],
                   "Group scales are the price of accuracy: a few percent on top of 4 bits.",
                   mistakes={"forgets the scales and zero points": params * 0.5 / GB,
                             "counts bf16 (2 bytes per weight)": params * 2 / GB})


@template(STEM, "fp8 scale")
def fp8_scale(rng, ref):
    amax = pick(rng, [3.5, 12.0, 57.0, 210.0, 896.0])
    x = round(amax * pick(rng, [0.1, 0.37, 0.5, 0.83]), 3)
    q = _fp8_q(amax, x, "A tensor's largest magnitude is")
    q.follow_ups.append(_fp8_q(amax * 8, x, "An outlier now makes the tensor's largest magnitude"))
    return q


def _fp8_q(amax: float, x: float, lead: str) -> Numeric:
    scale = amax / 448
    q = x / scale
    return Numeric(f"{lead} {fmt(amax)}. With a per-tensor E4M3 scale chosen so that it "
                   f"maps to the largest finite E4M3 value, what value (before rounding to E4M3) represents {fmt(x)}?",
                   "", q, [f"scale = amax / 448 = {fmt(amax)} / 448 = {fmt(scale)}", f"{fmt(x)} / {fmt(scale)} = {fmt(q)}"],
                   "E4M3's largest finite value is 448 (no infinity); scale = amax / 448.",
                   mistakes={"uses E5M2's max (57344)": x / (amax / 57344), "uses int8's 127": x / (amax / 127),
                             "uses 240, the max of float8_e4m3fnuz (AMD's E4M3 encoding), not OCP E4M3's 448":
                                 x / (amax / 240)})


@template(STEM, "where a quantized GEMM turns compute-bound")
def ridge_tokens(rng, ref):
    chip = pick(rng, CHIPS)
    widths = [(0.25, "2-bit weight-only (0.25 byte per weight)"), (0.5, "int4 weight-only (0.5 byte per weight)"),
              (1, "int8 weight-only (1 byte)"), (2, "bf16 (2 bytes)")]
    i = rng.randrange(4)
    q = _ridge_q(chip, *widths[i])
    q.follow_ups.append(_ridge_q(chip, *widths[(i + 1) % 4]))
    return q


def _ridge_q(chip, wb: float, name: str) -> Numeric:
    ridge = chip.peak_flops / chip.bandwidth
    n = ridge * wb / 2
    return Numeric(f"On an {chip.name} ({fmt(chip.dense_tflops)} dense bf16 TFLOP/s, {fmt(chip.hbm_gb_per_s)} GB/s) "
                   f"the weights are {name} and the matmul runs in bf16. At the datasheet peaks, from how many tokens "
                   "per step is a weight GEMM compute-bound (count only the weight bytes)?", "tokens", n,
                   [f"intensity = 2 n FLOPs per weight / {fmt(wb)} bytes per weight = {fmt(2 / wb)} n FLOP/byte",
                    f"ridge = {fmt(chip.dense_tflops)}e12 / {fmt(chip.hbm_gb_per_s)}e9 = {fmt(ridge)} FLOP/byte",
                    f"n = ridge x {fmt(wb)} / 2 = {fmt(n)}"],
                   "Fewer weight bytes raise the intensity: weight-only int4 leaves the memory-bound regime sooner, "
                   "and past it, it buys nothing.",
                   rtol=0.03, mistakes={"ignores the bytes per weight (n = ridge / 2, as bf16)": ridge / 2,
                                        "forgets the factor 2 FLOPs per multiply-add": ridge * wb,
                                        "takes the ridge itself as the token count": ridge})


@template(STEM, "W4A16 GEMM speedup by batch")
def w4a16_gemm(rng, ref):
    import torch

    chip = pick(rng, CHIPS)
    qw = ref.quantize_int4(torch.zeros(1, 128), 128, False)
    bits = ref.int4_bytes(qw) * 8 / 128  # 4-bit codes plus an fp16 scale and a uint8 zero per 128 weights
    q = _gemm_q(chip, bits, pick(rng, [1, 4, 16, 32]))
    q.follow_ups.append(_gemm_q(chip, bits, pick(rng, [128, 256, 1024])))
    return q


def _gemm_q(chip, bits: float, n: int) -> Numeric:
    ridge = chip.peak_flops / chip.bandwidth

    def per_weight(b):  # seconds per weight at the datasheet peaks: its bytes, or its 2n FLOPs, whichever is longer
        return max(b / chip.bandwidth, 2 * n / chip.peak_flops)

    bf16, w4 = per_weight(2.0), per_weight(bits / 8)
    regime = lambda b: "memory" if 2 * n / b < ridge else "compute"  # noqa: E731
    return Numeric(f"A weight GEMM on an {chip.name} ({fmt(chip.dense_tflops)} dense bf16 TFLOP/s, "
                   f"{fmt(chip.hbm_gb_per_s)} GB/s) runs {n} token{'s' if n > 1 else ''}. With int4 weight-only (W4A16, group 128: "
                   f"{fmt(bits)} bits per weight with the fp16 scale and uint8 zero) dequantized in the kernel, as "
                   "Marlin does, how many times faster is it than bf16 at the datasheet peaks (count the weight "
                   "bytes and the 2 FLOPs per weight per token)?", "x", bf16 / w4,
                   [f"ridge = {fmt(ridge)} FLOP/byte; intensity 2 x {n} / bytes per weight",
                    f"bf16: {fmt(2 * n / 2)} FLOP/byte, {regime(2.0)}-bound; W4A16: "
                    f"{fmt(2 * n / (bits / 8))} FLOP/byte, {regime(bits / 8)}-bound",
                    f"time per 1e9 weights: bf16 {fmt(bf16 * 1e12)} ms, W4A16 {fmt(w4 * 1e12)} ms -> {fmt(bf16 / w4)}x"],
                   "While both are memory-bound the speedup is the byte ratio, 16 / 4.19 ~ 3.8x (Marlin, Frantar et "
                   "al., PPoPP 2025, arXiv 2408.11743, measures close to that up to batch 16-32); once the math "
                   "dominates, fewer bytes buy nothing.", rtol=0.03,
                   mistakes={"takes the 4x of 4-bit codes, forgetting the scales and zero points": 4.0,
                             "keeps the memory-bound byte ratio past the ridge": 16 / bits})


@template(STEM, "modeled int4 decode speedup")
def int4_speedup(rng, ref):
    chip = pick(rng, ["H100", "H200", "A100"])
    batch, context = pick(rng, [1, 4, 8]), pick(rng, [1024, 4096])
    q = _speedup_q(ref, chip, batch, context)
    q.follow_ups.append(_speedup_q(ref, chip, 64, context))
    return q


def _speedup_q(ref, chip: str, batch: int, context: int) -> Numeric:
    bf16 = ref.modeled_method("bf16", batch, "decode", context=context, chip_name=chip)
    w4 = ref.modeled_method("w4a16", batch, "decode", context=context, chip_name=chip)
    return Numeric(f"Llama-3-8B decodes at batch {batch} with a {context}-token context on one {chip}. On the course's "
                   "modeled clock (gpu_model.step_time), how many times faster is a step with int4 weight-only (0.5 "
                   "byte per weight) than in bf16?", "x", bf16 / w4,
                   [f"bf16 step: {fmt(bf16 * 1e3)} ms (weights streamed at 2 bytes, plus KV reads and overhead)",
                    f"w4a16 step: {fmt(w4 * 1e3)} ms", f"ratio {fmt(bf16 / w4)}x"],
                   "Only the weight bytes shrink 4x; KV reads, activations and per-step overhead do not.",
                   rtol=0.05, mistakes={"takes the 4x of the weight bytes as the speedup": 4.0})


@template(STEM, "tokens an fp8 KV cache adds")
def fp8_kv_tokens(rng, ref):
    chip, shape = pick(rng, CHIPS), pick(rng, SHAPES)
    tp = 1 if shape is gm.LLAMA_3_8B else pick(rng, [2, 4, 8])  # 70B in bf16 needs more than one card
    q = _kv_q(shape, chip, tp)
    q.follow_ups.append(_kv_q(shape, gm.H200 if chip is not gm.H200 else gm.H100, tp))
    return q


def _kv_q(shape, chip, tp: int) -> Numeric:
    bf16 = gm.kv_capacity(shape, chip, tp=tp)["tokens"]
    fp8 = gm.kv_capacity(replace(shape, kv_bytes=1), chip, tp=tp)["tokens"]
    per = gm.kv_bytes_per_token(shape, tp)
    where = f"one {chip.name}" if tp == 1 else f"{tp} x {chip.name} (tensor parallel; per GPU)"
    return Numeric(f"{shape.name} in bf16 on {where} ({fmt(chip.memory_mib)} MiB each), 90% of memory usable, "
                   f"{fmt(per / 1024)} KiB of bf16 KV per token. How many more tokens fit with an fp8 KV cache?",
                   "tokens", fp8 - bf16,
                   [f"bf16 cache: {fmt(bf16)} tokens", f"fp8: half the bytes per token, {fmt(fp8)} tokens",
                    f"difference: {fmt(fp8 - bf16)}"],
                   "An fp8 cache doubles the tokens that fit; the weights keep their share.",
                   rtol=0.02, mistakes={"quantizes the weights instead (frees weight bytes, not KV bytes per token)":
                                        gm.kv_capacity(replace(shape, weight_bytes=1), chip, tp=tp)["tokens"] - bf16})


@template(STEM, "which method, and how to prove it")
def which_method(rng, ref):
    return Open(
        "Your service is slow at batch-1 decode, slow at prefill-heavy batches, and out of KV memory at peak. Which "
        "quantization do you ship for each, and how do you show quality held when perplexity barely moved?",
        ["batch-1 decode is memory-bound: weight-only int4/int8 (AWQ, GPTQ) cuts the bytes streamed per step",
         "prefill and large batches are compute-bound: 8-bit W8A8 uses the 8-bit tensor-core rate (2x bf16 on the "
         "datasheet; vLLM's FP8 docs report up to 1.6x throughput): fp8 on Ada/Hopper, INT8 W8A8 from compute "
         "capability 7.5 (A100, needs calibrated activation scales); weight-only does not help",
         "W4A16 kernels (Marlin) reach ~3.8x on a GEMM only while it is memory-bound (small batch): 16 / 4.19 bits",
         "KV capacity: an fp8 KV cache halves bytes per token, twice the tokens; no speedup without fused dequantization",
         "per-group (128) or per-token scales keep outliers from flattening the rest of the grid",
         "perplexity hides flips: report KL to the baseline, top-1 flip rate, greedy agreement (Dutta et al., 2024)",
         "measure by position in long contexts: divergence compounds in generation"],
        "Match the method to the resource you lack, then evaluate with the metrics that see flips.")
