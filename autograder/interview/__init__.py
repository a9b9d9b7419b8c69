"""Mock interviews: `course interview [NN ...] [--minutes M] [--seed S] [--json PATH]`, and `ask("NN")` in a notebook.

Each question is a fresh instance of one of a lesson's templates (model, chip, workload, SLO drawn
from a seeded random.Random), answered by a number in a stated unit and graded within a stated
tolerance, then explained step by step with numbers computed by the lesson's reference solutions,
then probed with follow-ups that change one condition. Open questions show their key points after
the learner's answer; the learner marks which they covered, and those marks are reported apart
from the graded numbers.

    from autograder.interview import ask
    ask("02")            # one question from lesson 02, answered with input()

The answers need solutions/: in a student's copy every entry point says so (NeedsFullCourse).
"""
from __future__ import annotations

import json
import random
import sys

from .. import lessons
from .session import Session
from .templates import NEEDS_FULL_COURSE, NeedsFullCourse, all_templates, require_solutions, stems

__all__ = ["ask", "run", "Session", "NeedsFullCourse", "NEEDS_FULL_COURSE", "all_templates", "stems", "resolve"]


def resolve(keys: list[str]) -> list[str]:
    """Lesson stems for command-line keys ('01', 'l02_kv_cache', 'roofline'); every ready lesson if none.
    Raises KeyError with a message for an unknown lesson or one without questions."""
    if not keys:
        return stems()
    out = []
    for key in keys:
        lesson = lessons.find(key)
        if lesson.stem not in stems():
            raise KeyError(f"lesson {lesson.number:02d} ({lesson.title}) has no interview questions yet; ready: "
                           + " ".join(f"{lessons.find(s).number:02d}" for s in stems()))
        if lesson.stem not in out:
            out.append(lesson.stem)
    return [s for s in stems() if s in out]  # course order: the same lessons in any order replay the same session


def stream_reader(stream, echo_to=None):
    """read(prompt) over a text stream: None at end of input. echo_to(line) shows what was read (for a script's log)."""
    def read(prompt: str) -> str | None:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        try:
            line = stream.readline()
        except KeyboardInterrupt:
            line = ""
        if not line:
            sys.stdout.write("\n")
            return None
        line = line.rstrip("\n")
        if echo_to:
            echo_to(line)
        else:
            sys.stdout.write("\n")
        return line
    return read


def input_reader(prompt: str) -> str | None:
    """read(prompt) with input(): a terminal or a notebook. None at end of input or on Ctrl-C."""
    try:
        return input(prompt)
    except (EOFError, KeyboardInterrupt):
        return None


def run(keys: list[str], seed: int, minutes: float | None = None, questions: int | None = None,
        json_path: str | None = None, stdin=None) -> dict:
    """The `course interview` session on standard input and output; returns its record (and writes it to json_path)."""
    require_solutions()
    stdin = stdin or sys.stdin
    read = input_reader if stdin is sys.stdin and stdin.isatty() else stream_reader(stdin, echo_to=print)
    session = Session(resolve(keys), seed, read, print, minutes=minutes, questions=questions)
    print(f"Mock interview: {len(session.stems)} lesson(s), seed {seed}"
          + (f", {minutes:g} min" if minutes else "") + ". Type 'help' for the commands.")
    record = session.run()
    if json_path:
        with open(json_path, "w") as f:
            json.dump(record, f, indent=2)
        print(f"wrote {json_path}")
    return record


def ask(lesson: str, seed: int | None = None) -> dict | None:
    """One question from `lesson` ('01', 'l02_kv_cache', ...) with its follow-ups, answered with input().
    Returns the session's record, or None (with a message) where the course has no solutions."""
    try:
        require_solutions()
        stem = resolve([lesson])[0]
    except (NeedsFullCourse, KeyError) as e:
        print(e.args[0])
        return None
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    session = Session([stem], seed, input_reader, print, questions=1)
    record = session.run(summary=False)
    print(f"\n(seed {seed}: ask({lesson!r}, seed={seed}) asks the same question again)")
    return record
