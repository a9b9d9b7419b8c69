"""Plausible wrong answers for lesson 17; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here are
prefixed `_m_`."""
import math

from reference_engine.sim import gpu_model as gm
from solutions import l17_disaggregation as sol  # graded as source, this line becomes `sol = sol`
from tests.mutants import mutant

# -- 1.1 bytes ----------------------------------------------------------------------------------------


@mutant(check="kv_transfer_bytes", message="counts only K")
def kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill=1, tp_decode=1):
    return sol.kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill,
                                 tp_decode) // 2


@mutant(check="kv_transfer_bytes", message="ignores decode-side replication")
def kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill=1, tp_decode=1):  # noqa: F811
    sol.kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill, tp_decode)
    return 2 * num_layers * prompt_len * num_kv_heads * head_dim * kv_dtype_bytes


@mutant(check="kv_transfer_bytes", message="one decode GPU's share")
def kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill=1, tp_decode=1):  # noqa: F811
    return sol.kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill,
                                 tp_decode) // tp_decode


@mutant(check="kv_transfer_bytes", message="refused")
def kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill=1, tp_decode=1):  # noqa: F811
    return 2 * num_layers * prompt_len * max(num_kv_heads, tp_decode) * head_dim * kv_dtype_bytes  # no validation


@mutant(check="kv_transfer_bytes", message="sends every head to every decode GPU")
def kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill=1, tp_decode=1):  # noqa: F811
    sol.kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill, tp_decode)
    return 2 * num_layers * prompt_len * num_kv_heads * tp_decode * head_dim * kv_dtype_bytes


@mutant(check="kv_transfer_bytes", message="float byte count")
def kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill=1, tp_decode=1):  # noqa: F811
    sol.kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill, tp_decode)
    heads = num_kv_heads * max(1, tp_decode / num_kv_heads)  # true division: a float even when it divides
    return 2 * num_layers * prompt_len * heads * head_dim * kv_dtype_bytes


@mutant(check="kv_transfer_bytes", message="tp_decode=0")
def kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill=1, tp_decode=1):  # noqa: F811
    for tp in (tp_prefill, tp_decode):  # no positive-int test: 0 and -8 are "multiples" of the heads
        if num_kv_heads % tp and tp % num_kv_heads:
            raise ValueError(f"tp={tp} does not shard {num_kv_heads} heads")
    return 2 * num_layers * prompt_len * max(num_kv_heads, tp_decode) * head_dim * kv_dtype_bytes


@mutant(check="kv_transfer_bytes", message="tp_decode=8.0")
def kv_transfer_bytes(prompt_len, num_layers, num_kv_heads, head_dim, kv_dtype_bytes, tp_prefill=1, tp_decode=1):  # noqa: F811
    for tp in (tp_prefill, tp_decode):  # tp >= 1 tested, not that it is an int
        if tp < 1 or (num_kv_heads % tp and tp % num_kv_heads):
            raise ValueError(f"tp={tp} does not shard {num_kv_heads} heads")
    return 2 * num_layers * prompt_len * max(num_kv_heads, tp_decode) * head_dim * kv_dtype_bytes


# -- 1.2 time -----------------------------------------------------------------------------------------


@mutant(check="transfer_time", message="reads Gb/s as GB/s")
def transfer_time(nbytes, bandwidth_gbps, latency_s=0.0, num_messages=1):
    return nbytes / (bandwidth_gbps * 1e9) + num_messages * latency_s


@mutant(check="transfer_time", message="pays the latency once")
def transfer_time(nbytes, bandwidth_gbps, latency_s=0.0, num_messages=1):  # noqa: F811
    return nbytes * 8 / (bandwidth_gbps * 1e9) + latency_s


# -- 2. pack / unpack ---------------------------------------------------------------------------------


