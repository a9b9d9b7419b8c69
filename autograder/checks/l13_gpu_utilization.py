"""Checks of lesson 13: NVML utilization from a kernel timeline, SM active from grid sizes, MFU and MBU over a
window, and the diagnosis from the dashboard.

Timelines are small hand-made ones (overlapping streams, kernels crossing sample boundaries, empty samples)
plus hidden ones drawn from t.rng. Wrong answers are named by running the usual wrong formulas (the
variants below) on the same inputs.
"""
from __future__ import annotations

import math

from autograder.core import check
from autograder.reference import answer_code


def both_accepting(t, name: str, args: tuple, refusals: dict) -> tuple:
    """`t.both(name, *args)` for an input the docstring accepts. If the learner's code raises one of the
    exception types in `refusals` (type -> what that raise means on this input), the case fails with that
    explanation and the traceback instead of a bare traceback."""
    expected = getattr(t.ref, name)(*args)
    got, raised = t.attempt(t.call, name, *args)  # a stub still ends the check "not started"
    if raised:
        why = next((msg for exc, msg in refusals.items() if raised.is_a(exc)), None)
        if why is None:
            raise raised
        t.fail(f"{name}() raised {raised.type_name} on an input it must accept.", why, end=f"\n{raised.tb_text}")
    return got, expected

# ---------------------------------------------------------------- 1.1 NVML utilization


@answer_code
def nvml_variant(kernels, period, t0, samples, union=True, clip=True, binary=False, from_zero=False,
                 scale=1.0, tail=True, sort=True, end_max=True):
    """NVML utilization with one convention changed: union=False adds overlapping kernels twice (capped at
    1, as a fraction cannot go higher); sort=False merges the intervals in the order given, as if they came
    sorted by start (a kernel that starts before the interval it overlaps leaves that interval's start where it
    was, so its earlier part is lost); end_max=False sets a merged interval's end to the new kernel's end, not
    the larger of the two (a kernel nested inside a longer one cuts the union short); clip=False charges each
    kernel's whole duration to the sample it starts in; tail=False counts a kernel only in the sample it starts
    in, clipped at that sample's end; binary=True reads a sample as 1 when any kernel touched it;
    from_zero=True starts the windows at 0 instead of t0; scale=100 reports percent."""
    ivs = sorted(kernels) if sort else [tuple(k) for k in kernels]
    if union:
        merged = []
        for s, e in ivs:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e) if end_max else e
            else:
                merged.append([s, e])
        ivs = merged
    start = 0.0 if from_zero else t0
    out = []
    for i in range(samples):
        lo, hi = start + i * period, start + (i + 1) * period
        if binary:
            out.append(1.0 if any(min(e, hi) > max(s, lo) for s, e in ivs) else 0.0)
        elif not clip:
            out.append(sum(e - s for s, e in ivs if lo <= s < hi) / period)
        elif not tail:
            out.append(sum(min(e, hi) - s for s, e in ivs if lo <= s < hi) / period)
        else:
            out.append(scale * min(1.0, sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in ivs) / period))
    return out


NVML_MISTAKES = {
    "adds overlapping kernels' time twice; a period with two streams busy at once is still busy once "
    "(take the union of the intervals)": dict(union=False),
    "merges the intervals in the order they come, as if sorted by start: the kernels come in any order (two "
    "streams' records one after the other), so sort them by start before merging": dict(sort=False),
    "sets a merged interval's end to the new kernel's end when merging: a kernel nested inside a longer one (a "
    "short kernel on a second stream) then cuts the union short; the merged end is max(current end, e)":
        dict(end_max=False),
    "charges each kernel's whole duration to the sample it starts in; clip every kernel to the sample window":
        dict(clip=False),
    "counts a kernel only in the sample it starts in: the part that crosses into the next sample is lost "
    "(clip every kernel to every window it overlaps)": dict(tail=False),
    "reads a sample as fully busy when any kernel ran in it; the value is the busy fraction of the period":
        dict(binary=True),
    "starts the sample windows at 0, not at t0: sample i covers [t0 + i * period, t0 + (i + 1) * period)":
        dict(from_zero=True),
    "reports percent, as nvidia-smi prints it; return the fraction in [0, 1]": dict(scale=100.0),
}

