"""Plausible wrong answers for lesson 15 (attention layouts)."""
import torch

from solutions import l15_attention_layouts as sol  # sets TRITON_INTERPRET on CPU first
from tests.mutants import mutant

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


# ---------------------------------------------------------------- 1. bytes per token

@mutant(check="kv_bytes_per_token", message="uses the GQA formula on an MLA model")
def kv_bytes_per_token(config, dtype_bytes):
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    d = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * config["num_hidden_layers"] * kv * d * dtype_bytes


def _mla_bytes(config, dtype_bytes, latent_copies, rope=True):
    if not config.get("kv_lora_rank"):
        return sol.kv_bytes_per_token(config, dtype_bytes)
    per_layer = latent_copies * config["kv_lora_rank"] + (config["qk_rope_head_dim"] if rope else 0)
    return per_layer * config["num_hidden_layers"] * dtype_bytes


@mutant(check="kv_bytes_per_token", message="counts K and V for the MLA latent")
def kv_bytes_per_token(config, dtype_bytes):  # noqa: F811
    return 2 * _mla_bytes(config, dtype_bytes, 1) if config.get("kv_lora_rank") else \
        sol.kv_bytes_per_token(config, dtype_bytes)


@mutant(check="kv_bytes_per_token", message="forgets the decoupled RoPE key")
def kv_bytes_per_token(config, dtype_bytes):  # noqa: F811
    return _mla_bytes(config, dtype_bytes, 1, rope=False)


