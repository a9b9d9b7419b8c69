"""Timelines of what ran when: the engine's ops on this CPU (torch.profiler), its kernels on the modeled GPU
clock, and NVML's utilization read on a real GPU.

A timeline is a list of Kernel(name, start, end, flops, bytes, blocks), seconds. Three sources:
- profile_steps(engine, n): n real engine steps under torch.profiler (CPU activity only); the ops are the
  top-level ATen calls of each step, so the gaps between them are Python (scheduling, input preparation,
  sampling) with no op running.
- modeled_timeline(shape, chip, compositions, host_s=...): the kernels gpu_model.step_time charges for each
  step, laid out one after another per layer on one stream, each step preceded by host_s of host work the
  GPU does not overlap. Per-kernel FLOPs and bytes are gpu_model's (lesson 01's counting); `blocks` is a
  grid-size estimate (see grid_blocks), an ASSUMPTION, not a measured launch configuration.
- nvml_during(fn): NVML's utilization sampled in a thread while fn runs (CUDA and nvidia-ml-py only; the
  optional extra `gpu` installs nvidia-ml-py).

window_counters() turns a modeled timeline into DCGM-style pipe readings over a window: tensor-pipe active
taken as achieved FLOP/s over the dense peak, DRAM active as achieved bytes/s over the HBM peak. Those are
the idealised readings of a pipe that is either fully busy or idle; real counters count busy cycles, so
they read somewhat higher for partly-busy pipes.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..sim.gpu_model import Chip, Composition, ModelShape, gemm_shapes, rank_dims, step_time

TILE = 128  # output tile of a GEMM thread block (a common CUTLASS / Triton choice): an ASSUMPTION


@dataclass(frozen=True)
class Kernel:
    """One op or kernel on a timeline: [start, end) seconds; flops / bytes it does (0 when unknown); blocks:
    its grid size, thread blocks launched (0 when unknown)."""
    name: str
    start: float
    end: float
    flops: float = 0.0
    bytes: float = 0.0
    blocks: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start


# ---------------------------------------------------------------- this CPU: torch.profiler


def profile_steps(engine, steps: int) -> dict:
    """Run `steps` engine steps under torch.profiler and return what ran in them.

    Returns {"steps": [(start, end)] per step, "ops": [Kernel] the ATen ops each step's Python code called
    directly (their children folded in), "wall_s": seconds of the profiled loop}; times in seconds from the
    first step's start. The profiler adds its own overhead per op, so the gaps read somewhat wider than
    without it."""
    from torch.profiler import ProfilerActivity, profile, record_function

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("engine_step"):
                engine.step()
    wall = time.perf_counter() - t0
    events = prof.events()
    marks = sorted((e for e in events if e.name == "engine_step"), key=lambda e: e.time_range.start)
    origin = marks[0].time_range.start if marks else 0.0
    ops = sorted((e for e in events if e.cpu_parent is not None and e.cpu_parent.name == "engine_step"),
                 key=lambda e: e.time_range.start)
    us = 1e-6
    return {"steps": [((e.time_range.start - origin) * us, (e.time_range.end - origin) * us) for e in marks],
            "ops": [Kernel(e.name, (e.time_range.start - origin) * us, (e.time_range.end - origin) * us) for e in ops],
            "wall_s": wall}


class CountingClock:
    """A clock for LLMEngine(clock=...) that keeps real time (time.perf_counter) and records each step's
    Composition, so that a run on this CPU can be costed with gpu_model's FLOP and byte counts."""

    def __init__(self):
        self.compositions: list[Composition] = []

    def __call__(self) -> float:
        return time.perf_counter()

    def advance(self, schedule) -> None:
        """Called by the engine once per step that runs a forward; records, never moves time."""
        self.compositions.append(Composition.from_schedule(schedule))


