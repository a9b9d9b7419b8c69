"""Lesson 13: what GPU utilization measures, and the numbers that say how busy the chip really is.

Time is in seconds throughout; a kernel timeline is a list of (start, end) intervals, end >= start.

    NVML utilization ("GPU-Util" in nvidia-smi): per sample period, the fraction of it during which at
        least one kernel was running. A kernel that reads HBM at full speed and a kernel that keeps one SM
        busy count the same.
    SM active (DCGM_FI_PROF_SM_ACTIVE): the fraction of SM-cycles with at least one warp resident,
        averaged over all SMs. A kernel of G thread blocks on S SMs, each SM holding up to B of its blocks at
        once (its occupancy limit), runs in ceil(G / (S * B)) waves; modelled here with every block taking the
        same time and a wave spread over the SMs before a second block is stacked on one.
    MFU / MBU: achieved FLOP/s over the dense peak, achieved HBM bytes/s over the peak bandwidth, over a
        window of wall time (idle time included), from the engine's own FLOP and byte counts.
    Tensor active / DRAM active (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, DCGM_FI_PROF_DRAM_ACTIVE): the fraction
        of cycles the tensor pipe / the memory interface was busy; close to MFU / MBU when a pipe is either
        saturated or idle.
"""
from __future__ import annotations

import math

BOUNDS = ("compute", "memory", "overhead", "idle")

# -- 1. what nvidia-smi's number is -----------------------------------------------------------------


def nvml_utilization(kernels: list[tuple[float, float]], period: float, t0: float, samples: int) -> list[float]:
    """Exercise 1.1: NVML-style GPU utilization of a kernel timeline, one value per sample period.

    kernels: (start, end) of every kernel, seconds, in any order; kernels on different streams may overlap.
    Sample i covers [t0 + i * period, t0 + (i + 1) * period), i = 0 .. samples - 1. Its value is the
    fraction of that window during which one or more kernels was running: the length of the union of the
    intervals, clipped to the window, divided by period. Returns a list of `samples` floats in [0, 1].
    A zero-length kernel (end == start, shorter than the timer's resolution) is allowed and counts no time.
    Raises ValueError if period <= 0, samples < 0 or a kernel ends before it starts (end < start).

    Example: kernels [(0.0, 0.3), (0.2, 0.5), (0.9, 1.2)], period 1.0, t0 0.0, samples 2
    -> [0.6, 0.2] (0.0-0.5 and 0.9-1.0 in the first second; 1.0-1.2 in the second).
    """
    ### BEGIN SOLUTION
    if period <= 0 or samples < 0:
        raise ValueError(f"need period > 0 and samples >= 0, got period={period}, samples={samples}")
    if any(e < s for s, e in kernels):
        raise ValueError(f"a kernel ends before it starts: {[k for k in kernels if k[1] < k[0]]}")
    merged: list[list[float]] = []  # the union of the intervals: overlapping kernels count once
    for s, e in sorted(kernels):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    out = []
    for i in range(samples):
        lo, hi = t0 + i * period, t0 + (i + 1) * period
        busy = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in merged)
        out.append(busy / period)
    return out
    ### END SOLUTION


# -- 2. SM active ------------------------------------------------------------------------------------


def sm_active(kernels: list[tuple[float, int]], num_sms: int, period: float) -> float:
    """Exercise 2.1: SM-active-style fraction of one sample period from kernels' durations and grid sizes.

    kernels: (seconds, blocks) or (seconds, blocks, per_sm) of kernels that run one after another inside the
    period (no overlap); blocks >= 1 is the kernel's grid size, per_sm >= 1 how many of its blocks one SM can
    hold at once (its occupancy limit: registers, shared memory and threads per block against the SM's; 1 when
    not given). Model: every block of a kernel takes the same time; a kernel runs in
    waves = ceil(blocks / (num_sms * per_sm)); every wave but the last fills every SM; the last wave's
    r = blocks - (waves - 1) * num_sms * per_sm blocks are spread one per SM first, so min(r, num_sms) SMs hold
    a block. Over the kernel's duration the share of SMs holding at least one block is then
    ((waves - 1) * num_sms + min(r, num_sms)) / (num_sms * waves) (with per_sm = 1: blocks / (num_sms * waves)).
    Returns the time-weighted average over the whole period (time with no kernel counts as 0):
    sum(seconds * that share) / period, in [0, 1].
    Raises ValueError if num_sms < 1, or if the kernels add up to more than the period beyond float
    rounding: kernels that fill the period exactly are accepted, even when their float sum lands a hair
    above it (0.1 + 0.2 s in a 0.3 s period; compare with a relative tolerance such as 1e-9).

    Example: [(0.2, 66), (0.4, 264), (0.2, 133)] on 132 SMs, period 1.0
    -> 0.2 * 0.5 + 0.4 * 1.0 + 0.2 * 133 / 264 = 0.6008 (the 133-block kernel's second wave holds 1 block).
    With per_sm: [(0.5, 300, 2)] on 132 SMs, period 1.0 -> 2 waves of up to 264 blocks, the last holding 36:
    0.5 * (132 + 36) / 264 = 0.3182.
    """
    ### BEGIN SOLUTION
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {num_sms}")
    if sum(k[0] for k in kernels) > period * (1 + 1e-9):
        raise ValueError(f"kernels take {sum(k[0] for k in kernels)} s, more than the period {period} s")
    busy = 0.0
    for seconds, blocks, *rest in kernels:
        per_sm = rest[0] if rest else 1
        waves = math.ceil(blocks / (num_sms * per_sm))
        last = blocks - (waves - 1) * num_sms * per_sm  # the blocks of the last wave, one per SM first
        busy += seconds * ((waves - 1) * num_sms + min(last, num_sms)) / (num_sms * waves)
    return busy / period
    ### END SOLUTION


