"""Sampling parameters (vLLM's names and defaults) and the batched sampler."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

# vLLM's _SAMPLING_EPS: a temperature below it samples greedily. Dividing logits by a smaller one overflows
# float32 (1e-40 is a denormal, 1e-300 rounds to 0): the softmax would be NaN and the draw would fail.
SAMPLING_EPS = 1e-5
INT64_MAX = (1 << 63) - 1  # the largest value a token count or id can take once it is a torch.long
MAX_TOKENS_LIMIT = (1 << 31) - 1  # past this a length is absurd for any context; refused before any arithmetic


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)  # True is an int to Python, never to a client


def _is_finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 (or below SAMPLING_EPS) = greedy
    top_p: float = 1.0  # keep the smallest set of most likely tokens whose probability reaches top_p; 1 = all
    top_k: int = -1  # keep the k most likely tokens (and any tied with the k-th); -1 = all
    max_tokens: int = 16
    seed: int | None = None  # per-request generator: same seed, same tokens, whatever else is batched
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1  # parallel samples sharing the prompt's KV blocks (copy-on-write)
    logprobs: int | None = None  # return the sampled token's logprob and the top-`logprobs` per step
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one (vLLM's); 0 = off

    def __post_init__(self):
        """Refuse what no engine can run: the error names the field (the server turns it into a 400 naming it).
        Non-finite numbers, bools where a number belongs, and integers no tensor can hold are refused too."""
        def bad(name, rule):
            raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r}: {rule}")

        if not _is_finite(self.temperature) or self.temperature < 0:
            bad("temperature", "must be a finite number >= 0 (0 means greedy)")
        if not _is_finite(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "must be a number in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < -1 or self.top_k == 0 or self.top_k > INT64_MAX:
            bad("top_k", f"must be -1 (disabled) or an integer in [1, {INT64_MAX}]")
        if not _is_finite(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "must be a number in [0, 1] (0 disables it)")
        if not _is_int(self.max_tokens) or not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT:
            bad("max_tokens", f"must be an integer in [1, {MAX_TOKENS_LIMIT}]")
        if not _is_int(self.n) or not 1 <= self.n <= MAX_TOKENS_LIMIT:
            bad("n", "must be an integer >= 1")
        if self.seed is not None and not _is_int(self.seed):
            bad("seed", "must be an integer or None")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOKENS_LIMIT):
            bad("logprobs", "must be None or an integer >= 0")
        if not isinstance(self.stop_token_ids, (list, tuple)) or \
                not all(_is_int(t) and 0 <= t <= INT64_MAX for t in self.stop_token_ids):
            bad("stop_token_ids", "must be a list of non-negative token ids")
        self.stop_token_ids = list(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


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
    its temperature, -inf below its min_p and outside its top_k / top_p (in vLLM's order: min_p first). Greedy
    rows (temperature below SAMPLING_EPS) come back unchanged."""
    rows = [i for i, p in enumerate(params) if not p.greedy]
    out = logits.clone()
    if not rows:
        return out
    V = logits.shape[-1]
    sub = logits[rows] / torch.tensor([params[i].temperature for i in rows], device=logits.device)[:, None]
    if any(params[i].min_p > 0 for i in rows):
        min_p = torch.tensor([params[i].min_p for i in rows], device=logits.device, dtype=sub.dtype)[:, None]
        probs = sub.softmax(-1)
        sub = sub.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))
    if any(params[i].top_k != -1 or params[i].top_p < 1 for i in rows):
        # top_k past the vocabulary keeps everything: clamped here, so any int64 fits the tensor
        top_k = torch.tensor([min(params[i].top_k, V) if params[i].top_k != -1 else V for i in rows],
                             device=logits.device)
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


def sample_isolated(logits: torch.Tensor, params: list[SamplingParams],
                    generators: list) -> tuple[torch.Tensor, dict[int, Exception]]:
    """sample(), with each row's failure kept to that row: returns (token ids [B], {row: the exception}).

    A failed row (a distribution that is NaN or all zero, parameters the warp cannot take) has no token (its
    entry in the tensor is meaningless); every other row gets exactly the token sample() would give it, and
    its generator advances exactly as it would have. The batched warp runs first; only if it raises are the
    rows warped one by one to find the culprit (the warp draws nothing, so redoing it changes no generator).
    The engine finishes a failed row's request with an error and keeps the rest of the batch running.
    """
    tokens = logits.argmax(-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    errors: dict[int, Exception] = {}
    if not rows:
        return tokens, errors
    try:
        probs = dict(zip(rows, warp_logits(logits[rows], [params[i] for i in rows]).softmax(-1)))
    except Exception:  # one row's parameters broke the batch: find it
        probs = {}
        for i in rows:
            try:
                probs[i] = warp_logits(logits[i:i + 1], [params[i]]).softmax(-1)[0]
            except Exception as e:
                errors[i] = e
    for i in rows:  # one draw per row so each request's generator advances on its own
        if i in errors:
            continue
        try:
            tokens[i] = torch.multinomial(probs[i], 1, generator=generators[i])[0]
        except Exception as e:  # "probability tensor contains either inf, nan or element < 0", ...
            errors[i] = e
    return tokens, errors
