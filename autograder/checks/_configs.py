"""Defaults the checks must exercise: config.json's optional fields, and keyword arguments.

config.json's attention fields with Hugging Face's defaults, for the checks that read a config.

A decoder's config.json may leave out `num_key_value_heads` (then the model is multi-head:
as many KV heads as query heads) and `head_dim` (then it is hidden_size // num_attention_heads),
or write either as null, which means the same default. A field that is present wins, even a
head_dim that is not hidden_size // num_attention_heads (Mistral-Nemo, Gemma, Qwen3).

    s = shape(cfg)                       # s.layers, s.heads, s.kv_heads, s.head_dim, s.implied_head_dim
    got = call(t, "kv_bytes_per_token", cfg, 2)   # t.call that names the null-field mistake
    cfg = random_config(t.rng)           # every trap drawn at random: absent, null, explicit

A keyword argument that a check always passes can hide a wrong default (or one ignored): a check
calls the learner's function with the arguments at their default left out, as a caller would:

    t.call("users_per_gpu", cfg, p, ctx, gpu, **non_default(weight_dtype=(w, "bfloat16"), kv_dtype=(k, "bfloat16")))
"""
from __future__ import annotations

import dataclasses

from autograder.core import LearnerRaised
from autograder.reference import answer_code

OPTIONAL = ("num_key_value_heads", "head_dim")


@dataclasses.dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    implied_head_dim: int  # hidden_size // num_attention_heads: what head_dim defaults to


@answer_code
def shape(cfg: dict) -> Shape:
    """The attention shape of `cfg` with the defaults filled in (absent or null: the default)."""
    heads = cfg["num_attention_heads"]
    implied = cfg["hidden_size"] // heads
    return Shape(cfg["num_hidden_layers"], heads, cfg.get("num_key_value_heads") or heads,
                 cfg.get("head_dim") or implied, implied)


def null_fields(cfg: dict) -> list[str]:
    """The optional fields that `cfg` has, set to null."""
    return [k for k in OPTIONAL if k in cfg and cfg[k] is None]


def describe(cfg: dict) -> str:
    """The fields that matter, as the learner would read them in the file: absent, null or a value."""
    def field(k):
        return "absent" if k not in cfg else ("null" if cfg[k] is None else cfg[k])
    return (f"layers={cfg['num_hidden_layers']}, heads={cfg['num_attention_heads']}, "
            f"num_key_value_heads={field('num_key_value_heads')}, head_dim={field('head_dim')}, "
            f"hidden={cfg['hidden_size']}")


# An MHA config written out the way some exporters do: both optional fields present, both null.
# A visible case wherever a config is read, so that this trap is met on every seed.
NULL_FIELDS_7B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": None, "head_dim": None, "hidden_size": 4096,
                  "intermediate_size": 11008, "vocab_size": 32000, "torch_dtype": "float16"}


def random_config(rng, kv_heads=(1, 2, 4, 8, 16), groups=(1, 2, 4, 8), head_dims=(64, 80, 96, 128, 256),
                  layers=(2, 100)) -> dict:
    """A Llama-style config.json the learner has not seen, with the defaults' traps drawn at random:
    num_key_value_heads present, absent (MHA only) or null; head_dim explicit and not
    hidden_size // heads, explicit and equal to it, absent or null; tie_word_embeddings sometimes."""
    kv = rng.choice(kv_heads)
    heads = kv * rng.choice(groups)
    head_dim = rng.choice(head_dims)
    cfg = {"model_type": rng.choice(["llama", "mistral", "qwen2"]), "num_hidden_layers": rng.randint(*layers),
           "num_attention_heads": heads, "vocab_size": rng.choice([32000, 50304, 128256, 151936]),
           "torch_dtype": "bfloat16"}
    draw = rng.random()
    if draw < 0.35:  # an explicit head_dim that hidden_size // heads does not give
        cfg["hidden_size"] = heads * rng.choice([d for d in (64, 96, 128, 160, 192) if d != head_dim])
        cfg["head_dim"] = head_dim
    else:
        cfg["hidden_size"] = heads * head_dim
        if draw < 0.55:
            cfg["head_dim"] = head_dim
        elif draw < 0.75:
            cfg["head_dim"] = None
    if kv != heads or rng.random() < 0.4:
        cfg["num_key_value_heads"] = kv
    elif rng.random() < 0.5:
        cfg["num_key_value_heads"] = None
    cfg["intermediate_size"] = 256 * rng.randint(4, 120)
    if rng.random() < 0.7:
        cfg["tie_word_embeddings"] = rng.random() < 0.4
    return cfg


def call(t, name: str, *args, **kwargs):
    """t.call(name, *args, **kwargs). When a config among the arguments has a null field and the
    learner's code trips over the None it read (a TypeError about NoneType), the case fails with
    that mistake named instead of a bare traceback."""
    try:
        return t.call(name, *args, **kwargs)
    except LearnerRaised as e:
        nulls = [f for a in args if isinstance(a, dict) for f in null_fields(a)]
        if nulls and e.is_a(TypeError) and "NoneType" in str(e.info.get("message") or "") \
                and not e.not_implemented:
            shown = " and ".join(f'"{f}": null' for f in dict.fromkeys(nulls))
            t.fail(f"{name}() raised TypeError on a config with {shown}.", "treats a field that is present but null "
                   "as set (config.get(key, default) returns None for it); null means the default, as if the field "
                   "were absent: config.get(key) or default", end=".\n" + e.tb_text)
        raise


def non_default(**args) -> dict:
    """The keyword arguments whose value is not their default, from name=(value, default) pairs."""
    return {k: v for k, (v, default) in args.items() if v != default or type(v) is not type(default)}
