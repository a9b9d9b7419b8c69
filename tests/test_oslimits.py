"""The operating-system layer alone (autograder/oslimits.py: Landlock): with the source scan bypassed, a learner
process cannot read the solutions, signal the grader or the zygote, read their open files, or write outside its
scratch directory. Each test fails with COURSE_SANDBOX=off (only the scan and the import blocker left)."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from autograder import core, oslimits, runner, wire, zygote
from autograder.runner import Target
from autograder.sandbox import LearnerGone, LearnerProcess, LearnerRaised
from tests.processes import running

pytestmark = pytest.mark.skipif(oslimits.abi() < 1, reason="this kernel has no Landlock")

STEM = "l02_kv_cache"
SOLUTION = str(runner.ROOT / "solutions" / f"{STEM}.py")


def _bypass_scan(tmp_path, body: str):
    """Grade kv_bytes_per_token (3 points) without the source scan: what the process boundary lets through."""
    import importlib
    header = (runner.ROOT / "exercises" / f"{STEM}.py").read_text()
    target = Target.from_source(header + "\n\n" + textwrap.dedent(body), tmp_path, "hostile", label="hostile.py")
    spec = next(s for s in core.load_checks(STEM) if s.name == "kv_bytes_per_token")
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
    "open and exec under other names": f"""
        _r, _x = open, exec
        def kv_bytes_per_token(config, dtype):
            ns = {{}}
            _x(_r({SOLUTION!r}).read(), ns)
            return ns["kv_bytes_per_token"](config, dtype)
        """,
    "builtins through print.__self__": f"""
        def kv_bytes_per_token(config, dtype):
            b = print.__self__
            ns = {{}}
            getattr(b, "ex" + "ec")(getattr(b, "op" + "en")({SOLUTION!r}).read(), ns)
            return ns["kv_bytes_per_token"](config, dtype)
        """,
    "os under another name, popen": f"""
        import os as o
        def kv_bytes_per_token(config, dtype):
            ns = {{}}
            exec(o.popen("cat " + {SOLUTION!r}).read() or "raise PermissionError('cat printed nothing')", ns)
            return ns["kv_bytes_per_token"](config, dtype)
        """,
    "from os import *": f"""
        from os import *
        def kv_bytes_per_token(config, dtype):
            ns = {{}}
            fd = open({SOLUTION!r}, O_RDONLY)
            exec(read(fd, 1 << 20).decode(), ns)
            return ns["kv_bytes_per_token"](config, dtype)
        """,
    "pkgutil.resolve_name": f"""
        import pkgutil, sys
        def kv_bytes_per_token(config, dtype):
            sys.path.insert(0, {str(runner.ROOT)!r})
            sys.meta_path[:] = [f for f in sys.meta_path if "Blocker" not in type(f).__name__]
            return pkgutil.resolve_name("solutions.{STEM}:kv_bytes_per_token")(config, dtype)
        """,
    "the checks' own helpers": """
        import sys
        def kv_bytes_per_token(config, dtype):
            sys.meta_path[:] = [f for f in sys.meta_path if "Blocker" not in type(f).__name__]
            import autograder.checks.l02_kv_cache  # (its helpers hold the mistake models and reference code)
            return 0
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
    expected = {"sys.path + bare import": ("ModuleNotFoundError",), "pkgutil.resolve_name": ("ModuleNotFoundError", "PermissionError"),
                "the checks' own helpers": ("PermissionError", "ImportError")}.get(how, ("PermissionError",))
    assert any(e in r.message for e in expected), r.message


SCAN_ONLY = {  # routes the scan must name too (the only guard where the kernel has no sandbox: macOS)
    "torch.os": "import torch\ndef f():\n    return torch.os.popen('cat solutions/l02_kv_cache.py').read()\n",
    "torch.sys.modules": "import torch\ndef f():\n    return torch.sys.modules['solutions.l02_kv_cache']\n",
    "tempfile._os": "import tempfile\ndef f():\n    return tempfile._os.open('solutions/l02_kv_cache.py', 0)\n",
    "getattr, name built at run time": "import torch\ndef f():\n    return getattr(torch, 'o' + 's')\n",
}


