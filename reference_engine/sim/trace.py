"""The Azure LLM inference trace 2023 (Splitwise, ISCA 2024) as workloads for a small model.

Each CSV row is one production request: TIMESTAMP, ContextTokens (prompt), GeneratedTokens
(output). `load` turns a file into `Request`s with arrival seconds measured from the first row;
the helpers below cut a window, fit the sizes into a small model's context and change the rate.
All functions return new lists; requests are immutable.

    reqs = sample(64, seed=0, trace="conv")          # 64 consecutive requests, t0 = 0
    reqs = scale_to_context(reqs, max_context=512)   # sizes fit a 512-token model
    reqs = with_rate(reqs, rps=4.0)                  # same burstiness, 4 requests/s on average
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "azure_llm_inference_2023"
TRACES = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv"}


@dataclass(frozen=True)
class Request:
    arrival: float      # seconds since the first request of the workload
    prompt_tokens: int
    output_tokens: int


def _path(trace: str | Path) -> Path:
    return DATA_DIR / TRACES[trace] if str(trace) in TRACES else Path(trace)


def load(trace: str | Path = "conv") -> list[Request]:
    """Read a trace ("conv", "code" or a CSV path) sorted by arrival; t = 0 at the first row. A new list each
    call (the requests are immutable); a file is parsed once per process while it stays unchanged."""
    path = _path(trace)
    st = path.stat()
    return list(_parse(str(path), st.st_mtime_ns, st.st_size))


@lru_cache(maxsize=8)
def _parse(path: str, mtime_ns: int, size: int) -> tuple[Request, ...]:
    """mtime and size are part of the key so an edited file is read again."""
    return tuple(_read(Path(path)))


def _read(path: Path) -> list[Request]:
    with open(path, newline="") as f:
        rows = csv.reader(f)
        head = next(rows)
        cols = [head.index(k) for k in ("TIMESTAMP", "ContextTokens", "GeneratedTokens")]
        stamps, prompt, output = zip(*((r[cols[0]], r[cols[1]], r[cols[2]]) for r in rows))
    # numpy parses the 7-digit fractional seconds exactly (datetime.fromisoformat may not), and whole columns
    # at once: a third of the time of a csv.DictReader and int() per row
    ts = np.array([s.strip().replace(" ", "T") for s in stamps], dtype="datetime64[ns]")
    order = np.argsort(ts, kind="stable")
    secs = ((ts[order] - ts[order[0]]).astype(np.int64) / 1e9).tolist()
    prompt = np.array(prompt, dtype=np.int64)[order].tolist()
    output = np.array(output, dtype=np.int64)[order].tolist()
    return [_request(a, c, g) for a, c, g in zip(secs, prompt, output)]


def _request(arrival: float, prompt_tokens: int, output_tokens: int) -> Request:
    """Request(arrival, prompt_tokens, output_tokens), built five times faster: a frozen dataclass's __init__
    sets each field through object.__setattr__, which for a whole trace (19,366 rows) was 0.1 s, two thirds of
    loading it. The instance is the same (fields in its __dict__, equal to one built by Request(...))."""
    r = object.__new__(Request)
    r.__dict__.update(arrival=arrival, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    return r


def rebase(requests: Sequence[Request]) -> list[Request]:
    """Shift arrivals so the first request arrives at t = 0."""
    t0 = min((r.arrival for r in requests), default=0.0)
    return [replace(r, arrival=r.arrival - t0) for r in requests]


def sample(n: int, seed: int = 0, trace: str | Path | Sequence[Request] = "conv",
           contiguous: bool = True) -> list[Request]:
    """n requests from a trace name/path or a request list, re-based to t = 0.

    contiguous=True: a window of n consecutive requests starting at a seeded random row
    (keeps the real burstiness). contiguous=False: a seeded random subset, kept in arrival order
    (thins the trace, so the rate drops by about n / len(trace))."""
    reqs = load(trace) if isinstance(trace, (str, Path)) else list(trace)
    if not 0 < n <= len(reqs):
        raise ValueError(f"n must be in 1..{len(reqs)}, got {n}")
    rng = np.random.default_rng(seed)
    if contiguous:
        start = int(rng.integers(0, len(reqs) - n + 1))
        picked = reqs[start:start + n]
    else:
        picked = [reqs[i] for i in np.sort(rng.choice(len(reqs), size=n, replace=False))]
    return rebase(picked)


def scale_to_context(requests: Sequence[Request], max_context: int, factor: float | None = None,
                     output_factor: float | None = None, quantile: float = 0.99) -> list[Request]:
    """Shrink token counts so every request fits a model with `max_context` positions.

    1. Divide prompt lengths by `factor` and output lengths by `output_factor` (default: the same
       factor), rounding to nearest and keeping each >= 1. `factor=None` picks
       max(1, q-quantile(prompt + output) / max_context) over these requests, so about
       (1 - quantile) of them still overflow before step 2. One common factor keeps the
       prompt/output ratio and the shape of both distributions.
    2. Any request with prompt + output > max_context is shrunk proportionally (both parts by the
       same ratio, each >= 1) so that prompt + output == max_context.
    Arrivals are unchanged."""
    if max_context < 2:
        raise ValueError("max_context must be >= 2 (one prompt and one output token)")
    if not requests:
        return []
    if factor is None:
        total = np.array([r.prompt_tokens + r.output_tokens for r in requests], dtype=np.float64)
        factor = max(1.0, float(np.quantile(total, quantile)) / max_context)
    output_factor = factor if output_factor is None else output_factor
    out = []
    for r in requests:
        p = max(1, round(r.prompt_tokens / factor))
        o = max(1, round(r.output_tokens / output_factor))
        if p + o > max_context:
            p = min(max_context - 1, max(1, int(p * max_context / (p + o))))
            o = max_context - p
        out.append(replace(r, prompt_tokens=p, output_tokens=o))
    return out


def rate(requests: Sequence[Request]) -> float:
    """Mean arrival rate (requests/s): (n - 1) interarrival gaps over the span."""
    if len(requests) < 2:
        return float("inf")
    span = max(r.arrival for r in requests) - min(r.arrival for r in requests)
    return (len(requests) - 1) / span if span > 0 else float("inf")


def with_rate(requests: Sequence[Request], rps: float) -> list[Request]:
    """Stretch/compress time so the mean rate is `rps`, keeping the relative gaps (burstiness).
    rps=inf puts every arrival at t = 0 (offline / all-at-once)."""
    reqs = rebase(requests)
    if rps == float("inf"):
        return [replace(r, arrival=0.0) for r in reqs]
    if rps <= 0:
        raise ValueError("rps must be > 0")
    cur = rate(reqs)
    if cur == float("inf"):  # all simultaneous: no gaps to stretch, space them evenly
        return [replace(r, arrival=i / rps) for i, r in enumerate(reqs)]
    return [replace(r, arrival=r.arrival * cur / rps) for r in reqs]


def with_poisson_arrivals(requests: Sequence[Request], rps: float, seed: int = 0) -> list[Request]:
    """Replace arrivals by a Poisson process of rate `rps` (first request at t = 0)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rps, size=len(requests))
    t = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    return [replace(r, arrival=float(a)) for r, a in zip(requests, t)]


