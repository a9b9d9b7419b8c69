"""Wrong answers to lesson 19 that its checks must catch, one per typical mistake."""
import math

import torch

from solutions import l19_offline_batch as sol
from tests.mutants import mutant

# -- 1.1 packing ------------------------------------------------------------------------------------

@mutant(check="pack_prompts", message="instead of restarting at 0 for each sequence")
def pack_prompts(prompts):
    b = sol.pack_prompts(prompts)
    b["positions"] = torch.arange(len(b["input_ids"]))
    return b


@mutant(check="pack_prompts", message="instead of raising ValueError")
def pack_prompts(prompts):  # noqa: F811 - refuses an empty prompt, but packs no prompts at all into nothing
    if not prompts:
        return {"input_ids": torch.zeros(0, dtype=torch.int64), "cu_seqlens": torch.zeros(1, dtype=torch.int32),
                "positions": torch.zeros(0, dtype=torch.int64), "max_seqlen": 0}
    return sol.pack_prompts(prompts)


@mutant(check="pack_prompts", message="leaves out the leading 0 of cu_seqlens")
def pack_prompts(prompts):  # noqa: F811 - each mutant is its own wrong answer
    b = sol.pack_prompts(prompts)
    b["cu_seqlens"] = torch.tensor([len(p) for p in prompts]).cumsum(0).int()
    return b


@mutant(check="pack_prompts", message="last index instead of its end (off by one")
def pack_prompts(prompts):  # noqa: F811
    b = sol.pack_prompts(prompts)
    b["cu_seqlens"] = torch.cat([b["cu_seqlens"][:1], b["cu_seqlens"][1:] - 1])
    return b


@mutant(check="pack_prompts", message="returns cu_seqlens as int64")
def pack_prompts(prompts):  # noqa: F811
    b = sol.pack_prompts(prompts)
    b["cu_seqlens"] = b["cu_seqlens"].long()
    return b


# -- 1.2 mask ---------------------------------------------------------------------------------------

@mutant(check="varlen_causal_mask", message="tokens attend across sequences")
def varlen_causal_mask(cu_seqlens):
    T = int(cu_seqlens[-1])
    return torch.ones(T, T, dtype=torch.bool).tril()


