"""Wrong answers to lesson 07 that its checks must catch, one per typical mistake.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here
are prefixed `_m_`, and a wrong policy class is given as a factory function of the class's name (the
engine harness calls it as it would call the class)."""
import math

from solutions import l07_chunked_prefill as sol
from tests.mutants import mutant


def _m_by_arrival(queue):
    return sorted(queue, key=lambda r: r["arrival"])


# -- 1.1 plan_step ----------------------------------------------------------------------------------

@mutant(check="plan_step", message="prefill chunks before the running decodes")
def plan_step(decode_ids, prefill_queue, budget):
    plan, left = [], budget
    for r in _m_by_arrival(prefill_queue):
        if left <= 0:
            break
        n = min(r["prompt_len"] - r["computed"], left)
        plan.append((r["id"], n))
        left -= n
    return plan + [(d, 1) for d in decode_ids[:left]]


@mutant(check="plan_step", message="prefills them again")
def plan_step(decode_ids, prefill_queue, budget):  # noqa: F811 - each mutant is its own wrong answer
    plan, left = [(d, 1) for d in decode_ids], budget - len(decode_ids)
    for r in _m_by_arrival(prefill_queue):
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
    for r in _m_by_arrival(prefill_queue):
        if left <= 0:
            break
        plan.append((r["id"], r["prompt_len"] - r["computed"]))
        left -= r["prompt_len"] - r["computed"]
    return plan


@mutant(check="plan_step", message="one token more than the budget left")
def plan_step(decode_ids, prefill_queue, budget):  # noqa: F811
    return sol.plan_step(decode_ids, prefill_queue, budget + 1)  # off by one: `left <= budget - decodes + 1`


@mutant(check="plan_step", message="queue order instead of arrival order")
def plan_step(decode_ids, prefill_queue, budget):  # noqa: F811
    queue = [{**r, "arrival": float(i)} for i, r in enumerate(prefill_queue)]
    return sol.plan_step(decode_ids, queue, budget)


@mutant(check="plan_step", message="breaks ties in arrival by id")
def plan_step(decode_ids, prefill_queue, budget):  # noqa: F811
    queue = sorted(prefill_queue, key=lambda r: (r["arrival"], r["id"]))  # reorders equal arrivals
    return sol.plan_step(decode_ids, queue, budget)


@mutant(check="plan_step", message="lists prompts that get 0 tokens")
def plan_step(decode_ids, prefill_queue, budget):  # noqa: F811
    plan, left = [(d, 1) for d in decode_ids], budget - len(decode_ids)
    for r in _m_by_arrival(prefill_queue):  # no early stop: the budget runs out, prompts still listed
        n = min(r["prompt_len"] - r["computed"], left)
        plan.append((r["id"], n))
        left -= n
    return plan


# -- 1.2 the engine policy --------------------------------------------------------------------------
# Each wrong policy takes the right one's arguments; `_m_Base` keeps them and the loop the wrong versions
# change one line of.

class _m_Base:
    def __init__(self, long_prefill_token_threshold, max_long_partial_prefills=1):
        self.t, self.m = long_prefill_token_threshold, max_long_partial_prefills

    def is_long(self, seq):
        return seq.num_uncomputed_tokens > self.t

    def held(self, seq, longs):
        return self.is_long(seq) and longs >= self.m

    def chunk(self, seq, budget):
        return min(seq.num_uncomputed_tokens, self.t, budget.tokens)

    def schedule(self, candidates, budget):
        picked, longs = [], 0
        for seq in candidates:
            n = seq.num_uncomputed_tokens
            if budget.chunked_prefill:
                if self.held(seq, longs):
                    continue
                n = self.chunk(seq, budget)
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
            longs += self.is_long(seq)
        return picked


class _m_NoThreshold(_m_Base):
    """Holds long prompts back, but lets each take all the budget left (lesson 03's chunk)."""

    def chunk(self, seq, budget):
        return min(seq.num_uncomputed_tokens, budget.tokens)


class _m_NoBudgetMin(_m_Base):
    def chunk(self, seq, budget):
        return min(seq.num_uncomputed_tokens, self.t)


class _m_NoLongCap(_m_Base):
    """Chunks of at most the threshold, but every long prompt goes: FCFS with smaller chunks."""

    def held(self, seq, longs):
        return False


class _m_CapsEveryPrompt(_m_Base):
    """Counts every prompt it picks against max_long_partial_prefills."""

    def schedule(self, candidates, budget):
        picked = []
        for seq in candidates:
            n = seq.num_uncomputed_tokens
            if budget.chunked_prefill:
                if len(picked) >= self.m:
                    continue
                n = self.chunk(seq, budget)
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
        return picked


