"""The student release: no solution text, and `course check` grades the visible cases from stored answers."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import lessons, release
from autograder.release import build, leaked_solution_text

ROOT = Path(__file__).resolve().parents[1]
READY = [lesson.stem for lesson in lessons.available()]

# Run the copy "imported from its directory": drop the editable install's finder, which maps
# `solutions` to this checkout, so the copy sees only its own files (as a student's machine would).
RUN_IN_COPY = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path[:] = [p for p in sys.path if "editable" not in p and ("site-packages" in p or not p.startswith({root!r}))]
sys.path.insert(0, {copy!r})
from autograder.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    dest = tmp_path_factory.mktemp("release") / "course"
    build(dest)
    yield dest
    shutil.rmtree(dest, ignore_errors=True)


def course_in(copy: Path, *args):
    code = RUN_IN_COPY.format(root=str(ROOT), copy=str(copy))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=copy, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(copy)})


def test_release_holds_no_solutions(copy):
    assert not (copy / "solutions").exists() and not (copy / "tests").exists()
    assert leaked_solution_text(copy) == []
    assert sorted(p.stem for p in (copy / "autograder" / "visible").glob("*.bin")) == sorted(READY)


def test_release_leaves_out_the_data_only_hidden_cases_read(copy):
    """Lesson 08's hidden workload seeds and their replays (each named by its injected cause, the answer of
    first_suspect) are not in the copy; the visible seed's replays are."""
    from autograder.checks import l08_tail_latency as l08
    hidden = release.instructor_only_data(READY)
    assert l08.HIDDEN_SEEDS_FILE in hidden and len(hidden) == 1 + 6 * len(l08.HIDDEN_SEEDS)
    for path in hidden:
        assert path.exists(), path
        assert not (copy / path.relative_to(ROOT)).exists(), path
    shipped = sorted(p.name for p in (copy / l08.REPLAYS_DIR.relative_to(ROOT)).iterdir())
    assert shipped == sorted(f"{cause}-{l08.VISIBLE_SEED}.json.gz" for cause in ("none", *l08.CAUSES))


def test_untouched_copy_is_not_started_and_says_hidden_cases_are_the_instructors(copy):
    r = course_in(copy, "check", "02")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "hidden cases are graded by your instructor" in r.stdout
    assert "not started" in r.stdout and "score 0/" in r.stdout


def test_solved_copy_passes_every_visible_case_from_stored_answers(copy, tmp_path):
    """Each lesson's solutions, put in the copy's exercises/, pass the visible cases: the store answers
    every question the checks ask of the reference."""
    work = tmp_path / "solved"
    shutil.copytree(copy, work)
    for stem in READY:
        shutil.copy(ROOT / "solutions" / f"{stem}.py", work / "exercises" / f"{stem}.py")
    out = tmp_path / "grade.json"
    r = course_in(work, "grade", "--json", str(out))
    data = json.loads(out.read_text())
    bad = [(stem, c["name"], c["status"], c["message"][:300]) for stem, v in data["lessons"].items()
           for c in v["checks"] if c["status"] not in ("passed", "not graded here")]
    assert not bad, bad
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    skipped = [(stem, c["name"], p["label"]) for stem, v in data["lessons"].items() for c in v["checks"]
               for p in c["parts"] if not p["graded"] and "instructor" in p["message"]]
    assert not skipped, skipped  # with right answers, no visible case should need the solutions


def test_wrong_answer_fails_in_the_copy_with_the_mistake_named(copy, tmp_path):
    work = tmp_path / "wrong"
    shutil.copytree(copy, work)
    src = (ROOT / "solutions" / "l02_kv_cache.py").read_text()
    src += "\n\ndef kv_bytes_per_token(config, dtype):\n    return kv_bytes_per_token_right(config, dtype) // 2\n"
    src = src.replace("def kv_bytes_per_token(", "def kv_bytes_per_token_right(", 1)
    (work / "exercises" / "l02_kv_cache.py").write_text(src)
    r = course_in(work, "check", "02", "--only", "kv_bytes_per_token")
    assert "counts only K, not K and V" in r.stdout, r.stdout + r.stderr


