"""Does any function shipped in a copy of the course compute an exercise's answer?

`collect` grades the solutions (visible cases and hidden ones drawn at `seed`) and logs every call the checks
make to a solution function: its arguments, what the solution returned and what its arguments held after the call
(an exercise that writes in place, such as a cache write, answers there). `probe` (run with a copy's
directory first on sys.path) imports every module of that copy's `autograder` and `reference_engine`, and calls
each module-level function whose signature takes an exercise's arguments (the same number of required
parameters) with every logged input, each call with a deadline; a function that returns the solution's answer, and
leaves its arguments as the solution left them, on every input reproduces it.

    python -m tests.answer_probe collect OUT.bin [SEED [STEM ...]]   # in the instructor's tree
    python -m tests.answer_probe probe CALLS.bin OUT.json            # with the copy first on sys.path
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import signal
import sys
import warnings

PER_FUNCTION = 6  # logged inputs kept per exercise function
CALL_DEADLINE = 5.0
# The grader's machinery: it starts processes, sandboxes or grades its caller, writes stores or files, or serves;
# no answer is computed there (the checks, their harnesses and helpers, and the engine's modules are all probed).
# The interview is left out too: it asks on stdin, and its answers come from the solutions.
MACHINERY = ("autograder.cli", "autograder.reference", "autograder.release", "autograder.sync",
             "autograder.nbgrader_build", "autograder.bench", "autograder.runner", "autograder.zygote", "autograder.sandbox", "autograder.parallel",
             "autograder.oslimits", "autograder.learner_side", "autograder.nbgrader_grade", "autograder.notebook",
             "autograder.doctor", "autograder.gpu_check", "autograder.runtime", "autograder.interview",
             "reference_engine.server", "reference_engine.distributed", "reference_engine.tools.bench",
             "reference_engine.tools.startup", "reference_engine.tools.train")


class _Log:
    """A solutions module whose function calls are logged."""

    def __init__(self, module, calls: dict):
        self._module, self._calls = module, calls

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if not inspect.isfunction(value):
            return value
        calls = self._calls

        def logged(*args, **kwargs):
            from autograder import wire
            kept = calls.setdefault(name, [])
            before = None
            if len(kept) < PER_FUNCTION:  # the inputs as they were before the call (it may write into them)
                try:
                    before = wire.encode([list(args), dict(kwargs)])
                except wire.WireError:
                    pass
            result = value(*args, **kwargs)
            if before is not None:
                try:
                    after = wire.decode(wire.encode([result, list(args), dict(kwargs)]))
                    kept.append(wire.decode(before) + after)
                except wire.WireError:
                    pass
            return result
        return logged


def collect(seed: int, stems: list[str] | None = None) -> dict:
    """{stem: {function: [[args, kwargs, result], ...]}} from grading the solutions at `seed`."""
    from autograder import lessons
    from autograder.runner import Target, grade_lesson
    out = {}
    for stem in stems or [lesson.stem for lesson in lessons.available()]:
        calls: dict = {}
        ref = _Log(importlib.import_module(f"solutions.{stem}"), calls)
        grade_lesson(stem, Target.for_lesson(stem, solutions=True), seed, ref=ref)
        out[stem] = calls
    return out


def _functions(package: str):
    pkg = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")]
    for name in names:
        if name.endswith("__main__") or any(name == m or name.startswith(m + ".") for m in MACHINERY):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this platform cannot import ships nothing callable here
            continue
        for attr, fn in list(vars(module).items()):
            fn = inspect.unwrap(fn) if inspect.isfunction(fn) else fn
            if inspect.isfunction(fn) and fn.__module__ == name:
                yield f"{name}.{attr}", getattr(module, attr)


def _required(sig: inspect.Signature) -> int:
    return sum(1 for p in sig.parameters.values()
               if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


class _Deadline(Exception):
    pass


def _call(fn, args, kwargs):
    """fn(*args, **kwargs) on copies of the logged inputs, within CALL_DEADLINE, its printed output discarded:
    ("ok", [value, args after, kwargs after]) or ("failed", None). In this process: a fork per call costs too much
    for the thousands of candidates (the machinery that starts processes or sandboxes its caller is not probed)."""
    import contextlib
    import io

    from autograder import wire

    def expire(*_):
        raise _Deadline
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, CALL_DEADLINE)
    try:
        args, kwargs = wire.decode(wire.encode([list(args), dict(kwargs)]))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = fn(*args, **kwargs)
            return "ok", [value, list(args), dict(kwargs)]
    except BaseException:  # noqa: BLE001 - whatever a candidate raises, it did not reproduce the answer
        return "failed", None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _same(a, b) -> bool:
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5, equal_nan=True))
    if isinstance(a, float) or isinstance(b, float):
        try:
            return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))
        except (TypeError, ValueError):
            return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def _is_check(fn) -> bool:
    from autograder import core
    return any(spec.func is fn for specs in core._REGISTRY.values() for spec in specs)


def probe(calls: dict) -> list[dict]:
    """Every shipped function that returns a solution's answer on every logged input of that function. Run in a
    directory of its own (a candidate given a string may write a file by that name)."""
    import tempfile
    here = os.getcwd()
    os.chdir(tempfile.mkdtemp(prefix="answer-probe-"))
    try:
        return _probe(calls)
    finally:
        os.chdir(here)


def _probe(calls: dict) -> list[dict]:
    found = []
    exercises = []
    for stem, fns in calls.items():
        for name, logged in fns.items():
            if logged:
                exercises.append((stem, name, logged))
    for package in ("autograder", "reference_engine"):
        for qualname, fn in _functions(package):
            try:
                sig = inspect.signature(fn)
            except (TypeError, ValueError):
                continue
            if getattr(fn, "__module__", "").startswith("autograder.checks.") and _is_check(fn):
                continue  # a check itself: it takes a Trial
            for stem, name, logged in exercises:
                if _required(sig) != min(len(a) + len(k) for a, k, *_ in logged):
                    continue
                try:
                    for args, kwargs, *_ in logged:
                        sig.bind(*args, **kwargs)
                except TypeError:
                    continue
                same = 0
                for args, kwargs, *expected in logged:
                    status, value = _call(fn, args, kwargs)
                    if status != "ok" or not _same(value, expected):
                        break
                    same += 1
                if same == len(logged):
                    found.append({"function": qualname, "lesson": stem, "exercise": name, "inputs": same})
    return found


def _private_mounts() -> None:
    """A mount namespace of its own (and a user namespace where not root), before any thread starts: a candidate
    that mounts something (the sandbox's tmpfs) mounts it here only."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, clone_newuser, ms_rec, ms_private = 0x20000, 0x10000000, 0x4000, 0x40000
    if libc.unshare(clone_newns if os.geteuid() == 0 else clone_newuser | clone_newns) != 0:
        raise OSError(ctypes.get_errno(), "unshare: the probe runs only in a mount namespace of its own")
    libc.mount(b"none", b"/", None, ms_rec | ms_private, None)


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"]:
        _private_mounts()
    from autograder import wire
    if argv[0] == "collect":
        seed = int(argv[2]) if len(argv) > 2 else 1
        with open(argv[1], "wb") as f:
            f.write(wire.encode(collect(seed, argv[3:] or None)))
        return 0
    if argv[0] == "probe":
        with open(argv[1], "rb") as f:
            calls = wire.decode(f.read())
        with open(argv[2], "w") as f:
            json.dump(probe(calls), f, indent=1)
        return 0
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
