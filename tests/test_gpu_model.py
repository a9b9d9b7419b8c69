"""The modeled GPU clock (reference_engine/sim/gpu_model.py): lesson 01's arithmetic, the regimes it predicts,
published measurements it should land near, the engine hook, and the CLI."""
import subprocess
import sys

import pytest
import torch

from reference_engine import LLM, SamplingParams
from reference_engine.shipped import TARGET
from reference_engine.sim import gpu_model as G
from reference_engine.sim.gpu_model import H100, H200, LLAMA_3_8B, LLAMA_3_70B, Composition, step_time
from solutions import l01_roofline as L01
from solutions import l06_capacity_planning as L06

L01_CHIP = {G.A100: "A100 SXM 80GB", G.H100: "H100 SXM", G.H200: "H200 SXM"}
GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


# ---------------------------------------------------------------- the numbers agree with lessons 01 and 06


@pytest.mark.parametrize("chip", list(L01_CHIP))
def test_chips_are_lesson_01s_datasheet_numbers(chip):
    ref = L01.CHIPS[L01_CHIP[chip]]
    assert (chip.dense_tflops, chip.hbm_gb_per_s) == (ref["dense_tflops"], ref["hbm_gb_per_s"])
    assert chip.at_peak().ridge == pytest.approx(L01.ridge_point(ref), rel=1e-12)
    assert 0 < chip.gemm_eff < 1 and 0 < chip.attn_eff < 1 and 0 < chip.mem_eff < 1


def test_memory_is_what_the_driver_reports():
    assert (G.H100.memory_mib, G.H200.memory_mib, G.A100.memory_mib) == (81_559, 143_771, 81_920)
    assert G.H100.memory_bytes / 1e9 == pytest.approx(85.52, abs=0.01)  # reference-facts.md
    assert G.H200.memory_bytes / 1e9 == pytest.approx(150.75, abs=0.01)


def test_shapes_match_lesson_06_and_the_facts():
    assert G.param_count(LLAMA_3_8B) == L06.param_count(L06.LLAMA_3_8B) == 8_030_261_248
    assert G.param_count(LLAMA_3_70B) == L06.param_count(L06.LLAMA_3_70B)
    assert G.kv_bytes_per_token(LLAMA_3_8B) == 131_072 and G.kv_bytes_per_token(LLAMA_3_70B) == 327_680
    assert G.kv_bytes_per_token(LLAMA_3_70B, tp=8) == 327_680 // 8
    norms = (2 * 80 + 1) * 8192  # RMSNorm weights: replicated on every rank, the rest split 8 ways
    assert G.weight_bytes_per_rank(LLAMA_3_70B, 8) == ((G.param_count(LLAMA_3_70B) - norms) / 8 + norms) * 2


@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (64, 6144, 4096), (295, 28672, 4096), (2048, 4096, 14336),
                                   (7, 3, 5)])
def test_matmul_cost_is_lesson_01s(m, n, k):
    flops, nbytes = G.matmul_cost(m, n, k)
    assert (flops, nbytes) == (L01.matmul_cost(m, n, k, "bf16")["flops"], L01.matmul_cost(m, n, k, "bf16")["bytes"])


EXPECTED_NK_8B = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
                  "down_proj": (4096, 14336), "lm_head": (128256, 4096)}


@pytest.mark.parametrize("comp", [Composition.decode_batch(1, 100), Composition.decode_batch(64, 1024),
                                  Composition.decode_batch(64, 1024, chunk=512), Composition(prefills=((2048, 0),)),
                                  Composition(prefills=((300, 17), (5, 0)), decodes=(3, 9))])
def test_gemm_roofline_is_lesson_01s(comp):
    """At 100% of peak, each weight GEMM's FLOPs, bytes, time and bound are lesson 01's matmul_cost + roofline,
    summed over the layers (lm_head: one call on one row per sequence)."""
    l01_chip = L01.CHIPS["H100 SXM"]
    st = step_time(LLAMA_3_8B, H100.at_peak(), comp, overhead_s=0.0)
    for name, (n, k) in EXPECTED_NK_8B.items():
        kern, calls = st.kernel(name), 1 if name == "lm_head" else LLAMA_3_8B.layers
        m = comp.num_seqs if name == "lm_head" else comp.num_tokens
        cost = L01.matmul_cost(m, n, k, "bf16")
        roof = L01.roofline(cost["flops"], cost["bytes"], l01_chip)
        assert (kern.calls, kern.flops, kern.bytes) == (calls, calls * cost["flops"], calls * cost["bytes"])
        assert kern.time_s == pytest.approx(calls * roof["time_s"], rel=1e-12)
        assert kern.bound == roof["bound"]
    assert st.time_s == pytest.approx(sum(k.time_s for k in st.kernels), rel=1e-12)


