"""Every ready lesson's question templates, and the reference module their answers come from.

The reference is the lesson's solutions module, imported when a question is built (never at import
time), so that this package can ship in a student's copy, where it says what it needs instead.
"""
from __future__ import annotations

import importlib

from .. import lessons, runtime
from .. import reference as course_reference
from . import (  # noqa: F401 - importing a lesson's module registers its templates
    l01_roofline,
    l02_kv_cache,
    l03_continuous_batching,
    l04_paged_attention,
    l05_latency_metrics,
    l06_capacity_planning,
    l07_chunked_prefill,
    l08_tail_latency,
    l09_engine_choice,
    l10_autoscaling,
    l11_cold_start,
    l12_streaming,
    l13_gpu_utilization,
    l14_speculative_decoding,
    l15_attention_layouts,
    l16_quantization,
    l17_disaggregation,
    l18_prefix_caching,
    l19_offline_batch,
)
from .question import REGISTRY, Template

NEEDS_FULL_COURSE = (
    "Mock interviews need the full course: every answer is computed by the reference solutions (solutions/), and a "
    "student's copy of the course does not include them. Use the mock-interview cell at the end of each lesson's "
    "notebook instead, or ask your instructor to run a session.")


class NeedsFullCourse(RuntimeError):
    """This copy of the course has no solutions/, so no question can be answered."""


def require_solutions() -> None:
    if not course_reference.solutions_available():
        raise NeedsFullCourse(NEEDS_FULL_COURSE)


def solutions(stem: str):
    """The lesson's reference module (raises NeedsFullCourse in a student's copy)."""
    require_solutions()
    runtime.setup()  # kernel modules need Triton's mode chosen before they are imported
    return importlib.import_module(f"solutions.{stem}")


def stems() -> list[str]:
    """Lessons with interview questions, in course order."""
    return [lesson.stem for lesson in lessons.LESSONS if lesson.stem in REGISTRY]


def for_lesson(stem: str) -> list[Template]:
    return list(REGISTRY.get(stem, []))


def all_templates() -> list[Template]:
    return [t for stem in stems() for t in REGISTRY[stem]]
