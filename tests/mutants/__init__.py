"""Plausible wrong answers, kept so that we know the checks catch them.

A mutants module per lesson (`tests/mutants/l02_kv_cache.py`) defines wrong
versions of solution functions, each decorated with the check that must catch
it and a phrase the failure message must contain:

    @mutant(check="kv_bytes_per_token", message="counts only K, not K and V")
    def kv_bytes_per_token(config, dtype_bytes):
        ...

`tests/test_mutants.py` grades the solutions with each mutant swapped in and
asserts the named check does not pass and says why.

The grader runs learner code from a source file in a process that cannot import
`solutions`, so a mutant is graded as source too (`Mutant.source()`): the solution
file, then `sol` bound to a snapshot of its namespace (mutants may call the right
version as `sol.name`), then the mutants file's helpers and the mutant's own
definitions, which replace the solution's.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ("\n\n# -- the mutant: `sol` is the right answer's namespace, the definitions below replace it --\n"
            "import types as _types\n"
            "sol = _types.SimpleNamespace(**{_k: _v for _k, _v in list(globals().items()) "
            "if not _k.startswith('__')})\n")


@dataclasses.dataclass
class Mutant:
    lesson: str
    check: str
    message: str
    replaces: dict[str, Callable]
    label: str

    def source(self) -> str:
        """The solution file with this mutant's definitions swapped in, as one module's source."""
        solution = (ROOT / "solutions" / f"{self.lesson}.py").read_text()
        path = ROOT / "tests" / "mutants" / f"{self.lesson}.py"
        text = path.read_text()
        lines = text.splitlines(keepends=True)
        tree = ast.parse(text)
        mutant_lines = {inspect.getsourcelines(fn)[1] for fn in self.replaces.values()}
        helpers, defs = [], []
        for node in tree.body:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            decorated = any(_is_mutant_decorator(d) for d in getattr(node, "decorator_list", []))
            body_start = node.lineno
            seg = "".join(lines[body_start - 1: node.end_lineno])
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mod = getattr(node, "module", None) or ""
                names = [a.name for a in node.names]
                if mod.startswith(("solutions", "tests", "__future__")) or any(
                        n.startswith(("solutions", "tests")) for n in names):
                    continue
                helpers.append(seg)
            elif isinstance(node, ast.Expr) and node is tree.body[0]:
                continue  # the docstring
            elif decorated:
                if first in mutant_lines or any(first <= ln <= node.end_lineno for ln in mutant_lines):
                    defs.append(seg)
            else:
                helpers.append(seg)
        return solution + SNAPSHOT + "\n\n".join(helpers) + "\n\n" + "\n\n".join(defs) + "\n"


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


def _is_mutant_decorator(d: ast.AST) -> bool:
    return isinstance(d, ast.Call) and getattr(d.func, "id", "") == "mutant"


def load(lesson: str) -> list[Mutant]:
    importlib.import_module(f"tests.mutants.{lesson}")
    return [m for m in MUTANTS if m.lesson == lesson]
