"""Plain-text tables of results, for terminals and notebooks alike."""
from __future__ import annotations

import dataclasses
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the table code needs no torch: `course list` stays instant
    from .core import CheckResult

PASSED, NOT_GRADED = "passed", "not graded here"

_MARK = {"passed": "ok", "failed": "FAIL", "error": "ERROR", "timeout": "TIMEOUT",
         "crashed": "CRASH", "not started": "todo", "not graded here": "skip", "rejected": "REJECTED"}


# Control characters a learner's output or exception text could carry into a terminal (ESC sequences move the
# cursor and recolour, a carriage return overwrites a line: a fake "score 17/17" could be drawn over the real one).
# Also C1 controls (U+009B is a one-character ESC [), the bidirectional overrides (U+202E reverses what follows),
# and lone surrogates (a terminal cannot encode them: printing one raised, and the report was lost).
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0, 9), *range(11, 32), *range(127, 160))}
_CONTROL.update({c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), *range(0xD800, 0xE000))})


def printable(text: str) -> str:
    """`text` with every control character but newline and tab shown as an escape (\\x1b), never obeyed."""
    return text.translate(_CONTROL)


def _pts(x: float) -> str:
    return f"{x:g}"


def check_table(results: list[CheckResult], verbose: bool = False, width: int = 100,
                for_student: bool = False) -> str:
    """The results as a table. for_student=True (nbgrader's feedback): a hidden case is shown by its own label
    ("hidden 2") and how it ended, never by its message or its full label (which may hold its inputs and
    expected values: student_message), and what the learner's code printed is left out of a check that ran
    hidden cases (it could print their inputs)."""
    name_w = max([len(r.name) for r in results] + [5])
    lines = [f"{'check':<{name_w}}  {'points':>9}  {'status':<15}  message",
             "-" * min(width, name_w + 40)]
    for r in results:
        parts = parts_of(r)
        pts = f"{_pts(r.earned)}/{_pts(r.points)}" if r.graded else f"-/{_pts(r.points)}"
        msg_lines = printable((student_message(r) if for_student else r.message) or "").splitlines() or [""]
        head = msg_lines[0]
        lines.append(f"{r.name:<{name_w}}  {pts:>9}  {r.status:<15}  {head}")
        indent = " " * (name_w + 31)
        rest = msg_lines[1:] if (verbose or r.status != PASSED) else []
        for extra in rest[:25]:
            lines.append(indent + extra)
        if verbose:
            for p in parts:
                mark = "pass" if p["passed"] else ("skip" if not p["graded"] else "FAIL")
                secret = for_student and p.get("hidden")
                first = [] if secret else printable(p["message"] or "").splitlines()[:1]
                label = p["hidden"] if secret else p["label"]
                lines.append(f"{indent}- [{mark}] {label}" + (f": {first[0]}" if first else ""))
        if r.output and (verbose or r.status != PASSED):
            if for_student and ran_hidden(r):
                lines.append(indent + "(what your code printed is not shown: it ran hidden cases)")
            else:
                lines.append(indent + "your code printed:")
                lines.extend(indent + "  " + o for o in printable(r.output).splitlines()[:10])
    return "\n".join(lines)


# How a failed hidden case ended (Part.kind), and how a check that stopped in one ended (its status): all a student
# is told of a hidden case.
_HIDDEN_ENDED = {"wrong": "failed", "raised": "your code raised an exception"}
_HIDDEN_STOPPED = {"timeout": "your code was still running at the check's time limit",
                   "crashed": "your code crashed its process", "error": "the check stopped with an error there",
                   "not started": "your code still raises NotImplementedError"}
HIDDEN_NOTE = "a hidden case's inputs and expected values are not shown"


def _part(p) -> dict:
    """A part as a dict (results read back from a second grader hold core.Part objects)."""
    return p if isinstance(p, dict) else dataclasses.asdict(p)


def parts_of(r: CheckResult) -> list[dict]:
    """A check's cases (core.Part) as dicts: label, hidden (its "hidden N" label, or ""), graded, passed, kind,
    weight, message."""
    return [_part(p) for p in r.parts]


def hidden_failures(failed: list[dict]) -> str:
    """All a student is told of failed hidden cases: each by its own label and how it ended."""
    return "; ".join(f"{p['hidden']}: {_HIDDEN_ENDED.get(p['kind'], 'failed')}" for p in failed) + f" ({HIDDEN_NOTE})"


def ran_hidden(r: CheckResult) -> bool:
    return bool(r.hidden_case) or any(p.get("hidden") for p in parts_of(r))


def student_message(r: CheckResult) -> str:
    """`r.message` as a student may see it: the same, unless a hidden case failed or the check stopped in one.
    Then: each such case by its own label and how it ended; the check's message only if it names no failed
    hidden case (when it does, the first failed visible case's instead); never a hidden case's message."""
    failed = [p for p in parts_of(r) if p["graded"] and not p["passed"]]
    secret = [p for p in failed if p.get("hidden")]
    if not secret and not r.hidden_case:
        return r.message
    lines = []
    if r.hidden_case:
        lines.append(f"{r.hidden_case}: {_HIDDEN_STOPPED.get(r.status, r.status)} ({HIDDEN_NOTE})")
    if secret:
        lines.append(hidden_failures(secret))
    names_secret = any(text and text in (r.message or "") for p in secret for text in (p["label"], p["message"]))
    if not r.hidden_case and not names_secret:
        lines.append(r.message)
    elif shown := [p for p in failed if not p.get("hidden")]:
        lines.append(f"{shown[0]['label']}: {shown[0]['message']}")
    return "\n".join(lines)


def totals(results: list[CheckResult]) -> tuple[float, float, float]:
    """(earned, possible among graded checks, points not graded here)."""
    earned = sum(r.earned for r in results if r.graded)
    possible = sum(r.points for r in results if r.graded)
    skipped = sum(r.points for r in results if r.status == NOT_GRADED)
    return round(earned, 2), round(possible, 2), round(skipped, 2)


def not_graded_why(results: list[CheckResult]) -> str:
    """What the checks not graded here need: "a GPU", "Triton", or both (decided by their messages, which the
    grader writes: "needs a CUDA GPU", "Triton is not available on this platform ...")."""
    needs = {"Triton" if "Triton" in (r.message or "") else "a GPU" for r in results if r.status == NOT_GRADED}
    return " or ".join(sorted(needs, reverse=True)) or "a GPU"


def summary_line(results: list[CheckResult]) -> str:
    earned, possible, skipped = totals(results)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    line = f"score {_pts(earned)}/{_pts(possible)} ({parts})"
    if skipped:
        line += f"; {_pts(skipped)} points not graded here (need {not_graded_why(results)})"
    return line


def wrap(text: str, width: int = 100) -> str:
    return "\n".join(textwrap.fill(p, width) for p in text.split("\n"))
