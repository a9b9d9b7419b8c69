"""The learner's side of the trust boundary: the process that runs learner code for one check.

It is forked from the zygote (`autograder.zygote`), a process that never imported
`solutions/` and holds no expected value, and it serves requests from the grader
over a socket: load the learner's module, call a function or a method, read an
attribute, or run a trusted harness function (the engine with a learner's policy
plugged in). Every reply is plain data (`autograder.wire`); objects that are not
data stay here and the grader gets a `Handle` to them.

Nothing here is trusted by the grader: learner code can patch this module, and the
grader judges only the data it receives.
"""
from __future__ import annotations

import contextlib
import faulthandler
import importlib
import importlib.abc
import importlib.util
import io
import os
import socket
import struct
import sys
import traceback

from . import oslimits, runtime, wire

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# What a learner process may not import: the reference solutions, and the grader's checks (their expected values
# and mistake models). The harness functions that run in a learner process live in autograder/harnesses/.
_BLOCKED = ("solutions", "autograder.checks")


def _blocked(name: str) -> bool:
    return any(name == b or name.startswith(b + ".") for b in _BLOCKED)


class _SolutionsBlocker(importlib.abc.MetaPathFinder):
    """Refuse to import the reference solutions and the grader's checks in a learner process."""

    def find_spec(self, fullname, path=None, target=None):
        if _blocked(fullname):
            raise ImportError(f"`{fullname}` cannot be imported while your code is graded: the solutions and "
                              "the grader's checks are not part of what your code may use")
        return None


class _EngineImports:
    """builtins.__import__ for a learner process: the learner's module (and the functions in it) may import of
    the engine only what its lesson's stub imports (scan.EngineUse: the engine implements several lessons'
    answers). Imports made by the engine itself and by harnesses go through untouched."""

    def __init__(self, module: str, use, inner):
        self.module, self.use, self.inner = module, use, inner

    def __call__(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == "reference_engine" or name.startswith("reference_engine.")) \
                and type(globals) is dict and globals.get("__name__") == self.module:
            wanted = [(name, n) for n in fromlist] if fromlist else [(name, None)]
            for module, item in wanted:
                if not self.use.allows_import(module, item):
                    what = module if item is None else f"{module}.{item}"
                    raise ImportError(f"`{what}` cannot be imported in this lesson's exercise: its stub does not "
                                      "use that part of the engine (it may implement the lesson's answer)")
        return self.inner(name, globals, locals, fromlist, level)


# -- framing -------------------------------------------------------------------------------------

def send_msg(sock: socket.socket, data: bytes):
    sock.sendall(struct.pack("<Q", len(data)) + data)


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_msg(sock: socket.socket) -> bytes | None:
    head = recv_exact(sock, 8)
    if head is None:
        return None
    (n,) = struct.unpack("<Q", head)
    return recv_exact(sock, n)


# -- errors ----------------------------------------------------------------------------------------