# -- 3. MFU and MBU ----------------------------------------------------------------------------------


def mfu_mbu(steps: list[dict], peak_flops: float, peak_bandwidth: float, elapsed: float | None = None) -> dict:
    """Exercise 3.1: model FLOPs utilization and memory bandwidth utilization over a window.

    steps: one dict per engine step with "flops" (FLOPs the step's kernels do), "bytes" (HBM bytes they
    move) and "wall_time" (seconds the step took). peak_flops: FLOP/s (dense); peak_bandwidth: bytes/s.
    elapsed: seconds of the whole window, idle time between steps included (None: the steps' total
    wall_time). Pool the window: MFU = total FLOPs / (elapsed * peak_flops), MBU = total bytes /
    (elapsed * peak_bandwidth); a step's share is weighted by its time, not averaged per step.
    Returns {"mfu": float, "mbu": float}; a window of 0 s (no steps, elapsed None or 0.0) did no work:
    {"mfu": 0.0, "mbu": 0.0}. Raises ValueError if elapsed is shorter than the steps' time beyond float
    rounding (as in sm_active: elapsed 0.3 for steps of 0.1 and 0.2 s is fine); elapsed=0.0 is a window
    of 0 s, not "no window" (only None means the steps' own time).

    Example: steps [{"flops": 2e12, "bytes": 1e12, "wall_time": 1.0}, {"flops": 0, "bytes": 1e12,
    "wall_time": 1.0}], peaks 1e13 FLOP/s and 1e12 B/s, elapsed 4.0 -> {"mfu": 0.05, "mbu": 0.5}.
    """
    ### BEGIN SOLUTION
    busy = sum(s["wall_time"] for s in steps)
    window = busy if elapsed is None else elapsed
    if window < busy * (1 - 1e-9):
        raise ValueError(f"elapsed={elapsed} s is shorter than the steps' own {busy} s")
    if window <= 0:
        return {"mfu": 0.0, "mbu": 0.0}
    return {"mfu": sum(s["flops"] for s in steps) / (window * peak_flops),
            "mbu": sum(s["bytes"] for s in steps) / (window * peak_bandwidth)}
    ### END SOLUTION


# -- 4. the diagnosis --------------------------------------------------------------------------------


def diagnose(dashboard: dict, in_flight: float, busy: float = 0.5) -> str:
    """Exercise 4.1: what limits the GPU, from the five dashboard numbers and the request load.

    dashboard: fractions in [0, 1] over one window: "gpu_util" (NVML), "sm_active", "sm_occupancy",
    "tensor_active", "dram_active". in_flight: mean requests running or waiting in the engine over the
    same window. busy: the threshold for "mostly". Rules, in this order:
      1. gpu_util < busy: kernels ran less than half the time. If in_flight < 1 there was mostly nothing
         to do -> "idle"; otherwise work was waiting and the host did not feed the GPU -> "overhead".
      2. tensor_active and dram_active both < busy: kernels ran but neither pipe was busy (small kernels,
         launch gaps shorter than the sample, latency-bound code) -> "overhead".
      3. otherwise the busier pipe: tensor_active >= dram_active -> "compute", else "memory".
    SM active and occupancy do not decide (memory-bound kernels keep SMs active too); they explain.
    Returns one of "compute", "memory", "overhead", "idle".

    Example: {"gpu_util": 0.97, "sm_active": 0.9, "sm_occupancy": 0.2, "tensor_active": 0.01,
    "dram_active": 0.8}, in_flight 8 -> "memory".
    """
    ### BEGIN SOLUTION
    if dashboard["gpu_util"] < busy:
        return "idle" if in_flight < 1 else "overhead"
    tensor, dram = dashboard["tensor_active"], dashboard["dram_active"]
    if max(tensor, dram) < busy:
        return "overhead"
    return "compute" if tensor >= dram else "memory"
    ### END SOLUTION


# -- given: the engine's steps as the records mfu_mbu reads ------------------------------------------


def step_records(step_times, wall_times=None) -> list[dict]:
    """{"flops", "bytes", "wall_time"} per step from gpu_model StepTimes (ModeledClock.steps): FLOPs and bytes
    summed over the step's kernels, wall_time the modeled step time, or wall_times[i] when given (a
    measured time for the same step)."""
    out = []
    for i, st in enumerate(step_times):
        hbm = [k for k in st.kernels if k.kind != "allreduce"]  # all-reduce bytes cross NVLink, not HBM
        out.append({"flops": sum(k.flops for k in hbm), "bytes": sum(k.bytes for k in hbm),
                    "wall_time": st.time_s if wall_times is None else wall_times[i]})
    return out
