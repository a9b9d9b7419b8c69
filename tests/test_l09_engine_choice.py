"""Lesson 09 beyond the shared tests: the engine's forward timing (real and modeled clock), the searches against
brute force, the reversals of the decision table actually reversing it, and the checks' re-implementation of
the table agreeing with the reference."""
import dataclasses
import math
import random

import pytest

from autograder.checks import l09_engine_choice as checks
from autograder.compare import compare
from reference_engine import SamplingParams
from reference_engine.llm import LLM
from reference_engine.shipped import TARGET
from reference_engine.sim import gpu_model as gm
from solutions import l09_engine_choice as S

# ---- the engine's StepStats.forward_time ------------------------------------------------------------

def test_forward_time_is_part_of_the_wall_time_on_the_real_clock():
    llm = LLM(TARGET, dtype="float32", max_num_seqs=4)
    llm.generate([[5, 6, 7, 8]] * 3, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    stats = S.stats_dicts(llm.engine)
    assert stats and all(s["forward_time"] is not None for s in stats)
    assert all(0 < s["forward_time"] < s["wall_time"] for s in stats)  # host work (schedule, sample) is never 0
    split = S.step_split(stats)
    assert 0 < split["host_fraction"] < 1 and split["steps"] == len(stats)


def test_forward_time_on_the_modeled_clock_is_the_modeled_kernels():
    with pytest.warns(UserWarning):  # engine_kwargs caps the block count for the tiny model's cache
        kw = gm.engine_kwargs(gm.LLAMA_3_8B, gm.H100)
    llm = LLM(TARGET, dtype="float32", max_num_seqs=4, **kw)
    llm.generate([[5, 6, 7, 8]] * 3, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    clock = kw["clock"]
    stats = llm.engine.step_stats
    assert len(stats) == len(clock.steps)
    for s, st in zip(stats, clock.steps):
        assert s.forward_time == pytest.approx(st.time_s - st.overhead_s, rel=1e-12)
        assert s.wall_time - s.forward_time == pytest.approx(gm.STEP_OVERHEAD_S, rel=1e-9)


# ---- section 1 on hand-made stats ---------------------------------------------------------------------

def test_docstring_examples():
    got = S.step_split([{"wall_time": 0.010, "forward_time": 0.006}, {"wall_time": 0.002, "forward_time": None},
                        {"wall_time": 0.030, "forward_time": 0.026}])
    assert got["steps"] == 2 and got["host_fraction"] == pytest.approx(0.2)
    two = [checks.S(0.010, 0.006, decode=4), checks.S(0.012, 0.008, decode=4)]
    assert compare(S.split_by_batch(two), {4: {"n": 2, "host_s": 0.004, "forward_s": 0.007}}, 1e-9, 1e-12) is None
    assert S.regime("llama-3-8b", "H100", 1, 1024, 1e-3) == "memory"
    assert S.overhead_bound_batch("llama-3-8b", "H100", 1024, 0.010) == 93
    assert S.steady_step(S.Workload(64, 2000, 200, prefix_share=0.75)) == {"batch": 64, "context": 2100, "chunk": 160,
                                                                            "chunk_context": 1500}
    r = S.recommend(S.Workload(32, 1000, 300, prefix_share=0.8))
    assert r._replace(reversal=r.reversal._replace(value=None)) == S.Recommendation(
        "vLLM", "default", "memory", S.Reversal("host_overhead_s", ">", None, None))
    assert round(r.reversal.value * 1e3, 2) == 7.23  # the docstring's d


def test_checks_split_helpers_agree_with_the_reference():
    rng = random.Random(9)
    for _ in range(50):
        steps = checks._random_steps(rng)
        assert checks._split(steps) == pytest.approx(S.step_split(steps))
        assert compare(checks._by_batch(steps), S.split_by_batch(steps), 1e-9, 1e-15) is None


# ---- section 2: the searches --------------------------------------------------------------------------

def test_device_time_never_falls_as_the_batch_grows():
    """The bisections (overhead_bound_batch, the slo row) rely on it."""
    for model in S.gm.MODELS:
        for chip in S.gm.CHIPS:
            for context, chunk in [(128, 0), (4096, 0), (1024, 512)]:
                times = [S.device_time(model, chip, b, context, chunk) for b in range(1, 600, 7)]
                assert times == sorted(times)


def test_overhead_bound_batch_matches_a_linear_scan():
    rng = random.Random(4)
    for _ in range(12):
        model, chip, context, host, mb = checks._random_obb(rng)
        assert S.overhead_bound_batch(model, chip, context, host, mb) == checks._first_batch(model, chip, context, host, mb)
    assert S.overhead_bound_batch("llama-3-8b", "H100", 1024, 1e-3) == 1
    assert S.overhead_bound_batch("llama-3-8b", "H100", 1024, 10.0) is None


def test_regime_agrees_with_the_checks_and_the_overhead_boundary():
    rng = random.Random(5)
    for _ in range(40):
        model, chip, batch, context, host, chunk, cc, tp = checks._random_regime(rng)
        assert S.regime(model, chip, batch, context, host, chunk, cc, tp) == checks._regime(
            model, chip, batch, context, host, chunk, cc, tp=tp)
    b = S.overhead_bound_batch("llama-3-70b", "A100", 512, 0.120)
    assert S.regime("llama-3-70b", "A100", b - 1, 512, 0.120) == "overhead"
    assert S.regime("llama-3-70b", "A100", b, 512, 0.120) != "overhead"


# ---- section 3: the table and its reversals ----------------------------------------------------------

def _workloads(n: int, seed: int):
    rng = random.Random(seed)
    return [S.Workload(**checks._random_workload(rng)) for _ in range(n)] + [S.Workload(**f) for _, f in checks.recommend_cases()]


def test_checks_table_agrees_with_the_reference():
    for w in _workloads(60, 1):
        r = S.recommend(w)
        assert checks._decide(dataclasses.asdict(w)) == (r.engine, r.row, r.regime)
        assert checks._steady(dataclasses.asdict(w)) == S.steady_step(w)


def test_every_row_is_reached_by_the_visible_cases():
    rows = {S.recommend(S.Workload(**f)).row for _, f in checks.recommend_cases()}
    assert rows == {"slo", "overhead", "compute", "default"}


def test_each_reversal_reverses_its_row():
    """Apply the reversal: the deciding row no longer applies and the table picks the reversal's engine."""
    for w in _workloads(60, 2):
        r = S.recommend(w)
        f, op, v, engine = r.reversal
        if f == "features":
            after = dataclasses.replace(w, features=tuple(sorted(set(w.features) | {v})))
        elif op == ">":
            after = dataclasses.replace(w, **{f: math.nextafter(v, math.inf)})
        else:
            after = dataclasses.replace(w, **{f: v})
        flipped = S.recommend(after)
        assert flipped.row != r.row and flipped.engine == engine, (w, r, flipped)
        if r.row == "slo" and f == "concurrency":  # the largest batch that meets the SLO: one more misses it
            assert S.recommend(dataclasses.replace(w, concurrency=v + 1)).row == "slo"


def test_prefix_reuse_moves_the_steady_step_down_the_roofline():
    """Caching a prefix removes prefill work: the steady step's device time falls as the share grows."""
    times = []
    for share in (0.0, 0.25, 0.5, 0.75, 0.95):
        s = S.steady_step(S.Workload(128, 2000, 200, prefix_share=share))
        times.append(S.device_time("llama-3-8b", "H100", s["batch"], s["context"], s["chunk"], s["chunk_context"]))
    assert times == sorted(times, reverse=True) and times[0] > 1.5 * times[-1]


def test_the_table_states_its_releases_and_its_rules_hold_for_them():
    """The rows rest on the releases in ENGINE_VERSIONS: only multi_vendor rules TensorRT-LLM out (1.0 needs no
    engine build), a shared prefix picks no engine by itself (every engine caches prefixes by default), and an
    overhead-bound step picks none (every engine overlaps the host with the device)."""
    assert set(S.ENGINE_VERSIONS) == set(S.ENGINES) and S.EXCLUDES == {"multi_vendor": "TensorRT-LLM"}
    big = S.Workload(512, 200, 500, model="llama-3-70b", tp=4)
    assert S.recommend(dataclasses.replace(big, features=("fast_model_turnover",))).engine == "TensorRT-LLM"
    assert S.recommend(dataclasses.replace(big, features=("multi_vendor",))).engine == "vLLM"
    for share in (0.0, 0.5, 0.9):
        assert S.recommend(S.Workload(32, 1000, 300, prefix_share=share)).engine == "vLLM"
    assert S.recommend(S.Workload(8, 500, 200, host_overhead_s=0.02)).engine is None
