"""Lesson 14 questions: tokens per target forward, the speedup with the draft's cost, the best gamma, the
acceptance probability, the modeled speedup at a batch, and the batch at which speculation stops paying."""
from __future__ import annotations

from reference_engine.sim import gpu_model as gm

from .pools import pick
from .question import Numeric, Open, fmt, template

STEM = "l14_speculative_decoding"
ALPHAS = [0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9]
MAX_GAMMA = 12
MAX_BATCH = 256  # the break-even search range (pricing a step prices each sequence's attention: big batches are slow)
# The lesson's modeled speedup prices one GPU running the whole target: Llama-3-8B, which fits on each chip.
MODELS = {"llama-3-8b": gm.LLAMA_3_8B}


def sum_text(alpha: float, gamma: int) -> str:
    """'1 + 0.8 + 0.8^2 + ... + 0.8^4' for a prompt or a step."""
    if gamma <= 2:
        return " + ".join(["1"] + [f"{alpha:g}" + (f"^{i}" if i > 1 else "") for i in range(1, gamma + 1)])
    return f"1 + {alpha:g} + {alpha:g}^2 + ... + {alpha:g}^{gamma}"


def all_or_nothing(alpha: float, gamma: int) -> float:
    """The alpha^gamma mistake: the gamma drafts count only when all of them pass, plus the target's token."""
    return 1 + gamma * alpha ** gamma


def tokens_steps(ref, alpha: float, gamma: int) -> list[str]:
    e = ref.expected_tokens_per_step(alpha, gamma)
    return [f"draft i (i = 1..{gamma}) is emitted only if drafts 1..i are all accepted: probability {alpha:g}^i",
            f"expected accepted drafts: {alpha:g} + ... + {alpha:g}^{gamma} = {fmt(e - 1)}",
            f"+ 1 token the target always adds (the resample after a rejection, or the bonus after {gamma} "
            f"acceptances): {sum_text(alpha, gamma)} = (1 - {alpha:g}^{gamma + 1}) / (1 - {alpha:g}) = {fmt(e)}"]


@template(STEM, "tokens per target forward")
def tokens_per_forward(rng, ref):
    alpha, gamma = pick(rng, ALPHAS + [0.95]), pick(rng, [3, 4, 5, 6])

    def ask(a, g, prompt):
        e = ref.expected_tokens_per_step(a, g)
        return Numeric(
            prompt, "tokens", e, tokens_steps(ref, a, g),
            "A run of acceptances stops at the first rejection, so draft i counts with alpha^i; the target adds one "
            "token of its own every step.",
            rtol=0.01, mistakes={"uses alpha^gamma (all drafts accepted) instead of the geometric sum": all_or_nothing(a, g),
                                 "forgets the token the target adds itself (the resample or the bonus)": e - 1,
                                 "treats each draft as accepted on its own, not only after all earlier ones": 1 + g * a})

    q = ask(alpha, gamma, f"A draft proposes gamma = {gamma} tokens per step; each is accepted with probability "
                          f"alpha = {alpha:g}, independently (Leviathan et al.'s assumption). How many tokens does one "
                          "forward of the target emit on average?")
    q.follow_ups.append(ask(0.5, gamma, "Now alpha drops to 0.5 (the draft agrees with the target less often): tokens "
                                        "per target forward?"))
    q.follow_ups.append(ask(alpha, 8, f"Back to alpha {alpha:g}, with gamma = 8: tokens per target forward?"))
    gain = ref.expected_tokens_per_step(alpha, 8) - ref.expected_tokens_per_step(alpha, gamma)
    q.follow_ups[1].why = (f"Drafts {gamma + 1} to 8 add alpha^{gamma + 1} + ... + alpha^8 = {fmt(gain)} tokens: "
                           "the sum flattens, while every draft is paid for.")
    return q


def speedup_steps(ref, a: float, g: int, c: float) -> list[str]:
    e, s = ref.expected_tokens_per_step(a, g), ref.speedup(a, g, c)
    return [f"tokens per target forward: (1 - {a:g}^{g + 1}) / (1 - {a:g}) = {fmt(e)}",
            f"cost of one step, in target forwards: {g} draft forwards x {c:g} + 1 verification forward = {fmt(g * c + 1)}",
            f"speedup = {fmt(e)} / {fmt(g * c + 1)} = {fmt(s)}x (plain decoding: 1 token per target forward)"]