@mutant(check="varlen_causal_mask", message="puts each sequence's first token into the sequence before it")
def varlen_causal_mask(cu_seqlens):  # noqa: F811
    T = int(cu_seqlens[-1])
    seq = torch.searchsorted(cu_seqlens[1:].long().contiguous(), torch.arange(T))  # right=False: off by one
    return (seq[:, None] == seq[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()


@mutant(check="varlen_causal_mask", message="not causal")
def varlen_causal_mask(cu_seqlens):  # noqa: F811
    m = sol.varlen_causal_mask(cu_seqlens)
    return m | m.T


@mutant(check="varlen_causal_mask", message="leaves out the diagonal")
def varlen_causal_mask(cu_seqlens):  # noqa: F811
    return sol.varlen_causal_mask(cu_seqlens) & ~torch.eye(int(cu_seqlens[-1]), dtype=torch.bool)


@mutant(check="varlen_causal_mask", message="dtype torch.float32, expected torch.bool")
def varlen_causal_mask(cu_seqlens):  # noqa: F811 - an additive mask where a boolean one is asked for
    m = sol.varlen_causal_mask(cu_seqlens)
    return torch.zeros(m.shape).masked_fill(~m, float("-inf"))


# -- 1.3 packed attention ---------------------------------------------------------------------------

def _m_attn(q, k, v, mask, scale):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("thd,shd->hts", q, k) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shd->thd", s.softmax(-1), v)


@mutant(check="packed_attention", message="depends on varlen_causal_mask, which fails")
def varlen_causal_mask(cu_seqlens):  # noqa: F811 - the attention is right; the mask it uses drops the diagonal
    return sol.varlen_causal_mask(cu_seqlens) & ~torch.eye(int(cu_seqlens[-1]), dtype=torch.bool)


@mutant(check="packed_attention", message="computes the scores and the softmax in bf16")
def packed_attention(q, k, v, cu_seqlens, scale=None):  # noqa: F811 - right in float32, no upcast for bf16
    mask = sol.varlen_causal_mask(cu_seqlens)
    return _m_attn(q, k, v, mask, q.shape[-1] ** -0.5 if scale is None else scale)


@mutant(check="packed_attention", message="attends across sequences")
def packed_attention(q, k, v, cu_seqlens, scale=None):
    T = q.shape[0]
    return _m_attn(q, k, v, torch.ones(T, T, dtype=torch.bool).tril(), scale or q.shape[-1] ** -0.5)


@mutant(check="packed_attention", message="is not causal within a sequence")
def packed_attention(q, k, v, cu_seqlens, scale=None):  # noqa: F811
    m = sol.varlen_causal_mask(cu_seqlens)
    return _m_attn(q, k, v, m | m.T, scale or q.shape[-1] ** -0.5)


@mutant(check="packed_attention", message="missing the 1/sqrt(head_dim) scale")
def packed_attention(q, k, v, cu_seqlens, scale=None):  # noqa: F811
    return _m_attn(q, k, v, sol.varlen_causal_mask(cu_seqlens), scale or 1.0)


@mutant(check="packed_attention", message="repeat, not repeat_interleave")
def packed_attention(q, k, v, cu_seqlens, scale=None):  # noqa: F811
    group = q.shape[1] // k.shape[1]
    return sol.packed_attention(q, k.repeat(1, group, 1), v.repeat(1, group, 1), cu_seqlens, scale)


# -- 2.1 batches ------------------------------------------------------------------------------------

def _m_first_fit(costs, budget, order, padded=False, last_only=False, strict=False):
    batches = []
    for i in order:
        for b in (batches[-1:] if last_only else batches):
            c = sol.batch_tokens(costs, b + [i], padded)
            if c < budget or (c == budget and not strict):
                b.append(i)
                break
        else:
            batches.append([i])
    return batches


def _m_decreasing(costs):
    return sorted(range(len(costs)), key=lambda i: (-costs[i], i))


@mutant(check="form_batches", message="instead of raising ValueError")
def form_batches(costs, budget, padded=False):  # noqa: F811 - checks the budget, not the costs
    if budget < 1:
        raise ValueError("budget must be positive")
    return _m_first_fit(costs, budget, _m_decreasing(costs), padded)


@mutant(check="form_batches", message="in arrival order (plain first-fit)")
def form_batches(costs, budget, padded=False):
    return _m_first_fit(costs, budget, range(len(costs)), padded)


@mutant(check="form_batches", message="(best-fit decreasing)")
def form_batches(costs, budget, padded=False):  # noqa: F811
    batches = []
    for i in _m_decreasing(costs):
        room = [(budget - sol.batch_tokens(costs, b + [i], padded), n) for n, b in enumerate(batches)]
        room = [(r, n) for r, n in room if r >= 0]
        if room:
            batches[min(room)[1]].append(i)  # the tightest fit, not the first
        else:
            batches.append([i])
    return batches


@mutant(check="form_batches", message="smallest cost first (first-fit increasing)")
def form_batches(costs, budget, padded=False):  # noqa: F811 - sorted, but the wrong way round
    return _m_first_fit(costs, budget, sorted(range(len(costs)), key=lambda i: (costs[i], i)), padded)


@mutant(check="form_batches", message="breaks cost ties by the higher index first")
def form_batches(costs, budget, padded=False):  # noqa: F811
    return _m_first_fit(costs, budget, sorted(range(len(costs)), key=lambda i: (-costs[i], -i)), padded)


@mutant(check="form_batches", message="(next-fit decreasing)")
def form_batches(costs, budget, padded=False):  # noqa: F811
    return _m_first_fit(costs, budget, _m_decreasing(costs), padded, last_only=True)


@mutant(check="form_batches", message="treats the budget as exclusive")
def form_batches(costs, budget, padded=False):  # noqa: F811
    return _m_first_fit(costs, budget, _m_decreasing(costs), padded, strict=True)


@mutant(check="form_batches", message="uses the padded size len(batch) * max cost in packed mode")
def form_batches(costs, budget, padded=False):  # noqa: F811 - always pads
    return _m_first_fit(costs, budget, _m_decreasing(costs), padded=True)


@mutant(check="form_batches", message="counts packed tokens in padded mode")
def form_batches(costs, budget, padded=False):  # noqa: F811
    return _m_first_fit(costs, budget, _m_decreasing(costs), padded=False)


@mutant(check="form_batches", message="it should get a batch of its own")
def form_batches(costs, budget, padded=False):  # noqa: F811
    if max(costs) > budget:
        raise ValueError(f"a request of {max(costs)} tokens exceeds the budget of {budget}")
    return sol.form_batches(costs, budget, padded)


# -- 3.1 the window ---------------------------------------------------------------------------------

@mutant(check="batch_window_delays", message="from the window's opening")
def batch_window_delays(arrivals, window, max_batch_size=None):
    r = sol.batch_window_delays(arrivals, window, max_batch_size)
    opened, k = [], 0
    for s in r["batch_sizes"]:
        opened += [arrivals[k]] * s
        k += s
    r["delay"] = [d - a for d, a in zip(r["dispatch"], opened)]
    r["mean"] = sum(r["delay"]) / len(arrivals) if arrivals else 0.0
    r["max"] = max(r["delay"], default=0.0)
    return r


@mutant(check="batch_window_delays", message="instead of raising ValueError")
def batch_window_delays(arrivals, window, max_batch_size=None):  # noqa: F811 - checks the window only
    if max_batch_size is not None and max_batch_size < 1:
        return sol.batch_window_delays(arrivals, window, None)
    return sol.batch_window_delays(arrivals, window, max_batch_size)


@mutant(check="batch_window_delays", message="ignores max_batch_size")
def batch_window_delays(arrivals, window, max_batch_size=None):  # noqa: F811
    return sol.batch_window_delays(arrivals, window, None)


@mutant(check="batch_window_delays", message="exactly at the window's end")
def batch_window_delays(arrivals, window, max_batch_size=None):  # noqa: F811
    # The learner's own loop with `<` where the window includes its end.
    dispatch, sizes, i = [], [], 0
    while i < len(arrivals):
        j = i + 1
        while j < len(arrivals) and arrivals[j] < arrivals[i] + window and \
                (max_batch_size is None or j - i < max_batch_size):
            j += 1
        full = max_batch_size is not None and j - i == max_batch_size
        dispatch += [arrivals[j - 1] if full else arrivals[i] + window] * (j - i)
        sizes.append(j - i)
        i = j
    delay = [d - a for d, a in zip(dispatch, arrivals)]
    return {"dispatch": dispatch, "delay": delay, "mean": sum(delay) / len(delay) if delay else 0.0,
            "max": max(delay, default=0.0), "batch_sizes": sizes}


@mutant(check="batch_window_delays", message="averages the delay over batches")
def batch_window_delays(arrivals, window, max_batch_size=None):  # noqa: F811
    r = sol.batch_window_delays(arrivals, window, max_batch_size)
    means, k = [], 0
    for s in r["batch_sizes"]:
        means.append(sum(r["delay"][k:k + s]) / s)
        k += s
    r["mean"] = sum(means) / len(means) if means else 0.0
    return r


@mutant(check="batch_window_delays", message="clock-aligned windows")
def batch_window_delays(arrivals, window, max_batch_size=None):  # noqa: F811
    dispatch, sizes, i = [], [], 0
    while i < len(arrivals):
        close = (math.floor(arrivals[i] / window) + 1) * window if window > 0 else arrivals[i]
        j = i + 1
        while j < len(arrivals) and arrivals[j] < close and (max_batch_size is None or j - i < max_batch_size):
            j += 1
        full = max_batch_size is not None and j - i == max_batch_size
        dispatch += [float(arrivals[j - 1]) if full else float(close)] * (j - i)
        sizes.append(j - i)
        i = j
    delay = [d - a for d, a in zip(dispatch, arrivals)]
    return {"dispatch": dispatch, "delay": delay, "mean": sum(delay) / len(delay) if delay else 0.0,
            "max": max(delay, default=0.0), "batch_sizes": sizes}


# -- 4.1 memory -------------------------------------------------------------------------------------
# KV per token comes from the given sol.kv_bytes_per_token; what a learner writes is the memory model.

def _m_fit(config, dtype_bytes, free_bytes, tokens, act_tokens, act_bytes_per_token, rounding=math.floor):
    per_seq = tokens * sol.kv_bytes_per_token(config, dtype_bytes) + act_tokens * act_bytes_per_token
    return max(0, int(rounding(free_bytes / per_seq)))


@mutant(check="max_batch_in_memory", message="forgets the output tokens")
def max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token=0.0,
                        block_size=1):
    return sol.max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, 0,
                                   act_bytes_per_token, block_size)


