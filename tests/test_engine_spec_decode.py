"""Speculative decoding in the engine (reference_engine/spec_decode.py): draft-model and prompt-lookup (ngram)
proposers, verification in the normal step, rollback of rejected drafts, the pluggable verifier, the metrics.

What must hold: greedy speculation emits exactly plain greedy's tokens; sampled speculation emits exactly the
target's distribution; rejected drafts leave no trace in the sequence, its KV blocks or the draft's cache.
"""
import itertools
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine import LLM, LLMEngine, SamplingParams
from reference_engine import spec_decode as sd
from reference_engine.sampling import warp_logits
from reference_engine.sim.gpu_model import H100, LLAMA_3_8B, Composition, ModeledClock, step_time

transformers = pytest.importorskip("transformers")
from reference_engine.shipped import DRAFT, TARGET  # noqa: E402
from reference_engine.tools.testing import drive_events, save_tiny_model, tiny_hf_model  # noqa: E402

GREEDY = dict(temperature=0, ignore_eos=True)
K = 4
DRAFT_CFG = {"model": DRAFT, "num_speculative_tokens": K}
NGRAM_CFG = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
CODE = '''def merge(intervals):
    """Merge overlapping intervals."""
    intervals = sorted(intervals, key=lambda x: x[0])
    out = []
    for start, end in intervals:
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()
'''


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one intra-op thread. Two threads on a shared, loaded machine made these tests 10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def generate(llm, prompts, **kw):
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(**{**GREEDY, **kw}))]


@pytest.fixture(scope="module")
def shipped_prompts():
    """19 token windows of 10 to 45 tokens over CODE, and plain greedy's 20 tokens after each."""
    llm = LLM(TARGET, dtype="float32", max_num_seqs=8)
    ids = llm.tokenizer.encode(CODE)
    prompts = [ids[(i * 37) % (len(ids) - 50):][:10 + (i * 7) % 36] for i in range(19)]
    return prompts, generate(llm, prompts, max_tokens=20)


# ---- greedy: token for token what plain greedy decoding emits -------------------------------------------

@pytest.mark.parametrize("batch", range(1, 17))
@pytest.mark.parametrize("cfg", [DRAFT_CFG, NGRAM_CFG], ids=["draft", "ngram"])
def test_greedy_speculation_equals_plain_greedy(shipped_prompts, cfg, batch):
    prompts, want = shipped_prompts
    n = batch + 3  # more requests than slots: later ones join as earlier ones finish
    # a 32-token budget chunks the prompts (up to 45 tokens) and, at 16 running, cuts the drafts to fit
    llm = LLM(TARGET, dtype="float32", max_num_seqs=batch, max_num_batched_tokens=32, speculative_config=cfg)
    assert generate(llm, prompts[:n], max_tokens=20) == want[:n]
    stats = llm.engine.step_stats
    assert any(0 < s.num_prefill_tokens and s.num_decode_tokens for s in stats) or batch == 1
    assert sum(s.num_prefill_tokens for s in stats) == sum(map(len, prompts[:n]))  # no preemption, chunks add up
    assert all(s.num_prefill_tokens + s.num_decode_tokens <= 32 for s in stats)
    accepted = sum(s.num_accepted_tokens for s in stats)
    assert accepted > 0, "no draft was ever accepted: the test did not exercise speculation"
    # each prompt's last chunk emits one token, each decode step one of the target's own plus the kept drafts
    assert n + sum(s.num_decode_seqs for s in stats) + accepted == 20 * n


def test_tokens_per_step_and_metrics_add_up(shipped_prompts):
    prompts, want = shipped_prompts
    llm = LLM(TARGET, dtype="float32", max_num_seqs=4, speculative_config=DRAFT_CFG)
    outs = llm.generate(prompts[:4], SamplingParams(max_tokens=20, **GREEDY))
    assert [o.token_ids for o in outs] == want[:4]
    stats = llm.engine.step_stats
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert sum(getattr(o.metrics, key) for o in outs) == sum(getattr(s, key) for s in stats), key
    for o in outs:
        m = o.metrics
        assert 0 < m.num_drafts and m.num_accepted_tokens <= m.num_draft_tokens <= K * m.num_drafts
        assert m.acceptance_rate == m.num_accepted_tokens / m.num_draft_tokens
        assert m.tokens_per_step == 1 + m.num_accepted_tokens / m.num_drafts
        # 20 tokens: the prefill's, one per verifying step plus its kept drafts, one per plain decode step
        # (when max_tokens leaves no room for a draft)
        assert 1 + m.num_drafts + m.num_accepted_tokens <= 20 == len(m.token_times)
    assert 4 + sum(s.num_decode_seqs for s in stats) + sum(s.num_accepted_tokens for s in stats) == 4 * 20