@template(STEM, "speedup with the draft's cost")
def speedup(rng, ref):
    alpha, gamma, c = pick(rng, ALPHAS), pick(rng, [2, 3, 4, 5, 6]), pick(rng, [0.02, 0.05, 0.08, 0.1, 0.15])

    def ask(a, g, cc, prompt):
        e = ref.expected_tokens_per_step(a, g)
        return Numeric(
            prompt, "x", ref.speedup(a, g, cc), speedup_steps(ref, a, g, cc),
            "Speculation buys tokens per target forward and pays gamma draft forwards for them, accepted or not.",
            rtol=0.01, mistakes={"ignores the draft's cost": ref.speedup(a, g, 0.0),
                                 "uses alpha^gamma (all drafts accepted) instead of the geometric sum":
                                 all_or_nothing(a, g) / (g * cc + 1),
                                 "forgets the token the target adds itself (the resample or the bonus)": (e - 1) / (g * cc + 1)})

    q = ask(alpha, gamma, c, f"Speculative decoding with gamma = {gamma} drafts per step, acceptance alpha = {alpha:g} "
                             f"(independent per draft), and a draft whose forward costs c = {c:g} of a target forward. "
                             "Verification is one target forward, as at small batch. Expected speedup over plain "
                             "decoding?")
    q.follow_ups.append(ask(alpha, gamma, 0.3, "Now the draft costs 30% of the target (c = 0.3): the speedup?"))
    q.follow_ups[0].why = ("A draft forward is paid whether or not its token survives: a slow draft can turn the gain "
                           "into a loss (below 1x).")
    q.follow_ups.append(ask(0.5, gamma, c, f"Back to c = {c:g}, but alpha drops to 0.5: the speedup?"))
    return q


def best_under(score, max_gamma: int = MAX_GAMMA) -> int:
    """The gamma in 0..max_gamma with the largest score (the smallest on ties), as best_gamma breaks them."""
    return max(range(max_gamma + 1), key=lambda g: (score(g), -g))


@template(STEM, "best gamma")
def best_gamma(rng, ref):
    while True:  # an instance where ignoring the draft's cost changes the answer
        alpha, c = pick(rng, ALPHAS), pick(rng, [0.02, 0.03, 0.05, 0.08, 0.1, 0.15, 0.2])
        if ref.best_gamma(alpha, c, MAX_GAMMA) < MAX_GAMMA:
            break

    def ask(cc, prompt):
        g = ref.best_gamma(alpha, cc, MAX_GAMMA)
        near = [k for k in (g - 1, g, g + 1) if 0 <= k <= MAX_GAMMA]
        return Numeric(
            prompt, "", g,
            [f"speedup(gamma) = (1 - {alpha:g}^(gamma + 1)) / ((1 - {alpha:g})(gamma x {cc:g} + 1)); gamma 0 is plain "
             "decoding, 1x",
             "one more draft adds alpha^(gamma + 1) expected tokens and costs c: the speedup rises, then falls",
             ", ".join(f"gamma {k}: {fmt(ref.speedup(alpha, k, cc))}x" for k in near) + f": the best is gamma {g}"
             + (" (do not speculate)" if g == 0 else "")],
            "The geometric gain of one more draft shrinks by alpha each time; its cost c does not.", rtol=0,
            mistakes={"ignores the draft's cost (more drafts always look better)": ref.best_gamma(alpha, 0.0, MAX_GAMMA),
                      "uses alpha^gamma (all drafts accepted) instead of the geometric sum":
                      best_under(lambda k: all_or_nothing(alpha, k) / (k * cc + 1))})

    q = ask(c, f"Acceptance alpha = {alpha:g} per draft (independent), a draft forward costs c = {c:g} of a target "
               f"forward, verification costs one target forward. Which gamma in 0..{MAX_GAMMA} drafts per step gives "
               "the largest expected speedup?")
    q.follow_ups.append(ask(0.3, "Now the draft costs 30% of the target (c = 0.3): the best gamma?"))
    q.follow_ups[0].why = "A costly draft makes each extra guess a worse bet: the best gamma shrinks, down to 0."
    return q


