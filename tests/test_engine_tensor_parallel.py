"""Tensor parallelism: LLM(model, tensor_parallel_size=N) shards the model over N worker processes
(gloo on CPU) and must produce exactly what one process produces; each rank's KV cache holds only its heads.

Each engine here starts N fresh interpreters (several seconds each on this machine), so the cases share
engines where they can."""
import json
import shutil

import pytest
import torch

from reference_engine import LLM, SamplingParams
from reference_engine.config import kv_bytes_per_token
from reference_engine.distributed import ShardSpec
from reference_engine.tools.testing import save_tiny_model
from solutions.l06_capacity_planning import kv_bytes_per_token_per_gpu

TARGET = "reference_engine/checkpoints/target"  # 8 query heads, 2 KV heads (GQA), intermediate 704
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _prompts(n=6):
    g = torch.Generator().manual_seed(0)  # lengths 3..70: some cross block boundaries, some span several chunks
    return [torch.randint(1, 2048, (int(L),), generator=g).tolist() for L in torch.linspace(3, 70, n).round()]


def _tokens(llm, prompts, params=GREEDY):
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]


# ---- the shard arithmetic --------------------------------------------------------------------------
def test_shard_ranges_split_heads_and_replicate_kv_heads_past_their_count():
    assert [ShardSpec(r, 2).kv_heads(2) for r in range(2)] == [range(0, 1), range(1, 2)]
    # 4 ranks, 2 KV heads: ranks 0,1 hold head 0 and ranks 2,3 head 1, the head their query heads use
    assert [ShardSpec(r, 4).kv_heads(2) for r in range(4)] == [range(0, 1)] * 2 + [range(1, 2)] * 2
    for r in range(4):
        s = ShardSpec(r, 4)
        q = s.heads(8)
        assert {h // (8 // 2) for h in q} == set(s.kv_heads(2)), "a rank's query heads must use its KV head"
    assert ShardSpec(3, 4).intermediate(704) == range(528, 704)
    assert ShardSpec(0, 4).kv_replicas(2) == 2 and ShardSpec(0, 2).kv_replicas(2) == 1


@pytest.mark.parametrize("size,heads,kv,inter,word", [(3, 8, 2, 704, "num_attention_heads"),
                                                       (2, 8, 2, 705, "intermediate_size"),
                                                       (4, 12, 3, 704, "num_key_value_heads")])
def test_shard_check_names_what_does_not_split(size, heads, kv, inter, word):
    with pytest.raises(ValueError, match=word):
        ShardSpec(0, size).check(heads, kv, inter)


def test_engine_rejects_a_size_the_model_cannot_split_before_starting_workers():
    with pytest.raises(ValueError, match="num_attention_heads=8 does not split across tensor_parallel_size=3"):
        LLM(TARGET, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive integer"):
        LLM(TARGET, tensor_parallel_size=0)


# ---- the engine -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def single():
    return LLM(TARGET, max_num_batched_tokens=64, num_blocks=24)


def test_tp2_matches_one_process_token_for_token_with_chunks_preemption_and_forks(single):
    """Small token budget (prompts arrive in chunks beside decodes), few blocks (sequences are preempted and
    recomputed), n=2 (forked sequences share blocks, then copy-on-write copies them on every rank)."""
    prompts = _prompts()
    forked = SamplingParams(temperature=0.8, seed=7, n=2, max_tokens=16, ignore_eos=True)
    want = _tokens(single, prompts), _tokens(single, prompts[:3], forked)
    llm = LLM(TARGET, tensor_parallel_size=2, max_num_batched_tokens=64, num_blocks=24)
    try:
        got = _tokens(llm, prompts), _tokens(llm, prompts[:3], forked)
        assert any(s.num_preempted for s in llm.engine.step_stats), "the case should preempt; make num_blocks smaller"
        stats = llm.engine.step_stats
        assert any(s.num_prefill_tokens and s.num_decode_tokens for s in stats), "the case should mix chunks and decodes"
    finally:
        llm.engine.shutdown()
    assert got == want


def test_tp4_replicates_kv_heads_and_each_rank_cache_matches_lesson_06(single):
    """4 ranks, 2 KV heads: each rank holds one whole head (2 ranks a head). The bytes a rank allocated equal
    num_blocks x block_size x lesson 06's per-GPU bytes per token."""
    prompts = _prompts(4)
    llm = LLM(TARGET, tensor_parallel_size=4, num_blocks=40)
    try:
        got = _tokens(llm, prompts)
        runner, eng = llm.engine.runner, llm.engine
    finally:
        llm.engine.shutdown()
    assert got == _tokens(single, prompts)
    config = json.loads(open(f"{TARGET}/config.json").read())
    per_gpu = kv_bytes_per_token_per_gpu(config, "fp32", 4)
    assert runner.kv_heads == [1, 1, 1, 1]
    assert runner.kv_cache_bytes == [eng.num_blocks * eng.block_size * per_gpu] * 4
    assert per_gpu == kv_bytes_per_token(eng.config, 4) // 2 == eng.kv_bytes_per_token_per_rank()


def test_tp2_with_an_fp8_cache_matches_one_process_with_one():
    """Per-tensor fp8 scales (1.0) quantize each element alone, so a rank's half of the heads rounds the same."""
    prompts = _prompts(3)
    want = _tokens(LLM(TARGET, kv_cache_dtype="fp8"), prompts)
    llm = LLM(TARGET, tensor_parallel_size=2, kv_cache_dtype="fp8")
    try:
        got = _tokens(llm, prompts)
        assert llm.engine.runner.kv_cache_bytes[0] == llm.engine.num_blocks * 16 * kv_bytes_per_token(llm.engine.config, 1) // 2
        assert llm.engine.init_times["tp_workers"] > 0  # the startup report's tp_workers phase
    finally:
        llm.engine.shutdown()
    assert got == want


def test_tp2_with_biases_everywhere_matches_one_process(tmp_path):
    """A model with q/k/v, o and MLP biases: column-parallel biases are sliced with their rows, row-parallel
    ones (o_proj, down_proj) are added once, by rank 0, after the all-reduce would have added them twice."""
    pytest.importorskip("transformers")  # save_tiny_model builds the model with it
    path, _ = save_tiny_model(tmp_path / "m", "llama", attention_bias=True, mlp_bias=True)
    prompts = [[5, 9, 200, 33, 17][: k] * 3 for k in (1, 3, 5)]
    want = _tokens(LLM(path), prompts)
    llm = LLM(path, tensor_parallel_size=2)
    try:
        assert _tokens(llm, prompts) == want
    finally:
        llm.engine.shutdown()


def test_a_worker_that_cannot_load_its_shard_raises_with_its_traceback(tmp_path):
    bad = tmp_path / "no_weights"
    bad.mkdir()
    shutil.copy(f"{TARGET}/config.json", bad / "config.json")  # the engine reads config.json; the workers fail
    with pytest.raises(RuntimeError, match=r"(?s)rank \d failed.*no \*\.safetensors weights"):
        LLM(bad, tensor_parallel_size=2)


def test_tp2_with_speculative_decoding_matches_one_process_with_it():
    """The draft model runs in the calling process and the target over the ranks: greedy speculative decoding
    emits exactly the target's tokens either way, and the ranks verify the same drafts one process does."""
    spec = {"model": "reference_engine/checkpoints/draft", "num_speculative_tokens": 3}
    prompts = _prompts(3)
    want = _tokens(LLM(TARGET, speculative_config=spec), prompts)
    llm = LLM(TARGET, tensor_parallel_size=2, speculative_config=spec)
    try:
        got = _tokens(llm, prompts)
    finally:
        llm.engine.shutdown()
    assert got == want
    assert got == _tokens(LLM(TARGET), prompts)  # greedy speculative decoding changes no token
