"""`course release DIR`: the copy of the course a student receives.

It holds the lessons, the exercise stubs, the engine and the grader, and no
solutions: no `solutions/`, no `tests/` (its mutants are edited solutions), no
instructor tools (exercise generation, the nbgrader builder), and no
"### BEGIN SOLUTION" text anywhere. In their place, `autograder/visible/<stem>.bin`
stores the answers the visible cases need (`autograder/reference.py`), recorded
here by grading the solutions on the visible cases. In that copy
`course check NN` grades the visible cases and says that the hidden ones are
graded by the instructor.

The copy's README.md is its own (`student_readme`): how to install and study,
what `course check` grades there and what to hand in. The install command, the
introduction and the lesson table are read from this README at release time,
so the two never disagree.

A release ships `exercises/` and `lessons/` as they are in the working tree, so
`build` refuses a tree whose exercise files differ from the stubs `course sync`
would generate, or whose lesson notebooks hold outputs (`unshippable`), unless
told force=True.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from . import lessons, reference, scan

COPIED = ["README.md", "pyproject.toml", "lessons", "exercises", "reference_engine", "autograder"]
INSTRUCTOR_ONLY = ["autograder/sync.py", "autograder/nbgrader_build.py",
                   "autograder/release.py", "autograder/README.md", "autograder/bench.py", "autograder/new_lesson.py",
                   "autograder/gradescope.py", "autograder/batch.py", "autograder/bench_autograde.py"]
# (nbgrader_grade.py stays: the notebooks' grade_cell shares its helpers.)
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info", "visible")
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
# Words that have no place in the copy's README: the tools and files a student's copy does not have.
INSTRUCTOR_WORDS = ("pytest", "course release", "course sync", "nbgrader", "solutions", "mutant")


class Unshippable(ValueError):
    """The working tree would ship exercise files or notebooks that are not the generated, cleared ones."""

    def __init__(self, stale: list[Path], with_outputs: list[Path], root: Path):
        self.stale, self.with_outputs = stale, with_outputs
        what = []
        if stale:
            what.append("exercise files differ from the stubs `course sync` generates: "
                        + ", ".join(_rel(p, root) for p in stale))
        if with_outputs:
            what.append("lesson notebooks hold outputs: " + ", ".join(_rel(p, root) for p in with_outputs))
        super().__init__("; ".join(what))


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def notebooks_with_outputs(root: Path | None = None) -> list[Path]:
    """Lesson notebooks under root/lessons with an executed code cell (outputs or an execution count)."""
    out = []
    for path in sorted(((root or lessons.ROOT) / "lessons").glob("*.ipynb")):
        cells = json.loads(path.read_text()).get("cells", [])
        if any(c.get("cell_type") == "code" and (c.get("outputs") or c.get("execution_count")) for c in cells):
            out.append(path)
    return out


def unshippable(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(exercise files that differ from the generated stubs, lesson notebooks holding outputs) in the tree
    at `root`. Nothing is written."""
    from . import sync
    root = root or lessons.ROOT
    return sync.stale(root), notebooks_with_outputs(root)


# -- the copy's README ----------------------------------------------------------------------------------

