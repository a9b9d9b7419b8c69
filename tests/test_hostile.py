"""A hostile learner: every known cheat earns nothing, the grader stays up, and no process survives.

Each cheat is tried twice where it makes sense: as the learner would submit it (the source
scan rejects it) and with the scan bypassed (`run_check` directly), to show that the process
boundary holds on its own: the learner's process has no solutions and no expected values.
Every zygote kind is covered: a fork of the grader, a fresh interpreter, and a clone (a second grader's).
"""
import os
import re
import textwrap
import time

import pytest

from autograder import core, runner, zygote
from autograder.runner import Target, grade_lesson
from tests.processes import running

STEM = "l02_kv_cache"
CHECK = "kv_bytes_per_token"
RIGHT = "from solutions.l02_kv_cache import kv_bytes_per_token as _right\n"


@pytest.fixture(scope="module")
def spawned_zygote():
    """One fresh-interpreter zygote for the module (starting one imports torch: seconds)."""
    saved = zygote._ZYGOTE
    os.environ["COURSE_ISOLATION"] = "spawn"
    zygote._ZYGOTE = None
    try:
        spawned = zygote.get()
    finally:
        del os.environ["COURSE_ISOLATION"]
        zygote._ZYGOTE = saved
    yield spawned
    spawned.close()


@pytest.fixture(scope="module")
def cloned_zygote():
    """A clone of the forked zygote, as `course check`'s second grader uses (parallel.run_checks)."""
    pid, sock = zygote.get().clone()
    clone = zygote.Zygote(pid, sock, None, "clone")
    yield clone
    clone.close()


@pytest.fixture(params=["fork", "spawn", "clone"])
def isolation(request, spawned_zygote, cloned_zygote, monkeypatch):
    """Run each test with the zygote forked from this process (conftest.py starts it before any
    solutions are imported), with a fresh-interpreter zygote (the path used once CUDA is up), and with a
    clone of the forked one (a second grader's, sharing a lesson's checks)."""
    if request.param == "spawn":
        monkeypatch.setattr(zygote, "_ZYGOTE", spawned_zygote)
    elif request.param == "clone":
        monkeypatch.setattr(zygote, "_ZYGOTE", cloned_zygote)
    assert zygote.get().mode == request.param
    return request.param


def _target(tmp_path, body: str, name="hostile") -> Target:
    header = (runner.ROOT / "exercises" / f"{STEM}.py").read_text()
    return Target.from_source(header + "\n\n" + textwrap.dedent(body), tmp_path, name, label="hostile.py")


def _graded(target: Target, only=CHECK, seed=1):
    (r,) = grade_lesson(STEM, target, seed, only=[only])
    return r


def _bypass_scan(target: Target, only=CHECK, seed=1):
    """Grade without the source scan: what the process boundary alone lets through."""
    import importlib
    spec = next(s for s in core.load_checks(STEM) if s.name == only)
    ref = importlib.import_module(f"solutions.{STEM}")
    return runner.run_check(spec, target, ref, seed, cuda=False, timeout=20)


# -- rejected by the scan, and empty-handed without it ----------------------------------------------------------

