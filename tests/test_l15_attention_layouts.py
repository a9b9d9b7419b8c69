"""Lesson 15's MLA solutions agree with transformers' DeepseekV2Attention, and the layouts' figures hold."""
import pytest
import torch

from autograder.checks import l15_attention_layouts as C
from solutions import l15_attention_layouts as L


def test_published_cache_figures_and_parameter_counts():
    # KV bytes/token in bf16 (reference-facts.md) and total parameters (model cards / papers).
    assert L.kv_bytes_per_token(L.DEEPSEEK_V3, 2) == 61 * (512 + 64) * 2 == 70272
    assert L.kv_bytes_per_token(L.DEEPSEEK_V2, 2) == 69120
    assert L.kv_bytes_per_token(L.LLAMA_3_70B, 2) == 327680
    counts = {m["name"]: L.param_count(m) / 1e9 for m in L.MODELS}
    assert round(counts["DeepSeek-V3"]) == 671 and round(counts["DeepSeek-V2"]) == 236
    assert round(counts["Llama-3-70B"], 1) == 70.6 and round(counts["Llama-3-8B"], 2) == 8.03
    assert round(counts["Mistral-7B-v0.1"], 2) == 7.24


def test_given_gqa_helper_is_lesson_02s_formula_and_mla_is_not_it():
    """gqa_kv_bytes_per_token (given, from the engine) equals lesson 02's graded answer on dense configs,
    nulls included; on an MLA config it is the literal reading the exercise must not return."""
    import random

    from solutions import l02_kv_cache as l02
    rng = random.Random(15)
    dense = [m for m in L.MODELS if not m.get("kv_lora_rank")]
    dense += [C._rand_dense_config(rng, kind) for kind in C.DENSE_KINDS for _ in range(20)]
    for cfg in dense:
        for b in (1, 2, 4):
            assert L.gqa_kv_bytes_per_token(cfg, b) == l02.kv_bytes_per_token(cfg, b) == L.kv_bytes_per_token(cfg, b)
    v3 = L.DEEPSEEK_V3
    assert L.gqa_kv_bytes_per_token(v3, 2) == 2 * 61 * 128 * (7168 // 128) * 2 != L.kv_bytes_per_token(v3, 2)
    assert L.kv_bytes_per_token(C.MLA_NO_Q_LORA, 2) == 27 * (512 + 64) * 2


def _hf_attention(cfg: dict, weights: dict):
    tr = pytest.importorskip("transformers")
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as m
    if not hasattr(m, "DeepseekV2RotaryEmbedding"):
        pytest.skip(f"transformers {tr.__version__} has another DeepseekV2 layout")
    hf_cfg = tr.DeepseekV2Config(
        hidden_size=cfg["hidden_size"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_attention_heads"], q_lora_rank=cfg["q_lora_rank"],
        kv_lora_rank=cfg["kv_lora_rank"], qk_nope_head_dim=cfg["qk_nope_head_dim"],
        qk_rope_head_dim=cfg["qk_rope_head_dim"], v_head_dim=cfg["v_head_dim"],
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        attention_bias=False, num_hidden_layers=1, vocab_size=16, intermediate_size=32,
        moe_intermediate_size=16, n_routed_experts=2)
    hf_cfg._attn_implementation = "eager"
    attn = m.DeepseekV2Attention(hf_cfg, layer_idx=0).eval()
    attn.load_state_dict(weights)
    return attn, m.DeepseekV2RotaryEmbedding(hf_cfg), m


@pytest.mark.parametrize("q_lora", [24, None])
def test_mla_matches_transformers_prefill_and_decode(q_lora):
    cfg = {**L.MLA_TINY, "q_lora_rank": q_lora, "rope_theta": 50000.0}
    g = torch.Generator().manual_seed(3)
    w = L.random_mla_weights(cfg, g)
    attn, rope, m = _hf_attention(cfg, w)
    S = 11
    x = torch.randn(S, cfg["hidden_size"], generator=g)
    pos = torch.arange(S)
    causal = torch.full((S, S), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        ref, _ = attn(x[None], attention_mask=causal, position_embeddings=rope(x[None], pos[None]))
        # Decode through transformers' own latent cache: 10 tokens, then the 11th.
        cache = m.DynamicCache(config=attn.config)
        attn(x[None, :-1], attention_mask=causal[..., :-1, :-1], cache=cache,
             position_embeddings=rope(x[None, :-1], pos[None, :-1]))
        dec, _ = attn(x[None, -1:], attention_mask=None, cache=cache,
                      position_embeddings=rope(x[None, -1:], pos[None, -1:]))
    ref, dec = ref[0], dec[0]
    c_kv, k_pe = L.mla_cache_entry(w, cfg, x, pos)
    naive = L.mla_attention_naive(w, cfg, x, pos, c_kv, k_pe)
    torch.testing.assert_close(naive, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dec, ref[-1:], rtol=1e-4, atol=1e-5)
    for fn in (L.mla_attention_naive, L.mla_attention_absorbed):
        out = fn(w, cfg, x[-1:], pos[-1:], c_kv, k_pe)
        torch.testing.assert_close(out, dec, rtol=1e-4, atol=1e-5)


def test_absorbed_equals_naive_in_float64():
    cfg = {**L.MLA_TINY, "num_attention_heads": 8, "kv_lora_rank": 48}
    g = torch.Generator().manual_seed(0)
    w = {k: v.double() for k, v in L.random_mla_weights(cfg, g).items()}
    x = torch.randn(20, cfg["hidden_size"], generator=g, dtype=torch.float64)
    pos = torch.arange(20)
    c_kv, k_pe = L.mla_cache_entry(w, cfg, x, pos)
    a = L.mla_attention_absorbed(w, cfg, x[5:], pos[5:], c_kv, k_pe)
    b = L.mla_attention_naive(w, cfg, x[5:], pos[5:], c_kv, k_pe)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_triton_kernel_handles_block_edges_and_other_block_sizes():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 8, 32, generator=g)
    k = torch.randn(3, 65, 2, 32, generator=g)
    v = torch.randn(3, 65, 2, 32, generator=g)
    lens = torch.tensor([64, 65, 1])
    ref = L.gqa_decode_torch(q, k, v, lens)
    for block_n in (16, 32):
        torch.testing.assert_close(L.gqa_decode_triton(q, k, v, lens, block_n=block_n), ref,
                                   rtol=1e-4, atol=1e-5)


def test_shape_watch_tells_absorbed_from_naive():
    cfg = {"hidden_size": 56, "num_attention_heads": 3, "q_lora_rank": None, "kv_lora_rank": 28,
           "qk_nope_head_dim": 12, "qk_rope_head_dim": 4, "v_head_dim": 20, "rope_theta": 10000.0}
    g = torch.Generator().manual_seed(0)
    w = L.random_mla_weights(cfg, g)
    x = torch.randn(41, 56, generator=g)
    pos = torch.arange(41)
    c_kv, k_pe = L.mla_cache_entry(w, cfg, x, pos)
    widths = {12, 20, 32, 16, 36, 60, 96}
    args = (w, cfg, x[-1:], pos[-1:], c_kv, k_pe)
    naive = C.watch_shapes(L.mla_attention_naive, 41, widths, *args)
    absorbed = C.watch_shapes(L.mla_attention_absorbed, 41, widths, *args)
    assert naive["seen"] and not absorbed["seen"]
    torch.testing.assert_close(absorbed["out"], naive["out"], rtol=1e-4, atol=1e-5)


def test_window_layouts_and_fp8_latent_figures():
    # Gemma 3 27B: 62 layers, global every 6th (layers 5, 11, ..., 59); gpt-oss-120b: 18 of 36 layers global.
    assert [i for i, w in enumerate(L.windowed_layers(L.GEMMA_3_27B)) if not w] == list(range(5, 62, 6))
    assert L.windowed_layers(L.GPT_OSS_120B) == [True, False] * 18
    assert L.windowed_layers({**L.GEMMA_3_27B, "sliding_window": None}) == [False] * 62
    per = 2 * 16 * 128 * 2                                   # Gemma 3 27B, bytes per layer and token, bf16
    assert L.window_kv_bytes(L.GEMMA_3_27B, 131072, 2) == per * (10 * 131072 + 52 * 1024)
    assert L.window_kv_bytes(L.GEMMA_3_27B, 500, 2) == per * 62 * 500     # inside the window: no saving
    assert L.window_kv_bytes(L.GPT_OSS_120B, 32768, 2) == 2 * 8 * 64 * 2 * (18 * 32768 + 18 * 128)
    # FlashMLA's "FP8 with scale" cache (its README): 512 fp8 + 4 float32 scales + 64 bf16 = 656 bytes per layer.
    assert 512 * 1 + (512 // 128) * 4 + 64 * 2 == 656 and 61 * 656 == 40016
