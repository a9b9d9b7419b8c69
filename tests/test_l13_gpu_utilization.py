"""Lesson 13 beyond the shared tests: the solutions against brute force and against each other, the checks'
wrong-answer variants against the reference, and reference_engine/tools/profiling.py's timelines against gpu_model."""
import math
import operator
import random

import pytest

from autograder.checks import l13_gpu_utilization as checks
from autograder.mistakes import name_of
from reference_engine import LLM
from reference_engine.sampling import SamplingParams
from reference_engine.shipped import TARGET
from reference_engine.sim.gpu_model import H100, LLAMA_3_8B, LLAMA_3_70B, Composition, step_time
from reference_engine.tools import profiling as prof
from solutions import l13_gpu_utilization as S


def brute_utilization(kernels, period, t0, samples, grid=4000):
    """Share of evenly spaced instants in each window at which some kernel runs."""
    out = []
    for i in range(samples):
        lo = t0 + i * period
        ts = [lo + (j + 0.5) * period / grid for j in range(grid)]
        out.append(sum(any(s <= t < e for s, e in kernels) for t in ts) / grid)
    return out


def test_nvml_utilization_matches_point_sampling():
    rng = random.Random(3)
    for _ in range(30):
        kernels, period, t0, samples = checks.random_timeline(rng)
        got = S.nvml_utilization(kernels, period, t0, samples)
        assert all(0.0 <= u <= 1.0 for u in got)
        assert got == pytest.approx(brute_utilization(kernels, period, t0, samples), abs=2e-3)


def test_nvml_utilization_edge_cases():
    assert S.nvml_utilization([], 1.0, 0.0, 3) == [0.0, 0.0, 0.0]
    assert S.nvml_utilization([(0.0, 0.5)], 1.0, 0.0, 0) == []
    assert S.nvml_utilization([(0.2, 0.2)], 1.0, 0.0, 1) == [0.0]  # a zero-length kernel is no time
    assert S.nvml_utilization([(-1.0, 5.0)], 1.0, 0.0, 2) == [1.0, 1.0]
    with pytest.raises(ValueError):
        S.nvml_utilization([(0.0, 1.0)], 0.0, 0.0, 1)


def test_sm_active_is_at_most_nvml_and_equal_for_full_waves():
    rng = random.Random(5)
    for _ in range(50):
        kernels, sms, period = checks.random_grids(rng)
        t, intervals = 0.0, []
        for d, *_ in kernels:
            intervals.append((t, t + d))
            t += d
        util = S.nvml_utilization(intervals, period, 0.0, 1)[0]
        assert S.sm_active(kernels, sms, period) <= util + 1e-12
        full = [(d, sms * rng.randint(1, 4)) for d, *_ in kernels]
        assert S.sm_active(full, sms, period) == pytest.approx(util)


def test_mfu_mbu_pools_by_time():
    steps = [{"flops": 1e12, "bytes": 1e9, "wall_time": 1.0}, {"flops": 3e12, "bytes": 3e9, "wall_time": 3.0}]
    assert S.mfu_mbu(steps, 1e13, 1e10) == pytest.approx({"mfu": 0.1, "mbu": 0.1})
    assert S.mfu_mbu(steps, 1e13, 1e10, 8.0) == pytest.approx({"mfu": 0.05, "mbu": 0.05})
    assert S.mfu_mbu([], 1e13, 1e10) == {"mfu": 0.0, "mbu": 0.0}


def test_diagnose_covers_every_bound():
    rng = random.Random(9)
    seen = {S.diagnose(*checks.random_dashboard(rng)) for _ in range(400)}
    assert seen == set(S.BOUNDS)
    for dash, load, busy in (c for _, c in checks.DIAGNOSE_CASES):
        assert S.diagnose(dash, load, busy) in S.BOUNDS


def test_every_diagnose_variant_differs_on_a_visible_case():
    for kind in checks.DIAGNOSE_MISTAKES.values():
        assert any(checks.diagnose_variant(d, load, busy, kind=kind) != S.diagnose(d, load, busy)
                   for _, (d, load, busy) in checks.DIAGNOSE_CASES), kind