def test_notebook_grade_cell_works_in_the_copy(copy):
    """An nbgrader release notebook's test cell, in a student's copy: it grades the functions the notebook's
    executed cells define (here: the solution's source as one cell), on the visible cases."""
    solution = (ROOT / "solutions" / "l01_roofline.py").read_text()
    code = RUN_IN_COPY.format(root=str(ROOT), copy=str(copy)).replace(
        "from autograder.cli import main\nsys.exit(main(sys.argv[1:]))",
        "from autograder.notebook import grade_cell\n"
        f"print('EARNED', grade_cell('l01_roofline', 'matmul_cost', {{'In': ['', {solution!r}]}}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(copy)})
    assert "EARNED 2.0" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


# -- the copy reads as a student's -----------------------------------------------------------------------

def _study_install_command() -> str:
    """The study command of the course README's Quick start (its first bash block)."""
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):]
    return quick.split("```bash\n", 1)[1].split("\n```", 1)[0]


def test_copy_has_its_own_readme(copy):
    text = (copy / "README.md").read_text()
    assert text != (ROOT / "README.md").read_text()
    assert _study_install_command() in text
    # How a CPU-only Linux machine gets the CPU build of torch, and which platform grades what.
    assert "--index-url https://download.pytorch.org/whl/cpu" in text and "| macOS on Apple silicon |" in text
    for needed in ("course lab", "course check", "exercises/", "graded by your instructor", "hand in"):
        assert needed in text, needed
    for word in ("pytest", "course release", "course sync", "nbgrader", "solutions", "--solutions", "mutant"):
        assert word not in text, word
    assert not (copy / "STUDENT_COPY.md").exists()  # the README says it


def _one_line_refusal(r, *phrases):
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not r.stdout.strip(), r.stdout
    for phrase in phrases:
        assert phrase in r.stderr, r.stderr


def test_help_in_the_copy_lists_no_instructor_commands(copy):
    for args in (["--help"], ["check", "--help"], ["grade", "--help"]):
        r = course_in(copy, *args)
        assert r.returncode == 0, r.stderr
        for word in ("sync", "release", "nbgrader", "--solutions", "interview"):
            assert word not in r.stdout, (args, word, r.stdout)
    assert "check" in course_in(copy, "--help").stdout
    assert "refused in this copy" in " ".join(course_in(copy, "check", "--help").stdout.split())


@pytest.mark.parametrize("args", [["sync"], ["sync", "--check"], ["nbgrader", "build", "nb"], ["nbgrader"],
                                  ["release", "out"]])
def test_instructor_commands_in_the_copy_answer_in_one_line(copy, args):
    _one_line_refusal(course_in(copy, *args), f"`course {args[0]}`", "instructor")


@pytest.mark.parametrize("args", [["check", "02", "--solutions"], ["grade", "--solutions"]])
def test_solutions_flag_in_the_copy_answers_in_one_line(copy, args):
    _one_line_refusal(course_in(copy, *args), "--solutions")


@pytest.mark.parametrize("args", [["check", "02", "--seed", "3"], ["grade", "--seed", "3"]])
def test_seed_in_the_copy_is_refused_in_one_line(copy, args):
    """The copy grades the visible cases at the seed their answers were recorded with: a --seed there would be
    silently ignored, so it is refused."""
    _one_line_refusal(course_in(copy, *args), "--seed", "instructor")


# -- what a release ships ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dirty_tree(tmp_path_factory):
    """The course's tree, with one exercise file edited and one lesson notebook holding an output."""
    tree = tmp_path_factory.mktemp("tree") / "course"
    tree.mkdir()
    for name in release.COPIED + ["solutions"]:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=release._IGNORE)
        else:
            shutil.copy2(src, tree / name)
    exercise = tree / "exercises" / "l02_kv_cache.py"
    exercise.write_text(exercise.read_text() + "\n# my own note\n")
    nb_path = tree / "lessons" / "l03_continuous_batching.ipynb"
    nb = json.loads(nb_path.read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    cell["execution_count"] = 1
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["42\n"]}]
    nb_path.write_text(json.dumps(nb))
    yield tree
    shutil.rmtree(tree, ignore_errors=True)