@template(STEM, "acceptance probability")
def acceptance(rng, ref):
    import torch

    def dist() -> list[float]:
        cuts = sorted(rng.sample(range(1, 20), 3))
        return [(b - a) / 20 for a, b in zip([0, *cuts], [*cuts, 20])]

    p, q = dist(), dist()
    while p == q or sorted(q)[-1] == sorted(q)[-2]:  # a unique argmax for the greedy draft below
        q = dist()
    P, Q = torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64)
    acc = float(ref.acceptance_rate(P, Q))
    mins = [min(x, y) for x, y in zip(p, q)]
    main = Numeric(
        f"Over a 4-token vocabulary the target's next-token distribution is p = {p} and the draft's is q = {q}. The "
        "draft samples a token from q and the rejection rule (accept with probability min(1, p/q)) verifies it. "
        "Probability that it is accepted, in %?", "%", 100 * acc,
        ["accepted with probability min(1, p(x)/q(x)) for the drafted x; averaged over x ~ q: "
         "sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x))",
         f"min(p, q) per token: {[round(m, 2) for m in mins]}: sum {fmt(acc)} = {fmt(100 * acc)}% (1 - the total "
         "variation distance)"],
        "Acceptance is the overlap of the two distributions: what the draft proposes and the target would also say.",
        rtol=0.01, mistakes={"averages p/q without the min (every draft counts as accepted)": 100.0,
                             "uses the chance that two independent samples agree, sum of p x q":
                             100 * float((P * Q).sum()),
                             "gives the total variation distance, not 1 minus it": 100 * (1 - acc)})
    k = max(range(4), key=lambda i: p[i] - q[i])  # the token the draft under-proposes most: a rejection favours it
    res = float(ref.residual_distribution(P, Q)[k])
    main.follow_ups.append(Numeric(
        f"A drafted token is rejected. With what probability (%) is the replacement token {k} (0-based)?", "%", 100 * res,
        [f"after a rejection, sample from max(0, p - q), normalized: max(0, p - q) = "
         f"{[round(max(0.0, x - y), 2) for x, y in zip(p, q)]}, sum {fmt(1 - acc)} (= the rejection probability)",
         f"token {k}: {round(p[k] - q[k], 2)} / {fmt(1 - acc)} = {fmt(100 * res)}%"],
        "The resample hands out exactly the mass acceptance left short, so the emitted token follows p.",
        rtol=0.01, mistakes={"resamples from p itself (over-proposed tokens get a second chance)": 100 * p[k],
                             "forgets to normalize max(0, p - q)": 100 * max(0.0, p[k] - q[k])}))
    j = max(range(4), key=lambda i: q[i])
    greedy = torch.zeros(4, dtype=torch.float64)
    greedy[j] = 1.0
    g_acc = float(ref.acceptance_rate(P, greedy))
    main.follow_ups.append(Numeric(
        f"Now the draft is greedy: it always proposes its most likely token, {j}, and the target still samples. "
        "Acceptance probability, in %?", "%", 100 * g_acc,
        [f"the draft's distribution is now all on token {j}: sum_x min(p(x), q(x)) = min(p({j}), 1) = p({j})",
         f"= {fmt(100 * g_acc)}%"],
        "A greedy draft against a sampling target is accepted only as often as the target would pick that token.",
        rtol=0.01, mistakes={"uses the draft's own probability of that token": 100 * q[j],
                             "keeps the sampling draft's overlap": 100 * acc}))
    return main


def verify_seconds(ref, model: str, chip: str, alpha: float, gamma: int, ctx: int, c: float, batch: int,
                   t_decode: float) -> float:
    """The verification forward's seconds that the reference's modeled speedup implies: from
    speedup = E x t_decode / (gamma c t_decode + t_verify)."""
    s = ref.modeled_speedup(model, chip, alpha, gamma, ctx, c, batch)
    return ref.expected_tokens_per_step(alpha, gamma) * t_decode / s - gamma * c * t_decode


def decode_seconds(model: str, chip: str, batch: int, ctx: int) -> float:
    return gm.step_time(MODELS[model], gm.CHIPS[chip], gm.Composition.decode_batch(batch, ctx)).time_s


