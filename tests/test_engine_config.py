"""reference_engine.config.attention_shape: config.json's attention sizes with its defaults, read the way
ModelConfig.from_dict reads them, from a partial dict too (the lessons' KV-per-token helpers use it)."""
import random

import pytest

from autograder.checks._configs import random_config
from reference_engine.config import AttentionShape, ModelConfig, attention_shape, kv_bytes_per_token

LLAMA_3_70B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
               "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8}


def test_agrees_with_from_dict_on_random_configs():
    # random_config draws num_key_value_heads and head_dim present, absent and null, and explicit head_dims
    # that hidden_size // heads does not give.
    rng = random.Random(9)
    for _ in range(300):
        cfg = random_config(rng)
        full = ModelConfig.from_dict(cfg)
        s = attention_shape(cfg)
        assert (s.num_hidden_layers, s.num_attention_heads, s.num_key_value_heads, s.head_dim) == \
               (full.num_hidden_layers, full.num_attention_heads, full.num_key_value_heads, full.head_dim), cfg
        for b in (1, 2, 4):
            assert kv_bytes_per_token(s, b) == kv_bytes_per_token(full, b)


def test_defaults_when_missing_or_null():
    partial = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096}  # no model_type, vocab, ...
    expected = AttentionShape(32, 32, 32, 128)
    assert attention_shape(partial) == expected
    assert attention_shape({**partial, "num_key_value_heads": None, "head_dim": None}) == expected
    assert attention_shape({**partial, "num_key_value_heads": 8, "head_dim": 96}) == AttentionShape(32, 32, 8, 96)
    # an explicit head_dim needs no hidden_size
    assert attention_shape({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 64}).head_dim == 64


def test_llama_3_70b_bytes_per_token():
    assert kv_bytes_per_token(attention_shape(LLAMA_3_70B), 2) == 2 * 80 * 8 * 128 * 2 == 327680


def test_reads_only_the_attention_fields():
    # A family the engine does not run (DeepSeek's MLA config) still has a literal GQA shape; telling MLA
    # apart is the caller's job (lesson 15), and from_dict refuses the family outright.
    deepseek = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
                "num_key_value_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512}
    assert attention_shape(deepseek) == AttentionShape(61, 128, 128, 56)
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_dict(deepseek)


@pytest.mark.parametrize("cfg, match", [
    ({"num_attention_heads": 8, "hidden_size": 512}, "'num_hidden_layers' is missing"),
    ({"num_hidden_layers": 2, "hidden_size": 512}, "'num_attention_heads' is missing"),
    ({"num_hidden_layers": 0, "num_attention_heads": 8, "hidden_size": 512}, "positive integer"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8.0, "hidden_size": 512}, "positive integer"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 3, "hidden_size": 512}, "multiple"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8}, "'hidden_size' is missing"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 500}, "give 'head_dim'"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": -64}, "positive integer"),
    ([2, 8, 512], "JSON object"),
])
def test_refuses_what_from_dict_refuses(cfg, match):
    with pytest.raises(ValueError, match=match):
        attention_shape(cfg)


# ---- engine_config.EngineConfig: LLMEngine's arguments in vLLM's parts, checked once -----------------------
from dataclasses import replace  # noqa: E402

import torch  # noqa: E402

from reference_engine.engine_config import (  # noqa: E402
    CPU_KV_CACHE_BYTES,
    CacheConfig,
    Clock,
    DraftClock,
    EngineConfig,
    IdleClock,
    SchedulerConfig,
    StepClock,
)

SMALL = ModelConfig.from_dict({**LLAMA_3_70B, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
                               "vocab_size": 1000})


