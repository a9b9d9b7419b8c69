"""Checks for lesson 03: static and continuous batching simulations, the closed-form gain for i.i.d.
output lengths, and scheduler policies run inside the reference engine.

Simulation cases are small hand-made request sets plus hidden ones drawn from t.rng (skewed output
lengths like a trace: many short, a few long; arrivals bunched and spread). Wrong answers are named
by running the usual wrong algorithms (variants below) on the same inputs. The engine checks run the
shipped draft model (the schedule does not depend on the model, and it is three times faster a step)
with the learner's policy (in the learner's process, `harnesses.engine.run_engine`) and, at the same
time (`t.run_against`), here with the reference one on the same prompts (greedy, few KV blocks so that requests get
preempted, with and without chunked prefill), and compare the per-step schedule, the tokens, and
that every KV block is free afterwards; a wrong schedule is named by running the usual wrong
policies here.

The grader's code that computes an answer or a mistake's value (the variants, the drivers, the closed forms,
the policies run here) is `@answer_code` (autograder/reference.py): a student's copy holds its name and
docstring, and replays its results on the visible cases.
"""
from __future__ import annotations

import numbers
import random
from functools import partial
from typing import NamedTuple

from autograder.checks._engine import POLICY_ERRORS, judged, known_error, step_bound, stopped, stub_guard
from autograder.compare import compare
from autograder.core import CaseFailed, check
from autograder.harnesses.engine import run_engine
from autograder.mistakes import looks_like
from autograder.reference import answer_code, recording

# -- request sets -----------------------------------------------------------------------------------


class Request(NamedTuple):
    """The lesson's Request; sent to the learner's code it arrives as their module's Request."""
    arrival: int
    output_len: int


R = Request


def random_requests(rng, n: int, spread: int) -> list:
    """n requests sorted by arrival in [0, spread]; output lengths 1..24, skewed short."""
    arrivals = sorted(rng.randint(0, spread) for _ in range(n))
    lens = [min(24, max(1, int(rng.expovariate(1 / 6)) + 1)) for _ in range(n)]
    return [R(a, l) for a, l in zip(arrivals, lens)]


def describe(reqs, B) -> str:
    return f"B={B}, (arrival, output_len) = {[tuple(r) for r in reqs]}"


def expect_result(t, got, expected, mistakes: dict):
    """Compare a simulate_* dict key by key; `mistakes` maps a name to a whole wrong result dict."""
    t.expect_dict(got, expected, "the result", mistakes, keys=("total_steps", "finish", "slots_used", "occupancy"),
                  rtol=1e-9)
    t.expect_true(isinstance(got["total_steps"], numbers.Integral),
                  f'"total_steps" should be an int, got {type(got["total_steps"]).__name__}')


@answer_code
def _result(finish, slots_used, reqs, B, total=None):
    total = len(slots_used) if total is None else total
    return {"finish": finish, "total_steps": total,
            "occupancy": sum(r.output_len for r in reqs) / (B * total) if total else 0.0,
            "slots_used": slots_used}


def random_case(rng):
    """A hidden simulation case: (requests, B)."""
    B = rng.choice([2, 3, 4, 8])
    return random_requests(rng, rng.randint(B + 1, 4 * B), rng.choice([0, 10, 40])), B


# -- 1.1 static batching ----------------------------------------------------------------------------

@answer_code
def static_variant(reqs, B, wait_arrivals=True, own_end=False, busy_slots=False, occ="B", idle=True):
    finish, used, end, busy_steps, slot_steps = [0] * len(reqs), [], 0, 0, 0
    for k in range(0, len(reqs), B):
        batch = range(k, min(k + B, len(reqs)))
        start = max(end, max(reqs[i].arrival for i in batch)) if wait_arrivals else end
        longest = max(reqs[i].output_len for i in batch)
        used += [0] * (start - end) * idle
        used += [len(batch) if busy_slots else sum(reqs[i].output_len > s for i in batch) for s in range(longest)]
        end = start + longest
        busy_steps += longest
        slot_steps += len(batch) * longest
        for i in batch:
            finish[i] = start + reqs[i].output_len if own_end else end
    res = _result(finish, used, reqs, B)
    useful = sum(r.output_len for r in reqs)
    if occ == "batch":
        res["occupancy"] = useful / slot_steps
    elif occ == "busy":
        res["occupancy"] = useful / (B * busy_steps)
    return res


