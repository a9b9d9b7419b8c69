"""Lesson 13 questions: nvidia-smi's reading from kernel and host time, SM active of a thin GEMM, MFU and MBU of
decode steps on the modeled clock (with idle time), pooled MFU of a mixed window, a tensor-parallel rank spinning in NCCL, and what to put on a dashboard."""
from __future__ import annotations

import math

from reference_engine.sim import gpu_model as gm

from .pools import CHIPS, SHAPES, chip_text, pick
from .question import Numeric, Open, fmt, template

STEM = "l13_gpu_utilization"
SMS = {gm.A100.name: 108, gm.H100.name: 132, gm.H200.name: 132}  # SM counts: NVIDIA A100 / H100 whitepapers
TILE = 128


def decode(shape, chip, batch, context):
    """The modeled decode step of `batch` sequences at `context`, the modeled per-step overhead included."""
    return gm.step_time(shape, chip, gm.Composition.decode_batch(batch, context))


@template(STEM, "nvidia-smi reading")
def nvml_reading(rng, ref):
    shape, chip = pick(rng, SHAPES), pick(rng, CHIPS)
    batch, context = pick(rng, [1, 8, 32, 64]), pick(rng, [512, 1024, 4096])
    kernels = gm.step_time(shape, chip, gm.Composition.decode_batch(batch, context), overhead_s=0).time_s
    host = kernels * pick(rng, [0.5, 1.0, 1.5, 2.0, 3.0])
    util = 100 * ref.nvml_utilization([(host, host + kernels)], host + kernels, 0.0, 1)[0]
    q = Numeric(
        f"{shape.name} decodes a batch of {batch} at context {context} on one {chip_text(chip)}. Each step's kernels "
        f"take {fmt(kernels * 1e3)} ms (memory-bound, HBM saturated while they run), and between steps the host "
        f"spends {fmt(host * 1e3)} ms scheduling and sampling with no kernel running. What does nvidia-smi's "
        "GPU-Util read?", "%", util,
        ["NVML: share of the sample period with at least one kernel running",
         f"per step: {fmt(kernels * 1e3)} ms of kernels in {fmt((kernels + host) * 1e3)} ms",
         f"= {fmt(util)}%, whatever the kernels do with the chip"],
        "GPU-Util is a fraction of time, not of the chip: host gaps lower it even when every kernel saturates HBM.",
        mistakes={"gives the host's share of the time": 100 * host / (host + kernels),
                  "reads 100% because HBM is saturated": 100.0,
                  "divides kernel time by host time": 100 * kernels / host})
    target = pick(rng, [30, 40, 50])
    needed = kernels * (100 / target - 1)
    q.follow_ups.append(Numeric(
        f"How much host time per step would make it read {target}%?", "ms", needed * 1e3,
        [f"util = K / (K + h) -> h = K (1 / util - 1) = {fmt(kernels * 1e3)} x ({fmt(100 / target)} - 1)",
         f"= {fmt(needed * 1e3)} ms"],
        "The reading falls with every millisecond the GPU waits on the host.",
        mistakes={"takes the host time as util x kernel time": kernels * target / 100 * 1e3}))
    return q


