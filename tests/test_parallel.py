"""`course grade --jobs N`: lessons graded by forked graders give the results one process gives, a timed
check is graded alone by the main process (its lesson's others by the workers), and a grader that dies
loses no lesson.

Each case runs in a fresh interpreter: this test process has imported the solutions (and started a zygote),
where grade_lessons rightly falls back to one lesson at a time."""
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import json, os, sys
from autograder import lessons
from autograder.parallel import grade_lessons
from autograder.core import CheckResult, load_checks

MAIN = os.getpid()
die = sys.argv[1] if len(sys.argv) > 1 else ""

def grade(stem, only=None):
    if stem == die and os.getpid() != MAIN:
        os._exit(3)  # a grader that dies in the middle of a lesson
    names = only or [spec.name for spec in load_checks(stem)]
    return [CheckResult(stem, n, "", 1.0, 1.0, "passed", str(os.getpid() == MAIN)) for n in names]

stems = [lesson.stem for lesson in lessons.available()]
out = grade_lessons(stems, grade, 2)
print(json.dumps({"order": list(out), "main": {s: {r.name: r.message == "True" for r in rs} for s, rs in out.items()},
                  "names": {s: [r.name for r in rs] for s, rs in out.items()},
                  "checks": {s: [spec.name for spec in load_checks(s)] for s in stems}}))
