"""Llama-family decoder (Llama, Mistral, Qwen2) over a flat batch of tokens.

The batch is ragged: input_ids and positions are 1-D over every token scheduled this step (decode
tokens first, then prefill chunks), so there is no padding anywhere in the dense layers. Attention
reads and writes the paged KV cache through the backend bound to each layer (see attention.py).
q/k/v and gate/up are fused into one matmul each; loader.py slices Hugging Face weights into them.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionMetadata, run_attention
from .config import ModelConfig
from .distributed import NO_SHARD, ShardSpec, all_reduce


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype=None, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """With residual: adds it first and returns (normed, new residual), saving one pass (as vLLM does)."""
        if residual is not None:
            x = x + residual
            residual = x
        wide = x.dtype == torch.float32  # (no casts to dispatch when there is nothing to cast: host time per layer)
        xf = x if wide else x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * (xf if wide else xf.to(x.dtype))
        return out if residual is None else (out, residual)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = config.rope_scaling
    if s is None:
        return inv_freq
    if s["rope_type"] == "linear":
        return inv_freq / s["factor"]
    # llama3: keep high frequencies, divide low ones by factor, interpolate smoothly in between.
    factor, lo, hi, old_len = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / hi) & (wavelen <= old_len / lo)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding:
    """cos/sin tables for every position up to max_position_embeddings, looked up once per forward."""

    def __init__(self, config: ModelConfig, device):
        freqs = torch.outer(torch.arange(config.max_position_embeddings, dtype=torch.float32), rope_inv_freq(config))
        self.cos, self.sin = freqs.cos().to(device), freqs.sin().to(device)

    def lookup(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos | cos, -sin | sin) at each position, [T, 1, D]: the tables apply_rope takes, built once per forward."""
        cos, sin = self.cos[positions], self.sin[positions]
        if dtype != cos.dtype:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return torch.cat((cos, cos), -1).unsqueeze(1), torch.cat((-sin, sin), -1).unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; the two halves of D form the rotated pairs (Hugging Face's rotate_half layout):
    (x1 cos - x2 sin, x2 cos + x1 sin) written as x * (cos | cos) + (x2 | x1) * (-sin | sin), with the tables of
    RotaryEmbedding.lookup. The same products and sums, bit for bit (a - b is a + (-b) in IEEE arithmetic), in
    five tensor operations instead of eight (host time: they run for q and k in every layer)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((x2, x1), dim=-1) * sin


class Linear(nn.Linear):
    """nn.Linear without its random init. Every weight of this model is read from a checkpoint right after
    it is built (loader.load_weights refuses files that lack one), so the init is wasted time: a third of
    building the shipped model, which the grader and the lessons build dozens of times."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    """nn.Embedding without its random init (see Linear)."""

    def reset_parameters(self) -> None:
        pass


class Attention(nn.Module):
    """Under tensor parallelism (shard.size > 1) this rank's query and KV heads only; o_proj's partial sums are
    all-reduced (distributed.py)."""

    def __init__(self, config: ModelConfig, dtype=None, device=None, shard: ShardSpec = NO_SHARD):
        super().__init__()
        self.shard = shard
        self.num_heads = len(shard.heads(config.num_attention_heads))
        self.num_kv_heads = len(shard.kv_heads(config.num_key_value_heads))
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias, dtype=dtype, device=device)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.o_bias, dtype=dtype, device=device)
        # Bound by ModelRunner.bind: this layer's slice of the paged cache and the attention backend.
        self.k_cache = self.v_cache = self.backend = None

    def forward(self, x: torch.Tensor, rope: tuple, meta: AttentionMetadata) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(T, self.num_heads, self.head_dim), *rope)
        k = apply_rope(k.view(T, self.num_kv_heads, self.head_dim), *rope)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        o = run_attention(self.backend, q, k, v, self.k_cache, self.v_cache, meta, self.scale)
        return all_reduce(self.o_proj(o.reshape(T, self.q_size)), self.shard)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype=None, device=None, shard: ShardSpec = NO_SHARD):
        super().__init__()
        self.shard = shard
        inter = len(shard.intermediate(config.intermediate_size))
        self.gate_up_proj = Linear(config.hidden_size, 2 * inter, bias=config.mlp_bias, dtype=dtype, device=device)
        self.down_proj = Linear(inter, config.hidden_size, bias=config.mlp_bias, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return all_reduce(self.down_proj(F.silu(gate) * up), self.shard)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, dtype=None, device=None, shard: ShardSpec = NO_SHARD):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.self_attn = Attention(config, dtype, device, shard)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.mlp = MLP(config, dtype, device, shard)

    def forward(self, x, residual, rope, meta):
        if residual is None:  # first layer: the embedding is the residual stream
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, rope, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class CausalLM(nn.Module):
    """config is the whole model's; with shard.size > 1 the layers hold rank shard.rank's part (distributed.py)."""

    def __init__(self, config: ModelConfig, dtype=None, device=None, shard: ShardSpec = NO_SHARD):
        super().__init__()
        shard.check(config.num_attention_heads, config.num_key_value_heads, config.intermediate_size)
        self.config, self.shard = config, shard
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(DecoderLayer(config, dtype, device, shard) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary: RotaryEmbedding | None = None  # set by init_rotary once the model is on its device

    def init_rotary(self, device) -> None:
        self.rotary = RotaryEmbedding(self.config, device)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        x = self.embed_tokens(input_ids)
        rope = self.rotary.lookup(positions, x.dtype)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, rope, meta)
        x, _ = self.norm(x, residual)
        return x

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
