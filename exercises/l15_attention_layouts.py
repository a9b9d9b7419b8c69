# Lesson 15 exercises: replace each `raise NotImplementedError` with your code.
# Check your work with `course check 15`. (Generated from solutions/l15_attention_layouts.py by
# `course sync`; keep the names and signatures.)
"""Lesson 15: MHA, GQA, MQA and MLA attention layouts, and what each caches per token.

- MHA caches a K and a V vector per query head; GQA shares each K/V head among a group of query
  heads (MQA: one K/V head for all of them).
- MLA (DeepSeek-V2/V3) caches, per layer, one compressed latent shared by every head plus one
  small RoPE key, and expands them to per-head K and V only inside attention; with the
  up-projections absorbed into the query and the output, it never expands them at all.
Sizes are in bytes; 1 GB = 10**9 bytes.
"""
from __future__ import annotations

import math

import torch

from reference_engine.config import attention_shape
from reference_engine.config import kv_bytes_per_token as engine_kv_bytes_per_token
from reference_engine.kernels.launch import launch
from reference_engine.kernels.triton_compat import tl, triton  # Triton; without it (macOS) a stand-in: see there

# ---------------------------------------------------------------- model configs
# Fields as in each model's Hugging Face config.json (only those used here).
LLAMA_3_8B = {"name": "Llama-3-8B", "num_hidden_layers": 32, "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
              "vocab_size": 128256, "tie_word_embeddings": False}
LLAMA_3_70B = {"name": "Llama-3-70B", "num_hidden_layers": 80, "hidden_size": 8192,
               "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672,
               "vocab_size": 128256, "tie_word_embeddings": False}
# Not a released model: Llama-3-70B's shapes with one K/V head per query head (MHA), the
# baseline that GQA shrinks. Its K/V projections grow to 8192 x 8192, so it has more parameters.
LLAMA_3_70B_MHA = {**LLAMA_3_70B, "name": "Llama-3-70B as MHA", "num_key_value_heads": 64}
MISTRAL_7B = {"name": "Mistral-7B-v0.1", "num_hidden_layers": 32, "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
              "vocab_size": 32000, "tie_word_embeddings": False}
DEEPSEEK_V2 = {"name": "DeepSeek-V2", "num_hidden_layers": 60, "hidden_size": 5120,
               "num_attention_heads": 128, "num_key_value_heads": 128,
               "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
               "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 12288,
               "moe_intermediate_size": 1536, "n_routed_experts": 160, "n_shared_experts": 2,
               "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
               "vocab_size": 102400, "tie_word_embeddings": False}
DEEPSEEK_V3 = {"name": "DeepSeek-V3", "num_hidden_layers": 61, "hidden_size": 7168,
               "num_attention_heads": 128, "num_key_value_heads": 128,
               "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
               "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
               "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
               "topk_method": "noaux_tc", "num_nextn_predict_layers": 1,
               "vocab_size": 129280, "tie_word_embeddings": False}
MODELS = [LLAMA_3_8B, MISTRAL_7B, LLAMA_3_70B, LLAMA_3_70B_MHA, DEEPSEEK_V2, DEEPSEEK_V3]
# Layouts where most layers attend only to a sliding window of recent tokens (section 3.4). Gemma 3 27B
# (google/gemma-3-27b-it config.json; Gemma 3 technical report, 2025: 5 local layers per global one, a
# 1,024-token window): layer i is global when (i + 1) % sliding_window_pattern == 0 (6 is transformers'
# Gemma3TextConfig default, which the checkpoint's config leaves to it). gpt-oss-120b
# (openai/gpt-oss-120b config.json; its model card, 2025: dense and 128-token banded layers alternate).
GEMMA_3_27B = {"name": "Gemma-3-27B", "num_hidden_layers": 62, "hidden_size": 5376, "num_attention_heads": 32,
               "num_key_value_heads": 16, "head_dim": 128, "sliding_window": 1024, "sliding_window_pattern": 6}