NVML_CASES = [
    ("visible: the docstring example", ([(0.0, 0.3), (0.2, 0.5), (0.9, 1.2)], 1.0, 0.0, 2)),
    ("visible: two streams overlapping", ([(0.00, 0.10), (0.05, 0.12), (0.11, 0.14), (0.20, 0.25)], 1 / 6, 0.0, 2)),
    ("visible: short kernels on a second stream nested inside a long one",
     ([(0.0, 0.6), (0.1, 0.2), (0.3, 0.4), (0.7, 0.9)], 0.5, 0.0, 2)),
    ("visible: a long kernel across three samples, an empty one after", ([(0.05, 0.42)], 0.125, 0.0, 5)),
    ("visible: decode steps with host gaps", ([(0.002 + 0.010 * i, 0.005 + 0.010 * i) for i in range(30)],
                                              0.1, 0.0, 3)),
    ("visible: two streams' records one after the other, not sorted by start",
     ([(0.30, 0.45), (0.55, 0.70), (0.05, 0.35), (0.40, 0.60)], 0.25, 0.0, 3)),
    ("visible: a profile that starts at t0 = 10 s, one kernel of zero length",
     ([(10.0, 10.5), (10.8, 11.3), (11.6, 11.6), (12.1, 12.2)], 1.0, 10.0, 3)),
]


def random_timeline(rng):
    """A hidden timeline: steps of a few kernels, some on a second stream overlapping, gaps between steps."""
    period = rng.choice([1 / 6, 0.2, 0.5, 1.0])
    samples = rng.randint(2, 5)
    kernels, t = [], rng.uniform(0, period / 4)
    while t < period * samples:
        d = rng.uniform(period / 20, period / 2)
        kernels.append((round(t, 6), round(t + d, 6)))
        if rng.random() < 0.4:  # a second stream: overlaps the kernel just launched
            s = t + rng.uniform(0, d)
            kernels.append((round(s, 6), round(s + rng.uniform(0, period / 3), 6)))
        t += d + rng.uniform(0, period / 2)
    rng.shuffle(kernels)
    return kernels, period, 0.0, samples


@check(points=3, section="1.1")
def nvml_utilization(t):
    """Per-sample busy fraction: the union of kernel intervals, clipped to each sample period."""
    for label, (kernels, period, t0, samples) in t.cases(NVML_CASES, random_timeline, n=3):
        with t.case(f"{label}: {len(kernels)} kernels, period {period:.4g} s, t0 {t0:g} s, {samples} samples"):
            zero_length = any(e == s for s, e in kernels)
            got, expected = both_accepting(t, "nvml_utilization", (kernels, period, t0, samples), {
                ValueError: "refuses a zero-length kernel (end == start): only end < start is a broken timeline; "
                            "a kernel shorter than the timer's resolution is zero time, not an error"}
                if zero_length else {})
            t.expect(got, expected, "utilization per sample", rtol=1e-6, atol=1e-9, mistakes={
                name: nvml_variant(kernels, period, t0, samples, **kw) for name, kw in NVML_MISTAKES.items()})
    for label, args, why in [
        ("a kernel that ends before it starts", ([(0.2, 0.1)], 1.0, 0.0, 1),
         "an interval with end < start is a broken timeline, not zero time"),
        ("a sample period of 0 s", ([(0.0, 0.5)], 0.0, 0.0, 1),
         "a period of 0 s has no busy fraction; check period > 0 before dividing by it"),
        ("a negative number of samples", ([(0.0, 0.5)], 1.0, 0.0, -1),
         "samples = -1 is a caller's bug; range(-1) would hide it as an empty list"),
    ]:
        with t.case(f"refuses {label}"):
            t.expect_raises(ValueError, "nvml_utilization", *args, why=why)