def learner_traceback(exc: BaseException) -> str:
    """The traceback without the grader's own frames: learners debug their code, not ours."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_PKG_DIR)]
    lines = traceback.format_list(frames[-6:])
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip()


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def describe_exception(exc: BaseException) -> dict:
    try:
        message = str(exc)[:4000]
    except Exception:  # noqa: BLE001 - a learner's exception whose __str__ raises
        message = "(its message could not be printed)"
    try:
        tb = learner_traceback(exc)
    except Exception:  # noqa: BLE001
        tb = f"{type(exc).__name__}: {message}"
    return {"type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
            "message": message, "tb": tb[-6000:],
            "not_implemented": any(isinstance(e, NotImplementedError) for e in _chain(exc))}


# -- the server --------------------------------------------------------------------------------------

class Server:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.module = None
        self.objects: dict[int, object] = {}
        self.ids: dict[int, int] = {}   # id(obj) -> handle id, so one object keeps one handle

    # handles
    def to_handle(self, obj) -> wire.Handle:
        hid = self.ids.get(id(obj))
        if hid is None:
            hid = len(self.objects) + 1
            self.objects[hid] = obj
            self.ids[id(obj)] = hid
        return wire.Handle(hid, type(obj).__name__, callable(obj))

    def resolve(self, ref):
        if isinstance(ref, wire.Handle):
            return self.objects[ref.id]
        if isinstance(ref, wire.MethodRef):
            return getattr(self.objects[ref.handle], ref.attr)
        if isinstance(ref, wire.LearnerRef):
            return getattr(self.module, ref.name)
        raise wire.WireError(f"cannot resolve {ref!r}")

    def rebuild(self, kind: str, cls_name: str, values):
        """A NamedTuple or dataclass sent by the grader becomes the learner module's class of that name."""
        cls = getattr(self.module, cls_name, None)
        if isinstance(cls, type):
            try:
                return cls(*values) if kind == "namedtuple" else cls(**values)
            except Exception:  # noqa: BLE001 - a changed class: send the plain values
                pass
        return values if kind == "namedtuple" else wire.Record(cls_name, values)

    def encode(self, value) -> bytes:
        return wire.encode(value, on_object=self.to_handle)

    # ops
    def op_load(self, req):
        name, path = req["name"], req["path"]
        for p in req.get("sys_path", []):
            if p not in sys.path:
                sys.path.insert(0, p)
        if req.get("engine") is not None:
            import builtins

            from .scan import EngineUse
            builtins.__import__ = _EngineImports(name, EngineUse.from_dict(req["engine"]), builtins.__import__)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        self.module = mod
        return {"file": path}

    def op_lookup(self, req):
        if not hasattr(self.module, req["name"]):
            return None
        obj = getattr(self.module, req["name"])
        return {"type": type(obj).__name__, "callable": callable(obj), "class": isinstance(obj, type)}

    def op_call(self, req):
        fn = req["fn"]
        args, kwargs = req.get("args", []), req.get("kwargs", {})
        out = fn(*args, **kwargs)
        reply = {"value": out}
        if req.get("return_args"):
            reply["args"] = list(args)
            reply["kwargs"] = dict(kwargs)
        return reply

    def op_getattr(self, req):
        obj = req["obj"]
        value = getattr(obj, req["attr"])
        if callable(value) and not isinstance(value, type) and hasattr(value, "__self__"):
            return {"value": wire.MethodRef(self.to_handle(obj).id, req["attr"])}
        return {"value": value}

    def op_harness(self, req):
        """Run a harness function ("module:qualname"): a function of the learner side of the checks
        (autograder/harnesses/; never autograder.checks, which a learner process may neither import nor read)
        marked @harness. Nothing else, whatever the request names."""
        from .harnesses import is_harness
        modname, _, qual = req["fn"].partition(":")
        if not modname.startswith("autograder.harnesses."):
            raise ValueError(f"not a harness function: {req['fn']} (harnesses live in autograder/harnesses/)")
        fn = importlib.import_module(modname)
        for part in qual.split("."):
            fn = getattr(fn, part)
        if not is_harness(fn):
            raise ValueError(f"not a harness function: {req['fn']} is not marked @harness")
        return {"value": fn(*req.get("args", []), **req.get("kwargs", {}))}

    def serve(self):
        while True:
            data = recv_msg(self.sock)
            if data is None:
                return
            try:
                req = wire.decode(data, device_map=_device_map, resolve=self.resolve, rebuild=self.rebuild)
                op = getattr(self, "op_" + req["op"])
            except BaseException as e:  # noqa: BLE001
                send_msg(self.sock, wire.encode({"error": f"bad request: {type(e).__name__}: {e}"}))
                continue
            try:
                reply = {"ok": op(req)}
            except BaseException as e:  # noqa: BLE001 - the learner's code may raise anything, SystemExit too
                reply = {"raised": describe_exception(e)}
            try:
                out = self.encode(reply)
            except BaseException as e:  # noqa: BLE001
                out = wire.encode({"raised": {
                    "type": "WireError", "mro": ["WireError"], "not_implemented": False,
                    "message": f"what your code returned cannot be sent to the grader: {e}",
                    "tb": f"what your code returned cannot be sent to the grader: {e}"}})
            send_msg(self.sock, out)


def _device_map(device: str) -> str:
    if device == "cuda":
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu"


def _limit_memory(extra_gb: float, cuda: bool = False):
    """Cap this process's memory at what it holds now plus `extra_gb`: a 100 GiB allocation becomes a
    MemoryError in this process instead of the machine swapping or the OOM killer picking a victim.

    Without CUDA the cap is on the address space (RLIMIT_AS, VmSize). CUDA reserves huge address ranges it
    never writes (no access rights, so they hold no memory), which an address-space cap would refuse; with
    CUDA the cap is on private writable memory instead (RLIMIT_DATA, VmData), where those ranges do not count.
    """
    try:
        import resource
        field, limit = ("VmData:", resource.RLIMIT_DATA) if cuda else ("VmSize:", resource.RLIMIT_AS)
        with open("/proc/self/status") as f:
            cur = next((int(line.split()[1]) * 1024 for line in f if line.startswith(field)), 0)
        if cur:
            lim = cur + int(extra_gb * 2**30)
            resource.setrlimit(limit, (lim, lim))
    except (ImportError, ValueError, OSError, StopIteration):
        pass


