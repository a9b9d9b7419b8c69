"""Plausible wrong answers to lesson 01, each caught by its check with the mistake named.

Mutants rebind the module-level names, so helpers call the reference through `S.`.
"""
import math

from solutions import l01_roofline as S
from solutions.l01_roofline import DTYPE_BITS
from tests.mutants import mutant


def _m_kv_per_token(model, kv_dtype, heads="kv_heads"):
    return 2 * model["layers"] * model[heads] * model["head_dim"] * DTYPE_BITS[kv_dtype] / 8


# ---------------------------------------------------------------- 1.1 matmul_cost

@mutant(check="matmul_cost", message="counts a multiply-add as one FLOP")
def matmul_cost(m, n, k, dtype):
    return {"flops": m * n * k, "bytes": (m * k + k * n + m * n) * DTYPE_BITS[dtype] / 8}


@mutant(check="matmul_cost", message="leaves out writing the output C")
def matmul_cost(m, n, k, dtype):  # noqa: F811
    return {"flops": 2 * m * n * k, "bytes": (m * k + k * n) * DTYPE_BITS[dtype] / 8}


@mutant(check="matmul_cost", message="uses bits instead of bytes")
def matmul_cost(m, n, k, dtype):  # noqa: F811
    return {"flops": 2 * m * n * k, "bytes": (m * k + k * n + m * n) * DTYPE_BITS[dtype]}


# ---------------------------------------------------------------- 1.2 attention_flops

@mutant(check="attention_flops", message="uses the KV heads")
def attention_flops(model, new_tokens, cached):
    keys = new_tokens * cached + new_tokens * (new_tokens + 1) // 2
    return 4 * model["layers"] * model["kv_heads"] * model["head_dim"] * keys


@mutant(check="attention_flops", message="ignores the causal mask")
def attention_flops(model, new_tokens, cached):  # noqa: F811
    return 4 * model["layers"] * model["heads"] * model["head_dim"] * new_tokens * (cached + new_tokens)


@mutant(check="attention_flops", message="counts 2 FLOPs per key and head_dim instead of 4")
def attention_flops(model, new_tokens, cached):  # noqa: F811
    keys = new_tokens * cached + new_tokens * (new_tokens + 1) // 2
    return 2 * model["layers"] * model["heads"] * model["head_dim"] * keys


@mutant(check="attention_flops", message="ignores the cached context")
def attention_flops(model, new_tokens, cached):  # noqa: F811
    return 4 * model["layers"] * model["heads"] * model["head_dim"] * new_tokens * (new_tokens + 1) // 2


# ---------------------------------------------------------------- 1.3 forward_flops

@mutant(check="forward_flops", message="leaves out the attention term")
def forward_flops(model, new_tokens, cached):
    return 2 * model["params"] * new_tokens


@mutant(check="forward_flops", message="counts a multiply-add as one FLOP in the weight matmuls")
def forward_flops(model, new_tokens, cached):  # noqa: F811
    return model["params"] * new_tokens + S.attention_flops(model, new_tokens, cached)


# ---------------------------------------------------------------- 1.4 forward_bytes

@mutant(check="forward_bytes", message="counts the weights once per token instead of once per pass")
def forward_bytes(model, new_tokens, cached, weight_dtype, kv_dtype):
    weights = model["params"] * DTYPE_BITS[weight_dtype] / 8
    return new_tokens * weights + (cached + new_tokens) * _m_kv_per_token(model, kv_dtype)


@mutant(check="forward_bytes", message="ignores the KV cache read")
def forward_bytes(model, new_tokens, cached, weight_dtype, kv_dtype):  # noqa: F811
    return model["params"] * DTYPE_BITS[weight_dtype] / 8 + new_tokens * _m_kv_per_token(model, kv_dtype)


@mutant(check="forward_bytes", message="uses bits instead of bytes")
def forward_bytes(model, new_tokens, cached, weight_dtype, kv_dtype):  # noqa: F811
    kv = 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * DTYPE_BITS[kv_dtype]
    return model["params"] * DTYPE_BITS[weight_dtype] + (cached + new_tokens) * kv


@mutant(check="forward_bytes", message="sizes the KV cache with the query heads")
def forward_bytes(model, new_tokens, cached, weight_dtype, kv_dtype):  # noqa: F811
    weights = model["params"] * DTYPE_BITS[weight_dtype] / 8
    return weights + (cached + new_tokens) * _m_kv_per_token(model, kv_dtype, heads="heads")


# ---------------------------------------------------------------- 2.1 ridge_point

