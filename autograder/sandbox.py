"""The grader's side of the trust boundary: a learner process, driven by requests.

    proc = LearnerProcess.start(target_path, module_name, deadline)
    f = proc.lookup("kv_bytes_per_token")          # a proxy; nothing of the learner's runs here
    value, args_after = proc.call(f.ref, (cfg, 2), {}, return_args=True)
    proc.close()                                    # kills its process group and any orphans

Learner code runs only in that process (a fork of the zygote, `autograder.zygote`,
in a session of its own, with a memory cap and its output captured to a
file). What comes back is decoded by `autograder.wire`: plain data, tensors and
`Handle`s to objects that stay over there. The outcomes a request can have:

- a value,
- `LearnerRaised`: the learner's code raised (type names, message, traceback
  of the learner's frames; `not_implemented` when a stub's error is in it),
- `LearnerGone`: no reply: "timeout" (past the check's deadline; the process
  is killed), "signal" (a segfault, the OOM killer) or "exit" (os._exit, a C
  library calling exit()).
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import struct
import tempfile
import time

from . import oslimits, runtime, wire, zygote
from .learner_side import recv_exact  # noqa: F401 - framing shared with the learner side

DEFAULT_MEMORY_GB = 6.0
# Waits between tries when the system refuses the zygote a fork (EAGAIN), then None: give up (~3 s in all).
FORK_RETRIES = (0.1, 0.2, 0.4, 0.8, 1.6, None)
_OUTPUT_LIMIT = 4000


class LearnerRaised(Exception):
    """The learner's code raised. `info`: type, mro (class names), message, tb, not_implemented."""

    def __init__(self, what: str, info: dict):
        super().__init__(what)
        self.what, self.info = what, info

    @property
    def tb_text(self) -> str:
        return self.info.get("tb", "")

    @property
    def type_name(self) -> str:
        return self.info.get("type", "")

    def is_a(self, exc_type: type) -> bool:
        return exc_type.__name__ in self.info.get("mro", [])

    @property
    def not_implemented(self) -> bool:
        """A stub's NotImplementedError (an exercise not started), not a bug in learner code."""
        return bool(self.info.get("not_implemented"))

    @property
    def stub_message(self) -> str:
        return self.info.get("message") or "the stub still raises NotImplementedError"


