"""Lesson 16: quantization, matched to the resource you are short of, and the evals perplexity misses.

- Section 1: int4 group quantization (groups of 128 input columns, two values per byte, fp16 scales),
  symmetric and asymmetric, and its inverse.
- Section 2: fp8 E4M3 with per-tensor and per-token scales, computed or static (calibrated), saturating at 448,
  and an fp8 KV cache written and read with one scale per (token, KV head).
- Section 3: a Triton W4A16 kernel: int4 weights dequantized inside the matmul.
- Section 4: evals beyond perplexity (helpers: KL to the full-precision model, top-1 flips, greedy
  agreement, by position).
- Section 5: which method for which bottleneck (lesson 01's roofline).

Weights are [out_features N, in_features K] as in nn.Linear; y = x @ W.T.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from reference_engine.kernels.launch import launch
from reference_engine.kernels.triton_compat import tl, triton  # Triton; without it (macOS) a stand-in: see there

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite E4M3 value (E4M3 has no infinity)
GROUP = 128


class Int4Weight(NamedTuple):
    """A weight [N, K] quantized to int4 per group of `group_size` input columns.

    packed uint8 [N, K // 2]: column 2i in the low nibble of byte i, column 2i + 1 in the high nibble;
    scales fp16 [N, K // group_size]; zeros uint8 [N, K // group_size] (8 for symmetric);
    w ~ (q - zero) * scale for the unsigned 4-bit code q in [0, 15].
    """
    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int


# ---------------------------------------------------------------- 1. int4 group quantization


def quantize_int4(w: torch.Tensor, group_size: int = GROUP, symmetric: bool = True) -> Int4Weight:
    """Exercise 1.1: quantize w [N, K] (K a multiple of group_size, group_size even) to int4 per group.

    Per row and per group of group_size consecutive columns, computed in float32:
    - symmetric: scale = amax(|w|) / 7, zero = 8; codes q = round(w / scale) + 8, clamped to [0, 15];
    - asymmetric: scale = (max - min) / 15, zero = round(-min / scale) clamped to [0, 15];
      codes q = round(w / scale) + zero, clamped to [0, 15].
    A group whose scale would be 0 (all values equal to 0, or all equal) uses scale 1.
    The scale is stored as fp16, and the codes are computed with that fp16 scale (converted back to float32),
    the one dequantization will use. torch.round (half to even). Then pack: byte i of a row holds column 2i
    in its low 4 bits and column 2i + 1 in its high 4 bits.
    Returns Int4Weight(packed uint8 [N, K // 2], scales fp16 [N, G], zeros uint8 [N, G], group_size).
    """
    ### BEGIN SOLUTION
    N, K = w.shape
    g = w.float().view(N, K // group_size, group_size)
    if symmetric:
        scale = g.abs().amax(-1) / 7
        zero = torch.full_like(scale, 8)
    else:
        lo, hi = g.amin(-1), g.amax(-1)
        scale = (hi - lo) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).half()
    s = scale.float()
    if not symmetric:
        zero = torch.round(-lo / s).clamp(0, 15)
    q = (torch.round(g / s[..., None]) + zero[..., None]).clamp(0, 15).to(torch.uint8).view(N, K)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    return Int4Weight(packed, scale, zero.to(torch.uint8), group_size)
    ### END SOLUTION


def dequantize_int4(qw: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Exercise 1.2: the weight [N, K] an Int4Weight stands for, in dtype: (q - zero) * scale per group,
    computed in float32 and cast at the end. Unpack: column 2i is the low nibble of byte i, 2i + 1 the high."""
    ### BEGIN SOLUTION
    p = qw.packed
    N = p.shape[0]
    q = torch.stack([p & 0xF, p >> 4], dim=-1).view(N, -1)
    g = q.view(N, qw.scales.shape[1], qw.group_size).float() - qw.zeros.float()[..., None]
    return (g * qw.scales.float()[..., None]).view(N, -1).to(dtype)
    ### END SOLUTION


def int4_bytes(qw: Int4Weight) -> int:
    """Bytes an Int4Weight stores (codes, scales, zero points): about 4.19 bits per weight at group 128 (a helper)."""
    return sum(t.numel() * t.element_size() for t in (qw.packed, qw.scales, qw.zeros))


# ---------------------------------------------------------------- 2. fp8


def quantize_fp8(x: torch.Tensor, per_token: bool,
                 scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 2.1: x [T, D] -> (xq float8_e4m3fn [T, D], scales float32: [T, 1] per token or [1, 1] per tensor).

    Dynamic (scale None): scale = amax(|x|) / 448 over the row (per_token) or the whole tensor (the largest
    magnitude, |x|, not the largest signed value), computed in float32; a zero amax uses scale 1.
    Static (scale given, as calibrated offline: [T, 1] per token, [1, 1] per tensor): use it as given (as float32);
    values of x beyond 448 x scale then saturate.
    xq = (x / scale) clamped to [-448, 448], then .to(torch.float8_e4m3fn). 448 is the largest finite value of
    OCP E4M3 (float8_e4m3fn), which has no infinity. Clamp before the cast: before PyTorch 2.12 the eager cast
    gives NaN for |x / scale| >= 480 (pytorch#178817; it saturates from 2.12), so only the clamp gives the same
    answer on every version. x ~ xq.float() * scale.
    """
    ### BEGIN SOLUTION
    xf = x.float()
    if scale is None:
        amax = xf.abs().amax(-1, keepdim=True) if per_token else xf.abs().amax().view(1, 1)
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    else:
        scale = scale.float()
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
    ### END SOLUTION


def fp8_kv_write(k: torch.Tensor, slot_mapping: torch.Tensor, cache: torch.Tensor, scales: torch.Tensor) -> None:
    """Exercise 2.2: write k [T, kv_heads, D] into an fp8 cache, one scale per (token, KV head), in place.

    cache float8_e4m3fn [num_slots, kv_heads, D]; scales float32 [num_slots, kv_heads]; token t goes to slot
    slot_mapping[t]. Each (token, head) row of D values is quantized as in quantize_fp8 per token: scale =
    amax / 448 (1 for an all-zero row), values / scale clamped to [-448, 448]. Only the named slots change.
    (CPU torch has no index_copy_ for float8: write through cache.view(torch.uint8), with the fp8 values
    viewed as uint8 too.)
    """
    ### BEGIN SOLUTION
    T, H, D = k.shape
    q, s = quantize_fp8(k.reshape(T * H, D), per_token=True)
    cache.view(torch.uint8).index_copy_(0, slot_mapping, q.view(T, H, D).view(torch.uint8))
    scales.index_copy_(0, slot_mapping, s.view(T, H))
    ### END SOLUTION


def fp8_kv_read(cache: torch.Tensor, scales: torch.Tensor, slot_mapping: torch.Tensor,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Exercise 2.2 (with fp8_kv_write): the K (or V) of the slots named by slot_mapping [T], dequantized: [T, kv_heads, D] in dtype.
    value = cache value (as float32) * its (slot, head) scale, then cast to dtype."""
    ### BEGIN SOLUTION
    vals = cache.view(torch.uint8).index_select(0, slot_mapping).view(FP8).float()
    return (vals * scales.index_select(0, slot_mapping)[..., None]).to(dtype)
    ### END SOLUTION


# ---------------------------------------------------------------- 3. the W4A16 kernel


@triton.jit
def w4a16_kernel(x_ptr, packed_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                 stride_xm, stride_pn, stride_sn, stride_om,
                 GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """Exercise 3.1: out [M, N] = x [M, K] @ W.T, W the int4 weight, dequantized in the kernel.

    Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)); program (i, j) computes the out tile of rows i*BLOCK_M ..
    and columns j*BLOCK_N .. (rows >= M and columns >= N masked). It walks K one group at a time
    (BLOCK_K = GROUP_SIZE, K a multiple of it): for group g, columns k = g*GROUP_SIZE + arange(GROUP_SIZE):
    - x tile [BLOCK_M, GROUP_SIZE] from x_ptr + m * stride_xm + k;
    - codes: column k of row n is in byte packed_ptr + n * stride_pn + k // 2, the low nibble for even k, the
      high one for odd k. Load the group's bytes once, as a [BLOCK_N, GROUP_SIZE // 2] tile (byte j of the group
      at packed_ptr + n * stride_pn + g * GROUP_SIZE // 2 + j: consecutive addresses along j), and split each
      into its two codes: tl.reshape(tl.join(byte & 15, byte >> 4), [BLOCK_N, GROUP_SIZE]) puts them in k order;
    - scale and zero of (n, g): scales_ptr + n * stride_sn + g (zeros has the same layout, stride_sn);
    - W tile [BLOCK_N, GROUP_SIZE] = (code - zero) * scale in float32, cast to x's dtype;
    - acc [BLOCK_M, BLOCK_N] float32 += tl.dot(x tile, tl.trans(W tile)) (input_precision="ieee" when IEEE, for
      fp32).
    Store acc cast to out's dtype at out_ptr + m * stride_om + n. Every tensor's last dimension is contiguous.
    Why the byte tile: gathering byte k // 2 for a [GROUP_SIZE, BLOCK_N] tile reads each byte twice, at addresses
    stride_pn apart from one lane to the next; on an H200 that version ran 3.3x slower than this one (107 vs
    33 us for x [16, 4096] @ W [14336, 4096].T in bf16; a bf16 matmul: 34 us).
    """
    ### BEGIN SOLUTION
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, GROUP_SIZE)
    jj = tl.arange(0, GROUP_SIZE // 2)
    mmask, nmask = m < M, n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for g in range(0, K // GROUP_SIZE):
        k = g * GROUP_SIZE + kk
        x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=mmask[:, None], other=0.0)
        byte = tl.load(packed_ptr + n[:, None] * stride_pn + (g * (GROUP_SIZE // 2) + jj)[None, :],
                       mask=nmask[:, None], other=0)  # [BLOCK_N, GROUP_SIZE // 2]: each byte once, coalesced
        code = tl.reshape(tl.join(byte & 15, (byte >> 4) & 15), [BLOCK_N, GROUP_SIZE]).to(tl.float32)
        scale = tl.load(scales_ptr + n * stride_sn + g, mask=nmask, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + n * stride_sn + g, mask=nmask, other=0).to(tl.float32)
        w = ((code - zero[:, None]) * scale[:, None]).to(x.dtype)  # [BLOCK_N, GROUP_SIZE]
        if IEEE:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    tl.store(out_ptr + m[:, None] * stride_om + n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])
    ### END SOLUTION


def launch_w4a16(kernel, x: torch.Tensor, qw: Int4Weight, block_m: int = 16, block_n: int = 32) -> torch.Tensor:
    """Run a W4A16 `kernel` (w4a16_kernel's signature): x [M, K] (fp32 / fp16 / bf16) -> [M, N] in x's dtype."""
    M, K = x.shape
    N = qw.packed.shape[0]
    G = qw.group_size
    if K % G or G < 16 or G & (G - 1) or qw.packed.shape[1] * 2 != K:
        raise ValueError(f"need K ({K}) a multiple of group_size ({G}), group_size a power of two >= 16 "
                         f"(tl.dot's smallest tile), and packed [N, K // 2]; got packed {tuple(qw.packed.shape)}")
    x, packed = x.contiguous(), qw.packed.contiguous()
    scales, zeros = qw.scales.contiguous(), qw.zeros.contiguous()
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    launch(kernel, grid, x, packed, scales, zeros, out, M, N, K, x.stride(0), packed.stride(0), scales.stride(0),
           out.stride(0), GROUP_SIZE=G, BLOCK_M=block_m, BLOCK_N=block_n, IEEE=x.dtype == torch.float32,
           stub="Exercise 3.1 (w4a16_kernel): see section 3.1 of lessons/l16_quantization.ipynb")
    return out


def w4a16_matmul(x: torch.Tensor, qw: Int4Weight) -> torch.Tensor:
    """x @ dequantize_int4(qw).T computed by w4a16_kernel (a helper: the kernel is the exercise)."""
    return launch_w4a16(w4a16_kernel, x, qw)


# ---------------------------------------------------------------- 4. evals beyond perplexity (helpers)


def compare_logits(ref_logits: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> dict:
    """Per-position metrics of a quantized model against the full-precision one (a helper).

    ref_logits, logits [W, T, V] (W windows, T positions); targets [W, T] (the next tokens).
    Returns float32 tensors [W, T]: nll (the quantized model's cross-entropy), ref_nll, kl = KL(ref || quant) of
    the next-token distributions (nats), flip = 1.0 where the top-1 token differs.
    """
    lp_ref, lp = ref_logits.float().log_softmax(-1), logits.float().log_softmax(-1)
    nll = -lp.gather(-1, targets[..., None])[..., 0]
    ref_nll = -lp_ref.gather(-1, targets[..., None])[..., 0]
    kl = (lp_ref.exp() * (lp_ref - lp)).sum(-1)
    flip = (lp_ref.argmax(-1) != lp.argmax(-1)).float()
    return {"nll": nll, "ref_nll": ref_nll, "kl": kl, "flip": flip}


def summarize(m: dict) -> dict:
    """Scalars of compare_logits' output: perplexity of both models, mean KL, flip rate."""
    return {"ppl": math.exp(m["nll"].mean().item()), "ref_ppl": math.exp(m["ref_nll"].mean().item()),
            "kl": m["kl"].mean().item(), "flips": m["flip"].mean().item()}


def greedy_agreement(ref_tokens: list[list[int]], tokens: list[list[int]]) -> dict:
    """How far greedy continuations agree (a helper): mean fraction of positions equal, and the mean length of
    the common prefix (the first disagreement changes everything after it)."""
    same, prefix = [], []
    for a, b in zip(ref_tokens, tokens):
        n = min(len(a), len(b))
        same.append(sum(x == y for x, y in zip(a[:n], b[:n])) / max(n, 1))
        k = next((i for i in range(n) if a[i] != b[i]), n)
        prefix.append(k)
    return {"match_fraction": sum(same) / len(same), "mean_common_prefix": sum(prefix) / len(prefix)}


# ---------------------------------------------------------------- 5. which method


METHODS = ("w4a16", "w8a16", "w8a8-fp8", "fp8-kv", "w8a8-int8", "none")


def bottleneck(workload: dict, chip: dict) -> str:
    """Exercise 5.1: what limits one step: "kv_capacity", "memory" or "compute".

    workload: tokens_per_step (tokens every weight GEMM processes this step: the batch for decode, the batch's
    prompt tokens for prefill), weight_bytes (bytes per weight element: 2 for bf16), kv_bytes_needed (the KV
    cache the workload's sequences need), free_bytes (memory left for KV after the weights).
    chip: flops (FLOP/s), bandwidth (bytes/s).
    First, if the cache does not fit (kv_bytes_needed > free_bytes) -> "kv_capacity". Otherwise lesson 01's
    roofline for a weight GEMM whose weight read dominates the bytes: arithmetic intensity = 2 * tokens_per_step /
    weight_bytes FLOP per byte; below the ridge flops / bandwidth -> "memory", at or above -> "compute".
    """
    ### BEGIN SOLUTION
    if workload["kv_bytes_needed"] > workload["free_bytes"]:
        return "kv_capacity"
    intensity = 2 * workload["tokens_per_step"] / workload["weight_bytes"]
    return "memory" if intensity < chip["flops"] / chip["bandwidth"] else "compute"
    ### END SOLUTION


def choose_method(bottleneck: str, workload: dict) -> str:
    """Exercise 5.2: the quantization that relieves `bottleneck`, one of METHODS.

    - "memory" (decode streams the weights once per step): weight-only, fewer weight bytes, activations kept in
      16 bits: "w4a16", or "w8a16" when workload["accuracy"] == "strict" (int8 weights barely move the outputs);
    - "compute" (prefill, large batches): weights and activations in 8 bits, so the tensor cores run at their
      8-bit rate: "w8a8-fp8" if workload["fp8_tensor_cores"] is true (compute capability 8.9 and up: Ada, Hopper,
      Blackwell); else "w8a8-int8" if workload["int8_tensor_cores"] is true (INT8 W8A8 runs from compute
      capability 7.5: Turing, Ampere...); with both, fp8 (dynamic fp8 needs no calibration data, int8
      activation scales do); with neither, "none" (quantizing only the weights does not speed a compute-bound
      matmul: the math still runs in 16 bits);
    - "kv_capacity": "fp8-kv" (half the bytes per cached token, twice the tokens).
    Any other bottleneck: ValueError.
    """
    ### BEGIN SOLUTION
    if bottleneck == "memory":
        return "w8a16" if workload.get("accuracy") == "strict" else "w4a16"
    if bottleneck == "compute":
        if workload.get("fp8_tensor_cores"):
            return "w8a8-fp8"
        return "w8a8-int8" if workload.get("int8_tensor_cores") else "none"
    if bottleneck == "kv_capacity":
        return "fp8-kv"
    raise ValueError(f"unknown bottleneck {bottleneck!r}: expected 'memory', 'compute' or 'kv_capacity'")
    ### END SOLUTION


# ---------------------------------------------------------------- helpers the notebook uses (not exercises)


def heldout_windows(n: int = 16, seq_len: int = 256) -> torch.Tensor:
    """n windows [n, seq_len] spread over the held-out token stream, chosen as reference_engine/tools/train.py does:
    the 128 windows behind checkpoints/metrics.json, every (128 // n)-th of them (the first n when n > 128)."""

    from tokenizers import Tokenizer

    from reference_engine.shipped import TARGET
    from reference_engine.tools import train

    _, held, _ = train.split_corpus()
    tok = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    windows = train.eval_windows(train.token_stream(tok, held), seq_len, 128)
    return windows[:: max(1, 128 // n)][:n]


@torch.no_grad()
def window_logits(llm, windows: torch.Tensor) -> torch.Tensor:
    """Logits [W, T, vocab] (float32) at every position of each window, each scored from an empty context by the
    engine's own model, KV cache and attention backend (one prefill per window; the engine must be idle)."""
    from reference_engine.attention import AttentionMetadata

    eng = llm.engine
    out = []
    for w in windows:
        T = len(w)
        nb = -(-T // eng.block_size)
        meta = AttentionMetadata(slot_mapping=torch.arange(T, device=eng.device), num_decode_tokens=0,
                                 decode_block_tables=None, decode_context_lens=None, prefill_cu_seqlens=[0, T],
                                 prefill_context_lens=[T],
                                 prefill_block_tables=torch.arange(nb, dtype=torch.int32, device=eng.device)[None])
        hidden = eng.model(w.to(eng.device), torch.arange(T, device=eng.device), meta)
        out.append(eng.model.compute_logits(hidden).cpu())
    return torch.stack(out)


def modeled_method(method: str, batch: int, phase: str, context: int = 1024, prompt: int = 2048,
                   shape_name: str = "llama-3-8b", chip_name: str = "H100") -> float:
    """Modeled seconds of one step (gpu_model.step_time) with a quantization method applied to the model's
    bytes per element: "bf16", "w4a16" (weights 0.5 byte), "w8a16" (1 byte), "w8a8-fp8" and "w8a8-int8" (1 byte
    and the tensor cores at twice the bf16 rate: the datasheet CEILING, from NVIDIA's H100 and A100 datasheets,
    which list dense fp8 / int8 at twice dense bf16; vLLM's FP8 docs report up to 1.6x throughput, so read the
    modeled 2x as an upper bound, not a prediction), "fp8-kv" (KV 1 byte). phase "decode": batch tokens at
    `context`; "prefill": batch
    prompts of `prompt` tokens. gpu_model counts activations at the weight width too (a simplification:
    they are a small share of a decode step's bytes)."""
    from dataclasses import replace

    from reference_engine.sim import gpu_model as gm

    shape, chip = gm.MODELS[shape_name], gm.CHIPS[chip_name]
    changes = {"bf16": {}, "w4a16": {"weight_bytes": 0.5}, "w8a16": {"weight_bytes": 1},
               "w8a8-fp8": {"weight_bytes": 1}, "w8a8-int8": {"weight_bytes": 1}, "fp8-kv": {"kv_bytes": 1}}[method]
    shape = replace(shape, **changes)
    if method in ("w8a8-fp8", "w8a8-int8"):
        chip = replace(chip, dense_tflops=2 * chip.dense_tflops)
    comp = gm.Composition.decode_batch(batch, context) if phase == "decode" else \
        gm.Composition(prefills=((prompt, 0),) * batch)
    return gm.step_time(shape, chip, comp).time_s
