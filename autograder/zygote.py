"""The zygote: a process that never imported the solutions nor the checks, forked once per check to run learner code.

A learner process forked straight from the grader would inherit everything the
grader holds: the imported `solutions` modules and check modules, expected values
in memory. So learner processes come from a zygote instead, a process with torch,
the engine and what the lesson needs imported (so a check starts in milliseconds;
a lesson without tensors, Lesson.torch False, gets neither torch nor the engine) but
no solutions and no checks (holds_solutions):

- on CPU, when nothing under `solutions` or `autograder.checks` has been imported
  yet (`course check`, a notebook, each grader of `course grade`), the zygote is a
  fork of the grader taken before it imports them;
- otherwise (a test session that imported them, or a machine with a CUDA device,
  where a fork of the grader may be unable to use CUDA) it is a fresh interpreter,
  `python -m autograder.zygote FD`, that imports torch but never touches CUDA.

The grader talks to it over a Unix socket: `spawn` (with the socket the learner
process will serve on, passed as a file descriptor), `wait` (its exit status),
`cleanup` (kill it and every process it left behind), and `clone` (fork a second
zygote, as warm and as clean, for a second grader sharing the lesson's checks:
parallel.run_checks). The zygote is a child subreaper (Linux), so processes the
learner starts and orphans end up as its children and cannot outlive the check.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper():
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:  # noqa: BLE001 - not Linux: the process group kill still applies
        pass


def _children_of(pid: int) -> list[int]:
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(name))
    return out


def _kill_all_children(keep: frozenset = frozenset()):
    """SIGKILL every child (check processes and the orphans reparented to us) but `keep`, until none is left.
    Returns once those are reaped: the kept ones (a clone zygote) are not waited for."""
    me = os.getpid()
    for _ in range(50):
        kids = [pid for pid in _children_of(me) if pid not in keep]
        if not kids:
            break
        for pid in kids:
            for kill in (lambda p: os.killpg(p, signal.SIGKILL), lambda p: os.kill(p, signal.SIGKILL)):
                try:
                    kill(pid)
                except OSError:
                    pass
        deadline = time.monotonic() + 0.2
        for pid in kids:
            try:
                _wait_exit(pid, deadline)
            except ChildProcessError:  # (reaped already)
                pass
    _reap_ended()


def _reap_ended():
    """Reap every child that has ended, without waiting."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wait_exit(pid: int, deadline: float) -> tuple[int, int] | None:
    """Reap child `pid` once it ends, waiting until `deadline` (time.monotonic()) at most: (pid, status), or None
    while it runs; ChildProcessError if it is not (or no longer) our child. Blocks on a pidfd where Linux has one
    (no polling: a check's process is reaped the moment it ends), else polls every millisecond."""
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pass
    try:
        while True:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                return got, status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if fd is not None:
                select.select([fd], [], [], left)
            else:
                time.sleep(min(0.001, left))
    finally:
        if fd is not None:
            os.close(fd)


def _status(pid: int, timeout: float) -> dict:
    try:
        ended = _wait_exit(pid, time.monotonic() + timeout)
    except ChildProcessError:
        return {"kind": "gone"}
    if ended is None:
        return {"kind": "running"}
    _, status = ended
    if os.WIFSIGNALED(status):
        return {"kind": "signal", "signal": os.WTERMSIG(status)}
    return {"kind": "exit", "code": os.WEXITSTATUS(status)}


def _send(sock, obj):
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("<I", len(data)) + data)


def _recv(sock) -> tuple[dict | None, list[int]]:
    msg, fds, _, _ = socket.recv_fds(sock, 4 + (1 << 16), 4)
    if not msg:
        return None, fds
    (n,) = struct.unpack("<I", msg[:4])
    body = msg[4:]
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            return None, fds
        body += chunk
    return json.loads(body), fds


def _try_fork(body) -> dict:
    """_fork, answered as the grader reads it: {"pid": pid}, or {"error": why} where the system refused the fork
    (the zygote lives on: a refused fork is the machine's state, not this process's end)."""
    try:
        return {"pid": _fork(body)}
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _fork(body) -> int:
    """Fork; the child runs body() and exits without returning (no atexit, no finally of the parent's)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            body()
        except BaseException:  # noqa: BLE001 - whatever happens, this process must not return
            code = 70
        finally:
            os._exit(code)
    return pid


def serve(ctrl: socket.socket, warm: tuple = (), later: tuple = (), base: bool = True):
    """The zygote's loop; returns when the grader closes the control socket. BASE_WARM (unless not `base`: a
    lesson without tensors, Lesson.torch False) and `warm` are imported before the first request is served,
    `later` between requests, while none is waiting (Lesson.warm and warm_later)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a notebook interrupts the grader, not us
    from .oslimits import make_undumpable
    make_undumpable()  # no learner process may ptrace us or read our /proc/<pid>/fd (learner_side undoes it)
    gc.disable()  # while importing (full collections of a heap that lives as long as we do: wasted)
    _warm_imports(warm, base)  # once here, while the grader goes on, instead of once per learner process
    _freeze()
    gc.enable()  # (a grader forked us with it off, perhaps: cli.run) learner code collects as usual
    from . import runtime
    runtime.limit_threads()  # inherited by every learner process (runtime.grading_threads)
    _loop(ctrl, list(later))


