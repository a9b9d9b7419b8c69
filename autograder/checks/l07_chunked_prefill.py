"""Checks for lesson 07: a step planner with a token budget, an engine scheduler policy with vLLM's
partial-prefill controls (a chunk cap and a cap on long prefills a step), the per-step cost model, the
budget that meets an ITL SLO, and the chunks of a prefill that starts after a prefix-cache hit.

plan_step is driven through whole simulated runs (requests arrive, prefill in chunks, decode, leave)
and compared with the reference at every step; its wrong variants below name the usual mistakes.
The policy runs inside the engine on the shipped draft model (the schedule does not depend on the
model, and it is three times faster a step), in the learner's process
(`harnesses.engine.run_engine`), which records what each schedule() call was given (the budget, the
candidates) and what it picked, as data. Here every recorded call is judged with the reference rule
on the same inputs, and the usual wrong rules name a wrong pick; the schedule, the generated tokens, the
budget and the KV pool are compared with a run of the reference policy (`t.reference`).
The grader's code that computes an answer or a mistake's value (the rules, the cost model, the variants) is
`@answer_code` (autograder/reference.py): a student's copy holds its name and docstring, and replays its
results on the visible cases.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

from autograder.checks._configs import non_default
from autograder.checks._engine import POLICY_ERRORS, judged, known_error, step_bound, stopped, stub_guard
from autograder.compare import compare
from autograder.core import CaseFailed, check
from autograder.harnesses.engine import run_engine
from autograder.mistakes import looks_like
from autograder.reference import answer_code

# -- 1.1 plan_step -----------------------------------------------------------------------------------


@answer_code
def _fcfs(queue):
    return sorted(queue, key=lambda r: r["arrival"])


@answer_code
def _chunks(order, left, need="remaining", zeros=False):
    """min(need, left) tokens each, in `order`, until the budget is spent (zeros: keep listing prompts
    that get 0 tokens once it is). need: what a prompt asks for, "remaining" (prompt_len - computed) or
    "prompt_len"."""
    plan = []
    for r in order:
        if left <= 0 and not zeros:
            break
        n = min(r["prompt_len"] - (r["computed"] if need == "remaining" else 0), max(left, 0))
        plan.append((r["id"], n))
        left -= n
    return plan


@answer_code
def plan_mistakes(decodes, queue, budget) -> dict:
    def remaining(r):
        return r["prompt_len"] - r["computed"]
    whole = []
    left = budget - len(decodes)
    for r in _fcfs(queue):
        if left <= 0:
            break
        whole.append((r["id"], remaining(r)))
        left -= remaining(r)
    prefill_first = _chunks(_fcfs(queue), budget)
    spent = sum(n for _, n in prefill_first)
    prefill_first += [(d, 1) for d in decodes[:max(0, budget - spent)]]
    dec = [(d, 1) for d in decodes]
    return {
        "schedules prefill chunks before the running decodes, so decodes get only what is left and stall":
            prefill_first,
        "ignores the tokens a prompt already has in the KV cache (\"computed\") and prefills them again":
            dec + _chunks(_fcfs(queue), budget - len(decodes), "prompt_len"),
        "forgets that the decode tokens count against the budget (the step overshoots it by one token "
        "per decode)": dec + _chunks(_fcfs(queue), budget),
        "gives the last chunk one token more than the budget left (off by one: the plan computes budget + 1 "
        "tokens)": dec + _chunks(_fcfs(queue), budget - len(decodes) + 1),
        "admits a prompt whole even when it is larger than the budget left (it must be chunked)":
            dec + whole,
        "serves prompts in queue order instead of arrival order (FCFS: sort by \"arrival\")":
            dec + _chunks(queue, budget - len(decodes)),
        "breaks ties in arrival by id; equal arrivals keep their queue order (sorted() is stable)":
            dec + _chunks(sorted(queue, key=lambda r: (r["arrival"], r["id"])), budget - len(decodes)),
        "lists prompts that get 0 tokens once the budget is spent (leave them out of the plan)":
            dec + _chunks(_fcfs(queue), budget - len(decodes), zeros=True),
    }


def _invariant_hint(got, decodes, budget) -> str:
    try:
        total = sum(int(n) for _, n in got)
        ids = [i for i, _ in got]
    except Exception:  # noqa: BLE001 - shape problems are reported by the comparison itself
        return ""
    if total > budget:
        return f"Your plan computes {total} tokens, over the budget of {budget}."
    missing = [d for d in decodes if d not in ids]
    if missing:
        return f"Decode(s) {missing} got no token this step: running decodes come first, every step."
    return ""


def scenario(rng):
    """A hidden run: a few short requests already decoding, then prompts arriving over the first steps.
    At most 9 requests decode at once, under the budget (>= 10): the docstring's budget >= decodes."""
    budget = rng.randint(10, 32)
    reqs = [{"id": f"d{i}", "prompt_len": rng.randint(2, 6), "arrive": 0, "decode": rng.randint(3, 10)}
            for i in range(rng.randint(1, 4))]
    for i in range(rng.randint(3, 5)):
        reqs.append({"id": f"p{i}", "prompt_len": rng.randint(3, 3 * budget), "arrive": rng.randint(0, 4),
                     "decode": rng.randint(1, 6)})
    return budget, reqs