@mutant(check="kv_bytes_per_token", message="ignores an explicit head_dim")
def kv_bytes_per_token(config, dtype_bytes):  # noqa: F811
    if config.get("kv_lora_rank"):
        return sol.kv_bytes_per_token(config, dtype_bytes)
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    return 2 * config["num_hidden_layers"] * kv * (config["hidden_size"] // heads) * dtype_bytes


@mutant(check="kv_capacity_tokens", message="ignores kv_copies")
def kv_capacity_tokens(config, num_params, weight_bytes, kv_bytes, num_gpus, gpu_bytes, kv_copies=1):
    free = num_gpus * gpu_bytes - num_params * weight_bytes
    return max(0, int(free // sol.kv_bytes_per_token(config, kv_bytes)))


@mutant(check="kv_capacity_tokens", message="returns a negative count when the weights do not fit")
def kv_capacity_tokens(config, num_params, weight_bytes, kv_bytes, num_gpus, gpu_bytes, kv_copies=1):  # noqa: F811
    free = num_gpus * gpu_bytes - num_params * weight_bytes
    return int(free // (kv_copies * sol.kv_bytes_per_token(config, kv_bytes)))


# ---------------------------------------------------------------- 2. GQA decode (torch)

def _torch_gqa(q, k_cache, v_cache, seq_lens, kv_of_head, scale):
    B, H, D = q.shape
    idx = kv_of_head(torch.arange(H), H // k_cache.shape[2], k_cache.shape[2])
    s = torch.einsum("bhd,blhd->bhl", q.float(), k_cache.float()[:, :, idx]) * scale(D)
    mask = torch.arange(k_cache.shape[1])[None, :] >= seq_lens[:, None]
    s = s.masked_fill(mask[:, None, :], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", s.softmax(-1), v_cache.float()[:, :, idx]).to(q.dtype)


@mutant(check="gqa_decode_torch", message="maps query head h to KV head h % num_kv_heads")
def gqa_decode_torch(q, k_cache, v_cache, seq_lens):
    return _torch_gqa(q, k_cache, v_cache, seq_lens, lambda h, g, n: h % n, lambda d: d ** -0.5)


@mutant(check="gqa_decode_torch", message="does not scale scores by 1/sqrt(head_dim)")
def gqa_decode_torch(q, k_cache, v_cache, seq_lens):  # noqa: F811
    return _torch_gqa(q, k_cache, v_cache, seq_lens, lambda h, g, n: h // g, lambda d: 1.0)


@mutant(check="gqa_decode_torch", message="attends to positions past the sequence length")
def gqa_decode_torch(q, k_cache, v_cache, seq_lens):  # noqa: F811
    return sol.gqa_decode_torch(q, k_cache, v_cache, torch.full_like(seq_lens, k_cache.shape[1]))


# ---------------------------------------------------------------- 2. GQA decode (Triton)
# Each kernel is the reference kernel with one line changed (marked).

@triton.jit
def _kernel_mod_heads(q_ptr, k_ptr, v_ptr, lens_ptr, out_ptr, scale,
                      stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_ob, stride_oh,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    num_kv = tl.num_programs(1)
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    n = tl.arange(0, BLOCK_N)
    heads = kvh + g * num_kv                                  # changed: heads with h % num_kv == kvh
    gmask = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + n
        valid = pos < seq_len
        k = tl.load(k_ptr + b * stride_kb + kvh * stride_kh + pos[None, :] * stride_kt + d[:, None],
                    mask=valid[None, :], other=0.0)
        s = tl.where(valid[None, :], tl.dot(q, k) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + b * stride_kb + kvh * stride_kh + pos[:, None] * stride_kt + d[None, :],
                    mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
             (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=gmask[:, None])


@triton.jit
def _kernel_no_max(q_ptr, k_ptr, v_ptr, lens_ptr, out_ptr, scale,
                   stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_ob, stride_oh,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + n
        valid = pos < seq_len
        k = tl.load(k_ptr + b * stride_kb + kvh * stride_kh + pos[None, :] * stride_kt + d[:, None],
                    mask=valid[None, :], other=0.0)
        s = tl.where(valid[None, :], tl.dot(q, k) * scale, float("-inf"))
        p = tl.exp(s)                                         # changed: no running max
        l = l + tl.sum(p, axis=1)
        v = tl.load(v_ptr + b * stride_kb + kvh * stride_kh + pos[:, None] * stride_kt + d[None, :],
                    mask=valid[:, None], other=0.0)
        acc = acc + tl.dot(p.to(v.dtype), v)
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
             (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=gmask[:, None])


@triton.jit
def _kernel_no_mask(q_ptr, k_ptr, v_ptr, lens_ptr, out_ptr, scale,
                    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_ob, stride_oh,
                    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + n
        valid = pos < seq_len
        k = tl.load(k_ptr + b * stride_kb + kvh * stride_kh + pos[None, :] * stride_kt + d[:, None],
                    mask=valid[None, :], other=0.0)
        s = tl.dot(q, k) * scale                              # changed: padding not set to -inf
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + b * stride_kb + kvh * stride_kh + pos[:, None] * stride_kt + d[None, :],
                    mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
             (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=gmask[:, None])


@mutant(check="gqa_decode_triton", message="maps query head h to KV head h % num_kv_heads")
def gqa_decode_triton(q, k_cache, v_cache, seq_lens, block_n=16):
    return sol.launch_gqa_decode(_kernel_mod_heads, q, k_cache, v_cache, seq_lens, block_n)


@mutant(check="gqa_decode_triton", message="skips the running-max subtraction")
def gqa_decode_triton(q, k_cache, v_cache, seq_lens, block_n=16):  # noqa: F811
    return sol.launch_gqa_decode(_kernel_no_max, q, k_cache, v_cache, seq_lens, block_n)


@mutant(check="gqa_decode_triton", message="attends to positions past the sequence length")
def gqa_decode_triton(q, k_cache, v_cache, seq_lens, block_n=16):  # noqa: F811
    return sol.launch_gqa_decode(_kernel_no_mask, q, k_cache, v_cache, seq_lens, block_n)


# ---------------------------------------------------------------- 3. MLA

def _rope_half(x, positions, theta):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = positions.float()[:, None] * inv[None, :]
    ang = ang.reshape(ang.shape[0], *([1] * (x.dim() - 2)), d // 2)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)


@mutant(check="mla_query", message="half-split RoPE")
def mla_query(weights, cfg, x, positions):
    H, nope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"]
    if cfg.get("q_lora_rank"):
        q = sol.rms_norm(x @ weights["q_a_proj.weight"].T, weights["q_a_layernorm.weight"]) @ weights["q_b_proj.weight"].T
    else:
        q = x @ weights["q_proj.weight"].T
    q = q.view(x.shape[0], H, -1)
    return q[..., :nope], _rope_half(q[..., nope:], positions, cfg["rope_theta"])


@mutant(check="mla_query", message="skips q_a_layernorm")
def mla_query(weights, cfg, x, positions):  # noqa: F811
    if not cfg.get("q_lora_rank"):
        return sol.mla_query(weights, cfg, x, positions)
    q = (x @ weights["q_a_proj.weight"].T) @ weights["q_b_proj.weight"].T
    q = q.view(x.shape[0], cfg["num_attention_heads"], -1)
    nope = cfg["qk_nope_head_dim"]
    return q[..., :nope], sol.rope_interleaved(q[..., nope:], positions, cfg["rope_theta"])


@mutant(check="mla_cache_entry", message="half-split RoPE")
def mla_cache_entry(weights, cfg, x, positions):
    r = cfg["kv_lora_rank"]
    a = x @ weights["kv_a_proj_with_mqa.weight"].T
    return sol.rms_norm(a[:, :r], weights["kv_a_layernorm.weight"]), _rope_half(a[:, r:], positions, cfg["rope_theta"])


@mutant(check="mla_cache_entry", message="skips kv_a_layernorm")
def mla_cache_entry(weights, cfg, x, positions):  # noqa: F811
    r = cfg["kv_lora_rank"]
    a = x @ weights["kv_a_proj_with_mqa.weight"].T
    return a[:, :r], sol.rope_interleaved(a[:, r:], positions, cfg["rope_theta"])


@mutant(check="mla_cache_entry", message="forgets RoPE on k_pe")
def mla_cache_entry(weights, cfg, x, positions):  # noqa: F811
    r = cfg["kv_lora_rank"]
    a = x @ weights["kv_a_proj_with_mqa.weight"].T
    return sol.rms_norm(a[:, :r], weights["kv_a_layernorm.weight"]), a[:, r:]


def _naive(weights, cfg, x, positions, c_kv, k_pe, scale=None, rope_score=True, per_head=True):
    S, T = c_kv.shape[0], x.shape[0]
    H, nope, vd = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    q_nope, q_pe = sol.mla_query(weights, cfg, x, positions)
    kv = c_kv @ weights["kv_b_proj.weight"].T
    if per_head:
        kv = kv.view(S, H, nope + vd)
        k_nope, v = kv[..., :nope], kv[..., nope:]
    else:
        k_nope, v = kv[:, : H * nope].view(S, H, nope), kv[:, H * nope:].view(S, H, vd)
    s = torch.einsum("thn,shn->hts", q_nope, k_nope)
    if rope_score:
        s = s + torch.einsum("thp,sp->hts", q_pe, k_pe)
    s = s * (sol.mla_scale(cfg) if scale is None else scale)
    s = s.masked_fill(torch.arange(S)[None, :] > positions[:, None], float("-inf"))
    o = torch.einsum("hts,shv->thv", s.softmax(-1), v)
    return o.reshape(T, H * vd) @ weights["o_proj.weight"].T


@mutant(check="mla_attention_naive", message="scales scores by 1/sqrt(qk_nope_head_dim)")
def mla_attention_naive(weights, cfg, x, positions, c_kv, k_pe):
    return _naive(weights, cfg, x, positions, c_kv, k_pe, scale=cfg["qk_nope_head_dim"] ** -0.5)


@mutant(check="mla_attention_naive", message="all heads' K | all heads' V")
def mla_attention_naive(weights, cfg, x, positions, c_kv, k_pe):  # noqa: F811
    return _naive(weights, cfg, x, positions, c_kv, k_pe, per_head=False)


def _naive_unmasked(weights, cfg, x, positions, c_kv, k_pe):
    # Every query sees every cached token: a query position past the end unmasks them all.
    far = torch.full_like(positions, c_kv.shape[0])
    q_nope, q_pe = sol.mla_query(weights, cfg, x, positions)
    S, T = c_kv.shape[0], x.shape[0]
    H, nope, vd = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    kv = (c_kv @ weights["kv_b_proj.weight"].T).view(S, H, nope + vd)
    s = (torch.einsum("thn,shn->hts", q_nope, kv[..., :nope])
         + torch.einsum("thp,sp->hts", q_pe, k_pe)) * sol.mla_scale(cfg)
    s = s.masked_fill(torch.arange(S)[None, :] > far[:, None], float("-inf"))
    o = torch.einsum("hts,shv->thv", s.softmax(-1), kv[..., nope:])
    return o.reshape(T, H * vd) @ weights["o_proj.weight"].T


@mutant(check="mla_attention_naive", message="does not apply the causal mask")
def mla_attention_naive(weights, cfg, x, positions, c_kv, k_pe):  # noqa: F811
    return _naive_unmasked(weights, cfg, x, positions, c_kv, k_pe)


@mutant(check="mla_attention_absorbed", message="drops the RoPE part of the score")
def mla_attention_absorbed(weights, cfg, x, positions, c_kv, k_pe):
    zero_pe = torch.zeros_like(k_pe)
    return sol.mla_attention_absorbed(weights, cfg, x, positions, c_kv, zero_pe)


@mutant(check="mla_attention_absorbed", message="the latent width")
def mla_attention_absorbed(weights, cfg, x, positions, c_kv, k_pe):  # noqa: F811
    width = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    return _naive(weights, cfg, x, positions, c_kv, k_pe, scale=width ** -0.5)


@mutant(check="mla_attention_absorbed", message="decompresses the cache into per-head K/V")
def mla_attention_absorbed(weights, cfg, x, positions, c_kv, k_pe):  # noqa: F811
    return sol.mla_attention_naive(weights, cfg, x, positions, c_kv, k_pe)

