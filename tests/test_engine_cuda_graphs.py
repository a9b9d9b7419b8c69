"""CUDA graphs for decode (reference_engine/cuda_graphs.py): one graph per batch bucket, inputs copied into static
buffers, padded rows on the null block, eager above the largest bucket and for steps with prefill rows.

On a machine without CUDA the capture itself cannot run: these tests swap in cuda_graphs.EagerReplay, which keeps
CUDAGraph's contract (static outputs refreshed by replay) by re-running the function, so what they show is the
bucketing, the static buffers and the padding; the capture is exercised by `python -m autograder.gpu_check` on a GPU.
"""
import pytest
import torch

from reference_engine import LLM, SamplingParams
from reference_engine import engine as engine_module
from reference_engine.cuda_graphs import EagerReplay, TorchCUDAGraph, capture_sizes
from reference_engine.engine_config import EngineConfig, EngineModelConfig
from reference_engine.shipped import TARGET

GREEDY = SamplingParams(temperature=0, ignore_eos=True)


def prompts(n):
    return [[(7 * i + j) % 500 + 3 for j in range(4 + (5 * i) % 23)] for i in range(n)]


def tokens(llm, ps, max_tokens):
    outs = llm.generate(ps, [SamplingParams(temperature=0, ignore_eos=True, max_tokens=max_tokens + i % 7)
                             for i in range(len(ps))])
    return [o.token_ids for o in outs]


@pytest.fixture
def graphs_on_cpu(monkeypatch):
    monkeypatch.setattr(engine_module, "cuda_graph_class", lambda cfg, backend: None if cfg.model.enforce_eager
                        else EagerReplay)


def test_capture_sizes_are_nano_vllms_buckets():
    assert capture_sizes(1) == [1]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert len(capture_sizes(512)) == 4 + 31 + 1


def test_replayed_decode_steps_give_the_eager_tokens(graphs_on_cpu):
    """19 requests in 20 slots finish at different steps, so decode batches shrink through every bucket and
    most replays pad (a batch of 13 runs the 16 graph): the tokens are the eager engine's."""
    ps = prompts(19)
    eager = tokens(LLM(TARGET, dtype="float32", max_num_seqs=20, enforce_eager=True), ps, 12)
    llm = LLM(TARGET, dtype="float32", max_num_seqs=20)
    runner = llm.engine.runner
    assert runner.graphs is not None and sorted(runner.graphs.graphs) == [1, 2, 4, 8, 16, 20]
    assert tokens(llm, ps, 12) == eager
    assert runner.graphs.replays > 10
    # the null block is one past the block manager's blocks: no sequence is ever given it
    assert runner.null_block == llm.engine.num_blocks and runner.k_cache.shape[1] == llm.engine.num_blocks + 1


def test_padded_rows_write_only_the_null_block(graphs_on_cpu):
    llm = LLM(TARGET, dtype="float32", max_num_seqs=8)
    runner = llm.engine.runner
    seen = []
    real_run = runner.graphs.run

    def spy(ids, pos, meta):
        out = real_run(ids, pos, meta)
        if out is not None:
            b = runner.graphs.bucket(ids.shape[0])
            seen.append((ids.shape[0], b, runner.graphs.slots[ids.shape[0]:b].tolist()))
        return out
    runner.graphs.run = spy
    tokens(llm, prompts(3), 5)  # 3 sequences: the 4 graph, one padded row
    null_slot = runner.null_block * runner.block_size
    assert any(n < b for n, b, _ in seen)
    assert all(slots == [null_slot] * (b - n) for n, b, slots in seen)


def test_batches_above_the_largest_graph_and_prefill_steps_run_eagerly(graphs_on_cpu):
    ps = prompts(8)
    eager = tokens(LLM(TARGET, dtype="float32", max_num_seqs=8, enforce_eager=True), ps, 6)
    llm = LLM(TARGET, dtype="float32", max_num_seqs=8, max_cudagraph_capture_size=4)
    graphs = llm.engine.runner.graphs
    assert sorted(graphs.graphs) == [1, 2, 4] and graphs.bucket(5) is None
    assert tokens(llm, ps, 6) == eager
    stats = llm.engine.step_stats
    decode_only = [s for s in stats if s.num_prefill_tokens == 0]
    assert graphs.replays == sum(1 for s in decode_only if s.num_decode_seqs <= 4) > 0
    assert any(s.num_decode_seqs > 4 for s in decode_only)  # those ran eagerly


def test_graphs_only_where_they_can_be_captured():
    """On CUDA with the Triton backend and one rank; never with enforce_eager, on CPU, or with a learner's backend."""
    from reference_engine.attention import TorchBackend

    class FakeTriton(engine_module.TritonBackend):
        def __init__(self):  # no kernels needed to decide
            pass

    def cfg(**kw):
        return EngineConfig(model=EngineModelConfig(**{"device": "cuda", "dtype": "float32", **kw}))
    assert engine_module.cuda_graph_class(cfg(), FakeTriton()) is TorchCUDAGraph
    assert engine_module.cuda_graph_class(cfg(enforce_eager=True), FakeTriton()) is None
    assert engine_module.cuda_graph_class(cfg(device="cpu"), FakeTriton()) is None
    assert engine_module.cuda_graph_class(cfg(), TorchBackend()) is None
    with pytest.raises(ValueError, match="max_cudagraph_capture_size"):
        EngineModelConfig(device="cpu", max_cudagraph_capture_size=0)
    assert LLM(TARGET, dtype=torch.float32).engine.runner.graphs is None  # CPU: eager, no null block
