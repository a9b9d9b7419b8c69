"""Checks of lesson 16: int4 group quantization and its inverse, fp8 per tensor and per token, the fp8 KV
cache, the W4A16 Triton kernel, and choosing a method from the bottleneck.

Wrong answers are named by computing the usual wrong versions here on the same inputs (the `_*_variant`
functions below), never in the learner's process.
"""
from __future__ import annotations

import torch

from autograder import compare as cmp
from autograder.core import check
from autograder.harnesses.l16_quantization import call_without_saturation, time_w4a16
from autograder.reference import answer_code

FP8 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2


def _some(mistakes: dict) -> dict:
    """The mistakes that apply to this case (a value of None: not this case)."""
    return {k: v for k, v in mistakes.items() if v is not None}

# ---------------------------------------------------------------- 1. int4


@answer_code
def int4_variant(w: torch.Tensor, group: int, symmetric: bool, qmax_sym: int = 7, swap: bool = False,
                 per_row: bool = False, fp32_scale: bool = False, rounding: str = "round", clamp_zero: bool = True,
                 clamp_codes: bool = True, upcast: bool = True, signed_max: bool = False) -> tuple:
    """(packed, scales, zeros) of int4 quantization with one thing changed: the symmetric divisor, the nibble
    order, one scale per row instead of per group, codes from the float32 scale instead of the stored fp16 one,
    the rounding of the codes (`rounding`: "round", "trunc", or "half_away": `_round_half_away`; the checks pass a
    name, plain data, and tests may pass the function itself), no clamp of the zero point or of the codes, or the
    arithmetic in w's own dtype instead of float32, or (signed_max) the symmetric scale from the largest signed
    value instead of the largest magnitude."""
    if isinstance(rounding, str):
        rounding = {"round": torch.round, "trunc": torch.trunc, "half_away": _round_half_away}[rounding]
    N, K = w.shape
    g = (w.float() if upcast else w).view(N, K // group, group)
    stat = g.reshape(N, 1, K) if per_row else g
    if symmetric:
        scale = (stat.amax(-1) if signed_max else stat.abs().amax(-1)).expand(N, K // group) / qmax_sym
        zero = torch.full_like(scale, 8)
    else:
        lo, hi = stat.amin(-1).expand(N, K // group), stat.amax(-1).expand(N, K // group)
        scale = (hi - lo) / 15
    exact = torch.where(scale > 0, scale, torch.ones_like(scale))
    scale = exact.half()
    s = exact.float() if fp32_scale else scale.float()
    if not symmetric:
        zero = torch.round(-lo / s)
        zero = zero.clamp(0, 15) if clamp_zero else zero
    q = (rounding(g / s[..., None]) + zero[..., None]).clamp(0, 15 if clamp_codes else 255).to(torch.uint8).view(N, K)
    lo_col, hi_col = (q[:, 1::2], q[:, 0::2]) if swap else (q[:, 0::2], q[:, 1::2])
    return lo_col | (hi_col << 4), scale.contiguous(), zero.to(torch.uint8).contiguous()


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """Round half away from zero (2.5 -> 3), the habit torch.round's half-to-even (2.5 -> 2) replaces."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _weight(gen, N: int, K: int, group: int, outlier: bool) -> torch.Tensor:
    """A weight whose groups have different ranges (so per-row and per-group scales differ), plus an outlier."""
    w = torch.randn(N, K, generator=gen) * 0.02
    w *= torch.rand(N, K // group, 1, generator=gen).repeat_interleave(group, 1).view(N, K) * 4 + 0.25
    if outlier:
        w[0, 3] = 0.5  # one salient weight: it stretches its group's scale
        w[1, :group] = 0.0  # an all-zero group: scale 1
    return w


def _hand_made_weight() -> torch.Tensor:
    """A 4 x 32 weight (groups of 16) built so that each detail of the recipe changes some code or zero point:
    - row 0, group 0: amax 0.875, scale 1/8 exactly, values at 0.5, 1.5 and 2.5 steps (ties: half to even);
    - row 0, group 1: amax 1, one value between 3.5 steps of the fp16 and of the float32 scale 1/7;
    - row 1, group 0: min 0, max 1.875 (asymmetric scale 1/8 exactly), values at 0.5 and 2.5 steps;
    - row 2, group 0 all positive and row 3, group 0 all negative (asymmetric: the zero point clamps to 0 / 15,
      and codes past 15 clamp)."""
    w = torch.linspace(-0.3, 0.2, 4 * 32).view(4, 32)
    w[0, :16] = 0.0
    w[0, :7] = torch.tensor([0.875, -0.875, 0.0625, -0.0625, 0.3125, -0.3125, 0.1875])
    s32 = torch.tensor(1.0) / 7
    w[0, 16:] = 0.0
    w[0, 16], w[0, 17] = 1.0, 3.5 * (s32.half().float() + s32) / 2
    w[1, :16] = 0.0
    w[1, :3] = torch.tensor([1.875, 0.0625, 0.3125])
    w[2, :16] = torch.linspace(0.5, 1.0, 16)
    w[3, :16] = torch.linspace(-1.0, -0.5, 16)
    return w


def _int4_cases(t, extra: tuple = ()):
    visible = [("visible: 8 x 256, group 128, symmetric", (8, 256, 128, True, "random")),
               ("visible: 8 x 256, group 128, asymmetric", (8, 256, 128, False, "random")),
               ("visible: 4 x 64, group 32, symmetric", (4, 64, 32, True, "random")), *extra]

    def hidden(rng):
        return rng.choice([2, 6, 16]), rng.choice([128, 256, 384]), rng.choice([32, 64, 128]), rng.random() < 0.5, \
            "random"
    return t.cases(visible=visible, hidden=hidden, n=2)


_INT4_EXTRA = (
    ("visible: hand-made 4 x 32, group 16, symmetric (ties, fp16 vs float32 scale)", (4, 32, 16, True, "hand")),
    ("visible: hand-made 4 x 32, group 16, asymmetric (ties, all-positive and all-negative groups)",
     (4, 32, 16, False, "hand")),
    ("visible: 8 x 256 in bfloat16, group 128, asymmetric", (8, 256, 128, False, "bf16")))


def _int4_weight(t, N: int, K: int, G: int, kind: str) -> torch.Tensor:
    if kind == "hand":
        return _hand_made_weight()
    w = _weight(t.gen, N, K, G, outlier=True)
    return w.bfloat16() if kind == "bf16" else w


@check(points=3, section="1.1", timeout=30)
def quantize_int4(t):
    """Codes, fp16 scales and zero points per group, packed two per byte."""
    for label, (N, K, G, sym, kind) in _int4_cases(t, _INT4_EXTRA):
        if K % G:
            K = G * max(1, K // G)
        with t.case(f"{label}: w [{N}, {K}], group {G}, symmetric={sym}"):
            w = _int4_weight(t, N, K, G, kind)
            exp = t.ref.quantize_int4(w, G, sym)
            got = t.call("quantize_int4", w, G, sym)
            t.expect_true(isinstance(got, tuple) and len(got) == 4,
                          "quantize_int4 must return Int4Weight(packed, scales, zeros, group_size)")
            packed, scales, zeros, _ = got
            own_dtype = int4_variant(w, G, sym, upcast=False)
            in_dtype = f"computes in w's dtype ({w.dtype}); the recipe works in float32 (w.float()) and stores fp16"
            t.expect(scales, exp.scales, "scales (fp16, one per row and group)", mistakes=_some({
                "divides amax by 8 (the symmetric int4 grid is -7..7, so scale = amax / 7)":
                    int4_variant(w, G, sym, qmax_sym=8)[1] if sym else None,
                "computes one scale per row, not one per group of group_size columns":
                    int4_variant(w, G, sym, per_row=True)[1],
                "takes the symmetric scale from the largest value (max) instead of the largest magnitude "
                "(amax of |w|): a group whose most extreme weight is negative gets too small a scale":
                    int4_variant(w, G, sym, signed_max=True)[1] if sym else None,
                in_dtype: own_dtype[1]}))
            t.expect(zeros, exp.zeros, "zero points (uint8, one per row and group)", mistakes=_some({
                "does not clamp the zero point to [0, 15] (a group of all-positive weights has -min / scale < 0, "
                "an all-negative one > 15)": int4_variant(w, G, sym, clamp_zero=False)[2] if not sym else None,
                in_dtype: own_dtype[2]}))
            t.expect(packed, exp.packed, "packed codes (uint8 [N, K // 2])", mistakes={
                "puts column 2i in the high nibble (it belongs in the low nibble, 2i + 1 in the high)":
                    int4_variant(w, G, sym, swap=True)[0],
                "computes the codes with the float32 scale; use the fp16 scale you store (converted back to "
                "float32), the one dequantization multiplies by": int4_variant(w, G, sym, fp32_scale=True)[0],
                "rounds halves away from zero (2.5 -> 3); torch.round rounds half to even (2.5 -> 2)":
                    int4_variant(w, G, sym, rounding="half_away")[0],
                "truncates w / scale instead of rounding it (torch.round)":
                    int4_variant(w, G, sym, rounding="trunc")[0],
                "does not clamp the codes to [0, 15] before packing (a code past 15 spills into the other nibble)":
                    int4_variant(w, G, sym, clamp_codes=False)[0],
                in_dtype: own_dtype[0]})


@check(points=2, section="1.2", timeout=30)
def dequantize_int4(t):
    """The weight an Int4Weight stands for."""
    for label, (N, K, G, sym, _) in _int4_cases(t):
        with t.case(f"{label}: w [{N}, {K}], group {G}, symmetric={sym}, to fp32, fp16 and bf16"):
            qw = t.ref.quantize_int4(_weight(t.gen, N, K, G, outlier=False), G, sym)
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                got, exp = t.both("dequantize_int4", qw, dtype)
                p = qw.packed
                swapped = type(qw)((p >> 4) | (p << 4), qw.scales, qw.zeros, G)
                no_zero = type(qw)(p, qw.scales, torch.zeros_like(qw.zeros), G)
                # float32 math then one rounding is deterministic, so a 16-bit result must match exactly in bf16
                # (whose 8-bit mantissa would hide a second rounding under the default tolerance).
                exact = {"rtol": 0.0, "atol": 0.0} if dtype == torch.bfloat16 else {}
                t.expect(got, exp, f"dequantized weight ({dtype})", mistakes={
                    "reads column 2i from the high nibble (it is the low nibble)": t.ref.dequantize_int4(swapped, dtype),
                    "forgets to subtract the zero point": t.ref.dequantize_int4(no_zero, dtype),
                    "tiles the per-group scales and zero points across the row (scales.repeat(1, group_size): "
                    "s0 s1 s0 s1 ...) instead of repeating each group's over its own group_size columns "
                    "(repeat_interleave: s0 s0 ... s1 s1 ...)": dequant_tiled(qw, dtype),
                    f"multiplies in {dtype} (the fp16 scale rounded to it, then the product rounded again): compute "
                    "(q - zero) * scale in float32 and cast once at the end": dequant_in_dtype(qw, dtype)}, **exact)


@answer_code
def dequant_tiled(qw, dtype: torch.dtype) -> torch.Tensor:
    """dequantize_int4 with the [N, G] scales and zeros tiled to [N, K] (repeat) instead of expanded per group."""
    p = qw.packed
    N = p.shape[0]
    q = torch.stack([p & 0xF, p >> 4], dim=-1).view(N, -1).float()
    z, s = qw.zeros.float().repeat(1, qw.group_size), qw.scales.float().repeat(1, qw.group_size)
    return ((q - z) * s).to(dtype)


@answer_code
def dequant_in_dtype(qw, dtype: torch.dtype) -> torch.Tensor:
    """dequantize_int4 with the multiply done in dtype instead of float32."""
    p = qw.packed
    N = p.shape[0]
    q = torch.stack([p & 0xF, p >> 4], dim=-1).view(N, -1)
    g = q.view(N, qw.scales.shape[1], qw.group_size).float() - qw.zeros.float()[..., None]
    return (g.to(dtype) * qw.scales.to(dtype)[..., None]).view(N, -1)


# ---------------------------------------------------------------- 2. fp8


@answer_code
def fp8_variant(x: torch.Tensor, per_token: bool, dtype=FP8, guard: bool = True, upcast: bool = True,
                fmax: float | None = None, signed_max: bool = False) -> tuple:
    """quantize_fp8 with one thing changed: another fp8 format, another largest value (`fmax`: 240 is
    float8_e4m3fnuz's), no scale-1 guard for a zero amax, the arithmetic in x's own dtype instead of float32, or the
    scale from the largest signed value instead of the largest magnitude."""
    fmax = torch.finfo(dtype).max if fmax is None else fmax
    xf = x.float() if upcast else x
    big = xf if signed_max else xf.abs()
    amax = big.amax(-1, keepdim=True) if per_token else big.amax().view(1, 1)
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax)) if guard else amax / fmax
    return (xf / scale).clamp(-fmax, fmax).to(dtype), scale


NO_CLAMP = ("does not clamp x / scale to [-448, 448] before the cast: a cast without saturation (a GPU's conversion "
            "without its saturating flag, PyTorch's eager cast before 2.12) turns a value past 448 into NaN, and the "
            "grader casts that way for this case; PyTorch 2.12 and later saturate, so only a clamp gives the same "
            "answer everywhere")
FNUZ = ("scales to 240, the largest value of float8_e4m3fnuz (the E4M3 encoding AMD's MI300 uses, with no negative "
        "zero and its NaN moved to 0x80) or of an IEEE-style E4M3 that keeps its top exponent for inf/NaN; this "
        "lesson's float8_e4m3fn is OCP E4M3, whose only NaN is S.1111.111, so its largest finite value is 448")


def _no_nan_where_finite(t, got_q, exp_q, what: str) -> None:
    """Fail, naming the missing clamp, when the learner's fp8 values hold NaN where the expected ones are finite
    (what a non-saturating cast of an unclamped x / scale gives); other differences are left to t.expect."""
    if isinstance(got_q, torch.Tensor) and got_q.shape == exp_q.shape and got_q.is_floating_point():
        nan = got_q.float().isnan() & ~exp_q.float().isnan()
        if nan.any():
            where = tuple(int(i) for i in nan.nonzero()[0])
            more = f" (and {int(nan.sum()) - 1} more)" if nan.sum() > 1 else ""
            t.fail(f"{what}: NaN at {where}{more}, where the expected value is {exp_q.float()[where].item():g}.",
                   NO_CLAMP)


def _activations(gen, T: int, D: int, kind: str = "random") -> torch.Tensor:
    """Rows of very different magnitude (as activations are): per-token scales matter. kind "zero": row 1 all
    zeros; "bf16": the same rows in bfloat16."""
    x = torch.randn(T, D, generator=gen) * torch.logspace(-2, 2, T)[:, None]
    x[-1, 0] = 3000.0  # an outlier channel
    if kind == "zero":
        x[1] = 0.0
    return x.bfloat16() if kind == "bf16" else x


def _static_scale(x: torch.Tensor, per_token: bool) -> torch.Tensor:
    """A calibrated scale that some of x exceeds: per tensor 2.0 (the 3000 outlier lands at 1500, past 448); per
    token, each row's own amax / 448 times 1/4, 1, 4, 1/2, 2, ... (the rows at 1/4 and 1/2 reach 1792 and 896)."""
    if not per_token:
        return torch.tensor([[2.0]])
    factors = torch.tensor([0.25, 1.0, 4.0, 0.5, 2.0] * (x.shape[0] // 5 + 1))[:x.shape[0], None]
    return x.float().abs().amax(-1, keepdim=True) / 448 * factors


@check(points=3, section="2.1", timeout=30)
def quantize_fp8(t):
    """E4M3 values and float32 scales, per tensor and per token, computed (dynamic) or given (static)."""
    visible = [("visible: 6 tokens x 32, per token", (6, 32, True, "random")),
               ("visible: 6 tokens x 32, per tensor", (6, 32, False, "random")),
               ("visible: 4 tokens x 16, per token, token 1 all zeros", (4, 16, True, "zero")),
               ("visible: 3 tokens x 16, per tensor, all zeros", (3, 16, False, "all_zero")),
               ("visible: 6 tokens x 32 in bfloat16, per token", (6, 32, True, "bf16")),
               ("visible: 6 tokens x 32, per tensor, a static scale of 2.0 (the outlier saturates)",
                (6, 32, False, "static")),
               ("visible: 5 tokens x 16, per token, static scales some rows exceed", (5, 16, True, "static")),
               ("visible: 5 tokens x 16, per token, static scales given in float64", (5, 16, True, "static64"))]

    def hidden(rng):
        return rng.randint(2, 12), rng.choice([16, 64, 128]), rng.random() < 0.5, "random"
    for label, (T, D, per_token, kind) in t.cases(visible=visible, hidden=hidden, n=2):
        data = "all zeros" if kind == "all_zero" else "with rows from 0.01 to 100 and one 3000 outlier"
        with t.case(f"{label}: x [{T}, {D}] {data}"):
            x = torch.zeros(T, D) if kind == "all_zero" else _activations(t.gen, T, D, kind)
            static = _static_scale(x, per_token) if kind.startswith("static") else None
            if kind == "static64":
                static = static.double()
            args = (x, per_token) if static is None else (x, per_token, static)
            exp_q, exp_s = t.ref.quantize_fp8(*args)
            # a static scale puts values past 448: the learner's casts into fp8 run without saturation there
            got = t.call("quantize_fp8", *args) if static is None else \
                t.run(call_without_saturation, t.learner("quantize_fp8"), *args, what="quantize_fp8")
            t.expect_true(isinstance(got, tuple) and len(got) == 2, "quantize_fp8 must return (xq, scales)")
            got_q, got_s = got
            if static is not None:
                t.expect(got_s, exp_s, "scales (the static scale passed in, as float32)", mistakes=_some({
                    "ignores the static scale and computes amax / 448 anyway": fp8_variant(x, per_token)[1],
                    f"returns the static scale in the dtype it was given ({static.dtype}); return it as float32 "
                    "(scale.float())": static if static.dtype != torch.float32 else None}))
                _no_nan_where_finite(t, got_q, exp_q, "quantized values (float8_e4m3fn)")
                t.expect(got_q, exp_q, "quantized values (float8_e4m3fn)", mistakes={
                    "ignores the static scale and computes amax / 448 anyway": fp8_variant(x, per_token)[0]})
                continue
            t.expect(got_s, exp_s, "scales", mistakes=_some({
                "uses one scale for the whole tensor, not one per token": fp8_variant(x, False)[1].expand_as(exp_s),
                "computes a scale per token where one for the whole tensor was asked":
                    fp8_variant(x, True)[1] if not per_token else None,
                "scales to E5M2's range (57344): this lesson's fp8 is E4M3, max 448": fp8_variant(x, per_token, E5M2)[1],
                FNUZ: fp8_variant(x, per_token, fmax=240.0)[1],
                "takes the scale from the largest value (max) instead of the largest magnitude (amax of |x|): a row "
                "whose most extreme value is negative gets too small a scale": fp8_variant(x, per_token, signed_max=True)[1],
                "gives an all-zero row a scale of 0 (amax / 448, or a tiny epsilon): the docstring's scale for a "
                "zero amax is 1": fp8_variant(x, per_token, guard=False)[1],
                f"computes the scale in x's dtype ({x.dtype}); compute it in float32 (x.float()) and return float32 "
                "scales": fp8_variant(x, per_token, upcast=False)[1]}))
            _no_nan_where_finite(t, got_q, exp_q, "quantized values (float8_e4m3fn)")
            t.expect(got_q, exp_q, "quantized values (float8_e4m3fn)", mistakes={
                "quantizes to float8_e5m2; use torch.float8_e4m3fn (more mantissa, max 448)":
                    fp8_variant(x, per_token, E5M2)[0]})


@answer_code
def kv_variant(k, slots, num_slots, per_token_only: bool = False, ignore_slots: bool = False, guard: bool = True):
    """(cache as float32, scales) after a write with one thing changed: one scale per token over all heads,
    writing token t into slot t, or no scale-1 guard for an all-zero row."""
    T, H, D = k.shape
    cache = torch.zeros(num_slots, H, D)
    scales = torch.zeros(num_slots, H)
    amax = k.abs().amax((1, 2), keepdim=True).expand(T, H, 1) if per_token_only else k.abs().amax(-1, keepdim=True)
    s = torch.where(amax > 0, amax / 448, torch.ones_like(amax)) if guard else amax / 448
    q = (k / s).clamp(-448, 448).to(FP8).float()
    idx = torch.arange(T) if ignore_slots else slots
    cache[idx], scales[idx] = q, s[..., 0]
    return cache, scales


@answer_code
def unscaled_read(cache, slots, dtype: torch.dtype) -> torch.Tensor:
    """fp8_kv_read without the multiply by the scale."""
    return cache.view(torch.uint8)[slots].view(FP8).to(dtype)


@answer_code
def read_in_dtype(cache, scales, slots, dtype: torch.dtype) -> torch.Tensor:
    """fp8_kv_read with the fp8 values and the scales cast to dtype before the multiply (not float32)."""
    vals = cache.view(torch.uint8)[slots].view(FP8).to(dtype)
    return vals * scales[slots][..., None].to(dtype)


def _same_layout(t, got, expected: torch.Tensor, what: str) -> None:
    """Fail unless `got` is a tensor of expected's shape and dtype: checked before this process converts it
    (a cache the learner's code swapped for a 400 MB one would take 1.6 GB here as float32)."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != expected.dtype:
        t.fail(f"{what}: {cmp.describe(got)}, expected the cache passed in, "
               f"Tensor(shape={tuple(expected.shape)}, dtype={expected.dtype}), written in place")


def written_kv(ref, k, slots, num_slots: int) -> tuple:
    """(cache, scales) after ref.fp8_kv_write into a zeroed cache of num_slots: a reference computation that edits
    its arguments, so it goes through t.reference (a student's copy replays its result)."""
    cache = torch.zeros(num_slots, *k.shape[1:], dtype=FP8)
    scales = torch.zeros(num_slots, k.shape[1])
    ref.fp8_kv_write(k, slots, cache, scales)
    return cache, scales


@check(points=3, section="2.2", timeout=30)
def fp8_kv_cache(t):
    """fp8_kv_write (in place, one scale per token and KV head) and fp8_kv_read."""
    visible = [("visible: 5 tokens, 2 KV heads of 16, into 12 slots", (5, 2, 16, 12, False)),
               ("visible: 3 tokens, 4 KV heads of 32, into 40 slots", (3, 4, 32, 40, False)),
               ("visible: 4 tokens, 2 KV heads of 16, into 10 slots, token 2's head 1 all zeros", (4, 2, 16, 10, True))]

    def hidden(rng):
        return rng.randint(1, 8), rng.choice([1, 2, 4]), rng.choice([16, 32, 64]), rng.randint(10, 60), False
    for label, (T, H, D, S, zero_row) in t.cases(visible=visible, hidden=hidden, n=2):
        with t.case(f"{label}; read back in fp32, fp16 and bf16"):
            k = torch.randn(T, H, D, generator=t.gen) * torch.logspace(-1, 1, H)[None, :, None]
            if zero_row:
                k[2, 1] = 0.0
            slots = torch.tensor(t.rng.sample(range(1, S), T), dtype=torch.int64)  # slot 0 never: t != slots[t]
            cache, scales = torch.zeros(S, H, D, dtype=FP8), torch.zeros(S, H)
            exp_cache, exp_scales = t.reference(written_kv, k, slots, S)
            rows = k.reshape(T * H, D)
            exp_rows = t.ref.quantize_fp8(rows, True)
            _, after = t.call_fn(t.fn("fp8_kv_write"), k, slots, cache, scales, inplace=True)
            got_cache, got_scales = after[2], after[3]
            _same_layout(t, got_cache, exp_cache, "the cache after fp8_kv_write")
            if cmp.compare(got_scales, exp_scales) or cmp.compare(got_cache.float(), exp_cache.float()):
                t.blame_upstream("fp8_kv_write", "quantize_fp8", [((rows, True), list(exp_rows))], rtol=None,
                                 shown="these (token, head) rows, per_token=True")
            t.expect(got_scales, exp_scales, "the scales after the write", mistakes={
                "uses one scale per token across all KV heads (each head's row gets its own)":
                    kv_variant(k, slots, S, per_token_only=True)[1],
                "writes token t into slot t instead of slot_mapping[t]": kv_variant(k, slots, S, ignore_slots=True)[1],
                "gives an all-zero (token, head) row a scale of 0 (amax / 448): the docstring's scale for an all-zero "
                "row is 1 (0 / 0 would put NaN in the cache)": kv_variant(k, slots, S, guard=False)[1]})
            t.expect(got_cache.float(), exp_cache.float(), "the cache after the write (as float32)")
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                got, exp = t.both("fp8_kv_read", exp_cache, exp_scales, slots, dtype)
                # One float32 multiply, then one cast: deterministic, so 16-bit reads must match exactly (bf16's
                # default tolerance would hide a multiply done in bf16).
                exact = {} if dtype == torch.float32 else {"rtol": 0.0, "atol": 0.0}
                t.expect(got, exp, f"fp8_kv_read's dequantized K ({dtype})", mistakes={
                    "forgets to multiply by the scale": unscaled_read(exp_cache, slots, dtype),
                    f"multiplies in {dtype} (the fp8 values and the scale cast to it first): multiply in float32, "
                    "then cast": read_in_dtype(exp_cache, exp_scales, slots, dtype)}, **exact)


# ---------------------------------------------------------------- 3. the W4A16 kernel


@answer_code
def matmul_with(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x @ w.T in x's dtype, cast to dtype: the product a wrong dequantized weight `w` gives."""
    return (x @ w.T).to(dtype)


@check(points=4, section="3.1", timeout=120, cost=0.7, requires_triton=True)
def w4a16_kernel(t):
    """The Triton W4A16 kernel against x @ dequantize_int4(qw).T (fp32, fp16; bf16 and timing on CUDA)."""
    visible = [("visible: x [5, 256], W [48, 256], group 128, asymmetric", (5, 48, 256, 128, False)),
               ("visible: x [17, 64], W [40, 64], group 32, symmetric (rows and columns past a tile)",
                (17, 40, 64, 32, True))]

    def hidden(rng):
        return rng.randint(1, 20), rng.choice([16, 32, 50]), 128 * rng.randint(1, 2), rng.choice([32, 64, 128]), \
            rng.random() < 0.5
    for label, (M, N, K, G, sym) in t.cases(visible=visible, hidden=hidden, n=1):
        with t.case(f"{label}: fp32 and fp16 activations"):
            # On the checking device: natively compiled Triton kernels read only GPU tensors.
            qw = t.ref.quantize_int4(_weight(t.gen, N, K, G, outlier=False).to(t.device), G, sym)
            x = torch.randn(M, K, generator=t.gen).to(t.device)
            for dtype in (torch.float32, torch.float16):
                xd = x.to(dtype)
                exp = t.ref.w4a16_matmul(xd, qw)
                got = t.call("w4a16_matmul", xd, qw)
                p = qw.packed
                w_swap = t.ref.dequantize_int4(type(qw)((p >> 4) | (p << 4), qw.scales, qw.zeros, G))
                w_nozero = t.ref.dequantize_int4(type(qw)(p, qw.scales, torch.zeros_like(qw.zeros), G))
                t.expect(got, exp, f"x @ W.T ({dtype})", mistakes={
                    "reads column 2i from the high nibble (it is the low nibble)": matmul_with(x, w_swap, dtype),
                    "forgets to subtract the zero point": matmul_with(x, w_nozero, dtype)},
                    rtol=2e-3 if dtype == torch.float16 else None, atol=2e-2 if dtype == torch.float16 else None,
                    # Reached only once fp32 matched on this case (a failure ends the case), so this much is certain.
                    hint="It matched with float32 activations on this case, so what differs is the fp16 path: the "
                         "docstring casts the dequantized W tile to x's dtype, accumulates tl.dot in float32 and casts "
                         "only the stored result." if dtype == torch.float16 else "")
    with t.case(f"speed: bf16, x [16, 4096] @ W [14336, 4096].T, within {W4A16_SLOWEST}x of a bf16 matmul "
                "(CUDA events, L2 flushed before each call)", requires_cuda=True) as on:
        if on:
            got = t.run(time_w4a16, t.learner("w4a16_matmul"), t.rng.randrange(2**31), what="w4a16_matmul, timed,")
            mine, ref = got["mine"], got["bf16"]
            if not (type(mine) is float and type(ref) is float and mine > 0 and ref > 0):
                t.fail(f"the timing of your kernel came back as {mine!r} s per call: it must be a positive time")
            t.expect_true(mine <= W4A16_SLOWEST * ref,
                          f"your W4A16 matmul takes {mine * 1e6:.1f} us, the bf16 matmul {ref * 1e6:.1f} us: at 16 "
                          "rows this GEMM is memory-bound and int4 weights with their scales and zeros are about 27% "
                          "of bf16's bytes, so it should not be slower. Load each group's packed bytes once, as a "
                          "[BLOCK_N, GROUP_SIZE // 2] tile along the row (gathering byte k // 2 into a "
                          "[GROUP_SIZE, BLOCK_N] tile reads every byte twice, strided across lanes), and keep the "
                          "dequantization in registers")


# How much slower than the bf16 matmul the learner's kernel may be at batch 16. The bar the lesson aims at is a
# speedup (Marlin, Frantar et al., PPoPP 2025, is near the ideal 4x over FP16 up to batch 16-32, reference-facts.md),
# but the solution's kernel measured 33 us against bf16's 34 us on an H200 (2026-12-04, L2 not flushed): a bar above
# parity waits until a reference kernel is shown to clear it on a GPU (gpu_check --perf times it at 1, 4 and 16 rows).
W4A16_SLOWEST = 2.0


# ---------------------------------------------------------------- 5. which method

H100 = {"flops": 989e12, "bandwidth": 3.35e12}  # dense bf16 FLOP/s and HBM bytes/s, datasheet (reference-facts.md)


RIDGE_200 = {"flops": 4e14, "bandwidth": 2e12}  # a made-up chip whose ridge is exactly 200 FLOP per byte


@answer_code
def bottleneck_variant(w: dict, chip: dict, kv_first: bool = True, intensity: str = "2 tok / b",
                       fits_strict: bool = False, memory_at_ridge: bool = False) -> str:
    """bottleneck with one thing changed: the roofline before KV capacity, another intensity formula (by name:
    "tok", "2 tok", "tok / b" or "2 tok * b", of tokens per step and bytes per weight), a cache that exactly
    fills the free bytes counted as not fitting, or a step exactly at the ridge counted as memory-bound."""
    need, free = w["kv_bytes_needed"], w["free_bytes"]
    fits = need < free if fits_strict else need <= free
    formulas = {"2 tok / b": lambda tok, b: 2 * tok / b, "tok": lambda tok, b: tok, "2 tok": lambda tok, b: 2 * tok,
                "tok / b": lambda tok, b: tok / b, "2 tok * b": lambda tok, b: 2 * tok * b}
    inten = formulas[intensity](w["tokens_per_step"], w["weight_bytes"])
    ridge = chip["flops"] / chip["bandwidth"]
    roof = "memory" if (inten <= ridge if memory_at_ridge else inten < ridge) else "compute"
    if kv_first:
        return roof if fits else "kv_capacity"
    return "kv_capacity" if roof == "memory" and not fits else roof


def _workload(tokens, weight_bytes=2, kv=10e9, free=40e9):
    return {"tokens_per_step": tokens, "weight_bytes": weight_bytes, "kv_bytes_needed": kv, "free_bytes": free}


@check(points=2, section="5.1", timeout=20)
def bottleneck(t):
    """KV capacity first, then lesson 01's roofline on the weight GEMM."""
    visible = [("visible: decode, batch 1, bf16 on H100", (_workload(1), H100)),
               ("visible: prefill of 4 x 2048 tokens, bf16 on H100", (_workload(8192), H100)),
               ("visible: prefill of 4096 tokens whose cache does not fit", (_workload(4096, kv=50e9), H100)),
               ("visible: 256 tokens per step with fp8 weights (1 byte): past the ridge", (_workload(256, 1), H100)),
               ("visible: 200 tokens per step with int4 weights (0.5 byte)", (_workload(200, 0.5), H100)),
               ("visible: 200 tokens per step, bf16 (2 bytes): below the ridge", (_workload(200, 2), H100)),
               ("visible: decode whose cache exactly fills the free memory (it fits)",
                (_workload(1, kv=40e9, free=40e9), H100)),
               ("visible: exactly at the ridge: 200 tokens, bf16 (2 bytes), a chip of 4e14 FLOP/s and 2e12 B/s",
                (_workload(200, 2), RIDGE_200))]

    def hidden(rng):
        w = _workload(rng.choice([1, 8, 64, 150, 300, 2048]), rng.choice([2, 1, 0.5]),
                      kv=rng.uniform(1e9, 60e9), free=rng.uniform(20e9, 60e9))
        return w, H100
    for label, (w, chip) in t.cases(visible=visible, hidden=hidden, n=3):
        with t.case(f"{label}: {w}"):
            got, exp = t.both("bottleneck", w, chip)
            # A string answer matches every mistake that gives the same label; equal ones are named together.
            t.expect(got, exp, "bottleneck", mistakes={
                "checks the roofline before KV capacity (a cache that does not fit stops you whatever the roofline "
                "says)": bottleneck_variant(w, chip, kv_first=False),
                "ignores weight_bytes (intensity = 2 x tokens / bytes per weight: fewer bytes, more FLOP per byte)":
                    bottleneck_variant(w, chip, intensity="tok"),
                "ignores weight_bytes (2 x tokens, as if every weight were 1 byte; intensity = 2 x tokens / bytes "
                "per weight)": bottleneck_variant(w, chip, intensity="2 tok"),
                "forgets the 2 FLOPs per multiply-add (intensity = 2 x tokens / weight_bytes)":
                    bottleneck_variant(w, chip, intensity="tok / b"),
                "multiplies by weight_bytes instead of dividing (fewer bytes per weight, more FLOP per byte)":
                    bottleneck_variant(w, chip, intensity="2 tok * b"),
                "counts a cache that exactly fills the free memory as not fitting (only kv_bytes_needed > "
                "free_bytes does not fit)": bottleneck_variant(w, chip, fits_strict=True),
                "calls a step exactly at the ridge memory-bound (at or above the ridge is compute)":
                    bottleneck_variant(w, chip, memory_at_ridge=True)})


@answer_code
def method_mistakes(b: str, w: dict) -> dict:
    """The usual wrong methods for bottleneck `b` and workload `w` (None: that mistake does not apply)."""
    return {
        "picks fp8 weights and activations for a memory-bound step (it halves bytes, as int8 weight-only "
        "does, while int4 weight-only quarters them)": "w8a8-fp8" if b == "memory" else None,
        "picks weight-only int4 for a compute-bound step (the matmul still runs at 16-bit speed)":
            "w4a16" if b == "compute" else None,
        "quantizes the weights when the KV cache is what does not fit": "w4a16" if b == "kv_capacity" else None,
        "picks w8a16 for any accuracy value (only \"strict\" asks for int8 weights)":
            "w8a16" if b == "memory" and w.get("accuracy") not in (None, "strict") else None,
        "gives up (\"none\") on a compute-bound step whose chip has int8 tensor cores: INT8 W8A8 runs from compute "
        "capability 7.5 (vLLM's INT8 W8A8 docs)":
            "none" if b == "compute" and not w.get("fp8_tensor_cores") and w.get("int8_tensor_cores") else None,
        "picks INT8 W8A8 where fp8 tensor cores are there too (prefer fp8: dynamic fp8 needs no calibration data, "
        "int8 activation scales do)":
            "w8a8-int8" if b == "compute" and w.get("fp8_tensor_cores") and w.get("int8_tensor_cores") else None,
        "picks INT8 W8A8 on a chip without int8 tensor cores":
            "w8a8-int8" if b == "compute" and not w.get("int8_tensor_cores") and not w.get("fp8_tensor_cores")
            else None}


@check(points=2, section="5.2", timeout=20)
def choose_method(t):
    """Weight-only for memory-bound, W8A8 (fp8, else int8) for compute-bound, fp8 KV for capacity."""
    cases = [("memory", {}), ("memory", {"accuracy": "strict"}), ("compute", {"fp8_tensor_cores": True}),
             ("compute", {"fp8_tensor_cores": False}), ("kv_capacity", {}), ("kv_capacity", {"fp8_tensor_cores": True}),
             ("memory", {"accuracy": "normal"}), ("memory", {"fp8_tensor_cores": True}),
             ("compute", {"fp8_tensor_cores": False, "int8_tensor_cores": True}),
             ("compute", {"fp8_tensor_cores": True, "int8_tensor_cores": True})]
    for b, w in cases:
        with t.case(f"visible: bottleneck {b!r}, workload {w}"):
            got, exp = t.both("choose_method", b, w)
            t.expect(got, exp, "method", mistakes=_some(method_mistakes(b, w)))
    with t.case("an unknown bottleneck is refused"):
        t.expect_raises(ValueError, "choose_method", "network", {}, why="there is no method for an unknown bottleneck")
