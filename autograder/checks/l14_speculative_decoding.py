"""Checks for lesson 14: the verification rules of speculative decoding, its arithmetic, and the batch size at
which it stops paying on the modeled GPU clock.

Greedy verification is compared token for token on small hand-made cases, then run as the verifier of a
speculative greedy loop over the shipped draft and target models (in the learner's process, `greedy_loop`),
whose tokens must equal the same loop with the right rule (run here), which are plain greedy decoding of
the target.

The rejection sampler is random, so it is judged on its distribution, never on its draws. On a small
vocabulary the exact probability of every sequence the rule can emit in one call is enumerated here
(`emission_law`). The learner's verify is called N_CALLS times in its own process (`sample_verify`), with
drafts drawn here from draft_probs and one torch.Generator seeded from t.rng, so a run is deterministic per
seed; a chi-square goodness-of-fit test (bins with an expected count under 5 pooled) compares the counts of
the emitted sequences with the exact law. A case fails when its p-value is below FALSE_ALARM = 1e-6: a right
verifier fails a case with probability 1e-6 (under the chi-square approximation, which the lesson's tests
calibrate), at most 4e-6 for the check's four cases. The usual wrong rules have their own exact laws; a
failing verifier is named by the one wrong law the same test does not reject.

Formula functions are compared with the reference on visible and hidden (alpha, gamma, c); the modeled
speedup and the break-even batch on visible and hidden (chip, alpha, gamma, context, c, batch), their usual
wrong versions computed here with reference_engine.sim.gpu_model.
"""
from __future__ import annotations

import math
from collections import Counter
from functools import partial

import torch

from autograder.core import check
from autograder.harnesses.l14_speculative_decoding import (
    CKPT,
    call_with_upstream,
    greedy_loop,
    sample_tree_verify,
    sample_verify,
)
from autograder.mistakes import groups, named
from autograder.reference import answer_code, recording

F64 = torch.float64
N_CALLS = 1000  # verify calls per case: on a visible case every named mistake is a chi-square noncentrality of 330
# or more from the rule and from every other mistake (the bonus drawn from row k - 1, the nearest; the test asks for
# 300, where a wrong rule still passes a case with probability under 1e-9: tests/test_l14_speculative_decoding.py)
FALSE_ALARM = 1e-6     # the p-value below which a case fails: how often a right verifier fails a case
MIN_EXPECTED = 5.0     # chi-square bins with a smaller expected count are pooled into one


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def _fmt(xs) -> str:
    return "[" + ", ".join(f"{x:.3f}" for x in xs) + "]"


# -- 1.1 greedy verification ------------------------------------------------------------------------------

@answer_code
def greedy_rule(logits: torch.Tensor, drafts: torch.Tensor, kind: str = "") -> list[int]:
    """Greedy verification, right (kind "") or one of its usual wrong versions (GREEDY_MISTAKES)."""
    best = logits.argmax(dim=-1).tolist()
    if kind == "softmax":  # the argmax of float32 probabilities: logits closer than float32 resolves become ties
        best = torch.softmax(logits.float(), dim=-1).argmax(dim=-1).tolist()
    if kind == "ties_last":  # a hand-rolled argmax with >=: the last of equal maxima
        best = (logits.shape[-1] - 1 - logits.flip(-1).argmax(dim=-1)).tolist()
    if kind == "dim0":  # one argmax per vocabulary column: only meaningful while V >= k + 1
        best = logits.argmax(dim=0).tolist()
    k, out = len(drafts), []
    if kind == "continue":
        return best[:k + 1]  # the argmax of every row, matched or not
    if kind == "trust":
        return drafts.tolist() + [best[k]]
    for i, d in enumerate(drafts.tolist()):
        t = best[i + 1] if kind == "off_by_one" else best[i]
        if t == d or (kind == "tie_accepts" and bool(logits[i, d] == logits[i].max())):
            out.append(d)
            continue
        if kind != "prefix_only":
            out.append(d if kind == "emit_draft" else t)
        return out
    return out if kind == "no_bonus" else out + [best[max(k - 1, 0) if kind == "bonus_prev" else k]]


GREEDY_MISTAKES = {
    "never emits the bonus token: when all k drafts match, row k's argmax is one more token for free":
        "no_bonus",
    "emits only the accepted drafts at a mismatch; the target's own argmax at that position is emitted too "
    "(every step emits at least one token)": "prefix_only",
    "emits the draft token at the mismatch; the target's argmax replaces it": "emit_draft",
    "keeps going after a mismatch: the rows after it were computed on a rejected draft, so the step ends there":
        "continue",
    "compares draft_tokens[i] with row i + 1; row i of target_logits scores draft position i": "off_by_one",
    "breaks argmax ties toward the last index; the rule (like torch.argmax) takes the first": "ties_last",
    "accepts every draft without comparing it with the target's argmax": "trust",
    "takes the bonus token from row k - 1 (the last draft's row); row k predicts the token after the last draft":
        "bonus_prev",
    "takes the argmax over the wrong dimension (dim=0, across positions); each row's argmax is over the "
    "vocabulary (dim=-1)": "dim0",
    "accepts a draft whose logit equals the row's maximum; among tied maxima only the first (the argmax) is "
    "accepted": "tie_accepts",
    "takes the argmax of softmax probabilities: float32 rounds the probabilities of logits this close to one "
    "value, so the first of them wins; take the argmax of the logits": "softmax",
}


@answer_code
def greedy_mistakes(logits: torch.Tensor, drafts: torch.Tensor) -> dict:
    V, k = logits.shape[-1], len(drafts)
    return {name: greedy_rule(logits, drafts, kind) for name, kind in GREEDY_MISTAKES.items()
            if kind != "dim0" or V >= k + 1}


def _is_int_list(x) -> bool:
    return isinstance(x, list) and all(type(v) is int for v in x)


def _logits(rows_argmax: list[int], V: int, seed: int) -> torch.Tensor:
    """Random logits [len(rows_argmax), V] whose row i has its maximum at rows_argmax[i]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(rows_argmax), V, generator=g, dtype=torch.float32)
    for i, a in enumerate(rows_argmax):
        x[i, a] = x[i].max() + 1.0 + float(torch.rand((), generator=g))
    return x


GREEDY_CASES = [
    ("visible: all 3 drafts match", (_logits([4, 1, 6, 2], 8, 0), torch.tensor([4, 1, 6]))),
    ("visible: the first draft is rejected", (_logits([3, 3, 0], 8, 1), torch.tensor([5, 3]))),
    ("visible: a mismatch at position 2 of 4", (_logits([7, 2, 1, 1, 5], 8, 2), torch.tensor([7, 2, 6, 1]))),
    ("visible: tied maxima (the first index wins)",
     (torch.tensor([[2.0, 5.0, 5.0, 0.0], [1.0, 1.0, 0.0, 1.0], [0.0, 9.0, 9.0, 0.0]]), torch.tensor([1, 0]))),
    ("visible: k = 0 drafts (only row 0, the target's own token)",
     (_logits([5], 8, 3), torch.zeros(0, dtype=torch.long))),
    ("visible: the first draft is the middle one of three tied maxima (argmax takes the first: a mismatch)",
     (torch.tensor([[2.0, 2.0, 2.0, 0.0], [0.0, 0.0, 3.0, 0.0], [1.0, 0.0, 0.0, 0.0]]), torch.tensor([1, 0]))),
    ("visible: two logits 1e-8 apart (apart in float32, equal after a float32 softmax)",
     (torch.tensor([[0.0, 1e-8, -3.0], [0.1, 0.5, 0.0]]), torch.tensor([1]))),
]


def random_greedy_case(rng):
    k, V = rng.randint(1, 5), rng.randint(4, 12)
    best = [rng.randrange(V) for _ in range(k + 1)]
    agree = rng.randint(0, k)  # drafts 0 .. agree-1 match, draft `agree` (if any) does not
    drafts = best[:agree] + [(best[agree] + rng.randrange(1, V)) % V for _ in range(k - agree)]
    return _logits(best, V, rng.randrange(2**31)), torch.tensor(drafts)


def _prompts() -> list[list[int]]:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(CKPT / "target" / "tokenizer.json"))
    return [tok.encode(s).ids for s in ("import os\n\n\ndef ", "class Cache:\n    def __init__(self, ")]


LOOP_GAMMA, LOOP_TOKENS = 3, 16


LOOP_MISTAKES = ("emit_draft", "continue", "off_by_one")  # the GREEDY_MISTAKES a loop's tokens can name


@answer_code
def greedy_right(prompts: list, gamma: int, max_new: int) -> dict:
    """greedy_loop here with greedy_rule as its verifier."""
    return greedy_loop(greedy_rule, prompts, gamma, max_new)


@answer_code
def greedy_wrong(prompts: list, gamma: int, max_new: int) -> dict:
    """{mistake: the tokens of the loop with that wrong rule} (the GREEDY_MISTAKES of LOOP_MISTAKES)."""
    return {name: greedy_loop(partial(greedy_rule, kind=kind), prompts, gamma, max_new)["tokens"]
            for name, kind in GREEDY_MISTAKES.items() if kind in LOOP_MISTAKES}


def greedy_loops(ref, prompts: list, gamma: int, max_new: int) -> tuple:
    """(the right loop, the wrong loops or None). The wrong loops (a few tenths of a second each) are run here only
    while a release records, so that a student's copy stores them; else only for a wrong answer."""
    return (greedy_right(prompts, gamma, max_new),
            greedy_wrong(prompts, gamma, max_new) if recording(ref) else None)


