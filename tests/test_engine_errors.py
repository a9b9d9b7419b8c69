"""Bad input fails early with a message that says what to fix; config parsing and defaults."""
import json
import shutil

import pytest
import torch

from reference_engine import LLM, LLMEngine, ModelConfig, SamplingParams, kv_bytes_per_token

BASE = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4)


def test_config_defaults():
    c = ModelConfig.from_dict(BASE)
    assert c.num_key_value_heads == 4  # missing: MHA
    assert c.head_dim == 16  # hidden_size // heads
    assert c.rope_theta == 10000.0 and c.rope_scaling is None
    assert ModelConfig.from_dict({**BASE, "rope_theta": 5e5}).rope_theta == 5e5
    assert ModelConfig.from_dict({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}).rope_theta == 1e6
    l3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    c = ModelConfig.from_dict({**BASE, "rope_theta": 5e5, "rope_scaling": l3})
    assert c.rope_theta == 5e5 and c.rope_scaling["rope_type"] == "llama3"
    q = ModelConfig.from_dict({**BASE, "model_type": "qwen2", "sliding_window": 32, "use_sliding_window": False})
    assert q.qkv_bias and not q.o_bias and q.sliding_window is None
    m = ModelConfig.from_dict({**BASE, "model_type": "mistral", "sliding_window": 100, "max_position_embeddings": 512})
    assert m.max_model_len == 100  # full attention inside the window is exact; beyond it, refused


def test_kv_bytes_per_token_matches_llama3_8b():
    c = ModelConfig.from_dict(dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8))
    assert kv_bytes_per_token(c, 2) == 2 * 32 * 8 * 128 * 2 == 131072


@pytest.mark.parametrize("patch, field", [
    ({"model_type": "gpt2"}, "model_type"), ({"model_type": None}, "model_type"),
    ({"hidden_size": None}, "hidden_size"), ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"num_attention_heads": "4"}, "num_attention_heads"), ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"hidden_size": 66}, "hidden_size"), ({"rope_scaling": {"rope_type": "yarn", "factor": 2}}, "rope_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8}}, "low_freq_factor"), ({"head_dim": 15}, "head_dim"),
])
def test_malformed_config_names_the_field(patch, field):
    d = {**BASE, **patch}
    d = {k: v for k, v in d.items() if not (v is None and k != "model_type")}
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_dict(d)


def test_config_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_file(tmp_path / "config.json")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelConfig.from_file(tmp_path / "config.json")


pytest.importorskip("transformers")
from reference_engine.tools.testing import save_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = save_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", seed=1, max_position_embeddings=64)
    return path


@pytest.fixture
def broken(model_dir, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(model_dir, dst)
    return dst


def test_missing_or_non_directory_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        LLM(tmp_path / "file")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LLM(tmp_path)


def test_missing_weights(broken):
    (broken / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        LLM(broken)


@pytest.mark.parametrize("damage", ["garbage", "truncate"])
def test_corrupted_safetensors_names_the_file(broken, damage):
    f = broken / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(b"\x13\x37" * 50 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors.*corrupted"):
        LLM(broken)


def test_missing_and_misshapen_tensors(broken):
    from safetensors.torch import load_file, save_file

    f = broken / "model.safetensors"
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, f)
    with pytest.raises(ValueError, match="lack 1 tensor.*up_proj"):
        LLM(broken)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, f)
    with pytest.raises(ValueError, match=r"up_proj.weight.*shape \(3, 3\).*\(128, 64\)"):
        LLM(broken)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(128, 64)
    tensors["model.layers.9.extra.weight"] = torch.zeros(1)
    save_file(tensors, f)
    with pytest.raises(ValueError, match="does not have.*layers.9"):
        LLM(broken)


def test_bad_config_in_model_dir(broken):
    cfg = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    with pytest.raises(ValueError, match="model_type"):
        LLM(broken)


def test_bad_prompts(model_dir):
    llm = LLM(model_dir)
    sp = SamplingParams(max_tokens=2)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], sp)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 2, 256]], sp)
    with pytest.raises(ValueError, match=r"64 tokens.*at most 63.*context limit"):
        llm.generate([list(range(64))], sp)
    with pytest.raises(ValueError, match="no tokenizer.json"):
        llm.generate("hello", sp)
    with pytest.raises(TypeError, match="prompt must be"):
        llm.generate([[1.5, 2]], sp)
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.generate([[1, 2]], {"max_tokens": 2})
    with pytest.raises(ValueError, match=r"n=100 exceeds max_num_seqs"):
        llm.generate([[1, 2]], SamplingParams(n=100))
    # one bad prompt in a list: nothing was queued
    with pytest.raises(ValueError):
        llm.generate([[1, 2], []], sp)
    assert not llm.engine.has_unfinished()
    assert len(llm.generate([[1, 2], [3]], sp)) == 2


def test_prompt_longer_than_the_cache(model_dir):
    eng = LLMEngine(model_dir, num_blocks=2, block_size=16)
    with pytest.raises(ValueError, match="num_blocks"):
        eng.add_request(list(range(40)))


def test_bad_engine_arguments(model_dir):
    with pytest.raises(ValueError, match="max_num_batched_tokens .* must be >= max_num_seqs"):
        LLM(model_dir, max_num_seqs=8, max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="unknown attention_backend"):
        LLM(model_dir, attention_backend="flash")
    with pytest.raises(TypeError, match="lacks method"):
        LLM(model_dir, attention_backend=object())
    with pytest.raises(ValueError, match="unknown dtype"):
        LLM(model_dir, dtype="int3")
    with pytest.raises(ValueError, match="block_size"):
        LLM(model_dir, block_size=0)
    with pytest.raises(ValueError, match="already in use"):
        eng = LLMEngine(model_dir)
        eng.add_request([1], request_id="a")
        eng.add_request([2], request_id="a")