@mutant(check="ridge_point", message="uses the sparse TFLOP/s")
def ridge_point(chip):
    return chip["sparse_tflops"] * 1e12 / (chip["hbm_gb_per_s"] * 1e9)


@mutant(check="ridge_point", message="mixes GB and GiB")
def ridge_point(chip):  # noqa: F811
    return chip["dense_tflops"] * 1e12 / (chip["hbm_gb_per_s"] * 2**30)


# ---------------------------------------------------------------- 2.2 roofline

def _m_roofline(flops, bytes_moved, chip, peak_key="dense_tflops", add=False, flip=False, strict=False):
    peak, bw = chip[peak_key] * 1e12, chip["hbm_gb_per_s"] * 1e9
    ai = flops / bytes_moved
    compute = (ai > peak / bw if strict else ai >= peak / bw) != flip
    return {"intensity": ai, "attainable_flops_per_s": min(peak, ai * bw),
            "bound": "compute" if compute else "memory",
            "time_s": flops / peak + bytes_moved / bw if add else max(flops / peak, bytes_moved / bw)}


@mutant(check="roofline", message="adds the compute time and the memory time")
def roofline(flops, bytes_moved, chip):
    return _m_roofline(flops, bytes_moved, chip, add=True)


@mutant(check="roofline", message="gets the bound backwards")
def roofline(flops, bytes_moved, chip):  # noqa: F811
    return _m_roofline(flops, bytes_moved, chip, flip=True)


@mutant(check="roofline", message="calls an intensity exactly at the ridge point memory-bound")
def roofline(flops, bytes_moved, chip):  # noqa: F811 - `>` where the rule is `>=`
    return _m_roofline(flops, bytes_moved, chip, strict=True)


@mutant(check="roofline", message="uses the sparse TFLOP/s")
def roofline(flops, bytes_moved, chip):  # noqa: F811
    return _m_roofline(flops, bytes_moved, chip, peak_key="sparse_tflops")


@mutant(check="roofline", message="leaves the compute roof out")
def roofline(flops, bytes_moved, chip):  # noqa: F811
    out = _m_roofline(flops, bytes_moved, chip)
    out["attainable_flops_per_s"] = out["intensity"] * chip["hbm_gb_per_s"] * 1e9
    return out


# ---------------------------------------------------------------- 3.1 decode_step_cost

@mutant(check="decode_step_cost", message="counts the weights once per sequence")
def decode_step_cost(model, batch, context, weight_dtype, kv_dtype):
    return {"flops": batch * S.forward_flops(model, 1, context),
            "bytes": batch * S.forward_bytes(model, 1, context, weight_dtype, kv_dtype)}


@mutant(check="decode_step_cost", message="ignores the KV cache read")
def decode_step_cost(model, batch, context, weight_dtype, kv_dtype):  # noqa: F811
    weights = model["params"] * DTYPE_BITS[weight_dtype] / 8
    return {"flops": batch * S.forward_flops(model, 1, context),
            "bytes": weights + batch * _m_kv_per_token(model, kv_dtype)}


@mutant(check="decode_step_cost", message="leaves out the attention FLOPs")
def decode_step_cost(model, batch, context, weight_dtype, kv_dtype):  # noqa: F811
    weights = model["params"] * DTYPE_BITS[weight_dtype] / 8
    return {"flops": batch * 2 * model["params"],
            "bytes": weights + batch * (context + 1) * _m_kv_per_token(model, kv_dtype)}


# ---------------------------------------------------------------- 3.2 decode_crossover_batch

def _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv, *, flops_per_param=2,
           peak_key="dense_tflops", bytes_per_bit=1 / 8, gb=1e9, kv=True, finish=math.ceil):
    ridge = chip[peak_key] * 1e12 / (chip["hbm_gb_per_s"] * gb)
    weights = model["params"] * DTYPE_BITS[weight_dtype] * bytes_per_bit
    f, k = flops_per_param * model["params"], 0.0
    if include_kv and kv:
        f += S.attention_flops(model, 1, context) * flops_per_param / 2
        k = (context + 1) * 2 * model["layers"] * model["kv_heads"] * model["head_dim"] \
            * DTYPE_BITS[kv_dtype] * bytes_per_bit
    margin = f - ridge * k
    return None if margin <= 0 else max(1, finish(ridge * weights / margin))


@mutant(check="decode_crossover_batch", message="with include_kv=False still counts the new token's own key")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    # the weights-only case as a whole step at context 0: its attention and KV read of the new token stay in
    return _m_solve(model, chip, context if include_kv else 0, weight_dtype, kv_dtype, True)


