"""Learner code is untrusted: whatever it does, the grader reports a status and a score."""
import os
import tempfile
import textwrap

import pytest

from autograder.runner import Target, grade_lesson

_DIR = tempfile.mkdtemp(prefix="course-isolation-")


def grade_source(src: str, name="learner_mod"):
    return grade(Target.from_source(textwrap.dedent(src), _DIR, name, label="learner"))


def grade(target, seed=1):
    res = grade_lesson("toy", target, seed, checks_module="tests.fake.toy",
                       ref_module="tests.fake.toy_ref", timeout_scale=1.0)
    return {r.name: r for r in res}


GOOD_COUNT = "def count(n):\n    return n\n"


@pytest.mark.parametrize("body,status,phrase", [
    ("def double(x):\n    return 2 * x\n", "passed", "4 case(s) passed"),
    ("def double(x):\n    raise NotImplementedError('Exercise 9.9')\n", "not started", "Exercise 9.9"),
    ("def double(x):\n    while True:\n        pass\n", "timeout", "still running"),
    # (a real fault: a learner process is its PID namespace's init, which ignores a SIGSEGV it raises itself)
    ("def double(x):\n    import faulthandler\n    faulthandler._read_null()\n", "crashed",
     "segmentation fault"),
    ("import sys\ndef double(x):\n    sys.exit(3)\n", "error", "sys.exit"),
    ("def double(x):\n    raise ValueError('boom')\n", "error", "ValueError: boom"),
    ("def double(x):\n    return (2 * x)[:-1]\n", "failed", "shape"),
    ("def double(x):\n    return (2 * x).double()\n", "failed", "dtype torch.float64, expected torch.float32"),
    ("def double(x):\n    return x * x\n", "failed", "squares instead of doubling"),
    ("def double(x):\n    return x.mul_(2)\n", "failed", "modified its argument #1 in place"),
    ("def double(x):\n    return bytearray(64 * 2**30)\n", "error", "MemoryError"),
    # Past the wire's 64 MiB: tensor bytes are refused over there, a huge header here before it is read.
    ("import torch\ndef double(x):\n    return torch.zeros(30_000_000)\n", "error", "more than 64 MiB"),
    ("def double(x):\n    return ['x' * 1000] * 70_000\n", "error", "larger than the grader accepts"),
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
    assert "learner_mod.py" in r.message and "helper" in r.message
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
    ("import faulthandler\nfaulthandler._read_null()\n", "crashed",
     "crashed the interpreter"),
])
def test_broken_module_import_fails_every_check_cleanly(tmp_path, monkeypatch, src, status, phrase):
    from autograder import runner
    real = runner.preflight
    monkeypatch.setattr(runner, "preflight", lambda t, timeout=3.0, stem=None: real(t, timeout=timeout, stem=stem))
    res = grade(Target.from_source(src, tmp_path, "broken_mod", label="broken_mod.py"))
    assert {r.status for r in res.values()} == {status}, [(r.status, r.message) for r in res.values()]
    assert all(phrase in r.message for r in res.values())
    assert all(r.earned == 0 for r in res.values())


def test_spawned_zygote_used_with_cuda_grades_the_same(tmp_path, monkeypatch):
    """With CUDA initialised (or solutions imported) the zygote is a fresh interpreter: it must grade alike."""
    from autograder import zygote
    monkeypatch.setenv("COURSE_ISOLATION", "spawn")
    monkeypatch.setattr(zygote, "_ZYGOTE", None)  # restored (to the forked one) after the test
    good = grade(Target.from_source("def double(x):\n    return 2 * x\n" + GOOD_COUNT, tmp_path, "good"))
    assert zygote.get().mode == "spawn"
    assert {r.status for r in good.values()} == {"passed"}, [(r.status, r.message) for r in good.values()]
    hangs = grade(Target.from_source("def double(x):\n    while True:\n        pass\n" + GOOD_COUNT, tmp_path,
                                     "hangs"))
    assert hangs["double"].status == "timeout" and hangs["count"].status == "passed"
    zygote.shutdown()  # the fresh-interpreter one; monkeypatch then restores the forked one


