"""Plausible wrong answers for lesson 09, each caught by its check with the mistake named."""
import dataclasses
import math
import statistics

from reference_engine.sim import gpu_model as gm
from solutions.l09_engine_choice import MAX_BATCH, Recommendation, Reversal, device_time, steady_step
from tests.mutants import mutant


def _m_split(steps, fraction="host/wall", keep_none=False):
    ran = [s for s in steps if keep_none or s["forward_time"] is not None]
    wall = sum(s["wall_time"] for s in ran)
    fwd = sum(s["forward_time"] or 0.0 for s in ran)
    host = wall - fwd
    frac = {"host/wall": host / wall, "host/forward": host / fwd,
            "mean": statistics.fmean(1 - (s["forward_time"] or 0.0) / s["wall_time"] for s in ran)}[fraction]
    return {"steps": len(ran), "wall_s": wall, "forward_s": fwd, "host_s": host, "host_fraction": frac}


# ---------------------------------------------------------------- 1.1 step_split

@mutant(check="step_split", message="divides the host time by the forward time")
def step_split(steps):
    return _m_split(steps, fraction="host/forward")


@mutant(check="step_split", message="averages the per-step host fractions")
def step_split(steps):  # noqa: F811
    return _m_split(steps, fraction="mean")


@mutant(check="step_split", message="counts a step without a forward (forward_time None) as host time")
def step_split(steps):  # noqa: F811
    return _m_split(steps, keep_none=True)


@mutant(check="step_split", message="instead of raising ValueError")
def step_split(steps):  # noqa: F811
    ran = [s for s in steps if s["forward_time"] is not None]
    if not ran:
        return {"steps": 0, "wall_s": 0.0, "forward_s": 0.0, "host_s": 0.0, "host_fraction": 0.0}
    return sol.step_split(steps)  # noqa: F821 - bound when the mutant is graded


# ---------------------------------------------------------------- 1.2 split_by_batch

def _m_by_batch(steps, mixed=False, agg=statistics.median, key="num_decode_seqs"):
    groups = {}
    for s in steps:
        if s["forward_time"] is not None and (mixed or s["num_prefill_tokens"] == 0):
            groups.setdefault(s[key], []).append(s)
    return {b: {"n": len(g), "host_s": agg([s["wall_time"] - s["forward_time"] for s in g]),
                "forward_s": agg([s["forward_time"] for s in g])} for b, g in sorted(groups.items())}


@mutant(check="split_by_batch", message="keeps steps that also prefilled")
def split_by_batch(steps):
    return _m_by_batch(steps, mixed=True)


@mutant(check="split_by_batch", message="takes means, not medians")
def split_by_batch(steps):  # noqa: F811
    return _m_by_batch(steps, agg=statistics.fmean)


@mutant(check="split_by_batch", message="groups by num_running")
def split_by_batch(steps):  # noqa: F811
    return _m_by_batch(steps, key="num_running")


# ---------------------------------------------------------------- 2.1 regime

def _m_regime(model, chip, batch, context, host, chunk=0, chunk_context=0, tp=1, overhead_s=0.0, peak=False,
              gemm_only=False):
    c = gm.CHIPS[chip].at_peak() if peak else gm.CHIPS[chip]
    st = gm.step_time(gm.MODELS[model], c, gm.Composition.decode_batch(batch, context, chunk, chunk_context),
                      tp=tp, overhead_s=overhead_s)
    if host > st.time_s:
        return "overhead"
    if gemm_only:
        return st.bound("gemm")
    compute = sum(k.time_s for k in st.kernels if k.bound == "compute")
    return "compute" if compute > st.time_s / 2 else "memory"


@mutant(check="regime", message="adds gpu_model's default per-step overhead")
def regime(model, chip, batch, context, host_overhead_s, chunk=0, chunk_context=0, tp=1):
    return _m_regime(model, chip, batch, context, host_overhead_s, chunk, chunk_context, tp, overhead_s=gm.STEP_OVERHEAD_S)


@mutant(check="regime", message="uses the datasheet peaks")
def regime(model, chip, batch, context, host_overhead_s, chunk=0, chunk_context=0, tp=1):  # noqa: F811
    return _m_regime(model, chip, batch, context, host_overhead_s, chunk, chunk_context, tp, peak=True)


@mutant(check="regime", message="classifies by the weight GEMMs' bound alone")
def regime(model, chip, batch, context, host_overhead_s, chunk=0, chunk_context=0, tp=1):  # noqa: F811
    return _m_regime(model, chip, batch, context, host_overhead_s, chunk, chunk_context, tp, gemm_only=True)


