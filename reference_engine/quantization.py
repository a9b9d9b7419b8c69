"""Weight quantization (int8 / int4 weight-only, fp8 W8A8) and the fp8 KV cache, as vLLM names them.

    LLM(model, quantization="int8" | "int4" | "fp8", kv_cache_dtype="fp8")

Weights. quantize_model() swaps every projection inside the decoder layers (qkv, o, gate_up, down) for a
QuantLinear; the embedding and the (tied) lm_head stay in the model dtype, as vLLM leaves them by default.
- "int8": symmetric int8 per group of GROUP_SIZE input columns, one fp16 scale per group.
- "int4": asymmetric int4 per group (AWQ-style: fp16 scale and a uint8 zero point per group), two values
  packed per byte, the even column in the low nibble.
- "fp8": E4M3 weights with one fp32 scale per output channel, and the activations quantized to E4M3 per
  token on the fly (W8A8, which is what vLLM's "fp8" means).
The matmul dequantizes the weight to the activation dtype and calls F.linear, on CPU and on CUDA alike: the
numbers are those of the quantized model, the speed is not (a real W4A16 / fp8 kernel reads the packed
bytes and dequantizes in registers; here the dequantized copy is materialised on every call).

KV cache. With kv_cache_dtype="fp8" the paged cache holds E4M3 values (1 byte each, so the same memory
holds twice the blocks) with per-tensor scales k_scale / v_scale (1.0 unless set: vLLM's default without
calibration). Fp8KVBackend wraps the attention backend: it quantizes K/V when writing, and for reading it
dequantizes only the blocks this step's block tables name into a compact cache in the activation dtype,
then runs the wrapped backend on that, so the Triton kernels never do fp8 arithmetic (the interpreter
cannot). Prefill attention uses the same fp8-rounded K/V it wrote, so a prompt sees what decode will see.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

GROUP_SIZE = 128
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max: E4M3 has no infinity, so overflow must saturate
METHODS = ("int8", "int4", "fp8")
KV_CACHE_DTYPES = ("auto", "fp8")


# ---- group quantization ---------------------------------------------------------------------------
def _grouped(w: torch.Tensor, group: int) -> torch.Tensor:
    """w [N, K] -> [N, ceil(K / group), group] float32, zero-padded on the right (zeros quantize exactly)."""
    N, K = w.shape
    pad = -K % group
    return F.pad(w.float(), (0, pad)).view(N, -1, group)


def quantize_groups(w: torch.Tensor, bits: int, group: int = GROUP_SIZE, symmetric: bool = True):
    """w [N, K] -> (q uint8 [N, K_pad] in [0, 2^bits), scales fp16 [N, G], zeros uint8 [N, G]); w ~ (q - zero) * scale.

    Symmetric: scale = amax / (2^(bits-1) - 1), zero = 2^(bits-1). Asymmetric: scale = (max - min) / (2^bits - 1),
    zero = round(-min / scale). Values are divided by the fp16-rounded scale, the one dequantization uses.
    """
    g = _grouped(w, group)
    levels = 2 ** bits - 1
    if symmetric:
        scale = g.abs().amax(-1) / (2 ** (bits - 1) - 1)
        zero = torch.full_like(scale, 2 ** (bits - 1))
    else:
        lo, hi = g.amin(-1), g.amax(-1)
        scale = (hi - lo) / levels
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).half()  # an all-zero group: any scale works
    s = scale.float()
    if not symmetric:
        zero = torch.round(-lo / s).clamp(0, levels)
    q = (torch.round(g / s[..., None]) + zero[..., None]).clamp(0, levels)
    return q.to(torch.uint8).view(w.shape[0], -1), scale, zero.to(torch.uint8)


def dequantize_groups(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, K: int, dtype) -> torch.Tensor:
    """Inverse of quantize_groups: q [N, K_pad], scales/zeros [N, G] -> w [N, K] in dtype."""
    N = q.shape[0]
    g = q.view(N, scales.shape[1], -1).float() - zeros.float()[..., None]
    return (g * scales.float()[..., None]).view(N, -1)[:, :K].to(dtype)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] of values in [0, 16), K even -> uint8 [N, K / 2]: column 2i in the low nibble, 2i+1 in the high."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).view(packed.shape[0], -1)


def quantize_fp8(x: torch.Tensor, per_row: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, K] -> (E4M3 [N, K], fp32 scales [N, 1] per row or [1, 1] per tensor); x ~ q.float() * scale.
    scale = amax / 448, so the largest value lands on E4M3's largest; the clamp saturates instead of NaN."""
    amax = x.float().abs().amax(-1, keepdim=True) if per_row else x.float().abs().amax().view(1, 1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


# ---- the quantized linear layer -------------------------------------------------------------------
class QuantLinear(nn.Module):
    """Drop-in for nn.Linear(K, N) holding a quantized weight; forward(x [..., K]) -> [..., N] in x.dtype."""

    def __init__(self, linear: nn.Linear, method: str, group: int = GROUP_SIZE):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"unknown quantization {method!r}; choose one of {METHODS}")
        w = linear.weight.detach()
        self.method, self.in_features, self.out_features, self.group = method, w.shape[1], w.shape[0], group
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        if method == "fp8":
            qw, scale = quantize_fp8(w, per_row=True)
            self.register_buffer("qweight", qw)
            self.register_buffer("scales", scale)
            self.zeros = None
        else:
            bits = 8 if method == "int8" else 4
            q, scale, zero = quantize_groups(w, bits, group, symmetric=method == "int8")
            if method == "int8":
                q = (q.to(torch.int16) - 128).to(torch.int8)  # store signed: zero is always 128
                zero = None
            else:
                q = pack_int4(q)
            self.register_buffer("qweight", q)
            self.register_buffer("scales", scale)
            self.register_buffer("zeros", zero)

    def dequantized_weight(self, dtype) -> torch.Tensor:
        """The weight [N, K] the layer computes with, in dtype."""
        if self.method == "fp8":
            return (self.qweight.float() * self.scales).to(dtype)
        if self.method == "int8":
            q, zeros = self.qweight.to(torch.int16) + 128, torch.full_like(self.scales, 128, dtype=torch.uint8)
            return dequantize_groups(q.to(torch.uint8), self.scales, zeros, self.in_features, dtype)
        return dequantize_groups(unpack_int4(self.qweight), self.scales, self.zeros, self.in_features, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.method == "fp8":  # W8A8: the activations take an E4M3 round trip too, one scale per token
            shape = x.shape
            xq, xs = quantize_fp8(x.reshape(-1, shape[-1]), per_row=True)
            x = (xq.float() * xs).to(x.dtype).view(shape)
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def weight_bytes(self) -> int:
        """Bytes of the stored weight: quantized values, scales and zero points."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros) if t is not None)


PROJECTIONS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))


@torch.no_grad()
def quantize_model(model: nn.Module, method: str, group: int = GROUP_SIZE) -> nn.Module:
    """Replace every decoder projection of a reference_engine CausalLM by a QuantLinear, in place."""
    if method not in METHODS:
        raise ValueError(f"unknown quantization {method!r}; choose one of {METHODS} (or None for none)")
    for layer in model.layers:
        for block, name in PROJECTIONS:
            parent = getattr(layer, block)
            setattr(parent, name, QuantLinear(getattr(parent, name), method, group))
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every weight the model stores (a tied lm_head counted once), quantized layers as stored."""
    total, seen = 0, set()
    for m in model.modules():
        if isinstance(m, QuantLinear):
            total += m.weight_bytes()
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


# ---- the fp8 KV cache -----------------------------------------------------------------------------
def resolve_kv_cache_dtype(kv_cache_dtype, model_dtype: torch.dtype) -> torch.dtype:
    """"auto" -> the model dtype; "fp8" (or "fp8_e4m3") -> torch.float8_e4m3fn."""
    if kv_cache_dtype in (None, "auto"):
        return model_dtype
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return FP8
    raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; choose 'auto' or 'fp8'")


def _to_fp8_bytes(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x / scale saturated to E4M3, as raw bytes (uint8): CPU torch has no index_copy_ for float8."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8)


class Fp8KVBackend:
    """Wraps an attention backend so the caches it sees hold E4M3 values; same methods as interfaces.AttentionBackend.
    A cache that is not one byte per value (a speculative draft model's, which shares the backend) passes through."""

    def __init__(self, inner, k_scale: float = 1.0, v_scale: float = 1.0):
        self.inner, self.k_scale, self.v_scale = inner, float(k_scale), float(v_scale)
        self.name = f"{getattr(inner, 'name', 'custom')}+fp8kv"

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
        if k_cache.element_size() != 1:
            return self.inner.write_kv(k, v, k_cache, v_cache, slot_mapping)
        self.inner.write_kv(_to_fp8_bytes(k, self.k_scale), _to_fp8_bytes(v, self.v_scale),
                            k_cache.view(torch.uint8), v_cache.view(torch.uint8), slot_mapping)

    def _compact(self, cache, scale, block_tables, dtype):
        """Dequantize only the blocks block_tables names: (cache [n_used, block, kv_heads, D] in dtype, new tables)."""
        used, remapped = torch.unique(block_tables.long(), return_inverse=True)
        deq = cache.index_select(0, used).float() * scale
        return deq.to(dtype), remapped.to(block_tables.dtype).view_as(block_tables)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale):
        if k_cache.element_size() != 1:
            return self.inner.decode(q, k_cache, v_cache, block_tables, context_lens, scale)
        kc, bt = self._compact(k_cache, self.k_scale, block_tables, q.dtype)
        vc, _ = self._compact(v_cache, self.v_scale, block_tables, q.dtype)
        return self.inner.decode(q, kc, vc, bt, context_lens, scale)

    def prefill(self, q, k, v, k_cache, v_cache, meta, scale):
        if k_cache.element_size() != 1:
            return self.inner.prefill(q, k, v, k_cache, v_cache, meta, scale)
        kc, bt = self._compact(k_cache, self.k_scale, meta.prefill_block_tables, q.dtype)
        vc, _ = self._compact(v_cache, self.v_scale, meta.prefill_block_tables, q.dtype)
        # This step's K/V as the cache holds them, so a prompt's own tokens are seen in fp8 too.
        kq = (_to_fp8_bytes(k, self.k_scale).view(FP8).float() * self.k_scale).to(q.dtype)
        vq = (_to_fp8_bytes(v, self.v_scale).view(FP8).float() * self.v_scale).to(q.dtype)
        compact = _MetaView(meta, bt)
        return self.inner.prefill(q, kq, vq, kc, vc, compact, scale)


class _MetaView:
    """AttentionMetadata with prefill_block_tables replaced (other fields read through)."""

    def __init__(self, meta, prefill_block_tables):
        self._meta, self.prefill_block_tables = meta, prefill_block_tables

    def __getattr__(self, name):
        return getattr(self._meta, name)