def test_a_machine_with_a_cuda_device_never_forks_the_grader_into_the_zygote(monkeypatch):
    """torch's default is_available() starts the CUDA driver, after which no forked child can use CUDA; so on a
    machine with a device the zygote is always a fresh interpreter, and asking goes through NVML."""

    import torch

    from autograder import zygote
    assert os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"  # set when reference_engine.device is imported
    monkeypatch.delenv("COURSE_ISOLATION", raising=False)
    monkeypatch.setattr(zygote, "holds_solutions", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not zygote.can_fork_clean()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert zygote.can_fork_clean() == hasattr(os, "fork")


@pytest.mark.parametrize("cuda", [False, True], ids=["address-space cap", "private-data cap (CUDA)"])
def test_the_memory_cap_turns_a_huge_allocation_into_a_memory_error(cuda):
    """Both caps (the one for CUDA machines leaves CUDA's reserved, never-written address ranges alone) stop a
    64 GiB allocation in the learner's process, and still allow a modest one."""
    from autograder.learner_side import _limit_memory

    def trial():
        _limit_memory(1.0, cuda=cuda)
        small = bytearray(100 * 2**20)
        try:
            bytearray(64 * 2**30)
            return b"allocated"
        except MemoryError:
            return b"MemoryError" if len(small) else b"?"
    got = _in_child(trial)
    assert got == b"MemoryError"


def test_a_learner_process_closes_the_graders_files_but_keeps_the_gpu_drivers():
    """A learner process closes every descriptor it inherited except its socket and the NVIDIA driver's device
    files: the NVML state torch left in the zygote still points at those, and closing them made every CUDA query
    in the child fail (found on an H200). Here a file under a temporary directory stands in for /dev/nvidia*."""
    from autograder.learner_side import _close_fds_except

    def is_open(fd):
        try:
            os.fstat(fd)
            return True
        except OSError:
            return False

    with tempfile.TemporaryDirectory() as d:
        def trial(w):
            driver = os.open(os.path.join(d, "nvidia0"), os.O_RDWR | os.O_CREAT)
            other_r, other_w = os.pipe()
            _close_fds_except(w, keep_prefixes=(d,))
            return f"{is_open(driver)} {is_open(other_r)} {is_open(other_w)}".encode()
        got = _in_child(trial, pass_fd=True)
    assert got == b"True False False", got


def _in_child(fn, pass_fd: bool = False) -> bytes:
    """fn() (or fn(write_fd)) run in a forked child; the bytes it returns, or the repr of what it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            verdict = fn(w) if pass_fd else fn()
        except BaseException as e:  # noqa: BLE001
            verdict = repr(e).encode()[:200]
        os.write(w, verdict)
        os._exit(0)
    os.close(w)
    got = os.read(r, 256)
    os.waitpid(pid, 0)
    os.close(r)
    return got


FLAKY_FORK = r'''
import errno, json, os, sys
from autograder import zygote
from autograder.runner import Target, grade_lesson

grader, real, left = os.getpid(), zygote._fork, [int(sys.argv[1])]

def flaky(body):
    if os.getpid() != grader and left[0]:  # in the zygote: its forks of learner processes
        left[0] -= 1
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    return real(body)

zygote._fork = flaky  # before the zygote is forked from this process, which holds no solutions
target = Target.from_source("def double(x):\n    return 2 * x\n" + sys.argv[3], sys.argv[2], "good")
res = grade_lesson("toy", target, 1, checks_module="tests.fake.toy", ref_module="tests.fake.toy_ref")
print(json.dumps({"mode": zygote.get().mode, "alive": zygote._ZYGOTE.alive(),
                  "results": [[r.status, r.earned, r.message] for r in res]}))
zygote.shutdown()
'''


@pytest.mark.parametrize("refusals", [2, 10**6], ids=["refused twice", "refused always"])
def test_a_fork_the_system_refuses_is_retried_then_reported_and_the_zygote_lives_on(tmp_path, refusals):
    """fork() failing with EAGAIN (a full process table, a process limit, no memory) is the machine's state, not the
    learner's doing: the zygote answers it instead of dying, the grader tries again for a few seconds, and then
    reports the check as an error that says so (and never raises out of grading). (In a process of its own: the
    zygote must be forked from one that never imported the solutions, as a test run's process may have.)"""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "COURSE_ISOLATION"}
    r = subprocess.run([sys.executable, "-c", FLAKY_FORK, str(refusals), str(tmp_path), GOOD_COUNT], cwd=root,
                       env={**env, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["mode"] == "fork" and out["alive"], out
    if refusals == 2:
        assert {status for status, _, _ in out["results"]} == {"passed"}, out["results"]
    else:
        for status, earned, message in out["results"]:
            assert status == "error" and earned == 0, (status, message)
            assert "refused to start a process for your code" in message and "BlockingIOError" in message
            assert "Run the check again" in message
