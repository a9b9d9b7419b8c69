"""The learner side of the checks: harness functions that run in a learner process.

A check (autograder/checks/) runs in the grader. When it needs something only the learner's process can
observe (the engine with a learner's component plugged in, the bytes a learner's loader reads, the shapes a
learner's function builds), it asks that process to run a harness function from here:
`t.run(harness_fn, *args)` / `t.run_against(reference, harness_fn, *args)` (autograder/core.py). The process
imports the harness's module and calls it; what comes back is plain data, which the check judges.

The rule: a learner process may not import anything under `autograder.checks` (an import hook refuses it) nor
read those files (Landlock), so that the checks' expected values, mistake models and reference code stay out of
its reach. It may read autograder/'s top-level modules and this package. So a module here:

- imports neither `autograder.checks` nor `solutions` (tests/test_harness_boundary.py scans and imports each);
- holds no code that computes a lesson's expected answer (no reference implementation, no mistake variants):
  only drivers, instrumentation and case inputs, which a learner may read without gaining a point;
- is named after the lesson it serves (`l04_paged_attention.py`), or after what several lessons share
  (`engine.py`: the engine runs; `server.py`: the streaming server).

A check imports what it shares with its harness from here (the grader may import harnesses; a learner process
may not import checks). The grader's own side of a shared harness lives beside the checks
(autograder/checks/_engine.py for engine.py).

Every function a check runs there is marked `@harness`: a learner process runs nothing else that a request
names (learner_side.op_harness), and the grader sends nothing else (core.Trial.run): the trust boundary is
declared where the code is, not kept by convention.
"""
from __future__ import annotations

from collections.abc import Callable

MARK = "__course_harness__"


def harness(fn: Callable) -> Callable:
    """Mark fn as a harness: a function the grader may ask a learner process to run."""
    setattr(fn, MARK, True)
    return fn


def is_harness(fn) -> bool:
    return getattr(fn, MARK, False) is True
