"""Checks for lesson 03: static and continuous batching simulations, the closed-form gain for i.i.d.
output lengths, and scheduler policies run inside the reference engine.

Simulation cases are small hand-made request sets plus hidden ones drawn from t.rng (skewed output
lengths like a trace: many short, a few long; arrivals bunched and spread). Wrong answers are named
by running the usual wrong algorithms (variants below) on the same inputs. The engine checks run the
shipped target model with the learner's policy and with the reference one on the same prompts
(greedy, few KV blocks so that requests get preempted) and compare the per-step schedule, the tokens,
and that every KV block is free afterwards.
"""
from __future__ import annotations

import numbers

import torch

from autograder.compare import compare
from autograder.core import check

# The engine builds its model on the meta device, which makes torch import its compiler stack
# (seconds). Do it once here, in the grader's parent process, so each forked check starts warm.
with torch.device("meta"):
    torch.nn.Embedding(1, 1)

# -- request sets -----------------------------------------------------------------------------------


def R(arrival, output_len):
    from solutions.l03_continuous_batching import Request
    return Request(arrival, output_len)


def random_requests(rng, n: int, spread: int) -> list:
    """n requests sorted by arrival in [0, spread]; output lengths 1..24, skewed short."""
    arrivals = sorted(rng.randint(0, spread) for _ in range(n))
    lens = [min(24, max(1, int(rng.expovariate(1 / 6)) + 1)) for _ in range(n)]
    return [R(a, l) for a, l in zip(arrivals, lens)]


def merged(mistakes: dict) -> dict:
    """Mistakes that give the same wrong value on this case are named together (either may be it)."""
    out: dict = {}
    for name, wrong in mistakes.items():
        same = next((k for k, v in out.items() if compare(wrong, v, rtol=1e-9) is None), None)
        if same is None:
            out[name] = wrong
        else:
            out[f"{same}; or your code {name}"] = out.pop(same)
    return out


def describe(reqs, B) -> str:
    return f"B={B}, (arrival, output_len) = {[tuple(r) for r in reqs]}"


def expect_result(t, got, expected, mistakes: dict):
    """Compare a simulate_* dict key by key; `mistakes` maps a name to a whole wrong result dict."""
    t.expect_true(isinstance(got, dict), f"return a dict, got {type(got).__name__}")
    missing = [k for k in expected if k not in got]
    t.expect_true(not missing, f"the dict is missing key(s) {missing}")
    done = []
    for key in ("total_steps", "finish", "slots_used", "occupancy"):
        # A mistake that would have shown in a key already passed does not explain this one.
        t.expect(got[key], expected[key], f'"{key}"', rtol=1e-9,
                 mistakes=merged({name: wrong[key] for name, wrong in mistakes.items()
                                  if wrong[key] != expected[key] and all(wrong[k] == expected[k] for k in done)}))
        done.append(key)
    t.expect_true(isinstance(got["total_steps"], numbers.Integral),
                  f'"total_steps" should be an int, got {type(got["total_steps"]).__name__}')


def _result(finish, slots_used, reqs, B, total=None):
    total = len(slots_used) if total is None else total
    return {"finish": finish, "total_steps": total,
            "occupancy": sum(r.output_len for r in reqs) / (B * total) if total else 0.0,
            "slots_used": slots_used}


# -- 1.1 static batching ----------------------------------------------------------------------------

def static_variant(reqs, B, wait_arrivals=True, own_end=False, busy_slots=False, occ="B"):
    finish, used, end, busy_steps, slot_steps = [0] * len(reqs), [], 0, 0, 0
    for k in range(0, len(reqs), B):
        batch = range(k, min(k + B, len(reqs)))
        start = max(end, max(reqs[i].arrival for i in batch)) if wait_arrivals else end
        longest = max(reqs[i].output_len for i in batch)
        used += [0] * (start - end)
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
}