# ---------------------------------------------------------------- 2.2 overhead_bound_batch

@mutant(check="overhead_bound_batch", message="returns the last overhead-bound batch")
def overhead_bound_batch(model, chip, context, host_overhead_s, max_batch=MAX_BATCH):
    b = sol.overhead_bound_batch(model, chip, context, host_overhead_s, max_batch)  # noqa: F821
    return b if b is None or b == 1 else b - 1


@mutant(check="overhead_bound_batch", message="adds gpu_model's default per-step overhead")
def overhead_bound_batch(model, chip, context, host_overhead_s, max_batch=MAX_BATCH):  # noqa: F811
    for b in range(1, max_batch + 1):
        if device_time(model, chip, b, context) + gm.STEP_OVERHEAD_S >= host_overhead_s:
            return b
    return None


@mutant(check="overhead_bound_batch", message="uses the datasheet peaks")
def overhead_bound_batch(model, chip, context, host_overhead_s, max_batch=MAX_BATCH):  # noqa: F811
    c = gm.CHIPS[chip].at_peak()
    for b in range(1, max_batch + 1):
        if gm.step_time(gm.MODELS[model], c, gm.Composition.decode_batch(b, context), overhead_s=0.0).time_s >= host_overhead_s:
            return b
    return None


# ---------------------------------------------------------------- 3.1 steady_step

@mutant(check="steady_step", message="prefills the whole prompt")
def steady_step(w):
    return {"batch": w.concurrency, "context": w.prompt_tokens + w.output_tokens // 2,
            "chunk": round(w.concurrency * w.prompt_tokens / w.output_tokens),
            "chunk_context": round(w.prompt_tokens * w.prefix_share)}


@mutant(check="steady_step", message="uses the context at the end of a request")
def steady_step(w):  # noqa: F811
    return {**sol.steady_step(w), "context": w.prompt_tokens + w.output_tokens}  # noqa: F821


@mutant(check="steady_step", message="starts one request per step")
def steady_step(w):  # noqa: F811
    return {**sol.steady_step(w), "chunk": round(w.prompt_tokens * (1 - w.prefix_share))}  # noqa: F821


# ---------------------------------------------------------------- 3.2 recommend

def _m_recommend(w, order=("slo", "prefix", "overhead", "compute"), features=True, chunk=True, one_gpu=False,
                 prefix_engine=None, overhead_engine=None, turnover=False):
    s = steady_step(w)
    ck, cc = (s["chunk"], s["chunk_context"]) if chunk else (0, 0)
    d = device_time(w.model, w.chip, s["batch"], s["context"], ck, cc, w.tp)
    r = sol.regime(w.model, w.chip, s["batch"], s["context"], w.host_overhead_s, ck, cc,  # noqa: F821
                   1 if one_gpu else w.tp)
    ruled_out = {"multi_vendor", "fast_model_turnover"} if turnover else {"multi_vendor"}
    out = bool(features and ruled_out & set(w.features))
    rows = {"slo": (None, w.tpot_slo_s is not None and d > w.tpot_slo_s),
            "prefix": (prefix_engine, prefix_engine is not None and w.prefix_share >= 0.5),
            "overhead": (overhead_engine, r == "overhead"),
            "compute": ("TensorRT-LLM", r == "compute" and not out)}
    right = sol.recommend(w)  # noqa: F821 - the reversal as the reference gives it; the decision is wrong
    for row in order:
        if rows[row][1]:
            return Recommendation(rows[row][0], row, r, right.reversal)
    return Recommendation("vLLM", "default", r, right.reversal)


@mutant(check="recommend", message="picks SGLang for a prefix share >= 0.5")
def recommend(w):
    """The table of older releases: a shared prefix of half the prompt or more picks SGLang."""
    return _m_recommend(w, prefix_engine="SGLang")


@mutant(check="recommend", message="picks SGLang for an overhead-bound step")
def recommend(w):  # noqa: F811
    return _m_recommend(w, overhead_engine="SGLang")


@mutant(check="recommend", message="rules TensorRT-LLM out for fast_model_turnover")
def recommend(w):  # noqa: F811
    return _m_recommend(w, turnover=True)


@mutant(check="recommend", message="ignores feature fit")
def recommend(w):  # noqa: F811
    return _m_recommend(w, features=False)


@mutant(check="recommend", message="reads the regime of the decodes alone")
def recommend(w):  # noqa: F811
    return _m_recommend(w, chunk=False)


@mutant(check="recommend", message="reversal.value")
def recommend(w):  # noqa: F811
    """The slo row's reversal at the smallest batch that misses the SLO, not the largest that meets it."""
    r = sol.recommend(w)  # noqa: F821
    if r.row == "slo" and r.reversal.field == "concurrency":
        v = r.reversal.value + 1
        return r._replace(reversal=Reversal("concurrency", "<=", v, r.reversal.engine))
    return r


