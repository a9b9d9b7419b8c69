"""Checks for lesson 19: packing ragged prompts, packed attention, first-fit-decreasing batches,
the batching window's added latency, and the largest batch that fits in memory.

Packed attention is checked against its definition, independently of the reference: causal SDPA run
on each sequence alone, the outputs concatenated. Batches are checked by their properties first (every
request once, the budget held, no more batches than first-fit decreasing needs), then against the
docstring's assignment (first-fit decreasing, ties by lower index): a packing with as few batches but
another grouping (best-fit, other tie order) is named, and so is a worse one.
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from autograder.checks import _attention
from autograder.checks._configs import NULL_FIELDS_7B, call, describe, non_default, random_config
from autograder.compare import compare
from autograder.core import LearnerRaised, check
from autograder.mistakes import name_of
from autograder.reference import answer_code

# -- 1.1 packing ------------------------------------------------------------------------------------


def random_prompts(rng, n_max: int = 6, len_max: int = 12) -> list[list[int]]:
    n = rng.randint(2, n_max)
    return [[rng.randrange(2048) for _ in range(rng.randint(1, len_max))] for _ in range(n)]


def _lengths(prompts):
    return torch.tensor([len(p) for p in prompts], dtype=torch.int64)


@answer_code
def cu_seqlens_mistakes(prompts) -> dict:
    ends = _lengths(prompts).cumsum(0)
    zero = torch.zeros(1, dtype=torch.int64)
    return {"leaves out the leading 0 of cu_seqlens (it has n + 1 entries and starts at 0)": ends.int(),
            "leaves out the final total (cu_seqlens has n + 1 entries and ends at T)": torch.cat([zero, ends[:-1]]).int(),
            "stores each sequence's last index instead of its end (off by one: sequence i is "
            "cu_seqlens[i]:cu_seqlens[i + 1], end excluded)": torch.cat([zero, ends - 1]).int(),
            "returns cu_seqlens as int64; varlen attention kernels take int32": torch.cat([zero, ends])}


@answer_code
def positions_mistakes(prompts) -> dict:
    T = int(_lengths(prompts).sum())
    restart = torch.cat([torch.arange(len(p)) for p in prompts])
    return {"numbers positions across the whole packed batch instead of restarting at 0 for each "
            "sequence (they run past the model's context, and decoding resumes at positions that do not "
            "match the cached keys)": torch.arange(T),
            "starts positions at 1 instead of 0": restart + 1,
            "returns positions as int32; index tensors (RoPE tables, embeddings) use int64": restart.int()}


@check(points=2, section="1.1")
def pack_prompts(t):
    """Flat input_ids, int32 cu_seqlens with a leading 0, per-sequence positions, max_seqlen."""
    visible = [("two prompts", [[5, 6, 7], [8, 9]]), ("one prompt", [[11, 12, 13, 14]]),
               ("one-token prompts at both ends", [[7], [3, 4, 5], [9]])]
    for label, prompts in t.cases(visible, random_prompts, n=2):
        with t.case(f"{label}, lengths {[len(p) for p in prompts]}"):
            got, expected = t.both("pack_prompts", prompts)
            t.expect_true(isinstance(got, dict), f"pack_prompts() must return a dict, got {type(got).__name__}")
            missing = [k for k in expected if k not in got]
            t.expect_true(not missing, f"the dict is missing key(s) {missing}")
            t.expect(got["input_ids"], expected["input_ids"], "input_ids",
                     mistakes={"stores token ids as int32; embedding lookups take int64":
                               expected["input_ids"].int()})
            t.expect(got["cu_seqlens"], expected["cu_seqlens"], "cu_seqlens", mistakes=cu_seqlens_mistakes(prompts))
            t.expect(got["positions"], expected["positions"], "positions", mistakes=positions_mistakes(prompts))
            t.expect(got["max_seqlen"], expected["max_seqlen"], "max_seqlen",
                     mistakes={"returns the total token count, not the longest prompt": int(_lengths(prompts).sum())})
            t.expect_true(isinstance(got["max_seqlen"], numbers.Integral),
                          f"max_seqlen should be a Python int, got {type(got['max_seqlen']).__name__}")
    with t.case("an empty prompt is refused with ValueError"):
        t.expect_raises(ValueError, "pack_prompts", [[1, 2], []],
                        why="an empty prompt has no token to generate from; engines reject it")
    with t.case("no prompts at all is refused with ValueError"):
        t.expect_raises(ValueError, "pack_prompts", [],
                        why="a batch needs at least one prompt (and max() of nothing is undefined)")


# -- 1.2 the mask -----------------------------------------------------------------------------------

@answer_code
def cu_of(lengths) -> torch.Tensor:
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return cu


@answer_code
def block_diagonal(cu: torch.Tensor) -> torch.Tensor:
    cu = cu.long()
    seq = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
    return seq[:, None] == seq[None, :]


@answer_code
def mask_mistakes(cu: torch.Tensor) -> dict:
    T = int(cu[-1])
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    block = block_diagonal(cu)
    return {"is causal over the whole packed batch, so tokens attend across sequences (the mask must "
            "also be block-diagonal: same sequence only)": causal,
            "is block-diagonal but not causal: tokens see later tokens of their own sequence": block,
            "is transposed: token i sees tokens j >= i (the future) instead of j <= i": block & causal.T,
            "leaves out the diagonal: a token must attend to itself (j <= i, not j < i)": block & causal.tril(-1),
            "puts each sequence's first token into the sequence before it (an off-by-one at the boundaries: "
            "position p belongs to the sequence i with cu_seqlens[i] <= p < cu_seqlens[i + 1])":
                boundary_shifted(cu) & causal}


@answer_code
def boundary_shifted(cu: torch.Tensor) -> torch.Tensor:
    """Same-sequence mask with position cu[i] counted in sequence i - 1 (searchsorted without right=True)."""
    pos = torch.arange(int(cu[-1]))
    seq = torch.searchsorted(cu[1:].long().contiguous(), pos)
    return seq[:, None] == seq[None, :]


def random_lengths(rng, n_max=6, len_max=10) -> list[int]:
    return [rng.randint(1, len_max) for _ in range(rng.randint(2, n_max))]


@check(points=2, section="1.2")
def varlen_causal_mask(t):
    """Block-diagonal causal bool mask from cu_seqlens."""
    visible = [("two sequences", [2, 1]), ("two sequences", [3, 2]), ("one sequence", [4]),
               ("one-token sequences", [1, 3, 1])]
    for label, lengths in t.cases(visible, random_lengths, n=2):
        with t.case(f"{label}: lengths {lengths}"):
            cu = cu_of(lengths)
            got, expected = t.both("varlen_causal_mask", cu)
            t.expect(got, expected, f"mask for cu_seqlens {cu.tolist()}", mistakes=mask_mistakes(cu),
                     hint="Return a bool tensor, True where attention is allowed (SDPA's boolean attn_mask "
                          "convention), not an additive 0 / -inf float mask.")


# -- 1.3 packed attention ---------------------------------------------------------------------------

@answer_code
def per_sequence_sdpa(q, k, v, cu, scale=None) -> torch.Tensor:
    """The definition: causal attention on each sequence alone (SDPA), outputs concatenated."""
    group = q.shape[1] // k.shape[1]
    out = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qi, ki, vi = (x[s:e].transpose(0, 1)[None] for x in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
        out.append(F.scaled_dot_product_attention(qi.double(), ki.double(), vi.double(), is_causal=True,
                                                  scale=scale)[0].transpose(0, 1))
    return torch.cat(out).to(q.dtype)


@answer_code
def masked_attention(q, k, v, mask, scale, heads="interleave", acc=torch.float64) -> torch.Tensor:
    """Attention under `mask`, computed in `acc`: float64 for the references, bf16 for the no-upcast mistake."""
    T, H, D = q.shape
    group = H // k.shape[1]
    if heads == "interleave":
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    else:
        k, v = k.repeat(1, group, 1), v.repeat(1, group, 1)
    scores = torch.einsum("thd,shd->hts", q.to(acc), k.to(acc)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v.to(acc)).to(q.dtype)


@answer_code
def attention_mistakes(q, k, v, cu, scale) -> dict:
    D, H, H_kv = q.shape[2], q.shape[1], k.shape[1]
    s = D ** -0.5 if scale is None else scale
    T = int(cu[-1])
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    block = block_diagonal(cu)
    wrong = {"attends across sequences (a causal mask over the whole batch is not block-diagonal)":
             masked_attention(q, k, v, causal, s),
             "is not causal within a sequence (block-diagonal mask without the triangle)":
             masked_attention(q, k, v, block, s),
             "applies no mask at all": masked_attention(q, k, v, None, s)}
    if scale is None:
        wrong["is missing the 1/sqrt(head_dim) scale"] = masked_attention(q, k, v, block & causal, 1.0)
    else:
        wrong["ignores the scale argument (uses 1/sqrt(head_dim))"] = masked_attention(q, k, v, block & causal, D ** -0.5)
    if H_kv > 1 and H > H_kv:
        wrong["pairs query heads with KV heads by repeat, not repeat_interleave (head h reads KV head "
              "h // group)"] = masked_attention(q, k, v, block & causal, s, heads="repeat")
    return wrong


@check(points=3, section="1.3")
def packed_attention(t):
    """Attention over the packed batch equals causal attention on each sequence alone."""
    visible = [("two sequences", ([3, 2], 4, 2, 8, None)), ("one sequence", ([5], 2, 2, 8, None)),
               ("GQA, a one-token sequence", ([1, 4, 2], 8, 2, 16, None)),
               ("explicit scale", ([2, 3], 2, 1, 8, 0.3))]

    def hidden(rng):  # grouped-query heads every time (the visible cases hold MHA and MQA): the pairing shows
        H_kv, group = rng.choice([2, 4]), rng.choice([2, 4])
        return random_lengths(rng, 5, 10), H_kv * group, H_kv, rng.choice([8, 16, 32]), None
    for label, (lengths, H, H_kv, D, scale) in t.cases(visible, hidden, n=2):
        with t.case(f"{label}: lengths {lengths}, heads {H}, kv heads {H_kv}, head_dim {D}"
                    + (f", scale {scale}" if scale is not None else "")):
            T = sum(lengths)
            q = torch.randn(T, H, D, generator=t.gen)
            k, v = torch.randn(T, H_kv, D, generator=t.gen), torch.randn(T, H_kv, D, generator=t.gen)
            cu = cu_of(lengths)
            expected = per_sequence_sdpa(q, k, v, cu, scale)
            args = (q, k, v, cu) + ((scale,) if scale is not None else ())
            got = t.call("packed_attention", *args)
            mask = t.ref.varlen_causal_mask(cu)  # computed whatever the answer: a student's copy replays it
            if compare(got, expected) is not None:
                t.blame_upstream("packed_attention", "varlen_causal_mask", [((cu,), mask)], rtol=None,
                                 shown=f"cu_seqlens {cu.tolist()}")
            t.expect(got, expected, "packed attention vs each sequence alone",
                     mistakes=attention_mistakes(q, k, v, cu, scale))
    with t.case("bf16 q, k, v: lengths [10, 6], heads 4, kv heads 1, head_dim 32, keys with a large common part"):
        q, k, v = _attention.bf16_qkv(16)
        cu = cu_of([10, 6])
        exact = per_sequence_sdpa(q.double(), k.double(), v.double(), cu)
        t.expect(t.call("packed_attention", q, k, v, cu), exact.bfloat16(), "packed attention vs each sequence alone",
                 mistakes={"computes the scores and the softmax in bf16: upcast q, k and v to float32 first (bf16 "
                           "keeps 2-3 significant digits: a score near 100 is off by up to 0.25), and cast the "
                           "output back": masked_attention(q, k, v, varlen_mask(cu), 32 ** -0.5, acc=torch.bfloat16),
                           "returns float32: cast the output back to q's dtype": exact.float()})


@answer_code
def varlen_mask(cu: torch.Tensor) -> torch.Tensor:
    T = int(cu[-1])
    return block_diagonal(cu) & torch.ones(T, T, dtype=torch.bool).tril()


# -- 2.1 batches under a token budget ---------------------------------------------------------------

def _cost(costs, batch, padded):
    sizes = [costs[i] for i in batch]
    return len(sizes) * max(sizes) if padded else sum(sizes)


@answer_code
def _pack(costs, budget, padded, order="decreasing", fit="first", strict=False, cost_padded=None):
    """First/next/best-fit with a choice of order: the reference's algorithm and its usual variants."""
    cost_padded = padded if cost_padded is None else cost_padded
    idx = list(range(len(costs)))
    if order == "decreasing":
        idx.sort(key=lambda i: (-costs[i], i))
    elif order == "decreasing, ties by higher index":
        idx.sort(key=lambda i: (-costs[i], -i))
    elif order == "increasing":
        idx.sort(key=lambda i: (costs[i], i))
    batches = []
    for i in idx:
        open_ = batches if fit in ("first", "best") else batches[-1:]
        fits = [b for b in open_ if (c := _cost(costs, b + [i], cost_padded)) < budget or (not strict and c == budget)]
        if fit == "best" and fits:  # the batch left with the least room
            fits.sort(key=lambda b: budget - _cost(costs, b + [i], cost_padded))
        if fits:
            fits[0].append(i)
        else:
            batches.append([i])
    return batches


