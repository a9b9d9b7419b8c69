"""Replay an Azure-trace workload on this engine and on transformers' static batching.

    python -m reference_engine.tools.bench [--model reference_engine/checkpoints/target]
        [--trace conv|code] [--num-requests N] [--rate RPS] [--seed S] [--json FILE]

Workload: N consecutive requests from the Azure LLM inference trace 2023 (trace.sample), token
counts scaled into the model's context (trace.scale_to_context), arrivals rescaled to RPS
requests/s keeping the trace's burstiness (trace.with_rate; --rate inf = all at t = 0, offline).
Prompts are seeded random token ids of each request's length; decoding is greedy with EOS
ignored, so each request produces exactly its trace output length on both systems.

Both systems face the same arrival process, in the same process, with the same torch threads,
one after the other. Arrivals are replayed against a wall clock started just before each run:
  engine  requests enter through engine.add_request(arrival_time=...) once their arrival time has
          passed, between engine.step() calls (continuous batching, up to --max-batch running).
  hf      static batches of --max-batch requests in arrival order; a batch starts when the
          previous one has returned and its last member has arrived; prompts are padded left,
          max_new_tokens = the batch's longest output, outputs truncated per request.

Metrics (per request, from its arrival): TTFT = first output token time - arrival (for a static
batch: the batch's first decoding step, so it includes waiting for earlier batches);
TPOT = (latency - TTFT) / (output_tokens - 1) as in vLLM's benchmark; HF per-token times come
from a StoppingCriteria hook run after every decoding step, and a request counts as finished at
its own last useful token (generous to the baseline). Throughput = useful output tokens / wall
time from the start of the replay until the last request is done.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from reference_engine.shipped import TARGET
from reference_engine.sim import trace as tr


@dataclass
class Timing:
    """One request's result on one system; times are seconds on the replay clock."""
    arrival: float
    first_token: float
    finish: float
    output_tokens: int
    token_ids: list[int]

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.finish - self.arrival - self.ttft) / (self.output_tokens - 1)


# ----------------------------------------------------------------------------- workload


def build_workload(trace: str, n: int, rps: float, seed: int, max_context: int, vocab_size: int,
                   exclude: tuple[int, ...], output_factor: float | None = None
                   ) -> tuple[list[tr.Request], list[list[int]]]:
    reqs = tr.scale_to_context(tr.sample(n, seed, trace), max_context, output_factor=output_factor)
    reqs = tr.with_rate(reqs, rps)
    return reqs, tr.prompt_token_ids(reqs, vocab_size, seed, exclude=exclude)


def _sleep_until(clock_t0: float, t: float) -> None:
    dt = clock_t0 + t - time.perf_counter()
    if dt > 0:
        time.sleep(dt)


# ----------------------------------------------------------------------------- transformers


def load_hf(model_dir: str | Path, device: str = "cpu"):
    import transformers
    from transformers import AutoModelForCausalLM

    # a padded batch can run past max_position_embeddings in positions whose tokens are then
    # truncated away; silence the warning about it (useful tokens always fit)
    transformers.logging.set_verbosity_error()

    return AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True,
                                                dtype=torch.float32).to(device).eval()


def _hf_batch(model, prompts: list[list[int]], max_new: int, pad_id: int):
    """Left-padded greedy generate; returns (new tokens [B, max_new], time after each step)."""
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

    class StepClock(StoppingCriteria):  # called once per generated token; never stops
        def __init__(self):
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kw):
            if input_ids.is_cuda:  # the token must exist before its time is taken
                torch.cuda.synchronize(input_ids.device)
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    # eos_token_id=None: never stop early, like the engine's ignore_eos (min_new_tokens would
    # instead mask the EOS logit and change the greedy choice)
    cfg = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=None,
                           pad_token_id=pad_id, bos_token_id=None)
    clock = StepClock()
    ids, mask = ids.to(model.device), mask.to(model.device)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg,
                             stopping_criteria=StoppingCriteriaList([clock]))
    new = out[:, width:]
    assert new.shape[1] == max_new == len(clock.times), "generate stopped early"
    return new, clock.times


