"""A differential driver: the same operations on the learner's object (in the learner's process) and on a model of it
here (the engine's own class, a brute-force spec), judged after each; lessons 04 (the block allocator) and 18 (the
radix tree) subclass it.

    class _Drive(Differential):
        cls = "PagedBlockAllocator"                       # the learner's class, built with __init__'s args
        def where(self): return f"\\n  (num_blocks={self.n}; ...)"   # what every failure ends with
        def grow(self, i):
            self.log.append(f"table {i} grows")           # the operation log a failure shows
            b = self.m("allocate")                        # a method call; what it raises fails the case
            self.check_value(b, self.ref.allocate(), "allocate()", mistakes={...})

The stub rule: a stub's NotImplementedError, raised by any call, ends the check "not started" (Trial.attempt). The
verdicts use the mistake rule (autograder/mistakes.py), and a mistake an earlier right answer of the same code ruled
out (`refuted`, shared by a check's cases) is not named.
"""
from __future__ import annotations

from autograder.core import LearnerRaised
from autograder.mistakes import groups, looks_like, named


def plain(x):
    """x with tuples as lists, all the way down: what compares equal as data."""
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


def _same(a, b) -> bool:
    return plain(a) == plain(b)


class Differential:
    cls = ""  # the learner's class under test

    def __init__(self, t, *args, refuted: set | None = None):
        self.t = t
        self.refuted = set() if refuted is None else refuted
        self.log: list[str] = []
        self._methods: dict = {}
        self.mine = self._call(t.fn(self.cls), *args, what=self.cls)

    def where(self) -> str:
        """What every failure message ends with: the setting, and the last operations of the log."""
        return ""

    def show(self, arg) -> str:
        """An argument as a failure message shows it."""
        return repr(arg)

    def raised_hint(self, e: LearnerRaised) -> str:
        """What to add to the traceback of a call that raised."""
        return ""

    def fail(self, msg: str, mistake: str | list[str] | None = None, end: str = "."):
        """End the case with `msg` ("Looks like your code <mistake>." after it, when one is named), then where()."""
        self.t.fail((f"{msg} {looks_like(mistake, end)}" if mistake else msg) + self.where())

    def _call(self, fn, *args, what: str, **kwargs):
        """Learner code over there; an exception it raises fails the case with the operations before it."""
        got, raised = self.t.attempt(self.t.call_fn, fn, *args, what=what, **kwargs)
        if raised:
            self.fail(f"{what}({', '.join(map(self.show, args))}) raised:\n{raised.tb_text}{self.raised_hint(raised)}")
        return got

    def method(self, name: str):
        if name not in self._methods:
            try:
                self._methods[name] = getattr(self.mine, name)
            except LearnerRaised as e:
                self.fail(f"your {self.cls} has no working `{name}`:\n{e.tb_text}")
        return self._methods[name]

    def m(self, name: str, *args, **kwargs):
        """mine.name(*args), judged by _call."""
        return self._call(self.method(name), *args, what=f"{self.cls}.{name}", **kwargs)

    def refused(self, name: str, *args) -> LearnerRaised | None:
        """What mine.name(*args) raised, for a call that must raise (None if it returned)."""
        return self.t.attempt(self.t.call_fn, self.method(name), *args, what=f"{self.cls}.{name}")[1]

    def judge(self, got, expected, mistakes: dict) -> tuple[bool, list[str]]:
        """(right, the mistake to name: [] for none). The mistake rule over the mistakes (a value of None: not
        known here) that no earlier right answer of this code ruled out; a right answer rules out every mistake
        that would have shown in it."""
        found = groups({name: v for name, v in mistakes.items() if v is not None}, _same, expected)
        self.t.offered.update(name for names, _ in found for name in names)
        if _same(got, expected):
            self.refuted.update(name for names, _ in found for name in names)
            return True, []
        live = {name: v for names, v in found for name in names if name not in self.refuted}
        return False, named(got, groups(live, _same), _same)

    def check_value(self, got, expected, what: str, mistakes: dict, hint: str = ""):
        ok, names = self.judge(got, expected, mistakes)
        if not ok:
            self.fail(f"{what}: got {self.show(got)}, expected {self.show(expected)}."
                      + ("" if names or not hint else f" {hint}"), names)