@answer_code
def batching_mistakes(costs, budget, padded) -> dict:
    """The usual wrong packers, each named for what it does. Used both when the learner needs more batches than
    first-fit decreasing and when it needs as many but groups the requests differently (first-fit in arrival
    order, say, can tie first-fit decreasing's count)."""
    wrong = {"visits the requests in arrival order (plain first-fit); first-fit decreasing visits the largest "
             "cost first": _pack(costs, budget, padded, "none"),
             "visits the requests smallest cost first (first-fit increasing); first-fit decreasing visits the "
             "largest first": _pack(costs, budget, padded, "increasing"),
             "only tries the most recently opened batch (next-fit decreasing); first-fit tries every batch opened "
             "so far, oldest first": _pack(costs, budget, padded, fit="next"),
             "treats the budget as exclusive (< budget); a batch of exactly `budget` tokens fits (<= budget)":
             _pack(costs, budget, padded, strict=True)}
    if not padded:
        wrong["uses the padded size len(batch) * max cost in packed mode; a packed batch costs the sum of its "
              "costs"] = _pack(costs, budget, False, cost_padded=True)
    return wrong


@answer_code
def assignment_mistakes(costs, budget, padded) -> dict:
    """Variants that need no more batches than first-fit decreasing but put requests elsewhere."""
    return {"puts each request into the batch it leaves fullest (best-fit decreasing); first-fit takes the first "
            "batch opened that has room": _pack(costs, budget, padded, fit="best"),
            "breaks cost ties by the higher index first; equal costs go lower index first":
            _pack(costs, budget, padded, "decreasing, ties by higher index")}