GPT_OSS_120B = {"name": "gpt-oss-120b", "num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
                "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"] * 18}


def _attention_params(c: dict) -> int:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    if c.get("kv_lora_rank"):
        qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        r = c.get("q_lora_rank")
        q = h * heads * qk if not r else h * r + r + r * heads * qk          # q_lora: a, norm, b
        kv = (h * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) + c["kv_lora_rank"]
              + c["kv_lora_rank"] * heads * (c["qk_nope_head_dim"] + c["v_head_dim"]))
        return q + kv + heads * c["v_head_dim"] * h
    s = attention_shape(c)                                                     # config.json's defaults
    d, kv_heads = s.head_dim, s.num_key_value_heads
    return h * heads * d * 2 + h * kv_heads * d * 2                            # q, o; k, v


def param_count(config: dict) -> int:
    """Parameters of a Llama-style or DeepSeek-V2/V3-style decoder, from its config (a helper).

    Embeddings, the LM head (unless tied), and per layer: attention, a SwiGLU MLP (3 matrices) or
    an MoE block (router + routed and shared experts), two RMSNorms; the final norm. These models
    have no biases. DeepSeek-V3's multi-token-prediction module (num_nextn_predict_layers) is
    left out: it serves only speculative decoding and need not be loaded.
    """
    c, h = config, config["hidden_size"]
    layers = c["num_hidden_layers"]
    mlp = 3 * h * c["intermediate_size"]
    if c.get("n_routed_experts"):
        assert c.get("moe_layer_freq", 1) == 1
        dense_layers = c["first_k_dense_replace"]
        n_exp = c["n_routed_experts"]
        router = n_exp * h + (n_exp if c.get("topk_method") == "noaux_tc" else 0)  # + V3's bias
        moe = router + (n_exp + c["n_shared_experts"]) * 3 * h * c["moe_intermediate_size"]
        ffn = dense_layers * mlp + (layers - dense_layers) * moe
    else:
        ffn = layers * mlp
    embed = c["vocab_size"] * h * (1 if c.get("tie_word_embeddings") else 2)
    return embed + layers * (_attention_params(c) + 2 * h) + ffn + h


# ---------------------------------------------------------------- 1. bytes per token


def gqa_kv_bytes_per_token(config: dict, dtype_bytes: int) -> int:
    """Bytes of K and V one token caches over all layers, for MHA, GQA and MQA (given, not an exercise).

    Lesson 02's formula, 2 (K and V) * num_hidden_layers * kv_heads * head_dim * dtype_bytes, where a
    missing or null num_key_value_heads means MHA (= num_attention_heads) and a missing or null
    head_dim means hidden_size // num_attention_heads; computed by the engine
    (reference_engine.config). It reads the config literally: on an MLA config it gives the size of
    a per-head cache that no engine serving MLA allocates (section 1.1's trap).

    >>> gqa_kv_bytes_per_token(LLAMA_3_70B, 2)
    327680
    """
    return engine_kv_bytes_per_token(attention_shape(config), dtype_bytes)


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int:
    """Exercise 1.1: bytes of attention cache one token takes, over all layers, for any layout.

    `config` is a Hugging Face config.json as a dict; `dtype_bytes` the cache's bytes per element
    (2 for bf16, 1 for fp8).
    - MLA (the config has a non-null `kv_lora_rank`: DeepSeek-V2/V3): each layer caches one latent
      of kv_lora_rank elements, shared by all heads, plus one decoupled RoPE key of
      qk_rope_head_dim elements, also shared:
          (kv_lora_rank + qk_rope_head_dim) * num_hidden_layers * dtype_bytes.
      These configs also list num_key_value_heads (128) and may carry a head_dim: ignore both.
      A kv_lora_rank that is present but null means the model is not MLA.
    - Otherwise MHA/GQA/MQA: lesson 02's formula, which the given gqa_kv_bytes_per_token computes.

    >>> kv_bytes_per_token(LLAMA_3_70B, 2), kv_bytes_per_token(DEEPSEEK_V3, 2)
    (327680, 70272)
    """
    raise NotImplementedError("Exercise 1.1 (kv_bytes_per_token): see section 1.1 of lessons/l15_attention_layouts.ipynb")


