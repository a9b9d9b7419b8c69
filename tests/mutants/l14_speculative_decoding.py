"""Plausible wrong answers for lesson 14; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here are
prefixed `_m_`."""
import torch

from tests.mutants import mutant

# -- 1.1 greedy verification ------------------------------------------------------------------------------


def _m_greedy(target_logits, draft_tokens, kind):
    best = target_logits.argmax(dim=-1).tolist()
    out = []
    for i, d in enumerate(draft_tokens.tolist()):
        t = best[i + 1] if kind == "off_by_one" else best[i]
        if t != d:
            if kind == "continue":
                out.append(t)
                continue
            return out + [d if kind == "emit_draft" else t]
        out.append(d)
    return out if kind == "no_bonus" else out + [best[len(draft_tokens)]]


@mutant(check="verify_greedy", message="never emits the bonus token")
def verify_greedy(target_logits, draft_tokens):
    return _m_greedy(target_logits, draft_tokens, "no_bonus")


@mutant(check="verify_greedy", message="emits the draft token at the mismatch")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    return _m_greedy(target_logits, draft_tokens, "emit_draft")


@mutant(check="verify_greedy", message="keeps going after a mismatch")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    return _m_greedy(target_logits, draft_tokens, "continue")


@mutant(check="verify_greedy", message="compares draft_tokens[i] with row i + 1")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    return _m_greedy(target_logits, draft_tokens, "off_by_one")


@mutant(check="verify_greedy", message="tensor.tolist()")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    return torch.tensor(sol.verify_greedy(target_logits, draft_tokens))  # a tensor, not a list of ints


@mutant(check="verify_greedy", message="breaks argmax ties toward the last index")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    V = target_logits.shape[-1]
    best = (V - 1 - target_logits.flip(-1).argmax(dim=-1)).tolist()  # a hand-rolled argmax with >=
    out = []
    for i, d in enumerate(draft_tokens.tolist()):
        out.append(best[i])
        if best[i] != d:
            return out
    return out + [best[len(out)]]


@mutant(check="verify_greedy", message="k = 0 drafts")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    best = target_logits.argmax(dim=-1).tolist()
    out, i = [], None
    for i, d in enumerate(draft_tokens.tolist()):
        out.append(best[i])
        if best[i] != d:
            return out
    return out + [best[i + 1]]  # the loop variable: None (a TypeError) when there are no drafts


@mutant(check="verify_greedy", message="accepts every draft without comparing")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    return draft_tokens.tolist() + [int(target_logits[len(draft_tokens)].argmax())]


@mutant(check="verify_greedy", message="accepts a draft whose logit equals the row's maximum")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    best, out = target_logits.argmax(dim=-1).tolist(), []
    for i, d in enumerate(draft_tokens.tolist()):
        if target_logits[i, d] == target_logits[i].max():  # "the target rates the draft top too"
            out.append(d)
            continue
        return out + [best[i]]
    return out + [best[len(out)]]


@mutant(check="verify_greedy", message="argmax of softmax probabilities")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    return sol.verify_greedy(torch.softmax(target_logits, dim=-1), draft_tokens)


# -- 1.2 / 1.3 --------------------------------------------------------------------------------------------

@mutant(check="acceptance_rate", message="takes p/q without the min")
def acceptance_rate(target_probs, draft_probs):
    ratio = target_probs / draft_probs.clamp(min=1e-300)   # p/q, not min(1, p/q)
    return (draft_probs * ratio).sum(dim=-1)


@mutant(check="acceptance_rate", message="averages min(1, p/q) over the vocabulary")
def acceptance_rate(target_probs, draft_probs):  # noqa: F811
    ratio = torch.where(draft_probs > 0, target_probs / draft_probs.clamp(min=1e-300), torch.ones_like(target_probs))
    return ratio.clamp(max=1).mean(dim=-1)


@mutant(check="acceptance_rate", message="divides p by q at tokens where both are 0")
def acceptance_rate(target_probs, draft_probs):  # noqa: F811
    return (draft_probs * (target_probs / draft_probs).clamp(max=1)).sum(dim=-1)  # 0/0 = NaN on one-hot rows


@mutant(check="acceptance_rate", message="0/0 counted as 1")
def acceptance_rate(target_probs, draft_probs):  # noqa: F811
    ratio = torch.nan_to_num(target_probs / draft_probs, nan=1.0)  # "0/0: both models agree"
    return ratio.clamp(max=1).mean(dim=-1)


