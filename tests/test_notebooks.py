"""Every ready lesson's notebook runs headless against the solutions, within its time budget."""

import nbformat
import pytest

from autograder import lessons
from autograder.core import registered
from autograder.runner import load_checks

nbclient = pytest.importorskip("nbclient")

READY = lessons.available()
CELL_BUDGET_S = 120  # no single cell may take longer than this on a 2-core CPU


@pytest.mark.parametrize("lesson", READY, ids=lambda lesson: lesson.stem)
def test_notebook_is_committed_clean_and_complete(lesson):
    nb = nbformat.read(lesson.notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit without outputs"
    roles = [c.metadata.get("course", {}).get("role") for c in nb.cells]
    assert roles.count("setup") == 1
    load_checks(lesson.stem)
    checks = {c.metadata["course"]["check"] for c in nb.cells if c.metadata.get("course", {}).get("role") == "check"}
    assert checks == {s.name for s in registered(lesson.stem)}, "every check has a check cell"
    assert nb.cells[0].cell_type == "markdown" and "interview" in nb.cells[0].source.lower()


@pytest.mark.parametrize("lesson", READY, ids=lambda lesson: lesson.stem)
def test_notebook_executes_against_solutions(lesson, monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_IMPL", "solutions")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(lesson.notebook, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_BUDGET_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(lessons.ROOT / "lessons")}})
    client.execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    # The inline checks ran, and against the solutions they pass.
    assert "passed" in text and "not started" not in text and "FAIL" not in text
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