# ---------------------------------------------------------------- 2.1 SM active


@answer_code
def sm_variant(kernels, num_sms, period, share="waves", busy_only=False, mean=False, occupancy="spread"):
    """SM active with one convention changed. share: "waves" (right), "min" = min(blocks, SMs) / SMs (no tail
    wave; floor(blocks / SMs) waves, capped at 1, gives the same), "whole" = every SM busy while a kernel
    runs, "uncapped" = blocks / SMs, "extra" = blocks // SMs + 1 waves, "last" = the last wave's fill alone.
    occupancy (for kernels given per_sm): "spread" (right: a wave holds SMs * per_sm blocks, the last one's
    spread one per SM first), "ignored" = per_sm taken as 1, "slots" = the share of block slots filled
    (blocks / (SMs * per_sm * waves)), not of SMs holding a block, "waves_only" = per_sm in the number of waves
    only: the full waves take SMs blocks each, so the last wave holds blocks - (waves - 1) * SMs (the same values
    as min(1, blocks / (SMs * waves))), "mod" = the last wave's blocks taken as blocks % SMs (or SMs), not capped
    at SMs. busy_only divides by the kernels' time; mean averages the kernels' shares, unweighted."""
    def one(blocks, per):
        if occupancy == "ignored":
            per = 1
        if share == "whole":
            return 1.0
        if share == "min":
            return min(blocks, num_sms) / num_sms
        if share == "uncapped":
            return blocks / num_sms
        cap = num_sms * per
        if share == "last":
            return min(blocks % cap or cap, num_sms) / num_sms
        waves = blocks // cap + 1 if share == "extra" else math.ceil(blocks / cap)
        if occupancy == "slots":
            return blocks / (cap * waves)
        last = blocks - (waves - 1) * (num_sms if occupancy == "waves_only" else cap)
        if occupancy == "mod":
            return ((waves - 1) * num_sms + (blocks % num_sms or num_sms)) / (num_sms * waves)
        return ((waves - 1) * num_sms + min(last, num_sms)) / (num_sms * waves)

    def per_sm(k):
        return k[2] if len(k) > 2 else 1
    if mean:
        return sum(one(k[1], per_sm(k)) for k in kernels) / len(kernels) if kernels else 0.0
    busy = sum(k[0] * one(k[1], per_sm(k)) for k in kernels)
    denom = sum(k[0] for k in kernels) if busy_only else period
    return busy / denom if denom else 0.0


SM_MISTAKES = {
    "ignores the last, partly empty wave (a grid of 133 blocks on 132 SMs runs two waves, the second with one "
    "block: on average 133 / 264 of the SMs hold a block, so use ceil(blocks / SMs) waves)": dict(share="min"),
    "counts every SM busy while any kernel runs: that is NVML's utilization, not SM active": dict(share="whole"),
    "takes blocks / SMs without waves: a grid larger than the GPU cannot hold more than every SM":
        dict(share="uncapped"),
    "counts blocks // SMs + 1 waves: a grid of exactly 264 blocks on 132 SMs runs 2 waves, not 3 (ceil)":
        dict(share="extra"),
    "takes the last wave's fill for the whole kernel: the full waves before it hold a block on every SM "
    "(average over all waves: blocks / (SMs * waves))": dict(share="last"),
    "divides by the kernels' own time, not the whole period (time with no kernel counts as 0)":
        dict(busy_only=True),
    "averages the kernels' shares without weighting them by their time over the period": dict(mean=True),
    "ignores per_sm, the blocks one SM holds at once: a wave holds num_sms * per_sm blocks, so a grid that "
    "needs 2 waves at one block per SM may fit in 1": dict(occupancy="ignored"),
    "counts the block slots filled, not the SMs holding a block: SM active asks whether an SM holds at least "
    "one block; the last wave's r blocks are spread one per SM first, so min(r, num_sms) SMs are active":
        dict(occupancy="slots"),
    "uses per_sm for the number of waves but not for the blocks the full waves hold: each full wave holds "
    "num_sms * per_sm blocks, so the last one holds r = blocks - (waves - 1) * num_sms * per_sm, of which "
    "min(r, num_sms) SMs hold one (blocks / (num_sms * waves) is the share at per_sm = 1 only)":
        dict(occupancy="waves_only"),
    "takes the last wave's blocks as blocks % num_sms: at per_sm > 1 a wave holds up to num_sms * per_sm blocks, "
    "so the last one's r = blocks - (waves - 1) * num_sms * per_sm can be more than num_sms (then every SM holds "
    "one: min(r, num_sms))": dict(occupancy="mod"),
}