def test_release_refuses_edited_stubs_and_notebook_outputs(dirty_tree, tmp_path):
    stale, with_outputs = release.unshippable(dirty_tree)
    assert [p.name for p in stale] == ["l02_kv_cache.py"]
    assert [p.name for p in with_outputs] == ["l03_continuous_batching.ipynb"]
    out = tmp_path / "out"
    r = course_in(dirty_tree, "release", str(out))
    _one_line_refusal(r, "exercises/l02_kv_cache.py", "lessons/l03_continuous_batching.ipynb", "--force")
    assert not out.exists()


def test_release_force_ships_them_and_says_which(dirty_tree, tmp_path):
    out = tmp_path / "out"
    r = course_in(dirty_tree, "release", str(out), "02", "--force")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "exercises/l02_kv_cache.py" in r.stdout and "lessons/l03_continuous_batching.ipynb" in r.stdout
    assert (out / "exercises" / "l02_kv_cache.py").read_text().endswith("# my own note\n")
    assert release.notebooks_with_outputs(out) == [out / "lessons" / "l03_continuous_batching.ipynb"]
    assert leaked_solution_text(out) == []


def test_copy_stubs_say_what_to_do_and_not_where_they_came_from(copy):
    """A stub's header in the copy names the check command, not the maintainers' generator or solutions/."""
    for path in sorted((copy / "exercises").glob("l[0-9][0-9]_*.py")):
        head = "".join(path.read_text().splitlines(keepends=True)[:3])
        assert f"course check {path.name[1:3]}" in head, path
        assert "solutions" not in head and "course sync" not in head, (path, head)


# -- the copy grades as the instructor's visible cases do ---------------------------------------------------

GRADE_IN_COPY = """
import json
from autograder.runner import Target, grade_lesson
out = []
for job in json.load(open(sys.argv[1])):
    target = Target(path=job["path"], label=job["name"], module_name=job["name"])
    (r,) = grade_lesson(job["lesson"], target, 0, only=[job["check"]])
    out.append(r.to_dict())
json.dump(out, open(sys.argv[2], "w"))
"""


def grade_in_copy(copy: Path, jobs: list[dict], out: Path) -> list[dict]:
    code = RUN_IN_COPY.format(root=str(ROOT), copy=str(copy)).replace(
        "from autograder.cli import main\nsys.exit(main(sys.argv[1:]))", GRADE_IN_COPY)
    spec = out.with_suffix(".jobs.json")
    spec.write_text(json.dumps(jobs))
    r = subprocess.run([sys.executable, "-c", code, str(spec), str(out)], cwd=copy, capture_output=True, text=True,
                       timeout=1800, env={**os.environ, "PYTHONPATH": str(copy)})
    assert r.returncode == 0 and out.exists(), r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(out.read_text())


# Checks whose named mistakes come from the reference run on the learner's own output (lesson 10's tuned_kpa
# replays the learner's schedule in the fleet simulator): the store cannot hold those, so a copy grades such a
# case as "graded by your instructor", never as passed, and names no mistake there.
NAMED_ONLY_BY_THE_INSTRUCTOR = {("l10_autoscaling", "tuned_kpa")}


