"""Plain-text tables of results, for terminals and notebooks alike."""
from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the table code needs no torch: `course list` stays instant
    from .runner import CheckResult

PASSED, NOT_GRADED = "passed", "not graded here"

_MARK = {"passed": "ok", "failed": "FAIL", "error": "ERROR", "timeout": "TIMEOUT",
         "crashed": "CRASH", "not started": "todo", "not graded here": "skip", "rejected": "REJECTED"}


# Control characters a learner's output or exception text could carry into a terminal (ESC sequences move the
# cursor and recolour, a carriage return overwrites a line: a fake "score 17/17" could be drawn over the real one).
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0, 9), *range(11, 32), 127)}


def printable(text: str) -> str:
    """`text` with every control character but newline and tab shown as an escape (\\x1b), never obeyed."""
    return text.translate(_CONTROL)


def _pts(x: float) -> str:
    return f"{x:g}"


def check_table(results: list[CheckResult], verbose: bool = False, width: int = 100) -> str:
    name_w = max([len(r.name) for r in results] + [5])
    lines = [f"{'check':<{name_w}}  {'points':>9}  {'status':<15}  message",
             "-" * min(width, name_w + 40)]
    for r in results:
        pts = f"{_pts(r.earned)}/{_pts(r.points)}" if r.graded else f"-/{_pts(r.points)}"
        msg_lines = printable(r.message or "").splitlines() or [""]
        head = msg_lines[0]
        lines.append(f"{r.name:<{name_w}}  {pts:>9}  {r.status:<15}  {head}")
        indent = " " * (name_w + 31)
        rest = msg_lines[1:] if (verbose or r.status != PASSED) else []
        for extra in rest[:25]:
            lines.append(indent + extra)
        if verbose:
            for p in r.parts:
                mark = "pass" if p["passed"] else ("skip" if not p["graded"] else "FAIL")
                first = printable(p["message"] or "").splitlines()[:1]
                lines.append(f"{indent}- [{mark}] {p['label']}" + (f": {first[0]}" if first else ""))
        if r.output and (verbose or r.status != PASSED):
            lines.append(indent + "your code printed:")
            lines.extend(indent + "  " + o for o in printable(r.output).splitlines()[:10])
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