@pytest.mark.parametrize("how", list(READS) + list(SCAN_ONLY))
def test_the_scan_names_each_route_too(how):
    """Without the kernel's sandbox (macOS, COURSE_SANDBOX=off) the source scan is what stops these: each is
    rejected, with its line named."""
    from autograder.scan import scan_source
    source = textwrap.dedent(READS[how]) if how in READS else SCAN_ONLY[how]
    found = scan_source(source)
    assert found and all(f.line >= 1 for f in found), how


# -- the learner-side machinery, driven directly --------------------------------------------------------------------

@contextlib.contextmanager
def _loaded(tmp_path, body: str, seconds: float = 20):
    """A learner process (its deadline `seconds` away) with `body` loaded as its module; closed after."""
    path = tmp_path / "probe.py"
    path.write_text(textwrap.dedent(body))
    proc = LearnerProcess.start(time.monotonic() + seconds, target=str(path))
    try:
        proc.load(str(path), "probe")
        yield proc
    finally:
        proc.close()


def _run(tmp_path, body: str, *args):
    """Load `body` (a module defining f) in a learner process and call f(*args): ("ok", value) or ("raised", tb)."""
    try:
        with _loaded(tmp_path, body) as proc:
            return "ok", proc.call(wire.LearnerRef("f"), args, {}, what="f")[0]
    except LearnerRaised as e:
        return "raised", e.tb_text


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
    # (In its own PID namespace the learner's parent is pid 0 and the zygote's number names no process there, or
    # another one: both are tried.)
    for pid in (None, zyg.pid):
        kind, what = _run(tmp_path, SIGNAL, pid, int(sig))
        assert kind == "raised" and ("PermissionError" in what or "ProcessLookupError" in what) \
            or (kind == "ok" and pid is None and oslimits.namespaces()["available"]), (kind, what)
        assert zyg.alive() and not resumed


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_a_process_outside_cannot_be_signalled(tmp_path, sig):
    """A stand-in for the grader (a process of the same user outside the learner's domain): stopping the real
    one would hang this test run where the sandbox is off."""
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kind, what = _run(tmp_path, SIGNAL, outside.pid, int(sig))
        assert kind == "raised" and ("PermissionError" in what or "ProcessLookupError" in what), (kind, what)
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


def test_a_course_installed_into_site_packages_keeps_its_solutions_unreadable(tmp_path, monkeypatch):
    """`pip install .` (not -e) would copy solutions/ next to torch: site-packages is then granted entry by entry."""
    site = tmp_path / "site-packages"
    for name in ("torch", "solutions", "autograder", "numpy"):
        (site / name).mkdir(parents=True)
    (site / "six.py").write_text("")
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    rules = oslimits.learner_rules(None, str(tmp_path / "scratch"), os.devnull)
    assert rules[str(site)] == oslimits.READ_DIR
    assert rules[str(site / "torch")] == oslimits.READ and str(site / "six.py") in rules
    assert str(site / "solutions") not in rules and str(site / "autograder") not in rules


def test_the_report_names_the_isolation(monkeypatch):
    assert oslimits.describe().startswith(f"isolation: Landlock (ABI {oslimits.abi()}): files")
    monkeypatch.setenv("COURSE_SANDBOX", "off")
    assert oslimits.describe() == "isolation: source scan only, not for high-stakes grading"


def test_without_namespaces_landlock_still_holds_and_the_header_says_so(tmp_path, monkeypatch):
    """A kernel that refuses unprivileged namespaces (some distributions' default): Landlock alone, said plainly."""
    monkeypatch.setattr(oslimits, "namespaces", lambda: {"available": False, "pid_max": False, "why": "EPERM"})
    assert oslimits.describe().endswith("no namespaces here (EPERM): processes and network not isolated")
    r = _bypass_scan(tmp_path, READS["os.open"])
    assert r.earned == 0 and "PermissionError" in r.message, r.message
    kind, pid = _run(tmp_path, "import os\ndef f():\n    return os.getpid()\n")
    assert kind == "ok" and pid != 1, pid  # (no PID namespace of its own)


