"""exercises/ is generated from solutions/ and must not drift from it."""
import ast
import textwrap

import pytest

from autograder import sync
from autograder.lessons import ROOT


def test_exercises_are_up_to_date():
    stale = sync.stale()
    assert not stale, f"exercises/ out of date ({[p.name for p in stale]}): run `course sync`"


def _api(tree: ast.Module):
    """The module's functions, classes and their methods: what a learner's stub must keep. Functions nested
    inside a function are the solution's own helpers (inside its solution block), not part of the API."""
    out = []
    for node in tree.body:
        out.append(node)
        if isinstance(node, ast.ClassDef):
            out += node.body
    return [n for n in out if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def test_every_solution_has_stubs_and_keeps_signatures():
    for path, text in sync.plan().items():
        sol = ast.parse((ROOT / "solutions" / path.name).read_text())
        ex = ast.parse(text)
        assert "### BEGIN SOLUTION" not in text and "NotImplementedError" in text, path.name
        sigs = lambda tree: {n.name: ast.unparse(n.args) for n in _api(tree)  # noqa: E731
                             if not isinstance(n, ast.ClassDef)}
        assert sigs(sol) == sigs(ex), f"{path.name}: signatures differ from the solution"
        docs = lambda tree: {n.name: ast.get_docstring(n) for n in _api(tree)}  # noqa: E731
        assert docs(sol) == docs(ex), f"{path.name}: docstrings differ from the solution"


def _write(tmp_path, src):
    p = tmp_path / "l99_demo.py"
    p.write_text(textwrap.dedent(src))
    return p


def test_stub_names_exercise_and_section(tmp_path):
    p = _write(tmp_path, '''
        def f(x: int) -> int:
            """Exercise 9.2: double x."""
            y = 1
            ### BEGIN SOLUTION
            return 2 * x
            ### END SOLUTION

        class C:
            """Exercise 9.3: a counter."""
            def inc(self):
                ### BEGIN SOLUTION
                self.n += 1
                ### END SOLUTION
        ''')
    text = sync.exercise_source(p, 99)
    assert 'raise NotImplementedError("Exercise 9.2 (f): see section 9.2 of lessons/l99_demo.ipynb")' in text
    assert "    y = 1\n" in text and "return 2 * x" not in text
    assert '        raise NotImplementedError("Exercise 9.3 (C.inc)' in text


@pytest.mark.parametrize("src,phrase", [
    ('def f():\n    """no label"""\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n', "Exercise N.M"),
    ('def f():\n    """Exercise 1.1"""\n    ### BEGIN SOLUTION\n    return 1\n', "without"),
    ('X = 1\n', "no solution markers"),
])
def test_malformed_solutions_are_refused(tmp_path, src, phrase):
    with pytest.raises(sync.SyncError, match=phrase):
        sync.exercise_source(_write(tmp_path, src), 99)