@check(points=3, section="1.1")
def simulate_static(t):
    """Finish steps, total steps, slot occupancy and per-step useful slots of static batching."""
    cases = [("visible: the docstring example", [R(0, 1), R(0, 3), R(0, 2)], 2),
             ("visible: the second batch waits for an arrival", [R(0, 2), R(0, 4), R(1, 1), R(9, 3), R(9, 2)], 2),
             ("visible: short last batch", [R(0, 5), R(0, 1), R(0, 1), R(0, 2), R(0, 3)], 4)]
    for _ in range(3):
        B = t.rng.choice([2, 3, 4, 8])
        cases.append(("hidden", random_requests(t.rng, t.rng.randint(B + 1, 4 * B), t.rng.choice([0, 10, 40])), B))
    for label, reqs, B in cases:
        with t.case(f"{label}: {describe(reqs, B)}"):
            expected = t.ref.simulate_static(reqs, B)
            got = t.call("simulate_static", reqs, B)
            expect_result(t, got, expected, {name: static_variant(reqs, B, **kw) for name, kw in STATIC_MISTAKES.items()})


# -- 2.1 / 2.2 continuous batching ------------------------------------------------------------------

def step_variant(running, waiting, reqs, B, step, variant=""):
    """The reference step and its usual wrong versions."""
    retired = [rid for rid, left in running if left == 0]
    if variant != "retire_after":
        running = [(rid, left) for rid, left in running if left > 0]
    waiting = list(waiting)
    cap = B + 1 if variant == "beyond_B" else B
    while waiting and len(running) < cap and (variant == "no_arrival" or reqs[waiting[0]].arrival <= step):
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
}


def drive(reqs, B, variant="", count_last=False):
    """simulate_continuous over step_variant."""
    running, waiting, finish, used, step = [], list(range(len(reqs))), [0] * len(reqs), [], 0
    while (running or waiting) and step < 10_000:
        running, waiting, retired = step_variant(running, waiting, reqs, B, step, variant)
        for rid in retired:
            finish[rid] = step
        if running or waiting or count_last:
            used.append(len(running))
        step += 1
    return _result(finish, used, reqs, B)