def test_a_diagnosis_several_mistakes_give_names_them_together():
    """The one mistake rule (autograder/mistakes.py): a wrong diagnosis that several usual mistakes give (a
    diagnosis has four answers) names all of them, and one that no mistake gives names none."""
    cases = dict(checks.DIAGNOSE_CASES)
    for label, got, kinds in [("visible: HBM saturated while kernels run, host gaps, requests waiting", "idle",
                               {"util", "no_queue"}),
                              ("visible: the same reading with one request always in flight", "idle",
                               {"util", "no_queue", "idle_le"}),
                              ("visible: the same reading with almost no traffic", "overhead",
                               {"idle_zero", "no_util"}),
                              ("visible: the same reading with almost no traffic", "compute", set())]:
        dash, load, busy = cases[label]
        wrong = {n: checks.diagnose_variant(dash, load, busy, kind=k) for n, k in checks.DIAGNOSE_MISTAKES.items()}
        names = name_of(got, wrong, operator.eq, S.diagnose(dash, load, busy))
        assert {checks.DIAGNOSE_MISTAKES[n] for n in names} == kinds, label


def test_sm_floor_waves_gives_the_min_share():
    """Why the message for a missing tail wave also covers floor(blocks / SMs) waves: same values."""
    for sms in (108, 132):
        for blocks in range(1, 5 * sms):
            floor = min(1.0, blocks / (sms * max(1, blocks // sms)))
            assert floor == pytest.approx(min(blocks, sms) / sms)


def test_boundaries_of_the_contracts():
    assert S.nvml_utilization([(10.0, 10.5), (11.6, 11.6)], 1.0, 10.0, 2) == pytest.approx([0.5, 0.0])
    with pytest.raises(ValueError):
        S.nvml_utilization([(0.0, 0.5)], 1.0, 0.0, -1)
    assert S.sm_active([(0.1, 66), (0.2, 132)], 132, 0.3) == pytest.approx(0.25 / 0.3)  # 0.1 + 0.2 > 0.3 in floats
    assert S.sm_active([(0.25, 132), (0.75, 264)], 132, 1.0) == 1.0
    with pytest.raises(ValueError):
        S.sm_active([(0.5, 10)], 0, 1.0)
    steps = [{"flops": 1.0, "bytes": 1.0, "wall_time": 0.1}, {"flops": 1.0, "bytes": 1.0, "wall_time": 0.2}]
    assert S.mfu_mbu(steps, 1.0, 1.0, 0.3) == pytest.approx({"mfu": 2 / 0.3, "mbu": 2 / 0.3})
    with pytest.raises(ValueError):
        S.mfu_mbu(steps, 1.0, 1.0, 0.0)
    assert S.mfu_mbu([], 1.0, 1.0, 0.0) == {"mfu": 0.0, "mbu": 0.0}
    dash = {"gpu_util": 0.5, "sm_active": 0.5, "sm_occupancy": 0.5, "tensor_active": 0.5, "dram_active": 0.5}
    assert S.diagnose(dash, 0.5) == "compute"  # busy itself is "mostly"; a tie goes to compute
    assert S.diagnose({**dash, "gpu_util": 0.3}, 1.0) == "overhead"
    assert S.diagnose({**dash, "gpu_util": 0.6}, 8.0, busy=0.7) == "overhead"


def test_check_variants_reproduce_the_reference():
    rng = random.Random(11)
    for _ in range(40):
        kernels, period, t0, samples = checks.random_timeline(rng)
        assert checks.nvml_variant(kernels, period, t0, samples) == pytest.approx(
            S.nvml_utilization(kernels, period, t0, samples))
        grids, sms, p = checks.random_grids(rng)
        assert checks.sm_variant(grids, sms, p) == pytest.approx(S.sm_active(grids, sms, p))
        steps, pf, pb, elapsed = checks.random_steps(rng)
        assert checks.mfu_variant(steps, pf, pb, elapsed) == pytest.approx(S.mfu_mbu(steps, pf, pb, elapsed))
        dash, load = checks.random_dashboard(rng)
        assert checks.diagnose_variant(dash, load) == S.diagnose(dash, load)


@pytest.mark.parametrize("comp", [Composition.decode_batch(1, 1024), Composition.decode_batch(64, 4096, 512, 100),
                                  Composition(prefills=((2048, 0),))])
def test_step_kernels_add_up_to_step_time(comp):
    for shape in (LLAMA_3_8B, LLAMA_3_70B):  # one GPU: the timeline has no all-reduce kernels
        st = step_time(shape, H100, comp, overhead_s=0.0)
        ks = prof.step_kernels(shape, H100, comp, start=1.0)
        assert ks[0].start == 1.0 and all(a.end == pytest.approx(b.start) for a, b in zip(ks, ks[1:]))
        assert sum(k.duration for k in ks) == pytest.approx(st.time_s, rel=1e-9)
        assert sum(k.flops for k in ks) == pytest.approx(sum(k.flops for k in st.kernels), rel=1e-9)
        assert sum(k.bytes for k in ks) == pytest.approx(sum(k.bytes for k in st.kernels), rel=1e-9)
        assert all(k.blocks >= 1 for k in ks)


def test_window_counters_agree_with_mfu_mbu():
    comp = Composition.decode_batch(32, 1024)
    tl = prof.modeled_timeline(LLAMA_3_8B, H100, [comp] * 4, host_s=1e-3)
    st = step_time(LLAMA_3_8B, H100, comp, overhead_s=1e-3)
    pipes = prof.window_counters(tl["kernels"], H100, 0.0, tl["end"])
    pooled = S.mfu_mbu(S.step_records([st] * 4), H100.peak_flops, H100.bandwidth)
    assert pipes["tensor_active"] == pytest.approx(pooled["mfu"], rel=1e-9)
    assert pipes["dram_active"] == pytest.approx(pooled["mbu"], rel=1e-9)
    util = S.nvml_utilization([(k.start, k.end) for k in tl["kernels"]], tl["end"], 0.0, 1)[0]
    assert util == pytest.approx(1 - 4e-3 / tl["end"], rel=1e-9)


def test_grid_blocks():
    assert prof.grid_blocks("gemm", LLAMA_3_8B, m=1, n=6144) == 48
    assert prof.grid_blocks("gemm", LLAMA_3_8B, m=129, n=128) == 2
    assert prof.grid_blocks("attn_decode", LLAMA_3_8B, seqs=3) == 3 * 8
    assert prof.grid_blocks("attn_prefill", LLAMA_3_8B, tokens=300) == math.ceil(300 / 128) * 32
    with pytest.raises(ValueError):
        prof.grid_blocks("conv", LLAMA_3_8B)


def test_counting_clock_and_profile_steps_on_the_engine():
    clock = prof.CountingClock()
    engine = LLM(str(TARGET), clock=clock).engine
    for i in range(3):
        engine.add_request([1 + i, 2, 3, 4] * 3, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.step()
    trace = prof.profile_steps(engine, 3)
    assert len(trace["steps"]) == 3 and trace["ops"]
    for s, e in trace["steps"]:
        assert e > s
    assert all(any(s <= o.start and o.end <= e + 1e-6 for s, e in trace["steps"]) for o in trace["ops"])
    assert len(clock.compositions) == len(engine.step_stats) == 4
    assert clock.compositions[0].num_prefill_tokens == 36  # three 12-token prompts in the first step
    assert clock.compositions[-1].decodes == (14, 14, 14)  # the fourth step: 12 prompt + 2 generated tokens cached
    shape = prof.model_shape(TARGET)
    assert (shape.layers, shape.hidden, shape.kv_heads, shape.weight_bytes) == (4, 256, 2, 4)


def test_nvml_code_is_not_run_without_cuda():
    import torch

    if not torch.cuda.is_available():
        assert prof.nvml_available() is False


def test_sm_active_occupancy_reduces_to_one_block_per_sm_and_counts_sms_not_slots():
    # per_sm = 1 is the one-block-per-SM model; more blocks per SM can only shorten the waves
    assert S.sm_active([(1.0, 133, 1)], 132, 1.0) == pytest.approx(S.sm_active([(1.0, 133)], 132, 1.0))
    # 300 blocks, 2 per SM on 132 SMs: a full wave of 264, then 36 blocks on 36 SMs
    assert S.sm_active([(1.0, 300, 2)], 132, 1.0) == pytest.approx((132 + 36) / 264)
    # a grid of 200 blocks at 2 per SM fits one wave: 132 SMs hold at least one block
    assert S.sm_active([(1.0, 200, 2)], 132, 1.0) == 1.0
    assert checks.sm_variant([(1.0, 200, 2)], 132, 1.0, occupancy="slots") == pytest.approx(200 / 264)


def test_unsorted_timeline_case_is_visible_and_names_the_sorted_assumption():
    label, (kernels, period, t0, samples) = next(c for c in checks.NVML_CASES if "not sorted" in c[0])
    assert kernels != sorted(kernels)
    wrong = checks.nvml_variant(kernels, period, t0, samples, sort=False)
    assert wrong != pytest.approx(S.nvml_utilization(kernels, period, t0, samples))
