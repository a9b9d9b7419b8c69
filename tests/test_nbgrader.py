"""The classroom flow of README's "Teaching with it (nbgrader)", run with nbgrader's own commands in a temporary
directory: build, generate_assignment, release_assignment, (students) fetch_assignment and submit, collect,
autograde, generate_feedback, release_feedback / fetch_feedback, export, then a second autograde (skipped
without --force), a forced re-grade, and autograde without the sandbox (refused, then opted in).

Among the submissions, some hold code that would attack the instructor if anything ran it (nbgrader's kernel did):
none of it runs, in an answer cell (graded in the sandbox, where the source scan rejects it) or in any other cell
(never graded). A wrong answer's feedback names its failed hidden cases but shows none of their expected values."""
import csv
import dataclasses
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("nbgrader")

from autograder import compare as cmp  # noqa: E402
from autograder import core, oslimits, report  # noqa: E402
from autograder.core import load_checks  # noqa: E402
from autograder.nbgrader_build import build  # noqa: E402
from autograder.nbgrader_grade import seed_for, submission_source  # noqa: E402
from autograder.runner import Target, grade_lesson  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEM = "l01_roofline"
COURSE_ID = "llm-inference"
CHEATS = {
    "imports_solutions": "from solutions.l01_roofline import *\n",
    "redefines_grade_cell": "def grade_cell(*args, **kwargs):\n    return 99.0\n",
    "patches_the_grader": ("import autograder.core\n"
                           "autograder.core.Trial.expect = lambda *a, **k: None\n"),
}
# Code that attacks the instructor when run in nbgrader's kernel: in the first answer cell, or in cells that are not
# answer cells (a lesson code cell rewritten and a cell the student added). Named to be graded last (autograde goes
# by student id): a gradebook they zeroed would stay so.
ATTACKS = {"x_attacks_in_an_answer": "answer", "x_attacks_in_other_cells": "other cells"}
WRONG = "wrong"  # every exercise solved, but matmul_cost right on its visible cases only (a multiply-add as one FLOP)
THROUGH_EXCHANGE = ["solved", "untouched"]  # fetch_assignment and submit, then collect
HANDED_IN = [*CHEATS, *ATTACKS, WRONG]  # handed in another way: put into submitted/ by hand
STUDENTS = [*THROUGH_EXCHANGE, *HANDED_IN]
# A detached process: sleeps 60 s, then (after autograde) zeroes every grade in the gradebook.
SLEEPER = ("import sqlite3, sys, time; time.sleep(60); db = sqlite3.connect(sys.argv[1]); "
           "db.execute('UPDATE grade SET auto_score = 0'); db.commit()")


def _attack(token: str, outside: Path, course: Path) -> str:
    """Code that, wherever it runs, leaves `outside`/TOKEN.marker, prints the solutions (into the feedback), zeroes
    every grade in gradebook.db, and starts a detached process (double fork, setsid) with TOKEN in its command line
    that writes its pid to `outside` and to the temporary directory, sleeps 60 s and zeroes the grades again."""
    db, sleeper = str(course / "gradebook.db"), [SLEEPER, str(course / "gradebook.db"), token]
    return textwrap.dedent(f"""\
        import os, sqlite3, sys, tempfile
        open({str(outside / (token + ".marker"))!r}, "w").write("ran")
        print(open({str(ROOT / "solutions" / f"{STEM}.py")!r}).read())
        db = sqlite3.connect({db!r})
        db.execute("UPDATE grade SET auto_score = 0")
        db.commit()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                for folder in ({str(outside)!r}, tempfile.gettempdir()):
                    open(os.path.join(folder, {token + ".pid"!r}), "w").write(str(os.getpid()))
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execv(sys.executable, [sys.executable, "-c", *{sleeper!r}])
            os._exit(0)
        os.wait()
        """)


def _alive(token: str) -> list[int]:
    """The processes whose command line holds `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int(entry.name) != os.getpid() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _text(path: Path) -> str:
    """An HTML file's text, as a reader sees it: tags left out, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


