"""Plausible wrong answers for lesson 13; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here are
prefixed `_m_`."""
import math

from tests.mutants import mutant

# -- 1.1 NVML utilization ---------------------------------------------------------------------------


@mutant(check="nvml_utilization", message="adds overlapping kernels' time twice")
def nvml_utilization(kernels, period, t0, samples):
    if any(e < s for s, e in kernels):
        raise ValueError("a kernel ends before it starts")
    out = []
    for i in range(samples):
        lo, hi = t0 + i * period, t0 + (i + 1) * period
        busy = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in kernels)  # no union: overlaps count twice
        out.append(min(1.0, busy / period))
    return out


@mutant(check="nvml_utilization", message="merges the intervals in the order they come, as if sorted by start")
def nvml_utilization(kernels, period, t0, samples):  # noqa: F811
    if period <= 0 or samples < 0 or any(e < s for s, e in kernels):
        raise ValueError("bad input")
    merged = []
    for s, e in kernels:  # no sorted(): a kernel listed after a later one is merged into it and its start lost
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [sum(max(0.0, min(e, t0 + (i + 1) * period) - max(s, t0 + i * period)) for s, e in merged) / period
            for i in range(samples)]


@mutant(check="nvml_utilization", message="reads a sample as fully busy when any kernel ran in it")
def nvml_utilization(kernels, period, t0, samples):  # noqa: F811 - one mutant per definition
    if any(e < s for s, e in kernels):
        raise ValueError("a kernel ends before it starts")
    return [1.0 if any(min(e, t0 + (i + 1) * period) > max(s, t0 + i * period) for s, e in kernels) else 0.0
            for i in range(samples)]


@mutant(check="nvml_utilization", message="charges each kernel's whole duration to the sample it starts in")
def nvml_utilization(kernels, period, t0, samples):  # noqa: F811
    if any(e < s for s, e in kernels):
        raise ValueError("a kernel ends before it starts")
    merged = []
    for s, e in sorted(kernels):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [sum(e - s for s, e in merged if t0 + i * period <= s < t0 + (i + 1) * period) / period
            for i in range(samples)]


@mutant(check="nvml_utilization", message="starts the sample windows at 0, not at t0")
def nvml_utilization(kernels, period, t0, samples):  # noqa: F811
    return sol.nvml_utilization(kernels, period, 0.0, samples)


@mutant(check="nvml_utilization", message="refuses a zero-length kernel")
def nvml_utilization(kernels, period, t0, samples):  # noqa: F811
    if any(e <= s for s, e in kernels):  # <= instead of <
        raise ValueError("a kernel ends before it starts")
    return sol.nvml_utilization(kernels, period, t0, samples)


@mutant(check="nvml_utilization", message="sets a merged interval's end to the new kernel's end")
def nvml_utilization(kernels, period, t0, samples):  # noqa: F811
    if period <= 0 or samples < 0 or any(e < s for s, e in kernels):
        raise ValueError("bad input")
    merged = []
    for s, e in sorted(kernels):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = e  # not max(end, e): a kernel nested inside a longer one cuts the union short
        else:
            merged.append([s, e])
    return [sum(max(0.0, min(e, t0 + (i + 1) * period) - max(s, t0 + i * period)) for s, e in merged) / period
            for i in range(samples)]


@mutant(check="nvml_utilization", message="a period of 0 s has no busy fraction")
def nvml_utilization(kernels, period, t0, samples):  # noqa: F811
    if samples < 0 or any(e < s for s, e in kernels):
        raise ValueError("bad input")
    merged = _m_union(kernels)  # no period check: period 0 divides by zero below
    return [sum(max(0.0, min(e, t0 + (i + 1) * period) - max(s, t0 + i * period)) for s, e in merged) / period
            for i in range(samples)]


@mutant(check="nvml_utilization", message="samples = -1 is a caller's bug")
def nvml_utilization(kernels, period, t0, samples):  # noqa: F811
    return sol.nvml_utilization(kernels, period, t0, max(samples, 0))


def _m_union(kernels):
    merged = []
    for s, e in sorted(kernels):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


# -- 2.1 SM active ----------------------------------------------------------------------------------


@mutant(check="sm_active", message="ignores the last, partly empty wave")
def sm_active(kernels, num_sms, period):
    if sum(d for d, _ in kernels) > period * (1 + 1e-9):
        raise ValueError("kernels longer than the period")
    return sum(d * min(blocks, num_sms) / num_sms for d, blocks in kernels) / period


@mutant(check="sm_active", message="divides by the kernels' own time")
def sm_active(kernels, num_sms, period):  # noqa: F811
    if sum(d for d, _ in kernels) > period * (1 + 1e-9):
        raise ValueError("kernels longer than the period")
    busy = sum(d * b / (num_sms * math.ceil(b / num_sms)) for d, b in kernels)
    return busy / sum(d for d, _ in kernels)


