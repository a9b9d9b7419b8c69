"""Every ready lesson's notebook runs headless within its time budget, untouched and solved.

Untouched (the learner's stubs, which raise NotImplementedError) and solved (COURSE_IMPL=solutions), a
notebook must run end to end with no error output, draw no empty figure (a cell whose exercise is missing
says which one to write and draws nothing) and leave no matplotlib figure open. The lessons with Triton
kernels also run where `import triton` fails: their Triton cells say Triton is not available.
"""

import json
import os
import re
from urllib.parse import unquote

import nbformat
import pytest

from autograder import lessons
from autograder.core import load_checks, registered

nbclient = pytest.importorskip("nbclient")

READY = lessons.available()
CELL_BUDGET_S = 120  # no single cell may take longer than this on a 2-core CPU
TRITON_LESSONS = tuple(lesson.stem for lesson in lessons.LESSONS if lesson.triton)
PROBE_MARK = "course-notebook-probe:"

# The first cell the tests add: it watches matplotlib from IPython. It wraps the display formatters of
# matplotlib figures (which `%matplotlib inline` installs, and the probe wraps again before every cell), so
# it sees every figure drawn into the notebook, by plt.show() in a cell or by the inline backend's flush after
# it, and records the empty ones. Its post_execute callback is registered before the notebook's
# `%matplotlib inline` registers that flush, so it also sees the figures a cell leaves open, before they are
# shown. pre_run_cell records a figure still open when the next cell starts (one no backend showed and
# closed). The probe closes nothing.
PROBE_FIRST = r'''
def _probe_install(ip):
    import sys

    state = {"cell": "", "empty": [], "left_open": [], "seen_open": set(), "figures_seen": 0, "judged": set()}

    def figures():
        if "matplotlib.pyplot" not in sys.modules:
            return []
        from matplotlib._pylab_helpers import Gcf
        return [(m.num, m.canvas.figure) for m in Gcf.get_all_fig_managers()]

    def drawn(ax):
        return bool(ax.has_data() or ax.images or ax.texts or ax.tables or ax.artists)

    def blank(fig):
        """Nothing drawn at all, or a panel with its frame showing and nothing in it."""
        axes = fig.get_axes()
        if not any(drawn(ax) for ax in axes) and not fig.images and not fig.texts:
            return "nothing drawn"
        empty = [ax for ax in axes if ax.get_visible() and ax.axison and not drawn(ax)]
        return f"{len(empty)} of {len(axes)} axes empty" if empty else None

    def judge(fig):
        if id(fig) in state["judged"]:
            return
        state["judged"].add(id(fig))
        state["figures_seen"] += 1
        why = blank(fig)
        if why:
            state["empty"].append({"figure": getattr(fig, "number", None), "cell": state["cell"], "why": why})

    def wrap_formatters():
        if "matplotlib.figure" not in sys.modules:
            return
        from matplotlib.figure import Figure
        for formatter in ip.display_formatter.formatters.values():
            try:
                show = formatter.lookup_by_type(Figure)
            except KeyError:
                continue
            if getattr(show, "_probe", False):
                continue

            def judged(fig, *args, _show=show, **kwargs):
                judge(fig)
                return _show(fig, *args, **kwargs)
            judged._probe = True
            formatter.for_type(Figure, judged)

    def before(info):
        for num, _ in figures():
            if num not in state["seen_open"]:
                state["seen_open"].add(num)
                state["left_open"].append({"figure": num, "left by": state["cell"]})
        state["cell"], state["judged"] = info.raw_cell or "", set()
        wrap_formatters()

    def after():
        for _, fig in figures():
            judge(fig)
        wrap_formatters()  # for the flush that follows, when this cell ran `%matplotlib inline`

    ip.events.register("pre_run_cell", before)
    ip.events.register("post_execute", after)
    return state


_probe_state = _probe_install(get_ipython())
del _probe_install
'''

PROBE_LAST = r'''
import json as _probe_json
import sys as _probe_sys

_probe_state["open_now"] = (_probe_sys.modules["matplotlib.pyplot"].get_fignums()
                            if "matplotlib.pyplot" in _probe_sys.modules else [])
print("%s" + _probe_json.dumps({k: v for k, v in _probe_state.items() if k not in ("seen_open", "judged")}))
''' % PROBE_MARK

