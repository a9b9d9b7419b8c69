"""Plausible wrong answers for lesson 15 (attention layouts)."""
import torch

from reference_engine.kernels.triton_compat import tl, triton  # on CPU: Triton's interpreter, set before @triton.jit
from solutions import l15_attention_layouts as sol
from tests.mutants import mutant

# ---------------------------------------------------------------- 1. bytes per token
# MHA/GQA/MQA come from the given sol.gqa_kv_bytes_per_token; what a learner writes is the MLA branch.

@mutant(check="kv_bytes_per_token", message="uses the GQA formula on an MLA model")
def kv_bytes_per_token(config, dtype_bytes):
    return sol.gqa_kv_bytes_per_token(config, dtype_bytes)


@mutant(check="kv_bytes_per_token", message="uses the GQA formula on an MLA model")
def kv_bytes_per_token(config, dtype_bytes):  # noqa: F811 - MLA told by q_lora_rank, which can be null
    if config.get("q_lora_rank"):
        return sol.kv_bytes_per_token(config, dtype_bytes)
    return sol.gqa_kv_bytes_per_token(config, dtype_bytes)


def _m_mla_bytes(config, dtype_bytes, latent_copies=1, rope_copies=1):
    if not config.get("kv_lora_rank"):
        return sol.gqa_kv_bytes_per_token(config, dtype_bytes)
    per_layer = latent_copies * config["kv_lora_rank"] + rope_copies * config["qk_rope_head_dim"]
    return per_layer * config["num_hidden_layers"] * dtype_bytes


@mutant(check="kv_bytes_per_token", message="counts K and V for the MLA latent")
def kv_bytes_per_token(config, dtype_bytes):  # noqa: F811
    return 2 * _m_mla_bytes(config, dtype_bytes) if config.get("kv_lora_rank") else \
        sol.gqa_kv_bytes_per_token(config, dtype_bytes)


@mutant(check="kv_bytes_per_token", message="forgets the decoupled RoPE key")
def kv_bytes_per_token(config, dtype_bytes):  # noqa: F811
    return _m_mla_bytes(config, dtype_bytes, rope_copies=0)


@mutant(check="kv_bytes_per_token", message="stores the latent once per head")
def kv_bytes_per_token(config, dtype_bytes):  # noqa: F811
    heads = config["num_attention_heads"]
    return _m_mla_bytes(config, dtype_bytes, latent_copies=heads, rope_copies=heads)


@mutant(check="kv_bytes_per_token", message="stores the RoPE key once per head")
def kv_bytes_per_token(config, dtype_bytes):  # noqa: F811
    return _m_mla_bytes(config, dtype_bytes, rope_copies=config["num_attention_heads"])