class LearnerGone(Exception):
    """The learner's process gave no reply: kind is "timeout", "signal" or "exit"."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


_SIGNALS = {signal.SIGSEGV: "a segmentation fault (an out-of-bounds pointer or load)",
            signal.SIGKILL: "SIGKILL: the out-of-memory killer, or your code killing its own process",
            signal.SIGABRT: "an abort (a failed assertion inside a C/C++ library)",
            signal.SIGBUS: "a bus error (a bad memory access)",
            signal.SIGXFSZ: "SIGXFSZ: your code wrote a file larger than the sandbox allows (256 MiB)"}


def _signal_text(sig: int) -> str:
    if sig in _SIGNALS:
        return _SIGNALS[sig]
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _device_map(device: str) -> str:
    import torch
    return "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"


class LearnerProcess:
    """One learner process, serving one check."""

    def __init__(self, pid: int, sock: socket.socket, capture: str, zyg: zygote.Zygote, deadline: float,
                 scratch: str | None = None):
        self.pid, self.sock, self.capture, self.zygote, self.scratch = pid, sock, capture, zyg, scratch
        self.deadline = deadline
        self.closed = False
        self.output = ""

    @classmethod
    def start(cls, deadline: float, memory_gb: float = DEFAULT_MEMORY_GB, target: str | None = None,
              readable: tuple = ()) -> "LearnerProcess":
        """target: the one learner file it will load; readable: directories it may read besides (the check's
        hand-off directory). Both matter only under Landlock (oslimits), where nothing else is readable."""
        oslimits.make_undumpable()  # (the zygote makes itself so too) no learner process reads our /proc/<pid>/fd
        zyg = zygote.get()
        fd, capture = tempfile.mkstemp(prefix="course-check-", suffix=".out")
        os.close(fd)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # With CUDA the cap is on private writable memory, not the address space (see learner_side._limit_memory).
        spec = {"capture": capture, "memory_gb": memory_gb, "memory_cap": "data" if runtime.cuda_available() else "address"}
        scratch = None
        if oslimits.active():  # its private scratch directory, the only one it may write to
            scratch = tempfile.mkdtemp(prefix="course-scratch-")
            spec["sandbox"] = {"scratch": scratch, "target": target, "readable": list(readable),
                               "namespaces": oslimits.namespaces()["available"]}
        try:
            for wait in FORK_RETRIES:
                try:
                    try:
                        pid = zyg.spawn(theirs.fileno(), spec)
                    except zygote.ZygoteGone:  # killed since it last answered (by the previous check's code): a new one
                        zyg = zygote.get()
                        pid = zyg.spawn(theirs.fileno(), spec)
                    break
                except zygote.ForkFailed:  # the system's process table or memory is full now: it may not be soon
                    if wait is None:
                        raise
                    time.sleep(wait)
        finally:
            theirs.close()
        return cls(pid, mine, capture, zyg, deadline, scratch)

    # -- requests ------------------------------------------------------------------------------
    def request(self, req: dict, what: str = "your code"):
        """Send a request; return the decoded `ok` value, or raise LearnerRaised / LearnerGone."""
        self.send(req)
        return self.receive(what)

    def send(self, req: dict) -> None:
        """The first half of `request`: the learner process starts on it while the caller goes on. Every
        send must be followed by exactly one `receive` before the next send."""
        if self.closed:
            raise LearnerGone("exit", "the learner process has already ended")
        data = wire.encode(req)
        # Within the check's deadline: a learner process that stops reading would otherwise block this forever.
        self.sock.settimeout(max(self.deadline - time.monotonic(), 0.001))
        try:
            self.sock.sendall(struct.pack("<Q", len(data)) + data)
        except TimeoutError:
            self.kill()
            raise LearnerGone("timeout", "still running at the check's time limit (it stopped reading)") from None
        except OSError:
            raise self._gone() from None
        finally:
            self.sock.settimeout(None)

    def receive(self, what: str = "your code"):
        """The second half of `request`: wait for the reply to the last `send` and decode it."""
        reply = self._read()
        try:
            msg = wire.decode(reply, device_map=_device_map, deadline=self.deadline)
        except wire.WireError as e:
            raise LearnerRaised(what, {"type": "WireError", "mro": ["WireError"], "not_implemented": False,
                                       "message": str(e), "tb": f"the reply could not be read: {e}"}) from None
        if type(msg) is not dict:
            raise LearnerRaised(what, {"type": "WireError", "mro": [], "not_implemented": False,
                                       "message": "malformed reply", "tb": "malformed reply"})
        if "raised" in msg and type(msg["raised"]) is dict:
            info = {k: msg["raised"].get(k) for k in ("type", "mro", "message", "tb", "not_implemented")}
            info["mro"] = [str(x) for x in (info["mro"] or []) if type(x) is str]
            info["tb"] = str(info["tb"] or "")
            info["type"] = str(info["type"] or "")
            info["not_implemented"] = info["not_implemented"] is True
            raise LearnerRaised(what, info)
        if "error" in msg:  # (only the learner's side answers so, and learner code can make it say anything)
            raise LearnerRaised(what, {"type": "WireError", "mro": ["WireError"], "not_implemented": False,
                                       "message": "the learner process refused a request",
                                       "tb": f"the learner process refused the grader's request: {msg['error']}"})
        return msg.get("ok")

    def _read(self) -> bytes:
        head = self._read_exact(8)
        (n,) = struct.unpack("<Q", head)
        if n > wire.MAX_MESSAGE + (1 << 20):
            self.kill()
            raise LearnerGone("exit", "the reply was larger than the grader accepts")
        return self._read_exact(n)

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise LearnerGone("timeout", "still running at the check's time limit")
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                continue
            try:
                chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            except OSError:
                chunk = b""
            if not chunk:
                raise self._gone()
            buf += chunk
        return bytes(buf)

    def _gone(self) -> LearnerGone:
        status = self.zygote.wait(self.pid, timeout=2.0)
        if status.get("kind") == "signal":
            return LearnerGone("signal", _signal_text(int(status["signal"])))
        if status.get("kind") == "exit":
            return LearnerGone("exit", f"the process exited with code {status['code']} before returning "
                                       "(os._exit, or a library calling exit())")
        self.kill()
        return LearnerGone("exit", "the learner process closed its connection")

    # -- operations -------------------------------------------------------------------------------
    def load(self, path: str, name: str, sys_path: list[str] | None = None, engine: dict | None = None):
        """Import the learner's module. engine: scan.EngineUse.to_dict(), what of the engine it may import (its
        lesson's stub's); None: anything."""
        return self.request({"op": "load", "path": path, "name": name, "sys_path": sys_path or [],
                             "engine": engine}, what=f"importing {os.path.basename(path)}")

    def lookup(self, name: str) -> dict | None:
        return self.request({"op": "lookup", "name": name}, what=name)

    def call(self, fn, args: tuple, kwargs: dict, what: str, return_args: bool = False):
        """Call `fn` (a LearnerRef, Handle or MethodRef) over there. Returns (value, args, kwargs)."""
        out = self.request({"op": "call", "fn": fn, "args": list(args), "kwargs": dict(kwargs),
                            "return_args": return_args}, what=what)
        return out["value"], out.get("args"), out.get("kwargs")

    def getattr(self, handle: wire.Handle, attr: str, what: str):
        return self.request({"op": "getattr", "obj": handle, "attr": attr}, what=what)["value"]

    def harness(self, fn: str, args: tuple, kwargs: dict, what: str):
        self.send_harness(fn, args, kwargs)
        return self.receive(what)["value"]

    def send_harness(self, fn: str, args: tuple, kwargs: dict) -> None:
        """Start a harness call over there; read its value with `receive(what)["value"]`."""
        self.send({"op": "harness", "fn": fn, "args": list(args), "kwargs": dict(kwargs)})

    # -- the end -----------------------------------------------------------------------------------
    def kill(self):
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> str:
        """End the process and everything it started; return its captured output."""
        if self.closed:
            return self.output
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        self.kill()
        try:
            self.zygote.cleanup()
        except (OSError, RuntimeError):
            pass
        self.output = _read_capture(self.capture)
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return self.output


def _read_capture(path: str) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read(_OUTPUT_LIMIT + 1).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return text if len(text) <= _OUTPUT_LIMIT else text[:_OUTPUT_LIMIT] + "\n... (output truncated)"


def use_fork() -> bool:
    """Whether the zygote can be a fork of this process (else it is a fresh interpreter)."""
    return zygote.can_fork_clean()


def run_harness(fn: str, args: tuple = (), timeout: float = 60.0):
    """Run trusted function `fn` ("module:qualname") in a learner process; for self-tests.

    Returns (kind, value or detail, output) with kind "ok", "raised", "timeout", "signal" or "exit".
    """
    proc = LearnerProcess.start(time.monotonic() + timeout)
    try:
        return "ok", proc.harness(fn, args, {}, what=fn), proc.close()
    except LearnerRaised as e:
        return "raised", e.tb_text, proc.close()
    except LearnerGone as e:
        return e.kind, e.detail, proc.close()
    finally:
        proc.close()
