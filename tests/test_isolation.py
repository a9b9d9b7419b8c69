"""Learner code is untrusted: whatever it does, the grader reports a status and a score."""
import textwrap
import types

import pytest

from autograder.runner import Target, grade_lesson


def grade_source(src: str, tmp_path=None, name="learner_mod"):
    mod = types.ModuleType(name)
    exec(compile(textwrap.dedent(src), f"/learner/{name}.py", "exec"), mod.__dict__)
    return grade(Target(module=mod, label="learner"))


def grade(target, seed=1):
    res = grade_lesson("toy", target, seed, checks_module="tests.fake.toy",
                       ref_module="tests.fake.toy_ref", timeout_scale=1.0)
    return {r.name: r for r in res}


GOOD_COUNT = "def count(n):\n    return n\n"


@pytest.mark.parametrize("body,status,phrase", [
    ("def double(x):\n    return 2 * x\n", "passed", "4 case(s) passed"),
    ("def double(x):\n    raise NotImplementedError('Exercise 9.9')\n", "not started", "Exercise 9.9"),
    ("def double(x):\n    while True:\n        pass\n", "timeout", "still running"),
    ("import ctypes\ndef double(x):\n    return ctypes.string_at(0)\n", "crashed", "segmentation fault"),
    ("import sys\ndef double(x):\n    sys.exit(3)\n", "error", "sys.exit"),
    ("import os\ndef double(x):\n    os._exit(7)\n", "error", "exited with code 7"),
    ("def double(x):\n    raise ValueError('boom')\n", "error", "ValueError: boom"),
    ("def double(x):\n    return (2 * x)[:-1]\n", "failed", "shape"),
    ("def double(x):\n    return (2 * x).double()\n", "failed", "dtype torch.float64, expected torch.float32"),
    ("def double(x):\n    return x * x\n", "failed", "squares instead of doubling"),
    ("def double(x):\n    return x.mul_(2)\n", "failed", "modified its argument #1 in place"),
    ("def double(x):\n    return bytearray(64 * 2**30)\n", "error", "MemoryError"),
    ("def double(x):\n    return [2 * v for v in x.tolist()]\n", "failed", "expected a torch.Tensor, got list"),
    ("def double(x):\n    print('hello ' * 10000)\n    return 2 * x\n", "passed", ""),
])
def test_untrusted_learner_code_gets_a_status(body, status, phrase):
    r = grade_source(body + GOOD_COUNT)["double"]
    assert r.status == status, (r.status, r.message)
    assert phrase in r.message
    assert r.earned == (2.0 if status == "passed" else 0.0)


def test_partial_credit_for_partly_right_code():
    # Right on the two 3- and 5-value visible cases only.
    r = grade_source("def double(x):\n    return 2 * x if len(x) in (3, 5) else x\n" + GOOD_COUNT)["double"]
    assert r.status == "failed" and 0 < r.earned < 2


def test_traceback_shows_learner_frames_not_the_graders():
    r = grade_source("def helper(x):\n    return x.nope\ndef double(x):\n    return helper(x)\n"
                     + GOOD_COUNT)["double"]
    assert "/learner/learner_mod.py" in r.message and "helper" in r.message
    assert "autograder" not in r.message


def test_missing_function_is_named():
    r = grade_source(GOOD_COUNT)["double"]
    assert r.status == "error" and "has no `double`" in r.message


def test_hidden_cases_follow_the_seed():
    src = "def double(x):\n    return 2 * x if len(x) in (3, 5) else x\n" + GOOD_COUNT
    a, b = grade_source(src)["double"], grade_source(src)["double"]
    assert a.message == b.message  # same seed, same hidden cases


@pytest.mark.parametrize("src,status,phrase", [
    ("def double(x)\n    return x\n", "error", "SyntaxError"),
    ("raise RuntimeError('at import')\n", "error", "at import"),
    ("while True:\n    pass\n", "timeout", "module level"),
    ("import ctypes\nctypes.string_at(0)\n", "crashed", "crashed the interpreter"),
])
def test_broken_module_import_fails_every_check_cleanly(tmp_path, monkeypatch, src, status, phrase):
    pkg = tmp_path / "broken_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    from autograder import runner
    monkeypatch.setattr(runner, "preflight", lambda t, timeout=3.0: runner.sandbox.run_isolated(
        runner._import_target, (t,), timeout=timeout))
    res = grade(Target(module_name="broken_pkg.mod", label="broken_pkg/mod.py"))
    assert {r.status for r in res.values()} == {status}, [(r.status, r.message) for r in res.values()]
    assert all(phrase in r.message for r in res.values())
    assert all(r.earned == 0 for r in res.values())


def test_forkserver_path_used_with_cuda_grades_the_same(tmp_path, monkeypatch):
    """With CUDA initialised the grader cannot fork; its forkserver path must grade alike."""
    pkg = tmp_path / "fs_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text("def double(x):\n    return 2 * x\n" + GOOD_COUNT)
    (pkg / "hangs.py").write_text("def double(x):\n    while True:\n        pass\n" + GOOD_COUNT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + ":" + __import__("os").environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("COURSE_ISOLATION", "forkserver")
    good = grade(Target(module_name="fs_pkg.good"))
    assert {r.status for r in good.values()} == {"passed"}, [(r.status, r.message) for r in good.values()]
    hangs = grade(Target(module_name="fs_pkg.hangs"))
    assert hangs["double"].status == "timeout" and hangs["count"].status == "passed"
