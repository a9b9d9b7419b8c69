"""The engine's model equals transformers' on random-weight tiny models saved with save_pretrained."""
import zlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

from reference_engine import LLM, LLMEngine, ModelConfig, SamplingParams  # noqa: E402
from reference_engine.tools.testing import save_tiny_model  # noqa: E402

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 500000.0}  # wavelengths in all 3 bands
CASES = {
    "llama-mha-untied": ("llama", dict(num_key_value_heads=4)),
    "llama-gqa-tied": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "llama-mqa-bias": ("llama", dict(num_key_value_heads=1, attention_bias=True, mlp_bias=True)),
    "llama3-rope-scaling": ("llama", dict(rope_parameters=LLAMA3_ROPE)),
    "qwen2-gqa": ("qwen2", dict(num_key_value_heads=2)),
    "qwen2-tied": ("qwen2", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "mistral-gqa": ("mistral", dict(num_key_value_heads=2, head_dim=32)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request, tmp_path_factory):
    model_type, overrides = CASES[request.param]
    path, hf = save_tiny_model(tmp_path_factory.mktemp(request.param), model_type, seed=zlib.crc32(request.param.encode()) % 1000, **overrides)
    return path, hf


def hf_greedy(hf, prompt, n):
    # eos_token_id=None in a GenerationConfig falls back to the model's own EOS; clear that too.
    hf.generation_config.eos_token_id = None
    cfg = transformers.GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0, bos_token_id=None)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), generation_config=cfg)
    return out[0, len(prompt):].tolist()


def test_logits_match_transformers(saved):
    path, hf = saved
    engine = LLMEngine(path, num_blocks=64)
    prompt = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(1)).tolist()  # spans 5 blocks
    ours = engine.score(prompt)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)


def test_greedy_generation_matches_transformers(saved):
    path, hf = saved
    llm = LLM(path, num_blocks=64, max_num_batched_tokens=64)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 9, 33, 80)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(hf, p, 24), f"prompt of {len(p)} tokens diverged"
        assert o.prompt_token_ids == p and o.finish_reason == "length"


def test_sharded_checkpoint_loads_like_single_file(tmp_path):
    single, hf = save_tiny_model(tmp_path / "single", "llama", seed=3)
    sharded, _ = save_tiny_model(tmp_path / "sharded", "llama", seed=3, max_shard_size="60KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    prompt = list(range(1, 40))
    a = LLMEngine(single, num_blocks=16).score(prompt)
    b = LLMEngine(sharded, num_blocks=16).score(prompt)
    assert torch.equal(a, b)
    with torch.no_grad():
        torch.testing.assert_close(b, hf(torch.tensor([prompt])).logits[0], atol=2e-5, rtol=1e-4)


def test_config_from_saved_file_reads_family_details(saved):
    path, hf = saved
    c = ModelConfig.from_file(path / "config.json")
    h = hf.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (h.num_hidden_layers, h.num_attention_heads, h.num_key_value_heads)
    assert c.head_dim == getattr(h, "head_dim", None) or c.head_dim == h.hidden_size // h.num_attention_heads
    assert c.tie_word_embeddings == h.tie_word_embeddings
    assert c.qkv_bias == (c.model_type == "qwen2" or bool(getattr(h, "attention_bias", False)))