def _section(readme: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", readme, flags=re.M | re.S)
    if not m:
        raise RuntimeError(f"README.md has no '## {title}' section to build the student copy's README from")
    return m.group(1)


def _study_install(readme: str) -> tuple[str, str]:
    """(the Quick start's study install block, what follows it up to `course lab`'s paragraph: the CPU-only
    Linux note and its command), and the Platforms table, as one text."""
    quick = _section(readme, "Quick start")
    block = re.search(r"^```bash\n(.*?)\n```\n", quick, flags=re.M | re.S)
    if not block or "pip install" not in block.group(1) or "course lab" not in block.group(1):
        raise RuntimeError("README.md's Quick start no longer opens with the study install command "
                           "(a ```bash block with `pip install` and `course lab`)")
    after = quick[block.end():]
    notes = after[:after.index("`course lab NN`")] if "`course lab NN`" in after else ""
    platforms = re.search(r"^### Platforms\n\n((?:\|.*\n)+)", quick, flags=re.M)
    if not notes.strip() or not platforms:
        raise RuntimeError("README.md's Quick start no longer has the CPU-only note after the study command "
                           "(before `course lab NN`) or a ### Platforms table")
    return block.group(1).strip(), notes.strip() + "\n\n" + platforms.group(1).strip()


def student_readme(readme: str) -> str:
    """The copy's README.md, built from the course's README (`readme`, its text)."""
    title = readme.splitlines()[0].lstrip("# ").strip()
    intro = readme.split("\n\n")[1].strip()
    install, platforms = _study_install(readme)
    table = "\n".join(line for line in _section(readme, "Lessons").splitlines() if line.startswith("|"))
    text = STUDENT_README.format(title=title, intro=intro, install=install, platforms=platforms, table=table)
    found = [w for w in INSTRUCTOR_WORDS if w in text]
    if found:
        raise RuntimeError(f"the student copy's README would mention {found}: reword README.md's introduction, "
                           "Quick start or lesson table")
    return text


STUDENT_README = """\
# {title}

{intro}

This is your copy of the course: the lessons, the exercise files you write in, the
reference engine and the grader.

## Install

```bash
{install}
```

{platforms}

## How to study

1. Open a lesson: `course lab 01` runs Jupyter Lab on lesson 01 (anything after
   the lesson number goes to Jupyter, e.g. `course lab 04 --no-browser --port 8890`;
   as root it adds `--allow-root`). `course list` lists the lessons.
2. Each exercise cell links to its stub in `exercises/lNN_<topic>.py`. Write your
   code there, keeping the stub's function names and signatures (the notebook
   reloads the file automatically), then run the check cell under it: it grades
   that exercise in place.
3. From a terminal, `course check 02` grades a whole lesson (`-v` shows every
   case, `--only NAME ...` runs some of its checks, `--file PATH` grades another
   file); `course grade` grades every lesson. `course doctor` prints the
   versions and the device and runs a quick Triton self-test.

## What `course check` grades here

Every check runs visible cases and hidden ones. Here `course check` grades the
visible cases; the hidden cases, drawn fresh for each grading so that code
written to the visible answers does not pass, are graded by your instructor.
Passing every visible case is the first step, not the grade. A case the visible
set cannot judge is reported as graded by your instructor, never as passed, and
`--seed` is refused here: the visible cases are fixed.

Statuses: **passed**; **failed** (a wrong value: the message says where and, for
the usual mistakes, which mistake); **error** (your code raised on the first
case it failed, or outside any case: the traceback shows your frames);
**timeout**; **crashed**; **not started** (the stub still raises
`NotImplementedError`); **rejected** (your module uses something no exercise
needs, such as `open`, `inspect` or importing the grader; the message names
each line); **not graded here** (needs a CUDA GPU, or Triton where it does not
install; not counted in the score).
Partial credit: you earn the fraction of a check's cases you pass.

## What to hand in

Your exercise files, `exercises/lNN_<topic>.py`, one per lesson you were
assigned, with the stubs' names and signatures kept: that is what your
instructor grades, on the visible and the hidden cases. Before you hand them
in, `course check NN` should pass here; your notebooks are for you.

## Lessons

{table}
"""


# -- building -------------------------------------------------------------------------------------------

def record(stem: str) -> tuple[dict, list]:
    """Grade the solutions on `stem`'s visible cases through a Recorder; returns (store entries, results)."""
    import importlib

    from .runner import Target, grade_lesson
    rec = reference.Recorder(importlib.import_module(f"solutions.{stem}"))
    results = grade_lesson(stem, Target.for_lesson(stem, solutions=True), reference.RELEASE_SEED,
                           visible_only=True, ref=rec)
    return rec.entries, results


def build(dest: str | Path, stems: list[str] | None = None, force: bool = False) -> Path:
    """Write the student copy to `dest` (missing or empty). Raises Unshippable, before writing anything, when
    the working tree's exercises/ or lesson notebooks are not what a copy should ship, unless force=True."""
    root, dest = lessons.ROOT, Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    stale, with_outputs = unshippable(root)
    if (stale or with_outputs) and not force:
        raise Unshippable(stale, with_outputs, root)
    readme = student_readme((root / "README.md").read_text())
    stems = stems or [lesson.stem for lesson in lessons.available()]
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=_IGNORE)
        else:
            shutil.copy2(src, dest / name)
    for rel in INSTRUCTOR_ONLY:
        (dest / rel).unlink(missing_ok=True)
    for path in instructor_only_data([lesson.stem for lesson in lessons.available()]):
        (dest / path.relative_to(root)).unlink(missing_ok=True)
    (dest / "README.md").write_text(readme)
    _student_headers(dest / "exercises")
    strip_answer_code(dest / "autograder")
    for stem in stems:
        entries, results = record(stem)
        bad = [(r.name, r.status, r.message[:200]) for r in results if r.status not in ("passed", "not graded here")]
        if bad:
            raise RuntimeError(f"{stem}: the solutions do not pass their own visible cases: {bad}")
        reference.save(stem, entries, reference.RELEASE_SEED, dest / "autograder" / "visible",
                       engine=scan.lesson_engine_use(stem).to_dict())
    leaks = leaked_solution_text(dest)
    if leaks:
        raise RuntimeError(f"solution text in the release: {leaks[:5]}")
    return dest


def _student_headers(exercises: Path) -> None:
    """The stubs' header names the maintainer's generator and solutions/; in the copy it says only what to do."""
    from . import sync
    for path in sorted(exercises.glob("l[0-9][0-9]_*.py")):
        num = path.name[1:3]
        text = path.read_text()
        generated = sync.HEADER.format(num=num, name=path.name)
        if text.startswith(generated):
            path.write_text(STUB_HEADER.format(num=num) + text[len(generated):])


def instructor_only_data(stems: list[str]) -> list[Path]:
    """Data files only hidden cases read (a checks module's INSTRUCTOR_ONLY_DATA: lesson 08's hidden seeds and
    their replays), which a copy leaves out."""
    import importlib
    out = []
    for stem in stems:
        out += list(getattr(importlib.import_module(f"autograder.checks.{stem}"), "INSTRUCTOR_ONLY_DATA", ()))
    return out


def strip_answer_code(directory: Path) -> list[Path]:
    """Strip the body of every `@answer_code` function under `directory` (the copy's grader): the code that
    computes an answer or a mistake's value. The copy replays those results from its store."""
    changed = []
    for path in sorted(directory.rglob("*.py")):
        text = path.read_text()
        if reference.ANSWER_CODE in text:
            stripped = reference.strip_answer_code(text)
            if stripped != text:
                path.write_text(stripped)
                changed.append(path)
    return changed


STUB_HEADER = ("# Lesson {num} exercises: replace each `raise NotImplementedError` with your code.\n"
               "# Check your work with `course check {num}`; keep the names and signatures.\n")


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
