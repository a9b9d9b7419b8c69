"""Lesson 02: the reference answers against independent sources, and the lesson's files in shape."""
import random
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

from autograder.checks import _attention
from autograder.checks import l02_kv_cache as checks
from autograder.core import load_checks
from autograder.runner import Target, grade_lesson
from solutions import l02_kv_cache as sol

STEM = "l02_kv_cache"
NOTEBOOK = Path(__file__).resolve().parent.parent / "lessons" / f"{STEM}.ipynb"


# -- bytes per token ----------------------------------------------------------------------------

@pytest.mark.parametrize("cfg,expected", [
    (checks.LLAMA_3_70B, 327_680),   # reference-facts.md: 320 KiB
    (checks.LLAMA_3_8B, 131_072),
    ({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
      "hidden_size": 4096}, 131_072),  # Mistral-7B-v0.1
])
def test_bf16_bytes_per_token_match_the_published_table(cfg, expected):
    assert sol.kv_bytes_per_token(cfg, "bfloat16") == expected


def test_config_defaults():
    base = {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512}   # 512 // 8 = 64
    assert sol.kv_bytes_per_token(base, 1) == 2 * 2 * 8 * 64                       # MHA when missing
    assert sol.kv_bytes_per_token(dict(base, num_key_value_heads=None), 1) == 2 * 2 * 8 * 64
    assert sol.kv_bytes_per_token(dict(base, num_key_value_heads=2), 1) == 2 * 2 * 2 * 64
    assert sol.kv_bytes_per_token(dict(base, head_dim=None), 1) == 2 * 2 * 8 * 64
    assert sol.kv_bytes_per_token(dict(base, head_dim=128), 1) == 2 * 2 * 8 * 128  # explicit wins


def test_dtype_bytes_names_widths_and_errors():
    assert [sol.dtype_bytes(x) for x in ("BF16", "float16", "fp8_e5m2", "FP32", 2, torch.float8_e4m3fn)] \
        == [2, 2, 1, 4, 2, 1]
    for bad in ("int3", 16, "bits"):
        with pytest.raises(ValueError):
            sol.dtype_bytes(bad)


def test_users_round_down_and_never_go_negative():
    per = sol.kv_cache_bytes(checks.LLAMA_3_70B, "bfloat16", 1, 8192)
    assert per == 8192 * 327_680
    assert [sol.max_users(checks.LLAMA_3_70B, "bfloat16", 8192, f) for f in (5 * per, 5 * per - 1, -1e9)] \
        == [5, 4, 0]
    assert sol.users_per_gpu(checks.LLAMA_3_70B, 70.55e9, 8192, 141e9, "bfloat16", "bfloat16") == 0


# -- attention ----------------------------------------------------------------------------------

def _random_shapes(n, seed):
    rng = random.Random(seed)
    for _ in range(n):
        H_kv, g = rng.randint(1, 4), rng.choice([1, 2, 4, 8])
        S = rng.randint(1, 40)
        yield rng.randint(1, S), S, H_kv * g, H_kv, rng.choice([4, 16, 64])


def _lower_right_sdpa(q, k, v):
    """An independent reference: torch's own end-aligned causal bias."""
    from torch.nn.attention.bias import causal_lower_right  # imports triton: after the course set it up
    T, H, _ = q.shape
    S, H_kv, _ = k.shape
    g = H // H_kv
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1), v.repeat_interleave(g, 1).transpose(0, 1),
        attn_mask=causal_lower_right(T, S))
    return out.transpose(0, 1)


@pytest.mark.parametrize("T,S,H,H_kv,D", list(_random_shapes(12, seed=2)))
def test_decode_attention_and_the_checks_reference_agree_with_torch(T, S, H, H_kv, D):
    g = torch.Generator().manual_seed(T * 1000 + S)
    q, k, v = torch.randn(T, H, D, generator=g), torch.randn(S, H_kv, D, generator=g), torch.randn(S, H_kv, D, generator=g)
    truth = _lower_right_sdpa(q, k, v)
    torch.testing.assert_close(sol.decode_attention(q, k, v), truth, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(checks.sdpa_reference(q, k, v), truth, rtol=1e-4, atol=1e-5)
    # every named mistake must be a different answer, or the check could name a right one
    for name, wrong in checks.attention_mistakes(q, k, v).items():
        if "over heads" in name and H == 1:
            continue
        assert not torch.allclose(wrong, truth, rtol=1e-4, atol=1e-5), name


def test_sdpa_is_causal_is_top_left_so_the_lesson_builds_its_own_mask():
    q, k = torch.randn(1, 3, 8), torch.randn(1, 8, 8)
    top_left = torch.ones(3, 8, dtype=torch.bool).tril()
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, k, is_causal=True),
                               F.scaled_dot_product_attention(q, k, k, attn_mask=top_left))