SM_CASES = [
    ("visible: the docstring example", ([(0.2, 66), (0.4, 264), (0.2, 133)], 132, 1.0)),
    ("visible: decode GEMMs of Llama-3-8B at batch 1 (128x128 tiles)",
     ([(18e-6, 48), (1.5e-6, 8), (12e-6, 32), (84e-6, 224), (42e-6, 32)], 132, 200e-6)),
    ("visible: one full wave and a one-block tail, then a half-empty grid", ([(0.5, 109), (0.25, 54)], 108, 1.0)),
    ("visible: two kernels that fill the period exactly", ([(0.25, 132), (0.75, 264)], 132, 1.0)),
    ("visible: kernels of 0.1 s and 0.2 s in a 0.3 s period", ([(0.1, 66), (0.2, 132)], 132, 0.3)),
    ("visible: 2 blocks per SM with a tail wave, then one block per SM with a one-block tail",
     ([(0.5, 300, 2), (0.25, 133)], 132, 1.0)),
    ("visible: the docstring's occupancy example, 2 blocks per SM", ([(0.5, 300, 2)], 132, 1.0)),
    ("visible: occupancy-limited grids (per_sm from registers and shared memory), some with one block per SM",
     ([(20e-6, 96, 2), (40e-6, 600, 4), (10e-6, 200), (30e-6, 140, 3)], 132, 120e-6)),
]


def random_grids(rng, occupancy: bool = True):
    """A hidden set of grids; with occupancy, some kernels carry per_sm (1 to 8 blocks per SM)."""
    num_sms = rng.choice([108, 132, 144])
    kernels = [(round(rng.uniform(1e-6, 1e-4), 9), rng.choice([1, 8, 32, num_sms, num_sms + 1,
                                                                   rng.randint(1, 5 * num_sms)]))
               for _ in range(rng.randint(2, 7))]
    if occupancy:
        kernels = [k + (rng.randint(1, 8),) if rng.random() < 0.5 else k for k in kernels]
    period = sum(k[0] for k in kernels) * rng.uniform(1.0, 3.0)
    return kernels, num_sms, period


def _overflow_refusal(kernels, period) -> dict:
    """What a ValueError means on kernels that fit the period (exactly, or up to float rounding)."""
    total = sum(k[0] for k in kernels)
    if total == period:
        return {ValueError: f"refuses kernels that fill the period exactly ({total!r} s of {period!r} s): they "
                            "fit; only more than the period is refused (> rather than >=)"}
    if total > period:
        return {ValueError: f"refuses kernels that fill the period: their float sum {total!r} s is above "
                            f"{period!r} s by rounding only; compare with a relative tolerance (1e-9)"}
    return {}


@check(points=3, section="2.1")
def sm_active(t):
    """Time-weighted share of SMs holding a block, waves included, over the whole period."""
    for label, (kernels, num_sms, period) in t.cases(SM_CASES, random_grids, n=3):
        with t.case(f"{label}: {len(kernels)} kernels on {num_sms} SMs, period {period:.4g} s"):
            got, expected = both_accepting(t, "sm_active", (kernels, num_sms, period),
                                           _overflow_refusal(kernels, period))
            t.expect(got, expected, "SM active", rtol=1e-6,
                     mistakes={name: sm_variant(kernels, num_sms, period, **kw) for name, kw in SM_MISTAKES.items()})
    with t.case("refuses kernels longer than the period"):
        t.expect_raises(ValueError, "sm_active", [(0.6, 10), (0.6, 10)], 132, 1.0,
                        why="kernels on one stream cannot take 1.2 s of a 1 s period")
    with t.case("refuses a GPU with 0 SMs"):
        t.expect_raises(ValueError, "sm_active", [(0.5, 10)], 0, 1.0,
                        why="num_sms = 0 is a broken device description (check num_sms >= 1 before dividing)")


