"""The shipped checkpoints (reference_engine/checkpoints/{target,draft}) load in this engine and generate."""

import pytest
import torch

from reference_engine import LLM, SamplingParams
from reference_engine.shipped import CHECKPOINTS as CKPT

PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module", params=["target", "draft"])
def shipped(request):
    path = CKPT / request.param
    assert (path / "config.json").is_file(), f"shipped checkpoint {path} is missing"
    return path, LLM(path, max_num_seqs=4)


def test_loads_and_generates_text(shipped):
    _, llm = shipped
    assert llm.tokenizer is not None and llm.engine.config.eos_token_ids == (0,)
    [out] = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24))
    assert out.prompt_token_ids == llm.tokenizer.encode(PROMPT)
    assert 1 <= len(out.token_ids) <= 24 and out.finish_reason in ("stop", "length")
    assert out.text == llm.tokenizer.decode(out.token_ids) and out.text.strip()
    sampled = llm.generate([PROMPT] * 2, SamplingParams(temperature=0.8, top_p=0.95, seed=1, max_tokens=16))
    assert sampled[0].token_ids == sampled[1].token_ids  # same seed, same tokens


def test_matches_transformers(shipped):
    transformers = pytest.importorskip("transformers")
    path, llm = shipped
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32).eval()
    ids = llm.tokenizer.encode(PROMPT * 3)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(llm.engine.score(ids), ref, atol=1e-4, rtol=1e-4)
    hf.generation_config.eos_token_id = None
    cfg = transformers.GenerationConfig(do_sample=False, max_new_tokens=20, eos_token_id=None, pad_token_id=0, bos_token_id=None)
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           generation_config=cfg)[0, len(ids):].tolist()
    [out] = llm.generate(ids, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert out.token_ids == want