class _m_StopsAtHeld(_m_Base):
    """Stops the step at the first long prompt past the cap, so nothing behind it goes."""

    def schedule(self, candidates, budget):
        picked, longs = [], 0
        for seq in candidates:
            n = seq.num_uncomputed_tokens
            if budget.chunked_prefill:
                if self.held(seq, longs):
                    break
                n = self.chunk(seq, budget)
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
            longs += self.is_long(seq)
        return picked


class _m_LongByPromptLength(_m_Base):
    def is_long(self, seq):
        return seq.num_prompt_tokens > self.t


class _m_LongAtThreshold(_m_Base):
    def is_long(self, seq):
        return seq.num_uncomputed_tokens >= self.t


class _m_CapsUnchunked(_m_Base):
    """Holds long prompts back whether or not prompts are chunked."""

    def schedule(self, candidates, budget):
        picked, longs = [], 0
        for seq in candidates:
            if self.held(seq, longs):
                continue
            n = self.chunk(seq, budget) if budget.chunked_prefill else seq.num_uncomputed_tokens
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
            longs += self.is_long(seq)
        return picked


class _m_SkipAhead(_m_Base):
    def schedule(self, candidates, budget):
        picked, longs = [], 0
        for seq in candidates:
            n = seq.num_uncomputed_tokens
            if budget.chunked_prefill:
                if self.held(seq, longs):
                    continue
                n = self.chunk(seq, budget)
            if budget.try_take(seq, n):  # no break: a later one that fits goes ahead
                picked.append((seq, n))
                longs += self.is_long(seq)
        return picked


class _m_FullPrompt(_m_Base):
    def chunk(self, seq, budget):
        return min(seq.num_prompt_tokens, self.t, budget.tokens)


class _m_NoChunking(_m_Base):
    def chunk(self, seq, budget):
        return seq.num_uncomputed_tokens


class _m_IgnoresBudgetLeft(_m_Base):
    """Takes tokens without asking the budget (as if the decodes had not spent any of it)."""

    def schedule(self, candidates, budget):
        picked, left, longs = [], budget.tokens + 4, 0
        for seq in candidates:
            if budget.chunked_prefill and self.held(seq, longs):
                continue
            n = min(seq.num_uncomputed_tokens, self.t, left) if budget.chunked_prefill else seq.num_uncomputed_tokens
            if n <= 0:
                break
            picked.append((seq, n))
            left -= n
            longs += self.is_long(seq)
        return picked


class _m_TokensOnly(_m_Base):
    """Counts the tokens itself and never asks budget.try_take (KV blocks and slots unchecked)."""

    def schedule(self, candidates, budget):
        picked, left, longs = [], budget.tokens, 0
        for seq in candidates:
            n = seq.num_uncomputed_tokens
            if budget.chunked_prefill:
                if self.held(seq, longs):
                    continue
                n = min(n, self.t, left)
            if not 0 < n <= left:
                break
            picked.append((seq, n))
            left -= n
            longs += self.is_long(seq)
        return picked


class _m_AlwaysChunks(_m_Base):
    """Chunks whatever the switch says: with chunked prefill off, a prompt must go whole or wait."""

    def schedule(self, candidates, budget):
        picked, longs = [], 0
        for seq in candidates:
            if self.held(seq, longs):
                continue
            n = self.chunk(seq, budget)
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
            longs += self.is_long(seq)
        return picked


class _m_WaitingOnly:
    """Serves the waiting queue only: a prompt it started never gets its next chunk."""

    def __init__(self, *args):
        self.right = sol.ChunkedPrefillPolicy(*args)

    def schedule(self, candidates, budget):
        return self.right.schedule([s for s in candidates if s.is_waiting], budget)


@mutant(check="chunked_policy_in_engine", message="no chunk is larger than long_prefill_token_threshold")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):
    return _m_NoThreshold(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="but not at budget.tokens")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_NoBudgetMin(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="never holds a long prompt back")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_NoLongCap(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="counts every prompt against max_long_partial_prefills")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_CapsEveryPrompt(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="stops the step at a long prompt held back by the cap")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_StopsAtHeld(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="decides a prompt is long by num_prompt_tokens")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_LongByPromptLength(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="exactly long_prefill_token_threshold tokens left as long")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_LongAtThreshold(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="holds long prompts back with chunking off too")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_CapsUnchunked(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="overtake one that does not fit")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_SkipAhead(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="instead of what is still uncomputed")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_FullPrompt(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="admits a prompt whole")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_NoChunking(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="more tokens than the budget left")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_IgnoresBudgetLeft(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="without budget.try_take")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_TokensOnly(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="never continues a started prompt")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_WaitingOnly(long_prefill_token_threshold, max_long_partial_prefills)