@mutant(check="pack_kv", message="sorted order")
def pack_kv(k_cache, v_cache, block_table, num_tokens):
    nb = -(-num_tokens // k_cache.shape[2])
    return sol.pack_kv(k_cache, v_cache, sorted(block_table[:nb]), num_tokens)


@mutant(check="pack_kv", message="drops the partial last block")
def pack_kv(k_cache, v_cache, block_table, num_tokens):  # noqa: F811
    bs = k_cache.shape[2]
    return sol.pack_kv(k_cache, v_cache, block_table, num_tokens)[:, :, :num_tokens // bs * bs].contiguous()


@mutant(check="pack_kv", message="swaps K and V")
def pack_kv(k_cache, v_cache, block_table, num_tokens):  # noqa: F811
    return sol.pack_kv(v_cache, k_cache, block_table, num_tokens)


@mutant(check="pack_kv", message="reverses the layer order")
def pack_kv(k_cache, v_cache, block_table, num_tokens):  # noqa: F811
    return sol.pack_kv(k_cache, v_cache, block_table, num_tokens).flip(0).contiguous()


@mutant(check="pack_kv", message="not contiguous")
def pack_kv(k_cache, v_cache, block_table, num_tokens):  # noqa: F811
    # [layers, 2, tokens, ...] values, but as a transposed view of [layers, tokens, 2, ...]
    return sol.pack_kv(k_cache, v_cache, block_table, num_tokens).transpose(1, 2).contiguous().transpose(1, 2)


@mutant(check="unpack_kv", message="swaps K and V")
def unpack_kv(buf, k_cache, v_cache, block_table):
    sol.unpack_kv(buf, v_cache, k_cache, block_table)


@mutant(check="unpack_kv", message="skips the partial last block")
def unpack_kv(buf, k_cache, v_cache, block_table):  # noqa: F811
    full = buf.shape[2] // k_cache.shape[2] * k_cache.shape[2]
    if full:
        sol.unpack_kv(buf[:, :, :full], k_cache, v_cache, block_table)


@mutant(check="unpack_kv", message="zeroes the rest of the partial last block")
def unpack_kv(buf, k_cache, v_cache, block_table):  # noqa: F811
    nb = -(-buf.shape[2] // k_cache.shape[2])
    for b in block_table[:nb]:
        k_cache[:, b] = 0
        v_cache[:, b] = 0
    sol.unpack_kv(buf, k_cache, v_cache, block_table)


# In the engine only unpack_kv is wrong here: pack_kv is the right one, so the unit checks of pack pass and the
# engine check must catch (and name) the receiving side's mistake from the tokens alone.

@mutant(check="pack_unpack_in_engine", message="unpack_kv reverses the layer order")
def unpack_kv(buf, k_cache, v_cache, block_table):  # noqa: F811
    sol.unpack_kv(buf.flip(0), k_cache, v_cache, block_table)


@mutant(check="pack_unpack_in_engine", message="unpack_kv writes blocks 0, 1, 2")
def unpack_kv(buf, k_cache, v_cache, block_table):  # noqa: F811
    sol.unpack_kv(buf, k_cache, v_cache, list(range(len(block_table))))


@mutant(check="pack_unpack_in_engine", message="pack_kv swaps K and V")
def pack_kv(k_cache, v_cache, block_table, num_tokens):  # noqa: F811
    return sol.pack_kv(v_cache, k_cache, block_table, num_tokens)


@mutant(check="pack_unpack_in_engine", message="pack_kv leaves the partial last block's tokens as zeros")
def pack_kv(k_cache, v_cache, block_table, num_tokens):  # noqa: F811
    out = sol.pack_kv(k_cache, v_cache, block_table, num_tokens)
    bs = k_cache.shape[2]
    out[:, :, num_tokens // bs * bs:] = 0  # the partial block's tokens never read: the engine gets zeros there
    return out


@mutant(check="pack_unpack_in_engine", message="not the caches' dtype")
def pack_kv(k_cache, v_cache, block_table, num_tokens):  # noqa: F811
    return sol.pack_kv(k_cache, v_cache, block_table, num_tokens).float()  # the fp8 cache's bytes, upcast


# -- 3. break-even ------------------------------------------------------------------------------------


@mutant(check="prefill_stall", message="starts every chunk at context 0")
def prefill_stall(model, chip, prompt_len, chunk, batch, context, tp=1):
    shape, gpu = gm.MODELS[model], gm.CHIPS[chip]
    alone = gm.step_time(shape, gpu, gm.Composition.decode_batch(batch, context), tp=tp).time_s
    return sum(gm.step_time(shape, gpu, gm.Composition.decode_batch(batch, context, min(chunk, prompt_len - s)),
                            tp=tp).time_s - alone for s in range(0, prompt_len, chunk))


@mutant(check="prefill_stall", message="counts the whole mixed step")
def prefill_stall(model, chip, prompt_len, chunk, batch, context, tp=1):  # noqa: F811
    shape, gpu = gm.MODELS[model], gm.CHIPS[chip]
    return sum(gm.step_time(shape, gpu, gm.Composition.decode_batch(batch, context, min(chunk, prompt_len - s), s),
                            tp=tp).time_s for s in range(0, prompt_len, chunk))


@mutant(check="break_even_gbps", message="answers in GB/s")
def break_even_gbps(model, chip, prompt_len, chunk, batch, context, latency_s=0.0, tp=1):
    return sol.break_even_gbps(model, chip, prompt_len, chunk, batch, context, latency_s, tp) / 8


@mutant(check="break_even_gbps", message="leaves out the latency")
def break_even_gbps(model, chip, prompt_len, chunk, batch, context, latency_s=0.0, tp=1):  # noqa: F811
    return sol.break_even_gbps(model, chip, prompt_len, chunk, batch, context, 0.0, tp)


# -- 4. pools -----------------------------------------------------------------------------------------


@mutant(check="plan_pools", message="no queueing")
def plan_pools(model, chip, rate_rps, prompt_len, output_len, ttft_slo_s, tpot_slo_s, tp=1, transfer_s=0.0):
    plan = sol.plan_pools(model, chip, rate_rps, prompt_len, output_len, ttft_slo_s, tpot_slo_s, tp, transfer_s)
    plan["prefill_rps"] = 1 / plan["prefill_s"]
    plan["n_prefill"] = math.ceil(rate_rps / plan["prefill_rps"])
    return plan


@mutant(check="plan_pools", message="counts output_len decode steps")
def plan_pools(model, chip, rate_rps, prompt_len, output_len, ttft_slo_s, tpot_slo_s, tp=1, transfer_s=0.0):  # noqa: F811
    plan = sol.plan_pools(model, chip, rate_rps, prompt_len, output_len, ttft_slo_s, tpot_slo_s, tp, transfer_s)
    plan["decode_rps"] = plan["decode_batch"] / (output_len * plan["decode_step_s"])
    plan["n_decode"] = math.ceil(rate_rps / plan["decode_rps"])
    return plan


@mutant(check="plan_pools", message="forgets that the transfer spends part of the TTFT budget")
def plan_pools(model, chip, rate_rps, prompt_len, output_len, ttft_slo_s, tpot_slo_s, tp=1, transfer_s=0.0):  # noqa: F811
    return sol.plan_pools(model, chip, rate_rps, prompt_len, output_len, ttft_slo_s, tpot_slo_s, tp, 0.0)


@mutant(check="plan_pools", message="ignores the KV cache")
def plan_pools(model, chip, rate_rps, prompt_len, output_len, ttft_slo_s, tpot_slo_s, tp=1, transfer_s=0.0):  # noqa: F811
    real = gm.kv_capacity
    gm.kv_capacity = lambda *a, **k: {**real(*a, **k), "tokens": 10**12}
    try:
        return sol.plan_pools(model, chip, rate_rps, prompt_len, output_len, ttft_slo_s, tpot_slo_s, tp, transfer_s)
    finally:
        gm.kv_capacity = real



def _m_plan_pools(model, chip, rate_rps, prompt_len, output_len, ttft_slo_s, tpot_slo_s, tp=1, transfer_s=0.0,
                  no_tpot=False, overshoot=False, strict=False, ttft_guard=True, batch_guard=True,
                  x_strict=False, plus1=False):
    """plan_pools with one thing changed (the flags), written out as a learner would."""
    shape, gpu = gm.MODELS[model], gm.CHIPS[chip]
    t_p = gm.step_time(shape, gpu, gm.Composition(prefills=((prompt_len, 0),)), tp=tp).time_s
    x = (ttft_slo_s - transfer_s) / t_p
    if ttft_guard and (x < 1 if x_strict else x <= 1):
        raise ValueError("TTFT budget not above one prefill")
    prefill_rps = 2 * (x - 1) / (2 * x - 1) / t_p
    context = prompt_len + output_len // 2
    fits = gm.kv_capacity(shape, gpu, tp=tp)["tokens"] // (prompt_len + output_len)
    batch, step = 0, 0.0
    for b in range(1, min(sol.MAX_DECODE_BATCH, fits) + 1):
        t = gm.step_time(shape, gpu, gm.Composition.decode_batch(b, context), tp=tp).time_s
        if not no_tpot and (t >= tpot_slo_s if strict else t > tpot_slo_s):
            step = t if overshoot else step
            break
        batch, step = b, t
    if batch_guard and batch == 0:
        raise ValueError("no decode batch meets TPOT")
    decode_rps = batch / ((output_len - 1) * step)

    def up(r):
        return int(r) + 1 if plus1 else math.ceil(r)
    return {"n_prefill": up(rate_rps / prefill_rps), "n_decode": up(rate_rps / decode_rps), "prefill_rps": prefill_rps,
            "decode_rps": decode_rps, "decode_batch": batch, "prefill_s": t_p, "decode_step_s": step}


@mutant(check="plan_pools", message="ignores the TPOT SLO")
def plan_pools(*args, **kwargs):  # noqa: F811
    return _m_plan_pools(*args, **kwargs, no_tpot=True)


@mutant(check="plan_pools", message="first batch over the SLO")
def plan_pools(*args, **kwargs):  # noqa: F811
    return _m_plan_pools(*args, **kwargs, overshoot=True)


@mutant(check="plan_pools", message="refuses a step exactly at the SLO")
def plan_pools(*args, **kwargs):  # noqa: F811
    return _m_plan_pools(*args, **kwargs, strict=True)


@mutant(check="plan_pools", message="TTFT 10 ms is less than one")
def plan_pools(*args, **kwargs):  # noqa: F811
    return _m_plan_pools(*args, **kwargs, ttft_guard=False)  # a plan for a TTFT below one prefill


@mutant(check="plan_pools", message="TPOT 1 ms")
def plan_pools(*args, **kwargs):  # noqa: F811
    return _m_plan_pools(*args, **kwargs, batch_guard=False)  # no batch: ZeroDivisionError, not ValueError


@mutant(check="plan_pools", message="x = 1 leaves no time")
def plan_pools(*args, **kwargs):  # noqa: F811
    return _m_plan_pools(*args, **kwargs, x_strict=True)


@mutant(check="plan_pools", message="int(r) + 1")
def plan_pools(*args, **kwargs):  # noqa: F811
    return _m_plan_pools(*args, **kwargs, plus1=True)


@mutant(check="break_even_gbps", message="equality included")
def break_even_gbps(model, chip, prompt_len, chunk, batch, context, latency_s=0.0, tp=1):  # noqa: F811
    s = gm.MODELS[model]
    nbytes = sol.kv_transfer_bytes(prompt_len, s.layers, s.kv_heads, s.head_dim, s.kv_bytes, tp, tp)
    stall = sol.prefill_stall(model, chip, prompt_len, chunk, batch, context, tp)
    if stall < latency_s:  # strict: equality falls through to a division by zero
        return float("inf")
    return nbytes * 8 / (stall - latency_s) / 1e9


# ---------------------------------------------------------------- malformed return values

@mutant(check="pack_unpack_in_engine", message="pack_kv returns tuple of length 2, not one tensor")
def pack_kv(k_cache, v_cache, block_table, num_tokens):  # noqa: F811
    buf = sol.pack_kv(k_cache, v_cache, block_table, num_tokens)
    return buf[:, 0], buf[:, 1]  # K and V as a pair, not one [layers, 2, ...] buffer
