"""Sampling parameters (vLLM's names and defaults), the batched sampler, and the processing before it.

What a row's next token is drawn from, in vLLM's order: the model's raw logits, then logit_bias added, the
stop tokens masked while fewer than min_tokens are out, the repetition penalty (prompt and output tokens:
a positive logit divided by it, a negative one multiplied), the frequency and presence penalties (output
tokens: minus penalty * count, minus penalty once), then temperature, min_p, top_k, top_p (warp_logits).
Logprobs (engine._logprobs) are the log-softmax of the raw logits, as vLLM's default (logprobs_mode
"raw_logprobs") returns them. Stop strings are matched on the detokenized output (StopStrings).
"""
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
    # Stop strings (vLLM's): the output ends before the first one it contains (after it, with
    # include_stop_str_in_output), finish_reason "stop", stop_reason the string. A str is one stop string.
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0  # in [-2, 2]: minus this from every token already in the output
    frequency_penalty: float = 0.0  # in [-2, 2]: minus this times the token's count in the output
    repetition_penalty: float = 1.0  # > 0: tokens in the prompt or output, logit / it if positive, * it if not
    min_tokens: int = 0  # the stop tokens (EOS, stop_token_ids) cannot be sampled and stop strings do not match
    #                      until this many tokens are out
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    prompt_logprobs: int | None = None  # each prompt token's logprob and the top-`prompt_logprobs` (vLLM's)

    def __post_init__(self):
        """Refuse what no engine can run: the error names the field (the server turns it into a 400 naming it).
        Non-finite numbers, bools where a number belongs, and integers no tensor can hold are refused too."""
        _check(self, _RULES_BEFORE_STOP)
        self.stop = [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else self.stop
        _check(self, _RULES_FROM_STOP)
        self.stop_token_ids, self.stop = list(self.stop_token_ids), list(self.stop)
        if self.logit_bias is not None:
            self.logit_bias = dict(self.logit_bias) or None

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def processes_logits(self) -> bool:
        """Whether the logits need processing before the sampler (penalties, logit_bias, min_tokens)."""
        return bool(self.logit_bias or self.min_tokens or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0)


def _in(lo, hi, finite=True):
    """A number (an integer when not `finite`) in [lo, hi]; no bool, no NaN or infinity."""
    return (lambda v: _is_finite(v) and lo <= v <= hi) if finite else (lambda v: _is_int(v) and lo <= v <= hi)


def _optional(ok):
    return lambda v: v is None or ok(v)


# SamplingParams' rules, in the order they are checked: (field, ok(value, params), what the field must be).
_RULES_BEFORE_STOP = [
    ("temperature", lambda v, p: _is_finite(v) and v >= 0, "must be a finite number >= 0 (0 means greedy)"),
    ("top_p", lambda v, p: _is_finite(v) and 0 < v <= 1, "must be a number in (0, 1]"),
    ("top_k", lambda v, p: v == -1 and _is_int(v) or _in(1, INT64_MAX, finite=False)(v),
     f"must be -1 (disabled) or an integer in [1, {INT64_MAX}]"),
    ("min_p", lambda v, p: _in(0, 1)(v), "must be a number in [0, 1] (0 disables it)"),
    ("max_tokens", lambda v, p: _in(1, MAX_TOKENS_LIMIT, finite=False)(v), f"must be an integer in [1, {MAX_TOKENS_LIMIT}]"),
    ("n", lambda v, p: _in(1, MAX_TOKENS_LIMIT, finite=False)(v), "must be an integer >= 1"),
    ("seed", lambda v, p: v is None or _is_int(v), "must be an integer or None"),
    ("logprobs", lambda v, p: _optional(_in(0, MAX_TOKENS_LIMIT, finite=False))(v), "must be None or an integer >= 0"),
    ("stop_token_ids", lambda v, p: isinstance(v, (list, tuple)) and all(_in(0, INT64_MAX, finite=False)(t) for t in v),
     "must be a list of non-negative token ids"),
]
_RULES_FROM_STOP = [
    ("stop", lambda v, p: isinstance(v, (list, tuple)) and all(isinstance(x, str) and x for x in v),
     "must be a string or a list of non-empty strings"),
    ("include_stop_str_in_output", lambda v, p: isinstance(v, bool), "must be a bool"),
    ("presence_penalty", lambda v, p: _in(-2, 2)(v), "must be a number in [-2, 2]"),
    ("frequency_penalty", lambda v, p: _in(-2, 2)(v), "must be a number in [-2, 2]"),
    ("repetition_penalty", lambda v, p: _is_finite(v) and v > 0, "must be a finite number > 0 (1 disables it)"),
    ("min_tokens", lambda v, p: _in(0, p.max_tokens, finite=False)(v), "must be an integer in [0, max_tokens={max_tokens}]"),
    ("logit_bias", lambda v, p: v is None or isinstance(v, dict) and all(
        _in(0, INT64_MAX, finite=False)(k) and _in(-100, 100)(b) for k, b in v.items()),
     "must map token ids (ints >= 0) to numbers in [-100, 100]"),
    ("prompt_logprobs", lambda v, p: _optional(_in(0, MAX_TOKENS_LIMIT, finite=False))(v), "must be None or an integer >= 0"),
]


def _check(params: SamplingParams, rules) -> None:
    for name, ok, rule in rules:
        value = getattr(params, name)
        if not ok(value, params):
            raise ValueError(f"SamplingParams.{name}={value!r}: {rule.format(max_tokens=params.max_tokens)}")


def process_logits(logits: torch.Tensor, params: list[SamplingParams], token_ids: list[list[int]],
                   num_prompt_tokens: list[int], stop_ids: list) -> torch.Tensor:
    """logits [B, V] raw -> the logits each row's sampler sees (before temperature), vLLM's way: logit_bias
    added; stop_ids[i] masked (-inf) while row i has fewer than min_tokens output tokens; then the repetition
    penalty over the prompt and output tokens (token_ids[i][:num_prompt_tokens[i]] and the rest), then the
    frequency and presence penalties over the output tokens. Rows that need none of it come back unchanged
    (and so does the tensor, when no row does)."""
    rows = [i for i, p in enumerate(params) if p.processes_logits]
    if not rows:
        return logits
    out, V, dev = logits.clone(), logits.shape[-1], logits.device
    for i in rows:
        p, row = params[i], out[i]
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=dev)
            row.index_add_(0, ids, torch.tensor(list(p.logit_bias.values()), device=dev, dtype=row.dtype))
        prompt, output = token_ids[i][:num_prompt_tokens[i]], token_ids[i][num_prompt_tokens[i]:]
        if len(output) < p.min_tokens and stop_ids[i]:
            row[torch.tensor([t for t in stop_ids[i] if t < V], device=dev, dtype=torch.long)] = float("-inf")
        counts = torch.bincount(torch.tensor(output, device=dev, dtype=torch.long), minlength=V)[:V]
        if p.repetition_penalty != 1.0:
            seen = counts > 0
            seen[torch.tensor(prompt, device=dev, dtype=torch.long)] = True
            scaled = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
            row.copy_(torch.where(seen, scaled, row))
        if p.frequency_penalty:
            row -= p.frequency_penalty * counts.to(row.dtype)
        if p.presence_penalty:
            row -= p.presence_penalty * (counts > 0).to(row.dtype)
    return out