@mutant(check="kv_bytes_per_token", message="reads a null field as a value")
def kv_bytes_per_token(config, dtype_bytes):  # noqa: F811
    # `in` is true for a field present but null (as transformers writes a dense model's kv_lora_rank)
    if "kv_lora_rank" in config:
        return (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * config["num_hidden_layers"] * dtype_bytes
    return sol.gqa_kv_bytes_per_token(config, dtype_bytes)


@mutant(check="kv_capacity_tokens", message="depends on kv_bytes_per_token, which fails")
def kv_bytes_per_token(config, dtype_bytes):  # noqa: F811 - the capacity is right; the cache per token it uses is not
    return sol.gqa_kv_bytes_per_token(config, dtype_bytes)


@mutant(check="kv_capacity_tokens", message="ignores kv_copies")
def kv_capacity_tokens(config, num_params, weight_bytes, kv_bytes, num_gpus, gpu_bytes, kv_copies=1):
    free = num_gpus * gpu_bytes - num_params * weight_bytes
    return max(0, int(free // sol.kv_bytes_per_token(config, kv_bytes)))


@mutant(check="kv_capacity_tokens", message="returns a negative count when the weights do not fit")
def kv_capacity_tokens(config, num_params, weight_bytes, kv_bytes, num_gpus, gpu_bytes, kv_copies=1):  # noqa: F811
    free = num_gpus * gpu_bytes - num_params * weight_bytes
    return int(free // (kv_copies * sol.kv_bytes_per_token(config, kv_bytes)))


@mutant(check="kv_capacity_tokens", message="rounds to the nearest token")
def kv_capacity_tokens(config, num_params, weight_bytes, kv_bytes, num_gpus, gpu_bytes, kv_copies=1):  # noqa: F811
    free = num_gpus * gpu_bytes - num_params * weight_bytes
    return max(0, round(free / (kv_copies * sol.kv_bytes_per_token(config, kv_bytes))))


@mutant(check="kv_capacity_tokens", message="stores a copy per GPU when kv_copies is not given")
def kv_capacity_tokens(config, num_params, weight_bytes, kv_bytes, num_gpus, gpu_bytes, kv_copies=None):  # noqa: F811
    copies = num_gpus if kv_copies is None else kv_copies
    return sol.kv_capacity_tokens(config, num_params, weight_bytes, kv_bytes, num_gpus, gpu_bytes, copies)


# ---------------------------------------------------------------- 2. GQA decode (torch)

def _m_torch_gqa(q, k_cache, v_cache, seq_lens, kv_of_head, scale, lens=lambda n, L: n, upcast=True):
    B, H, D = q.shape
    dtype = q.dtype
    idx = kv_of_head(torch.arange(H), H // k_cache.shape[2], k_cache.shape[2])
    if upcast:
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    s = torch.einsum("bhd,blhd->bhl", q, k_cache[:, :, idx]) * scale(D)
    mask = torch.arange(k_cache.shape[1])[None, :] >= lens(seq_lens.long(), k_cache.shape[1])[:, None]
    s = s.masked_fill(mask[:, None, :], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", s.softmax(-1), v_cache[:, :, idx]).to(dtype)


@mutant(check="gqa_decode_torch", message="maps query head h to KV head h % num_kv_heads")
def gqa_decode_torch(q, k_cache, v_cache, seq_lens):
    return _m_torch_gqa(q, k_cache, v_cache, seq_lens, lambda h, g, n: h % n, lambda d: d ** -0.5)


@mutant(check="gqa_decode_torch", message="does not scale scores by 1/sqrt(head_dim)")
def gqa_decode_torch(q, k_cache, v_cache, seq_lens):  # noqa: F811
    return _m_torch_gqa(q, k_cache, v_cache, seq_lens, lambda h, g, n: h // g, lambda d: 1.0)


@mutant(check="gqa_decode_torch", message="drops the newest token")
def gqa_decode_torch(q, k_cache, v_cache, seq_lens):  # noqa: F811
    return _m_torch_gqa(q, k_cache, v_cache, seq_lens, lambda h, g, n: h // g, lambda d: d ** -0.5,
                        lens=lambda n, L: n - 1)


@mutant(check="gqa_decode_torch", message="attends to one row too many")
def gqa_decode_torch(q, k_cache, v_cache, seq_lens):  # noqa: F811
    return _m_torch_gqa(q, k_cache, v_cache, seq_lens, lambda h, g, n: h // g, lambda d: d ** -0.5,
                        lens=lambda n, L: n + 1)


@mutant(check="gqa_decode_torch", message="computes the scores and softmax in bf16")
def gqa_decode_torch(q, k_cache, v_cache, seq_lens):  # noqa: F811
    return _m_torch_gqa(q, k_cache, v_cache, seq_lens, lambda h, g, n: h // g, lambda d: d ** -0.5, upcast=False)


@mutant(check="gqa_decode_torch", message="attends to positions past the sequence length")
def gqa_decode_torch(q, k_cache, v_cache, seq_lens):  # noqa: F811
    return sol.gqa_decode_torch(q, k_cache, v_cache, torch.full_like(seq_lens, k_cache.shape[1]))


# ---------------------------------------------------------------- 2. GQA decode (Triton)
# One kernel: the reference kernel with the line MODE names changed.

def _m_gqa_kernel_src(q_ptr, k_ptr, v_ptr, lens_ptr, out_ptr, scale,
                      stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_ob, stride_oh,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_N: tl.constexpr, MODE: tl.constexpr):
    # MODE 1: heads h % num_kv_heads; 2: no running max; 3: padding not masked;
    # 4: 16 positions per step of BLOCK_N; 5: steps of 16, BLOCK_N positions each
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    if MODE == 4:
        n = tl.arange(0, 16)
    else:
        n = tl.arange(0, BLOCK_N)
    if MODE == 1:
        heads = kvh + g * tl.num_programs(1)
    else:
        heads = kvh * GROUP + g
    gmask = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    step = 16 if MODE == 5 else BLOCK_N
    for start in range(0, seq_len, step):
        pos = start + n
        valid = pos < seq_len
        k = tl.load(k_ptr + b * stride_kb + kvh * stride_kh + pos[None, :] * stride_kt + d[:, None],
                    mask=valid[None, :], other=0.0)
        s = tl.dot(q, k) * scale
        if MODE != 3:
            s = tl.where(valid[None, :], s, float("-inf"))
        v = tl.load(v_ptr + b * stride_kb + kvh * stride_kh + pos[:, None] * stride_kt + d[None, :],
                    mask=valid[:, None], other=0.0)
        if MODE == 2:
            p = tl.exp(s)
            l = l + tl.sum(p, axis=1)
            acc = acc + tl.dot(p.to(v.dtype), v)
        else:
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
             (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=gmask[:, None])


# Jitted by a call, not a decorator: a mutant's source keeps its helpers' bodies but not their decorators.
_m_gqa_kernel = triton.jit(_m_gqa_kernel_src)


class _m_Mode:
    """Stands in for a kernel: kernel[grid](...) runs _m_gqa_kernel with MODE set."""

    def __init__(self, mode):
        self.mode = mode

    def __getitem__(self, grid):
        return lambda *a, **kw: _m_gqa_kernel[grid](*a, MODE=self.mode, **kw)


@mutant(check="gqa_decode_triton", message="maps query head h to KV head h % num_kv_heads")
def gqa_decode_triton(q, k_cache, v_cache, seq_lens, block_n=16):
    return sol.launch_gqa_decode(_m_Mode(1), q, k_cache, v_cache, seq_lens, block_n)


@mutant(check="gqa_decode_triton", message="skips the running-max subtraction")
def gqa_decode_triton(q, k_cache, v_cache, seq_lens, block_n=16):  # noqa: F811
    return sol.launch_gqa_decode(_m_Mode(2), q, k_cache, v_cache, seq_lens, block_n)


@mutant(check="gqa_decode_triton", message="attends to positions past the sequence length")
def gqa_decode_triton(q, k_cache, v_cache, seq_lens, block_n=16):  # noqa: F811
    return sol.launch_gqa_decode(_m_Mode(3), q, k_cache, v_cache, seq_lens, block_n)


@mutant(check="gqa_decode_triton", message="ignores BLOCK_N")
def gqa_decode_triton(q, k_cache, v_cache, seq_lens, block_n=16):  # noqa: F811
    return sol.launch_gqa_decode(_m_Mode(4), q, k_cache, v_cache, seq_lens, block_n)


@mutant(check="gqa_decode_triton", message="steps by 16 but reads BLOCK_N positions")
def gqa_decode_triton(q, k_cache, v_cache, seq_lens, block_n=16):  # noqa: F811
    return sol.launch_gqa_decode(_m_Mode(5), q, k_cache, v_cache, seq_lens, block_n)


# ---------------------------------------------------------------- 3. MLA

def _m_rope_half(x, positions, theta):
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
    return q[..., :nope], _m_rope_half(q[..., nope:], positions, cfg["rope_theta"])


@mutant(check="mla_query", message="rotates with rope_theta 10000")
def mla_query(weights, cfg, x, positions):  # noqa: F811
    return sol.mla_query(weights, {**cfg, "rope_theta": 10000.0}, x, positions)


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
    return (sol.rms_norm(a[:, :r], weights["kv_a_layernorm.weight"]),
            _m_rope_half(a[:, r:], positions, cfg["rope_theta"]))


@mutant(check="mla_cache_entry", message="rotates with rope_theta 10000")
def mla_cache_entry(weights, cfg, x, positions):  # noqa: F811
    return sol.mla_cache_entry(weights, {**cfg, "rope_theta": 10000.0}, x, positions)


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


def _m_naive(weights, cfg, x, positions, c_kv, k_pe, scale=None, rope_score=True, per_head=True):
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
    return _m_naive(weights, cfg, x, positions, c_kv, k_pe, scale=cfg["qk_nope_head_dim"] ** -0.5)


@mutant(check="mla_attention_naive", message="scales scores by 1/sqrt(v_head_dim)")
def mla_attention_naive(weights, cfg, x, positions, c_kv, k_pe):  # noqa: F811
    return _m_naive(weights, cfg, x, positions, c_kv, k_pe, scale=cfg["v_head_dim"] ** -0.5)


@mutant(check="mla_attention_naive", message="all heads' K | all heads' V")
def mla_attention_naive(weights, cfg, x, positions, c_kv, k_pe):  # noqa: F811
    return _m_naive(weights, cfg, x, positions, c_kv, k_pe, per_head=False)


def _m_naive_unmasked(weights, cfg, x, positions, c_kv, k_pe):
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


@mutant(check="mla_attention_naive", message="depends on mla_query, which fails")
def mla_query(weights, cfg, x, positions):  # noqa: F811 - the attention is right; the query it builds on rotates wrong
    return sol.mla_query(weights, {**cfg, "rope_theta": 10000.0}, x, positions)


@mutant(check="mla_attention_naive", message="does not apply the causal mask")
def mla_attention_naive(weights, cfg, x, positions, c_kv, k_pe):  # noqa: F811
    return _m_naive_unmasked(weights, cfg, x, positions, c_kv, k_pe)


@mutant(check="mla_attention_absorbed", message="drops the RoPE part of the score")
def mla_attention_absorbed(weights, cfg, x, positions, c_kv, k_pe):
    zero_pe = torch.zeros_like(k_pe)
    return sol.mla_attention_absorbed(weights, cfg, x, positions, c_kv, zero_pe)


@mutant(check="mla_attention_absorbed", message="the latent width")
def mla_attention_absorbed(weights, cfg, x, positions, c_kv, k_pe):  # noqa: F811
    width = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    return _m_naive(weights, cfg, x, positions, c_kv, k_pe, scale=width ** -0.5)


@mutant(check="mla_attention_absorbed", message="decompresses the cache into per-head K/V")
def mla_attention_absorbed(weights, cfg, x, positions, c_kv, k_pe):  # noqa: F811
    return sol.mla_attention_naive(weights, cfg, x, positions, c_kv, k_pe)