@mutant(check="acceptance_rate", message="without the 1/2 of the total variation distance")
def acceptance_rate(target_probs, draft_probs):  # noqa: F811
    return 1 - (target_probs - draft_probs).abs().sum(dim=-1)  # 1 - TV distance, without TV's 1/2


@mutant(check="acceptance_rate", message="returns whether the argmaxes of p and q agree")
def acceptance_rate(target_probs, draft_probs):  # noqa: F811
    return (target_probs.argmax(dim=-1) == draft_probs.argmax(dim=-1)).to(target_probs.dtype)  # greedy agreement


@mutant(check="residual_distribution", message="does not normalize max(0, p - q)")
def residual_distribution(target_probs, draft_probs):
    return (target_probs - draft_probs).clamp(min=0)


@mutant(check="residual_distribution", message="divides by a zero sum where p == q")
def residual_distribution(target_probs, draft_probs):  # noqa: F811
    excess = (target_probs - draft_probs).clamp(min=0)
    return excess / excess.sum(dim=-1, keepdim=True)


@mutant(check="residual_distribution", message="returns p")
def residual_distribution(target_probs, draft_probs):  # noqa: F811
    return target_probs.clone()


@mutant(check="residual_distribution", message="returns the uniform distribution where p == q")
def residual_distribution(target_probs, draft_probs):  # noqa: F811
    excess = (target_probs - draft_probs).clamp(min=0)
    total = excess.sum(dim=-1, keepdim=True)
    uniform = torch.full_like(target_probs, 1.0 / target_probs.shape[-1])
    return torch.where(total > 0, excess / total.clamp(min=1e-300), uniform)


@mutant(check="residual_distribution", message="returns p for every row as soon as one row has p == q")
def residual_distribution(target_probs, draft_probs):  # noqa: F811
    excess = (target_probs - draft_probs).clamp(min=0)
    total = excess.sum(dim=-1, keepdim=True)
    return target_probs.clone() if bool((total == 0).any()) else excess / total


@mutant(check="residual_distribution", message="returns a row of zeros where p == q")
def residual_distribution(target_probs, draft_probs):  # noqa: F811
    excess = (target_probs - draft_probs).clamp(min=0)
    return excess / excess.sum(dim=-1, keepdim=True).clamp(min=1e-300)  # 0 / tiny = 0 on a p == q row


# -- 1.4 the rejection sampler ----------------------------------------------------------------------------

def _m_verify(p, q, drafts, gen, accept="min", residual="norm", bonus="last", after_reject="stop", rng=True):
    k, out = drafts.shape[0], []
    draw = (lambda: torch.rand((), generator=gen, dtype=p.dtype)) if rng else (lambda: torch.rand((), dtype=p.dtype))
    pick = (lambda row: int(torch.multinomial(row, 1, generator=gen))) if rng else \
        (lambda row: int(torch.multinomial(row, 1)))
    for i, x in enumerate(drafts.tolist()):
        ratio = p[i, x] / q[i, x] if accept == "min" else q[i, x] / p[i, x]
        if draw() < ratio:
            out.append(x)
            continue
        if residual == "p":
            out.append(pick(p[i]))
        elif residual == "cdf_unnormalized":  # inverse CDF of max(0, p - q) without dividing by its sum
            cdf = (p[i] - q[i]).clamp(min=0).cumsum(0)
            u = torch.rand((), generator=gen, dtype=p.dtype)
            out.append(min(int((cdf <= u).sum()), p.shape[1] - 1))
        else:
            out.append(pick(sol.residual_distribution(p[i], q[i])))
        if after_reject == "stop":
            return out
    if bonus != "none":  # every draft accepted (or examined, after_reject="continue")
        out.append(pick(p[k if bonus == "last" else k - 1]))
    return out


@mutant(check="verify", message="resamples from p after a rejection")
def verify(target_probs, draft_probs, draft_tokens, generator):
    return _m_verify(target_probs, draft_probs, draft_tokens, generator, residual="p")


@mutant(check="verify", message="never emits the bonus token")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    return _m_verify(target_probs, draft_probs, draft_tokens, generator, bonus="none")


@mutant(check="verify", message="accepts with min(1, q/p)")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    return _m_verify(target_probs, draft_probs, draft_tokens, generator, accept="inverse")


@mutant(check="verify", message="keeps examining drafts after a rejection")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    return _m_verify(target_probs, draft_probs, draft_tokens, generator, after_reject="continue")


