"""What a check is, and the Trial object a check uses to exercise learner code.

A check is a function `def name(t: Trial)` registered with `@check(points=...)`
in `autograder/checks/<lesson stem>.py`. It runs a few visible cases and a few
hidden ones drawn from `t.rng`; each case is one part of the score:

    @check(points=3, section="2.1")
    def kv_bytes_per_token(t):
        for label, cfg in cases(t):
            with t.case(label):
                expected = t.ref.kv_bytes_per_token(cfg, 2)      # trusted reference first
                got = t.call("kv_bytes_per_token", cfg, 2)       # learner code, isolated
                t.expect(got, expected, "bytes per token",
                         mistakes={"counts only K, not K and V": expected // 2})

which reports "... Looks like your code counts only K, not K and V."

A failing expectation ends its case; the message names the mistake when the
wrong value matches one of `mistakes`.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import random
import traceback
from typing import Any, Callable

import torch

from . import compare as cmp

PASSED, FAILED, ERROR, TIMEOUT, CRASHED, NOT_STARTED, NOT_GRADED = (
    "passed", "failed", "error", "timeout", "crashed", "not started", "not graded here")


@dataclasses.dataclass
class CheckSpec:
    lesson: str
    name: str
    func: Callable
    points: float
    section: str
    timeout: float
    requires_cuda: bool
    doc: str


_REGISTRY: dict[str, list[CheckSpec]] = {}


def check(points: float, section: str = "", timeout: float = 10.0, requires_cuda: bool = False):
    """Register a check for the lesson whose checks module defines it."""
    def deco(func):
        lesson = func.__module__.rsplit(".", 1)[-1]
        doc = (func.__doc__ or "").strip().splitlines()
        _REGISTRY.setdefault(lesson, []).append(CheckSpec(
            lesson, func.__name__, func, float(points), section, timeout, requires_cuda,
            doc[0] if doc else ""))
        return func
    return deco


def registered(lesson: str) -> list[CheckSpec]:
    return list(_REGISTRY.get(lesson, []))


@dataclasses.dataclass
class Part:
    label: str
    weight: float
    passed: bool
    message: str = ""
    graded: bool = True


class CaseFailed(Exception):
    """Raised by an expectation to end the current case."""


class NotStarted(Exception):
    """The learner's code still raises the stub's NotImplementedError."""


class LearnerRaised(Exception):
    def __init__(self, what: str, exc: BaseException, tb_text: str):
        super().__init__(what)
        self.what, self.exc, self.tb_text = what, exc, tb_text


def learner_traceback(exc: BaseException, skip_files: tuple[str, ...]) -> str:
    """The traceback with the grader's own frames removed: learners debug their code, not ours."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not any(f.filename.startswith(s) for s in skip_files)]
    lines = traceback.format_list(frames[-6:])
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip()


class Trial:
    """The handle a check gets: the learner's module, the reference, randomness, and scoring."""

    def __init__(self, impl, ref, seed: int, cuda: bool, skip_files: tuple[str, ...] = ()):
        self.impl, self.ref, self.seed, self.cuda = impl, ref, seed, cuda
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.parts: list[Part] = []
        self.device = "cuda" if cuda else "cpu"
        self._skip = skip_files

    # -- learner code -------------------------------------------------------
    def fn(self, name: str) -> Callable:
        obj = getattr(self.impl, name, None)
        if obj is None:
            raise LearnerRaised(name, AttributeError(name),
                                f"your module has no `{name}`: keep the names and signatures of the stubs")
        return obj

    def call(self, name: str, *args, **kwargs) -> Any:
        """Call learner function `name` on copies of the arguments, and notice if it mutates them."""
        fn = self.fn(name)
        return self.call_fn(fn, *args, what=name, **kwargs)

    def call_fn(self, fn: Callable, *args, what: str = "", **kwargs) -> Any:
        what = what or getattr(fn, "__name__", "your code")
        a, kw = copy.deepcopy(args), copy.deepcopy(kwargs)
        try:
            out = fn(*a, **kw)
        except NotImplementedError as e:
            raise NotStarted(str(e)) from None
        except Exception as e:  # noqa: BLE001 - learner code may raise anything
            raise LearnerRaised(what, e, learner_traceback(e, self._skip)) from None
        for i, (orig, used) in enumerate(zip(args, a)):
            if cmp.compare(used, orig, rtol=0, atol=0) is not None:
                self.fail(f"{what}() modified its argument #{i + 1} in place; "
                          "callers (the engine, the scheduler) still need the original: work on a copy")
        for k in kwargs:
            if cmp.compare(kw[k], kwargs[k], rtol=0, atol=0) is not None:
                self.fail(f"{what}() modified its argument `{k}` in place; work on a copy")
        return out

    # -- parts ----------------------------------------------------------------
    @contextlib.contextmanager
    def case(self, label: str, weight: float = 1.0, requires_cuda: bool = False):
        """One scored part. Learner exceptions and failed expectations end it, not the check."""
        if requires_cuda and not self.cuda:
            self.parts.append(Part(label, weight, False, "needs a CUDA GPU", graded=False))
            yield False
            return
        try:
            yield True
        except CaseFailed as e:
            self.parts.append(Part(label, weight, False, str(e)))
        except LearnerRaised as e:
            self.parts.append(Part(label, weight, False, f"{e.what}() raised:\n{e.tb_text}"))
        else:
            self.parts.append(Part(label, weight, True))

    def fail(self, message: str):
        raise CaseFailed(message)

    def expect(self, got, expected, what: str, mistakes: dict[str, Any] | None = None,
               rtol: float | None = None, atol: float | None = None, check_dtype: bool = True,
               hint: str = ""):
        """Fail the case unless `got` matches `expected`; name the mistake if it matches one."""
        msg = cmp.compare(got, expected, rtol, atol, check_dtype)
        if msg is None:
            return
        for name, wrong in (mistakes or {}).items():
            try:
                same = cmp.compare(got, wrong, rtol, atol, check_dtype) is None
            except Exception:  # noqa: BLE001 - a mistake value of another type simply does not match
                same = False
            if same:
                self.fail(f"{what}: {msg}. Looks like your code {name}.")
        self.fail(f"{what}: {msg}." + (f" {hint}" if hint else ""))

    def expect_true(self, cond: bool, message: str):
        if not cond:
            self.fail(message)

    def expect_raises(self, exc_type: type, fn: str | Callable, *args, why: str, what: str = ""):
        """Pass only if the learner's function (a name or a callable) raises `exc_type` on `args`."""
        what = what or (fn if isinstance(fn, str) else getattr(fn, "__qualname__", "your code"))
        try:
            got = self.call(fn, *args) if isinstance(fn, str) else self.call_fn(fn, *args, what=what)
        except LearnerRaised as e:
            if not isinstance(e.exc, exc_type):
                self.fail(f"{what}() raised {type(e.exc).__name__}, expected {exc_type.__name__}: {why}")
            return
        self.fail(f"{what}() returned {cmp.fmt(got)[:60]} instead of raising {exc_type.__name__}: {why}")

    @contextlib.contextmanager
    def learner_code(self, what: str):
        """Around code that calls learner code indirectly (the engine running a plugged-in component):
        a stub's NotImplementedError makes the check "not started", any other exception fails the
        case with the learner's traceback."""
        try:
            yield
        except (CaseFailed, NotStarted, LearnerRaised):
            raise
        except NotImplementedError as e:
            raise NotStarted(str(e)) from None
        except Exception as e:  # noqa: BLE001 - learner code may raise anything
            self.fail(f"{what} raised:\n{learner_traceback(e, self._skip)}")