def kv_capacity_tokens(config: dict, num_params: float, weight_bytes: float, kv_bytes: int,
                       num_gpus: int, gpu_bytes: float, kv_copies: int = 1) -> int:
    """Exercise 1.2: tokens of cache (summed over all sequences) that fit once the weights are in.

    The weights, num_params * weight_bytes bytes, are split across the num_gpus GPUs of
    gpu_bytes each and stored once. The rest holds the cache, kv_bytes_per_token(config,
    kv_bytes) per token, stored `kv_copies` times: 1 when each token's cache lives in one place
    (split by KV head under tensor parallelism, or data-parallel attention), num_gpus when every
    GPU keeps its own copy (an MLA latent under plain tensor parallelism: it has no heads to
    split). Whole tokens only; 0 (never negative) when the weights do not fit. Activations and
    CUDA graphs are ignored here.

    >>> kv_capacity_tokens(LLAMA_3_8B, 8e9, 2, 2, 1, 80e9)   # (80e9 - 16e9) // 131072
    488281
    """
    raise NotImplementedError("Exercise 1.2 (kv_capacity_tokens): see section 1.2 of lessons/l15_attention_layouts.ipynb")


def windowed_layers(config: dict) -> list[bool]:
    """Which layers attend only to a sliding window (given, not an exercise), from config.json: `layer_types`
    ("sliding_attention" / "full_attention") when present, else Gemma 3's `sliding_window_pattern` p (layer i is
    global when (i + 1) % p == 0); no `sliding_window` (missing or null) means every layer is global.

    >>> windowed_layers(GEMMA_3_27B).count(False), windowed_layers(GPT_OSS_120B).count(False)
    (10, 18)
    """
    n = config["num_hidden_layers"]
    if not config.get("sliding_window"):
        return [False] * n
    if config.get("layer_types"):
        return [kind == "sliding_attention" for kind in config["layer_types"]]
    p = config.get("sliding_window_pattern")
    return [bool(p) and (i + 1) % p != 0 for i in range(n)]


def window_kv_bytes(config: dict, context: int, dtype_bytes: int) -> int:
    """KV bytes one sequence of `context` tokens holds (given, not an exercise): a global layer keeps K and V of every
    token, a sliding-window layer only of the last `sliding_window` tokens (engines free the rest: vLLM's
    SlidingWindowSpec). Per layer and token, 2 x num_key_value_heads x head_dim x dtype_bytes.

    >>> window_kv_bytes(GEMMA_3_27B, 32768, 2) / window_kv_bytes({**GEMMA_3_27B, "sliding_window": None}, 32768, 2)
    0.1875
    """
    per_layer_token = gqa_kv_bytes_per_token(config, dtype_bytes) // config["num_hidden_layers"]
    window = config.get("sliding_window") or context
    return sum(per_layer_token * (min(context, window) if w else context) for w in windowed_layers(config))


# ---------------------------------------------------------------- 2. GQA decode