def copy_disagreements(copy: Path, stem: str, work: Path) -> list[str]:
    """Each kept wrong answer of `stem`, graded in `copy` and here (the solutions, visible cases, the release's
    seed): what the copy gets wrong (see the test below). Also for a partial copy: build(dest, [stem], True)."""
    from autograder.reference import RELEASE_SEED
    from autograder.runner import grade_lesson
    from tests.mutants import load
    from tests.test_mutants import mutant_target
    mutants = load(stem)
    jobs, here = [], []
    for m in mutants:
        target = mutant_target(m, work)
        jobs.append({"lesson": stem, "check": m.check, "path": target.path, "name": target.module_name})
        (r,) = grade_lesson(stem, target, RELEASE_SEED, only=[m.check], visible_only=True)
        here.append(r)
    there = grade_in_copy(copy, jobs, work / "copy.json")
    bad = []
    for m, r, c in zip(mutants, here, there):
        if c["earned"] > r.earned + 1e-9:
            bad.append(f"{m.label}: earns {c['earned']} in the copy, {r.earned} here: {c['message'][:300]}")
        elif m.message.lower() in r.message.lower() and m.message.lower() not in c["message"].lower() \
                and (stem, m.check) not in NAMED_ONLY_BY_THE_INSTRUCTOR:
            bad.append(f"{m.label}: names '{m.message}' here, not in the copy ({c['status']}): {c['message'][:300]}")
    return bad


@pytest.mark.parametrize("stem", READY)
def test_copy_grades_every_mutant_as_the_visible_cases_do(copy, stem, tmp_path):
    """Each kept wrong answer, graded in the copy (stored answers, the grader's answer code stripped) and here
    (the solutions, visible cases, the release's seed): no case the instructor's grading fails passes in the copy,
    and the mistake it names here is named there. A case the copy cannot judge (a question only that wrong
    answer asks) may say "graded by your instructor"; it is never passed."""
    bad = copy_disagreements(copy, stem, tmp_path)
    assert not bad, "\n".join(bad)


def test_copy_allows_only_the_engine_imports_of_the_lesson_stub(copy, tmp_path):
    """The copy's exercise file is the student's own: what it may import of the engine is what the release
    recorded of the lesson's stub, not what that file imports. Lesson 14's answer imported from the engine is
    rejected; lesson 06's stub imports the engine's bytes per token, which stays allowed."""
    work = tmp_path / "engine"
    shutil.copytree(copy, work)
    stub = work / "exercises" / "l14_speculative_decoding.py"
    stub.write_text(stub.read_text().replace("import torch\n", "import torch\n"
                                             "from reference_engine.spec_decode import verify_greedy\n", 1))
    r = course_in(work, "check", "14", "--only", "verify_greedy")
    assert "rejected" in r.stdout and "reference_engine.spec_decode" in r.stdout, r.stdout + r.stderr
    shutil.copy(ROOT / "solutions" / "l06_capacity_planning.py", work / "exercises" / "l06_capacity_planning.py")
    r = course_in(work, "check", "06")
    assert r.returncode == 0 and "rejected" not in r.stdout, r.stdout + r.stderr


# -- no shipped function computes an answer --------------------------------------------------------------

def probe_copy(copy: Path, calls: Path, out: Path) -> list[dict]:
    """tests/answer_probe.py's probe, run on `copy`'s own modules (the copy first on sys.path)."""
    code = RUN_IN_COPY.format(root=str(ROOT), copy=str(copy)).replace(
        "from autograder.cli import main\nsys.exit(main(sys.argv[1:]))",
        f"sys.path.append({str(ROOT / 'tests')!r})\nimport answer_probe\nsys.exit(answer_probe.main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "probe", str(calls), str(out)], cwd=copy, capture_output=True,
                       text=True, timeout=1800, env={**os.environ, "PYTHONPATH": str(copy)})
    assert r.returncode == 0 and out.exists(), r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(out.read_text())


# Lessons whose answers the engine implements (the README's "The engine holds answers"): a function of the
# engine may reproduce one of these, and the lesson's exercise may not import it.
ENGINE_ANSWERS = {"l02_kv_cache", "l04_paged_attention", "l12_streaming", "l14_speculative_decoding",
                  "l16_quantization", "l17_disaggregation", "l18_prefix_caching"}


