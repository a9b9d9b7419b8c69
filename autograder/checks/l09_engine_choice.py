"""Checks for lesson 09: the host/forward split of measured steps, the regime of a step on the modeled
roofline, the batch below which decode is overhead-bound, a workload's steady step, and the decision table.

Step statistics are made here: hand-made visible lists (a step with no forward, steps of very different
lengths, a garbage-collector pause, prefill steps, a batch that shrinks as requests finish) and hidden
random runs. Device times come from the modeled GPU clock (reference_engine.sim.gpu_model), which the checks
import directly to compute the values the usual mistakes give (the peaks instead of the achievable
fractions, the default per-step overhead left in, the GEMMs' bound instead of the step's). Workloads
cross to the learner as Records, which arrive as the learner's own Workload; the expected answers come
from the reference through t.reference, the wrong ones from the table re-implemented here with one
mistake put in. The visible cases hold one case for each mistake, so every named mistake is tested on
every seed.
"""
from __future__ import annotations

import math
import statistics

from autograder.core import check
from autograder.reference import answer_code
from autograder.wire import Record
from reference_engine.sim import gpu_model as gm

MODELS, CHIPS = ("llama-3-8b", "llama-3-70b"), ("H100", "H200", "A100")


# -- the modeled step, as the mistakes compute it ----------------------------------------------------

def _step(model, chip, batch, context, chunk=0, chunk_context=0, overhead_s=0.0, peak=False, tp=1) -> gm.StepTime:
    c = gm.CHIPS[chip].at_peak() if peak else gm.CHIPS[chip]
    comp = gm.Composition.decode_batch(batch, context, chunk, chunk_context)
    return gm.step_time(gm.MODELS[model], c, comp, tp=tp, overhead_s=overhead_s)


@answer_code
def _regime(model, chip, batch, context, host, chunk=0, chunk_context=0, overhead_s=0.0, peak=False,
            gemm_only=False, tp=1, tie=False, rule="time", one_gpu=False) -> str:
    st = _step(model, chip, batch, context, chunk, chunk_context, overhead_s, peak, 1 if one_gpu else tp)
    if host > st.time_s or (tie and host == st.time_s):
        return "overhead"
    if gemm_only:
        return st.bound("gemm")
    compute = sum(k.time_s for k in st.kernels if k.bound == "compute")
    memory = sum(k.time_s for k in st.kernels if k.bound == "memory")
    n_compute = sum(1 for k in st.kernels if k.bound == "compute")
    is_compute = {"time": compute > st.time_s / 2, "vs_memory": compute > memory,
                  "count": n_compute > len(st.kernels) / 2,
                  "longest": max(st.kernels, key=lambda k: k.time_s).bound == "compute",
                  "terms": sum(k.compute_s for k in st.kernels) > sum(k.memory_s for k in st.kernels)}[rule]
    return "compute" if is_compute else "memory"


# -- 1.1 step_split -----------------------------------------------------------------------------------

def S(wall: float, forward: float | None, prefill: int = 0, decode: int = 1, running: int | None = None) -> dict:
    """One step's stats as the engine's StepStats gives them (the fields the lesson reads, plus a few)."""
    return {"wall_time": wall, "forward_time": forward, "num_prefill_tokens": prefill,
            "num_prefill_seqs": 1 if prefill else 0, "num_decode_tokens": decode, "num_decode_seqs": decode,
            "num_running": decode if running is None else running, "num_waiting": 0, "num_preempted": 0}


@answer_code
def _split(steps, fraction="host/wall", keep_none=False, falsy=False) -> dict:
    ran = [s for s in steps if (s["forward_time"] if falsy else keep_none or s["forward_time"] is not None)]
    wall = sum(s["wall_time"] for s in ran)
    fwd = sum(s["forward_time"] or 0.0 for s in ran)
    host = sum(s["wall_time"] - (s["forward_time"] or 0.0) for s in ran)
    frac = {"host/wall": host / wall, "host/forward": host / fwd if fwd else float("inf"), "forward/wall": fwd / wall,
            "mean": statistics.fmean((s["wall_time"] - (s["forward_time"] or 0.0)) / s["wall_time"] for s in ran)}
    return {"steps": len(ran), "wall_s": wall, "forward_s": fwd, "host_s": host, "host_fraction": frac[fraction]}


