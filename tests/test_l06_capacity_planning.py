"""Lesson 06 beyond the shared tests: the reference agrees with independent implementations
(transformers' Llama, vLLM's KV-head rule, a paged block allocator), and the notebook's claims hold."""
import math
import random

import pytest

from autograder.checks.l06_capacity_planning import LLAMA_1_7B, LLAMA_3_2_1B, MISTRAL_NEMO_12B, random_config, valid_tps
from solutions import l06_capacity_planning as S

H100, H200 = S.GPU_MEMORY_BYTES["H100 SXM"], S.GPU_MEMORY_BYTES["H200 SXM"]


def _hf_count(cfg: dict) -> int:
    """Parameters of transformers' own LlamaForCausalLM for this config, built without memory."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    fields = {k: v for k, v in cfg.items() if k not in ("model_type", "torch_dtype")}
    config = transformers.LlamaConfig(**fields)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    return sum(p.numel() for p in model.parameters())  # tied weights are one parameter


@pytest.mark.parametrize("cfg", [S.LLAMA_3_70B, S.LLAMA_3_8B, LLAMA_3_2_1B, MISTRAL_NEMO_12B, LLAMA_1_7B],
                         ids=["llama3-70b", "llama3-8b", "llama3.2-1b-tied", "mistral-nemo", "llama1-7b-mha"])
def test_param_count_matches_transformers_llama(cfg):
    assert S.param_count(cfg) == _hf_count(cfg)


def test_param_count_matches_transformers_on_random_shapes():
    rng = random.Random(6)
    for _ in range(6):
        cfg = random_config(rng)
        cfg["num_hidden_layers"] = min(cfg["num_hidden_layers"], 4)  # keep model construction fast
        assert S.param_count(cfg) == _hf_count(cfg), cfg


def test_headline_sizes_round_to_the_published_ones():
    # Model cards: "70B" / "8B" families, the hub lists 70.6B and 8.03B parameters.
    assert round(S.param_count(S.LLAMA_3_70B) / 1e9, 1) == 70.6
    assert round(S.param_count(S.LLAMA_3_8B) / 1e9, 2) == 8.03


def _vllm_kv_heads_per_rank(total_kv: int, tp: int) -> int:
    """vLLM QKVParallelLinear: one head (replicated) when tp >= kv heads, else an even split."""
    if tp >= total_kv:
        assert tp % total_kv == 0
        return 1
    assert total_kv % tp == 0
    return total_kv // tp


def test_kv_per_gpu_follows_vllms_head_rule_on_random_configs():
    rng = random.Random(0)
    for _ in range(200):
        cfg = random_config(rng)
        s = S.config_shape(cfg)
        for tp in valid_tps(cfg):
            per_rank = _vllm_kv_heads_per_rank(s["kv_heads"], tp)
            for dtype in ("bf16", "fp8"):
                expected = 2 * cfg["num_hidden_layers"] * per_rank * s["head_dim"] * S.DTYPE_BITS[dtype] // 8
                got = S.kv_bytes_per_token_per_gpu(cfg, dtype, tp)
                assert got == expected
                # The group as a whole never stores less than one copy of the cache.
                assert got * tp >= S.kv_bytes_per_token_per_gpu(cfg, dtype, 1)


def test_valid_tps_are_the_ones_vllm_accepts_for_llama_3_70b():
    assert valid_tps(S.LLAMA_3_70B) == [1, 2, 4, 8, 16, 32, 64]


def test_users_equal_a_paged_allocation_when_context_is_whole_blocks():
    """What the notebook claims: 16-token blocks give the same count for L a multiple of 16."""
    rng = random.Random(1)
    for _ in range(300):
        cfg = random_config(rng)
        tp = rng.choice(valid_tps(cfg))
        ctx = 16 * rng.randint(1, 8192)
        mem = rng.uniform(8, 200) * 1e9
        r = S.max_users(cfg, mem, tp, ctx, rng.choice(["bf16", "fp8"]), rng.choice(["bf16", "fp8"]),
                        rng.choice([0.8, 0.9, 0.95]), rng.choice([0.0, 1.0, 2.0]))
        if r["free_kv_bytes_per_gpu"] <= 0:
            assert r["users"] == 0 and r["reason"]
            continue
        blocks = math.floor(r["free_kv_bytes_per_gpu"] / (16 * r["kv_bytes_per_token_per_gpu"]))
        assert r["users"] == blocks // (ctx // 16)
        assert (r["reason"] is None) == (r["users"] > 0)


def test_users_move_the_right_way():
    rng = random.Random(2)
    for _ in range(100):
        cfg = random_config(rng)
        tp, ctx = rng.choice(valid_tps(cfg)), rng.randint(256, 65536)
        base = dict(gpu_mem_bytes=rng.uniform(20, 150) * 1e9, n_gpus=tp, context_len=ctx)
        u = S.max_users(cfg, **base)["users"]
        assert S.max_users(cfg, **{**base, "gpu_mem_bytes": base["gpu_mem_bytes"] * 1.5})["users"] >= u
        assert S.max_users(cfg, **{**base, "context_len": ctx * 2})["users"] <= u
        assert S.max_users(cfg, **base, kv_dtype="fp8")["users"] >= u
        assert S.max_users(cfg, **base, reserve_gib=4.0)["users"] <= u


def test_the_notebooks_claims():
    users = lambda mem, n, wd="bf16", kd="bf16", ctx=8192: S.max_users(S.LLAMA_3_70B, mem, n, ctx, wd, kd)  # noqa: E731
    assert users(H200, 1)["users"] == 0 and users(H200, 1)["free_kv_bytes_per_gpu"] < 0
    assert users(H200, 1, "fp8", "fp8")["users"] == 2 * users(H200, 1, "fp8", "bf16")["users"]
    two = users(H100, 2)
    assert two["users"] == 0 and -1e9 < two["free_kv_bytes_per_gpu"] < 0  # short by under a GB per GPU
    assert users(H100, 8)["users"] == 155  # the docstring's example
    assert users(H100, 4, "fp8", "fp8")["users"] > 2 * users(H100, 4)["users"]  # fp8 helps more than 2x
    assert users(H100, 8, ctx=131072)["users"] < 10
    # The split: past the KV-head count, replicas beat a bigger group; below it, a bigger group wins.
    assert users(H100, 16)["users"] < 2 * users(H100, 8)["users"]
    assert 2 * users(H100, 4)["users"] < users(H100, 8)["users"]
    r8 = S.max_users(S.LLAMA_3_8B, H100, 1, 8192)["users"]
    assert abs(r8 / users(H100, 8)["users"] - 1 / 3) < 0.05 and abs(r8 - users(H100, 4)["users"]) <= 2


def test_the_two_ways_no_user_fits_each_have_their_own_reason():
    # The check's visible cases hold both causes; each reason must name its own.
    w = S.max_users(S.LLAMA_3_70B, H200, 1, 8192)
    assert w["users"] == 0 and w["free_kv_bytes_per_gpu"] <= 0 and "weight" in w["reason"]
    c = S.max_users(S.LLAMA_3_70B, H100, 2, 1_048_576, "fp8", "bf16", 0.95, 1.0)
    assert c["users"] == 0 and c["free_kv_bytes_per_gpu"] > 0 and "sequence" in c["reason"]


def test_given_kv_helper_is_lesson_02s_formula():
    """kv_bytes_per_token (given, from the engine) equals lesson 02's graded answer on every config trap."""
    from solutions import l02_kv_cache as l02
    rng = random.Random(3)
    for cfg in [S.LLAMA_3_70B, S.LLAMA_3_8B, LLAMA_1_7B, MISTRAL_NEMO_12B] + [random_config(rng) for _ in range(200)]:
        for dtype in ("fp32", "bf16", "fp16", "fp8", "int8"):
            assert S.kv_bytes_per_token(cfg, dtype) == l02.kv_bytes_per_token(cfg, S.DTYPE_BITS[dtype] // 8), cfg
    with pytest.raises(ValueError, match="whole bytes"):
        S.kv_bytes_per_token(S.LLAMA_3_8B, "int4")
