"""Disaggregated prefill/decode (reference_engine/disagg.py, kv_transfer.py): pack/unpack round-trip the paged
cache, a prefill engine + a decode engine give a single engine's tokens (greedy, fp32 and fp8 caches), in one
process over the loopback link and in two processes over gloo; an abort at any point (queued, prefilled and
held, between two layers on either side, decoding) leaves every block back in both pools."""
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autograder.harnesses.engine import target_path
from reference_engine import LLM, SamplingParams
from reference_engine.disagg import DisaggPair, replay_disaggregated, run_disaggregated
from reference_engine.engine import LLMEngine
from reference_engine.kv_transfer import pack_kv, raw_view, unpack_kv

MODEL = target_path()
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
LENS = (5, 8, 9, 16, 23, 31)  # block_size 8: inside one block, exactly full, one past, several, partial tails


def _prompts(lens=LENS, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(1, 2048) for _ in range(n)] for n in lens]


def _engine(num_blocks=40, **kw):
    return LLMEngine(MODEL, dtype=torch.float32, block_size=8, num_blocks=num_blocks, **kw)


def _single(prompts, params=GREEDY, **kw):
    return [o.token_ids for o in LLM(MODEL, dtype=torch.float32, block_size=8, num_blocks=40, **kw).generate(prompts, params)]


def _consistent(engine):
    engine.block_manager.check_consistency([s for seqs in engine.requests.values() for s in seqs])


