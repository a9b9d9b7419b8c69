"""Lesson 01: the roofline of prefill vs decode.

Counting conventions used throughout (the lesson's section 1 explains them):
- FLOPs: a multiply-add is 2 FLOPs. The weight matmuls of a dense decoder cost 2 * P * T for T
  tokens (every weight takes part in one multiply-add per token). Attention's two
  context-dependent matmuls (Q K^T and P V) are a separate term: per layer and query head, each
  (query, key) pair costs 4 * head_dim FLOPs, and under the causal mask a new token at position i
  of a chunk sees `cached + i + 1` keys. Softmax, norms and activations are ignored.
- Bytes: the weights are read once per forward pass, however many tokens it holds; the KV cache
  of the cached context is read once; the new tokens' K and V are written once. Activations,
  re-reads of K/V inside an attention kernel and the embedding lookup are not counted.
- Units: FLOP/s and bytes/s in SI units (1 GB = 1e9 bytes, 1 TFLOP/s = 1e12 FLOP/s).
"""
from __future__ import annotations

import itertools
import math
import time

import torch

# Bits per element of the number formats used below. Bytes = bits / 8.
DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}

# Vendor datasheets (NVIDIA A100 / H100 / H200): dense bf16 tensor-core TFLOP/s, HBM bandwidth
# and capacity; the sparse (2:4 structured sparsity) figure printed beside dense is twice it.
CHIPS = {
    "A100 SXM 80GB": {"dense_tflops": 312.0, "sparse_tflops": 2 * 312.0, "hbm_gb_per_s": 2039.0, "hbm_gb": 80},
    "H100 SXM": {"dense_tflops": 989.0, "sparse_tflops": 2 * 989.0, "hbm_gb_per_s": 3350.0, "hbm_gb": 80},
    "H200 SXM": {"dense_tflops": 989.0, "sparse_tflops": 2 * 989.0, "hbm_gb_per_s": 4800.0, "hbm_gb": 141},
}

# Two more accelerators for section 5.3, from their vendors' datasheets, dense bf16 (half the sparse figure):
# NVIDIA HGX B200 datasheet, per GPU of the board's eight (its 1,000 W configuration): 2.25 PFLOP/s dense bf16
# (4.5 sparse), 8 TB/s of HBM3e, 180 GB (the board's 1.44 TB / 8); AMD Instinct MI300X data sheet: 1,307.4 TFLOP/s
# dense bf16 (2,614.9 with structured sparsity), 5.3 TB/s, 192 GB of HBM3. Section 5.3 only: CHIPS above stays the
# three chips the exercises and checks use.
OTHER_CHIPS = {
    "B200 (HGX, 1000 W)": {"dense_tflops": 2250.0, "sparse_tflops": 2 * 2250.0, "hbm_gb_per_s": 8000.0, "hbm_gb": 180},
    "MI300X": {"dense_tflops": 1307.4, "sparse_tflops": 2614.9, "hbm_gb_per_s": 5300.0, "hbm_gb": 192},
}

# GPU-to-GPU bandwidth for section 5.3, per GPU and per direction: NVLink 4 on the H100 SXM (datasheet: 900 GB/s,
# both directions together) and NVLink 5 on the HGX B200 (datasheet: 1.8 TB/s, both directions together).
NVLINK_GB_PER_S = {"H100 SXM": 450.0, "B200 (HGX, 1000 W)": 900.0}

# Shapes from the models' config.json; "params" is the nominal parameter count (8e9, 70e9).
# hidden (hidden_size), intermediate (intermediate_size) and vocab (vocab_size) size the weight
# matrices one by one; only section 3.3 uses them.
LLAMA_3_8B = {"name": "Llama-3-8B", "params": 8e9, "layers": 32, "heads": 32, "kv_heads": 8,
              "head_dim": 128, "hidden": 4096, "intermediate": 14336, "vocab": 128256}
