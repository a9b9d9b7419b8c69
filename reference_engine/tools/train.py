"""Train the two small Llamas shipped with the course (target + draft) on Python's stdlib.

    python -m reference_engine.tools.train --out reference_engine/checkpoints --seed 0 [--steps N]

Everything here is plain torch + `tokenizers`: the model below is a self-contained Llama whose
state-dict names and math match Hugging Face's LlamaForCausalLM, so the saved directories load
with `AutoModelForCausalLM.from_pretrained(dir)` and with this repo's engine, and training does
not need `transformers` at all.

Corpus: every `*.py` under the running interpreter's stdlib (excluding test suites, idlelib and
site-packages), sorted by relative path. A file is held out when sha1(relative path) % 20 == 0,
so the split depends on names only and is stable across machines and Python versions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

EOS = "<|endoftext|>"
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}

# ----------------------------------------------------------------------------- corpus


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """Sorted stdlib source files (sorted by relative path, so the order is deterministic)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_heldout(relpath: str) -> bool:
    return int(hashlib.sha1(relpath.encode()).hexdigest(), 16) % 20 == 0


def split_corpus(root: str | Path | None = None) -> tuple[list[str], list[str], list[str]]:
    """-> (train texts, held-out texts, held-out relative paths)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    train, held, held_names = [], [], []
    for p in stdlib_files(root):
        rel = p.relative_to(root).as_posix()
        text = p.read_text(encoding="utf-8", errors="replace")
        if is_heldout(rel):
            held.append(text)
            held_names.append(rel)
        else:
            train.append(text)
    return train, held, held_names


def corpus_digest(names: list[str], texts: list[str]) -> str:
    """Fingerprint of a file set, so tests can tell whether they see the same held-out text."""
    h = hashlib.sha1()
    for n, t in zip(names, texts):
        h.update(n.encode() + b"\0" + t.encode("utf-8", "replace") + b"\0")
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int = 2048):
    """Byte-level BPE (GPT-2 style): any byte string round-trips; <|endoftext|> is id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def token_stream(tok, texts: list[str]) -> torch.Tensor:
    """Files joined as `text <eos> text <eos> ...` into one int64 stream."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


# ----------------------------------------------------------------------------- model


@dataclass
class LlamaArgs:
    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 704
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True


TARGET = LlamaArgs()
DRAFT = LlamaArgs(hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=32)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(a: LlamaArgs, positions: torch.Tensor):
    """HF 'default' RoPE: frequencies duplicated over both halves (rotate_half convention)."""
    inv = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, dtype=torch.float32) / a.head_dim))
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


_LOADING = False  # set while load_checkpoint builds a model: every weight is read from the file right after


class Linear(nn.Linear):
    """nn.Linear (the same init, the same random draws) that skips its init while a checkpoint is loaded
    (load_checkpoint): random weights overwritten at once were most of the time a load took."""

    def reset_parameters(self) -> None:
        if not _LOADING:
            super().reset_parameters()


class Embedding(nn.Embedding):
    """nn.Embedding that skips its init while a checkpoint is loaded (see Linear)."""

    def reset_parameters(self) -> None:
        if not _LOADING:
            super().reset_parameters()


class Attention(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.a = a
        self.q_proj = Linear(a.hidden_size, a.num_attention_heads * a.head_dim, bias=False)
        self.k_proj = Linear(a.hidden_size, a.num_key_value_heads * a.head_dim, bias=False)
        self.v_proj = Linear(a.hidden_size, a.num_key_value_heads * a.head_dim, bias=False)
        self.o_proj = Linear(a.num_attention_heads * a.head_dim, a.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        a = self.a
        q = self.q_proj(x).view(b, t, a.num_attention_heads, a.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, a.num_key_value_heads, a.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, a.num_key_value_heads, a.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # GQA: query head h reads kv head h // group (same as HF repeat_kv)
        group = a.num_attention_heads // a.num_key_value_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.gate_proj = Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.self_attn = Attention(a)
        self.mlp = MLP(a)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.embed_tokens = Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(a) for _ in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)


class Llama(nn.Module):
    """Names match HF: model.embed_tokens / model.layers.N.* / model.norm / lm_head."""

    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.args = a
        self.model = LlamaBody(a)
        self.lm_head = Linear(a.hidden_size, a.vocab_size, bias=False)
        if a.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        if _LOADING:
            return
        self.apply(self._init)
        # GPT-2 style: shrink the residual-branch outputs so the stream's variance stays ~1
        for n, p in self.named_parameters():
            if n.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * a.num_hidden_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        cos, sin = rope_cos_sin(self.args, torch.arange(ids.shape[1]))
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights counted once


# ----------------------------------------------------------------------------- HF export


def hf_config(a: LlamaArgs, bos: int, eos: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": a.vocab_size, "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size, "num_hidden_layers": a.num_hidden_layers,
        "num_attention_heads": a.num_attention_heads, "num_key_value_heads": a.num_key_value_heads,
        "head_dim": a.head_dim, "max_position_embeddings": a.max_position_embeddings,
        "hidden_act": "silu", "rms_norm_eps": a.rms_norm_eps,
        # older transformers read rope_theta, 5.x reads rope_parameters: write both
        "rope_theta": a.rope_theta,
        "rope_parameters": {"rope_theta": a.rope_theta, "rope_type": "default"},
        "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "mlp_bias": False, "tie_word_embeddings": a.tie_word_embeddings,
        "initializer_range": 0.02, "bos_token_id": bos, "eos_token_id": eos,
        "pad_token_id": eos, "torch_dtype": "float32", "use_cache": True,
    }


def save_checkpoint(model: Llama, tok, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    eos = tok.token_to_id(EOS)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.args.tie_word_embeddings:
        sd.pop("lm_head.weight")  # HF convention: tied head is not stored
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    dump = lambda name, obj: (out / name).write_text(json.dumps(obj, indent=2) + "\n")
    dump("config.json", hf_config(model.args, eos, eos))
    dump("generation_config.json", {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos,
                                    "do_sample": False})
    tok.save(str(out / "tokenizer.json"))
    dump("tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOS, "eos_token": EOS,
        "pad_token": EOS, "unk_token": None, "add_bos_token": False, "add_eos_token": False,
        "model_max_length": model.args.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
    })
    dump("special_tokens_map.json", {"bos_token": EOS, "eos_token": EOS, "pad_token": EOS})


def load_checkpoint(path: str | Path) -> Llama:
    """Load a directory written by save_checkpoint back into the local Llama (no transformers)."""
    from safetensors.torch import load_file

    cfg = json.loads((Path(path) / "config.json").read_text())
    a = LlamaArgs(**{k: cfg[k] for k in asdict(LlamaArgs()) if k in cfg})
    global _LOADING
    _LOADING = True  # built without init: every weight is read below, and a file that lacks one is refused
    try:
        model = Llama(a)
    finally:
        _LOADING = False
    sd = load_file(str(Path(path) / "model.safetensors"))
    result = model.load_state_dict(sd, strict=False)
    missing = [k for k in result.missing_keys if not (a.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise ValueError(f"{path}: the checkpoint does not match the model (missing {missing}, unexpected "
                         f"{result.unexpected_keys})")
    return model.eval()


# ----------------------------------------------------------------------------- train / eval


def eval_windows(stream: torch.Tensor, seq_len: int, n: int) -> torch.Tensor:
    """n non-overlapping windows evenly spaced over the stream (deterministic)."""
    n = min(n, len(stream) // seq_len)
    starts = torch.linspace(0, len(stream) - seq_len, n).long()
    return torch.stack([stream[s:s + seq_len] for s in starts])


@torch.no_grad()
def eval_loss(model: Llama, windows: torch.Tensor, batch: int = 16) -> float:
    """Mean next-token cross-entropy over all (seq_len - 1) predictions of every window,
    i.e. what HF computes for `model(input_ids=w, labels=w).loss` on same-length windows."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        logits = model(w)[:, :-1]
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                 reduction="sum").item()
        count += w[:, 1:].numel()
    return total / count


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    prog = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))  # cosine to 10% of peak