def canonical(batches) -> list:
    return sorted(sorted(b) for b in batches)


def random_costs(rng, budget: int, n: int, oversize: bool) -> list[int]:
    """Request sizes shaped like a trace: many short, a few long; optionally one over the budget."""
    costs = [max(1, min(budget, int(rng.lognormvariate(math.log(budget / 6), 0.8)))) for _ in range(n)]
    if oversize:
        costs[rng.randrange(n)] = budget + rng.randint(1, budget)
    return costs


@check(points=3, section="2.1")
def form_batches(t):
    """Every request once, each batch within the budget, no more batches than first-fit decreasing."""
    # The first case tells every usual packer apart (arrival order, smallest first, next-fit, best-fit, an exclusive
    # budget, the padded size in packed mode: each groups the requests its own way), so a wrong packer's first
    # message names it alone; on the docstring's cases some of them group alike.
    visible = [("every usual variant groups differently", ([1, 5, 8, 1, 4], 10, False)),
               ("packed", ([4, 4, 4, 6, 6, 6], 10, False)), ("padded", ([4, 4, 4, 6, 6, 6], 12, True)),
               ("exact fits", ([5, 5, 5, 5, 2, 8], 10, False)),
               ("first-fit and best-fit part ways", ([2, 8, 4, 5, 1, 7], 10, False)),
               ("a request larger than the budget", ([3, 15, 5, 2, 7], 10, False))]
    hidden = []
    for padded, oversize in [(False, False), (False, True), (True, False)]:
        budget = t.rng.choice([256, 512, 1000, 2048])
        hidden.append((random_costs(t.rng, budget, t.rng.randint(12, 30), oversize), budget, padded))
    for label, (costs, budget, padded) in t.cases(visible, hidden):
        shown = costs if len(costs) <= 8 else f"{len(costs)} requests"
        with t.case(f"{label}: costs {shown}, budget {budget}" + (", padded" if padded else "")):
            try:  # padded=False is the default: leave it out, as a caller would
                got = t.call("form_batches", costs, budget, **non_default(padded=(padded, False)))
            except LearnerRaised as e:
                if any(c > budget for c in costs) and e.is_a(ValueError) and not e.not_implemented:
                    t.fail("form_batches() raised ValueError for a request larger than the budget; "
                           "it should get a batch of its own")
                raise
            check_batches(t, got, costs, budget, padded)
            ref = t.ref.form_batches(costs, budget, padded)
            # computed whatever the answer (a student's copy replays what the release computed for the solution)
            too_many, other = batching_mistakes(costs, budget, padded), assignment_mistakes(costs, budget, padded)
            other = {**too_many, **other}  # a wrong packer can tie first-fit decreasing's count and still group otherwise
            same = lambda a, b: canonical(a) == canonical(b)
            if len(got) > len(ref):
                names = name_of(got, too_many, same, ref)
                t.fail(f"{len(got)} batches where first-fit decreasing needs {len(ref)}" + ("." if names else f": {ref}"),
                       names)
            if canonical(got) != canonical(ref):  # as few batches, but not the docstring's assignment
                names = name_of(got, other, same, ref)
                t.fail(f"batches {[list(b) for b in got]}; first-fit decreasing gives {ref}"
                       + ("." if names else " (the requests are grouped differently: visit costs largest first, "
                          "ties lower index first, each into the first batch opened that has room)"), names)
    for label, costs, budget in [("a budget of 0", [3, 2], 0), ("a cost of 0", [3, 0, 2], 10)]:
        with t.case(f"{label} is refused with ValueError"):
            t.expect_raises(ValueError, "form_batches", costs, budget,
                            why="a budget below 1 or a cost below 1 is a caller's bug, not a batch to form")