# ---------------------------------------------------------------- 3.1 MFU and MBU


@answer_code
def mfu_variant(steps, peak_flops, peak_bw, elapsed=None, mean=False, idle=True, plus_busy=False,
                mbu_busy=False, swapped=False, scale=1.0, best=False):
    """MFU / MBU with one convention changed: mean=True averages per-step ratios; idle=False divides by the
    steps' own time even when the window is longer; plus_busy adds elapsed to the steps' time (as if it
    were the idle time alone); mbu_busy leaves the idle time out of MBU only; swapped divides by the wrong
    peaks; scale=100 reports percent; best reports the best step's own ratios. Needs steps with time (the
    empty window is not compared)."""
    busy = sum(s["wall_time"] for s in steps)
    window = elapsed if (elapsed is not None and idle) else busy
    if plus_busy and elapsed is not None:
        window = busy + elapsed
    pf, pb = (peak_bw, peak_flops) if swapped else (peak_flops, peak_bw)
    if best:
        return {"mfu": max(s["flops"] / (s["wall_time"] * pf) for s in steps),
                "mbu": max(s["bytes"] / (s["wall_time"] * pb) for s in steps)}
    if mean:
        per = [(s["flops"] / (s["wall_time"] * pf), s["bytes"] / (s["wall_time"] * pb)) for s in steps]
        frac = busy / window  # idle time still counts: only the weighting is wrong
        return {"mfu": frac * sum(p[0] for p in per) / len(per), "mbu": frac * sum(p[1] for p in per) / len(per)}
    return {"mfu": scale * sum(s["flops"] for s in steps) / (window * pf),
            "mbu": scale * sum(s["bytes"] for s in steps) / ((busy if mbu_busy else window) * pb)}


MFU_MISTAKES = {
    "averages each step's own MFU / MBU; pool the window (total FLOPs over total time), so a long step "
    "weighs more than a short one": dict(mean=True),
    "divides by the steps' own time and leaves out the idle time between them (use elapsed)": dict(idle=False),
    "divides by elapsed plus the steps' time: elapsed is the whole window, idle time already included":
        dict(plus_busy=True),
    "leaves the idle time out of MBU only: both ratios are over the same window": dict(mbu_busy=True),
    "divides FLOPs by the bandwidth and bytes by the FLOP/s peak (the peaks swapped)": dict(swapped=True),
    "reports percent; return fractions in [0, 1]": dict(scale=100.0),
    "reports the best step's own MFU / MBU; the window's figure pools every step and the idle time":
        dict(best=True),
}

H100_PEAKS = (989e12, 3350e9)  # dense bf16 FLOP/s and HBM bytes/s (datasheet, reference-facts.md)


def _steps(rows):
    return [{"flops": f, "bytes": b, "wall_time": w} for f, b, w in rows]


MFU_CASES = [
    ("visible: the docstring example", (_steps([(2e12, 1e12, 1.0), (0, 1e12, 1.0)]), 1e13, 1e12, 4.0)),
    ("visible: Llama-3-8B decode steps at batch 1 and 64, H100, no idle time",
     (_steps([(1.6e10, 1.62e10, 5.9e-3), (1.03e12, 1.70e10, 7.1e-3)]), *H100_PEAKS, None)),
    ("visible: a prefill step and decode steps, idle gaps between them",
     (_steps([(2.1e13, 2.0e10, 0.030), (1.6e10, 1.62e10, 0.006), (1.6e10, 1.62e10, 0.006)]), *H100_PEAKS, 0.1)),
    ("visible: steps of 0.1 s and 0.2 s in a window of elapsed = 0.3 s",
     (_steps([(1e13, 1e11, 0.1), (2e13, 1e11, 0.2)]), *H100_PEAKS, 0.3)),
    ("visible: an empty window (no steps, elapsed None)", ([], *H100_PEAKS, None)),
]