BLOCK_TRITON = 'raise ImportError("No module named \'triton\' (blocked for this test)")\n'


def _texts(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            out.append(o.get("data", {}).get("text/plain", ""))
        elif o.output_type == "error":
            out.append(f"{o.ename}: {o.evalue}")
    return "".join(out)


def _check_status(cell) -> str | None:
    """The status the check cell's table reports for its check (None when there is no row for it)."""
    name = cell.metadata["course"]["check"]
    m = re.search(rf"^{re.escape(name)}\s+\S+\s+(.+?)(?:\s{{2,}}|$)", _texts(cell), re.M)
    return m.group(1).strip() if m else None


def execute(lesson, monkeypatch, tmp_path, impl: str | None, block_triton: bool = False):
    """Run the lesson's notebook with the probe cells added; returns (executed cells of the notebook, probe)."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    if impl:
        monkeypatch.setenv("COURSE_IMPL", impl)
    else:
        monkeypatch.delenv("COURSE_IMPL", raising=False)
    if block_triton:
        fake = tmp_path / "no_triton"
        (fake / "triton").mkdir(parents=True)
        (fake / "triton" / "__init__.py").write_text(BLOCK_TRITON)
        monkeypatch.setenv("PYTHONPATH", str(fake), prepend=os.pathsep)  # first, before whatever is there
    nb = nbformat.read(lesson.notebook, as_version=4)
    nb.cells = [nbformat.v4.new_code_cell(PROBE_FIRST), *nb.cells, nbformat.v4.new_code_cell(PROBE_LAST)]
    client = nbclient.NotebookClient(nb, timeout=CELL_BUDGET_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(lessons.ROOT / "lessons")}})
    client.execute()
    last = _texts(nb.cells[-1])
    probe = json.loads(last.split(PROBE_MARK, 1)[1]) if PROBE_MARK in last else None
    return nb.cells[1:-1], probe


def _cell_index(cells, source: str) -> str:
    """The notebook's cell index of an executed source, for messages."""
    found = [i for i, c in enumerate(cells) if c.cell_type == "code" and c.source == source]
    return f"cell {found[0]}" if found else f"cell {source[:60]!r}"


def assert_ran_clean(cells, probe):
    errors = [f"cell {i}: {o.ename}: {o.evalue}" for i, c in enumerate(cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    assert not errors, "error output:\n" + "\n".join(errors)
    assert probe is not None, "the probe's last cell did not run"
    empty = [f"{_cell_index(cells, e['cell'])}: figure {e['figure']}, {e['why']}" for e in probe["empty"]]
    assert not empty, "empty figures drawn:\n" + "\n".join(empty)
    left = [f"{_cell_index(cells, e['left by'])}: figure {e['figure']}" for e in probe["left_open"]]
    assert not left and not probe["open_now"], f"figures left open: {left}; open at the end: {probe['open_now']}"


def check_cells(cells):
    return [c for c in cells if c.metadata.get("course", {}).get("role") == "check"]


def check_statuses(cells, allowed: tuple[str, ...]) -> dict[str, str | None]:
    """Each check cell's status; asserts it is one of `allowed`, showing the tables of those that are not."""
    statuses = {c.metadata["course"]["check"]: _check_status(c) for c in check_cells(cells)}
    bad = [_texts(c) for c in check_cells(cells) if statuses[c.metadata["course"]["check"]] not in allowed]
    assert statuses and not bad, f"check cells not {' or '.join(allowed)}:\n" + "\n".join(bad)
    return statuses


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


def skipped_lines(cells) -> list[str]:
    """What the cells printed where after_exercises() skipped the rest of a cell."""
    return [line for c in cells if c.cell_type == "code" and not c.metadata.get("course")
            for line in _texts(c).splitlines() if line.startswith("(skipped: ")]


@pytest.mark.parametrize("lesson", READY, ids=lambda lesson: lesson.stem)
def test_notebook_executes_against_solutions(lesson, monkeypatch, tmp_path):
    cells, probe = execute(lesson, monkeypatch, tmp_path, "solutions")
    assert_ran_clean(cells, probe)
    # The inline checks ran, and against the solutions they pass.
    statuses = check_statuses(cells, ("passed", "not graded here"))
    assert "passed" in statuses.values()
    assert not skipped_lines(cells), "a cell skipped against the solutions"
    if any("plt." in c.source for c in cells if c.cell_type == "code"):
        assert probe["figures_seen"], "the probe saw no figure of a lesson that plots: it would miss empty ones"


@pytest.mark.parametrize("lesson", READY, ids=lambda lesson: lesson.stem)
def test_notebook_executes_untouched(lesson, monkeypatch, tmp_path):
    """The learner's first Run All: every stub still raises NotImplementedError, and every cell that needs one
    says which exercise to write first. A lesson without Triton kernels runs here where `import triton` fails
    (macOS, native Windows): with the solved run, every notebook runs both with and without Triton (the Triton
    lessons in both states each way: test_triton_notebook_executes_without_triton)."""
    cells, probe = execute(lesson, monkeypatch, tmp_path, None, block_triton=lesson.stem not in TRITON_LESSONS)
    assert_ran_clean(cells, probe)
    check_statuses(cells, ("not started",))
    skipped = skipped_lines(cells)
    assert skipped, "no cell uses an exercise?"
    unnamed = [line for line in skipped if line.startswith("(skipped: this cell uses code that is not written yet")]
    assert not unnamed, f"skipped without naming the exercise: {unnamed}"


@pytest.mark.parametrize("impl", [None, "solutions"], ids=["untouched", "solved"])
@pytest.mark.parametrize("stem", TRITON_LESSONS)
def test_triton_notebook_executes_without_triton(stem, impl, monkeypatch, tmp_path):
    """Where `import triton` fails (macOS, native Windows): the Triton cells say so, none raises."""
    lesson = next(lesson for lesson in READY if lesson.stem == stem)
    cells, probe = execute(lesson, monkeypatch, tmp_path, impl, block_triton=True)
    assert_ran_clean(cells, probe)
    text = "\n".join(_texts(c) for c in cells)
    assert "Triton is not available" in text
    statuses = check_statuses(cells, ("passed", "not graded here") if impl else ("not started", "not graded here"))
    assert "not graded here" in statuses.values()
    if impl:  # solved: a cell skips only where it launches a Triton kernel
        assert all("Triton is not available" in line for line in skipped_lines(cells)), skipped_lines(cells)


MD_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target)


def _links(source: str) -> list[str]:
    """The targets of the Markdown links in a cell's text (not in its code spans and blocks)."""
    text = re.sub(r"```.*?```", "", source, flags=re.S)
    return MD_LINK.findall(re.sub(r"`[^`]*`", "", text))


@pytest.mark.parametrize("lesson", READY, ids=lambda lesson: lesson.stem)
def test_notebook_links_to_its_exercise_file(lesson):
    """The top cell and the text of every exercise link to the file the learner writes, relative to lessons/."""
    nb = nbformat.read(lesson.notebook, as_version=4)
    target = f"../exercises/{lesson.stem}.py"
    assert target in _links(nb.cells[0].source), "the top cell links to the exercise file"
    for i, cell in enumerate(nb.cells):
        if cell.metadata.get("course", {}).get("role") == "exercise":
            text = next(c for c in reversed(nb.cells[:i]) if c.cell_type == "markdown")
            assert target in _links(text.source), f"the text before exercise cell {i} links to {target}"


@pytest.mark.parametrize("lesson", READY, ids=lambda lesson: lesson.stem)
def test_notebook_relative_links_resolve(lesson):
    nb = nbformat.read(lesson.notebook, as_version=4)
    broken = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for target in _links(cell.source):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor in this notebook
            path = lesson.notebook.parent / unquote(target.split("#", 1)[0])
            if not path.is_file():
                broken.append(f"cell {i}: {target}")
    assert not broken, broken


def test_links_are_found():
    """The link pattern the two tests above rely on."""
    assert _links("see [a](../exercises/x.py) and ![b](img.png \"t\"), [c](https://e.org)") == \
        ["../exercises/x.py", "img.png", "https://e.org"]
    assert _links("`L[0](x)` and\n```\nf[1](y)\n```\n[a] (b)") == []


def test_after_exercises_skips_a_stub_and_its_figure(capsys):
    plt = pytest.importorskip("matplotlib.pyplot")
    from autograder.notebook import after_exercises

    before = plt.figure()
    try:
        with after_exercises():
            plt.subplots()
            raise NotImplementedError("Exercise 4.2 (paged_decode_kernel): see section 4.2 of lessons/l04.ipynb")
        out = capsys.readouterr().out
        assert out.startswith("(skipped: write Exercise 4.2 (paged_decode_kernel) first, then rerun this cell")
        assert "see section 4.2" in out
        assert plt.get_fignums() == [before.number], "the figure opened inside is closed, the one before is not"
    finally:
        plt.close("all")


def test_after_exercises_names_the_exercise_file(capsys):
    from autograder.notebook import after_exercises
    from exercises import l01_roofline

    with after_exercises():
        l01_roofline.ridge_point({"dense_tflops": 1, "hbm_gb_per_s": 1})
    out = capsys.readouterr().out
    assert out.startswith("(skipped: write Exercise 2.1 (ridge_point) first, in exercises/l01_roofline.py, ")


def test_after_exercises_lets_other_errors_through(capsys):
    from autograder.notebook import after_exercises

    with pytest.raises(KeyError):
        with after_exercises():
            try:
                raise NotImplementedError("Exercise 1.1 (x)")
            except NotImplementedError:
                raise KeyError("a bug of its own") from None
    with pytest.raises(ValueError):
        with after_exercises():
            raise ValueError("not a stub")
    with after_exercises():
        try:
            raise NotImplementedError("Exercise 1.1 (x)")
        except NotImplementedError as e:
            raise RuntimeError("wrapped") from e
    assert capsys.readouterr().out.startswith("(skipped: write Exercise 1.1 (x) first")


def test_after_exercises_says_triton_is_missing(capsys):
    from autograder.notebook import after_exercises, skip, written
    from reference_engine.kernels.triton_compat import TritonUnavailable

    with after_exercises():
        raise TritonUnavailable("the Triton kernel k needs Triton. Triton is not available on this platform (...)")
    assert capsys.readouterr().out.startswith("(skipped: the Triton kernel k needs Triton. Triton is not available")
    with after_exercises():
        skip("rerun section 4 first")
    assert capsys.readouterr().out == "(skipped: rerun section 4 first)\n"

    def stub():
        raise NotImplementedError("Exercise 1.1 (x)")
    assert written(lambda: 1) and not written(stub)


def test_probe_sees_empty_and_open_figures(monkeypatch, tmp_path):
    """The probe the notebook runs rely on: an empty figure shown by plt.show(), one left to the inline
    backend's flush, and one left open where no backend shows it."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in [
        "%matplotlib inline\nimport matplotlib.pyplot as plt",
        "fig, ax = plt.subplots()\nplt.show()",                                       # empty, shown
        "fig, (a, b) = plt.subplots(1, 2)\na.plot([1, 2])",                           # one empty panel, flushed
        "fig, ax = plt.subplots()\nax.plot([1, 2])\nplt.show()",                      # fine
        "import matplotlib\nmatplotlib.use('Agg')\nfig, ax = plt.subplots()\nax.plot([1])",  # left open
        "print('next')"]])
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    fake = type("Lesson", (), {"stem": "probe", "notebook": path})()
    cells, probe = execute(fake, monkeypatch, tmp_path, None)
    assert [(e["cell"].splitlines()[0], e["why"]) for e in probe["empty"]] == \
        [("fig, ax = plt.subplots()", "nothing drawn"), ("fig, (a, b) = plt.subplots(1, 2)", "1 of 2 axes empty")]
    assert probe["figures_seen"] == 5  # the four figures, and the open one again after the last cell
    assert [e["left by"].splitlines()[0] for e in probe["left_open"]] == ["import matplotlib"]
    with pytest.raises(AssertionError, match="empty figures drawn"):
        assert_ran_clean(cells, probe)