@mutant(check="verify", message="without normalizing it")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    return _m_verify(target_probs, draft_probs, draft_tokens, generator, residual="cdf_unnormalized")


@mutant(check="verify", message="draws the bonus token from target_probs[k - 1]")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    return _m_verify(target_probs, draft_probs, draft_tokens, generator, bonus="previous")


@mutant(check="verify", message="modified its argument")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    out = []
    for i, x in enumerate(draft_tokens.tolist()):
        if torch.rand((), generator=generator, dtype=target_probs.dtype, device=target_probs.device) < target_probs[i, x] / draft_probs[i, x]:
            out.append(x)
            continue
        row = target_probs[i].sub_(draft_probs[i]).clamp_(min=0)  # in place: the caller's p is gone
        out.append(int(torch.multinomial(row, 1, generator=generator)))
        return out
    return out + [int(torch.multinomial(target_probs[len(out)], 1, generator=generator))]


@mutant(check="verify", message="never emits the bonus token")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    if len(draft_tokens) == 0:  # "nothing to verify"
        return []
    return sol.verify(target_probs, draft_probs, draft_tokens, generator)


@mutant(check="verify", message="draw every random number from `generator`")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    return _m_verify(target_probs, draft_probs, draft_tokens, generator, rng=False)  # torch's global RNG


# -- 3.4 the verifier inside the engine: wrong verifiers as the engine sees them (its refusals, other tokens,
# other acceptance counts) ---------------------------------------------------------------------------------


@mutant(check="verifier_in_engine", message="never emits the bonus token")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    return _m_greedy(target_logits, draft_tokens, "no_bonus")  # same tokens, one draft fewer kept per full match


@mutant(check="verifier_in_engine", message="returns no token at all")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    best = target_logits.argmax(dim=-1).tolist()
    out = []
    for i, d in enumerate(draft_tokens.tolist()):
        if best[i] != d:
            return out  # the accepted drafts only: no correction token
        out.append(d)
    return out + [best[len(out)]]


@mutant(check="verifier_in_engine", message="keeps a draft after a mismatch")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    return _m_greedy(target_logits, draft_tokens, "continue")


@mutant(check="verifier_in_engine", message="emits the draft token at the mismatch")
def verify_greedy(target_logits, draft_tokens):  # noqa: F811
    return _m_greedy(target_logits, draft_tokens, "emit_draft")


@mutant(check="verifier_in_engine", message="resamples from p after a rejection")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    return _m_verify(target_probs, draft_probs, draft_tokens, generator, residual="p")


@mutant(check="verifier_in_engine", message="draw exactly one torch.rand per draft examined")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    return _m_verify(target_probs, draft_probs, draft_tokens, generator, rng=False)  # torch's global RNG


@mutant(check="verifier_in_engine", message="draws u with torch.rand in float32 (no dtype=)")
def verify(target_probs, draft_probs, draft_tokens, generator):  # noqa: F811
    out = []
    for i, x in enumerate(draft_tokens.tolist()):
        if torch.rand((), generator=generator) < target_probs[i, x] / draft_probs[i, x]:  # float32: no dtype=
            out.append(x)
            continue
        row = sol.residual_distribution(target_probs[i], draft_probs[i])
        return out + [int(torch.multinomial(row, 1, generator=generator))]
    return out + [int(torch.multinomial(target_probs[len(out)], 1, generator=generator))]


# -- 2. the arithmetic ------------------------------------------------------------------------------------

@mutant(check="expected_tokens_per_step", message="one term short")
def expected_tokens_per_step(alpha, gamma):
    return float(gamma) if alpha == 1 else (1 - alpha ** gamma) / (1 - alpha)


@mutant(check="expected_tokens_per_step", message="ZeroDivisionError")
def expected_tokens_per_step(alpha, gamma):  # noqa: F811
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)  # alpha = 1 not handled


@mutant(check="expected_tokens_per_step", message="uses 1 + gamma * alpha")
def expected_tokens_per_step(alpha, gamma):  # noqa: F811
    return 1 + gamma * alpha


@mutant(check="expected_tokens_per_step", message="treats an alpha close to 1 as 1")
def expected_tokens_per_step(alpha, gamma):  # noqa: F811
    return float(gamma + 1) if alpha >= 0.99 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


@mutant(check="expected_tokens_per_step", message="returns 0 at alpha = 0")
def expected_tokens_per_step(alpha, gamma):  # noqa: F811
    return 0.0 if alpha == 0 else sol.expected_tokens_per_step(alpha, gamma)


