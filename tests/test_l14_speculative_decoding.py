"""Lesson 14 beyond the shared tests: the rejection sampler's exactness, the check's statistics (exact law,
calibrated false-alarm rate, power against every named mistake), the greedy loop against plain greedy, the
KV-cached helpers, and the modeled-clock assumptions the break-even search relies on."""
import math
import random
from collections import Counter

import pytest
import torch

from autograder.checks import l14_speculative_decoding as checks
from autograder.compare import compare
from reference_engine.tools import train
from solutions import l14_speculative_decoding as S


def _random_pq(rng, k, V):
    return checks._rows(rng, k + 1, V), checks._rows(rng, k, V)


# -- the exact law -------------------------------------------------------------------------------------------

def test_law_sums_to_one_and_each_emitted_token_has_the_target_distribution():
    """Given that position j is reached (drafts 0 .. j-1 accepted), the token emitted there is distributed as
    p_j: the property that makes speculative sampling exact (fixed rows stand for the conditionals)."""
    rng = random.Random(0)
    for _ in range(50):
        k, V = rng.randint(1, 3), rng.randint(2, 5)
        p, q = _random_pq(rng, k, V)
        law = checks.emission_law(p, q)
        assert math.isclose(sum(law.values()), 1.0, rel_tol=1e-12)
        for j in range(k + 1):
            reach = sum(w for s, w in law.items() if len(s) > j)
            if reach == 0:
                continue  # p and q disjoint at an earlier position: nothing gets this far
            for y in range(V):
                share = sum(w for s, w in law.items() if len(s) > j and s[j] == y) / reach
                assert math.isclose(share, p[j][y], rel_tol=1e-9, abs_tol=1e-12)
        for name, kw in checks.VERIFY_MISTAKES.items():
            assert math.isclose(sum(checks.emission_law(p, q, **kw).values()), 1.0, rel_tol=1e-9), name


def test_reference_verify_follows_the_law():
    rng = random.Random(1)
    p, q = _random_pq(rng, 2, 4)
    drafts = torch.stack([torch.multinomial(checks._t(r), 4000, replacement=True,
                                            generator=torch.Generator().manual_seed(i)) for i, r in enumerate(q)], 1)
    run = checks.sample_verify(S.verify, checks._t(p), checks._t(q), drafts, seed=3)
    assert run["deterministic"] and not run["modified"]
    counts = Counter(tuple(o) for o in run["outputs"])
    assert checks.chi_square(counts, checks.emission_law(p, q), len(drafts))[2] > 1e-3


def test_truncated_gamma_accepts_the_prefix_of_the_same_draws():
    """measure_acceptance's claim: with the same generator, verify on the first g drafts accepts min(A, g)."""
    rng = random.Random(2)
    for trial in range(200):
        p, q = _random_pq(rng, 6, 4)
        P, Q = checks._t(p), checks._t(q)
        drafts = torch.stack([torch.multinomial(row, 1, generator=torch.Generator().manual_seed(trial)) for row in Q])[:, 0]
        full = len(S.verify(P, Q, drafts, torch.Generator().manual_seed(trial))) - 1
        for g in range(1, 7):
            cut = len(S.verify(P[:g + 1], Q[:g], drafts[:g], torch.Generator().manual_seed(trial))) - 1
            assert cut == min(full, g)


