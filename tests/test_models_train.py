"""train.py's pieces on tiny inputs: corpus split, tokenizer, HF-compatible model/export, training."""

import json
import math
import sysconfig
from pathlib import Path

import pytest
import torch

from reference_engine.tools import train as T

TINY = T.LlamaArgs(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


@pytest.fixture(scope="module")
def tiny_tok():
    texts = [Path(T.__file__).read_text(), Path(json.__file__).read_text()] * 2
    return T.train_tokenizer(texts, vocab_size=300)


def test_stdlib_files_and_split():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = T.stdlib_files(root)
    rels = [p.relative_to(root).as_posix() for p in files]
    assert rels == sorted(rels) and len(rels) > 300
    assert not any(r.startswith(("test/", "idlelib/")) or "/tests/" in r for r in rels)
    assert "json/decoder.py" in rels
    held = [r for r in rels if T.is_heldout(r)]
    assert 0.02 < len(held) / len(rels) < 0.1
    # the rule depends on the name only
    assert [T.is_heldout(r) for r in rels] == [T.is_heldout(r) for r in rels]


def test_corpus_digest_sensitive():
    a = T.corpus_digest(["x.py"], ["print(1)\n"])
    assert a == T.corpus_digest(["x.py"], ["print(1)\n"])
    assert a != T.corpus_digest(["x.py"], ["print(2)\n"])
    assert a != T.corpus_digest(["y.py"], ["print(1)\n"])


def test_tokenizer(tiny_tok):
    assert tiny_tok.get_vocab_size() == 300
    assert tiny_tok.token_to_id(T.EOS) == 0
    for s in ("def f(x):\n    return x\n", "ünïcödé ☃ \t\r\n", ""):
        assert tiny_tok.decode(tiny_tok.encode(s).ids) == s
    stream = T.token_stream(tiny_tok, ["a = 1\n", "b = 2\n"])
    assert stream.dtype == torch.long and (stream == 0).sum() == 2 and stream[-1] == 0


def test_param_count_and_tying():
    m = T.Llama(TINY)
    assert m.lm_head.weight is m.model.embed_tokens.weight
    per_layer = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 48 + 2 * 32
    assert m.num_params() == 300 * 32 + 2 * per_layer + 32
    assert 2e6 < T.Llama(T.TARGET).num_params() < 5e6
    assert T.Llama(T.DRAFT).num_params() < 1e6


@pytest.mark.parametrize("tied", [True, False])
def test_export_loads_in_transformers_with_equal_logits(tmp_path, tiny_tok, tied):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    a = T.LlamaArgs(**{**TINY.__dict__, "tie_word_embeddings": tied})
    model = T.Llama(a)
    with torch.no_grad():  # make norms non-trivial so a skipped weight would show
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    T.save_checkpoint(model, tiny_tok, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), local_files_only=True).eval()
    ids = torch.randint(1, 300, (3, 40))
    with torch.no_grad():
        assert torch.allclose(model(ids), hf(ids).logits, atol=1e-5)
        back = T.load_checkpoint(tmp_path)
        assert torch.equal(back(ids), model(ids))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert tok.eos_token_id == 0 and tok.decode(tok("x = 1\n")["input_ids"]) == "x = 1\n"


def test_eval_loss_matches_hf_loss(tmp_path, tiny_tok):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    model = T.Llama(TINY)
    T.save_checkpoint(model, tiny_tok, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), local_files_only=True).eval()
    stream = torch.randint(0, 300, (1000,))
    w = T.eval_windows(stream, 32, 10)
    assert w.shape == (10, 32) and torch.equal(w[0], stream[:32]) and torch.equal(w[-1], stream[-32:])
    with torch.no_grad():
        want = hf(input_ids=w, labels=w).loss.item()
    assert T.eval_loss(model, w, batch=3) == pytest.approx(want, rel=1e-5)


def test_lr_schedule():
    steps, peak, warm = 100, 1e-3, 10
    lrs = [T.lr_at(s, steps, peak, warm) for s in range(steps)]
    assert lrs[0] == pytest.approx(peak / warm) and lrs[warm - 1] == pytest.approx(peak)
    assert max(lrs) == pytest.approx(peak)
    assert all(b <= a + 1e-12 for a, b in zip(lrs[warm:], lrs[warm + 1:]))  # cosine decays
    assert lrs[-1] == pytest.approx(0.1 * peak, rel=0.01)


def test_training_learns_a_pattern():
    torch.set_num_threads(1)
    # a periodic stream: a model that learned it predicts the next token almost surely
    stream = torch.arange(40).repeat(200) % 37 + 1
    a = T.LlamaArgs(**{**TINY.__dict__, "vocab_size": 64})
    model = T.train_model(a, stream, steps=60, seed=0, batch=8, seq_len=32, lr=1e-2, desc="t")
    w = T.eval_windows(stream, 32, 8)
    assert T.eval_loss(model, w) < 0.25 * math.log(64)
    # seeded: same result twice
    again = T.train_model(a, stream, steps=3, seed=0, batch=8, seq_len=32, lr=1e-2, desc="t")
    again2 = T.train_model(a, stream, steps=3, seed=0, batch=8, seq_len=32, lr=1e-2, desc="t")
    assert all(torch.equal(p, q) for p, q in zip(again.parameters(), again2.parameters()))


def test_greedy_is_argmax():
    torch.manual_seed(0)
    m = T.Llama(TINY).eval()
    out = T.greedy(m, [5, 6, 7], 4)
    assert out[:3] == [5, 6, 7] and len(out) == 7
    with torch.no_grad():
        assert out[3] == int(m(torch.tensor([[5, 6, 7]]))[0, -1].argmax())


def test_cli_end_to_end(tmp_path):
    """The real pipeline on the real corpus with 2 steps per model (about 12 s: tokenizer
    training and encoding the stdlib dominate)."""
    T.main(["--out", str(tmp_path), "--steps", "2", "--eval-windows", "4", "--batch", "2"])
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert set(m["models"]) == {"target", "draft"} and m["eval_windows"] == 4
    assert (tmp_path / "target" / "model.safetensors").is_file()
    assert m["models"]["target"]["greedy_samples"]["def "]["text"].startswith("def ")