@mutant(check="speedup", message="returns 0 at gamma = 0")
def speedup(alpha, gamma, c):  # noqa: F811
    return 0.0 if gamma == 0 else sol.speedup(alpha, gamma, c)


@mutant(check="speedup", message="divides by gamma * c")
def speedup(alpha, gamma, c):
    return sol.expected_tokens_per_step(alpha, gamma) / (gamma * c)


@mutant(check="speedup", message="leaves out the draft's cost")
def speedup(alpha, gamma, c):  # noqa: F811
    return sol.expected_tokens_per_step(alpha, gamma)


@mutant(check="best_gamma", message="never returns 0")
def best_gamma(alpha, c, max_gamma):
    return max(range(1, max_gamma + 1), key=lambda g: (sol.speedup(alpha, g, c), -g))


@mutant(check="best_gamma", message="stops at max_gamma - 1")
def best_gamma(alpha, c, max_gamma):  # noqa: F811
    return max(range(max_gamma), key=lambda g: (sol.speedup(alpha, g, c), -g))


@mutant(check="best_gamma", message="ignoring what the drafts cost")
def best_gamma(alpha, c, max_gamma):  # noqa: F811
    return max(range(max_gamma + 1), key=lambda g: (sol.expected_tokens_per_step(alpha, g), -g))


@mutant(check="best_gamma", message="breaks ties toward the larger gamma")
def best_gamma(alpha, c, max_gamma):  # noqa: F811
    best, best_s = 0, sol.speedup(alpha, 0, c)
    for g in range(1, max_gamma + 1):
        if sol.speedup(alpha, g, c) >= best_s:  # >=: a tie moves to the later gamma
            best, best_s = g, sol.speedup(alpha, g, c)
    return best


@mutant(check="best_gamma", message="treats speedups within 1e-3 of the best as ties")
def best_gamma(alpha, c, max_gamma):  # noqa: F811
    s = [sol.speedup(alpha, g, c) for g in range(max_gamma + 1)]
    return next(g for g, v in enumerate(s) if v >= max(s) - 1e-3)


@mutant(check="best_gamma", message="speculates when its best speedup only equals 1")
def best_gamma(alpha, c, max_gamma):  # noqa: F811
    g = max(range(1, max_gamma + 1), key=lambda g: (sol.speedup(alpha, g, c), -g))
    return g if sol.speedup(alpha, g, c) >= 1 else 0


# -- 3. the modeled GPU clock -----------------------------------------------------------------------------

def _m_modeled(model, chip, alpha, gamma, context, c, batch, verify_composition, lm_head=True):
    from reference_engine.sim import gpu_model as gm

    shape, hw = gm.MODELS[model], gm.CHIPS[chip]
    t_decode = gm.step_time(shape, hw, gm.Composition.decode_batch(batch, context)).time_s
    t_verify = gm.step_time(shape, hw, verify_composition).time_s
    if lm_head:
        t_verify += sol.lm_head_seconds(model, chip, batch * (gamma + 1)) - sol.lm_head_seconds(model, chip, batch)
    return sol.expected_tokens_per_step(alpha, gamma) * t_decode / (gamma * c * t_decode + t_verify)


@mutant(check="modeled_speedup", message="charges the verification forward as one decode step")
def modeled_speedup(model, chip, alpha, gamma, context, c, batch):
    return sol.speedup(alpha, gamma, c)


@mutant(check="modeled_speedup", message="leaves out the extra lm_head rows")
def modeled_speedup(model, chip, alpha, gamma, context, c, batch):  # noqa: F811
    from reference_engine.sim.gpu_model import Composition
    return _m_modeled(model, chip, alpha, gamma, context, c, batch,
                      Composition(prefills=((gamma + 1, context),) * batch), lm_head=False)


@mutant(check="modeled_speedup", message="batch * (gamma + 1) decode sequences")
def modeled_speedup(model, chip, alpha, gamma, context, c, batch):  # noqa: F811
    from reference_engine.sim.gpu_model import Composition
    return _m_modeled(model, chip, alpha, gamma, context, c, batch,
                      Composition.decode_batch(batch * (gamma + 1), context))


