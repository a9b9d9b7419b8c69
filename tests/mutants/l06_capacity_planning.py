"""Plausible wrong answers for lesson 06, each caught by its check with the mistake named."""
import math

from solutions.l06_capacity_planning import DTYPE_BITS, GiB, config_shape
from solutions.l06_capacity_planning import kv_bytes_per_token as _m_whole
from solutions.l06_capacity_planning import kv_bytes_per_token_per_gpu as _m_kv
from solutions.l06_capacity_planning import param_count as _m_param_count
from solutions.l06_capacity_planning import weight_bytes as _m_wb
from tests.mutants import mutant


def _m_params(config, kv_heads=None, mlp_mats=3, norms=True, lm_head_always=False):
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    s = config_shape(config)
    kv = kv_heads or s["kv_heads"]
    attn = 2 * h * s["heads"] * s["head_dim"] + 2 * h * kv * s["head_dim"]
    tied = config.get("tie_word_embeddings", False) and not lm_head_always
    per_layer = attn + mlp_mats * h * inter + (2 * h if norms else 0)
    return config["num_hidden_layers"] * per_layer + vocab * h * (1 if tied else 2) + (h if norms else 0)


# ---------------------------------------------------------------- 1.1 param_count

@mutant(check="param_count", message="ignores num_key_value_heads")
def param_count(config):
    return _m_params(config, kv_heads=config["num_attention_heads"])


@mutant(check="param_count", message="SwiGLU has three")
def param_count(config):  # noqa: F811
    return _m_params(config, mlp_mats=2)


@mutant(check="param_count", message="leaves out the RMSNorm weights")
def param_count(config):  # noqa: F811
    return _m_params(config, norms=False)


@mutant(check="param_count", message="counts a separate lm_head although tie_word_embeddings is true")
def param_count(config):  # noqa: F811
    return _m_params(config, lm_head_always=True)


@mutant(check="param_count", message="uses hidden_size / num_attention_heads")
def param_count(config):  # noqa: F811
    return _m_param_count({k: v for k, v in config.items() if k != "head_dim"})


# ---------------------------------------------------------------- 2.1 quantized_linear_bytes

@mutant(check="quantized_linear_bytes", message="forgets the fp16 group scales")
def quantized_linear_bytes(out_features, in_features, group_size=128, zero_point=False):
    groups = out_features * math.ceil(in_features / group_size)
    return out_features * in_features / 2 + (groups * 0.5 if zero_point else 0)


@mutant(check="quantized_linear_bytes", message="one scale per row instead of one per group")
def quantized_linear_bytes(out_features, in_features, group_size=128, zero_point=False):  # noqa: F811
    return out_features * in_features / 2 + out_features * (2.5 if zero_point else 2)


@mutant(check="quantized_linear_bytes", message="bits vs bytes")
def quantized_linear_bytes(out_features, in_features, group_size=128, zero_point=False):  # noqa: F811
    groups = out_features * math.ceil(in_features / group_size)
    return out_features * in_features * 4 + groups * (2.5 if zero_point else 2)


@mutant(check="quantized_linear_bytes", message="dropping the short last group")
def quantized_linear_bytes(out_features, in_features, group_size=128, zero_point=False):  # noqa: F811
    groups = out_features * (in_features // group_size)
    return out_features * in_features / 2 + groups * (2.5 if zero_point else 2)


@mutant(check="quantized_linear_bytes", message="floor-divides the bits by 8")
def quantized_linear_bytes(out_features, in_features, group_size=128, zero_point=False):  # noqa: F811
    groups = out_features * math.ceil(in_features / group_size)
    return (out_features * in_features * 4 + groups * (16 + (4 if zero_point else 0))) // 8


# ---------------------------------------------------------------- 2.2 weight_bytes

@mutant(check="weight_bytes", message="dropping the short last group")
def weight_bytes(n_params, dtype, group_size=128, zero_point=False):  # noqa: F811
    if dtype != "int4":
        return _m_wb(n_params, dtype, group_size, zero_point)
    return n_params / 2 + (n_params // group_size) * (2.5 if zero_point else 2)


@mutant(check="weight_bytes", message="forgets the fp16 group scales")
def weight_bytes(n_params, dtype, group_size=128, zero_point=False):
    return n_params * DTYPE_BITS[dtype] / 8


@mutant(check="weight_bytes", message="returns bits, not bytes")
def weight_bytes(n_params, dtype, group_size=128, zero_point=False):  # noqa: F811
    return 8 * _m_wb(n_params, dtype, group_size, zero_point)


# ---------------------------------------------------------------- 3.1 kv_bytes_per_token_per_gpu
# The whole model's bytes come from the given helper (_m_whole); what a learner writes is the split.

@mutant(check="kv_bytes_per_token_per_gpu", message="divides the whole model's bytes by TP")
def kv_bytes_per_token_per_gpu(config, kv_dtype="bf16", tp=1):
    return _m_whole(config, kv_dtype) // tp  # (with / it is a float as well: the check names that first)


@mutant(check="kv_bytes_per_token_per_gpu", message="does not divide the KV heads across the TP ranks")
def kv_bytes_per_token_per_gpu(config, kv_dtype="bf16", tp=1):  # noqa: F811
    return _m_whole(config, kv_dtype)


@mutant(check="kv_bytes_per_token_per_gpu", message="rounds the KV heads per rank down")
def kv_bytes_per_token_per_gpu(config, kv_dtype="bf16", tp=1):  # noqa: F811
    kv_heads = config_shape(config)["kv_heads"]
    return _m_whole(config, kv_dtype) // kv_heads * (kv_heads // tp)


@mutant(check="kv_bytes_per_token_per_gpu", message="uses the query heads, not the KV heads")
def kv_bytes_per_token_per_gpu(config, kv_dtype="bf16", tp=1):  # noqa: F811
    s = config_shape(config)
    return _m_whole(config, kv_dtype) // s["kv_heads"] * math.ceil(s["heads"] / tp)


@mutant(check="kv_bytes_per_token_per_gpu", message="takes one head's bytes as the whole model's / num_attention_heads")
def kv_bytes_per_token_per_gpu(config, kv_dtype="bf16", tp=1):  # noqa: F811
    s = config_shape(config)
    return _m_whole(config, kv_dtype) // s["heads"] * math.ceil(s["kv_heads"] / tp)


# ---------------------------------------------------------------- 4.1 max_users

def _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype, util, reserve_gib,
             reserve_unit=GiB, split_kv=True, split_weights=True, floor=True, clamp=True, reason_when=None):
    weights = _m_wb(_m_param_count(config), weight_dtype) / (n_gpus if split_weights else 1)
    kv_token = _m_kv(config, kv_dtype, n_gpus if split_kv else 1)
    free = gpu_mem_bytes * util - weights - reserve_gib * reserve_unit
    users = free / (kv_token * context_len)
    users = (free // (kv_token * context_len) if floor == "//" else math.floor(users)) if floor else users
    users = max(0, users) if clamp else users
    fails = users <= 0 if reason_when is None else reason_when(free, users)
    return {"weight_bytes_per_gpu": weights, "kv_bytes_per_token_per_gpu": kv_token,
            "free_kv_bytes_per_gpu": free, "users": users,
            "reason": "the weights do not fit" if fails else None}


@mutant(check="max_users", message="does not round the user count down")
def max_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype="bf16", kv_dtype="bf16",
              gpu_memory_utilization=0.9, reserve_gib=2.0):
    return _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype,
                  gpu_memory_utilization, reserve_gib, floor=False)


