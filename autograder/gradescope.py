"""A Gradescope autograder for the course: `course gradescope build OUT [LESSONS]` writes OUT/autograder.zip.

Gradescope's autograder specification (its docs, "Autograder Specifications"): the zip holds `setup.sh`, run once
when the image is built, and `run_autograder`, run once per submission in a fresh container, with the zip unpacked
at /autograder/source, the student's files at /autograder/submission (and submission_metadata.json beside them),
and the results expected at /autograder/results/results.json: a test per row (`name`, `number`, `score`,
`max_score`, `status`, `output`, `visibility`), the total `score` and the `execution_time`.

What this autograder does in that container (`python -m autograder.gradescope run`, which run_autograder calls):
- finds the lessons' answers in the submission: the exercise file (`l02_kv_cache.py`, anywhere under the
  submission) or the nbgrader notebook (`l02_kv_cache.ipynb`, its answer cells, as `nbgrader autograde` reads them);
- grades them with the course's grader, visible and hidden cases, the learner code in the sandboxed learner
  process (autograder/oslimits.py); refuses, with a row that says why, where the sandbox is not active, unless the
  zip was built with --allow-unsandboxed (a container per submission is some isolation, but the grader and the
  solutions are in it);
- writes one row per check and kind of case: "visible cases" (visible at once, the check's message) and "hidden
  cases" (`after_published`: the instructor publishes them; a hidden case is named by its label and how it ended,
  never its inputs, report.student_message); the points are split by the cases' weights;
- always writes results.json: a missing file, a check that crashes the grader, the whole run's time limit (the
  run_autograder script writes a fallback if Python never did) are rows with 0 points and a message.
The seed comes from the assignment and the students' ids (submission_metadata.json), so a regrade repeats it.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

from . import lessons

SHIPPED = ["pyproject.toml", "README.md", "autograder", "reference_engine", "solutions", "exercises"]
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info", "visible")
VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")
TIMEOUT_S = 40 * 60  # the whole run; Gradescope's own default limit is 10 minutes: raise it in the assignment
TORCH_PIN = "torch==2.13.0"

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder's image.
set -euo pipefail
apt-get update -qq && apt-get install -y -qq python3-venv > /dev/null || true
python3 -m venv /autograder/venv
# the CPU build of torch (the public index's default build is CUDA's, gigabytes Gradescope cannot use)
/autograder/venv/bin/pip install -q {torch} --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install -q -e /autograder/source/course
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this once per submission. Never exits without results.json.
ROOT="${{COURSE_GRADESCOPE_ROOT:-/autograder}}"
PY="${{COURSE_PYTHON:-/autograder/venv/bin/python}}"
SOURCE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$ROOT/results"
rm -f "$ROOT/results/results.json"
cd "$SOURCE/course"
timeout -k 10 {timeout} "$PY" -m autograder.gradescope run --root "$ROOT" --config "$SOURCE/course/gradescope.json"
status=$?
if [ ! -s "$ROOT/results/results.json" ]; then
  "$PY" -m autograder.gradescope fallback --root "$ROOT" --config "$SOURCE/course/gradescope.json" --status "$status" \\
  || printf '{{"score": 0, "output": "The grader stopped before it wrote any result (exit status %s). Please tell your \
instructor.", "tests": []}}' "$status" > "$ROOT/results/results.json"
fi
exit 0
"""


# -- build ---------------------------------------------------------------------------------------------------

def build(out: str | Path, stems: list[str] | None = None, allow_unsandboxed: bool = False,
          timeout_s: int = TIMEOUT_S) -> Path:
    """Write OUT/autograder.zip for these lessons (default: every ready one)."""
    stems = stems or [lesson.stem for lesson in lessons.available()]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {"lessons": stems, "allow_unsandboxed": allow_unsandboxed, "timeout_s": timeout_s}
    with tempfile.TemporaryDirectory(prefix="course-gradescope-") as tmp:
        course = Path(tmp) / "course"
        course.mkdir()
        for rel in SHIPPED:
            src = lessons.ROOT / rel
            if src.is_dir():
                shutil.copytree(src, course / rel, ignore=_IGNORE)
            elif src.exists():
                shutil.copy2(src, course / rel)
        (course / "gradescope.json").write_text(json.dumps(config, indent=1) + "\n")
        scripts = {"setup.sh": SETUP_SH.format(torch=TORCH_PIN), "run_autograder": RUN_AUTOGRADER.format(timeout=timeout_s)}
        zpath = out / "autograder.zip"
        with zipfile.ZipFile(zpath, "w", zipfile.ZIP_DEFLATED) as z:
            for name, text in scripts.items():
                info = zipfile.ZipInfo(name)
                info.external_attr = 0o755 << 16
                z.writestr(info, text)
            for path in sorted(course.rglob("*")):
                if path.is_file():
                    z.write(path, path.relative_to(tmp))
    return zpath


