"""Plausible wrong answers for lesson 16; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here
are prefixed `_m_`."""
import torch

from tests.mutants import mutant

# -- 1. int4 ----------------------------------------------------------------------------------------


@mutant(check="quantize_int4", message="puts column 2i in the high nibble")
def quantize_int4(w, group_size=128, symmetric=True):
    qw = sol.quantize_int4(w, group_size, symmetric)  # noqa: F821 - bound by the mutant runner
    p = qw.packed
    return qw._replace(packed=(p >> 4) | (p << 4))


@mutant(check="quantize_int4", message="one scale per row, not one per group")
def quantize_int4(w, group_size=128, symmetric=True):  # noqa: F811 - one mutant per definition
    return _m_per_row(w, group_size, symmetric)


def _m_per_row(w, group_size, symmetric):
    """Quantize with the whole row's range, then report the scale once per group."""
    N, K = w.shape
    qw = sol.quantize_int4(w, K, symmetric)  # noqa: F821
    G = K // group_size
    return qw._replace(scales=qw.scales.repeat(1, G), zeros=qw.zeros.repeat(1, G), group_size=group_size)


@mutant(check="dequantize_int4", message="forgets to subtract the zero point")
def dequantize_int4(qw, dtype=torch.float32):
    return sol.dequantize_int4(qw._replace(zeros=torch.zeros_like(qw.zeros)), dtype)  # noqa: F821


# -- 2. fp8 -----------------------------------------------------------------------------------------


@mutant(check="quantize_fp8", message="one scale for the whole tensor, not one per token")
def quantize_fp8(x, per_token):
    q, s = sol.quantize_fp8(x, False)  # noqa: F821
    return q, s.expand(x.shape[0], 1).contiguous() if per_token else s


@mutant(check="quantize_fp8", message="E5M2")
def quantize_fp8(x, per_token):  # noqa: F811
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True) if per_token else xf.abs().amax().view(1, 1)
    scale = torch.where(amax > 0, amax / 57344.0, torch.ones_like(amax))
    return (xf / scale).clamp(-57344.0, 57344.0).to(torch.float8_e5m2), scale


@mutant(check="fp8_kv_cache", message="one scale per token across all KV heads")
def fp8_kv_write(k, slot_mapping, cache, scales):
    T, H, D = k.shape
    q, s = sol.quantize_fp8(k.reshape(T, H * D), per_token=True)  # noqa: F821
    cache.view(torch.uint8).index_copy_(0, slot_mapping, q.view(T, H, D).view(torch.uint8))
    scales.index_copy_(0, slot_mapping, s.expand(T, H).contiguous())


@mutant(check="fp8_kv_cache", message="forgets to multiply by the scale")
def fp8_kv_read(cache, scales, slot_mapping, dtype=torch.float32):
    return cache.view(torch.uint8).index_select(0, slot_mapping).view(torch.float8_e4m3fn).to(dtype)


# -- 3. the kernel ----------------------------------------------------------------------------------


@mutant(check="w4a16_kernel", message="forgets to subtract the zero point")
def w4a16_matmul(x, qw):
    return sol.launch_w4a16(sol.w4a16_kernel, x, qw._replace(zeros=torch.zeros_like(qw.zeros)))  # noqa: F821


# -- 5. which method --------------------------------------------------------------------------------


@mutant(check="bottleneck", message="checks the roofline before KV capacity")
def bottleneck(workload, chip):
    intensity = 2 * workload["tokens_per_step"] / workload["weight_bytes"]
    if intensity >= chip["flops"] / chip["bandwidth"]:
        return "compute"
    return "kv_capacity" if workload["kv_bytes_needed"] > workload["free_bytes"] else "memory"


@mutant(check="bottleneck", message="ignores weight_bytes")
def bottleneck(workload, chip):  # noqa: F811
    return sol.bottleneck({**workload, "weight_bytes": 2}, chip)  # noqa: F821