class StopStrings:
    """One sequence's stop-string matcher (vLLM's check_stop_strings, run after every token).

    check(text, num_output_tokens) is given the whole detokenized output after each new token. A match must
    end in text that was not checked before (a stop string straddling the previous end is found; one wholly
    inside earlier text was found then, or ignored on purpose), and nothing is matched while at most
    min_tokens tokens are out (that text is never searched, as vLLM's detokenizer skips it). Text ending
    inside a UTF-8 character (decoded as U+FFFD) waits for the character. Returns (stop string, the length
    the output text is cut to) for the match that completes earliest (ties: the first in `stops`), or None.
    """

    def __init__(self, stops: list[str], include_in_output: bool, min_tokens: int, text: str = ""):
        self.stops, self.include, self.min_tokens = list(stops), include_in_output, min_tokens
        self.checked = len(text.rstrip("\ufffd"))  # characters of the output already searched

    def check(self, text: str, num_output_tokens: int) -> tuple[str, int] | None:
        if text.endswith("\ufffd"):
            return None
        start, self.checked = self.checked, len(text)
        if num_output_tokens <= self.min_tokens:
            return None
        best = None
        for s in self.stops:
            i = text.find(s, max(0, start - len(s) + 1))
            if i != -1 and (best is None or i + len(s) < best[1] + len(best[0])):
                best = (s, i)
        if best is None:
            return None
        s, i = best
        return s, (i + len(s) if self.include else i)


def stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of text that is a prefix of some stop string (or the whole of one):
    what a stream must hold back, since the next tokens may complete a stop string there."""
    longest = max((len(s) for s in stops), default=0)
    for k in range(min(longest, len(text)), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stops):
            return k
    return 0


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
