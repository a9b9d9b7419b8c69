"""Plausible wrong answers for lesson 17; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here are
prefixed `_m_`."""
import math

from reference_engine import gpu_model as gm
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

