"""How long grading takes: `python -m autograder.bench [--repeat N]`.

Measures each ready lesson's `course check` against the solutions (every
check runs its cases, so this is the slow path) in one process after the
imports, and the whole command as a fresh process (imports included), with
one grader and with two sharing the checks (the default), side by side; then
`course grade --solutions` over every ready lesson, one lesson at a time and
two at once.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from . import lessons
from .runner import Target, grade_lesson


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5, help="in-process runs per lesson (the median is shown)")
    ap.add_argument("--fresh", type=int, default=3, help="fresh `course check` processes per lesson (median)")
    ap.add_argument("--lessons", nargs="*", help="lesson numbers or stems (default: every ready lesson)")
    ap.add_argument("--no-grade", action="store_true", help="skip the whole-course `course grade` runs")
    args = ap.parse_args(argv)
    chosen = [lessons.find(x) for x in args.lessons] if args.lessons else lessons.available()
    from . import zygote
    stems = [lesson.stem for lesson in chosen]
    zygote.want(lessons.warm_imports(stems), lessons.later_imports(stems))  # one zygote serves every lesson here
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, triton"], check=True)
    print(f"fresh `import torch, triton` (paid once per process): {time.perf_counter() - t0:.2f} s")
    print(f"{'lesson':<24} {'checks':>6} {'in-process median':>18} {'max':>7}   fresh `course check` median (max): "
          f"{'--jobs 1':>15} {'--jobs 2 (default)':>19}")
    for lesson in chosen:
        times = []
        for i in range(args.repeat):
            start = time.perf_counter()
            res = grade_lesson(lesson.stem, Target.for_lesson(lesson.stem, solutions=True), seed=i, jobs=2)
            times.append(time.perf_counter() - start)
        fresh: dict[int, list[float]] = {1: [], 2: []}
        for i in range(args.fresh):
            for jobs in (1, 2):  # side by side: the machine's speed drifts over minutes
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "autograder.cli", "check", f"{lesson.number:02d}",
                                "--solutions", "--seed", str(i), "--jobs", str(jobs)], capture_output=True, check=False)
                fresh[jobs].append(time.perf_counter() - start)
        cols = "".join(f"{statistics.median(f):>11.2f} s ({max(f):.2f})" for f in fresh.values())
        print(f"{lesson.stem:<24} {len(res):>6} {statistics.median(times):>16.2f} s {max(times):>5.2f} s  {cols}",
              flush=True)
    for jobs in () if args.no_grade else (1, 2):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autograder.cli", "grade", "--solutions", "--jobs", str(jobs)],
                       capture_output=True, check=False)
        print(f"fresh `course grade --solutions --jobs {jobs}` (every ready lesson): "
              f"{time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
