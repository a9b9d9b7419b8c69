"""`course autograde SUBMISSIONS --workers N`: a class graded in parallel into one gradebook, resumable, with the
exports an LMS takes. (How much faster two workers are is measured by `python -m autograder.bench_autograde`, not
timed here: the machines that run the tests are shared.)"""
import csv
import json
import shutil

import pytest

from autograder import batch
from autograder.lessons import ROOT
from autograder.nbgrader_grade import seed_for
from tests.mutants import load

STEM = "l02_kv_cache"


def make_class(root, nbgrader=True):
    """Four students: solved, blank (the stub), a named mistake, and one who submitted nothing for the lesson."""
    m = next(m for m in load(STEM) if m.check == "kv_bytes_per_token")
    answers = {"ada": (ROOT / "solutions" / f"{STEM}.py").read_text(),
               "bob": (ROOT / "exercises" / f"{STEM}.py").read_text(), "cy": m.source(), "dee": None}
    base = root / "submitted" if nbgrader else root
    for student, text in answers.items():
        folder = base / student / ("kv-assignment" if nbgrader else "exercises")
        folder.mkdir(parents=True)
        if text is not None:
            (folder / f"{STEM}.py").write_text(text)
        else:
            (folder / "notes.txt").write_text("nothing")
    return m


def scores(book):
    return {s: (e[STEM]["score"], e[STEM]["max"]) for s, e in book.items()}


def test_parallel_grades_like_serial_and_exports(tmp_path):
    m = make_class(tmp_path / "course")
    two = batch.autograde(tmp_path / "course", tmp_path / "two", [STEM], workers=2, log=lambda *_: None)
    one = batch.autograde(tmp_path / "course", tmp_path / "one", [STEM], workers=1, log=lambda *_: None)
    assert two["graded"] == one["graded"] == 4
    strip = {s: {k: v for k, v in e[STEM].items() if k != "seconds"} for s, e in two["book"].items()}
    assert strip == {s: {k: v for k, v in e[STEM].items() if k != "seconds"} for s, e in one["book"].items()}
    got = scores(two["book"])
    full = got["ada"][1]
    assert got["ada"] == (full, full) and got["bob"][0] == 0 and 0 < got["cy"][0] < full and got["dee"][0] == 0
    entry = two["book"]["cy"][STEM]
    assert entry["assignment"] == "kv-assignment" and entry["seed"] == seed_for("kv-assignment", "cy")  # as nbgrader
    assert any(m.message in c["message"] for c in entry["checks"])
    assert all(c["status"] == "not started" for c in two["book"]["bob"][STEM]["checks"])
    assert all("no l02_kv_cache.py" in c["message"] for c in two["book"]["dee"][STEM]["checks"])

    rows = list(csv.DictReader(open(tmp_path / "two" / "grades.csv")))
    assert [r["student"] for r in rows] == ["ada", "bob", "cy", "dee"]
    assert float(rows[0]["total"]) == full and f"{STEM}:kv_bytes_per_token" in rows[0]
    assert float(rows[2][f"{STEM}:kv_bytes_per_token"]) < float(rows[0][f"{STEM}:kv_bytes_per_token"])
    lesson_rows = list(csv.DictReader(open(tmp_path / "two" / f"{STEM}.csv")))
    assert len(lesson_rows) == 4 and json.loads((tmp_path / "two" / f"{STEM}.json").read_text())["ada"]["score"] == full
    fb = (tmp_path / "two" / "feedback" / "cy.md").read_text()
    assert f"## {STEM}" in fb and m.message in fb and "kv_bytes_per_token" in fb


def test_a_rerun_grades_only_new_or_changed_submissions(tmp_path):
    make_class(tmp_path / "class", nbgrader=False)
    first = batch.autograde(tmp_path / "class", tmp_path / "book", [STEM], workers=2, log=lambda *_: None)
    assert first["graded"] == 4 and first["book"]["ada"][STEM]["assignment"] == STEM
    again = batch.autograde(tmp_path / "class", tmp_path / "book", [STEM], workers=2, log=lambda *_: None)
    assert again["graded"] == 0 and again["skipped"] == 4
    shutil.copy(ROOT / "solutions" / f"{STEM}.py", tmp_path / "class" / "bob" / "exercises" / f"{STEM}.py")
    third = batch.autograde(tmp_path / "class", tmp_path / "book", [STEM], workers=2, log=lambda *_: None)
    assert third["graded"] == 1 and scores(third["book"])["bob"] == scores(third["book"])["ada"]


def test_without_the_sandbox_it_refuses(tmp_path, monkeypatch):
    from autograder import oslimits
    make_class(tmp_path / "c", nbgrader=False)
    monkeypatch.setattr(oslimits, "active", lambda: False)
    with pytest.raises(SystemExit, match="sandbox is not active"):
        batch.autograde(tmp_path / "c", tmp_path / "b", [STEM], workers=1)


def test_an_nbgrader_course_gets_the_grades_in_its_gradebook(tmp_path):
    """Graded in an nbgrader course (SUBMISSIONS/submitted and SUBMISSIONS/gradebook.db): each test cell's
    auto_score is the check's points earned, so `nbgrader export` and formgrader show them."""
    from nbgrader.api import Gradebook

    from autograder.core import load_checks
    course = tmp_path / "course"
    make_class(course)
    specs = load_checks(STEM)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:  # what `nbgrader generate_assignment` records
        gb.add_assignment("kv-assignment")
        gb.add_notebook(STEM, "kv-assignment")
        for s in specs:
            gb.add_grade_cell(f"check_{s.name}", STEM, "kv-assignment", max_score=s.points, cell_type="code")
    lines = []
    r = batch.autograde(course, tmp_path / "book", [STEM], workers=2, log=lines.append)
    assert any(line.endswith("3 submission(s) written") for line in lines if isinstance(line, str)), lines
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        assert [s.student.id for s in gb.assignment_submissions("kv-assignment")] != []
        for student, (score, full) in scores(r["book"]).items():
            if student == "dee":  # handed in nothing: no submission, as nbgrader would have it
                continue
            sub = gb.find_submission("kv-assignment", student)
            assert (sub.score, sub.max_score) == (pytest.approx(score), pytest.approx(full)), student
        cells = {g.name: g.auto_score for nb in gb.find_submission("kv-assignment", "cy").notebooks for g in nb.grades}
    cy = {f"check_{c['name']}": c["earned"] for c in r["book"]["cy"][STEM]["checks"]}
    assert cells == pytest.approx(cy) and min(cells.values()) == 0 < max(cells.values())


def test_jobs_run_longest_first():
    """The heaviest lessons go first (no worker idles at the end behind a long job): by the gradebook's seconds
    when it has every lesson, else by the checks' time limits."""
    jobs = [batch.Job(s, stem, stem, "", "") for s in ("a", "b") for stem in ("l13_gpu_utilization", "l14_speculative_decoding")]
    assert [j.stem for j in batch.longest_first(jobs, {})][:2] == ["l14_speculative_decoding"] * 2
    book = {"a": {"l13_gpu_utilization": {"seconds": 9.0}, "l14_speculative_decoding": {"seconds": 1.0}}}
    assert [(j.student, j.stem) for j in batch.longest_first(jobs, book)][:2] == [("a", "l13_gpu_utilization"),
                                                                                 ("b", "l13_gpu_utilization")]
