"""The calibrated cost of one engine step: gpu_model's roofline, plus what real kernels lose on the way.

gpu_model.step_time prices a step as if every kernel ran at one fraction of the chip's peak whatever its shape.
Measured against published numbers (reference_engine/sim/validation.py), that is close for memory-bound decode
and optimistic elsewhere. This module prices the same step, with the same inputs and the same StepTime /
KernelTime answer, adding what the roofline leaves out:

1. GEMM shape. A GEMM kernel cuts its output C[m, n] into tiles, one thread block per tile, and runs them in
   waves over the chip's SMs: a partial last wave leaves SMs idle, and rows past m in the last tile row are
   padding. The time is (waves) x (one tile's work at one SM's share of the best-shape rate), with the kernel
   picking the least wasteful of a few tile shapes and, for skinny GEMMs, splitting K. FP8 weight GEMMs (shape.weight_bytes == 1) run on the FP8
   tensor cores: twice the bf16 peak, at their own, lower, achievable fraction.
2. Non-GEMM kernels: per layer two fused residual-add + RMSNorms, RoPE, the KV-cache write and the SiLU-and-
   multiply; per step the embedding gather, the final norm and sampling over the logits. Each is memory-bound:
   the bytes it reads and writes over the achievable bandwidth.
3. A floor per kernel launch: even inside a CUDA graph (no host launch cost) a kernel takes a few microseconds
   on the GPU, however little it moves. A batch-1 decode step launches hundreds of them.
4. Attention by grid size. Decode attention runs one program per (sequence, KV head, 512-key partition): fewer
   programs than SMs reach only that share of the bandwidth. Prefill attention likewise, one program per
   (query tile of 128 rows, head), and each query tile pays a fixed cost worth ATTN_TILE_OVERHEAD_KEYS keys,
   so short sequences run further below the attention peak than long ones.
5. Memory efficiency per chip, all-reduce time by ring size, and a per-step host overhead (smaller than
   gpu_model's: engines that publish these numbers overlap scheduling with the GPU and replay CUDA graphs).

Every constant says where it comes from: CITED (with its source) or ASSUMPTION. The lessons still use
gpu_model.step_time; this is opt-in:

    from reference_engine.sim import calibration
    from reference_engine.sim.gpu_model import H100, LLAMA_3_8B, Composition
    st = calibration.step_time(LLAMA_3_8B, H100, Composition.decode_batch(64, 1024))
    st.time_s, [(k.name, k.calls, k.time_s) for k in st.kernels]
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from reference_engine.sim import measured
from reference_engine.sim.gpu_model import (
    A100,
    H100,
    H200,
    MEM_EFF_GPT_FAST,
    Chip,
    Composition,
    KernelTime,
    ModelShape,
    StepTime,
    attention_cost,
    gemm_shapes,
    matmul_cost,
    rank_dims,
)

# ---------------------------------------------------------------- the constants


@dataclass(frozen=True)
class ChipCalibration:
    """What the calibrated model needs beyond gpu_model's Chip: the SM count (for waves and grids), the dense
    FP8 tensor-core peak (0: none, as on A100) and the achievable fraction of HBM bandwidth. The calibrated model
    takes peaks, gemm_eff and attn_eff from the Chip, and the memory fraction from here (Chip.mem_eff is not read)."""
    sms: int
    fp8_tflops: float
    mem_eff: float
    mem_eff_source: str = ""


# SM counts, CITED: NVIDIA A100 Tensor Core GPU Architecture whitepaper (A100: 108 SMs); NVIDIA H100 Tensor Core GPU
# Architecture whitepaper (H100 SXM5: 132 SMs). H200 is the same GH100 chip with HBM3e (NVIDIA H200 datasheet: same
# compute as H100, as reference-facts.md says), so 132 SMs.
# FP8 peak, CITED: H100 SXM datasheet, dense FP8 tensor 1,979 TFLOP/s = 2 x the 989 bf16 figure; H200 the same.
# mem_eff: A100 CITED (gpt-fast README, 1700 of 2039 GB/s, as gpu_model.MEM_EFF_GPT_FAST). H100 and H200: the same
# 0.834 is an ASSUMPTION; no measurement of either chip's achievable bandwidth was found to cite.
# A chip measured by gpu_check (measured.py's table, with its provenance) takes the measured fraction instead.
_GPT_FAST = "CITED for A100: gpt-fast README, 1700 of 2039 GB/s"
_ASSUMED = "ASSUMPTION: A100's cited fraction (gpt-fast); not measured on this chip yet"
CALIBRATIONS = {
    A100.name: ChipCalibration(sms=108, fp8_tflops=0.0, mem_eff=MEM_EFF_GPT_FAST, mem_eff_source=_GPT_FAST),
    H100.name: ChipCalibration(sms=132, fp8_tflops=1979.0, mem_eff=MEM_EFF_GPT_FAST, mem_eff_source=_ASSUMED),
    H200.name: ChipCalibration(sms=132, fp8_tflops=1979.0, mem_eff=MEM_EFF_GPT_FAST, mem_eff_source=_ASSUMED),
}

# FP8 GEMM best-shape fraction, CITED: DeepGEMM (deepseek-ai/DeepGEMM README) first release, "up to 1350+ FP8 TFLOPS"
# on H800 (the same 1,979 TFLOP/s dense FP8 peak as H100 SXM): 1350 / 1979 = 0.68. Its README later reports up to
# 1550 (0.78) after hand tuning; taking the lower figure for the per-tensor-scaled library GEMMs an engine calls is
# an ASSUMPTION. bf16 keeps gpu_model's cited best-shape fraction (Chip.gemm_eff: 0.803 on H100).
FP8_GEMM_EFF = 1350 / 1979

# Output tiles (rows, columns) a GEMM kernel may use; it picks the least wasteful. ASSUMPTION: the common CUTLASS /
# cuBLAS Hopper tile sizes; 64 rows is the smallest, the M of one Hopper warpgroup MMA (wgmma m64nNk16, CUDA PTX ISA),
# so a decode GEMM of 1..64 rows pays for 64. Used for A100 too (its MMA is smaller, but its library tiles are not).
GEMM_TILES = ((64, 128), (64, 256), (128, 128), (128, 256))
# Split-K: a GEMM with too few tiles to fill the SMs splits K into up to this many slices, one block per (tile,
# slice), each slice at least GEMM_MIN_SPLIT_K deep (cuBLAS and CUTLASS do this for skinny GEMMs; the limits are an
# ASSUMPTION). Without it a decode GEMM of 32 tiles would use 32 of 132 SMs.
GEMM_MAX_SPLIT_K, GEMM_MIN_SPLIT_K = 8, 256

# Decode attention splits each sequence's keys into partitions of this many, one program per (sequence, KV head,
# partition). CITED: vLLM's PagedAttention V2 kernel, grid (heads, sequences, partitions) with PARTITION_SIZE = 512
# (csrc/attention/paged_attention_v2.cu). SGLang's Triton decode kernel and vLLM v1's unified Triton attention split the
# keys likewise (reference-facts.md, 2026-12-06); that 512 fits them too is an ASSUMPTION.
DECODE_PARTITION_KEYS = 512
# Prefill attention: one program per (query tile, head). CITED: FlashAttention's forward grid is (ceil(seqlen_q /
# kBlockM), heads, batch) (flash_fwd_launch_template.h), kBlockM = 128 for head_dim 128 in most of its kernels (some
# variants use 64; taking 128 throughout is an ASSUMPTION).
ATTN_QUERY_TILE = 128
# Each query tile's fixed cost (loading Q, the half-masked diagonal block under the causal mask, the final rescale
# and write of O), in keys' worth of work: half a 128-key block of masked waste is derived; the rest of the 128 is an
# ASSUMPTION. A tile that sees k keys on average runs at k / (k + 128) of the attention peak.
ATTN_TILE_OVERHEAD_KEYS = 128

# The least time one kernel launch takes on the GPU, ASSUMPTION: "a few microseconds" (launch, ramp-up of the first
# wave and drain of the last). CUDA graphs hide the host's launch cost but not this.
KERNEL_FLOOR_S = 3e-6
# Host time per step that the engine does not hide behind the GPU, ASSUMPTION. Smaller than gpu_model's 0.3 ms because
# the engines published here replay CUDA graphs and overlap scheduling with the previous step (TensorRT-LLM's overlap
# scheduler is on by default; reference-facts.md, 2026-12-06).
HOST_OVERHEAD_S = 0.1e-3

# Activations, residuals and K/V before they are cached are bf16 (2 bytes) whatever the weights: the course's dtype.
ACT_BYTES = 2
# Sampling reads the fp32 logits (4 bytes) about three times (max, softmax sum, pick) in two kernels, ASSUMPTION.
LOGIT_BYTES, SAMPLING_PASSES, SAMPLING_KERNELS = 4, 3, 2


def calibration_for(chip: Chip, table: Path = measured.TABLE) -> ChipCalibration:
    """The ChipCalibration of one of gpu_model's chips (at_peak() copies included: same name), its memory fraction
    the newest measurement of that chip in measured.py's table if there is one. Raises KeyError for another chip:
    pass step_time(..., calibration=ChipCalibration(...)) for it."""
    try:
        cal = CALIBRATIONS[chip.name]
    except KeyError:
        raise KeyError(f"no calibration for {chip.name!r}: pass calibration=ChipCalibration(...)") from None
    record = _measured(table).get(chip.name)
    if record is None:
        return cal
    return replace(cal, mem_eff=measured.mem_eff(record), mem_eff_source=measured.source(record))


@functools.lru_cache(maxsize=4)
def _measured(table: Path) -> dict[str, dict]:
    return measured.load(table)

# ---------------------------------------------------------------- GEMMs


def waves(programs: int, sms: int) -> int:
    """How many rounds `programs` thread blocks take on `sms` SMs, one block per SM at a time."""
    return max(1, math.ceil(programs / sms))


def gemm_compute_s(m: int, n: int, k: int, rate_flops: float, sms: int) -> float:
    """Compute time of C[m, n] = A[m, k] @ B[k, n] at `rate_flops` (the best-shape rate of the whole chip): the least,
    over GEMM_TILES and split-K factors, of waves x one block's 2 * rows * cols * (k / splits) FLOPs at one SM's share
    of the rate. Padding (the last tile row past m, the last tile column past n) and SMs idle in the last wave are the
    difference from 2mnk / rate_flops. (The split-K partial sums' extra traffic is left out: m x n, small.)"""
    per_sm = rate_flops / sms
    best = math.inf
    for rows, cols in GEMM_TILES:
        tiles = math.ceil(m / rows) * math.ceil(n / cols)
        for splits in range(1, GEMM_MAX_SPLIT_K + 1):
            if splits > 1 and k / splits < GEMM_MIN_SPLIT_K:
                break
            blocks = tiles * splits
            best = min(best, waves(blocks, sms) * 2 * rows * cols * math.ceil(k / splits) / per_sm)
    return best


def gemm_efficiency(m: int, n: int, k: int, sms: int) -> float:
    """The share of the best-shape rate a GEMM of this shape reaches (1.0: no padding, every wave full)."""
    return 2 * m * n * k / (gemm_compute_s(m, n, k, 1.0, sms))


def _gemm_dtypes(shape: ModelShape, name: str, fp8_cores: bool) -> tuple[int, int, bool]:
    """(activation-in bytes, weight bytes, runs on FP8 tensor cores) of one weight GEMM. FP8 checkpoints keep lm_head
    in bf16 (ASSUMPTION: NVIDIA ModelOpt's FP8 export lists lm_head in exclude_modules); an FP8 GEMM also reads FP8
    activations (W8A8, per-tensor scales). Without FP8 tensor cores 1-byte weights are weight-only (bf16 math)."""
    w = 2 if name == "lm_head" else shape.weight_bytes
    fp8 = w == 1 and fp8_cores
    return (1 if fp8 else ACT_BYTES), w, fp8


def _gemm_kernels(shape, chip, cal, tokens: int, logit_rows: int, tp: int, floor_s: float) -> list[KernelTime]:
    """One KernelTime per weight GEMM of gemm_shapes: max(compute by waves, bytes / achievable bandwidth) per call."""
    bw = chip.bandwidth * cal.mem_eff
    out = []
    for name, m, n, k, calls in gemm_shapes(shape, tokens, logit_rows, tp):
        if m == 0:
            continue
        a, w, fp8 = _gemm_dtypes(shape, name, cal.fp8_tflops > 0)
        rate = cal.fp8_tflops * 1e12 * FP8_GEMM_EFF if fp8 else chip.peak_flops * chip.gemm_eff
        flops = matmul_cost(m, n, k)[0]
        nbytes = m * k * a + k * n * w + m * n * ACT_BYTES  # output in bf16
        compute, memory = gemm_compute_s(m, n, k, rate, cal.sms), nbytes / bw
        out.append(_kernel(name, "gemm", calls, flops, nbytes, compute, memory, floor_s))
    return out


def _kernel(name, kind, calls, flops, nbytes, compute_s, memory_s, floor_s) -> KernelTime:
    """A KernelTime of `calls` equal launches, each max(compute_s, memory_s, floor_s); totals over the calls.
    bound: "compute" or "memory" (the larger term), "launch" when the floor is larger than both."""
    per_call = max(compute_s, memory_s)
    bound = "launch" if floor_s > per_call else ("compute" if compute_s >= memory_s else "memory")
    return KernelTime(name, kind, calls, calls * flops, calls * nbytes, calls * compute_s, calls * memory_s,
                      calls * max(per_call, floor_s), bound)

# ---------------------------------------------------------------- attention


def decode_programs(shape: ModelShape, contexts: Counter, tp: int) -> float:
    """Programs of one decode-attention launch: per sequence, KV heads x partitions of DECODE_PARTITION_KEYS keys (a
    fraction for the last; so the count, and the time, never drop as a context grows)."""
    kv_heads = rank_dims(shape, tp)["kv_heads"]
    return sum(k * kv_heads * max(1.0, (c + 1) / DECODE_PARTITION_KEYS) for c, k in contexts.items())


def prefill_programs(shape: ModelShape, chunks: Counter, tp: int) -> float:
    """Programs of one prefill-attention launch: per chunk, query heads x query tiles of ATTN_QUERY_TILE rows."""
    heads = rank_dims(shape, tp)["heads"]
    return sum(k * heads * max(1.0, n / ATTN_QUERY_TILE) for (n, _), k in chunks.items())


def _attention_kernel(name, shape, chip, cal, chunks: Counter, programs: float, tp, floor_s) -> KernelTime:
    """One attention launch per layer over chunks {(tokens, context): count}. The grid fills min(1, programs / SMs)
    of the chip, which scales both its FLOP rate and its bandwidth; each chunk is its own roofline (as in gpu_model),
    its FLOP rate further scaled by the query tiles' fixed cost (ATTN_TILE_OVERHEAD_KEYS). bound: whichever term set
    most of the time, or "launch" when the per-layer floor is longer."""
    fill = min(1.0, programs / cal.sms)
    peak, bw = chip.peak_flops * chip.attn_eff * fill, chip.bandwidth * cal.mem_eff * fill
    flops = nbytes = compute = memory = total = compute_bound = 0.0
    for (n, c), k in chunks.items():
        f, b = attention_cost(shape, n, c, tp)
        keys = c + (n + 1) / 2  # keys an average query row of the chunk sees
        tc, tm = f / (peak * keys / (keys + ATTN_TILE_OVERHEAD_KEYS)), b / bw
        flops, nbytes, compute, memory = flops + k * f, nbytes + k * b, compute + k * tc, memory + k * tm
        total += k * max(tc, tm)
        compute_bound += k * tc if tc >= tm else 0.0
    floor_total = shape.layers * floor_s
    bound = "launch" if floor_total > total else ("compute" if compute_bound > total / 2 else "memory")
    return KernelTime(name, "attention", shape.layers, flops, nbytes, compute, memory, max(total, floor_total), bound)

# ---------------------------------------------------------------- non-GEMM kernels


def elementwise_bytes(shape: ModelShape, tokens: int, logit_rows: int, tp: int = 1,
                      fp8_gemms: bool = False) -> list[tuple[str, int, float]]:
    """The memory-bound non-GEMM kernels of one forward on one rank, as (name, calls, bytes per call).

    Per layer: two fused residual-add + RMSNorms (read x and the residual, write the residual and the normed input of
    the next GEMM), RoPE (read and write q and k), the KV-cache write (read new K/V in bf16, write them at kv_bytes),
    SiLU-and-multiply (read gate and up, write the down_proj input). Per step: the embedding gather, the final norm,
    and sampling over logit_rows x vocab fp32 logits. The input of the next GEMM is written in 1 byte when the
    GEMMs run in FP8 (fp8_gemms), else in bf16."""
    r, h, d = rank_dims(shape, tp), shape.hidden, shape.head_dim
    gemm_in = 1 if fp8_gemms else ACT_BYTES
    t = tokens
    return [("add_rmsnorm", 2 * shape.layers, t * h * (3 * ACT_BYTES + gemm_in)),
            ("rope", shape.layers, 2 * t * (r["heads"] + r["kv_heads"]) * d * ACT_BYTES),
            ("kv_cache_write", shape.layers, t * 2 * r["kv_heads"] * d * (ACT_BYTES + shape.kv_bytes)),
            ("silu_mul", shape.layers, t * r["intermediate"] * (2 * ACT_BYTES + gemm_in)),
            ("embedding", 1, 2 * t * h * ACT_BYTES),
            ("final_norm", 1, t * h * 4 * ACT_BYTES),
            ("sampling", SAMPLING_KERNELS, logit_rows * shape.vocab * LOGIT_BYTES * SAMPLING_PASSES / SAMPLING_KERNELS)]


def _elementwise_kernels(shape, chip, cal, comp: Composition, tp, floor_s) -> list[KernelTime]:
    bw = chip.bandwidth * cal.mem_eff
    fp8_gemms = _gemm_dtypes(shape, "qkv_proj", cal.fp8_tflops > 0)[2]
    return [_kernel(name, "elementwise", calls, 0.0, nbytes, 0.0, nbytes / bw, floor_s)
            for name, calls, nbytes in elementwise_bytes(shape, comp.num_tokens, comp.num_logit_rows, tp, fp8_gemms)]

# ---------------------------------------------------------------- all-reduce


# gpu_model's all-reduce fit (Chip.allreduce_*) was measured on 8 GPUs, CITED there.
ALLREDUCE_FIT_GPUS = 8


def ring_factor(n: int) -> float:
    """The share of the payload each GPU sends (and receives) in a ring all-reduce over n GPUs: 2 (n - 1) / n."""
    return 2 * (n - 1) / n


def _allreduce_kernel(shape, chip, comp, tp, floor_s) -> KernelTime:
    """Two all-reduces per layer of tokens x hidden bf16 activations. gpu_model's fit (40 us + P / 180 GB/s) is per
    payload on 8 GPUs; nccl-tests (doc/PERFORMANCE.md) calls algbw x ring_factor(n) the bus bandwidth, which does not
    depend on n. So here: latency + P x ring_factor(tp) / busbw, busbw = 180 x ring_factor(8) = 315 GB/s (derived):
    gpu_model's time at tp=8; at tp=2 the payload term is 1.75x smaller. The latency stays the 8-GPU one."""
    calls, payload = 2 * shape.layers, comp.num_tokens * shape.hidden * ACT_BYTES
    bus_gb_per_s = chip.allreduce_gb_per_s * ring_factor(ALLREDUCE_FIT_GPUS)
    per_call = chip.allreduce_latency_s + payload * ring_factor(tp) / (bus_gb_per_s * 1e9)
    return KernelTime("all_reduce", "allreduce", calls, 0.0, calls * payload, 0.0, calls * per_call,
                      calls * max(per_call, floor_s), "network")

# ---------------------------------------------------------------- the step


def step_time(shape: ModelShape, chip: Chip, composition: Composition, *, tp: int = 1,
              overhead_s: float = HOST_OVERHEAD_S, launch_floor_s: float = KERNEL_FLOOR_S, elementwise: bool = True,
              calibration: ChipCalibration | None = None) -> StepTime:
    """Calibrated seconds of one engine step: gpu_model.step_time's inputs and StepTime, with GEMMs by tiles and waves
    (FP8 at its own peak), attention by grid size, the non-GEMM kernels (kind "elementwise"; elementwise=False leaves
    them out), a floor of launch_floor_s per kernel launch (0 to drop it) and overhead_s per step.
    KernelTime.calls counts launches here (gpu_model's attention counts sequences x layers)."""
    if not composition.num_tokens:
        return StepTime(composition, (), 0.0, 0.0)
    cal = calibration or calibration_for(chip)
    floor = launch_floor_s
    kernels = _gemm_kernels(shape, chip, cal, composition.num_tokens, composition.num_logit_rows, tp, floor)
    if composition.decodes:
        contexts = Counter(composition.decodes)
        chunks = Counter({(1, c): k for c, k in contexts.items()})
        programs = decode_programs(shape, contexts, tp)
        kernels.append(_attention_kernel("attn_decode", shape, chip, cal, chunks, programs, tp, floor))
    if composition.prefills:
        chunks = Counter(composition.prefills)
        programs = prefill_programs(shape, chunks, tp)
        kernels.append(_attention_kernel("attn_prefill", shape, chip, cal, chunks, programs, tp, floor))
    if elementwise:
        kernels += _elementwise_kernels(shape, chip, cal, composition, tp, floor)
    if tp > 1:
        kernels.append(_allreduce_kernel(shape, chip, composition, tp, floor))
    return StepTime(composition, tuple(kernels), overhead_s, sum(k.time_s for k in kernels) + overhead_s)


def launches(st: StepTime) -> int:
    """Kernel launches in a calibrated step (the count the per-launch floor multiplies)."""
    return sum(k.calls for k in st.kernels)
