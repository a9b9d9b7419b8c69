"""Published serving measurements, and what the calibrated step pricing (calibration.py) says for each.

Each Case is one published number with its source and configuration; model(case) recomputes it from calibrated
step times, and validate() returns the rows (case, configuration, published, modeled, ratio = modeled / published,
source). For a throughput a ratio above 1 means the model is optimistic; for a latency, pessimistic.

How each kind of number is modeled:
- "output tok/s" (TensorRT-LLM's max-throughput table): a saturated continuous-batching steady state, below.
- "TTFT ms" at concurrency 1: one step that prefills the whole prompt.
- "ITL ms" at concurrency 1: one decode step of one sequence at the mean context over its output.
- "decode tok/s" at batch 1: 1 / that decode step.
Client-side time (HTTP, tokenization, streaming) is not modeled, so modeled latencies lean low.

The steady state (saturated_throughput): requests of ISL prompt and OSL output tokens arrive without pause. The
engine holds N requests at once: as many as the KV cache fits when each reserves ISL + OSL tokens (TensorRT-LLM's
default capacity policy, GUARANTEED_NO_EVICT, reserves a request's whole length: its docs, "Useful Runtime
Options"), capped by the max batch and token budget trtllm-bench derives for the run (tensorrt_llm/bench/build/
tuning.py: the KV-limited request count rounded up, at most 4096; tokens per step min(batch * (1 + ISL/OSL), 32768),
rounded up). Each request lives OSL steps: one that prefills its whole prompt (no chunking: the PyTorch backend's
default) and makes its first token, then OSL - 1 decode steps. With every slot busy, each step decodes
N (OSL - 1) / OSL sequences, whose contexts are spread evenly over ISL .. ISL + OSL - 2, and prefills N / OSL
prompts (a fraction: priced between the steps with floor and ceil of it, weighted); it makes N output tokens, so
throughput = N / step time. Left out: ramp-up and drain at the ends of a finite run (TensorRT-LLM ran 1500-30000
requests per point, several times the concurrency), and the near-lockstep cohorts equal-length requests form, whose
mean context per step is the same as the spread one here.

KV capacity: memory as the driver reports it (gpu_model's memory_mib) x gpu_memory_utilization 0.9 - weights, as
gpu_model.kv_capacity computes it. The FP8 checkpoints store weights and KV cache in FP8 (ASSUMPTION: NVIDIA's
ModelOpt FP8 export sets kv_cache_quant_algo FP8 and keeps lm_head, and here also the embedding, in bf16; both add
to the weights). TensorRT-LLM sizes its cache from 0.9-0.95 of the memory left after loading, so this is close
but not its exact rule.

    python -m reference_engine.sim.validation    # prints the table
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
from dataclasses import dataclass, replace

from reference_engine.sim import calibration
from reference_engine.sim.gpu_model import (
    A100,
    CHIPS,
    H100,
    H200,
    LLAMA_3_8B,
    LLAMA_3_70B,
    Chip,
    Composition,
    ModelShape,
    kv_capacity,
)

# ---------------------------------------------------------------- model shapes


def fp8(shape: ModelShape, name: str) -> ModelShape:
    """The same architecture with FP8 weights (W8A8 GEMMs) and an FP8 KV cache."""
    return replace(shape, name=name, weight_bytes=1, kv_bytes=1)


# Llama-3.1-8B and Llama-3.3-70B have Llama-3-8B's and Llama-3-70B's sizes (same layers, heads, hidden, intermediate and
# vocabulary in their config.json; they differ in RoPE scaling and context length, which do not enter the cost).
LLAMA_3_1_8B_FP8 = fp8(LLAMA_3_8B, "Llama-3.1-8B FP8")
LLAMA_3_3_70B_FP8 = fp8(LLAMA_3_70B, "Llama-3.3-70B FP8")
# Not in gpu_model, so defined here from meta-llama/Llama-2-7b-hf config.json: 32 layers, 32 heads, 32 KV heads (no
# GQA), head_dim 128, hidden 4096, intermediate 11008, vocabulary 32000.
LLAMA_2_7B = ModelShape("Llama-2-7B", 32, 32, 32, 128, 4096, 11008, 32000)

# ---------------------------------------------------------------- the published numbers

TRTLLM = ("TensorRT-LLM perf overview (docs/source/performance/perf-overview.md, v1.0, PyTorch backend, trtllm-bench "
          "throughput): 'Total Output Throughput (tokens/sec)'")
NIM = ("NVIDIA NIM LLM benchmarking, Performance, Llama-3.3-70b-instruct NIM 1.8.0 "
       "(docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance)")
GPT_FAST = "gpt-fast README (pytorch-labs/gpt-fast), A100-80GB power-limited to 330 W, torch.compile"


@dataclass(frozen=True)
class Case:
    """One published number: metric is "output tok/s", "TTFT ms", "ITL ms" or "decode tok/s"; isl / osl the prompt
    and output lengths (for a batch-1 decode, the prompt and the tokens generated)."""
    name: str
    metric: str
    published: float
    shape: ModelShape
    chip: Chip
    tp: int
    isl: int
    osl: int
    source: str

    @property
    def config(self) -> str:
        return f"{self.shape.name}, {self.chip.name}, TP{self.tp}, ISL/OSL {self.isl}/{self.osl}"


def _trtllm(chip: Chip, isl: int, osl: int, value: float) -> Case:
    return Case(f"TRT-LLM {chip.name.split()[0]} {isl}/{osl}", "output tok/s", value, LLAMA_3_1_8B_FP8, chip, 1, isl,
                osl, TRTLLM)


CASES = (
    _trtllm(H100, 2048, 128, 3450), _trtllm(H100, 128, 2048, 22714), _trtllm(H100, 1000, 1000, 15220),
    _trtllm(H200, 2048, 128, 3538), _trtllm(H200, 128, 2048, 26221), _trtllm(H200, 1000, 1000, 17744),
    Case("NIM 2xH100 TTFT", "TTFT ms", 406.77, LLAMA_3_3_70B_FP8, H100, 2, 5000, 500, NIM + ", concurrency 1"),
    Case("NIM 2xH100 ITL", "ITL ms", 18.58, LLAMA_3_3_70B_FP8, H100, 2, 5000, 500, NIM + ", concurrency 1"),
    # gpt-fast's benchmark prompt is 5 tokens ("Hello, my name is"); 200 new tokens is generate.py's default
    # (ASSUMPTION: the README does not say how many tokens its figure averages over).
    Case("gpt-fast A100 bs1", "decode tok/s", 104.9, LLAMA_2_7B, A100, 1, 5, 200, GPT_FAST + ", batch 1"),
)

# ---------------------------------------------------------------- the steady state


def kv_tokens(shape: ModelShape, chip: Chip, tp: int = 1, gpu_memory_utilization: float = 0.9) -> int:
    """KV-cache tokens per GPU: gpu_model.kv_capacity, less the bf16 embedding and lm_head an FP8 checkpoint keeps."""
    cap = kv_capacity(shape, chip, tp=tp, gpu_memory_utilization=gpu_memory_utilization)
    bf16_extra = (2 - shape.weight_bytes) * 2 * shape.vocab * shape.hidden / tp if shape.weight_bytes < 2 else 0
    return int((cap["free_bytes"] - bf16_extra) // cap["kv_bytes_per_token"])


def trtllm_bench_limits(requests: float, isl: int, osl: int) -> tuple[int, int]:
    """(max batch size, max tokens per step) trtllm-bench sets for a run whose KV cache holds `requests` whole
    requests (tensorrt_llm/bench/build/tuning.py, finetune_setting, pipeline parallel 1, optimistic tuning on)."""
    raw_bs = min(requests, 4096)
    raw_tokens = min(raw_bs * (1 + isl / osl), 32768)
    if raw_bs < 256:
        bs = max(64, 32 * math.ceil(raw_bs / 32))
    else:
        step = 128 if raw_bs < 1024 else 256
        bs = step * math.ceil(raw_bs / step)
    step = 256 if raw_tokens < 4096 else 512 if raw_tokens < 8192 else 1024
    return bs, max(2048, step * math.ceil(raw_tokens / step))


def _steady_step(price, shape, chip, tp, isl, osl, decodes: int, prompts: int) -> float:
    """Seconds of one step decoding `decodes` sequences spread over the output and prefilling `prompts` prompts."""
    span = max(osl - 2, 0)
    contexts = tuple(isl + (i * span) // max(decodes - 1, 1) for i in range(decodes))
    comp = Composition(prefills=((isl, 0),) * prompts, decodes=contexts)
    return price(shape, chip, comp, tp=tp).time_s


def saturated_throughput(shape: ModelShape, chip: Chip, isl: int, osl: int, *, tp: int = 1,
                         price=calibration.step_time) -> dict:
    """The steady state of the module docstring, each step priced by `price` (a step_time: calibration's, or
    gpu_model's for comparison). Returns concurrency (N), max_batch and token_budget (trtllm-bench's), kv_tokens,
    decodes and prompts per step, step_s, and tok_s (output tokens per second, every rank together)."""
    tokens = kv_tokens(shape, chip, tp)
    fits = tokens / (isl + osl)
    max_batch, budget = trtllm_bench_limits(fits, isl, osl)
    n = min(int(fits), max_batch, int(budget * osl / (osl - 1 + isl)))
    decodes, prompts = round(n * (osl - 1) / osl), n / osl
    low = math.floor(prompts)
    frac = prompts - low
    step_s = (1 - frac) * _steady_step(price, shape, chip, tp, isl, osl, decodes, low)
    if frac:
        step_s += frac * _steady_step(price, shape, chip, tp, isl, osl, decodes, low + 1)
    return {"concurrency": n, "max_batch": max_batch, "token_budget": budget, "kv_tokens": tokens,
            "decodes": decodes, "prompts": prompts, "step_s": step_s, "tok_s": n / step_s}

# ---------------------------------------------------------------- each metric


def _throughput(case: Case, price) -> float:
    return saturated_throughput(case.shape, case.chip, case.isl, case.osl, tp=case.tp, price=price)["tok_s"]


def _ttft_ms(case: Case, price) -> float:
    return price(case.shape, case.chip, Composition(prefills=((case.isl, 0),)), tp=case.tp).time_s * 1e3


def _decode_s(case: Case, price) -> float:
    """One decode step of one sequence at the mean context over its output (prompt + half the output)."""
    return price(case.shape, case.chip, Composition(decodes=(case.isl + case.osl // 2,)), tp=case.tp).time_s


MODELS = {"output tok/s": _throughput, "TTFT ms": _ttft_ms,
          "ITL ms": lambda case, price: _decode_s(case, price) * 1e3,
          "decode tok/s": lambda case, price: 1 / _decode_s(case, price)}


def model(case: Case, step=calibration.step_time, **step_kwargs) -> float:
    """The value of case.metric with every step priced by step(shape, chip, composition, tp=..., **step_kwargs):
    calibration.step_time by default (step_kwargs such as elementwise=False or launch_floor_s=0.0 show what a part is
    worth); gpu_model.step_time gives what the lessons' uncalibrated clock says."""
    return MODELS[case.metric](case, functools.partial(step, **step_kwargs))