# ---- sampling: the emitted distribution is the target's -------------------------------------------------

V, STAT_PROMPT, STAT_TOKENS = 4, [1, 3, 0, 2, 1], 4


def _save_small(path, seed):
    """A 1-layer random Llama with a 4-token vocabulary; lm_head scaled so distributions are far from uniform."""
    model = tiny_hf_model("llama", seed, vocab_size=V, num_hidden_layers=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(path))
    return str(path), model


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    target, hf = _save_small(tmp_path_factory.mktemp("small_target"), seed=1)
    draft, _ = _save_small(tmp_path_factory.mktemp("small_draft"), seed=2)
    return target, draft, hf


def exact_joint(hf, params: SamplingParams) -> dict:
    """P(first STAT_TOKENS generated tokens) under the target's sampler (temperature, top-k via the engine's
    warp_logits, itself tested against transformers' warpers), from one batched forward over every prefix."""
    rest = list(itertools.product(range(V), repeat=STAT_TOKENS - 1))
    with torch.no_grad():
        logits = hf(torch.tensor([STAT_PROMPT + list(r) for r in rest])).logits[:, len(STAT_PROMPT) - 1:]
    n = logits.shape[1]
    lp = torch.log_softmax(warp_logits(logits.reshape(-1, V), [params] * (len(rest) * n)).double(), -1)
    lp = lp.reshape(len(rest), n, V)
    joint = {}
    for i, r in enumerate(rest):
        head = sum(lp[i, j, r[j]] for j in range(len(r)))
        for last in range(V):
            joint[r + (last,)] = float((head + lp[i, -1, last]).exp())
    return joint


def chi_square_p(counts: Counter, joint: dict, n: int) -> float:
    """Pearson chi-square goodness of fit; cells expecting < 5 draws pooled into one. Returns the p-value."""
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for x, p in joint.items():
        if p * n < 5:
            pool_o, pool_e = pool_o + counts.get(x, 0), pool_e + p * n
        else:
            obs.append(counts.get(x, 0))
            exp.append(p * n)
    if pool_e:
        obs.append(pool_o)
        exp.append(pool_e)
    o, e = torch.tensor(obs, dtype=torch.float64), torch.tensor(exp, dtype=torch.float64)
    chi2, df = float(((o - e) ** 2 / e).sum()), len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(chi2 / 2)))


def sample_many(path, cfg, params_kw, n, seed0=0):
    eng = LLMEngine(path, max_num_seqs=256, max_num_batched_tokens=2048, speculative_config=cfg)
    for i in range(n):
        eng.add_request(STAT_PROMPT, SamplingParams(seed=seed0 + i, max_tokens=STAT_TOKENS, ignore_eos=True, **params_kw))
    outs = []
    while eng.has_unfinished():
        outs += [o.output for o in eng.step() if o.output is not None]
    return Counter(tuple(o.token_ids) for o in outs), eng


ALPHA = 1e-3  # false-alarm rate: a correct engine fails this test for one in 1,000 choices of seeds


