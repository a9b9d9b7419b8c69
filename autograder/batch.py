"""`course autograde SUBMISSIONS --workers N`: a class's submissions graded in parallel into one gradebook.

SUBMISSIONS holds one folder per student, either nbgrader's layout (`submitted/<student>/<assignment>/...`) or any
other (`<student>/...`); a lesson's answers are the student's exercise file (`l02_kv_cache.py`) or nbgrader notebook
(`l02_kv_cache.ipynb`, its answer cells), found anywhere in the student's folder, as the Gradescope autograder finds
them (autograder/gradescope.py: find_answers).

Each (student, lesson) is one job; N worker processes take jobs, each grading with the course's grader (the
student's code in sandboxed learner processes, hidden cases included, one grader per job: `jobs=1`). The seed comes
from the assignment (nbgrader's folder name, or the lesson's stem) and the student, as `nbgrader autograde` with the
course's TrustedGrades seeds it, so a regrade gives the same scores.

The gradebook, in OUT (default SUBMISSIONS/../gradebook):
- `gradebook.json`: every graded job, with its submission's hash; written after each job, so a stopped run resumes,
  and a rerun grades only the submissions that are new or changed (or whose lesson's checks changed);
- `<stem>.csv` and `<stem>.json` per lesson: a row per student, a column per check;
- `grades.csv`: what an LMS imports, a row per student, a column per lesson total and per check;
- `feedback/<student>.md`: each check's points and message, hidden cases named without their inputs (as nbgrader's
  feedback shows the course's check cells).
"""
from __future__ import annotations

import csv
import hashlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from . import lessons


@dataclass(frozen=True)
class Job:
    student: str
    stem: str
    assignment: str
    path: str  # the file found, "" when the student has none for this lesson
    digest: str  # hash of the answers and of the lesson's checks: a change in either regrades


def _checks_digest(stem: str) -> str:
    files = [lessons.ROOT / "autograder" / "checks" / f"{stem}.py", lessons.ROOT / "solutions" / f"{stem}.py"]
    h = hashlib.sha256()
    for f in files:
        if f.exists():
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def student_folders(submissions: Path) -> list[Path]:
    """The students' folders: SUBMISSIONS/<student>, or nbgrader's SUBMISSIONS/submitted/<student>."""
    root = submissions / "submitted" if (submissions / "submitted").is_dir() else submissions
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def find_jobs(submissions: Path, stems: list[str] | None = None) -> list[Job]:
    """Every (student, lesson) to grade: the given lessons, or every lesson some student has a file for."""
    folders = student_folders(submissions)
    nbgrader = (submissions / "submitted").is_dir()
    if stems is None:
        known = [lesson.stem for lesson in lessons.available()]
        stems = [s for s in known if any(_found(f, s) for f in folders)]
    digests = {stem: _checks_digest(stem) for stem in stems}
    jobs = []
    for folder in folders:
        for stem in stems:
            found = _found(folder, stem)
            rel = found.relative_to(folder).parts if found is not None else ()
            assignment = rel[0] if nbgrader and len(rel) > 1 else stem  # nbgrader: <student>/<assignment>/...
            digest = hashlib.sha256((found.read_bytes() if found else b"") + digests[stem].encode()).hexdigest()[:16]
            jobs.append(Job(folder.name, stem, assignment, str(found or ""), digest))
    return jobs


# The gradebook is saved this often while grading (and at the end): a run that is stopped loses at most this much.
SAVE_EVERY_S = 2.0


def _found(folder: Path, stem: str) -> Path | None:
    from .gradescope import answer_file
    return answer_file(folder, stem)


def grade_job(job: Job) -> dict:
    """One job's gradebook entry (run in a worker process)."""
    from . import gradescope, report
    from .nbgrader_grade import seed_for
    from .runner import Target, grade_lesson
    start = time.perf_counter()
    seed = seed_for(job.assignment, job.student)
    entry = {"student": job.student, "lesson": job.stem, "assignment": job.assignment, "seed": seed,
             "digest": job.digest, "file": Path(job.path).name if job.path else ""}
    if not job.path:
        source, where = None, f"no {job.stem}.py or {job.stem}.ipynb in the submission"
    else:
        source, where = gradescope.find_answers(Path(job.path).parent, job.stem)
    try:
        if source is None:
            from .core import load_checks
            checks = [{"name": s.name, "points": s.points, "earned": 0.0, "status": "missing", "message": where}
                      for s in load_checks(job.stem)]
        else:
            with tempfile.TemporaryDirectory(prefix="course-autograde-") as tmp:
                target = Target.from_source(source, tmp, f"submission_{job.stem}", label=f"{job.student}'s {where}")
                results = grade_lesson(job.stem, target, seed)
            # a traceback names the graded copy's temporary path: name the student's file instead (the same
            # gradebook whichever worker or run graded it)
            shown = str(Path(job.path).relative_to(Path(job.path).parents[1])) if job.path else job.stem
            checks = [{"name": r.name, "points": r.points, "earned": r.earned if r.graded else 0.0,
                       "status": r.status, "message": report.student_message(r).replace(str(target.path), shown)}
                      for r in results]
    except Exception as e:  # noqa: BLE001 - one job's failure is its entry, the class is still graded
        checks = [{"name": "(grader)", "points": 0.0, "earned": 0.0, "status": "error",
                   "message": f"the grader failed on this submission: {type(e).__name__}: {e}"}]
    entry["checks"] = checks
    entry["score"] = round(sum(c["earned"] for c in checks), 2)
    entry["max"] = round(sum(c["points"] for c in checks), 2)
    entry["seconds"] = round(time.perf_counter() - start, 2)
    return entry