'''


def _run(*args):
    r = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_lessons_are_shared_out_and_come_back_in_order_with_the_timed_check_graded_alone():
    from autograder import lessons
    got = _run()
    stems = [lesson.stem for lesson in lessons.available()]
    assert got["order"] == stems and got["names"] == got["checks"], "every check once, in the lesson's order"
    by_main = sorted(f"{s}.{n}" for s, checks in got["main"].items() for n, here in checks.items() if here)
    assert by_main == ["l12_streaming.streaming_server"], \
        "only the check that times a real server is graded by the main process (alone); the rest by the workers"


def test_a_grader_that_dies_leaves_its_lesson_to_the_main_process():
    got = _run("l05_latency_metrics")
    assert all(got["main"]["l05_latency_metrics"].values())
    assert got["names"] == got["checks"]


def test_course_grade_with_two_jobs_gives_the_scores_of_one(tmp_path):
    """The real thing on three quick lessons: same seed, same per-check results, one job or two."""
    def grade(jobs):
        path = tmp_path / f"jobs{jobs}.json"
        code = (f"import sys; from autograder import cli, lessons; "
                f"lessons.available = (lambda f: lambda: [l for l in f() if l.number in (5, 6, 13)])(lessons.available); "
                f"sys.exit(cli.main(['grade', '--solutions', '--seed', '3', '--jobs', '{jobs}', '--json', r'{path}']))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        data = json.loads(path.read_text())
        return {s: [(c["name"], c["status"], c["earned"]) for c in v["checks"]] for s, v in data["lessons"].items()}
    one, two = grade(1), grade(2)
    assert list(one) == ["l05_latency_metrics", "l06_capacity_planning", "l13_gpu_utilization"]
    assert one == two


# -- one lesson's checks shared by two graders (`course check`, parallel.run_checks) ------------------------------

def _spec(name: str, timed: bool = False, cost: float = 0.1):
    from autograder.core import CheckSpec
    return CheckSpec("lesson", name, None, 1.0, "", 10.0, False, "", timed, cost)


def _fake_run_one(main: int, die: str = ""):
    import os
    import time

    from autograder.core import CheckResult

    def run_one(spec):
        if spec.name == die and os.getpid() != main:
            os._exit(3)  # the second grader dies in the middle of a check
        time.sleep(0.05)  # long enough that both graders take some
        return CheckResult("lesson", spec.name, "", 1.0, 1.0, "passed", "main" if os.getpid() == main else "second")
    return run_one


def test_checks_are_shared_by_two_graders_and_come_back_in_order_with_the_timed_check_graded_here():
    import os

    from autograder.parallel import run_checks
    specs = [_spec(f"c{i}", cost=i / 10) for i in range(8)] + [_spec("timed", timed=True)]
    got = run_checks(specs, _fake_run_one(os.getpid()), 2)
    assert [r.name for r in got] == [s.name for s in specs], "every check once, in the lesson's order"
    by = {r.name: r.message for r in got}
    assert by["timed"] == "main", "a check that times this machine runs alone, in the main grader"
    assert {"main", "second"} <= set(by.values()), f"both graders take checks: {by}"
    assert by["c7"] != by["c6"], "the costliest two go first, one to each grader"


def test_a_check_the_second_grader_took_and_never_reported_is_graded_here():
    import os

    from autograder.parallel import run_checks
    specs = [_spec(f"c{i}") for i in range(6)]
    got = run_checks(specs, _fake_run_one(os.getpid(), die="c1"), 2)
    assert [r.name for r in got] == [s.name for s in specs]
    assert next(r for r in got if r.name == "c1").message == "main"


def test_a_clone_zygote_cleans_up_only_its_own_and_ends_with_its_socket(monkeypatch):
    import time

    from autograder import zygote
    from autograder.sandbox import LearnerProcess
    from tests.processes import alive as _alive
    root = zygote.get()
    pid, sock = root.clone()
    clone = zygote.Zygote(pid, sock, None, "clone")
    mine = LearnerProcess.start(time.monotonic() + 30)
    monkeypatch.setattr(zygote, "_ZYGOTE", clone)
    theirs = LearnerProcess.start(time.monotonic() + 30)
    monkeypatch.undo()
    assert zygote.get() is root and _alive(mine.pid) and _alive(theirs.pid) and clone.alive()
    root.cleanup()  # the first grader's check ends
    assert not _alive(mine.pid), "the root's cleanup kills its learner processes"
    assert _alive(theirs.pid) and _alive(pid), "but not the clone, nor the clone's learner process"
    clone.cleanup()
    assert not _alive(theirs.pid) and _alive(pid), "the clone's cleanup kills its own learner process, not itself"
    clone.close()
    for _ in range(200):
        if not _alive(pid):
            break
        time.sleep(0.01)
    assert not _alive(pid), "a clone ends when its grader closes its socket"
    assert not clone.alive()
    mine.close()
    theirs.close()


def test_course_check_with_two_graders_gives_the_results_of_one(tmp_path):
    """The real thing: lesson 04 (the engine, a Triton kernel, a GPU-only case) solved and untouched, same
    seed, one grader or two: the same verdict on every case."""
    def check(jobs, *extra):
        path = tmp_path / f"jobs{jobs}{''.join(extra)}.json"
        r = subprocess.run([sys.executable, "-m", "autograder.cli", "check", "04", "--seed", "3", "--jobs",
                            str(jobs), "--json", str(path), *extra], capture_output=True, text=True, timeout=300)
        assert r.returncode in (0, 1), r.stdout + r.stderr
        (lesson,) = json.loads(path.read_text())["lessons"].values()
        return [(c["name"], c["status"], c["earned"], [(p["label"], p["passed"], p["kind"]) for p in c["parts"]])
                for c in lesson["checks"]]
    solved = check(1, "--solutions")
    assert all(status in ("passed", "not graded here") for _, status, _, _ in solved)
    assert check(2, "--solutions") == solved
    untouched = check(2)
    assert {status for _, status, _, _ in untouched} <= {"not started", "not graded here"}
    assert untouched == check(1)


NO_SCAN = "from autograder import scan, cli; scan.scan_source = lambda *a, **k: []; cli.run()"


def test_code_that_kills_its_zygote_leaves_both_graders_working(tmp_path):
    """Each learner process kills its parent (the zygote, or the second grader's clone) as its module loads:
    every check still gets a verdict (the stub's "not started", or "crashed" naming the killed process, never
    a blame on the learner's return values), and the command ends with no process left behind."""
    def ours() -> set[str]:  # fresh-interpreter zygotes, and forks of the `course` process (its command line)
        found = [subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
                 for pattern in ("autograder.zygote", str(killer))]
        return {pid for pids in found for pid in pids}
    killer = tmp_path / "killer.py"
    before = ours()
    killer.write_text((ROOT / "exercises" / "l13_gpu_utilization.py").read_text()
                      + "\n\nimport os as _os\n_os.kill(_os.getppid(), 9)\n")
    out = tmp_path / "out.json"
    for jobs in ("2", "1"):
        # (the source scan names `os.kill`: it is switched off in this grader, to try the layers beneath it)
        r = subprocess.run([sys.executable, "-c", NO_SCAN, "check", "13", "--file", str(killer), "--jobs",
                            jobs, "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 1, r.stdout + r.stderr
        (lesson,) = json.loads(out.read_text())["lessons"].values()
        for c in lesson["checks"]:  # the stub's verdict, or the lost process named as what happened
            assert c["earned"] == 0 and (c["status"] == "not started" or (
                c["status"] == "crashed" and "kill its parent process" in c["message"]) or (
                c["status"] == "error" and "PermissionError" in c["message"])), r.stdout  # (Landlock refused)
    time.sleep(0.3)
    left = ours() - before
    assert not left, f"processes left behind: {left}"


def test_a_line_a_worker_did_not_write_is_its_task_lost_not_a_crash():
    """Only a grader's own forks write to its result pipes (the sandbox keeps learner processes out of them);
    a malformed line is read as a worker that died, whose task is graded again, never an exception."""
    import os

    from autograder.parallel import _Worker
    for junk in (b"not json\n", b'[{"name": 1}]\n', b'{"a": 1}\n', b"[1, 2]\n"):
        r, w = os.pipe()
        os.write(w, junk)
        os.close(w)
        worker = _Worker(0, None, r)
        assert worker.take() is None, junk
        os.close(r)
