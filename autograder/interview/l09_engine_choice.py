"""Lesson 09 questions: the host share of a step, overlap, the overhead-bound batch, the steady step, the batch
an SLO allows, goodput at an SLO, and the engine for a workload."""
from __future__ import annotations

from .pools import pick
from .question import Numeric, Open, fmt, template

STEM = "l09_engine_choice"
MODELS = {"llama-3-8b": "Llama-3-8B", "llama-3-70b": "Llama-3-70B"}
CHIPS = ["A100", "H100", "H200"]


TP = {"llama-3-8b": 1, "llama-3-70b": 4}  # GPUs per replica: 70B's bf16 weights do not fit in one 80 GB GPU


def _where(model: str, chip: str) -> str:
    gpus = "one" if TP[model] == 1 else f"{TP[model]} tensor-parallel"
    return (f"{MODELS[model]} in bf16 on {gpus} {chip}{'s' if TP[model] > 1 else ''} (the course's modeled clock: "
            "roofline kernels at achievable fractions)")


@template(STEM, "host share of a run")
def host_share(rng, ref):
    n_fast, n_slow = pick(rng, [40, 60, 90]), pick(rng, [2, 4, 6])
    fast_wall = pick(rng, [4.0, 6.0, 8.0])
    fast_fwd = fast_wall * pick(rng, [0.5, 0.6, 0.7])
    slow_wall = pick(rng, [40.0, 60.0, 80.0])
    slow_fwd = slow_wall * pick(rng, [0.85, 0.9, 0.95])
    steps = ([{"wall_time": fast_wall / 1e3, "forward_time": fast_fwd / 1e3}] * n_fast
             + [{"wall_time": slow_wall / 1e3, "forward_time": slow_fwd / 1e3}] * n_slow)
    s = ref.step_split(steps)
    per_step = (n_fast * (1 - fast_fwd / fast_wall) + n_slow * (1 - slow_fwd / slow_wall)) / (n_fast + n_slow)
    overlapped = n_fast * max(fast_fwd, fast_wall - fast_fwd) + n_slow * max(slow_fwd, slow_wall - slow_fwd)
    q = Numeric(
        f"A run has {n_fast} decode steps of {fast_wall:g} ms wall time with {fmt(fast_fwd)} ms of forward each, and "
        f"{n_slow} prefill steps of {slow_wall:g} ms with {fmt(slow_fwd)} ms of forward. What percentage of the run's "
        "time is host work (not the forward)?", "%", 100 * s["host_fraction"],
        [f"host time: {n_fast} x {fmt(fast_wall - fast_fwd)} + {n_slow} x {fmt(slow_wall - slow_fwd)} = "
         f"{fmt(s['host_s'] * 1e3)} ms", f"wall time: {fmt(s['wall_s'] * 1e3)} ms",
         f"host share = {fmt(100 * s['host_fraction'])}%"],
        "The share of the run is a ratio of sums: long steps weigh what they cost.", rtol=0.01,
        mistakes={"averages the per-step host fractions": 100 * per_step,
                  "divides host time by forward time": 100 * s["host_s"] / s["forward_s"]})
    q.follow_ups.append(Numeric(
        "An engine that prepares each step while the previous one runs hides the shorter of host and forward in "
        "every step. How much faster would this run be (x)?", "x", s["wall_s"] * 1e3 / overlapped,
        [f"each step now takes max(host, forward): {n_fast} x {fmt(max(fast_fwd, fast_wall - fast_fwd))} + {n_slow} x "
         f"{fmt(max(slow_fwd, slow_wall - slow_fwd))} = {fmt(overlapped)} ms", f"{fmt(s['wall_s'] * 1e3)} / "
         f"{fmt(overlapped)} = {fmt(s['wall_s'] * 1e3 / overlapped)}x"],
        "Overlap can hide host work only behind a forward at least as long.", rtol=0.01))
    return q


