"""The learner side of lesson 10's checks (autograder/harnesses/__init__.py): the learner's kpa_decide driven tick
by tick over a scenario in one round trip (drive_kpa, which the grader runs with the reference and the usual wrong
versions too), and the learner's simulate_fleet called with a check that it leaves its jobs alone."""
from __future__ import annotations

from typing import NamedTuple

from autograder.harnesses import harness


class KPAState(NamedTuple):
    panic_since: float | None = None
    max_panic: int = 0
    recent: tuple = ()


def drive_kpa(decide, conc, ready, cfg, tick=2.0):
    """The decisions of `decide` over a scenario: at tick k (time (k + 1) * tick) the samples so far."""
    state, samples, out = KPAState(), [], []
    for k, (c, r) in enumerate(zip(conc, ready)):
        samples.append(((k + 1) * tick, float(c)))
        d, state = decide(list(samples), (k + 1) * tick, r, cfg, state)
        out.append(d)
    return out


@harness
def drive_learner_kpa(decide, conc, ready, cfg) -> dict:
    """(A harness: runs in the learner's process.) drive_kpa with the learner's kpa_decide, every tick in one
    round trip: {"decisions": [desired per tick], "problem": None}, or decisions None and the problem (a reply
    that is not a (desired, state) pair, or a call that edited its samples list) at the tick it happened."""
    def checked(samples, now, r, c, state):
        before = list(samples)
        value = decide(samples, now, r, c, state)
        if samples != before:
            raise _Problem(f"kpa_decide() modified its argument #1 (the samples) in place at t = {now}; callers "
                           "still need the original: work on a copy")
        if not (isinstance(value, tuple) and len(value) == 2):
            raise _Problem(f"kpa_decide should return (desired, KPAState), got {str(value)[:80]}")
        return value
    try:
        return {"decisions": drive_kpa(checked, conc, ready, cfg), "problem": None}
    except _Problem as e:
        return {"decisions": None, "problem": str(e)}


class _Problem(Exception):
    """A reply the check cannot use, found in the learner's process by drive_learner_kpa."""


@harness
def simulate_unmodified(simulate_fleet, jobs, fleet, scaler) -> dict:
    """(A harness: runs in the learner's process.) {"sim": simulate_fleet(jobs, fleet, scaler), "modified":
    whether the call changed the jobs list} (fleet and scaler are NamedTuples: they cannot change)."""
    before = list(jobs)
    sim = simulate_fleet(jobs, fleet, scaler)
    return {"sim": sim, "modified": list(jobs) != before}