SPLIT_MISTAKES = {
    "divides the host time by the forward time; the host's share of the run is host / wall":
        dict(fraction="host/forward"),
    "returns the forward's share of the wall time, not the host's": dict(fraction="forward/wall"),
    "averages the per-step host fractions; the run's share is a ratio of sums, in which long steps weigh more":
        dict(fraction="mean"),
    "counts a step without a forward (forward_time None) as host time; such a step is left out entirely":
        dict(keep_none=True),
    "drops steps whose forward_time is 0.0 (a truthiness test); only None marks a step without a forward, "
    "0.0 is a forward the clock saw as instant": dict(falsy=True),
}

SPLIT_CASES = [
    ("the docstring's example", [S(0.010, 0.006), S(0.002, None), S(0.030, 0.026)]),
    ("a long prefill step among short decodes", [S(0.002, 0.0005), S(0.002, 0.0006), S(0.050, 0.046, prefill=512),
                                                 S(0.0021, 0.0005)]),
    ("a preemption-only step with a long wall time", [S(0.004, 0.003), S(0.020, None), S(0.004, 0.0025)]),
    ("a forward timed as 0.0 (it ran: only None means no forward)", [S(0.003, 0.002), S(0.001, 0.0),
                                                                   S(0.004, 0.003)]),
]


def _random_steps(rng, n: int | None = None) -> list[dict]:
    steps = []
    for _ in range(n or rng.randint(8, 30)):
        wall = rng.uniform(0.001, 0.05)
        fwd = None if rng.random() < 0.12 else wall * rng.uniform(0.15, 0.95)
        b = rng.randint(1, 12)
        steps.append(S(wall, fwd, prefill=rng.choice([0, 0, 0, rng.randint(1, 256)]), decode=b,
                       running=max(0, b - rng.choice([0, 0, 1, 2]))))
    if all(s["forward_time"] is None for s in steps):
        steps[0]["forward_time"] = steps[0]["wall_time"] / 2
    return steps


@check(points=3, section="1.1")
def step_split(t):
    """Host and forward time of measured steps; steps without a forward left out; ValueError when none ran."""
    for label, steps in t.cases(SPLIT_CASES, _random_steps, n=3):
        with t.case(f"{label}: {len(steps)} steps"):
            expected = t.ref.step_split(steps)
            got = t.call("step_split", steps)
            t.expect_dict(got, expected, "the split", rtol=1e-9,
                          mistakes={name: _split(steps, **kw) for name, kw in SPLIT_MISTAKES.items()},
                          keys=("steps", "wall_s", "forward_s", "host_s", "host_fraction"))
    with t.case("no step ran a forward"):
        t.expect_raises(ValueError, "step_split", [S(0.01, None), S(0.02, None)],
                        why="with no forward there is nothing to split (host_fraction would divide by zero "
                            "or describe steps that ran no model)")


# -- 1.2 split_by_batch -------------------------------------------------------------------------------

@answer_code
def _by_batch(steps, mixed=False, mean=False, key="num_decode_seqs", max_prefill=0, diff_of_medians=False,
              first_seen=False) -> dict:
    agg = statistics.fmean if mean else statistics.median
    groups: dict[int, list[dict]] = {}
    for s in steps:
        if s["forward_time"] is not None and (mixed or s["num_prefill_tokens"] <= max_prefill):
            groups.setdefault(s[key], []).append(s)

    def host(g):
        if diff_of_medians:
            return agg([s["wall_time"] for s in g]) - agg([s["forward_time"] for s in g])
        return agg([s["wall_time"] - s["forward_time"] for s in g])
    return {b: {"n": len(g), "host_s": host(g), "forward_s": agg([s["forward_time"] for s in g])}
            for b, g in (groups.items() if first_seen else sorted(groups.items()))}


BATCH_MISTAKES = {
    "keeps steps that also prefilled (num_prefill_tokens > 0); a prefill chunk makes a step slower for "
    "reasons that are not the batch": dict(mixed=True),
    "takes means, not medians: one slow step (the OS, the garbage collector) moves a mean": dict(mean=True),
    "groups by num_running, the batch after the step; the step ran num_decode_seqs sequences":
        dict(key="num_running"),
    "treats a step with 1 prefill token as pure decode; any prefill token (num_prefill_tokens > 0) makes it a "
    "mixed step": dict(max_prefill=1),
    "subtracts the median forward time from the median wall time; the host time of the typical step is the "
    "median of the per-step differences (the two medians can come from different steps)":
        dict(diff_of_medians=True),
    "lists the batch sizes in the order they first appear; the docstring asks for increasing order":
        dict(first_seen=True),
}

