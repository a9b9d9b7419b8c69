"""The solutions earn full marks; the untouched exercises earn zero, every check 'not started'."""
import json
import subprocess
import sys

import pytest

from autograder import lessons
from autograder.runner import Target, grade_lesson

READY = [lesson.stem for lesson in lessons.available()]


def test_lessons_01_and_02_are_ready():
    assert {"l01_roofline", "l02_kv_cache"} <= set(READY)


@pytest.mark.parametrize("stem", READY)
@pytest.mark.parametrize("seed", [0, 987654])
def test_solutions_score_full_marks(stem, seed):
    results = grade_lesson(stem, Target.for_lesson(stem, solutions=True), seed)
    bad = [(r.name, r.status, r.message) for r in results if r.status not in ("passed", "not graded here")]
    assert not bad, bad
    assert all(r.earned == r.points for r in results if r.status == "passed")


@pytest.mark.parametrize("stem", READY)
def test_untouched_exercises_score_zero_not_started(stem):
    results = grade_lesson(stem, Target.for_lesson(stem), seed=3)
    assert results
    assert [r.status for r in results if r.status != "not graded here"] == \
        ["not started"] * sum(r.status != "not graded here" for r in results), \
        [(r.name, r.status, r.message) for r in results]
    assert sum(r.earned for r in results) == 0
    assert all("Exercise" in r.message for r in results if r.status == "not started")


def _course(*args):
    return subprocess.run([sys.executable, "-m", "autograder.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_cli_check_exit_codes_and_rows():
    ok = _course("check", "01", "--solutions", "--seed", "5")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "passed" in ok.stdout and "reproduce with: course check 01 --seed 5 --solutions" in ok.stdout
    todo = _course("check", "01", "--seed", "5")
    assert todo.returncode == 1
    assert "not started" in todo.stdout and "score 0/" in todo.stdout
    assert _course("check", "42").returncode == 2


def test_cli_grade_json(tmp_path):
    out = tmp_path / "grades.json"
    r = _course("grade", "--solutions", "--seed", "9", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["seed"] == 9 and set(READY) == set(data["lessons"])
    assert data["earned"] == data["possible"] > 0
    for lesson in data["lessons"].values():
        assert sum(c["points"] for c in lesson["checks"] if c["status"] != "not graded here") == lesson["possible"]


def test_doctor_runs_the_triton_self_test():
    r = _course("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "self-test passed" in r.stdout and "torch" in r.stdout


def test_course_lab_adds_allow_root_only_as_root(monkeypatch):
    """Jupyter refuses to start as root without --allow-root (containers often run as root)."""
    import os

    from autograder.cli import lab_command
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert lab_command("01", [])[-1] == "--allow-root" and lab_command("01", [])[4].endswith("l01_roofline.ipynb")
    assert lab_command("01", ["--allow-root"]).count("--allow-root") == 1
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "--allow-root" not in lab_command(None, ["--no-browser"]) and lab_command(None, [])[-1].endswith("lessons")


def test_an_expected_nan_is_matched_only_by_a_nan():
    """NaN compares False with everything, so a tolerance test alone would let any value match it."""
    import torch

    from autograder.compare import compare
    expected = torch.tensor([1.0, float("nan")])
    assert compare(torch.tensor([1.0, float("nan")]), expected) is None
    assert compare(torch.tensor([1.0, 0.0]), expected) is not None
    assert compare(torch.tensor([float("nan"), float("nan")]), expected) is not None