def plan_queue(reqs, computed, step, rng) -> list[dict]:
    """The prompts that have arrived and still need tokens, shuffled; never in arrival order when their
    arrivals differ, so that queue order and arrival order disagree on every seed, and equal arrivals in
    descending id order."""
    queue = [{"id": r["id"], "prompt_len": r["prompt_len"], "computed": computed[r["id"]],
              "arrival": float(r["arrive"])} for r in reqs
             if r["arrive"] <= step and computed[r["id"]] < r["prompt_len"]]
    rng.shuffle(queue)
    if queue == sorted(queue, key=lambda r: r["arrival"]) and len({r["arrival"] for r in queue}) > 1:
        queue.reverse()
    for arrival in {r["arrival"] for r in queue}:  # ties in descending id order: a tie broken by id shows
        at = [i for i, r in enumerate(queue) if r["arrival"] == arrival]
        for i, r in zip(at, sorted((queue[i] for i in at), key=lambda r: r["id"], reverse=True)):
            queue[i] = r
    return queue


def simulate(budget: int, reqs: list[dict], rng, plan):
    """Drive a run with `plan(decoding, queue, budget, step)` (which checks each step), following the
    plans it returns; returns the tokens each prompt got in all."""
    by_id = {r["id"]: r for r in reqs}
    computed = {r["id"]: 0 for r in reqs}
    left_to_decode = {r["id"]: r["decode"] for r in reqs}
    decoding: list[str] = []
    for step in range(200):
        queue = plan_queue(reqs, computed, step, rng)
        if not queue and not decoding:
            if all(computed[r["id"]] == r["prompt_len"] for r in reqs):
                break
            continue
        for rid, n in plan(list(decoding), queue, budget, step):
            if rid in decoding:
                left_to_decode[rid] -= 1
                if left_to_decode[rid] == 0:
                    decoding.remove(rid)
            else:
                computed[rid] += n
                if computed[rid] == by_id[rid]["prompt_len"]:
                    decoding.append(rid)
    return computed


def check_plans(t, budget: int, reqs: list[dict]):
    """The learner's plan_step at every step of a run, against the reference (whose plans drive the run)."""
    def plan(decoding, queue, budget, step):
        got, expected = t.both("plan_step", decoding, queue, budget)
        t.expect(got, expected, f"step {step} (budget {budget}, decodes {decoding}, queue {queue})",
                 mistakes=plan_mistakes(decoding, queue, budget), hint=_invariant_hint(got, decoding, budget))
        return expected

    computed = simulate(budget, reqs, t.rng, plan)
    bad = [r["id"] for r in reqs if computed[r["id"]] != r["prompt_len"]]
    t.expect_true(not bad, f"prompts {bad} were not prefilled exactly once (sum of chunks != prompt_len)")


PLAN_CASES = [
    ("visible: budget 16, two decodes, prompts of 40, 7 and 25 tokens",
     (16, [{"id": "d0", "prompt_len": 3, "arrive": 0, "decode": 6},
           {"id": "d1", "prompt_len": 4, "arrive": 0, "decode": 9},
           {"id": "p0", "prompt_len": 40, "arrive": 1, "decode": 3},
           {"id": "p1", "prompt_len": 7, "arrive": 2, "decode": 2},
           {"id": "p2", "prompt_len": 25, "arrive": 2, "decode": 4}])),
    ("visible: budget 8, one long prompt among three decodes",
     (8, [{"id": f"d{i}", "prompt_len": 2, "arrive": 0, "decode": 12} for i in range(3)]
      + [{"id": "long", "prompt_len": 30, "arrive": 1, "decode": 2}])),
]


@check(points=3, section="1.1")
def plan_step(t):
    """Decodes first, then FCFS chunks, never over the budget, every prompt prefilled exactly once."""
    for label, (budget, reqs) in t.cases(visible=PLAN_CASES, hidden=scenario, n=2):
        with t.case(f"{label} (budget {budget})" if label.startswith("hidden") else label):
            check_plans(t, budget, reqs)


# -- 1.2 the policy in the engine ------------------------------------------------------------------