BATCH_CASES = [
    ("the docstring's example", [S(0.010, 0.006, decode=4), S(0.012, 0.008, decode=4)]),
    ("a garbage-collector pause in batch 2", [S(0.003, 0.002, decode=2), S(0.0031, 0.0021, decode=2),
                                              S(0.040, 0.0022, decode=2), S(0.005, 0.004, decode=4),
                                              S(0.0052, 0.0041, decode=4), S(0.0049, 0.0039, decode=4)]),
    ("a prefill chunk beside 3 decodes", [S(0.004, 0.003, decode=3), S(0.030, 0.027, prefill=300, decode=3),
                                          S(0.0041, 0.0031, decode=3), S(0.0042, 0.0029, decode=3)]),
    ("requests finishing: the batch shrinks after the step", [S(0.006, 0.005, decode=6, running=4),
                                                              S(0.0045, 0.0036, decode=4), S(0.0046, 0.0034, decode=4),
                                                              S(0.002, None, decode=0)]),
    ("a one-token prefill (the last token of a prompt) and a long one beside 3 decodes",
     [S(0.004, 0.003, decode=3), S(0.009, 0.0065, prefill=1, decode=3), S(0.0041, 0.0031, decode=3),
      S(0.030, 0.027, prefill=300, decode=3)]),
    ("batch 5: the median host time is not the median wall minus the median forward",
     [S(0.010, 0.009, decode=5), S(0.011, 0.004, decode=5), S(0.020, 0.006, decode=5)]),
]


@check(points=3, section="1.2")
def split_by_batch(t):
    """Median host and forward time of pure decode steps, per num_decode_seqs."""
    for label, steps in t.cases(BATCH_CASES, _random_steps, n=3):
        with t.case(f"{label}: {len(steps)} steps"):
            expected = t.ref.split_by_batch(steps)
            got = t.call("split_by_batch", steps)
            t.expect_true(isinstance(got, dict), f"split_by_batch should return a dict {{batch: {{...}}}}; got "
                                                 f"{type(got).__name__}")
            t.expect(list(got), list(expected), "the batch sizes (keys, in order)",
                     mistakes={name: list(_by_batch(steps, **kw)) for name, kw in BATCH_MISTAKES.items()})
            t.expect(got, expected, "the split by batch", rtol=1e-9,
                     mistakes={name: _by_batch(steps, **kw) for name, kw in BATCH_MISTAKES.items()})


# -- 2.1 regime ---------------------------------------------------------------------------------------

REGIME_MISTAKES = {
    "adds gpu_model's default per-step overhead to the device time; the device time is the kernels alone "
    "(overhead_s=0)": dict(overhead_s=gm.STEP_OVERHEAD_S),
    "uses the datasheet peaks (Chip.at_peak()); the modeled clock runs kernels at the achievable fractions":
        dict(peak=True),
    "classifies by the weight GEMMs' bound alone; attention counts too, and at long contexts it is most of "
    "the step": dict(gemm_only=True),
    "counts a tie (host == device time) as overhead; the step is overhead-bound only when the host takes "
    "longer than the kernels": dict(tie=True),
    "compares the compute-bound kernels with the memory-bound ones, leaving the all-reduces out; the rule is "
    "more than half of the whole device time": dict(rule="vs_memory"),
    "counts kernels, not their time; the compute-bound kernels must take more than half of the device time":
        dict(rule="count"),
    "takes the bound of the single longest kernel; the rule adds up the time of every compute-bound kernel":
        dict(rule="longest"),
    "compares the sums of the compute and memory roofline terms; a kernel's time is the larger of its two "
    "terms, so add up the time_s of the compute-bound kernels": dict(rule="terms"),
    "models the step on one GPU (tp left out); each GPU of a tensor-parallel group runs its shard, so pass tp "
    "to step_time": dict(one_gpu=True),
}

