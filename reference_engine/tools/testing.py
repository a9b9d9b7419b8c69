"""Tiny random-weight Hugging Face models for tests and lessons (needs transformers; nothing is downloaded)."""
from __future__ import annotations

from pathlib import Path

import torch

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)


def tiny_hf_model(model_type: str = "llama", seed: int = 0, **overrides):
    """A transformers *ForCausalLM with random weights; its config is TINY updated with overrides."""
    import transformers

    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
               "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
    cfg_cls, model_cls = (getattr(transformers, n) for n in classes[model_type])
    config = cfg_cls(**{**TINY, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():  # default init leaves biases at 0 and norms at 1; randomize so tests see them
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def save_tiny_model(path: str | Path, model_type: str = "llama", seed: int = 0, max_shard_size=None, **overrides):
    """Save tiny_hf_model(...) with save_pretrained; returns (path, the transformers model)."""
    model = tiny_hf_model(model_type, seed, **overrides)
    kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(str(path), **kw)
    return Path(path), model


def drive_events(engine, events, add, check, max_drain_steps: int = 2000) -> list:
    """Replay a generated event stream on an engine, then run it dry, calling check() after every step.

    events: ("add", ...) -> rid = add(event, number of requests added before it); ("abort", i) aborts the i-th
    added request (mod their count); anything else (name, n), an abort before any add included, runs n steps.
    Returns the request ids added, in order."""
    rids = []
    for ev in events:
        if ev[0] == "add":
            rids.append(add(ev, len(rids)))
        elif ev[0] == "abort" and rids:
            engine.abort(rids[ev[1] % len(rids)])
        else:
            for _ in range(ev[1]):
                engine.step()
                check()
    steps = 0
    while engine.has_unfinished():
        engine.step()
        check()
        steps += 1
        assert steps < max_drain_steps, "engine stopped making progress"
    return rids