@template(STEM, "modeled decode step")
def decode_step(rng, ref):
    model, chip = pick(rng, list(MODELS)), pick(rng, CHIPS)
    batch, context = pick(rng, [1, 8, 32, 64]), pick(rng, [512, 1024, 2048])
    d = ref.device_time(model, chip, batch, context, tp=TP[model])
    h = pick(rng, [2.0, 4.0, 8.0]) * (d * 1e3) / 4
    q = Numeric(
        f"{_where(model, chip)}: a decode step of {batch} sequences at {context:,} tokens of context each. How many "
        "ms of kernels?", "ms", d * 1e3,
        ["weights read once per step, plus each sequence's KV cache, at the achievable bandwidth; FLOPs are small "
         "at this batch", f"the modeled clock gives {fmt(d * 1e3)} ms"],
        "Small-batch decode is a weight read: the batch hardly changes it.", rtol=0.03,
        mistakes={"uses the datasheet bandwidth and TFLOP/s, not what kernels reach":
                  ref.gm.step_time(ref.gm.MODELS[model], ref.gm.CHIPS[chip].at_peak(),
                                   ref.gm.Composition.decode_batch(batch, context), tp=TP[model],
                                   overhead_s=0.0).time_s * 1e3})
    serial, overlapped = h + d * 1e3, max(h, d * 1e3)
    q.follow_ups.append(Numeric(
        f"The host needs {fmt(h)} ms per step. Tokens per second gain from hiding the host work behind the previous "
        "step's kernels (an overlapping scheduler), versus doing it in between (x)?", "x", serial / overlapped,
        [f"serial: host + kernels = {fmt(serial)} ms", f"overlapped: max(host, kernels) = {fmt(overlapped)} ms",
         f"gain {fmt(serial / overlapped)}x"],
        "Overlap hides the smaller of the two: the gain is largest (2x) when host and kernels take the same time.",
        rtol=0.02, mistakes={"divides the step by the host time alone": serial / h}))
    return q


@template(STEM, "overhead-bound batch")
def overhead_batch(rng, ref):
    model, chip, context = "llama-3-8b", pick(rng, CHIPS), pick(rng, [256, 512, 1024, 2048])
    d1 = ref.device_time(model, chip, 1, context)
    h = round(d1 * 1e3 * pick(rng, [1.2, 1.5, 2.0, 3.0]), 1) / 1e3
    b = ref.overhead_bound_batch(model, chip, context, h)
    db = ref.device_time(model, chip, b, context)
    q = Numeric(
        f"{_where(model, chip)}, decoding at {context:,} tokens of context. The host needs {fmt(h * 1e3)} ms per step. "
        "From which batch size on do the kernels, not the host, set the step time?", "sequences", b,
        [f"batch 1: {fmt(d1 * 1e3)} ms of kernels, below the host's {fmt(h * 1e3)} ms",
         "each extra sequence adds its KV read (and a little GEMM work)",
         f"batch {b}: {fmt(db * 1e3)} ms >= {fmt(h * 1e3)} ms; every smaller batch is overhead-bound"],
        "Below that batch the GPU waits for Python: a faster scheduler helps more than any kernel.",
        rtol=0.0, mistakes={"gives the last overhead-bound batch": b - 1})
    h2 = h * 1.5
    b2 = ref.overhead_bound_batch(model, chip, context, h2)
    q.follow_ups.append(Numeric(
        f"The host gets slower: {fmt(h2 * 1e3)} ms per step (more Python per step, say). From which batch on now?",
        "sequences", b2, [f"the first batch with at least {fmt(h2 * 1e3)} ms of kernels: {b2}"],
        "A slower host pushes the overhead-bound region to larger batches; the kernels do not change.", rtol=0.0))
    return q