def _init_worker() -> None:
    from . import runtime
    runtime.setup()


def autograde(submissions: str | Path, out: str | Path | None = None, stems: list[str] | None = None,
              workers: int = 1, allow_unsandboxed: bool = False, log=print) -> dict:
    """Grade what is new or changed; returns {"graded": n, "skipped": n, "seconds": s, "book": gradebook}."""
    from . import oslimits
    submissions = Path(submissions)
    out = Path(out) if out else submissions.parent / "gradebook"
    out.mkdir(parents=True, exist_ok=True)
    if not oslimits.active() and not allow_unsandboxed:
        raise SystemExit(f"not grading: the course's sandbox is not active here ({oslimits.describe()}); students' code "
                         "would run as you. Grade on Linux 5.13 or later, or pass --allow-unsandboxed")
    book_path = out / "gradebook.json"
    book = json.loads(book_path.read_text()) if book_path.exists() else {}
    jobs = find_jobs(submissions, stems)
    todo = longest_first([j for j in jobs if book.get(j.student, {}).get(j.stem, {}).get("digest") != j.digest], book)
    log(f"{len(jobs)} submission(s) of {len({j.student for j in jobs})} student(s) in {len({j.stem for j in jobs})} "
        f"lesson(s): {len(todo)} to grade, {len(jobs) - len(todo)} unchanged since the last run; {workers} worker(s)")
    start = time.perf_counter()
    if todo:
        # spawn: each worker a fresh interpreter (no torch or zygote state inherited from this process)
        ctx = multiprocessing.get_context("spawn")
        written = time.monotonic()
        try:
            with ctx.Pool(workers, initializer=_init_worker) as pool:
                for entry in pool.imap_unordered(grade_job, todo):
                    book.setdefault(entry["student"], {})[entry["lesson"]] = entry
                    if time.monotonic() - written >= SAVE_EVERY_S:  # (the whole book: not after every entry)
                        _write_json(book_path, book)
                        written = time.monotonic()
                    log(f"  {entry['student']:<20} {entry['lesson']:<28} {entry['score']:g}/{entry['max']:g} "
                        f"({entry['seconds']:.1f} s)")
        finally:  # stopped (Ctrl-C) or done: what was graded is kept, and a re-run grades only the rest
            _write_json(book_path, book)
    seconds = time.perf_counter() - start
    export(book, out)
    db = submissions / "gradebook.db"
    if (submissions / "submitted").is_dir() and db.exists():  # an nbgrader course: its gradebook gets the grades too
        log(to_nbgrader(book, db))
    return {"graded": len(todo), "skipped": len(jobs) - len(todo), "seconds": seconds, "book": book}


def to_nbgrader(book: dict, db: Path) -> str:
    """Each graded entry's check scores into nbgrader's gradebook (the auto_score of each test cell, grade id
    check_<name>, of notebook <stem> in the entry's assignment), as `nbgrader autograde` would leave them: the
    submission is added if nbgrader has none yet; a student who handed in nothing gets none. An assignment nbgrader
    does not know (never generated) is left out, and said. Returns what was done, in a line."""
    try:
        from nbgrader.api import Gradebook, MissingEntry
    except ImportError:
        return f"not written to {db}: nbgrader is not installed (pip install -e \".[teach]\")"
    written, unknown = 0, set()
    with Gradebook(f"sqlite:///{db}") as gb:
        for student, entries in sorted(book.items()):
            for stem, e in sorted(entries.items()):
                if not e["file"]:  # nothing handed in: nbgrader holds no submission for it either
                    continue
                try:
                    gb.find_assignment(e["assignment"])
                except MissingEntry:
                    unknown.add(e["assignment"])
                    continue
                try:
                    gb.find_student(student)
                except MissingEntry:
                    gb.add_student(student)
                try:
                    gb.find_submission(e["assignment"], student)
                except MissingEntry:
                    with warnings.catch_warnings():  # (nbgrader's own add_submission warns of SQLAlchemy's autoflush)
                        warnings.simplefilter("ignore")
                        gb.add_submission(e["assignment"], student)
                for c in e["checks"]:
                    try:
                        grade = gb.find_grade(f"check_{c['name']}", stem, e["assignment"], student)
                    except MissingEntry:
                        continue
                    grade.auto_score = c["earned"]
                gb.db.commit()
                written += 1
    skipped = (f"; not in it (run nbgrader generate_assignment first): {', '.join(sorted(unknown))}"
               if unknown else "")
    return f"nbgrader's gradebook {db}: {written} submission(s) written{skipped}"


