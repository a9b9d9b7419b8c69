"""`course release DIR`: the copy of the course a student receives.

It holds the lessons, the exercise stubs, the engine and the grader, and no
solutions: no `solutions/`, no `tests/` (its mutants are edited solutions), no
instructor tools (exercise generation, the nbgrader builder), and no
"### BEGIN SOLUTION" text anywhere. In their place, `autograder/visible/<stem>.bin`
stores the answers the visible cases need (`autograder/reference.py`), recorded
here by grading the solutions on the visible cases. In that copy
`course check NN` grades the visible cases and says that the hidden ones are
graded by the instructor.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from . import lessons, reference

COPIED = ["README.md", "pyproject.toml", "lessons", "exercises", "reference_engine", "autograder"]
INSTRUCTOR_ONLY = ["autograder/sync.py", "autograder/nbgrader_build.py",
                   "autograder/release.py", "autograder/README.md", "autograder/bench.py"]
# (nbgrader_grade.py stays: the notebooks' grade_cell shares its helpers.)
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info", "visible")
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")

STUDENT_NOTE = """# Your copy of the course

This copy has no solutions. `course check NN` grades each exercise's visible
cases against answers stored in `autograder/visible/` (recorded from the
reference solutions when this copy was made); the hidden cases, drawn fresh,
are graded by your instructor.
"""


def record(stem: str) -> tuple[dict, list]:
    """Grade the solutions on `stem`'s visible cases through a Recorder; returns (store entries, results)."""
    import importlib

    from .runner import Target, grade_lesson
    rec = reference.Recorder(importlib.import_module(f"solutions.{stem}"))
    results = grade_lesson(stem, Target.for_lesson(stem, solutions=True), reference.RELEASE_SEED,
                           visible_only=True, ref=rec)
    return rec.entries, results


def build(dest: str | Path, stems: list[str] | None = None) -> Path:
    root, dest = lessons.ROOT, Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=_IGNORE)
        else:
            shutil.copy2(src, dest / name)
    for rel in INSTRUCTOR_ONLY:
        (dest / rel).unlink(missing_ok=True)
    (dest / "STUDENT_COPY.md").write_text(STUDENT_NOTE)
    for stem in stems or [lesson.stem for lesson in lessons.available()]:
        entries, results = record(stem)
        bad = [(r.name, r.status, r.message[:200]) for r in results if r.status not in ("passed", "not graded here")]
        if bad:
            raise RuntimeError(f"{stem}: the solutions do not pass their own visible cases: {bad}")
        reference.save(stem, entries, reference.RELEASE_SEED, dest / "autograder" / "visible")
    leaks = leaked_solution_text(dest)
    if leaks:
        raise RuntimeError(f"solution text in the release: {leaks[:5]}")
    return dest


def leaked_solution_text(dest: Path) -> list[str]:
    """Files under `dest` that contain a solution marker, or a solutions/ directory."""
    out = []
    for path in dest.rglob("*"):
        if path.is_dir() and path.name == "solutions":
            out.append(str(path))
        elif path.is_file() and path.suffix in (".py", ".ipynb", ".md", ".txt", ".toml", ".json", ".cfg"):
            text = path.read_text(errors="replace")
            if any(m in text for m in MARKERS):
                out.append(str(path))
    return out