d1 = _step("llama-3-8b", "H100", 1, 1024).time_s
d1_peak = _step("llama-3-8b", "H100", 1, 1024, peak=True).time_s
d70_tp4, d70_tp1 = (_step("llama-3-70b", "H100", 64, 1024, tp=tp).time_s for tp in (4, 1))
REGIME_CASES = [  # (model, chip, batch, context, host, chunk, chunk_context, tp)
    ("the docstring's example", ("llama-3-8b", "H100", 1, 1024, 1e-3, 0, 0, 1)),
    ("host just above the kernels", ("llama-3-8b", "H100", 1, 1024, d1 + 0.4 * gm.STEP_OVERHEAD_S, 0, 0, 1)),
    ("host between the peak and the achievable kernel time",
     ("llama-3-8b", "H100", 1, 1024, (d1 + d1_peak) / 2, 0, 0, 1)),
    ("compute-bound GEMMs, KV reads dominate", ("llama-3-8b", "H100", 512, 1024, 1e-3, 0, 0, 1)),
    ("70B over 4 GPUs, a host between the shard's kernel time and the whole model's",
     ("llama-3-70b", "H100", 64, 1024, (d70_tp4 + d70_tp1) / 2, 0, 0, 4)),
    ("70B over 4 GPUs, a large batch", ("llama-3-70b", "H100", 512, 1024, 1e-3, 0, 0, 4)),
    ("a prefill chunk beside the decodes", ("llama-3-8b", "A100", 16, 512, 2e-3, 2048, 0, 1)),
    ("host exactly the kernel time (a tie)", ("llama-3-8b", "H100", 1, 1024, d1, 0, 0, 1)),
    ("the longest kernel is memory-bound, most of the time compute-bound",
     ("llama-3-8b", "H100", 512, 1024, 1e-3, 2048, 0, 1)),
    ("compute-bound by time, not by the sums of the roofline terms", ("llama-3-8b", "H100", 128, 512, 1e-3, 256, 0, 1)),
]


def _tp(rng, model: str) -> int:
    """GPUs per replica: 1 for 8B; 70B does not fit one GPU in bf16, so 2 to 8."""
    return 1 if model == "llama-3-8b" else rng.choice([2, 4, 8])


def _random_regime(rng):
    model, chip = rng.choice(MODELS), rng.choice(CHIPS)
    batch, context = rng.choice([1, 4, 16, 64, 256, 512, 1024]), rng.choice([128, 512, 1024, 4096])
    chunk, tp = rng.choice([0, 0, 256, 2048]), _tp(rng, model)
    d = _step(model, chip, batch, context, chunk, 0, tp=tp).time_s
    return (model, chip, batch, context, d * rng.choice([0.2, 0.9, 1.02, 1.5]), chunk,
            rng.choice([0, 512]) if chunk else 0, tp)


def _regime_args(case) -> tuple[tuple, dict]:
    model, chip, batch, context, host, chunk, cc, tp = case
    kw = {"chunk": chunk, "chunk_context": cc} if chunk else {}
    return (model, chip, batch, context, host), {**kw, **({"tp": tp} if tp != 1 else {})}


@check(points=3, section="2.1")
def regime(t):
    """Overhead, memory or compute: the host against the kernels, then the compute-bound kernels' share."""
    for label, case in t.cases(REGIME_CASES, _random_regime, n=4):
        model, chip, batch, context, host, chunk, cc, tp = case
        with t.case(f"{label}: {model} on {chip} (tp={tp}), batch {batch} at context {context}, chunk {chunk} "
                    f"after {cc}, host {host * 1e3:.3f} ms"):
            args, kw = _regime_args(case)
            expected = t.ref.regime(*args, **kw)
            got = t.call("regime", *args, **kw)
            t.expect(got, expected, "the regime",
                     mistakes={name: _regime(*args, chunk, cc, tp=tp, **m) for name, m in REGIME_MISTAKES.items()})


# -- 2.2 overhead_bound_batch --------------------------------------------------------------------------

@answer_code
def _first_batch(model, chip, context, host, max_batch, overhead_s=0.0, peak=False, last=False, strict=False,
                 top=0, bisect_top=False, first=1):
    """The smallest batch whose modeled device time reaches `host` (linear scan: an independent answer), or
    with a mistake: strict (> host), the scan stopping `top` batches short of max_batch (bisect_top: a
    bisection that returns its top when max_batch reaches the host), the scan from `first` (0: batch 0)."""
    def reaches(b):
        t = _step(model, chip, b, context, overhead_s=overhead_s, peak=peak).time_s
        return t > host if strict else t >= host
    for b in range(first, max_batch + 1 - top):
        if reaches(b):
            return (b - 1 if b > 1 else 1) if last else b
    return max_batch - top if bisect_top and reaches(max_batch) else None


