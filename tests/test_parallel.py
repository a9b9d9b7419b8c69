"""`course grade --jobs N`: lessons graded by forked graders give the results one process gives, a timed
check is graded alone by the main process (its lesson's others by the workers), and a grader that dies
loses no lesson.

Each case runs in a fresh interpreter: this test process has imported the solutions (and started a zygote),
where grade_lessons rightly falls back to one lesson at a time."""
import json
import subprocess
import sys

SCRIPT = r'''
import json, os, sys
from autograder import lessons
from autograder.parallel import grade_lessons
from autograder.runner import CheckResult, load_checks

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