# -- namespaces -------------------------------------------------------------------------------------------------

needs_namespaces = pytest.mark.skipif(not oslimits.namespaces()["available"],
                                      reason="this kernel gives an unprivileged process no namespaces")

SWARM = """
    import os
    def f(marker, most):
        made = 0
        refused = ""
        for _ in range(most):
            try:
                pid = os.fork()
            except OSError as e:
                refused = e.strerror
                break
            if pid == 0:  # a child in a session of its own leaves a grandchild behind, then ends
                try:
                    os.setsid()
                    if os.fork() == 0:
                        os.execv("/bin/sleep", ["sleep", marker])
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
            made += 1
        return made, refused, os.getpid()
    """


@needs_namespaces
def test_a_fork_swarm_is_capped_and_dies_with_the_check(tmp_path):
    """Processes in sessions of their own, orphaned, each one exec'ing: at most PROCESS_LIMIT of them (the
    namespace's pid_max where the kernel has one per namespace, else RLIMIT_NPROC for a user that is not root),
    and none left once the check is over: they were all in the learner's PID namespace, whose init it was."""
    marker = f"61.{os.getpid()}{time.monotonic_ns() % 10**6}"
    kind, got = _run(tmp_path, SWARM, marker, 2000)
    assert kind == "ok", got
    made, refused, pid = got
    assert pid == 1, f"the learner process is pid {pid} in its namespace, not its init"
    if oslimits.namespaces()["pid_max"] or os.geteuid() != 0:
        assert made < oslimits.PROCESS_LIMIT and refused, (made, refused)
    deadline = time.monotonic() + 5
    while running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(marker), f"{len(running(marker))} of the {made} processes outlived the check"


NET = """
    import socket
    def f(port):
        seen = {}
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            seen["the machine's loopback"] = "connected"
        except OSError as e:
            seen["the machine's loopback"] = type(e).__name__
        try:
            socket.create_connection(("192.0.2.1", 80), timeout=2).close()  # (TEST-NET-1)
            seen["another machine"] = "connected"
        except OSError as e:
            seen["another machine"] = type(e).__name__
        server = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        client.sendall(b"ping")
        seen["its own loopback"] = conn.recv(4).decode()
        return seen
    """


@needs_namespaces
def test_the_network_is_a_loopback_of_its_own(tmp_path):
    """A server of the grader's machine on 127.0.0.1 is out of reach, and so is any other machine; a server the
    learner's code starts on its own loopback works (lesson 12's checks run one)."""
    with socket.create_server(("127.0.0.1", 0)) as outside:
        kind, seen = _run(tmp_path, NET, outside.getsockname()[1])
    assert kind == "ok", seen
    assert seen == {"the machine's loopback": "ConnectionRefusedError", "another machine": "OSError",
                    "its own loopback": "ping"} or (seen["the machine's loopback"] != "connected"
                                                   and seen["another machine"] != "connected"
                                                   and seen["its own loopback"] == "ping"), seen


LIMITS = """
    import os, resource, tempfile
    def f():
        st = os.statvfs(tempfile.gettempdir())
        caps = [line.split()[1] for line in open("/proc/self/status") if line.startswith(("CapEff", "CapPrm", "CapBnd"))]
        return {"fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0],
                "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
                "core": resource.getrlimit(resource.RLIMIT_CORE)[0],
                "scratch": st.f_blocks * st.f_frsize, "caps": caps, "no_new_privs":
                next(line.split()[1] for line in open("/proc/self/status") if line.startswith("NoNewPrivs"))}
    """


@needs_namespaces
def test_files_scratch_and_capabilities_are_capped(tmp_path):
    kind, got = _run(tmp_path, LIMITS)
    assert kind == "ok", got
    assert got["fsize"] == oslimits.FILE_BYTES and got["nproc"] == oslimits.PROCESS_LIMIT and got["core"] == 0, got
    assert got["scratch"] == oslimits.SCRATCH_BYTES, got
    assert got["caps"] == ["0000000000000000"] * 3 and got["no_new_privs"] == "1", got