def gqa_decode_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     seq_lens: torch.Tensor) -> torch.Tensor:
    """Exercise 2.1: one decode step of GQA attention, in plain torch.

    q:       [batch, num_heads, head_dim], the new token's query per sequence.
    k_cache, v_cache: [batch, max_len, num_kv_heads, head_dim]; sequence b's keys are rows
             0 .. seq_lens[b] - 1 (the new token included); rows past that are stale junk.
    seq_lens: [batch] integer tensor, each 1 <= seq_lens[b] <= max_len.
    Returns [batch, num_heads, head_dim] in q's dtype (compute in float32).

    group = num_heads // num_kv_heads, and query head h reads KV head h // group (heads
    0 .. group-1 share KV head 0). Scores are scaled by 1 / sqrt(head_dim).

    >>> q, k = torch.randn(2, 8, 16), torch.randn(2, 5, 2, 16)
    >>> gqa_decode_torch(q, k, k, torch.tensor([5, 3])).shape
    torch.Size([2, 8, 16])
    """
    raise NotImplementedError("Exercise 2.1 (gqa_decode_torch): see section 2.1 of lessons/l15_attention_layouts.ipynb")


@triton.jit
def gqa_decode_kernel(q_ptr, k_ptr, v_ptr, lens_ptr, out_ptr, scale,
                      stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_ob, stride_oh,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """Exercise 2.2: one program = one (sequence, KV head); it serves all GROUP query heads.

    Grid (batch, num_kv_heads). Program (b, j) handles query heads j*GROUP .. j*GROUP+GROUP-1:
    - load their queries as a [GROUP_PAD, HEAD_DIM] tile (rows >= GROUP masked to 0: tl.dot
      needs every dimension >= 16, so the launcher pads the group to GROUP_PAD);
    - walk positions 0 .. seq_len-1 in blocks of BLOCK_N: load K and V of KV head j for the
      block once ([HEAD_DIM, BLOCK_N] and [BLOCK_N, HEAD_DIM], positions >= seq_len masked),
      scores = tl.dot(q, k) * scale for the whole group, positions past seq_len set to -inf;
    - online softmax: running max m, running sum l, accumulator acc [GROUP_PAD, HEAD_DIM];
      per block m_new = max(m, rowmax(s)), rescale l and acc by exp(m - m_new), add
      exp(s - m_new) and tl.dot(p, v);
    - store acc / l for the GROUP real rows, in out's dtype.
    Arguments: q_ptr [B, H, D], k_ptr/v_ptr [B, max_len, H_kv, D] (same strides, stride_k*),
    lens_ptr [B] int32, out_ptr [B, H, D]; element (b, h, i) of q is at
    q_ptr + b*stride_qb + h*stride_qh + i, element (b, s, j, i) of K at
    k_ptr + b*stride_kb + s*stride_kt + j*stride_kh + i (the last dimension is contiguous).
    scale = 1/sqrt(HEAD_DIM). Everything accumulates in float32.
    """
    raise NotImplementedError("Exercise 2.2 (gqa_decode_kernel): see section 2.2 of lessons/l15_attention_layouts.ipynb")


def launch_gqa_decode(kernel, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      seq_lens: torch.Tensor, block_n: int = 16) -> torch.Tensor:
    """Run a GQA decode `kernel` (with gqa_decode_kernel's signature) on grid (batch, num_kv_heads)."""
    B, H, D = q.shape
    _, _, H_kv, _ = k_cache.shape
    if H % H_kv or D < 16 or D & (D - 1) or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"need num_heads % num_kv_heads == 0 and head_dim, block_n powers of two "
                         f">= 16; got num_heads={H}, num_kv_heads={H_kv}, head_dim={D}, block_n={block_n}")
    group = H // H_kv
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    out = torch.empty_like(q)
    lens = seq_lens.to(device=q.device, dtype=torch.int32).contiguous()
    launch(kernel, (B, H_kv), q, k_cache, v_cache, lens, out, 1.0 / math.sqrt(D),
           q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
           out.stride(0), out.stride(1),
           GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=D, BLOCK_N=block_n,
           stub="Exercise 2.2 (gqa_decode_kernel): see section 2.2 of lessons/l15_attention_layouts.ipynb")
    return out


def gqa_decode_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      seq_lens: torch.Tensor, block_n: int = 16) -> torch.Tensor:
    """gqa_decode_torch's contract, computed by gqa_decode_kernel (a helper: the kernel is the exercise)."""
    return launch_gqa_decode(gqa_decode_kernel, q, k_cache, v_cache, seq_lens, block_n)


