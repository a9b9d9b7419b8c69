"""A mock-interview session: draw questions, read answers, grade, explain, probe, summarize.

Input is read a line at a time from whatever `read` returns (None means end of input), output goes to
`write`, and time comes from `clock`, so a session can run in a terminal, in a notebook, or scripted in
a test. Commands at any prompt: `skip` shows the answer (counted wrong), `quit` ends the session,
`help` lists them. End of input ends the session too; the summary is always printed. An answer that cannot
be read (no number, a unit of another kind, an ambiguous unit) is not graded: its message is printed and
the same question is asked again, so in a scripted session it uses up one line of input.
"""
from __future__ import annotations

import random
import textwrap
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from .. import lessons
from .answer import hint, read
from .question import Numeric, Open, Template, fmt
from .templates import for_lesson, solutions

HELP = ("Type the number, in any notation (12.5, 1,024, 3.5e9, 8.03B), and its unit if you like: '12.5 GB', '40%', "
        "'557 us'. A unit of the same kind as the question's converts exactly (GiB = 2**30 bytes, GB = 1e9 bytes; "
        "ms, s, us; GB/s, Gb/s); one of another kind, or one that could mean two things, is asked again, not "
        "graded. 'skip' shows the answer (counted as wrong), 'quit' ends the session with its summary, 'help' "
        "shows this.")


class _EndOfInput(Exception):
    pass


class _Quit(Exception):
    pass


@dataclass
class Item:
    """One question or follow-up as it went. status: "right", "wrong", "skipped" (numeric), "marked" (open),
    "unanswered" (the session ended while it was asked)."""
    stem: str
    template: str
    kind: str
    follow_up: bool
    prompt: str
    status: str = "unanswered"
    seconds: float = 0.0
    unit: str | None = None
    answer: float | None = None
    rtol: float | None = None
    given: float | None = None
    typed: str | None = None
    read_as: str | None = None
    mistake: str | None = None
    text: str | None = None
    rubric: list[str] = field(default_factory=list)
    hit: list[int] = field(default_factory=list)


def deck(stems: list[str], seed: int) -> list[Template]:
    """Every template of these lessons, shuffled within each lesson, lessons taken in turn (shuffled order)."""
    rng = random.Random(seed)
    piles = {s: rng.sample(for_lesson(s), len(for_lesson(s))) for s in stems}
    order = rng.sample(stems, len(stems))
    out = []
    while any(piles.values()):
        out += [piles[s].pop(0) for s in order if piles[s]]
    return out


def instance(t: Template, seed: int) -> Numeric | Open:
    """The question `t` asks in the session of this seed: the same seed, the same question."""
    return t.build(random.Random(f"{seed}:{t.key}"), solutions(t.stem))


def title(stem: str) -> str:
    lesson = lessons.find(stem)
    return f"{lesson.number:02d} {lesson.title}"


