"""Sampling parameters (vLLM's names and defaults) and the batched sampler."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # keep the smallest set of most likely tokens whose probability reaches top_p; 1 = all
    top_k: int = -1  # keep the k most likely tokens (and any tied with the k-th); -1 = all
    max_tokens: int = 16
    seed: int | None = None  # per-request generator: same seed, same tokens, whatever else is batched
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1  # parallel samples sharing the prompt's KV blocks (copy-on-write)
    logprobs: int | None = None  # return the sampled token's logprob and the top-`logprobs` per step

    def __post_init__(self):
        def bad(name, rule):
            raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r}: {rule}")

        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            bad("temperature", "must be >= 0 (0 means greedy)")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1 or self.top_k == 0:
            bad("top_k", "must be -1 (disabled) or >= 1")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad("max_tokens", "must be an integer >= 1")
        if not isinstance(self.n, int) or self.n < 1:
            bad("n", "must be an integer >= 1")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "must be an integer or None")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            bad("logprobs", "must be None or an integer >= 0")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be a list of non-negative token ids")
        self.stop_token_ids = list(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(seed: int | None, index: int, device) -> torch.Generator | None:
    """Generator for sample `index` of a seeded request (None: the global RNG)."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed((seed + index * 0x9E3779B97F4A7C15) % (1 << 63))  # distinct streams for n > 1
    return g


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [B, V] (already divided by temperature); top_k [B] (V = off); top_p [B] (>= 1 = off).
    Masked entries -> -inf; the most likely token always stays.

    top-k keeps every token at least as likely as the k-th (ties included, as transformers' TopKLogitsWarper
    and vLLM do). top-p then keeps, within that set, each token whose probability mass *before* it (the
    tokens more likely than it) is < top_p, so the token that crosses top_p stays (TopPLogitsWarper's rule).
    The mass is summed from the least likely token up: "before" = 1 - (this token and every less likely
    one). Summed the other way, float32 rounding reaches 1.0 while tail tokens remain, and top_p = 1.0
    would drop them.
    """
    V = logits.shape[-1]
    sorted_logits, idx = logits.sort(dim=-1)  # ascending: the most likely token is last
    kth = sorted_logits.gather(-1, (V - top_k.clamp(1, V)).long()[:, None])  # the k-th most likely logit
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    tail = sorted_logits.softmax(-1).cumsum(-1)  # mass of each token and every less likely one
    # 1 - top_p in float64 first, then to the logits' dtype: the threshold transformers compares with
    threshold = (1 - top_p.to(torch.float64)).to(tail.dtype)[:, None]
    drop = (tail <= threshold) & (top_p < 1)[:, None]
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return logits.scatter(-1, idx, sorted_logits)


def warp_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits [B, V] float32, one SamplingParams per row -> the logits each row samples from [B, V]: divided by
    its temperature, -inf outside its top_k / top_p. Greedy rows (temperature 0) come back unchanged."""
    rows = [i for i, p in enumerate(params) if not p.greedy]
    out = logits.clone()
    if not rows:
        return out
    V = logits.shape[-1]
    sub = logits[rows] / torch.tensor([params[i].temperature for i in rows], device=logits.device)[:, None]
    if any(params[i].top_k != -1 or params[i].top_p < 1 for i in rows):
        top_k = torch.tensor([params[i].top_k if params[i].top_k != -1 else V for i in rows], device=logits.device)
        top_p = torch.tensor([params[i].top_p for i in rows], device=logits.device, dtype=torch.float64)
        sub = filter_logits(sub, top_k, top_p)
    out[rows] = sub
    return out


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each row's token is drawn from, [B, V]: softmax of warp_logits, or for a greedy row
    one-hot at its argmax. A speculative-decoding verifier compares draft tokens against these."""
    probs = warp_logits(logits, params).softmax(-1)
    for i, p in enumerate(params):
        if p.greedy:
            probs[i] = torch.nn.functional.one_hot(logits[i].argmax(), logits.shape[-1]).to(probs.dtype)
    return probs


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list) -> torch.Tensor:
    """logits [B, V] float32 -> token ids [B]; greedy rows take argmax, the rest sample from the filtered softmax."""
    tokens = logits.argmax(-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens
    probs = warp_logits(logits[rows], [params[i] for i in rows]).softmax(-1)
    for j, i in enumerate(rows):  # one draw per row so each request's generator advances on its own
        tokens[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
    return tokens