def _max_fd() -> int:
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return soft if 0 < soft < 1 << 20 else 4096
    except (ImportError, ValueError, OSError):
        return 4096


# Open files a child must keep although the learner did not open them: the NVIDIA driver's device files.
# torch asks NVML whether a GPU is present and never shuts NVML down, so a process that asked (the zygote) holds
# /dev/nvidia* open, and its forked child inherits NVML's state: closing those files there makes every later
# NVML query fail ("Can't initialize NVML"), torch.cuda.is_available() answer False and Triton find no driver.
DRIVER_FILES = ("/dev/nvidia",)


def _close_fds_except(sock_fd: int, keep_prefixes: tuple[str, ...] = DRIVER_FILES):
    """Close every descriptor from 3 up except `sock_fd` and those open on a path under `keep_prefixes`."""
    keep = {sock_fd}
    try:
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                if os.readlink(f"/proc/self/fd/{name}").startswith(keep_prefixes):
                    keep.add(int(name))
    except OSError:
        pass
    lo = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, _max_fd())


# Environment variables a learner process keeps (by name, or by prefix): what Python, torch, Triton, CUDA and the
# course read. Anything else the grader's environment holds (a token, a password) is not the learner's to read.
_ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "HOME", "TMPDIR", "USER", "LOGNAME", "VIRTUAL_ENV",
             "LD_LIBRARY_PATH", "SYSTEMROOT")
_ENV_KEEP_PREFIXES = ("LC_", "PYTHON", "COURSE_", "TORCH", "TRITON_", "CUDA_", "NVIDIA_", "CUBLAS_", "CUDNN_",
                      "NCCL_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "MPL", "PYTORCH_")


def _scrub_environment() -> None:
    for name in list(os.environ):
        if name not in _ENV_KEEP and not name.startswith(_ENV_KEEP_PREFIXES):
            del os.environ[name]


def child_main(sock: socket.socket, spec: dict):
    """Entry of a learner process (forked from the zygote, in a session of its own)."""
    try:
        os.setsid()  # its own process group: the grader kills the whole group when the check ends
    except OSError:
        pass
    faulthandler.disable()  # a segfault is reported by the grader, not dumped to a terminal
    # Nothing the grader (or a test runner, or a notebook kernel) has open is the learner's to write to:
    # keep the request socket only (and the GPU driver's device files: DRIVER_FILES).
    _close_fds_except(sock.fileno())
    out = os.open(spec["capture"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    sys.stdout = sys.stderr = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True)
    sys.stdin = open(os.devnull)
    _scrub_environment()
    os.environ["COURSE_LEARNER_PROCESS"] = "1"
    sys.meta_path.insert(0, _SolutionsBlocker())
    for name in [m for m in sys.modules if _blocked(m)]:
        del sys.modules[name]
    runtime.limit_threads(1)  # a forked child must not reuse the parent's thread pool
    if spec.get("memory_gb"):
        _limit_memory(spec["memory_gb"], cuda=spec.get("memory_cap") == "data")
    oslimits.make_dumpable()  # (the zygote is not: a fork inherits that) debuggable as any process of its user
    if spec.get("sandbox"):
        _sandbox(spec["sandbox"], spec["capture"])
    Server(sock).serve()


def _sandbox(sandbox: dict, capture: str):
    """The operating system's limits, before any learner code runs (autograder/oslimits.py): namespaces where the
    grader found them (this process then forks the PID namespace's init, which goes on to serve, and itself only
    relays how that one ended), then Landlock. The grader asked for them because its kernel has them, so a
    process that cannot set them up serves nothing (exit code 71)."""
    scratch = sandbox["scratch"]
    for var in ("TMPDIR", "HOME", "TRITON_CACHE_DIR", "MPLCONFIGDIR"):
        os.environ[var] = scratch
    import tempfile
    tempfile.tempdir = scratch
    try:
        oslimits.confine(scratch, oslimits.learner_rules(sandbox.get("target"), scratch, capture,
                                                         sandbox.get("readable", ())), bool(sandbox.get("namespaces")))
    except Exception as e:  # noqa: BLE001
        print(f"the grader could not sandbox this process: {e}", flush=True)
        os._exit(71)
