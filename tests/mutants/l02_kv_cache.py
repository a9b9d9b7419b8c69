"""Plausible wrong answers for lesson 02; each must be caught, and named, by its check."""
from __future__ import annotations

import math

import torch

from solutions import l02_kv_cache as sol
from tests.mutants import mutant


def _m_fields(config):
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    return config["num_hidden_layers"], heads, kv, config.get("head_dim") or config["hidden_size"] // heads


# -- 2.1 -----------------------------------------------------------------------------------------

@mutant(check="dtype_bytes", message="bits instead of bytes")
def dtype_bytes(dtype):
    return 8 * sol.dtype_bytes(dtype)


@mutant(check="dtype_bytes", message="accepts a bool as a byte width")
def dtype_bytes(dtype):  # noqa: F811 - isinstance(True, int) is True, and True in (1, 2, 4, 8)
    if isinstance(dtype, int):
        if dtype not in (1, 2, 4, 8):
            raise ValueError(f"a byte width must be 1, 2, 4 or 8, got {dtype}")
        return int(dtype)
    return sol.dtype_bytes(dtype)


@mutant(check="dtype_bytes", message="matches names case-sensitively")
def dtype_bytes(dtype):  # noqa: F811
    if isinstance(dtype, str) and dtype != dtype.lower():
        raise ValueError(f"unknown dtype {dtype!r}")
    return sol.dtype_bytes(dtype)


def _m_bits(dtype):
    return 8 * sol.dtype_bytes(dtype)


@mutant(check="kv_bytes_per_token", message="bits instead of bytes")
def kv_bytes_per_token(config, dtype):
    L, _, kv, hd = _m_fields(config)
    return 2 * L * kv * hd * _m_bits(dtype)


@mutant(check="kv_bytes_per_token", message="counts only K, not K and V")
def kv_bytes_per_token(config, dtype):  # noqa: F811 - each mutant is its own wrong answer
    L, _, kv, hd = _m_fields(config)
    return L * kv * hd * sol.dtype_bytes(dtype)


@mutant(check="kv_bytes_per_token", message="ignores num_key_value_heads")
def kv_bytes_per_token(config, dtype):  # noqa: F811
    L, heads, _, hd = _m_fields(config)
    return 2 * L * heads * hd * sol.dtype_bytes(dtype)


@mutant(check="kv_bytes_per_token", message="uses hidden_size instead of")
def kv_bytes_per_token(config, dtype):  # noqa: F811
    return 2 * config["num_hidden_layers"] * config["hidden_size"] * sol.dtype_bytes(dtype)