@mutant(check="decode_crossover_batch", message="still counts the attention FLOPs over the new token's own key")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    if include_kv:
        return _m_solve(model, chip, context, weight_dtype, kv_dtype, True)
    ridge = S.ridge_point(chip)
    f = 2 * model["params"] + S.attention_flops(model, 1, 0)
    return max(1, math.ceil(ridge * model["params"] * DTYPE_BITS[weight_dtype] / 8 / f))


@mutant(check="decode_crossover_batch", message="forgets the factor 2 in the FLOPs")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):
    return _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv, flops_per_param=1)


@mutant(check="decode_crossover_batch", message="uses the sparse TFLOP/s")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    return _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv, peak_key="sparse_tflops")


@mutant(check="decode_crossover_batch", message="mixes GB and GiB")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    return _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv, gb=2**30)


@mutant(check="decode_crossover_batch", message="uses bits instead of bytes")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    return _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv, bytes_per_bit=1)


@mutant(check="decode_crossover_batch", message="ignores the KV cache read")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    return _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv, kv=False)


@mutant(check="decode_crossover_batch", message="rounds down")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    return _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv, finish=math.floor)


@mutant(check="decode_crossover_batch", message="takes the first batch strictly past the crossover")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    return _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv, finish=lambda x: int(x) + 1)


@mutant(check="decode_crossover_batch", message="ignores the KV cache read")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=False):  # noqa: F811
    # right, but with the wrong default: a caller leaving include_kv out gets the weights-only answer
    return _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv)


@mutant(check="decode_crossover_batch", message="ignores include_kv=False")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    # the include_kv flag is accepted but never read: the cached context always counts
    return _m_solve(model, chip, context, weight_dtype, kv_dtype, True)


@mutant(check="decode_crossover_batch", message="adds the KV cache bytes even with include_kv=False")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    # the step's bytes always come from decode_step_cost; only the FLOPs follow include_kv
    ridge, weights = S.ridge_point(chip), model["params"] * DTYPE_BITS[weight_dtype] / 8
    one = S.decode_step_cost(model, 1, context, weight_dtype, kv_dtype)
    flops = one["flops"] if include_kv else 2 * model["params"]
    margin = flops - ridge * (one["bytes"] - weights)
    return None if margin <= 0 else max(1, math.ceil(ridge * weights / margin))


@mutant(check="decode_crossover_batch", message="returns the real-valued crossover")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    return _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv, finish=lambda x: x)


@mutant(check="decode_crossover_batch", message="counts the weights once per sequence")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    # A search that never finds a batch: per-sequence weights keep the intensity flat.
    ridge = S.ridge_point(chip)
    for batch in range(1, 10_000):
        step_flops = batch * S.forward_flops(model, 1, context if include_kv else 0)
        step_bytes = batch * S.forward_bytes(model, 1, context if include_kv else 0, weight_dtype, kv_dtype)
        if step_flops / step_bytes >= ridge:
            return batch
    return None


@mutant(check="decode_crossover_batch", message="returns infinity")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    b = _m_solve(model, chip, context, weight_dtype, kv_dtype, include_kv)
    return math.inf if b is None else b


# ---------------------------------------------------------------- 3.3 step_kernels

def _m_step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk, chunk_context, *, qkv_heads=None,
                    lm_head_calls=1, kv_heads="kv_heads"):
    h, d, layers = model["hidden"], model["head_dim"], model["layers"]
    m = batch + chunk
    qkv = qkv_heads(model) if qkv_heads else model["heads"] + 2 * model["kv_heads"]
    gemms = {"qkv_proj": (m, qkv * d, h, layers), "o_proj": (m, h, model["heads"] * d, layers),
             "gate_up_proj": (m, 2 * model["intermediate"], h, layers),
             "down_proj": (m, h, model["intermediate"], layers),
             "lm_head": (batch + (1 if chunk else 0), model["vocab"], h, lm_head_calls)}
    kv = _m_kv_per_token(model, kv_dtype, heads=kv_heads)
    work = {}
    for name, (rows, n, k, calls) in gemms.items():
        cost = S.matmul_cost(rows, n, k, weight_dtype)
        work[name] = (calls * cost["flops"], calls * cost["bytes"])
    work["attn_decode"] = (batch * S.attention_flops(model, 1, context), batch * (context + 1) * kv)
    if chunk:
        work["attn_prefill"] = (S.attention_flops(model, chunk, chunk_context), (chunk_context + chunk) * kv)
    out = {}
    for name, (flops, nbytes) in work.items():
        r = S.roofline(flops, nbytes, chip)
        out[name] = {"flops": flops, "bytes": nbytes, "time_s": r["time_s"], "bound": r["bound"]}
    return out