DRAFT = "llama-3.2-1b"  # the lesson's draft model key (solutions' model_shape): gpu_model.LLAMA_3_2_1B


def setting_text(model: str, chip: str, alpha: float, gamma: int, ctx: int, c: float | str) -> str:
    draft = (f"one draft forward costs c = {c:g} of the target's decode step at any batch (a drafter with next to no "
             "KV cache of its own, such as an EAGLE head, so its c stays fixed)" if not isinstance(c, str) else
             f"the draft is a separate {gm.LLAMA_3_2_1B.name}-shaped model, priced by its own modeled decode step at "
             "each batch and context")
    return (f"Modeled {gm.CHIPS[chip].name} (reference_engine/sim/gpu_model.py: roofline kernels at achievable fractions of "
            f"the datasheet peaks, plus its per-step overhead), {MODELS[model].name} target in bf16, every sequence at "
            f"{ctx:,} tokens of context. Draft: gamma = {gamma} tokens per step, acceptance alpha = {alpha:g}; {draft}. "
            "Verification scores gamma + 1 tokens per sequence with logits at every position")


def frozen_c(model: str, chip: str, ctx: int) -> float:
    """The 1B draft's c at batch 1: its decode step over the target's (what freezing c keeps at every batch)."""
    one = gm.Composition.decode_batch(1, ctx)
    return (gm.step_time(gm.LLAMA_3_2_1B, gm.CHIPS[chip], one).time_s
            / gm.step_time(MODELS[model], gm.CHIPS[chip], one).time_s)


@template(STEM, "modeled speedup at a batch")
def modeled(rng, ref):
    model, chip = pick(rng, sorted(MODELS)), pick(rng, sorted(gm.CHIPS))
    alpha, gamma = pick(rng, ALPHAS), pick(rng, [2, 3, 4, 5])
    ctx, c, batch = pick(rng, [512, 1024, 2048, 4096]), pick(rng, [0.05, 0.1, 0.15]), pick(rng, [1, 4, 8, 16, 32])

    def ask(b, prompt):
        s = ref.modeled_speedup(model, chip, alpha, gamma, ctx, c, b)
        e, td = ref.expected_tokens_per_step(alpha, gamma), decode_seconds(model, chip, b, ctx)
        tv = verify_seconds(ref, model, chip, alpha, gamma, ctx, c, b, td)
        return Numeric(
            prompt, "x", s,
            [f"plain decode step, {b} sequence(s) x 1 token: {fmt(td * 1e3)} ms (modeled)",
             f"verification: {b} x {gamma + 1} = {b * (gamma + 1):,} tokens, each sequence's KV read once: "
             f"{fmt(tv * 1e3)} ms = {fmt(tv / td)}x a decode step",
             f"drafts: {gamma} x {c:g} x {fmt(td * 1e3)} ms = {fmt(gamma * c * td * 1e3)} ms",
             f"speedup = {fmt(e)} tokens x {fmt(td * 1e3)} ms / ({fmt(gamma * c * td * 1e3)} + {fmt(tv * 1e3)}) ms "
             f"= {fmt(s)}x"],
            "While the step is a weight read, the gamma + 1 tokens ride along almost free; the batch decides whether it is.",
            rtol=0.02, mistakes={"assumes verification costs one decode step, at any batch": ref.speedup(alpha, gamma, c),
                                 "ignores the draft's cost": ref.modeled_speedup(model, chip, alpha, gamma, ctx, 0.0, b)})

    q = ask(batch, f"{setting_text(model, chip, alpha, gamma, ctx, c)}. At a decode batch of {batch} sequence(s), what "
                   "speedup does speculation give over plain decoding, in tokens per second?")
    q.follow_ups.append(ask(256, "Now the batch is 256 sequences: the modeled speedup?"))
    td = decode_seconds(model, chip, 256, ctx)
    tv = verify_seconds(ref, model, chip, alpha, gamma, ctx, c, 256, td)
    q.follow_ups[0].why = (f"At batch 256 verification puts {256 * (gamma + 1):,} tokens in the step and costs "
                           f"{fmt(tv / td)}x a decode step: past the ridge point extra tokens cost compute.")
    return q


