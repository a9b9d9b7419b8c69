"""What the lesson notebooks import.

    from autograder.notebook import lesson, check
    L = lesson("l02_kv_cache")        # exercises.l02_kv_cache (your code)
    check("l02_kv_cache", "kv_bytes_per_token")

Set COURSE_IMPL=solutions to point every notebook at the reference solutions
(the course's own tests run the notebooks that way).
"""
from __future__ import annotations

import importlib
import os
import random
import types

from . import report, runtime
from .runner import Target, grade_lesson

runtime.setup()  # before a lesson's imports can pull in triton


def impl_package() -> str:
    return "solutions" if os.environ.get("COURSE_IMPL", "exercises") == "solutions" else "exercises"


def lesson(stem: str) -> types.ModuleType:
    """The module the notebook works with: the learner's exercises, or the solutions."""
    runtime.setup()
    return importlib.import_module(f"{impl_package()}.{stem}")


def check(stem: str, *names: str, seed: int | None = None, verbose: bool = False):
    """Grade some checks of a lesson inline and print the table. Returns nothing (no big repr)."""
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    target = Target(module_name=f"{impl_package()}.{stem}", label=f"{impl_package()}/{stem}.py")
    results = grade_lesson(stem, target, seed, only=list(names) or None)
    print(report.check_table(results, verbose=verbose))
    print(report.summary_line(results) + f"   [seed {seed}]")


class LiveModule(types.ModuleType):
    """A module view of a notebook's globals, so `L.fn` finds functions defined in cells."""

    def __init__(self, namespace: dict, name: str = "notebook"):
        super().__init__(name)
        object.__setattr__(self, "_ns", namespace)

    def __getattr__(self, item):
        try:
            return self._ns[item]
        except KeyError:
            raise AttributeError(item) from None


def grade_cell(stem: str, name: str, namespace: dict, seed: int | None = None) -> float:
    """nbgrader test cell: grade `name` against the functions defined in this notebook.

    Prints the row and returns the points earned, which nbgrader reads as partial credit.
    """
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    target = Target(module=LiveModule(namespace), label="this notebook")
    results = grade_lesson(stem, target, seed, only=[name])
    print(report.check_table(results))
    return float(sum(r.earned for r in results))
