"""Lesson 01: the reference agrees with its own definitions, the checks' mistake formulas are built
on the right answer, the docstring examples hold, and the measuring helpers return sane rows."""
import math
import random

import pytest
import torch

from autograder.checks import l01_roofline as checks
from autograder.core import Trial
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
        assert checks._crossover(t, model, chip, ctx, wd, kd, include_kv) == \
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
    assert "not started" in text and "you have not written yet" in text
    assert "passed" not in text
