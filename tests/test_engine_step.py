"""The engine in vLLM v1's step shape: EngineConfig (engine_config.py) -> parts; step() = schedule ->
execute -> sample/verify -> Scheduler.update_from_output, which alone edits the queues and the sequences'
bookkeeping (forks, speculative rollback, aborts, disaggregation's received requests included)."""
import itertools

import pytest

from reference_engine import LLMEngine, SamplingParams
from reference_engine.block_manager import BlockAllocator, BlockManager
from reference_engine.engine_config import EngineConfig, SchedulerConfig
from reference_engine.scheduler import SampledTokens, SamplerOutput, Scheduler
from reference_engine.sequence import RequestMetrics, Sequence, Status
from reference_engine.shipped import TARGET

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _scheduler(num_blocks=16, block_size=4, max_seq_len=64):
    ticks = itertools.count()
    cfg = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_seq_len=max_seq_len),
                       clock=lambda: float(next(ticks)))
    return Scheduler(cfg, BlockManager(BlockAllocator(num_blocks), block_size, num_blocks), eos_token_ids=[0])


def _seq(i, n_prompt, **params):
    return Sequence(i, f"r{i}", list(range(1, n_prompt + 1)), SamplingParams(temperature=0, **params), RequestMetrics(0.0),
                    stop_ids=frozenset({0}))  # as the engine gives it: token 0 is EOS


def test_update_from_output_applies_the_step():
    sched = _scheduler()
    a, b = _seq(0, 6, max_tokens=2), _seq(1, 3, max_tokens=5)
    sched.add(a)
    sched.add(b)
    so = sched.schedule(now=7.0)
    assert [s.num_tokens for s in so.prefills] == [6, 3] and a.metrics.first_scheduled_time == 7.0
    outs = sched.update_from_output(so, SamplerOutput(sampled=[SampledTokens(a, [11]), SampledTokens(b, [0])]))
    assert (a.num_computed_tokens, a.token_ids[-1], a.status) == (6, 11, Status.RUNNING)
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outs] == [("r0", [11], None), ("r1", [0], "stop")]
    assert b.status is Status.FINISHED and not b.block_table and sched.running == [a]  # EOS: finished, blocks freed
    so = sched.schedule(now=8.0)
    [out] = sched.update_from_output(so, SamplerOutput(sampled=[SampledTokens(a, [12])]))
    assert out.finish_reason == "length" and out.text is None and not sched.has_unfinished()
    assert sched.bm.num_free() == 16


def test_rollback_keeps_the_kept_drafts_and_frees_the_blocks_past_them():
    sched = _scheduler()
    seq = _seq(0, 7, max_tokens=20)
    sched.add(seq)
    sched.update_from_output(so := sched.schedule(0.0), SamplerOutput(sampled=[SampledTokens(seq, [9])]))
    seq.token_ids += [21, 22, 23, 24]  # four drafts after the sampled 9
    seq.num_logits = 5
    so = sched.schedule(1.0)
    assert [s.num_tokens for s in so.prefills] == [5] and len(seq.block_table) == 3  # 12 tokens, blocks of 4
    outs = sched.update_from_output(so, SamplerOutput(verified=[SampledTokens(seq, [21, 30], num_drafts=4)]))
    assert outs[0].new_token_ids == [21, 30] and seq.token_ids[7:] == [9, 21, 30]
    assert seq.num_computed_tokens == 9 and len(seq.block_table) == 3 and seq.num_logits == 1
    seq.token_ids += [40, 41, 42, 43, 44, 45]
    seq.num_logits = 7
    so = sched.schedule(2.0)
    assert len(seq.block_table) == 4  # 16 tokens
    sched.update_from_output(so, SamplerOutput(verified=[SampledTokens(seq, [31], num_drafts=6)]))
    assert seq.token_ids[7:] == [9, 21, 30, 31] and seq.num_computed_tokens == 10 and len(seq.block_table) == 3
    sched.preempt(seq)
    seq.token_ids += [50]
    sched.rollback(seq, 1)  # a waiting sequence only loses the tokens
    assert seq.num_tokens == 11 and seq.num_computed_tokens == 0 and not seq.block_table


def test_received_requests_and_aborts_are_scheduler_operations():
    sched = _scheduler(num_blocks=3)
    seq = _seq(0, 9, max_tokens=3)
    assert sched.allocate_received(seq) and len(seq.block_table) == 3 and not sched.running and not sched.waiting
    assert not sched.allocate_received(_seq(1, 2))  # no block left
    out = sched.add_received(seq, 5)
    assert sched.running == [seq] and seq.num_computed_tokens == 9 and out.new_token_ids == [5] and not out.finished
    [ended] = sched.finish_request([seq], "abort")
    assert ended.finish_reason == "abort" and seq.status is Status.FINISHED and sched.bm.num_free() == 3


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(TARGET, dtype="float32")


def test_config_form_matches_the_keywords(engine):
    cfg = EngineConfig.from_kwargs(dtype="float32", block_size=8, max_num_seqs=4)
    by_config, by_kwargs = LLMEngine(TARGET, config=cfg), LLMEngine(TARGET, dtype="float32", block_size=8, max_num_seqs=4)
    assert by_config.engine_config == by_kwargs.engine_config and by_config.engine_config.resolved
    prompts = [[5, 6, 7, 8, 9], list(range(3, 40))]
    outs = [[o.token_ids for o in _generate(e, prompts)] for e in (by_config, by_kwargs, engine)]
    assert outs[0] == outs[1] == outs[2]
    assert (by_config.block_size, by_config.max_num_seqs, by_config.num_blocks) == (8, 4, by_config.engine_config.cache.num_blocks)
    with pytest.raises(TypeError, match="not both"):
        LLMEngine(TARGET, config=cfg, block_size=8)


def _generate(engine, prompts, params=GREEDY):
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o.output for o in engine.step() if o.output is not None})
    return [done[i] for i in ids]


def test_max_seq_len_is_the_schedulers(engine):
    assert engine.max_seq_len == engine.scheduler.max_seq_len == engine.engine_config.scheduler.max_seq_len
    e = LLMEngine(TARGET, dtype="float32", max_model_len=20)
    [out] = _generate(e, [[1, 2, 3]], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    assert len(out.token_ids) == 17 and out.finish_reason == "length"
    e.max_seq_len = 12  # lesson 17 lifts or sets it on a timing-only engine: the stop follows
    [out] = _generate(e, [[1, 2, 3]], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    assert len(out.token_ids) == 9


def test_a_modeled_clock_prices_each_step(engine):
    from reference_engine.sim.gpu_model import CHIPS, MODELS, ModeledClock

    clock = ModeledClock(MODELS["llama-3-8b"], CHIPS["H100"])
    e = LLMEngine(TARGET, dtype="float32", clock=clock)
    _generate(e, [[1, 2, 3, 4]])
    assert len(clock.steps) == len(e.step_stats) == GREEDY.max_tokens
    assert [s.forward_time for s in e.step_stats] == pytest.approx([st.time_s - st.overhead_s for st in clock.steps])