@mutant(check="modeled_speedup", message="one chunk of batch * (gamma + 1) tokens")
def modeled_speedup(model, chip, alpha, gamma, context, c, batch):  # noqa: F811
    from reference_engine.sim.gpu_model import Composition
    return _m_modeled(model, chip, alpha, gamma, context, c, batch,
                      Composition(prefills=((batch * (gamma + 1), context),)))


@mutant(check="break_even_batch", message="tries only powers of two")
def break_even_batch(model, chip, alpha, gamma, context, c, max_batch=1024):
    b = 1
    while b <= max_batch:
        if sol.modeled_speedup(model, chip, alpha, gamma, context, c, b) <= 1:
            return b
        b *= 2
    return None


@mutant(check="break_even_batch", message="returns max_batch when speculation still pays there")
def break_even_batch(model, chip, alpha, gamma, context, c, max_batch=1024):  # noqa: F811
    found = sol.break_even_batch(model, chip, alpha, gamma, context, c, max_batch)
    return max_batch if found is None else found


@mutant(check="break_even_batch", message="the last batch at which speculation still pays")
def break_even_batch(model, chip, alpha, gamma, context, c, max_batch=1024):  # noqa: F811
    found = sol.break_even_batch(model, chip, alpha, gamma, context, c, max_batch)
    return found - 1 if found else found


@mutant(check="break_even_batch", message="break_even_batch depends on modeled_speedup, which fails")
def modeled_speedup(model, chip, alpha, gamma, context, c, batch):  # noqa: F811
    return sol.speedup(alpha, gamma, c)  # break_even_batch calls this wrong modeled_speedup: blamed on it


@mutant(check="break_even_batch", message="ignores max_batch")
def break_even_batch(model, chip, alpha, gamma, context, c, max_batch=1024):  # noqa: F811
    return sol.break_even_batch(model, chip, alpha, gamma, context, c, 1024)


@mutant(check="break_even_batch", message="never tries max_batch itself")
def break_even_batch(model, chip, alpha, gamma, context, c, max_batch=1024):  # noqa: F811
    for b in range(1, max_batch):  # stops one short of max_batch
        if sol.modeled_speedup(model, chip, alpha, gamma, context, c, b) <= 1:
            return b
    return None


@mutant(check="break_even_batch", message="one less than the first at which it stops")
def break_even_batch(model, chip, alpha, gamma, context, c, max_batch=1024):  # noqa: F811
    if sol.modeled_speedup(model, chip, alpha, gamma, context, c, max_batch) > 1:
        return None
    lo, hi = 1, max_batch
    while lo < hi:  # the textbook slip: hi = mid - 1 can step past the answer
        mid = (lo + hi) // 2
        if sol.modeled_speedup(model, chip, alpha, gamma, context, c, mid) > 1:
            lo = mid + 1
        else:
            hi = mid - 1
    return max(lo, 1)


@mutant(check="break_even_batch", message="passes c and context to modeled_speedup in swapped order")
def break_even_batch(model, chip, alpha, gamma, context, c, max_batch=1024):  # noqa: F811
    pays = lambda b: sol.modeled_speedup(model, chip, alpha, gamma, c, context, b) > 1  # noqa: E731
    if pays(max_batch):
        return None
    return next(b for b in range(1, max_batch + 1) if not pays(b))


@mutant(check="break_even_batch", message="uses speedup(alpha, gamma, c), which does not depend on the batch")
def break_even_batch(model, chip, alpha, gamma, context, c, max_batch=1024):  # noqa: F811
    return None if sol.speedup(alpha, gamma, c) > 1 else 1


# -- 4. tree drafts ---------------------------------------------------------------------------------------------

@mutant(check="tree_attention_mask", message="lets a node attend to every earlier node")
def tree_attention_mask(parents, prefix_len):  # noqa: F811
    n = len(parents)
    mask = torch.ones(n, prefix_len + n, dtype=torch.bool).tril(prefix_len)  # causal: siblings see each other
    return mask, sol.tree_attention_mask(parents, prefix_len)[1]


@mutant(check="tree_attention_mask", message="numbers positions by node index")
def tree_attention_mask(parents, prefix_len):  # noqa: F811
    mask, _ = sol.tree_attention_mask(parents, prefix_len)
    return mask, torch.arange(len(parents)) + prefix_len  # chain positions


@mutant(check="tree_attention_mask", message="leaves the prefix out")
def tree_attention_mask(parents, prefix_len):  # noqa: F811
    mask, pos = sol.tree_attention_mask(parents, prefix_len)
    mask[:, :prefix_len] = False
    return mask, pos


