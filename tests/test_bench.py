"""Smoke run of the benchmark on a tiny random model: fields exist and agree with each other."""

import json
import math
from pathlib import Path

import pytest
import torch

from reference_engine.sim import trace as tr
from reference_engine.tools import bench
from reference_engine.tools import train as T

pytest.importorskip("transformers")

TINY = T.LlamaArgs(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tok = T.train_tokenizer([Path(T.__file__).read_text()], vocab_size=300)
    torch.manual_seed(0)
    T.save_checkpoint(T.Llama(TINY), tok, d)
    return d


def _engine_available():
    try:
        from reference_engine import LLM  # noqa: F401
        return True
    except ImportError:
        return False


def _check_system(s, want_tokens):
    assert s["requests"] == 8 and s["output_tokens"] == want_tokens
    assert s["tokens_per_s"] == pytest.approx(s["output_tokens"] / s["wall_s"])
    assert 0 < s["ttft_p50_s"] <= s["ttft_p99_s"]
    assert 0 < s["tpot_p50_s"] <= s["tpot_p99_s"]


def test_workload_is_scaled_and_seeded():
    reqs, prompts = bench.build_workload("code", 12, 5.0, 3, 128, 300, (0,))
    assert [len(p) for p in prompts] == [r.prompt_tokens for r in reqs]
    assert all(r.prompt_tokens + r.output_tokens <= 128 for r in reqs)
    assert tr.rate(reqs) == pytest.approx(5.0)
    assert (reqs, prompts) == bench.build_workload("code", 12, 5.0, 3, 128, 300, (0,))


def test_timing_metrics():
    t = bench.Timing(arrival=1.0, first_token=1.5, finish=3.5, output_tokens=5, token_ids=[1] * 5)
    assert t.ttft == pytest.approx(0.5) and t.tpot == pytest.approx(0.5)
    assert bench.Timing(0.0, 0.2, 0.2, 1, [1]).tpot is None


def test_hf_static_batches_match_unbatched(tiny_model):
    """Left padding + truncation gives each request what it would get alone."""
    model = bench.load_hf(tiny_model)
    reqs = [tr.Request(0.0, 5, 3), tr.Request(0.0, 17, 9), tr.Request(0.0, 2, 1)]
    prompts = tr.prompt_token_ids(reqs, 300, seed=0)
    timings, wall = bench.run_hf(model, reqs, prompts, max_batch=3, pad_id=0)
    assert [t.output_tokens for t in timings] == [3, 9, 1]
    assert len({t.first_token for t in timings}) == 1  # one batch: one first decoding step
    ours = T.load_checkpoint(tiny_model)
    for r, p, t in zip(reqs, prompts, timings):
        assert t.token_ids == T.greedy(ours, p, r.output_tokens)[len(p):]
        assert t.arrival <= t.first_token <= t.finish <= wall


def test_hf_batches_wait_for_arrivals(tiny_model):
    model = bench.load_hf(tiny_model)
    reqs = [tr.Request(0.0, 4, 2), tr.Request(0.3, 4, 2)]
    timings, _ = bench.run_hf(model, reqs, [[1] * 4, [2] * 4], max_batch=2, pad_id=0)
    # the batch cannot start before its last member arrives
    assert min(t.first_token for t in timings) >= 0.3
    assert timings[0].ttft - timings[1].ttft == pytest.approx(0.3)  # same batch, same first token


def test_bench_json_fields(tiny_model, tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--model", str(tiny_model), "--trace", "conv", "--num-requests", "8", "--rate", "50",
            "--seed", "1", "--max-batch", "4", "--json", str(out)]
    if not _engine_available():
        argv.append("--skip-engine")
    bench.main(argv)
    r = json.loads(out.read_text())
    want = r["workload"]["requests"] * r["workload"]["output_tokens_mean"]
    assert r["torch_threads"] == 1 and r["max_context"] == 128 and r["rate_rps"] == 50
    _check_system(r["hf"], round(want))
    if not _engine_available():
        pytest.skip("engine half not importable; HF half checked")
    _check_system(r["engine"], round(want))
    assert r["speedup_vs_hf"] == pytest.approx(r["engine"]["tokens_per_s"] / r["hf"]["tokens_per_s"])
    # same greedy model on both sides
    assert r["greedy_outputs_identical"] == 1.0
    assert math.isfinite(r["speedup_vs_hf"]) and r["speedup_vs_hf"] > 0


def test_offline_json_is_strict(tiny_model, tmp_path):
    out = tmp_path / "offline.json"
    bench.main(["--model", str(tiny_model), "--num-requests", "3", "--max-batch", "2",
                "--skip-engine", "--json", str(out)])
    r = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert r["rate_rps"] is None and r["arrivals"].startswith("all at t=0")
    assert r["hf"]["output_tokens"] == round(3 * r["workload"]["output_tokens_mean"])


def test_profile_says_where_the_engines_step_time_goes(tiny_model, capsys):
    if not _engine_available():
        pytest.skip("engine not importable")
    r = bench.main(["--model", str(tiny_model), "--num-requests", "4", "--max-batch", "2", "--skip-hf", "--profile"])
    p = r["engine_profile"]
    assert p["steps"] > 0 and 0 < p["kernel_share"] < 1 and 0 < p["forward_share"] <= 1
    assert p["top_ops"][0][0].startswith("aten::")
    assert "of step time in the model's forward" in capsys.readouterr().out