def test_from_kwargs_builds_the_parts():
    cfg = EngineConfig.from_kwargs(block_size=8, max_num_seqs=4, enable_chunked_prefill=False, device="cpu",
                                   dtype="bf16", kv_cache_dtype="fp8", enable_prefix_caching=True,
                                   speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert (cfg.cache.block_size, cfg.scheduler.max_num_seqs, cfg.scheduler.enable_chunked_prefill) == (8, 4, False)
    assert cfg.model.device == torch.device("cpu") and cfg.model.dtype == torch.bfloat16
    assert cfg.kv_cache_dtype == torch.float8_e4m3fn and cfg.cache.enable_prefix_caching
    assert cfg.speculative.method == "ngram" and cfg.speculative.prompt_lookup_max == 5
    assert not cfg.resolved and cfg == EngineConfig.from_kwargs(**{
        "block_size": 8, "max_num_seqs": 4, "enable_chunked_prefill": False, "device": "cpu", "dtype": torch.bfloat16,
        "kv_cache_dtype": "fp8", "enable_prefix_caching": True,
        "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}})


@pytest.mark.parametrize("kwargs, error, match", [
    ({"block_size": 0}, ValueError, "block_size must be a positive integer"),
    ({"max_num_seqs": 2.5}, ValueError, "max_num_seqs must be a positive integer"),
    ({"tensor_parallel_size": 0}, ValueError, "tensor_parallel_size must be a positive integer"),
    ({"num_blocks": 0}, ValueError, "num_blocks must be a positive integer"),
    ({"dtype": "int3"}, ValueError, "unknown dtype"),
    ({"kv_cache_dtype": "int4"}, ValueError, "unknown kv_cache_dtype"),
    ({"quantization": "int2"}, ValueError, "unknown quantization 'int2'"),
    ({"max_num_seqs": 8, "max_num_batched_tokens": 4}, ValueError, "max_num_batched_tokens .* must be >= max_num_seqs"),
    ({"tensor_parallel_size": 2, "attention_backend": object()}, ValueError, "must be a backend name"),
    ({"speculative_config": {"num_speculative_tokens": 2}}, ValueError, "needs 'model'"),
    ({"speculative_config": {"model": "ngram", "num_speculative_tokens": 0}}, ValueError, "num_speculative_tokens"),
    ({"clock": 3.0}, TypeError, "clock must be a callable"),
])
def test_arguments_are_refused_before_any_model_is_read(kwargs, error, match):
    with pytest.raises(error, match=match):
        EngineConfig.from_kwargs(**kwargs)


def test_resolve_fills_in_what_depends_on_the_model():
    cfg = EngineConfig.from_kwargs(device="cpu", dtype="float32", block_size=16, max_num_seqs=8).resolve(SMALL)
    per_block = cfg.kv_bytes_per_token_per_rank(SMALL) * 16
    assert cfg.kv_bytes_per_token_per_rank(SMALL) == kv_bytes_per_token(SMALL, 4)
    assert cfg.resolved and cfg.model.max_model_len == 512
    assert cfg.cache.num_blocks == min(8 * 512 // 16, CPU_KV_CACHE_BYTES // per_block) == 256
    assert cfg.scheduler.max_seq_len == 512 and cfg.scheduler.max_num_batched_tokens == 512
    # a budget of a few blocks caps the longest sequence; a shorter max_model_len caps it too
    few = EngineConfig.from_kwargs(device="cpu", dtype="float32", kv_cache_memory_bytes=3 * per_block).resolve(SMALL)
    assert (few.cache.num_blocks, few.scheduler.max_seq_len) == (3, 48)
    short = EngineConfig.from_kwargs(device="cpu", dtype="float32", max_model_len=100).resolve(SMALL)
    assert short.model.max_model_len == short.scheduler.max_seq_len == 100
    whole = EngineConfig.from_kwargs(device="cpu", dtype="float32", enable_chunked_prefill=False).resolve(SMALL)
    assert whole.scheduler.max_num_batched_tokens == 512
    assert whole.resolve(SMALL) == whole  # resolving again changes nothing


def test_resolve_refuses_what_the_model_rules_out():
    with pytest.raises(ValueError, match="holds no block"):
        EngineConfig.from_kwargs(device="cpu", dtype="float32", kv_cache_memory_bytes=10).resolve(SMALL)
    with pytest.raises(ValueError, match="enable_chunked_prefill=False, max_num_batched_tokens \\(256\\)"):
        EngineConfig.from_kwargs(device="cpu", dtype="float32", enable_chunked_prefill=False,
                                 max_num_batched_tokens=256).resolve(SMALL)
    with pytest.raises(ValueError, match="num_attention_heads=4 does not split"):
        EngineConfig.from_kwargs(device="cpu", dtype="float32", tensor_parallel_size=3).resolve(SMALL)
    with pytest.raises(ValueError, match="max_num_batched_tokens \\(512\\) must be >= max_num_seqs \\(600\\)"):
        EngineConfig.from_kwargs(device="cpu", dtype="float32", max_num_seqs=600).resolve(SMALL)


def test_a_part_checks_itself_when_built_by_hand():
    with pytest.raises(ValueError, match="block_size"):
        CacheConfig(block_size=-1)
    with pytest.raises(ValueError, match="must be >= the longest sequence"):
        SchedulerConfig(max_num_batched_tokens=100, enable_chunked_prefill=False, max_seq_len=200)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        replace(EngineConfig().scheduler, max_num_seqs=1000, max_num_batched_tokens=512)


def test_clock_protocols():
    from reference_engine.sim.gpu_model import CHIPS, MODELS, ModeledClock
    from reference_engine.tools.profiling import CountingClock

    modeled, counting = ModeledClock(MODELS["llama-3-8b"], CHIPS["H100"]), CountingClock()
    assert isinstance(modeled, StepClock) and isinstance(modeled, DraftClock) and isinstance(modeled, IdleClock)
    assert isinstance(counting, StepClock) and not isinstance(counting, DraftClock)
    assert isinstance(time_clock := EngineConfig().clock, Clock) and not isinstance(time_clock, StepClock)
    assert not isinstance(lambda: 0.0, StepClock)
