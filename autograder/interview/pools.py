"""What a question's instance is drawn from: chips, model shapes and hypothetical configs.

Chips and the two Llama shapes are reference_engine.sim.gpu_model's (datasheet peaks, memory as the
driver reports it, config.json sizes, all cited there). Each lesson takes its inputs in its own
format, so these helpers turn them into a lesson's dicts.
"""
from __future__ import annotations

import random
from dataclasses import replace

from reference_engine.sim import gpu_model as gm

CHIPS = [gm.A100, gm.H100, gm.H200]
SHAPES = [gm.LLAMA_3_8B, gm.LLAMA_3_70B]
GB, GiB, MiB = 10**9, 2**30, 2**20


def pick(rng: random.Random, items):
    return items[rng.randrange(len(items))]


def other(rng: random.Random, items, not_this):
    return pick(rng, [x for x in items if x != not_this])


def hf_config(shape: gm.ModelShape) -> dict:
    """A model shape as the fields of its config.json."""
    return {"num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads, "hidden_size": shape.hidden,
            "intermediate_size": shape.intermediate, "vocab_size": shape.vocab,
            "tie_word_embeddings": shape.tie_word_embeddings}


def hypothetical_config(rng: random.Random) -> dict:
    """A Llama-style config that is no released model: layers, heads, KV heads and head_dim drawn at random."""
    heads = pick(rng, [16, 24, 32, 40, 48, 64])
    kv = pick(rng, [k for k in (1, 2, 4, 8, 16) if heads % k == 0 and k < heads])
    head_dim = pick(rng, [64, 96, 128])
    return {"num_hidden_layers": pick(rng, [16, 24, 28, 32, 40, 48, 60, 80]), "num_attention_heads": heads,
            "num_key_value_heads": kv, "hidden_size": heads * head_dim}


def hypothetical_llama(rng: random.Random) -> dict:
    """hypothetical_config with the MLP and vocabulary sizes a parameter count needs (untied embeddings)."""
    cfg = hypothetical_config(rng)
    cfg["intermediate_size"] = round(cfg["hidden_size"] * pick(rng, [2.6875, 3.5, 4.0]) / 256) * 256
    cfg["vocab_size"] = pick(rng, [32000, 128256, 152064])
    cfg["tie_word_embeddings"] = False
    return cfg


def hypothetical_chip(rng: random.Random) -> gm.Chip:
    """An accelerator that is no real product: dense TFLOP/s and HBM GB/s drawn at random (stated in the question)."""
    return replace(gm.H100, name="hypothetical accelerator", dense_tflops=float(pick(rng, [400, 600, 800, 1200, 1800, 2400])),
                   hbm_gb_per_s=float(pick(rng, [1600, 2400, 3200, 4000, 6000, 8000])))


def any_chip(rng: random.Random) -> gm.Chip:
    """A real chip two times in three, else a hypothetical one."""
    return pick(rng, CHIPS) if rng.random() < 2 / 3 else hypothetical_chip(rng)


def describe(cfg: dict) -> str:
    """A config's attention shape in words, for a prompt."""
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return f"{cfg['num_hidden_layers']} layers, {heads} query heads, {kv} KV head{'s' if kv != 1 else ''}, head_dim {hd}"


def chip_text(chip: gm.Chip) -> str:
    return f"{chip.name} ({chip.dense_tflops:g} dense bf16 TFLOP/s, {chip.hbm_gb_per_s:g} GB/s HBM)"


def group_text(n: int, chip: gm.Chip) -> str:
    """'one H100 SXM (memory ...)' or '8 x H100 SXM (memory ... each), tensor parallel over the 8'."""
    if n == 1:
        return f"one {chip.name} ({memory_text(chip)})"
    return f"{n} x {chip.name} ({memory_text(chip)} each), tensor parallel over the {n}"


def memory_text(chip: gm.Chip) -> str:
    return f"{chip.memory_mib:,} MiB as the driver reports it (= {chip.memory_bytes / GB:.2f} GB)"
