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
    assert lab_command("01", [])[-1] == "--allow-root" and lab_command("01", [])[-2].endswith("l01_roofline.ipynb")
    assert lab_command("01", ["--allow-root"]).count("--allow-root") == 1
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "--allow-root" not in lab_command(None, ["--no-browser"]) and lab_command(None, [])[-1].startswith(
        "--ServerApp.root_dir=")


def test_an_expected_nan_is_matched_only_by_a_nan():
    """NaN compares False with everything, so a tolerance test alone would let any value match it."""
    import torch

    from autograder.compare import compare
    expected = torch.tensor([1.0, float("nan")])
    assert compare(torch.tensor([1.0, float("nan")]), expected) is None
    assert compare(torch.tensor([1.0, 0.0]), expected) is not None
    assert compare(torch.tensor([float("nan"), float("nan")]), expected) is not None
    assert compare(float("nan"), float("nan")) is None and compare(1.0, float("nan")) is not None
    assert compare(float("nan"), 1.0) == "got NaN"


def test_the_fast_path_for_large_exact_matches_keeps_compares_verdicts(monkeypatch):
    """compare() says yes at once to a large container whose repr equals the expected one; every verdict must
    be the one the element-by-element comparison gives."""
    from autograder import compare as C
    expected = [(i, i * 0.5, i % 2 == 0, f"s{i}") for i in range(64)]
    nans = [float("nan")] * 40
    cases = [([tuple(x) for x in expected], expected, {}),
             ([(i, i * 0.5, int(i % 2 == 0), f"s{i}") for i in range(64)], expected, {}),  # 1 is not True
             ([list(x) for x in expected], expected, {}),
             ([(i, i * 0.5 + 1e-12, i % 2 == 0, f"s{i}") for i in range(64)], expected, {"rtol": 1e-6}),
             ([(i, i * 0.5 + 1e-3, i % 2 == 0, f"s{i}") for i in range(64)], expected, {"rtol": 1e-6}),
             (list(nans), nans, {}),
             ({str(i): i for i in range(40)}, {str(i): i for i in range(40)}, {}),
             ({str(i): float(i) for i in range(40)}, {str(i): i for i in range(40)}, {})]
    fast = [C.compare(g, e, **kw) for g, e, kw in cases]
    assert fast[0] is None and fast[1] is not None and fast[5] is None  # NaN matches NaN, as for tensors
    monkeypatch.setattr(C, "_identical", lambda got, expected: False)
    assert fast == [C.compare(g, e, **kw) for g, e, kw in cases]
