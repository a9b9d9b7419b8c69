"""What the lesson notebooks import.

    from autograder.notebook import lesson, check
    L = lesson("l02_kv_cache")        # exercises.l02_kv_cache (your code)
    check("l02_kv_cache", "kv_bytes_per_token")

Set COURSE_IMPL=solutions to point every notebook at the reference solutions
(the course's own tests run the notebooks that way).
"""
from __future__ import annotations

import ast
import importlib
import os
import random
import tempfile
import types

from . import nbgrader_grade, report, runtime
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
    target = Target.for_lesson(stem, solutions=impl_package() == "solutions")
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


def _defines(source: str) -> set[str]:
    try:
        tree = ast.parse(nbgrader_grade.strip_magics(source))
    except SyntaxError:
        return set()
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def notebook_source(stem: str, namespace: dict) -> str:
    """The learner's module as this notebook defines it: the lesson's header (its exercise file), then the
    last executed cell defining each of the notebook's functions and classes, in execution order."""
    history = [c for c in namespace.get("In", []) if isinstance(c, str)]
    chosen: dict[str, int] = {}
    for i, cell in enumerate(history):
        for name in _defines(cell):
            chosen[name] = i
    cells = [nbgrader_grade.strip_magics(history[i]) for i in sorted(set(chosen.values()))]
    return nbgrader_grade.lesson_header(stem) + "\n\n# -- this notebook's cells --\n\n" + "\n\n".join(cells) + "\n"


def grade_cell(stem: str, name: str, namespace: dict, seed: int | None = None) -> float | None:
    """nbgrader test cell: grade `name` on the functions this notebook defines.

    The code is taken from the notebook's cells and run in a learner process, like `course check`
    (in a student's copy: the visible cases). Under `nbgrader autograde` it does nothing: the points
    come from the course's grader outside this kernel (autograder.nbgrader_grade)."""
    if os.environ.get("NBGRADER_EXECUTION") == "autograde":
        print("graded outside this kernel by the course's grader (see the row nbgrader records)")
        return None
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    with tempfile.TemporaryDirectory(prefix="course-notebook-") as tmp:
        target = Target.from_source(notebook_source(stem, namespace), tmp, f"notebook_{stem}", label="this notebook")
        results = grade_lesson(stem, target, seed, only=[name])
    print(report.check_table(results))
    return float(sum(r.earned for r in results))