@template(STEM, "steady prefill chunk")
def steady_chunk(rng, ref):
    conc, prompt, output = pick(rng, [32, 64, 128, 256]), pick(rng, [1000, 2000, 4000]), pick(rng, [100, 200, 500])
    share = pick(rng, [0.0, 0.5, 0.8, 0.9])
    s = ref.steady_step(ref.Workload(conc, prompt, output, share))
    s0 = ref.steady_step(ref.Workload(conc, prompt, output, 0.0 if share else 0.9))
    q = Numeric(
        f"{conc} sequences decode at once; each request has a {prompt:,}-token prompt, of which {share:.0%} is a cached "
        f"prefix, and generates {output} tokens. With chunked prefill, how many prefill tokens does a steady-state "
        "step compute?", "tokens", s["chunk"],
        [f"a sequence finishes every {output} steps: {conc} / {output} = {fmt(conc / output)} new requests per step",
         f"each brings {prompt:,} x (1 - {share:g}) = {fmt(prompt * (1 - share))} uncached tokens",
         f"{fmt(conc / output)} x {fmt(prompt * (1 - share))} = {s['chunk']} tokens per step"],
        "Prefix reuse removes prefill work from every step: it moves the workload down the roofline.", rtol=0.01,
        mistakes={"prefills the whole prompt": round(conc * prompt / output),
                  "starts one request per step": round(prompt * (1 - share))})
    q.follow_ups.append(Numeric(
        f"Now {'no' if share else '90% of each'} prompt is a cached prefix: prefill tokens per step?", "tokens",
        s0["chunk"], [f"{fmt(conc / output)} requests per step x {fmt(prompt * (1 - (0.0 if share else 0.9)))} "
                      f"uncached tokens = {s0['chunk']}"],
        "The chunk scales with the uncached share of each prompt.", rtol=0.01))
    return q


@template(STEM, "batch an SLO allows")
def slo_batch(rng, ref):
    model, chip = pick(rng, list(MODELS)), pick(rng, CHIPS)
    conc, prompt, output = pick(rng, [128, 256, 512]), pick(rng, [500, 1000, 2000]), pick(rng, [200, 500])

    def kernels(batch: int) -> float:
        s = ref.steady_step(ref.Workload(batch, prompt, output, model=model, chip=chip, tp=TP[model]))
        return ref.device_time(model, chip, s["batch"], s["context"], s["chunk"], s["chunk_context"], TP[model])
    d, d1 = kernels(conc), kernels(1)
    slo = d1 + (d - d1) * pick(rng, [0.3, 0.5, 0.7])  # met at batch 1, missed at the full concurrency
    r = ref.recommend(ref.Workload(conc, prompt, output, tpot_slo_s=slo, model=model, chip=chip, tp=TP[model]))
    b = r.reversal.value
    slo2 = slo + (d - slo) / 2  # looser, still missed at the full concurrency
    b2 = max(x for x in range(b, conc + 1) if kernels(x) <= slo2) if kernels(b) <= slo2 else b
    q = Numeric(
        f"{_where(model, chip)}; {prompt:,}-token prompts, {output}-token outputs, chunked prefill, {conc} concurrent "
        f"sequences: the steady step's kernels take {fmt(d * 1e3)} ms. The TPOT target is {fmt(slo * 1e3)} ms. What "
        "is the largest concurrency per replica that meets it, whichever engine you pick?", "sequences", b,
        ["no engine beats its kernels: the SLO caps the batch, not the engine choice",
         "the steady step at batch b holds b decodes and b / output requests' prefill",
         f"bisect on b: batch {b} meets {fmt(slo * 1e3)} ms, batch {b + 1} does not"],
        "When the kernels alone miss the SLO, the lever is the batch (or more GPUs), not the engine.", rtol=0.0,
        mistakes={"gives the smallest batch that misses the SLO": b + 1})
    q.follow_ups.append(Numeric(
        f"The target loosens to {fmt(slo2 * 1e3)} ms: the largest concurrency now?", "sequences", b2,
        [f"the largest batch whose steady step takes at most {fmt(slo2 * 1e3)} ms: {b2}"],
        "The SLO sets the batch; the batch sets the cost per token.", rtol=0.0))
    return q