@check(points=3, section="1.1", timeout=90, cost=0.3)
def verify_greedy(t):
    """Greedy verification: the target's argmax while it matches the drafts, then the target's own token; in a
    speculative loop over the shipped models, exactly the tokens of plain greedy decoding."""
    for label, (logits, drafts) in t.cases(visible=GREEDY_CASES, hidden=random_greedy_case, n=3):
        with t.case(f"{label}: argmax per row {logits.argmax(-1).tolist()}, drafts {drafts.tolist()}"):
            got, expected = t.both("verify_greedy", logits, drafts)
            t.expect(got, expected, "the emitted tokens", mistakes=greedy_mistakes(logits, drafts),
                     hint="" if _is_int_list(got) else "Return a list of Python ints (tensor.tolist()).")
    # The loop's prompts are visible only: the hidden cases above already judge the rule on unseen logits, and
    # a loop over other prompts judged nothing more (one speculative loop each side is a quarter of this check).
    for label, ps in [("visible: two code prompts", _prompts())]:
        with t.case(f"{label}: speculative greedy loop over the shipped draft and target, gamma {LOOP_GAMMA}, "
                    f"{LOOP_TOKENS} tokens per prompt"):
            got, (expected, wrong) = t.run_against(partial(greedy_loops, t.ref, ps, LOOP_GAMMA, LOOP_TOKENS),
                                                   greedy_loop, t.learner("verify_greedy"), ps, LOOP_GAMMA,
                                                   LOOP_TOKENS, what="a speculative greedy loop with your verify_greedy")
            if got["problem"]:
                t.fail(got["problem"])
            if got["tokens"] != expected["tokens"]:
                t.expect(got["tokens"], expected["tokens"],
                         "the generated tokens (they must equal plain greedy decoding of the target)",
                         mistakes=wrong if wrong is not None else greedy_wrong(ps, LOOP_GAMMA, LOOP_TOKENS))


# -- 1.2 / 1.3 acceptance probability and residual ----------------------------------------------------------

def _rows(rng, n, V, zeros=True):
    out = []
    for _ in range(n):
        w = [rng.random() ** 2 + 0.01 for _ in range(V)]
        if zeros and rng.random() < 0.5:
            w[rng.randrange(V)] = 0.0
        out.append([x / sum(w) for x in w])
    return out


P2 = [[0.5, 0.3, 0.15, 0.05], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]
Q2 = [[0.2, 0.5, 0.1, 0.2], [0.4, 0.3, 0.3, 0.0], [0.25, 0.25, 0.25, 0.25]]
PAIR_CASES = [
    ("visible: one row", (_t([0.6, 0.3, 0.1, 0.0]), _t([0.2, 0.2, 0.3, 0.3]))),
    ("visible: three rows, the last with p == q", (_t(P2), _t(Q2))),
    ("visible: two rows, the second with p == q (not uniform)",
     (_t([[0.1, 0.2, 0.7], [0.1, 0.6, 0.3]]), _t([[0.3, 0.3, 0.4], [0.1, 0.6, 0.3]]))),
]


def random_pair_case(rng):
    k, V = rng.randint(1, 4), rng.randint(3, 8)
    return _t(_rows(rng, k, V)), _t(_rows(rng, k, V))


@answer_code
def acceptance_mistakes(p, q) -> dict:
    ratio = torch.where(q > 0, (p / q.clamp(min=1e-300)).clamp(max=1), torch.ones_like(p))
    inverse = torch.where(p > 0, (q / p.clamp(min=1e-300)).clamp(max=1), torch.ones_like(p))
    both = torch.minimum(p, q).sum(-1)
    return {"takes p/q without the min: E_q[p/q] = sum p = 1 always; a token with p > q is accepted with "
            "probability 1, not p/q": (q * p / q.clamp(min=1e-300)).sum(-1),
            "averages min(1, p/q) over the vocabulary (0/0 counted as 1 there); weight each token by q(x), the "
            "chance the draft proposes it": ratio.mean(-1),
            "takes the ratio upside down: min(1, q/p)": (q * inverse).sum(-1),
            "returns the rejection probability 1 - sum min(p, q)": 1 - both,
            "uses max(p, q) instead of min(p, q)": torch.maximum(p, q).sum(-1),
            "forgets to sum over the vocabulary (returns min(p, q) per token)": torch.minimum(p, q),
            "computes 1 - sum |p - q|, without the 1/2 of the total variation distance: TV = 1/2 sum |p - q|, and "
            "1 - TV = sum min(p, q)": 1 - (p - q).abs().sum(-1),
            "returns whether the argmaxes of p and q agree (1 or 0): that is greedy verification's acceptance; a "
            "sampled draft x ~ q is accepted with probability min(1, p(x) / q(x)), so E = sum min(p, q)":
                (p.argmax(-1) == q.argmax(-1)).to(p.dtype),
            NAN_ACCEPT: (q * (p / q).clamp(max=1)).sum(-1)}


NAN_ACCEPT = ("divides p by q at tokens where both are 0 (as in a one-hot row at temperature 0): 0/0 is NaN, and "
              "q * NaN stays NaN; such a token adds min(p, q) = 0, so sum torch.minimum(p, q) and divide nothing")

ACCEPT_CASES = [  # first: a draft close to the target, where 1 - sum |p - q| and argmax agreement differ
    ("visible: two rows, the draft close to the target (argmaxes differ, then agree)",
     (_t([[0.45, 0.4, 0.15], [0.6, 0.3, 0.1]]), _t([[0.3, 0.5, 0.2], [0.5, 0.2, 0.3]]))),
]

ONE_HOT_CASES = [
    ("visible: one-hot rows, as at temperature 0 (same argmax, then different argmaxes; most tokens have p = q = 0)",
     (_t([[0.0, 0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]]),
      _t([[0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]]))),
]


def random_accept_case(rng):
    """random_pair_case's rows, then row 0 made one-hot in p and in q (argmaxes equal half the time) and, in the
    other rows, one token set to 0 in both p and q: every case has tokens where both are 0."""
    p, q = random_pair_case(rng)
    V = p.shape[-1]
    a = rng.randrange(V)
    b = a if rng.random() < 0.5 else (a + rng.randrange(1, V)) % V
    p[0], q[0] = torch.nn.functional.one_hot(torch.tensor(a), V), torch.nn.functional.one_hot(torch.tensor(b), V)
    for i in range(1, p.shape[0]):
        z = rng.randrange(V)
        p[i, z] = q[i, z] = 0.0
        p[i], q[i] = p[i] / p[i].sum(), q[i] / q[i].sum()
    return p, q


@answer_code
def residual_mistakes(p, q) -> dict:
    def norm(x):
        s = x.sum(-1, keepdim=True)
        return torch.where(s > 0, x / s.clamp(min=1e-300), p)
    excess = (p - q).clamp(min=0)
    total = excess.sum(-1, keepdim=True)
    nan_rows = excess / total
    uniform = torch.where(total > 0, excess / total.clamp(min=1e-300), torch.full_like(p, 1.0 / p.shape[-1]))
    return {"does not normalize max(0, p - q): divide it by its sum": excess,
            "returns the uniform distribution where p == q; return p there (then every row is still the target's "
            "distribution)": uniform,
            "returns p for every row as soon as one row has p == q; decide row by row (torch.where on each row's "
            "sum)": p.clone() if bool((total == 0).any()) else norm(excess),
            "takes max(0, q - p): the residual is where the target wants more than the draft gave": norm((q - p).clamp(min=0)),
            "returns p: after a rejection, sample from the excess of p over q, or tokens q overproposes come out "
            "too often": p,
            "normalizes |p - q|: only the tokens with p > q get mass": norm((p - q).abs()),
            "returns a row of zeros where p == q; return p for such a row, so that every row is a distribution":
                excess / total.clamp(min=1e-300),
            NAN_ROWS: nan_rows}


NAN_ROWS = "divides by a zero sum where p == q (return p for such a row)"


def _nan_only(t, got, mistakes: dict, nan_name: str) -> dict:
    """`mistakes` for t.expect, the NaN mistake `nan_name` offered to an answer holding a NaN only: an expected NaN
    matches any value in the comparison, so that mistake would "fit" every answer wrong only where it is NaN."""
    if not (isinstance(got, torch.Tensor) and bool(torch.isnan(got).any())):
        if bool(torch.isnan(mistakes.pop(nan_name)).any()):
            t.offered.add(nan_name)
    return mistakes


@check(points=2, section="1.2")
def acceptance_rate(t):
    """The acceptance probability of a drafted token: sum over the vocabulary of min(p, q), also on rows with
    tokens where both are 0 (one-hot rows, as the temperature-0 measurement of section 2.4 builds)."""
    for label, (p, q) in t.cases(visible=ACCEPT_CASES + PAIR_CASES + ONE_HOT_CASES, hidden=random_accept_case, n=3):
        with t.case(f"{label}: {p.shape[0] if p.dim() > 1 else 1} row(s) of V={p.shape[-1]}"):
            got, expected = t.both("acceptance_rate", p, q)
            t.expect(got, expected, "acceptance probability",
                     mistakes=_nan_only(t, got, acceptance_mistakes(p, q), NAN_ACCEPT))


@check(points=2, section="1.3")
def residual_distribution(t):
    """The distribution sampled after a rejection: norm(max(0, p - q)), p where p == q."""
    for label, (p, q) in t.cases(visible=PAIR_CASES, hidden=random_pair_case, n=3):
        with t.case(f"{label}: {p.shape[0] if p.dim() > 1 else 1} row(s) of V={p.shape[-1]}"):
            got, expected = t.both("residual_distribution", p, q)
            t.expect(got, expected, "residual distribution", mistakes=_nan_only(t, got, residual_mistakes(p, q), NAN_ROWS))


# -- 1.4 the rejection sampler, judged on its distribution --------------------------------------------------

@answer_code
def _residual_row(p, q, how: str) -> list[float]:
    """The distribution a variant samples after a rejection (as a list of probabilities)."""
    if how == "p":
        return list(p)
    diff = [max(0.0, (b - a) if how == "swap" else (a - b)) for a, b in zip(p, q)]
    total = sum(diff)
    if how == "cdf_unnormalized":  # inverse-CDF sampling of an unnormalized row: the missing mass lands last
        return diff[:-1] + [1.0 - sum(diff[:-1])]
    return [d / total for d in diff] if total > 0 else list(p)