LLAMA_3_70B = {"name": "Llama-3-70B", "params": 70e9, "layers": 80, "heads": 64, "kv_heads": 8,
               "head_dim": 128, "hidden": 8192, "intermediate": 28672, "vocab": 128256}

# A mixture-of-experts decoder for section 5.2, from Mixtral-8x7B's config.json (32 layers, 32 heads,
# 8 KV heads, hidden 4096, intermediate 14336, 8 local experts, 2 per token). "expert_params" is one
# expert's SwiGLU MLP in one layer (3 * 4096 * 14336); "params" is the total the config gives
# (embeddings, attention, norms, routers and all experts: 46.7e9; the Mixtral paper rounds it to
# 47B, of which 13B are active per token).
MIXTRAL_8X7B = {"name": "Mixtral-8x7B", "params": 46_702_792_704, "layers": 32, "heads": 32, "kv_heads": 8,
                "head_dim": 128, "experts": 8, "top_k": 2, "expert_params": 3 * 4096 * 14336}

# A large MoE for section 5.3's expert parallelism, from DeepSeek-V3's config.json (61 layers of which the first 3
# are dense, hidden 7168, 256 routed experts and 1 shared, 8 routed experts per token, expert intermediate size
# 2048) and its technical report (arXiv:2412.19437: 671B parameters in all, 37B activated per token).
DEEPSEEK_V3 = {"name": "DeepSeek-V3", "params": 671e9, "active_params": 37e9, "layers": 61, "dense_layers": 3,
               "hidden": 7168, "routed_experts": 256, "shared_experts": 1, "top_k": 8, "expert_intermediate": 2048}


# ---------------------------------------------------------------- 1. the cost of a forward pass


def matmul_cost(m: int, n: int, k: int, dtype: str) -> dict:
    """Exercise 1.1: FLOPs and bytes of one matmul C[m, n] = A[m, k] @ B[k, n].

    Each of the m * n outputs is a dot product of length k: k multiplies and k adds. Bytes are
    the minimum traffic: read A and B once, write C once, each element DTYPE_BITS[dtype] / 8 bytes.

    Returns {"flops": ..., "bytes": ...}.
    Example: matmul_cost(1, 4096, 4096, "bf16") ->
        {"flops": 33554432, "bytes": 33570816.0}   (intensity ~1 FLOP/byte)
    """
    ### BEGIN SOLUTION
    nbytes = DTYPE_BITS[dtype] / 8
    return {"flops": 2 * m * n * k, "bytes": (m * k + k * n + m * n) * nbytes}
    ### END SOLUTION


def attention_flops(model: dict, new_tokens: int, cached: int) -> int:
    """Exercise 1.2: FLOPs of attention's score and value matmuls in one forward pass.

    `new_tokens` tokens of one sequence go through the model; `cached` earlier tokens of it are
    already in the KV cache. Under the causal mask the i-th new token (i = 0, 1, ...) attends to
    cached + i + 1 keys (the cached ones, the earlier new ones, itself). Per layer and per query
    head, each (query, key) pair costs 2 * head_dim FLOPs for q.k and 2 * head_dim for adding
    p * v: 4 * head_dim in all. Uses model["layers"], model["heads"] (query heads), model["head_dim"].

    Example: attention_flops(LLAMA_3_8B, 1, 2000) == 4 * 32 * 32 * 128 * 2001 == 1049100288
    """
    ### BEGIN SOLUTION
    keys_seen = new_tokens * cached + new_tokens * (new_tokens + 1) // 2
    return 4 * model["layers"] * model["heads"] * model["head_dim"] * keys_seen
    ### END SOLUTION


def forward_flops(model: dict, new_tokens: int, cached: int) -> float:
    """Exercise 1.3: total FLOPs of one forward pass of one sequence.

    Weight matmuls, 2 * model["params"] * new_tokens, plus attention_flops(model, new_tokens, cached).

    Example: forward_flops(LLAMA_3_8B, 1, 2000) == 2 * 8e9 + 1049100288 == 1.7049100288e10
    """
    ### BEGIN SOLUTION
    return 2 * model["params"] * new_tokens + attention_flops(model, new_tokens, cached)
    ### END SOLUTION