def check_batches(t, got, costs, budget, padded) -> None:
    t.expect_true(isinstance(got, (list, tuple)) and all(isinstance(b, (list, tuple)) for b in got),
                  f"form_batches() must return a list of lists of indices, got {type(got).__name__}")
    flat = [i for b in got for i in b]
    t.expect_true(all(isinstance(i, numbers.Integral) and 0 <= i < len(costs) for i in flat),
                  f"batches must hold request indices 0..{len(costs) - 1}")
    t.expect_true(all(len(b) > 0 for b in got), "a batch is empty: drop it")
    missing = sorted(set(range(len(costs))) - set(flat))
    t.expect_true(not missing, f"request(s) {missing[:10]} are in no batch")
    twice = sorted({i for i in flat if flat.count(i) > 1})
    t.expect_true(not twice, f"request(s) {twice[:10]} are in more than one batch")
    kind = "padded (len(batch) * longest)" if padded else "packed (sum of costs)"
    for b in got:
        size = _cost(costs, list(b), padded)
        if len(b) > 1 and size > budget:
            big = [i for i in b if costs[i] > budget]
            if big:
                t.fail(f"request {big[0]} costs {costs[big[0]]} > budget {budget}, yet shares batch {list(b)}: "
                       "an oversized request runs alone")
            if padded and _cost(costs, list(b), False) <= budget:
                t.fail(f"batch {list(b)} is {size} tokens padded, over the budget {budget}.", "counts packed tokens "
                       "in padded mode (a padded batch costs len(batch) * its longest request)")
            t.fail(f"batch {list(b)} is {size} tokens {kind}, over the budget {budget}")