@pytest.mark.parametrize("method,params_kw", [("draft", dict(temperature=1.0)), ("ngram", dict(temperature=0.7, top_k=3))])
def test_sampled_speculation_has_the_targets_distribution(small, method, params_kw):
    """3,000 seeded requests, 4 tokens each: token 1 from the prefill, tokens 2-4 from one or two verifying
    steps (k = 2 drafts: the cap leaves room for the bonus token). Their joint (256 cells) must fit the exact
    target distribution: chi-square p-value >= ALPHA. The seeds are fixed, so the outcome is too."""
    target, draft, hf = small
    cfg = {"model": draft, "num_speculative_tokens": 3} if method == "draft" else \
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    n = 3000
    counts, eng = sample_many(target, cfg, params_kw, n)
    stats = eng.step_stats
    drafted, kept = sum(s.num_draft_tokens for s in stats), sum(s.num_accepted_tokens for s in stats)
    assert drafted >= 2 * n and 0.1 * drafted < kept < 0.9 * drafted, "acceptance and rejection both happen often"
    p = chi_square_p(counts, exact_joint(hf, SamplingParams(**params_kw)), n)
    assert p >= ALPHA, f"speculative samples do not follow the target's distribution (chi-square p = {p:.2e})"


class ResampleFromTarget:
    """A wrong rejection sampler: after a rejection it draws from p instead of norm(max(0, p - q))."""
    verify_greedy = staticmethod(sd.verify_greedy)

    @staticmethod
    def verify(p, q, drafts, g):
        out = []
        for i, x in enumerate(drafts.tolist()):
            if torch.rand((), generator=g, dtype=p.dtype) < p[i, x] / q[i, x]:
                out.append(x)
                continue
            return out + [int(torch.multinomial(p[i], 1, generator=g))]
        return out + [int(torch.multinomial(p[-1], 1, generator=g))]


def test_the_distribution_test_catches_a_wrong_residual(small):
    """The same test has the power to see a subtle mistake: 1,000 samples suffice to reject it at p < 1e-6."""
    target, draft, hf = small
    cfg = {"model": draft, "num_speculative_tokens": 3, "verifier": ResampleFromTarget()}
    counts, _ = sample_many(target, cfg, dict(temperature=1.0), 1000)
    assert chi_square_p(counts, exact_joint(hf, SamplingParams(temperature=1.0)), 1000) < 1e-6


# ---- the pluggable verifier --------------------------------------------------------------------------------

class AlwaysReject:
    """Keeps no draft: emits the target's own token at the first position (what plain decoding emits)."""

    def verify_greedy(self, logits, drafts):
        return [int(logits[0].argmax())]

    def verify(self, p, q, drafts, g):
        return [int(torch.multinomial(p[0], 1, generator=g))]


class LessonVerifier:
    """Lesson 14's contract written out independently: the same draws in the same order as the engine's."""

    def verify_greedy(self, logits, drafts):
        out = []
        for i, x in enumerate(drafts.tolist()):
            out.append(int(torch.argmax(logits[i])))
            if out[-1] != x:
                return out
        return out + [int(torch.argmax(logits[len(drafts)]))]

    def verify(self, p, q, drafts, g):
        out = []
        for i, x in enumerate(drafts.tolist()):
            u = torch.rand((), generator=g, dtype=p.dtype)
            if u < p[i, x] / q[i, x]:
                out.append(x)
                continue
            res = (p[i] - q[i]).clamp(min=0)
            res = res / res.sum() if res.sum() > 0 else p[i]
            return out + [int(torch.multinomial(res, 1, generator=g))]
        return out + [int(torch.multinomial(p[len(drafts)], 1, generator=g))]


@pytest.mark.parametrize("cfg", [DRAFT_CFG, NGRAM_CFG], ids=["draft", "ngram"])
def test_a_verifier_that_always_rejects_gives_plain_greedy_one_token_per_step(shipped_prompts, cfg):
    prompts, want = shipped_prompts
    llm = LLM(TARGET, dtype="float32", max_num_seqs=4, speculative_config={**cfg, "verifier": AlwaysReject()})
    outs = llm.generate(prompts[:6], SamplingParams(max_tokens=20, **GREEDY))
    assert [o.token_ids for o in outs] == want[:6]
    stats = llm.engine.step_stats
    assert sum(s.num_draft_tokens for s in stats) > 0 and sum(s.num_accepted_tokens for s in stats) == 0
    assert all(o.metrics.tokens_per_step == 1.0 for o in outs)
    assert all(s.num_decode_seqs == 0 or s.num_decode_tokens >= s.num_decode_seqs for s in stats)