# ---------------------------------------------------------------- 3. MLA
# Weights use the names of transformers' DeepseekV2Attention (Linear weights are [out, in]):
#   q_proj.weight [H*(nope+rope), hidden]                       when q_lora_rank is null, else
#   q_a_proj.weight [q_lora, hidden], q_a_layernorm.weight [q_lora], q_b_proj.weight [H*(nope+rope), q_lora]
#   kv_a_proj_with_mqa.weight [kv_lora + rope, hidden], kv_a_layernorm.weight [kv_lora]
#   kv_b_proj.weight [H*(nope+v), kv_lora]   (per head: nope rows of W_UK, then v rows of W_UV)
#   o_proj.weight [hidden, H*v]

MLA_TINY = {"hidden_size": 64, "num_attention_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 32,
            "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "rope_theta": 10000.0}
NORM_EPS = 1e-6  # transformers builds q_a_layernorm and kv_a_layernorm with its default eps


def random_mla_weights(cfg: dict, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Random float32 weights for an MLA layer of shape `cfg` (Linear weights ~ 1/sqrt(fan_in))."""
    h, H = cfg["hidden_size"], cfg["num_attention_heads"]
    r, rope, nope, vd = (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"],
                         cfg["v_head_dim"])

    def lin(out_f, in_f):
        return torch.randn(out_f, in_f, generator=generator) / math.sqrt(in_f)

    def norm(n):  # not all ones, so that a skipped norm weight shows
        return 1.0 + 0.2 * torch.randn(n, generator=generator)

    w = {}
    if cfg.get("q_lora_rank"):
        w["q_a_proj.weight"] = lin(cfg["q_lora_rank"], h)
        w["q_a_layernorm.weight"] = norm(cfg["q_lora_rank"])
        w["q_b_proj.weight"] = lin(H * (nope + rope), cfg["q_lora_rank"])
    else:
        w["q_proj.weight"] = lin(H * (nope + rope), h)
    w["kv_a_proj_with_mqa.weight"] = lin(r + rope, h)
    w["kv_a_layernorm.weight"] = norm(r)
    w["kv_b_proj.weight"] = lin(H * (nope + vd), r)
    w["o_proj.weight"] = lin(h, H * vd)
    return w


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in float32 (as transformers does)."""
    xf = x.float()
    return (weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def rope_interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate x [T, ..., d] at `positions` [T], DeepSeek's way: adjacent pairs (x[2i], x[2i+1]).

    Pair i turns by positions * theta ** (-2i / d). (Llama's HF code pairs x[i] with x[i + d/2]
    instead, "rotate_half"; the two differ unless the weights are permuted to match.)
    """
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = positions.to(x.device).float()[:, None] * inv_freq[None, :]            # [T, d/2]
    ang = ang.reshape(ang.shape[0], *([1] * (x.dim() - 2)), d // 2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    x0, x1 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)


def mla_scale(cfg: dict) -> float:
    """Softmax scale: 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim), the per-head query width
    (no YaRN mscale: these exercises use plain RoPE)."""
    return (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5


def mla_query(weights: dict, cfg: dict, x: torch.Tensor,
              positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 3.1: the per-head query of MLA, split into its two parts.

    x: [T, hidden_size], positions: [T]. With cfg["q_lora_rank"] set, q = q_b(rms_norm(q_a(x)))
    (q_a_layernorm.weight; eps NORM_EPS); without it, q = q_proj(x). View q as
    [T, num_heads, qk_nope_head_dim + qk_rope_head_dim]; per head the first qk_nope_head_dim
    values are q_nope, the rest q_pe, which gets rope_interleaved at `positions` (rope_theta).
    Returns (q_nope [T, H, qk_nope_head_dim], q_pe [T, H, qk_rope_head_dim]).

    >>> w = random_mla_weights(MLA_TINY)
    >>> [t.shape for t in mla_query(w, MLA_TINY, torch.randn(3, 64), torch.arange(3))]
    [torch.Size([3, 4, 16]), torch.Size([3, 4, 8])]
    """
    raise NotImplementedError("Exercise 3.1 (mla_query): see section 3.1 of lessons/l15_attention_layouts.ipynb")


def mla_cache_entry(weights: dict, cfg: dict, x: torch.Tensor,
                    positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 3.1: what MLA writes to the cache for tokens x [T, hidden_size] at `positions` [T].

    kv_a_proj_with_mqa(x) gives [T, kv_lora_rank + qk_rope_head_dim]: the first kv_lora_rank
    values are the latent, which goes through rms_norm with kv_a_layernorm.weight (eps NORM_EPS);
    the last qk_rope_head_dim are the shared RoPE key, which gets rope_interleaved at
    `positions` (rope_theta) before it is cached.
    Returns (c_kv [T, kv_lora_rank], k_pe [T, qk_rope_head_dim]): kv_lora_rank +
    qk_rope_head_dim values per token and layer, whatever the number of heads.
    """
    raise NotImplementedError("Exercise 3.1 (mla_cache_entry): see section 3.1 of lessons/l15_attention_layouts.ipynb")


def mla_attention_naive(weights: dict, cfg: dict, x: torch.Tensor, positions: torch.Tensor,
                        c_kv: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    """Exercise 3.2: MLA attention by decompressing the cache into per-head K and V.

    x: [T, hidden_size], the newest T tokens (T = 1 for a decode step), at `positions` [T].
    c_kv [S, kv_lora_rank], k_pe [S, qk_rope_head_dim]: the cache of tokens 0 .. S-1 (the new
    ones included, written by mla_cache_entry); cached token s is at position s.
    - (q_nope, q_pe) = mla_query(...);
    - kv_b_proj(c_kv) viewed as [S, H, qk_nope_head_dim + v_head_dim]: per head, k_nope then v;
    - per head, k = concat(k_nope, k_pe) (the same k_pe for every head), q = concat(q_nope, q_pe);
    - scores scaled by mla_scale(cfg); causal: the query at position p sees cached tokens 0..p;
    - softmax, weighted sum of v, heads concatenated [T, H * v_head_dim], then o_proj.
    Returns [T, hidden_size] in x's dtype.
    """
    raise NotImplementedError("Exercise 3.2 (mla_attention_naive): see section 3.2 of lessons/l15_attention_layouts.ipynb")


def mla_attention_absorbed(weights: dict, cfg: dict, x: torch.Tensor, positions: torch.Tensor,
                           c_kv: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    """Exercise 3.3: the same attention, computed on the latents without expanding them.

    Same arguments and result as mla_attention_naive. Split kv_b_proj.weight, viewed as
    [H, qk_nope_head_dim + v_head_dim, kv_lora_rank], into W_UK [H, nope, r] and W_UV [H, v, r].
    - absorb W_UK into the query: q_lat[t, h] = q_nope[t, h] @ W_UK[h]     -> [T, H, r];
    - score[h, t, s] = (q_lat[t, h] . c_kv[s] + q_pe[t, h] . k_pe[s]) * mla_scale(cfg), causal;
    - o_lat[t, h] = sum_s softmax(score)[h, t, s] * c_kv[s]                  -> [T, H, r];
    - apply W_UV after the sum: o[t, h] = W_UV[h] @ o_lat[t, h]              -> [T, H, v];
      concatenate the heads and apply o_proj.
    Every head reads the same c_kv and k_pe rows: no [S, H, ...] tensor is ever built.
    """
    raise NotImplementedError("Exercise 3.3 (mla_attention_absorbed): see section 3.3 of lessons/l15_attention_layouts.ipynb")
