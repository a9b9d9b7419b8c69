"""Several logit rows per sequence (Sequence.num_logits): what speculative decoding's verification reads.

The rows step() returns must equal a plain forward of the model (transformers') over the same tokens, whatever
else is batched and however the rows' tokens are chunked; the next token is sampled from the last row.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from reference_engine import LLMEngine, SamplingParams  # noqa: E402
from reference_engine.sampling import sampling_probs  # noqa: E402
from reference_engine.tools.testing import save_tiny_model  # noqa: E402

GREEDY = dict(temperature=0, ignore_eos=True)
TOL = dict(atol=2e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", seed=5, num_key_value_heads=2)


def plain_logits(hf, token_ids) -> torch.Tensor:
    """[len(token_ids), vocab]: row i scores the token after token_ids[i]."""
    with torch.no_grad():
        return hf(torch.tensor([token_ids])).logits[0]


def ids(n, seed):
    return torch.randint(1, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def step_until(eng, rid, limit=50):
    """Step until request rid gets a StepOutput; returns it and every output of those steps."""
    seen = []
    for _ in range(limit):
        outs = eng.step()
        seen += outs
        mine = [o for o in outs if o.request_id == rid]
        if mine:
            return mine[0], seen
    raise AssertionError(f"request {rid} produced nothing in {limit} steps")


@pytest.mark.parametrize("budget", [64, 3])  # 3: the 4 verified tokens are split over chunks (the rows are kept)
def test_verifying_drafts_returns_each_positions_logits(tiny, budget):
    path, hf = tiny
    eng = LLMEngine(path, max_num_seqs=2, max_num_batched_tokens=budget)
    a = eng.add_request(ids(13, 1), SamplingParams(max_tokens=40, **GREEDY))
    b = eng.add_request(ids(20, 2), SamplingParams(max_tokens=40, **GREEDY))
    seq_a, seq_b = eng.requests[a][0], eng.requests[b][0]
    while not (seq_a.num_output_tokens and seq_b.num_output_tokens):  # until both are decoding
        eng.step()
    first = len(eng.step_stats)
    drafts = ids(3, 3)
    seq_a.token_ids += drafts  # k = 3 draft tokens after the last sampled one
    seq_a.num_logits = len(drafts) + 1
    tokens_a, tokens_b = list(seq_a.token_ids), list(seq_b.token_ids)
    out_a, seen = step_until(eng, a)
    assert (len(eng.step_stats) - first > 1) == (budget < 4 + 1)  # budget 3: chunks of 2 beside b's decode
    outs_b = [o for o in seen if o.request_id == b]
    want_a = plain_logits(hf, tokens_a)[-4:]  # positions of the last sampled token and the 3 drafts
    assert out_a.logits is not None and out_a.logits.shape == want_a.shape
    torch.testing.assert_close(out_a.logits, want_a, **TOL)
    assert out_a.new_token_ids == [int(want_a[-1].argmax())]  # sampled from the row after the last draft
    assert seq_a.token_ids == tokens_a + out_a.new_token_ids
    # b, decoding in the same steps, sampled each of its tokens from its own row
    assert outs_b and all(o.logits is None for o in outs_b)
    want_b = plain_logits(hf, seq_b.token_ids[:-1])
    for i in range(len(tokens_b), len(seq_b.token_ids)):
        assert seq_b.token_ids[i] == int(want_b[i - 1].argmax())
    # one step only: afterwards a is a plain decode again
    assert seq_a.num_logits == 1 and seq_a.kept_logits == []
    nxt, _ = step_until(eng, a)
    assert nxt.logits is None and nxt.new_token_ids == [int(plain_logits(hf, seq_a.token_ids[:-1])[-1].argmax())]
    stats = eng.step_stats
    assert all(s.num_prefill_tokens == 0 for s in stats[first:])  # verification is decoding, not prefill


def test_prompt_rows_over_chunks_equal_a_plain_forward(tiny):
    """num_logits = prompt length: every prompt position's row, gathered over 6 chunks of a 4-token budget."""
    path, hf = tiny
    eng = LLMEngine(path, max_num_seqs=2, max_num_batched_tokens=4)
    prompt = ids(22, 4)
    rid = eng.add_request(prompt, SamplingParams(max_tokens=3, **GREEDY))
    eng.requests[rid][0].num_logits = len(prompt)
    out, _ = step_until(eng, rid)
    assert len([s for s in eng.step_stats if s.num_prefill_tokens]) == 6
    want = plain_logits(hf, prompt)
    torch.testing.assert_close(out.logits, want, **TOL)
    assert out.new_token_ids == [int(want[-1].argmax())]