class _Blocks:
    """What the engine's Budget asks of a block manager, answered from a recorded call."""

    def __init__(self, free: int, block_size: int):
        self.free, self.block_size = free, block_size

    def num_free(self) -> int:
        return self.free

    def blocks_needed(self, seq, n: int) -> int:
        return -(-(seq.computed + n) // self.block_size) - seq.blocks + seq.cow


def replay(call: dict, block_size: int):
    """A recorded schedule() call's candidates, and a fresh engine Budget with its limits, for a rule."""
    from reference_engine.scheduler import Budget
    seqs = [SimpleNamespace(seq_id=c["seq_id"], num_uncomputed_tokens=c["uncomputed"], num_prompt_tokens=c["prompt"],
                            is_waiting=c["waiting"], num_slots=c["slots"], computed=c["computed"],
                            blocks=c["blocks"], cow=c["cow"]) for c in call["candidates"]]
    return seqs, Budget(call["tokens"], call["slots"], _Blocks(call["free_blocks"], block_size), call["chunked"])


def _tokens(seq, which: str) -> int:
    return seq.num_uncomputed_tokens if which == "uncomputed" else seq.num_prompt_tokens


@answer_code  # its arguments are engine objects: called only inside policy_picks (and by tests), never a question
def rule(candidates, budget, threshold: int, max_long: int, need="uncomputed", long_by="uncomputed", skip=False,
         whole=False, started=True, tokens_only=False, always_chunk=False, no_threshold=False, no_budget_min=False,
         no_cap=False, count_all=False, stop_at_held=False, long_at_threshold=False, cap_unchunked=False):
    """The reference rule (the solution's docstring: with chunked prefill, a long candidate past the cap is
    held back, the others get min(uncomputed, threshold, budget.tokens), FCFS stop at the first that does
    not fit; without, whole or stop) and its usual wrong versions, one keyword each:
    need (what a prompt asks for: "uncomputed" or "prompt" tokens), long_by / long_at_threshold (which prompts
    are long, by "uncomputed" or "prompt" tokens), skip (overtaking),
    whole (never chunks), started=False (never continues a started prompt), tokens_only (counts tokens itself
    instead of budget.try_take), always_chunk (ignores budget.chunked_prefill), no_threshold / no_budget_min
    (a term missing from the chunk's min), no_cap / count_all / stop_at_held / cap_unchunked (the long cap
    missing, counting every prompt, stopping the step at a held prompt, applied with chunking off).
    Returns [(seq_id, num_tokens)]."""
    chunked = budget.chunked_prefill or always_chunk
    capped = (chunked or cap_unchunked) and not no_cap
    picked, left, longs = [], budget.tokens, 0
    for seq in candidates:
        if not started and not seq.is_waiting:
            continue
        is_long = _tokens(seq, long_by) >= threshold if long_at_threshold else _tokens(seq, long_by) > threshold
        counts = is_long or count_all
        if capped and counts and longs >= max_long:
            if stop_at_held:
                break
            continue
        n = _tokens(seq, need)
        if chunked and not whole:
            n = n if no_threshold else min(n, threshold)
            n = n if no_budget_min else min(n, left if tokens_only else budget.tokens)
        if tokens_only:
            if not 0 < n <= left:
                break
            left -= n
        elif not budget.try_take(seq, n):
            if skip:
                continue
            break
        picked.append((seq.seq_id, n))
        longs += counts
    return picked


POLICY_MISTAKES = {
    "gives a prompt up to all of budget.tokens; no chunk is larger than long_prefill_token_threshold (take "
    "min(num_uncomputed_tokens, threshold, budget.tokens))": dict(no_threshold=True),
    "caps a chunk at the threshold but not at budget.tokens, so a prompt that would get the tokens left gets "
    "nothing and the step stops early": dict(no_budget_min=True),
    "never holds a long prompt back: at most max_long_partial_prefills long prompts (more than the threshold "
    "left to compute) get tokens in one step": dict(no_cap=True),
    "counts every prompt against max_long_partial_prefills; only long ones count, short prompts always may "
    "go": dict(count_all=True),
    "stops the step at a long prompt held back by the cap; skip it and go on: a short prompt behind it may "
    "still go (that is what the cap is for)": dict(stop_at_held=True),
    "decides a prompt is long by num_prompt_tokens; what counts is what it still has to compute "
    "(num_uncomputed_tokens), so a long prompt on its last chunk no longer holds a long slot":
        dict(long_by="prompt"),
    "counts a prompt with exactly long_prefill_token_threshold tokens left as long; long means more than the "
    "threshold": dict(long_at_threshold=True),
    "holds long prompts back with chunking off too; a prompt scheduled whole finishes its prefill in the step, "
    "nothing is partial, and the rule is plain FCFS": dict(cap_unchunked=True),
    "lets a later request overtake one that does not fit (FCFS stops at the first that does not fit; only a "
    "long prompt held back by the cap is skipped)": dict(skip=True),
    "asks for a prompt's full length (num_prompt_tokens) instead of what is still uncomputed "
    "(num_uncomputed_tokens), so partly prefilled prompts cannot continue and get prefilled again":
        dict(need="prompt"),
    "admits a prompt whole even when it is larger than the threshold or the budget left (with "
    "budget.chunked_prefill, a prompt gets min(num_uncomputed_tokens, threshold, budget.tokens))": dict(whole=True),
    "never continues a started prompt: candidates with is_waiting False (partly prefilled) come first and "
    "need their next chunk": dict(started=False),
    "counts only tokens, without budget.try_take: free KV blocks and batch slots limit a step too":
        dict(tokens_only=True),
    "chunks a prompt although budget.chunked_prefill is False (with chunking off a prompt is scheduled whole "
    "or waits for a later step)": dict(always_chunk=True),
}


@answer_code
def policy_picks(call: dict, block_size: int, policy: tuple) -> tuple[list, dict]:
    """(the reference rule's picks, {mistake: the wrong rule's picks}) on a recorded schedule() call, given
    without its "picks" (what the call was given, not what the learner's policy returned: a student's copy
    replays the answers for the calls the reference policy was given)."""
    expected = rule(*replay(call, block_size), *policy)
    return expected, {name: rule(*replay(call, block_size), *policy, **kw) for name, kw in POLICY_MISTAKES.items()}


def _call_label(i: int, call: dict, policy: tuple) -> str:
    cands = [(c["seq_id"], c["uncomputed"], c["prompt"], c["waiting"]) for c in call["candidates"]]
    return (f"schedule() call {i + 1} (engine step {call['step']}) of ChunkedPrefillPolicy{policy}: "
            f"budget.tokens={call['tokens']}, budget.slots={call['slots']}, budget.free_blocks={call['free_blocks']}, "
            f"budget.chunked_prefill={call['chunked']}, candidates (seq_id, num_uncomputed_tokens, "
            f"num_prompt_tokens, is_waiting) {cands}")


def judge_calls(t, run: dict, policy: tuple):
    """Every recorded schedule() call the policy returned from, against the reference rule on the same
    inputs; the first wrong pick fails the case, named by the one wrong rule that picks the same. A wrong
    rule that picks differently on some call counts as tested (it would have been caught)."""
    named = known_error(run)
    hint = looks_like(named) if named else ""
    for i, call in enumerate(run["policy_calls"]):
        if call["picks"] is None and i == len(run["policy_calls"]) - 1 and run["error"] is not None:
            return  # it raised, or returned no list of pairs: the engine's error says which
        expected, wrong = policy_picks({k: v for k, v in call.items() if k != "picks"}, run["block_size"], policy)
        t.offered.update(name for name, w in wrong.items() if w != expected)
        if call["picks"] == expected:
            continue
        try:
            t.expect(call["picks"], expected, f"{_call_label(i, call, policy)}: your policy returned (seq_id, "
                     f"num_tokens) {call['picks']}, expected {expected}", mistakes=wrong, hint=hint)
        except CaseFailed as e:
            t.fail(f"{e}\n{stopped(run)}" if run["error"] is not None else str(e))


# The policy is judged by its schedule, which does not depend on the model: both sides run the small
# draft model (three times faster a step than the target).
MODEL = "draft"


def reference_run(ref, prompts: list, max_tokens: int, llm_kwargs: dict, policy: tuple) -> dict:
    """The engine run with the reference ChunkedPrefillPolicy(*policy) (for t.reference: plain data in and out)."""
    return run_engine(prompts, max_tokens, llm_kwargs, make={"scheduler_policy": (ref.ChunkedPrefillPolicy, *policy)},
                      record_policy=True, catch=True, model=MODEL)


def engine_case(t, llm_kwargs: dict, policy: tuple, prompts: list, max_tokens: int):
    lens = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    run, expected = t.run_against(lambda: t.reference(reference_run, prompts, max_tokens, llm_kwargs, policy),
                                  run_engine, prompts, max_tokens, llm_kwargs, what="the engine, running your policy,",
                                  make={"scheduler_policy": (t.learner("ChunkedPrefillPolicy"), *policy)},
                                  max_steps=step_bound(prompts, lens), record_policy=True, catch=True,
                                  model=MODEL)
    if expected["error"] is not None:
        raise RuntimeError(f"the reference policy failed in the engine: {expected['error']['message']}")
    judge_calls(t, run, policy)
    with judged(t, run, POLICY_ERRORS, unfinished=f"the requests did not finish in {run['steps']} steps (the "
                f"reference policy needs {expected['steps']}): does your policy make progress?"):
        t.expect(run["schedule"], expected["schedule"], "the per-step schedule (each step: prompts prefilled, "
                 "prefill tokens, decodes, preemptions) vs the reference policy's")
        t.expect(run["tokens"], expected["tokens"], "generated token ids (greedy) vs the reference policy's run")
        limit = run["max_num_batched_tokens"]
        over = [k for k, n in enumerate(run["step_tokens"]) if n > limit]
        t.expect_true(not over, f"steps {over} computed more than max_num_batched_tokens={limit} tokens")


def _prompts(rng, lens) -> list:
    return [[rng.randrange(1, 2048) for _ in range(n)] for n in lens]


def _visible_prompts(seed: int, lens) -> list:
    return _prompts(random.Random(seed), lens)


# (label, (LLM keywords, (long_prefill_token_threshold, max_long_partial_prefills), prompts)); max_tokens 6
ENGINE_CASES = [
    ("visible: a long prompt, then short ones; budget 40, threshold 16, one long prefill a step",
     (dict(num_blocks=64, max_num_seqs=6, max_num_batched_tokens=40), (16, 1), _visible_prompts(0, (120, 9, 14, 16, 12)))),
    ("visible: two long prompts (48 and 64 tokens) and short ones; budget 32, threshold 16, one long a step",
     (dict(num_blocks=64, max_num_seqs=6, max_num_batched_tokens=32), (16, 1), _visible_prompts(1, (48, 64, 10, 40, 7)))),
    ("visible: three long prompts, two long prefills a step; budget 48, threshold 12",
     (dict(num_blocks=64, max_num_seqs=5, max_num_batched_tokens=48), (12, 2), _visible_prompts(2, (50, 36, 41, 5, 30)))),
    ("visible: 6 KV blocks of 16 (forces preemption); budget 20, threshold 10, two long prefills a step",
     (dict(num_blocks=6, max_num_seqs=4, max_num_batched_tokens=20), (10, 2), _visible_prompts(26, (25, 17, 39, 48, 45)))),
    ("visible: chunked prefill off, budget 96; two long prompts fit one step whole",
     (dict(num_blocks=40, max_num_seqs=4, max_num_batched_tokens=96, max_model_len=96, enable_chunked_prefill=False),
      (16, 1), _visible_prompts(4, (30, 40, 20, 50, 12)))),
]


def random_engine_case(rng):
    """Long prompts among short ones, a random threshold and cap; KV blocks from tight to plenty."""
    budget = rng.randint(16, 48)
    threshold = rng.randint(6, max(6, budget // 2))
    lens = [rng.randint(threshold + 1, 4 * threshold) if rng.random() < 0.5 else rng.randint(3, threshold)
            for _ in range(rng.randint(4, 6))]
    kwargs = dict(num_blocks=rng.choice([8, 12, 64]), max_num_seqs=rng.randint(3, 6), max_num_batched_tokens=budget)
    return kwargs, (threshold, rng.choice([1, 1, 2])), _prompts(rng, lens)


@check(points=3, section="1.2", timeout=90, cost=0.4)
def chunked_policy_in_engine(t):
    """The policy in the engine: the reference pick at every call (long prompts capped and held back, short
    ones let through, FCFS otherwise), the reference schedule and tokens, budget held, no leaked blocks."""
    stub_guard(t, "ChunkedPrefillPolicy", 16)
    for label, (kwargs, policy, prompts) in t.cases(visible=ENGINE_CASES, hidden=random_engine_case, n=1):
        if label.startswith("hidden"):
            label = (f"{label}: budget {kwargs['max_num_batched_tokens']}, threshold {policy[0]}, "
                     f"{policy[1]} long prefill(s) a step, {kwargs['num_blocks']} KV blocks")
        with t.case(f"{label}, prompts of {[len(p) for p in prompts]} tokens"):
            engine_case(t, kwargs, policy, prompts, max_tokens=6)


# -- 2.1 step time ---------------------------------------------------------------------------------


def random_cost(rng) -> dict:
    return {"overhead_s": rng.uniform(2e-3, 2e-2), "per_token_s": rng.uniform(1e-5, 2e-4),
            "per_attn_s": rng.choice([0.0, rng.uniform(1e-9, 1e-7)])}


@answer_code
def cost_model(cost, d, ctx, chunk, start) -> float:
    """The docstring's formula (the grader's copy, for the wrong budgets below)."""
    pairs = d * ctx + chunk * start + chunk * (chunk + 1) // 2
    return cost["overhead_s"] + cost["per_token_s"] * (d + chunk) + cost["per_attn_s"] * pairs


@answer_code
def step_time_mistakes(cost, d, ctx, chunk, start) -> dict:
    o, a, b = cost["overhead_s"], cost["per_token_s"], cost["per_attn_s"]
    causal = chunk * start + chunk * (chunk + 1) // 2
    return {"forgets the decode tokens in the step (they cost per-token and attention time too)":
                o + a * chunk + b * causal,
            "charges per_token_s only for the chunk's tokens; the decode tokens go through the weights too":
                o + a * chunk + b * (d * ctx + causal),
            "leaves out the decodes' attention (num_decodes * decode_context (query, key) pairs)":
                o + a * (d + chunk) + b * causal,
            "counts the decodes' attention once, not once per decode (num_decodes * decode_context pairs)":
                o + a * (d + chunk) + b * (ctx + causal),
            "lets each decode attend decode_context + 1 keys; decode_context already counts every key it attends":
                o + a * (d + chunk) + b * (d * (ctx + 1) + causal),
            "lets each chunk token attend only the chunk itself, not the context computed before it":
                o + a * (d + chunk) + b * (d * ctx + chunk * (chunk + 1) // 2),
            "lets every chunk token attend the whole chunk (not causal: position p attends p + 1 keys)":
                o + a * (d + chunk) + b * (d * ctx + chunk * (start + chunk)),
            "is off by one in the causal sum: the token at position p attends p + 1 keys (itself too), not p":
                o + a * (d + chunk) + b * (d * ctx + chunk * start + chunk * (chunk - 1) // 2),
            "leaves out the fixed per-step overhead": a * (d + chunk) + b * (d * ctx + causal)}


STEP_BASE = {"overhead_s": 0.01, "per_token_s": 1e-4, "per_attn_s": 1e-8}
STEP_CASES = [("visible: 8 decodes, a 56-token chunk at the start", (STEP_BASE, 8, 100, 56, 0)),
              ("visible: 4 decodes, a 100-token chunk after 300 computed", (STEP_BASE, 4, 250, 100, 300)),
              ("visible: decode-only step", (STEP_BASE, 16, 40, 0, 0))]


def random_step_case(rng):
    c = random_cost(rng)
    c["per_attn_s"] = c["per_attn_s"] or 3e-8
    return c, rng.randint(1, 64), rng.randint(1, 4000), rng.randint(1, 2048), rng.randint(0, 8000)


@check(points=2, section="2.1")
def step_time(t):
    """Overhead + per-token cost of decode and chunk tokens + causal attention pairs."""
    for label, args in t.cases(visible=STEP_CASES, hidden=random_step_case, n=2):
        with t.case(f"{label}: decodes={args[1]}, decode_context={args[2]}, chunk={args[3]}, start={args[4]}"):
            got, expected = t.both("step_time", *args)
            t.expect(got, expected, "step time (s)", rtol=1e-6, mistakes=step_time_mistakes(*args))


# -- 2.2 the budget --------------------------------------------------------------------------------


@answer_code
def wrong_choice(cost, slo, P, d, ctx, floor=False, mean=False, no_decodes=False, smallest=False,
                 strict=False, first_only=False, start0=False, ttft_max=False, no_top=False, uncapped=False):
    """choose_budget with one usual mistake (None where that version would raise)."""
    top = d + P - 1 if no_top else d + P
    for budget in (range(d + 1, top + 1) if smallest else range(top, d, -1)):
        share = budget if no_decodes else budget - d
        if share > P:
            continue
        starts = range(0, share * (P // share), share) if floor else range(0, P, share)
        times = [cost_model(cost, d, ctx, share if uncapped else min(share, P - s), 0 if start0 else s)
                 for s in starts]
        if not times:
            continue
        worst = times[0] if first_only else sum(times) / len(times) if mean else max(times)
        if worst < slo if strict else worst <= slo:
            ttft = len(times) * max(times) if ttft_max else sum(times)
            return {"budget": budget, "num_steps": len(times), "ttft_s": ttft, "max_step_s": max(times)}
    return None


BUDGET_MISTAKES = {
    "rounds the number of chunks down (a partial last chunk is still a step: use ceil)": dict(floor=True),
    "checks the mean step time against the SLO instead of the slowest step": dict(mean=True),
    "forgets the decode tokens in the budget (each step's chunk is budget - num_decodes)": dict(no_decodes=True),
    "returns the smallest budget that meets the SLO; the largest one gives the lowest TTFT": dict(smallest=True),
    "rejects a budget whose slowest step takes exactly the SLO (meeting it means <=)": dict(strict=True),
    "checks only the first chunk's step against the SLO; later chunks attend the earlier ones and are "
    "slower": dict(first_only=True),
    "times every chunk as if it started at position 0; a later chunk attends the chunks before it":
        dict(start0=True),
    "takes the TTFT as num_steps times the slowest step; it is the sum of the steps' times": dict(ttft_max=True),
    "never tries the largest budget, num_decodes + prompt_len (the whole prompt in one step)": dict(no_top=True),
    "times the last chunk as a full chunk; it is what remains of the prompt, min(chunk, prompt_len - start)":
        dict(uncapped=True),
}


@answer_code
def budget_mistakes(cost, slo, P, d, ctx) -> dict:
    """The usual wrong choose_budget results on these inputs (the versions that would raise left out)."""
    mistakes = {name: wrong_choice(cost, slo, P, d, ctx, **kw) for name, kw in BUDGET_MISTAKES.items()}
    return {k: v for k, v in mistakes.items() if v is not None}


LINEAR = {"overhead_s": 0.01, "per_token_s": 1e-4, "per_attn_s": 0.0}
ATTN = {"overhead_s": 0.008, "per_token_s": 5e-5, "per_attn_s": 2e-8}
# Powers of two: every step time is exact in binary floating point, whatever the order of the sum, so
# an SLO equal to a step time is met exactly (the boundary case), by any correct implementation.
EXACT = {"overhead_s": 2.0 ** -7, "per_token_s": 2.0 ** -14, "per_attn_s": 2.0 ** -27}
# Budget 104's slowest step, max(cost_model(EXACT, 4, 256, min(100, 512 - s), s) for s in range(0, 512, 100)),
# written out: cost_model's body is not in a student's copy (tests/test_l07_chunked_prefill.py checks that the
# reference's choose_budget meets it exactly, at budget 104).
EXACT_SLO = 0.014503434300422668  # 0x1.db3fap-7, exact

BUDGET_CASES = [
    ("visible: linear cost, SLO 30.55 ms, 1000-token prompt, 8 decodes", (LINEAR, 0.03055, 1000, 8, 100)),
    ("visible: with attention cost, SLO 25 ms, 3000-token prompt, 16 decodes", (ATTN, 0.025, 3000, 16, 500)),
    ("visible: the slowest step takes exactly the SLO (it is met)", (EXACT, EXACT_SLO, 512, 4, 256)),
    ("visible: a generous SLO, the whole prompt in one step", (ATTN, 0.05, 300, 8, 100)),
]


def budget_case(rng):
    cost = random_cost(rng)
    d, ctx, P = rng.randint(2, 32), rng.randint(10, 400), rng.randint(50, 3000)
    # half a token past a whole number of tokens: no budget's step lands on the SLO to within rounding
    slo = cost["overhead_s"] + cost["per_token_s"] * (d + rng.randint(8, 300) + 0.5) + cost["per_attn_s"] * d * ctx
    return cost, slo, P, d, ctx


@answer_code
def budget_steps(cost, P, d, ctx, budget) -> list:
    """[(step_time's arguments, its value)] for the first two and the last two chunks of a P-token prompt
    prefilled with this budget: the calls a choose_budget built on step_time makes at that budget."""
    share = budget - d
    starts = list(range(0, P, share))
    starts = sorted(set(starts[:2] + starts[-2:]))
    return [((cost, d, ctx, min(share, P - s), s), cost_model(cost, d, ctx, min(share, P - s), s)) for s in starts]


@check(points=3, section="2.2", cost=0.2)
def choose_budget(t):
    """The largest budget whose every step meets the ITL SLO; its steps, TTFT and worst step. A wrong result
    that comes from a wrong step_time is blamed on step_time."""
    for label, (cost, slo, P, d, ctx) in t.cases(visible=BUDGET_CASES, hidden=budget_case, n=2):
        with t.case(f"{label} (cost {cost}, slo {slo:.6g} s, prompt {P}, decodes {d}, context {ctx})"):
            got, expected = t.both("choose_budget", cost, slo, P, d, ctx)
            calls = budget_steps(cost, P, d, ctx, expected["budget"])
            if compare(got, expected, rtol=1e-6) is not None:
                t.blame_upstream("choose_budget", "step_time", calls,
                                 show=lambda a: "the cost model" if isinstance(a, dict) else repr(a))
            t.expect_true(isinstance(got, dict), f"choose_budget() must return a dict, got {type(got).__name__}")
            t.expect(got, expected, "choose_budget result", rtol=1e-6, mistakes=budget_mistakes(cost, slo, P, d, ctx))
    with t.case("an SLO below a decode-only step raises ValueError"):
        t.expect_raises(ValueError, "choose_budget", LINEAR, 0.005, 100, 4, 10,
                        why="no budget meets an SLO that even a decode-only step misses")


# -- 3.1 chunks after a prefix-cache hit -------------------------------------------------------------


@answer_code
def chunks_variant(prompt_len, cached_blocks, block_size, chunk_budget, align, start="blocks", step="largest",
                   lengths=False):
    """prefill_chunks with one thing changed, to name a wrong answer. `start`, where the prefill starts:
    "blocks" (right), "whole" (the hit capped at the prompt, the last token not kept), "floor" (at most
    prompt_len // block_size blocks), "tokens" (the hit capped at prompt_len - 1 tokens, not whole blocks),
    "as_tokens" (cached_blocks read as tokens). `step`, an aligned chunk: "largest" (right), "first" (only
    the first chunk aligned), "up" (rounded up to whole blocks). `lengths`: chunk lengths only."""
    hit = block_size * cached_blocks
    first = {"blocks": block_size * min(cached_blocks, (prompt_len - 1) // block_size),
             "whole": min(hit, prompt_len),
             "floor": block_size * min(cached_blocks, prompt_len // block_size),
             "tokens": min(hit, prompt_len - 1),
             "as_tokens": min(cached_blocks, prompt_len - 1)}[start]
    sizes = [chunk_budget]
    if align:
        down, up = chunk_budget // block_size * block_size, -(-chunk_budget // block_size) * block_size
        sizes = {"largest": [down], "first": [down, chunk_budget], "up": [up]}[step]
    chunks, at = [], first
    while at < prompt_len:
        n = min(sizes[min(len(chunks), len(sizes) - 1)], prompt_len - at)
        chunks.append((at, n))
        at += n
    return [n for _, n in chunks] if lengths else chunks


CHUNK_MISTAKES = {
    "ignores the rule that the prompt's last token is always computed (its logits give the first output "
    "token): a fully cached prompt still recomputes its last block": dict(start="whole"),
    "uses prompt_len // block_size as the most blocks the hit can cover; it is (prompt_len - 1) // block_size, "
    "so that the last token stays to compute": dict(start="floor"),
    "counts the hit in tokens, capped at prompt_len - 1; the cache shares whole blocks only, so the prefill "
    "starts at a block boundary and recomputes the last block whole": dict(start="tokens"),
    "reads cached_blocks as a number of tokens; it counts whole blocks of block_size tokens": dict(start="as_tokens"),
    "aligns only the first chunk to whole blocks; with align=True every chunk but the last is a multiple "
    "of block_size": dict(step="first"),
    "rounds the aligned chunk up to whole blocks, over the budget; take the largest multiple of block_size "
    "that fits chunk_budget": dict(step="up"),
    "returns the chunk lengths only; each chunk is a (start, num_tokens) pair": dict(lengths=True),
}

@answer_code
def chunks_mistakes(prompt_len, cached_blocks, block_size, chunk_budget, align) -> dict:
    """The usual wrong prefill_chunks results on these inputs."""
    return {name: chunks_variant(prompt_len, cached_blocks, block_size, chunk_budget, align, **kw)
            for name, kw in CHUNK_MISTAKES.items()}


CHUNK_CASES = [
    ("visible: a 3-block hit, budget 30", (100, 3, 16, 30, False)),
    ("visible: the same, align=True (chunks of whole blocks)", (100, 3, 16, 30, True)),
    ("visible: a hit of 10 blocks on a 40-token prompt (2 full blocks and 8 tokens)", (40, 10, 16, 8, False)),
    ("visible: a prompt fully cached (4 blocks of 16, 64 tokens)", (64, 4, 16, 64, False)),
]


def chunk_case(rng):
    block = rng.choice([1, 4, 8, 16, 32])
    prompt = rng.randint(1, 2000)
    align = rng.random() < 0.5
    hit = rng.randint(0, prompt // block + 2)  # up to two blocks past the prompt's end
    return prompt, hit, block, rng.randint(max(4, block) if align else 4, 600), align


@check(points=2, section="3.1")
def prefill_chunks(t):
    """Chunks of chunk_budget after the hit's whole blocks, the last token always computed; aligned ones."""
    for label, (P, hit, bs, budget, align) in t.cases(visible=CHUNK_CASES, hidden=chunk_case, n=4):
        call = f"prefill_chunks({P}, {hit}, {bs}, {budget}{', align=True' if align else ''})"
        with t.case(f"{label}: {call}"):
            got, expected = t.both("prefill_chunks", P, hit, bs, budget, **non_default(align=(align, False)))
            t.expect(got, expected, f"the chunks (expected {expected})" if len(expected) <= 6 else "the chunks",
                     mistakes=chunks_mistakes(P, hit, bs, budget, align))
    with t.case("align=True with a budget smaller than a block raises ValueError"):
        t.expect_raises(ValueError, "prefill_chunks", 100, 3, 16, 8, True,
                        why="no chunk of whole 16-token blocks fits 8 tokens of budget: the caller asked for "
                            "something impossible")