@mutant(check="sm_active", message="by rounding only")
def sm_active(kernels, num_sms, period):  # noqa: F811
    if sum(d for d, _ in kernels) > period:  # no tolerance
        raise ValueError("kernels longer than the period")
    return sol.sm_active(kernels, num_sms, period)


@mutant(check="sm_active", message="(> rather than >=)")
def sm_active(kernels, num_sms, period):  # noqa: F811
    if sum(d for d, _ in kernels) >= period:
        raise ValueError("kernels longer than the period")
    return sol.sm_active(kernels, num_sms, period)


@mutant(check="sm_active", message="num_sms = 0 is a broken device description")
def sm_active(kernels, num_sms, period):  # noqa: F811
    if sum(k[0] for k in kernels) > period * (1 + 1e-9):
        raise ValueError("kernels longer than the period")
    busy = 0.0
    for d, b, *rest in kernels:  # right, but never checks num_sms: 0 SMs divides by zero
        cap = num_sms * (rest[0] if rest else 1)
        waves = math.ceil(b / cap)
        busy += d * ((waves - 1) * num_sms + min(b - (waves - 1) * cap, num_sms)) / (num_sms * waves)
    return busy / period


@mutant(check="sm_active", message="ignores the last, partly empty wave")
def sm_active(kernels, num_sms, period):  # noqa: F811 - floor instead of ceil: the same values as min(blocks, SMs)
    if sum(d for d, _ in kernels) > period * (1 + 1e-9):
        raise ValueError("kernels longer than the period")
    return sum(d * min(1.0, b / (num_sms * max(1, b // num_sms))) for d, b in kernels) / period


@mutant(check="sm_active", message="takes the last wave's fill for the whole kernel")
def sm_active(kernels, num_sms, period):  # noqa: F811
    if sum(d for d, _ in kernels) > period * (1 + 1e-9):
        raise ValueError("kernels longer than the period")
    return sum(d * (b % num_sms or num_sms) / num_sms for d, b in kernels) / period


@mutant(check="sm_active", message="ignores per_sm, the blocks one SM holds at once")
def sm_active(kernels, num_sms, period):  # noqa: F811
    if sum(k[0] for k in kernels) > period * (1 + 1e-9):
        raise ValueError("kernels longer than the period")
    return sol.sm_active([k[:2] for k in kernels], num_sms, period)  # every kernel at one block per SM


@mutant(check="sm_active", message="counts the block slots filled, not the SMs holding a block")
def sm_active(kernels, num_sms, period):  # noqa: F811
    if sum(k[0] for k in kernels) > period * (1 + 1e-9):
        raise ValueError("kernels longer than the period")
    busy = 0.0
    for d, b, *rest in kernels:
        cap = num_sms * (rest[0] if rest else 1)
        busy += d * b / (cap * math.ceil(b / cap))  # the last wave's blocks as a share of its slots
    return busy / period


def _m_waves(kernels, num_sms, period, share):
    """sm_active's loop with the busy share of one kernel given: share(blocks, waves)."""
    if sum(k[0] for k in kernels) > period * (1 + 1e-9):
        raise ValueError("kernels longer than the period")
    busy = 0.0
    for d, b, *rest in kernels:
        busy += d * share(b, math.ceil(b / (num_sms * (rest[0] if rest else 1))))
    return busy / period


@mutant(check="sm_active", message="uses per_sm for the number of waves but not for the blocks the full waves hold")
def sm_active(kernels, num_sms, period):  # noqa: F811
    def share(b, waves):  # the full waves' blocks counted at one per SM
        last = b - (waves - 1) * num_sms
        return ((waves - 1) * num_sms + min(last, num_sms)) / (num_sms * waves)
    return _m_waves(kernels, num_sms, period, share)


@mutant(check="sm_active", message="takes the last wave's blocks as blocks % num_sms")
def sm_active(kernels, num_sms, period):  # noqa: F811
    def share(b, waves):  # the last wave's fill at one block per SM
        return ((waves - 1) * num_sms + (b % num_sms or num_sms)) / (num_sms * waves)
    return _m_waves(kernels, num_sms, period, share)


@mutant(check="sm_active", message="uses per_sm for the number of waves but not for the blocks the full waves hold")
def sm_active(kernels, num_sms, period):  # noqa: F811
    # the per_sm = 1 share: the same values as the first of these
    return _m_waves(kernels, num_sms, period, lambda b, waves: min(1.0, b / (num_sms * waves)))


# -- 3.1 MFU and MBU --------------------------------------------------------------------------------


@mutant(check="mfu_mbu", message="leaves out the idle time")
def mfu_mbu(steps, peak_flops, peak_bandwidth, elapsed=None):
    return sol.mfu_mbu(steps, peak_flops, peak_bandwidth, None)  # the window shrinks to the busy time


@mutant(check="mfu_mbu", message="averages each step's own MFU")
def mfu_mbu(steps, peak_flops, peak_bandwidth, elapsed=None):  # noqa: F811
    busy = sum(s["wall_time"] for s in steps)
    window = busy if elapsed is None else elapsed
    if window < busy * (1 - 1e-9):
        raise ValueError("elapsed shorter than the steps")
    mfu = sum(s["flops"] / (s["wall_time"] * peak_flops) for s in steps) / len(steps)
    mbu = sum(s["bytes"] / (s["wall_time"] * peak_bandwidth) for s in steps) / len(steps)
    return {"mfu": mfu * busy / window, "mbu": mbu * busy / window}


@mutant(check="mfu_mbu", message="above it by rounding only")
def mfu_mbu(steps, peak_flops, peak_bandwidth, elapsed=None):  # noqa: F811
    if elapsed is not None and elapsed < sum(s["wall_time"] for s in steps):  # no tolerance
        raise ValueError("elapsed shorter than the steps")
    return sol.mfu_mbu(steps, peak_flops, peak_bandwidth, elapsed)


@mutant(check="mfu_mbu", message="not `elapsed or ...`")
def mfu_mbu(steps, peak_flops, peak_bandwidth, elapsed=None):  # noqa: F811
    return sol.mfu_mbu(steps, peak_flops, peak_bandwidth, elapsed or None)  # elapsed=0.0 becomes "no window"


@mutant(check="mfu_mbu", message="divides by the window of 0 s")
def mfu_mbu(steps, peak_flops, peak_bandwidth, elapsed=None):  # noqa: F811
    window = sum(s["wall_time"] for s in steps) if elapsed is None else elapsed
    if steps and window < sum(s["wall_time"] for s in steps) * (1 - 1e-9):
        raise ValueError("elapsed shorter than the steps")
    return {"mfu": sum(s["flops"] for s in steps) / (window * peak_flops),
            "mbu": sum(s["bytes"] for s in steps) / (window * peak_bandwidth)}


@mutant(check="mfu_mbu", message="reports the best step's own MFU / MBU")
def mfu_mbu(steps, peak_flops, peak_bandwidth, elapsed=None):  # noqa: F811
    if not steps:
        return {"mfu": 0.0, "mbu": 0.0}
    return {"mfu": max(s["flops"] / (s["wall_time"] * peak_flops) for s in steps),
            "mbu": max(s["bytes"] / (s["wall_time"] * peak_bandwidth) for s in steps)}


# -- 4.1 diagnosis ----------------------------------------------------------------------------------


@mutant(check="diagnose", message="trusts NVML's utilization alone")
def diagnose(dashboard, in_flight, busy=0.5):
    return "compute" if dashboard["gpu_util"] >= busy else "idle"


@mutant(check="diagnose", message="skips the utilization rule")
def diagnose(dashboard, in_flight, busy=0.5):  # noqa: F811
    tensor, dram = dashboard["tensor_active"], dashboard["dram_active"]
    if max(tensor, dram) < busy:
        return "overhead"
    return "compute" if tensor >= dram else "memory"


@mutant(check="diagnose", message="calls every low-utilization window idle")  # named with "util" (same output)
def diagnose(dashboard, in_flight, busy=0.5):  # noqa: F811
    if dashboard["gpu_util"] < busy:
        return "idle"
    return sol.diagnose(dashboard, in_flight, busy)


@mutant(check="diagnose", message="calls a window with in_flight = 1 idle")  # named with the two others giving idle
def diagnose(dashboard, in_flight, busy=0.5):  # noqa: F811
    if dashboard["gpu_util"] < busy:
        return "idle" if in_flight <= 1 else "overhead"
    return sol.diagnose(dashboard, in_flight, busy)


@mutant(check="diagnose", message="calls a window idle only when in_flight is 0")  # named with "skips the utilization rule"
def diagnose(dashboard, in_flight, busy=0.5):  # noqa: F811
    if dashboard["gpu_util"] < busy:
        return "idle" if in_flight == 0 else "overhead"
    return sol.diagnose(dashboard, in_flight, busy)


@mutant(check="diagnose", message="calls gpu_util exactly at busy low")
def diagnose(dashboard, in_flight, busy=0.5):  # noqa: F811
    if dashboard["gpu_util"] <= busy:
        return "idle" if in_flight < 1 else "overhead"
    return sol.diagnose(dashboard, in_flight, busy)


@mutant(check="diagnose", message="ignores the busy argument and uses 0.5")
def diagnose(dashboard, in_flight, busy=0.5):  # noqa: F811
    return sol.diagnose(dashboard, in_flight)


@mutant(check="diagnose", message="gives a tie between the pipes to memory")
def diagnose(dashboard, in_flight, busy=0.5):  # noqa: F811
    verdict = sol.diagnose(dashboard, in_flight, busy)
    tied = dashboard["tensor_active"] == dashboard["dram_active"]
    return "memory" if verdict == "compute" and tied else verdict


@mutant(check="diagnose", message="calls a pipe exactly at busy quiet")
def diagnose(dashboard, in_flight, busy=0.5):  # noqa: F811
    if dashboard["gpu_util"] >= busy and max(dashboard["tensor_active"], dashboard["dram_active"]) <= busy:
        return "overhead"
    return sol.diagnose(dashboard, in_flight, busy)
