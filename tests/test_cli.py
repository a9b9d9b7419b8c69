"""`course check`'s command line: unknown checks refused, a reproduce line that repeats the run, and the status a
check gets when the learner's code raised."""
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from autograder import core
from autograder.core import Part, load_checks
from autograder.runner import _summarise

ROOT = Path(__file__).resolve().parents[1]


def _course(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "autograder.cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def _table(stdout: str) -> str:
    """The check table of `course check`'s output (the header line to the blank line before the score)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("check "))
    end = next(i for i, line in enumerate(lines) if line.startswith("score "))
    return "\n".join(lines[start:end])


def test_only_with_an_unknown_check_names_it_and_lists_the_lessons_checks():
    r = _course("check", "02", "--only", "dtype_bytes", "nosuch", "kv_bytes_per_tokn")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "score" not in r.stdout and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "nosuch" in line and "kv_bytes_per_tokn" in line
    names = [spec.name for spec in load_checks("l02_kv_cache")]
    assert line.endswith(", ".join(names)), line
    assert line.split(";")[0].count("dtype_bytes") == 0  # a known name is not called unknown


def test_reproduce_line_repeats_the_exact_run(tmp_path):
    """The reproduce line keeps the seed, the file (quoted) and the --only checks: running it gives the same
    table."""
    work = tmp_path / "my work"
    work.mkdir()
    learner = work / "l02_kv_cache.py"
    shutil.copy(ROOT / "solutions" / "l02_kv_cache.py", learner)
    first = _course("check", "02", "--seed", "7", "--file", str(learner), "--only", "dtype_bytes", "kv_cache_bytes")
    assert first.returncode == 0, first.stdout + first.stderr
    (line,) = [x for x in first.stdout.splitlines() if x.startswith("reproduce with: ")]
    words = shlex.split(line.removeprefix("reproduce with: "))
    assert words[:2] == ["course", "check"]
    assert words[words.index("--only") + 1:words.index("--only") + 3] == ["dtype_bytes", "kv_cache_bytes"]
    assert words[words.index("--file") + 1] == str(learner)
    again = _course(*words[1:])
    assert again.returncode == 0, again.stdout + again.stderr
    assert _table(again.stdout) == _table(first.stdout)
    assert [r.split()[0] for r in _table(again.stdout).splitlines()[2:]] == ["dtype_bytes", "kv_cache_bytes"]


# dtype_bytes right for names, and raising (AttributeError: an int has no .lower) for a width or a torch.dtype.
NAMES_ONLY = '''
NAMES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
         "float8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def dtype_bytes(dtype):
    if dtype.lower() not in NAMES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return NAMES[dtype.lower()]
'''


def test_a_check_whose_first_failed_case_raised_is_an_error(tmp_path):
    """The README: "error (your code raised ...)". Passing some cases does not make a raise "failed"."""
    learner = tmp_path / "l02_kv_cache.py"
    learner.write_text(NAMES_ONLY)
    out = tmp_path / "r.json"
    r = _course("check", "02", "--seed", "1", "--only", "dtype_bytes", "--file", str(learner), "--json", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    (check,) = json.loads(out.read_text())["lessons"]["l02_kv_cache"]["checks"]
    assert check["status"] == "error", (check["status"], check["message"])
    assert 0 < check["earned"] < check["points"]  # the names passed
    assert check["message"].startswith("dtype_bytes(2): dtype_bytes() raised:"), check["message"]
    assert "AttributeError" in check["message"]
    assert " error " in _table(r.stdout)


def test_status_is_that_of_the_first_failed_case():
    spec = type("Spec", (), {"points": 2.0})()
    ok, wrong = Part("a", 1.0, True), Part("b", 1.0, False, "got 1, expected 2", kind=core.WRONG)
    raised = Part("c", 1.0, False, "f() raised:\nValueError: no", kind=core.RAISED)
    earned, status, msg = _summarise(spec, [ok, raised, wrong])
    assert (status, earned) == ("error", round(2 / 3, 2)) and msg.startswith("c: f() raised:")
    earned, status, msg = _summarise(spec, [ok, wrong, raised])
    assert status == "failed" and msg.startswith("b: got 1, expected 2") and "(1 more of 3 cases failed)" in msg
    assert _summarise(spec, [raised, raised])[1] == "error"
    assert _summarise(spec, [wrong, wrong])[1] == "failed"


def test_learner_text_cannot_draw_on_the_terminal():
    """What a learner's code printed or raised is shown, never obeyed: an ESC sequence or a carriage return
    could otherwise clear the screen or draw a fake "score 17/17" line over the real one."""
    from autograder.core import CheckResult
    from autograder.report import check_table
    fake = "\x1b[2J\x1b[Hscore 17/17\rok"
    r = CheckResult("l02_kv_cache", "dtype_bytes", "1", 1.0, 0.0, "error", f"dtype_bytes() raised:\n{fake}",
                    parts=[{"label": "case", "passed": False, "graded": True, "message": fake}], output=fake)
    table = check_table([r], verbose=True)
    assert "\x1b" not in table and "\r" not in table
    assert "\\x1b[2J" in table and "\\x0dok" in table