def random_steps(rng):
    rows = [(rng.uniform(1e9, 5e13), rng.uniform(1e9, 3e10), rng.uniform(2e-3, 5e-2)) for _ in range(rng.randint(2, 6))]
    busy = sum(w for _, _, w in rows)
    return _steps(rows), *H100_PEAKS, rng.choice([None, busy * rng.uniform(1.1, 4.0)])


def _window_refusals(steps, elapsed) -> dict:
    """What a raise means on a window the docstring accepts."""
    busy = sum(s["wall_time"] for s in steps)
    if not steps:
        return {ZeroDivisionError: "divides by the window of 0 s: with no steps and no elapsed time nothing ran, "
                                   "so MFU and MBU are 0.0 (return them before dividing)"}
    if elapsed is not None and elapsed < busy:
        return {ValueError: f"refuses elapsed = {elapsed!r} s for steps whose float sum is {busy!r} s: above it "
                            "by rounding only; compare with a relative tolerance (1e-9)"}
    return {}


@check(points=3, section="3.1")
def mfu_mbu(t):
    """MFU and MBU pooled over a window of wall time, idle time included."""
    for label, (steps, pf, pb, elapsed) in t.cases(MFU_CASES, random_steps, n=3):
        with t.case(f"{label}: {len(steps)} steps, elapsed {elapsed}"):
            got, expected = both_accepting(t, "mfu_mbu", (steps, pf, pb, elapsed), _window_refusals(steps, elapsed))
            mistakes = {name: mfu_variant(steps, pf, pb, elapsed, **kw) for name, kw in MFU_MISTAKES.items()} \
                if steps else {}
            t.expect_dict(got, expected, "MFU and MBU", mistakes, keys=("mfu", "mbu"), rtol=1e-6)
    with t.case("refuses a window shorter than its steps"):
        t.expect_raises(ValueError, "mfu_mbu", _steps([(1e12, 1e9, 1.0)]), *H100_PEAKS, 0.5,
                        why="elapsed = 0.5 s cannot hold a step of 1 s")
    with t.case("refuses elapsed = 0.0 for steps that took time"):
        t.expect_raises(ValueError, "mfu_mbu", _steps([(1e12, 1e9, 1.0)]), *H100_PEAKS, 0.0,
                        why="elapsed = 0.0 is a window of 0 s, shorter than the step's 1 s; only None means "
                            "'the steps' own time' (test `elapsed is None`, not `elapsed or ...`)")


# ---------------------------------------------------------------- 4.1 diagnosis


@answer_code
def diagnose_variant(d, in_flight, busy=0.5, kind=""):
    """The usual wrong readings (kind): "util" trusts gpu_util alone; "no_queue" calls every low-util window
    idle; "idle_le" / "idle_zero" draw the idle line at in_flight <= 1 / == 0; "util_le" / "pipes_le" use
    <= busy in rule 1 / rule 2; "sm_util" reads sm_active in rule 1; "sm" takes SM active as the compute
    signal; "no_util" skips rule 1; "no_rule2" skips rule 2; "rule2_idle" calls rule 2's windows idle;
    "min_pipe" calls overhead when either pipe is quiet; "occupancy" calls low occupancy overhead before
    the pipes decide; "tie" gives a tie to memory; "half" ignores busy and uses 0.5."""
    if kind == "util":
        return "compute" if d["gpu_util"] >= busy else "idle"
    if kind == "half":
        busy = 0.5
    util = d["sm_active"] if kind == "sm_util" else d["gpu_util"]
    if kind != "no_util" and (util <= busy if kind == "util_le" else util < busy):
        idle = {"no_queue": True, "idle_le": in_flight <= 1, "idle_zero": in_flight == 0}.get(kind, in_flight < 1)
        return "idle" if idle else "overhead"
    compute, dram = (d["sm_active"] if kind == "sm" else d["tensor_active"]), d["dram_active"]
    pick = min if kind == "min_pipe" else max
    quiet = pick(compute, dram) <= busy if kind == "pipes_le" else pick(compute, dram) < busy
    if quiet and kind != "no_rule2":
        return "idle" if kind == "rule2_idle" else "overhead"
    if kind == "occupancy" and d["sm_occupancy"] < busy:
        return "overhead"
    return "compute" if (compute > dram if kind == "tie" else compute >= dram) else "memory"