@mutant(check="max_users", message="returns a float count")
def max_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype="bf16", kv_dtype="bf16",  # noqa: F811
              gpu_memory_utilization=0.9, reserve_gib=2.0):
    return _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype,
                    gpu_memory_utilization, reserve_gib, floor="//")


@mutant(check="max_users", message="does not subtract the runtime reserve")
def max_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype="bf16", kv_dtype="bf16",  # noqa: F811
              gpu_memory_utilization=0.9, reserve_gib=2.0):
    return _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype,
                  gpu_memory_utilization, reserve_gib, reserve_unit=0)


@mutant(check="max_users", message="treats reserve_gib as GB")
def max_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype="bf16", kv_dtype="bf16",  # noqa: F811
              gpu_memory_utilization=0.9, reserve_gib=2.0):
    return _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype,
                  gpu_memory_utilization, reserve_gib, reserve_unit=10**9)


@mutant(check="max_users", message="counts the KV per token of the whole model on every GPU")
def max_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype="bf16", kv_dtype="bf16",  # noqa: F811
              gpu_memory_utilization=0.9, reserve_gib=2.0):
    return _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype,
                  gpu_memory_utilization, reserve_gib, split_kv=False)


@mutant(check="max_users", message="puts the whole model's weights on every GPU")
def max_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype="bf16", kv_dtype="bf16",  # noqa: F811
              gpu_memory_utilization=0.9, reserve_gib=2.0):
    return _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype,
                  gpu_memory_utilization, reserve_gib, split_weights=False)


@mutant(check="max_users", message="reports a negative user count")
def max_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype="bf16", kv_dtype="bf16",  # noqa: F811
              gpu_memory_utilization=0.9, reserve_gib=2.0):
    return _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype,
                  gpu_memory_utilization, reserve_gib, clamp=False)


@mutant(check="max_users", message="reason should be a sentence saying why")
def max_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype="bf16", kv_dtype="bf16",  # noqa: F811
              gpu_memory_utilization=0.9, reserve_gib=2.0):
    # a reason only for the weights not fitting, None when one sequence is too long for what is free
    return _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype,
                    gpu_memory_utilization, reserve_gib, reason_when=lambda free, users: free <= 0)


@mutant(check="max_users", message="gives the same reason for both causes")
def max_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype="bf16", kv_dtype="bf16",  # noqa: F811
              gpu_memory_utilization=0.9, reserve_gib=2.0):
    return _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype,
                    gpu_memory_utilization, reserve_gib)


@mutant(check="max_users", message="uses gpu_memory_utilization=0.9 whatever the caller passes")
def max_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype="bf16", kv_dtype="bf16",  # noqa: F811
              gpu_memory_utilization=0.9, reserve_gib=2.0):
    return _m_users(config, gpu_mem_bytes, n_gpus, context_len, weight_dtype, kv_dtype, 0.9, reserve_gib)


@mutant(check="param_count", message="treats a field that is present but null as set")
def param_count(config):  # noqa: F811 - config.get(key, default) returns None for "key": null
    h, heads = config["hidden_size"], config["num_attention_heads"]
    kv, d = config.get("num_key_value_heads", heads), config.get("head_dim", h // heads)
    attn = 2 * h * heads * d + 2 * h * kv * d
    lm = 0 if config.get("tie_word_embeddings", False) else config["vocab_size"] * h
    return (config["num_hidden_layers"] * (attn + 3 * h * config["intermediate_size"] + 2 * h)
            + config["vocab_size"] * h + h + lm)
