"""The `course` command."""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shlex
import sys
import time
from pathlib import Path

from . import lessons, report


def _seed(args) -> int:
    return args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)


# The instructor's commands: a student's copy has neither them nor the files they need.
INSTRUCTOR_COMMANDS = ("sync", "new-lesson", "release", "nbgrader", "gradescope", "autograde")
SEED_IN_COPY = ("--seed is not available in this copy of the course: it grades the visible cases only, at a fixed "
                "seed; the hidden cases, which a seed reproduces, are graded by your instructor")


def student_copy() -> bool:
    """Whether this is a student's copy of the course: the one rule is that it has no solutions."""
    from . import reference
    return not reference.solutions_available()


def _refused_in_copy(args) -> str | None:
    """Why `check`/`grade` refuse these options in a student's copy (one line), or None."""
    if args.solutions:
        return "--solutions is not available: this copy of the course has no solutions"
    if args.seed is not None:
        return SEED_IN_COPY
    return None


def _run_seed(args) -> tuple[bool, int | None]:
    """(in a student's copy, the run's seed): the copy grades at the seed its visible answers were recorded with
    and refuses what it cannot honour (one line on stderr, seed None)."""
    from . import reference
    in_copy = student_copy()
    refused = _refused_in_copy(args) if in_copy else None
    if refused:
        print(refused, file=sys.stderr)
        return in_copy, None
    return in_copy, reference.RELEASE_SEED if in_copy else _seed(args)


def _check_names(stem: str) -> list[str]:
    """The lesson's check names, loaded as grade_lesson loads them (its zygote started first)."""
    from . import runtime, zygote
    from .core import load_checks
    runtime.setup()
    zygote.prepare(lessons.warm_imports([stem]), lessons.later_imports([stem]), lessons.needs_torch([stem]))
    return [spec.name for spec in load_checks(stem)]


def _reproduce(lesson, seed: int, args) -> str:
    """The command line that repeats this run exactly: same seed, code and checks."""
    words = ["course", "check", f"{lesson.number:02d}", "--seed", str(seed)]
    words += ["--solutions"] if args.solutions else []
    words += ["--file", args.file] if args.file else []
    words += ["--only", *args.only] if args.only else []
    return shlex.join(words)


def cmd_list(args) -> int:
    for lesson in lessons.LESSONS:
        state = "ready" if lesson.available else "planned"
        print(f"{lesson.number:02d}  {lesson.stem:<28} {state:<8} {lesson.title}")
    return 0


def lab_command(lesson_key: str | None, extra: list[str]) -> list[str]:
    """The `jupyter lab` command line that opens a lesson with the whole course reachable: Jupyter is rooted at
    the course directory (so exercises/, where every answer is written, opens in its editor, also from a
    browser on another machine) and opens lesson NN's notebook. Jupyter refuses to start as root (common in
    containers) unless told --allow-root, so it is added exactly when this process runs as root."""
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={lessons.ROOT}"]
    if lesson_key:
        cmd.append(str(lessons.find(lesson_key).notebook))
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in extra:
        cmd.append("--allow-root")
    return cmd + extra


def cmd_lab(args) -> int:
    try:
        cmd = lab_command(args.lesson, args.jupyter_args)
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    print(" ".join(cmd), flush=True)
    os.execv(cmd[0], cmd)  # hand the terminal to Jupyter (Ctrl-C stops it as usual)
    return 0  # not reached


def _grade(stem: str, solutions: bool, seed: int, only=None, file: str | None = None, jobs: int = 1):
    from .runner import Target, grade_lesson
    target = Target(path=str(Path(file).resolve()), label=file) if file else Target.for_lesson(stem, solutions)
    return grade_lesson(stem, target, seed, only=only, jobs=jobs)


def cmd_check(args) -> int:
    try:
        lesson = lessons.find(args.lesson)
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    if not lesson.available:
        print(f"lesson {lesson.number:02d} ({lesson.title}) has no checks yet", file=sys.stderr)
        return 2
    in_copy, seed = _run_seed(args)
    if seed is None:
        return 2
    start = time.perf_counter()
    if args.file and not Path(args.file).is_file():
        print(f"no file {args.file}", file=sys.stderr)
        return 2
    if args.only:
        names = _check_names(lesson.stem)
        unknown = [name for name in dict.fromkeys(args.only) if name not in names]
        if unknown:
            print(f"lesson {lesson.number:02d} has no check named {', '.join(unknown)}; its checks are: "
                  + ", ".join(names), file=sys.stderr)
            return 2
    jobs = args.jobs if args.jobs is not None else min(2, os.cpu_count() or 1)
    results = _grade(lesson.stem, args.solutions, seed, only=args.only or None, file=args.file, jobs=jobs)
    what = args.file or f"{'solutions' if args.solutions else 'exercises'}/{lesson.stem}.py"
    from .oslimits import describe
    print(f"lesson {lesson.number:02d}: {lesson.title}  ({what}, seed {seed})\n{describe()}\n")
    if in_copy:
        print("Visible cases only: this copy stores their answers; the hidden cases are graded by your "
              "instructor.\n")
    print(report.check_table(results, verbose=args.verbose))
    print("\n" + report.summary_line(results) + f"  in {time.perf_counter() - start:.1f} s")
    if not in_copy:
        print(f"reproduce with: {_reproduce(lesson, seed, args)}")
    if args.json:
        _write_json(args.json, seed, {lesson.stem: results})
    return 0 if all(r.status in ("passed", "not graded here") for r in results) else 1