@pytest.mark.parametrize("cfg", [DRAFT_CFG, NGRAM_CFG], ids=["draft", "ngram"])
def test_a_verifier_equal_to_the_engines_gives_identical_tokens(shipped_prompts, cfg):
    prompts, _ = shipped_prompts
    params = [SamplingParams(temperature=0.8, top_p=0.95, seed=i, max_tokens=16, ignore_eos=True) for i in range(5)]
    params += [SamplingParams(max_tokens=16, **GREEDY)]
    runs = []
    for verifier in (None, LessonVerifier(), sd):  # the engine's own, a re-implementation, the module itself
        spec = {**cfg, "verifier": verifier} if verifier is not None else cfg
        llm = LLM(TARGET, dtype="float32", max_num_seqs=6, speculative_config=spec)
        outs = llm.generate(prompts[:6], params)
        runs.append([(o.token_ids, o.metrics.num_accepted_tokens) for o in outs])
    assert runs[0] == runs[1] == runs[2]
    assert sum(acc for _, acc in runs[0]) > 0


@pytest.mark.parametrize("answer,match", [
    (lambda logits, drafts: [], "0 tokens"),
    (lambda logits, drafts: [int(d) + 1 for d in drafts] + [0], "must be a kept draft"),
    (lambda logits, drafts: drafts.tolist() + [0, 0], "tokens for"),
    (lambda logits, drafts: [99999], "outside the vocabulary"),
    (lambda logits, drafts: ["a"], "Python int"),
])
def test_a_broken_verifier_fails_loudly(shipped_prompts, answer, match):
    prompts, _ = shipped_prompts

    class Broken:
        verify_greedy = staticmethod(answer)
        verify = staticmethod(lambda *args: None)  # not reached: the requests are greedy
    llm = LLM(TARGET, dtype="float32", speculative_config={**NGRAM_CFG, "verifier": Broken()})
    with pytest.raises(RuntimeError, match=match):
        llm.generate(prompts[0] * 3, SamplingParams(max_tokens=10, **GREEDY))


# ---- rollback, preemption, seeds, n > 1, logprobs ------------------------------------------------------------

def test_preemption_discards_drafts_and_keeps_greedy_output(shipped_prompts):
    prompts, want = shipped_prompts
    # 8 blocks of 16 tokens for 6 sequences of up to 65 tokens: sequences are preempted and recomputed
    llm = LLM(TARGET, dtype="float32", max_num_seqs=6, num_blocks=8, max_num_batched_tokens=64, speculative_config=DRAFT_CFG)
    assert generate(llm, prompts[:6], max_tokens=20) == want[:6]
    eng = llm.engine
    assert sum(s.num_preempted for s in eng.step_stats) > 0, "the small cache should have forced preemption"
    eng.block_manager.check_consistency([])
    eng.spec.proposer.check_consistency()
    assert eng.spec.proposer.bm.num_free() == eng.spec.proposer.bm.num_blocks and not eng.spec.pending


def test_the_draft_models_cache_stays_in_step_with_the_sequence(shipped_prompts):
    """After rollbacks, the draft model's proposals are still its own greedy continuation of the true context:
    its cache holds exactly the kept tokens (a stale rejected draft in it would change them)."""
    prompts, _ = shipped_prompts
    llm = LLM(TARGET, dtype="float32", max_num_seqs=3, speculative_config=DRAFT_CFG)
    proposer, seen = llm.engine.spec.proposer, []
    propose = proposer.propose

    def recording(seqs, ks):
        contexts = [list(s.token_ids) for s in seqs]
        proposals = propose(seqs, ks)
        seen.extend((c, d) for c, (d, _) in zip(contexts, proposals))
        return proposals

    proposer.propose = recording
    llm.generate(prompts[:3], SamplingParams(max_tokens=20, **GREEDY))
    stats = llm.engine.step_stats
    assert sum(s.num_accepted_tokens for s in stats) < sum(s.num_draft_tokens for s in stats), "no rejection happened"
    draft = LLM(DRAFT, dtype="float32", max_num_seqs=8)
    want = [o.token_ids for o in draft.generate([c for c, _ in seen], [SamplingParams(max_tokens=len(d), **GREEDY)
                                                                       for _, d in seen])]
    assert [d for _, d in seen] == want


