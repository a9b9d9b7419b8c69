"""SamplingParams validation, the sampler's filters, seeded reproducibility, top-k=1 == greedy."""
import pytest
import torch

from reference_engine.sampling import SamplingParams, filter_logits, make_generator, sample


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