def forward_bytes(model: dict, new_tokens: int, cached: int, weight_dtype: str,
                  kv_dtype: str) -> float:
    """Exercise 1.4: bytes moved from/to HBM by one forward pass of one sequence.

    Counted: all weights read once (model["params"] elements of weight_dtype), the KV cache of the
    `cached` tokens read once, and K and V of the `new_tokens` written once. KV bytes per token are
    2 (K and V) * layers * kv_heads * head_dim elements of kv_dtype. Activations are not counted.

    Example: forward_bytes(LLAMA_3_8B, 1, 2000, "bf16", "bf16")
        == 8e9 * 2 + (2000 + 1) * 131072 == 16262275072.0
    """
    ### BEGIN SOLUTION
    kv_per_token = 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * DTYPE_BITS[kv_dtype] / 8
    weights = model["params"] * DTYPE_BITS[weight_dtype] / 8
    return weights + (cached + new_tokens) * kv_per_token
    ### END SOLUTION


# ---------------------------------------------------------------- 2. the roofline


def ridge_point(chip: dict) -> float:
    """Exercise 2.1: the chip's ridge point in FLOP/byte: dense peak FLOP/s over HBM bytes/s.

    chip["dense_tflops"] is in TFLOP/s (1e12 FLOP/s), chip["hbm_gb_per_s"] in GB/s (1e9 bytes/s).
    A pass with a higher arithmetic intensity than this is compute-bound on the chip.

    Example: ridge_point(CHIPS["H100 SXM"]) == 989e12 / 3350e9 == 295.22...
    """
    ### BEGIN SOLUTION
    return chip["dense_tflops"] * 1e12 / (chip["hbm_gb_per_s"] * 1e9)
    ### END SOLUTION


def roofline(flops: float, bytes_moved: float, chip: dict) -> dict:
    """Exercise 2.2: the roofline model of one pass on one chip.

    Returns a dict with
      "intensity":              flops / bytes_moved (FLOP/byte)
      "attainable_flops_per_s": min(peak, intensity * bandwidth) (FLOP/s, dense peak)
      "bound":                  "compute" if intensity >= ridge_point(chip) else "memory"
      "time_s":                 max(flops / peak, bytes_moved / bandwidth): compute and memory
                                traffic overlap, so the slower of the two sets the time.

    Example: roofline(2e12, 1e10, CHIPS["H100 SXM"]) ->
        {"intensity": 200.0, "attainable_flops_per_s": 6.7e14, "bound": "memory",
         "time_s": 0.002985...}
    """
    ### BEGIN SOLUTION
    peak = chip["dense_tflops"] * 1e12
    bw = chip["hbm_gb_per_s"] * 1e9
    intensity = flops / bytes_moved
    return {"intensity": intensity,
            "attainable_flops_per_s": min(peak, intensity * bw),
            "bound": "compute" if intensity >= peak / bw else "memory",
            "time_s": max(flops / peak, bytes_moved / bw)}
    ### END SOLUTION


# ---------------------------------------------------------------- 3. batching decode


def decode_step_cost(model: dict, batch: int, context: int, weight_dtype: str,
                     kv_dtype: str) -> dict:
    """Exercise 3.1: FLOPs and bytes of one decode step of `batch` sequences.

    Each sequence has `context` tokens in the KV cache and adds one new token. The sequences share
    one read of the weights; each reads its own KV cache and writes one token's K and V.

    Returns {"flops": ..., "bytes": ...}.
    Example: decode_step_cost(LLAMA_3_8B, 1, 2000, "bf16", "bf16") ==
        {"flops": forward_flops(LLAMA_3_8B, 1, 2000),
         "bytes": forward_bytes(LLAMA_3_8B, 1, 2000, "bf16", "bf16")}
    """
    ### BEGIN SOLUTION
    weights = model["params"] * DTYPE_BITS[weight_dtype] / 8
    kv_per_token = 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * DTYPE_BITS[kv_dtype] / 8
    return {"flops": batch * forward_flops(model, 1, context),
            "bytes": weights + batch * (context + 1) * kv_per_token}
    ### END SOLUTION


