"""The operating-system layer alone (autograder/oslimits.py: Landlock): with the source scan bypassed, a learner
process cannot read the solutions, signal the grader or the zygote, read their open files, or write outside its
scratch directory. Each test fails with COURSE_SANDBOX=off (only the scan and the import blocker left)."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from autograder import oslimits, runner, wire, zygote
from autograder.runner import Target
from autograder.sandbox import LearnerProcess, LearnerRaised

pytestmark = pytest.mark.skipif(oslimits.abi() < 1, reason="this kernel has no Landlock")

STEM = "l02_kv_cache"
SOLUTION = str(runner.ROOT / "solutions" / f"{STEM}.py")


def _bypass_scan(tmp_path, body: str):
    """Grade kv_bytes_per_token (3 points) without the source scan: what the process boundary lets through."""
    import importlib
    header = (runner.ROOT / "exercises" / f"{STEM}.py").read_text()
    target = Target.from_source(header + "\n\n" + textwrap.dedent(body), tmp_path, "hostile", label="hostile.py")
    spec = next(s for s in runner.load_checks(STEM) if s.name == "kv_bytes_per_token")
    return runner.run_check(spec, target, importlib.import_module(f"solutions.{STEM}"), 1, cuda=False, timeout=20)


READS = {  # each returns the reference answer when it can read the solution's source
    "os.open": f"""
        import os
        def kv_bytes_per_token(config, dtype):
            fd = os.open({SOLUTION!r}, os.O_RDONLY)
            ns = {{}}
            exec(os.read(fd, 1 << 20).decode(), ns)
            return ns["kv_bytes_per_token"](config, dtype)
        """,
    "linecache": f"""
        import linecache
        def kv_bytes_per_token(config, dtype):
            ns = {{}}
            exec("".join(linecache.getlines({SOLUTION!r})) or "raise PermissionError('linecache read nothing')", ns)
            return ns["kv_bytes_per_token"](config, dtype)
        """,
    "runpy": f"""
        import runpy
        def kv_bytes_per_token(config, dtype):
            return runpy.run_path({SOLUTION!r})["kv_bytes_per_token"](config, dtype)
        """,
    "sys.path + bare import": f"""
        import sys
        def kv_bytes_per_token(config, dtype):
            sys.path.insert(0, {os.path.dirname(SOLUTION)!r})
            import {STEM} as ref
            return ref.kv_bytes_per_token(config, dtype)
        """,
    "spec_from_file_location": f"""
        import importlib.util
        def kv_bytes_per_token(config, dtype):
            spec = importlib.util.spec_from_file_location("sol", {SOLUTION!r})
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod.kv_bytes_per_token(config, dtype)
        """,
}


@pytest.mark.parametrize("how", list(READS))
def test_reading_the_solutions_is_refused_by_the_kernel(tmp_path, how):
    r = _bypass_scan(tmp_path, READS[how])
    assert r.earned == 0 and r.status == "error", (r.status, r.message)
    # A bare import finds nothing: the import system takes an unreadable directory for an empty one.
    expected = "ModuleNotFoundError" if how == "sys.path + bare import" else "PermissionError"
    assert expected in r.message, r.message


# -- the learner-side machinery, driven directly --------------------------------------------------------------------

def _run(tmp_path, body: str, *args):
    """Load `body` (a module defining f) in a learner process and call f(*args): ("ok", value) or ("raised", tb)."""
    path = tmp_path / "probe.py"
    path.write_text(textwrap.dedent(body))
    proc = LearnerProcess.start(time.monotonic() + 20, target=str(path))
    try:
        proc.load(str(path), "probe")
        return "ok", proc.call(wire.LearnerRef("f"), args, {}, what="f")[0]
    except LearnerRaised as e:
        return "raised", e.tb_text
    finally:
        proc.close()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


SIGNAL = """
    import os
    def f(pid, sig):
        os.kill(os.getppid() if pid is None else pid, sig)
        return "sent"
    """


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_the_zygote_cannot_be_signalled(tmp_path, sig):
    zyg = zygote.get()
    resumed = []
    def watchdog():  # without the sandbox, a stopped zygote would hang the grader: resume it, and say so
        time.sleep(3)
        if zyg.alive() and _state(zyg.pid) == "T":
            resumed.append(True)
            os.kill(zyg.pid, signal.SIGCONT)
    threading.Thread(target=watchdog, daemon=True).start()
    kind, what = _run(tmp_path, SIGNAL, None, int(sig))
    assert kind == "raised" and "PermissionError" in what, (kind, what)
    assert zyg.alive() and not resumed


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_a_process_outside_cannot_be_signalled(tmp_path, sig):
    """A stand-in for the grader (a process of the same user outside the learner's domain): stopping the real
    one would hang this test run where the sandbox is off."""
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kind, what = _run(tmp_path, SIGNAL, outside.pid, int(sig))
        assert kind == "raised" and "PermissionError" in what, (kind, what)
        assert outside.poll() is None and _state(outside.pid) != "T"
    finally:
        outside.kill()
        outside.wait()


FDS = """
    import os
    def f(pid):
        seen = []
        for name in os.listdir(f"/proc/{pid}/fd"):
            with open(f"/proc/{pid}/fd/{name}", "rb") as fh:
                seen.append(name)
        return seen
    """


@pytest.mark.parametrize("whose", ["grader", "zygote"])
def test_the_graders_open_files_cannot_be_read(tmp_path, whose):
    pid = os.getpid() if whose == "grader" else zygote.get().pid
    kind, what = _run(tmp_path, FDS, pid)
    assert kind == "raised" and "PermissionError" in what, (kind, what)


WRITES = """
    import os, tempfile
    def f(outside):
        done = {}
        for where in (tempfile.gettempdir(), os.environ["HOME"], os.environ["TMPDIR"]):
            p = os.path.join(where, "note.txt")
            with open(p, "w") as fh:
                fh.write("mine")
            done[where] = open(p).read()
        try:
            open(outside, "w").write("escaped")
            done["outside"] = "written"
        except PermissionError:
            done["outside"] = "refused"
        return done
    """


def test_writes_land_in_scratch_only(tmp_path):
    kind, got = _run(tmp_path, WRITES, str(tmp_path / "escaped.txt"))
    assert kind == "ok", got
    assert got.pop("outside") == "refused" and not (tmp_path / "escaped.txt").exists()
    assert set(got.values()) == {"mine"} and all(os.path.basename(p).startswith("course-scratch-") for p in got)


def test_the_report_names_the_isolation(monkeypatch):
    assert oslimits.describe().startswith(f"isolation: Landlock (ABI {oslimits.abi()}): files")
    monkeypatch.setenv("COURSE_SANDBOX", "off")
    assert oslimits.describe() == "isolation: source scan only, not for high-stakes grading"


def test_setting_up_costs_little(tmp_path):
    """Building the rules and restricting (in a fork: Landlock cannot be undone) takes well under 20 ms."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            start = time.perf_counter()
            oslimits.restrict(oslimits.learner_rules(SOLUTION, str(tmp_path), os.devnull))
            os.write(w, f"{time.perf_counter() - start:.6f}".encode())
        finally:
            os._exit(0)
    os.close(w)
    took = float(os.read(r, 100) or "inf")
    os.waitpid(pid, 0)
    assert took < 0.02, took
