"""Model configuration: a Hugging Face config.json read into one typed, validated record.

Only the fields a Llama-family decoder needs. Defaults follow the transformers config classes for
the three supported families (llama, mistral, qwen2); the structural sizes have no sensible default
and must be present.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Per-family defaults that differ (transformers' LlamaConfig / MistralConfig / Qwen2Config).
_MAX_POS_DEFAULT = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768}
_EPS_DEFAULT = {"llama": 1e-6, "mistral": 1e-6, "qwen2": 1e-6}


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3"|"linear", "factor": ..., ...}
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # bias on q/k/v projections (Qwen2 always, Llama if attention_bias)
    o_bias: bool = False  # bias on o_proj (Llama attention_bias only)
    mlp_bias: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    torch_dtype: str | None = None

    @property
    def max_model_len(self) -> int:
        """Longest sequence this engine computes exactly: full attention inside a sliding window
        equals windowed attention, so the window caps the length instead of being implemented."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"no config.json at {path}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        if not isinstance(d, dict):
            raise ValueError(f"config must be a JSON object, got {type(d).__name__}")
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"config field 'model_type' is {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        for name in _REQUIRED:
            if name not in d:
                raise ValueError(f"config field '{name}' is missing")
            _positive_int(d, name)
        shape = attention_shape(d)  # KV heads and head_dim with config.json's defaults, checked
        heads, kv_heads, head_dim = shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
        if head_dim % 2:
            raise ValueError(f"config field 'head_dim' must be even for RoPE, got {head_dim}")
        rope_theta, rope_scaling = _rope(d)
        max_pos = d.get("max_position_embeddings", _MAX_POS_DEFAULT[model_type])
        _positive_int({"max_position_embeddings": max_pos}, "max_position_embeddings")
        window = d.get("sliding_window")
        if model_type == "qwen2" and not d.get("use_sliding_window", False):
            window = None  # Qwen2 stores a window but only uses it when use_sliding_window is set
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=max_pos,
            rms_norm_eps=float(d.get("rms_norm_eps", _EPS_DEFAULT[model_type])),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=attention_bias if model_type == "llama" else False,
            mlp_bias=bool(d.get("mlp_bias", False)) if model_type == "llama" else False,
            sliding_window=int(window) if window else None,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
        )


def _positive_int(d: dict, name: str) -> None:
    v = d[name]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"config field '{name}' must be a positive integer, got {v!r}")


def _rope(d: dict) -> tuple[float, dict | None]:
    """rope_theta may sit at top level (transformers 4), inside rope_parameters (transformers 5)
    or rope_scaling, or be absent (10000). Returns (theta, scaling dict or None for plain RoPE)."""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"config field 'rope_parameters'/'rope_scaling' must be an object, got {params!r}")
    theta = float(d.get("rope_theta") or params.get("rope_theta") or 10000.0)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"config field 'rope_type' is {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope_type == "default":
        return theta, None
    need = ("factor",) if rope_type == "linear" else ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    for k in need:
        if not isinstance(params.get(k), (int, float)):
            raise ValueError(f"config field 'rope_scaling.{k}' is required for rope_type {rope_type!r}")
    return theta, {"rope_type": rope_type, **{k: params[k] for k in need}}


@dataclass(frozen=True)
class AttentionShape:
    """The four sizes of a config.json that decide its KV cache, defaults filled in (see attention_shape).
    Field names are ModelConfig's, so kv_bytes_per_token takes either."""
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


def attention_shape(d: dict) -> AttentionShape:
    """Layers, heads, KV heads and head_dim of a config.json dict, with config.json's defaults: a missing
    or null num_key_value_heads means MHA (as many as num_attention_heads), a missing or null head_dim
    means hidden_size // num_attention_heads (a head_dim that is present wins, even when it differs).

    Reads only those fields (hidden_size only when head_dim is absent), so it takes a partial config or
    one of a family this engine does not run; from_dict reads them through it. ValueError, with
    from_dict's messages, for a missing or non-positive size or KV heads that do not divide the heads.
    """
    if not isinstance(d, dict):
        raise ValueError(f"config must be a JSON object, got {type(d).__name__}")
    for name in ("num_hidden_layers", "num_attention_heads"):
        if name not in d:
            raise ValueError(f"config field '{name}' is missing")
        _positive_int(d, name)
    heads = d["num_attention_heads"]
    kv_heads = d.get("num_key_value_heads") or heads  # missing (or null) means MHA
    _positive_int({"num_key_value_heads": kv_heads}, "num_key_value_heads")
    if heads % kv_heads:
        raise ValueError(f"config field 'num_attention_heads' ({heads}) must be a multiple of 'num_key_value_heads' ({kv_heads})")
    head_dim = d.get("head_dim")
    if head_dim is None:
        if "hidden_size" not in d:
            raise ValueError("config field 'hidden_size' is missing (it gives head_dim, which is absent)")
        _positive_int(d, "hidden_size")
        if d["hidden_size"] % heads:
            raise ValueError(f"config field 'hidden_size' ({d['hidden_size']}) is not divisible by 'num_attention_heads' ({heads}); give 'head_dim'")
        head_dim = d["hidden_size"] // heads
    _positive_int({"head_dim": head_dim}, "head_dim")
    return AttentionShape(d["num_hidden_layers"], heads, kv_heads, head_dim)


def kv_bytes_per_token(config: ModelConfig | AttentionShape, dtype_bytes: int | float) -> int | float:
    """Bytes of K and V cache one token occupies across all layers: 2 * layers * kv_heads * head_dim * bytes."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * dtype_bytes
