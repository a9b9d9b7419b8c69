# Lesson 02 exercises: replace each `raise NotImplementedError` with your code.
# Check your work with `course check 02`. (Generated from solutions/l02_kv_cache.py by
# `course sync`; keep the names and signatures.)
"""Lesson 02: the KV cache per token, what it costs, and a cache you can attend over.

Sizes are in bytes. 1 GB = 10**9 bytes and 1 GiB = 2**30 bytes; the functions
return bytes and leave the unit to the caller.
"""
from __future__ import annotations

import math

import torch


def dtype_bytes(dtype: str | int | torch.dtype) -> int:
    """Exercise 2.1: bytes per element of a dtype given by name, by byte width, or as a torch.dtype.

    Names (case-insensitive): "float32"/"fp32" -> 4; "bfloat16"/"bf16", "float16"/"fp16" -> 2;
    "float8"/"fp8", "fp8_e4m3", "fp8_e5m2" -> 1. An int is already a width in bytes
    (1, 2, 4 or 8) and is returned as is; a torch.dtype gives its element size.
    Anything else raises ValueError.

    >>> dtype_bytes("bfloat16"), dtype_bytes("FP8_E4M3"), dtype_bytes(4), dtype_bytes(torch.float16)
    (2, 1, 4, 2)
    """
    raise NotImplementedError("Exercise 2.1 (dtype_bytes): see section 2.1 of lessons/l02_kv_cache.ipynb")


def kv_bytes_per_token(config: dict, dtype: str | int | torch.dtype) -> int:
    """Exercise 2.1: bytes of K and V cached for one token, over all layers.

    `config` is a Hugging Face config.json as a dict. Fields used:
      num_hidden_layers, num_attention_heads, hidden_size,
      num_key_value_heads  (missing or null: MHA, as many as num_attention_heads),
      head_dim             (missing or null: hidden_size // num_attention_heads;
                            when present it wins, and need not equal that quotient).
    `dtype` is the KV cache's dtype (see dtype_bytes), which need not be the weights' dtype.

    bytes = 2 (K and V) * layers * kv_heads * head_dim * bytes per element.

    >>> kv_bytes_per_token({"num_hidden_layers": 80, "num_attention_heads": 64,
    ...                     "num_key_value_heads": 8, "hidden_size": 8192}, "bfloat16")
    327680
    """
    raise NotImplementedError("Exercise 2.1 (kv_bytes_per_token): see section 2.1 of lessons/l02_kv_cache.ipynb")


def kv_cache_bytes(config: dict, dtype: str | int | torch.dtype, num_users: int, context_len: int) -> int:
    """Exercise 2.2: bytes of KV cache for `num_users` sequences of `context_len` tokens each.

    >>> kv_cache_bytes(LLAMA_3_70B, "bfloat16", 32, 8192) / 2**30   # GiB
    80.0
    """
    raise NotImplementedError("Exercise 2.2 (kv_cache_bytes): see section 2.2 of lessons/l02_kv_cache.ipynb")


def max_users(config: dict, dtype: str | int | torch.dtype, context_len: int, free_bytes: float) -> int:
    """Exercise 2.2: how many sequences of `context_len` tokens fit, whole, in `free_bytes`.

    A sequence that does not fit entirely cannot be admitted, so round down; no room
    (free_bytes smaller than one sequence, or negative) means 0. Returns an int.

    >>> per_user = kv_cache_bytes(LLAMA_3_70B, "bfloat16", 1, 8192)
    >>> max_users(LLAMA_3_70B, "bfloat16", 8192, 5 * per_user - 1)
    4
    """
    raise NotImplementedError("Exercise 2.2 (max_users): see section 2.2 of lessons/l02_kv_cache.ipynb")