BIG_FILE = """
    import os, tempfile
    def f(n):
        with open(os.path.join(tempfile.gettempdir(), "big"), "wb") as fh:
            for _ in range(n >> 20):
                fh.write(bytes(1 << 20))
        return "written"
    """


@needs_namespaces
def test_a_file_past_the_cap_is_refused(tmp_path):
    with _loaded(tmp_path, BIG_FILE) as proc:
        # (Python ignores SIGXFSZ: the write fails with EFBIG instead of the signal ending the process)
        with pytest.raises((LearnerRaised, LearnerGone)) as e:
            proc.call(wire.LearnerRef("f"), (oslimits.FILE_BYTES + (1 << 20),), {}, what="f")
    said = e.value.tb_text if isinstance(e.value, LearnerRaised) else e.value.detail
    assert "File too large" in said or "larger than the sandbox allows" in said, said


SETUP_COST = """
import os, sys, time
import torch, reference_engine.engine  # (what a zygote holds: a learner process is a fork of that size)
from autograder import oslimits
scratch, solution = sys.argv[1], sys.argv[2]
with_namespaces = oslimits.namespaces()["available"]
def once():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            oslimits.make_dumpable()
            start = time.perf_counter()
            oslimits.confine(scratch, oslimits.learner_rules(solution, scratch, os.devnull), with_namespaces)
            os.write(w, f"{time.perf_counter() - start:.6f}".encode())
        finally:
            os._exit(0)
    os.close(w)
    took = float(os.read(r, 100) or "inf")
    os.waitpid(pid, 0)
    return took
print(min(once() for _ in range(7)))
"""


def test_setting_up_costs_little(tmp_path):
    """Everything a learner process does to sandbox itself, namespaces (with the fork of their init), Landlock
    and seccomp, takes about 10 ms, measured in a process the size of a zygote (torch and the engine imported;
    this test run's own process, grown by thousands of tests, forks far slower), the best of seven."""
    out = subprocess.run([sys.executable, "-c", SETUP_COST, str(tmp_path), SOLUTION], capture_output=True,
                         text=True, timeout=120, cwd=str(runner.ROOT))
    assert out.returncode == 0, out.stderr
    took = float(out.stdout.strip())
    # The target is ~20 ms; the bound leaves room for a busy machine.
    assert took < 0.03, f"{took * 1e3:.1f} ms"


# -- what the attack review found (each was a way through before) -------------------------------------------------

META = """
    import os
    def f(path):
        out = {}
        for name, call in [("chmod", lambda: os.chmod(path, 0o4755)), ("chown", lambda: os.chown(path, -1, 0)),
                           ("utime", lambda: os.utime(path, (0, 0))),
                           ("setxattr", lambda: os.setxattr(path, "user.x", b"1"))]:
            try:
                call()
                out[name] = "done"
            except OSError as e:
                out[name] = e.strerror
        return out
    """