@template(STEM, "SM active of a thin GEMM")
def sm_active_gemm(rng, ref):
    chip = pick(rng, CHIPS)
    sms = SMS[chip.name]
    shape = pick(rng, SHAPES)
    name, cols = pick(rng, [("the QKV projection", (shape.heads + 2 * shape.kv_heads) * shape.head_dim),
                            ("the down projection", shape.hidden), ("the o projection", shape.hidden)])
    batch = pick(rng, [1, 16, 64, 128])
    blocks = math.ceil(batch / TILE) * math.ceil(cols / TILE)
    share = 100 * ref.sm_active([(1.0, blocks)], sms, 1.0)

    def ask(m, prompt):
        g = math.ceil(m / TILE) * math.ceil(cols / TILE)
        waves = math.ceil(g / sms)
        value = 100 * ref.sm_active([(1.0, g)], sms, 1.0)
        return Numeric(
            prompt, "%", value,
            [f"blocks = ceil({m} / {TILE}) x ceil({cols} / {TILE}) = {g}", f"waves = ceil({g} / {sms}) = {waves}",
             f"SM active = {g} / ({sms} x {waves}) = {fmt(value)}%"],
            "A grid smaller than the SM count, or a partial last wave, leaves SMs empty; NVML cannot see it.",
            mistakes={"ignores the partial last wave (min(blocks, SMs) / SMs)": 100 * min(g, sms) / sms,
                      "reads 100% because a kernel is running (NVML's view)": 100.0})

    q = ask(batch, f"{shape.name}, decode batch {batch}: {name} writes a {batch} x {cols} output. The kernel tiles it "
                   f"in {TILE} x {TILE} blocks, one block per SM at a time, all blocks equally long, on a {chip.name} "
                   f"with {sms} SMs. While it runs, what fraction of SMs hold a block on average (SM active)?")
    assert math.isclose(q.answer, share)
    big = pick(rng, [384, 640, 1024])
    q.follow_ups.append(ask(big, f"Now a prefill chunk of {big} tokens through the same projection: SM active?"))
    return q


@template(STEM, "MFU of a decode step")
def mfu_decode(rng, ref):
    shape, chip = pick(rng, SHAPES), pick(rng, CHIPS)
    batch, context = pick(rng, [1, 8, 32, 128]), pick(rng, [1024, 4096])
    st = decode(shape, chip, batch, context)
    rec = ref.step_records([st])
    got = ref.mfu_mbu(rec, chip.peak_flops, chip.bandwidth)
    q = Numeric(
        f"On the modeled clock, one decode step of {shape.name} (batch {batch}, context {context}) on a "
        f"{chip_text(chip)} does {fmt(rec[0]['flops'] / 1e9)} GFLOP and moves {fmt(rec[0]['bytes'] / 1e9)} GB "
        f"in {fmt(st.time_s * 1e3)} ms. Its MFU?", "%", 100 * got["mfu"],
        [f"achieved = {fmt(rec[0]['flops'] / 1e9)} GFLOP / {fmt(st.time_s * 1e3)} ms = "
         f"{fmt(rec[0]['flops'] / st.time_s / 1e12)} TFLOP/s",
         f"MFU = that / {fmt(chip.dense_tflops)} TFLOP/s = {fmt(100 * got['mfu'])}%"],
        "Decode does 2 FLOPs per weight per sequence while reading every weight once: small MFU even at full HBM.",
        mistakes={"gives MBU (bytes per second over peak bandwidth) instead": 100 * got["mbu"],
                  "divides by the achievable (gemm_eff) peak, not the datasheet peak":
                      100 * got["mfu"] / chip.gemm_eff})
    busy = pick(rng, [0.25, 0.4, 0.5])
    idle = ref.mfu_mbu(rec * 10, chip.peak_flops, chip.bandwidth, 10 * st.time_s / busy)
    q.follow_ups.append(Numeric(
        f"The same steps, but the GPU is running them only {fmt(100 * busy)}% of a window (idle otherwise). The "
        "window's MFU?", "%", 100 * idle["mfu"],
        [f"pooled over elapsed time: {fmt(100 * got['mfu'])}% x {fmt(busy)} = {fmt(100 * idle['mfu'])}%"],
        "Idle time counts: MFU is over the window, not over the moments kernels ran.",
        mistakes={"leaves the idle time out": 100 * got["mfu"]}))
    return q