DIAGNOSE_MISTAKES = {
    "trusts NVML's utilization alone (a kernel running is not the chip busy: read the tensor and DRAM pipes)":
        "util",
    "calls every low-utilization window idle; with requests waiting (in_flight >= 1) the host is the "
    "bottleneck: overhead": "no_queue",
    "calls a window with in_flight = 1 idle: a request always in flight is work waiting (idle is in_flight < 1)":
        "idle_le",
    "calls a window idle only when in_flight is 0: in_flight is a mean, and below 1 the engine mostly had "
    "nothing to do (idle is in_flight < 1)": "idle_zero",
    "calls gpu_util exactly at busy low: rule 1 is gpu_util < busy, so busy itself is 'mostly'": "util_le",
    "calls a pipe exactly at busy quiet: rule 2 is both pipes < busy, so busy itself is 'mostly'": "pipes_le",
    "reads sm_active in rule 1; rule 1 is about time, gpu_util (small grids keep few SMs active while "
    "kernels run all the time)": "sm_util",
    "reads SM active as compute; memory-bound kernels keep SMs active too (use tensor_active)": "sm",
    "skips the utilization rule: pipes busy while kernels run say nothing about the time no kernel ran":
        "no_util",
    "skips rule 2: with both pipes under busy neither roof is the limit, the kernels are too small or wait "
    "on launches (overhead)": "no_rule2",
    "calls quiet pipes idle; kernels ran most of the time, so the GPU was not idle: overhead": "rule2_idle",
    "calls overhead when either pipe is under busy; one busy pipe is enough to name the bound (rule 2 needs "
    "both quiet)": "min_pipe",
    "lets low occupancy decide; occupancy explains a bound, the busier pipe decides it": "occupancy",
    "gives a tie between the pipes to memory; rule 3 is tensor_active >= dram_active -> compute": "tie",
    "ignores the busy argument and uses 0.5; the threshold is the caller's": "half",
}


@answer_code
def rule_path(d, in_flight, busy=0.5) -> str:
    """The docstring's rules applied to one reading, in words: what every message can state for certain."""
    u, tensor, dram = d["gpu_util"], d["tensor_active"], d["dram_active"]
    if u < busy:
        if in_flight < 1:
            return f"rule 1: gpu_util {u} < busy {busy} and in_flight {in_flight} < 1: mostly nothing to do -> idle"
        return (f"rule 1: gpu_util {u} < busy {busy} with in_flight {in_flight} >= 1: requests waited while no "
                "kernel ran, the host did not feed the GPU -> overhead")
    if max(tensor, dram) < busy:
        return (f"rule 2: gpu_util {u} >= busy {busy}, but tensor_active {tensor} and dram_active {dram} are both "
                f"< {busy} -> overhead")
    return (f"rule 3: gpu_util {u} >= busy {busy} and a pipe is busy; the busier pipe decides (tensor_active "
            f"{tensor} vs dram_active {dram}, a tie going to compute; SM active and occupancy only explain) -> "
            + ("compute" if tensor >= dram else "memory"))


def _dash(util, sm, occ, tensor, dram):
    return {"gpu_util": util, "sm_active": sm, "sm_occupancy": occ, "tensor_active": tensor, "dram_active": dram}