def test_no_function_in_the_copy_reproduces_a_solution(copy, tmp_path):
    """Every function the copy ships (its grader, harnesses and engine) is called with the inputs the checks give
    the solutions (visible cases and hidden ones at a seed drawn now) wherever its signature takes them: none of
    the grader's reproduces an exercise's answers (its answer code is stripped at release), and the engine's
    that do belong to the lessons the README names, whose exercises cannot import them."""
    import random

    from autograder import scan
    from tests import answer_probe
    seed = random.randrange(1 << 30)
    calls = tmp_path / "calls.bin"
    from autograder import wire
    calls.write_bytes(wire.encode(answer_probe.collect(seed)))
    found = probe_copy(copy, calls, tmp_path / "found.json")
    grader = [f for f in found if f["function"].startswith("autograder.")]
    assert not grader, f"seed {seed}: the copy's grader computes answers: {grader}"
    for f in found:
        assert f["lesson"] in ENGINE_ANSWERS, f"seed {seed}: the engine computes {f['lesson']}'s answers: {f}"
        module = f["function"].rsplit(".", 1)[0]
        use = scan.lesson_engine_use(f["lesson"])
        assert module not in use.modules and not any(m == module for m, _ in use.names), (
            f"{f['lesson']}'s exercise may import {module}, whose {f['function']} computes {f['exercise']}")


def test_probe_finds_answer_code_in_the_instructor_tree(tmp_path):
    """The probe is able to fail: in this tree (answer code not stripped) it finds the grader's mistake variants
    whose defaults are the rule."""
    from autograder import wire
    from tests import answer_probe
    calls = tmp_path / "calls.bin"
    calls.write_bytes(wire.encode(answer_probe.collect(3, ["l10_autoscaling"])))
    r = subprocess.run([sys.executable, "-m", "tests.answer_probe", "probe", str(calls), str(tmp_path / "f.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads((tmp_path / "f.json").read_text())
    assert any(f["function"] == "autograder.checks.l10_autoscaling.kpa_variant" for f in found), found


def test_probe_judges_an_in_place_exercise_by_what_it_writes():
    """fp8_kv_write answers by writing the cache (it returns None): a function that returns None and writes nothing
    does not reproduce it (the CI failure: a check helper returning None was counted), the solution does."""
    from solutions import l16_quantization as sol
    from tests import answer_probe
    logged = answer_probe.collect(5, ["l16_quantization"])["l16_quantization"]["fp8_kv_write"]
    assert logged
    for args, kwargs, *expected in logged:
        assert expected[0] is None
        status, value = answer_probe._call(lambda k, slots, cache, scales: None, args, kwargs)
        assert status == "ok" and not answer_probe._same(value, expected)
        status, value = answer_probe._call(sol.fp8_kv_write, args, kwargs)
        assert status == "ok" and answer_probe._same(value, expected)


def test_strip_answer_code_keeps_names_and_docstrings_and_drops_bodies():
    from autograder import reference
    src = '''import math
from autograder.reference import answer_code
from autograder import reference


@answer_code
def rule(x, flag=False):
    """The rule, or a mistake."""
    def inner(y):
        return math.sqrt(y)
    return inner(x) + (1 if flag else 0)


@reference.answer_code
def other(x):
    return x * 2


def untouched(x):
    return x + 1
'''
    out = reference.strip_answer_code(src)
    assert "math.sqrt" not in out and "x * 2" not in out and "return x + 1" in out
    assert '"""The rule, or a mistake."""' in out and "def rule(x, flag=False):" in out and "def other(x):" in out
    namespace: dict = {}
    exec(compile(out, "<stripped>", "exec"), namespace)
    assert namespace["untouched"](1) == 2
    for name in ("rule", "other"):
        with pytest.raises(reference.AnswerStripped):
            namespace[name](4)


def test_answer_code_is_recorded_and_replayed_and_runs_as_written_otherwise():
    from autograder import reference

    calls = []

    @reference.answer_code
    def rule(x, scale=2):
        calls.append(x)
        return {"value": x * scale}

    assert rule(3) == {"value": 6} and calls == [3]  # no channel: as written
    rec = reference.Recorder(object())
    with reference.answering(rec):
        assert rule(5, scale=3) == {"value": 15}
    rep = reference.Replayer(rec.entries)
    with reference.answering(rep):
        assert rule(5, scale=3) == {"value": 15}
        assert calls == [3, 5]  # replayed, not run
        with pytest.raises(reference.NotRecorded):
            rule(6)  # a question the release never asked