# -- the check's statistics -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", [c for _, c in checks.VERIFY_CASES] + [_random_pq(random.Random(9), 3, 5)])
def test_chi_square_false_alarm_rate_is_calibrated(case):
    """Counts drawn from the exact law itself: the test's p-values are close to uniform, so FALSE_ALARM is the
    rate at which a right verifier fails a case (checked here at 1% and 0.1%, where it can be measured)."""
    p, q = case
    law = checks.emission_law(p, q)
    seqs = list(law)
    probs = torch.tensor([law[s] for s in seqs], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    reps = 3000
    pvalues = []
    for _ in range(reps):
        draws = torch.multinomial(probs, checks.N_CALLS, replacement=True, generator=g)
        bins = torch.bincount(draws, minlength=len(seqs)).tolist()
        counts = Counter({seqs[i]: n for i, n in enumerate(bins) if n})
        pvalues.append(checks.chi_square(counts, law, checks.N_CALLS)[2])
    for level in (0.01, 0.001):
        rate = sum(pv < level for pv in pvalues) / reps
        sd = math.sqrt(level * (1 - level) / reps)
        assert abs(rate - level) < 4 * sd + 0.002, (level, rate)


def _noncentrality(true_law: dict, tested: dict, n: int) -> float:
    """The chi-square statistic's expected excess when counts come from true_law and are tested against tested."""
    total = 0.0
    for s in set(true_law) | set(tested):
        a, b = true_law.get(s, 0.0), tested.get(s, 0.0)
        if b == 0 and a > 0:
            return math.inf
        if b > 0:
            total += (a - b) ** 2 / b
    return n * total


FAR = 300  # chi-square units between a mistake's law and every other law on some visible case


def _miss_probability(df: int, noncentrality: float) -> float:
    """P(a noncentral chi-square(df, noncentrality) statistic stays under the check's critical value): how often
    counts drawn from a law that far from the tested one pass the test (a Poisson mixture of central
    chi-squares)."""
    f64 = lambda x: torch.tensor(float(x), dtype=torch.float64)
    lo, hi = 0.0, 10_000.0  # the critical value: upper tail FALSE_ALARM
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(torch.special.gammaincc(f64(df / 2), f64(mid / 2))) > checks.FALSE_ALARM else (lo, mid)
    half, total = noncentrality / 2, 0.0
    for j in range(int(half + 40 * math.sqrt(half) + 50)):
        weight = (j == 0) if half == 0 else math.exp(-half + j * math.log(half) - math.lgamma(j + 1))
        total += weight * float(torch.special.gammainc(f64(df / 2 + j), f64(hi / 2)))
    return total


def test_far_means_a_wrong_rule_fails_the_visible_cases():
    """FAR chi-square units are enough: counts from a law that far away pass a visible case's test with
    probability under 1e-9 (at each visible case's degrees of freedom, bins with an expected count under 5
    pooled)."""
    assert _miss_probability(10, 0) > 0.99  # (the mixture at no distance: the test's own false-alarm side)
    for _, (p, q) in checks.VERIFY_CASES:
        law = checks.emission_law(p, q)
        df = sum(checks.N_CALLS * v >= checks.MIN_EXPECTED for v in law.values())  # bins - 1, plus the pooled bin
        assert _miss_probability(df, FAR) < 1e-9, df


def test_every_verify_mistake_is_far_from_the_rule_and_from_the_others_on_a_visible_case():
    """Power: on some visible case each named mistake's law is FAR or more chi-square units away from the right
    law (so it fails) and from every other mistake's (so it alone is named)."""
    for name, kw in checks.VERIFY_MISTAKES.items():
        ok = False
        for _, (p, q) in checks.VERIFY_CASES:
            mine = checks.emission_law(p, q, **kw)
            others = [checks.emission_law(p, q)] + [checks.emission_law(p, q, **k2)
                                                   for n2, k2 in checks.VERIFY_MISTAKES.items() if n2 != name]
            if all(_noncentrality(mine, other, checks.N_CALLS) > FAR for other in others):
                ok = True
        assert ok, name


# -- greedy ----------------------------------------------------------------------------------------------------

def test_greedy_rule_matches_the_reference():
    rng = random.Random(3)
    for _ in range(300):
        logits, drafts = checks.random_greedy_case(rng)
        assert checks.greedy_rule(logits, drafts) == S.verify_greedy(logits, drafts)


@pytest.fixture(scope="module")
def models():
    return S.load_models()


def test_greedy_loop_equals_plain_greedy(models):
    """The check's expected tokens (the loop with the right rule) are plain greedy decoding of the target."""
    target, _ = models
    prompts = checks._prompts()
    loop = checks.greedy_loop(checks.greedy_rule, prompts, checks.LOOP_GAMMA, checks.LOOP_TOKENS)
    for prompt, got in zip(prompts, loop["tokens"]):
        assert got == train.greedy(target, prompt, checks.LOOP_TOKENS)[len(prompt):]


def test_cached_model_matches_the_full_forward_and_rolls_back(models):
    ids = list(range(5, 60))
    for model in models:
        full = model(torch.tensor([ids]))[0].detach()
        cache = S.CachedModel(model)
        parts = [cache.feed(ids[:30]), cache.feed(ids[30:31]), cache.feed(ids[31:])]
        assert torch.allclose(torch.cat(parts), full, atol=1e-4)
        cache.rollback(20)
        assert torch.allclose(cache.feed(ids[20:40]), full[20:40], atol=1e-4)


def test_speculative_greedy_equals_plain_greedy_with_the_kv_cache(models):
    target, draft = models
    prompt = S.tokenizer().encode("def parse(self, text):\n    ").ids
    plain = S.generate(target, prompt, 40)["tokens"]
    assert plain == train.greedy(target, prompt, 40)[len(prompt):]
    for gamma in (1, 3, 5):
        spec = S.speculative_generate(target, draft, prompt, 40, gamma)
        assert spec["tokens"] == plain
        assert spec["target_forwards"] == len(spec["accepted"]) < 40
        assert all(0 <= a <= gamma for a in spec["accepted"])


def test_speculative_sampling_runs_and_counts(models):
    target, draft = models
    spec = S.speculative_generate(target, draft, [1, 2, 3, 4], 30, 3, temperature=1.0, seed=5)
    assert len(spec["tokens"]) == 30 and sum(a + 1 for a in spec["accepted"]) >= 30
    again = S.speculative_generate(target, draft, [1, 2, 3, 4], 30, 3, temperature=1.0, seed=5)
    assert again["tokens"] == spec["tokens"]


# -- the arithmetic and the modeled clock ----------------------------------------------------------------------

def test_expected_tokens_is_the_mean_of_a_simulated_step():
    rng = random.Random(4)
    for alpha, gamma in ((0.6, 3), (0.9, 6), (0.2, 1)):
        n, total = 40000, 0
        for _ in range(n):
            accepted = 0
            while accepted < gamma and rng.random() < alpha:
                accepted += 1
            total += accepted + 1
        assert total / n == pytest.approx(S.expected_tokens_per_step(alpha, gamma), rel=0.02)


def test_best_gamma_is_the_brute_force_argmax():
    rng = random.Random(5)
    for _ in range(200):
        alpha, c, top = rng.uniform(0, 1), rng.uniform(0, 1), rng.randint(0, 12)
        vals = [S.speedup(alpha, g, c) for g in range(top + 1)]
        assert S.best_gamma(alpha, c, top) == vals.index(max(vals))


def test_check_variant_equals_the_reference_modeled_speedup():
    rng = random.Random(6)
    for _ in range(30):
        case = checks.random_modeled_case(rng)
        assert checks.modeled(*case) == pytest.approx(S.modeled_speedup(*case), rel=1e-12)


def test_check_variant_equals_the_reference_with_a_draft_model():
    for case in [c for _, c in checks.MODELED_CASES] + [("llama-3-8b", chip, 0.7, 3, ctx, "llama-3.2-1b", b)
                                                         for chip in ("A100", "H200") for ctx in (128, 2048)
                                                         for b in (1, 77, 512)]:
        assert checks.modeled(*case) == pytest.approx(S.modeled_speedup(*case), rel=1e-12)


def test_a_draft_models_c_grows_with_batch_and_context_and_freezing_it_moves_the_break_even():
    """The lesson's claims (section 3.3, the solution's docstring, the checks' visible cases): the 1B draft keeps a
    quarter of the 8B target's KV bytes per token, a larger share than of its parameters; so its c rises with the
    batch; at alpha 0.6, gamma 4 on the modeled H100 the break-even batch is 103 at context 1024 (116 with c
    frozen at its batch-1 value) and 236 at context 4096 (none up to 1024 with c frozen)."""
    from reference_engine.sim import gpu_model as gm
    D, T = gm.LLAMA_3_2_1B, gm.LLAMA_3_8B
    assert gm.kv_bytes_per_token(D) / gm.kv_bytes_per_token(T) == 0.25
    assert gm.param_count(D) / gm.param_count(T) < 0.2
    assert S.model_shape("llama-3.2-1b") is D and S.model_shape("llama-3-8b") is T
    step = lambda s, b, ctx: gm.step_time(s, gm.H100, gm.Composition.decode_batch(b, ctx)).time_s
    for ctx in (1024, 4096):
        cs = [step(D, b, ctx) / step(T, b, ctx) for b in (1, 64, 256)]
        assert cs == sorted(cs) and cs[-1] < 0.25
    c1 = step(D, 1, 1024) / step(T, 1, 1024)
    assert S.break_even_batch("llama-3-8b", "H100", 0.6, 4, 1024, "llama-3.2-1b") == 103
    assert S.break_even_batch("llama-3-8b", "H100", 0.6, 4, 1024, c1) == 116
    assert S.break_even_batch("llama-3-8b", "H100", 0.6, 4, 4096, "llama-3.2-1b") == 236
    assert S.break_even_batch("llama-3-8b", "H100", 0.6, 4, 4096, c1) is None
    # a frozen c is the draft model at batch 1 exactly
    assert S.modeled_speedup("llama-3-8b", "H100", 0.6, 4, 1024, c1, 1) == \
        pytest.approx(S.modeled_speedup("llama-3-8b", "H100", 0.6, 4, 1024, "llama-3.2-1b", 1), rel=1e-12)


def test_modeled_speedup_is_leviathan_at_batch_one_and_falls_with_the_batch():
    """At batch 1 the step is memory-bound: verification costs about one decode step. The speedup never rises
    again once it falls (what break_even_batch's bisection relies on), over a grid of settings."""
    for chip in ("A100", "H100", "H200"):
        for context in (128, 1024, 4096):
            for alpha, gamma, c in ((0.5, 2, 0.3), (0.7, 4, 0.2), (0.9, 8, 0.05)):
                assert S.modeled_speedup("llama-3-8b", chip, alpha, gamma, context, c, 1) == \
                    pytest.approx(S.speedup(alpha, gamma, c), rel=0.03)
                vals = [S.modeled_speedup("llama-3-8b", chip, alpha, gamma, context, c, b) for b in range(1, 700, 7)]
                assert all(b <= a + 1e-12 for a, b in zip(vals, vals[1:])), (chip, context, alpha, gamma, c)


def test_with_a_draft_model_the_speedup_never_comes_back_above_one():
    """With a draft model's c(batch, context) the modeled speedup can rise again past a few hundred sequences,
    by under 1e-3 (the draft's c dips where the target's GEMMs turn compute-bound), but once it is <= 1 it stays
    <= 1 up to batch 1024: what break_even_batch's bisection needs, over a grid of settings."""
    for chip in ("A100", "H100", "H200"):
        for context in (128, 1024, 4096):
            for alpha, gamma in ((0.5, 2), (0.6, 4), (0.9, 8)):
                vals = [S.modeled_speedup("llama-3-8b", chip, alpha, gamma, context, "llama-3.2-1b", b)
                        for b in range(1, 1025)]
                assert max(b - a for a, b in zip(vals, vals[1:])) < 1e-3
                first = next((i for i, v in enumerate(vals) if v <= 1), None)
                assert first is None or max(vals[first:]) <= 1, (chip, context, alpha, gamma)


def test_break_even_bisection_equals_a_scan():
    for chip, alpha, gamma, context, c in (("H100", 0.7, 4, 1024, 0.2), ("A100", 0.6, 3, 256, 0.3),
                                           ("H200", 0.8, 6, 512, 0.1)):
        scan = next((b for b in range(1, 513)
                     if S.modeled_speedup("llama-3-8b", chip, alpha, gamma, context, c, b) <= 1), None)
        assert S.break_even_batch("llama-3-8b", chip, alpha, gamma, context, c, 512) == scan
        scan = next((b for b in range(1, 513)
                     if S.modeled_speedup("llama-3-8b", chip, alpha, gamma, context, "llama-3.2-1b", b) <= 1), None)
        assert S.break_even_batch("llama-3-8b", chip, alpha, gamma, context, "llama-3.2-1b", 512) == scan


def test_break_even_cases_at_max_batch_are_what_their_labels_say():
    """Three visible break_even_batch cases set max_batch at, one below and one above the first case's
    break-even batch: keep them there if the modeled clock changes."""
    first = S.break_even_batch(*checks.BREAK_EVEN_CASES[0][1])
    around = {label: case[6] for label, case in checks.BREAK_EVEN_CASES if "break-even batch" in label}
    assert around == {"visible: max_batch is exactly the break-even batch": first,
                      "visible: max_batch one below the break-even batch": first - 1,
                      "visible: max_batch one above the break-even batch": first + 1}


def test_tie_and_edge_cases_are_what_their_labels_say():
    speeds = [S.speedup(0.0, g, 0.0) for g in range(6)]
    assert speeds == [1.0] * 6  # alpha 0 with free drafts: every gamma ties
    close = sorted(S.speedup(0.58, g, 0.27) for g in range(12))[-2:]
    assert 0 < close[1] - close[0] < 1e-3
    logits, drafts = checks.GREEDY_CASES[3][1]
    assert (logits == logits.max(dim=-1, keepdim=True).values).sum(-1).min() >= 2  # every row has a tie
    assert checks.greedy_rule(logits, drafts, "ties_last") != S.verify_greedy(logits, drafts)


# -- every mistake a check names shows in a visible case (so on every seed) -----------------------------------

def _exercised(cases, expected_fn, mistakes_fn) -> set:
    seen = set()
    for _, args in cases:
        expected = expected_fn(*args)
        seen |= {name for name, wrong in mistakes_fn(*args).items() if compare(wrong, expected, rtol=1e-9)}
    return seen


def test_every_named_mistake_shows_in_a_visible_case():
    greedy = _exercised(checks.GREEDY_CASES, S.verify_greedy, lambda lg, d: {
        n: checks.greedy_rule(lg, d, kind) for n, kind in checks.GREEDY_MISTAKES.items()})
    assert greedy == set(checks.GREEDY_MISTAKES)
    acc = _exercised(checks.ACCEPT_CASES + checks.PAIR_CASES + checks.ONE_HOT_CASES, S.acceptance_rate, checks.acceptance_mistakes)
    assert acc == set(checks.acceptance_mistakes(*checks.PAIR_CASES[0][1]))
    res = _exercised(checks.PAIR_CASES, S.residual_distribution, checks.residual_mistakes)
    assert res == set(checks.residual_mistakes(*checks.PAIR_CASES[0][1]))
    tok = _exercised(checks.TOKENS_CASES, S.expected_tokens_per_step, checks.tokens_mistakes)
    assert tok == set(checks.tokens_mistakes(0.5, 2))
    spd = _exercised(checks.SPEEDUP_CASES, S.speedup, checks.speedup_mistakes)
    assert spd == set(checks.speedup_mistakes(0.5, 2, 0.1))
    best = _exercised(checks.BEST_CASES, S.best_gamma, checks.best_gamma_mistakes)
    assert best == set(checks.best_gamma_mistakes(0.5, 0.1, 3))
    mod = _exercised(checks.MODELED_CASES, S.modeled_speedup, checks.modeled_mistakes)
    assert mod == set(checks.MODELED_MISTAKES) | set(checks.DRAFT_MISTAKES)
    be = _exercised(checks.BREAK_EVEN_CASES, S.break_even_batch, checks.break_even_mistakes)
    assert be == set(checks.break_even_mistakes(*checks.BREAK_EVEN_CASES[0][1])) | set(
        checks.break_even_mistakes(*checks.BREAK_EVEN_CASES[-1][1]))


# -- 3.4 the verifier inside the engine --------------------------------------------------------------------------

def test_verify_rule_makes_the_engines_draws_and_its_mistakes_differ():
    """The check names a wrong verify by rerunning the engine with verify_rule's variants: the right variant must
    emit exactly what the engine's own verify emits from the same generator state."""
    from reference_engine import spec_decode as sd
    rng = random.Random(5)
    for trial in range(300):
        k, V = rng.randint(1, 4), rng.randint(2, 6)
        p, q = (checks._t(r) for r in _random_pq(rng, k, V))
        drafts = torch.tensor([rng.randrange(V) for _ in range(k)])
        q[torch.arange(k), drafts] = q[torch.arange(k), drafts].clamp(min=0.05)  # a draft is a token q proposes
        q = q / q.sum(-1, keepdim=True)
        ours = checks.verify_rule(p, q, drafts, torch.Generator().manual_seed(trial))
        assert ours == sd.verify(p, q, drafts, torch.Generator().manual_seed(trial))


@pytest.fixture(scope="module")
def engine_runs():
    from autograder.harnesses.engine import run_speculative
    torch.set_num_threads(1)
    prompts = checks._engine_prompts()
    runs = {"plain": run_speculative(prompts, checks.GREEDY_PARAMS, None, checks.ENGINE_K, checks.ENGINE_KW)}
    for proposer in ("draft", "ngram"):
        runs[proposer] = checks._engine(prompts, checks.VISIBLE_PARAMS, proposer)
        runs[proposer, "lesson"] = run_speculative(prompts, checks.VISIBLE_PARAMS, proposer, checks.ENGINE_K,
                                                   checks.ENGINE_KW, verify_greedy=S.verify_greedy, verify=S.verify)
    return prompts, runs


def test_the_engine_cases_chunk_prompts_and_both_keep_and_reject_drafts(engine_runs):
    prompts, runs = engine_runs
    assert max(len(p) for p in prompts) > checks.ENGINE_KW["max_num_batched_tokens"], "no prompt is chunked"
    greedy = checks.VISIBLE_GREEDY
    assert [checks.VISIBLE_PARAMS[i] for i in greedy] == [checks.GREEDY_PARAMS[0]] * len(greedy)
    assert all(checks.VISIBLE_PARAMS[i].get("temperature", 0) > 0 for i in range(len(prompts)) if i not in greedy)
    for proposer in ("draft", "ngram"):
        run = runs[proposer]
        assert run["error"] is None and run["leak"] is None and run["free_blocks"] == run["num_blocks"]
        assert 0 < sum(run["accepted"]) < sum(run["proposed"]), proposer
        assert sum(run["proposed"][i] for i in greedy) > 0, "no greedy request verified a draft"
        for i in greedy:  # the engine's own verifier: the greedy requests are plain greedy decoding
            assert run["tokens"][i] == runs["plain"]["tokens"][i], (proposer, i)


def test_the_lessons_verifier_in_the_harness_equals_the_engines_own(engine_runs):
    """What the check demands of a right answer holds for the lesson's solution, through the harness's adapter."""
    _, runs = engine_runs
    for proposer in ("draft", "ngram"):
        mine, own = runs[proposer, "lesson"], runs[proposer]
        assert (mine["tokens"], checks._counts(mine)) == (own["tokens"], checks._counts(own))


def test_every_engine_mistake_changes_the_visible_runs(engine_runs):
    """Each mistake the check can name gives other tokens or counts than the right rule on the visible draft
    proposer run: a greedy mistake on the greedy requests, a sampling one on the whole batch."""
    prompts, runs = engine_runs
    right, greedy = runs["draft"], checks.VISIBLE_GREEDY
    for name, kind in checks.GREEDY_MISTAKES.items():
        if kind in ("emit_draft", "off_by_one", "no_bonus", "prefix_only"):
            wrong = checks._engine(prompts, checks.VISIBLE_PARAMS, "draft", greedy_kind=kind)
            assert checks._pick(wrong, greedy) != checks._pick(right, greedy), name
    for name, kind in checks.ENGINE_VERIFY_MISTAKES.items():
        wrong = checks._engine(prompts, checks.VISIBLE_PARAMS, "draft", verify_kind=kind)
        assert (wrong["tokens"], checks._counts(wrong)) != (right["tokens"], checks._counts(right)), name


# -- a check grades its own function: a mistake upstream fails only the upstream function's check ----------------

def _mutants(function: str, message: str):
    from tests.mutants import load
    return [m for m in load("l14_speculative_decoding") if function in m.replaces and message in m.message]


@pytest.mark.parametrize("message", ["one term short", "returns 0 at alpha = 0"])
def test_a_wrong_expected_tokens_per_step_fails_only_its_own_check(message, tmp_path):
    """An expected_tokens_per_step mistake: speedup, best_gamma, modeled_speedup and break_even_batch still pass
    (they run on the right upstream values), only expected_tokens_per_step fails."""
    from autograder.runner import grade_lesson
    from tests.test_mutants import mutant_target
    (m,) = _mutants("expected_tokens_per_step", message)
    downstream = ["speedup", "best_gamma", "modeled_speedup", "break_even_batch"]
    results = grade_lesson(m.lesson, mutant_target(m, tmp_path), 0, only=["expected_tokens_per_step", *downstream])
    status = {r.name: r for r in results}
    assert status["expected_tokens_per_step"].status != "passed"
    for name in downstream:
        assert status[name].status == "passed", (name, status[name].message)


def test_a_wrong_speedup_fails_only_its_own_check(tmp_path):
    from autograder.runner import grade_lesson
    from tests.test_mutants import mutant_target
    (m,) = _mutants("speedup", "leaves out the draft's cost")
    results = {r.name: r for r in grade_lesson(m.lesson, mutant_target(m, tmp_path), 0, only=["speedup", "best_gamma"])}
    assert results["speedup"].status != "passed" and results["best_gamma"].status == "passed", results["best_gamma"].message
