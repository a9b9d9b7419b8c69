"""The learner side of the checks stays apart from the grader's side.

A learner process may not import `autograder.checks` (an import hook) nor read its files (Landlock): the checks
hold expected values, mistake models and reference code. What runs there, the harness functions of `t.run` /
`t.run_against`, lives in autograder/harnesses/, which must import neither the checks nor the solutions; and no
learner process may hold a check module in memory, which means no zygote may be forked from a process that
imported one (zygote.holds_solutions)."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import lessons

ROOT = Path(__file__).resolve().parent.parent
HARNESSES = sorted((ROOT / "autograder" / "harnesses").glob("*.py"))
HARNESS_MODULES = [f"autograder.harnesses.{p.stem}" for p in HARNESSES if p.stem != "__init__"]
FORBIDDEN = ("autograder.checks", "solutions")


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def _imports(tree: ast.AST, package: str) -> set[str]:
    """Every module an `import` or `from ... import` anywhere in the tree names (relative ones resolved against
    `package`), with `from m import n` also giving m.n (n may be a submodule)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def test_every_lesson_whose_checks_run_harnesses_has_its_harness_module():
    """One module per lesson that needs one, named by the lesson's stem, beside the shared ones."""
    stems = {lesson.stem for lesson in lessons.LESSONS}
    shared = {"__init__", "engine", "server", "timing", "doctor"}  # (doctor: `course doctor`'s Triton self-test)
    assert {p.stem for p in HARNESSES} - shared <= stems
    assert not (ROOT / "autograder" / "engine_harness.py").exists()
    assert not (ROOT / "autograder" / "server_harness.py").exists()


@pytest.mark.parametrize("path", HARNESSES, ids=lambda p: p.name)
def test_a_harness_module_imports_neither_checks_nor_solutions(path):
    """Scanned: every import in the file, at any depth (a function's own imports run in the learner's process)."""
    bad = sorted(m for m in _imports(ast.parse(path.read_text()), "autograder.harnesses") if _forbidden(m))
    assert not bad, f"{path.name} imports {bad}"


def test_importing_every_harness_module_loads_no_check_and_no_solution():
    """Imported, each in a fresh interpreter: nothing they import pulls in a check module or a solution."""
    code = ("import importlib, json, sys\nout = {}\n"
            f"for m in {HARNESS_MODULES!r}:\n"
            "    before = set(sys.modules)\n"
            "    importlib.import_module(m)\n"
            "    out[m] = sorted(n for n in set(sys.modules) - before if n == 'solutions' or n.startswith("
            "('solutions.', 'autograder.checks')))\n"
            "print(json.dumps(out))")
    for m in HARNESS_MODULES:  # one interpreter each: what one module imports is not hidden by another's
        single = code.replace(repr(HARNESS_MODULES), repr([m]))
        r = subprocess.run([sys.executable, "-c", single], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.strip().splitlines()[-1]) == {m: []}


def _harness_argument(call: ast.Call) -> ast.expr | None:
    """The harness of `t.run(harness, ...)` / `t.run_against(reference, harness, ...)` (also `self.t.run`)."""
    f = call.func
    if not isinstance(f, ast.Attribute) or f.attr not in ("run", "run_against"):
        return None
    owner = f.value
    if not ((isinstance(owner, ast.Name) and owner.id == "t") or (isinstance(owner, ast.Attribute) and owner.attr == "t")):
        return None
    i = 0 if f.attr == "run" else 1
    return call.args[i] if len(call.args) > i else None


@pytest.mark.parametrize("stem", [lesson.stem for lesson in lessons.available()])
def test_every_harness_a_check_runs_comes_from_the_harnesses(stem):
    """In the lesson's checks, the function given to t.run / t.run_against is a name imported from
    autograder.harnesses (or an attribute of a harness module imported so): the learner's process imports its
    module, and may import no other."""
    tree = ast.parse((ROOT / "autograder" / "checks" / f"{stem}.py").read_text())
    names, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autograder.harnesses"):
            for a in node.names:
                (modules if node.module == "autograder.harnesses" else names).add(a.asname or a.name)
    for node in ast.walk(tree):
        arg = _harness_argument(node) if isinstance(node, ast.Call) else None
        if arg is None:
            continue
        where = f"{stem}.py line {node.lineno}"
        if isinstance(arg, ast.Name):
            assert arg.id in names, f"{where}: the harness {arg.id} is not imported from autograder.harnesses"
        else:
            assert isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id in modules, \
                f"{where}: the harness is not a function of an autograder.harnesses module"


