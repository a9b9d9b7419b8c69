"""Lesson 01: the reference agrees with its own definitions, the checks' mistake formulas are built
on the right answer, the docstring examples hold, and the measuring helpers return sane rows."""
import math
import random

import pytest
import torch

from autograder.checks import l01_roofline as checks
from autograder.core import Trial
from reference_engine.sim import gpu_model as G
from solutions import l01_roofline as S


def _trial(seed=0):
    return Trial(S, S, seed, cuda=False)


def _intensity(model, batch, ctx, wd, kd):
    c = S.decode_step_cost(model, batch, ctx, wd, kd)
    return c["flops"] / c["bytes"]


def test_docstring_examples():
    assert S.matmul_cost(1, 4096, 4096, "bf16") == {"flops": 33554432, "bytes": 33570816.0}
    assert S.attention_flops(S.LLAMA_3_8B, 1, 2000) == 4 * 32 * 32 * 128 * 2001 == 1049100288
    assert S.forward_flops(S.LLAMA_3_8B, 1, 2000) == 2 * 8e9 + 1049100288
    assert S.forward_bytes(S.LLAMA_3_8B, 1, 2000, "bf16", "bf16") == 8e9 * 2 + 2001 * 131072
    assert S.ridge_point(S.CHIPS["H100 SXM"]) == pytest.approx(989 / 3.35)
    r = S.roofline(2e12, 1e10, S.CHIPS["H100 SXM"])
    assert r["intensity"] == 200 and r["bound"] == "memory"
    assert r["attainable_flops_per_s"] == pytest.approx(6.7e14) and r["time_s"] == pytest.approx(1e10 / 3.35e12)
    assert S.decode_crossover_batch(S.LLAMA_3_8B, S.CHIPS["H100 SXM"], 0, "bf16", "bf16", include_kv=False) == 296
    k = S.step_kernels(S.LLAMA_3_8B, S.CHIPS["H100 SXM"], 512, 1024, "bf16", "bf16")
    assert [n for n in k if k[n]["bound"] == "compute"] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"]
    assert k["attn_decode"]["bound"] == "memory" and k["attn_decode"]["flops"] / k["attn_decode"]["bytes"] == 4.0
    assert S.step_bound(2e9, 1e6, S.CHIPS["H100 SXM"], 1e-4) == {"time_s": 1e-4, "bound": "overhead"}
    assert S.moe_decode_cost(S.MIXTRAL_8X7B, 1, 0, "bf16", "bf16")["experts_read"] == 2.0


def test_kv_bytes_per_token_match_the_reference_facts():
    # 131,072 and 327,680 bytes per token in bf16 (reference facts, model table)
    for model, expected in [(S.LLAMA_3_8B, 131072), (S.LLAMA_3_70B, 327680)]:
        assert S.forward_bytes(model, 1, 0, "bf16", "bf16") - S.forward_bytes(model, 0, 0, "bf16", "bf16") == expected


def test_attention_flops_equal_a_brute_force_count_of_unmasked_pairs():
    model = {"name": "tiny", "params": 1000, "layers": 3, "heads": 4, "kv_heads": 2, "head_dim": 8}
    for new, cached in [(1, 0), (1, 7), (5, 0), (6, 9)]:
        total = new + cached
        pairs = sum(1 for q in range(cached, total) for k in range(total) if k <= q)
        assert S.attention_flops(model, new, cached) == 4 * 3 * 4 * 8 * pairs


def test_decode_step_of_one_sequence_is_one_forward_pass():
    for ctx in (0, 1, 2000):
        one = S.decode_step_cost(S.LLAMA_3_70B, 1, ctx, "fp8", "bf16")
        assert one == {"flops": S.forward_flops(S.LLAMA_3_70B, 1, ctx),
                       "bytes": S.forward_bytes(S.LLAMA_3_70B, 1, ctx, "fp8", "bf16")}