class Flow:
    """Every nbgrader command run, in order, with its output and duration."""

    def __init__(self, base: Path):
        self.base = base
        self.course, self.exchange = base / "course", base / "exchange"
        self.runs: list[tuple[str, subprocess.CompletedProcess, float]] = []

    def nbgrader(self, cwd: Path, *args: str, env: dict | None = None, ok: bool = True) -> subprocess.CompletedProcess:
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, capture_output=True, text=True,
                           timeout=1200, env=env)
        self.runs.append((args[0], r, time.monotonic() - start))
        assert (r.returncode == 0) == ok, " ".join(args) + "\n" + r.stdout[-3000:] + r.stderr[-3000:]
        return r

    def student(self, name: str, *args: str) -> subprocess.CompletedProcess:
        """A student's nbgrader command, run in their own folder (no course config there)."""
        home = self.base / "homes" / name
        home.mkdir(parents=True, exist_ok=True)
        return self.nbgrader(home, *args, f"--course={COURSE_ID}", f"--Exchange.root={self.exchange}",
                             f"--Exchange.cache={home / '.nbgrader_cache'}")

    def output(self, command: str) -> list[str]:
        return [r.stdout + r.stderr for name, r, _ in self.runs if name == command]


def _fill(nb, answers: dict[str, str] | None = None, first: str | None = None, other: str | None = None):
    """The notebook with solution cells replaced: by grade_id from `answers`, or only the first by `first`; with
    `other`, the first code cell that is not an nbgrader cell replaced by it and a cell of it added after it."""
    out = nbformat.from_dict(nb)
    solution_cells = [c for c in out.cells if c.metadata.get("nbgrader", {}).get("solution")]
    for cell in solution_cells:
        if answers is not None:
            cell.source = answers[cell.metadata["nbgrader"]["grade_id"]]
    if first is not None:
        solution_cells[0].source = first
    if other is not None:
        i = next(i for i, c in enumerate(out.cells) if c.cell_type == "code" and "nbgrader" not in c.metadata)
        out.cells[i].source = other
        out.cells.insert(i + 1, nbformat.v4.new_code_cell(other))
    return out


def _solutions_lines() -> list[str]:
    """Lines of solutions/<stem>.py that are in neither the exercise file nor the release: the answers."""
    given = (ROOT / "exercises" / f"{STEM}.py").read_text()
    return [line.strip() for line in (ROOT / "solutions" / f"{STEM}.py").read_text().splitlines()
            if len(line.strip()) > 24 and line.strip() not in given]


