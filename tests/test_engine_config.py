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