@answer_code
def emission_law(p: list, q: list, accept: str = "min", residual: str = "norm", bonus: str = "last",
                 after_reject: str = "stop") -> dict:
    """The exact probability of every token sequence one call emits, for drafts x_i ~ q_i drawn independently
    (fixed rows: the check's setting). p: k + 1 rows, q: k rows (lists of floats).

    The right rule: accept="min", residual="norm", bonus="last", after_reject="stop". Wrong ones:
    accept="inverse" (min(1, q/p)); residual="p" | "swap" | "cdf_unnormalized" (see _residual_row);
    bonus="none" | "previous" (no bonus token, or drawn from p_{k-1}); after_reject="continue" (keeps
    examining the next drafts after emitting the resampled token)."""
    k, law = len(q), {}

    def add(seq, prob):
        if prob > 0:
            law[seq] = law.get(seq, 0.0) + prob

    def walk(i, seq, prob):
        if prob == 0:
            return
        if i == k:
            if bonus == "none":
                add(seq, prob)
            else:
                for y, py in enumerate(p[k if bonus == "last" else k - 1]):
                    add(seq + (y,), prob * py)
            return
        reject = 0.0
        for x, qx in enumerate(q[i]):
            if qx == 0:
                continue
            px = p[i][x]
            a = min(1.0, px / qx) if accept == "min" else (min(1.0, qx / px) if px > 0 else 1.0)
            walk(i + 1, seq + (x,), prob * qx * a)
            reject += qx * (1 - a)
        if reject > 1e-15:
            for y, ry in enumerate(_residual_row(p[i], q[i], residual)):
                if after_reject == "continue":
                    walk(i + 1, seq + (y,), prob * reject * ry)
                else:
                    add(seq + (y,), prob * reject * ry)

    walk(0, (), 1.0)
    return law


VERIFY_MISTAKES = {
    "resamples from p after a rejection; sample from norm(max(0, p - q)), or the tokens the draft overproposes "
    "come out too often": dict(residual="p"),
    "resamples from norm(max(0, q - p)): the residual is where the target wants more than the draft gave":
        dict(residual="swap"),
    "samples max(0, p - q) without normalizing it (by inverse CDF, so the missing mass lands on the last token)":
        dict(residual="cdf_unnormalized"),
    "accepts with min(1, q/p): the ratio is target over draft, p/q": dict(accept="inverse"),
    "never emits the bonus token: when all k drafts are accepted, one more token comes from target_probs[k]":
        dict(bonus="none"),
    "draws the bonus token from target_probs[k - 1]; the last row, target_probs[k], predicts the token after "
    "the last draft": dict(bonus="previous"),
    "keeps examining drafts after a rejection; the drafts after it were drawn given a rejected token, so the step "
    "ends with the resampled token": dict(after_reject="continue"),
}


def chi_square(counts: Counter, law: dict, n: int) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of a chi-square goodness-of-fit test of `counts` (n draws)
    against `law`; bins with an expected count under MIN_EXPECTED are pooled into one. A sequence the law
    gives probability 0 makes the statistic infinite (p-value 0)."""
    if any(seq not in law for seq in counts):
        return math.inf, 0, 0.0
    stat, bins, pool_e, pool_o = 0.0, 0, 0.0, 0
    for seq, prob in law.items():
        e, o = n * prob, counts.get(seq, 0)
        if e >= MIN_EXPECTED:
            stat, bins = stat + (o - e) ** 2 / e, bins + 1
        else:
            pool_e, pool_o = pool_e + e, pool_o + o
    if pool_e > 0:
        stat, bins = stat + (pool_o - pool_e) ** 2 / pool_e, bins + 1
    df = max(bins - 1, 1)
    pvalue = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=F64), torch.tensor(stat / 2, dtype=F64)))
    return stat, df, pvalue


VERIFY_CASES = [
    ("visible: V=4, k=2 (q proposes token 3 never at position 1)", (P2, Q2[:2])),
    ("visible: V=5, k=3", ([[0.05, 0.4, 0.3, 0.2, 0.05], [0.3, 0.3, 0.1, 0.1, 0.2], [0.1, 0.1, 0.6, 0.1, 0.1],
                            [0.2, 0.2, 0.2, 0.2, 0.2]],
                           [[0.3, 0.2, 0.3, 0.1, 0.1], [0.25, 0.5, 0.05, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2]])),
    ("visible: k=0 drafts (one token, the bonus, from target_probs[0])", ([[0.1, 0.6, 0.3]], [])),
]


def random_verify_case(rng):
    k, V = rng.randint(1, 3), rng.randint(3, 5)
    return _rows(rng, k + 1, V), _rows(rng, k, V)


def _length_shares(law_or_counts: dict, k: int, n: float = 1.0) -> list[float]:
    shares = [0.0] * (k + 1)
    for seq, w in law_or_counts.items():
        if 1 <= len(seq) <= k + 1:
            shares[len(seq) - 1] += w / n
    return shares


def _first_token_shares(counts: Counter, V: int, n: int) -> list[float]:
    shares = [0.0] * V
    for seq, w in counts.items():
        if seq and 0 <= seq[0] < V:
            shares[seq[0]] += w / n
    return shares


def judge_verify(t, run: dict, p: list, q: list):
    """Fail the case unless the emitted sequences fit the exact law of the rejection sampler."""
    if run["problem"]:
        t.fail(run["problem"])
    t.expect_true(not run["modified"], "verify modified an argument in place; the caller still needs it")
    k, V, outs = len(q), len(p[0]), run["outputs"]
    bad = next((o for o in outs if not 1 <= len(o) <= k + 1 or not all(0 <= x < V for x in o)), None)
    t.expect_true(bad is None, f"verify returned {bad} for k={k} drafts over V={V} tokens: a call emits 1 to "
                               f"k + 1 = {k + 1} token ids in 0 .. {V - 1}" + (
                                   " (with no drafts the one token is the bonus token, drawn from target_probs[0]: "
                                   "looks like your code never emits the bonus token)" if k == 0 and bad == [] else ""))
    right = emission_law(p, q)
    wrong = {name: emission_law(p, q, **kw) for name, kw in VERIFY_MISTAKES.items()}
    found = groups(wrong, lambda a, b: _law_distance(a, b) <= 1e-12, right)  # laws equal to each other together
    t.offered.update(name for names, _ in found for name in names)
    counts = Counter(tuple(o) for o in outs)
    stat, df, pvalue = chi_square(counts, right, len(outs))
    if pvalue >= FALSE_ALARM:
        t.expect_true(run["deterministic"], "the distribution is right, but two runs with generators of the same "
                                            "seed emit different tokens: draw every random number from `generator`")
        return
    impossible = next((s for s in counts if s not in right), None)
    why = (f"it emitted {list(impossible)}, which the rule can never emit" if impossible is not None else
           f"chi-square {stat:.0f} on {df} degrees of freedom, p-value {pvalue:.2g} (a case fails below "
           f"{FALSE_ALARM:g}: a right verifier fails it once in a million runs)")
    t.fail(f"over {len(outs)} calls (drafts drawn from draft_probs), the sequences verify emits do not follow the "
           f"rejection sampler's exact law: {why}.\n"
           f"  tokens emitted per call (1 .. {k + 1}): yours {_fmt(_length_shares(counts, k, len(outs)))}, "
           f"the rule's {_fmt(_length_shares(right, k))}\n"
           f"  first emitted token: yours {_fmt(_first_token_shares(counts, V, len(outs)))}, "
           f"target_probs[0] {_fmt(p[0])} (the rule emits exactly p_0).",
           named(counts, found, lambda c, law: chi_square(c, law, len(outs))[2] >= FALSE_ALARM))  # a law it fits


def _law_distance(a: dict, b: dict) -> float:
    return sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


@check(points=4, section="1.4", timeout=120, cost=0.4)
def verify(t):
    """The rejection sampler: the law of what it emits, judged by a chi-square test against the exact law
    (false-alarm rate 1e-6 per case), and that it draws from its generator only."""
    for label, (p, q) in t.cases(visible=VERIFY_CASES, hidden=random_verify_case, n=1):
        k, V = len(q), len(p[0])
        g = torch.Generator().manual_seed(t.rng.randrange(2**31))
        drafts = torch.stack([torch.multinomial(_t(row), N_CALLS, replacement=True, generator=g) for row in q], 1) \
            if q else torch.zeros(N_CALLS, 0, dtype=torch.long)
        seed = t.rng.randrange(2**31)
        with t.case(f"{label}: V={V}, k={k}, {N_CALLS} calls"):
            run = t.run(sample_verify, t.learner("verify"), _t(p), _t(q) if q else torch.zeros(0, V, dtype=F64),
                        drafts, seed,
                        what=f"verify, called {N_CALLS} times,")
            judge_verify(t, run, p, q)


# -- 3.4 your verifier inside the engine ----------------------------------------------------------------

ENGINE_K, ENGINE_TOKENS = 4, 12
# 4 prompts at batch 4 and a 16-token budget a step: prompts are prefilled in chunks, and drafts are cut
# while other prompts still take part of the budget
ENGINE_KW = {"max_num_seqs": 4, "max_num_batched_tokens": 16}
ENGINE_TEXTS = ("import os\n\n\ndef ", "class Cache:\n    def __init__(self, ",
                "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny = ", "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return ")
GREEDY_PARAMS = [{"temperature": 0, "max_tokens": ENGINE_TOKENS}] * len(ENGINE_TEXTS)

# The engine's refusals of a verifier's answer (spec_decode.SpecDecoder._checked): (phrase, read after "your code").
VERIFIER_ERRORS = [
    ("returned 0 tokens", "returns no token at all for some step: at a mismatch the target's own token (the "
                          "correction) is emitted, and when every draft matches, the bonus token; a step emits 1 "
                          "to k + 1 tokens"),
    ("tokens for", "returns more than k + 1 tokens: the kept drafts, then exactly one token of the target's own"),
    ("must be a kept draft", "keeps a draft after a mismatch (or emits a token that is not the draft before the "
                             "last position): the step ends at the first rejection, with one token of the target's"),
    ("outside the vocabulary", "emits a token id outside the vocabulary"),
    ("Python int", "returns something other than a list of Python ints (tensor.tolist())"),
]


@answer_code
def verify_rule(target_probs, draft_probs, draft_tokens, generator, kind: str = "") -> list[int]:
    """The rejection sampler with the engine's draws in the engine's order, right (kind "") or one of its usual
    wrong versions (ENGINE_VERIFY_MISTAKES), which make the same draws: given the request's generator, each
    emits exactly the tokens the engine would emit with that rule. Its generator is not plain data: the checks
    call it only inside `_engine`."""
    p, q, k, out = target_probs, draft_probs, len(draft_tokens), []
    for i, x in enumerate(draft_tokens.tolist()):
        u = torch.rand((), generator=generator, dtype=torch.float32 if kind == "f32" else p.dtype, device=p.device)
        ratio = q[i, x] / p[i, x] if kind == "inverse" else p[i, x] / q[i, x]
        if u < ratio:
            out.append(x)
            continue
        excess = (p[i] - q[i]).clamp(min=0)
        row = p[i] if kind == "p" or excess.sum() == 0 else excess / excess.sum()
        out.append(int(torch.multinomial(row, 1, generator=generator)))
        return out
    if kind == "no_bonus":
        return out
    out.append(int(torch.multinomial(p[k - 1 if kind == "previous" else k], 1, generator=generator)))
    return out


F32_DRAW = ("draws u with torch.rand in float32 (no dtype=): the engine's probabilities are float64, and a float64 "
            "draw takes other bits from the generator than a float32 one, so every later draw moves; pass "
            "dtype=target_probs.dtype (and device=) to torch.rand")

ENGINE_VERIFY_MISTAKES = {
    "resamples from p after a rejection; sample from norm(max(0, p - q))": "p",
    "accepts with min(1, q/p): the ratio is target over draft, p/q": "inverse",
    "never emits the bonus token: when all k drafts are accepted, one more token comes from target_probs[k]":
        "no_bonus",
    "draws the bonus token from target_probs[k - 1]; target_probs[k] predicts the token after the last draft":
        "previous",
    F32_DRAW: "f32",
}


def _engine_prompts() -> list[list[int]]:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(CKPT / "target" / "tokenizer.json"))
    return [tok.encode(s).ids for s in ENGINE_TEXTS]


@answer_code
def _engine(prompts, params, proposer, greedy_kind=None, verify_kind=None) -> dict:
    """run_speculative here: with the engine's own verifier, or (a kind given) with a rule of this module."""
    from autograder.harnesses.engine import run_speculative
    if greedy_kind is None and verify_kind is None:
        return run_speculative(prompts, params, proposer, ENGINE_K, ENGINE_KW)
    return run_speculative(prompts, params, proposer, ENGINE_K, ENGINE_KW,
                           verify_greedy=partial(greedy_rule, kind=greedy_kind or ""),
                           verify=partial(verify_rule, kind=verify_kind or ""))


