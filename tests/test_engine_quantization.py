"""Quantization in the engine: LLM(model, quantization=...) and kv_cache_dtype="fp8" (reference_engine/quantization.py)."""
import pytest
import torch

from reference_engine import LLM, SamplingParams
from reference_engine import quantization as Q
from reference_engine.attention import AttentionMetadata
from reference_engine.kernels import triton_compat
from reference_engine.shipped import DRAFT, TARGET

PROMPTS = ["def ", "import os\n", "class Foo:", "for i in range(10):", "return self.", "if __name__ ==",
           "    def __init__(self", "# Copyright"]


def _weight(seed=0, N=24, K=300):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, K, generator=g) * 0.05  # K not a multiple of 128: the last group is padded


@pytest.mark.parametrize("bits,symmetric", [(8, True), (4, True), (4, False)])
def test_group_round_trip_error_is_at_most_half_a_step(bits, symmetric):
    w = _weight()
    q, scales, zeros = Q.quantize_groups(w, bits, 128, symmetric)
    back = Q.dequantize_groups(q, scales, zeros, w.shape[1], torch.float32)
    step = scales.float().repeat_interleave(128, 1)[:, :w.shape[1]]
    # round-to-nearest on a grid of `step`: error <= step / 2 (the fp16 scale rounding adds a hair); asymmetric
    # grids can clip by up to one step when the zero point is rounded, so allow a full step there.
    bound = step * (0.5 if symmetric else 1.0) * (1 + 1e-3) + 1e-7
    assert torch.all((back - w).abs() <= bound)


def test_int4_pack_unpack_round_trip():
    q = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    packed = Q.pack_int4(q)
    assert packed.shape == (5, 32) and torch.equal(Q.unpack_int4(packed), q)
    assert torch.equal(packed[:, 0] & 0xF, q[:, 0])  # column 0 in the low nibble


def test_fp8_round_trip_relative_error_and_saturation():
    x = torch.randn(16, 64) * torch.logspace(-1, 2, 16)[:, None]
    q, s = Q.quantize_fp8(x, per_row=True)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (16, 1)
    back = q.float() * s
    normal = (x / s).abs() >= 2 ** -6  # E4M3's smallest normal: 3 mantissa bits -> relative error <= 2^-4
    assert torch.all(((back - x).abs() <= x.abs() * 2 ** -4 + 1e-12)[normal])
    assert back.abs().max() <= x.abs().max() * (1 + 2 ** -4)


def test_quantized_layer_matches_its_dequantized_weight():
    lin = torch.nn.Linear(300, 24)
    for method in Q.METHODS:
        ql = Q.QuantLinear(lin, method)
        x = torch.randn(3, 300)
        w = ql.dequantized_weight(torch.float32)
        if method != "fp8":  # fp8 also rounds the activations (W8A8)
            torch.testing.assert_close(ql(x), torch.nn.functional.linear(x, w, lin.bias))
        assert (w - lin.weight).abs().max() < 0.1 * lin.weight.abs().max()


def _greedy(llm, n=24):
    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]


@pytest.fixture(scope="module")
def reference_tokens():
    return _greedy(LLM(TARGET))


def test_defaults_keep_todays_engine():
    eng = LLM(TARGET, dtype="bfloat16", kv_cache_memory_bytes=1 << 20).engine
    assert eng.kv_cache_dtype == torch.bfloat16 and eng.runner.k_cache.dtype == torch.bfloat16
    assert not any(isinstance(m, Q.QuantLinear) for m in eng.model.modules())


def test_int8_weight_only_greedy_agreement(reference_tokens):
    """Measured: int8 group-128 weights give the fp32 tokens at >= 90% of positions on these prompts."""
    llm = LLM(TARGET, quantization="int8")
    assert Q.weight_bytes(llm.engine.model) < 0.5 * Q.weight_bytes(LLM(TARGET).engine.model)
    got = _greedy(llm)
    same = sum(a == b for x, y in zip(got, reference_tokens) for a, b in zip(x, y)) / sum(map(len, got))
    assert same >= 0.9, f"int8 weight-only agrees with fp32 on only {same:.0%} of greedy tokens"


def _window_logits(llm, ids):
    eng, T = llm.engine, len(ids)
    meta = AttentionMetadata(torch.arange(T), 0, None, None, [0, T], [T],
                             torch.arange(-(-T // eng.block_size), dtype=torch.int32)[None])
    return eng.model.compute_logits(eng.model(torch.tensor(ids), torch.arange(T), meta))


def test_fp8_kv_cache_logits_close_and_greedy_tokens(reference_tokens):
    """The fp8 cache changes next-token log-probs by < 0.5 nats anywhere on a 200-token window, and the first 8
    greedy tokens equal fp32's for at least half of the prompts (measured: E4M3 has 3 mantissa bits)."""
    ref, fp8 = LLM(TARGET), LLM(TARGET, kv_cache_dtype="fp8")
    assert fp8.engine.runner.k_cache.dtype == torch.float8_e4m3fn
    ids = torch.randint(1, 2048, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    a, b = _window_logits(ref, ids).log_softmax(-1), _window_logits(fp8, ids).log_softmax(-1)
    assert (a - b).abs().max() < 0.5
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9
    got = _greedy(fp8)
    same_prefix = sum(x[:8] == y[:8] for x, y in zip(got, reference_tokens))
    assert same_prefix >= len(PROMPTS) // 2, f"only {same_prefix}/{len(PROMPTS)} prompts keep fp32's first 8 tokens"


@pytest.mark.skipif(not triton_compat.AVAILABLE, reason="Triton is not installed")
def test_fp8_kv_cache_triton_backend_matches_torch():
    """The Triton kernels read a dequantized copy (no fp8 arithmetic under the interpreter): same tokens."""
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    torch_tokens = [o.outputs[0].token_ids for o in LLM(TARGET, kv_cache_dtype="fp8").generate(PROMPTS[:2], sp)]
    triton = LLM(TARGET, kv_cache_dtype="fp8", attention_backend="triton", num_blocks=32)
    assert [o.outputs[0].token_ids for o in triton.generate(PROMPTS[:2], sp)] == torch_tokens


def test_fp8_kv_cache_doubles_blocks_for_the_same_memory():
    budget = 1 << 20
    bf16 = LLM(TARGET, dtype="bfloat16", kv_cache_memory_bytes=budget).engine
    fp8 = LLM(TARGET, dtype="bfloat16", kv_cache_memory_bytes=budget, kv_cache_dtype="fp8").engine
    assert fp8.num_blocks == 2 * bf16.num_blocks
    assert fp8.runner.k_cache.nbytes == bf16.runner.k_cache.nbytes


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="quantization"):
        LLM(TARGET, quantization="int3")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(TARGET, kv_cache_dtype="int8")


def test_fp8_kv_cache_with_a_draft_model():
    """The draft model shares the backend but keeps its own full-precision cache: speculation still runs."""
    sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    spec = {"model": str(DRAFT), "num_speculative_tokens": 3}
    plain = [o.outputs[0].token_ids for o in LLM(TARGET, kv_cache_dtype="fp8").generate(PROMPTS[:2], sp)]
    got = [o.outputs[0].token_ids for o in
           LLM(TARGET, kv_cache_dtype="fp8", speculative_config=spec).generate(PROMPTS[:2], sp)]
    assert got == plain  # greedy speculation returns the target's own greedy tokens