STATIC_MISTAKES = {
    "starts a batch as soon as the previous one ends, before its requests have arrived":
        dict(wait_arrivals=False),
    "returns each request at its own last token; a static batch returns all its requests together, "
    "when its longest one ends": dict(own_end=True),
    "counts every slot of the batch as useful until the batch ends (slots_used counts only slots "
    "still generating)": dict(busy_slots=True),
    "divides by the slots of each batch actually filled; a short last batch still holds B slots":
        dict(occ="batch"),
    "leaves the idle steps (waiting for arrivals) out of the occupancy's denominator": dict(occ="busy"),
    "records no step while a batch waits for its last arrival (slots_used needs a 0 for each idle step, "
    "and total_steps counts them)": dict(idle=False),
}

STATIC_CASES = [
    ("visible: the docstring example", ([R(0, 1), R(0, 3), R(0, 2)], 2)),
    ("visible: the second batch waits for an arrival", ([R(0, 2), R(0, 4), R(1, 1), R(9, 3), R(9, 2)], 2)),
    ("visible: short last batch", ([R(0, 5), R(0, 1), R(0, 1), R(0, 2), R(0, 3)], 4)),
]


@answer_code
def static_mistakes(reqs, B) -> dict:
    """The usual wrong static-batching results on these inputs, each a whole result dict."""
    return {name: static_variant(reqs, B, **kw) for name, kw in STATIC_MISTAKES.items()}


@check(points=3, section="1.1")
def simulate_static(t):
    """Finish steps, total steps, slot occupancy and per-step useful slots of static batching."""
    for label, (reqs, B) in t.cases(visible=STATIC_CASES, hidden=random_case, n=3):
        with t.case(f"{label}: {describe(reqs, B)}"):
            got, expected = t.both("simulate_static", reqs, B)
            expect_result(t, got, expected, static_mistakes(reqs, B))


# -- 2.1 / 2.2 continuous batching ------------------------------------------------------------------

@answer_code
def step_variant(running, waiting, reqs, B, step, variant=""):
    """The reference step (variant "") and its usual wrong versions; the arguments are left as they are."""
    running, waiting = list(running), list(waiting)
    retired = [rid for rid, left in running if left == 0]
    if variant != "retire_after":
        running = [(rid, left) for rid, left in running if left > 0]
    cap = B + 1 if variant == "beyond_B" else B

    def arrived(rid):
        if variant == "no_arrival":
            return True
        return reqs[rid].arrival < step if variant == "strict_arrival" else reqs[rid].arrival <= step

    while waiting and len(running) < cap and arrived(waiting[0]):
        if variant == "static" and running:
            break
        rid = waiting.pop(0)
        running.append((rid, reqs[rid].output_len))
    if variant == "retire_after":
        running = [(rid, left) for rid, left in running if left > 0]
    return [(rid, left - 1) for rid, left in running], waiting, retired


STEP_MISTAKES = {
    "admits only when the whole batch is empty (that is static batching: fill free slots every step)": "static",
    "retires finished requests after admitting, so a freed slot stays empty for a step": "retire_after",
    "admits beyond B slots (more than B requests run at once)": "beyond_B",
    "ignores arrival times (admits a request before it has arrived)": "no_arrival",
    "admits only requests that arrived before this step (arrival < step); one arriving at this very step "
    "may join (arrival <= step)": "strict_arrival",
}


@answer_code
def drive(reqs, B, variant="", count_last=False, finish_shift=0):
    """simulate_continuous over step_variant; finish_shift=-1 records the step of the last token."""
    running, waiting, finish, used, step = [], list(range(len(reqs))), [0] * len(reqs), [], 0
    while (running or waiting) and step < 10_000:
        running, waiting, retired = step_variant(running, waiting, reqs, B, step, variant)
        for rid in retired:
            finish[rid] = step + finish_shift
        if running or waiting or count_last:
            used.append(len(running))
        step += 1
    return _result(finish, used, reqs, B)


