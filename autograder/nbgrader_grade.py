"""Trusted grades for `nbgrader autograde`, computed in the course's sandbox, never in a kernel.

nbgrader's own autograde runs every cell of a submission in a Jupyter kernel, as the instructor, and reads each
test cell's points from its output: the student's code could print any score, rewrite the gradebook, read the
solutions or other students' work, or start a process that outlives the grading. The course's nbgrader config
(autograder/nbgrader_build.py: CONFIG) leaves nbgrader's Execute out, so no cell of the submission runs in
nbgrader, and puts `TrustedGrades` in its place: it rebuilds the student's module from the submission's answer
cells (after the lesson's own helpers), grades it with `course`'s grader (learner code in a sandboxed learner
process, autograder/oslimits.py; hidden cases included), clears every output the submission carried, and writes
each test cell's output: that check's row of the report for the student (a hidden case's inputs and expected
values left out, report.student_message) and the points earned, which nbgrader's SaveAutoGrades then reads.

Where the sandbox is not active (no Landlock: macOS, Linux < 5.13; or COURSE_SANDBOX=off) it refuses to grade
unless the instructor opted in (c.TrustedGrades.allow_unsandboxed = True); every graded cell names the isolation.

The seed comes from the assignment and the student id and is printed in each
graded cell, so autograding a submission twice gives the same score.
"""
from __future__ import annotations

import ast
import tempfile
import zlib

import nbformat
from nbconvert.preprocessors import ExecutePreprocessor, Preprocessor
from traitlets import Bool

from . import oslimits, report
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


class SandboxRequired(RuntimeError):
    """Autograde refused: the submission's code would not run in the course's sandbox."""


UNSANDBOXED = ("the course grader's sandbox is not active on this machine ({isolation}): Landlock needs Linux 5.13 "
               "or later, and COURSE_SANDBOX must not be off. A submission's code would then run as you with only "
               "the source scan in its way. Run `nbgrader autograde` on such a Linux machine (inside a container or "
               "VM for high stakes) or, to grade here anyway, add `c.TrustedGrades.allow_unsandboxed = True` to "
               "nbgrader_config.py.")
EXECUTING = ("nbgrader's Execute is in c.Autograde.autograde_preprocessors: it runs every cell of the submission in "
             "a kernel, as you, outside the course's sandbox. Use the list `course nbgrader build` writes in "
             "nbgrader_config.py (TrustedGrades grades the answer cells in the sandbox).")


class TrustedGrades(Preprocessor):
    """Grade the submission's answer cells in the course's sandbox; clear every output it carried and write each
    test cell's: the check's row for the student, and the points."""

    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled
    allow_unsandboxed = Bool(False, help="Grade even where the course's sandbox is not active (no Landlock, or "
                             "COURSE_SANDBOX=off): submissions' code then runs with only the source scan in its way. "
                             "Not for high-stakes grading.").tag(config=True)

    def _refuse(self, message: str):
        self.log.error(message)
        raise SandboxRequired(message)

    def preprocess(self, nb, resources):
        from .runner import Target, grade_lesson
        if any(isinstance(p, ExecutePreprocessor) and p.enabled for p in getattr(self.parent, "_preprocessors", [])):
            self._refuse(EXECUTING)
        if not oslimits.active() and not self.allow_unsandboxed:
            self._refuse(UNSANDBOXED.format(isolation=oslimits.describe()))
        for cell in nb.cells:  # what the student's kernel printed is theirs to forge: none of it is kept
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
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
        header = (f"[graded outside the notebook's kernel: the answer cells, in the course grader's learner process; "
                  f"{oslimits.describe()}; seed {seed} from assignment {assignment!r} and student {student!r}]\n")
        for cell, (_, name) in tests:
            r = results.get(name)
            if r is None:
                cell.outputs = _outputs(header + f"no check named {name!r} in lesson {stem}\n", 0.0)
                continue
            earned = r.earned if r.graded else 0.0
            cell.outputs = _outputs(header + report.check_table([r], for_student=True) + "\n", earned)
        return nb, resources