def decode_crossover_batch(model: dict, chip: dict, context: int, weight_dtype: str,
                           kv_dtype: str, include_kv: bool = True) -> int | None:
    """Exercise 3.2: the smallest batch size at which a decode step is compute-bound.

    That is the smallest whole B >= 1 with intensity(decode_step_cost(model, B, ...)) >=
    ridge_point(chip). With include_kv=False, count only the weight matmuls and the weight read
    (no attention FLOPs, no KV bytes): the short-context approximation. Returns None when no
    batch size gets there: each sequence reads its own KV cache, so those bytes grow with B as
    fast as the FLOPs, and the intensity levels off (below the ridge, for long contexts).

    Example: decode_crossover_batch(LLAMA_3_8B, CHIPS["H100 SXM"], 0, "bf16", "bf16",
                                    include_kv=False) == 296      (ridge 295.2 * 2 bytes / 2 FLOPs)
    """
    ### BEGIN SOLUTION
    ridge = ridge_point(chip)
    weights = model["params"] * DTYPE_BITS[weight_dtype] / 8
    if include_kv:
        one = decode_step_cost(model, 1, context, weight_dtype, kv_dtype)
        flops_per_seq, kv_per_seq = one["flops"], one["bytes"] - weights
    else:
        flops_per_seq, kv_per_seq = 2 * model["params"], 0.0
    # B * F / (W + B * K) >= ridge  <=>  B * (F - ridge * K) >= ridge * W
    margin = flops_per_seq - ridge * kv_per_seq
    if margin <= 0:
        return None
    return max(1, math.ceil(ridge * weights / margin))
    ### END SOLUTION


def step_kernels(model: dict, chip: dict, batch: int, context: int, weight_dtype: str, kv_dtype: str,
                 chunk: int = 0, chunk_context: int = 0) -> dict:
    """Exercise 3.3: one decode (or mixed) step split into its kernels, each with its own roofline.

    The step holds `batch` >= 1 decode tokens, each of a sequence with `context` cached tokens, and,
    if chunk > 0, one prefill chunk of `chunk` tokens of a prompt with `chunk_context` tokens already
    cached. All of them, m = batch + chunk tokens, go through the weight GEMMs together:

      qkv_proj      [m, hidden] @ [hidden, (heads + 2 * kv_heads) * head_dim]   once per layer
      o_proj        [m, heads * head_dim] @ [heads * head_dim, hidden]         once per layer
      gate_up_proj  [m, hidden] @ [hidden, 2 * intermediate]                   once per layer
      down_proj     [m, intermediate] @ [intermediate, hidden]                 once per layer
      lm_head       [s, hidden] @ [hidden, vocab], once per step (not per layer), on one row per
                    sequence: s = batch + (1 if chunk else 0)

    Each GEMM's FLOPs and bytes are matmul_cost(m, n, k, weight_dtype) times its calls. Attention is
    one kernel per kind, all layers:
      attn_decode   FLOPs batch * attention_flops(model, 1, context); bytes: each sequence reads its
                    cached K/V and writes its new token's, batch * (context + 1) * KV bytes per token
      attn_prefill  (only if chunk > 0) FLOPs attention_flops(model, chunk, chunk_context); bytes
                    (chunk_context + chunk) * KV bytes per token
    KV bytes per token as in forward_bytes (kv_dtype). Each kernel's time and bound are roofline()'s
    on `chip` for its total FLOPs and bytes.

    Returns {name: {"flops": ..., "bytes": ..., "time_s": ..., "bound": "compute" | "memory"}} with
    the names above, in that order ("attn_prefill" only when chunk > 0). The step takes the sum of
    the kernels' times: they run one after another.
    Example: step_kernels(LLAMA_3_8B, CHIPS["H100 SXM"], 512, 1024, "bf16", "bf16") has every weight
    GEMM "compute"-bound and "attn_decode" "memory"-bound (intensity 2 * 32/8 / 2 = 4 FLOP/byte).
    """
    ### BEGIN SOLUTION
    h, d, layers = model["hidden"], model["head_dim"], model["layers"]
    m = batch + chunk
    gemms = {"qkv_proj": (m, (model["heads"] + 2 * model["kv_heads"]) * d, h, layers),
             "o_proj": (m, h, model["heads"] * d, layers),
             "gate_up_proj": (m, 2 * model["intermediate"], h, layers),
             "down_proj": (m, h, model["intermediate"], layers),
             "lm_head": (batch + (1 if chunk else 0), model["vocab"], h, 1)}
    kv_per_token = 2 * layers * model["kv_heads"] * d * DTYPE_BITS[kv_dtype] / 8
    work = {}
    for name, (rows, n, k, calls) in gemms.items():
        cost = matmul_cost(rows, n, k, weight_dtype)
        work[name] = (calls * cost["flops"], calls * cost["bytes"])
    work["attn_decode"] = (batch * attention_flops(model, 1, context), batch * (context + 1) * kv_per_token)
    if chunk:
        work["attn_prefill"] = (attention_flops(model, chunk, chunk_context), (chunk_context + chunk) * kv_per_token)
    out = {}
    for name, (flops, nbytes) in work.items():
        r = roofline(flops, nbytes, chip)
        out[name] = {"flops": flops, "bytes": nbytes, "time_s": r["time_s"], "bound": r["bound"]}
    return out
    ### END SOLUTION


