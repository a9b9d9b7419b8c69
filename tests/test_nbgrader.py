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
    _nbgrader(root, "db", "student", "add", "solved")
    _nbgrader(root, "db", "student", "add", "untouched")
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
    _nbgrader(root, "autograde", STEM, "--force")
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        scores = {s: (gb.find_submission(STEM, s).score, gb.find_submission(STEM, s).max_score)
                  for s in ("solved", "untouched")}
    yield root, release, scores
    shutil.rmtree(root, ignore_errors=True)


def test_release_strips_solutions_and_keeps_test_cells(graded):
    _, release, _ = graded
    text = "\n".join(c.source for c in release.cells)
    assert "### BEGIN SOLUTION" not in text and "raise NotImplementedError()" in text
    tests = [c for c in release.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert {c.metadata["nbgrader"]["points"] for c in tests} and all("grade_cell(" in c.source for c in tests)
    assert sum(c.metadata["nbgrader"]["points"] for c in tests) == sum(s.points for s in load_checks(STEM))


def test_solved_submission_gets_full_marks(graded):
    _, _, scores = graded
    score, max_score = scores["solved"]
    assert max_score == sum(s.points for s in load_checks(STEM)) and score == max_score, scores


def test_untouched_release_gets_zero(graded):
    _, _, scores = graded
    assert scores["untouched"][0] == 0 and scores["untouched"][1] > 0, scores