BATCH_BOUND_MISTAKES = {
    "returns the last overhead-bound batch; the answer is the first batch whose kernels take at least the "
    "host time": dict(last=True),
    "adds gpu_model's default per-step overhead to the device time; the device time is the kernels alone":
        dict(overhead_s=gm.STEP_OVERHEAD_S),
    "uses the datasheet peaks (Chip.at_peak()), not the achievable fractions of the modeled clock": dict(peak=True),
    "counts a batch whose kernels take exactly the host time as overhead-bound; the answer is the first batch "
    "whose device time is at least (>=) the host's": dict(strict=True),
    "never tries max_batch itself; the batches run from 1 to max_batch inclusive": dict(top=1),
    "bisects over 1 .. max_batch - 1 (hi = max_batch - 1); max_batch itself can be the answer":
        dict(top=1, bisect_top=True),
    "can return batch 0; a decode step runs at least one sequence, so the batches start at 1": dict(first=0),
}

OBB_CASES = [  # (model, chip, context, host, max_batch)
    ("the docstring's example", ("llama-3-8b", "H100", 1024, 0.010, 4096)),
    ("no batch is overhead-bound", ("llama-3-8b", "H100", 1024, 0.001, 4096)),
    ("every batch up to max_batch is overhead-bound", ("llama-3-8b", "H100", 1024, 0.010, 64)),
    ("70B on A100, a slow host", ("llama-3-70b", "A100", 512, 0.120, 4096)),
    ("a short context", ("llama-3-8b", "H200", 128, 0.0045, 512)),
    ("host exactly batch 40's kernel time", ("llama-3-8b", "H100", 1024, _step("llama-3-8b", "H100", 40, 1024).time_s,
                                             4096)),
    ("only max_batch reaches the host time", ("llama-3-8b", "H200", 512, (_step("llama-3-8b", "H200", 63, 512).time_s
                                              + _step("llama-3-8b", "H200", 64, 512).time_s) / 2, 64)),
    ("a host that takes no time", ("llama-3-8b", "H100", 1024, 0.0, 4096)),
]


def _random_obb(rng):
    model, chip, context = rng.choice(MODELS), rng.choice(CHIPS), rng.choice([128, 512, 1024, 2048, 4096])
    d1 = _step(model, chip, 1, context).time_s
    return model, chip, context, d1 * rng.uniform(1.05, 4.0), rng.choice([512, 1024, 4096])


@check(points=3, section="2.2", cost=0.3)
def overhead_bound_batch(t):
    """The first decode batch whose kernels take at least the host time (1 if none is overhead-bound, None if all)."""
    for label, (model, chip, context, host, mb) in t.cases(OBB_CASES, _random_obb, n=3):
        with t.case(f"{label}: {model} on {chip}, context {context}, host {host * 1e3:.3f} ms, max_batch {mb}"):
            kw = {} if mb == 4096 else {"max_batch": mb}
            expected = t.ref.overhead_bound_batch(model, chip, context, host, **kw)
            got = t.call("overhead_bound_batch", model, chip, context, host, **kw)
            t.expect(got, expected, "the batch",
                     mistakes={name: _first_batch(model, chip, context, host, mb, **m)
                               for name, m in BATCH_BOUND_MISTAKES.items()})


# -- 3.1 steady_step -----------------------------------------------------------------------------------

def W(concurrency, prompt, output, prefix_share=0.0, tpot_slo_s=None, host=0.0, model="llama-3-8b", chip="H100",
      features=(), tp=None) -> dict:
    """A Workload's fields (sent as a Record, so it arrives as the learner's own Workload); 70B on 4 GPUs
    unless tp says otherwise."""
    return {"concurrency": concurrency, "prompt_tokens": prompt, "output_tokens": output,
            "prefix_share": prefix_share, "tpot_slo_s": tpot_slo_s, "host_overhead_s": host, "model": model,
            "chip": chip, "tp": tp or (4 if model == "llama-3-70b" else 1), "features": tuple(features)}


def _describe(f: dict) -> str:
    extra = [f"prefix share {f['prefix_share']:g}"] if f["prefix_share"] else []
    if f["tpot_slo_s"] is not None:
        extra.append(f"TPOT SLO {f['tpot_slo_s'] * 1e3:.2f} ms")
    if f["host_overhead_s"]:
        extra.append(f"host {f['host_overhead_s'] * 1e3:.2f} ms/step")
    if f["features"]:
        extra.append(f"needs {', '.join(f['features'])}")
    return (f"{f['model']} on {f['tp']} x {f['chip']}, {f['concurrency']} concurrent, {f['prompt_tokens']} in / "
            f"{f['output_tokens']} out" + "".join(f", {e}" for e in extra))


