"""The nineteen lessons, in syllabus order. A lesson is available once its checks exist."""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Lesson:
    number: int
    stem: str
    title: str

    @property
    def available(self) -> bool:
        return importlib.util.find_spec(f"autograder.checks.{self.stem}") is not None

    @property
    def notebook(self) -> Path:
        return ROOT / "lessons" / f"{self.stem}.ipynb"


LESSONS = [Lesson(n, s, t) for n, s, t in [
    (1, "l01_roofline", "Roofline of prefill vs decode"),
    (2, "l02_kv_cache", "KV cache per token"),
    (3, "l03_continuous_batching", "Continuous batching"),
    (4, "l04_paged_attention", "PagedAttention"),
    (5, "l05_latency_metrics", "TTFT, TPOT and goodput"),
    (6, "l06_capacity_planning", "Capacity planning: bf16, fp8, tensor parallel"),
    (7, "l07_chunked_prefill", "Chunked prefill"),
    (8, "l08_tail_latency", "Debugging tail latency"),
    (9, "l09_engine_choice", "Choosing an engine on the roofline"),
    (10, "l10_autoscaling", "Autoscaling"),
    (11, "l11_cold_start", "Cold start"),
    (12, "l12_streaming", "Streaming robustness"),
    (13, "l13_gpu_utilization", "What GPU utilization measures"),
    (14, "l14_speculative_decoding", "Speculative decoding"),
    (15, "l15_attention_layouts", "MHA, GQA and MLA layouts"),
    (16, "l16_quantization", "Quantization"),
    (17, "l17_disaggregation", "Disaggregated prefill and decode"),
    (18, "l18_prefix_caching", "Prefix caching with a radix tree"),
    (19, "l19_offline_batch", "Offline batch inference"),
]]


# Modules a lesson's learner processes import beyond the zygote's base set (zygote.BASE_WARM): its zygote
# imports them once, before it forks any (WARM: what loading the exercise needs), or between requests
# (WARM_LATER: what only some checks use). Measured by logging the imports each learner process made.
# (compiler.code_generator, gluon, libdevice: what the interpreter imports at a process's first kernel launch)
_TRITON = ("triton", "triton.language", "triton.compiler.code_generator", "triton.experimental.gluon",
           "triton.language.extra.libdevice")
WARM = {
    "l04_paged_attention": _TRITON,
    "l08_tail_latency": ("numpy.ma",),
    "l09_engine_choice": ("statistics",),
    "l12_streaming": ("reference_engine.server.streaming",),
    "l15_attention_layouts": _TRITON,
    "l16_quantization": _TRITON,
}
WARM_LATER = {
    # The server stack: only the server check runs it (0.4-0.7 s to import, which held back every check).
    "l12_streaming": ("httpx", "httpcore", "pydantic.v1", "uvicorn", "uvicorn.protocols.http.h11_impl",
                      "reference_engine.server.api", "reference_engine.server.runner"),
}


# Lessons whose checks, solutions and exercises use no tensors and no engine: their grader and learner processes
# never import torch (1-2 s of a fresh `course check`), unless learner code does (tests/test_zygote_warm.py keeps
# this list true).
NO_TORCH = frozenset({"l05_latency_metrics", "l06_capacity_planning", "l08_tail_latency", "l09_engine_choice",
                      "l10_autoscaling", "l13_gpu_utilization"})


def needs_torch(stems) -> bool:
    """Whether grading these lessons needs torch and the engine in the learner processes (see NO_TORCH)."""
    return any(stem not in NO_TORCH for stem in stems)


def warm_imports(stems) -> tuple[str, ...]:
    """The modules the zygote should import for grading these lessons before it forks (see WARM)."""
    return tuple(dict.fromkeys(m for stem in stems for m in WARM.get(stem, ())))


def later_imports(stems) -> tuple[str, ...]:
    """The modules the zygote should import between requests for grading these lessons (see WARM_LATER)."""
    return tuple(dict.fromkeys(m for stem in stems for m in WARM_LATER.get(stem, ())))


def find(key: str) -> Lesson:
    """Accept '1', '01', 'l01', 'l01_roofline' or 'roofline'."""
    k = key.strip().lower()
    for lesson in LESSONS:
        if k in (str(lesson.number), f"{lesson.number:02d}", f"l{lesson.number:02d}", lesson.stem,
                 lesson.stem.split("_", 1)[1]):
            return lesson
    raise KeyError(f"no lesson {key!r}; try a number 1-19 (see `course list`)")


def available() -> list[Lesson]:
    return [lesson for lesson in LESSONS if lesson.available]
