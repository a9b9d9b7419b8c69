"""The classroom flow of README's "Teaching with it (nbgrader)", run with nbgrader's own commands in a temporary
directory: build, generate_assignment, release_assignment, (students) fetch_assignment and submit, collect,
autograde, generate_feedback, release_feedback / fetch_feedback, export, then a second autograde (skipped
without --force) and a forced re-grade."""
import csv
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("nbgrader")

from autograder.nbgrader_build import build  # noqa: E402
from autograder.runner import load_checks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEM = "l01_roofline"
COURSE_ID = "llm-inference"
CHEATS = {
    "imports_solutions": "from solutions.l01_roofline import *\n",
    "redefines_grade_cell": "def grade_cell(*args, **kwargs):\n    return 99.0\n",
    "patches_the_grader": ("import autograder.core\n"
                           "autograder.core.Trial.expect = lambda *a, **k: None\n"),
}
THROUGH_EXCHANGE = ["solved", "untouched"]  # fetch_assignment and submit, then collect
STUDENTS = [*THROUGH_EXCHANGE, *CHEATS]  # the cheats are handed in another way: put into submitted/ by hand


class Flow:
    """Every nbgrader command run, in order, with its output and duration."""

    def __init__(self, base: Path):
        self.base = base
        self.course, self.exchange = base / "course", base / "exchange"
        self.runs: list[tuple[str, subprocess.CompletedProcess, float]] = []

    def nbgrader(self, cwd: Path, *args: str) -> subprocess.CompletedProcess:
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, capture_output=True, text=True,
                           timeout=1200)
        self.runs.append((args[0], r, time.monotonic() - start))
        assert r.returncode == 0, " ".join(args) + "\n" + r.stdout[-3000:] + r.stderr[-3000:]
        return r

    def student(self, name: str, *args: str) -> subprocess.CompletedProcess:
        """A student's nbgrader command, run in their own folder (no course config there)."""
        home = self.base / "homes" / name
        home.mkdir(parents=True, exist_ok=True)
        return self.nbgrader(home, *args, f"--course={COURSE_ID}", f"--Exchange.root={self.exchange}",
                             f"--Exchange.cache={home / '.nbgrader_cache'}")

    def output(self, command: str) -> list[str]:
        return [r.stdout + r.stderr for name, r, _ in self.runs if name == command]


def _fill(nb, answers: dict[str, str] | None = None, first: str | None = None):
    """The notebook with solution cells replaced: by grade_id from `answers`, or only the first by `first`."""
    out = nbformat.from_dict(nb)
    solution_cells = [c for c in out.cells if c.metadata.get("nbgrader", {}).get("solution")]
    for cell in solution_cells:
        if answers is not None:
            cell.source = answers[cell.metadata["nbgrader"]["grade_id"]]
    if first is not None:
        solution_cells[0].source = first
    return out


