"""Lesson 16 beyond the shared tests: the solution against the engine's quantization code, the kernel against
a plain matmul, and the checks' wrong-answer variants against what the mutants compute."""
import torch

from autograder.checks import l16_quantization as checks
from reference_engine import quantization as Q
from solutions import l16_quantization as S


def _w(seed=0, N=16, K=256):
    return torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.03


def test_solution_int4_equals_the_engines_packing():
    w = _w()
    for sym in (True, False):
        qw = S.quantize_int4(w, 128, sym)
        q, scales, zeros = Q.quantize_groups(w, 4, 128, sym)
        assert torch.equal(qw.packed, Q.pack_int4(q)) and torch.equal(qw.scales, scales) and torch.equal(qw.zeros, zeros)
        torch.testing.assert_close(S.dequantize_int4(qw), Q.dequantize_groups(q, scales, zeros, 256, torch.float32))


def test_check_variant_without_changes_is_the_solution():
    w = checks._weight(torch.Generator().manual_seed(1), 4, 256, 128, outlier=True)
    for sym in (True, False):
        packed, scales, zeros = checks.int4_variant(w, 128, sym)
        exp = S.quantize_int4(w, 128, sym)
        assert torch.equal(packed, exp.packed) and torch.equal(scales, exp.scales) and torch.equal(zeros, exp.zeros)
    x = checks._activations(torch.Generator().manual_seed(2), 5, 32)
    for per_token in (True, False):
        q, s = checks.fp8_variant(x, per_token)
        eq, es = S.quantize_fp8(x, per_token)
        assert torch.equal(q.view(torch.uint8), eq.view(torch.uint8)) and torch.equal(s, es)


def test_kernel_equals_dequantized_matmul_and_handles_ragged_tiles():
    qw = S.quantize_int4(_w(3, N=40, K=64), 32, False)
    x = torch.randn(17, 64)
    torch.testing.assert_close(S.w4a16_matmul(x, qw), x @ S.dequantize_int4(qw).T, rtol=1e-5, atol=1e-5)


def test_fp8_kv_write_read_round_trip_and_untouched_slots():
    k = torch.randn(4, 2, 16) * 5
    slots = torch.tensor([7, 1, 3, 9])
    cache, scales = torch.zeros(12, 2, 16, dtype=torch.float8_e4m3fn), torch.zeros(12, 2)
    S.fp8_kv_write(k, slots, cache, scales)
    back = S.fp8_kv_read(cache, scales, slots)
    assert ((back - k).abs() <= k.abs().amax(-1, keepdim=True) / 448 * 16 + 1e-6).all()  # within one E4M3 step
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[slots] = False
    assert (scales[untouched] == 0).all() and (cache.view(torch.uint8)[untouched] == 0).all()