def _freeze():
    """Everything imported so far lives as long as the zygote: out of the collector's sight (gc.freeze, as
    prefork servers do), a learner process's first full collection does not walk torch's hundreds of thousands
    of objects, writing to (and so copying) every page that holds one: that cost up to 0.1 s in the middle of a
    check. (No gc.collect() first: a full collection here would cost the same 0.1 s, on every check's path.)"""
    gc.freeze()


def _loop(ctrl: socket.socket, later: list):
    """Serve requests; while none is waiting, import the next module of `later`: modules only some of a
    lesson's checks use (lesson 12's server stack: 0.4-0.7 s) then no longer hold back its first check, and a
    learner process forked before one of them is in imports it itself. A clone imports no more of them: it
    serves a second grader, whose checks may need none (the checks that need them come later, or import them)."""
    from .learner_side import child_main
    _become_subreaper()  # (a fork does not inherit it: a clone sets it again)
    clones: set[int] = set()  # zygotes forked from this one for a second grader (op "clone"): not a check's
    while True:
        while later and not select.select([ctrl], [], [], 0)[0]:
            gc.disable()
            _import_quietly(later.pop(0))
            _freeze()
            gc.enable()
        try:
            req, fds = _recv(ctrl)
        except OSError:
            req, fds = None, []
        if req is None:
            _kill_all_children()  # the clones too: each then kills its own
            return
        op = req.get("op")
        if op == "spawn":
            def learner(fds=fds, spec=req["spec"]):
                ctrl.close()
                child_main(socket.socket(fileno=fds[0]), spec)
            reply = _try_fork(learner)
            for fd in fds:
                os.close(fd)
            _send(ctrl, reply)
        elif op == "clone":
            def clone(fds=fds):
                ctrl.close()
                _loop(socket.socket(fileno=fds[0]), [])
            reply = _try_fork(clone)
            for fd in fds:
                os.close(fd)
            clones.update([reply["pid"]] if "pid" in reply else [])
            _send(ctrl, reply)
        elif op == "wait":
            _send(ctrl, _status(int(req["pid"]), float(req.get("timeout", 1.0))))
        elif op == "cleanup":
            clones = {pid for pid in clones if _status(pid, 0)["kind"] == "running"}  # (reaps those that ended)
            _kill_all_children(keep=frozenset(clones))
            _send(ctrl, {"ok": True})
        else:
            _send(ctrl, {"error": f"unknown op {op!r}"})


class ForkFailed(RuntimeError):
    """The zygote is alive but the system refused it a new process (EAGAIN: the machine's or this user's process
    limit, or memory), even after a few tries."""


class ZygoteGone(RuntimeError):
    """The zygote stopped answering: killed (by learner code that kills its parent process, say). The next
    zygote.get() starts a new one."""


