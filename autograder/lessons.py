"""The nineteen lessons, in syllabus order. A lesson is available once its checks exist."""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# Modules a lesson's learner processes import beyond the zygote's base set (zygote.BASE_WARM) are named in its
# record: its zygote imports `warm` once, before it forks any (what loading the exercise needs), and `warm_later`
# between requests (what only some checks use). Measured by logging the imports each learner process made.
# (compiler.code_generator, gluon, libdevice: what the interpreter imports at a process's first kernel launch)
TRITON_MODULES = ("triton", "triton.language", "triton.compiler.code_generator", "triton.experimental.gluon",
                  "triton.language.extra.libdevice")


@dataclasses.dataclass(frozen=True)
class Lesson:
    """One lesson's record: everything about it that is not found from its stem.

    From the stem: solutions/<stem>.py, exercises/<stem>.py, autograder/checks/<stem>.py,
    autograder/harnesses/<stem>.py (if its checks run code in the learner's process), tests/mutants/<stem>.py,
    tests/test_<stem>.py, lessons/<stem>.ipynb, autograder/interview/<stem>.py (its mock-interview questions).

    torch: whether grading it needs torch and the engine in the learner processes (False: neither its checks,
    solution nor exercise import them, and its processes never pay the 1-2 s; tests/test_zygote_warm.py keeps
    it true). triton: its exercise writes a Triton kernel (the zygote imports Triton; a platform without
    Triton skips those checks as "not graded here"). warm / warm_later: see above.
    """
    number: int
    stem: str
    title: str
    torch: bool = True
    triton: bool = False
    warm: tuple[str, ...] = ()
    warm_later: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        return importlib.util.find_spec(f"autograder.checks.{self.stem}") is not None

    @property
    def notebook(self) -> Path:
        return ROOT / "lessons" / f"{self.stem}.ipynb"

    @property
    def interview_module(self) -> str:
        return f"autograder.interview.{self.stem}"

    @property
    def warm_imports(self) -> tuple[str, ...]:
        return (TRITON_MODULES if self.triton else ()) + self.warm


# The server stack: only lesson 12's server check runs it (0.4-0.7 s to import, which held back every check).
_SERVER = ("httpx", "httpcore", "pydantic.v1", "uvicorn", "uvicorn.protocols.http.h11_impl",
           "reference_engine.server.api", "reference_engine.server.runner")

# The manifest: one record per lesson, in syllabus order (`course new-lesson` appends to it).
LESSONS = [
    Lesson(1, "l01_roofline", "Roofline of prefill vs decode"),
    Lesson(2, "l02_kv_cache", "KV cache per token"),
    Lesson(3, "l03_continuous_batching", "Continuous batching"),
    Lesson(4, "l04_paged_attention", "PagedAttention", triton=True),
    Lesson(5, "l05_latency_metrics", "TTFT, TPOT and goodput", torch=False),
    Lesson(6, "l06_capacity_planning", "Capacity planning: bf16, fp8, tensor parallel", torch=False),
    Lesson(7, "l07_chunked_prefill", "Chunked prefill"),
    Lesson(8, "l08_tail_latency", "Debugging tail latency", torch=False, warm=("numpy.ma",)),
    Lesson(9, "l09_engine_choice", "Choosing an engine on the roofline", torch=False, warm=("statistics",)),
    Lesson(10, "l10_autoscaling", "Autoscaling", torch=False),
    Lesson(11, "l11_cold_start", "Cold start"),
    Lesson(12, "l12_streaming", "Streaming robustness", warm=("reference_engine.server.streaming",),
           warm_later=_SERVER),
    Lesson(13, "l13_gpu_utilization", "What GPU utilization measures", torch=False),
    Lesson(14, "l14_speculative_decoding", "Speculative decoding"),
    Lesson(15, "l15_attention_layouts", "MHA, GQA and MLA layouts", triton=True),
    Lesson(16, "l16_quantization", "Quantization", triton=True),
    Lesson(17, "l17_disaggregation", "Disaggregated prefill and decode"),
    Lesson(18, "l18_prefix_caching", "Prefix caching with a radix tree"),
    Lesson(19, "l19_offline_batch", "Offline batch inference"),
]
_BY_STEM = {lesson.stem: lesson for lesson in LESSONS}


def by_stem(stem: str) -> Lesson:
    """The stem's record; a stem not in the manifest (a test's lesson) gets the defaults: torch, nothing warm."""
    return _BY_STEM.get(stem) or Lesson(0, stem, stem)


def needs_torch(stems) -> bool:
    """Whether grading these lessons needs torch and the engine in the learner processes (Lesson.torch)."""
    return any(by_stem(stem).torch for stem in stems)


def warm_imports(stems) -> tuple[str, ...]:
    """The modules the zygote should import for grading these lessons before it forks (Lesson.warm)."""
    return tuple(dict.fromkeys(m for stem in stems for m in by_stem(stem).warm_imports))


def later_imports(stems) -> tuple[str, ...]:
    """The modules the zygote should import between requests for grading these lessons (Lesson.warm_later)."""
    return tuple(dict.fromkeys(m for stem in stems for m in by_stem(stem).warm_later))


def find(key: str) -> Lesson:
    """Accept '1', '01', 'l01', 'l01_roofline' or 'roofline'."""
    k = key.strip().lower()
    for lesson in LESSONS:
        if k in (str(lesson.number), f"{lesson.number:02d}", f"l{lesson.number:02d}", lesson.stem,
                 lesson.stem.split("_", 1)[1]):
            return lesson
    raise KeyError(f"no lesson {key!r}; try a number 1-{len(LESSONS)} (see `course list`)")


def available() -> list[Lesson]:
    return [lesson for lesson in LESSONS if lesson.available]