def test_fractions_of_peak_scale_the_two_roofs():
    comp = Composition.decode_batch(8, 512)
    ideal, real = step_time(LLAMA_3_8B, H100.at_peak(), comp), step_time(LLAMA_3_8B, H100, comp)
    for name in GEMMS:  # memory-bound at batch 8: only mem_eff matters
        assert real.kernel(name).time_s == pytest.approx(ideal.kernel(name).time_s / H100.mem_eff)
    assert real.kernel("attn_decode").time_s == pytest.approx(ideal.kernel("attn_decode").time_s / H100.mem_eff)
    big = Composition(prefills=((4096, 0),))
    gi, gr = (step_time(LLAMA_3_8B, c, big).kernel("gate_up_proj") for c in (H100.at_peak(), H100))
    assert gr.time_s == pytest.approx(gi.time_s / H100.gemm_eff)  # compute-bound: only gemm_eff matters


@pytest.mark.parametrize("new,cached", [(1, 0), (1, 2000), (7, 100), (512, 0), (512, 4096)])
def test_attention_is_lesson_01s(new, cached):
    flops, nbytes = G.attention_cost(LLAMA_3_8B, new, cached)
    assert flops == L01.attention_flops(L01.LLAMA_3_8B, new, cached)
    weights = L01.LLAMA_3_8B["params"] * 2
    assert nbytes == L01.forward_bytes(L01.LLAMA_3_8B, new, cached, "bf16", "bf16") - weights


# ---------------------------------------------------------------- the regimes


def test_weight_gemms_turn_compute_bound_near_the_ridge():
    """H100 at peak: ridge 295 FLOP/byte, and a GEMM of m tokens has intensity just under m, so every weight
    GEMM flips from memory- to compute-bound between m = ridge and m = 1.2 * ridge."""
    chip, ridge = H100.at_peak(), L01.ridge_point(L01.CHIPS["H100 SXM"])
    assert round(ridge) == 295

    def bounds(m):
        st = step_time(LLAMA_3_8B, chip, Composition(prefills=((m, 0),)))
        return {st.kernel(n).bound for n in GEMMS}

    assert bounds(int(ridge)) == {"memory"} and bounds(int(1.2 * ridge)) == {"compute"}
    assert bounds(16) == {"memory"} and bounds(4096) == {"compute"}
    first = next(m for m in range(1, 1000) if bounds(m) == {"compute"})
    assert ridge < first < 1.2 * ridge