def _scores(course: Path) -> dict:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        out = {}
        for s in STUDENTS:
            sub = gb.find_submission(STEM, s)
            out[s] = (sub.score, sub.max_score)
            out[s + "/cells"] = sorted((g.name, g.score) for nb in sub.notebooks for g in nb.grades)
        return out


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    f = Flow(tmp_path_factory.mktemp("classroom"))
    course = f.course
    build(course, [STEM])
    f.exchange.mkdir()
    config = course / "nbgrader_config.py"  # the exchange: here a temporary folder, not /srv/nbgrader/exchange
    config.write_text(config.read_text().replace('# c.Exchange.root = "/srv/nbgrader/exchange"',
                                                 f'c.Exchange.root = "{f.exchange}"'))
    f.nbgrader(course, "generate_assignment", STEM)
    f.nbgrader(course, "release_assignment", STEM)
    source = nbformat.read(course / "source" / STEM / f"{STEM}.ipynb", as_version=4)
    release = nbformat.read(course / "release" / STEM / f"{STEM}.ipynb", as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    fetched = {}
    for student in THROUGH_EXCHANGE:
        f.student(student, "fetch_assignment", STEM)
        path = f.base / "homes" / student / STEM / f"{STEM}.ipynb"
        fetched[student] = nbformat.read(path, as_version=4)
        if student == "solved":  # a student who solved every exercise: each solution cell filled in
            nbformat.write(_fill(fetched[student], answers), path)
        f.student(student, "submit", STEM, f"--student={student}")  # every student here is this test's user
    for student, code in CHEATS.items():  # cheats, each in an answer cell of an otherwise untouched release
        path = course / "submitted" / student / STEM / f"{STEM}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(_fill(release, first=code), path)
    f.nbgrader(course, "collect", STEM, "--ExchangeCollect.check_owner=False")
    f.nbgrader(course, "autograde", STEM)
    f.first_scores = _scores(course)
    f.nbgrader(course, "generate_feedback", STEM)
    f.nbgrader(course, "release_feedback", STEM, f"--CourseDirectory.student_id_exclude={','.join(CHEATS)}")
    f.student("solved", "fetch_feedback", STEM, "--student=solved")
    f.nbgrader(course, "export")
    graded = {s: course / "autograded" / s / STEM / f"{STEM}.ipynb" for s in STUDENTS}
    f.graded_mtimes = {s: p.stat().st_mtime_ns for s, p in graded.items()}
    f.nbgrader(course, "autograde", STEM)  # again, without --force: skips every submission
    f.skipped_mtimes = {s: p.stat().st_mtime_ns for s, p in graded.items()}
    f.nbgrader(course, "autograde", STEM, "--force")  # the re-grade
    f.forced_mtimes = {s: p.stat().st_mtime_ns for s, p in graded.items()}
    f.second_scores = _scores(course)
    f.release, f.fetched = release, fetched
    yield f
    durations = ", ".join(f"{name} {seconds:.1f}s" for name, _, seconds in f.runs)
    print(f"\nnbgrader commands: {durations}")
    shutil.rmtree(f.base, ignore_errors=True)


def test_no_command_warns_about_the_course_root(flow):
    """The generated config gives nbgrader an absolute root: no "root '.' is not absolute" on any command."""
    assert flow.runs
    for name, r, _ in flow.runs:
        assert "is not absolute" not in r.stdout + r.stderr, (name, r.stderr[-2000:])
    config = (flow.course / "nbgrader_config.py").read_text()
    assert 'root = "."' not in config


def test_release_strips_solutions_and_keeps_test_cells(flow):
    text = "\n".join(c.source for c in flow.release.cells)
    assert "### BEGIN SOLUTION" not in text and "raise NotImplementedError()" in text
    tests = [c for c in flow.release.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert {c.metadata["nbgrader"]["points"] for c in tests} and all("grade_cell(" in c.source for c in tests)
    assert sum(c.metadata["nbgrader"]["points"] for c in tests) == sum(s.points for s in load_checks(STEM))


def test_students_fetch_the_release_and_collect_brings_their_submissions(flow):
    for student in THROUGH_EXCHANGE:
        assert [c.source for c in flow.fetched[student].cells] == [c.source for c in flow.release.cells]
        assert (flow.course / "submitted" / student / STEM / f"{STEM}.ipynb").exists()
    collected = flow.output("collect")[0]
    assert all(f"Collecting submission: {s} {STEM}" in collected for s in THROUGH_EXCHANGE), collected


def test_solved_submission_gets_full_marks(flow):
    score, max_score = flow.first_scores["solved"]
    assert max_score == sum(s.points for s in load_checks(STEM)) and score == max_score, flow.first_scores


def test_untouched_release_gets_zero(flow):
    assert flow.first_scores["untouched"][0] == 0 and flow.first_scores["untouched"][1] > 0, flow.first_scores


@pytest.mark.parametrize("student", list(CHEATS))
def test_cheating_submission_earns_nothing(flow, student):
    """Importing the solutions, redefining grade_cell, patching the grader in the kernel: 0 points."""
    assert flow.first_scores[student][0] == 0, (student, flow.first_scores[student + "/cells"])


def test_feedback_shows_each_student_the_trusted_grades(flow):
    for student in STUDENTS:
        html = (flow.course / "feedback" / student / STEM / f"{STEM}.html").read_text()
        score, max_score = flow.first_scores[student]
        assert "graded outside the notebook" in html, student
        assert f"Score: {float(score)} / {float(max_score)}" in html, student
    fetched = list((flow.base / "homes" / "solved" / STEM / "feedback").glob(f"*/{STEM}.html"))
    assert len(fetched) == 1, fetched


def test_export_writes_every_students_score(flow):
    with open(flow.course / "grades.csv", newline="") as fh:
        rows = {row["student_id"]: row for row in csv.DictReader(fh)}
    assert set(rows) == set(STUDENTS)
    for student in STUDENTS:
        score, max_score = flow.first_scores[student]
        assert (float(rows[student]["score"]), float(rows[student]["max_score"])) == (score, max_score)


def test_a_second_autograde_skips_every_submission_without_force(flow):
    again = flow.output("autograde")[1]
    for student in STUDENTS:
        assert f"Skipping existing assignment: {flow.course / 'autograded' / student / STEM}" in again
    assert flow.skipped_mtimes == flow.graded_mtimes


def test_a_forced_regrade_grades_again_and_gives_the_same_scores(flow):
    assert all(flow.forced_mtimes[s] != flow.graded_mtimes[s] for s in STUDENTS)
    assert flow.second_scores == flow.first_scores


def _readme_flow() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("## Teaching with it (nbgrader)"):].split("\n## ", 1)[0]


def test_the_readme_documents_the_flow_this_file_runs(flow):
    """Every nbgrader command this flow runs is in the README's teaching section, and every one there was run here."""
    text = _readme_flow()
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    documented = set(re.findall(r"^nbgrader (\w+)", blocks, re.M))
    run = {name for name, _, _ in flow.runs}
    assert documented == run, (sorted(documented), sorted(run))
    assert "course nbgrader build" in text and 'pip install -e ".[teach]"' in text and "pip install -e ." in text
    assert f"nbgrader autograde {STEM} --force" in text and "Skipping existing assignment" in text


def test_the_config_names_the_course_directory_wherever_it_is(tmp_path):
    """The root is the folder holding nbgrader_config.py, absolute, even when the folder is moved."""
    build(tmp_path / "a", [STEM])
    shutil.move(tmp_path / "a", tmp_path / "b")
    code = ("from traitlets.config.loader import PyFileConfigLoader as L; "
            "print(L('nbgrader_config.py', path='.').load_config().CourseDirectory.root)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "b", capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == str(tmp_path / "b")
