"""Lesson 17: the solutions against hand-worked numbers and the engine's own KV transfer, and the checks'
helpers (their variants with nothing changed must equal the solution, or a mistake would be named wrongly)."""
import math
import random

import pytest
import torch

from autograder.checks import l17_disaggregation as chk
from reference_engine import kv_transfer
from reference_engine.sim import gpu_model as gm
from solutions import l17_disaggregation as sol

# ---- 1. bytes and time -------------------------------------------------------------------------------------


def test_worked_example_70b_8k():
    n = sol.kv_transfer_bytes(8192, 80, 8, 128, 2)
    assert n == 327_680 * 8192  # reference-facts.md: 320 KiB of bf16 KV per token
    assert sol.transfer_time(n, 100) == pytest.approx(n * 8 / 100e9)
    assert sol.transfer_time(n, 400) == pytest.approx(sol.transfer_time(n, 100) / 4)
    assert sol.transfer_time(n, 400, 20e-6, 80) == pytest.approx(n * 8 / 400e9 + 80 * 20e-6)


def test_replication_counts_decode_side_only():
    base = sol.kv_transfer_bytes(100, 32, 8, 128, 2)
    assert sol.kv_transfer_bytes(100, 32, 8, 128, 2, tp_prefill=16, tp_decode=8) == base
    assert sol.kv_transfer_bytes(100, 32, 8, 128, 2, tp_prefill=1, tp_decode=32) == 4 * base
    for bad in ((3, 1), (1, 6), (0, 1), (1, 0), (-8, 1), (1, 8.0)):
        with pytest.raises(ValueError):
            sol.kv_transfer_bytes(100, 32, 8, 128, 2, *bad)


def test_bytes_variant_unchanged_is_the_solution():
    rng = random.Random(0)
    for _ in range(50):
        case = chk.random_bytes_case(rng)
        assert chk.bytes_variant(*case) == sol.kv_transfer_bytes(*case)


# ---- 2. pack / unpack ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_solution_pack_unpack_equal_the_engines(seed):
    rng = random.Random(seed)
    L, nb, bs, H, D, n, dtype = chk.random_pack_case(rng)
    k, v, table, n = chk.kv_case(torch.Generator().manual_seed(seed), L, nb, bs, H, D, n, dtype, seed)
    buf = sol.pack_kv(k, v, table, n)
    assert torch.equal(buf, kv_transfer.pack_kv(k, v, table, n))
    assert torch.equal(buf, chk.pack_variant(k, v, table, n))
    k2, v2, dest, _ = chk.kv_case(torch.Generator().manual_seed(seed + 1), L, nb, bs, H, D, n, dtype, seed + 9)
    want_k, want_v = chk.unpack_variant(buf, k2, v2, dest)
    ek, ev = k2.clone(), v2.clone()
    kv_transfer.unpack_kv(buf, ek, ev, dest)
    sol.unpack_kv(buf, k2, v2, dest)
    assert torch.equal(k2, want_k) and torch.equal(v2, want_v)
    assert torch.equal(k2, ek) and torch.equal(v2, ev)


def test_pack_mistakes_differ_from_the_answer_on_visible_cases():
    """Every named mistake changes the packed buffer in some visible case (else it could never be named)."""
    seen = set()
    for i, (_, shape) in enumerate(chk.PACK_VISIBLE):
        k, v, table, n = chk.kv_case(torch.Generator().manual_seed(i), *shape, seed=i)
        right = chk.pack_variant(k, v, table, n)
        for name, kw in chk.ENGINE_PACK_MISTAKES.items():
            wrong = chk.pack_variant(k, v, table, n, **kw)
            if wrong.shape != right.shape or not torch.equal(wrong, right):
                seen.add(name)
    assert seen == set(chk.ENGINE_PACK_MISTAKES)