def train_model(a: LlamaArgs, stream: torch.Tensor, steps: int, seed: int, batch: int,
                seq_len: int, lr: float, desc: str) -> Llama:
    from tqdm import tqdm

    torch.manual_seed(seed)
    model = Llama(a)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    model.train()
    bar = tqdm(range(steps), desc=desc, mininterval=5)
    for step in bar:
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
        xy = torch.stack([stream[s:s + seq_len + 1] for s in starts])
        logits = model(xy[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab_size), xy[:, 1:].reshape(-1))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup=max(1, steps // 20))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    return model.eval()


@torch.no_grad()
def greedy(model: Llama, ids: list[int], n: int) -> list[int]:
    """Plain recompute-everything greedy decoding; slow but obviously correct."""
    ids = list(ids)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids[-model.args.max_position_embeddings:]]))[0, -1].argmax()))
    return ids


def greedy_samples(model: Llama, tok, prompts=("def ", "import "), n: int = 48) -> dict:
    """Greedy continuations recorded in metrics.json (text for the README, ids for the tests)."""
    out = {}
    for p in prompts:
        ids = greedy(model, tok.encode(p).ids, n)
        out[p] = {"new_tokens": n, "token_ids": ids, "text": tok.decode(ids)}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="reference_engine/checkpoints")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="target steps (draft gets the same)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    t0 = time.time()

    train_texts, held_texts, held_names = split_corpus()
    tok = train_tokenizer(train_texts, TARGET.vocab_size)
    train_stream, held_stream = token_stream(tok, train_texts), token_stream(tok, held_texts)
    print(f"corpus: {len(train_texts)} train files ({len(train_stream)} tokens), "
          f"{len(held_texts)} held-out files ({len(held_stream)} tokens)")
    windows = eval_windows(held_stream, args.seq_len, args.eval_windows)

    steps = {"target": args.steps or 500, "draft": args.steps or 600}
    metrics = {
        "how_measured": (
            "held-out loss = mean next-token cross-entropy (nats) over every prediction inside "
            f"{len(windows)} non-overlapping windows of {args.seq_len} tokens, evenly spaced over "
            "the held-out token stream (files joined by <|endoftext|>); each window is scored "
            "independently from an empty context, fp32, CPU; perplexity = exp(loss). 'slice' = "
            "the first 8 of those windows (used by the tests)."),
        "python_version": platform.python_version(),
        "heldout_rule": "sha1(relative stdlib path) % 20 == 0",
        "heldout_files": len(held_names),
        "heldout_digest": corpus_digest(held_names, held_texts),
        "train_files": len(train_texts), "train_tokens": len(train_stream),
        "heldout_tokens": len(held_stream), "seq_len": args.seq_len,
        "eval_windows": len(windows), "tokens_evaluated": len(windows) * (args.seq_len - 1),
        "slice_windows": 8, "seed": args.seed, "torch_threads": args.threads,
        "torch_version": torch.__version__, "models": {},
    }
    # peak LRs: a run with 4e-3 / 5e-3 (600 / 400 steps) ended worse on held-out (3.63 / 4.01 nats)
    for name, a, lr in (("draft", DRAFT, 3e-3), ("target", TARGET, 2e-3)):
        t = time.time()
        model = train_model(a, train_stream, steps[name], args.seed, args.batch, args.seq_len, lr, name)
        train_s = time.time() - t
        loss = eval_loss(model, windows)
        slice_loss = eval_loss(model, windows[:8])
        save_checkpoint(model, tok, out / name)
        m = {"params": model.num_params(), "config": asdict(a), "steps": steps[name],
             "batch": args.batch, "peak_lr": lr, "train_tokens_seen": steps[name] * args.batch * args.seq_len,
             "train_seconds": round(train_s, 1), "heldout_loss": round(loss, 4),
             "heldout_ppl": round(math.exp(loss), 3), "slice_loss": round(slice_loss, 4)}
        if name == "target":
            m["greedy_samples"] = greedy_samples(model, tok)
        metrics["models"][name] = m
        print(f"{name}: {m['params']:,} params, held-out loss {loss:.3f} (ppl {math.exp(loss):.2f}), "
              f"{train_s:.0f}s")
    metrics["total_seconds"] = round(time.time() - t0, 1)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    for p, smp in metrics["models"]["target"].get("greedy_samples", {}).items():
        print(f"--- greedy from {p!r}:\n{smp['text']}")


if __name__ == "__main__":
    main()