def test_a_full_draft_cache_means_fewer_drafts_not_an_error(shipped_prompts):
    from reference_engine.block_manager import BlockAllocator, BlockManager

    prompts, want = shipped_prompts
    llm = LLM(TARGET, dtype="float32", max_num_seqs=4, speculative_config=DRAFT_CFG)
    llm.engine.spec.proposer.bm = BlockManager(BlockAllocator(5), 16, 5)  # room for about one sequence's draft
    assert generate(llm, prompts[:4], max_tokens=20) == want[:4]
    stats = llm.engine.step_stats
    assert any(s.num_drafts for s in stats) and any(s.num_decode_seqs > s.num_drafts for s in stats)
    assert llm.engine.spec.proposer.bm.num_free() == 5


@pytest.mark.parametrize("cfg", [DRAFT_CFG, NGRAM_CFG], ids=["draft", "ngram"])
def test_speculation_with_prefix_caching_and_preemption_keeps_greedy_output(cfg):
    """Rolled-back drafts never reach the prefix cache: only computed, kept tokens' full blocks are cached."""
    plain = LLM(TARGET, dtype="float32")
    ids = plain.tokenizer.encode(CODE)
    prompts = [ids[:40] + ids[60 + 13 * i:][:10] for i in range(6)] * 2  # a shared 40-token prefix, each twice
    want = generate(plain, prompts, max_tokens=24)
    llm = LLM(TARGET, dtype="float32", enable_prefix_caching=True, max_num_seqs=4, num_blocks=12,
              max_num_batched_tokens=32, speculative_config=cfg)
    assert generate(llm, prompts, max_tokens=24) == want
    eng = llm.engine
    assert eng.prefix_cache_stats.hits > 0 and sum(s.num_preempted for s in eng.step_stats) > 0
    assert sum(s.num_accepted_tokens for s in eng.step_stats) > 0
    eng.block_manager.check_consistency([])


def test_seeded_speculation_is_reproducible_alone_or_batched(shipped_prompts):
    prompts, _ = shipped_prompts
    sp = SamplingParams(temperature=1.0, seed=7, max_tokens=24, ignore_eos=True)
    alone = LLM(TARGET, dtype="float32", speculative_config=DRAFT_CFG).generate(prompts[3], sp)[0].token_ids
    others = [SamplingParams(temperature=0.9, seed=i, max_tokens=30, ignore_eos=True) for i in range(4)]
    batched = LLM(TARGET, dtype="float32", speculative_config=DRAFT_CFG).generate(prompts[:3] + [prompts[3]] + prompts[4:5],
                                                                                   others[:3] + [sp] + others[3:])
    assert batched[3].token_ids == alone


def test_parallel_samples_and_logprobs_with_speculation(shipped_prompts):
    prompts, want = shipped_prompts
    llm = LLM(TARGET, dtype="float32", speculative_config=NGRAM_CFG)
    [out] = llm.generate(prompts[2], SamplingParams(n=3, max_tokens=20, logprobs=2, **GREEDY))
    assert [c.token_ids for c in out.outputs] == [want[2]] * 3
    full = llm.engine.score(prompts[2] + want[2])
    for i, (tok, lp) in enumerate(zip(want[2], out.outputs[0].logprobs)):
        ref = torch.log_softmax(full[len(prompts[2]) - 1 + i], -1)
        assert tok in lp and len(lp) <= 3
        assert lp[tok] == pytest.approx(float(ref[tok]), abs=1e-4)


def test_drafts_are_capped_by_max_tokens_and_the_cache():
    llm = LLM(TARGET, dtype="float32", max_model_len=40, speculative_config=NGRAM_CFG)
    ids = llm.tokenizer.encode("a = 1\na = 1\na = 1\na = 1\na = 1\n")
    [out] = llm.generate(ids, SamplingParams(max_tokens=100, **GREEDY))
    assert len(ids) + len(out.token_ids) == 40 and out.finish_reason == "length"
    [out] = llm.generate(ids[:10], SamplingParams(max_tokens=7, **GREEDY))
    assert len(out.token_ids) == 7