@pytest.mark.parametrize("shape,tp", [(LLAMA_3_8B, 1), (LLAMA_3_70B, 8)])
@pytest.mark.parametrize("batch,context", [(1, 16), (64, 1024), (512, 1024), (8, 32768)])
def test_decode_attention_is_never_compute_bound(shape, tp, batch, context):
    """Decode attention's intensity is 2 * group size / KV bytes per element, whatever the batch or context:
    4 FLOP/byte for Llama-3 (4 query heads per KV head, bf16; 8 on 70B, 64/8), far below any ridge."""
    st = step_time(shape, H100, Composition.decode_batch(batch, context), tp=tp)
    attn = st.kernel("attn_decode")
    assert attn.flops / attn.bytes == pytest.approx(2 * (shape.heads // shape.kv_heads) / shape.kv_bytes)
    assert attn.bound == "memory" and attn.flops / attn.bytes < H100.ridge / 10


def test_decode_at_batch_1_is_memory_bound_and_costs_the_weight_read():
    st = step_time(LLAMA_3_8B, H100, Composition.decode_batch(1, 1000))
    assert {k.bound for k in st.kernels} == {"memory"}
    gemm_weights = (G.param_count(LLAMA_3_8B) - LLAMA_3_8B.vocab * LLAMA_3_8B.hidden) * 2  # no embedding gather
    assert st.seconds("gemm") == pytest.approx(gemm_weights / (H100.bandwidth * H100.mem_eff), rel=1e-3)
    assert 4e-3 < st.time_s < 7e-3  # 15 GB over ~2.8 TB/s, plus the overhead


def test_a_chunk_rides_almost_free_on_a_memory_bound_decode_step():
    """The chunked-prefill knee: on a decode batch of 64, a chunk of a couple of hundred tokens costs a few
    percent of the step, while past the knee every chunk token costs compute-bound time."""
    base = step_time(LLAMA_3_8B, H100, Composition.decode_batch(64, 1024)).time_s
    with_chunk = {c: step_time(LLAMA_3_8B, H100, Composition.decode_batch(64, 1024, c)).time_s for c in (128, 192, 2048)}
    alone = step_time(LLAMA_3_8B, H100, Composition(prefills=((192, 0),))).time_s
    assert with_chunk[192] - base < 0.05 * base and with_chunk[192] - base < 0.1 * alone
    per_token_past_knee = (with_chunk[2048] - with_chunk[192]) / (2048 - 192)
    compute_rate = 2 * G.param_count(LLAMA_3_8B) / (H100.peak_flops * H100.gemm_eff)  # seconds per token
    assert per_token_past_knee == pytest.approx(compute_rate, rel=0.15)
    assert (with_chunk[192] - base) / 192 < 0.2 * per_token_past_knee


def test_tensor_parallel_splits_weights_and_kv_and_adds_all_reduces():
    comp = Composition.decode_batch(16, 1024)
    one, eight = step_time(LLAMA_3_70B, H100, comp), step_time(LLAMA_3_70B, H100, comp, tp=8)
    for name in GEMMS:
        assert eight.kernel(name).flops == one.kernel(name).flops / 8
    assert eight.kernel("attn_decode").bytes == one.kernel("attn_decode").bytes / 8
    ar = eight.kernel("all_reduce")
    assert ar.calls == 2 * LLAMA_3_70B.layers and ar.bytes == ar.calls * 16 * LLAMA_3_70B.hidden * 2
    assert ar.time_s == pytest.approx(ar.calls * (H100.allreduce_latency_s + 16 * 8192 * 2 / (H100.allreduce_gb_per_s * 1e9)))
    assert "all_reduce" not in [k.name for k in one.kernels]
    with pytest.raises(ValueError, match="tp=3"):
        step_time(LLAMA_3_70B, H100, comp, tp=3)


LLAMA_2_7B = G.ModelShape("Llama-2-7B", 32, 32, 32, 128, 4096, 11008, 32000)
LLAMA_2_70B = G.ModelShape("Llama-2-70B", 80, 64, 8, 128, 8192, 28672, 32000)


@pytest.mark.parametrize("shape,tp,tokens_per_s", [(LLAMA_2_7B, 1, 104.9), (LLAMA_2_70B, 8, 62.50)])
def test_batch_1_decode_lands_near_gpt_fasts_a100_measurements(shape, tp, tokens_per_s):
    """gpt-fast README (pytorch-labs/gpt-fast): batch 1, 5-token prompt, bf16 on A100-80GB (power-limited to
    330 W): Llama-2-7B 104.9 tok/s on 1 GPU, Llama-2-70B 62.50 tok/s on 8 (tensor parallel). The 7B check
    leans on the same README's bandwidth note that set mem_eff; the 70B one also tests the all-reduce fit,
    which comes from another source (8x H200)."""
    st = step_time(shape, G.A100, Composition.decode_batch(1, 100), tp=tp)
    assert st.time_s == pytest.approx(1 / tokens_per_s, rel=0.25)


# ---------------------------------------------------------------- capacity and engine kwargs


def test_kv_capacity_uses_driver_memory_minus_weights():
    cap = G.kv_capacity(LLAMA_3_8B, H100)
    free = 81_559 * 2**20 * 0.9 - G.param_count(LLAMA_3_8B) * 2
    assert cap["free_bytes"] == pytest.approx(free) and cap["tokens"] == int(free // 131_072)
    assert cap["blocks"] == cap["tokens"] // 16
    assert G.kv_capacity(LLAMA_3_8B, H200)["tokens"] > 1.9 * cap["tokens"]
    with pytest.raises(ValueError, match="no KV cache"):
        G.kv_capacity(LLAMA_3_70B, H100)  # 141 GB of weights on one 80 GB card
    assert G.kv_capacity(LLAMA_3_70B, H100, tp=8)["kv_bytes_per_token"] == 40_960


def test_engine_kwargs_scale_blocks_and_say_when_capped():
    with pytest.warns(UserWarning, match="capped at max_blocks=4096"):
        kw = G.engine_kwargs(LLAMA_3_8B, H100)
    assert set(kw) == {"clock", "num_blocks", "block_size"} and kw["num_blocks"] == 4096
    assert kw["clock"].capacity["capped"] and kw["clock"].capacity["blocks"] > 4096
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kw = G.engine_kwargs(LLAMA_3_70B, H200, tp=8, gpu_memory_utilization=0.5, max_blocks=None)
    assert kw["num_blocks"] == G.kv_capacity(LLAMA_3_70B, H200, tp=8, gpu_memory_utilization=0.5)["blocks"]
    assert kw["clock"].tp == 8 and kw["clock"]() == 0.0


def test_clock_moves_only_by_advance():
    clock = G.ModeledClock(LLAMA_3_8B, H100, start=5.0)
    assert clock() == clock() == 5.0
    st = clock.advance(Composition.decode_batch(4, 10))
    assert clock() == 5.0 + st.time_s and clock.steps == [st]
    with pytest.raises(ValueError):
        Composition(prefills=((0, 3),))
    clock.advance_to(1.0)  # idle time never moves the clock back
    assert clock() == 5.0 + st.time_s and len(clock.steps) == 1
    clock.advance_to(100.0)
    assert clock() == 100.0 and len(clock.steps) == 1


# ---------------------------------------------------------------- the engine on the modeled clock


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 2000, (n,), generator=g).tolist() for n in lengths]


LENGTHS, MAX_TOKENS = (40, 17, 64, 9), (12, 20, 8, 16)


def _run(llm):
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in MAX_TOKENS]
    return llm.generate(_prompts(LENGTHS), params)


