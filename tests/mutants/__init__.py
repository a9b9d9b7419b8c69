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
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]


def _top_level_names(tree: ast.Module) -> list[str]:
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", "") != "__future__":
            names += [(a.asname or a.name).split(".")[0] for a in node.names]
    return list(dict.fromkeys(n for n in names if not n.startswith("__")))


def snapshot(solution: str) -> str:
    """`sol`: the solution's top-level names, bound before the mutant's definitions replace them."""
    names = _top_level_names(ast.parse(solution))
    return ("\n\n# -- the mutant: `sol` is the right answer's namespace, the definitions below replace it --\n"
            "import types as _types\n\n"
            "sol = _types.SimpleNamespace(" + ", ".join(f"{n}={n}" for n in names) + ")\n")


@dataclasses.dataclass
class Mutant:
    lesson: str
    check: str
    message: str
    replaces: dict[str, Callable]
    label: str
    lines: tuple[int, ...] = ()  # where the replacing definitions start in the mutants file

    def source(self) -> str:
        """The solution file with this mutant's definitions swapped in, as one module's source."""
        solution = (ROOT / "solutions" / f"{self.lesson}.py").read_text()
        path = ROOT / "tests" / "mutants" / f"{self.lesson}.py"
        text = path.read_text()
        lines = text.splitlines(keepends=True)
        tree = ast.parse(text)
        mutant_lines = set(self.lines)
        helpers, defs = [], []
        for node in tree.body:
            decorators = getattr(node, "decorator_list", [])
            first = min([node.lineno] + [d.lineno for d in decorators])
            decorated = any(_is_mutant_decorator(d) for d in decorators)
            # Keep every decorator but @mutant (a helper kernel's @triton.jit must stay).
            kept = ["".join(lines[d.lineno - 1: d.end_lineno]) for d in decorators if not _is_mutant_decorator(d)]
            seg = "".join(kept) + "".join(lines[node.lineno - 1: node.end_lineno])
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mod = getattr(node, "module", None) or ""
                names = [a.name for a in node.names]
                if mod.startswith("solutions") or any(n.startswith("solutions") for n in names):
                    helpers.append(_solution_aliases(node))
                    continue
                if mod.startswith(("tests", "__future__")) or any(n.startswith("tests") for n in names):
                    continue
                helpers.append(seg)
            elif isinstance(node, ast.Expr) and (node is tree.body[0] or _calls_mutant(node.value)):
                continue  # the docstring, or a `mutant(...)(fn)` registration
            elif decorated:
                if any(first <= ln <= node.end_lineno for ln in mutant_lines):
                    defs.append(seg)
            elif any(first <= ln <= node.end_lineno for ln in mutant_lines):
                defs.append(seg)  # registered with mutant(...)(fn) or passed in `also`
            else:
                helpers.append(seg)
        return solution + snapshot(solution) + "\n\n".join(helpers) + "\n\n" + "\n\n".join(defs) + "\n"


MUTANTS: list[Mutant] = []


def mutant(check: str, message: str, also: dict[str, Callable] | None = None):
    """Register the decorated function (and any `also` replacements) as one mutant."""
    def deco(fn):
        lesson = fn.__module__.rsplit(".", 1)[-1]
        replaces = {fn.__name__: fn, **(also or {})}
        n = sum(m.lesson == lesson and fn.__name__ in m.replaces for m in MUTANTS)
        # A function knows its first line; a class does not (and several mutants may share a name), but
        # the module-level line executing now is its definition's. `also` entries are earlier functions.
        here = _first_line(fn) if hasattr(fn, "__code__") else sys._getframe(1).f_lineno
        lines = (here,) + tuple(_first_line(f) for f in (also or {}).values())
        MUTANTS.append(Mutant(lesson, check, message, replaces, f"{lesson}.{fn.__name__}#{n}", lines))
        return fn
    return deco


def _solution_aliases(node: ast.AST) -> str:
    """`from solutions import lNN as S` -> `S = sol`; `from solutions.lNN import f` -> `f = sol.f`."""
    out = []
    for a in node.names:
        if isinstance(node, ast.ImportFrom) and node.module == "solutions":
            out.append(f"{a.asname or a.name} = sol")
        elif isinstance(node, ast.ImportFrom):
            out.append(f"{a.asname or a.name} = sol.{a.name}")
        else:  # import solutions.lNN as S
            out.append(f"{a.asname or a.name.split('.')[0]} = sol")
    return "\n".join(out) + "\n"


def _first_line(obj) -> int:
    code = getattr(obj, "__code__", None)
    return code.co_firstlineno if code is not None else inspect.getsourcelines(obj)[1]


def _calls_mutant(e: ast.AST) -> bool:
    """`mutant(...)(fn)`: a registration written as an expression."""
    return isinstance(e, ast.Call) and isinstance(e.func, ast.Call) and getattr(e.func.func, "id", "") == "mutant"


def _is_mutant_decorator(d: ast.AST) -> bool:
    return isinstance(d, ast.Call) and getattr(d.func, "id", "") == "mutant"


def load(lesson: str) -> list[Mutant]:
    importlib.import_module(f"tests.mutants.{lesson}")
    return [m for m in MUTANTS if m.lesson == lesson]