def run_hf(model, reqs: list[tr.Request], prompts: list[list[int]], max_batch: int,
           pad_id: int) -> tuple[list[Timing], float]:
    """Static batching replay. Returns per-request timings and the wall time of the replay."""
    results: list[Timing] = []
    t0 = time.perf_counter()
    for b in range(0, len(reqs), max_batch):
        batch, bp = reqs[b:b + max_batch], prompts[b:b + max_batch]
        _sleep_until(t0, max(r.arrival for r in batch))
        new, times = _hf_batch(model, bp, max(r.output_tokens for r in batch), pad_id)
        for i, r in enumerate(batch):
            results.append(Timing(r.arrival, times[0] - t0, times[r.output_tokens - 1] - t0,
                                  r.output_tokens, new[i, :r.output_tokens].tolist()))
    return results, time.perf_counter() - t0


# ----------------------------------------------------------------------------- engine


def load_engine(model_dir: str | Path, max_batch: int, max_num_batched_tokens: int | None,
                device: str = "cpu"):
    from reference_engine import LLM

    # fp32 on both sides: the same numbers, so greedy outputs can be compared token for token
    kw = {"max_num_seqs": max_batch, "device": device, "dtype": torch.float32}
    if max_num_batched_tokens:
        kw["max_num_batched_tokens"] = max_num_batched_tokens
    return LLM(model=str(model_dir), block_size=16, **kw)


def run_engine(llm, reqs: list[tr.Request], prompts: list[list[int]]) -> tuple[list[Timing], float]:
    """Continuous batching replay through the step API: between steps, every request whose
    arrival time has passed is added (stamped with its scheduled arrival, so time spent
    waiting for the current step to end counts against TTFT); idle gaps are slept through."""
    from reference_engine.sim.replay import replay

    outputs, t0, wall = replay(llm.engine, reqs, prompts)
    timings = []
    for o, r in zip(outputs, reqs):
        m = o.metrics
        assert len(o.token_ids) == r.output_tokens, "engine stopped early"
        timings.append(Timing(m.arrival_time - t0, m.first_token_time - t0, m.finish_time - t0,
                              len(o.token_ids), list(o.token_ids)))
    return timings, wall


# ----------------------------------------------------------------------------- report


def profile_engine(llm, stats: list, reqs: list[tr.Request], prompts: list[list[int]]) -> dict:
    """Where an engine step's time goes, from the run just measured and one more under torch.profiler:
    forward_share, the steps' forward time (StepStats.forward_time: the model, kernels and its Python) over their
    wall time; kernel_share, the self time of every aten operator (the kernels and their dispatch, on the CPU) over
    the steps' wall time in the profiled run (the profiler's own cost counts as host time: a lower bound)."""
    from torch.profiler import ProfilerActivity, profile

    forward, wall = sum(s.forward_time for s in stats), sum(s.wall_time for s in stats)
    before = len(llm.engine.step_stats)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_engine(llm, reqs, prompts)
    profiled = llm.engine.step_stats[before:]
    ops = prof.key_averages()
    aten = sum(e.self_cpu_time_total for e in ops if e.key.startswith("aten::")) / 1e6
    top = sorted(ops, key=lambda e: -e.self_cpu_time_total)[:5]
    return {"steps": len(stats), "forward_share": forward / wall,
            "kernel_share": aten / sum(s.wall_time for s in profiled),
            "top_ops": [[e.key, e.self_cpu_time_total / 1e6] for e in top]}


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def summarize(timings: list[Timing], wall_s: float) -> dict:
    tokens = sum(t.output_tokens for t in timings)
    ttft = [t.ttft for t in timings]
    tpot = [t.tpot for t in timings if t.tpot is not None]
    return {"requests": len(timings), "output_tokens": tokens, "wall_s": wall_s,
            "tokens_per_s": tokens / wall_s,
            "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
            "tpot_p50_s": _pct(tpot, 50), "tpot_p99_s": _pct(tpot, 99)}