def longest_first(todo: list[Job], book: dict) -> list[Job]:
    """The jobs, longest first (so the last ones to finish are short, and no worker waits long for another at the
    end): by each lesson's mean seconds in the gradebook when every lesson has some, else by the sum of its checks'
    time limits (set in proportion to the work each check does)."""
    from .core import load_checks
    stems = {j.stem for j in todo}
    seen: dict[str, list[float]] = {}
    for entries in book.values():
        for stem, e in entries.items():
            seen.setdefault(stem, []).append(e.get("seconds", 0.0))
    if stems <= seen.keys():
        weight = {stem: sum(seen[stem]) / len(seen[stem]) for stem in stems}
    else:
        weight = {stem: sum(s.timeout for s in load_checks(stem)) for stem in stems}
    return sorted(todo, key=lambda j: -weight[j.stem])  # (stable: within a lesson, the students' order)


def _write_json(path: Path, data) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _stems(book: dict) -> list[str]:
    seen = {stem for entries in book.values() for stem in entries}
    return [lesson.stem for lesson in lessons.LESSONS if lesson.stem in seen]


def _check_names(book: dict, stem: str) -> list[str]:
    names: list[str] = []
    for entries in book.values():
        for c in entries.get(stem, {}).get("checks", []):
            if c["name"] not in names:
                names.append(c["name"])
    return names


def export(book: dict, out: Path) -> None:
    """grades.csv (a row per student, a column per lesson and per check), a CSV and JSON per lesson, feedback."""
    stems = _stems(book)
    students = sorted(book)
    columns = {stem: _check_names(book, stem) for stem in stems}
    with open(out / "grades.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "total"] + [f"{s} total" for s in stems] + [f"{s}:{n}" for s in stems for n in columns[s]])
        for student in students:
            entries = book[student]
            per = [entries.get(s, {}).get("score", 0.0) for s in stems]
            cells = [_earned(entries.get(s, {}), n) for s in stems for n in columns[s]]
            w.writerow([student, round(sum(per), 2)] + per + cells)
    for stem in stems:
        rows = {student: book[student][stem] for student in students if stem in book[student]}
        _write_json(out / f"{stem}.json", rows)
        with open(out / f"{stem}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["student", "score", "max", "seed"] + columns[stem])
            for student, e in rows.items():
                w.writerow([student, e["score"], e["max"], e["seed"]] + [_earned(e, n) for n in columns[stem]])
    fb = out / "feedback"
    fb.mkdir(exist_ok=True)
    for student in students:
        (fb / f"{_safe(student)}.md").write_text(feedback(student, book[student]))


def _earned(entry: dict, name: str):
    return next((c["earned"] for c in entry.get("checks", []) if c["name"] == name), "")


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def feedback(student: str, entries: dict) -> str:
    """A student's feedback in Markdown: per lesson, each check's points and message."""
    lines = [f"# Feedback for {student}", ""]
    for stem in [s for s in (lesson.stem for lesson in lessons.LESSONS) if s in entries]:
        e = entries[stem]
        lines += [f"## {stem}: {e['score']:g} / {e['max']:g}", "",
                  f"Graded from {e['file'] or 'no file'} (seed {e['seed']}).", "",
                  "| check | points | status |", "|---|---|---|"]
        lines += [f"| {c['name']} | {c['earned']:g} / {c['points']:g} | {c['status']} |" for c in e["checks"]]
        lines.append("")
        for c in e["checks"]:
            if c["status"] != "passed" and c["message"]:
                body = "\n".join("    " + line for line in c["message"].splitlines())
                lines += [f"**{c['name']}**:", "", body, ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:  # `course autograde` (cli.py) is the usual way in
    import argparse
    p = argparse.ArgumentParser(prog="python -m autograder.batch")
    p.add_argument("submissions")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out")
    p.add_argument("--lessons", nargs="*")
    p.add_argument("--allow-unsandboxed", action="store_true")
    a = p.parse_args(argv)
    stems = [lessons.find(x).stem for x in a.lessons] if a.lessons else None
    r = autograde(a.submissions, a.out, stems, a.workers, a.allow_unsandboxed)
    print(f"graded {r['graded']} in {r['seconds']:.1f} s ({r['graded'] / max(r['seconds'], 1e-9) * 60:.1f} per minute)"
          f"; {r['skipped']} unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