@template(STEM, "MBU of a decode step")
def mbu_decode(rng, ref):
    shape, chip = pick(rng, SHAPES), pick(rng, CHIPS)
    batch, context = pick(rng, [1, 16, 64]), pick(rng, [1024, 8192])
    st = decode(shape, chip, batch, context)
    rec = ref.step_records([st])
    got = ref.mfu_mbu(rec, chip.peak_flops, chip.bandwidth)
    q = Numeric(
        f"On the modeled clock, a decode step of {shape.name} (batch {batch}, context {context}) on a "
        f"{chip_text(chip)} moves {fmt(rec[0]['bytes'] / 1e9)} GB (weights, activations, KV) in "
        f"{fmt(st.time_s * 1e3)} ms, {fmt(st.overhead_s * 1e3)} ms of it host overhead. Its MBU?", "%",
        100 * got["mbu"],
        [f"achieved = {fmt(rec[0]['bytes'] / 1e9)} GB / {fmt(st.time_s * 1e3)} ms = "
         f"{fmt(rec[0]['bytes'] / st.time_s / 1e9)} GB/s",
         f"MBU = that / {fmt(chip.hbm_gb_per_s)} GB/s = {fmt(100 * got['mbu'])}%"],
        "MBU is the decode number that matters: it says how close the step is to the memory roof.",
        mistakes={"leaves the host overhead out of the time":
                      100 * rec[0]["bytes"] / ((st.time_s - st.overhead_s) * chip.bandwidth),
                  "gives MFU instead": 100 * got["mfu"]})
    gap = st.time_s * pick(rng, [1, 2, 3])
    window = ref.mfu_mbu(rec * 20, chip.peak_flops, chip.bandwidth, 20 * (st.time_s + gap))
    q.follow_ups.append(Numeric(
        f"Between steps the GPU now waits {fmt(gap * 1e3)} ms for requests. MBU over a window of 20 steps?", "%",
        100 * window["mbu"],
        [f"20 steps move {fmt(20 * rec[0]['bytes'] / 1e9)} GB in 20 x {fmt((st.time_s + gap) * 1e3)} ms",
         f"MBU = {fmt(100 * window['mbu'])}%"],
        "The bytes did not change; the window got longer.",
        mistakes={"leaves the idle time out": 100 * got["mbu"]}))
    return q


@template(STEM, "pooled MFU of a mixed window")
def pooled_mfu(rng, ref):
    shape, chip = pick(rng, SHAPES), pick(rng, CHIPS)
    chunk, batch, n = pick(rng, [1024, 2048, 4096]), pick(rng, [16, 32, 64]), pick(rng, [4, 8, 16])
    pre = gm.step_time(shape, chip, gm.Composition(prefills=((chunk, 0),)))
    dec = decode(shape, chip, batch, 1024)
    recs = ref.step_records([pre] + [dec] * n)
    got = ref.mfu_mbu(recs, chip.peak_flops, chip.bandwidth)
    per = [ref.mfu_mbu([r], chip.peak_flops, chip.bandwidth)["mfu"] for r in recs]
    q = Numeric(
        f"On a {chip_text(chip)} ({shape.name}, modeled clock), a window holds one prefill step of {chunk} tokens "
        f"({fmt(recs[0]['flops'] / 1e12)} TFLOP in {fmt(pre.time_s * 1e3)} ms) and {n} decode steps of batch {batch} "
        f"({fmt(recs[1]['flops'] / 1e9)} GFLOP in {fmt(dec.time_s * 1e3)} ms each), back to back. The window's MFU?",
        "%", 100 * got["mfu"],
        [f"total FLOPs = {fmt(sum(r['flops'] for r in recs) / 1e12)} TFLOP over "
         f"{fmt(sum(r['wall_time'] for r in recs) * 1e3)} ms",
         f"MFU = {fmt(sum(r['flops'] for r in recs) / sum(r['wall_time'] for r in recs) / 1e12)} TFLOP/s / "
         f"{fmt(chip.dense_tflops)} = {fmt(100 * got['mfu'])}%"],
        "Pool the window: a long prefill step weighs by its time, not as one vote among many short decodes.",
        mistakes={"averages the steps' own MFUs": 100 * sum(per) / len(per)})
    busy = sum(r["wall_time"] for r in recs)
    idle = pick(rng, [0.5, 1.0, 2.0]) * busy
    window = ref.mfu_mbu(recs, chip.peak_flops, chip.bandwidth, busy + idle)
    q.follow_ups.append(Numeric(
        f"The window also holds {fmt(idle * 1e3)} ms with no request to serve. Its MFU?", "%", 100 * window["mfu"],
        [f"same FLOPs over {fmt((busy + idle) * 1e3)} ms: {fmt(100 * window['mfu'])}%"],
        "Idle time is part of the window: MFU falls with it.",
        mistakes={"leaves the idle time out": 100 * got["mfu"]}))
    return q