@mutant(check="recommend", message="reversal.engine")
def recommend(w):  # noqa: F811
    """The default row's reversal engine read with the host set to the kernel time itself (not yet above it)."""
    r = sol.recommend(w)  # noqa: F821
    if r.row == "default":
        then = sol.recommend(dataclasses.replace(w, host_overhead_s=r.reversal.value)).engine  # noqa: F821
        return r._replace(reversal=r.reversal._replace(engine=then))
    return r


@mutant(check="recommend", message="recommend depends on steady_step, which fails here")
def steady_step(w):  # noqa: F811
    """A wrong steady step (the context at the end of a request): recommend() is right, its input is not."""
    return {**sol.steady_step(w), "context": w.prompt_tokens + w.output_tokens}  # noqa: F821


# ---------------------------------------------------------------- wrong answers an earlier version of the checks missed

@mutant(check="step_split", message="drops steps whose forward_time is 0.0")
def step_split(steps):  # noqa: F811
    return sol.step_split([s for s in steps if s["forward_time"]] or steps)  # noqa: F821


@mutant(check="split_by_batch", message="lists the batch sizes in the order they first appear")
def split_by_batch(steps):  # noqa: F811
    right = sol.split_by_batch(steps)  # noqa: F821
    order = [s["num_decode_seqs"] for s in steps if s["forward_time"] is not None and s["num_prefill_tokens"] == 0]
    return {b: right[b] for b in dict.fromkeys(order)}


@mutant(check="split_by_batch", message="treats a step with 1 prefill token as pure decode")
def split_by_batch(steps):  # noqa: F811
    return sol.split_by_batch([{**s, "num_prefill_tokens": 0} if s["num_prefill_tokens"] <= 1 else s  # noqa: F821
                               for s in steps])


@mutant(check="split_by_batch", message="subtracts the median forward time from the median wall time")
def split_by_batch(steps):  # noqa: F811
    out = sol.split_by_batch(steps)  # noqa: F821
    for b, v in out.items():
        g = [s for s in steps if s["forward_time"] is not None and s["num_prefill_tokens"] == 0
             and s["num_decode_seqs"] == b]
        v["host_s"] = statistics.median(s["wall_time"] for s in g) - statistics.median(s["forward_time"] for s in g)
    return out


def _m_kernels(model, chip, batch, context, chunk, chunk_context, tp):
    comp = gm.Composition.decode_batch(batch, context, chunk, chunk_context)
    return gm.step_time(gm.MODELS[model], gm.CHIPS[chip], comp, tp=tp, overhead_s=0.0)


@mutant(check="regime", message="counts a tie (host == device time) as overhead")
def regime(model, chip, batch, context, host_overhead_s, chunk=0, chunk_context=0, tp=1):  # noqa: F811
    st = _m_kernels(model, chip, batch, context, chunk, chunk_context, tp)
    return "overhead" if host_overhead_s >= st.time_s else sol.regime(model, chip, batch, context, 0.0,  # noqa: F821
                                                                       chunk, chunk_context, tp)


@mutant(check="regime", message="takes the bound of the single longest kernel")
def regime(model, chip, batch, context, host_overhead_s, chunk=0, chunk_context=0, tp=1):  # noqa: F811
    st = _m_kernels(model, chip, batch, context, chunk, chunk_context, tp)
    return "overhead" if host_overhead_s > st.time_s else max(st.kernels, key=lambda k: k.time_s).bound


@mutant(check="regime", message="compares the sums of the compute and memory roofline terms")
def regime(model, chip, batch, context, host_overhead_s, chunk=0, chunk_context=0, tp=1):  # noqa: F811
    st = _m_kernels(model, chip, batch, context, chunk, chunk_context, tp)
    if host_overhead_s > st.time_s:
        return "overhead"
    return "compute" if sum(k.compute_s for k in st.kernels) > sum(k.memory_s for k in st.kernels) else "memory"


@mutant(check="regime", message="leaving the all-reduces out")
def regime(model, chip, batch, context, host_overhead_s, chunk=0, chunk_context=0, tp=1):  # noqa: F811
    st = _m_kernels(model, chip, batch, context, chunk, chunk_context, tp)
    if host_overhead_s > st.time_s:
        return "overhead"
    compute = sum(k.time_s for k in st.kernels if k.bound == "compute")
    return "compute" if compute > sum(k.time_s for k in st.kernels if k.bound == "memory") else "memory"