def users_per_gpu(config: dict, num_params: float, context_len: int, gpu_bytes: float,
                  weight_dtype: str | int | torch.dtype = "bfloat16",
                  kv_dtype: str | int | torch.dtype = "bfloat16") -> int:
    """Exercise 2.3: sequences of `context_len` tokens one GPU holds once the weights are loaded.

    Weights take num_params * dtype_bytes(weight_dtype) bytes of the `gpu_bytes` the
    engine may use; the rest holds KV cache in `kv_dtype`. If the weights do not fit,
    the answer is 0 (never negative). Activations, CUDA graphs and fragmentation are
    ignored here: pass a smaller gpu_bytes to leave room for them.

    >>> users_per_gpu(LLAMA_3_8B, 8.03e9, 8192, 80e9)       # bf16 weights and cache
    59
    """
    raise NotImplementedError("Exercise 2.3 (users_per_gpu): see section 2.3 of lessons/l02_kv_cache.ipynb")


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exercise 2.4: attention of the newest T tokens' queries over all S cached keys and values.

    q: [T, num_heads, head_dim], the queries of the last T tokens of the sequence.
    k, v: [S, num_kv_heads, head_dim], every token so far (S >= T), the new ones included.
    Returns [T, num_heads, head_dim] in q's dtype.

    - scale scores by 1/sqrt(head_dim);
    - GQA: num_heads = group * num_kv_heads, and query head h reads KV head h // group;
    - causal: query i is token S - T + i, so it sees keys 0 .. S - T + i and nothing later;
    - softmax over the keys.

    >>> q, k = torch.randn(1, 8, 64), torch.randn(10, 2, 64)
    >>> decode_attention(q, k, k).shape
    torch.Size([1, 8, 64])
    """
    raise NotImplementedError("Exercise 2.4 (decode_attention): see section 2.4 of lessons/l02_kv_cache.ipynb")


class KVCache:
    """Exercise 2.5: a preallocated KV cache for one sequence, filled layer by layer.

    K and V live in two buffers of shape [num_layers, max_tokens, num_kv_heads, head_dim]
    allocated once, in `dtype`. Each layer keeps its own fill length, because a forward
    pass appends to layer 0, then layer 1, and so on.

    >>> cache = KVCache(num_layers=2, max_tokens=16, num_kv_heads=2, head_dim=8)
    >>> cache.append(0, torch.randn(5, 2, 8), torch.randn(5, 2, 8))   # prefill 5 tokens
    >>> cache.length(0), cache.length(1), cache.read(0)[0].shape
    (5, 0, torch.Size([5, 2, 8]))
    """

    def __init__(self, num_layers: int, max_tokens: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        raise NotImplementedError("Exercise 2.5 (KVCache.__init__): see section 2.5 of lessons/l02_kv_cache.ipynb")

    def length(self, layer: int = 0) -> int:
        """Tokens stored so far in `layer`."""
        raise NotImplementedError("Exercise 2.5 (KVCache.length): see section 2.5 of lessons/l02_kv_cache.ipynb")

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new tokens' k, v ([new_tokens, num_kv_heads, head_dim]) after those already in
        `layer`, converted to the cache's dtype. Raises ValueError rather than go past max_tokens."""
        raise NotImplementedError("Exercise 2.5 (KVCache.append): see section 2.5 of lessons/l02_kv_cache.ipynb")

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) of every token stored in `layer`, each [length(layer), num_kv_heads, head_dim]."""
        raise NotImplementedError("Exercise 2.5 (KVCache.read): see section 2.5 of lessons/l02_kv_cache.ipynb")

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Exercise 2.5: one attention layer's step: append this step's k, v to `layer`, then
        return decode_attention of q ([T, num_heads, head_dim]) over everything cached there."""
        raise NotImplementedError("Exercise 2.5 (KVCache.attend): see section 2.5 of lessons/l02_kv_cache.ipynb")


# Configs used in the examples above (fields from the models' public config.json files).
LLAMA_3_70B = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
               "hidden_size": 8192}
LLAMA_3_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096}