def test_ngram_lookup_takes_the_longest_then_earliest_match():
    ng = sd.NgramProposer(prompt_lookup_max=3, prompt_lookup_min=2)
    assert ng.lookup([1, 2, 3, 4, 2, 3], 4) == [4, 2, 3]  # vLLM's example: [4, 2, 3] unmatched, [2, 3] matches
    assert ng.lookup([5, 2, 3, 9, 1, 2, 3, 7, 2, 3], 2) == [9, 1]  # earliest of the two [2, 3] occurrences
    assert ng.lookup([1, 2, 3, 8, 2, 3, 1, 2, 3], 3) == [8, 2, 3]  # [1, 2, 3] (n = 3) beats the earlier [2, 3]
    assert ng.lookup([1, 2, 3, 4], 3) == [] and ng.lookup([7], 3) == []
    assert sd.NgramProposer(1, 1).lookup([4, 4, 4], 5) == [4, 4]  # the occurrence may overlap the suffix


def test_speculative_config_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="unknown keys"):
        LLM(TARGET, speculative_config={"model": DRAFT, "num_speculative_tokens": 2, "draft_tp": 1})
    with pytest.raises(ValueError, match="needs 'model'"):
        LLM(TARGET, speculative_config={"num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(TARGET, speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        LLM(TARGET, speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2,
                                        "prompt_lookup_min": 3})
    with pytest.raises(TypeError, match="verify_greedy"):
        LLM(TARGET, speculative_config={**NGRAM_CFG, "verifier": object()})
    other, _ = save_tiny_model(tmp_path / "other", "llama", seed=0)  # vocabulary 256, not 2048
    with pytest.raises(ValueError, match="vocab_size"):
        LLM(TARGET, speculative_config={"model": str(other), "num_speculative_tokens": 2})
    cfg = sd.SpeculativeConfig.from_dict({"model": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4})
    assert (cfg.method, cfg.prompt_lookup_min, cfg.prompt_lookup_max) == ("ngram", 4, 4)  # vLLM's defaulting


# ---- the modeled clock charges the k + 1 verified rows -------------------------------------------------

def test_modeled_clock_charges_lm_head_for_every_verified_row(shipped_prompts):
    prompts, _ = shipped_prompts
    clock = ModeledClock(LLAMA_3_8B, H100)
    llm = LLM(TARGET, dtype="float32", clock=clock, speculative_config=DRAFT_CFG)
    llm.generate(prompts[:2], SamplingParams(max_tokens=12, **GREEDY))
    verify_steps = [t for t in clock.steps if t.composition.logit_rows is not None]
    assert verify_steps, "no step verified drafts"
    for t in verify_steps:
        c = t.composition
        assert c.logit_rows == len(c.decodes) + sum(n for n, _ in c.prefills)  # every token of a chunk is a row
        plain = step_time(LLAMA_3_8B, H100, Composition(c.prefills, c.decodes))
        assert t.kernel("lm_head").flops > plain.kernel("lm_head").flops and t.time_s > plain.time_s
    assert Composition(((5, 10),), logit_rows=1) == Composition(((5, 10),))  # the default is one row per sequence


# ---- no leaks: random request streams with speculation on -------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    # 8 token ids: n-grams recur in prompts and outputs alike, so prompt lookup drafts often
    target, _ = save_tiny_model(tmp_path_factory.mktemp("tiny_t"), "llama", seed=3, num_hidden_layers=1, vocab_size=8)
    draft, _ = save_tiny_model(tmp_path_factory.mktemp("tiny_d"), "llama", seed=4, num_hidden_layers=1, vocab_size=8)
    return str(target), str(draft)


events = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 60), st.integers(1, 25), st.integers(1, 2), st.booleans()),
    st.tuples(st.just("abort"), st.integers(0, 100)),
    st.tuples(st.just("step"), st.integers(1, 4)),
), min_size=1, max_size=25)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=events, method=st.sampled_from(["draft", "ngram"]), k=st.integers(1, 5), num_blocks=st.integers(5, 12),
       block_size=st.sampled_from([4, 16]), budget=st.sampled_from([8, 32]))