def _c_at(model: str, chip: str, ctx: int, batch: int) -> float:
    comp = gm.Composition.decode_batch(batch, ctx)
    return (gm.step_time(gm.LLAMA_3_2_1B, gm.CHIPS[chip], comp).time_s
            / gm.step_time(MODELS[model], gm.CHIPS[chip], comp).time_s)


@template(STEM, "break-even batch")
def break_even(rng, ref):
    while True:  # an instance where it pays at batch 1 and stops within MAX_BATCH, at this gamma and at gamma 8
        model, chip = pick(rng, sorted(MODELS)), pick(rng, sorted(gm.CHIPS))
        alpha, gamma = pick(rng, [0.6, 0.7, 0.8]), pick(rng, [2, 3, 4, 5])
        ctx, c = pick(rng, [256, 512, 1024, 2048]), DRAFT  # a 1B draft model: its c at each batch
        b = ref.break_even_batch(model, chip, alpha, gamma, ctx, c, MAX_BATCH)
        if b is None or b == 1:
            continue
        b8 = ref.break_even_batch(model, chip, alpha, 8, ctx, c, MAX_BATCH)
        if b8 is not None:
            break

    c1 = frozen_c(model, chip, ctx)

    def ask(g, n, prompt):
        at = lambda k: ref.modeled_speedup(model, chip, alpha, g, ctx, c, k)
        steps = [f"modeled speedup at batch 1: {fmt(at(1))}x; it falls as the batch grows: verification holds "
                 f"{g + 1}x the decode step's tokens, and past the ridge point those tokens cost compute",
                 f"the draft's c is its own step over the target's at each batch: {fmt(c1)} at batch 1, "
                 f"{fmt(_c_at(model, chip, ctx, n))} at "
                 f"batch {n} (its KV reads grow with the batch)"]
        if n > 1:
            steps.append(f"batch {n - 1}: {fmt(at(n - 1))}x, still above 1")
        steps.append(f"batch {n}: {fmt(at(n))}x <= 1: the first batch at which it stops paying is {n}")
        frozen = ref.break_even_batch(model, chip, alpha, g, ctx, c1, MAX_BATCH)
        mistakes = {"gives the last batch at which it still pays, not the first at which it stops": n - 1}
        if frozen is not None:
            mistakes["freezes the draft's c at its batch-1 value; a separate draft model's c grows with the batch"] = frozen
        return Numeric(prompt, "sequences", n, steps,
                       "Speculation spends spare arithmetic; a large enough batch has none left to spend.", rtol=0,
                       mistakes=mistakes)

    q = ask(gamma, b, f"{setting_text(model, chip, alpha, gamma, ctx, c)}. What is the smallest decode batch (1 to "
                      f"{MAX_BATCH} sequences) at which speculation stops paying, its modeled speedup <= 1?")
    q.follow_ups.append(ask(8, b8, "Now gamma is 8: the break-even batch?"))
    q.follow_ups[0].why = ("More drafts put more tokens in every verification for tokens that come with probability "
                           f"alpha^gamma: here it stops paying at batch {b8} instead of {b}.")
    return q


@template(STEM, "explain when speculation stops paying")
def explain(rng, ref):
    return Open(
        "Your team turned on speculative decoding (a small draft, gamma 4) and latency at low load improved, but at "
        "peak traffic throughput fell. When does speculation stop paying, and why? What would you change?",
        ["a decode step at small batch is a weight read: scoring gamma + 1 positions costs about one decode step",
         "tokens per target forward = (1 - alpha^(gamma+1)) / (1 - alpha), bonus token included; speedup = that / "
         "(gamma c + 1)",
         "the draft's forwards are paid whether or not its tokens survive: a low alpha or a slow draft makes the best "
         "gamma 0",
         "verification multiplies the step's tokens by gamma + 1: at a large batch the GEMMs are compute-bound and "
         "those tokens cost full price, so past a break-even batch it loses throughput",
         "long contexts keep it paying longer (the KV read is shared by the gamma + 1 queries); a larger gamma stops "
         "paying sooner",
         "measure alpha on your own traffic; shorten gamma or turn speculation off above a batch size (use it for "
         "latency at low load)"],
        "Speculation turns idle arithmetic into tokens; at peak load there is no idle arithmetic to turn.")
