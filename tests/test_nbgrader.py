"""The classroom round trip with nbgrader itself: release, submit, autograde."""
import shutil
import subprocess
import sys

import nbformat
import pytest

pytest.importorskip("nbgrader")

from autograder.nbgrader_build import build  # noqa: E402
from autograder.runner import load_checks  # noqa: E402

STEM = "l01_roofline"


def _nbgrader(root, *args):
    r = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=root, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def _submit(root, student, nb):
    path = root / "submitted" / student / STEM / f"{STEM}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    build(root, [STEM])
    for student in STUDENTS:
        _nbgrader(root, "db", "student", "add", student)
    _nbgrader(root, "generate_assignment", STEM, "--force")
    source = nbformat.read(root / "source" / STEM / f"{STEM}.ipynb", as_version=4)
    release = nbformat.read(root / "release" / STEM / f"{STEM}.ipynb", as_version=4)
    _submit(root, "untouched", release)
    # A student who solved every exercise: the release with each solution cell filled in.
    solved = nbformat.from_dict(release)
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in source.cells}
    for cell in solved.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = by_id[meta["grade_id"]].source
    _submit(root, "solved", solved)
    # Cheats: each in an answer cell of an otherwise untouched release.
    for student, code in CHEATS.items():
        nb = nbformat.from_dict(release)
        first = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
        first.source = code
        _submit(root, student, nb)
    _nbgrader(root, "autograde", STEM, "--force")
    first_scores = _scores(root)
    _nbgrader(root, "autograde", STEM, "--force")  # the same submissions again: the same scores
    yield root, release, first_scores, _scores(root)
    shutil.rmtree(root, ignore_errors=True)


def _scores(root):
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        out = {}
        for s in STUDENTS:
            sub = gb.find_submission(STEM, s)
            out[s] = (sub.score, sub.max_score)
            out[s + "/cells"] = sorted((g.name, g.score) for nb in sub.notebooks for g in nb.grades)
        return out


CHEATS = {
    "imports_solutions": "from solutions.l01_roofline import *\n",
    "redefines_grade_cell": "def grade_cell(*args, **kwargs):\n    return 99.0\n",
    "patches_the_grader": ("import autograder.core\n"
                           "autograder.core.Trial.expect = lambda *a, **k: None\n"),
}
STUDENTS = ["solved", "untouched", *CHEATS]


def test_release_strips_solutions_and_keeps_test_cells(graded):
    _, release, _, _ = graded
    text = "\n".join(c.source for c in release.cells)
    assert "### BEGIN SOLUTION" not in text and "raise NotImplementedError()" in text
    tests = [c for c in release.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert {c.metadata["nbgrader"]["points"] for c in tests} and all("grade_cell(" in c.source for c in tests)
    assert sum(c.metadata["nbgrader"]["points"] for c in tests) == sum(s.points for s in load_checks(STEM))


def test_solved_submission_gets_full_marks(graded):
    _, _, scores, _ = graded
    score, max_score = scores["solved"]
    assert max_score == sum(s.points for s in load_checks(STEM)) and score == max_score, scores


def test_untouched_release_gets_zero(graded):
    _, _, scores, _ = graded
    assert scores["untouched"][0] == 0 and scores["untouched"][1] > 0, scores


@pytest.mark.parametrize("student", list(CHEATS))
def test_cheating_submission_earns_nothing(graded, student):
    """Importing the solutions, redefining grade_cell, patching the grader in the kernel: 0 points."""
    _, _, scores, _ = graded
    assert scores[student][0] == 0, (student, scores[student + "/cells"])


def test_autograding_twice_gives_the_same_scores(graded):
    _, _, first, second = graded
    assert first == second