def model_shape(path, dtype_bytes: int = 4) -> ModelShape:
    """The gpu_model ModelShape of a checkpoint's config.json (Llama-style), weights and KV cache of
    dtype_bytes each (4: the fp32 the shipped models run in on CPU)."""
    c = json.loads((Path(path) / "config.json").read_text())
    heads = c["num_attention_heads"]
    return ModelShape(Path(path).name, c["num_hidden_layers"], heads, c.get("num_key_value_heads") or heads,
                      c.get("head_dim") or c["hidden_size"] // heads, c["hidden_size"], c["intermediate_size"],
                      c["vocab_size"], bool(c.get("tie_word_embeddings", False)), dtype_bytes, dtype_bytes)


def measure_cpu_peaks(n: int = 1024, copy_mib: int = 64, repeats: int = 5) -> dict:
    """This CPU's practical peaks for the torch threads in use: fp32 matmul FLOP/s (n x n x n, best of
    `repeats`) and copy bandwidth in bytes/s (read + write of copy_mib MiB, best of `repeats`)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    src = torch.empty(copy_mib * 2**20 // 4)
    dst = torch.empty_like(src)
    best_mm = best_cp = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best_mm = min(best_mm, time.perf_counter() - t0)
        t0 = time.perf_counter()
        dst.copy_(src)
        best_cp = min(best_cp, time.perf_counter() - t0)
    return {"flops": 2 * n**3 / best_mm, "bandwidth": 2 * src.numel() * 4 / best_cp}


# ---------------------------------------------------------------- the modeled GPU


def grid_blocks(kind: str, shape: ModelShape, m: int = 0, n: int = 0, seqs: int = 0, tokens: int = 0,
                tp: int = 1) -> int:
    """Thread blocks one launch would use (an ASSUMPTION, the plainest tiling; real libraries split K or
    the KV sequence to fill more SMs when the grid is small):
    "gemm": one block per TILE x TILE tile of the m x n output;
    "attn_decode": one block per (sequence, KV head), a paged-attention decode kernel without KV splitting;
    "attn_prefill": one block per TILE query rows and query head, per sequence (tokens = the chunks' rows)."""
    r = rank_dims(shape, tp)
    if kind == "gemm":
        return math.ceil(m / TILE) * math.ceil(n / TILE)
    if kind == "attn_decode":
        return seqs * r["kv_heads"]
    if kind == "attn_prefill":
        return math.ceil(tokens / TILE) * r["heads"]
    raise ValueError(f"unknown kernel kind {kind!r}")


def step_kernels(shape: ModelShape, chip: Chip, comp: Composition, start: float, tp: int = 1) -> list[Kernel]:
    """The kernels step_time charges for one step, in launch order from `start`: per layer qkv_proj,
    attention (decode, then prefill), o_proj, gate_up_proj, down_proj; then lm_head. Each layer's share of a
    kernel kind is its total / layers; the sum of durations is step_time(...).time_s - overhead_s."""
    st = step_time(shape, chip, comp, tp=tp, overhead_s=0.0)
    by_name = {k.name: k for k in st.kernels}
    rows = {"qkv_proj": comp.num_tokens, "o_proj": comp.num_tokens, "gate_up_proj": comp.num_tokens,
            "down_proj": comp.num_tokens, "lm_head": comp.num_logit_rows}
    cols = {name: n for name, _, n, _, _ in gemm_shapes(shape, comp.num_tokens, comp.num_logit_rows, tp)}
    order = ["qkv_proj", "attn_decode", "attn_prefill", "o_proj", "gate_up_proj", "down_proj"]
    out, t = [], start
    for _ in range(shape.layers):
        for name in order:
            k = by_name.get(name)
            if k is None:
                continue
            if name == "attn_decode":
                blocks = grid_blocks(name, shape, seqs=len(comp.decodes), tp=tp)
            elif name == "attn_prefill":
                blocks = sum(grid_blocks(name, shape, tokens=n, tp=tp) for n, _ in comp.prefills)
            else:
                blocks = grid_blocks("gemm", shape, m=rows[name], n=cols[name], tp=tp)
            d = k.time_s / shape.layers
            out.append(Kernel(name, t, t + d, k.flops / shape.layers, k.bytes / shape.layers, blocks))
            t += d
    k = by_name["lm_head"]
    out.append(Kernel("lm_head", t, t + k.time_s, k.flops, k.bytes,
                      grid_blocks("gemm", shape, m=rows["lm_head"], n=cols["lm_head"], tp=tp)))
    return out


def modeled_timeline(shape: ModelShape, chip: Chip, compositions, *, host_s: float, tp: int = 1,
                     start: float = 0.0, idle_s: float = 0.0) -> dict:
    """Consecutive steps on one stream: each step is host_s of host work (no kernel runs), then its kernels
    back to back, then idle_s with nothing to do (waiting for requests). Returns {"kernels": [Kernel],
    "steps": [(start, end)] (host part included), "end": seconds}."""
    kernels, steps, t = [], [], start
    for comp in compositions:
        ks = step_kernels(shape, chip, comp, t + host_s, tp=tp)
        steps.append((t, ks[-1].end))
        kernels += ks
        t = ks[-1].end + idle_s
    return {"kernels": kernels, "steps": steps, "end": t}


def window_counters(kernels: list[Kernel], chip: Chip, t0: float, t1: float) -> dict:
    """DCGM-style pipe readings of a modeled timeline over [t0, t1): each kernel's FLOPs and bytes are
    spread evenly over its duration and the part inside the window counted. tensor_active = FLOPs /
    (dense peak x window); dram_active = bytes / (HBM peak x window)."""
    flops = nbytes = 0.0
    for k in kernels:
        inside = max(0.0, min(k.end, t1) - max(k.start, t0))
        if inside and k.duration > 0:
            flops += k.flops * inside / k.duration
            nbytes += k.bytes * inside / k.duration
    span = t1 - t0
    return {"tensor_active": flops / (chip.peak_flops * span), "dram_active": nbytes / (chip.bandwidth * span)}


# ---------------------------------------------------------------- a real GPU: NVML


def nvml_available() -> bool:
    """True when torch sees a CUDA GPU and pynvml (package nvidia-ml-py) imports and initialises."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:  # no driver, no package, or NVML refuses: all mean "not here"
        return False


def nvml_during(fn, *, interval_s: float = 0.05, index: int = 0) -> tuple[object, list[dict]]:
    """Call fn() while a thread reads nvmlDeviceGetUtilizationRates every interval_s. Returns (fn's result,
    samples [{"t": seconds from the start, "gpu": percent, "memory": percent}]). NVML's own sample period
    (1/6 s to 1 s depending on the product) is longer than interval_s, so neighbouring reads repeat."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    samples, done, t0 = [], threading.Event(), time.perf_counter()

    def poll():
        while not done.is_set():
            u = pynvml.nvmlDeviceGetUtilizationRates(handle)
            samples.append({"t": time.perf_counter() - t0, "gpu": u.gpu, "memory": u.memory})
            done.wait(interval_s)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        result = fn()
    finally:
        done.set()
        thread.join()
    return result, samples


def cuda_decode_trace(engine, steps: int, *, interval_s: float = 0.02) -> dict:
    """CUDA only: run `steps` engine steps under torch.profiler (CPU and CUDA activity) while NVML is read
    every interval_s. Returns {"kernels": [(start, end)] of every CUDA kernel, "nvml": NVML samples (see
    nvml_during), "wall_s": seconds of the loop}; all times in seconds from the loop's start on the host
    clock (the profiler maps GPU timestamps onto it)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    def loop():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                engine.step()
            torch.cuda.synchronize()
            return prof, time.perf_counter() - t0

    (prof, wall), samples = nvml_during(loop, interval_s=interval_s)
    kernels = sorted((e.time_range.start * 1e-6, e.time_range.end * 1e-6) for e in prof.events()
                     if e.device_type == DeviceType.CUDA)
    origin = kernels[0][0] if kernels else 0.0
    return {"kernels": [(s - origin, e - origin) for s, e in kernels], "nvml": samples, "wall_s": wall}
