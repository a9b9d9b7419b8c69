"""SamplingParams validation, the sampler's filters, seeded reproducibility, top-k=1 == greedy."""
import pytest
import torch

from reference_engine.sampling import SamplingParams, filter_logits, make_generator, sample, sampling_probs, warp_logits


@pytest.mark.parametrize("kw, field", [
    (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=0), "top_k"), (dict(top_k=-2), "top_k"), (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=2.5), "max_tokens"), (dict(n=0), "n"), (dict(seed="x"), "seed"),
    (dict(logprobs=-1), "logprobs"), (dict(stop_token_ids=[-1]), "stop_token_ids"),
])
def test_invalid_params_name_the_field(kw, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}="):
        SamplingParams(**kw)


def test_valid_edge_params():
    SamplingParams(temperature=0, top_p=1.0, top_k=-1, max_tokens=1)
    SamplingParams(temperature=2.0, top_p=1e-6, top_k=1, n=4, seed=0, logprobs=0)


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]] * 3))
    out = filter_logits(logits, top_k=torch.tensor([2, 5, 5]), top_p=torch.tensor([1.0, 0.7, 0.71]))
    kept = torch.isfinite(out)
    assert kept[0].tolist() == [True, True, False, False, False]  # top-k 2
    assert kept[1].tolist() == [True, True, False, False, False]  # 0.5 + 0.2 reaches 0.7
    assert kept[2].tolist() == [True, True, True, False, False]  # 0.71 needs the third
    assert torch.equal(out[kept], logits[kept])


def test_top_p_renormalizes_after_top_k():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    # after top-k 2 the probabilities are 4/7, 3/7: top_p 0.5 keeps only the first
    out = filter_logits(logits, top_k=torch.tensor([2]), top_p=torch.tensor([0.5]))
    assert torch.isfinite(out).tolist() == [[True, False, False, False]]


def test_greedy_and_top_k_1_take_the_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    greedy = sample(logits, [SamplingParams(temperature=0)] * 6, [None] * 6)
    topk1 = sample(logits, [SamplingParams(temperature=1.5, top_k=1)] * 6, [make_generator(i, 0, "cpu") for i in range(6)])
    assert torch.equal(greedy, logits.argmax(-1)) and torch.equal(topk1, greedy)


def test_seeded_sampling_is_reproducible_and_independent_of_batch():
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=1.0, seed=s) for s in (5, 6, 7, 8)]

    def draw(rows):
        gens = [make_generator(params[i].seed, 0, "cpu") for i in rows]
        return sample(logits[rows], [params[i] for i in rows], gens).tolist()

    full = [draw([0, 1, 2, 3]) for _ in range(2)]
    assert full[0] == full[1]
    assert draw([2]) == [full[0][2]]  # a request's draw does not depend on what else is batched


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(3000, 3).contiguous()
    g = make_generator(0, 0, "cpu")
    toks = sample(logits, [SamplingParams(temperature=1.0)] * 3000, [g] * 3000)
    freq = torch.bincount(toks, minlength=3).float() / 3000
    assert torch.allclose(freq, probs, atol=0.03)
    hot = sample(logits, [SamplingParams(temperature=0.2)] * 3000, [g] * 3000)
    assert (hot == 0).float().mean() > 0.95  # low temperature sharpens toward the mode


def test_distinct_streams_for_parallel_samples():
    a, b = make_generator(3, 0, "cpu"), make_generator(3, 1, "cpu")
    assert not torch.equal(torch.rand(8, generator=a), torch.rand(8, generator=b))
    assert make_generator(None, 0, "cpu") is None


# ---- the kept set equals transformers' warpers (TemperatureLogitsWarper -> TopK -> TopP, as generate() chains them)