# ---------------------------------------------------------------- 4. measuring your own device
# Teaching code, not exercises: timings are noisy, so nothing here is graded by value.

_TORCH_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device: torch.device, min_seconds: float = 0.05, repeats: int = 3) -> float:
    """Seconds per call of fn(): the best of `repeats` timed loops, each at least min_seconds long."""
    fn()  # warm-up: first-call allocation, kernel selection
    _sync(device)
    calls, best = 1, float("inf")
    for _ in range(repeats):
        while True:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
            calls *= 2
        best = min(best, elapsed / calls)
    return best


def measure_copy_bandwidth(device: torch.device, nbytes: int = 2**28, min_seconds: float = 0.05) -> float:
    """Bytes/s of a large device-to-device copy, counting the read and the write (2 * nbytes)."""
    src = torch.full((nbytes // 4,), 1.0, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = time_call(lambda: dst.copy_(src), device, min_seconds)
    return 2 * src.numel() * 4 / seconds


def measure_read_bandwidth(device: torch.device, nbytes: int = 2**28, min_seconds: float = 0.05) -> float:
    """Bytes/s of summing a large tensor: a pure read stream, like a decode step reading weights."""
    src = torch.full((nbytes // 4,), 1.0, dtype=torch.float32, device=device)
    seconds = time_call(lambda: src.sum(), device, min_seconds)
    return src.numel() * 4 / seconds


def matmul_sweep(ms: list[int], n: int, k: int, dtype: torch.dtype, device: torch.device,
                 pool_bytes: int = 2**28, min_seconds: float = 0.05, repeats: int = 3) -> list[dict]:
    """Time [m, k] @ [k, n] for each m in `ms`; the FLOPs and bytes come from matmul_cost.

    The weight B cycles through a pool of copies at least `pool_bytes` large, so each call reads a
    B that is not sitting in the last-level cache (else small-m points beat the memory roof).
    Returns one dict per m: m, flops, bytes, seconds, flops_per_s, intensity.
    """
    w_bytes = k * n * torch.finfo(dtype).bits // 8
    pool = [torch.randn(k, n, device=device, dtype=dtype)
            for _ in range(max(1, math.ceil(pool_bytes / w_bytes)))]
    rows = []
    for m in ms:
        a = torch.randn(m, k, device=device, dtype=dtype)
        out = torch.empty(m, n, device=device, dtype=dtype)
        turn = itertools.count()

        def step():  # timed right here, inside this iteration: binding the loop's variables is intended
            torch.matmul(a, pool[next(turn) % len(pool)], out=out)  # noqa: B023

        seconds = time_call(step, device, min_seconds, repeats)
        cost = matmul_cost(m, n, k, _TORCH_DTYPES[dtype])
        rows.append({"m": m, "flops": cost["flops"], "bytes": cost["bytes"], "seconds": seconds,
                     "flops_per_s": cost["flops"] / seconds, "intensity": cost["flops"] / cost["bytes"]})
    return rows


# ---------------------------------------------------------------- 5. two more regimes


def step_bound(flops: float, bytes_moved: float, chip: dict, overhead_s: float) -> dict:
    """Exercise 5.1: the roofline with a third roof, the host's overhead.

    overhead_s is the time the host needs to get the pass onto the chip (Python, scheduling, kernel
    launches). Launches are asynchronous: the host issues work while the chip runs earlier work, so
    the slowest of the three sets the time: max(flops / peak, bytes_moved / bandwidth, overhead_s)
    (dense peak, as in roofline()). The bound is "overhead" when overhead_s is larger than the
    roofline time (the chip waits for the host), else roofline()'s bound.

    Returns {"time_s": ..., "bound": "compute" | "memory" | "overhead"}.
    Example: step_bound(2e9, 1e6, CHIPS["H100 SXM"], 1e-4) -> {"time_s": 1e-4, "bound": "overhead"}
    """
    ### BEGIN SOLUTION
    r = roofline(flops, bytes_moved, chip)
    if overhead_s > r["time_s"]:
        return {"time_s": overhead_s, "bound": "overhead"}
    return {"time_s": r["time_s"], "bound": r["bound"]}
    ### END SOLUTION


def moe_decode_cost(model: dict, batch: int, context: int, weight_dtype: str, kv_dtype: str) -> dict:
    """Exercise 5.2: FLOPs and bytes of one decode step of a mixture-of-experts model.

    model: as LLAMA_3_8B, plus "experts" (experts per layer), "top_k" (distinct experts each token
    runs, per layer) and "expert_params" (parameters of one expert in one layer); "params" counts
    everything, all experts included. Dense parameters (attention, embeddings, norms, routers):
    params - layers * experts * expert_params.

    Routing is taken as uniform and independent between tokens: a token misses a given expert with
    probability 1 - top_k / experts, so a batch of B tokens reads, per layer, on average
        experts_read = experts * (1 - (1 - top_k / experts) ** B)
    experts (each one read once however many of the batch's tokens it serves).
      flops: each token runs the dense weights and its top_k experts per layer (2 FLOPs per
             parameter, as in forward_flops) plus attention_flops(model, 1, context)
      bytes: dense weights + layers * experts_read * expert_params, in weight_dtype, plus each
             sequence's KV cache read and new K/V written, as in decode_step_cost

    Returns {"experts_read": ..., "flops": ..., "bytes": ...}.
    Example: moe_decode_cost(MIXTRAL_8X7B, 1, 0, "bf16", "bf16")["experts_read"] == 2.0
    """
    ### BEGIN SOLUTION
    experts, k, per_expert, layers = model["experts"], model["top_k"], model["expert_params"], model["layers"]
    dense = model["params"] - layers * experts * per_expert
    experts_read = experts * (1 - (1 - k / experts) ** batch)
    active = dense + layers * k * per_expert
    kv_per_token = 2 * layers * model["kv_heads"] * model["head_dim"] * DTYPE_BITS[kv_dtype] / 8
    weights = (dense + layers * experts_read * per_expert) * DTYPE_BITS[weight_dtype] / 8
    return {"experts_read": experts_read,
            "flops": batch * (2 * active + attention_flops(model, 1, context)),
            "bytes": weights + batch * (context + 1) * kv_per_token}
    ### END SOLUTION