def cmd_grade(args) -> int:
    in_copy, seed = _run_seed(args)
    if seed is None:
        return 2
    from .parallel import grade_lessons
    ready = lessons.available()
    from . import zygote
    stems = [lesson.stem for lesson in ready]
    zygote.want(lessons.warm_imports(stems), lessons.later_imports(stems))  # one zygote may serve every lesson
    jobs = args.jobs if args.jobs is not None else min(2, os.cpu_count() or 1)
    everything = grade_lessons([lesson.stem for lesson in ready],
                               lambda stem, only=None: _grade(stem, args.solutions, seed, only=only), jobs)
    rows = [(lesson, everything[lesson.stem]) for lesson in ready]
    from .oslimits import describe
    print(describe() + "\n")
    print(f"{'lesson':<28} {'score':>11} {'checks passed':>14}  note")
    for lesson, results in rows:
        earned, possible, skipped = report.totals(results)
        passed = sum(r.status == "passed" for r in results)
        todo = sum(r.status == "not started" for r in results)
        notes = ([f"{todo} not started"] if todo else []) + \
            ([f"{skipped:g} pts not graded here (need {report.not_graded_why(results)})"] if skipped else [])
        print(f"{lesson.stem:<28} {earned:>5g}/{possible:<5g} {passed:>7}/{len(results):<6}  " + "; ".join(notes))
    all_results = [r for res in everything.values() for r in res]
    tot_e, tot_p, tot_s = report.totals(all_results)
    print(f"{'total':<28} {tot_e:>5g}/{tot_p:<5g}   (seed {seed})")
    todo = sum(r.status == "not started" for r in all_results)
    if todo:
        print(f"{todo} of {len(all_results)} checks are not started (their stubs still raise NotImplementedError)")
    if tot_s:
        print(f"{tot_s:g} points need {report.not_graded_why(all_results)} and were not graded here")
    if args.json:
        _write_json(args.json, seed, everything)
    ok = all(r.status in ("passed", "not graded here") for r in all_results)
    return 0 if ok else 1


def _write_json(path: str, seed: int, everything: dict):
    out = {"seed": seed, "lessons": {}}
    for stem, results in everything.items():
        earned, possible, skipped = report.totals(results)
        out["lessons"][stem] = {"earned": earned, "possible": possible, "not_graded_here": skipped,
                                "checks": [r.to_dict() for r in results]}
    out["earned"] = round(sum(v["earned"] for v in out["lessons"].values()), 2)
    out["possible"] = round(sum(v["possible"] for v in out["lessons"].values()), 2)
    with open(path, "w") as f:
        json.dump(out, f, indent=2)


def cmd_doctor(args) -> int:
    from .doctor import run
    return run()


def cmd_sync(args) -> int:
    from . import sync
    if args.check:
        bad = sync.stale()
        for p in bad:
            print(f"out of date: {p.relative_to(lessons.ROOT)}")
        if bad:
            print("run `course sync` to regenerate exercises/ from solutions/")
        return 1 if bad else 0
    for p in sync.write():
        print(f"wrote {p.relative_to(lessons.ROOT)}")
    return 0


def cmd_new_lesson(args) -> int:
    from . import new_lesson
    return new_lesson.command(args.number, args.stem, args.title)


def cmd_release(args) -> int:
    from . import release
    try:
        stems = [lessons.find(x).stem for x in args.lessons] or None
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    dest = Path(args.dir)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        print(f"{dest} exists and is not an empty directory: name a new one", file=sys.stderr)
        return 2
    stale, with_outputs = release.unshippable()
    if (stale or with_outputs) and not args.force:
        print(f"not released: {release.Unshippable(stale, with_outputs, lessons.ROOT)} (run `course sync` and "
              "clear the notebooks' outputs, or pass --force to ship them as they are)", file=sys.stderr)
        return 2
    for p in stale:
        print(f"shipping {p.relative_to(lessons.ROOT)} as it is: it differs from the stub `course sync` generates")
    for p in with_outputs:
        print(f"shipping {p.relative_to(lessons.ROOT)} with its outputs")
    dest = release.build(dest, stems, force=args.force)
    print(f"wrote a student copy to {dest} (no solutions; visible cases stored in autograder/visible/)")
    return 0