@mutant(check="chunked_policy_in_engine", message="chunks a prompt although budget.chunked_prefill is False")
def ChunkedPrefillPolicy(long_prefill_token_threshold, max_long_partial_prefills=1):  # noqa: F811
    return _m_AlwaysChunks(long_prefill_token_threshold, max_long_partial_prefills)


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


@mutant(check="step_time", message="off by one in the causal sum")
def step_time(cost, num_decodes, decode_context, chunk, chunk_start):  # noqa: F811
    pairs = num_decodes * decode_context + sum(range(chunk_start, chunk_start + chunk))  # p keys, not p + 1
    return cost["overhead_s"] + cost["per_token_s"] * (num_decodes + chunk) + cost["per_attn_s"] * pairs


@mutant(check="step_time", message="counts the decodes' attention once")
def step_time(cost, num_decodes, decode_context, chunk, chunk_start):  # noqa: F811
    pairs = decode_context + chunk * chunk_start + chunk * (chunk + 1) // 2
    return cost["overhead_s"] + cost["per_token_s"] * (num_decodes + chunk) + cost["per_attn_s"] * pairs


# -- 2.2 choose_budget ------------------------------------------------------------------------------

def _m_choose(cost, slo, P, d, ctx, floor=False, mean=False, share_of=lambda b, d: b - d, budgets=None,
              meets=lambda worst, slo: worst <= slo, ttft=sum):
    for budget in budgets or range(d + P, d, -1):
        share = share_of(budget, d)
        if share > P:
            continue
        n = P // share if floor else math.ceil(P / share)
        times = [sol.step_time(cost, d, ctx, min(share, P - k * share), k * share) for k in range(n)]
        if not times:
            continue
        if meets(sum(times) / len(times) if mean else max(times), slo):
            return {"budget": budget, "num_steps": n, "ttft_s": ttft(times), "max_step_s": max(times)}
    raise ValueError("no budget meets the SLO")


@mutant(check="choose_budget", message="rounds the number of chunks down")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):
    return _m_choose(cost, itl_slo_s, prompt_len, num_decodes, decode_context, floor=True)


@mutant(check="choose_budget", message="mean step time")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    return _m_choose(cost, itl_slo_s, prompt_len, num_decodes, decode_context, mean=True)


@mutant(check="choose_budget", message="forgets the decode tokens in the budget")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    return _m_choose(cost, itl_slo_s, prompt_len, num_decodes, decode_context, share_of=lambda b, d: b)


@mutant(check="choose_budget", message="returns the smallest budget")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    return _m_choose(cost, itl_slo_s, prompt_len, num_decodes, decode_context,
                     budgets=range(num_decodes + 1, num_decodes + prompt_len + 1))


@mutant(check="choose_budget", message="takes exactly the SLO")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    return _m_choose(cost, itl_slo_s, prompt_len, num_decodes, decode_context, meets=lambda w, slo: w < slo)


@mutant(check="choose_budget", message="num_steps times the slowest step")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    return _m_choose(cost, itl_slo_s, prompt_len, num_decodes, decode_context, ttft=lambda ts: len(ts) * max(ts))


@mutant(check="choose_budget", message="times the last chunk as a full chunk")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    """The last chunk charged as a whole chunk, not what remains of the prompt."""
    for budget in range(num_decodes + prompt_len, num_decodes, -1):
        share = budget - num_decodes
        times = [sol.step_time(cost, num_decodes, decode_context, share, start) for start in range(0, prompt_len, share)]
        if max(times) <= itl_slo_s:
            return {"budget": budget, "num_steps": len(times), "ttft_s": sum(times), "max_step_s": max(times)}
    raise ValueError("no budget meets the SLO")


@mutant(check="choose_budget", message="never tries the largest budget")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    return _m_choose(cost, itl_slo_s, prompt_len, num_decodes, decode_context,
                     budgets=range(num_decodes + prompt_len - 1, num_decodes, -1))


@mutant(check="choose_budget", message="as if it started at position 0")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    for budget in range(num_decodes + prompt_len, num_decodes, -1):
        share = budget - num_decodes
        times = [sol.step_time(cost, num_decodes, decode_context, min(share, prompt_len - s), 0)
                 for s in range(0, prompt_len, share)]
        if max(times) <= itl_slo_s:
            return {"budget": budget, "num_steps": len(times), "ttft_s": sum(times), "max_step_s": max(times)}
    raise ValueError("no budget meets the SLO")