# -- 3.1 the batching window ------------------------------------------------------------------------

@answer_code
def _window(arrivals, window, max_batch=None, strict=False, clock_aligned=False, from_open=False,
            mean_over_batches=False, full_waits=False) -> dict:
    """The batcher with one switchable mistake (all off: the right answer)."""
    dispatch, opened, sizes, i, n = [], [], [], 0, len(arrivals)
    while i < n:
        a0 = arrivals[i]
        close = (math.floor(a0 / window) + 1) * window if clock_aligned and window > 0 else a0 + window
        j = i + 1
        while j < n and (arrivals[j] < close if strict or clock_aligned else arrivals[j] <= close) \
                and (max_batch is None or j - i < max_batch):
            j += 1
        full = max_batch is not None and j - i == max_batch and not full_waits
        at = float(arrivals[j - 1]) if full else float(close)
        dispatch += [at] * (j - i)
        opened += [float(a0)] * (j - i)
        sizes.append(j - i)
        i = j
    start = opened if from_open else arrivals
    delay = [d - float(a) for d, a in zip(dispatch, start)]
    if mean_over_batches and sizes:
        k, means = 0, []
        for s in sizes:
            means.append(sum(delay[k:k + s]) / s)
            k += s
        mean = sum(means) / len(means)
    else:
        mean = sum(delay) / n if n else 0.0
    return {"dispatch": dispatch, "delay": delay, "mean": mean, "max": max(delay, default=0.0), "batch_sizes": sizes}