def _judge_engine_run(t, run: dict):
    """Fail unless the run finished with every KV block back in the pool."""
    from autograder.checks._engine import judged
    with judged(t, run, VERIFIER_ERRORS, who="your verifier (YourVerifier: your verify_greedy and verify)",
                unfinished=f"the engine stopped after {run['steps']} steps with requests unfinished"):
        pass
    t.expect_true(run["free_blocks"] == run["num_blocks"],
                  f"{run['num_blocks'] - run['free_blocks']} KV blocks still held after every request finished")


def _counts(run: dict) -> list:
    return [list(x) for x in zip(run["proposed"], run["accepted"])]


def random_seeds(rng):
    return [rng.randrange(2**31) for _ in range(3)]


def _sampled(seed: int) -> dict:
    return {"temperature": 0.8, "top_p": 0.95, "seed": seed, "max_tokens": ENGINE_TOKENS}


# The visible runs, one per proposer: greedy requests (prompts 0 and 2) and seeded sampled ones (prompts 1 and 3,
# the long one chunked) in one batch. Every named mistake changes the draft proposer's run (tests/
# test_l14_speculative_decoding.py).
VISIBLE_GREEDY = (0, 2)
VISIBLE_PARAMS = [GREEDY_PARAMS[0], _sampled(11), GREEDY_PARAMS[0], _sampled(12)]


def _pick(run: dict, idx) -> tuple[list, list]:
    """(tokens, [drafts verified, drafts kept]) of the requests `idx` of a run."""
    counts = _counts(run)
    return [run["tokens"][i] for i in idx], [counts[i] for i in idx]


@answer_code
def engine_own(prompts, params, proposer) -> dict:
    """The engine's run with its own verifier."""
    return _engine(prompts, params, proposer)


@answer_code
def engine_wrong(prompts, params, proposer, greedy) -> dict:
    """What the usual wrong verifiers give on the same requests: the greedy requests' tokens ("greedy_tokens") or
    drafts kept ("greedy_counts") with a wrong greedy rule, and every request's (tokens, counts) with a wrong
    rejection sampler ("sampled"), each {mistake: value}."""
    def wrong_greedy(kind):
        return _pick(_engine(prompts, params, proposer, greedy_kind=kind), greedy)

    def wrong_sampled(kind):
        run = _engine(prompts, params, proposer, verify_kind=kind)
        return list(zip(run["tokens"], _counts(run)))

    return {"greedy_tokens": {name: wrong_greedy(kind)[0] for name, kind in GREEDY_MISTAKES.items()
                              if kind in ("emit_draft", "off_by_one")},
            "greedy_counts": {name: wrong_greedy(kind)[1] for name, kind in GREEDY_MISTAKES.items()
                              if kind in ("no_bonus", "prefix_only")},
            "sampled": {name: wrong_sampled(kind) for name, kind in ENGINE_VERIFY_MISTAKES.items()}}


def engine_runs(ref, prompts, params, proposer, greedy) -> tuple:
    """(the engine's own run, the wrong verifiers' runs or None). The wrong runs (a few tenths of a second each)
    are made here only while a release records, so that a student's copy stores them; else for a wrong answer."""
    return (engine_own(prompts, params, proposer),
            engine_wrong(prompts, params, proposer, greedy) if recording(ref) else None)


class _LazyRuns:
    """engine_wrong's result, made on first use (only a wrong answer uses it)."""

    def __init__(self, *args):
        self._args, self._value = args, None

    def __getitem__(self, key):
        if self._value is None:
            self._value = engine_wrong(*self._args)
        return self._value[key]


@check(points=3, section="3.4", timeout=60, cost=0.7)
def verifier_in_engine(t):
    """Your verify_greedy and verify as the engine's verifier (speculative_config["verifier"]), draft-model
    and prompt-lookup proposers, k = 4, four prompts at batch 4 with chunked prefill, greedy and seeded sampled
    requests in one batch: greedy requests emit exactly plain greedy decoding's tokens and keep exactly as many
    drafts as with the engine's own verifier; sampled requests emit exactly the engine's own verifier's tokens
    (the same draws, in the same order)."""
    from autograder.harnesses.engine import run_speculative
    prompts = _engine_prompts()
    visible = [("visible", (proposer, VISIBLE_PARAMS, VISIBLE_GREEDY)) for proposer in ("draft", "ngram")]

    def hidden(rng):  # other seeds, one proposer drawn, the greedy request last
        seeds = random_seeds(rng)
        return rng.choice(("draft", "ngram")), [_sampled(s) for s in seeds] + [GREEDY_PARAMS[0]], (len(seeds),)

    for label, (proposer, params, greedy) in t.cases(visible=visible, hidden=hidden, n=1, label="random seeds"):
        seeds = [kw["seed"] for kw in params if "seed" in kw]
        with t.case(f"{label}: {proposer} proposer, k={ENGINE_K}, {len(prompts)} prompts at batch {len(prompts)}, "
                    f"chunked prefill, {ENGINE_TOKENS} tokens each; greedy requests {list(greedy)}, the others "
                    f"sampled (temperature 0.8, top_p 0.95, seeds {seeds})"):
            got, (own, runs) = t.run_against(partial(engine_runs, t.ref, prompts, params, proposer, greedy),
                                      run_speculative, prompts, params, proposer, ENGINE_K, ENGINE_KW,
                                      t.learner("verify_greedy"), t.learner("verify"),
                                      what=f"the engine with your verify_greedy and verify ({proposer} proposer)")
            if runs is None:
                runs = _LazyRuns(prompts, params, proposer, greedy)
            _judge_engine_run(t, got)
            # Greedy requests first (a wrong greedy verifier also moves the sampled requests' draws, through the
            # shared token budget). The engine's own greedy verifier emits exactly plain greedy decoding's tokens
            # (tests/test_engine_spec_decode.py), so its run stands in for a run without speculation.
            (mine, mine_counts), (plain, own_counts) = _pick(got, greedy), _pick(own, greedy)
            if mine != plain:
                t.expect(mine, plain, "the greedy requests' tokens: with greedy verification they must equal plain "
                         "greedy decoding of the target (your code emits a token the target did not choose)",
                         mistakes=runs["greedy_tokens"])
            if mine_counts != own_counts:
                t.expect(mine_counts, own_counts, "[draft tokens verified, drafts kept] per greedy request (the "
                         "tokens are right, but the engine's own verifier keeps more or fewer drafts)",
                         mistakes=runs["greedy_counts"])
            mine, right = list(zip(got["tokens"], _counts(got))), list(zip(own["tokens"], _counts(own)))
            if mine != right:
                wrong = runs["sampled"]
                t.expect(mine, right, "(tokens, [drafts verified, drafts kept]) per request, against the "
                         "engine's own verifier given the same seeded generator: draw exactly one torch.rand "
                         "per draft examined, then one torch.multinomial, all from `generator`", mistakes=wrong)


