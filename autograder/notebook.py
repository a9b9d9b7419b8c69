"""What the lesson notebooks import.

    from autograder.notebook import lesson, check, after_exercises
    L = lesson("l02_kv_cache")        # exercises.l02_kv_cache (your code)
    check("l02_kv_cache", "kv_bytes_per_token")
    with after_exercises():           # a teaching cell that uses your code
        print(L.kv_bytes_per_token(...))

`after_exercises()` turns a stub's NotImplementedError (and TritonUnavailable, where Triton is not
installed) into one line that names the exercise to write first, and closes the figures the cell opened.
Inside it, `needs(...)` calls exercises up front (for code that would reach them only in another thread)
and `skip(reason)` ends the cell when an earlier cell did not produce what it uses; `written(call)` says
whether an exercise is written, for a cell that falls back to the engine's own version until it is.

Set COURSE_IMPL=solutions to point every notebook at the reference solutions
(the course's own tests run the notebooks that way).
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import os
import random
import re
import sys
import tempfile
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path

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


_EXERCISE = re.compile(r"Exercise \d+\.\d+(?: \([^)]*\))?")
_ROOT = Path(__file__).resolve().parent.parent


def _triton_unavailable(e: BaseException) -> bool:
    """e is reference_engine.kernels.triton_compat.TritonUnavailable (raised where Triton is not installed).
    Asked without importing that module: if nothing imported it, nothing raised its exception."""
    compat = sys.modules.get("reference_engine.kernels.triton_compat")
    if compat is not None and isinstance(e, compat.TritonUnavailable):
        return True
    return any(c.__name__ == "TritonUnavailable" for c in type(e).__mro__)  # a reloaded module's class


def _not_written(e: BaseException) -> BaseException | None:
    """The NotImplementedError or TritonUnavailable that e is, or was raised from (`raise ... from`), else None.
    The implicit context of an exception is not followed: an error raised while handling a stub's
    NotImplementedError is an error of its own."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, NotImplementedError) or _triton_unavailable(e):
            return e
        e = e.__cause__
    return None


def _raised_in(e: BaseException) -> str | None:
    """The course file (relative to the course directory) where e was raised, if it is an exercise file."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return None
    try:
        where = Path(frames[-1].filename).resolve().relative_to(_ROOT)
    except ValueError:
        return None
    return where.as_posix() if where.parts[0] == "exercises" else None


def skip_message(e: BaseException) -> str:
    """The line a teaching cell prints instead of a traceback when it reaches a stub, or a Triton kernel
    where Triton is not installed."""
    if _triton_unavailable(e):
        return f"(skipped: {e})"
    message = str(e).strip()
    exercise = _EXERCISE.search(message)
    where = _raised_in(e)
    if exercise:
        rest = (message[:exercise.start()] + message[exercise.end():]).strip(" :;,.")
        return (f"(skipped: write {exercise.group(0)} first{f', in {where}' if where else ''}, then rerun this cell"
                f"{f'; {rest}' if rest else ''})")
    return (f"(skipped: this cell uses code that is not written yet{f', in {where}' if where else ''}; write it, "
            f"then rerun this cell. {type(e).__name__}: {message or 'a stub'})")


class Skipped(Exception):
    """Raised by skip(): after_exercises() prints its reason and ends the cell there."""


def skip(reason: str) -> None:
    """End the cell inside after_exercises() with "(skipped: reason)": for a cell that needs what an earlier
    cell did not make (that cell stopped at an exercise not written yet)."""
    raise Skipped(reason)


def _open_figures() -> set[int]:
    plt = sys.modules.get("matplotlib.pyplot")  # never imported here: a lesson without plots has none
    return set(plt.get_fignums()) if plt is not None else set()


def _close_figures_since(before: set[int]) -> None:
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        for num in set(plt.get_fignums()) - before:
            plt.close(num)


@contextlib.contextmanager
def after_exercises() -> Iterator[None]:
    """Around a teaching cell that uses the exercises:

        with after_exercises():
            print(L.kv_bytes_per_token(config))

    If the cell reaches a function that is still a stub (it raises NotImplementedError), or launches a Triton
    kernel where Triton is not installed (reference_engine.kernels.triton_compat.TritonUnavailable), the cell
    stops there and prints one line that says which exercise to write first, instead of a traceback; any figure
    opened inside the block is closed, so no empty plot is drawn. skip(reason) inside the block ends it the same
    way, with its reason. Any other exception propagates."""
    before = _open_figures()
    try:
        yield
    except Skipped as e:
        _close_figures_since(before)
        print(f"(skipped: {e})")
    except Exception as e:  # noqa: BLE001 - only a stub's or Triton's exception is handled; others re-raised
        cause = _not_written(e)
        if cause is None:
            raise
        _close_figures_since(before)
        print(skip_message(cause))


def needs(*calls: Callable[[], object]) -> None:
    """Call each of `calls` (small calls of exercise functions) and return nothing; a stub's NotImplementedError
    propagates. For a cell whose code would reach the exercise only where its exception is not seen (a server
    thread, an engine callback), so that `after_exercises()` around the cell skips it before it starts."""
    for call in calls:
        call()


def written(call: Callable[[], object]) -> bool:
    """False if `call()` reaches a stub (NotImplementedError), else True: for a cell that uses the learner's
    version where it is written and falls back to the engine's own until then."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - only a stub's or Triton's exception means "not written"
        if _not_written(e) is None:
            raise
        return False
    return True


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
