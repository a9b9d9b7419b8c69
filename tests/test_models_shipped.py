"""The two shipped checkpoints: HF-loadable, sized as documented, scored as metrics.json says."""

import json
import math
from pathlib import Path

import pytest
import torch

from reference_engine.shipped import CHECKPOINTS as CKPT
from reference_engine.shipped import METRICS as METRICS_FILE
from reference_engine.tools import train as T

NAMES = ("target", "draft")
METRICS = json.loads(METRICS_FILE.read_text())

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    return {n: (AutoModelForCausalLM.from_pretrained(str(CKPT / n), local_files_only=True).eval(),
                AutoTokenizer.from_pretrained(str(CKPT / n), local_files_only=True)) for n in NAMES}


@pytest.fixture(scope="module")
def heldout_windows(hf):
    """The test slice, rebuilt from this machine's stdlib with the shipped tokenizer."""
    from tokenizers import Tokenizer

    _, held, names = T.split_corpus()
    tok = Tokenizer.from_file(str(CKPT / "target" / "tokenizer.json"))
    windows = T.eval_windows(T.token_stream(tok, held), METRICS["seq_len"], METRICS["eval_windows"])
    same = T.corpus_digest(names, held) == METRICS["heldout_digest"]
    return windows[:METRICS["slice_windows"]], same


def test_files_and_config():
    for n in NAMES:
        d = CKPT / n
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "generation_config.json"):
            assert (d / f).is_file(), f"{n}/{f} missing"
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
        assert cfg["torch_dtype"] == "float32" and cfg["max_position_embeddings"] == 512
        assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
        assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]  # GQA / MQA
        assert (d / "model.safetensors").stat().st_size < 20e6


def test_load_with_transformers_and_sizes(hf):
    target, draft = hf["target"][0], hf["draft"][0]
    assert type(target).__name__ == "LlamaForCausalLM"
    assert 2e6 <= target.num_parameters() <= 5e6
    assert draft.num_parameters() < 1e6
    for n in NAMES:
        model = hf[n][0]
        assert model.num_parameters() == METRICS["models"][n]["params"]
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied


def test_shared_tokenizer(hf):
    assert (CKPT / "target" / "tokenizer.json").read_bytes() == (CKPT / "draft" / "tokenizer.json").read_bytes()
    tt, dt = hf["target"][1], hf["draft"][1]
    assert tt.get_vocab() == dt.get_vocab()
    assert len(tt) == hf["target"][0].config.vocab_size == hf["draft"][0].config.vocab_size
    assert tt.eos_token == tt.bos_token == "<|endoftext|>"
    assert tt.eos_token_id == hf["target"][0].config.eos_token_id == 0


def test_tokenizer_round_trips(hf):
    tok = hf["target"][1]
    samples = [
        "def f(x):\n    return x ** 2  # square\n",
        "\tmixed\ttabs   and  spaces\r\n\n\n",
        "unicode: é ü ☃ 日本語 🐍\x00\x7f",
        Path(T.__file__).read_text(),  # a whole Python file
    ]
    for s in samples:
        ids = tok(s, add_special_tokens=True)["input_ids"]
        assert tok.decode(ids) == s
    # code compresses well below one token per byte; prose bytes still round-trip
    src = samples[-1]
    assert len(tok(src)["input_ids"]) < 0.5 * len(src.encode())
    assert tok.decode(tok("<|endoftext|>x")["input_ids"]) == "<|endoftext|>x"
    assert tok("<|endoftext|>")["input_ids"] == [0]


def test_local_llama_matches_transformers(hf):
    """train.py's model definition is numerically HF Llama (names, RoPE, GQA, RMSNorm)."""
    ids = torch.randint(0, 2048, (2, 77), generator=torch.Generator().manual_seed(0))
    for n in NAMES:
        ours = T.load_checkpoint(CKPT / n)
        with torch.no_grad():
            diff = (ours(ids) - hf[n][0](ids).logits).abs().max().item()
        assert diff < 1e-4, f"{n}: max |logit diff| {diff}"


def test_heldout_loss_matches_metrics(hf, heldout_windows):
    windows, same_corpus = heldout_windows
    for n in NAMES:
        with torch.no_grad():
            loss = hf[n][0](input_ids=windows, labels=windows).loss.item()
        want = METRICS["models"][n]["slice_loss"]
        # same stdlib text as at training time: equal up to float noise; another Python
        # version's stdlib changes some held-out files, so only roughly
        assert loss == pytest.approx(want, abs=2e-3) if same_corpus else loss == pytest.approx(want, rel=0.1)
        # far better than chance (uniform over the vocab)
        assert loss < math.log(2048) - 2


def test_metrics_consistent():
    m = METRICS
    assert m["tokens_evaluated"] == m["eval_windows"] * (m["seq_len"] - 1)
    assert m["eval_windows"] >= 64
    for n in NAMES:
        mm = m["models"][n]
        assert mm["heldout_ppl"] == pytest.approx(math.exp(mm["heldout_loss"]), rel=1e-3)
    # the bigger model is the better one (speculative decoding relies on that ordering)
    assert m["models"]["target"]["heldout_loss"] < m["models"]["draft"]["heldout_loss"]


def test_greedy_samples_reproduce(hf):
    model, tok = hf["target"]
    for prompt, smp in METRICS["models"]["target"]["greedy_samples"].items():
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=smp["new_tokens"], eos_token_id=None, pad_token_id=0)
        assert out[0].tolist() == smp["token_ids"]
        assert tok.decode(out[0]) == smp["text"] and smp["text"].startswith(prompt)


def test_engine_greedy_equals_transformers(hf):
    try:
        from reference_engine import LLM, SamplingParams
    except ImportError as e:
        pytest.skip(f"engine not importable: {e}")
    model, tok = hf["target"]
    prompts = ["def ", "import os\n", "class Foo:\n    def __init__(self", "for i in range("]
    llm = LLM(model=str(CKPT / "target"), block_size=16, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = llm.generate([tok(p)["input_ids"] for p in prompts], params)
    for p, o in zip(prompts, outs):
        ids = tok(p, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=24, eos_token_id=None, pad_token_id=0)
        assert list(o.token_ids) == ref[0, ids.shape[1]:].tolist(), p