@mutant(check="regime", message="counts kernels, not their time")
def regime(model, chip, batch, context, host_overhead_s, chunk=0, chunk_context=0, tp=1):  # noqa: F811
    st = _m_kernels(model, chip, batch, context, chunk, chunk_context, tp)
    if host_overhead_s > st.time_s:
        return "overhead"
    return "compute" if sum(k.bound == "compute" for k in st.kernels) > len(st.kernels) / 2 else "memory"


@mutant(check="regime", message="models the step on one GPU (tp left out)")
def regime(model, chip, batch, context, host_overhead_s, chunk=0, chunk_context=0, tp=1):  # noqa: F811
    return sol.regime(model, chip, batch, context, host_overhead_s, chunk, chunk_context)  # noqa: F821


@mutant(check="overhead_bound_batch", message="counts a batch whose kernels take exactly the host time")
def overhead_bound_batch(model, chip, context, host_overhead_s, max_batch=MAX_BATCH):  # noqa: F811
    for b in range(1, max_batch + 1):
        if device_time(model, chip, b, context) > host_overhead_s:
            return b
    return None


@mutant(check="overhead_bound_batch", message="never tries max_batch itself")
def overhead_bound_batch(model, chip, context, host_overhead_s, max_batch=MAX_BATCH):  # noqa: F811
    return next((b for b in range(1, max_batch) if device_time(model, chip, b, context) >= host_overhead_s), None)


@mutant(check="overhead_bound_batch", message="bisects over 1 .. max_batch - 1")
def overhead_bound_batch(model, chip, context, host_overhead_s, max_batch=MAX_BATCH):  # noqa: F811
    b = sol.overhead_bound_batch(model, chip, context, host_overhead_s, max_batch)  # noqa: F821
    return max_batch - 1 if b == max_batch else b


@mutant(check="overhead_bound_batch", message="can return batch 0")
def overhead_bound_batch(model, chip, context, host_overhead_s, max_batch=MAX_BATCH):  # noqa: F811
    if device_time(model, chip, 0, context) >= host_overhead_s:
        return 0
    return sol.overhead_bound_batch(model, chip, context, host_overhead_s, max_batch)  # noqa: F821


@mutant(check="steady_step", message="truncates with int()")
def steady_step(w):  # noqa: F811
    return {"batch": w.concurrency, "context": w.prompt_tokens + w.output_tokens // 2,
            "chunk": int(w.concurrency * w.prompt_tokens * (1 - w.prefix_share) / w.output_tokens),
            "chunk_context": int(w.prompt_tokens * w.prefix_share)}


@mutant(check="steady_step", message="rounds halves up")
def steady_step(w):  # noqa: F811
    return {"batch": w.concurrency, "context": w.prompt_tokens + w.output_tokens // 2,
            "chunk": int(w.concurrency * w.prompt_tokens * (1 - w.prefix_share) / w.output_tokens + 0.5),
            "chunk_context": int(w.prompt_tokens * w.prefix_share + 0.5)}


@mutant(check="steady_step", message="rounds the chunk up (ceil)")
def steady_step(w):  # noqa: F811
    return {**sol.steady_step(w),  # noqa: F821
            "chunk": math.ceil(w.concurrency * w.prompt_tokens * (1 - w.prefix_share) / w.output_tokens)}


@mutant(check="steady_step", message="rounds half the output")
def steady_step(w):  # noqa: F811
    return {**sol.steady_step(w), "context": w.prompt_tokens + round(w.output_tokens / 2)}  # noqa: F821


@mutant(check="recommend", message="checks the regime before the SLO")
def recommend(w):  # noqa: F811
    """The SLO row last: an overhead- or compute-bound step is decided before the SLO is looked at."""
    return _m_recommend(w, order=("overhead", "compute", "slo"))


@mutant(check="recommend", message="reads the regime on one GPU")
def recommend(w):  # noqa: F811
    return _m_recommend(w, one_gpu=True)


@mutant(check="recommend", message="counts a batch whose step takes exactly the SLO as missing it")
def recommend(w):  # noqa: F811
    r = sol.recommend(w)  # noqa: F821
    if r.row == "slo" and r.reversal.field == "concurrency":
        s = steady_step(dataclasses.replace(w, concurrency=r.reversal.value))
        if device_time(w.model, w.chip, s["batch"], s["context"], s["chunk"], s["chunk_context"], w.tp) == w.tpot_slo_s:
            b = r.reversal.value - 1
            return r._replace(reversal=Reversal("concurrency", "<=", b,
                                                sol.recommend(dataclasses.replace(w, concurrency=b)).engine))  # noqa: F821
    return r
