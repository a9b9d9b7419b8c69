"""The grader's side of the engine harness (autograder/harnesses/engine.py, which runs in the learner's process):
`stub_guard()` says "not started" before any engine is built, `judged()` gives an engine run's verdict (error ->
finished -> what the check compares -> leak), `stopped()` turns a run that ended in an error into a failure message
that names the mistake when the engine's error reveals it (`known_error`; POLICY_ERRORS: the scheduler's refusals of
a policy), and `step_bound()` caps a learner's run before the reference has run."""
from __future__ import annotations

import contextlib
from typing import Callable

from autograder.mistakes import looks_like


def step_bound(prompts: list, lens: list) -> int:
    """The most steps a learner's run may take, known before the reference has run (the two run at the
    same time): a policy that makes progress computes at least one token a step, and a preemption
    recomputes at most every token once more, so 4x the workload's tokens is more than enough. A policy
    that schedules nothing at all is stopped earlier by the engine's own no-progress error."""
    return 4 * (sum(len(p) for p in prompts) + sum(lens)) + 20


# What the scheduler's RuntimeErrors say a policy did: (phrase in the message, read after "your code").
# Facts the engine checked, not guesses, so a check may name them when no usual mistake matches.
POLICY_ERRORS = [
    ("> max_num_batched_tokens", "admits more tokens than the budget left after the decodes (budget.tokens)"),
    ("but chunked prefill is off", "chunks a prompt although budget.chunked_prefill is False"),
    ("KV blocks, only", "schedules more tokens than the free KV blocks hold (budget.try_take checks them)"),
    ("admitted past max_num_seqs", "admits more requests than there are free batch slots (budget.slots)"),
    ("tokens to", "gives a prompt a number of tokens outside 1 .. num_uncomputed_tokens"),
    ("starved a started prompt", "schedules nothing while a started prompt's next chunk fits and nothing "
                                 "else runs (candidates with is_waiting False need their next chunk)"),
    ("admitted nothing", "schedules nothing while nothing runs and requests wait (a prompt larger than "
                         "the budget left still gets a chunk)"),
    ("not a candidate or appears twice", "returns a sequence twice, or one that is not a candidate"),
]


def stopped(run: dict, known: list[tuple[str, str]] = (), who: str = "your policy") -> str:
    """The failure message for a run that ended in an error ("error" set by catch=True): the mistake
    when a phrase of `known` [(phrase in the error, mistake read after "your code")] is in the error's
    message, then where it stopped and the traceback."""
    named = known_error(run, known)
    return (looks_like(named, ".\n") if named else "") + \
        f"The engine, running {who}, stopped at step {run['steps']}:\n{run['error']['tb']}"


def known_error(run: dict, known: list[tuple[str, str]] = POLICY_ERRORS) -> str | None:
    """The mistake of `known` [(phrase in the error, mistake)] whose phrase the run's error message holds, or None
    (also for a run that did not stop in an error)."""
    err = run["error"]
    return next((m for phrase, m in known if phrase in err["message"]), None) if err is not None else None


@contextlib.contextmanager
def judged(t, run: dict, known: list[tuple[str, str]] = (), who: str = "your policy", unfinished: str | None = None,
           leak: bool = True, on_error: Callable[[dict], str] | None = None):
    """The verdict on an engine run made with catch=True (run_engine, run_speculative, or a harness returning the
    same record: "error", "finished", "steps", "leak"), in the order every engine check gives it: an error ends the
    case (`stopped`, naming a `known` mistake; `on_error(run)`: a message of the check's own instead); then every
    request must have finished (`unfinished`: the message if not); then what the body compares (the tokens, the
    schedule, ...); then no KV block may have leaked (leak=False: a case of its own judges that).

        with judged(t, run, POLICY_ERRORS):
            t.expect(run["tokens"], expected["tokens"], "generated token ids per request")
    """
    if run["error"] is not None:
        t.fail(on_error(run) if on_error else stopped(run, known, who))
    t.expect_true(run["finished"], unfinished or f"the requests did not finish in {run['steps']} steps")
    yield
    if leak:
        t.expect_true(run["leak"] is None, run["leak"] or "")


def stub_guard(t, cls_name: str, *args):
    """A policy stub raises as soon as schedule() is called: find that out before an engine is built
    (seconds), so an untouched exercise is "not started" at once. Anything else this call raises is left
    to the engine runs, which call the policy as the engine does."""
    t.require_started(lambda: t.fn(cls_name)(*args).schedule([], None))