PROBE = '''import sys


def held():
    """The check and solution modules this process holds (in sys.modules, or as autograder.checks)."""
    import autograder
    mods = sorted(m for m in sys.modules if m == "solutions" or m.startswith(("solutions.", "autograder.checks")))
    return mods + (["autograder.checks (an attribute of autograder)"] if "checks" in vars(autograder) else [])


def try_import(name):
    import importlib
    try:
        importlib.import_module(name)
    except ImportError as e:
        return "ImportError: " + str(e)
    return "imported"


def try_read(path):
    try:
        with open(path) as f:
            f.read(1)
    except OSError as e:
        return type(e).__name__
    return "read"
'''

SCRIPT = r'''
import json, sys, time
from autograder import lessons, oslimits, wire, zygote
from autograder.core import load_checks
from autograder.sandbox import LearnerProcess, LearnerRaised

probe, check_file = sys.argv[1], sys.argv[2]
assert lessons.find("02").available  # imports the bare package autograder.checks, as `course check` does
clean_before = zygote.can_fork_clean()
zygote.prepare(base=False)  # as runner.grade_lesson: the zygote first, then the checks
load_checks("l02_kv_cache")
out = {"clean_before": clean_before, "clean_after": zygote.can_fork_clean(), "mode": zygote.get().mode,
       "landlock": oslimits.active()}
proc = LearnerProcess.start(time.monotonic() + 60, target=probe)
try:
    proc.load(probe, "probe", [])
    call = lambda name, *args: proc.call(wire.LearnerRef(name), args, {}, what=name)[0]
    out["held"] = call("held")
    out["import"] = call("try_import", "autograder.checks.l02_kv_cache")
    out["import_package"] = call("try_import", "autograder.checks")
    out["read"] = call("try_read", check_file)
    out["refused"] = []
    for fn in ("autograder.checks.l02_kv_cache:kv_bytes_per_token", "solutions.l02_kv_cache:kv_bytes_per_token",
               "autograder.core:load_checks", "reference_engine.shipped:Path",  # (the engine: not a harness module)
               "autograder.harnesses.engine:build_llm"):  # a helper of a harness module, not marked @harness
        try:
            proc.harness(fn, ("l02_kv_cache",), {}, what=fn)
            out["refused"].append(None)
        except LearnerRaised as e:
            out["refused"].append(e.info["message"])
    out["harness"] = proc.harness("autograder.harnesses.engine:target_path", (), {}, what="target_path")
    out["held_after"] = call("held")
finally:
    proc.close()
print(json.dumps(out))
'''


