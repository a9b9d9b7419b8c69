"""The student release: no solution text, and `course check` grades the visible cases from stored answers."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import lessons
from autograder.release import build, leaked_solution_text

ROOT = Path(__file__).resolve().parents[1]
READY = [lesson.stem for lesson in lessons.available()]

# Run the copy "imported from its directory": drop the editable install's finder, which maps
# `solutions` to this checkout, so the copy sees only its own files (as a student's machine would).
RUN_IN_COPY = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path[:] = [p for p in sys.path if "editable" not in p and ("site-packages" in p or not p.startswith({root!r}))]
sys.path.insert(0, {copy!r})
from autograder.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    dest = tmp_path_factory.mktemp("release") / "course"
    build(dest)
    yield dest
    shutil.rmtree(dest, ignore_errors=True)


def course_in(copy: Path, *args):
    code = RUN_IN_COPY.format(root=str(ROOT), copy=str(copy))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=copy, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(copy)})


def test_release_holds_no_solutions(copy):
    assert not (copy / "solutions").exists() and not (copy / "tests").exists()
    assert leaked_solution_text(copy) == []
    assert sorted(p.stem for p in (copy / "autograder" / "visible").glob("*.bin")) == sorted(READY)


def test_untouched_copy_is_not_started_and_says_hidden_cases_are_the_instructors(copy):
    r = course_in(copy, "check", "02")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "hidden cases are graded by your instructor" in r.stdout
    assert "not started" in r.stdout and "score 0/" in r.stdout


def test_solved_copy_passes_every_visible_case_from_stored_answers(copy, tmp_path):
    """Each lesson's solutions, put in the copy's exercises/, pass the visible cases: the store answers
    every question the checks ask of the reference."""
    work = tmp_path / "solved"
    shutil.copytree(copy, work)
    for stem in READY:
        shutil.copy(ROOT / "solutions" / f"{stem}.py", work / "exercises" / f"{stem}.py")
    out = tmp_path / "grade.json"
    r = course_in(work, "grade", "--json", str(out))
    data = json.loads(out.read_text())
    bad = [(stem, c["name"], c["status"], c["message"][:300]) for stem, v in data["lessons"].items()
           for c in v["checks"] if c["status"] not in ("passed", "not graded here")]
    assert not bad, bad
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    skipped = [(stem, c["name"], p["label"]) for stem, v in data["lessons"].items() for c in v["checks"]
               for p in c["parts"] if not p["graded"] and "instructor" in p["message"]]
    assert not skipped, skipped  # with right answers, no visible case should need the solutions


def test_wrong_answer_fails_in_the_copy_with_the_mistake_named(copy, tmp_path):
    work = tmp_path / "wrong"
    shutil.copytree(copy, work)
    src = (ROOT / "solutions" / "l02_kv_cache.py").read_text()
    src += "\n\ndef kv_bytes_per_token(config, dtype):\n    return kv_bytes_per_token_right(config, dtype) // 2\n"
    src = src.replace("def kv_bytes_per_token(", "def kv_bytes_per_token_right(", 1)
    (work / "exercises" / "l02_kv_cache.py").write_text(src)
    r = course_in(work, "check", "02", "--only", "kv_bytes_per_token")
    assert "counts only K, not K and V" in r.stdout, r.stdout + r.stderr


def test_notebook_grade_cell_works_in_the_copy(copy):
    """An nbgrader release notebook's test cell, in a student's copy: it grades the functions the notebook's
    executed cells define (here: the solution's source as one cell), on the visible cases."""
    solution = (ROOT / "solutions" / "l01_roofline.py").read_text()
    code = RUN_IN_COPY.format(root=str(ROOT), copy=str(copy)).replace(
        "from autograder.cli import main\nsys.exit(main(sys.argv[1:]))",
        "from autograder.notebook import grade_cell\n"
        f"print('EARNED', grade_cell('l01_roofline', 'matmul_cost', {{'In': ['', {solution!r}]}}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(copy)})
    assert "EARNED 2.0" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