def test_rows_survive_a_preemption_and_n_samples_share_them(tiny):
    """A sequence preempted between its chunks recomputes its rows (no stale or doubled rows); with n = 2 both
    samples report the prompt's rows and draw their first token from its last row."""
    path, hf = tiny
    eng = LLMEngine(path, max_num_seqs=3, num_blocks=6, block_size=16, max_num_batched_tokens=8)
    eng.add_request(ids(46, 6), SamplingParams(max_tokens=60, **GREEDY))  # grows into the blocks the other holds
    prompt = ids(40, 7)
    rid = eng.add_request(prompt, SamplingParams(n=2, max_tokens=5, **GREEDY))
    seq = eng.requests[rid][0]
    seq.num_logits = len(prompt)
    outs, dropped = [], False
    while not any(o.request_id == rid for o in outs):
        kept = len(seq.kept_logits)
        outs += eng.step()
        dropped |= bool(kept and eng.step_stats[-1].num_preempted and seq.num_computed_tokens == 0)
    assert dropped, "the 6-block cache should have preempted the prompt while it held rows of earlier chunks"
    mine = [o for o in outs if o.request_id == rid]
    want = plain_logits(hf, prompt)
    assert [o.index for o in mine] == [0, 1]
    for o in mine:
        torch.testing.assert_close(o.logits, want, **TOL)
        assert o.new_token_ids == [int(want[-1].argmax())]


def test_num_logits_only_reaches_tokens_the_next_step_computes(tiny):
    path, _ = tiny
    eng = LLMEngine(path)
    rid = eng.add_request(ids(5, 8), SamplingParams(max_tokens=4, **GREEDY))
    seq = eng.requests[rid][0]
    seq.num_logits = 5
    with pytest.raises(ValueError, match=r"num_logits=6 .* 1 \.\. 5"):
        seq.num_logits = 6
    with pytest.raises(ValueError, match="num_logits=0"):
        seq.num_logits = 0
    step_until(eng, rid)
    with pytest.raises(ValueError, match="append the draft tokens to token_ids first"):
        seq.num_logits = 2  # prefilled: only the last sampled token is uncomputed


def test_sampling_probs_of_the_rows_give_a_verifiers_target_distributions(tiny):
    path, hf = tiny
    eng = LLMEngine(path)
    sp = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=3, max_tokens=10, ignore_eos=True)
    rid = eng.add_request(ids(9, 9), sp)
    step_until(eng, rid)
    seq = eng.requests[rid][0]
    seq.token_ids += ids(2, 10)
    seq.num_logits = 3
    context = list(seq.token_ids)
    out, _ = step_until(eng, rid)
    p = sampling_probs(out.logits, [sp] * 3)
    ref = torch.softmax(plain_logits(hf, context)[-3:] / 0.7, -1)
    assert torch.allclose(p.sum(-1), torch.ones(3))
    for i in range(3):  # what top-k 20 / top-p 0.9 keep carries the reference's mass, renormalized
        kept = p[i] > 0
        assert 1 <= kept.sum() <= 20
        torch.testing.assert_close(p[i][kept], ref[i][kept] / ref[i][kept].sum(), atol=1e-5, rtol=1e-4)
    assert p[-1][out.new_token_ids[0]] > 0  # the sampled token is one the last row's distribution allows