def test_request_streams_with_speculation_never_leak_blocks(tiny_pair, events, method, k, num_blocks, block_size, budget):
    target, draft = tiny_pair
    cfg = {"model": draft, "num_speculative_tokens": k} if method == "draft" else \
        {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    eng = LLMEngine(target, num_blocks=num_blocks, block_size=block_size, max_num_seqs=4, max_num_batched_tokens=budget,
                    speculative_config=cfg)
    bm, sched, spec, g = eng.block_manager, eng.scheduler, eng.spec, torch.Generator().manual_seed(0)

    def check():
        bm.check_consistency(sched.running + list(sched.waiting))
        spec.proposer.check_consistency()
        assert not spec.pending, "drafts outlived their step"
        for s in sched.running:  # rolled back: one uncomputed token (or prompt left), blocks cover the cache
            assert len(s.block_table) == -(-s.num_computed_tokens // block_size)
            assert s.num_uncomputed_tokens == 1 or s.in_prefill
        assert all(s.block_table == [] for s in sched.waiting)

    def add(ev, i):
        _, plen, max_tokens, n, sampled = ev
        plen = min(plen, eng.max_seq_len - 1)
        prompt = torch.randint(0, 8, (plen,), generator=g).tolist()
        sp = SamplingParams(n=n, temperature=1.0 if sampled else 0, seed=i, max_tokens=max_tokens, ignore_eos=True)
        return eng.add_request(prompt, sp)

    drive_events(eng, events, add, check)
    assert bm.num_free() == num_blocks and not eng.requests
    if method == "draft":
        assert spec.proposer.bm.num_free() == spec.proposer.bm.num_blocks and not spec.proposer.states


def test_the_modeled_clock_prices_the_draft_forwards_at_draft_shape():
    """On a ModeledClock every forward of the draft model is priced (at draft_shape) or, without a
    draft_shape, counted as not priced; the tokens do not depend on the clock."""
    from reference_engine.sim import gpu_model as gm
    prompts = [[5 + i + j for j in range(30)] for i in range(3)]
    runs = {}
    for draft_shape in (None, gm.LLAMA_3_2_1B):
        kw = gm.engine_kwargs(gm.LLAMA_3_8B, gm.CHIPS["H100"], max_blocks=None, draft_shape=draft_shape)
        kw["num_blocks"] = 64
        llm = LLM(TARGET, dtype="float32", speculative_config=DRAFT_CFG, **kw)
        runs[draft_shape] = (generate(llm, prompts, max_tokens=12), kw["clock"])
    (plain_tokens, free), (tokens, priced) = runs[None], runs[gm.LLAMA_3_2_1B]
    assert tokens == plain_tokens
    assert free.uncharged_draft_forwards > 0 and not free.draft_steps
    assert len(priced.draft_steps) == free.uncharged_draft_forwards and priced.uncharged_draft_forwards == 0
    target = sum(s.time_s for s in priced.steps)
    assert priced.now == pytest.approx(target + sum(s.time_s for s in priced.draft_steps))
    assert free.now == pytest.approx(sum(s.time_s for s in free.steps))
    assert all(s.overhead_s == 0 for s in priced.draft_steps)


def test_verification_rows_run_on_the_split_context_triton_kernel(shipped_prompts, monkeypatch):
    """With the Triton backend (the interpreter here), a speculative step's gamma + 1 rows a sequence go to the
    flash-decoding kernel as short queries (cu_seqlens_q), and greedy speculation still emits plain greedy's tokens."""
    pytest.importorskip("triton")
    from reference_engine.kernels import triton_kernels
    tk = triton_kernels()
    calls = Counter()
    real = tk.flash_decode_triton

    def counting(*args, cu_seqlens_q=None, **kw):
        calls["verify" if cu_seqlens_q is not None else "decode"] += 1
        return real(*args, cu_seqlens_q=cu_seqlens_q, **kw)
    monkeypatch.setattr(tk, "flash_decode_triton", counting)
    prompts, want = shipped_prompts
    llm = LLM(TARGET, dtype="float32", max_num_seqs=2, attention_backend="triton", speculative_config=NGRAM_CFG)
    assert generate(llm, prompts[:2], max_tokens=8) == [w[:8] for w in want[:2]]
    assert calls["verify"] > 0 and sum(s.num_accepted_tokens for s in llm.engine.step_stats) > 0
