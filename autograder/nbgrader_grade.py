"""Trusted grades for `nbgrader autograde`, computed outside the student's kernel.

nbgrader executes a submission in a kernel and reads each test cell's points from
its output, and that kernel runs the student's code: a redefined `grade_cell` or a
patched grader would print any score it liked. So the course's nbgrader config
puts `TrustedGrades` just before nbgrader's SaveAutoGrades: it rebuilds the
student's module from the submission's answer cells (after the lesson's own
helpers), grades it with `course`'s grader (learner code in its own process,
hidden cases included) and overwrites every test cell's output with that row and
the points earned. Whatever the kernel printed is discarded.

The seed comes from the assignment and the student id and is printed in each
graded cell, so autograding a submission twice gives the same score.
"""
from __future__ import annotations

import ast
import tempfile
import zlib

import nbformat
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from . import report
from .lessons import ROOT


def seed_for(assignment: str, student: str) -> int:
    return zlib.crc32(f"{assignment}:{student}".encode()) & 0x7FFFFFFF


def _test_call(source: str) -> tuple[str, str] | None:
    """("l01_roofline", "matmul_cost") from a test cell's `grade_cell("l01_roofline", "matmul_cost", globals())`."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "grade_cell" and len(node.args) >= 2:
            a, b = node.args[:2]
            if isinstance(a, ast.Constant) and isinstance(b, ast.Constant):
                return str(a.value), str(b.value)
    return None


def strip_magics(source: str) -> str:
    """A notebook cell as code that can follow the lesson's header in one module: IPython lines
    (`%matplotlib`, `!pip`) have no meaning there, and `from __future__` is legal only at a module's top
    (the header has it), so both are commented out."""
    return "\n".join(("# " + line) if line.lstrip().startswith(("%", "!", "from __future__ ")) else line
                     for line in source.splitlines())


def lesson_header(stem: str) -> str:
    """The lesson module's imports and helpers: its exercise file (stubs included, which the answer
    cells that follow replace)."""
    return (ROOT / "exercises" / f"{stem}.py").read_text()


def submission_source(stem: str, nb) -> str:
    """The student's module: the lesson's header, then every answer cell of the submission, in order."""
    answers = [strip_magics(c.source) for c in nb.cells
               if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")]
    return lesson_header(stem) + "\n\n# -- the submission's answer cells --\n\n" + "\n\n".join(answers) + "\n"


def _outputs(text: str, earned: float) -> list:
    return [nbformat.v4.new_output("stream", name="stdout", text=text),
            nbformat.v4.new_output("execute_result", data={"text/plain": repr(float(earned))}, execution_count=1)]


class TrustedGrades(Preprocessor):
    """Grade the submission outside the kernel; overwrite every test cell's output with the result."""

    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled

    def preprocess(self, nb, resources):
        from .runner import Target, grade_lesson
        tests = [(c, _test_call(c.source)) for c in nb.cells
                 if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")
                 and not c.metadata.get("nbgrader", {}).get("solution")]
        tests = [(c, call) for c, call in tests if call]
        if not tests:
            return nb, resources
        stem = tests[0][1][0]
        info = resources.get("nbgrader", {})
        assignment, student = str(info.get("assignment", stem)), str(info.get("student", ""))
        seed = seed_for(assignment, student)
        with tempfile.TemporaryDirectory(prefix="course-submission-") as tmp:
            target = Target.from_source(submission_source(stem, nb), tmp, f"submission_{stem}",
                                        label=f"{student or 'the'} submission's answer cells")
            results = {r.name: r for r in grade_lesson(stem, target, seed)}
        for cell, (_, name) in tests:
            r = results.get(name)
            if r is None:
                cell.outputs = _outputs(f"no check named {name!r} in lesson {stem}\n", 0.0)
                continue
            earned = r.earned if r.graded else 0.0
            text = (report.check_table([r]) + f"\n[graded outside the notebook's kernel; seed {seed} from "
                    f"assignment {assignment!r} and student {student!r}]\n")
            cell.outputs = _outputs(text, earned)
        return nb, resources