# -- one submission ------------------------------------------------------------------------------------------

def answer_file(folder: Path, stem: str) -> Path | None:
    """The lesson's exercise file or notebook anywhere under folder: the shallowest, a .py before an .ipynb."""
    found = sorted((p for p in folder.rglob(f"{stem}.*") if p.suffix in (".py", ".ipynb")),
                   key=lambda p: (len(p.parts), p.suffix != ".py"))
    return found[0] if found else None


def find_answers(submission: Path, stem: str) -> tuple[str | None, str]:
    """(the learner module's source, where it came from), or (None, why not): the exercise file or the nbgrader
    notebook of the lesson, anywhere under the submission (the shallowest if several)."""
    from .nbgrader_grade import submission_source
    path = answer_file(submission, stem)
    if path is None:
        return None, f"the submission has no {stem}.py (your exercises/{stem}.py) and no {stem}.ipynb"
    try:
        if path.suffix == ".py":
            return path.read_text(encoding="utf-8", errors="replace"), path.name
        import nbformat
        nb = nbformat.read(path, as_version=4)
        if not any(c.metadata.get("nbgrader", {}).get("solution") for c in nb.cells):
            return None, (f"{path.name} has no answer cells: submit the notebook `course nbgrader build` made, or "
                          f"your exercises/{stem}.py (the lesson's own notebook keeps your answers in that file)")
        return submission_source(stem, nb), f"{path.name} (its answer cells)"
    except Exception as e:  # noqa: BLE001 - an unreadable file is the student's row, not the grader's crash
        return None, f"{path.name} could not be read: {type(e).__name__}: {e}"


def seed_of(root: Path) -> tuple[int, str]:
    """The grading seed from the assignment and the submitters' ids (a regrade repeats it), and what it came from."""
    from .nbgrader_grade import seed_for
    try:
        meta = json.loads((root / "submission_metadata.json").read_text())
        assignment = str((meta.get("assignment") or {}).get("id", ""))
        users = ",".join(sorted(str(u.get("id", "")) for u in meta.get("users") or []))
        return seed_for(assignment, users), f"assignment {assignment!r}, students {users!r}"
    except (OSError, ValueError, AttributeError, TypeError):
        return 0, "seed 0 (no readable submission_metadata.json)"


def _share(parts: list[dict], hidden: bool) -> tuple[float, float]:
    """(passed weight, weight) of the graded cases of one kind."""
    mine = [p for p in parts if p["graded"] and bool(p.get("hidden")) == hidden]
    return sum(p["weight"] for p in mine if p["passed"]), sum(p["weight"] for p in mine)


def rows_for(r, number: str) -> list[dict]:
    """Gradescope rows for one CheckResult: one for its visible cases, one (after_published) for its hidden ones;
    a check that stopped before its cases (not started, a crash, a time limit) is one visible row with 0."""
    from . import report
    parts = report.parts_of(r)
    total = sum(p["weight"] for p in parts if p["graded"])
    status = "passed" if r.status == "passed" else "failed"
    name = f"{r.lesson} {r.name}"
    if not total or not r.graded:
        score = round(r.earned, 2) if r.graded else 0.0
        why = "not graded on this machine: " if not r.graded else \
            "" if r.status in ("passed", "failed") else f"{r.status}: "
        return [{"name": name, "number": number, "score": score, "max_score": r.points, "status": status,
                 "output": why + report.student_message(r), "visibility": "visible"}]
    rows = []
    for hidden, label, visibility in ((False, "visible cases", "visible"), (True, "hidden cases", "after_published")):
        passed, weight = _share(parts, hidden)
        if not weight:
            continue
        failed = [p for p in parts if p["graded"] and not p["passed"] and bool(p.get("hidden")) == hidden]
        if hidden:
            output = report.hidden_failures(failed) if failed else "every hidden case passed"
        else:
            output = "\n".join(f"{p['label']}: {p['message']}" for p in failed) or "every visible case passed"
        rows.append({"name": f"{name} ({label})", "number": f"{number}{'h' if hidden else ''}",
                     "score": round(r.points * passed / total, 2), "max_score": round(r.points * weight / total, 2),
                     "status": "passed" if passed == weight else "failed", "output": output, "visibility": visibility})
    return rows


def _zero_rows(stem: str, number: int, why: str) -> list[dict]:
    from .core import load_checks
    try:
        specs = load_checks(stem)
    except Exception:  # noqa: BLE001 - even the checks failing to load leaves a row
        return [{"name": stem, "number": str(number), "score": 0.0, "max_score": 0.0, "status": "failed",
                 "output": why, "visibility": "visible"}]
    return [{"name": f"{stem} {s.name}", "number": f"{number}.{i}", "score": 0.0, "max_score": s.points,
             "status": "failed", "output": why, "visibility": "visible"} for i, s in enumerate(specs, 1)]