@mutant(check="verify_tree_greedy", message="tries only the first child")
def verify_tree_greedy(target_logits, tokens, parents):  # noqa: F811
    best, kids = target_logits.argmax(dim=-1).tolist(), sol.children_of(parents)
    out, node = [], 0
    while True:
        out.append(best[node])
        if not kids[node] or tokens[kids[node][0]] != best[node]:
            return out
        node = kids[node][0]


@mutant(check="verify_tree_greedy", message="never emits the last token")
def verify_tree_greedy(target_logits, tokens, parents):  # noqa: F811
    out = sol.verify_tree_greedy(target_logits, tokens, parents)
    return out[:-1] if len(out) > 1 else out


@mutant(check="verify_tree_greedy", message="follows the last child holding the target's argmax")
def verify_tree_greedy(target_logits, tokens, parents):  # noqa: F811
    best, kids = target_logits.argmax(dim=-1).tolist(), sol.children_of(parents)
    out, node = [], 0
    while True:
        out.append(best[node])
        matches = [c for c in kids[node] if tokens[c] == best[node]]
        if not matches:
            return out
        node = matches[-1]  # the last sibling holding the argmax, not the first


def _m_tree(p, q, tokens, parents, gen, kind):
    kids = sol.children_of(parents)
    out, node, pc, qc = [], 0, p[0], q[0]
    while True:
        tried = kids[node][:1] if kind == "first_only" else kids[node]
        moved = False
        for c in tried:
            x = tokens[c]
            ratio = qc[x] / pc[x] if kind == "inverse" else pc[x] / qc[x]
            if torch.rand((), generator=gen, dtype=p.dtype) < ratio:
                out.append(x)
                node, pc, qc, moved = c, p[c], q[c], True
                break
            if kind != "no_p_update":
                pc = sol.residual_distribution(pc, qc)
            if kind != "no_q_update":
                qc = qc.clone()
                qc[x] = 0
                qc = qc / qc.sum()
        if not moved:
            if kind == "no_final" and kids[node]:
                return out  # every child rejected: no resampled token
            final = p[node] if kind == "final_from_target" else pc
            return out + [int(torch.multinomial(final, 1, generator=gen))]


@mutant(check="verify_tree", message="tries only the first child")
def verify_tree(target_probs, draft_probs, tokens, parents, generator):  # noqa: F811
    return _m_tree(target_probs, draft_probs, tokens, parents, generator, "first_only")


@mutant(check="verify_tree", message="does not remove a rejected sibling's token from q")
def verify_tree(target_probs, draft_probs, tokens, parents, generator):  # noqa: F811
    return _m_tree(target_probs, draft_probs, tokens, parents, generator, "no_q_update")


@mutant(check="verify_tree", message="does not update p between siblings")
def verify_tree(target_probs, draft_probs, tokens, parents, generator):  # noqa: F811
    return _m_tree(target_probs, draft_probs, tokens, parents, generator, "no_p_update")


@mutant(check="verify_tree", message="samples the last token from the node's target row")
def verify_tree(target_probs, draft_probs, tokens, parents, generator):  # noqa: F811
    return _m_tree(target_probs, draft_probs, tokens, parents, generator, "final_from_target")



@mutant(check="verify_tree", message="accepts a child with min(1, q/p)")
def verify_tree(target_probs, draft_probs, tokens, parents, generator):  # noqa: F811
    return _m_tree(target_probs, draft_probs, tokens, parents, generator, "inverse")


@mutant(check="verify_tree", message="emits nothing more once every child of a node is rejected")
def verify_tree(target_probs, draft_probs, tokens, parents, generator):  # noqa: F811
    return _m_tree(target_probs, draft_probs, tokens, parents, generator, "no_final")


@mutant(check="verify_tree", message="judges every sibling against the node's own target_probs and draft_probs rows")
def verify_tree(target_probs, draft_probs, tokens, parents, generator):  # noqa: F811
    kids = sol.children_of(parents)
    out, node = [], 0
    while True:
        for c in kids[node]:
            x = tokens[c]
            p, q = target_probs[node], draft_probs[node]  # every sibling judged as if it were the only draft
            if torch.rand((), generator=generator, dtype=p.dtype) < p[x] / q[x]:
                out.append(x)
                node = c
                break
        else:
            p = sol.residual_distribution(target_probs[node], draft_probs[node]) if kids[node] else target_probs[node]
            return out + [int(torch.multinomial(p, 1, generator=generator))]