def _transformers_kept(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Which tokens transformers' warpers leave finite. generate() adds TopK only for top_k > 0 and TopP only for
    top_p < 1, so -1 and 1.0 mean "no filter" there too."""
    lp = pytest.importorskip("transformers.generation.logits_process")
    scores = lp.TemperatureLogitsWarper(float(p.temperature))(None, logits)
    if p.top_k != -1:
        scores = lp.TopKLogitsWarper(p.top_k)(None, scores)
    if p.top_p < 1:
        scores = lp.TopPLogitsWarper(p.top_p)(None, scores)
    return torch.isfinite(scores)


TEMPERATURES = (0.05, 0.7, 1.0, 2.5)
TOP_KS = (-1, 1, 2, 4, 37, 1000, 5000)  # 5000 > vocab: keeps everything
TOP_PS = (1e-6, 0.1, 0.5, 0.9, 0.999, 1 - 1e-7, 1.0)


@pytest.mark.parametrize("scale", [0.1, 3.0, 12.0, 40.0])  # flat to very peaked (tail probabilities underflow)
def test_kept_tokens_equal_transformers_warpers(scale):
    g = torch.Generator().manual_seed(int(scale * 10))
    logits = torch.randn(len(TOP_KS) * len(TOP_PS), 1000, generator=g) * scale
    for t in TEMPERATURES:
        # one batch holding every (top_k, top_p) pair: rows with different filters are filtered together
        params = [SamplingParams(temperature=t, top_k=k, top_p=p) for k in TOP_KS for p in TOP_PS]
        ours = torch.isfinite(warp_logits(logits, params))
        for i, p in enumerate(params):
            want = _transformers_kept(logits[i:i + 1], p)[0]
            assert torch.equal(ours[i], want), (
                f"temperature={t}, top_k={p.top_k}, top_p={p.top_p}, logit scale {scale}: kept {int(ours[i].sum())} "
                f"tokens, transformers keeps {int(want.sum())}")


def test_top_p_one_with_top_k_keeps_all_k_on_peaked_logits():
    """top_p = 1.0 is no top-p filter: with top_k = 4 exactly the 4 most likely tokens stay, even when float32
    rounding puts the probability mass of the first two at 1.0."""
    logits = torch.randn(300, 1000, generator=torch.Generator().manual_seed(0)) * 12
    out = warp_logits(logits, [SamplingParams(temperature=1.0, top_k=4, top_p=1.0)] * 300)
    kept = torch.isfinite(out)
    assert kept.sum(-1).tolist() == [4] * 300
    assert torch.equal(kept, torch.zeros_like(kept).scatter(-1, logits.topk(4).indices, True))


def test_top_k_keeps_ties_and_top_p_keeps_the_crossing_token_like_transformers():
    # integer logits: many ties at the top-k boundary; tie order is arbitrary, so compare the kept values
    logits = torch.randn(40, 64, generator=torch.Generator().manual_seed(3)).mul(2).round()
    for k in (1, 3, 10):
        for p in (0.3, 0.8, 1.0):
            sp = SamplingParams(temperature=1.0, top_k=k, top_p=p)
            ours = torch.isfinite(warp_logits(logits, [sp] * 40))
            for i in range(40):
                want = _transformers_kept(logits[i:i + 1], sp)[0]
                assert sorted(logits[i][ours[i]].tolist()) == sorted(logits[i][want].tolist()), (k, p, i)
    # the token whose probability crosses top_p stays: 0.5 before it < 0.6
    two = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    assert torch.isfinite(warp_logits(two, [SamplingParams(top_p=0.6)])).tolist() == [[True, True, False]]
    # one-token vocabulary, and top_p below the top token's probability: the top token alone stays
    assert torch.isfinite(warp_logits(torch.zeros(1, 1), [SamplingParams(top_p=1e-6, top_k=3)])).all()
    assert torch.isfinite(warp_logits(two, [SamplingParams(top_p=1e-6)])).tolist() == [[True, False, False]]


def test_sampling_probs_is_what_sample_draws_from():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.5, top_k=5), SamplingParams(top_p=0.8)]
    probs = sampling_probs(logits, params)
    assert torch.allclose(probs.sum(-1), torch.ones(3))
    assert probs[0].argmax() == logits[0].argmax() and probs[0].max() == 1  # greedy: one-hot
    assert (probs[1] > 0).sum() == 5
    torch.testing.assert_close(probs[1], (warp_logits(logits[1:2], params[1:2])[0]).softmax(-1))
    g = make_generator(0, 0, "cpu")
    draws = sample(logits[1:2].expand(4000, 20).contiguous(), [params[1]] * 4000, [g] * 4000)
    freq = torch.bincount(draws, minlength=20).float() / 4000
    assert torch.allclose(freq, probs[1], atol=0.03)