def _ref_steady(ref, fields: dict) -> dict:
    return ref.steady_step(ref.Workload(**fields))


ROUNDINGS = {"round": round, "trunc": int, "half_up": lambda x: math.floor(x + 0.5)}


@answer_code
def _steady(f, share=True, end_context=False, per_request=False, rounding="round", ceil_chunk=False,
            round_half_output=False) -> dict:
    s = f["prefix_share"] if share else 0.0
    per_step = 1 if per_request else f["concurrency"] / f["output_tokens"]
    rnd = ROUNDINGS[rounding]
    half = round(f["output_tokens"] / 2) if round_half_output else f["output_tokens"] // 2
    chunk = per_step * f["prompt_tokens"] * (1 - s)
    return {"batch": f["concurrency"],
            "context": f["prompt_tokens"] + (f["output_tokens"] if end_context else half),
            "chunk": math.ceil(chunk) if ceil_chunk else rnd(chunk),
            "chunk_context": rnd(f["prompt_tokens"] * f["prefix_share"])}


STEADY_MISTAKES = {
    "prefills the whole prompt; the cached prefix_share of it is not computed again": dict(share=False),
    "uses the context at the end of a request (prompt + output); on average a decode has half its output "
    "behind it": dict(end_context=True),
    "starts one request per step; in a steady state concurrency / output_tokens requests start per step":
        dict(per_request=True),
    "truncates with int(); the docstring rounds (round())": dict(rounding="trunc"),
    "rounds halves up (floor(x + 0.5)); Python's round() takes a half to the even neighbour (round(2.5) == 2)":
        dict(rounding="half_up"),
    "rounds the chunk up (ceil); the docstring rounds it to the nearest int": dict(ceil_chunk=True),
    "rounds half the output (round(output_tokens / 2)); the docstring's context floors it (output_tokens // 2)":
        dict(round_half_output=True),
}

STEADY_CASES = [
    ("the docstring's example", W(64, 2000, 200, 0.75)),
    ("no shared prefix, long outputs", W(128, 512, 1024)),
    ("one output token per request", W(8, 300, 1, 0.2)),
    ("a chunk of 156.25 tokens", W(10, 1000, 64)),
    ("a chunk of exactly 2.5 tokens", W(5, 100, 200)),
    ("a chunk of 178.57 tokens", W(10, 1000, 56)),
    ("an output length of 4k + 3 (half of it ends in .5)", W(16, 1000, 203, 0.25)),
]


def _random_workload(rng) -> dict:
    model, chip = rng.choice(MODELS), rng.choice(CHIPS)
    conc = rng.choice([1, 4, 16, 48, 128, 256, 512, 1024])
    prompt, output = rng.choice([64, 300, 1000, 4000]), rng.choice([16, 64, 256, 1000])
    share = rng.choice([0.0, 0.0, 0.3, 0.5, 0.9])
    w = W(conc, prompt, output, share, model=model, chip=chip, tp=_tp(rng, model),
          features=rng.choice([(), (), ("multi_vendor",), ("fast_model_turnover",)]))
    s = _steady(w)
    d = _step(model, chip, s["batch"], s["context"], s["chunk"], s["chunk_context"], tp=w["tp"]).time_s
    w["host_overhead_s"] = rng.choice([0.0, 0.3e-3, d * rng.uniform(0.5, 2.0)])
    w["tpot_slo_s"] = rng.choice([None, None, d * rng.uniform(0.5, 1.5)])
    return w


@check(points=2, section="3.1")
def steady_step(t):
    """The steady step: concurrency decodes at the mean context, the uncached prefill of the requests starting."""
    for label, fields in t.cases(STEADY_CASES, _random_workload, n=3):
        with t.case(f"{label}: {_describe(fields)}"):
            expected = t.reference(_ref_steady, fields)
            got = t.call("steady_step", Record("Workload", dict(fields)))
            t.expect_dict(got, expected, "the steady step", keys=("batch", "context", "chunk", "chunk_context"),
                          mistakes={name: _steady(fields, **m) for name, m in STEADY_MISTAKES.items()})


# -- 3.2 recommend -------------------------------------------------------------------------------------

