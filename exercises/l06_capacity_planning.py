# Lesson 06 exercises: replace each `raise NotImplementedError` with your code.
# Check your work with `course check 06`. (Generated from solutions/l06_capacity_planning.py by
# `course sync`; keep the names and signatures.)
"""Lesson 06: capacity planning in bf16, fp8 and under tensor parallelism.

The budget of one GPU, as vLLM sizes it at startup:

    KV bytes free per GPU = total * gpu_memory_utilization - weights per GPU - runtime reserve
    concurrent users at context L = floor(free / (KV bytes per token per GPU * L))

Conventions:
- Models are Llama-style Hugging Face config.json dicts. Missing `num_key_value_heads` means
  multi-head attention (as many KV heads as query heads); missing `head_dim` means
  hidden_size / num_attention_heads; missing `tie_word_embeddings` means untied (the default of
  transformers' LlamaConfig). Biases are not counted: Llama's attention_bias and mlp_bias are false.
- Formats are named by strings; DTYPE_BITS gives their bits per element, bytes = bits / 8.
- Units: bytes. GB = 1e9 bytes (datasheets), GiB = 2**30 bytes (what engines and nvidia-smi's
  MiB columns count in).
"""
from __future__ import annotations

import math

from reference_engine.config import attention_shape
from reference_engine.config import kv_bytes_per_token as engine_kv_bytes_per_token

# Bits per element. int4 is a weight-only format: see quantized_linear_bytes for its scales.
DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}
SCALE_BITS = 16  # one fp16 scale per group of int4 weights (GPTQ, AWQ)
ZERO_BITS = 4    # an asymmetric group's zero point, packed 4-bit like the weights (GPTQ/AWQ qzeros)

GB, GiB = 10**9, 2**30

# HBM per GPU from the vendor datasheets, in GB as printed there (1 GB taken as 1e9 bytes): the LABEL.
# The course's convention for capacity is the memory the driver reports, which is what vLLM multiplies by
# gpu_memory_utilization: H100 SXM 81,559 MiB = 85.52e9 bytes, H200 SXM 143,771 MiB = 150.75e9 bytes (nvidia-smi /
# NVML, via Modal's "Why does an NVIDIA H100 80GB card offer 85.52 GB?"; kept in reference_engine/sim/gpu_model.py).
# The label is a few percent less and is used only where a figure says so. max_users takes either: it is an input.
GPU_MEMORY_BYTES = {"H100 SXM": 80 * GB, "H200 SXM": 141 * GB}

# Two more accelerators, datasheet labels (their driver totals are not collected here): NVIDIA HGX B200 datasheet,
# 1.44 TB of HBM3e over 8 GPUs = 180 GB each; AMD Instinct MI300X data sheet, 192 GB of HBM3.
OTHER_GPU_MEMORY_BYTES = {"B200 (HGX)": 180 * GB, "MI300X": 192 * GB}

# A mixture-of-experts model for section 4's last part: DeepSeek-V3's technical report (arXiv:2412.19437) gives 671B
# parameters in all and 37B activated per token; its KV cache is MLA's latent, 61 layers x (512 + 64) x 2 bytes
# = 70,272 bytes per token in bf16 (config.json: kv_lora_rank 512, qk_rope_head_dim 64).
DEEPSEEK_V3 = {"name": "DeepSeek-V3", "params": 671e9, "active_params": 37e9, "kv_bytes_per_token": 61 * (512 + 64) * 2}

# The fields of the models' config.json that matter here (meta-llama on the Hugging Face hub).
LLAMA_3_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
               "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
               "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
LLAMA_3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def config_shape(config: dict) -> dict:
    """The attention shape of a config with the defaults filled in: heads, kv_heads, head_dim
    (read by the engine, reference_engine.config.attention_shape)."""
    s = attention_shape(config)
    return {"heads": s.num_attention_heads, "kv_heads": s.num_key_value_heads, "head_dim": s.head_dim}