def test_crossover_is_the_smallest_compute_bound_batch():
    rng = random.Random(7)
    finite = never = 0
    for _ in range(300):
        model, chip = checks._random_model(rng), checks._random_chip(rng)
        wd, kd = rng.choice(["bf16", "fp8", "int4"]), rng.choice(["bf16", "fp8"])
        ctx = rng.randint(0, 4000)
        ridge = S.ridge_point(chip)
        b = S.decode_crossover_batch(model, chip, ctx, wd, kd)
        if b is None:
            never += 1
            assert _intensity(model, 10**9, ctx, wd, kd) < ridge  # the asymptote stays below the ridge
            continue
        finite += 1
        assert isinstance(b, int) and b >= 1
        assert _intensity(model, b, ctx, wd, kd) >= ridge * (1 - 1e-12)
        if b > 1:
            assert _intensity(model, b - 1, ctx, wd, kd) < ridge * (1 + 1e-12)
    assert finite > 50 and never > 20  # the draw exercises both outcomes


def test_weights_only_crossover_is_ridge_times_bytes_over_two():
    for chip in S.CHIPS.values():
        for dtype in ("bf16", "fp8", "int4"):
            b = S.decode_crossover_batch(S.LLAMA_3_8B, chip, 12345, dtype, "bf16", include_kv=False)
            assert b == math.ceil(S.ridge_point(chip) * S.DTYPE_BITS[dtype] / 8 / 2)


@pytest.mark.parametrize("seed", range(20))
def test_check_mistake_formulas_are_built_on_the_right_answer(seed):
    # With no error put in, the checks' own crossover solver must agree with the reference; else a
    # "mistake" could be the right answer in disguise.
    t = _trial(seed)
    for _, model, chip, ctx, wd, kd, include_kv in checks._crossover_cases(t):
        assert checks._crossover(S.DTYPE_BITS, model, chip, ctx, wd, kd, include_kv) == \
            S.decode_crossover_batch(model, chip, ctx, wd, kd, include_kv)
    for flops, nbytes in [(3e13, 1.6e10), (1.7e10, 1.6e10)]:
        chip = checks._random_chip(t.rng)
        peak, bw = chip["dense_tflops"] * 1e12, chip["hbm_gb_per_s"] * 1e9
        assert checks._roof(flops, nbytes, peak, bw) == S.roofline(flops, nbytes, chip)


def test_the_ridge_cases_sit_exactly_on_the_ridge():
    # The boundary cases rely on exact floating point: intensity == ridge, crossover == 250.
    chip = checks.RIDGE_250
    assert S.ridge_point(chip) == 250.0 == checks._ridge(chip)
    assert S.roofline(2.5e12, 1e10, chip)["bound"] == "compute"
    assert S.roofline(2.5e12, 1e10, chip)["intensity"] == S.ridge_point(chip)
    assert S.decode_crossover_batch(S.LLAMA_3_8B, chip, 0, "bf16", "bf16", include_kv=False) == 250


def test_time_call_is_positive_and_counts_calls():
    calls = []
    s = S.time_call(lambda: calls.append(1), torch.device("cpu"), min_seconds=0.001, repeats=2)
    assert s > 0 and len(calls) > 2


def test_measuring_helpers_return_sane_rows():
    dev = torch.device("cpu")
    assert S.measure_read_bandwidth(dev, nbytes=2**20, min_seconds=0.001) > 0
    assert S.measure_copy_bandwidth(dev, nbytes=2**20, min_seconds=0.001) > 0
    rows = S.matmul_sweep([1, 4, 16], 64, 64, torch.float32, dev, pool_bytes=2**16, min_seconds=0.001)
    assert [r["m"] for r in rows] == [1, 4, 16]
    for r in rows:
        assert set(r) == {"m", "flops", "bytes", "seconds", "flops_per_s", "intensity"}
        assert all(r[k] > 0 for k in r)
        assert r["flops"] == 2 * r["m"] * 64 * 64 and r["intensity"] == pytest.approx(r["flops"] / r["bytes"])
    assert rows[0]["intensity"] < rows[1]["intensity"] < rows[2]["intensity"]


def test_notebook_runs_clean_on_the_untouched_exercises(monkeypatch):
    """Every teaching cell either works or says which exercise to finish: no tracebacks."""
    nbclient = pytest.importorskip("nbclient")
    import nbformat

    from autograder.lessons import find
    lesson = find("01")
    monkeypatch.setenv("COURSE_IMPL", "exercises")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(lesson.notebook, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(lesson.notebook.parent)}}).execute()
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outs)
    assert "not started" in text and "(skipped: write Exercise" in text
    assert "passed" not in text


# ---------------------------------------------------------------- 3.3 and 5: per kernel, overhead, MoE