@pytest.mark.parametrize("isolation", ["fork", "spawn"])
def test_a_learner_process_holds_no_check_and_cannot_import_or_read_one(tmp_path, isolation):
    """A grader that holds a check module (as every grader does once its checks are loaded) starts learner
    processes the normal way (LearnerProcess, from its zygote: forked before the checks were loaded, or a fresh
    interpreter): none holds a check module or the autograder.checks package, none can import one (nor run one
    as a harness), and under Landlock none can read its file; a harness of autograder/harnesses runs."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    check_file = ROOT / "autograder" / "checks" / "l02_kv_cache.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if isolation == "spawn":
        env["COURSE_ISOLATION"] = "spawn"
    else:
        env.pop("COURSE_ISOLATION", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(probe), str(check_file)], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["mode"] == isolation
    if isolation == "fork":
        assert out["clean_before"] and not out["clean_after"], "a grader holding a check module must not fork a zygote"
    assert out["held"] == [] and out["held_after"] == []
    for key in ("import", "import_package"):
        assert out[key].startswith("ImportError") and "cannot be imported while your code is graded" in out[key]
    assert all(msg and "not a harness function" in msg for msg in out["refused"]), out["refused"]
    assert "is not marked @harness" in out["refused"][-1]
    assert out["harness"] == str(ROOT / "reference_engine" / "checkpoints" / "target")
    if out["landlock"]:
        assert out["read"] == "PermissionError"


GRADE = r'''
import json, os, sys
from autograder import zygote
from autograder.parallel import grade_lessons
from autograder.core import CheckResult, load_checks

MAIN = os.getpid()

def grade(stem, only=None):
    # as runner.grade_lesson: the zygote first (a clean fork if this process holds no check yet), then the checks
    zygote.prepare(base=False)
    names = only or [spec.name for spec in load_checks(stem)]
    return [CheckResult(stem, n, "", 1.0, 1.0, "passed", f"{os.getpid() == MAIN} {zygote.get().mode}") for n in names]

stems = ["l05_latency_metrics", "l12_streaming", "l13_gpu_utilization"]
out = grade_lessons(stems, grade, 2)
print(json.dumps({s: {r.name: r.message for r in rs} for s, rs in out.items()}))
'''


def test_course_grade_never_imports_the_checks_before_forking_its_graders():
    """`course grade`'s graders, and this process for the timed check it grades alone at the end, each fork their
    zygote cleanly: the process that forks them never imported a check module (their names come from a child)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COURSE_ISOLATION", None)
    r = subprocess.run([sys.executable, "-c", GRADE], capture_output=True, text=True, cwd=ROOT, env=env, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["l12_streaming"]["streaming_server"] == "True fork", "the timed check: graded here, alone, forked"
    rest = [m for s, checks in got.items() for name, m in checks.items() if name != "streaming_server"]
    assert rest and set(rest) == {"False fork"}, "every other check: by a forked grader whose zygote is a fork"


def test_holding_a_check_module_rules_out_a_forked_zygote():
    """The bare package (imported by looking a lesson up) is allowed; a check module, a solution, a mutant not."""
    from autograder import zygote
    for name in ("autograder.checks.l02_kv_cache", "autograder.checks._engine", "solutions", "solutions.l02_kv_cache",
                 "tests.mutants", "tests.mutants.l02_kv_cache"):
        assert zygote._never_in_a_zygote(name), name
    for name in ("autograder.checks", "autograder.harnesses.engine", "autograder.core", "reference_engine.engine",
                 "tests.test_cli"):
        assert not zygote._never_in_a_zygote(name), name


def test_the_lpm_stand_in_tree_matches_as_the_checks_trie_does():
    """Lesson 18's lpm_order runs, in the learner's process, on the engine's own prefix cache (the checks' brute
    trie is grader-side code): both hold the same pages in the same blocks, so every lookup answers alike."""
    import random

    from autograder.checks.l18_prefix_caching import _build
    from autograder.harnesses.l18_prefix_caching import stand_in_tree
    rng = random.Random(0)
    for _ in range(200):
        P = rng.choice([1, 2, 3, 4])
        pool = [[rng.randrange(4) for _ in range(rng.randint(0, 12))] for _ in range(3)]
        cached = [rng.choice(pool)[:rng.randint(0, 12)] + [rng.randrange(4) for _ in range(rng.randint(0, 6))]
                  for _ in range(rng.randint(0, 4))]
        tree, trie = stand_in_tree(P, cached), _build(P, cached)
        for _ in range(5):
            w = rng.choice(pool + cached + [[]])[:rng.randint(0, 14)] + [rng.randrange(4) for _ in range(rng.randint(0, 3))]
            assert tree.match_prefix(w)[0] == trie.match_prefix(w)[0], (P, cached, w)


def test_the_grader_sends_no_unmarked_function():
    """Trial.run / run_against refuse, in the grader, a function not marked @harness (a check's own bug, found before
    any learner process is asked)."""
    from autograder import core
    from autograder.harnesses import engine, harness, is_harness
    assert is_harness(engine.run_engine) and not is_harness(engine.build_llm)
    with pytest.raises(TypeError, match="not a harness: mark it @harness"):
        core._harness_name(engine.build_llm)
    assert core._harness_name(harness(lambda: None)).endswith(":test_the_grader_sends_no_unmarked_function.<locals>.<lambda>")


def test_no_grader_callable_crosses_as_an_argument():
    """What a check sends a learner process is data: a function, a partial, a class or a lambda of the grader's is
    refused by the wire, so op_harness (a @harness function by its name) is the only way grader code runs there."""
    import functools

    from autograder import wire
    for fn in (len, functools.partial(print, 1), type("C", (), {}), lambda: 0, test_no_grader_callable_crosses_as_an_argument):
        with pytest.raises(wire.WireError, match="cannot be sent as data"):
            wire.encode([fn])
