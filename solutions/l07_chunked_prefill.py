"""Lesson 07: chunked prefill. One token budget per engine step, spent on running decodes first and
then on slices ("chunks") of prompts, first come first served; vLLM's partial-prefill controls
(long_prefill_token_threshold, and V0's max_long_partial_prefills), which keep one long prompt from taking every
prefill token so that short prompts behind it get their first token quickly; and the budget that keeps
every step under an inter-token-latency SLO while getting a long prompt its first token as soon as
possible.

Times are in seconds. A "budget" counts every token a step computes, decode tokens included (vLLM's
max_num_batched_tokens).
"""
from __future__ import annotations

# -- 1. scheduling with a token budget ---------------------------------------------------------------

def plan_step(decode_ids: list[str], prefill_queue: list[dict], budget: int) -> list[tuple[str, int]]:
    """Exercise 1.1: one scheduler step under a per-step token budget (a pure function).

    decode_ids: the running sequences in decode, oldest first; each needs exactly 1 token this step.
    prefill_queue: prompts still to prefill, each {"id": str, "prompt_len": int, "computed": int,
      "arrival": float}; "computed" prompt tokens are already in the KV cache (earlier chunks), so
      prompt_len - computed (>= 1) remain. Not necessarily in arrival order.
    budget: tokens this step may compute in all, decodes included; budget >= len(decode_ids).

    Returns [(id, num_tokens), ...] in batch order: every decode with 1 token, in the given order;
    then prefill chunks in arrival order (FCFS; equal arrivals keep queue order), each taking
    min(remaining prompt tokens, budget left), until the budget is spent. Prompts that get no
    tokens are left out. The total never exceeds budget.

    >>> q = [{"id": "b", "prompt_len": 30, "computed": 0, "arrival": 2.0},
    ...      {"id": "a", "prompt_len": 50, "computed": 40, "arrival": 1.0}]
    >>> plan_step(["d0", "d1"], q, 16)
    [('d0', 1), ('d1', 1), ('a', 10), ('b', 4)]
    """
    ### BEGIN SOLUTION
    plan = [(d, 1) for d in decode_ids]
    left = budget - len(decode_ids)
    for req in sorted(prefill_queue, key=lambda r: r["arrival"]):  # sorted() is stable: ties keep order
        if left <= 0:
            break
        n = min(req["prompt_len"] - req["computed"], left)
        plan.append((req["id"], n))
        left -= n
    return plan
    ### END SOLUTION