# -- 2. the arithmetic --------------------------------------------------------------------------------------

@answer_code
def _geometric(alpha, terms) -> float:
    return float(terms) if alpha == 1 else (1 - alpha ** terms) / (1 - alpha)


@answer_code
def tokens_mistakes(alpha, gamma) -> dict:
    e = _geometric(alpha, gamma + 1)
    return {"sums 1 + alpha + ... + alpha^(gamma - 1), one term short: draft i is emitted with probability "
            "alpha^(i+1) and every step adds one token of the target's own": _geometric(alpha, gamma),
            "counts only the accepted drafts; every step also emits the target's own token (resample or bonus)":
                e - 1,
            "uses 1 + gamma * alpha: a draft counts only if every draft before it was accepted too": 1 + gamma * alpha,
            "uses 1 / (1 - alpha), the limit of infinitely many drafts": math.inf if alpha == 1 else 1 / (1 - alpha),
            "treats an alpha close to 1 as 1 (gamma + 1); only alpha == 1 itself needs the special case":
                float(gamma + 1) if 0.99 <= alpha else e,
            "returns 0 at alpha = 0; every step still emits the target's own token, so it is 1":
                0.0 if alpha == 0 else e}


TOKENS_CASES = [("visible", (0.5, 2)), ("visible", (0.8, 4)), ("visible: alpha = 1, every draft accepted", (1.0, 4)),
                ("visible: gamma = 0, plain decoding", (0.7, 0)),
                ("visible: alpha = 0.995, close to 1 but not 1", (0.995, 3)),
                ("visible: alpha = 0, every draft rejected", (0.0, 3))]


def random_formula_case(rng):
    return round(rng.uniform(0.05, 0.98), 3), rng.randint(1, 10), round(rng.uniform(0.01, 0.6), 3)


@check(points=2, section="2.1")
def expected_tokens_per_step(t):
    """(1 - alpha^(gamma+1)) / (1 - alpha) tokens per target forward; gamma + 1 at alpha = 1."""
    for label, (alpha, gamma) in t.cases(visible=TOKENS_CASES, hidden=lambda r: random_formula_case(r)[:2], n=3):
        with t.case(f"{label}: alpha={alpha}, gamma={gamma}"):
            got, expected = t.both("expected_tokens_per_step", alpha, gamma)
            t.expect(got, expected, "expected tokens per step", mistakes=tokens_mistakes(alpha, gamma), rtol=1e-9)


@answer_code
def speedup_mistakes(alpha, gamma, c) -> dict:
    e = _geometric(alpha, gamma + 1)
    return {"divides by gamma * c: the target's verification forward costs one step too": e / (gamma * c) if gamma * c
            else math.inf,
            "leaves out the draft's cost (returns the expected tokens per step)": e,
            "counts gamma + 1 draft forwards per step; the draft runs once per drafted token": e / ((gamma + 1) * c + 1),
            "multiplies the draft cost in (gamma * c + 1) instead of dividing by it": e * (gamma * c + 1),
            "returns 0 at gamma = 0; with no drafts a step is one plain target forward, a speedup of 1":
                0.0 if gamma == 0 else e / (gamma * c + 1)}


SPEEDUP_CASES = [("visible", (0.8, 4, 0.05)), ("visible: a slow draft", (0.6, 3, 0.5)),
                 ("visible: alpha = 1", (1.0, 5, 0.1)),
                 ("visible: gamma = 0, no speculation", (0.7, 0, 0.3))]


def _tokens_table(ref, alpha, gammas) -> tuple:
    """expected_tokens_per_step's right values at (alpha, g) for g in gammas, as call_with_upstream takes them."""
    return ("expected_tokens_per_step", [((alpha, g), ref.expected_tokens_per_step(alpha, g)) for g in gammas])


def _on_right_upstream(t, name: str, args: tuple, *upstream):
    """The learner's `name`(*args), with the exercises it builds on (`upstream`: call_with_upstream's tables of
    the reference's values) answering right while it runs: a check judges its own function only, and a mistake
    upstream is named by the upstream function's own check."""
    return t.run(call_with_upstream, t.learner(name), list(upstream), list(args), what=name)


@check(points=2, section="2.2")
def speedup(t):
    """Leviathan et al.'s wall-time speedup: expected tokens per step over (gamma * c + 1). Your
    expected_tokens_per_step answers with the right values while it runs (its own check judges it)."""
    for label, (alpha, gamma, c) in t.cases(visible=SPEEDUP_CASES, hidden=random_formula_case, n=3):
        with t.case(f"{label}: alpha={alpha}, gamma={gamma}, c={c}"):
            expected = t.ref.speedup(alpha, gamma, c)
            got = _on_right_upstream(t, "speedup", (alpha, gamma, c), _tokens_table(t.ref, alpha, [gamma]))
            t.expect(got, expected, "speedup", mistakes=speedup_mistakes(alpha, gamma, c), rtol=1e-9)


@answer_code
def _speedup(alpha, gamma, c) -> float:
    return _geometric(alpha, gamma + 1) / (gamma * c + 1)


@answer_code
def best_gamma_mistakes(alpha, c, max_gamma) -> dict:
    best = lambda gs, f: max(gs, key=lambda g: (f(g), -g))
    speeds = [_speedup(alpha, g, c) for g in range(max_gamma + 1)]
    return {"never returns 0; when no gamma beats plain decoding (speedup 1 at gamma = 0), do not speculate":
                best(range(1, max_gamma + 1), lambda g: _speedup(alpha, g, c)),
            "stops at max_gamma - 1: the range of gammas includes max_gamma":
                best(range(max_gamma), lambda g: _speedup(alpha, g, c)),
            "maximizes the expected tokens per step, ignoring what the drafts cost":
                best(range(max_gamma + 1), lambda g: _geometric(alpha, g + 1)),
            "breaks ties toward the larger gamma; among equal speedups take the smallest gamma (drafts that gain "
            "nothing still cost compute)": max(range(max_gamma + 1), key=lambda g: (_speedup(alpha, g, c), g)),
            "speculates when its best speedup only equals 1; gamma = 0 (plain decoding) wins that tie":
                _ge_one(alpha, c, max_gamma),
            "treats speedups within 1e-3 of the best as ties; compare them exactly":
                next(g for g, v in enumerate(speeds) if v >= max(speeds) - 1e-3)}


@answer_code
def _ge_one(alpha, c, max_gamma) -> int:
    """best_gamma's mistake: the best gamma >= 1, kept when its speedup is >= 1 (ties at 1 go to speculation)."""
    if max_gamma == 0:
        return 0
    g = max(range(1, max_gamma + 1), key=lambda g: (_speedup(alpha, g, c), -g))
    return g if _speedup(alpha, g, c) >= 1 else 0


BEST_CASES = [("visible", (0.8, 0.05, 10)), ("visible: speculation does not pay", (0.3, 0.5, 10)),
              ("visible: the best gamma is max_gamma", (0.95, 0.01, 6)),
              ("visible: alpha = 0, free drafts: every gamma ties at speedup 1", (0.0, 0.0, 5)),
              ("visible: two gammas within 1e-3 of each other", (0.58, 0.27, 11))]


def random_best_case(rng):
    return round(rng.uniform(0.2, 0.97), 3), round(rng.uniform(0.005, 0.5), 3), rng.randint(2, 16)


@check(points=2, section="2.3")
def best_gamma(t):
    """The gamma in 0 .. max_gamma with the largest speedup (0: do not speculate). Your speedup and
    expected_tokens_per_step answer with the right values while it runs (their own checks judge them)."""
    for label, (alpha, c, max_gamma) in t.cases(visible=BEST_CASES, hidden=random_best_case, n=3):
        with t.case(f"{label}: alpha={alpha}, c={c}, max_gamma={max_gamma}"):
            expected = t.ref.best_gamma(alpha, c, max_gamma)
            gammas = range(max_gamma + 2)  # one past the range too: a range slip is best_gamma's own mistake
            got = _on_right_upstream(t, "best_gamma", (alpha, c, max_gamma), _tokens_table(t.ref, alpha, gammas),
                                     ("speedup", [((alpha, g, c), t.ref.speedup(alpha, g, c)) for g in gammas]))
            t.expect(got, expected, "best gamma", mistakes=best_gamma_mistakes(alpha, c, max_gamma), count=True)


# -- 3. the modeled GPU clock -------------------------------------------------------------------------------

DRAFT_SHAPES = {"llama-3.2-1b": "LLAMA_3_2_1B"}  # the draft model keys a case may pass as c (gpu_model names)