def grade_submission(root: Path, stems: list[str], allow_unsandboxed: bool = False) -> dict:
    """results.json's content for the submission under root/submission."""
    from . import oslimits, runtime
    from .runner import Target, grade_lesson
    start = time.perf_counter()
    runtime.setup()
    seed, seeded_by = seed_of(root)
    sandboxed = oslimits.active()
    notes = [f"Graded by the course's grader: your code ran in a sandboxed process ({oslimits.describe()}); "
             f"seed {seed} ({seeded_by}). Hidden cases' rows are shown once your instructor publishes the grades."]
    tests: list[dict] = []
    for stem in stems:
        lesson = lessons.by_stem(stem)
        if not sandboxed and not allow_unsandboxed:
            tests += _zero_rows(stem, lesson.number, "not graded: the course's sandbox is not active in this "
                                f"container ({oslimits.describe()}); your instructor can build the autograder "
                                "with --allow-unsandboxed")
            continue
        source, where = find_answers(root / "submission", stem)
        if source is None:
            tests += _zero_rows(stem, lesson.number, where)
            continue
        try:
            with tempfile.TemporaryDirectory(prefix="course-gradescope-") as tmp:
                target = Target.from_source(source, tmp, f"submission_{stem}", label=f"your {where}")
                results = grade_lesson(stem, target, seed)
            for i, r in enumerate(results, 1):
                tests += rows_for(r, f"{lesson.number}.{i}")
        except Exception:  # noqa: BLE001 - a grader failure is a row, and the next lesson is still graded
            tests += _zero_rows(stem, lesson.number, "the grader failed on this lesson (please tell your instructor): "
                                + traceback.format_exc(limit=3).strip().splitlines()[-1])
    return {"score": round(sum(t["score"] for t in tests), 2), "execution_time": round(time.perf_counter() - start, 1),
            "output": "\n".join(notes), "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def write_results(root: Path, results: dict) -> Path:
    path = root / "results" / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(path)
    return path


def fallback(root: Path, stems: list[str], status: int) -> dict:
    """What run_autograder writes when the run wrote nothing: every check 0, with the reason."""
    why = (f"the grader's time limit ended the run (exit status {status}): your code may be far too slow or never "
           "return" if status in (124, 137) else f"the grader stopped before it wrote any result (exit status {status})")
    tests = [row for stem in stems for row in _zero_rows(stem, lessons.by_stem(stem).number, why)]
    return {"score": 0.0, "output": why + ". Please tell your instructor if this keeps happening.", "tests": tests}


def validate(results: dict) -> list[str]:
    """What in results.json does not follow Gradescope's specification (field names and types); [] when it does."""
    errors = []
    num = (int, float)
    for key, kind in (("score", num), ("execution_time", num), ("output", str), ("visibility", str),
                      ("stdout_visibility", str), ("tests", list)):
        if key in results and not isinstance(results[key], kind):
            errors.append(f"{key} should be {kind}")
    for v in ("visibility", "stdout_visibility"):
        if v in results and results[v] not in VISIBILITIES:
            errors.append(f"{v} {results[v]!r} is not one of {VISIBILITIES}")
    if "score" not in results and not all("score" in t for t in results.get("tests", [])):
        errors.append("no total score and a test without one")
    for i, t in enumerate(results.get("tests", [])):
        for key, kind in (("score", num), ("max_score", num), ("name", str), ("number", str), ("output", str),
                          ("visibility", str), ("status", str)):
            if key in t and not isinstance(t[key], kind):
                errors.append(f"tests[{i}].{key} should be {kind}")
        if t.get("visibility", "visible") not in VISIBILITIES:
            errors.append(f"tests[{i}].visibility {t['visibility']!r}")
        if t.get("status", "passed") not in ("passed", "failed"):
            errors.append(f"tests[{i}].status {t['status']!r}")
        unknown = set(t) - {"score", "max_score", "status", "name", "name_format", "number", "output",
                            "output_format", "tags", "visibility", "extra_data"}
        if unknown:
            errors.append(f"tests[{i}] has fields Gradescope does not know: {sorted(unknown)}")
    return errors


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.gradescope")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "fallback"):
        s = sub.add_parser(name)
        s.add_argument("--root", default="/autograder")
        s.add_argument("--config", required=True)
        s.add_argument("--status", type=int, default=1)
    args = p.parse_args(argv)
    root = Path(args.root)
    config = json.loads(Path(args.config).read_text())
    if args.cmd == "fallback":
        write_results(root, fallback(root, config["lessons"], args.status))
        return 0
    try:
        results = grade_submission(root, config["lessons"], config.get("allow_unsandboxed", False))
    except Exception:  # noqa: BLE001 - whatever happens, the student gets a results file
        results = fallback(root, config["lessons"], 1)
        results["output"] += "\n" + traceback.format_exc(limit=3).strip().splitlines()[-1]
    write_results(root, results)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