@mutant(check="kv_bytes_per_token", message="ignores an explicit head_dim")
def kv_bytes_per_token(config, dtype):  # noqa: F811
    L, heads, kv, _ = _m_fields(config)
    return 2 * L * kv * (config["hidden_size"] // heads) * sol.dtype_bytes(dtype)


@mutant(check="kv_bytes_per_token", message="forgets the number of layers")
def kv_bytes_per_token(config, dtype):  # noqa: F811
    _, _, kv, hd = _m_fields(config)
    return 2 * kv * hd * sol.dtype_bytes(dtype)


@mutant(check="kv_bytes_per_token", message="treats a field that is present but null as set")
def kv_bytes_per_token(config, dtype):  # noqa: F811 - get(key, default) returns None for "key": null
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim", config["hidden_size"] // heads)
    return 2 * config["num_hidden_layers"] * kv * head_dim * sol.dtype_bytes(dtype)


@mutant(check="kv_bytes_per_token", message="torch_dtype instead of the dtype argument")
def kv_bytes_per_token(config, dtype):  # noqa: F811
    return sol.kv_bytes_per_token(config, config.get("torch_dtype") or dtype)


# -- 2.2 -----------------------------------------------------------------------------------------

@mutant(check="kv_cache_bytes", message="forgets to multiply by the number of users")
def kv_cache_bytes(config, dtype, num_users, context_len):
    return context_len * sol.kv_bytes_per_token(config, dtype)


@mutant(check="max_users", message="returns a fraction of a user")
def max_users(config, dtype, context_len, free_bytes):
    return max(0.0, free_bytes / sol.kv_cache_bytes(config, dtype, 1, context_len))


@mutant(check="max_users", message="rounds up")
def max_users(config, dtype, context_len, free_bytes):  # noqa: F811
    return max(0, math.ceil(free_bytes / sol.kv_cache_bytes(config, dtype, 1, context_len)))


@mutant(check="max_users", message="to the nearest whole number")
def max_users(config, dtype, context_len, free_bytes):  # noqa: F811
    return max(0, round(free_bytes / sol.kv_cache_bytes(config, dtype, 1, context_len)))


@mutant(check="max_users", message="counts tokens that fit, not sequences")
def max_users(config, dtype, context_len, free_bytes):  # noqa: F811
    return max(0, int(free_bytes // sol.kv_bytes_per_token(config, dtype)))


@mutant(check="max_users", message="negative number of users")
def max_users(config, dtype, context_len, free_bytes):  # noqa: F811
    return int(free_bytes // sol.kv_cache_bytes(config, dtype, 1, context_len))


@mutant(check="max_users", message="returns a float count")
def max_users(config, dtype, context_len, free_bytes):  # noqa: F811 - floor division of a float is a float
    return max(0, free_bytes // sol.kv_cache_bytes(config, dtype, 1, context_len))


# -- 2.3 -----------------------------------------------------------------------------------------

@mutant(check="users_per_gpu", message="forgets to subtract the weights")
def users_per_gpu(config, num_params, context_len, gpu_bytes, weight_dtype="bfloat16", kv_dtype="bfloat16"):
    return sol.max_users(config, kv_dtype, context_len, gpu_bytes)


@mutant(check="users_per_gpu", message="negative number of users when the weights do not fit")
def users_per_gpu(config, num_params, context_len, gpu_bytes, weight_dtype="bfloat16",  # noqa: F811
                  kv_dtype="bfloat16"):
    free = gpu_bytes - num_params * sol.dtype_bytes(weight_dtype)
    return int(free // sol.kv_cache_bytes(config, kv_dtype, 1, context_len))


@mutant(check="users_per_gpu", message="sizes the weights with the KV cache's dtype")
def users_per_gpu(config, num_params, context_len, gpu_bytes, weight_dtype="bfloat16",  # noqa: F811
                  kv_dtype="bfloat16"):
    return sol.users_per_gpu(config, num_params, context_len, gpu_bytes, kv_dtype, kv_dtype)


# -- 2.4 -----------------------------------------------------------------------------------------

def _m_attention(q, k, v, scale=True, heads="interleave", mask="end", softmax_dim=-1):
    """Attention written the way a learner would, with one switchable mistake."""
    T, H, D = q.shape
    S, H_kv, _ = k.shape
    g = H // H_kv
    if heads == "interleave":
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    else:
        k, v = k.repeat(1, g, 1), v.repeat(1, g, 1)
    scores = torch.einsum("thd,shd->hts", q, k)
    if scale:
        scores = scores / math.sqrt(D)
    if mask != "none":
        q_pos = torch.arange(S - T, S) if mask == "end" else torch.arange(T)
        scores = scores.masked_fill(torch.arange(S)[None, :] > q_pos[:, None], float("-inf"))
    p = torch.nan_to_num(scores.softmax(dim=softmax_dim))
    return torch.einsum("hts,shd->thd", p, v)


@mutant(check="decode_attention", message="computes the scores and the softmax in bf16")
def decode_attention(q, k, v):  # noqa: F811 - right in float32, but no upcast for bf16 inputs
    return _m_attention(q, k, v)


@mutant(check="decode_attention", message="missing the 1/sqrt(head_dim) scale")
def decode_attention(q, k, v):
    return _m_attention(q, k, v, scale=False)


@mutant(check="decode_attention", message="repeat instead of repeat_interleave")
def decode_attention(q, k, v):  # noqa: F811
    return _m_attention(q, k, v, heads="repeat")


@mutant(check="decode_attention", message="no causal mask")
def decode_attention(q, k, v):  # noqa: F811
    return _m_attention(q, k, v, mask="none")


@mutant(check="decode_attention", message="aligns the causal mask top-left")
def decode_attention(q, k, v):  # noqa: F811
    return _m_attention(q, k, v, mask="start")


@mutant(check="decode_attention", message="softmax over the wrong axis")
def decode_attention(q, k, v):  # noqa: F811
    return _m_attention(q, k, v, softmax_dim=-2)  # scores are [H, T, S]: this normalises over queries


@mutant(check="decode_attention", message="softmax over the wrong axis")
def decode_attention(q, k, v):  # noqa: F811
    return _m_attention(q, k, v, softmax_dim=0)  # over heads


# -- 2.5 -----------------------------------------------------------------------------------------

# Python 3.11's inspect finds a class's source by its name, so every mutant class named KVCache would
# be read as the first one: each mutant is a factory function named KVCache returning its class.

class _m_Overwrites(sol.KVCache):
    def append(self, layer, k, v):
        n = k.shape[0]
        self.k[layer, :n] = k
        self.v[layer, :n] = v
        self.lengths[layer] = n


class _m_RefusesFull(sol.KVCache):
    def append(self, layer, k, v):  # off by one: refuses to reach max_tokens exactly
        if self.lengths[layer] + k.shape[0] >= self.k.shape[1]:
            raise ValueError("cache full")
        sol.KVCache.append(self, layer, k, v)


class _m_ReadsPast(sol.KVCache):
    def read(self, layer):
        return self.k[layer], self.v[layer]


class _m_AttendsFirst(sol.KVCache):
    def attend(self, layer, q, k, v):
        if self.length(layer) >= q.shape[0]:
            out = sol.decode_attention(q, *self.read(layer))
        else:  # nothing to attend to yet: fall back to the new tokens alone
            out = sol.decode_attention(q, k, v)
        self.append(layer, k, v)
        return out


class _m_NewOnly(sol.KVCache):
    def attend(self, layer, q, k, v):
        self.append(layer, k, v)
        return sol.decode_attention(q, k, v)


@mutant(check="kv_cache", message="overwrites the cache instead of appending")
def KVCache(*args, **kwargs):
    return _m_Overwrites(*args, **kwargs)


@mutant(check="kv_cache", message="refuses to fill the cache to exactly max_tokens")
def KVCache(*args, **kwargs):  # noqa: F811
    return _m_RefusesFull(*args, **kwargs)


@mutant(check="kv_cache", message="reads past the filled length")
def KVCache(*args, **kwargs):  # noqa: F811
    return _m_ReadsPast(*args, **kwargs)


@mutant(check="kv_cache_attend", message="attends before appending")
def KVCache(*args, **kwargs):  # noqa: F811
    return _m_AttendsFirst(*args, **kwargs)


@mutant(check="kv_cache_attend", message="attends only over this step's new tokens")
def KVCache(*args, **kwargs):  # noqa: F811
    return _m_NewOnly(*args, **kwargs)
