"""What a check is, and the Trial object a check uses to exercise learner code.

A check is a function `def name(t: Trial)` registered with `@check(points=...)`
in `autograder/checks/<lesson stem>.py`. It runs in the grader's own process,
which never runs learner code: `t.call(...)` sends the arguments to the
learner's process and gets plain data back (`autograder.sandbox`). Each case is
one part of the score:

    @check(points=3, section="2.1")
    def kv_bytes_per_token(t):
        for label, cfg in t.cases(visible=VISIBLE, hidden=random_config, n=4):
            with t.case(label):
                expected = t.ref.kv_bytes_per_token(cfg, 2)      # trusted reference, here
                got = t.call("kv_bytes_per_token", cfg, 2)       # learner code, over there
                t.expect(got, expected, "bytes per token",
                         mistakes={"counts only K, not K and V": expected // 2})

which reports "... Looks like your code counts only K, not K and V."

A failing expectation ends its case; the message names the mistake only when the
wrong value matches that mistake's value and no other's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import random
import re
from functools import partial
from typing import Any, Callable, Iterable

from . import compare as cmp
from . import wire
from .harnesses import is_harness
from .mistakes import groups, looks_like, named
from .reference import NotRecorded
from .sandbox import LearnerGone, LearnerRaised

PASSED, FAILED, ERROR, TIMEOUT, CRASHED, NOT_STARTED, NOT_GRADED, REJECTED = (
    "passed", "failed", "error", "timeout", "crashed", "not started", "not graded here", "rejected")

__all__ = ["check", "Trial", "CaseFailed", "NotStarted", "LearnerRaised", "LearnerGone", "LearnerFunction",
           "LearnerObject"]


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
    timed: bool = False  # it measures this machine's wall-clock time: graded with no other check running
    cost: float = 0.1  # rough seconds it takes: the longest are handed out first when graders share a lesson
    requires_triton: bool = False  # it launches a Triton kernel: "not graded here" where Triton is not installed


_REGISTRY: dict[str, list[CheckSpec]] = {}


def check(points: float, section: str = "", timeout: float = 10.0, requires_cuda: bool = False,
          timed: bool = False, cost: float = 0.1, requires_triton: bool = False):
    """Register a check for the lesson whose checks module defines it. timed=True: its verdict rests on
    wall-clock times measured on this machine (on CPU), so it is graded with no other check running.
    requires_triton=True: it launches the learner's Triton kernel, so where Triton is not installed (macOS,
    native Windows) it is "not graded here", decided by the grader, never by what the learner's code raises.
    cost: about how many seconds it takes on a 2-core CPU (a scheduling hint: when two graders share a
    lesson's checks, the costliest go first; no result depends on it)."""
    def deco(func):
        lesson = func.__module__.rsplit(".", 1)[-1]
        doc = (func.__doc__ or "").strip().splitlines()
        specs = _REGISTRY.setdefault(lesson, [])
        specs[:] = [s for s in specs if s.name != func.__name__]  # a reloaded module replaces, not doubles
        specs.append(CheckSpec(lesson, func.__name__, func, float(points), section, timeout, requires_cuda,
                               doc[0] if doc else "", timed, float(cost), requires_triton))
        return func
    return deco


def triton_missing() -> str | None:
    """None where Triton is installed; else the "not graded here" message: why, and what to do. Asked of this
    (the grader's) process, which runs in the learner processes' environment: what the learner's code raises
    never decides it."""
    from reference_engine.kernels import triton_compat
    return None if triton_compat.AVAILABLE else triton_compat.why()


def registered(lesson: str) -> list[CheckSpec]:
    return list(_REGISTRY.get(lesson, []))


def load_checks(stem: str, checks_module: str | None = None) -> list[CheckSpec]:
    """The lesson's checks, in file order. `checks_module` overrides where they live (tests)."""
    importlib.import_module(checks_module or f"autograder.checks.{stem}")
    return registered(stem)


FLOAT_COUNT = ("returns a float count: a product or a floor division with any float in it (7.0 // 2 == 3.0) is a "
               "float too; a count of whole things is an int (wrap it in int())")

# Part.kind: how a case ended.
OK, WRONG, RAISED, SKIPPED = "ok", "wrong", "raised", "skipped"


@dataclasses.dataclass
class Part:
    label: str
    weight: float
    passed: bool
    message: str = ""
    graded: bool = True
    kind: str = OK
    # A hidden case's own label as Trial.cases made it ("hidden 2"), "" for a visible case: a report for the
    # student (nbgrader's feedback) shows a hidden case by this label and how it ended, never its message
    # (which may hold the case's inputs and expected values), and the check's label (with the inputs) neither.
    hidden: str = ""


class CaseFailed(Exception):
    """Raised by an expectation to end the current case."""


class NotStarted(Exception):
    """The learner's code still raises the stub's NotImplementedError."""


# -- proxies for what lives in the learner's process -------------------------------------------------

class LearnerFunction:
    """A top-level function or class of the learner's module. Calling it runs it over there."""

    def __init__(self, trial: "Trial", ref, what: str):
        self._t, self.ref, self.what = trial, ref, what
        self.__name__ = self.__qualname__ = what

    def __call__(self, *args, **kwargs):
        return self._t._remote(self.ref, args, kwargs, self.what)

    def __repr__(self):
        return f"<your {self.what}>"


class LearnerObject:
    """An object that lives in the learner's process (a policy, an allocator, a cache).

    `obj.method` is a LearnerFunction; `obj.field` fetches the field's value as data.
    """

    def __init__(self, trial: "Trial", handle: wire.Handle):
        object.__setattr__(self, "_t", trial)
        object.__setattr__(self, "handle", handle)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._t._attr(self, name)

    def __setattr__(self, name, value):
        raise AttributeError("a learner object is read-only from the grader")

    def __call__(self, *args, **kwargs):
        return self._t._remote(self.handle, args, kwargs, self.handle.type)

    def __repr__(self):
        return f"<your {self.handle.type} object>"


class _Cases(list):
    """What t.cases returns: the cases, as a list; a loop over it tells its Trial whether it is at a hidden one,
    so that a case opened in the loop's body is known to be hidden even when its label does not say so."""

    def __init__(self, trial: "Trial", items: list, hidden_at: list[str]):
        super().__init__(items)
        self._trial, self._hidden_at = trial, hidden_at

    def __iter__(self):
        return _CasesIterator(self._trial, list.__iter__(self), self._hidden_at)


class _CasesIterator:
    """Sets trial._at_hidden to the hidden label of the item it hands out ("" for a visible one, and when the
    loop is done). Left where it is when the loop stops early (a break, an exception): a case opened after that
    counts as hidden, which hides too much rather than too little."""

    def __init__(self, trial: "Trial", items, hidden_at: list[str]):
        self._trial, self._items, self._hidden_at, self._i = trial, items, hidden_at, 0

    def __iter__(self):
        return self

    def __next__(self):
        try:
            item = next(self._items)
        except StopIteration:
            self._trial._at_hidden = ""
            raise
        self._trial._at_hidden = self._hidden_at[self._i] if self._i < len(self._hidden_at) else ""
        self._i += 1
        return item


@dataclasses.dataclass
class CheckResult:
    lesson: str
    name: str
    section: str
    points: float
    earned: float
    status: str
    message: str
    parts: list = dataclasses.field(default_factory=list)
    output: str = ""
    seconds: float = 0.0
    mistakes_tested: list = dataclasses.field(default_factory=list)  # names whose value differed on a case
    hidden_case: str = ""  # the hidden case the check stopped in ("hidden 2"): `message` is not for the student

    @property
    def graded(self) -> bool:
        return self.status != NOT_GRADED

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["parts"] = [dataclasses.asdict(p) if isinstance(p, Part) else p for p in self.parts]
        return d



class Trial:
    """The handle a check gets: the learner's process, the reference, randomness, and scoring.

    - t.ref: the reference solutions (trusted; computed here)
    - t.rng (random.Random), t.gen (torch.Generator): seeded per run and per check
    - t.visible_only: True in a student's copy, where only visible cases are graded
    """

    def __init__(self, learner, ref, seed: int, cuda: bool, visible_only: bool = False):
        self._learner = learner          # a sandbox.LearnerProcess (started lazily by the runner)
        self.ref, self.seed, self.cuda = ref, seed, cuda
        self.visible_only = visible_only
        self.rng = random.Random(seed)
        self._gen = None
        self.parts: list[Part] = []
        self.device = "cuda" if cuda else "cpu"
        self._case_open = False
        self.offered: set[str] = set()  # mistakes that made a difference on some case (see expect)
        self._hidden_labels: list[str] = []  # the labels t.cases gave hidden cases ("hidden 1", ...)
        self._at_hidden = ""  # the hidden case a loop over t.cases' list is at ("" at a visible one, or done)
        # The hidden case open now ("" for a visible one); after the check, the one whose body raised what ended it
        # (a timeout, a crash, a stub: its message is not for the student).
        self.stopped_in = ""

    @property
    def gen(self):
        """A torch.Generator seeded with the check's seed, made on first use (a lesson without tensors never
        imports torch)."""
        if self._gen is None:
            import torch
            self._gen = torch.Generator().manual_seed(self.seed)
        return self._gen

    # -- cases -------------------------------------------------------------------------------------
    def cases(self, visible: Iterable = (), hidden: Callable[[random.Random], Any] | Iterable | None = None,
              n: int = 0, label: str = "hidden") -> list:
        """Visible cases as given, then `n` hidden ones drawn with `hidden(t.rng)` (or taken from an
        iterable). Visible items are returned as they are; hidden ones as (label, case) when the visible
        items are pairs, else bare. In a student's copy (t.visible_only) the hidden ones are left out,
        but still drawn, so that the visible cases' randomness does not depend on the mode.
        A case opened for a hidden item is marked hidden (Part.hidden, see _hidden): a report for the student
        names it, never shows its message."""
        out = list(visible)
        pairs = bool(out) and all(isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in out)
        drawn = []
        if callable(hidden):
            drawn = [hidden(self.rng) for _ in range(n)]
        elif hidden is not None:
            drawn = list(hidden)
        if self.visible_only:
            return out
        names = [f"{label} {i + 1}" for i in range(len(drawn))]
        self._hidden_labels += names
        hidden_at = [""] * len(out) + names
        out += [(name, case) if pairs else case for name, case in zip(names, drawn)]
        return _Cases(self, out, hidden_at)

    def _hidden(self, label: str) -> str:
        """The hidden case a case labelled `label` belongs to, "" if none: its label holds a label t.cases gave a
        hidden case ("hidden 2: 4096 FLOPs on ...", "... users, hidden 2, dtype=..."), or it is opened while a
        loop over t.cases' list is at a hidden case (the bare, unlabelled form)."""
        for name in self._hidden_labels:
            if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w.])", label):
                return name
        return self._at_hidden

    @property
    def hidden_now(self) -> str:
        """The hidden case the check was in when it stopped ("" if none): what the runner reports the check's
        own message under, for a student."""
        return self.stopped_in or self._at_hidden

    @contextlib.contextmanager
    def case(self, label: str, weight: float = 1.0, requires_cuda: bool = False, requires_triton: bool = False):
        """One scored part. Learner exceptions and failed expectations end it, not the check. A case that
        needs what this machine lacks (a CUDA GPU, Triton) is "not graded here" and its body never runs."""
        missing = "needs a CUDA GPU" if requires_cuda and not self.cuda else \
            triton_missing() if requires_triton else None
        hidden = self._hidden(label)
        if missing:
            self.parts.append(Part(label, weight, False, missing, graded=False, kind=SKIPPED, hidden=hidden))
            yield False
            return
        self._case_open = True
        self.stopped_in = hidden  # cleared below when the case ends here, kept when what it raised ends the check
        try:
            yield True
        except CaseFailed as e:
            self.parts.append(Part(label, weight, False, str(e), kind=WRONG, hidden=hidden))
        except LearnerRaised as e:
            if e.not_implemented:
                raise NotStarted(e.stub_message) from None
            self.parts.append(Part(label, weight, False, f"{e.what}() raised:\n{e.tb_text}", kind=RAISED,
                                   hidden=hidden))
        except NotRecorded:
            self.parts.append(Part(label, weight, False, "graded by your instructor (this copy stores the "
                                   "answers of the visible cases only)", graded=False, kind=SKIPPED, hidden=hidden))
        else:
            self.parts.append(Part(label, weight, True, hidden=hidden))
        finally:
            self._case_open = False
        self.stopped_in = ""

    def fail(self, message: str, mistake: str | list[str] | None = None, end: str = "."):
        """End the case with `message`; with a mistake's name, followed by "Looks like your code <mistake>."
        (`end` closes that sentence)."""
        raise CaseFailed(f"{message} {looks_like(mistake, end)}" if mistake else message)

    def not_graded(self, label: str, why: str, weight: float = 1.0):
        """Record a part that is "not graded here", and why (a scenario this machine could not set up): it
        counts neither for nor against the learner, and the check is never "passed" on it alone."""
        self.parts.append(Part(label, weight, False, f"not graded: {why}", graded=False, kind=SKIPPED,
                               hidden=self._hidden(label)))

    def require_started(self, call: Callable, *args, **kwargs):
        """Call learner code once, before anything costly (an engine, a server) is built: a stub's
        NotImplementedError ends the check "not started" at once; its value, or anything else it raises, is
        left to the cases, which call it as they judge it.

            t.require_started(lambda: t.fn("MyPolicy")().schedule([], None))
        """
        self.attempt(call, *args, **kwargs)

    # -- learner code --------------------------------------------------------------------------------
    def fn(self, name: str) -> LearnerFunction:
        """The learner's top-level `name` (a function or a class), as a proxy."""
        info = self._learner.lookup(name)
        if info is None:
            raise LearnerRaised(name, {"type": "AttributeError", "mro": ["AttributeError"], "not_implemented": False,
                                       "message": name,
                                       "tb": f"your module has no `{name}`: keep the names and signatures of the stubs"})
        return LearnerFunction(self, wire.LearnerRef(name), name)

    def learner(self, name: str) -> wire.LearnerRef:
        """A reference to the learner's `name` to pass to a harness function (`t.run`)."""
        return wire.LearnerRef(name)

    def both(self, name: str, *args, **kwargs) -> tuple[Any, Any]:
        """`(got, expected)`: the learner's `name(*args)` (over there, argument changes checked) and the
        reference's (here), for the commonest case, where expected is just the reference on the same
        arguments. The reference runs first: a broken case is the grader's bug, not the learner's."""
        expected = getattr(self.ref, name)(*args, **kwargs)
        return self.call(name, *args, **kwargs), expected

    def attempt(self, call: Callable, *args, **kwargs) -> tuple[Any, LearnerRaised | None]:
        """call(*args, **kwargs), a call of learner code (t.call, t.call_fn, t.run, a LearnerFunction): (its value,
        None), or (None, what the learner's code raised) for a check that judges the exception itself. A stub's
        NotImplementedError is never returned: it ends the check "not started", as everywhere.

            got, raised = t.attempt(t.call, "dtype_bytes", spec)
            if raised and not raised.is_a(ValueError): t.fail(...)
        """
        try:
            return call(*args, **kwargs), None
        except LearnerRaised as e:
            if e.not_implemented:
                raise NotStarted(e.stub_message) from None
            return None, e

    def blame_upstream(self, what: str, upstream: str, calls: Iterable, *, rtol: float | None = 1e-6,
                       show: Callable[[Any], str] = repr, shown: str | None = None,
                       normalize: Callable[[Any], Any] | None = None) -> None:
        """Asked once `what`'s answer is wrong: a check grades its own function, so when the learner's `upstream`
        (another exercise `what` calls) gives a wrong value on one of `calls` [(args, expected)], the case fails
        naming `upstream`, whose own check names the mistake. `expected` is the reference's value, computed up front
        whatever the answer (so that a student's copy has it recorded). A stub upstream blames nothing: `what` may
        have been written without it. The arguments are shown with `show`, or as the text `shown`; `normalize`
        puts the learner's value in the reference's form first (a list for any sequence, a bool for a truth value).

            if wrong: t.blame_upstream("cold_start_seconds", "hop_seconds", [((hop, nbytes), ref_hop)])
        """
        for args, exp in calls:
            try:
                got, raised = self.attempt(self.call, upstream, *args)
            except NotStarted:
                return
            if raised is None and normalize is not None:
                got = normalize(got)
            if isinstance(got, (list, tuple)) and isinstance(exp, (list, tuple)):
                got = type(exp)(got)
            wrong = f"raised {raised.type_name}" if raised is not None else cmp.compare(got, exp, rtol)
            if wrong is not None:
                text = shown if shown is not None else ", ".join(show(a) for a in args)
                self.fail(f"{what} depends on {upstream}, which fails here: {upstream}({text[:200]}) {wrong}. Fix "
                          f"{upstream} first (its own check names the mistake); {what} is graded once it is right")

    def call(self, name: str, *args, **kwargs) -> Any:
        """Call learner function `name` over there, and notice if it mutates its arguments."""
        return self.call_fn(self.fn(name), *args, what=name, **kwargs)

    def call_fn(self, fn, *args, what: str = "", inplace: bool = False, **kwargs) -> Any:
        """Call a learner callable (t.fn(...), an object's method). With inplace=True the arguments as
        the learner left them are returned too, `(value, args_after)`: for APIs that edit a list in
        place on purpose (a block table); otherwise changing an argument fails the case."""
        ref = fn.ref if isinstance(fn, LearnerFunction) else getattr(fn, "handle", None)
        if ref is None:
            raise TypeError(f"call_fn needs a learner function or object, not {fn!r}")
        what = what or getattr(fn, "what", "your code")
        value, args_after, kw_after = self._learner.call(ref, args, kwargs, what=what, return_args=True)
        if inplace:
            return value, args_after
        for i, (orig, used) in enumerate(zip(args, args_after or [])):
            if _changed(used, orig):
                self.fail(f"{what}() modified its argument #{i + 1} in place; "
                          "callers (the engine, the scheduler) still need the original: work on a copy")
        for k in kwargs:
            if _changed((kw_after or {}).get(k), kwargs[k]):
                self.fail(f"{what}() modified its argument `{k}` in place; work on a copy")
        return self._wrap(value)

    def run(self, harness: Callable, *args, what: str = "your code", **kwargs) -> Any:
        """Run a trusted harness function (a module-level function of an autograder module) in the
        learner's process, e.g. the engine with the learner's policy plugged in. Pass learner names
        with t.learner("Name"). It must return plain data: the grader judges that, not the learner."""
        value = self._learner.harness(_harness_name(harness), args, kwargs, what=what)
        return self._wrap(value)

    def run_against(self, reference: Callable[[], Any], harness: Callable, *args, what: str = "your code",
                    **kwargs) -> tuple[Any, Any]:
        """`(got, expected)`: `t.run(harness, *args, **kwargs)` and `reference()` at the same time. The
        learner's process starts the harness, the grader computes `reference()` (e.g. the same engine run
        with the engine's own component, through `t.reference`) while it runs, then reads the learner's
        answer: on two cores an engine check takes the time of one run instead of two. The reference
        still never sees learner output, and a reference that raises (a grader bug) is re-raised after
        the learner's answer is read, so the process stays in step."""
        self._learner.send_harness(_harness_name(harness), args, kwargs)
        try:
            expected = reference()
        except BaseException:
            try:
                self._learner.receive(what)
            except Exception:  # noqa: BLE001 - the reference's error is the one to report
                pass
            raise
        value = self._learner.receive(what)["value"]
        return self._wrap(value), expected

    def _remote(self, ref, args, kwargs, what: str):
        value, _, _ = self._learner.call(ref, args, kwargs, what=what)
        return self._wrap(value)

    def _attr(self, obj: LearnerObject, name: str):
        what = f"{obj.handle.type}.{name}"
        value = self._learner.getattr(obj.handle, name, what=what)
        if isinstance(value, wire.MethodRef):
            return LearnerFunction(self, value, what)
        return self._wrap(value)

    def _wrap(self, value):
        """Handles become proxies; everything else is already plain data."""
        if isinstance(value, wire.Handle):
            return LearnerObject(self, value)
        if isinstance(value, wire.MethodRef):
            return LearnerFunction(self, value, value.attr)
        if type(value) is list:
            return [self._wrap(v) for v in value]
        if type(value) is tuple:
            return tuple(self._wrap(v) for v in value)
        if type(value) is dict:
            return {k: self._wrap(v) for k, v in value.items()}
        return value

    # -- the reference -------------------------------------------------------------------------------
    def reference(self, fn: Callable, *args, **kwargs):
        """A reference computation made of more than one `t.ref` call, e.g. the engine run with the
        reference policy: returns fn(t.ref, *args, **kwargs). `fn` must be a module-level function and
        its arguments and result plain data (numbers, strings, lists, dicts, tensors): in a student's
        copy, which has no solutions, the result is replayed from values stored at release time."""
        hook = getattr(self.ref, "_course_reference", None)
        if hook is not None:
            return hook(fn, args, kwargs)
        return fn(self.ref, *args, **kwargs)

    # -- expectations ---------------------------------------------------------------------------------
    def expect(self, got, expected, what: str, mistakes: dict[str, Any] | None = None,
               rtol: float | None = None, atol: float | None = None, check_dtype: bool = True,
               hint: str = "", count: bool = False):
        """Fail the case unless `got` matches `expected`.

        `mistakes` maps a mistake's name (read after "your code ...") to the value that mistake gives.
        The mistake rule (autograder/mistakes.py): a mistake whose value equals the expected one is ignored;
        mistakes with the same value are named together ("X; or your code Y"), since the output cannot tell
        them apart; a wrong value is named when it matches one mistake's value and no other's.
        `count=True`: `expected` is a count of whole things (users, blocks), so `got` must be an int, not a
        float of the same value (a caller uses it as a count: range(n), a list size)."""
        same = partial(_same, rtol=rtol, atol=atol, check_dtype=check_dtype)
        found = groups(mistakes or {}, same, expected)
        self.offered.update(name for names, _ in found for name in names)
        if count and isinstance(expected, int) and not (isinstance(got, int) and not isinstance(got, bool)):
            if isinstance(got, float) and got == expected:
                self.fail(f"{what}: got the float {got!r}, expected the int {expected}.", FLOAT_COUNT, end="")
        msg = cmp.compare(got, expected, rtol, atol, check_dtype)
        if msg is None:
            return
        names = named(got, found, same)
        self.fail(f"{what}: {msg}." + ("" if names or not hint else f" {hint}"), names)

    def expect_dict(self, got, expected: dict, what: str, mistakes: dict[str, dict] | None = None,
                    keys=None, rtol: float | None = None, atol: float | None = None):
        """A dict answer, key by key (in `keys` order, default expected's): it must be a dict holding every
        key; `mistakes` maps a mistake's name to the whole dict that mistake gives. A mistake is offered for
        a wrong key only if it agrees with every key the learner got right (a mistake that would have shown
        in a right key does not explain a wrong one)."""
        keys = list(expected if keys is None else keys)
        if not isinstance(got, dict):
            self.fail(f"{what}: expected a dict with keys {keys}, got {cmp.describe(got)}")
        missing = [k for k in keys if k not in got]
        if missing:
            self.fail(f"{what}: the dict is missing key(s) {missing} (expected keys {keys})")
        mistakes = mistakes or {}
        self.offered.update(name for name, wrong in mistakes.items()  # tested here: it differs on some key
                            if not all(_same(wrong[k], expected[k], rtol, atol, True) for k in keys))
        right = [k for k in keys if cmp.compare(got[k], expected[k], rtol, atol) is None]
        fits = {name: wrong for name, wrong in mistakes.items()
                if all(_same(wrong[k], expected[k], rtol, atol, True) for k in right)}
        for k in keys:
            self.expect(got[k], expected[k], f"{what}[{k!r}]", rtol=rtol, atol=atol,
                        mistakes={name: wrong[k] for name, wrong in fits.items()})

    def expect_true(self, cond: bool, message: str, mistake: str | list[str] | None = None, end: str = "."):
        """Fail the case with `message` unless cond is True; a mistake's name makes it as t.fail does ("Looks like
        your code <mistake>." after the message)."""
        if cond is not True and not (isinstance(cond, bool) and cond):
            self.fail(message, mistake, end)

    def expect_raises(self, exc_type: type, fn: str | LearnerFunction, *args, why: str, what: str = ""):
        """Pass only if the learner's function (a name or a proxy) raises `exc_type` on `args`."""
        what = what or (fn if isinstance(fn, str) else getattr(fn, "what", "your code"))
        got, raised = self.attempt(self.call, fn, *args) if isinstance(fn, str) else \
            self.attempt(self.call_fn, fn, *args, what=what)
        if raised:
            if not raised.is_a(exc_type):
                self.fail(f"{what}() raised {raised.type_name}, expected {exc_type.__name__}: {why}")
            return
        self.fail(f"{what}() returned {cmp.fmt(got)[:60]} instead of raising {exc_type.__name__}: {why}")


def _changed(after, before) -> bool:
    """Whether an argument came back changed: different at zero tolerance, or a dict (at any depth) with keys
    added (compare() lets an answer carry extra keys; an argument must come back as it went)."""
    return cmp.compare(after, before, rtol=0, atol=0) is not None or _keys_added(after, before)


def _keys_added(after, before) -> bool:
    if isinstance(before, dict) and isinstance(after, dict):
        return set(after) != set(before) or any(_keys_added(after[k], before[k]) for k in before)
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)):
        return any(_keys_added(a, b) for a, b in zip(after, before))
    return False


def _harness_name(harness: Callable) -> str:
    """"module:qualname" of a function marked @harness (the learner process would refuse any other)."""
    if not is_harness(harness):
        raise TypeError(f"{harness!r} is not a harness: mark it @harness in autograder/harnesses/")
    return f"{harness.__module__}:{harness.__qualname__}"


def _same(a, b, rtol, atol, check_dtype) -> bool:
    try:
        return cmp.compare(a, b, rtol, atol, check_dtype) is None
    except Exception:  # noqa: BLE001 - values of other types simply do not match
        return False