def _scores(course: Path) -> dict:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        out = {}
        for s in STUDENTS:
            sub = gb.find_submission(STEM, s)
            out[s] = (sub.score, sub.max_score)
            out[s + "/cells"] = sorted((g.name, g.score) for nb in sub.notebooks for g in nb.grades)
        return out


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    f = Flow(tmp_path_factory.mktemp("classroom"))
    course = f.course
    build(course, [STEM])
    f.exchange.mkdir()
    f.outside = f.base / "outside"  # where an attack that ran would leave its traces
    f.outside.mkdir()
    config = course / "nbgrader_config.py"  # the exchange: here a temporary folder, not /srv/nbgrader/exchange
    config.write_text(config.read_text().replace('# c.Exchange.root = "/srv/nbgrader/exchange"',
                                                 f'c.Exchange.root = "{f.exchange}"'))
    sandboxed = config.read_text()
    opted_in = sandboxed.replace("# c.TrustedGrades.allow_unsandboxed = True", "c.TrustedGrades.allow_unsandboxed = True")
    assert opted_in != sandboxed
    if not oslimits.active():  # no Landlock here (macOS, an old kernel): the flow runs as an instructor opted in
        config.write_text(opted_in)
    f.nbgrader(course, "generate_assignment", STEM)
    f.nbgrader(course, "release_assignment", STEM)
    source = nbformat.read(course / "source" / STEM / f"{STEM}.ipynb", as_version=4)
    release = nbformat.read(course / "release" / STEM / f"{STEM}.ipynb", as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    fetched = {}
    for student in THROUGH_EXCHANGE:
        f.student(student, "fetch_assignment", STEM)
        path = f.base / "homes" / student / STEM / f"{STEM}.ipynb"
        fetched[student] = nbformat.read(path, as_version=4)
        if student == "solved":  # a student who solved every exercise: each solution cell filled in
            nbformat.write(_fill(fetched[student], answers), path)
        f.student(student, "submit", STEM, f"--student={student}")  # every student here is this test's user
    handed_in = {student: _fill(release, first=code) for student, code in CHEATS.items()}  # in an answer cell
    f.tokens = {student: f"course-attack-{os.getpid()}-{student}" for student in ATTACKS}
    for student, where in ATTACKS.items():
        code = _attack(f.tokens[student], f.outside, course)
        handed_in[student] = _fill(release, first=code) if where == "answer" else _fill(release, other=code)
    wrong = dict(answers, exercise_matmul_cost=answers["exercise_matmul_cost"].replace(
        '"flops": 2 * m * n * k', '"flops": (2 if m in (1, 2000) else 1) * m * n * k'))
    assert wrong != answers
    handed_in[WRONG] = _fill(release, wrong)
    for student, nb in handed_in.items():
        path = course / "submitted" / student / STEM / f"{STEM}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    f.handed_in = handed_in
    f.nbgrader(course, "collect", STEM, "--ExchangeCollect.check_owner=False")
    f.nbgrader(course, "autograde", STEM)
    f.autograded_at = time.monotonic()
    f.alive = {"after autograde": {s: _alive(token) for s, token in f.tokens.items()}}
    f.first_scores = _scores(course)
    f.nbgrader(course, "generate_feedback", STEM)
    f.alive["after generate_feedback"] = {s: _alive(token) for s, token in f.tokens.items()}
    f.nbgrader(course, "release_feedback", STEM, f"--CourseDirectory.student_id_exclude={','.join(HANDED_IN)}")
    f.student("solved", "fetch_feedback", STEM, "--student=solved")
    f.nbgrader(course, "export")
    time.sleep(max(0.0, 65 - (time.monotonic() - f.autograded_at)))  # a process autograde started has woken by now
    f.alive["65 s after autograde"] = {s: _alive(token) for s, token in f.tokens.items()}
    f.woken_scores = _scores(course)
    graded = {s: course / "autograded" / s / STEM / f"{STEM}.ipynb" for s in STUDENTS}
    f.graded_mtimes = {s: p.stat().st_mtime_ns for s, p in graded.items()}
    f.nbgrader(course, "autograde", STEM)  # again, without --force: skips every submission
    f.skipped_mtimes = {s: p.stat().st_mtime_ns for s, p in graded.items()}
    f.nbgrader(course, "autograde", STEM, "--force")  # the re-grade
    f.forced_mtimes = {s: p.stat().st_mtime_ns for s, p in graded.items()}
    f.second_scores = _scores(course)
    # Without the sandbox (COURSE_SANDBOX=off): refused, unless the config opts in.
    unsandboxed = {**os.environ, "COURSE_SANDBOX": "off"}
    config.write_text(sandboxed)
    f.refused = f.nbgrader(course, "autograde", STEM, "--student=untouched", "--force", env=unsandboxed, ok=False)
    config.write_text(opted_in)
    f.nbgrader(course, "autograde", STEM, "--student=untouched", "--force", env=unsandboxed)
    f.unsandboxed = nbformat.read(course / "autograded" / "untouched" / STEM / f"{STEM}.ipynb", as_version=4)
    config.write_text(sandboxed if oslimits.active() else opted_in)
    f.alive["at the end"] = {s: _alive(token) for s, token in f.tokens.items()}
    f.release, f.fetched = release, fetched
    yield f
    durations = ", ".join(f"{name} {seconds:.1f}s" for name, _, seconds in f.runs)
    print(f"\nnbgrader commands: {durations}")
    shutil.rmtree(f.base, ignore_errors=True)


def test_no_command_warns_about_the_course_root(flow):
    """The generated config gives nbgrader an absolute root: no "root '.' is not absolute" on any command."""
    assert flow.runs
    for name, r, _ in flow.runs:
        assert "is not absolute" not in r.stdout + r.stderr, (name, r.stderr[-2000:])
    config = (flow.course / "nbgrader_config.py").read_text()
    assert 'root = "."' not in config


def test_release_strips_solutions_and_keeps_test_cells(flow):
    text = "\n".join(c.source for c in flow.release.cells)
    assert "### BEGIN SOLUTION" not in text and "raise NotImplementedError()" in text
    tests = [c for c in flow.release.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert {c.metadata["nbgrader"]["points"] for c in tests} and all("grade_cell(" in c.source for c in tests)
    assert sum(c.metadata["nbgrader"]["points"] for c in tests) == sum(s.points for s in load_checks(STEM))


def test_students_fetch_the_release_and_collect_brings_their_submissions(flow):
    for student in THROUGH_EXCHANGE:
        assert [c.source for c in flow.fetched[student].cells] == [c.source for c in flow.release.cells]
        assert (flow.course / "submitted" / student / STEM / f"{STEM}.ipynb").exists()
    collected = flow.output("collect")[0]
    assert all(f"Collecting submission: {s} {STEM}" in collected for s in THROUGH_EXCHANGE), collected


def test_solved_submission_gets_full_marks(flow):
    score, max_score = flow.first_scores["solved"]
    assert max_score == sum(s.points for s in load_checks(STEM)) and score == max_score, flow.first_scores


def test_untouched_release_gets_zero(flow):
    assert flow.first_scores["untouched"][0] == 0 and flow.first_scores["untouched"][1] > 0, flow.first_scores


@pytest.mark.parametrize("student", list(CHEATS))
def test_cheating_submission_earns_nothing(flow, student):
    """Importing the solutions, redefining grade_cell, patching the grader in the kernel: 0 points."""
    assert flow.first_scores[student][0] == 0, (student, flow.first_scores[student + "/cells"])


def test_feedback_shows_each_student_the_trusted_grades(flow):
    for student in STUDENTS:
        html = (flow.course / "feedback" / student / STEM / f"{STEM}.html").read_text()
        score, max_score = flow.first_scores[student]
        assert "graded outside the notebook" in html, student
        assert oslimits.describe() in html, student  # the isolation it was graded under
        assert f"Score: {float(score)} / {float(max_score)}" in html, student
    fetched = list((flow.base / "homes" / "solved" / STEM / "feedback").glob(f"*/{STEM}.html"))
    assert len(fetched) == 1, fetched


def test_export_writes_every_students_score(flow):
    with open(flow.course / "grades.csv", newline="") as fh:
        rows = {row["student_id"]: row for row in csv.DictReader(fh)}
    assert set(rows) == set(STUDENTS)
    for student in STUDENTS:
        score, max_score = flow.first_scores[student]
        assert (float(rows[student]["score"]), float(rows[student]["max_score"])) == (score, max_score)


def test_a_second_autograde_skips_every_submission_without_force(flow):
    again = flow.output("autograde")[1]
    for student in STUDENTS:
        assert f"Skipping existing assignment: {flow.course / 'autograded' / student / STEM}" in again
    assert flow.skipped_mtimes == flow.graded_mtimes


def test_a_forced_regrade_grades_again_and_gives_the_same_scores(flow):
    assert all(flow.forced_mtimes[s] != flow.graded_mtimes[s] for s in STUDENTS)
    assert flow.second_scores == flow.first_scores


def _readme_flow() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("## Teaching with it (nbgrader)"):].split("\n## ", 1)[0]


def test_the_readme_documents_the_flow_this_file_runs(flow):
    """Every nbgrader command this flow runs is in the README's teaching section, and every one there was run here."""
    text = _readme_flow()
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    documented = set(re.findall(r"^nbgrader (\w+)", blocks, re.M))
    run = {name for name, _, _ in flow.runs}
    assert documented == run, (sorted(documented), sorted(run))
    assert "course nbgrader build" in text and 'pip install -e ".[teach]"' in text and "pip install -e ." in text
    assert f"nbgrader autograde {STEM} --force" in text and "Skipping existing assignment" in text


def test_the_config_names_the_course_directory_wherever_it_is(tmp_path):
    """The root is the folder holding nbgrader_config.py, absolute, even when the folder is moved."""
    build(tmp_path / "a", [STEM])
    shutil.move(tmp_path / "a", tmp_path / "b")
    code = ("from traitlets.config.loader import PyFileConfigLoader as L; "
            "print(L('nbgrader_config.py', path='.').load_config().CourseDirectory.root)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "b", capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == str(tmp_path / "b")


# -- nothing of a submission runs outside the sandbox ----------------------------------------------------------------

@pytest.mark.parametrize("student", list(ATTACKS))
def test_a_submissions_code_never_runs_in_nbgrader(flow, student):
    """In an answer cell (graded in the sandbox: the scan rejects it there) or in cells that are not answer cells
    (never run): no marker outside, no pid file, no detached process, now or after autograde."""
    token = flow.tokens[student]
    assert not (flow.outside / f"{token}.marker").exists()
    assert not (flow.outside / f"{token}.pid").exists()
    assert not list(Path(tempfile.gettempdir()).glob(f"{token}.pid"))
    for when, alive in flow.alive.items():
        assert not alive[student], (when, alive)


@pytest.mark.parametrize("student", list(ATTACKS))
def test_an_attacking_submission_scores_no_more_than_a_blank_one(flow, student):
    assert flow.first_scores[student][0] <= flow.first_scores["untouched"][0], flow.first_scores[student + "/cells"]


def test_the_gradebook_keeps_every_students_scores(flow):
    """An attack that zeroes the gradebook, at once or from a process woken 60 s later, changed nothing."""
    assert flow.woken_scores == flow.first_scores
    score, max_score = flow.first_scores["solved"]
    assert score == max_score > 0 and 0 < flow.first_scores[WRONG][0] < max_score


def test_no_feedback_holds_the_solutions(flow):
    lines = _solutions_lines()
    assert len(lines) > 20
    for student in STUDENTS:
        if student in ("solved", WRONG):  # their answer cells are the solutions
            continue
        text = _text(flow.course / "feedback" / student / STEM / f"{STEM}.html")
        assert not [line for line in lines if line in text], student


def test_only_the_answer_cells_are_graded_and_no_output_is_kept(flow):
    """The attack in cells that are not answer cells changes nothing: the submission grades as a blank one, and no
    cell of the autograded notebook but a test cell has an output."""
    assert flow.first_scores["x_attacks_in_other_cells/cells"] == flow.first_scores["untouched/cells"]
    nb = nbformat.read(flow.course / "autograded" / "x_attacks_in_other_cells" / STEM / f"{STEM}.ipynb", as_version=4)
    assert sum(flow.tokens["x_attacks_in_other_cells"] in c.source for c in nb.cells) == 2
    for cell in nb.cells:
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade"):
            assert not cell.outputs, cell.source[:200]


def test_feedback_names_failed_hidden_cases_but_not_their_values(flow, monkeypatch, tmp_path):
    """The wrong answer, graded again here with the seed autograde used: each failed hidden case is named in the
    feedback, and neither its full label (its inputs), its message, nor its expected values (from solutions.<stem>,
    recorded as the check compares) are; the instructor's report shows them."""
    seen = []  # (trial, index of the case's part, expected value)
    compare = core.Trial.expect

    def recording(t, got, want, *args, **kwargs):
        if t.stopped_in:  # inside a hidden case
            seen.append((t, len(t.parts), want))
        return compare(t, got, want, *args, **kwargs)

    monkeypatch.setattr(core.Trial, "expect", recording)
    source = submission_source(STEM, flow.handed_in[WRONG])
    results = grade_lesson(STEM, Target.from_source(source, tmp_path, "wrong_again"), seed_for(STEM, WRONG))
    parts = [p for r in results for p in r.parts if p["hidden"] and not p["passed"]]
    (matmul,) = [r for r in results if r.name == "matmul_cost"]
    assert matmul.status == "failed" and matmul.message.startswith("hidden 1: ")  # the instructor's first failure
    expected = [want for t, i, want in seen if not t.parts[i].passed]  # the failed hidden cases'
    values = {form for want in expected for v in (want.values() if isinstance(want, dict) else [want])
              if isinstance(v, (int, float)) for form in (str(v), cmp.fmt(v)) if len(form) >= 6}
    assert values
    instructors = report.check_table(results, verbose=True)  # `course check -v`: every case, in full
    assert any(v in instructors for v in values) and all(p["label"] in instructors for p in parts)
    text = _text(flow.course / "feedback" / WRONG / STEM / f"{STEM}.html")
    for p in parts:
        assert f"{p['hidden']}: failed" in text
        assert p["label"] not in text and p["message"].splitlines()[0] not in text
    assert not [v for v in values if v in text]


def test_without_the_sandbox_autograde_refuses_unless_the_config_opts_in(flow):
    out = flow.refused.stdout + flow.refused.stderr
    assert "sandbox is not active" in out and "c.TrustedGrades.allow_unsandboxed = True" in out, out[-3000:]
    outputs = [o.get("text", "") for c in flow.unsandboxed.cells for o in c.get("outputs", [])]
    assert any("isolation: source scan only" in o for o in outputs), outputs


def test_a_hidden_case_is_known_by_its_label_or_by_the_loop_it_is_opened_in():
    """Trial marks the parts of hidden cases, labelled (pairs) or bare; the report for the student names them and
    shows none of their inputs or expected values, the instructor's shows them all."""
    from autograder.core import CheckResult
    t = core.Trial(None, None, seed=1, cuda=False)
    draw = lambda rng: rng.randint(10**6, 10**7)  # noqa: E731
    for label, x in t.cases([("visible", 11)], draw, n=2):
        with t.case(f"{label}: x={x}"):
            t.fail(f"expected {2 * x}")
    for x in t.cases([12], draw, n=1):  # the bare form: the label is the check's own
        with t.case(f"x={x}"):
            t.fail(f"expected {2 * x}")
    with t.case("a case of no t.cases"):
        pass
    assert [p.hidden for p in t.parts] == ["", "hidden 1", "hidden 2", "", "hidden 1", ""]
    secrets = [str(v) for p in t.parts if p.hidden for v in re.findall(r"\d{7,}", p.label + p.message)]
    r = CheckResult(STEM, "toy", "", 2.0, 0.0, "failed", f"{t.parts[0].label}: {t.parts[0].message}\n(more failed)",
                    [dataclasses.asdict(p) for p in t.parts], output=f"{secrets[0]}\n")
    full, student = report.check_table([r], verbose=True), report.check_table([r], verbose=True, for_student=True)
    assert all(s in full for s in secrets) and not [s for s in secrets if s in student]
    assert "hidden 1: failed; hidden 2: failed; hidden 1: failed" in student and "expected 22" in student


def test_the_config_runs_no_kernel_and_keeps_the_sanitize_step(tmp_path):
    build(tmp_path, [STEM])
    code = ("from traitlets.config.loader import PyFileConfigLoader as L; "
            "c = L('nbgrader_config.py', path='.').load_config().Autograde; "
            "print(*[p.__name__ for p in c.autograde_preprocessors]); "
            "print(*[p.__name__ for p in c.sanitize_preprocessors])")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    autograde, sanitize = (line.split() for line in r.stdout.strip().splitlines())
    assert "Execute" not in autograde and autograde[0] == "TrustedGrades" and "SaveAutoGrades" in autograde
    assert sanitize == ["ClearOutput", "DeduplicateIds", "OverwriteKernelspec", "OverwriteCells", "CheckCellMetadata"]


def test_trusted_grades_refuses_when_a_kernel_would_run_the_submission():
    from nbconvert.exporters import NotebookExporter
    from nbgrader.preprocessors import Execute

    from autograder.nbgrader_grade import SandboxRequired, TrustedGrades
    exporter = NotebookExporter()
    exporter.register_preprocessor(Execute)
    exporter.register_preprocessor(TrustedGrades)
    with pytest.raises(SandboxRequired, match="Execute is in"):
        exporter._preprocessors[-1].preprocess(nbformat.v4.new_notebook(), {})