@answer_code
def window_mistakes(arrivals, window, max_batch) -> dict:
    wrong = {"measures each delay from the window's opening, not from the request's own arrival":
             _window(arrivals, window, max_batch, from_open=True),
             "leaves a request that arrives exactly at the window's end for the next batch (the window "
             "includes its end: arrival <= a0 + window)": _window(arrivals, window, max_batch, strict=True),
             "uses fixed clock-aligned windows [k*W, (k+1)*W) instead of opening a window when the first "
             "waiting request arrives": _window(arrivals, window, max_batch, clock_aligned=True),
             "averages the delay over batches, not over requests": _window(arrivals, window, max_batch,
                                                                            mean_over_batches=True)}
    if max_batch is not None:
        wrong["ignores max_batch_size"] = _window(arrivals, window, None)
        wrong["dispatches a full batch at its window's end instead of the moment it fills"] = \
            _window(arrivals, window, max_batch, full_waits=True)
    return wrong


def poisson_arrivals(rng, n: int, rate: float, grid: float | None = None) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(round(t / grid) * grid if grid else t)
        t += rng.expovariate(rate)
    return sorted(out)


@check(points=3, section="3.1")
def batch_window_delays(t):
    """Per-request added wait of a batching window (with an optional max batch size); mean and max."""
    grid = [0.125, 0.375, 0.625, 0.875, 1.625, 1.875, 3.125]  # exact in binary: ties at a0 + window are real
    visible = [("window 0.5 s", (grid, 0.5, None)), ("window 0.5 s, max_batch_size 2", (grid, 0.5, 2)),
               ("window 0, simultaneous arrivals", ([1.0, 1.0, 1.0, 2.0], 0.0, None)),
               ("no requests", ([], 1.0, None))]
    hidden = [(poisson_arrivals(t.rng, t.rng.randint(15, 40), t.rng.uniform(2, 20)), t.rng.uniform(0.05, 1.0), None),
              (poisson_arrivals(t.rng, t.rng.randint(15, 40), t.rng.uniform(4, 12), grid=0.125),
               t.rng.choice([0.25, 0.5, 0.75]), t.rng.randint(2, 6))]
    for label, (arrivals, window, max_batch) in t.cases(visible, hidden):
        shown = arrivals if len(arrivals) <= 8 else f"{len(arrivals)} Poisson arrivals"
        with t.case(f"{label}: {shown}, window {window:g}" + (f", max_batch_size {max_batch}" if max_batch else "")):
            expected = t.ref.batch_window_delays(arrivals, window, max_batch)
            # max_batch_size=None is the default: leave it out, as a caller would
            got = t.call("batch_window_delays", arrivals, window, **non_default(max_batch_size=(max_batch, None)))
            t.expect(got, expected, "batch_window_delays()", mistakes=window_mistakes(arrivals, window, max_batch),
                     atol=1e-9)
    for label, window, max_batch in [("a negative window", -0.5, None), ("max_batch_size 0", 0.5, 0)]:
        with t.case(f"{label} is refused with ValueError"):
            t.expect_raises(ValueError, "batch_window_delays", [0.0, 1.0], window, max_batch,
                            why="a window below 0 or a max_batch_size below 1 is a caller's bug")


# -- 4.1 the largest batch that fits ----------------------------------------------------------------

LLAMA_3_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "intermediate_size": 14336, "torch_dtype": "bfloat16"}
LLAMA_3_70B = {"model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
               "hidden_size": 8192, "intermediate_size": 28672, "torch_dtype": "bfloat16"}
MHA_7B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096,
          "intermediate_size": 11008}