def _warmup(fn) -> None:
    """One tiny untimed run so one-off costs (allocations, lazy init) stay out of the replay."""
    fn([tr.Request(0.0, 8, 4), tr.Request(0.0, 5, 2)], [[1] * 8, [2] * 5])


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    eos = cfg.get("eos_token_id")
    exclude = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    max_context = args.max_context or cfg["max_position_embeddings"]
    reqs, prompts = build_workload(args.trace, args.num_requests, args.rate, args.seed,
                                   max_context, cfg["vocab_size"], exclude, args.output_factor)
    pad_id = exclude[0] if exclude else 0
    report = {
        "model": str(args.model), "trace": args.trace, "num_requests": args.num_requests,
        "rate_rps": args.rate, "seed": args.seed, "max_batch": args.max_batch,
        "max_context": max_context, "output_factor": args.output_factor, "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        "device": args.device, "torch_version": torch.__version__, "workload": tr.summary(reqs),
        "arrivals": "replayed on a wall clock" if math.isfinite(args.rate) else "all at t=0 (offline)",
    }
    systems = {}
    if not args.skip_hf:
        hf = load_hf(args.model, args.device)
        _warmup(lambda r, p: run_hf(hf, r, p, args.max_batch, pad_id))
        systems["hf"] = run_hf(hf, reqs, prompts, args.max_batch, pad_id)
    if not args.skip_engine:
        llm = load_engine(args.model, args.max_batch, args.max_num_batched_tokens, args.device)
        _warmup(lambda r, p: run_engine(llm, r, p))
        measured_from = len(llm.engine.step_stats)
        systems["engine"] = run_engine(llm, reqs, prompts)
        if args.profile:
            report["engine_profile"] = profile_engine(llm, llm.engine.step_stats[measured_from:], reqs, prompts)
    for name, (timings, wall) in systems.items():
        report[name] = summarize(timings, wall)
    if "hf" in systems and "engine" in systems:
        report["speedup_vs_hf"] = report["engine"]["tokens_per_s"] / report["hf"]["tokens_per_s"]
        same = [a.token_ids == b.token_ids for a, b in zip(systems["hf"][0], systems["engine"][0])]
        report["greedy_outputs_identical"] = sum(same) / len(same)
    return report


def print_report(r: dict) -> None:
    w = r["workload"]
    print(f"workload: {r['trace']} trace, {w['requests']} requests, arrivals {r['arrivals']}, "
          f"rate {w['rps']:.2f} req/s, prompt p50/p99 {w['prompt_tokens_p50']:.0f}/"
          f"{w['prompt_tokens_p99']:.0f}, output p50/p99 {w['output_tokens_p50']:.0f}/"
          f"{w['output_tokens_p99']:.0f} tokens; max batch {r['max_batch']}, "
          f"torch threads {r['torch_threads']}")
    print(f"{'system':<8}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p50':>10}{'TPOT p99':>10}"
          f"{'wall s':>8}")
    for name in ("hf", "engine"):
        if name in r:
            s = r[name]
            print(f"{name:<8}{s['tokens_per_s']:>9.1f}{s['ttft_p50_s'] * 1e3:>8.0f}ms"
                  f"{s['ttft_p99_s'] * 1e3:>8.0f}ms{s['tpot_p50_s'] * 1e3:>8.1f}ms"
                  f"{s['tpot_p99_s'] * 1e3:>8.1f}ms{s['wall_s']:>8.2f}")
    if "engine_profile" in r:
        p = r["engine_profile"]
        print(f"engine steps: {p['forward_share']:.1%} of step time in the model's forward; "
              f"{p['kernel_share']:.1%} in aten kernels (torch.profiler, {p['steps']} steps); top: "
              + ", ".join(f"{k} {t:.2f}s" for k, t in p["top_ops"][:3]))
    if "speedup_vs_hf" in r:
        print(f"engine / hf throughput: {r['speedup_vs_hf']:.2f}x; identical greedy outputs: "
              f"{r['greedy_outputs_identical']:.0%} of requests")


def _finite(x):
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(TARGET))
    ap.add_argument("--trace", default="conv", choices=sorted(tr.TRACES))
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--rate", type=float, default=math.inf, help="requests/s; inf = all at t=0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batch", type=int, default=16,
                    help="HF static batch size and the engine's max_num_seqs")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--output-factor", type=float, default=None,
                    help="divide output lengths by this instead of the prompt factor (e.g. 1 for "
                         "the code trace, whose short outputs otherwise shrink to ~1 token)")
    ap.add_argument("--max-context", type=int, default=None, help="default: the model's max positions")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="device for both systems")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both systems")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="also report the share of the engine's step time in the model and in aten kernels")
    ap.add_argument("--json", default=None, help="write the report here")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    report = run(args)
    print_report(report)
    if args.json:  # strict JSON: inf / nan (offline rate, no TPOT) become null
        Path(args.json).write_text(json.dumps(_finite(report), indent=2, allow_nan=False) + "\n")
    return report


if __name__ == "__main__":
    main()