@mutant(check="choose_method", message="picks fp8 weights and activations for a memory-bound step")
def choose_method(bottleneck, workload):
    return "w8a8-fp8" if bottleneck in ("memory", "compute") else sol.choose_method(bottleneck, workload)  # noqa: F821


# -- wrong answers an earlier version of the checks missed, or named wrongly ----------------------------------


@mutant(check="quantize_int4", message="rounds halves away from zero")
def quantize_int4(w, group_size=128, symmetric=True):  # noqa: F811
    return _m_int4(w, group_size, symmetric, rounding=lambda v: torch.sign(v) * torch.floor(v.abs() + 0.5))


@mutant(check="quantize_int4", message="does not clamp the zero point")
def quantize_int4(w, group_size=128, symmetric=True):  # noqa: F811
    return _m_int4(w, group_size, symmetric, clamp_zero=False)


@mutant(check="quantize_int4", message="does not clamp the codes")
def quantize_int4(w, group_size=128, symmetric=True):  # noqa: F811
    return _m_int4(w, group_size, symmetric, code_max=255)


@mutant(check="quantize_int4", message="computes in w's dtype")
def quantize_int4(w, group_size=128, symmetric=True):  # noqa: F811
    return _m_int4(w, group_size, symmetric, upcast=False)


def _m_int4(w, group_size, symmetric, rounding=torch.round, clamp_zero=True, code_max=15, upcast=True):
    """The solution's recipe with one step changed (the codes' rounding, a clamp, or the float32 upcast)."""
    N, K = w.shape
    g = (w.float() if upcast else w).view(N, K // group_size, group_size)
    if symmetric:
        scale = g.abs().amax(-1) / 7
        zero = torch.full_like(scale, 8)
    else:
        lo, hi = g.amin(-1), g.amax(-1)
        scale = (hi - lo) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).half()
    s = scale.float()
    if not symmetric:
        zero = torch.round(-lo / s)
        zero = zero.clamp(0, 15) if clamp_zero else zero
    q = (rounding(g / s[..., None]) + zero[..., None]).clamp(0, code_max).to(torch.uint8).view(N, K)
    return sol.Int4Weight(q[:, 0::2] | (q[:, 1::2] << 4), scale, zero.to(torch.uint8), group_size)  # noqa: F821


@mutant(check="dequantize_int4", message="multiplies in torch.bfloat16")
def dequantize_int4(qw, dtype=torch.float32):  # noqa: F811
    p = qw.packed
    N = p.shape[0]
    q = torch.stack([p & 0xF, p >> 4], dim=-1).view(N, -1)
    g = q.view(N, qw.scales.shape[1], qw.group_size).float() - qw.zeros.float()[..., None]
    return (g.to(dtype) * qw.scales.to(dtype)[..., None]).view(N, -1)