def reachable_state(rng, reqs, B):
    """Run the (grader's copy of the) reference step a random number of steps: a state the scheduler
    can really be in. Drawn without t.ref (in a student's copy, `state_after` is replayed like t.ref)."""
    return state_after(reqs, B, rng.randint(1, max(2, sum(r.output_len for r in reqs) // B)))


@answer_code
def state_after(reqs, B, stop: int):
    """(running, waiting, step): the reference step run from an empty batch for `stop` steps, or until
    every request is done."""
    running, waiting = [], list(range(len(reqs)))
    for step in range(stop):
        if not (running or waiting):
            return running, waiting, step
        running, waiting, _ = step_variant(running, waiting, reqs, B, step)
    return running, waiting, stop


def random_step_case(rng):
    B = rng.choice([2, 3, 4])
    reqs = random_requests(rng, rng.randint(B + 2, 4 * B), rng.choice([0, 8, 20]))
    running, waiting, step = reachable_state(rng, reqs, B)
    return running, waiting, reqs, B, step


STEP_CASES = [
    ("visible: the docstring example", ([(0, 0), (1, 2)], [2, 3], [R(0, 1), R(0, 3), R(0, 3), R(9, 1)], 2, 4)),
    ("visible: one slot frees, one request joins", ([(0, 0), (1, 3), (2, 1)], [3, 4],
                                                    [R(0, 1), R(0, 5), R(0, 2), R(0, 2), R(0, 2)], 3, 1)),
    ("visible: a full batch admits nobody", ([(0, 2), (1, 1)], [2], [R(0, 3), R(0, 2), R(0, 1)], 2, 1)),
    ("visible: the next request has not arrived", ([(0, 0)], [1, 2], [R(0, 1), R(5, 2), R(6, 1)], 4, 1)),
    ("visible: a request arriving at this very step joins", ([(0, 0)], [1, 2], [R(0, 1), R(3, 2), R(4, 1)], 3, 3)),
    ("visible: empty batch, first step", ([], [0, 1, 2], [R(0, 2), R(0, 1), R(0, 4)], 2, 0)),
]


@answer_code
def step_mistakes(running, waiting, reqs, B, step) -> dict:
    """The usual wrong steps on these inputs, each a (running, waiting, retired) tuple."""
    return {name: step_variant(running, waiting, reqs, B, step, v) for name, v in STEP_MISTAKES.items()}


@check(points=3, section="2.1")
def continuous_step(t):
    """One scheduler step: retire, admit FCFS into free slots (arrived only, at most B), decode."""
    for label, (running, waiting, rq, B, step) in t.cases(visible=STEP_CASES, hidden=random_step_case, n=3):
        with t.case(f"{label}: running {running}, waiting {waiting}, B={B}, step={step}, "
                    f"(arrival, output_len) = {[tuple(r) for r in rq]}"):
            got, expected = t.both("continuous_step", running, waiting, rq, B, step)
            t.expect_true(isinstance(got, (tuple, list)) and len(got) == 3,
                          "return a tuple (running, waiting, retired)")
            t.expect(tuple(got), expected, "(running, waiting, retired)",
                     mistakes=step_mistakes(running, waiting, rq, B, step))


CONTINUOUS_CASES = [
    ("visible: the docstring example", ([R(0, 1), R(0, 3), R(0, 2)], 2)),
    ("visible: idle steps before a late arrival", ([R(0, 2), R(0, 1), R(6, 2)], 2)),
    ("visible: more requests than slots", ([R(0, 5), R(0, 1), R(0, 1), R(0, 2), R(1, 3)], 2)),
]


@answer_code
def continuous_mistakes(reqs, B) -> dict:
    mistakes = {name: drive(reqs, B, v) for name, v in STEP_MISTAKES.items()}
    mistakes["counts the last, empty step (it only retires; total_steps = max(finish))"] = \
        drive(reqs, B, count_last=True)
    mistakes["records the step of a request's last token as its finish; a request retired at step s " \
             "finished at the end of step s - 1, so its finish is s"] = drive(reqs, B, finish_shift=-1)
    mistakes["is static batching (simulate_static), not continuous"] = static_variant(reqs, B)
    return mistakes


@answer_code
def step_trace(reqs, B) -> list:
    """[(running, waiting, step, (running, waiting, retired))]: every call of the reference step that the
    reference simulate_continuous makes on these requests, and what it returns."""
    running, waiting, step, calls = [], list(range(len(reqs))), 0, []
    while (running or waiting) and step < 10_000:
        result = step_variant(running, waiting, reqs, B, step)
        calls.append((running, waiting, step, result))
        running, waiting, _ = result
        step += 1
    return calls


@check(points=2, section="2.2")
def simulate_continuous(t):
    """The driver: finish steps, total steps, occupancy and slots used of continuous batching. A wrong result
    that comes from a wrong continuous_step (which the driver calls) is blamed on continuous_step."""
    for label, (reqs, B) in t.cases(visible=CONTINUOUS_CASES, hidden=random_case, n=3):
        with t.case(f"{label}: {describe(reqs, B)}"):
            got, expected = t.both("simulate_continuous", reqs, B)
            mistakes, calls = continuous_mistakes(reqs, B), step_trace(reqs, B)
            if compare(got, expected, rtol=1e-9) is not None:
                t.blame_upstream("simulate_continuous", "continuous_step",
                                 [((running, waiting, reqs, B, step), result) for running, waiting, step, result in calls],
                                 rtol=1e-9)
            expect_result(t, got, expected, mistakes)


# -- 3.1 / 3.2 the closed form ----------------------------------------------------------------------

def random_pmf(rng) -> dict:
    """A skewed discrete distribution: a few lengths, long ones rarer."""
    ks = sorted(rng.sample(range(1, 200), rng.randint(2, 6)))
    ws = [rng.random() / k ** 0.5 for k in ks]
    return {k: w / sum(ws) for k, w in zip(ks, ws)}


def random_pmf_case(rng):
    return random_pmf(rng), rng.choice([2, 4, 8, 16, 32])


@answer_code
def cdf_sum(pmf, B, shift: int):
    """sum over k >= 1 of (1 - F(k - 1 + shift)^B): shift 0 is E[max], shift 1 the off-by-one."""
    top = max(pmf)
    F = lambda x: sum(p for k, p in pmf.items() if k <= x)
    return sum(1 - F(k - 1 + shift) ** B for k in range(1, top + 1))


@answer_code
def dict_order_sum(pmf, B) -> float:
    """The CDF-step sum taken in the dict's own order, as if its keys were sorted."""
    total, cdf, prev = 0.0, 0.0, 0
    for k in pmf:
        total += (k - prev) * (1.0 - cdf ** B)
        cdf += pmf[k]
        prev = k
    return total


@answer_code
def emax_mistakes(pmf, B) -> dict:
    mean = sum(k * p for k, p in pmf.items())
    emin = sum((1 - sum(p for k, p in pmf.items() if k <= j - 1)) ** B for j in range(1, max(pmf) + 1))
    return {"walks the pmf in its dict order, not by increasing length (sort the lengths first)":
                dict_order_sum(pmf, B),
            "returns E[L], ignoring that a batch waits for its longest request": mean,
            "returns the largest possible length, not the expected maximum": float(max(pmf)),
            "is off by one: sums 1 - F(k)^B, which is P(M > k), not P(M >= k)": cdf_sum(pmf, B, 1),
            "computes the expected minimum (1 - (1 - F)^B is the min's CDF; the max's is F^B)": emin}


@answer_code
def gain_mistakes(pmf, B) -> tuple[dict, dict]:
    """The usual wrong "gain" values, and the usual wrong "padding_waste" values."""
    mean, emax = sum(k * p for k, p in pmf.items()), cdf_sum(pmf, B, 0)
    return ({"inverts the gain: continuous over static is E[max] / E[L], not E[L] / E[max]": mean / emax,
             "uses E[L] for the static batch's length (no gain); a batch lasts its longest request": 1.0},
            {"divides the wasted slot-steps by E[L]; the waste is a share of all slot-steps, E[max] per slot":
                (emax - mean) / mean,
             "returns the useful fraction E[L] / E[max], not the wasted one": mean / emax})


EMAX_CASES = [("visible: the docstring example", ({1: 0.5, 3: 0.5}, 2)),
              ("visible: B=1 is the mean", ({2: 0.2, 5: 0.5, 9: 0.3}, 1)),
              ("visible: a rare long request", ({4: 0.9, 100: 0.1}, 8)),
              ("visible: lengths not in increasing order (a dict keeps insertion order)",
               ({9: 0.3, 2: 0.2, 5: 0.5}, 3))]
GAIN_CASES = [EMAX_CASES[0], EMAX_CASES[2]]


def _pmf_label(label, pmf, B) -> str:
    return f"{label}: B={B}, pmf {{{', '.join(f'{k}: {p:.3g}' for k, p in pmf.items())}}}"


@check(points=2, section="3.1")
def expected_max(t):
    """Exact E[max of B i.i.d. lengths] for a discrete length distribution."""
    for label, (pmf, B) in t.cases(visible=EMAX_CASES, hidden=random_pmf_case, n=3):
        with t.case(_pmf_label(label, pmf, B)):
            got, expected = t.both("expected_max", pmf, B)
            t.expect(got, expected, "E[max]", mistakes=emax_mistakes(pmf, B), rtol=1e-9,
                     hint="Compute it exactly from the CDF (no sampling).")


@check(points=2, section="3.2")
def batching_gain(t):
    """Padding waste of static batching and the throughput gain of continuous batching."""
    for label, (pmf, B) in t.cases(visible=GAIN_CASES, hidden=random_pmf_case, n=3):
        with t.case(_pmf_label(label, pmf, B)):
            got, expected = t.both("batching_gain", pmf, B)
            emax = t.ref.expected_max(pmf, B)
            if compare(got, expected, rtol=1e-9) is not None:  # it calls expected_max: is that the wrong one?
                t.blame_upstream("batching_gain", "expected_max", [((pmf, B), emax)], rtol=1e-9)
            t.expect_true(isinstance(got, dict), f"return a dict, got {type(got).__name__}")
            missing = [k for k in expected if k not in got]
            t.expect_true(not missing, f"the dict is missing key(s) {missing}")
            gain, waste = gain_mistakes(pmf, B)
            t.expect(got["gain"], expected["gain"], '"gain"', rtol=1e-9, mistakes=gain)
            t.expect(got["padding_waste"], expected["padding_waste"], '"padding_waste"', rtol=1e-9, mistakes=waste)


# -- 4.1 / 4.2 policies in the engine ---------------------------------------------------------------

class _Fcfs:
    """The reference rule and its usual wrong versions, as engine policies run here (trusted code).

    static_slots: admit only into an empty batch (static batching); skip: let later candidates overtake
    one that does not fit; chunk=False: never chunk; started=False: never continue a started prompt;
    starve: (static) schedule nothing at all while the batch runs, started prompts included."""

    def __init__(self, static_slots=None, skip=False, chunk=True, started=True, starve=False):
        self.static_slots, self.skip, self.chunk = static_slots, skip, chunk
        self.started, self.starve = started, starve

    @answer_code  # called only inside _variant_run (its engine runs it): never a question of its own
    def schedule(self, candidates, budget):
        empty = self.static_slots is None or budget.slots == self.static_slots
        picked = []
        for seq in candidates:
            if not seq.is_waiting and not self.started:
                continue
            if not empty and (seq.is_waiting or self.starve):
                break
            n = seq.num_uncomputed_tokens
            if budget.chunked_prefill and self.chunk:
                n = min(n, budget.tokens)
            if not budget.try_take(seq, n):
                if self.skip:
                    continue
                break
            picked.append((seq, n))
        return picked


def _prompts(rng, n):
    """Short and long prompts mixed, so that a long one at the head may not fit."""
    return [[rng.randrange(1, 2048) for _ in range(rng.choice([rng.randint(8, 20), rng.randint(50, 100)]))]
            for _ in range(n)]


def _chunked_prompts(rng, n):
    """The first prompt (45 tokens) is longer than the 32-token budget: it must be chunked."""
    return [[rng.randrange(1, 2048) for _ in range(45)]] + _prompts(rng, n - 1)


NO_CHUNK = dict(enable_chunked_prefill=False, max_num_batched_tokens=4096)
CHUNK_32 = dict(enable_chunked_prefill=True, max_num_batched_tokens=32)


def _visible(seed, prompts, kw):
    rng = random.Random(seed)
    ps = prompts(rng, 8 if prompts is _prompts else 6)
    return ps, [rng.randint(3, 10) for _ in ps], kw


def engine_cases(t):
    """(label, (prompts, output lengths, engine kwargs)): few KV blocks, so that requests get preempted;
    without chunked prefill, and with it and a prompt longer than the budget (visible), then a hidden
    chunked case drawn from t.rng."""
    visible = [("visible: 8 prompts, B=4, 8 KV blocks of 16 tokens",
                _visible(0, _prompts, dict(max_num_seqs=4, num_blocks=8, **NO_CHUNK))),
               ("visible: chunked prefill, 32-token budget, B=4, 10 KV blocks",
                _visible(1, _chunked_prompts, dict(max_num_seqs=4, num_blocks=10, **CHUNK_32)))]

    def hidden(rng):
        kw = dict(max_num_seqs=rng.choice([3, 4]), num_blocks=rng.choice([10, 12]), **CHUNK_32)
        return _chunked_prompts(rng, 6), [rng.randint(3, 10) for _ in range(6)], kw

    return t.cases(visible=visible, hidden=hidden, n=1)


def _describe(prompts, lens, kw) -> str:
    chunking = f"chunked prefill, {kw['max_num_batched_tokens']}-token budget" if kw["enable_chunked_prefill"] \
        else "no chunked prefill"
    return (f"prompt lengths {[len(p) for p in prompts]}, output lengths {lens}, B={kw['max_num_seqs']}, "
            f"{kw['num_blocks']} KV blocks of 16, {chunking}")


def _outcome(run) -> tuple:
    """How a run ended ("finished", "unfinished", or "stopped: " what stopped the engine), then its schedule."""
    if run["error"] is None:
        return ("finished" if run["finished"] else "unfinished"), run["schedule"]
    msg = run["error"]["message"]
    return "stopped: " + next((p for p, _ in POLICY_ERRORS if p in msg), run["error"]["type"]), run["schedule"]


def _first_difference(got: list, expected: list) -> str:
    for k, (g, e) in enumerate(zip(got, expected)):
        if tuple(g) != tuple(e):
            return f"; step {k}: yours {tuple(g)}, the reference {tuple(e)}"
    return f"; yours has {len(got)} steps, the reference {len(expected)}"


def judge_run(t, run: dict, expected: dict, variants: dict):
    """The learner's run against the reference run. A wrong schedule, or an engine error, is named by the
    one usual wrong policy (`variants`: name -> its run, made here, only now) that does the same; an
    error no variant explains by what the engine's error says the policy did (POLICY_ERRORS)."""
    wrong = {}
    if _outcome(run) != _outcome(expected):
        wrong = {name: _outcome(make()) for name, make in variants.items()}
        if run["error"] is not None:
            named = known_error(run)
            try:
                t.expect(_outcome(run), _outcome(expected), "how your run ended", mistakes=wrong,
                         hint=looks_like(named) if named else "")
            except CaseFailed as e:
                t.fail(f"{e}\n{stopped(run)}")
    with judged(t, run, unfinished=f"the requests did not finish in {run['steps']} steps (the reference needs "
                                   f"{expected['steps']}): does your policy make progress?"):
        t.expect(run["schedule"], expected["schedule"],
                 "the per-step schedule (each step: prompts prefilled, prefill tokens, decodes, preemptions)"
                 + _first_difference(run["schedule"], expected["schedule"]),
                 mistakes={name: sched for name, (end, sched) in wrong.items() if end == "finished"})
        t.expect(run["tokens"], expected["tokens"], "generated token ids per request")


# The policy checks judge the schedule, which does not depend on the model: they run the small draft
# model (three times faster a step than the target), on both sides of every comparison.
MODEL = "draft"


def _static_reference(ref, prompts, lens, kw):
    """The engine run with the reference StaticPolicy (for t.reference: plain data in and out)."""
    return run_engine(prompts, lens, kw, make={"scheduler_policy": (ref.StaticPolicy, kw["max_num_seqs"])}, catch=True,
                      model=MODEL)


def policy_check(t, cls_name: str, static: bool, variants: dict):
    """Run the learner's policy class in the engine on each case and judge it against the reference."""
    stub_guard(t, cls_name, *((4,) if static else ()))
    for label, (prompts, lens, kw) in engine_cases(t):
        with t.case(f"{label}: {_describe(prompts, lens, kw)}"):
            B = kw["max_num_seqs"]
            reference = partial(t.reference, _static_reference, prompts, lens, kw) if static else \
                partial(run_engine, prompts, lens, kw, catch=True, model=MODEL)  # the engine's FCFS
            run, expected = t.run_against(reference, run_engine, prompts, lens, kw,
                                          what="the engine, running your policy,",
                                          make={"scheduler_policy": (t.learner(cls_name), *((B,) if static else ()))},
                                          max_steps=step_bound(prompts, lens), catch=True, model=MODEL)
            steps = 4 * expected["steps"] + 20
            variant_runs = {name: partial(_variant_run, prompts, lens, kw, steps, v(B)) for name, v in variants.items()}
            if recording(t.ref):  # so that a student's copy can name a wrong policy from its store
                for make in variant_runs.values():
                    make()
            judge_run(t, run, expected, variant_runs)


@answer_code
def _variant_run(prompts, lens, kw, max_steps, policy_kwargs):
    """The engine run, here, with one of the usual wrong policies: _Fcfs(**policy_kwargs)."""
    return run_engine(prompts, lens, kw, max_steps=max_steps, catch=True, model=MODEL,
                      make={"scheduler_policy": (partial(_Fcfs, **policy_kwargs),)})


NO_NEXT_CHUNK = "never continues a started prompt: candidates with is_waiting False (partly prefilled) need their next chunk"
OVERTAKE = "lets a later request overtake one that does not fit (FCFS stops at the first that does not fit)"
NEVER_CHUNKS = "never chunks a prompt: with budget.chunked_prefill a prompt takes at most budget.tokens"
STARVES = ("schedules nothing while the batch runs, not even the next chunk of a prompt the batch already "
           "started (candidates with is_waiting False); only new requests wait for an empty batch")

CONTINUOUS_VARIANTS = {  # mistake -> _Fcfs arguments, given B
    "admits only when nothing is running (that is static batching)": lambda B: dict(static_slots=B),
    OVERTAKE: lambda B: dict(skip=True),
    NEVER_CHUNKS: lambda B: dict(chunk=False),
    NO_NEXT_CHUNK: lambda B: dict(started=False)}

STATIC_VARIANTS = {
    "admits while requests are still running (that is continuous batching)": lambda B: dict(),
    OVERTAKE: lambda B: dict(static_slots=B, skip=True),
    STARVES: lambda B: dict(static_slots=B, starve=True),
    NEVER_CHUNKS: lambda B: dict(static_slots=B, chunk=False)}


@check(points=3, section="4.1", timeout=90, cost=0.3)
def continuous_policy(t):
    """ContinuousPolicy in the engine: same schedule and tokens as the engine's FCFS, no leaked blocks."""
    policy_check(t, "ContinuousPolicy", static=False, variants=CONTINUOUS_VARIANTS)


@check(points=2, section="4.2", timeout=90, cost=0.3)
def static_policy(t):
    """StaticPolicy in the engine: admits only into an empty batch, yet keeps chunking the prompts it
    started; same schedule as the reference."""
    policy_check(t, "StaticPolicy", static=True, variants=STATIC_VARIANTS)