def test_a_files_metadata_outside_scratch_cannot_change(tmp_path):
    """Landlock has no right for a file's mode, owner, times or extended attributes, and the learner owns the
    grader's files (same uid): seccomp refuses those calls (a setuid bit on a copy of a shell was the attack)."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"#!/bin/sh\n")
    victim.chmod(0o755)
    before = victim.stat()
    kind, got = _run(tmp_path, META, str(victim))
    assert kind == "ok" and set(got.values()) == {"Operation not permitted"}, got
    after = victim.stat()
    assert (after.st_mode, after.st_uid, after.st_mtime_ns) == (before.st_mode, before.st_uid, before.st_mtime_ns)


SYSCALL = """
    import ctypes
    def f(nr):
        libc = ctypes.CDLL(None, use_errno=True)
        ret = libc.syscall(nr, 0, 0, 0, 0)
        return ret, ctypes.get_errno()
    """


@pytest.mark.skipif(oslimits._audit_arch() is None, reason="no seccomp table for this architecture")
@pytest.mark.parametrize("name", ["keyctl", "add_key", "inotify_add_watch", "process_vm_readv", "ptrace", "bpf"])
def test_system_calls_no_exercise_needs_are_refused(tmp_path, name):
    """The kernel keyrings (the grader's session keyring held a secret), inotify on the grader's directories,
    other processes' memory."""
    kind, (ret, err) = _run(tmp_path, SYSCALL, oslimits._DENIED[oslimits._audit_arch()][name])
    assert kind == "ok" and ret == -1 and err == 1, (name, ret, err)


SHM = """
    import ctypes
    def f(key):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.shmget(key, 0, 0), ctypes.get_errno()
    """


@needs_namespaces
def test_system_v_ipc_is_a_namespace_of_its_own(tmp_path):
    """A segment of the grader's machine is out of reach (and one the learner makes goes with its namespace)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x41C0FFEE
    shmid = libc.shmget(key, 4096, 0o1000 | 0o600)  # IPC_CREAT
    assert shmid >= 0, ctypes.get_errno()
    try:
        kind, (got, err) = _run(tmp_path, SHM, key)
        assert kind == "ok" and got == -1 and err == 2, (got, err)  # ENOENT: not in its IPC namespace
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


ENV = """
    import os
    def f():
        return sorted(os.environ)
    """


def test_the_graders_environment_is_not_the_learners(tmp_path):
    from autograder import learner_side
    kind, names = _run(tmp_path, ENV)
    assert kind == "ok", names
    strays = [n for n in names if n not in learner_side._ENV_KEEP and not n.startswith(learner_side._ENV_KEEP_PREFIXES)
              and n != "COURSE_LEARNER_PROCESS"]
    assert not strays, strays


FORGED_ERROR = """
    import autograder.learner_side as ls
    from autograder import wire
    def f():
        real = ls.send_msg
        ls.send_msg = lambda sock, data: real(sock, wire.encode({"error": "\\x1b[2J\\x1b[Hscore 17/17"}))
        return 0
    def g():
        return 1
    """


def test_a_forged_error_reply_is_the_learners_failure_not_a_crash(tmp_path):
    with _loaded(tmp_path, FORGED_ERROR) as proc, pytest.raises(LearnerRaised) as e:
        proc.call(wire.LearnerRef("f"), (), {}, what="f")
        proc.call(wire.LearnerRef("g"), (), {}, what="g")
    assert "refused" in e.value.tb_text


STOPS_READING = """
    import time
    import autograder.learner_side as ls
    def f():
        ls.recv_msg = lambda sock: time.sleep(3600)  # answers this call, then never reads another request
        return 0
    """


def test_a_learner_that_stops_reading_cannot_block_the_grader(tmp_path):
    start = time.monotonic()
    with _loaded(tmp_path, STOPS_READING, seconds=4) as proc:
        proc.call(wire.LearnerRef("f"), (), {}, what="f")
        with pytest.raises(LearnerGone) as e:
            proc.call(wire.LearnerRef("f"), (b"x" * (16 << 20),), {}, what="f")  # more than a socket buffers
    assert e.value.kind == "timeout" and time.monotonic() - start < 10


def test_keys_that_all_hash_alike_cannot_hold_the_grader_past_the_deadline():
    big = (1 << 61) - 1  # every multiple hashes to 0
    msg = wire.encode({"v": {big * i for i in range(1, 5000)}})
    start = time.monotonic()
    with pytest.raises(wire.WireError):
        wire.decode(msg, deadline=time.monotonic() - 1)
    assert time.monotonic() - start < 1
    assert len(wire.decode(msg)["v"]) == 4999  # (no deadline: read whole)


def test_a_handles_type_name_is_kept_short():
    h = wire.decode(wire.encode({"h": wire.Handle(3, "K" * 100_000, False)}))["h"]
    assert h.id == 3 and len(h.type) == 200


def test_a_module_in_another_encoding_is_refused(tmp_path):
    """Python honours a `# coding:` line; a scan that read UTF-8 saw a comment where Python saw `import gc`."""
    from autograder.scan import scan_file
    path = tmp_path / "m.py"
    path.write_bytes(b"# coding: utf-7\n# +AAo-import gc\ndef f():\n    return 1\n")
    found = scan_file(str(path))
    assert found and "utf" in found[0].what