@pytest.fixture(scope="module")
def modeled_run():
    with pytest.warns(UserWarning, match="capped"):
        kw = G.engine_kwargs(LLAMA_3_8B, H100)
    llm = LLM(TARGET, max_num_seqs=4, max_num_batched_tokens=64, **kw)
    return llm, kw["clock"], _run(llm)


def test_modeled_clock_gives_the_wall_clock_runs_tokens(modeled_run):
    _, _, outs = modeled_run
    wall = _run(LLM(TARGET, max_num_seqs=4, max_num_batched_tokens=64))
    assert [o.token_ids for o in outs] == [o.token_ids for o in wall]


def test_each_step_costs_step_time_of_its_composition(modeled_run):
    llm, clock, _ = modeled_run
    stats = llm.engine.step_stats
    assert len(stats) == len(clock.steps) > 0
    elapsed = 0.0
    for stat, st in zip(stats, clock.steps):
        assert st.time_s == step_time(LLAMA_3_8B, H100, st.composition).time_s
        assert stat.wall_time == pytest.approx(st.time_s, rel=1e-9)
        assert stat.start_time == pytest.approx(elapsed, abs=1e-12)
        # The composition is what the kernels run; StepStats count by phase, where a prompt's one-token last
        # chunk (run by the decode kernel) is prefill. Same tokens either way; no draft tokens here, so the
        # kernels' prefill tokens are at most the prefill phase's.
        assert st.composition.num_tokens == stat.num_prefill_tokens + stat.num_decode_tokens
        assert st.composition.num_prefill_tokens <= stat.num_prefill_tokens
        elapsed += st.time_s
    assert clock() == pytest.approx(elapsed)
    assert any(st.composition.prefills and st.composition.decodes for st in clock.steps), "no mixed step"


def test_ttft_and_tpot_come_out_in_modeled_h100_seconds(modeled_run):
    _, clock, outs = modeled_run
    for o in outs:
        m = o.metrics
        ttft = m.first_token_time - m.arrival_time
        tpot = (m.finish_time - m.first_token_time) / (len(o.token_ids) - 1)
        assert 5e-3 < ttft < 0.1  # one to a few steps of ~6 ms
        assert 5e-3 < tpot < 8e-3, f"TPOT {tpot * 1e3:.2f} ms: Llama-3-8B weights over H100 bandwidth is ~5.4 ms"
        assert all(4e-3 < b - a < 12e-3 for a, b in zip(m.token_times, m.token_times[1:]))  # ITL