def test_model_shapes_match_the_engines_gpu_model():
    for lesson, engine in [(S.LLAMA_3_8B, G.LLAMA_3_8B), (S.LLAMA_3_70B, G.LLAMA_3_70B)]:
        assert (lesson["layers"], lesson["heads"], lesson["kv_heads"], lesson["head_dim"], lesson["hidden"],
                lesson["intermediate"], lesson["vocab"]) == (engine.layers, engine.heads, engine.kv_heads,
                                                             engine.head_dim, engine.hidden, engine.intermediate,
                                                             engine.vocab)
        # the nominal parameter count is within 3% of the exact one the engine's model counts
        assert lesson["params"] == pytest.approx(G.param_count(engine), rel=0.03)


STEPS = [(1, 100, 0, 0), (1, 2000, 0, 0), (64, 1024, 0, 0), (512, 1024, 0, 0), (64, 1024, 512, 0),
         (8, 4000, 2048, 1024), (7, 33, 300, 17), (300, 0, 1, 5)]
L01_CHIP = {"A100 SXM 80GB": G.A100, "H100 SXM": G.H100, "H200 SXM": G.H200}


@pytest.mark.parametrize("chip", list(L01_CHIP))
@pytest.mark.parametrize("model", ["Llama-3-8B", "Llama-3-70B"])
@pytest.mark.parametrize("batch,context,chunk,chunk_context", STEPS)
def test_step_kernels_are_the_engines_modeled_kernels_at_peak(chip, model, batch, context, chunk, chunk_context):
    """reference_engine/sim/gpu_model.py (the modeled GPU clock, which never imports solutions/) and lesson 01's
    step_kernels give every kernel the same FLOPs, bytes, time and bound at 100% of the datasheet peaks."""
    lesson = {"Llama-3-8B": S.LLAMA_3_8B, "Llama-3-70B": S.LLAMA_3_70B}[model]
    shape = {"Llama-3-8B": G.LLAMA_3_8B, "Llama-3-70B": G.LLAMA_3_70B}[model]
    comp = G.Composition.decode_batch(batch, context, chunk, chunk_context)
    engine = G.step_time(shape, L01_CHIP[chip].at_peak(), comp, overhead_s=0.0)
    ours = S.step_kernels(lesson, S.CHIPS[chip], batch, context, "bf16", "bf16", chunk, chunk_context)
    assert list(ours) == [k.name for k in engine.kernels]
    for k in engine.kernels:
        assert (ours[k.name]["flops"], ours[k.name]["bytes"]) == (k.flops, k.bytes), k.name
        assert ours[k.name]["time_s"] == pytest.approx(k.time_s, rel=1e-12), k.name
        assert ours[k.name]["bound"] == k.bound, k.name
    assert sum(v["time_s"] for v in ours.values()) == pytest.approx(engine.time_s, rel=1e-12)


@pytest.mark.parametrize("batch,context,chunk,chunk_context", STEPS)
def test_step_kernels_on_a_derated_chip_are_the_engines_modeled_h100(batch, context, chunk, chunk_context):
    """The engine's modeled H100 is lesson 01's roofline on a chip derated to the achievable fractions:
    GEMMs at gemm_eff of the peak, attention at attn_eff, both at mem_eff of the bandwidth."""
    comp = G.Composition.decode_batch(batch, context, chunk, chunk_context)
    engine = G.step_time(G.LLAMA_3_8B, G.H100, comp, overhead_s=0.0)
    bw = G.H100.hbm_gb_per_s * G.H100.mem_eff
    for kind, eff in [("gemm", G.H100.gemm_eff), ("attention", G.H100.attn_eff)]:
        chip = {"dense_tflops": G.H100.dense_tflops * eff, "hbm_gb_per_s": bw}
        ours = S.step_kernels(S.LLAMA_3_8B, chip, batch, context, "bf16", "bf16", chunk, chunk_context)
        for k in engine.kernels:
            if k.kind == kind:
                assert ours[k.name]["time_s"] == pytest.approx(k.time_s, rel=1e-9), k.name
                assert ours[k.name]["bound"] == k.bound, k.name


