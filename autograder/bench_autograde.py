"""How fast `course autograde` grades a class: `python -m autograder.bench_autograde [--students N] [--lessons ...]`.

Makes a class of N students per lesson (solved, blank, and the lesson's kept mutants as the wrong answers, in turn),
grades it with 1 worker and then with 2 (fresh gradebooks, the same submissions), checks the two gradebooks agree,
and prints submissions a minute for each and their ratio, side by side in one run. Then the time a class of 300
over the 19 lessons would take on 2, 16 and 64 cores, projected from the per-submission times measured here (mean
per lesson, one worker) and the two-worker efficiency measured here; a projection, not a measurement.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from . import batch, lessons


def make_class(root: Path, stems: list[str], students: int) -> None:
    sys.path.insert(0, str(lessons.ROOT))
    from tests.mutants import load  # the kept wrong answers (the full course has them)
    for stem in stems:
        answers = [(lessons.ROOT / "solutions" / f"{stem}.py").read_text(),
                   (lessons.ROOT / "exercises" / f"{stem}.py").read_text()] + [m.source() for m in load(stem)]
        for i in range(students):
            folder = root / f"student{i:03d}" / "exercises"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{stem}.py").write_text(answers[i % len(answers)])


def _hours(h: float) -> str:
    return f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.bench_autograde")
    ap.add_argument("--students", type=int, default=4)
    ap.add_argument("--lessons", nargs="*", help="lesson numbers or stems (default: every lesson)")
    args = ap.parse_args(argv)
    stems = [lessons.find(x).stem for x in args.lessons] if args.lessons else [x.stem for x in lessons.available()]
    with tempfile.TemporaryDirectory(prefix="course-bench-autograde-") as tmp:
        root = Path(tmp)
        make_class(root / "class", stems, args.students)
        runs = {}
        for workers in (1, 2):
            start = time.perf_counter()
            r = batch.autograde(root / "class", root / f"book{workers}", stems, workers, log=lambda *_: None)
            runs[workers] = (r, time.perf_counter() - start)
        strip = [{s: {stem: {k: v for k, v in e.items() if k != "seconds"} for stem, e in es.items()}
                  for s, es in runs[w][0]["book"].items()} for w in (1, 2)]
        same = strip[0] == strip[1]
        n = runs[1][0]["graded"]
        rate = {w: n / runs[w][1] * 60 for w in runs}
        print(f"{n} submissions ({args.students} students x {len(stems)} lessons: {', '.join(stems)})")
        for w in (1, 2):
            print(f"  {w} worker(s): {runs[w][1]:6.1f} s, {rate[w]:5.1f} submissions a minute")
        print(f"  2 workers / 1: {rate[2] / rate[1]:.2f}x; gradebooks identical: {same}")
        per_lesson = {}
        for es in runs[1][0]["book"].values():
            for stem, e in es.items():
                per_lesson.setdefault(stem, []).append(e["seconds"])
        mean_job = sum(sum(v) / len(v) for v in per_lesson.values()) / len(per_lesson)
        efficiency = rate[2] / rate[1] / 2
        serial_h = 300 * 19 * mean_job / 3600
        print(f"  mean seconds a submission, one worker, over the lessons above: {mean_job:.1f}; two-worker "
          f"efficiency {efficiency:.0%}")
        print("  projected, 300 students x 19 lessons at that mean, if that efficiency held on more cores: "
              + ", ".join(f"{cores} cores {_hours(serial_h / (cores * efficiency))}" for cores in (2, 16, 64)))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