def cmd_nbgrader(args) -> int:
    from .nbgrader_build import build
    for path in build(args.dir, [lessons.find(x).stem for x in args.lessons] or None):
        print(f"wrote {path}")
    return 0


def cmd_gradescope(args) -> int:
    from . import gradescope
    stems = [lessons.find(x).stem for x in args.lessons] if args.lessons else None
    path = gradescope.build(args.out, stems, allow_unsandboxed=args.allow_unsandboxed)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): upload it as the assignment's autograder "
          "(Gradescope: Configure Autograder > Zip file upload), and raise the assignment's time limit to 40 minutes")
    return 0


def cmd_autograde(args) -> int:
    from . import batch
    stems = [lessons.find(x).stem for x in args.lessons] if args.lessons else None
    r = batch.autograde(args.submissions, args.out, stems, args.workers, args.allow_unsandboxed)
    print(f"graded {r['graded']} submission(s) in {r['seconds']:.1f} s "
          f"({r['graded'] / max(r['seconds'], 1e-9) * 60:.1f} a minute), {r['skipped']} unchanged; gradebook, "
          f"grades.csv and feedback/ in {Path(args.out) if args.out else Path(args.submissions).parent / 'gradebook'}")
    return 0


def cmd_serve(args) -> int:
    from reference_engine.server import options

    def error(message):
        print(message, file=sys.stderr)
        raise SystemExit(2)
    return options.run(args, error)


def cmd_interview(args) -> int:
    from . import interview
    try:
        interview.require_solutions()
        interview.resolve(args.lessons)
    except interview.NeedsFullCourse as e:
        print(e, file=sys.stderr)
        return 2
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    if args.minutes is not None and args.minutes <= 0 or args.questions is not None and args.questions < 1:
        print("--minutes must be > 0 and --questions >= 1", file=sys.stderr)
        return 2
    interview.run(args.lessons, _seed(args), minutes=args.minutes, questions=args.questions, json_path=args.json)
    return 0


