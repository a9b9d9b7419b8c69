"""`course gradescope build`: the autograder.zip run as Gradescope runs it, in a simulated container layout.

The zip is unpacked at ROOT/source, a submission put at ROOT/submission with its submission_metadata.json, and the
zip's own `run_autograder` script run (the image's Python replaced by this one: COURSE_PYTHON, and /autograder by
ROOT: COURSE_GRADESCOPE_ROOT). What must hold: results.json is always written and follows Gradescope's
specification; a solved submission scores full marks, a blank one 0 with "not started", a wrong one names its
mistake, a cheat earns nothing, hidden cases' rows wait for the instructor to publish them.
"""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autograder import gradescope
from autograder.lessons import ROOT
from tests.mutants import load

STEM = "l02_kv_cache"


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    """An unpacked autograder: ROOT/source holds the zip's files, as Gradescope unpacks it."""
    tmp = tmp_path_factory.mktemp("gradescope")
    zpath = gradescope.build(tmp / "out", [STEM])
    root = tmp / "autograder"
    with zipfile.ZipFile(zpath) as z:
        z.extractall(root / "source")
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
    return root


def run_submission(root: Path, files: dict[str, str], student="s1") -> dict:
    sub = root / "submission"
    if sub.exists():
        subprocess.run(["rm", "-rf", str(sub)], check=True)
    sub.mkdir()
    for name, text in files.items():
        (sub / name).parent.mkdir(parents=True, exist_ok=True)
        (sub / name).write_text(text)
    (root / "submission_metadata.json").write_text(json.dumps(
        {"assignment": {"id": 4242, "title": "KV cache"}, "users": [{"id": student, "email": f"{student}@x"}]}))
    env = {**os.environ, "COURSE_GRADESCOPE_ROOT": str(root), "COURSE_PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert gradescope.validate(results) == [], results
    return results


def total(results):
    return sum(t["score"] for t in results["tests"]), sum(t["max_score"] for t in results["tests"])


def test_solved_submission_scores_full_marks_with_hidden_rows_after_publishing(container):
    r = run_submission(container, {"exercises/l02_kv_cache.py": (ROOT / "solutions" / f"{STEM}.py").read_text()})
    earned, possible = total(r)
    assert possible > 0 and earned == pytest.approx(possible) and r["score"] == pytest.approx(possible)
    visibility = {t["visibility"] for t in r["tests"]}
    assert visibility == {"visible", "after_published"}
    assert all("hidden cases" in t["name"] for t in r["tests"] if t["visibility"] == "after_published")
    assert "sandboxed" in r["output"] and "seed" in r["output"]


def test_blank_submission_scores_zero_not_started(container):
    r = run_submission(container, {f"{STEM}.py": (ROOT / "exercises" / f"{STEM}.py").read_text()})
    assert total(r)[0] == 0 and all("not started" in t["output"] for t in r["tests"])


def test_wrong_submission_names_its_mistake(container):
    m = next(m for m in load(STEM) if m.check == "kv_bytes_per_token")
    r = run_submission(container, {f"{STEM}.py": m.source()})
    rows = [t for t in r["tests"] if t["name"].startswith(f"{STEM} kv_bytes_per_token") and t["visibility"] == "visible"]
    assert rows and rows[0]["status"] == "failed" and m.message in rows[0]["output"]
    assert total(r)[0] < total(r)[1]


def test_cheat_earns_nothing_and_a_missing_file_is_a_row(container):
    cheat = (ROOT / "exercises" / f"{STEM}.py").read_text() + (
        "\n\ndef kv_bytes_per_token(config, dtype):\n    src = open('solutions/l02_kv_cache.py').read()\n"
        "    return len(src)\n")
    r = run_submission(container, {f"{STEM}.py": cheat})
    assert total(r)[0] == 0
    r = run_submission(container, {"notes.txt": "forgot the file"})
    assert total(r)[0] == 0 and all(f"no {STEM}.py" in t["output"] for t in r["tests"])


def test_a_crashing_run_still_leaves_results(container, tmp_path):
    """The run's Python dying (here: an unreadable config) leaves the fallback's rows, every check at 0."""
    config = container / "source" / "course" / "gradescope.json"
    saved = config.read_text()
    config.write_text("{not json")
    try:
        r = run_submission(container, {f"{STEM}.py": "x = 1\n"})
    finally:
        config.write_text(saved)
    assert r["score"] == 0 and "grader stopped" in r["output"]


def test_validate_names_what_breaks_the_specification():
    assert gradescope.validate({"tests": [{"score": "1", "visibility": "sometimes", "status": "ok", "color": 1}]}) == [
        "tests[0].score should be (<class 'int'>, <class 'float'>)", "tests[0].visibility 'sometimes'",
        "tests[0].status 'ok'", "tests[0] has fields Gradescope does not know: ['color']"]