def validate(cases=CASES, step=calibration.step_time, **step_kwargs) -> list[dict]:
    """One row per case: case, config, metric, published, modeled, ratio (modeled / published), source."""
    rows = []
    for case in cases:
        modeled = model(case, step, **step_kwargs)
        rows.append({"case": case.name, "config": case.config, "metric": case.metric, "published": case.published,
                     "modeled": modeled, "ratio": modeled / case.published, "source": case.source})
    return rows


BAND = (0.8, 1.25)  # what "agrees" means here: modeled within -20% / +25% of published


def table(rows: list[dict]) -> str:
    """The rows as text: one line per case, then each source once."""
    sources = list(dict.fromkeys(r["source"] for r in rows))
    lines = [f"{'case':<24}{'configuration':<60}{'metric':<14}{'published':>10}{'modeled':>10}{'ratio':>7}  src"]
    for r in rows:
        flag = "" if BAND[0] <= r["ratio"] <= BAND[1] else "  OUTSIDE"
        lines.append(f"{r['case']:<24}{r['config']:<60}{r['metric']:<14}{r['published']:>10,.1f}{r['modeled']:>10,.1f}"
                     f"{r['ratio']:>7.2f}  [{sources.index(r['source']) + 1}]{flag}")
    lines += ["", f"ratio = modeled / published; band {BAND[0]}-{BAND[1]}. Sources:"]
    lines += [f"[{i + 1}] {s}" for i, s in enumerate(sources)]
    lines += ["", "Achievable HBM fraction per chip (reference_engine/sim/measured.py adds a chip measured by gpu_check):"]
    cals = {name: calibration.calibration_for(chip) for name, chip in CHIPS.items()}
    lines += [f"  {name}: {cal.mem_eff:.3f}, {cal.mem_eff_source}" for name, cal in cals.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reference_engine.sim.validation", description=__doc__.split("\n")[0])
    p.add_argument("--no-elementwise", action="store_true", help="leave the non-GEMM kernels out")
    p.add_argument("--no-floor", action="store_true", help="no per-launch floor")
    args = p.parse_args(argv)
    kwargs = {}
    if args.no_elementwise:
        kwargs["elementwise"] = False
    if args.no_floor:
        kwargs["launch_floor_s"] = 0.0
    print(table(validate(**kwargs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