@mutant(check="choose_budget", message="instead of raising ValueError")
def choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context):  # noqa: F811
    try:
        return sol.choose_budget(cost, itl_slo_s, prompt_len, num_decodes, decode_context)
    except ValueError:
        return None  # "no budget" as a value instead of the documented ValueError


@mutant(check="choose_budget", message="depends on step_time, which fails")
def step_time(cost, num_decodes, decode_context, chunk, chunk_start):  # noqa: F811
    """A right choose_budget over a wrong step_time (chunks timed from position 0): blamed on step_time."""
    return sol.step_time(cost, num_decodes, decode_context, chunk, 0)


# -- 3.1 prefill_chunks ------------------------------------------------------------------------------

def _m_chunks(start, prompt_len, sizes):
    """Chunks from `start`: sizes[i] tokens for the i-th chunk (the last size repeats), the last one what remains."""
    chunks = []
    while start < prompt_len:
        n = min(sizes[min(len(chunks), len(sizes) - 1)], prompt_len - start)
        chunks.append((start, n))
        start += n
    return chunks


def _m_aligned(chunk_budget, block_size, align):
    if not align:
        return chunk_budget
    if chunk_budget < block_size:
        raise ValueError("budget smaller than a block")
    return chunk_budget // block_size * block_size


@mutant(check="prefill_chunks", message="ignores the rule that the prompt's last token is always computed")
def prefill_chunks(prompt_len, cached_blocks, block_size, chunk_budget, align=False):
    start = min(cached_blocks * block_size, prompt_len)  # a fully cached prompt: nothing left to compute
    return _m_chunks(start, prompt_len, [_m_aligned(chunk_budget, block_size, align)])


@mutant(check="prefill_chunks", message="uses prompt_len // block_size")
def prefill_chunks(prompt_len, cached_blocks, block_size, chunk_budget, align=False):  # noqa: F811
    start = block_size * min(cached_blocks, prompt_len // block_size)
    return _m_chunks(start, prompt_len, [_m_aligned(chunk_budget, block_size, align)])


@mutant(check="prefill_chunks", message="counts the hit in tokens")
def prefill_chunks(prompt_len, cached_blocks, block_size, chunk_budget, align=False):  # noqa: F811
    start = min(cached_blocks * block_size, prompt_len - 1)  # keeps the last token, but not its block
    return _m_chunks(start, prompt_len, [_m_aligned(chunk_budget, block_size, align)])


@mutant(check="prefill_chunks", message="reads cached_blocks as a number of tokens")
def prefill_chunks(prompt_len, cached_blocks, block_size, chunk_budget, align=False):  # noqa: F811
    return _m_chunks(min(cached_blocks, prompt_len - 1), prompt_len, [_m_aligned(chunk_budget, block_size, align)])


@mutant(check="prefill_chunks", message="aligns only the first chunk")
def prefill_chunks(prompt_len, cached_blocks, block_size, chunk_budget, align=False):  # noqa: F811
    start = block_size * min(cached_blocks, (prompt_len - 1) // block_size)
    return _m_chunks(start, prompt_len, [_m_aligned(chunk_budget, block_size, align), chunk_budget])


@mutant(check="prefill_chunks", message="rounds the aligned chunk up")
def prefill_chunks(prompt_len, cached_blocks, block_size, chunk_budget, align=False):  # noqa: F811
    start = block_size * min(cached_blocks, (prompt_len - 1) // block_size)
    step = math.ceil(chunk_budget / block_size) * block_size if align else chunk_budget
    return _m_chunks(start, prompt_len, [step])


@mutant(check="prefill_chunks", message="returns the chunk lengths only")
def prefill_chunks(prompt_len, cached_blocks, block_size, chunk_budget, align=False):  # noqa: F811
    return [n for _, n in sol.prefill_chunks(prompt_len, cached_blocks, block_size, chunk_budget, align)]


@mutant(check="prefill_chunks", message="instead of raising ValueError")
def prefill_chunks(prompt_len, cached_blocks, block_size, chunk_budget, align=False):  # noqa: F811
    start = block_size * min(cached_blocks, (prompt_len - 1) // block_size)
    step = max(block_size, chunk_budget // block_size * block_size) if align else chunk_budget  # one block at least
    return _m_chunks(start, prompt_len, [step])