def _ref_recommend(ref, fields: dict) -> dict:
    return _flat(ref.recommend(ref.Workload(**fields)))


def _flat(r) -> dict:
    """A Recommendation (namedtuple) as one flat dict, the reversal's fields prefixed."""
    rev = r[3]
    return {"engine": r[0], "row": r[1], "regime": r[2], "reversal.field": rev[0], "reversal.op": rev[1],
            "reversal.value": rev[2], "reversal.engine": rev[3]}


@answer_code
def _device(f) -> float:
    """The device time of a workload's steady step, as the lesson defines it."""
    s = _steady(f)
    return _step(f["model"], f["chip"], s["batch"], s["context"], s["chunk"], s["chunk_context"], tp=f["tp"]).time_s


@answer_code
def _decide(f, slo_first=True, features=True, chunk=True, regime_one_gpu=False, prefix_row=False,
            overhead_engine=None, turnover=False) -> tuple:
    """(engine, row, regime) by the lesson's table, or with one of the usual mistakes put in: the SLO row
    after the others, feature fit ignored, the regime of the decodes alone or of one GPU, or a rule of
    older releases (a prefix row picking SGLang, the overhead row picking an engine, fast model turnover
    ruling TensorRT-LLM out)."""
    s = _steady(f)
    ck, cc = (s["chunk"], s["chunk_context"]) if chunk else (0, 0)
    d = _step(f["model"], f["chip"], s["batch"], s["context"], ck, cc, tp=f["tp"]).time_s
    r = _regime(f["model"], f["chip"], s["batch"], s["context"], f["host_overhead_s"], ck, cc, tp=f["tp"],
                one_gpu=regime_one_gpu)
    ruled_out = {"multi_vendor", "fast_model_turnover"} if turnover else {"multi_vendor"}
    trt_out = features and bool(set(f["features"]) & ruled_out)
    applies = {"slo": (None, f["tpot_slo_s"] is not None and d > f["tpot_slo_s"]),
               "prefix": ("SGLang", prefix_row and f["prefix_share"] >= 0.5),
               "overhead": (overhead_engine, r == "overhead"),
               "compute": ("TensorRT-LLM", r == "compute" and not trt_out)}
    order = ["slo", "prefix", "overhead", "compute"] if slo_first else ["prefix", "overhead", "compute", "slo"]
    for row in order:
        engine, hit = applies[row]
        if hit:
            return engine, row, r
    return "vLLM", "default", r


TABLE_MISTAKES = {
    "checks the regime before the SLO; when the kernels alone miss the SLO no engine meets it, whatever the "
    "regime": dict(slo_first=False),
    "picks SGLang for a prefix share >= 0.5, a rule of older releases; at the releases the table describes "
    "every engine reuses a cached prefix by default, and the steady step already counts the reuse":
        dict(prefix_row=True),
    "picks SGLang for an overhead-bound step, a rule of older releases; every engine now overlaps the host "
    "with the device, so the engine does not decide (None)": dict(overhead_engine="SGLang"),
    "rules TensorRT-LLM out for fast_model_turnover; since 1.0 it loads a Hugging Face checkpoint with no "
    "engine build, so only the needs in EXCLUDES (multi_vendor) rule it out": dict(turnover=True),
    "ignores feature fit: an engine a needed feature rules out (EXCLUDES) cannot be picked": dict(features=False),
    "reads the regime of the decodes alone; the steady step holds the prefill chunk too": dict(chunk=False),
    "reads the regime on one GPU (tp left out of regime()); each GPU of the tensor-parallel group runs its shard":
        dict(regime_one_gpu=True),
}
SLO_STRICT = ("counts a batch whose step takes exactly the SLO as missing it; a step meets the SLO when its device "
              "time is at most (<=) tpot_slo_s")


@answer_code
def _slo_reversal(f, strict=False) -> tuple:
    """The slo row's reversal (value, engine after it) by a linear scan; strict: a tie misses the SLO."""
    def meets(b):
        d = _device({**f, "concurrency": b})
        return d < f["tpot_slo_s"] if strict else d <= f["tpot_slo_s"]
    b = next((b for b in range(f["concurrency"] - 1, 0, -1) if meets(b)), 0)
    if b:
        return "concurrency", "<=", b, _decide({**f, "concurrency": b})[0]
    d = _device(f)
    return "tpot_slo_s", ">=", d, _decide({**f, "tpot_slo_s": d})[0]