def clock_text(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"


class Session:
    """Runs questions drawn from `stems` with `seed`. minutes: stop asking once this much time has passed (None: no
    limit); questions: how many main questions at most (None: until the deck runs out)."""

    def __init__(self, stems: list[str], seed: int, read: Callable[[str], str | None], write: Callable[[str], None],
                 minutes: float | None = None, questions: int | None = None, clock: Callable[[], float] = time.monotonic):
        self.stems, self.seed, self.read, self.write, self.clock = stems, seed, read, write, clock
        self.questions, self.minutes = questions, minutes
        self.items: list[Item] = []
        self.ended_by = "deck"

    # -- running ------------------------------------------------------------------------------------

    def run(self, summary: bool = True) -> dict:
        self.start = self.clock()
        self.deadline = None if self.minutes is None else self.start + 60 * self.minutes
        templates = deck(self.stems, self.seed)
        if self.questions is not None:
            templates = templates[:self.questions]
        try:
            for i, t in enumerate(templates):
                if self._out_of_time():
                    break
                self._ask(t, instance(t, self.seed), i + 1, len(templates))
        except _EndOfInput:
            self.ended_by = "end of input"
            self.write("\n(end of input)")
        except _Quit:
            self.ended_by = "quit"
        if summary:
            self.write(self.summary_text())
        return self.record()

    def _out_of_time(self) -> bool:
        if self.deadline is not None and self.clock() >= self.deadline:
            self.ended_by = "time"
            self.write(f"\nTime is up ({self.minutes:g} min).")
            return True
        return False

    def _ask(self, t: Template, q: Numeric | Open, number: int, total: int) -> None:
        left = "" if self.deadline is None else f" | {clock_text(max(0.0, self.deadline - self.clock()))} left"
        self.write(f"\n-- Question {number} of {total} | {title(t.stem)}{left}")
        if isinstance(q, Open):
            self._open(t, q)
            return
        self._numeric(t, q, follow_up=False)
        for f in q.follow_ups:
            if self._out_of_time():
                return
            self._numeric(t, f, follow_up=True)

    def _say(self, text: str, indent: str = "") -> None:
        for para in text.split("\n"):
            self.write(textwrap.fill(para, width=100, initial_indent=indent, subsequent_indent=indent + "  ")
                       if len(para) > 100 else indent + para)

    def _line(self) -> str:
        line = self.read("> ")
        if line is None:
            raise _EndOfInput
        word = line.strip().lower()
        if word in ("quit", "exit"):
            raise _Quit
        return line

    def _numeric(self, t: Template, q: Numeric, follow_up: bool) -> None:
        item = Item(t.stem, t.name, "numeric", follow_up, q.prompt, unit=q.unit, answer=q.answer, rtol=q.rtol)
        self.items.append(item)
        self._say(("Follow-up: " if follow_up else "") + q.prompt)
        note = hint(q.unit)
        self.write(f"Answer in {q.unit or 'a plain number'} ({q.tolerance()}{'; ' + note if note else ''}).")
        start = self.clock()
        while True:
            line = self._line()
            if line.strip().lower() in ("help", "?"):
                self.write(HELP)
                continue
            if line.strip().lower() == "skip":
                item.status = "skipped"
                break
            reading = read(line, q.unit)
            if reading.problem:
                self.write(reading.problem)
                continue
            item.given, item.typed, item.read_as = reading.value, line.strip(), reading.shown
            item.status = "right" if q.grade(reading.value) else "wrong"
            item.mistake = None if item.status == "right" else q.mistake(reading.value)
            break
        item.seconds = self.clock() - start
        unit = f" {q.unit}" if q.unit else ""
        if item.status == "right":
            self.write(f"Right: {item.read_as}; the reference answer is {fmt(q.answer)}{unit}.")
        elif item.status == "wrong":
            self.write(f"Not quite: {item.read_as}; the answer is {fmt(q.answer)}{unit} ({q.tolerance()})."
                       + (f" Your answer is what you get if your reasoning {item.mistake}." if item.mistake else ""))
        else:
            self.write(f"Skipped: the answer is {fmt(q.answer)}{unit}.")
        self.write("Worked answer:")
        for k, step in enumerate(q.steps, 1):
            self._say(f"{k}. {step}", indent="  ")
        self._say(f"Intuition: {q.why}")

    def _open(self, t: Template, q: Open) -> None:
        item = Item(t.stem, t.name, "open", False, q.prompt, rubric=list(q.rubric))
        self.items.append(item)
        self._say(q.prompt)
        self.write("Answer in words, on one line (not graded: you will mark it against the key points). 'skip' to see them.")
        start = self.clock()
        while True:
            line = self._line()
            if line.strip():
                break
            self.write("Type your answer on one line, or 'skip'.")
        skipped = line.strip().lower() == "skip"
        item.text = None if skipped else line.strip()
        self.write("Key points an interviewer listens for:")
        for k, point in enumerate(q.rubric, 1):
            self._say(f"{k}. {point}", indent="  ")
        if not skipped:
            self.write("Which did your answer cover? Type their numbers (e.g. 1 3), 'all' or 'none'.")
            item.hit = self._marks(len(q.rubric))
        item.status = "skipped" if skipped else "marked"
        item.seconds = self.clock() - start
        self._say(f"Intuition: {q.why}")

    def _marks(self, n: int) -> list[int]:
        while True:
            words = self._line().replace(",", " ").lower().split()
            if words == ["all"]:
                return list(range(1, n + 1))
            if words in (["none"], ["0"]):
                return []
            if words and all(w.isdigit() and 1 <= int(w) <= n for w in words):
                return sorted({int(w) for w in words})
            self.write(f"Type point numbers from 1 to {n} separated by spaces, 'all' or 'none'.")

    # -- reporting ----------------------------------------------------------------------------------

    def per_lesson(self) -> dict[str, dict]:
        out = {}
        for stem in self.stems:
            its = [i for i in self.items if i.stem == stem]
            num = [i for i in its if i.kind == "numeric"]
            opens = [i for i in its if i.kind == "open" and i.status == "marked"]
            out[stem] = {"right": sum(i.status == "right" for i in num),
                         "wrong": sum(i.status in ("wrong", "skipped") for i in num),
                         "seconds": sum(i.seconds for i in its),
                         "points_marked": sum(len(i.hit) for i in opens),
                         "points": sum(len(i.rubric) for i in opens),
                         "asked": len(its)}
        return out

    def revisit(self) -> list[str]:
        """Lessons with a wrong or skipped numeric answer, or fewer than half of their key points self-marked."""
        return [s for s, v in self.per_lesson().items()
                if v["wrong"] or (v["points"] and v["points_marked"] < v["points"] / 2)]

    def summary_text(self) -> str:
        rows = self.per_lesson()
        asked = [s for s in self.stems if rows[s]["asked"]]
        right, wrong = sum(v["right"] for v in rows.values()), sum(v["wrong"] for v in rows.values())
        marked, points = sum(v["points_marked"] for v in rows.values()), sum(v["points"] for v in rows.values())
        unanswered = sum(i.status == "unanswered" for i in self.items)
        ended = {"deck": "every question asked", "time": "time limit", "quit": "quit",
                 "end of input": "end of input"}[self.ended_by]
        lines = ["", f"== Session summary (seed {self.seed}; {clock_text(self.clock() - self.start)}; ended: {ended})",
                 f"{'lesson':<52}{'right':>6}{'wrong':>6}{'time':>9}   key points (self-marked)"]
        for s in asked:
            v = rows[s]
            pts = f"{v['points_marked']}/{v['points']}" if v["points"] else "-"
            lines.append(f"{title(s):<52}{v['right']:>6}{v['wrong']:>6}{clock_text(v['seconds']):>9}   {pts}")
        lines.append(f"Numeric answers: {right} right, {wrong} wrong or skipped, each graded against its stated tolerance.")
        if points:
            lines.append(f"Open answers, marked by you and not graded: {marked} of {points} key points covered.")
        if unanswered:
            lines.append(f"{unanswered} question(s) left unanswered when the session ended.")
        again = self.revisit()
        lines.append("Revisit: " + ("; ".join(f"{title(s)} (lessons/{s}.ipynb)" for s in again) if again
                                    else "nothing this time." if asked else "no questions were answered."))
        lines.append(f"Same questions again: course interview --seed {self.seed} "
                     + " ".join(f"{lessons.find(s).number:02d}" for s in self.stems))
        return "\n".join(lines)

    def record(self) -> dict:
        """Everything the session did, as plain data (what --json writes)."""
        return {"seed": self.seed, "lessons": self.stems, "minutes": self.minutes, "ended_by": self.ended_by,
                "per_lesson": self.per_lesson(), "revisit": self.revisit(),
                "items": [asdict(i) for i in self.items]}