def test_replay_skips_idle_gaps_on_the_modeled_clock():
    """A 1000 s gap between two arrivals: on the modeled clock replay jumps over it (it would wait forever, or
    sleep 1000 s of wall time); the second request is served from its arrival, so its TTFT is one prefill step."""
    import time

    from reference_engine.sim.replay import replay
    from reference_engine.sim.trace import Request
    with pytest.warns(UserWarning, match="capped"):
        kw = G.engine_kwargs(LLAMA_3_8B, H100, max_blocks=256)
    llm = LLM(TARGET, max_num_seqs=4, max_num_batched_tokens=64, **kw)
    reqs = [Request(arrival=0.0, prompt_tokens=20, output_tokens=3), Request(arrival=1000.0, prompt_tokens=20,
                                                                            output_tokens=3)]
    start = time.perf_counter()
    outs, t0, span = replay(llm.engine, reqs, _prompts([20, 20]))
    assert time.perf_counter() - start < 60 and span > 1000
    second = outs[1].metrics
    assert second.arrival_time == t0 + 1000.0
    assert second.first_token_time - second.arrival_time == pytest.approx(kw["clock"].steps[3].time_s)


def test_single_request_compositions_are_prefill_then_growing_decodes():
    with pytest.warns(UserWarning):
        kw = G.engine_kwargs(LLAMA_3_8B, H100, max_blocks=64)
    llm = LLM(TARGET, **kw)
    [out] = llm.generate(_prompts([30]), SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    comps = [st.composition for st in kw["clock"].steps]
    assert comps == [Composition(prefills=((30, 0),))] + [Composition(decodes=(30 + i,)) for i in range(5)]
    assert out.metrics.first_token_time - out.metrics.arrival_time == kw["clock"].steps[0].time_s


# ---------------------------------------------------------------- the CLI


def test_table_prints_regimes(capsys):
    assert G.main(["--chip", "H100", "--model", "llama-3-8b"]) == 0
    text = capsys.readouterr().out
    assert "Llama-3-8B on H100 SXM" in text and "Decode batch" in text and "Prefill chunk" in text
    rows = [line.split() for line in text.splitlines() if line[:6].strip().isdigit()]
    batch_1 = next(r for r in rows if r[0] == "1")
    assert batch_1[5:7] == ["memory", "memory"] and 5.0 < float(batch_1[1]) < 7.0
    assert any(r[5] == "compute" for r in rows)
    assert G.main(["--chip", "h200", "--model", "llama-3-70b", "--tp", "8"]) == 0
    assert "tp=8" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of --calibrate")
def test_calibrate_on_cpu_is_not_graded_here():
    r = subprocess.run([sys.executable, "-m", "reference_engine.sim.gpu_model", "--calibrate"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "not graded here: needs a CUDA GPU"


def test_calibrate_code_path_runs_on_small_shapes():
    """The timing code runs (on CPU here, scaled-down shapes); its values are only meaningful on a GPU."""
    tiny = G.ModelShape("tiny", 2, 4, 2, 16, 64, 128, 256)
    rows = G.calibrate(tiny, H100, context=32, batches=(1, 4), chunks=(8,), device="cpu", pool_bytes=1 << 16)
    assert [r["kernel"] for r in rows].count("attn_decode") == 2 and len(rows) == 3 * 4 + 2 + 1
    assert all(r["measured_s"] > 0 and r["modeled_s"] > 0 for r in rows)
    small = G.calibrate(tiny, H100, context=32, batches=(8,), chunks=(), device="cpu", budget_bytes=4 * 2 * 32 * 16 * 2 * 2)
    assert small[-1]["shape"].startswith("B=4 (of 8)")
    assert "meas/model" in G._calibration_text(rows, H100, "cpu")


def test_cli_rejects_a_model_that_does_not_fit():
    with pytest.raises(SystemExit) as e:
        G.main(["--model", "llama-3-70b"])
    assert e.value.code == 2


def test_modeled_chip_of_a_device_name():
    assert G._chip_of_device("NVIDIA H200", H100) is H200
    assert G._chip_of_device("NVIDIA GeForce RTX 4090", H100) is H100