def to_arrays(requests: Sequence[Request]) -> dict[str, np.ndarray]:
    return {"arrival": np.array([r.arrival for r in requests], dtype=np.float64),
            "prompt_tokens": np.array([r.prompt_tokens for r in requests], dtype=np.int64),
            "output_tokens": np.array([r.output_tokens for r in requests], dtype=np.int64)}


def summary(requests: Sequence[Request]) -> dict[str, float]:
    """Count, span, rate and p50/p99 sizes, for printing next to a replay's results."""
    a = to_arrays(requests)
    s = {"requests": len(requests), "span_s": float(np.ptp(a["arrival"])) if len(requests) else 0.0,
         "rps": rate(requests)}
    for k in ("prompt_tokens", "output_tokens"):
        s[f"{k}_mean"] = float(a[k].mean())
        s[f"{k}_p50"], s[f"{k}_p99"] = (float(x) for x in np.percentile(a[k], [50, 99]))
    return s


def prompt_token_ids(requests: Sequence[Request], vocab_size: int, seed: int = 0,
                     exclude: Sequence[int] = (0,)) -> list[list[int]]:
    """Seeded random prompts of each request's prompt length (ids in exclude are avoided, e.g.
    the EOS/BOS id). Content does not matter for throughput, only length does."""
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(exclude, dtype=np.int64))
    return [rng.choice(allowed, size=r.prompt_tokens).tolist() for r in requests]