def test_bottleneck_and_choice_follow_the_roofline():
    chip = checks.H100
    ridge = chip["flops"] / chip["bandwidth"]
    assert S.bottleneck(checks._workload(int(ridge) - 1), chip) == "memory"
    assert S.bottleneck(checks._workload(int(ridge) + 1), chip) == "compute"
    assert S.bottleneck(checks._workload(int(ridge) // 2 + 1, weight_bytes=1), chip) == "compute"
    assert S.bottleneck(checks._workload(1, kv=2, free=1), chip) == "kv_capacity"
    assert [S.choose_method(b, {"fp8_tensor_cores": True}) for b in ("memory", "compute", "kv_capacity")] == \
        ["w4a16", "w8a8-fp8", "fp8-kv"]


def test_modeled_methods_order():
    """w4a16 is the fastest batch-1 decode and fp8 W8A8 the fastest large prefill on the modeled H100."""
    dec = {m: S.modeled_method(m, 1, "decode") for m in S.METHODS[:4] + ("bf16",) if m != "none"}
    pre = {m: S.modeled_method(m, 64, "prefill") for m in ("bf16", "w4a16", "w8a8-fp8")}
    assert min(dec, key=dec.get) == "w4a16" and min(pre, key=pre.get) == "w8a8-fp8"


def test_hand_made_weight_separates_each_int4_variant_the_check_names():
    """The hand-made case is what makes these mistakes show on every seed: each must change its output."""
    w = checks._hand_made_weight()
    for sym, changes in ((True, [{"fp32_scale": True}, {"rounding": checks._round_half_away}]),
                         (False, [{"rounding": checks._round_half_away}, {"clamp_zero": False}, {"clamp_codes": False}])):
        exp = S.quantize_int4(w, 16, sym)
        assert all(torch.equal(a, b) for a, b in zip(checks.int4_variant(w, 16, sym), exp[:3]))
        for kw in changes:
            got = checks.int4_variant(w, 16, sym, **kw)
            assert not all(torch.equal(a, b) for a, b in zip(got, exp[:3])), (sym, kw)


def test_bottleneck_variant_without_changes_is_the_solution_and_the_edge_cases_are_edges():
    chips = (checks.H100, checks.RIDGE_200)
    for tokens in (1, 8, 100, 150, 200, 256, 300, 2048):
        for wb in (2, 1, 0.5):
            for kv in (10e9, 40e9, 50e9):
                w, chip = checks._workload(tokens, wb, kv=kv, free=40e9), chips[tokens in (100, 200)]
                assert checks.bottleneck_variant(w, chip) == S.bottleneck(w, chip)
    at_ridge = checks._workload(200, 2)
    assert 2 * 200 / 2 == checks.RIDGE_200["flops"] / checks.RIDGE_200["bandwidth"]
    assert S.bottleneck(at_ridge, checks.RIDGE_200) == "compute"
    assert checks.bottleneck_variant(at_ridge, checks.RIDGE_200, memory_at_ridge=True) == "memory"
    assert S.bottleneck(checks._workload(1, kv=40e9, free=40e9), checks.H100) == "memory"


def test_static_scale_saturates_and_the_visible_static_cases_reach_the_nan_range():
    """A static scale leaves values past 448 x scale: they must saturate (the clamp), and the visible static cases
    must reach |x / scale| >= 480, where a cast without a clamp gives NaN before PyTorch 2.12."""
    x = checks._activations(torch.Generator().manual_seed(4), 6, 32)
    for per_token in (False, True):
        scale = checks._static_scale(x, per_token)
        q, s = S.quantize_fp8(x, per_token, scale)
        assert torch.equal(s, scale.float()) and not q.float().isnan().any()
        assert q.float().abs().max() == 448.0
        assert ((x / scale).abs() >= 480).any(), per_token
    q, s = S.quantize_fp8(x, True)
    assert torch.equal(S.quantize_fp8(x, True, s)[0].view(torch.uint8), q.view(torch.uint8))  # static = dynamic's own


def test_named_fp8_and_int4_mistakes_differ_from_the_solution_on_the_visible_data():
    x = checks._activations(torch.Generator().manual_seed(5), 6, 32)
    for per_token, changes in ((False, ({"fmax": 240.0},)), (True, ({"fmax": 240.0}, {"signed_max": True}))):
        exp_s = S.quantize_fp8(x, per_token)[1]  # per tensor, the +3000 outlier is both the max and the amax
        for kw in changes:
            assert not torch.equal(checks.fp8_variant(x, per_token, **kw)[1], exp_s), kw
    assert torch.finfo(torch.float8_e4m3fnuz).max == 240.0 and torch.finfo(torch.float8_e4m3fn).max == 448.0
    w = checks._weight(torch.Generator().manual_seed(6), 8, 256, 128, outlier=True)
    assert not torch.equal(checks.int4_variant(w, 128, True, signed_max=True)[1], S.quantize_int4(w, 128, True).scales)
    qw = S.quantize_int4(w, 128, False)
    assert not torch.equal(checks.dequant_tiled(qw, torch.float32), S.dequantize_int4(qw))
    one_group = S.quantize_int4(w[:, :128], 128, False)  # one group per row: tiling changes nothing
    assert torch.equal(checks.dequant_tiled(one_group, torch.float32), S.dequantize_int4(one_group))


def test_compute_bound_choice_prefers_fp8_then_int8_then_none():
    assert S.choose_method("compute", {"fp8_tensor_cores": True, "int8_tensor_cores": True}) == "w8a8-fp8"
    assert S.choose_method("compute", {"fp8_tensor_cores": False, "int8_tensor_cores": True}) == "w8a8-int8"
    assert S.choose_method("compute", {"fp8_tensor_cores": False}) == "none"
    assert "none" in checks.method_mistakes("compute", {"int8_tensor_cores": True}).values()
    assert S.modeled_method("w8a8-int8", 64, "prefill", chip_name="A100") < S.modeled_method("bf16", 64, "prefill",
                                                                                           chip_name="A100")


def test_the_timing_harness_packs_the_weight_as_the_solution_does():
    from autograder.harnesses.l16_quantization import timing_inputs

    x, qw, wb = timing_inputs(3, "cpu", n=32, k=256, m=4)
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(32, 256, generator=gen) * 0.02
    exp = S.quantize_int4(w, 128, False)
    assert torch.equal(qw.packed, exp.packed) and torch.equal(qw.scales, exp.scales) and torch.equal(qw.zeros, exp.zeros)
    assert x.dtype == wb.dtype == torch.bfloat16 and torch.equal(wb, w.bfloat16())
