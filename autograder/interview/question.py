"""What one interview question is: a number to give (with its unit and tolerance) or an open answer.

A template turns a seeded `random.Random` and the lesson's reference module into one fresh question;
every number in it (the answer, the steps of the worked answer, the follow-ups' answers and the
values the usual mistakes give) comes from calls into that module, made when the question is built.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

from ..mistakes import groups, named


@dataclass
class Numeric:
    """A question answered by one number.

    prompt: the question, with every input it needs; unit: the unit the answer is asked in ("GB",
    "ms", "%"...; "" for a plain count); answer: the reference value, in that unit; rtol: the
    relative tolerance (0: exact); steps: the worked answer, one line per step; why: the one-line
    intuition an interviewer wants to hear; mistakes: {what the mistake is: the value it gives};
    follow_ups: questions asked after this one's answer, each changing one condition.
    Mistakes that this instance cannot tell from the answer (within rtol) are dropped.
    """
    prompt: str
    unit: str
    answer: float
    steps: list[str]
    why: str
    rtol: float = 0.02
    mistakes: dict[str, float] = field(default_factory=dict)
    follow_ups: list[Numeric] = field(default_factory=list)

    def __post_init__(self):
        self.prompt = self.prompt[:1].upper() + self.prompt[1:]
        if not math.isfinite(self.answer):
            raise ValueError(f"answer must be finite, got {self.answer!r} for: {self.prompt}")
        self.mistakes = {k: float(v) for k, v in self.mistakes.items()
                         if v is not None and math.isfinite(v) and not self.grade(v)}

    def grade(self, value: float) -> bool:
        """True when value is within the stated tolerance of the answer."""
        return abs(value - self.answer) <= self.rtol * abs(self.answer)

    def tolerance(self) -> str:
        return "exact" if self.rtol == 0 else f"within {self.rtol * 100:g}%"

    def mistake(self, value: float) -> str | None:
        """The mistake this wrong value gives away, by the checks' rule (autograder/mistakes.py: it matches that
        mistake's value within the same tolerance, and no other's), those with the same value joined by "or";
        None if none."""
        same = lambda x, v: abs(x - v) <= max(self.rtol, 1e-9) * abs(v)
        return " or ".join(named(value, groups(self.mistakes, same), same)) or None


@dataclass
class Open:
    """A question answered in words: the learner types an answer, then marks which rubric points it
    covered. Nothing grades the text; the marks are the learner's own and reported as such."""
    prompt: str
    rubric: list[str]
    why: str


@dataclass(frozen=True)
class Template:
    """One kind of question of one lesson; build(rng, ref) makes a fresh instance."""
    stem: str
    name: str
    build: Callable[[random.Random, ModuleType], Numeric | Open]

    @property
    def key(self) -> str:
        return f"{self.stem}:{self.name}"


REGISTRY: dict[str, list[Template]] = {}


def template(stem: str, name: str):
    """Decorator: register build(rng, ref) as a template of lesson `stem`."""
    def register(build):
        REGISTRY.setdefault(stem, []).append(Template(stem, name, build))
        return build
    return register


def fmt(x: float, digits: int = 4) -> str:
    """A number for a sentence: integers with thousands separators, others to `digits` significant digits."""
    if isinstance(x, int) or (float(x).is_integer() and abs(x) < 1e15):
        return f"{int(x):,}"
    if x != 0 and (abs(x) >= 1e7 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    if abs(x) >= 10**digits:
        return f"{x:,.0f}"
    return f"{x:,.{digits}g}"