@mutant(check="step_kernels", message="sizes K and V in qkv_proj with the query heads")
def step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk=0, chunk_context=0):
    return _m_step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk, chunk_context,
                           qkv_heads=lambda m: 3 * m["heads"])


@mutant(check="step_kernels", message="runs lm_head once per layer")
def step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk=0, chunk_context=0):  # noqa: F811
    return _m_step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk, chunk_context,
                           lm_head_calls=model["layers"])


@mutant(check="step_kernels", message="sizes the KV cache with the query heads")
def step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk=0, chunk_context=0):  # noqa: F811
    return _m_step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk, chunk_context,
                           kv_heads="heads")


@mutant(check="step_kernels", message="the kernel names")
def step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk=0, chunk_context=0):  # noqa: F811
    # a mixed step's chunk folded into the decode attention: no attn_prefill kernel
    out = sol.step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk, chunk_context)
    out.pop("attn_prefill", None)
    return out


# ---------------------------------------------------------------- 5.1 step_bound

@mutant(check="step_bound", message="adds the overhead to the roofline time")
def step_bound(flops, bytes_moved, chip, overhead_s):
    r = S.roofline(flops, bytes_moved, chip)
    return {"time_s": r["time_s"] + overhead_s, "bound": "overhead" if overhead_s > r["time_s"] else r["bound"]}


@mutant(check="step_bound", message="keeps the roofline's bound when the overhead sets the time")
def step_bound(flops, bytes_moved, chip, overhead_s):  # noqa: F811
    r = S.roofline(flops, bytes_moved, chip)
    return {"time_s": max(r["time_s"], overhead_s), "bound": r["bound"]}


# ---------------------------------------------------------------- 5.2 moe_decode_cost

@mutant(check="moe_decode_cost", message="reads only the top_k experts a token runs")
def moe_decode_cost(model, batch, context, weight_dtype, kv_dtype):
    dense = model["params"] - model["layers"] * model["experts"] * model["expert_params"]
    active = dense + model["layers"] * model["top_k"] * model["expert_params"]
    one = S.decode_step_cost(dict(model, params=active), batch, context, weight_dtype, kv_dtype)
    return {"experts_read": model["top_k"], **one}


@mutant(check="moe_decode_cost", message="assumes the batch's tokens pick different experts")
def moe_decode_cost(model, batch, context, weight_dtype, kv_dtype):  # noqa: F811
    out = sol.moe_decode_cost(model, batch, context, weight_dtype, kv_dtype)
    read = min(model["experts"], batch * model["top_k"])
    extra = model["layers"] * (read - out["experts_read"]) * model["expert_params"] * DTYPE_BITS[weight_dtype] / 8
    return {"experts_read": read, "flops": out["flops"], "bytes": out["bytes"] + extra}


# ---------------------------------------------------------------- malformed return values

@mutant(check="step_kernels", message="keyed by kernel name (str), got keys of types int and str")
def step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk=0, chunk_context=0):  # noqa: F811
    # lm_head keyed by its position instead of its name
    out = sol.step_kernels(model, chip, batch, context, weight_dtype, kv_dtype, chunk, chunk_context)
    out[4] = out.pop("lm_head")
    return out


# -- weights taken as 2 bytes each whatever their dtype (bf16's size), in each function that sizes them ------------

@mutant(check="forward_bytes", message="uses 2 bytes per weight whatever weight_dtype")
def forward_bytes(model, new_tokens, cached, weight_dtype, kv_dtype):  # noqa: F811
    return S.forward_bytes(model, new_tokens, cached, "bf16", kv_dtype)


@mutant(check="decode_step_cost", message="uses 2 bytes per weight whatever weight_dtype")
def decode_step_cost(model, batch, context, weight_dtype, kv_dtype):  # noqa: F811
    return S.decode_step_cost(model, batch, context, "bf16", kv_dtype)


@mutant(check="decode_crossover_batch", message="uses 2 bytes per weight whatever weight_dtype")
def decode_crossover_batch(model, chip, context, weight_dtype, kv_dtype, include_kv=True):  # noqa: F811
    return S.decode_crossover_batch(model, chip, context, "bf16", kv_dtype, include_kv)


@mutant(check="moe_decode_cost", message="uses 2 bytes per weight whatever weight_dtype")
def moe_decode_cost(model, batch, context, weight_dtype, kv_dtype):  # noqa: F811
    return S.moe_decode_cost(model, batch, context, "bf16", kv_dtype)