@template(STEM, "a TP rank spinning in NCCL")
def nccl_spin(rng, ref):
    shape, chip = pick(rng, SHAPES), pick(rng, CHIPS)
    sms = SMS[chip.name]
    tp, batch = pick(rng, [2, 4, 8]), pick(rng, [16, 32, 64])
    kernels = gm.step_time(shape, chip, gm.Composition.decode_batch(batch, 1024), tp=tp, overhead_s=0).time_s
    late = kernels * pick(rng, [0.25, 0.5, 1.0])
    channels = pick(rng, [8, 16, 24, 32])
    period = kernels + late
    util = 100 * ref.nvml_utilization([(0.0, kernels), (kernels, period)], period, 0.0, 1)[0]
    useful = 100 * kernels / period
    q = Numeric(
        f"{shape.name} decodes a batch of {batch} at TP = {tp} on {chip_text(chip)}s. One rank's kernels for a step "
        f"take {fmt(kernels * 1e3)} ms; a peer rank arrives {fmt(late * 1e3)} ms late at the all-reduce, and this rank "
        "waits inside NCCL's all-reduce kernel, polling. nvidia-smi reads 100% on this rank. What share of the "
        "step does it spend on useful work?", "%", useful,
        [f"the step lasts {fmt(kernels * 1e3)} + {fmt(late * 1e3)} = {fmt(period * 1e3)} ms, a kernel resident "
         f"throughout, so NVML reads {fmt(util)}%",
         f"useful: {fmt(kernels * 1e3)} / {fmt(period * 1e3)} = {fmt(useful)}%"],
        "A rank waiting in an all-reduce keeps a kernel resident: NVML counts it as busy while nothing useful runs.",
        mistakes={"trusts NVML's 100%": 100.0,
                  "gives the waiting share instead": 100 * late / period})
    wait = 100 * ref.sm_active([(1.0, channels)], sms, 1.0)
    q.follow_ups.append(Numeric(
        f"NCCL runs {channels} channels, one thread block each, on this {sms}-SM chip. What does SM active "
        "(DCGM_FI_PROF_SM_ACTIVE) read while the rank waits?", "%", wait,
        [f"{channels} blocks hold {channels} of {sms} SMs: {fmt(wait)}%",
         "tensor-pipe active reads 0 meanwhile: SM and tensor activity tell spin from work"],
        "SM active and tensor-pipe active separate a spinning rank from a computing one; NVML cannot.",
        mistakes={"reads NVML's 100% for SM active too": 100.0}))
    return q


@template(STEM, "what to put on the dashboard")
def dashboard(rng, ref):
    return Open(
        "A team's GPUs read 100% in nvidia-smi and they ask for more cards; another team's read 30% and they plan to "
        "pack a second model on each. What does the number measure, what would you put on the dashboard, and what "
        "would you check before agreeing to either plan?",
        ["NVML GPU-Util = share of the sample period (1/6-1 s) with at least one kernel running: time, not chip",
         "SM active and SM occupancy (DCGM profiling metrics): are the SMs filled, are there warps to hide latency",
         "tensor-pipe active and DRAM active, with MFU and MBU from the engine's FLOP and byte counts: which roof",
         "running and waiting requests: separates an idle GPU from one the host is not feeding",
         "100% with ~0.3% MFU and high MBU is memory-bound decode: batch more before buying cards",
         "30% with saturated HBM during kernels and a queue is overhead-bound: fix the host (async scheduling, "
         "CUDA graphs); a second model would contend for the HBM bandwidth those kernels saturate",
         "with MIG each instance's readings are fractions of its own SMs (a 1g slice is 1/7 of an H100's): weight "
         "them by that share; a TP rank waiting in an NCCL all-reduce reads 100% in NVML with few SMs and no "
         "tensor pipe active"],
        "Utilization says whether a kernel was running; the pipes and the load say what limits the GPU.")