class ChunkedPrefillPolicy:
    """Exercise 1.2: chunked prefill with vLLM's partial-prefill controls, as a reference_engine
    SchedulerPolicy: LLM(path, scheduler_policy=ChunkedPrefillPolicy(long_prefill_token_threshold=32)).

    Plain FCFS chunking (exercise 1.1, lesson 03's ContinuousPolicy) gives the oldest prompt every token the
    decodes leave, so a short prompt queued behind a long one waits for the whole long prefill. Two knobs,
    named as in vLLM's SchedulerConfig, let short prompts through (the threshold is V1's, off by default;
    the cap on long prompts was implemented by V0's scheduler only):

    long_prefill_token_threshold (T >= 1): a candidate is *long* when it still has more than T tokens to
      compute (seq.num_uncomputed_tokens > T; vLLM's scheduler tests what is left, get_num_new_tokens(), so a
      long prompt on its last chunk, or one mostly found in the prefix cache, counts as short). No
      candidate gets more than T tokens in a step.
    max_long_partial_prefills (M >= 1): at most M long candidates get tokens in one step. A long candidate
      past that cap is held back (left out this step), and the candidates behind it are still considered:
      a short prompt may go ahead of a long one (that is the point).

    Both apply to chunked prefill only. With budget.chunked_prefill False no prefill is partial (a prompt
    goes whole or waits), and the rule is lesson 03's plain FCFS.
    """

    def __init__(self, long_prefill_token_threshold: int, max_long_partial_prefills: int = 1):
        for name, v in (("long_prefill_token_threshold", long_prefill_token_threshold),
                        ("max_long_partial_prefills", max_long_partial_prefills)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.max_long_partial_prefills = max_long_partial_prefills

    def schedule(self, candidates: list, budget) -> list[tuple]:
        """candidates: Sequences oldest first (partly prefilled prompts, then the waiting queue).
        budget: reference_engine.scheduler.Budget; budget.tokens is what is left after the decodes,
        budget.chunked_prefill says whether a prompt may be split, budget.try_take(seq, n) checks the
        tokens, batch slots and free KV blocks for n tokens of seq and spends them if they fit.

        Returns [(seq, num_tokens), ...] in candidate order. With budget.chunked_prefill, for each candidate
        in order (T, M as in the class docstring; "long" means seq.num_uncomputed_tokens > T):
          1. a long candidate when M long ones were already picked this step is held back: skip it;
          2. otherwise it gets n = min(seq.num_uncomputed_tokens, T, budget.tokens) tokens; if
             budget.try_take(seq, n) says no (no tokens left, no batch slot, too few free KV blocks),
             stop: nobody overtakes a request that waits for room (FCFS);
          3. else it is picked (and counts against M if long).
        Without chunked prefill: each candidate in order gets all its seq.num_uncomputed_tokens; stop at
        the first that does not fit (no threshold, no cap).
        """
        ### BEGIN SOLUTION
        picked, longs = [], 0
        for seq in candidates:
            n = seq.num_uncomputed_tokens
            is_long = n > self.long_prefill_token_threshold
            if budget.chunked_prefill:
                if is_long and longs >= self.max_long_partial_prefills:
                    continue  # held back: a shorter prompt behind it may still go
                n = min(n, self.long_prefill_token_threshold, budget.tokens)
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
            longs += is_long
        return picked
        ### END SOLUTION


# -- 2. choosing the budget -------------------------------------------------------------------------

def step_time(cost: dict, num_decodes: int, decode_context: int, chunk: int, chunk_start: int) -> float:
    """Exercise 2.1: predicted wall time (s) of one step with a linear cost model.

    cost: {"overhead_s": fixed per-step cost (launches, scheduling, sampling),
           "per_token_s": cost of each token computed (weights: GEMMs, MLP),
           "per_attn_s": cost of each (query token, cached key) pair attended}.
    The step runs num_decodes decode tokens, each attending decode_context cached tokens, and one
    prefill chunk of `chunk` prompt tokens at positions chunk_start .. chunk_start + chunk - 1;
    causal: the token at position p attends p + 1 keys. (chunk may be 0: a decode-only step.)

        time = overhead_s + per_token_s * (num_decodes + chunk)
               + per_attn_s * (num_decodes * decode_context + sum over the chunk of (p + 1))

    >>> step_time({"overhead_s": 0.01, "per_token_s": 1e-4, "per_attn_s": 0.0}, 8, 100, 56, 0)
    0.0164
    """
    ### BEGIN SOLUTION
    tokens = num_decodes + chunk
    chunk_pairs = chunk * chunk_start + chunk * (chunk + 1) // 2
    pairs = num_decodes * decode_context + chunk_pairs
    return cost["overhead_s"] + cost["per_token_s"] * tokens + cost["per_attn_s"] * pairs
    ### END SOLUTION


def choose_budget(cost: dict, itl_slo_s: float, prompt_len: int, num_decodes: int,
                  decode_context: int) -> dict:
    """Exercise 2.2: the largest token budget whose every step meets the ITL SLO, and the TTFT it gives.

    A prompt of prompt_len tokens arrives while num_decodes streams decode (each with decode_context
    cached tokens, taken as constant during the prefill). With budget B (decode tokens included) each
    step prefills a chunk of B - num_decodes prompt tokens (the last chunk what remains), so the prompt
    needs ceil(prompt_len / (B - num_decodes)) steps. Every one of those steps must take at most
    itl_slo_s (use step_time): the decode streams wait for the slowest step, not the average one.
    B ranges over num_decodes + 1 .. num_decodes + prompt_len; the TTFT (prompt arriving at a step
    boundary) is the sum of its steps' times; it never grows with B, so the largest feasible B is
    also the one with the lowest TTFT. Raise ValueError when no budget meets the SLO.

    Returns {"budget": B, "num_steps": int, "ttft_s": float, "max_step_s": float}.

    >>> c = {"overhead_s": 0.01, "per_token_s": 1e-4, "per_attn_s": 0.0}
    >>> r = choose_budget(c, 0.03055, 1000, 8, 100)  # budget 205: 0.0305 s a step; 206: 0.0306 s
    >>> r["budget"], r["num_steps"], round(r["ttft_s"], 4)
    (205, 6, 0.1648)
    """
    ### BEGIN SOLUTION
    for budget in range(num_decodes + prompt_len, num_decodes, -1):
        share = budget - num_decodes
        times = [step_time(cost, num_decodes, decode_context, min(share, prompt_len - start), start)
                 for start in range(0, prompt_len, share)]  # ceil(prompt_len / share) chunks
        if max(times) <= itl_slo_s:
            return {"budget": budget, "num_steps": len(times), "ttft_s": sum(times), "max_step_s": max(times)}
    raise ValueError(f"no budget meets an ITL SLO of {itl_slo_s} s: even a 1-token chunk is slower")
    ### END SOLUTION



# -- 3. chunked prefill meets the prefix cache -----------------------------------------------------

def prefill_chunks(prompt_len: int, cached_blocks: int, block_size: int, chunk_budget: int,
                   align: bool = False) -> list[tuple[int, int]]:
    """Exercise 3.1: the chunks a prompt's prefill computes when a prefix cache already holds some of it.

    prompt_len: tokens in the prompt (>= 1). cached_blocks: how many of the prompt's leading *full*
    blocks the prefix cache holds (as vLLM's, which hashes and shares whole blocks only, so a hit is a
    number of blocks). block_size: tokens per KV block. chunk_budget: prompt tokens this prompt may compute per
    step (>= 1).

    The prefill starts after the hit, but the prompt's last token is always computed: its logits
    give the first output token, so a hit covering the whole prompt still leaves its last block to
    compute. Cached: block_size * min(cached_blocks, (prompt_len - 1) // block_size) tokens.
    The rest is cut into chunks of chunk_budget tokens, the last one what remains. With align=True
    every chunk but the last ends on a block boundary: chunks of the largest multiple of block_size
    that fits chunk_budget (so each chunk fills whole blocks, which the prefix cache can share as
    soon as that chunk is done); a budget smaller than a block cannot be aligned: ValueError.

    Returns [(start, num_tokens), ...]: the position of each chunk's first token, and its length.
    >>> prefill_chunks(100, 3, 16, 30)
    [(48, 30), (78, 22)]
    >>> prefill_chunks(100, 3, 16, 30, align=True)
    [(48, 16), (64, 16), (80, 16), (96, 4)]
    >>> prefill_chunks(64, 4, 16, 64)  # all 64 tokens cached: the last block is computed again
    [(48, 16)]
    """
    ### BEGIN SOLUTION
    start = block_size * min(cached_blocks, (prompt_len - 1) // block_size)
    step = chunk_budget
    if align:
        step = chunk_budget // block_size * block_size
        if step == 0:
            raise ValueError(f"a chunk budget of {chunk_budget} tokens cannot hold a whole block of {block_size}")
    chunks = []
    while start < prompt_len:
        n = min(step, prompt_len - start)
        chunks.append((start, n))
        start += n
    return chunks
    ### END SOLUTION