def reachable_state(t, reqs, B):
    """Run the reference a random number of steps: a state the scheduler can really be in."""
    running, waiting = [], list(range(len(reqs)))
    stop = t.rng.randint(1, max(2, sum(r.output_len for r in reqs) // B))
    for step in range(stop):
        if not (running or waiting):
            return running, waiting, step
        running, waiting, _ = t.ref.continuous_step(running, waiting, reqs, B, step)
    return running, waiting, stop


@check(points=3, section="2.1")
def continuous_step(t):
    """One scheduler step: retire, admit FCFS into free slots (arrived only, at most B), decode."""
    reqs = [R(0, 1), R(0, 3), R(0, 3), R(9, 1)]
    cases = [("visible: the docstring example", [(0, 0), (1, 2)], [2, 3], reqs, 2, 4),
             ("visible: one slot frees, one request joins", [(0, 0), (1, 3), (2, 1)], [3, 4],
              [R(0, 1), R(0, 5), R(0, 2), R(0, 2), R(0, 2)], 3, 1),
             ("visible: a full batch admits nobody", [(0, 2), (1, 1)], [2], [R(0, 3), R(0, 2), R(0, 1)], 2, 1),
             ("visible: the next request has not arrived", [(0, 0)], [1, 2], [R(0, 1), R(5, 2), R(6, 1)], 4, 1),
             ("visible: empty batch, first step", [], [0, 1, 2], [R(0, 2), R(0, 1), R(0, 4)], 2, 0)]
    for _ in range(3):
        B = t.rng.choice([2, 3, 4])
        hreqs = random_requests(t.rng, t.rng.randint(B + 2, 4 * B), t.rng.choice([0, 8, 20]))
        running, waiting, step = reachable_state(t, hreqs, B)
        cases.append(("hidden: a state reached by the scheduler", running, waiting, hreqs, B, step))
    for label, running, waiting, rq, B, step in cases:
        with t.case(f"{label}: running {running}, waiting {waiting}, B={B}, step={step}, "
                    f"(arrival, output_len) = {[tuple(r) for r in rq]}"):
            expected = t.ref.continuous_step(running, waiting, rq, B, step)
            got = t.call("continuous_step", running, waiting, rq, B, step)
            t.expect_true(isinstance(got, (tuple, list)) and len(got) == 3,
                          "return a tuple (running, waiting, retired)")
            wrong = {name: step_variant(running, waiting, rq, B, step, v) for name, v in STEP_MISTAKES.items()}
            t.expect(tuple(got), expected, "(running, waiting, retired)",
                     mistakes=merged({n: w for n, w in wrong.items() if w != expected}))


@check(points=2, section="2.2")
def simulate_continuous(t):
    """The driver: finish steps, total steps, occupancy and slots used of continuous batching."""
    cases = [("visible: the docstring example", [R(0, 1), R(0, 3), R(0, 2)], 2),
             ("visible: idle steps before a late arrival", [R(0, 2), R(0, 1), R(6, 2)], 2),
             ("visible: more requests than slots", [R(0, 5), R(0, 1), R(0, 1), R(0, 2), R(1, 3)], 2)]
    for _ in range(3):
        B = t.rng.choice([2, 3, 4, 8])
        cases.append(("hidden", random_requests(t.rng, t.rng.randint(B + 1, 4 * B), t.rng.choice([0, 10, 40])), B))
    for label, reqs, B in cases:
        with t.case(f"{label}: {describe(reqs, B)}"):
            expected = t.ref.simulate_continuous(reqs, B)
            got = t.call("simulate_continuous", reqs, B)
            mistakes = {name: drive(reqs, B, v) for name, v in STEP_MISTAKES.items()}
            mistakes["counts the last, empty step (it only retires; total_steps = max(finish))"] = \
                drive(reqs, B, count_last=True)
            mistakes["is static batching (simulate_static), not continuous"] = t.ref.simulate_static(reqs, B)
            expect_result(t, got, expected, mistakes)


# -- 3.1 / 3.2 the closed form ----------------------------------------------------------------------

def random_pmf(rng) -> dict:
    """A skewed discrete distribution: a few lengths, long ones rarer."""
    ks = sorted(rng.sample(range(1, 200), rng.randint(2, 6)))
    ws = [rng.random() / k ** 0.5 for k in ks]
    return {k: w / sum(ws) for k, w in zip(ks, ws)}


def cdf_sum(pmf, B, shift: int):
    """sum over k >= 1 of (1 - F(k - 1 + shift)^B): shift 0 is E[max], shift 1 the off-by-one."""
    top = max(pmf)
    F = lambda x: sum(p for k, p in pmf.items() if k <= x)
    return sum(1 - F(k - 1 + shift) ** B for k in range(1, top + 1))


def emax_mistakes(pmf, B) -> dict:
    mean = sum(k * p for k, p in pmf.items())
    emin = sum((1 - sum(p for k, p in pmf.items() if k <= j - 1)) ** B for j in range(1, max(pmf) + 1))
    return {"returns E[L], ignoring that a batch waits for its longest request": mean,
            "returns the largest possible length, not the expected maximum": float(max(pmf)),
            "is off by one: sums 1 - F(k)^B, which is P(M > k), not P(M >= k)": cdf_sum(pmf, B, 1),
            "computes the expected minimum (1 - (1 - F)^B is the min's CDF; the max's is F^B)": emin}


@check(points=2, section="3.1")
def expected_max(t):
    """Exact E[max of B i.i.d. lengths] for a discrete length distribution."""
    cases = [("visible: the docstring example", {1: 0.5, 3: 0.5}, 2),
             ("visible: B=1 is the mean", {2: 0.2, 5: 0.5, 9: 0.3}, 1),
             ("visible: a rare long request", {4: 0.9, 100: 0.1}, 8)]
    for _ in range(3):
        cases.append(("hidden", random_pmf(t.rng), t.rng.choice([2, 4, 8, 16, 32])))
    for label, pmf, B in cases:
        with t.case(f"{label}: B={B}, pmf {{{', '.join(f'{k}: {p:.3g}' for k, p in pmf.items())}}}"):
            expected = t.ref.expected_max(pmf, B)
            got = t.call("expected_max", pmf, B)
            t.expect(got, expected, "E[max]", mistakes=merged(emax_mistakes(pmf, B)), rtol=1e-9,
                     hint="Compute it exactly from the CDF (no sampling).")


@check(points=2, section="3.2")
def batching_gain(t):
    """Padding waste of static batching and the throughput gain of continuous batching."""
    cases = [("visible: the docstring example", {1: 0.5, 3: 0.5}, 2),
             ("visible: a rare long request", {4: 0.9, 100: 0.1}, 8)]
    for _ in range(3):
        cases.append(("hidden", random_pmf(t.rng), t.rng.choice([2, 4, 8, 16, 32])))
    for label, pmf, B in cases:
        with t.case(f"{label}: B={B}, pmf {{{', '.join(f'{k}: {p:.3g}' for k, p in pmf.items())}}}"):
            expected = t.ref.batching_gain(pmf, B)
            got = t.call("batching_gain", pmf, B)
            t.expect_true(isinstance(got, dict), f"return a dict, got {type(got).__name__}")
            missing = [k for k in expected if k not in got]
            t.expect_true(not missing, f"the dict is missing key(s) {missing}")
            mean, emax = sum(k * p for k, p in pmf.items()), t.ref.expected_max(pmf, B)
            t.expect(got["gain"], expected["gain"], '"gain"', rtol=1e-9, mistakes={
                "inverts the gain: continuous over static is E[max] / E[L], not E[L] / E[max]": mean / emax,
                "uses E[L] for the static batch's length (no gain); a batch lasts its longest request": 1.0})
            t.expect(got["padding_waste"], expected["padding_waste"], '"padding_waste"', rtol=1e-9, mistakes={
                "divides the wasted slot-steps by E[L]; the waste is a share of all slot-steps, "
                "E[max] per slot": (emax - mean) / mean,
                "returns the useful fraction E[L] / E[max], not the wasted one": mean / emax})


# -- 4.1 / 4.2 policies in the engine ---------------------------------------------------------------

class _Fcfs:
    def __init__(self, static_slots=None, skip=False, chunk=True):
        self.static_slots, self.skip, self.chunk = static_slots, skip, chunk

    def schedule(self, candidates, budget):
        empty = self.static_slots is None or budget.slots == self.static_slots
        picked = []
        for seq in candidates:
            if seq.is_waiting and not empty:
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


def engine_cases(t, chunked: bool):
    """(label, prompts, output lengths, engine kwargs): few KV blocks so that requests get preempted."""
    import random

    def prompts(rng, n):  # short and long prompts mixed, so a long one at the head may not fit
        return [[rng.randrange(1, 2048) for _ in range(rng.choice([rng.randint(8, 20), rng.randint(50, 100)]))]
                for _ in range(n)]

    vis = random.Random(0)
    cases = [("visible: 8 prompts, B=4, 8 KV blocks of 16 tokens", prompts(vis, 8),
              [vis.randint(4, 16) for _ in range(8)], dict(max_num_seqs=4, num_blocks=8)),
             ("hidden", prompts(t.rng, 6), [t.rng.randint(4, 16) for _ in range(6)],
              dict(max_num_seqs=t.rng.choice([3, 4]), num_blocks=t.rng.choice([8, 10])))]
    if chunked:  # the first prompt (45 tokens) is longer than the 32-token budget: it must be chunked
        first = [t.rng.randrange(1, 2048) for _ in range(45)]
        cases.append(("hidden: chunked prefill, 32-token budget", [first] + prompts(t.rng, 5),
                      [t.rng.randint(4, 16) for _ in range(6)],
                      dict(max_num_seqs=t.rng.choice([3, 4]), num_blocks=t.rng.choice([10, 12]),
                           enable_chunked_prefill=True, max_num_batched_tokens=32)))
    for _, _, _, kw in cases:
        kw.setdefault("enable_chunked_prefill", False)
        kw.setdefault("max_num_batched_tokens", 4096)
    return cases


def run_policy(policy, prompts, lens, kw):
    """One engine run; returns (schedule per step, tokens per request, leak message or None)."""
    from reference_engine import SamplingParams
    from solutions.l03_continuous_batching import engine_dir
    from reference_engine.llm import LLM

    torch.set_num_threads(1)
    llm = LLM(model=str(engine_dir() / "checkpoints" / "target"), scheduler_policy=policy,
              dtype=torch.float32, **kw)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
    outs = llm.generate(prompts, params)
    eng = llm.engine
    sched = [(s.num_prefill_seqs, s.num_prefill_tokens, s.num_decode_seqs, s.num_preempted) for s in eng.step_stats]
    leak = None
    try:
        eng.block_manager.check_consistency([])
        if eng.scheduler.has_unfinished():
            leak = "requests are still queued after every request finished"
    except AssertionError as e:
        leak = f"KV blocks leaked or miscounted after the run: {e}"
    return sched, [o.token_ids for o in outs], leak


def learner_run(t, make, prompts, lens, kw):
    """The engine with the learner's policy; their exceptions fail the case with their traceback."""
    with t.learner_code("the engine, running your policy,"):
        return run_policy(make(), prompts, lens, kw)


SCHEDULE_HINT = ("Each entry is one engine step: (prompts prefilled, prefill tokens, decodes, preemptions).")


def policy_check(t, cls_name: str, make_ref, mistakes: dict, chunked: bool):
    for label, prompts, lens, kw in engine_cases(t, chunked):
        with t.case(f"{label}: prompt lengths {[len(p) for p in prompts]}, output lengths {lens}"):
            cls = t.fn(cls_name)
            make = (lambda: cls(kw["max_num_seqs"])) if cls_name == "StaticPolicy" else cls
            sched, tokens, leak = learner_run(t, make, prompts, lens, kw)  # first: a stub stops here
            ref_sched, ref_tokens, _ = run_policy(make_ref(kw), prompts, lens, kw)
            if sched != ref_sched:  # name the mistake: run the usual wrong policies (only when needed)
                wrong = {}
                for name, policy in mistakes.items():
                    try:
                        wrong[name] = run_policy(policy(kw), prompts, lens, kw)[0]
                    except RuntimeError:
                        pass
                t.expect(sched, ref_sched, "the per-step schedule", mistakes=merged(wrong), hint=SCHEDULE_HINT)
            t.expect(tokens, ref_tokens, "generated token ids per request")
            t.expect_true(leak is None, leak or "")


@check(points=3, section="4.1", timeout=90)
def continuous_policy(t):
    """ContinuousPolicy in the engine: same schedule and tokens as the engine's FCFS, no leaked blocks."""
    policy_check(t, "ContinuousPolicy", lambda kw: None, {  # None: the engine's own FCFSPolicy
        "admits only when nothing is running (that is static batching)":
            lambda kw: _Fcfs(static_slots=kw["max_num_seqs"]),
        "lets a later request overtake one that does not fit (FCFS stops at the first that does not fit)":
            lambda kw: _Fcfs(skip=True),
        "never chunks a prompt: with chunked prefill a prompt takes at most budget.tokens":
            lambda kw: _Fcfs(chunk=False)}, chunked=True)


@check(points=2, section="4.2", timeout=90)
def static_policy(t):
    """StaticPolicy in the engine: admits only into an empty batch; same schedule as the reference."""
    policy_check(t, "StaticPolicy", lambda kw: t.ref.StaticPolicy(kw["max_num_seqs"]), {
        "admits while requests are still running (that is continuous batching)": lambda kw: _Fcfs(),
        "lets a later request overtake one that does not fit (FCFS stops at the first that does not fit)":
            lambda kw: _Fcfs(static_slots=kw["max_num_seqs"], skip=True)}, chunked=False)
