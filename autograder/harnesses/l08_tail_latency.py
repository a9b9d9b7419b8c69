"""The learner side of lesson 08's checks (autograder/harnesses/__init__.py): a replay travels to the learner's
process as numpy columns (a few blobs on the wire instead of thousands of small dicts), is rebuilt there as plain
dicts, and the learner's function is called on it once per call spec, in one round trip (call_on_replay)."""
from __future__ import annotations

import numpy as np

from autograder.harnesses import harness

STEP_FIELDS = ("start", "end", "prefill_tokens", "decode_tokens", "preempted", "running", "waiting")
REQUEST_FIELDS = ("arrival", "first_scheduled", "finish", "num_preemptions", "prompt_tokens", "replica")


def to_columns(data: dict) -> dict:
    """A replay's records as numpy columns (a few blobs on the wire instead of thousands of small dicts):
    each step field per replica, each request field, and the token times flat with their counts."""
    rs = data["requests"]
    return {"steps": [{k: np.array([s[k] for s in steps]) for k in STEP_FIELDS} for steps in data["steps"]],
            "requests": {k: np.array([r[k] for r in rs]) for k in REQUEST_FIELDS},
            "token_times": np.array([x for r in rs for x in r["token_times"]]),
            "num_tokens": np.array([len(r["token_times"]) for r in rs])}


def from_columns(cols: dict) -> tuple[list[dict], list[list[dict]]]:
    """to_columns undone: (requests, steps_by_replica) as plain dicts of Python floats and ints, equal to
    the replay's records (tolist() gives back the very floats)."""
    steps = [[dict(zip(STEP_FIELDS, row)) for row in zip(*(c[k].tolist() for k in STEP_FIELDS))]
             for c in cols["steps"]]
    times, counts = cols["token_times"].tolist(), cols["num_tokens"].tolist()
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    rows = zip(*(cols["requests"][k].tolist() for k in REQUEST_FIELDS))
    requests = []
    for i, row in enumerate(rows):
        r = dict(zip(REQUEST_FIELDS, row))
        r["token_times"] = times[bounds[i]:bounds[i + 1]]
        requests.append({k: r[k] for k in ("arrival", "first_scheduled", "token_times", "finish",
                                            "num_preemptions", "prompt_tokens", "replica")})
    return requests, steps


@harness
def call_on_replay(fn, cols: dict, calls: list) -> list:
    """Harness (runs in the learner's process): `fn` called once per entry of `calls` on the replay `cols`,
    in one round trip. An entry is a list of arguments, each a literal or one of ["$request", i] (request
    i), ["$steps_of", i] (the steps of request i's replica), ["$requests"] and ["$steps"] (all of them).
    Every call gets fresh records, so a call that edits its arguments cannot change the next one. Returns
    [value, index of the first argument the call changed or None] per call."""
    out = []
    for spec in calls:
        requests, steps = from_columns(cols)
        args = [_resolve(a, requests, steps) for a in spec]
        value = fn(*args)
        fresh = [_resolve(a, *from_columns(cols)) for a in spec]
        changed = next((i for i, (a, b) in enumerate(zip(args, fresh)) if a != b), None)
        out.append([value, changed])
    return out


def _resolve(arg, requests, steps):
    if isinstance(arg, list) and arg and isinstance(arg[0], str) and arg[0].startswith("$"):
        kind = arg[0]
        if kind == "$request":
            return requests[arg[1]]
        if kind == "$steps_of":
            return steps[requests[arg[1]]["replica"]]
        return requests if kind == "$requests" else steps
    return arg