@mutant(check="max_batch_in_memory", message="does not round each sequence's tokens up to whole blocks")
def max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token=0.0,  # noqa: F811
                        block_size=1):
    return sol.max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token, 1)


@mutant(check="max_batch_in_memory", message="rounds each sequence's tokens DOWN to whole blocks")
def max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token=0.0,  # noqa: F811
                        block_size=1):
    tokens = (prompt_len + output_len) // block_size * block_size
    return _m_fit(config, dtype_bytes, free_bytes, tokens, prompt_len, act_bytes_per_token)


@mutant(check="max_batch_in_memory", message="rounds the prompt and the output up to whole blocks separately")
def max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token=0.0,  # noqa: F811
                        block_size=1):
    tokens = (math.ceil(prompt_len / block_size) + math.ceil(output_len / block_size)) * block_size
    return _m_fit(config, dtype_bytes, free_bytes, tokens, prompt_len, act_bytes_per_token)


@mutant(check="max_batch_in_memory", message="counts blocks as tokens")
def max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token=0.0,  # noqa: F811
                        block_size=1):
    blocks = math.ceil((prompt_len + output_len) / block_size)
    return _m_fit(config, dtype_bytes, free_bytes, blocks, prompt_len, act_bytes_per_token)


@mutant(check="max_batch_in_memory", message="ignores the activations")
def max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token=0.0,  # noqa: F811
                        block_size=1):
    return sol.max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, 0.0, block_size)


