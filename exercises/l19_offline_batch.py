# Lesson 19 exercises: replace each `raise NotImplementedError` with your code.
# Check your work with `course check 19`. (Generated from solutions/l19_offline_batch.py by
# `course sync`; keep the names and signatures.)
"""Lesson 19: offline batch inference. Pack ragged prompts into one flat batch, attend over it,
form batches under a token budget, price a batching window, and size the largest batch that fits.

Dtypes follow the engines: token ids and positions are int64 (what nn.Embedding and the RoPE tables
index with); cu_seqlens is int32, as FlashAttention's varlen kernels and vLLM's metadata take it.
Times are in seconds, memory in bytes.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch

from reference_engine.config import attention_shape
from reference_engine.config import kv_bytes_per_token as engine_kv_bytes_per_token

# -- 1. packing ----------------------------------------------------------------------------------

def pack_prompts(prompts: list[list[int]]) -> dict:
    """Exercise 1.1: pack ragged prompts into one flat batch with no padding.

    prompts: n >= 1 non-empty lists of token ids (ValueError otherwise). Returns a dict:
      "input_ids":  int64 [T], every prompt's tokens concatenated in order (T = total tokens);
      "cu_seqlens": int32 [n + 1], cumulative lengths starting at 0: sequence i is the slice
                    input_ids[cu_seqlens[i]:cu_seqlens[i + 1]] and cu_seqlens[-1] == T;
      "positions":  int64 [T], each token's position inside its own prompt (restarts at 0);
      "max_seqlen": int, the longest prompt's length.

    >>> b = pack_prompts([[5, 6, 7], [8, 9]])
    >>> b["input_ids"].tolist(), b["cu_seqlens"].tolist(), b["positions"].tolist(), b["max_seqlen"]
    ([5, 6, 7, 8, 9], [0, 3, 5], [0, 1, 2, 0, 1], 3)
    """
    raise NotImplementedError("Exercise 1.1 (pack_prompts): see section 1.1 of lessons/l19_offline_batch.ipynb")


def varlen_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Exercise 1.2: the attention mask of a packed batch, as a bool [T, T] tensor.

    mask[i, j] is True iff token j is visible to token i: both belong to the same sequence
    (the same slice cu_seqlens[s]:cu_seqlens[s + 1]) and j <= i. It is block-diagonal, with a
    lower-triangular (causal) block per sequence. T = cu_seqlens[-1]; on cu_seqlens' device.

    >>> varlen_causal_mask(torch.tensor([0, 2, 3], dtype=torch.int32)).int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    raise NotImplementedError("Exercise 1.2 (varlen_causal_mask): see section 1.2 of lessons/l19_offline_batch.ipynb")


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     scale: float | None = None) -> torch.Tensor:
    """Exercise 1.3: causal attention over a packed batch, each sequence seeing only itself.

    q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim] (GQA: num_heads is a multiple
    of num_kv_heads and query head h reads KV head h // (num_heads // num_kv_heads)).
    cu_seqlens: int32 [n + 1] as from pack_prompts. scale: None means 1 / sqrt(head_dim).
    Returns [T, num_heads, head_dim] in q's dtype, equal to running causal attention on each
    sequence alone and concatenating the results.

    >>> q = torch.randn(5, 4, 8); kv = torch.randn(5, 2, 8)
    >>> packed_attention(q, kv, kv, torch.tensor([0, 3, 5], dtype=torch.int32)).shape
    torch.Size([5, 4, 8])
    """
    raise NotImplementedError("Exercise 1.3 (packed_attention): see section 1.3 of lessons/l19_offline_batch.ipynb")


# -- 2. batches under a token budget --------------------------------------------------------------

def batch_tokens(costs: list[int], batch: list[int], padded: bool = False) -> int:
    """Tokens a batch occupies: the sum of its members' costs (packed), or, padded to the longest
    member, len(batch) * max cost."""
    sizes = [costs[i] for i in batch]
    return len(sizes) * max(sizes) if padded else sum(sizes)


def form_batches(costs: list[int], budget: int, padded: bool = False) -> list[list[int]]:
    """Exercise 2.1: group requests into batches of at most `budget` tokens, first-fit decreasing.

    costs[i]: the tokens request i occupies (prompt + max output tokens, say): positive ints.
    A batch's size is batch_tokens(costs, batch, padded): the sum of its costs when packed, or
    len(batch) * its largest cost when every member is padded to the longest.

    First-fit decreasing: visit requests from the largest cost to the smallest (ties: lower index
    first); put each into the first batch, in the order batches were opened, that stays within
    the budget with it added; if none does, open a new batch. A request whose cost alone exceeds
    the budget gets a batch of its own (and nothing joins it): the job still runs it, alone.

    Returns a list of batches, each a list of request indices; every index appears exactly once.
    ValueError for a budget < 1 or a cost < 1.

    >>> form_batches([4, 4, 4, 6, 6, 6], budget=10)     # first-fit in arrival order needs 4
    [[3, 0], [4, 1], [5, 2]]
    >>> form_batches([4, 4, 4, 6, 6, 6], budget=12, padded=True)
    [[3, 4], [5, 0], [1, 2]]
    """
    raise NotImplementedError("Exercise 2.1 (form_batches): see section 2.1 of lessons/l19_offline_batch.ipynb")


# -- 3. the batching window -----------------------------------------------------------------------

def batch_window_delays(arrivals: list[float], window: float, max_batch_size: int | None = None) -> dict:
    """Exercise 3.1: the wait a batching window adds to each request.

    arrivals: request arrival times in seconds, non-decreasing. The batcher works like this: the
    first request not yet dispatched opens a batch at its arrival time a0; the batch is dispatched
    at a0 + window with every request that arrived at or before that instant (one arriving exactly
    at a0 + window is in), or earlier, at the arrival of its max_batch_size-th request, when
    max_batch_size is given and reached. The next request opens the next batch. Queueing behind a
    busy engine is not modelled: this is the window's own cost.

    Returns {"dispatch": [dispatch time of each request's batch], "delay": [dispatch - arrival],
    "mean": mean delay over requests, "max": max delay, "batch_sizes": [requests per batch, in
    order]}; all times are floats in seconds. No arrivals: empty lists and 0.0.

    >>> r = batch_window_delays([0.0, 0.1, 0.5, 2.0], window=0.5)
    >>> r["delay"], r["batch_sizes"], r["max"]
    ([0.5, 0.4, 0.0, 0.5], [3, 1], 0.5)
    """
    raise NotImplementedError("Exercise 3.1 (batch_window_delays): see section 3.1 of lessons/l19_offline_batch.ipynb")


# -- 4. the largest batch that fits ---------------------------------------------------------------

def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int:
    """KV bytes one token holds over all layers (given, not an exercise): lesson 02's formula,
    2 * layers * kv_heads * head_dim * dtype_bytes, with config.json's defaults (a missing or null
    num_key_value_heads means MHA, a missing or null head_dim hidden_size // num_attention_heads),
    computed by the engine (reference_engine.config).

    >>> kv_bytes_per_token({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    ...                     "hidden_size": 4096}, 2)
    131072
    """
    return engine_kv_bytes_per_token(attention_shape(config), dtype_bytes)


def max_batch_in_memory(config: dict, dtype_bytes: int, free_bytes: float, prompt_len: int, output_len: int,
                        act_bytes_per_token: float = 0.0, block_size: int = 1) -> int:
    """Exercise 4.1: the most sequences of prompt_len + output_len tokens one static batch can hold.

    config: a Hugging Face config.json dict. dtype_bytes: bytes per KV element. free_bytes: memory
    left once the weights are loaded.

    Memory model (a documented upper bound for a static batch):
      KV per token     = kv_bytes_per_token(config, dtype_bytes): lesson 02's formula, given;
      KV per sequence  = KV per token * (prompt_len + output_len) rounded up to whole blocks of
                         block_size tokens (paged allocation; block_size=1 means no rounding);
      activations      = act_bytes_per_token for every prompt token, since the batch's prompts
                         are prefilled in one forward; counted as live together with the full KV
                         (the real peak is a little lower);
      per sequence     = KV per sequence + prompt_len * act_bytes_per_token.
    Returns floor(free_bytes / per sequence) as an int, and 0 (never negative) when none fits.

    >>> llama8b = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    ...            "hidden_size": 4096}                                  # 131,072 KV bytes/token in bf16
    >>> max_batch_in_memory(llama8b, 2, 60e9, prompt_len=1536, output_len=512)
    223
    """
    raise NotImplementedError("Exercise 4.1 (max_batch_in_memory): see section 4.1 of lessons/l19_offline_batch.ipynb")


# -- 5. a shared prefix across the batch (given, not an exercise) ---------------------------------

def prefill_tokens(order: list[int], prefix_of: list[int], prefix_len: int, suffix_len: list[int], slots: int) -> int:
    """Prompt tokens prefilled when prompts run in `order`, prompt i being shared prefix prefix_of[i] (prefix_len
    tokens) followed by suffix_len[i] tokens of its own, with a prefix cache that keeps the KV of `slots` whole
    prefixes, least recently used evicted first (slots=0: no cache). A prompt whose prefix is cached prefills only
    its suffix.

    >>> prefill_tokens([0, 1, 2, 3], [0, 1, 0, 1], 100, [5, 5, 5, 5], slots=1)   # alternating: every prefix evicted
    420
    >>> prefill_tokens([0, 2, 1, 3], [0, 1, 0, 1], 100, [5, 5, 5, 5], slots=1)   # grouped: each prefix once
    220
    """
    cache: OrderedDict = OrderedDict()
    total = 0
    for i in order:
        p = prefix_of[i]
        if p in cache:
            cache.move_to_end(p)
        else:
            total += prefix_len
            if slots > 0:
                cache[p] = True
                if len(cache) > slots:
                    cache.popitem(last=False)
        total += suffix_len[i]
    return total