def test_cached_decoding_equals_full_recompute():
    g = torch.Generator().manual_seed(0)
    layers, H, H_kv, D, steps = 2, 8, 2, 16, [7, 1, 1, 3, 1]
    n = sum(steps)
    q = torch.randn(layers, n, H, D, generator=g)
    k, v = torch.randn(layers, n, H_kv, D, generator=g), torch.randn(layers, n, H_kv, D, generator=g)
    cache = sol.KVCache(layers, n, H_kv, D)
    outs = [[] for _ in range(layers)]
    start = 0
    for s in steps:
        for layer in range(layers):
            sl = slice(start, start + s)
            outs[layer].append(cache.attend(layer, q[layer, sl], k[layer, sl], v[layer, sl]))
        start += s
    for layer in range(layers):
        full = F.scaled_dot_product_attention(
            q[layer].transpose(0, 1), k[layer].repeat_interleave(H // H_kv, 1).transpose(0, 1),
            v[layer].repeat_interleave(H // H_kv, 1).transpose(0, 1), is_causal=True).transpose(0, 1)
        torch.testing.assert_close(torch.cat(outs[layer]), full, rtol=1e-4, atol=1e-5)
    assert cache.length(0) == cache.length(1) == n
    with pytest.raises(ValueError):
        cache.append(0, k[0, :1], v[0, :1])


# -- the lesson's files -------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 12345])
def test_solutions_earn_full_marks(seed):
    res = grade_lesson(STEM, Target.for_lesson(STEM, solutions=True), seed)
    assert [(r.name, r.status) for r in res if r.status != "passed"] == []


def test_untouched_stubs_are_not_started():
    res = grade_lesson(STEM, Target.for_lesson(STEM), 0)
    assert {r.status for r in res} == {"not started"} and sum(r.earned for r in res) == 0


def test_notebook_is_clean_and_wired_to_every_check():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    roles = [c.metadata.get("course", {}) for c in code]
    assert roles[0].get("role") == "setup"
    assert {r["check"] for r in roles if r.get("role") == "check"} == {s.name for s in load_checks(STEM)}
    names = [n for r in roles if r.get("role") == "exercise" for n in r["names"]]
    assert all(hasattr(sol, n) for n in names) and len(names) == len(set(names))


def test_notebook_executes_on_the_solutions(monkeypatch):
    from nbclient import NotebookClient
    monkeypatch.setenv("COURSE_IMPL", "solutions")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "Finish exercise" not in text and "not started" not in text
    assert "327,680 bytes (320 KiB) in bf16" in text


def test_the_bf16_case_tells_attention_in_bf16_apart_on_every_seed():
    from autograder.compare import compare
    q, k, v = _attention.bf16_qkv(2)  # fixed: the same tensors on every seed
    exact = checks.sdpa_reference(q.float(), k.float(), v.float()).bfloat16()
    assert compare(sol.decode_attention(q, k, v), exact) is None
    assert compare(checks.attention_variant(q, k, v), exact) is not None


def test_shared_config_defaults_treat_null_as_absent():
    from autograder.checks import _configs
    s = _configs.shape(_configs.NULL_FIELDS_7B)
    assert (s.kv_heads, s.head_dim) == (32, 128) and _configs.null_fields(_configs.NULL_FIELDS_7B) == \
        ["num_key_value_heads", "head_dim"]
    assert sol.kv_bytes_per_token(_configs.NULL_FIELDS_7B, 2) == 2 * 32 * 32 * 128 * 2
    rng = random.Random(0)
    drawn = [_configs.random_config(rng) for _ in range(200)]
    for key in _configs.OPTIONAL:  # the random configs draw every form of each optional field
        assert {"absent", "null", "set"} == {"absent" if key not in c else "null" if c[key] is None else "set"
                                             for c in drawn}
    for c in drawn:
        s = _configs.shape(c)
        assert sol.kv_bytes_per_token(c, 1) == 2 * s.layers * s.kv_heads * s.head_dim