@mutant(check="max_batch_in_memory", message="counts activations for the output tokens too")
def max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token=0.0,  # noqa: F811
                        block_size=1):
    tokens = math.ceil((prompt_len + output_len) / block_size) * block_size
    return _m_fit(config, dtype_bytes, free_bytes, tokens, prompt_len + output_len, act_bytes_per_token)


@mutant(check="max_batch_in_memory", message="rounds the number of sequences up (ceil)")
def max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token=0.0,  # noqa: F811
                        block_size=1):
    tokens = math.ceil((prompt_len + output_len) / block_size) * block_size
    return _m_fit(config, dtype_bytes, free_bytes, tokens, prompt_len, act_bytes_per_token, rounding=math.ceil)


@mutant(check="max_batch_in_memory", message="rounds the number of sequences to the nearest integer")
def max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token=0.0,  # noqa: F811
                        block_size=1):
    tokens = math.ceil((prompt_len + output_len) / block_size) * block_size
    return _m_fit(config, dtype_bytes, free_bytes, tokens, prompt_len, act_bytes_per_token, rounding=round)


@mutant(check="max_batch_in_memory", message="negative batch size")
def max_batch_in_memory(config, dtype_bytes, free_bytes, prompt_len, output_len, act_bytes_per_token=0.0,  # noqa: F811
                        block_size=1):
    tokens = math.ceil((prompt_len + output_len) / block_size) * block_size
    per_seq = tokens * sol.kv_bytes_per_token(config, dtype_bytes) + prompt_len * act_bytes_per_token
    return int(free_bytes // per_seq)