@answer_code
def modeled(model, chip, alpha, gamma, context, c, batch, kind: str = "") -> float:
    """The modeled speedup, right (kind "") or one of its usual wrong versions (MODELED_MISTAKES,
    DRAFT_MISTAKES), computed with reference_engine.sim.gpu_model. c: a frozen ratio, or a draft model's key."""
    from reference_engine.sim import gpu_model as gm

    shape, hw = gm.MODELS[model], gm.CHIPS[chip]
    step = lambda comp, s=shape: gm.step_time(s, hw, comp).time_s

    def lm_head(rows):
        _, m, n, k, calls = gm.gemm_shapes(shape, rows, rows)[-1]
        return calls * gm.roofline(*gm.matmul_cost(m, n, k, shape.weight_bytes), hw.peak_flops * hw.gemm_eff,
                                   hw.bandwidth * hw.mem_eff)[0]

    t_decode = step(gm.Composition.decode_batch(batch, context))
    extra = lm_head(batch * (gamma + 1)) - lm_head(batch)
    chunks = gm.Composition(prefills=((gamma + 1, context),) * batch)
    t_verify = {"leviathan": lambda: t_decode, "full_steps": lambda: (gamma + 1) * t_decode,
                "no_lm_head": lambda: step(chunks),
                "as_decodes": lambda: step(gm.Composition.decode_batch(batch * (gamma + 1), context)) + extra,
                "one_chunk": lambda: step(gm.Composition(prefills=((batch * (gamma + 1), context),))) + extra,
                }.get(kind, lambda: step(chunks) + extra)()
    if isinstance(c, str):
        draft = getattr(gm, DRAFT_SHAPES[c])
        t_draft = {"frozen_c": lambda: step(gm.Composition.decode_batch(1, context), draft)
                   / step(gm.Composition.decode_batch(1, context)) * t_decode,
                   "draft_batch_1": lambda: step(gm.Composition.decode_batch(1, context), draft),
                   "draft_no_kv": lambda: step(gm.Composition.decode_batch(batch, 0), draft),
                   "draft_is_target": lambda: t_decode,
                   }.get(kind, lambda: step(gm.Composition.decode_batch(batch, context), draft))()
    else:
        t_draft = c * t_decode
    drafting = 0.0 if kind == "no_draft" else gamma * t_draft
    return _geometric(alpha, gamma + 1) * t_decode / (drafting + t_verify)


MODELED_MISTAKES = {
    "charges the verification forward as one decode step: that is speedup(alpha, gamma, c), true only while the "
    "step is memory-bound": "leviathan",
    "charges the verification forward as gamma + 1 decode steps; it is one forward, whose weights are read once":
        "full_steps",
    "leaves out the extra lm_head rows: step_time charges one logit row per sequence, verification needs gamma + 1":
        "no_lm_head",
    "leaves out the draft's cost (gamma * c * t_decode)": "no_draft",
    "models the verification tokens as batch * (gamma + 1) decode sequences, each reading the whole KV cache; "
    "they are one chunk of gamma + 1 tokens per sequence": "as_decodes",
    "models verification as one chunk of batch * (gamma + 1) tokens (one long sequence); each sequence has its "
    "own chunk at its own context": "one_chunk",
}

# A draft model's key as c: the usual ways of pricing its forward wrongly.
DRAFT_MISTAKES = {
    "freezes the draft's cost at its batch-1 ratio (c = draft step / target step at batch 1, times t_decode at "
    "every batch); a draft model is priced by its own decode step at each batch and context, and its KV cache "
    "makes that ratio grow with the batch": "frozen_c",
    "prices the draft's forward at batch 1 whatever the batch; it drafts for every sequence of the batch, "
    "Composition.decode_batch(batch, context)": "draft_batch_1",
    "prices the draft's forward at context 0 (no KV read); the draft reads its own KV cache of `context` tokens "
    "per sequence": "draft_no_kv",
    "prices the draft's forward as a target decode step; price model_shape(c), the draft model's own shape":
        "draft_is_target",
}

MODELED_CASES = [
    ("visible: batch 1", ("llama-3-8b", "H100", 0.7, 4, 1024, 0.2, 1)),
    ("visible: batch 256", ("llama-3-8b", "H100", 0.7, 4, 1024, 0.2, 256)),
    ("visible: A100, long context", ("llama-3-8b", "A100", 0.8, 3, 4096, 0.1, 64)),
    ("visible: a 1B draft model, batch 128, context 4096 (its c at this batch, not at batch 1)",
     ("llama-3-8b", "H100", 0.6, 4, 4096, "llama-3.2-1b", 128)),
]


@answer_code
def modeled_mistakes(*case) -> dict:
    """{mistake: the modeled speedup it gives} for a modeled_speedup case (the draft-model ones where c names one)."""
    kinds = {**MODELED_MISTAKES, **(DRAFT_MISTAKES if isinstance(case[5], str) else {})}
    return {name: modeled(*case, kind=kind) for name, kind in kinds.items()}


def random_modeled_case(rng):
    alpha, gamma, c = random_formula_case(rng)
    return ("llama-3-8b", rng.choice(["A100", "H100", "H200"]), alpha, min(gamma, 8), rng.choice([128, 512, 2048]),
            c, rng.choice([1, 8, 32, 96, 200, 384]))


def _modeled_label(label, case, last: str = "batch") -> str:
    model, chip, alpha, gamma, context, c, n = case
    return f"{label}: {model} on {chip}, alpha={alpha}, gamma={gamma}, context={context}, c={c}, {last}={n}"


@check(points=3, section="3.1", timeout=30)
def modeled_speedup(t):
    """The speedup at a decode batch on the modeled GPU clock: draft steps and one verification chunk per
    sequence against plain decode steps. Your expected_tokens_per_step answers with the right values while it
    runs (its own check judges it)."""
    for label, case in t.cases(visible=MODELED_CASES, hidden=random_modeled_case, n=3):
        with t.case(_modeled_label(label, case)):
            expected = t.ref.modeled_speedup(*case)
            got = _on_right_upstream(t, "modeled_speedup", case, _tokens_table(t.ref, case[2], [case[3]]))
            t.expect(got, expected, "modeled speedup", rtol=1e-9, mistakes=modeled_mistakes(*case))


@answer_code
def first_not_paying(model, chip, alpha, gamma, context, c, max_batch: int, kind: str = "",
                     batches=None) -> int | None:
    """The smallest batch (of `batches`, default 1 .. max_batch) with f(batch) <= 1, f the modeled speedup
    (`modeled(model, chip, alpha, gamma, context, c, batch, kind)`), by bisection over a speedup that falls with
    the batch; None if f(max_batch) > 1 (or no listed batch qualifies)."""
    f = lambda batch: modeled(model, chip, alpha, gamma, context, c, batch, kind=kind)
    if batches is not None:
        return next((b for b in batches if f(b) <= 1), None)
    if f(max_batch) > 1:
        return None
    lo, hi = 0, max_batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if f(mid) > 1 else (lo, mid)
    return hi


@answer_code
def break_even_mistakes(model, chip, alpha, gamma, context, c, max_batch) -> dict:
    case = (model, chip, alpha, gamma, context, c)
    right = first_not_paying(*case, max_batch)
    powers = [2 ** i for i in range(max_batch.bit_length()) if 2 ** i <= max_batch]
    out = {"returns the last batch at which speculation still pays, one less than the first at which it stops":
           right - 1 if right else right,
           "returns max_batch when speculation still pays there; return None": max_batch if right is None else right,
           "never tries max_batch itself (range(1, max_batch), or a search over 1 .. max_batch - 1); max_batch is "
           "one of the batches": first_not_paying(*case, max_batch - 1),
           "ignores max_batch (always searches 1 .. 1024)": first_not_paying(*case, 1024),
           "tries only powers of two; the answer is the smallest batch, found by bisection or a scan":
           first_not_paying(*case, max_batch, batches=powers),
           "uses speedup(alpha, gamma, c), which does not depend on the batch (or a modeled_speedup that charges "
           "verification as one decode step): try modeled_speedup at each batch":
           first_not_paying(*case, max_batch, "leviathan")}
    try:
        swapped = first_not_paying(model, chip, alpha, gamma, c, context, max_batch)
        out["passes c and context to modeled_speedup in swapped order; it takes (model, chip, alpha, gamma, "
            "context, c, batch)"] = swapped
    except (TypeError, ValueError):  # a context the model cannot take: this mistake cannot be told apart here
        pass
    for name, kind in MODELED_MISTAKES.items():
        if kind in ("full_steps", "as_decodes"):
            out[f"{name} (in modeled_speedup)"] = first_not_paying(*case, max_batch, kind)
    if isinstance(c, str):
        for name, kind in DRAFT_MISTAKES.items():
            if kind == "frozen_c":
                out[f"{name} (in modeled_speedup)"] = first_not_paying(*case, max_batch, kind)
    return out


BREAK_EVEN_CASES = [
    ("visible: it stops paying", ("llama-3-8b", "H100", 0.7, 4, 1024, 0.2, 1024)),
    ("visible: long context, it pays up to max_batch", ("llama-3-8b", "H100", 0.7, 4, 4096, 0.2, 1024)),
    ("visible: it never pays", ("llama-3-8b", "H100", 0.3, 4, 1024, 0.5, 1024)),
    ("visible: H200, gamma 2", ("llama-3-8b", "H200", 0.75, 2, 512, 0.1, 1024)),
    # the first case stops paying at batch 245 (a test in tests/test_l14 keeps these labels true)
    ("visible: max_batch is exactly the break-even batch", ("llama-3-8b", "H100", 0.7, 4, 1024, 0.2, 245)),
    ("visible: max_batch one below the break-even batch", ("llama-3-8b", "H100", 0.7, 4, 1024, 0.2, 244)),
    ("visible: max_batch one above the break-even batch", ("llama-3-8b", "H100", 0.7, 4, 1024, 0.2, 246)),
    # a separate draft model: c = its own step over the target's at each batch (frozen at batch 1, 4k never stops)
    ("visible: a 1B draft model, context 4096", ("llama-3-8b", "H100", 0.6, 4, 4096, "llama-3.2-1b", 1024)),
    ("visible: a 1B draft model, context 1024", ("llama-3-8b", "H100", 0.6, 4, 1024, "llama-3.2-1b", 1024)),
]


def random_break_even_case(rng):
    model, chip, alpha, gamma, context, c, _ = random_modeled_case(rng)
    return model, chip, alpha, gamma, context, c, 1024


