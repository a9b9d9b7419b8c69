"""`course nbgrader build DIR`: an nbgrader course directory made from the lessons.

Each lesson notebook becomes source/<stem>/<stem>.ipynb in which
- the setup cell defines the solution module's imports and helpers in the notebook,
- each exercise cell becomes an nbgrader solution cell holding the solution
  source (with its ### BEGIN/END SOLUTION markers, which nbgrader strips on release),
- each check cell becomes an autograded test cell worth the check's points,
  calling the same check the `course` command runs on the notebook's own
  functions (in a student's copy: the visible cases). Under `nbgrader autograde`
  no cell runs in a kernel: the points come from `autograder.nbgrader_grade.TrustedGrades`,
  which grades the submission's answer cells in the course's sandboxed learner
  process and writes those outputs.
"""
from __future__ import annotations

import ast
from pathlib import Path

import nbformat

from .core import load_checks
from .lessons import ROOT, available, find

CONFIG = '''\
# nbgrader configuration for the LLM inference course (written by `course nbgrader build`).
import os

c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "llm-inference"
# The course directory is the one holding this file, as an absolute path (nbgrader wants one).
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
# Where release_assignment puts assignments and submit puts submissions: a folder every student's account can
# read and write. nbgrader's default is /srv/nbgrader/exchange; students' nbgrader must use the same one.
# c.Exchange.root = "/srv/nbgrader/exchange"
# nbgrader still runs your own notebooks (generate_solution; validate on the source): give a cell time.
c.ExecutePreprocessor.timeout = 600
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}

# No cell of a submission runs in nbgrader: its Execute (a kernel running every cell, as you, with nothing in
# the way) is left out. nbgrader's sanitize step runs first (its default list, written out here so no other config
# drops a part): outputs cleared, and locked cells, the test cells among them, given back the source's text and
# points. Then TrustedGrades grades the answer cells with the course's grader, the student's code in a sandboxed
# learner process, and writes each test cell's output (the check's row, the points) for SaveAutoGrades.
# The seed comes from the assignment and the student id.
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearOutput, DeduplicateIds,  # noqa: E402
                                    OverwriteCells, OverwriteKernelspec, SaveAutoGrades)

from autograder.nbgrader_grade import TrustedGrades  # noqa: E402

c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells,
                                      CheckCellMetadata]
c.Autograde.autograde_preprocessors = [TrustedGrades, ClearMetadataPreprocessor, SaveAutoGrades,
                                       AssignLatePenalties, CheckCellMetadata]
# Without the sandbox (no Landlock: macOS, Linux < 5.13; or COURSE_SANDBOX=off) autograde refuses to grade.
# WARNING: opting in lets submissions' code run as you with only the source scan in its way; not for high stakes.
# c.TrustedGrades.allow_unsandboxed = True
'''


def _nbmeta(grade_id: str, solution: bool, points: float | None = None) -> dict:
    meta = {"grade": points is not None, "grade_id": grade_id, "locked": not solution,
            "schema_version": 3, "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return meta


def _top_level_segments(path: Path) -> tuple[dict[str, str], list[str]]:
    """Source of each top-level def/class by name, and the remaining statements in order."""
    src = path.read_text()
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    named, rest = {}, []
    for i, node in enumerate(tree.body):
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        end = node.end_lineno
        # ast ends a def at its last statement; its trailing indented comments
        # (### END SOLUTION) belong to it too.
        while end < len(lines) and (not lines[end].strip() or lines[end][:1] in " \t"):
            end += 1
        text = "".join(lines[start - 1: end])
        if i == 0 and isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant):
            continue  # module docstring
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            named[node.name] = text
        elif not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            rest.append(text)
    return named, rest


def lesson_source_notebook(stem: str) -> nbformat.NotebookNode:
    lesson = find(stem)
    nb = nbformat.read(lesson.notebook, as_version=4)
    named, rest = _top_level_segments(ROOT / "solutions" / f"{stem}.py")
    points = {s.name: s.points for s in load_checks(stem)}
    exercise_names = {n for c in nb.cells for n in c.metadata.get("course", {}).get("names", [])}
    seen_checks = set()
    cells = []
    for cell in nb.cells:
        role = cell.metadata.get("course", {}).get("role")
        if role == "setup":
            # Helpers that are not exercises stay defined, in solution-file order.
            helpers = [t for n, t in named.items() if n not in exercise_names]
            body = ["from __future__ import annotations", "%matplotlib inline",
                    "from autograder.notebook import LiveModule, grade_cell", ""]
            body += [t.rstrip() for t in rest] + [""] + [t.rstrip() + "\n" for t in helpers]
            body += ["L = LiveModule(globals())  # lesson cells call L.<function>: the functions below"]
            cell = nbformat.v4.new_code_cell("\n".join(body))
        elif role == "exercise":
            names = cell.metadata["course"]["names"]
            missing = [n for n in names if n not in named]
            if missing:
                raise ValueError(f"{stem}: exercise cell names {missing}, not in solutions/{stem}.py")
            cell = nbformat.v4.new_code_cell("\n\n".join(named[n].rstrip() for n in names))
            cell.metadata["nbgrader"] = _nbmeta(f"exercise_{names[0]}", solution=True)
        elif role == "check":
            name = cell.metadata["course"]["check"]
            if name not in points:
                raise ValueError(f"{stem}: check cell names unknown check {name!r}")
            seen_checks.add(name)
            cell = nbformat.v4.new_code_cell(f'grade_cell("{stem}", "{name}", globals())')
            cell.metadata["nbgrader"] = _nbmeta(f"check_{name}", solution=False, points=points[name])
        else:
            cell = nbformat.from_dict(dict(cell))
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        cells.append(cell)
    unseen = sorted(set(points) - seen_checks)
    if unseen:
        raise ValueError(f"{stem}: checks without a check cell in the notebook: {unseen}")
    out = nbformat.v4.new_notebook(cells=cells, metadata=nb.metadata)
    nbformat.validate(out)
    return out


def build(directory: str | Path, stems: list[str] | None = None) -> list[Path]:
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    written = [root / "nbgrader_config.py"]
    written[0].write_text(CONFIG)
    for stem in stems or [lesson.stem for lesson in available()]:
        path = root / "source" / stem / f"{stem}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(lesson_source_notebook(stem), path)
        written.append(path)
    return written
