"""Run one function in a child process, so learner code cannot take the grader down.

On CPU the child is a fork of the grader: torch, triton and the reference are
already imported, so a check starts in milliseconds. With CUDA initialised a
fork is unsafe, so on a GPU machine children come from a forkserver that has
imported torch but never touched CUDA.

The child's outcome is one of: a value (pickled back through a pipe), or a
reason there is none: timeout, a signal (segfault, out-of-memory kill), or an
exit without a result (os._exit, a C library calling exit()).
"""
from __future__ import annotations

import dataclasses
import faulthandler
import io
import multiprocessing as mp
import os
import pickle
import select
import signal
import sys
import tempfile
import time
from typing import Any, Callable

DEFAULT_MEMORY_GB = 6.0
_OUTPUT_LIMIT = 4000


@dataclasses.dataclass
class Outcome:
    kind: str  # "ok" | "timeout" | "signal" | "exit"
    value: Any = None
    detail: str = ""
    output: str = ""
    seconds: float = 0.0


def _vm_size() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _limit_memory(extra_gb: float):
    """Cap the address space at what the grader already maps plus `extra_gb`.

    A learner allocating a 100 GiB tensor then gets a MemoryError in the child
    instead of the machine swapping or the kernel's OOM killer picking a victim.
    """
    try:
        import resource
        cur = _vm_size()
        if cur:
            lim = cur + int(extra_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    except (ImportError, ValueError, OSError):
        pass


def _child_run(func: Callable, args: tuple, write_fd: int, memory_gb: float, capture_path: str):
    faulthandler.disable()  # a learner's segfault is reported by the parent, not dumped to its tty
    # Learner prints go to a file, not the parent's terminal or a notebook's zmq socket.
    out = open(capture_path, "w+b", buffering=0)
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    sys.stdout = sys.stderr = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False),
                                               write_through=True)
    try:
        import torch
        torch.set_num_threads(1)  # a forked child must not reuse the parent's thread pool
    except Exception:  # noqa: BLE001
        pass
    _limit_memory(memory_gb)
    try:
        payload = ("ok", func(*args))
    except BaseException as e:  # noqa: BLE001 - the child reports everything
        payload = ("raised", f"{type(e).__name__}: {e}")
    try:
        data = pickle.dumps(payload)
    except Exception as e:  # noqa: BLE001
        data = pickle.dumps(("raised", f"result could not be sent back: {e}"))
    view = memoryview(data)
    while view:
        n = os.write(write_fd, view)
        view = view[n:]
    os.close(write_fd)


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


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
    """Fork unless CUDA has been initialised in this process (or the platform has no fork).

    COURSE_ISOLATION=forkserver forces the GPU path, so it can be tested without a GPU.
    """
    if not hasattr(os, "fork") or os.environ.get("COURSE_ISOLATION") == "forkserver":
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and torch.cuda.is_initialized())


def run_isolated(func: Callable, args: tuple = (), timeout: float = 10.0,
                 memory_gb: float = DEFAULT_MEMORY_GB) -> Outcome:
    """Run func(*args) in a child process and report what happened."""
    if not use_fork():
        return _run_forkserver(func, args, timeout, memory_gb)
    fd, capture = tempfile.mkstemp(prefix="course-check-", suffix=".out")
    os.close(fd)
    read_fd, write_fd = os.pipe()
    start = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            _child_run(func, args, write_fd, memory_gb, capture)
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks, deadline, timed_out = [], start + timeout, False
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    seconds = time.perf_counter() - start
    output = _read_capture(capture)
    if timed_out:
        return Outcome("timeout", detail=f"still running after {timeout:g} s", output=output,
                       seconds=seconds)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        why = {signal.SIGSEGV: "a segmentation fault (an out-of-bounds pointer or load)",
               signal.SIGKILL: "SIGKILL, most likely the out-of-memory killer",
               signal.SIGABRT: "an abort (a failed assertion inside a C/C++ library)"}
        return Outcome("signal", detail=why.get(sig, _signal_name(sig)), output=output,
                       seconds=seconds)
    data = b"".join(chunks)
    if not data:
        code = os.WEXITSTATUS(status)
        return Outcome("exit", detail=f"the process exited with code {code} before returning "
                       "(os._exit or a library calling exit())", output=output, seconds=seconds)
    kind, value = pickle.loads(data)
    if kind == "raised":
        return Outcome("exit", detail=value, output=output, seconds=seconds)
    return Outcome("ok", value=value, output=output, seconds=seconds)


def _run_forkserver(func, args, timeout, memory_gb) -> Outcome:
    """GPU path: a forkserver (clean of CUDA) forks a child that may initialise CUDA itself.

    No address-space cap here: CUDA reserves huge virtual ranges and would fail under one.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "autograder.runner"])
    fd, capture = tempfile.mkstemp(prefix="course-check-", suffix=".out")
    os.close(fd)
    parent, child = ctx.Pipe(duplex=False)
    start = time.perf_counter()
    proc = ctx.Process(target=_child_entry_spawned, args=(func, args, child, memory_gb, capture))
    proc.start()
    child.close()
    got = parent.poll(timeout)
    seconds = time.perf_counter() - start
    if not got:
        proc.kill()
        proc.join()
        return Outcome("timeout", detail=f"still running after {timeout:g} s",
                       output=_read_capture(capture), seconds=seconds)
    try:
        kind, value = parent.recv()
    except EOFError:
        proc.join()
        code = proc.exitcode or 0
        detail = (f"killed by {_signal_name(-code)}" if code < 0 else
                  f"the process exited with code {code} before returning")
        return Outcome("signal" if code < 0 else "exit", detail=detail,
                       output=_read_capture(capture), seconds=seconds)
    proc.join()
    if kind == "raised":
        return Outcome("exit", detail=value, output=_read_capture(capture), seconds=seconds)
    return Outcome("ok", value=value, output=_read_capture(capture), seconds=seconds)


def _child_entry_spawned(func, args, conn, memory_gb, capture):
    out = open(capture, "w+b", buffering=0)
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    try:
        payload = ("ok", func(*args))
    except BaseException as e:  # noqa: BLE001
        payload = ("raised", f"{type(e).__name__}: {e}")
    conn.send(payload)
    conn.close()