def parser(in_copy: bool | None = None) -> argparse.ArgumentParser:
    """The command line; in a student's copy (in_copy, by default student_copy()) without the instructor's
    commands and --solutions, and with --seed refused."""
    in_copy = student_copy() if in_copy is None else in_copy
    solutions_help = argparse.SUPPRESS if in_copy else "grade solutions/ instead"
    seed_help = ("refused in this copy (it grades the visible cases only, at a fixed seed; the hidden cases are "
                 "graded by your instructor)") if in_copy else "reproduce a run's hidden cases"
    p = argparse.ArgumentParser(prog="course", description="The LLM inference course: lessons and grader.")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the lessons and which are ready").set_defaults(func=cmd_list)
    lab = sub.add_parser("lab", help="open a lesson in Jupyter Lab (works as root too)")
    lab.add_argument("lesson", nargs="?", help="lesson number or stem (default: none, the course folder)")
    lab.add_argument("jupyter_args", nargs=argparse.REMAINDER, help="passed on to jupyter lab (e.g. --no-browser)")
    lab.set_defaults(func=cmd_lab)
    c = sub.add_parser("check", help="grade one lesson (your exercises/ by default)")
    c.add_argument("lesson", help="lesson number or stem, e.g. 01 or l01_roofline")
    c.add_argument("--solutions", action="store_true", help=solutions_help)
    c.add_argument("--file", help="grade this file instead of exercises/ (a submission, say)")
    c.add_argument("--seed", type=int, help=seed_help)
    c.add_argument("--only", nargs="*", help="run only these checks")
    c.add_argument("-v", "--verbose", action="store_true", help="show every case")
    c.add_argument("--json", help="also write the results to this file")
    c.add_argument("--jobs", type=int, help="graders sharing the checks (default: 2, or 1 on a one-core machine); "
                                            "the same results as one at a time")
    c.set_defaults(func=cmd_check)
    g = sub.add_parser("grade", help="grade every ready lesson and print a score table")
    g.add_argument("--solutions", action="store_true", help=solutions_help)
    g.add_argument("--seed", type=int, help=seed_help)
    g.add_argument("--json")
    g.add_argument("--jobs", type=int, help="lessons graded at once (default: 2, or 1 on a one-core machine); "
                                            "the same scores as one at a time")
    g.set_defaults(func=cmd_grade)
    sub.add_parser("doctor", help="versions, device, and a Triton self-test").set_defaults(func=cmd_doctor)
    if not in_copy:
        s = sub.add_parser("sync", help="(maintainers) regenerate exercises/ from solutions/; "
                                        "overwrites exercises/")
        s.add_argument("--check", action="store_true", help="only report files that are out of date")
        s.set_defaults(func=cmd_sync)
        nl = sub.add_parser("new-lesson", help="(maintainers) write a new lesson's files with one working example, "
                                               "add it to LESSONS, run sync")
        nl.add_argument("number", type=int, help="the lesson's number, e.g. 20")
        nl.add_argument("stem", help="lNN_name, e.g. l20_kv_offload")
        nl.add_argument("title", help="its title, as `course list` shows it")
        nl.set_defaults(func=cmd_new_lesson)
        r = sub.add_parser("release", help="(instructors) write the copy a student receives: no solutions")
        r.add_argument("dir")
        r.add_argument("lessons", nargs="*", help="default: every ready lesson")
        r.add_argument("--force", action="store_true",
                       help="release even if exercises/ differ from the generated stubs or lesson notebooks hold "
                            "outputs (it prints which it ships)")
        r.set_defaults(func=cmd_release)
    if not in_copy:  # its worked answers come from the solutions
        i = sub.add_parser("interview", help="a mock interview: fresh questions from the lessons, graded, with worked "
                                             "answers")
        i.add_argument("lessons", nargs="*", help="lesson numbers to draw from (default: every lesson with questions)")
        i.add_argument("--minutes", type=float, help="stop asking new questions after this many minutes")
        i.add_argument("--questions", type=int, help="at most this many questions (each with its follow-ups)")
        i.add_argument("--seed", type=int, help="replay a session: the same seed asks the same questions")
        i.add_argument("--json", help="also write the session's record to this file")
        i.set_defaults(func=cmd_interview)
    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server on the engine (default: the shipped model)")
    from reference_engine.server.options import add_serve_arguments
    add_serve_arguments(sv)
    sv.set_defaults(func=cmd_serve)
    if not in_copy:
        n = sub.add_parser("nbgrader", help="(instructors) nbgrader course directory")
        nsub = n.add_subparsers(dest="nbcmd", required=True)
        b = nsub.add_parser("build", help="write nbgrader_config.py and source/<lesson>/<lesson>.ipynb")
        b.add_argument("dir")
        b.add_argument("lessons", nargs="*", help="default: every ready lesson")
        b.set_defaults(func=cmd_nbgrader)
        gs = sub.add_parser("gradescope", help="(instructors) a Gradescope autograder")
        gsub = gs.add_subparsers(dest="gscmd", required=True)
        gb = gsub.add_parser("build", help="write OUT/autograder.zip (Gradescope's autograder specification)")
        gb.add_argument("out")
        gb.add_argument("lessons", nargs="*", help="default: every ready lesson")
        gb.add_argument("--allow-unsandboxed", action="store_true",
                        help="grade even where the course's sandbox is not active in Gradescope's container")
        gb.set_defaults(func=cmd_gradescope)
        ag = sub.add_parser("autograde", help="(instructors) grade a folder of submissions in parallel into one "
                                              "gradebook (grades.csv, a CSV and JSON per lesson, feedback/)")
        ag.add_argument("submissions", help="one folder per student, or nbgrader's course folder (submitted/...)")
        ag.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="graders at once (default: cores)")
        ag.add_argument("--out", help="gradebook folder (default: SUBMISSIONS/../gradebook)")
        ag.add_argument("--lessons", nargs="*", help="default: every lesson a student has a file for")
        ag.add_argument("--allow-unsandboxed", action="store_true", help="grade even without the course's sandbox")
        ag.set_defaults(func=cmd_autograde)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    in_copy = student_copy()
    command = next((a for a in argv if not a.startswith("-")), None)
    if in_copy and command in INSTRUCTOR_COMMANDS:
        print(f"`course {command}` is an instructor's command: this copy of the course does not have it "
              "(`course --help` lists what it has)", file=sys.stderr)
        return 2
    if in_copy and command == "interview":
        print("Mock interviews need the full course: their worked answers are computed by the reference solutions, "
              "which this copy does not include; the mock-interview cell at the end of each lesson's notebook works "
              "here", file=sys.stderr)
        return 2
    args = parser(in_copy).parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `course list | head`
        return 0


def run():
    """The `course` command's entry point: main(), then a quick exit. Once its work is done and its output
    flushed, the process leaves without the interpreter's teardown: unloading torch alone takes about 0.3 s,
    a sixth of a fresh `course check`. The zygote is shut down first (it ends every learner process).
    `check` and `grade` import torch, the engine and the solutions with the cyclic collector off: importing
    torch alone ran two full collections over its growing heap (~0.1 s of a 1.1 s import); everything imported
    lives as long as the process. The grading itself collects as usual (runner._imports_out_of_the_collector)."""
    if sys.argv[1:2] in (["check"], ["grade"]):
        gc.disable()
    code = main()
    from . import zygote
    zygote.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    run()
