"""Generate exercises/ from solutions/: the solutions are the one source of truth.

Inside solutions/, every answer sits between nbgrader's own markers:

    def kv_bytes_per_token(config, dtype_bytes):
        \"\"\"Exercise 2.1: ...\"\"\"
        ### BEGIN SOLUTION
        ...
        ### END SOLUTION

The exercise keeps the signature, type hints and docstring, and the marked
block becomes a stub that raises NotImplementedError naming the exercise and
the lesson section to read (the docstring of the enclosing function, or of its
class, must say "Exercise N.M").
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from .lessons import ROOT

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_EXERCISE = re.compile(r"Exercise (\d+\.\d+)")
HEADER = ("# Lesson {num} exercises: replace each `raise NotImplementedError` with your code.\n"
          "# Check your work with `course check {num}`. (Generated from solutions/{name} by\n"
          "# `course sync`; keep the names and signatures.)\n")


class SyncError(ValueError):
    pass


def _enclosing(tree: ast.Module, line: int) -> list[ast.AST]:
    """Function/class nodes containing `line`, outermost first."""
    chain = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.lineno <= line <= node.end_lineno:
                chain.append(node)
    return sorted(chain, key=lambda n: n.lineno)


def _exercise_label(chain: list[ast.AST], path: Path, line: int) -> tuple[str, str]:
    funcs = [n for n in chain if not isinstance(n, ast.ClassDef)]
    if not funcs:
        raise SyncError(f"{path}:{line}: solution markers must sit inside a function body")
    owner = [n.name for n in chain if isinstance(n, ast.ClassDef)][-1:] + [funcs[-1].name]
    for node in reversed(chain):
        m = _EXERCISE.search(ast.get_docstring(node) or "")
        if m:
            return m.group(1), ".".join(owner)
    raise SyncError(f"{path}:{line}: the docstring of `{funcs[-1].name}` (or its class) must say "
                    "'Exercise N.M' so the stub can point to the lesson section")


def exercise_source(path: Path, num: int) -> str:
    """The exercise module generated from the solution module at `path`."""
    src = path.read_text()
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    out, i, found = [], 0, 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == BEGIN:
            indent = line[: len(line) - len(line.lstrip())]
            j = next((k for k in range(i + 1, len(lines)) if lines[k].strip() == END), None)
            if j is None:
                raise SyncError(f"{path}:{i + 1}: {BEGIN} without {END}")
            label, func = _exercise_label(_enclosing(tree, i + 1), path, i + 1)
            nb = f"lessons/{path.stem}.ipynb"
            out.append(f'{indent}raise NotImplementedError("Exercise {label} ({func}): '
                       f'see section {label} of {nb}")\n')
            found += 1
            i = j + 1
            continue
        if line.strip() == END:
            raise SyncError(f"{path}:{i + 1}: {END} without {BEGIN}")
        out.append(line)
        i += 1
    if not found:
        raise SyncError(f"{path}: no solution markers found")
    text = HEADER.format(num=f"{num:02d}", name=path.name) + "".join(out)
    ast.parse(text)  # the stubbed module must still be valid Python
    return text


def plan(root: Path = ROOT) -> dict[Path, str]:
    """Map each exercises/ file to the text it should have."""
    from .lessons import LESSONS
    result = {}
    for lesson in LESSONS:
        sol = root / "solutions" / f"{lesson.stem}.py"
        if sol.exists():
            result[root / "exercises" / sol.name] = exercise_source(sol, lesson.number)
    return result


def stale(root: Path = ROOT) -> list[Path]:
    return [p for p, text in plan(root).items() if not p.exists() or p.read_text() != text]


def write(root: Path = ROOT) -> list[Path]:
    changed = stale(root)
    for p, text in plan(root).items():
        if p in changed:
            p.write_text(text)
    return changed