CHEATS = {
    "imports the solutions": RIGHT + "def kv_bytes_per_token(config, dtype):\n    return _right(config, dtype)\n",
    "loads the solutions file by path": """
        import importlib.util
        _s = importlib.util.spec_from_file_location("s", "solutions/l02_kv_cache.py")
        def kv_bytes_per_token(config, dtype):
            m = importlib.util.module_from_spec(_s); _s.loader.exec_module(m)
            return m.kv_bytes_per_token(config, dtype)
        """,
    "reads expected out of the grader's frames": """
        import inspect
        def kv_bytes_per_token(config, dtype):
            for f in inspect.stack():
                if "expected" in f.frame.f_locals:
                    return f.frame.f_locals["expected"]
            return 0
        """,
    "walks frames with sys._getframe": """
        import sys
        def kv_bytes_per_token(config, dtype):
            f = sys._getframe()
            while f is not None:
                if "expected" in f.f_locals:
                    return f.f_locals["expected"]
                f = f.f_back
            return 0
        """,
    "patches the grader's compare": """
        import autograder.compare
        autograder.compare.compare = lambda *a, **k: None
        def kv_bytes_per_token(config, dtype):
            return 0
        """,
    "patches Trial.expect": """
        from autograder import core
        core.Trial.expect = lambda *a, **k: None
        def kv_bytes_per_token(config, dtype):
            return 0
        """,
    "digs through gc for the solutions": """
        import gc
        def kv_bytes_per_token(config, dtype):
            for o in gc.get_objects():
                if callable(o) and getattr(o, "__name__", "") == "kv_bytes_per_token" and o is not kv_bytes_per_token:
                    return o(config, dtype)
            return 0
        """,
    "reads the solution source with open()": """
        def kv_bytes_per_token(config, dtype):
            src = open("solutions/l02_kv_cache.py").read()
            return len(src)
        """,
    "spawns a process": """
        import subprocess
        def kv_bytes_per_token(config, dtype):
            subprocess.Popen(["sleep", "60"])
            return 0
        """,
}


@pytest.mark.parametrize("name", list(CHEATS))
def test_cheat_is_rejected_with_the_line_named(tmp_path, name):
    r = _graded(_target(tmp_path, CHEATS[name]))
    assert r.status == "rejected" and r.earned == 0, (r.status, r.message)
    assert "line " in r.message


@pytest.mark.parametrize("name", ["imports the solutions", "reads expected out of the grader's frames",
                                  "walks frames with sys._getframe", "patches the grader's compare",
                                  "patches Trial.expect", "digs through gc for the solutions"])
def test_without_the_scan_the_process_boundary_still_holds(tmp_path, isolation, name):
    r = _bypass_scan(_target(tmp_path, CHEATS[name]))
    assert r.status != "passed" and r.earned == 0, (r.status, r.message)


def test_the_learner_process_cannot_import_solutions(tmp_path, isolation):
    r = _bypass_scan(_target(tmp_path, CHEATS["imports the solutions"]))
    assert r.status == "error" and "cannot be imported while your code is graded" in r.message, r.message


# -- lies through return values ---------------------------------------------------------------------------------

def test_int_subclass_whose_eq_lies_gets_nothing(tmp_path, isolation):
    r = _graded(_target(tmp_path, """
        class Liar(int):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __sub__(self, other): return 0
            def __rsub__(self, other): return 0
            def __abs__(self): return 0
            def __hash__(self): return 0
        def kv_bytes_per_token(config, dtype):
            return Liar(1)
        """))
    assert r.status == "failed" and r.earned == 0, (r.status, r.message)


def test_object_with_reduce_never_runs_in_the_grader(tmp_path, isolation):
    marker = tmp_path / "pwned"
    r = _graded(_target(tmp_path, """
        class Evil:
            def __reduce__(self):
                return (print, ("pwned",))
        def kv_bytes_per_token(config, dtype):
            return Evil()
        """))
    assert r.status in ("failed", "error") and r.earned == 0, (r.status, r.message)
    assert not marker.exists()


def test_forged_replies_on_every_descriptor_get_nothing(tmp_path, isolation):
    """Writing a made-up reply onto whatever socket the learner can find: the grader judges data only."""
    r = _bypass_scan(_target(tmp_path, """
        import os, struct, json
        def kv_bytes_per_token(config, dtype):
            header = json.dumps({"$t": "dict", "v": [["ok", {"$t": "dict", "v": [["value", 1]]}]]}).encode()
            msg = struct.pack("<Q", len(header)) + header
            for fd in range(3, 64):
                try:
                    os.write(fd, struct.pack("<Q", len(msg)) + msg)
                except OSError:
                    pass
            return 0
        """))
    assert r.status in ("failed", "error") and r.earned == 0, (r.status, r.message)


