"""Every ready lesson's question templates, and the reference module their answers come from.

The reference is the lesson's solutions module, imported when a question is built (never at import
time), so that this package can ship in a student's copy, where it says what it needs instead.
"""
from __future__ import annotations

import importlib
import importlib.util

from .. import lessons, runtime
from .. import reference as course_reference
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


def _register() -> None:
    """Import every lesson's interview module (Lesson.interview_module), which registers its templates."""
    for lesson in lessons.LESSONS:
        if importlib.util.find_spec(lesson.interview_module) is not None:
            importlib.import_module(lesson.interview_module)


_register()


def stems() -> list[str]:
    """Lessons with interview questions, in course order."""
    return [lesson.stem for lesson in lessons.LESSONS if lesson.stem in REGISTRY]


def for_lesson(stem: str) -> list[Template]:
    return list(REGISTRY.get(stem, []))


def all_templates() -> list[Template]:
    return [t for stem in stems() for t in REGISTRY[stem]]