@mutant(check="quantize_fp8", message="gives an all-zero row a scale of 0")
def quantize_fp8(x, per_token):  # noqa: F811
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True) if per_token else xf.abs().amax().view(1, 1)
    scale = amax / 448.0  # no guard: 0 / 0 = NaN for an all-zero row
    return (xf / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


@mutant(check="quantize_fp8", message="gives an all-zero row a scale of 0")
def quantize_fp8(x, per_token):  # noqa: F811
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True) if per_token else xf.abs().amax().view(1, 1)
    scale = amax.clamp_min(1e-12) / 448.0  # an epsilon instead of the docstring's scale 1
    return (xf / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


@mutant(check="quantize_fp8", message="computes the scale in x's dtype")
def quantize_fp8(x, per_token):  # noqa: F811
    amax = x.abs().amax(-1, keepdim=True) if per_token else x.abs().amax().view(1, 1)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


@mutant(check="fp8_kv_cache", message="gives an all-zero (token, head) row a scale of 0")
def fp8_kv_write(k, slot_mapping, cache, scales):  # noqa: F811
    T, H, D = k.shape
    kf = k.reshape(T * H, D).float()
    s = kf.abs().amax(-1, keepdim=True) / 448.0
    q = (kf / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    cache.view(torch.uint8).index_copy_(0, slot_mapping, q.view(T, H, D).view(torch.uint8))
    scales.index_copy_(0, slot_mapping, s.view(T, H))


@mutant(check="fp8_kv_cache", message="dtype torch.float32, expected torch.float16")
def fp8_kv_read(cache, scales, slot_mapping, dtype=torch.float32):  # noqa: F811
    return sol.fp8_kv_read(cache, scales, slot_mapping)  # noqa: F821 - always float32


@mutant(check="fp8_kv_cache", message="multiplies in torch.float16")
def fp8_kv_read(cache, scales, slot_mapping, dtype=torch.float32):  # noqa: F811
    vals = cache.view(torch.uint8).index_select(0, slot_mapping).view(torch.float8_e4m3fn).to(dtype)
    return vals * scales.index_select(0, slot_mapping)[..., None].to(dtype)


@mutant(check="bottleneck", message="ignores weight_bytes (2 x tokens, as if every weight were 1 byte")
def bottleneck(workload, chip):  # noqa: F811
    return sol.bottleneck({**workload, "weight_bytes": 1}, chip)  # noqa: F821


@mutant(check="bottleneck", message="counts a cache that exactly fills the free memory as not fitting")
def bottleneck(workload, chip):  # noqa: F811
    if workload["kv_bytes_needed"] >= workload["free_bytes"]:
        return "kv_capacity"
    return sol.bottleneck(workload, chip)  # noqa: F821


@mutant(check="bottleneck", message="calls a step exactly at the ridge memory-bound")
def bottleneck(workload, chip):  # noqa: F811
    if workload["kv_bytes_needed"] > workload["free_bytes"]:
        return "kv_capacity"
    intensity = 2 * workload["tokens_per_step"] / workload["weight_bytes"]
    return "memory" if intensity <= chip["flops"] / chip["bandwidth"] else "compute"


@mutant(check="choose_method", message="picks w8a16 for any accuracy value")
def choose_method(bottleneck, workload):  # noqa: F811
    if bottleneck == "memory":
        return "w8a16" if workload.get("accuracy") else "w4a16"
    return sol.choose_method(bottleneck, workload)  # noqa: F821


@mutant(check="choose_method", message="picks fp8 weights and activations for a memory-bound step")
def choose_method(bottleneck, workload):  # noqa: F811
    if workload.get("fp8_tensor_cores") and bottleneck in ("memory", "compute"):
        return "w8a8-fp8"
    return sol.choose_method(bottleneck, workload)  # noqa: F821


# -- hostile: the cache argument swapped for a larger one (checked before the grader converts it) ----------


@mutant(check="fp8_kv_cache", message="expected the cache passed in")
def fp8_kv_write(k, slot_mapping, cache, scales):  # noqa: F811
    sol.fp8_kv_write(k, slot_mapping, cache, scales)  # noqa: F821
    cache.set_(torch.zeros(1000, *cache.shape[1:], dtype=torch.uint8).view(cache.dtype))


# -- named mistakes of the fp8 and int4 recipes, the static scale, int8 W8A8 -------------------------------------


@mutant(check="quantize_fp8", message="240, the largest value of float8_e4m3fnuz")
def quantize_fp8(x, per_token, scale=None):  # noqa: F811
    return _m_fp8(x, per_token, scale, fmax=240.0)  # torch.finfo(torch.float8_e4m3fnuz).max, the AMD encoding


@mutant(check="quantize_fp8", message="from the largest value (max) instead of the largest magnitude")
def quantize_fp8(x, per_token, scale=None):  # noqa: F811
    return _m_fp8(x, per_token, scale, absolute=False)


@mutant(check="quantize_fp8", message="does not clamp x / scale to [-448, 448] before the cast")
def quantize_fp8(x, per_token, scale=None):  # noqa: F811
    q, s = _m_fp8(x, per_token, scale)
    v = x.float() / s  # what the unclamped cast gives before PyTorch 2.12: NaN from 480 up (this CPU's torch saturates)
    return torch.where(v.abs() >= 480, torch.full_like(v, float("nan")), q.float()).to(torch.float8_e4m3fn), s


@mutant(check="quantize_fp8", message="ignores the static scale")
def quantize_fp8(x, per_token, scale=None):  # noqa: F811
    return sol.quantize_fp8(x, per_token)  # noqa: F821 - the calibrated scale dropped


def _m_fp8(x, per_token, scale, fmax=448.0, absolute=True):
    """quantize_fp8 with another largest value, or the scale from the signed max."""
    xf = x.float()
    if scale is None:
        big = xf.abs() if absolute else xf
        amax = big.amax(-1, keepdim=True) if per_token else big.amax().view(1, 1)
        scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    return (xf / scale.float()).clamp(-fmax, fmax).to(torch.float8_e4m3fn), scale.float()


@mutant(check="quantize_int4", message="takes the symmetric scale from the largest value (max)")
def quantize_int4(w, group_size=128, symmetric=True):  # noqa: F811
    if not symmetric:
        return sol.quantize_int4(w, group_size, symmetric)  # noqa: F821
    N, K = w.shape
    g = w.float().view(N, K // group_size, group_size)
    scale = g.amax(-1) / 7  # the signed max: a group whose extreme weight is negative gets too small a scale
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).half()
    q = (torch.round(g / scale.float()[..., None]) + 8).clamp(0, 15).to(torch.uint8).view(N, K)
    return sol.Int4Weight(q[:, 0::2] | (q[:, 1::2] << 4), scale, torch.full_like(scale, 8).to(torch.uint8),  # noqa: F821
                          group_size)


@mutant(check="dequantize_int4", message="tiles the per-group scales and zero points across the row")
def dequantize_int4(qw, dtype=torch.float32):  # noqa: F811
    p = qw.packed
    N = p.shape[0]
    q = torch.stack([p & 0xF, p >> 4], dim=-1).view(N, -1).float()
    z, s = qw.zeros.float().repeat(1, qw.group_size), qw.scales.float().repeat(1, qw.group_size)  # s0 s1 s0 s1 ...
    return ((q - z) * s).to(dtype)


@mutant(check="fp8_kv_cache", message="fp8_kv_write depends on quantize_fp8, which fails")
def quantize_fp8(x, per_token, scale=None):  # noqa: F811 - the solution's fp8_kv_write calls this one
    return _m_fp8(x, per_token, scale, fmax=240.0)


@mutant(check="choose_method", message="gives up (\"none\") on a compute-bound step whose chip has int8 tensor cores")
def choose_method(bottleneck, workload):  # noqa: F811
    if bottleneck == "compute":
        return "w8a8-fp8" if workload.get("fp8_tensor_cores") else "none"  # the fp8-or-nothing rule
    return sol.choose_method(bottleneck, workload)  # noqa: F821


@mutant(check="choose_method", message="picks INT8 W8A8 where fp8 tensor cores are there too")
def choose_method(bottleneck, workload):  # noqa: F811
    if bottleneck == "compute" and workload.get("int8_tensor_cores"):
        return "w8a8-int8"
    return sol.choose_method(bottleneck, workload)  # noqa: F821


@mutant(check="quantize_fp8", message="does not clamp x / scale")
def quantize_fp8(x, per_token, scale=None):  # noqa: F811
    xf = x.float()
    if scale is None:
        amax = xf.abs().amax(-1, keepdim=True) if per_token else xf.abs().amax().view(1, 1)
        scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (xf / scale.float()).to(torch.float8_e4m3fn), scale.float()  # saturates on PyTorch >= 2.12 only


@mutant(check="quantize_fp8", message="returns the static scale in the dtype it was given")
def quantize_fp8(x, per_token, scale=None):  # noqa: F811
    q, s = sol.quantize_fp8(x, per_token, scale)  # noqa: F821
    return q, s if scale is None else scale
