"""Checks for lesson 07: a step planner with a token budget, the same rule as an engine scheduler
policy, the per-step cost model, and the budget that meets an ITL SLO.

plan_step is driven through whole simulated runs (requests arrive, prefill in chunks, decode, leave)
and compared with the reference at every step; its wrong variants below name the usual mistakes.
The policy runs inside the engine on the shipped target model: each call is replayed against the
reference rule on a copy of the same budget, and the generated tokens and the KV pool are compared
with a run of the engine's own FCFS policy.
"""
from __future__ import annotations

import copy
from pathlib import Path

from autograder.core import LearnerRaised, NotStarted, check, learner_traceback

# -- 1.1 plan_step -----------------------------------------------------------------------------------


def _fcfs(queue):
    return sorted(queue, key=lambda r: r["arrival"])


def _chunks(order, left, need):
    plan = []
    for r in order:
        if left <= 0:
            break
        n = min(need(r), left)
        plan.append((r["id"], n))
        left -= n
    return plan


def plan_mistakes(decodes, queue, budget) -> dict:
    remaining = lambda r: r["prompt_len"] - r["computed"]  # noqa: E731
    whole = []
    left = budget - len(decodes)
    for r in _fcfs(queue):
        if left <= 0:
            break
        whole.append((r["id"], remaining(r)))
        left -= remaining(r)
    prefill_first = _chunks(_fcfs(queue), budget, remaining)
    spent = sum(n for _, n in prefill_first)
    prefill_first += [(d, 1) for d in decodes[:max(0, budget - spent)]]
    dec = [(d, 1) for d in decodes]
    return {
        "schedules prefill chunks before the running decodes, so decodes get only what is left and stall":
            prefill_first,
        "ignores the tokens a prompt already has in the KV cache (\"computed\") and prefills them again":
            dec + _chunks(_fcfs(queue), budget - len(decodes), lambda r: r["prompt_len"]),
        "forgets that the decode tokens count against the budget (the step overshoots it by one token "
        "per decode)": dec + _chunks(_fcfs(queue), budget, remaining),
        "admits a prompt whole even when it is larger than the budget left (it must be chunked)":
            dec + whole,
        "serves prompts in queue order instead of arrival order (FCFS: sort by \"arrival\")":
            dec + _chunks(queue, budget - len(decodes), remaining),
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


def scenario(rng, budget: int, n_decoding: int, n_prompts: int, max_len: int):
    """Requests: a few short ones already decoding, then prompts arriving over the first steps."""
    reqs = [{"id": f"d{i}", "prompt_len": rng.randint(2, 6), "arrive": 0, "decode": rng.randint(3, 10)}
            for i in range(n_decoding)]
    for i in range(n_prompts):
        reqs.append({"id": f"p{i}", "prompt_len": rng.randint(3, max_len), "arrive": rng.randint(0, 4),
                     "decode": rng.randint(1, 6)})
    return budget, reqs


def simulate(t, budget: int, reqs: list[dict]):
    """Drive a run with the learner's plan_step, checking each step against the reference."""
    by_id = {r["id"]: r for r in reqs}
    computed = {r["id"]: 0 for r in reqs}
    chunk_sum = {r["id"]: 0 for r in reqs}
    left_to_decode = {r["id"]: r["decode"] for r in reqs}
    decoding: list[str] = []
    for step in range(200):
        queue = [{"id": r["id"], "prompt_len": r["prompt_len"], "computed": computed[r["id"]],
                  "arrival": float(r["arrive"])} for r in reqs
                 if r["arrive"] <= step and computed[r["id"]] < r["prompt_len"]]
        t.rng.shuffle(queue)  # queue order is not arrival order
        if not queue and not decoding:
            if all(computed[r["id"]] == r["prompt_len"] for r in reqs):
                break
            continue
        expected = t.ref.plan_step(list(decoding), queue, budget)
        got = t.call("plan_step", list(decoding), queue, budget)
        t.expect(got, expected, f"step {step} (budget {budget}, decodes {decoding}, queue {queue})",
                 mistakes=plan_mistakes(decoding, queue, budget), hint=_invariant_hint(got, decoding, budget))
        for rid, n in expected:
            if rid in decoding:
                left_to_decode[rid] -= 1
                if left_to_decode[rid] == 0:
                    decoding.remove(rid)
            else:
                computed[rid] += n
                chunk_sum[rid] += n
                if computed[rid] == by_id[rid]["prompt_len"]:
                    decoding.append(rid)
    bad = [rid for rid, r in by_id.items() if chunk_sum[rid] != r["prompt_len"]]
    t.expect_true(not bad, f"prompts {bad} were not prefilled exactly once (sum of chunks != prompt_len)")


@check(points=3, section="1.1")
def plan_step(t):
    """Decodes first, then FCFS chunks, never over the budget, every prompt prefilled exactly once."""
    cases = [("visible: budget 16, two decodes, prompts of 40, 7 and 25 tokens",
              (16, [{"id": "d0", "prompt_len": 3, "arrive": 0, "decode": 6},
                    {"id": "d1", "prompt_len": 4, "arrive": 0, "decode": 9},
                    {"id": "p0", "prompt_len": 40, "arrive": 1, "decode": 3},
                    {"id": "p1", "prompt_len": 7, "arrive": 2, "decode": 2},
                    {"id": "p2", "prompt_len": 25, "arrive": 2, "decode": 4}])),
             ("visible: budget 8, one long prompt among three decodes",
              (8, [{"id": f"d{i}", "prompt_len": 2, "arrive": 0, "decode": 12} for i in range(3)]
               + [{"id": "long", "prompt_len": 30, "arrive": 1, "decode": 2}]))]
    for k in range(2):
        budget = t.rng.randint(6, 32)
        cases.append((f"hidden run {k + 1}: budget {budget}",
                      scenario(t.rng, budget, t.rng.randint(1, 4), t.rng.randint(3, 5), 3 * budget)))
    for label, (budget, reqs) in cases:
        with t.case(label):
            simulate(t, budget, reqs)


# -- 1.2 the policy in the engine ------------------------------------------------------------------

TARGET = Path(__file__).resolve().parents[2] / "reference_engine" / "checkpoints" / "target"


def _ref_policy(candidates, budget, need=lambda s: s.num_uncomputed_tokens, skip=False, whole=False):
    picked = []
    for seq in candidates:
        n = need(seq)
        if budget.chunked_prefill and not whole:
            n = min(n, budget.tokens)
        if not budget.try_take(seq, n):
            if skip:
                continue
            break
        picked.append((seq, n))
    return picked


POLICY_MISTAKES = {
    "lets a later request overtake one that does not fit (FCFS stops at the first that does not fit)":
        dict(skip=True),
    "asks for a prompt's full length (num_prompt_tokens) instead of what is still uncomputed "
    "(num_uncomputed_tokens), so partly prefilled prompts cannot continue and get prefilled again":
        dict(need=lambda s: s.num_prompt_tokens),
    "admits a prompt whole even when it is larger than the budget left (take min(num_uncomputed_tokens, "
    "budget.tokens) when budget.chunked_prefill)": dict(whole=True),
}

ENGINE_ERRORS = [  # (phrase in the engine's RuntimeError, the mistake it reveals)
    ("> max_num_batched_tokens", "admits more tokens than the budget left after the decodes (budget.tokens)"),
    ("but chunked prefill is off", "chunks prompts although budget.chunked_prefill is False"),
    ("KV blocks, only", "schedules tokens without checking the free KV blocks (use budget.try_take)"),
    ("tokens to", "gives a prompt more tokens than it still needs (num_uncomputed_tokens)"),
    ("admitted nothing", "never schedules a prompt that is larger than the budget left (chunk it)"),
]


class _Recorder:
    """Wraps the learner's policy: replays each call against the reference on a copy of the budget."""

    def __init__(self, policy):
        self.policy, self.first_mismatch = policy, None

    def schedule(self, candidates, budget):
        ref = [(s.seq_id, n) for s, n in _ref_policy(candidates, copy.copy(budget))]
        wrong = {m: [(s.seq_id, n) for s, n in _ref_policy(candidates, copy.copy(budget), **kw)]
                 for m, kw in POLICY_MISTAKES.items()}
        tokens = budget.tokens
        picked = self.policy.schedule(list(candidates), budget)
        try:
            got = [(s.seq_id, n) for s, n in picked]
        except Exception:  # noqa: BLE001 - let the engine's own validation report the shape
            got = None
        if got != ref and self.first_mismatch is None:
            named = next((m for m, w in wrong.items() if w == got), None)
            self.first_mismatch = (tokens, ref, got, named)
        return picked


def _prompts(rng, n, lo, hi):
    return [[rng.randrange(1, 2048) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _run(llm_kwargs, prompts, policy, max_tokens, max_steps=10_000):
    """Run the prompts to completion (at most max_steps steps); returns the engine and token ids."""
    from reference_engine import LLM, SamplingParams
    engine = LLM(str(TARGET), scheduler_policy=policy, **llm_kwargs).engine
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished() and len(engine.step_stats) < max_steps:
        for out in engine.step():
            if out.output is not None:
                done[out.request_id] = out.output.token_ids
    return engine, [done.get(i) for i in ids]


def engine_case(t, llm_kwargs, prompts, max_tokens):
    from reference_engine.scheduler import FCFSPolicy
    ref_engine, ref_tokens = _run(llm_kwargs, prompts, FCFSPolicy(), max_tokens)
    learner = t.call("ChunkedPrefillPolicy")
    rec = _Recorder(learner)
    try:
        engine, tokens = _run(llm_kwargs, prompts, rec, max_tokens, max_steps=4 * len(ref_engine.step_stats) + 20)
    except NotImplementedError as e:
        raise NotStarted(str(e)) from None
    except Exception as e:  # noqa: BLE001 - the engine refused the policy's decisions, or the policy raised
        named = (rec.first_mismatch or (0, 0, 0, None))[3] or \
            next((m for phrase, m in ENGINE_ERRORS if phrase in str(e)), None)
        t.fail(("Looks like your code " + named + ".\n" if named else "") +
               f"The engine stopped with your policy:\n{learner_traceback(e, ())}")
    stuck = engine.has_unfinished()
    if rec.first_mismatch:
        tokens_left, ref, got, named = rec.first_mismatch
        t.fail(f"with budget.tokens={tokens_left} your policy returned (seq_id, tokens) {got}, expected {ref}."
               + (f" Looks like your code {named}." if named else "")
               + (f" The run did not finish in {len(engine.step_stats)} steps (FCFS needs "
                  f"{len(ref_engine.step_stats)})." if stuck else ""))
    t.expect_true(not stuck, f"the requests did not finish in {len(engine.step_stats)} steps (FCFS needs "
                  f"{len(ref_engine.step_stats)}): does your policy make progress?")
    t.expect(tokens, ref_tokens, "generated token ids (greedy) vs the engine's own policy")
    limit = engine.max_num_batched_tokens
    over = [s.step for s in engine.step_stats if s.num_prefill_tokens + s.num_decode_tokens > limit]
    t.expect_true(not over, f"steps {over} computed more than max_num_batched_tokens={limit} tokens")
    t.expect(sum(s.num_prefill_tokens for s in engine.step_stats),
             sum(s.num_prefill_tokens for s in ref_engine.step_stats), "prompt tokens prefilled in all")
    bm = engine.block_manager
    t.expect(bm.num_free(), engine.num_blocks, "free KV blocks after every request finished (a leak?)")
    bm.check_consistency([])


@check(points=3, section="1.2", timeout=60)
def chunked_policy_in_engine(t):
    """The policy in the engine: reference tokens, budget held, no re-prefill, no leaked blocks."""
    cases = [("visible: chunked, budget 16, 6 KV blocks of 16 (forces preemption)",
              dict(num_blocks=6, max_num_seqs=4, max_num_batched_tokens=16), _prompts(t.rng, 5, 10, 40)),
             ("visible: chunked prefill off, budget 96, 6 KV blocks of 16",
              dict(num_blocks=6, max_num_seqs=4, max_num_batched_tokens=96, enable_chunked_prefill=False),
              [p[:n] for p, n in zip(_prompts(t.rng, 4, 40, 40), (30, 30, 40, 12))])]
    budget = t.rng.randint(8, 24)
    cases.append((f"hidden: chunked, budget {budget}",
                  dict(num_blocks=t.rng.randint(6, 10), max_num_seqs=t.rng.randint(3, min(6, budget)),
                       max_num_batched_tokens=budget), _prompts(t.rng, t.rng.randint(4, 6), 8, 40)))
    for label, kwargs, prompts in cases:
        with t.case(f"{label}, prompts of {[len(p) for p in prompts]} tokens"):
            engine_case(t, kwargs, prompts, max_tokens=6)


# -- 2.1 step time ---------------------------------------------------------------------------------


def random_cost(rng) -> dict:
    return {"overhead_s": rng.uniform(2e-3, 2e-2), "per_token_s": rng.uniform(1e-5, 2e-4),
            "per_attn_s": rng.choice([0.0, rng.uniform(1e-9, 1e-7)])}


def step_time_mistakes(cost, d, ctx, chunk, start) -> dict:
    o, a, b = cost["overhead_s"], cost["per_token_s"], cost["per_attn_s"]
    causal = chunk * start + chunk * (chunk + 1) // 2
    return {"forgets the decode tokens in the step (they cost per-token and attention time too)":
                o + a * chunk + b * causal,
            "lets each chunk token attend only the chunk itself, not the context computed before it":
                o + a * (d + chunk) + b * (d * ctx + chunk * (chunk + 1) // 2),
            "lets every chunk token attend the whole chunk (not causal: position p attends p + 1 keys)":
                o + a * (d + chunk) + b * (d * ctx + chunk * (start + chunk)),
            "leaves out the fixed per-step overhead": a * (d + chunk) + b * (d * ctx + causal)}


@check(points=2, section="2.1")
def step_time(t):
    """Overhead + per-token cost of decode and chunk tokens + causal attention pairs."""
    base = {"overhead_s": 0.01, "per_token_s": 1e-4, "per_attn_s": 1e-8}
    cases = [("visible: 8 decodes, a 56-token chunk at the start", (base, 8, 100, 56, 0)),
             ("visible: 4 decodes, a 100-token chunk after 300 computed", (base, 4, 250, 100, 300)),
             ("visible: decode-only step", (base, 16, 40, 0, 0))]
    for k in range(2):
        c = random_cost(t.rng)
        c["per_attn_s"] = c["per_attn_s"] or 3e-8
        cases.append((f"hidden {k + 1}", (c, t.rng.randint(1, 64), t.rng.randint(1, 4000),
                                          t.rng.randint(1, 2048), t.rng.randint(0, 8000))))
    for label, args in cases:
        with t.case(f"{label}: decodes={args[1]}, decode_context={args[2]}, chunk={args[3]}, start={args[4]}"):
            expected = t.ref.step_time(*args)
            got = t.call("step_time", *args)
            t.expect(got, expected, "step time (s)", rtol=1e-6, mistakes=step_time_mistakes(*args))


# -- 2.2 the budget --------------------------------------------------------------------------------


def _wrong_choice(t, cost, slo, P, d, ctx, floor=False, mean=False, no_decodes=False):
    for budget in range(d + P, d, -1):
        share = budget if no_decodes else budget - d
        if no_decodes and share > P:
            continue
        starts = range(0, share * (P // share), share) if floor else range(0, P, share)
        times = [t.ref.step_time(cost, d, ctx, min(share, P - s), s) for s in starts]
        if not times:
            continue
        worst = sum(times) / len(times) if mean else max(times)
        if worst <= slo:
            return {"budget": budget, "num_steps": len(times), "ttft_s": sum(times), "max_step_s": max(times)}
    return None


def budget_case(rng, P_max):
    cost = random_cost(rng)
    d, ctx, P = rng.randint(2, 32), rng.randint(10, 400), rng.randint(50, P_max)
    slo = cost["overhead_s"] + cost["per_token_s"] * (d + rng.randint(8, 300)) + cost["per_attn_s"] * d * ctx
    return cost, slo, P, d, ctx


@check(points=3, section="2.2")
def choose_budget(t):
    """The largest budget whose every step meets the ITL SLO; its steps, TTFT and worst step."""
    lin = {"overhead_s": 0.01, "per_token_s": 1e-4, "per_attn_s": 0.0}
    attn = {"overhead_s": 0.008, "per_token_s": 5e-5, "per_attn_s": 2e-8}
    cases = [("visible: linear cost, SLO 31 ms, 1000-token prompt, 8 decodes", (lin, 0.031, 1000, 8, 100)),
             ("visible: with attention cost, SLO 25 ms, 3000-token prompt, 16 decodes", (attn, 0.025, 3000, 16, 500))]
    cases += [(f"hidden {k + 1}", budget_case(t.rng, 3000)) for k in range(2)]
    for label, (cost, slo, P, d, ctx) in cases:
        with t.case(f"{label} (cost {cost}, slo {slo:.4g} s, prompt {P}, decodes {d}, context {ctx})"):
            expected = t.ref.choose_budget(cost, slo, P, d, ctx)
            got = t.call("choose_budget", cost, slo, P, d, ctx)
            t.expect_true(isinstance(got, dict), f"choose_budget() must return a dict, got {type(got).__name__}")
            args = (cost, slo, P, d, ctx)
            mistakes = {"rounds the number of chunks down (a partial last chunk is still a step: use ceil)":
                            _wrong_choice(t, *args, floor=True),
                        "checks the mean step time against the SLO instead of the slowest step":
                            _wrong_choice(t, *args, mean=True),
                        "forgets the decode tokens in the budget (each step's chunk is budget - num_decodes)":
                            _wrong_choice(t, *args, no_decodes=True)}
            mistakes = {k: v for k, v in mistakes.items() if v is not None}
            t.expect(got, expected, "choose_budget result", rtol=1e-6, mistakes=mistakes)
    with t.case("an SLO below a decode-only step raises ValueError"):
        try:
            t.call("choose_budget", lin, 0.005, 100, 4, 10)
        except LearnerRaised as e:
            if not isinstance(e.exc, ValueError):
                raise
        else:
            t.fail("choose_budget() returned a result for an SLO no step can meet; raise ValueError")