DIAGNOSE_CASES = [
    ("visible: tiny kernels with launch gaps", (_dash(0.92, 0.18, 0.05, 0.02, 0.12), 4.0, 0.5)),
    ("visible: batch-1 decode back to back (100% util, ~0% MFU)", (_dash(0.97, 0.9, 0.2, 0.003, 0.79), 1.0, 0.5)),
    ("visible: an empty server (nothing in flight)", (_dash(0.02, 0.02, 0.01, 0.0, 0.01), 0.0, 0.5)),
    ("visible: HBM saturated while kernels run, host gaps, requests waiting",
     (_dash(0.30, 0.28, 0.1, 0.002, 0.24), 6.0, 0.5)),
    ("visible: the same reading with almost no traffic", (_dash(0.30, 0.28, 0.1, 0.002, 0.24), 0.3, 0.5)),
    ("visible: the same reading with one request always in flight", (_dash(0.30, 0.28, 0.1, 0.002, 0.24), 1.0, 0.5)),
    ("visible: large prefill chunks", (_dash(0.99, 0.98, 0.3, 0.72, 0.15), 12.0, 0.5)),
    ("visible: SMs busy, tensor pipe quiet, DRAM busy", (_dash(0.95, 0.85, 0.6, 0.20, 0.70), 32.0, 0.5)),
    ("visible: tensor and DRAM pipes both busy (near the ridge)", (_dash(0.98, 0.9, 0.5, 0.62, 0.58), 64.0, 0.5)),
    ("visible: the pipes exactly tied, low occupancy", (_dash(0.9, 0.85, 0.3, 0.6, 0.6), 16.0, 0.5)),
    ("visible: both pipes exactly at the threshold", (_dash(0.9, 0.8, 0.6, 0.5, 0.5), 8.0, 0.5)),
    ("visible: kernels exactly half the time, HBM saturated while they run, light load",
     (_dash(0.5, 0.5, 0.5, 0.05, 0.5), 0.5, 0.5)),
    ("visible: long memory-bound kernels on a small grid, light load", (_dash(0.9, 0.4, 0.1, 0.01, 0.7), 0.5, 0.5)),
    ("visible: a stricter threshold, busy = 0.7", (_dash(0.6, 0.55, 0.3, 0.05, 0.55), 8.0, 0.7)),
]


def random_dashboard(rng):
    """A hidden dashboard that could come from hardware: no pipe busier than the time kernels ran, the tensor
    pipe and occupancy no busier than SM active."""
    util = rng.choice([rng.uniform(0.05, 0.45), rng.uniform(0.55, 1.0)])
    sm = util * rng.uniform(0.1, 1.0)
    dash = _dash(util, sm, sm * rng.uniform(0.1, 1.0), sm * rng.uniform(0.0, 1.0), util * rng.uniform(0.0, 1.0))
    return {k: round(v, 3) for k, v in dash.items()}, rng.choice([0.2, 0.8, 3.0, 20.0])


def _random_case(rng):
    dash, in_flight = random_dashboard(rng)
    return dash, in_flight, 0.5


@check(points=3, section="4.1")
def diagnose(t):
    """Idle, overhead, compute or memory: utilization and load first, then the pipes."""
    for label, (dash, in_flight, busy) in t.cases(DIAGNOSE_CASES, _random_case, n=4):
        args = (dash, in_flight) if busy == 0.5 else (dash, in_flight, busy)  # the default, as callers use it
        with t.case(f"{label}: {dash}, in_flight {in_flight}" + ("" if busy == 0.5 else f", busy {busy}")):
            got, expected = t.both("diagnose", *args)
            wrong = {name: diagnose_variant(dash, in_flight, busy, kind=k) for name, k in DIAGNOSE_MISTAKES.items()}
            t.expect(got, expected, "the diagnosis", mistakes=wrong,
                     hint=f"The docstring's rules give: {rule_path(dash, in_flight, busy)}.")
