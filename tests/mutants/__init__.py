"""Plausible wrong answers, kept so that we know the checks catch them.

A mutants module per lesson (`tests/mutants/l02_kv_cache.py`) defines wrong
versions of solution functions, each decorated with the check that must catch
it and a phrase the failure message must contain:

    @mutant(check="kv_bytes_per_token", message="counts only K, not K and V")
    def kv_bytes_per_token(config, dtype_bytes):
        ...

`tests/test_mutants.py` grades the solutions with each mutant swapped in and
asserts the named check does not pass and says why.
"""
from __future__ import annotations

import dataclasses
import importlib
import types
from typing import Callable


@dataclasses.dataclass
class Mutant:
    lesson: str
    check: str
    message: str
    replaces: dict[str, Callable]
    label: str

    def module(self) -> types.ModuleType:
        """The solutions module with this mutant's definitions swapped in."""
        sol = importlib.import_module(f"solutions.{self.lesson}")
        mod = types.ModuleType(f"mutant_{self.label}")
        mod.__dict__.update(sol.__dict__)
        mod.__dict__.update(self.replaces)
        return mod


MUTANTS: list[Mutant] = []


def mutant(check: str, message: str, also: dict[str, Callable] | None = None):
    """Register the decorated function (and any `also` replacements) as one mutant."""
    def deco(fn):
        lesson = fn.__module__.rsplit(".", 1)[-1]
        replaces = {fn.__name__: fn, **(also or {})}
        n = sum(m.lesson == lesson and fn.__name__ in m.replaces for m in MUTANTS)
        MUTANTS.append(Mutant(lesson, check, message, replaces, f"{lesson}.{fn.__name__}#{n}"))
        return fn
    return deco


def load(lesson: str) -> list[Mutant]:
    importlib.import_module(f"tests.mutants.{lesson}")
    return [m for m in MUTANTS if m.lesson == lesson]