def recommend_cases() -> list:
    """The visible cases (built when a check runs: the last one's SLO is a modeled step time)."""
    return [
    ("memory-bound decode, nothing shared", W(32, 1000, 300)),
    ("the docstring's example: a shared prefix", W(32, 1000, 300, 0.8)),
    ("a slow host at a small batch", W(8, 500, 200, host=0.02)),
    ("70B at a large batch", W(512, 200, 500, model="llama-3-70b")),
    ("70B at a large batch, on a mixed fleet", W(512, 200, 500, model="llama-3-70b", features=("multi_vendor",))),
    ("70B at a large batch, models change every week", W(512, 200, 500, model="llama-3-70b",
                                                          features=("fast_model_turnover",))),
    ("a TPOT SLO a smaller batch meets", W(256, 1000, 300, tpot_slo_s=0.01)),
    ("a TPOT SLO no batch meets", W(256, 1000, 300, tpot_slo_s=0.001)),
    ("a shared prefix and an SLO no batch meets", W(64, 2000, 200, 0.9, tpot_slo_s=0.003)),
    ("a shared prefix on a compute-bound step", W(512, 200, 500, 0.6, model="llama-3-70b")),
    ("compute-bound only with the prefill chunk", W(64, 4000, 64, model="llama-3-70b", chip="A100")),
    ("a shared prefix and a slow host", W(8, 500, 200, 0.6, host=0.02)),
    ("a slow host and an SLO the kernels miss", W(8, 500, 200, host=0.02, tpot_slo_s=0.004)),
    ("70B over 4 GPUs, a host between the shard's kernel time and the whole model's",
     W(64, 500, 200, model="llama-3-70b", host=0.04)),
    ("an SLO exactly batch 100's step time", W(256, 1000, 300, tpot_slo_s=_device(W(100, 1000, 300)))),
    ]


def _ref_upstream(ref, fields: dict) -> tuple:
    """What recommend() builds on, by the reference: the steady step, and the regime() call on it."""
    st = ref.steady_step(ref.Workload(**fields))
    args = (fields["model"], fields["chip"], st["batch"], st["context"], fields["host_overhead_s"], st["chunk"],
            st["chunk_context"], fields["tp"])
    return st, list(args), ref.regime(*args)


def blame_upstream(t, fields: dict, upstream: tuple) -> None:
    """Asked once recommend() is wrong: steady_step() or regime(), which the table is built on, giving another
    answer on this very workload (or raising) fails the case naming that function (t.blame_upstream)."""
    st, args, r = upstream
    t.blame_upstream("recommend", "steady_step", [((Record("Workload", dict(fields)),), st)], rtol=1e-9,
                     shown="this workload")
    t.blame_upstream("recommend", "regime", [(tuple(args), r)], rtol=1e-9)


@check(points=5, section="3.2")
def recommend(t):
    """The decision table's engine, row and regime, and the reversal (field, op, value and the engine after it)."""
    from autograder.compare import compare

    keys = ("engine", "row", "regime", "reversal.field", "reversal.op", "reversal.value", "reversal.engine")
    for label, fields in t.cases(recommend_cases(), _random_workload, n=6):
        with t.case(f"{label}: {_describe(fields)}"):
            expected = t.reference(_ref_recommend, fields)
            upstream = t.reference(_ref_upstream, fields)
            got = t.call("recommend", Record("Workload", dict(fields)))
            t.expect_true(isinstance(got, tuple) and len(got) == 4 and isinstance(got[3], tuple) and len(got[3]) == 4,
                          f"recommend should return a Recommendation(engine, row, regime, reversal) whose reversal is "
                          f"a Reversal(field, op, value, engine); got {got!r}")
            mistakes = {}
            for name, m in TABLE_MISTAKES.items():
                engine, row, r = _decide(fields, **m)
                mistakes[name] = {**expected, "engine": engine, "row": row, "regime": r}
            if expected["row"] == "slo":
                rev = _slo_reversal(fields, strict=True)
                mistakes[SLO_STRICT] = {**expected, **dict(zip(("reversal.field", "reversal.op", "reversal.value",
                                                               "reversal.engine"), rev))}
            if compare({k: _flat(got)[k] for k in keys}, {k: expected[k] for k in keys}, 1e-9, None) is not None:
                blame_upstream(t, fields, upstream)
            t.expect_dict(_flat(got), expected, "the recommendation", rtol=1e-9, mistakes=mistakes, keys=keys)
