"""Wrong answers to lesson 07 that its checks must catch, one per typical mistake."""
import math

from solutions import l07_chunked_prefill as sol
from tests.mutants import mutant


def _by_arrival(queue):
    return sorted(queue, key=lambda r: r["arrival"])


# -- 1.1 plan_step ----------------------------------------------------------------------------------

@mutant(check="plan_step", message="prefill chunks before the running decodes")
def plan_step(decode_ids, prefill_queue, budget):
    plan, left = [], budget
    for r in _by_arrival(prefill_queue):
        if left <= 0:
            break
        n = min(r["prompt_len"] - r["computed"], left)
        plan.append((r["id"], n))
        left -= n
    return plan + [(d, 1) for d in decode_ids[:left]]


@mutant(check="plan_step", message="prefills them again")
def plan_step(decode_ids, prefill_queue, budget):  # noqa: F811 - each mutant is its own wrong answer
    plan, left = [(d, 1) for d in decode_ids], budget - len(decode_ids)
    for r in _by_arrival(prefill_queue):
        if left <= 0:
            break
        n = min(r["prompt_len"], left)
        plan.append((r["id"], n))
        left -= n
    return plan


@mutant(check="plan_step", message="decode tokens count against the budget")
def plan_step(decode_ids, prefill_queue, budget):  # noqa: F811
    plan = sol.plan_step([], prefill_queue, budget)
    return [(d, 1) for d in decode_ids] + plan


@mutant(check="plan_step", message="admits a prompt whole")
def plan_step(decode_ids, prefill_queue, budget):  # noqa: F811
    plan, left = [(d, 1) for d in decode_ids], budget - len(decode_ids)
    for r in _by_arrival(prefill_queue):
        if left <= 0:
            break
        plan.append((r["id"], r["prompt_len"] - r["computed"]))
        left -= r["prompt_len"] - r["computed"]
    return plan


@mutant(check="plan_step", message="queue order instead of arrival order")
def plan_step(decode_ids, prefill_queue, budget):  # noqa: F811
    queue = [{**r, "arrival": float(i)} for i, r in enumerate(prefill_queue)]
    return sol.plan_step(decode_ids, queue, budget)


# -- 1.2 the engine policy --------------------------------------------------------------------------

class _SkipAhead:
    def schedule(self, candidates, budget):
        picked = []
        for seq in candidates:
            n = min(seq.num_uncomputed_tokens, budget.tokens) if budget.chunked_prefill else seq.num_uncomputed_tokens
            if budget.try_take(seq, n):
                picked.append((seq, n))
        return picked


class _FullPrompt:
    def schedule(self, candidates, budget):
        picked = []
        for seq in candidates:
            n = min(seq.num_prompt_tokens, budget.tokens) if budget.chunked_prefill else seq.num_uncomputed_tokens
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
        return picked


class _NoChunking:
    def schedule(self, candidates, budget):
        picked = []
        for seq in candidates:
            if not budget.try_take(seq, seq.num_uncomputed_tokens):
                break
            picked.append((seq, seq.num_uncomputed_tokens))
        return picked


class _IgnoresBudgetLeft:
    """Takes tokens without asking the budget (as if the decodes had not spent any of it)."""
    def schedule(self, candidates, budget):
        picked, left = [], budget.tokens + 4
        for seq in candidates:
            n = min(seq.num_uncomputed_tokens, left) if budget.chunked_prefill else seq.num_uncomputed_tokens
            if n <= 0:
                break
            picked.append((seq, n))
            left -= n
        return picked


mutant(check="chunked_policy_in_engine", message="overtake one that does not fit")(
    type("ChunkedPrefillPolicy", (_SkipAhead,), {}))
mutant(check="chunked_policy_in_engine", message="instead of what is still uncomputed")(
    type("ChunkedPrefillPolicy", (_FullPrompt,), {}))
mutant(check="chunked_policy_in_engine", message="admits a prompt whole")(
    type("ChunkedPrefillPolicy", (_NoChunking,), {}))
mutant(check="chunked_policy_in_engine", message="more tokens than the budget left")(
    type("ChunkedPrefillPolicy", (_IgnoresBudgetLeft,), {}))


# -- 2.1 step_time ----------------------------------------------------------------------------------

@mutant(check="step_time", message="forgets the decode tokens")
def step_time(cost, num_decodes, decode_context, chunk, chunk_start):
    return sol.step_time(cost, 0, decode_context, chunk, chunk_start)


@mutant(check="step_time", message="not causal")
def step_time(cost, num_decodes, decode_context, chunk, chunk_start):  # noqa: F811
    return (cost["overhead_s"] + cost["per_token_s"] * (num_decodes + chunk)
            + cost["per_attn_s"] * (num_decodes * decode_context + chunk * (chunk_start + chunk)))


@mutant(check="step_time", message="not the context computed before it")
def step_time(cost, num_decodes, decode_context, chunk, chunk_start):  # noqa: F811
    return sol.step_time(cost, num_decodes, decode_context, chunk, 0)


# -- 2.2 choose_budget ------------------------------------------------------------------------------

def _choose(cost, slo, P, d, ctx, floor=False, mean=False, share_of=lambda b, d: b - d):
    for budget in range(d + P, d, -1):
        share = share_of(budget, d)
        if share > P:
            continue
        n = P // share if floor else math.ceil(P / share)
        times = [sol.step_time(cost, d, ctx, min(share, P - k * share), k * share) for k in range(n)]
        if not times:
            continue
        if (sum(times) / len(times) if mean else max(times)) <= slo:
            return {"budget": budget, "num_steps": n, "ttft_s": sum(times), "max_step_s": max(times)}
    raise ValueError("no budget meets the SLO")


@mutant(check="choose_budget", message="rounds the number of chunks down")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):
    return _choose(cost, itl_slo_s, prompt_len, num_decodes, decode_context, floor=True)


@mutant(check="choose_budget", message="mean step time")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    return _choose(cost, itl_slo_s, prompt_len, num_decodes, decode_context, mean=True)


@mutant(check="choose_budget", message="forgets the decode tokens in the budget")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    return _choose(cost, itl_slo_s, prompt_len, num_decodes, decode_context, share_of=lambda b, d: b)