def test_per_kernel_the_gemms_cross_the_ridge_and_decode_attention_never_does():
    h100 = S.CHIPS["H100 SXM"]
    for batch in (1, 16, 128, 256):
        k = S.step_kernels(S.LLAMA_3_8B, h100, batch, 1024, "bf16", "bf16")
        assert {k[n]["bound"] for n in k} == {"memory"}
    for batch in (512, 1024, 4096):
        k = S.step_kernels(S.LLAMA_3_8B, h100, batch, 1024, "bf16", "bf16")
        assert {k[n]["bound"] for n in checks.GEMMS[:4]} == {"compute"} and k["attn_decode"]["bound"] == "memory"
    for model in (S.LLAMA_3_8B, S.LLAMA_3_70B):  # decode attention: 2 * group size / KV bytes per element
        a = S.step_kernels(model, h100, 64, 3000, "bf16", "fp8")["attn_decode"]
        assert a["flops"] / a["bytes"] == 2 * (model["heads"] // model["kv_heads"]) / 1


def test_step_bound_is_the_roofline_until_the_overhead_is_larger():
    h100 = S.CHIPS["H100 SXM"]
    for flops, nbytes in [(3e13, 1.6e10), (1.7e10, 1.6e10), (1e6, 1e6)]:
        roof = S.roofline(flops, nbytes, h100)
        assert S.step_bound(flops, nbytes, h100, 0.0) == {"time_s": roof["time_s"], "bound": roof["bound"]}
        assert S.step_bound(flops, nbytes, h100, roof["time_s"] * 2) == {"time_s": roof["time_s"] * 2,
                                                                         "bound": "overhead"}


def test_moe_experts_read_matches_a_simulation_of_uniform_routing():
    rng = random.Random(3)
    model = S.MIXTRAL_8X7B
    for batch in (1, 3, 8, 20):
        trials = 4000
        seen = sum(len({e for _ in range(batch) for e in rng.sample(range(8), 2)}) for _ in range(trials)) / trials
        assert S.moe_decode_cost(model, batch, 0, "bf16", "bf16")["experts_read"] == pytest.approx(seen, rel=0.03)


def test_moe_decode_is_the_dense_count_at_its_limits():
    mix = S.MIXTRAL_8X7B
    dense = mix["params"] - mix["layers"] * mix["experts"] * mix["expert_params"]
    active = dense + mix["layers"] * mix["top_k"] * mix["expert_params"]
    # batch 1 reads the active parameters only; a large batch reads them all: a dense model of that size
    one = S.moe_decode_cost(mix, 1, 500, "bf16", "bf16")
    assert {"flops": one["flops"], "bytes": one["bytes"]} == S.decode_step_cost(dict(mix, params=active), 1, 500,
                                                                                "bf16", "bf16")
    big = S.moe_decode_cost(mix, 2000, 500, "bf16", "bf16")
    full = S.decode_step_cost(mix, 2000, 500, "bf16", "bf16")
    assert big["bytes"] == pytest.approx(full["bytes"], rel=1e-12) and big["flops"] < full["flops"] / 3
    assert round(active / 1e9, 1) == 12.9 and round(mix["params"] / 1e9, 1) == 46.7  # Mixtral paper: 13B of 47B


@pytest.mark.parametrize("seed", range(10))
def test_new_checks_mistake_formulas_default_to_the_right_answer(seed):
    t = _trial(seed)
    for _ in range(5):
        model, chip, batch, ctx, wd, kd, chunk, cc = checks._random_mixed_step(t.rng)
        got = checks._kernels(S.DTYPE_BITS, model, chip, batch, ctx, wd, kd, chunk, cc)
        want = S.step_kernels(model, chip, batch, ctx, wd, kd, chunk, cc)
        assert list(got) == list(want)
        for name in want:
            assert got[name]["bound"] == want[name]["bound"]
            for key in ("flops", "bytes", "time_s"):
                assert got[name][key] == pytest.approx(want[name][key], rel=1e-12)
        flops, nbytes, chip, overhead = checks._random_overhead_case(t.rng)
        peak, bw = chip["dense_tflops"] * 1e12, chip["hbm_gb_per_s"] * 1e9
        assert checks._bound(flops, nbytes, peak, bw, overhead) == S.step_bound(flops, nbytes, chip, overhead)
        model, batch, ctx, wd, kd = checks._random_moe(t.rng)
        got, want = checks._moe(S.DTYPE_BITS, model, batch, ctx, wd, kd), S.moe_decode_cost(model, batch, ctx, wd, kd)
        assert got == pytest.approx(want, rel=1e-12)