@answer_code
def memory_mistakes(per_tok, free, p, o, act, bs) -> dict:
    """The usual wrong memory models; `per_tok` is the given kv_bytes_per_token's value (lesson 02's formula,
    not written here, so it has no mistakes of its own)."""
    def fit(tokens=None, act_tokens=p, rounding=math.floor):
        tokens = math.ceil((p + o) / bs) * bs if tokens is None else tokens
        return max(0, int(rounding(free / (tokens * per_tok + act_tokens * act))))

    wrong = {"forgets the output tokens: the KV cache grows to prompt_len + output_len tokens per sequence":
             fit(tokens=math.ceil(p / bs) * bs),
             "rounds the number of sequences up (ceil); only whole sequences that fit count, so round it down "
             "(floor)": fit(rounding=math.ceil),
             "rounds the number of sequences to the nearest integer; only whole sequences that fit count, so round "
             "it down (floor)": fit(rounding=round)}
    if bs > 1:
        wrong["does not round each sequence's tokens up to whole blocks of block_size tokens"] = fit(tokens=p + o)
        wrong["rounds each sequence's tokens DOWN to whole blocks; a partly filled block still takes a whole block, "
              "so round them up"] = fit(tokens=(p + o) // bs * bs)
        wrong["rounds the prompt and the output up to whole blocks separately; they share the sequence's blocks, "
              "so round their sum"] = fit(tokens=(math.ceil(p / bs) + math.ceil(o / bs)) * bs)
        wrong["counts blocks as tokens: a block holds block_size tokens of KV, so multiply by block_size"] = \
            fit(tokens=math.ceil((p + o) / bs))
    if act:
        wrong["ignores the activations"] = fit(act_tokens=0)
        wrong["counts activations for the output tokens too (only the prefill holds prompt_len tokens' "
              "activations at once)"] = fit(act_tokens=p + o)
    if free < 0:
        wrong["returns a negative batch size when nothing fits (return 0)"] = int(
            free // (math.ceil((p + o) / bs) * bs * per_tok + p * act))
    return wrong


@check(points=2, section="4.1")
def max_batch_in_memory(t):
    """floor(free / (KV of prompt + output, in whole blocks, + prefill activations)), never negative; the KV per
    token is the given helper's (lesson 02's formula)."""
    # "short sequences" comes before the 70B case, where rounding the blocks down and the count up give the same
    # number: a learner who rounds the blocks the wrong way is named for that alone.
    visible = [("Llama-3-8B, bf16, 60 GB free", (LLAMA_3_8B, 2, 60e9, 1536, 512, 0.0, 1)),
               ("short sequences in blocks of 16", (LLAMA_3_8B, 2, 10e9, 20, 5, 0.0, 16)),
               ("Llama-3-70B, bf16, blocks of 16, activations", (LLAMA_3_70B, 2, 40e9, 1000, 210, 100e3, 16)),
               ("MHA without num_key_value_heads, fp8 KV", (MHA_7B, 1, 24e9, 3000, 500, 0.0, 16)),
               ("MHA with num_key_value_heads and head_dim null, fp16 KV", (NULL_FIELDS_7B, 2, 30e9, 700, 300, 5e4, 32)),
               ("nothing fits", (LLAMA_3_70B, 2, 1e8, 2048, 512, 0.0, 16)),
               ("the weights did not fit (negative free memory)", (LLAMA_3_8B, 2, -5e9, 512, 128, 0.0, 16))]

    def hidden(rng):
        cfg, p, o = random_config(rng), rng.randint(1, 8000), rng.randint(1, 2000)
        act, bs = rng.choice([0.0, rng.uniform(1e4, 3e5)]), rng.choice([1, 8, 16, 32])
        return cfg, rng.choice([1, 2, 4]), rng.uniform(1, 100) * 1e9, p, o, act, bs
    for label, (cfg, nbytes, free, p, o, act, bs) in t.cases(visible, hidden, n=3):
        with t.case(f"{label}: {describe(cfg)}, {nbytes} B/element, prompt {p}, output {o}, act {act:g} B/token, "
                    f"block_size {bs}, free {free / 1e9:g} GB"):
            expected = t.ref.max_batch_in_memory(cfg, nbytes, free, p, o, act, bs)
            # act_bytes_per_token=0.0 and block_size=1 are the defaults: leave them out, as a caller would
            got = call(t, "max_batch_in_memory", cfg, nbytes, free, p, o,
                       **non_default(act_bytes_per_token=(act, 0.0), block_size=(bs, 1)))
            per_tok = t.ref.kv_bytes_per_token(cfg, nbytes)
            t.expect(got, expected, "sequences that fit", mistakes=memory_mistakes(per_tok, free, p, o, act, bs))
            t.expect_true(isinstance(got, numbers.Integral) and not isinstance(got, bool),
                          f"return a whole number of sequences as an int, got {type(got).__name__}")