# ---- pack / unpack ------------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_pack_unpack_round_trip(data):
    L, nb, bs, h, d = 3, 12, data.draw(st.sampled_from([1, 4, 8])), 2, 4
    n = data.draw(st.integers(1, 6 * bs))
    table = data.draw(st.permutations(range(nb)))[: -(-n // bs)]
    k, v = torch.randn(L, nb, bs, h, d), torch.randn(L, nb, bs, h, d)
    buf = pack_kv(k, v, table, n)
    assert buf.shape == (L, 2, n, h, d) and buf.is_contiguous()
    for p in range(n):  # token p of the sequence, every layer, K then V
        assert torch.equal(buf[:, 0, p], k[:, table[p // bs], p % bs])
        assert torch.equal(buf[:, 1, p], v[:, table[p // bs], p % bs])
    k2, v2 = torch.zeros_like(k), torch.zeros_like(v)
    dest = data.draw(st.permutations(range(nb)))[: len(table)]
    unpack_kv(buf, k2, v2, dest)
    assert torch.equal(pack_kv(k2, v2, dest, n), buf)
    untouched = torch.ones(nb, bs, dtype=torch.bool)
    for p in range(n):
        untouched[dest[p // bs], p % bs] = False
    assert not k2[:, untouched].any() and not v2[:, untouched].any(), "unpack wrote past the sequence's tokens"


def test_fp8_cache_packs_as_bytes():
    k = torch.randn(2, 4, 4, 1, 8).to(torch.float8_e4m3fn)
    buf = pack_kv(raw_view(k), raw_view(k), [2, 0], 6)
    assert buf.dtype == torch.uint8 and buf.shape == (2, 2, 6, 1, 8)
    assert torch.equal(buf[:, 0, 5], raw_view(k)[:, 0, 1])


# ---- one process, loopback link -------------------------------------------------------------------------

@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_pair_matches_single_engine(kv_cache_dtype):
    prompts = _prompts()
    expected = _single(prompts, kv_cache_dtype=kv_cache_dtype)
    pair = DisaggPair(_engine(kv_cache_dtype=kv_cache_dtype), _engine(30, kv_cache_dtype=kv_cache_dtype))
    before = pair.free_blocks()
    got = [o.token_ids for o in pair.generate(prompts, GREEDY)]
    assert got == expected
    assert pair.free_blocks() == before
    elem = 1 if kv_cache_dtype == "fp8" else 4
    c = pair.decode.engine.config
    assert pair.prefill.sender.sent_bytes == sum(LENS) * 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * elem
    _consistent(pair.prefill.engine)
    _consistent(pair.decode.engine)


def test_first_token_that_ends_the_request():
    prompts = _prompts((9, 17))
    params = SamplingParams(temperature=0, max_tokens=1)
    pair = DisaggPair(_engine(), _engine())
    got = pair.generate(prompts, params)
    assert [o.token_ids for o in got] == _single(prompts, params)
    assert pair.free_blocks() == (40, 40)


def test_prefill_holds_blocks_until_shipped():
    pair = DisaggPair(_engine(), _engine(), messages_per_step=0)  # the prefill side sends nothing by itself
    pair.add_request(_prompts((20,))[0], GREEDY, "r")
    pair.step()
    assert pair.free_blocks() == (40 - 3, 40), "the prefilled prompt's 3 blocks stay held, nothing arrived yet"
    assert pair.prefill.sender.pump(2) == 2  # START and layer 0
    pair.decode.step()
    assert pair.free_blocks() == (40 - 3, 40 - 3), "the decode side allocated the prompt's blocks on START"
    pair.prefill.sender.pump()
    outs = pair.decode.step()
    assert [o.new_token_ids for o in outs][0], "the first token arrives with the last layer"
    assert pair.free_blocks()[0] == 40, "blocks go back to the prefill pool once the last layer left"


def _abort_mid_transfer(side: str):
    pair = DisaggPair(_engine(), _engine(), messages_per_step=0)
    before = pair.free_blocks()
    prompts = _prompts((12, 25, 7))
    expected = _single(prompts)
    for rid, p in zip("abc", prompts):
        pair.add_request(p, GREEDY, rid)
    pair.step()  # all three prefilled and held
    pair.prefill.sender.pump(3)  # START a, layers 0 and 1 of 4: a is mid-transfer
    pair.decode.step()
    assert pair.decode.receiver.current.meta["request_id"] == "a"
    (pair.prefill if side == "prefill" else pair.decode).abort("a")
    pair.prefill.messages_per_step = None
    outs = []
    while pair.has_unfinished():
        outs += pair.step()
    finished = {o.request_id: o for o in outs if o.finished}
    assert finished["b"].output.token_ids == expected[1]
    assert finished["c"].output.token_ids == expected[2]
    assert "a" not in finished or finished["a"].finish_reason == "abort"
    assert pair.free_blocks() == before
    _consistent(pair.prefill.engine)
    _consistent(pair.decode.engine)


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_abort_mid_transfer_leaks_nothing(side):
    _abort_mid_transfer(side)


def test_abort_anywhere_leaks_nothing():
    """Queued on the prefill side, prefilled but not shipped, not yet arrived, decoding: abort() on the pair."""
    pair = DisaggPair(_engine(), _engine(), messages_per_step=2)
    prompts = _prompts((30, 9, 17, 3, 12), seed=3)
    ids = [pair.add_request(p, GREEDY) for p in prompts]
    before = (40, 40)
    pair.abort(ids[0])  # queued
    pair.step()
    pair.abort(ids[3])  # prefilled, held, not started
    for _ in range(6):
        pair.step()
    pair.abort(ids[1])  # somewhere in flight or decoding
    while pair.has_unfinished():
        pair.step()
    assert pair.free_blocks() == before
    _consistent(pair.prefill.engine)
    _consistent(pair.decode.engine)


def test_decode_instance_refuses_another_model_shape():
    pair = DisaggPair(_engine(), _engine(kv_cache_dtype="fp8"))
    pair.add_request(_prompts((9,))[0], GREEDY)
    with pytest.raises(ValueError, match="same kv_cache_dtype"):
        for _ in range(3):
            pair.step()


def test_decode_waits_for_blocks():
    """A decode engine with room for one request at a time: transfers wait (no error, no leak)."""
    prompts = _prompts((20, 18, 22))
    pair = DisaggPair(_engine(), _engine(5))  # 5 blocks of 8: one 20-token prompt + 10 tokens
    got = [o.token_ids for o in pair.generate(prompts, GREEDY)]
    assert got == _single(prompts)
    assert pair.free_blocks() == (40, 5)


# ---- two processes, gloo --------------------------------------------------------------------------------

def test_two_processes_over_gloo():
    prompts = _prompts()
    expected = _single(prompts)
    kw = {"dtype": torch.float32, "block_size": 8, "num_blocks": 40}
    res = run_disaggregated(MODEL, prompts, GREEDY, engine_kwargs=kw, decode_kwargs={"num_blocks": 30},
                            faults={"prefill_abort_after_layers": {"1": 2}, "decode_abort_on_start": ["4"]})
    assert sorted(res["aborted"]) == ["1", "4"]
    for i, (got, want) in enumerate(zip(res["tokens"], expected)):
        if str(i) not in res["aborted"]:
            assert got == want, f"request {i}"
    assert res["finish_reasons"][1] == "abort" and res["tokens"][4] is None
    for side in ("prefill", "decode"):
        assert res[side]["free_after"] == res[side]["free_before"], f"{side} leaked blocks"
        assert res[side]["consistent"]
    c = LLMEngine(MODEL, dtype=torch.float32, num_blocks=4).config
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4
    full = sum(n for i, n in enumerate(LENS) if i != 1)  # request 1 stopped after 2 of its layers
    assert res["prefill"]["sent_bytes"] == full * per_token + LENS[1] * per_token * 2 // c.num_hidden_layers
    assert res["decode"]["received_bytes"] == res["prefill"]["sent_bytes"]
    assert res["prefill"]["steps"] < len(prompts), "the prefill instance batches prompts through its scheduler"


def test_two_processes_fp8_cache():
    prompts = _prompts((9, 24, 31), seed=5)
    kw = {"dtype": torch.float32, "block_size": 8, "num_blocks": 40, "kv_cache_dtype": "fp8"}
    res = run_disaggregated(MODEL, prompts, GREEDY, engine_kwargs=kw)
    assert res["tokens"] == _single(prompts, kv_cache_dtype="fp8")
    assert all(res[side]["free_after"] == res[side]["free_before"] for side in ("prefill", "decode"))


# ---- modeled replay with pools ------------------------------------------------------------------------

def test_replay_disaggregated_on_modeled_clocks():
    from reference_engine.sim.faults import skip_forward
    from reference_engine.sim.gpu_model import H100, LLAMA_3_8B, engine_kwargs
    from reference_engine.sim.trace import Request

    def eng():
        e = LLMEngine(MODEL, dtype=torch.float32, max_num_seqs=8, kv_cache_dtype="fp8",
                      **{**engine_kwargs(LLAMA_3_8B, H100, max_blocks=None), "num_blocks": 256})
        skip_forward(e)
        return e

    reqs = [Request(arrival=0.01 * i, prompt_tokens=n, output_tokens=o)
            for i, (n, o) in enumerate([(100, 5), (300, 3), (50, 8), (200, 1)])]
    prompts = [[1] * r.prompt_tokens for r in reqs]
    out = replay_disaggregated([eng()], [eng(), eng()], reqs, prompts, lambda n: 1e-3 + n * 1e-6)
    for r, o in zip(reqs, out):
        assert len(o["token_times"]) == r.output_tokens
        assert o["token_times"][0] >= o["prefilled"] + 1e-3 + r.prompt_tokens * 1e-6 - 1e-12
        assert o["prefilled"] > r.arrival
        assert o["token_times"] == sorted(o["token_times"])