def test_engine_harness_with_reference_pack_unpack():
    work = chk.VISIBLE_WORKLOADS[0][1]
    got = chk.pair_harness(sol.pack_kv, sol.unpack_kv, work)
    expected = chk._single_engine(work)
    aborted = {i for ids in work["aborts"].values() for i in ids}
    assert got["error"] is None and got["finished"]
    assert all(g == e for i, (g, e) in enumerate(zip(got["tokens"], expected)) if i not in aborted)
    assert got["leak"] is None
    assert any(got["tokens"][i] is None for i in aborted), "an abort must have landed before the request finished"


def test_engine_harness_fp8_workload_ships_uint8_bytes():
    label, work = chk.VISIBLE_WORKLOADS[2]
    assert "fp8" in label and chk.engine_kw(work)["kv_cache_dtype"] == "fp8"
    got = chk.pair_harness(sol.pack_kv, sol.unpack_kv, work)
    expected = chk._single_engine(work)
    aborted = {i for ids in work["aborts"].values() for i in ids}
    assert got["error"] is None and got["finished"]
    assert all(g == e for i, (g, e) in enumerate(zip(got["tokens"], expected)) if i not in aborted)
    upcast = chk.pair_harness(lambda *a: sol.pack_kv(*a).float(), sol.unpack_kv, work)
    assert upcast["error"] is not None and "uint8" in upcast["error"]["message"]


def test_pack_layout_sees_a_view():
    k, v, table, n = chk.kv_case(torch.Generator().manual_seed(0), *chk.PACK_VISIBLE[0][1])
    assert chk.pack_layout(sol.pack_kv, k, v, table, n)["contiguous"]

    def view(*a):
        return sol.pack_kv(*a).transpose(1, 2).contiguous().transpose(1, 2)

    assert not chk.pack_layout(view, k, v, table, n)["contiguous"]


def test_engine_harness_catches_swapped_unpack():
    work = chk.VISIBLE_WORKLOADS[1][1]

    def swapped(buf, k, v, table):
        sol.unpack_kv(buf, v, k, table)

    got = chk.pair_harness(sol.pack_kv, swapped, work)
    assert got["tokens"] != chk._single_engine(work)


# ---- 3. break-even -------------------------------------------------------------------------------------------


def test_stall_variant_unchanged_is_the_solution():
    rng = random.Random(1)
    for _, case in chk.STALL_VISIBLE + [("", chk.random_stall_case(rng)) for _ in range(4)]:
        assert chk.stall_variant(*case) == pytest.approx(sol.prefill_stall(*case), rel=1e-12)


def test_stall_is_the_chunked_prefill_work_on_the_clock():
    """One chunk adds less than its own prefill step would take (the weight reads are shared with the decode
    step) but more than nothing, and the stall grows with the prompt."""
    one = sol.prefill_stall("llama-3-8b", "H100", 512, 512, 1, 1024)
    alone = gm.step_time(gm.LLAMA_3_8B, gm.H100, gm.Composition(prefills=((512, 0),))).time_s
    assert 0 < one < alone
    assert sol.prefill_stall("llama-3-8b", "H100", 4096, 512, 64, 2048) > 7 * sol.prefill_stall(
        "llama-3-8b", "H100", 512, 512, 64, 2048)


def test_break_even_is_where_transfer_equals_stall():
    case = ("llama-3-70b", "H100", 4096, 512, 32, 4096)
    bw = sol.break_even_gbps(*case, latency_s=1e-3, tp=4)
    s = gm.LLAMA_3_70B
    nbytes = sol.kv_transfer_bytes(4096, s.layers, s.kv_heads, s.head_dim, s.kv_bytes, 4, 4)
    assert sol.transfer_time(nbytes, bw, 1e-3) == pytest.approx(sol.prefill_stall(*case, tp=4))
    assert sol.break_even_gbps("llama-3-8b", "H100", 64, 512, 16, 1024, latency_s=0.05) == math.inf


# ---- 4. pools ------------------------------------------------------------------------------------------------


def test_plan_variant_unchanged_is_the_solution():
    for _, case in chk.PLAN_VISIBLE:
        assert chk.plan_variant(*case) == pytest.approx(sol.plan_pools(*case), rel=1e-12)