@template(STEM, "goodput at an SLO")
def goodput(rng, ref):
    rps_a, rps_b = pick(rng, [40, 48, 60]), pick(rng, [32, 36, 40])
    ok_a, ok_b = pick(rng, [0.55, 0.62, 0.70]), pick(rng, [0.90, 0.94, 0.97])
    slo = pick(rng, ["TTFT <= 500 ms and TPOT <= 50 ms", "TTFT <= 1 s and TPOT <= 40 ms"])
    g_a, g_b = rps_a * ok_a, rps_b * ok_b
    q = Numeric(
        f"A benchmark at your SLO ({slo}) on your own prompts: engine A completes {rps_a} requests/s, of which "
        f"{ok_a:.0%} meet both targets; engine B completes {rps_b} requests/s, of which {ok_b:.0%} meet them. What is "
        "B's goodput divided by A's (x)?", "x", g_b / g_a,
        ["goodput = completed requests/s that meet both targets (DistServe, OSDI 2024)",
         f"A: {rps_a} x {ok_a:g} = {fmt(g_a)} req/s; B: {rps_b} x {ok_b:g} = {fmt(g_b)} req/s",
         f"{fmt(g_b)} / {fmt(g_a)} = {fmt(g_b / g_a)}x"],
        "Peak throughput ranks engines by what they push, goodput by what users get within the target.",
        rtol=0.01, mistakes={"compares peak throughput": rps_b / rps_a,
                             "compares the attainment alone": ok_b / ok_a})
    need = ok_a * rps_a / ok_b
    q.follow_ups.append(Numeric(
        f"At what completed rate would B match A's goodput, with its attainment unchanged ({ok_b:.0%})?", "req/s", need,
        [f"A's goodput {fmt(g_a)} req/s / {ok_b:g} = {fmt(need)} req/s"],
        "Goodput trades rate for attainment: compare at the rate each can hold while meeting the SLO.", rtol=0.01,
        mistakes={"uses A's attainment": g_a / ok_a}))
    return q


@template(STEM, "engine for a workload")
def which_engine(rng, ref):
    return Open(
        "You serve Llama-3-70B on H100s: a support chatbot with a 3,000-token shared system prompt, 200 concurrent users "
        "and a 50 ms TPOT target. vLLM, SGLang or TensorRT-LLM? Say which releases your answer holds for, and what would "
        "change it.",
        ["name the releases (say vLLM v0.11, SGLang v0.5, TensorRT-LLM 1.0): engine comparisons age with every release",
         "feature fit first: hardware (TensorRT-LLM is NVIDIA-only; SGLang and vLLM also run on AMD, TPU and more), "
         "and the features that still separate engines: MoE expert parallelism, prefill/decode disaggregation, "
         "EAGLE-3 or MTP speculative decoding, FP4, many LoRA adapters; check each in the release you deploy",
         "check the SLO against the kernels at this batch (modeled or measured): if the kernels alone miss it, no "
         "engine fixes it; lower the batch per replica or add GPUs",
         "the shared prompt picks no engine: all three reuse cached prefixes by default (vLLM's automatic prefix "
         "caching, SGLang's radix cache, TensorRT-LLM's block reuse); it lowers the prefill work for any of them",
         "an overhead-bound step picks no engine either: all three overlap the host with the device (vLLM's async "
         "scheduling, SGLang's and TensorRT-LLM's overlap schedulers); what is left is the host's own work",
         "compute-bound on NVIDIA: TensorRT-LLM's own kernels, no engine build since 1.0",
         "decide on goodput at the SLO (requests/s meeting TTFT and TPOT) on your own traffic, not peak throughput; "
         "re-run when a reversal condition moves (the batch, the host, the fleet's hardware, a new release)"],
        "The three engines share one roofline and, at current releases, most of their core; pick by fit and by goodput "
        "at your SLO, and name what would move the answer.")