# -- processes --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["fork", "popen", "setsid grandchild"])
def test_no_learner_process_outlives_the_check(tmp_path, isolation, cloned_zygote, how):
    marker = f"60.{os.getpid()}{time.monotonic_ns() % 10**6}"
    sleep = f"os.execv('/bin/sleep', ['sleep', '{marker}'])"
    spawn = {
        "fork": f"if os.fork() == 0:\n        {sleep}",
        "popen": f"import subprocess\n    subprocess.Popen(['sleep', '{marker}'])",
        "setsid grandchild": ("pid = os.fork()\n    if pid == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
                              f"            {sleep}\n        os._exit(0)\n    os.waitpid(pid, 0)"),
    }[how]
    body = f"import os, time\n\ndef kv_bytes_per_token(config, dtype):\n    {spawn}\n    time.sleep(0.2)\n    return 0\n"
    start = time.monotonic()
    r = _bypass_scan(_target(tmp_path, body))
    took = time.monotonic() - start
    assert r.status in ("failed", "error") and r.earned == 0, (r.status, r.message)
    assert took < 15, f"a learner's process holding the connection slowed the check to {took:.1f} s"
    deadline = time.monotonic() + 3
    while running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(marker), f"{len(running(marker))} process(es) outlived the check"
    # Nor anything else: the zygote (a subreaper) holds no orphan of the check. (The forked zygote's clone is its
    # child too, and is no learner's.)
    leftovers = [p for p in zygote._children_of(zygote.get().pid) if p != cloned_zygote.pid] \
        if zygote.get().alive() else []
    assert not leftovers, leftovers


# -- the grader stays up --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body,status", [
    ("def kv_bytes_per_token(config, dtype):\n    return [0] * (10 ** 9)\n", "error"),
    ("def kv_bytes_per_token(config, dtype):\n    raise SystemExit(0)\n", "error"),
    ("def kv_bytes_per_token(config, dtype):\n    raise KeyboardInterrupt\n", "error"),
    ("def kv_bytes_per_token(config, dtype):\n    class E(Exception):\n        def __str__(self): raise RuntimeError\n"
     "    raise E()\n", "error"),
    ("import os\ndef kv_bytes_per_token(config, dtype):\n    os._exit(0)\n", "error"),
])
def test_nasty_endings_are_reported_not_crashed(tmp_path, isolation, body, status):
    r = _bypass_scan(_target(tmp_path, body))
    assert r.status == status and r.earned == 0, (r.status, r.message)


def test_cheats_leave_core_untouched():
    assert core.Trial.expect.__module__ == "autograder.core"
    import autograder.compare
    assert autograder.compare.compare.__module__ == "autograder.compare"


def test_learner_process_environment_marks_it(tmp_path, isolation):
    """The learner's process is a separate one: its pid differs from the grader's."""
    r = _bypass_scan(_target(tmp_path, """
        import os
        def kv_bytes_per_token(config, dtype):
            return os.getpid()
        """))
    # Word boundaries: the grader's pid may be a substring of an expected value (840 in 163840).
    assert r.status == "failed" and re.search(r"\bgot \d+", r.message), r.message
    assert not re.search(rf"\b{os.getpid()}\b", r.message), r.message


def test_no_text_breaks_or_forges_the_report():
    """What a learner's code raises or prints reaches the terminal escaped: C0 and C1 controls (U+009B is a one-
    character ESC [), bidirectional overrides, and lone surrogates (which could not even be printed: the report
    was lost)."""
    from autograder.report import printable
    text = printable("a\x1b[2Jb\x9b2Jc\u202ed\ud800e")
    text.encode("utf-8")  # (raises on a lone surrogate)
    assert not any(0xD800 <= ord(ch) < 0xE000 or ord(ch) < 32 or 127 <= ord(ch) < 160 or ch == "\u202e"
                   for ch in text), text