@check(points=3, section="3.2", timeout=60, cost=0.2)
def break_even_batch(t):
    """The smallest batch at which the modeled speedup is <= 1 (None if it still pays at max_batch). Your
    expected_tokens_per_step answers with the right values while it runs; where your answer is wrong and your
    modeled_speedup is wrong at the batches that decide it, the case says so: fix modeled_speedup first."""
    for label, case in t.cases(visible=BREAK_EVEN_CASES, hidden=random_break_even_case, n=2):
        with t.case(_modeled_label(label, case, "max_batch")):
            expected = t.ref.break_even_batch(*case)
            tokens = _tokens_table(t.ref, case[2], [case[3]])
            got = _on_right_upstream(t, "break_even_batch", case, tokens)
            # the batches that decide the answer, and the reference's modeled speedup there (made for every
            # answer, so that a student's copy holds them)
            decide = sorted({b for b in ((expected - 1, expected) if expected else (case[6],)) if b >= 1})
            right = {b: t.ref.modeled_speedup(*case[:6], b) for b in decide}
            mistakes = break_even_mistakes(*case)
            if got != expected:
                _blame_modeled_speedup(t, case, right, tokens)
            t.expect(got, expected, "break-even batch", mistakes=mistakes, count=expected is not None)


def _blame_modeled_speedup(t, case, right: dict, tokens):
    """Fail the case, naming modeled_speedup, if the learner's modeled_speedup is wrong at a batch that decides
    the break-even batch (break_even_batch cannot be right on a wrong modeled_speedup)."""
    from autograder.compare import compare
    for b, value in right.items():
        mine, raised = t.attempt(_on_right_upstream, t, "modeled_speedup", (*case[:6], b), tokens)
        if raised is not None or compare(mine, value, rtol=1e-9) is not None:
            said = f"raises {raised.type_name}" if raised is not None else f"returns {mine!r}"
            t.fail(f"break_even_batch depends on modeled_speedup, which fails: at batch {b} your modeled_speedup "
                   f"{said}, the right value is {value:.6g}. Fix modeled_speedup (its own check names the "
                   "mistake) first; this case judges break_even_batch once modeled_speedup is right at the batches "
                   "that decide it")


# -- 4. tree drafts ---------------------------------------------------------------------------------------------

def _kids(parents) -> list[list[int]]:
    kids = [[] for _ in parents]
    for i, j in enumerate(parents[1:], start=1):
        kids[j].append(i)
    return kids


@answer_code
def tree_mask_rule(parents: list, prefix_len: int, kind: str = "") -> tuple:
    """The tree attention mask and positions, right (kind "") or one of TREE_MASK_MISTAKES."""
    n = len(parents)
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    mask = torch.zeros(n, prefix_len + n, dtype=torch.bool)
    if kind != "no_prefix":
        mask[:, :prefix_len] = True
    for i in range(n):
        if kind == "causal":  # every earlier node, as in a chain
            mask[i, prefix_len:prefix_len + i + 1] = True
            continue
        j = i
        while j != -1:
            if not (kind == "no_self" and j == i):
                mask[i, prefix_len + j] = True
            j = parents[j]
    if kind == "descendants":
        mask[:, prefix_len:] = mask[:, prefix_len:].T.clone()
    pos = {"index": list(range(n)), "depth_plus_one": [d + 1 for d in depth]}.get(kind, depth)
    return mask, torch.tensor(pos, dtype=torch.long) + prefix_len


TREE_MASK_MISTAKES = {
    "lets a node attend to every earlier node (a causal mask): siblings and cousins are other candidates, a node "
    "sees only its ancestors and itself": "causal",
    "leaves the prefix out: every node attends to all prefix_len cached keys": "no_prefix",
    "leaves out the node itself: a token attends to its own key, as in a causal mask's diagonal": "no_self",
    "marks descendants instead of ancestors (the mask transposed)": "descendants",
    "numbers positions by node index (as in a chain); a node's position is prefix_len + its depth, siblings share "
    "it": "index",
    "puts the root at prefix_len + 1; the root is at depth 0, position prefix_len": "depth_plus_one",
}

TREE_CASES = [
    ("visible: root, two children, a grandchild", ([-1, 0, 0, 1], 3)),
    ("visible: a chain of 4 (the tree of plain speculation)", ([-1, 0, 1, 2], 2)),
    ("visible: two branches of depth 2 and a third child", ([-1, 0, 0, 1, 2, 0], 5)),
    ("visible: the root alone", ([-1], 4)),
]


def random_tree(rng, n_max: int = 9) -> list[int]:
    n = rng.randint(2, n_max)
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def random_tree_case(rng):
    return random_tree(rng), rng.randint(0, 6)


@answer_code
def tree_mask_mistakes(parents, prefix_len) -> dict:
    return {name: tree_mask_rule(parents, prefix_len, kind) for name, kind in TREE_MASK_MISTAKES.items()}


@check(points=2, section="4.1")
def tree_attention_mask(t):
    """The tree attention mask (prefix, ancestors and self) and positions (prefix_len + depth)."""
    for label, (parents, prefix_len) in t.cases(visible=TREE_CASES, hidden=random_tree_case, n=3):
        with t.case(f"{label}: parents {parents}, prefix_len {prefix_len}"):
            got, expected = t.both("tree_attention_mask", parents, prefix_len)
            wrong = tree_mask_mistakes(parents, prefix_len)
            if not (isinstance(got, tuple) and len(got) == 2):
                t.fail(f"expected a tuple (mask, positions), got {type(got).__name__}")
            t.expect(got[0], expected[0], "the mask", mistakes={k: v[0] for k, v in wrong.items()})
            t.expect(got[1], expected[1], "the positions", mistakes={k: v[1] for k, v in wrong.items()})


@answer_code
def tree_greedy_rule(logits, tokens: list, parents: list, kind: str = "") -> list[int]:
    """Greedy tree verification, right (kind "") or one of TREE_GREEDY_MISTAKES."""
    best, kids = logits.argmax(dim=-1).tolist(), _kids(parents)
    out, node = [], 0
    while True:
        t = best[node]
        tried = {"first_child": kids[node][:1], "last_match": kids[node][::-1]}.get(kind, kids[node])
        nxt = next((c for c in tried if tokens[c] == t), None)  # last_match: the last sibling holding t
        if kind == "own_row" and kids[node]:  # compares a child's token with the child's own row
            nxt = next((c for c in kids[node] if tokens[c] == best[c]), None)
            t = tokens[nxt] if nxt is not None else t
        if nxt is None:
            if kind != "no_bonus" or not out:
                out.append(t)
            return out
        out.append(t)
        node = nxt


TREE_GREEDY_MISTAKES = {
    "tries only the first child: when it does not match the target's argmax, try its siblings, one of them may":
        "first_child",
    "never emits the last token (the target's own, where no child matches or at a leaf)": "no_bonus",
    "compares a child's token with the child's own row; the parent's row predicts the child's token": "own_row",
    "follows the last child holding the target's argmax; when siblings hold the same token, move to the first of "
    "them in index order (their subtrees differ, so which one you follow changes what comes next)": "last_match",
}

TREE_GREEDY_CASES = [
    ("visible: the second child matches, then its child", ([[0, 0, 9, 0], [9, 0, 0, 0], [0, 9, 0, 0], [0, 0, 0, 9],
                                                          [1, 0, 0, 0]], [3, 1, 2, 1, 3], [-1, 0, 0, 2, 3])),
    ("visible: no child matches at the root", ([[0, 9, 0, 0], [9, 0, 0, 0], [0, 0, 9, 0]], [0, 2, 3], [-1, 0, 0])),
    ("visible: a full path to a leaf (the bonus token)", ([[0, 0, 0, 9], [0, 9, 0, 0], [0, 0, 9, 0], [9, 0, 0, 0]],
                                                          [1, 3, 1, 0], [-1, 0, 1, 1])),
    ("visible: two children hold the same token, with different subtrees (the first one's matches, the last one's "
     "does not)", ([[0, 9, 0, 0], [0, 0, 0, 9], [9, 0, 0, 0], [0, 0, 9, 0], [9, 0, 0, 0], [0, 9, 0, 0]],
                   [2, 1, 2, 1, 3, 0], [-1, 0, 0, 0, 1, 3])),
]


def random_tree_greedy_case(rng):
    parents = random_tree(rng)
    n, V = len(parents), rng.randint(3, 6)
    best = [rng.randrange(V) for _ in range(n)]
    tokens = [rng.randrange(V)] + [best[parents[i]] if rng.random() < 0.6 else rng.randrange(V) for i in range(1, n)]
    return _logits(best, V, rng.randrange(2**31)), tokens, parents


@answer_code
def tree_greedy_mistakes(logits, tokens, parents) -> dict:
    return {name: tree_greedy_rule(logits, tokens, parents, kind) for name, kind in TREE_GREEDY_MISTAKES.items()}


@check(points=2, section="4.2")
def verify_tree_greedy(t):
    """Greedy tree verification: follow the child holding the target's argmax, trying every sibling, then the
    target's own token."""
    visible = [(label, (_t(rows).float(), tokens, parents)) for label, (rows, tokens, parents) in TREE_GREEDY_CASES]
    for label, (logits, tokens, parents) in t.cases(visible=visible, hidden=random_tree_greedy_case, n=3):
        with t.case(f"{label}: argmax per node {logits.argmax(-1).tolist()}, tokens {tokens}, parents {parents}"):
            got, expected = t.both("verify_tree_greedy", logits, tokens, parents)
            t.expect(got, expected, "the emitted tokens", mistakes=tree_greedy_mistakes(logits, tokens, parents),
                     hint="" if _is_int_list(got) else "Return a list of Python ints (tensor.tolist()).")


def _norm(row: list) -> list:
    total = sum(row)
    return [x / total for x in row] if total > 0 else list(row)