def test_plan_cases_exercise_tpot_and_boundaries():
    """The TPOT-bound visible case is bound by TPOT, not memory; the boundary case keeps the batch whose step is
    exactly the SLO; a TTFT of exactly t_p is refused."""
    label, case = chk.PLAN_VISIBLE[-1]
    assert "TPOT-bound" in label
    right = sol.plan_pools(*case)
    assert chk.plan_variant(*case, no_memory=True) == right
    assert chk.plan_variant(*case, no_tpot=True)["decode_batch"] > right["decode_batch"]
    (_, boundary), t_p = chk.plan_boundary_cases()
    assert chk.plan_variant(*boundary) == pytest.approx(sol.plan_pools(*boundary), rel=1e-12)
    assert sol.plan_pools(*boundary)["decode_batch"] == 100
    assert chk.plan_variant(*boundary, strict_tpot=True)["decode_batch"] == 99
    with pytest.raises(ValueError):
        sol.plan_pools("llama-3-8b", "H100", 20.0, 2048, 256, t_p, 0.04)


def test_plan_meets_the_ttft_slo_at_its_rate():
    plan = sol.plan_pools("llama-3-8b", "H100", 20.0, 2048, 256, 0.5, 0.04, 1, 0.01)
    t_p, lam = plan["prefill_s"], plan["prefill_rps"]
    rho = lam * t_p
    assert t_p + rho * t_p / (2 * (1 - rho)) == pytest.approx(0.5 - 0.01)  # M/D/1 mean TTFT at the limit
    slower = gm.step_time(gm.LLAMA_3_8B, gm.H100, gm.Composition.decode_batch(plan["decode_batch"] + 1, 2048 + 128))
    fits = gm.kv_capacity(gm.LLAMA_3_8B, gm.H100)["tokens"] // (2048 + 256)
    assert plan["decode_step_s"] <= 0.04
    assert slower.time_s > 0.04 or plan["decode_batch"] == min(fits, sol.MAX_DECODE_BATCH)
    with pytest.raises(ValueError):
        sol.plan_pools("llama-3-8b", "H100", 1.0, 8192, 100, 0.01, 0.04)


# ---- the replay harness ------------------------------------------------------------------------------------


def test_replays_produce_every_token():
    reqs, prompts = sol.workload(12, rps=4.0, seed=2)
    for rows in (sol.replay_colocated(reqs, prompts, 2), sol.replay_disagg(reqs, prompts, 1, 1, 100.0)):
        assert [len(r["itl"]) + 1 for r in rows] == [r.output_tokens for r in reqs]
        assert all(r["ttft"] > 0 for r in rows)
    s = sol.summarize(rows, 1.0, 0.05)
    assert 0 <= s["attainment"] <= 1 and s["itl_p99"] >= s["itl_p50"]


def test_prefill_pool_ttft_is_the_m_d_1_queue_of_plan_pools():
    """Random dispatch gives each instance the M/D/1 queue plan_pools sizes: the simulated mean TTFT is the formula's;
    a shared queue is never slower at any percentile; the transfer adds to every sample."""
    import numpy as np
    plan = sol.plan_pools("llama-3-70b", "H100", 4.0, 8192, 512, 1.5, 0.08, 4)
    t_p, n = plan["prefill_s"], plan["n_prefill"]
    rho = 4.0 / n * t_p
    x = np.array(sol.prefill_pool_ttft(t_p, 4.0, n, n=40_000))
    assert x.mean() == pytest.approx(t_p + rho * t_p / (2 * (1 - rho)), rel=0.05)
    assert x.min() >= t_p - 1e-12
    shared = np.array(sol.prefill_pool_ttft(t_p, 4.0, n, n=40_000, shared_queue=True))
    assert all(np.percentile(shared, q) <= np.percentile(x, q) + 1e-9 for q in (50, 90, 99))
    moved = np.array(sol.prefill_pool_ttft(t_p, 4.0, n, n=1_000, transfer_s=0.01))
    assert moved == pytest.approx(np.array(sol.prefill_pool_ttft(t_p, 4.0, n, n=1_000)) + 0.01)