def kv_bytes_per_token(config: dict, kv_dtype: str = "bf16") -> int:
    """Bytes of K and V one token adds to the cache of the whole model (given, not an exercise).

    Lesson 02's formula, 2 (K and V) x layers x kv_heads x head_dim x DTYPE_BITS[kv_dtype] / 8 with
    config_shape's defaults, computed by the engine (reference_engine.config.kv_bytes_per_token).

    Example: kv_bytes_per_token(LLAMA_3_70B, "bf16") == 2 * 80 * 8 * 128 * 2 == 327680
    """
    bits = DTYPE_BITS[kv_dtype]
    if bits % 8:
        raise ValueError(f"{kv_dtype} is a weight-only format here: a KV cache element takes whole bytes")
    return engine_kv_bytes_per_token(attention_shape(config), bits // 8)


# ---------------------------------------------------------------- 1. parameters


def param_count(config: dict) -> int:
    """Exercise 1.1: the number of parameters of a Llama-style decoder, from its config.json.

    Count, with h = hidden_size, I = intermediate_size, H = num_attention_heads,
    K = num_key_value_heads, d = head_dim (defaults: see config_shape):
      - token embeddings: vocab_size x h
      - per layer, attention: q_proj h x H*d, k_proj and v_proj h x K*d each, o_proj H*d x h
      - per layer, SwiGLU MLP: gate_proj and up_proj h x I, down_proj I x h (three matrices)
      - per layer, two RMSNorm weight vectors of h (before attention, before the MLP)
      - the final RMSNorm (h)
      - lm_head vocab_size x h, unless tie_word_embeddings is true (then it reuses the embeddings)
    No biases.

    Example: param_count(LLAMA_3_8B) == 8030261248
    """
    raise NotImplementedError("Exercise 1.1 (param_count): see section 1.1 of lessons/l06_capacity_planning.ipynb")


# ---------------------------------------------------------------- 2. weight bytes


def quantized_linear_bytes(out_features: int, in_features: int, group_size: int = 128,
                           zero_point: bool = False) -> float:
    """Exercise 2.1: bytes of one int4 weight matrix W[out_features, in_features], with its scales.

    Layout (GPTQ/AWQ style): each weight is 4 bits, packed two to a byte. Each row of W is cut into
    groups of `group_size` consecutive weights along the input dimension, ceil(in / g) groups per
    row (the last one may be short), and every group stores one fp16 scale (2 bytes). With
    zero_point=True (asymmetric quantization) every group also stores a 4-bit zero point (0.5 B).

    Example: quantized_linear_bytes(8192, 8192, 128) == 8192 * 8192 / 2 + 8192 * 64 * 2 == 34603008.0
    """
    raise NotImplementedError("Exercise 2.1 (quantized_linear_bytes): see section 2.1 of lessons/l06_capacity_planning.ipynb")


def weight_bytes(n_params: int, dtype: str, group_size: int = 128, zero_point: bool = False) -> float:
    """Exercise 2.2: bytes of `n_params` weights stored in `dtype` (a key of DTYPE_BITS).

    Every weight takes DTYPE_BITS[dtype] / 8 bytes. For "int4" add the group scales (and zero
    points) of quantized_linear_bytes; treat the count as rows whose lengths are multiples of
    group_size (true of every Llama matrix for g <= 128), so there are ceil(n_params / g) groups.
    group_size and zero_point matter only for int4.

    Example: weight_bytes(1_000_000, "bf16") == 2e6;  weight_bytes(1_024, "int4", 128) == 528.0
    """
    raise NotImplementedError("Exercise 2.2 (weight_bytes): see section 2.2 of lessons/l06_capacity_planning.ipynb")


# ---------------------------------------------------------------- 3. KV cache under tensor parallelism


def kv_bytes_per_token_per_gpu(config: dict, kv_dtype: str = "bf16", tp: int = 1) -> int:
    """Exercise 3.1: bytes of KV cache one token takes on each GPU of a tensor-parallel group.

    The whole model's bytes per token are lesson 02's formula, computed for you by the given
    kv_bytes_per_token(config, kv_dtype); config_shape(config)["kv_heads"] gives the KV heads.
    What is new is the split. Under tensor parallelism of degree `tp` each rank keeps the K and V
    of its own KV heads only, every head the same size. With more ranks than KV heads a head
    cannot be split: each rank still holds one whole KV head, and the heads are replicated (vLLM:
    num_kv_heads = 1 and num_kv_head_replicas = tp / kv_heads when tp >= kv_heads). So a rank
    holds ceil(kv_heads / tp) heads. (vLLM accepts only tp that divides the attention heads and
    either divides or is a multiple of the KV heads; you need not check.) Returns an int.

    Example: kv_bytes_per_token_per_gpu(LLAMA_3_70B, "bf16", 8) == 327680 // 8 * 1 == 40960
             kv_bytes_per_token_per_gpu(LLAMA_3_70B, "bf16", 16) == 40960 as well
    """
    raise NotImplementedError("Exercise 3.1 (kv_bytes_per_token_per_gpu): see section 3.1 of lessons/l06_capacity_planning.ipynb")


# ---------------------------------------------------------------- 4. concurrent users


def max_users(config: dict, gpu_mem_bytes: float, n_gpus: int, context_len: int,
              weight_dtype: str = "bf16", kv_dtype: str = "bf16",
              gpu_memory_utilization: float = 0.9, reserve_gib: float = 2.0) -> dict:
    """Exercise 4.1: how many sequences of `context_len` tokens fit in the KV cache of a TP group.

    The model runs with tensor parallelism over `n_gpus` GPUs of `gpu_mem_bytes` bytes each. The
    weights (param_count, weight_bytes with its defaults) are split evenly across the ranks. As
    in vLLM, the engine may use gpu_memory_utilization of each GPU's memory; out of that come the
    weights and a runtime reserve of `reserve_gib` GiB (2**30 bytes) per GPU (activations, CUDA
    graphs, fragmentation), and the rest holds KV cache. A user needs context_len tokens of KV.

    Returns a dict:
      "weight_bytes_per_gpu":       weight bytes / n_gpus
      "kv_bytes_per_token_per_gpu": kv_bytes_per_token_per_gpu(config, kv_dtype, n_gpus)
      "free_kv_bytes_per_gpu":      gpu_mem_bytes * util - weights per GPU - reserve (bytes;
                                    negative when the weights do not fit)
      "users":                      floor(free / (KV bytes per token per GPU * context_len)), an
                                    int, 0 when nothing fits
      "reason":                     None when users > 0, else a sentence saying which of the two
                                    causes it is: the weights (with the reserve) do not fit, or they
                                    do but one sequence of context_len tokens needs more KV than is free

    Example: max_users(LLAMA_3_70B, 80e9, 8, 8192)["users"] == 155   (80e9: the H100's datasheet label)
    """
    raise NotImplementedError("Exercise 4.1 (max_users): see section 4.1 of lessons/l06_capacity_planning.ipynb")