@answer_code
def tree_law(p: list, q: list, parents: list, kind: str = "") -> dict:
    """The exact probability of every token sequence one verify_tree call emits, node tokens drawn here (each
    node's children from q[parent] without replacement, in index order), for the right rule (kind "") or one of
    TREE_VERIFY_MISTAKES."""
    n, kids, law = len(parents), _kids(parents), {}

    def add(seq, w):
        if w > 0:
            law[seq] = law.get(seq, 0.0) + w

    def walk(toks, prob):
        def at(node, seq, w):
            tries(node, kids[node][:1] if kind == "first_only" else kids[node], p[node], q[node], seq, w)

        def tries(node, rest, pc, qc, seq, w):
            if w == 0:
                return
            if not rest:
                for tail, py in _tree_ends(p[node], q[node], pc, bool(kids[node]), kind):
                    add(seq + tail, w * py)
                return
            x = toks[rest[0]]
            a, pc2, qc2 = _tree_try(pc, qc, x, kind)
            if a > 0:
                at(rest[0], seq + (x,), w * a)
            if a < 1:
                tries(node, rest[1:], pc2, qc2, seq, w * (1 - a))

        at(0, (), prob)

    def assign(i, toks, prob):
        if i == n:
            walk(toks, prob)
            return
        used = {toks[s] for s in kids[parents[i]] if s < i}
        row = _norm([0.0 if y in used else v for y, v in enumerate(q[parents[i]])])
        for x, w in enumerate(row):
            if w > 0:
                assign(i + 1, toks + [x], prob * w)

    assign(1, [0], 1.0)
    return law


@answer_code
def _tree_try(pc: list, qc: list, x: int, kind: str) -> tuple:
    """A try of a child holding token x against the current rows pc, qc: (the probability it is accepted, the
    rows the next sibling is tried with after a rejection), for the right rule (kind "") or a mistake's."""
    if kind == "inverse":
        a = min(1.0, qc[x] / pc[x]) if pc[x] > 0 else 1.0
    else:
        a = min(1.0, pc[x] / qc[x]) if qc[x] > 0 else 1.0
    pc2 = pc if kind in ("no_p_update", "fixed_rows") else _residual_row(pc, qc, "norm")
    qc2 = qc if kind in ("no_q_update", "fixed_rows") else _norm([0.0 if y == x else v for y, v in enumerate(qc)])
    return a, pc2, qc2


@answer_code
def _tree_ends(p_node: list, q_node: list, pc: list, rejected: bool, kind: str) -> list:
    """How a call ends once a node has no child left to try, at a leaf (rejected False) or after all its children
    were rejected: [(the tokens it emits last, their probability)], one token drawn from the current p (pc) for
    the right rule, or nothing more for kind "no_final"."""
    if rejected and kind == "no_final":
        return [((), 1.0)]
    row = pc
    if rejected and kind == "fixed_rows":
        row = _residual_row(p_node, q_node, "norm")
    elif rejected and kind == "final_from_target":
        row = p_node
    return [((y,), py) for y, py in enumerate(row)]


TREE_VERIFY_MISTAKES = {
    "tries only the first child and samples the residual when it is rejected; try every sibling in turn":
        dict(kind="first_only"),
    "does not remove a rejected sibling's token from q: the next sibling was drawn without it, so set q(x) to 0 "
    "and renormalize": dict(kind="no_q_update"),
    "does not update p between siblings: after a rejection the next sibling is judged against the residual "
    "norm(max(0, p - q))": dict(kind="no_p_update"),
    "samples the last token from the node's target row after rejecting its children; sample from the residual "
    "left by the rejections": dict(kind="final_from_target"),
    "judges every sibling against the node's own target_probs and draft_probs rows, as if each were the only "
    "draft; after a rejection the next sibling is tried with p = norm(max(0, p - q)) and q without the rejected "
    "token": dict(kind="fixed_rows"),
    "accepts a child with min(1, q/p): the ratio is target over draft, p(x) / q(x)": dict(kind="inverse"),
    "emits nothing more once every child of a node is rejected; the call still ends with one token of the "
    "target's, drawn from the residual p the rejections left": dict(kind="no_final"),
}

TREE_VERIFY_CASES = [
    # The root's draft row puts most of its mass where the target puts little, so siblings are often rejected and
    # what each rule does after a rejection shows: over 1,000 calls every named mistake's law is a chi-square
    # noncentrality of 900+ away from the right one and 180+ from every other mistake's (at least 62 and 68 with
    # the draft row [0.1, 0.2, 0.3, 0.4] this case had, which let "does not remove a rejected sibling's token from
    # q" pass about one run in ten).
    ("visible: root with 3 children, V=4", ([-1, 0, 0, 0],
     [[0.5, 0.2, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]],
     [[0.05, 0.2, 0.1, 0.65], [0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]])),
    ("visible: two children, the first with two of its own, V=4", ([-1, 0, 0, 1, 1],
     [[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.3, 0.3, 0.2, 0.2], [0.2, 0.2, 0.3, 0.3], [0.4, 0.1, 0.1, 0.4]],
     [[0.2, 0.5, 0.2, 0.1], [0.3, 0.3, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25],
      [0.25, 0.25, 0.25, 0.25]])),
]


def random_tree_verify_case(rng):
    parents = [-1, 0, 0] + ([1] if rng.random() < 0.5 else [0])
    V = rng.randint(3, 4)
    return parents, _rows(rng, len(parents), V, zeros=False), _rows(rng, len(parents), V, zeros=False)


def _draw_trees(q: list, parents: list, count: int, g: torch.Generator) -> list:
    """count node-token lists: each node's children drawn from q[parent] without replacement, in index order."""
    kids, rows = _kids(parents), []
    for _ in range(count):
        toks = [0]
        for i in range(1, len(parents)):
            used = {toks[s] for s in kids[parents[i]] if s < i}
            row = _t([0.0 if y in used else v for y, v in enumerate(q[parents[i]])])
            toks.append(int(torch.multinomial(row / row.sum(), 1, generator=g)))
        rows.append(toks)
    return rows


@check(points=3, section="4.3", timeout=120, cost=0.3)
def verify_tree(t):
    """Multi-candidate rejection sampling over a tree: the law of what it emits, judged by a chi-square test
    against the exact law (false-alarm rate 1e-6 per case)."""
    for label, (parents, p, q) in t.cases(visible=TREE_VERIFY_CASES, hidden=random_tree_verify_case, n=1):
        g = torch.Generator().manual_seed(t.rng.randrange(2**31))
        trees = _draw_trees(q, parents, N_CALLS, g)
        seed = t.rng.randrange(2**31)
        with t.case(f"{label}: parents {parents}, {N_CALLS} calls"):
            run = t.run(sample_tree_verify, t.learner("verify_tree"), _t(p), _t(q), trees, parents, seed,
                        what=f"verify_tree, called {N_CALLS} times,")
            if run["problem"]:
                t.fail(run["problem"])
            t.expect_true(not run["modified"], "verify_tree modified an argument in place; the caller still needs it")
            right = tree_law(p, q, parents)
            wrong = {name: tree_law(p, q, parents, **kw) for name, kw in TREE_VERIFY_MISTAKES.items()}
            found = groups(wrong, lambda a, b: _law_distance(a, b) <= 1e-12, right)
            t.offered.update(name for names, _ in found for name in names)
            counts = Counter(tuple(o) for o in run["outputs"])
            if chi_square(counts, right, N_CALLS)[2] >= FALSE_ALARM:
                continue
            t.fail(f"over {N_CALLS} calls (node tokens drawn from draft_probs), the sequences verify_tree emits do "
                   f"not follow the rule's exact law: {_tree_verdict(counts, right, p[0], N_CALLS)}",
                   named(counts, found, lambda c, law: chi_square(c, law, N_CALLS)[2] >= FALSE_ALARM))


def _tree_verdict(counts: Counter, right: dict, p0: list, n: int) -> str:
    """Why n calls' emitted sequences (counts) do not fit the rule's exact law, in words: a sequence the rule never
    emits, or the chi-square test; then where they differ most: tokens per call, the first token against p_0 (which
    the rule emits exactly), and the sequence furthest from its expected count."""
    impossible = sorted((s for s in counts if s not in right), key=lambda s: -counts[s])
    if impossible:
        s = impossible[0]
        why = (f"it emitted {list(s)} ({counts[s]} of {n} calls), which the rule can never emit"
               + (": every call emits at least one token" if not s else ""))
    else:
        stat, df, pvalue = chi_square(counts, right, n)
        shown = f"{pvalue:.2g}" if pvalue > 0 else "under 1e-300"
        why = (f"chi-square {stat:.0f} on {df} degrees of freedom, p-value {shown} (a case fails below "
               f"{FALSE_ALARM:g}: a right verify_tree fails it once in a million runs)")
    lo, top = (0 if () in counts else 1), max(len(s) for s in [*right, *counts])
    per_call = lambda law, m: [sum(w for s, w in law.items() if len(s) == k) / m for k in range(lo, top + 1)]
    first = _first_token_shares(counts, len(p0), n)
    y = max(range(len(p0)), key=lambda v: abs(first[v] - p0[v]))
    off = abs(first[y] - p0[y]) > 4 * math.sqrt(p0[y] * (1 - p0[y]) / n) + 1e-12  # beyond sampling noise
    seq = max(right, key=lambda s: abs(counts.get(s, 0) - n * right[s]) / math.sqrt(max(n * right[s], MIN_EXPECTED)))
    return (f"{why}.\n"
            f"  tokens emitted per call ({lo} .. {top}): yours {_fmt(per_call(counts, n))}, the rule's "
            f"{_fmt(per_call(right, 1.0))}\n"
            f"  first emitted token: yours {_fmt(first)}, target_probs[0] {_fmt(p0)} (the rule emits exactly p_0)"
            + (f": token {y} comes first in {first[y]:.3f} of the calls, target_probs[0][{y}] is {p0[y]:.3f}" if off
               else ": yours is within sampling noise of it") + "\n"
            f"  furthest from the law: the sequence {list(seq)} came out {counts.get(seq, 0)} times in {n} calls; the "
            f"rule emits it with probability {right[seq]:.3f} ({n * right[seq]:.0f} expected).")