class Zygote:
    """The grader's handle on its zygote process."""

    def __init__(self, pid: int, ctrl: socket.socket, popen: subprocess.Popen | None, mode: str, base: bool = True):
        self.pid, self.ctrl, self.popen, self.mode = pid, ctrl, popen, mode
        self.base = base  # it imported BASE_WARM (torch and the engine)
        self.owner = os.getpid()

    def _ask(self, obj, fds=()) -> dict:
        data = json.dumps(obj).encode()
        try:
            socket.send_fds(self.ctrl, [struct.pack("<I", len(data)) + data], list(fds))
            reply, _ = _recv(self.ctrl)
        except OSError as e:  # (a broken pipe, a reset connection)
            raise ZygoteGone(f"the grader's zygote process died ({e})") from None
        if reply is None:
            raise ZygoteGone("the grader's zygote process died")
        return reply

    def spawn(self, sock_fd: int, spec: dict) -> int:
        return self._pid(self._ask({"op": "spawn", "spec": spec}, [sock_fd]))

    @staticmethod
    def _pid(reply: dict) -> int:
        if "error" in reply:
            raise ForkFailed(reply["error"])
        return int(reply["pid"])

    def wait(self, pid: int, timeout: float = 1.0) -> dict:
        return self._ask({"op": "wait", "pid": pid, "timeout": timeout})

    def cleanup(self):
        self._ask({"op": "cleanup"})

    def clone(self) -> tuple[int, socket.socket]:
        """A second zygote, forked from this one (as warm, and as clean): the control socket of its own, to
        hand to another grader process (adopt), and its pid. It kills only its own learner processes, and
        ends when that socket closes."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = self._pid(self._ask({"op": "clone"}, [theirs.fileno()]))
        finally:
            theirs.close()
        return pid, mine

    def alive(self) -> bool:
        if self.owner != os.getpid():
            return False
        if self.mode == "clone":  # not our child: it is gone when its end of the socket has closed
            try:
                readable, _, _ = select.select([self.ctrl], [], [], 0)
            except (OSError, ValueError):
                return False
            return not readable  # nothing is owed to us between requests: readable means closed
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            got, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return got == 0

    def close(self):
        try:
            self.ctrl.close()
        except OSError:
            pass
        if self.popen is not None:
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        elif self.mode != "clone":  # a clone is its zygote's child, reaped there
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass


_ZYGOTE: Zygote | None = None


# What a learner process must never hold, so what a process that imported any of it may not be forked into a zygote
# (every learner process would inherit it): the reference solutions, the tests' mutants (made from them), and the
# grader's checks (expected values, mistake models, reference code; autograder/harnesses/ is their learner side).
# The bare package `autograder.checks` (its __init__ is a docstring) does not count: looking a lesson up
# (lessons.Lesson.available) imports it. A forked zygote drops it (_forget_checks).
def _never_in_a_zygote(name: str) -> bool:
    return name in ("solutions", "tests.mutants") or name.startswith(("solutions.", "tests.mutants.",
                                                                      "autograder.checks."))


def holds_solutions() -> bool:
    """Whether this process has imported anything from `solutions`, the tests' mutants or a module of the grader's
    checks (`autograder.checks.*`): a fork of it would hold them."""
    return any(_never_in_a_zygote(m) for m in list(sys.modules))


def _forget_checks():
    """In a zygote forked from the grader: drop the bare `autograder.checks` package (holds_solutions allows it, and
    nothing of a check is in it), so that no learner process finds it in sys.modules or on `autograder`."""
    sys.modules.pop("autograder.checks", None)
    pkg = sys.modules.get("autograder")
    if pkg is not None and "checks" in vars(pkg):
        delattr(pkg, "checks")


def can_fork_clean() -> bool:
    """A fork of this process can be the zygote: forking is safe here (fork_is_safe) and neither solutions nor
    checks are imported (holds_solutions)."""
    return fork_is_safe() and not holds_solutions()


def fork_is_safe() -> bool:
    """Fork exists, is not switched off (COURSE_ISOLATION), and there is no CUDA device. With a device, even a
    process that never initialised CUDA may have started its driver (torch's default is_available() does),
    and a child forked from it then cannot use CUDA at all."""
    if not hasattr(os, "fork") or os.environ.get("COURSE_ISOLATION") in ("spawn", "forkserver"):
        return False
    torch = sys.modules.get("torch")  # not imported yet: nothing can have started the driver
    if torch is not None:
        from . import runtime
        if torch.cuda.is_initialized() or runtime.cuda_available():
            return False
    return True


def _start_forked(warm: tuple, later: tuple, base: bool) -> Zygote:
    parent_sock, zyg_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    def zygote_main():
        parent_sock.close()
        os.setpgid(0, 0)  # out of the terminal's group: a Ctrl-C meant for the grader does not reach it
        _forget_checks()
        serve(zyg_sock, warm, later, base)
    pid = _fork(zygote_main)
    zyg_sock.close()
    return Zygote(pid, parent_sock, None, "fork", base)


def _start_spawned(warm: tuple, later: tuple, base: bool) -> Zygote:
    parent_sock, zyg_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = zyg_sock.fileno()
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in sys.path if p and os.path.isdir(p)])
    popen = subprocess.Popen([sys.executable, "-m", "autograder.zygote", str(fd), *([] if base else ["--no-base"]),
                              *warm, "--later", *later],
                             pass_fds=[fd], env=env,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    zyg_sock.close()
    return Zygote(popen.pid, parent_sock, popen, "spawn", base)


_WANTED: tuple = ()  # modules every zygote this process starts imports beside BASE_WARM (see want)
_WANTED_LATER: tuple = ()
_WANTED_BASE = False  # every zygote this process starts imports BASE_WARM


def want(modules, later=()) -> None:
    """Have every zygote this process starts from now on also import `modules` (and `later`, between requests)
    and BASE_WARM (e.g. `course grade`: every lesson's, so that one zygote serves them all)."""
    global _WANTED, _WANTED_LATER, _WANTED_BASE
    _WANTED = tuple(dict.fromkeys(_WANTED + tuple(modules)))
    _WANTED_LATER = tuple(dict.fromkeys(_WANTED_LATER + tuple(later)))
    _WANTED_BASE = True


def get(warm: tuple = (), later: tuple = (), base: bool | None = None) -> Zygote:
    """This process's zygote, started on first use (forked when that is clean, else a fresh interpreter).
    warm: modules it imports for its learner processes beside BASE_WARM before it serves the first; later:
    modules it imports between requests (a running zygote is kept as it is: a learner process imports what it
    lacks); base: whether it imports BASE_WARM (torch and the engine; None: as it is, True for a new one). A
    running zygote without BASE_WARM is replaced when base is True: its learner processes would each import
    torch."""
    global _ZYGOTE
    if _ZYGOTE is not None and _ZYGOTE.alive():
        if _ZYGOTE.base or not base:
            return _ZYGOTE
        shutdown()
    base = True if base is None else (base or _WANTED_BASE)
    if base and can_fork_clean():
        # Imported here, before the fork, the zygote inherits torch; forked first, it would import it beside this
        # process (which imports it too, for the checks' tensors): two imports at once on two cores held every
        # learner process of lessons 03 and 07 back by 0.8 s.
        import torch  # noqa: F401
    warm = tuple(dict.fromkeys(_WANTED + tuple(warm)))
    later = tuple(m for m in dict.fromkeys(_WANTED_LATER + tuple(later)) if m not in warm)
    _ZYGOTE = _start_forked(warm, later, base) if can_fork_clean() else _start_spawned(warm, later, base)
    atexit.register(shutdown)  # close the socket: the zygote then kills what is left and exits
    return _ZYGOTE


def adopt(pid: int, sock: socket.socket) -> None:
    """Make the clone `pid` behind `sock` (Zygote.clone, asked for by the grader this process was forked from) this
    process's zygote; the grader's own stays the grader's."""
    global _ZYGOTE
    base = _ZYGOTE.base if _ZYGOTE is not None else True  # (a clone imported what its zygote had)
    if _ZYGOTE is not None and _ZYGOTE.owner != os.getpid():
        try:
            _ZYGOTE.ctrl.close()  # this process's copy of the grader's socket (closing it ends nothing)
        except OSError:
            pass
    _ZYGOTE = Zygote(pid, sock, None, "clone", base)


def prepare(warm: tuple = (), later: tuple = (), base: bool = True):
    """Start the zygote now, while it can still be a clean fork (call before importing solutions or checks); warm, later:
    the modules a lesson's learner processes need beside BASE_WARM (lessons.warm_imports); base: whether they
    need BASE_WARM (lessons.needs_torch)."""
    get(warm, later, base)


def shutdown():
    global _ZYGOTE
    if _ZYGOTE is not None and _ZYGOTE.owner == os.getpid():
        _ZYGOTE.close()
    _ZYGOTE = None


# What every learner process needs. Triton is not here: it costs a quarter of a second of the zygote's start, on
# the critical path of every `course check`, and only the kernel lessons' processes use it (Lesson.triton).
BASE_WARM = ("reference_engine.engine", "reference_engine.kernels", "reference_engine.llm", "tokenizers")


def _warm_imports(warm: tuple = (), base: bool = True):
    """BASE_WARM (if base) and `warm`, imported once here instead of once per learner process."""
    from . import runtime
    runtime.setup()
    for name in (("torch",) + BASE_WARM if base else ()) + tuple(warm):
        _import_quietly(name)


def _import_quietly(name: str):
    import importlib
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a broken optional import shows up in the check that needs it
        pass


if __name__ == "__main__":
    _base = "--no-base" not in sys.argv[2:]
    _names = [a for a in sys.argv[2:] if a != "--no-base"] + ["--later"]
    _cut = _names.index("--later")
    serve(socket.socket(fileno=int(sys.argv[1])), tuple(_names[:_cut]),
          tuple(m for m in _names[_cut + 1:] if m != "--later"), _base)
    os._exit(0)  # its learner processes are gone; skip the interpreter's teardown (unloading torch: ~0.3 s)
