"""Continuous batching, chunked prefill, preemption, parallel sampling, aborts, streaming, hooks."""
import itertools

import pytest
import torch

pytest.importorskip("transformers")

from reference_engine import LLM, LLMEngine, SamplingParams  # noqa: E402
from reference_engine.block_manager import BlockAllocator  # noqa: E402
from reference_engine.sampling import make_generator  # noqa: E402
from reference_engine.scheduler import FCFSPolicy  # noqa: E402
from reference_engine.tools.testing import save_tiny_model  # noqa: E402

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = save_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", seed=7, num_key_value_heads=2)
    return path


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 256, (n,), generator=g).tolist() for n in lengths]


LENGTHS, MAX_TOKENS = (3, 40, 17, 1, 64, 9), (12, 5, 20, 8, 15, 30)


def one_at_a_time(model_dir, ps, max_tokens):
    llm = LLM(model_dir, max_num_seqs=1, max_num_batched_tokens=256)
    return [llm.generate(p, SamplingParams(max_tokens=m, **GREEDY))[0].token_ids for p, m in zip(ps, max_tokens)]


@pytest.fixture(scope="module")
def reference(model_dir):
    ps = prompts(LENGTHS)
    return ps, one_at_a_time(model_dir, ps, MAX_TOKENS)


def run(llm, ps, max_tokens=MAX_TOKENS, **kw):
    return [o.token_ids for o in llm.generate(ps, [SamplingParams(max_tokens=m, **GREEDY, **kw) for m in max_tokens])]


def test_continuous_batching_equals_one_at_a_time(model_dir, reference):
    ps, ref = reference
    llm = LLM(model_dir, max_num_seqs=3, max_num_batched_tokens=256)  # requests join as others finish
    assert run(llm, ps) == ref
    stats = llm.engine.step_stats
    assert any(s.num_prefill_seqs and s.num_decode_seqs for s in stats), "no step mixed prefill and decode"
    assert max(s.num_running for s in stats) == 3


def test_chunked_prefill_equals_one_shot(model_dir, reference):
    ps, ref = reference
    llm = LLM(model_dir, max_num_seqs=4, max_num_batched_tokens=8)
    assert run(llm, ps) == ref
    stats = llm.engine.step_stats
    assert all(s.num_prefill_tokens + s.num_decode_tokens <= 8 for s in stats)
    assert sum(s.num_prefill_tokens for s in stats) == sum(LENGTHS)  # no preemption: each prompt token once


def test_chunked_prefill_gives_same_logits_as_one_shot_prefill(model_dir):
    [p] = prompts([45], seed=3)
    llm = LLM(model_dir, max_num_seqs=2, max_num_batched_tokens=4)  # 11 chunks of 4, then a last one of 1
    [out] = llm.generate(p, SamplingParams(max_tokens=6, logprobs=256, **GREEDY))
    assert [s.num_prefill_tokens for s in llm.engine.step_stats if s.num_prefill_tokens] == [4] * 11 + [1]
    one_shot = LLMEngine(model_dir, num_blocks=16).score(p + out.token_ids)
    for i, step_lp in enumerate(out.logprobs):  # generated token i came from position len(p) - 1 + i
        ref = torch.log_softmax(one_shot[len(p) - 1 + i], -1)
        got = torch.tensor([step_lp[t] for t in range(256)])
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_without_chunked_prefill_prompts_run_whole(model_dir, reference):
    ps, ref = reference
    # Budget 100 < the 134 prompt tokens: chunking would split the 64-token prompt; here it waits a step.
    llm = LLM(model_dir, max_num_seqs=6, num_blocks=32, max_model_len=100, enable_chunked_prefill=False,
              max_num_batched_tokens=100)
    assert run(llm, ps) == ref
    stats = [s for s in llm.engine.step_stats if s.num_prefill_seqs]
    assert sum(s.num_preempted for s in llm.engine.step_stats) == 0
    assert sum(s.num_prefill_seqs for s in stats) == len(LENGTHS)  # one prefill per prompt
    assert stats[0].num_prefill_tokens == 3 + 40 + 17 + 1 and len(stats) > 1
    with pytest.raises(ValueError, match="enable_chunked_prefill=False"):
        LLM(model_dir, max_model_len=100, enable_chunked_prefill=False, max_num_batched_tokens=64)


def test_preemption_by_recompute_keeps_greedy_output(model_dir, reference):
    ps, ref = reference
    llm = LLM(model_dir, num_blocks=7, block_size=16, max_num_seqs=4, max_num_batched_tokens=64)
    assert run(llm, ps) == ref
    stats = llm.engine.step_stats
    assert sum(s.num_preempted for s in stats) > 0, "the tiny cache should have forced preemption"
    assert max(s.blocks_used for s in stats) <= 7
    assert stats[-1].blocks_free == 7


def test_preemption_keeps_seeded_sampling(model_dir):
    ps = prompts(LENGTHS, seed=5)
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=m, ignore_eos=True) for i, m in enumerate(MAX_TOKENS)]
    roomy = LLM(model_dir, max_num_seqs=4).generate(ps, params)
    tight_llm = LLM(model_dir, num_blocks=7, max_num_seqs=4, max_num_batched_tokens=64)
    tight = tight_llm.generate(ps, params)
    assert sum(s.num_preempted for s in tight_llm.engine.step_stats) > 0
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]


def test_seeded_request_is_reproducible_alone_or_batched(model_dir):
    ps = prompts(LENGTHS, seed=6)
    sp = SamplingParams(temperature=1.0, top_k=50, seed=42, max_tokens=10, ignore_eos=True)
    llm = LLM(model_dir, max_num_seqs=4)
    alone = [llm.generate(ps[2], sp)[0].token_ids for _ in range(2)]
    batched = llm.generate(ps, [SamplingParams(temperature=1.0, max_tokens=10)] * 2 + [sp] + [SamplingParams(temperature=1.0)] * 3)
    assert alone[0] == alone[1] == batched[2].token_ids
    other_seed = llm.generate(ps[2], SamplingParams(temperature=1.0, top_k=50, seed=43, max_tokens=10, ignore_eos=True))
    assert other_seed[0].token_ids != alone[0]


def test_parallel_sampling_forks_share_prompt_blocks_copy_on_write(model_dir):
    [p] = prompts([21], seed=9)  # 21 tokens: the last prompt block is shared and partly filled
    kw = dict(temperature=1.0, seed=11, max_tokens=12, ignore_eos=True, logprobs=0)
    llm = LLM(model_dir, max_num_seqs=4)
    [out] = llm.generate(p, SamplingParams(n=3, **kw))
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    assert llm.engine.step_stats[0].blocks_used == 2  # prompt prefilled once
    # Each child must equal an independent request drawing from the same random stream; logprobs
    # catch a child reading a sibling's K/V even when the perturbed draw lands on the same token.
    for c in out.outputs:
        eng = LLMEngine(model_dir)
        rid = eng.add_request(p, SamplingParams(**kw))
        eng.requests[rid][0].generator = make_generator(11, c.index, eng.device)
        single = [o.output for o in itertools.chain.from_iterable(iter(eng.step, [])) if o.output]
        assert single[0].token_ids == c.token_ids, f"child {c.index} diverged: copy-on-write broken?"
        got = [lp[t] for lp, t in zip(c.logprobs, c.token_ids)]
        want = [lp[t] for lp, t in zip(single[0].logprobs, c.token_ids)]
        assert got == pytest.approx(want, abs=1e-5), f"child {c.index} saw other K/V: copy-on-write broken?"
    assert llm.engine.block_manager.num_free() == llm.engine.num_blocks


def test_parallel_greedy_samples_are_identical(model_dir, reference):
    ps, ref = reference
    [out] = LLM(model_dir).generate(ps[1], SamplingParams(n=2, max_tokens=MAX_TOKENS[1], **GREEDY))
    assert [c.token_ids for c in out.outputs] == [ref[1], ref[1]]


def test_abort_waiting_and_running_frees_blocks(model_dir):
    eng = LLMEngine(model_dir, max_num_seqs=1)
    a = eng.add_request(prompts([30])[0], SamplingParams(max_tokens=50, **GREEDY))
    b = eng.add_request(prompts([10])[0], SamplingParams(max_tokens=50, **GREEDY))
    eng.step()
    eng.step()
    assert eng.block_manager.num_free() < eng.num_blocks
    out_a = eng.abort(a)  # running
    out_b = eng.abort(b)  # still waiting (max_num_seqs=1)
    assert out_a.finish_reason == "abort" and len(out_a.token_ids) == 2
    assert out_b.finish_reason == "abort" and out_b.token_ids == []
    assert not eng.has_unfinished() and eng.block_manager.num_free() == eng.num_blocks
    assert eng.abort("no-such-request") is None


def test_timestamps_on_injected_clock(model_dir):
    ticks = itertools.count()
    eng = LLMEngine(model_dir, clock=lambda: float(next(ticks)))
    rid = eng.add_request(prompts([20])[0], SamplingParams(max_tokens=5, **GREEDY), arrival_time=-3.0)
    outs = [o for o in eng.stream([1, 2, 3], SamplingParams(max_tokens=2, **GREEDY))]
    while eng.has_unfinished():
        outs += eng.step()
    [final] = [o.output for o in outs if o.output and o.request_id == rid]
    m = final.metrics
    assert m.arrival_time == -3.0
    assert m.arrival_time < m.first_scheduled_time < m.first_token_time == m.token_times[0]
    assert len(m.token_times) == len(final.token_ids) == 5
    assert m.token_times == sorted(m.token_times) and len(set(m.token_times)) == 5  # one step per token
    assert m.finish_time == m.token_times[-1]


def test_stream_yields_deltas_that_add_up(model_dir, reference):
    ps, ref = reference
    eng = LLMEngine(model_dir)
    got, final = [], None
    for o in eng.stream(ps[2], SamplingParams(max_tokens=MAX_TOKENS[2], **GREEDY)):
        assert len(o.new_token_ids) == 1
        got += o.new_token_ids
        final = o
    assert got == ref[2] and final.finished and final.output.token_ids == ref[2]


def test_stream_ends_when_one_of_its_requests_is_aborted(model_dir, reference):
    """An aborted request finishes its stream: one last StepOutput, no new token, finish_reason "abort" (as vLLM
    reports it), carrying the RequestOutput; the stream's other request runs to the end."""
    ps, ref = reference
    eng = LLMEngine(model_dir)
    steps, step = itertools.count(), eng.step

    def bounded_step():  # a stream that never ends steps forever without yielding: fail instead of hanging
        assert next(steps) < 100, "stream() kept stepping after its requests had finished or been aborted"
        return step()

    eng.step = bounded_step
    stream = eng.stream([ps[0], ps[2]], SamplingParams(max_tokens=20, **GREEDY))
    outs = [next(stream), next(stream)]
    victim = outs[0].request_id
    eng.abort(victim)
    outs += stream
    last = [o for o in outs if o.request_id == victim][-1]
    assert last.finished and last.finish_reason == "abort" and last.new_token_ids == []
    assert last.output.finish_reason == "abort" and len(last.output.token_ids) == 1
    other = [o for o in outs if o.request_id != victim]
    assert other[-1].finish_reason == "length" and other[-1].output.token_ids == ref[2][:20]
    assert not eng.has_unfinished() and step() == []  # reported once


def test_abort_before_any_step_is_reported_by_the_next_step(model_dir):
    eng = LLMEngine(model_dir)
    rid = eng.add_request([1, 2, 3], SamplingParams(n=2, max_tokens=4, **GREEDY))
    out = eng.abort(rid)
    assert out.finish_reason == "abort" and out.token_ids == []
    [step_out] = eng.step()  # not forked yet: one sequence
    assert (step_out.request_id, step_out.finish_reason, step_out.output) == (rid, "abort", out)
    assert list(eng.stream([4, 5], SamplingParams(max_tokens=2, **GREEDY)))[-1].finish_reason == "length"


def test_a_one_token_last_prompt_chunk_counts_as_prefill(model_dir):
    """Budget 4, a 9-token prompt: chunks 4, 4 and 1. The last chunk runs in the decode kernel (one query token
    against cached context) but the sequence is still prefilling: StepStats count it as prefill."""
    llm = LLM(model_dir, max_num_seqs=2, max_num_batched_tokens=4)
    llm.generate(prompts([9])[0], SamplingParams(max_tokens=3, **GREEDY))
    stats = [(s.num_prefill_seqs, s.num_prefill_tokens, s.num_decode_seqs, s.num_decode_tokens)
             for s in llm.engine.step_stats]
    assert stats == [(1, 4, 0, 0), (1, 4, 0, 0), (1, 1, 0, 0), (0, 0, 1, 1), (0, 0, 1, 1)]


def test_a_recompute_after_preemption_counts_as_prefill(model_dir):
    """Two 2-token prompts decode until 6 blocks of 4 are full; the newer one is preempted and, once the other
    finishes, recomputes its 2 prompt + ~10 generated tokens in chunks of 4. Chunks past its prompt are still
    prefill (recompute), not decode: every decode step computes one token per sequence."""
    ps = prompts([2, 2], seed=11)
    llm = LLM(model_dir, num_blocks=6, block_size=4, max_num_seqs=2, max_num_batched_tokens=4)
    outs = run(llm, ps, max_tokens=(14, 14))
    assert outs == [one_at_a_time(model_dir, [p], [14])[0] for p in ps]
    stats = llm.engine.step_stats
    assert sum(s.num_preempted for s in stats) == 1
    assert all(s.num_decode_tokens == s.num_decode_seqs for s in stats)
    recompute = [s.num_prefill_tokens for s in stats[[s.num_preempted for s in stats].index(1) + 1:] if s.num_prefill_tokens]
    assert len(recompute) > 1 and sum(recompute) > 2  # chunked, and past the prompt


def test_stop_token_ends_with_stop(model_dir, reference):
    ps, ref = reference
    stop = ref[4][3]
    [out] = LLM(model_dir).generate(ps[4], SamplingParams(max_tokens=15, stop_token_ids=[stop], **GREEDY))
    assert out.finish_reason == "stop" and out.token_ids == ref[4][:ref[4].index(stop) + 1]


def test_generation_stops_at_context_limit(model_dir):
    llm = LLM(model_dir, max_model_len=40)
    [out] = llm.generate(prompts([30])[0], SamplingParams(max_tokens=100, **GREEDY))
    assert out.finish_reason == "length" and len(out.token_ids) == 10


def test_custom_scheduler_policy_is_used(model_dir, reference):
    class OneNewPerStep(FCFSPolicy):
        calls = 0

        def schedule(self, candidates, budget):
            OneNewPerStep.calls += 1
            picked, new = [], 0
            for seq, n in super().schedule(candidates, budget):
                new += seq.is_waiting
                if new > 1:
                    break
                picked.append((seq, n))
            return picked

    ps, ref = reference
    llm = LLM(model_dir, scheduler_policy=OneNewPerStep)
    assert run(llm, ps) == ref
    assert OneNewPerStep.calls > 0
    running = [s.num_running for s in llm.engine.step_stats]
    assert all(b - a <= 1 for a, b in zip([0] + running, running))


def test_broken_scheduler_policies_fail_loudly(model_dir):
    class OverBudget:
        def schedule(self, candidates, budget):
            return [(s, s.num_uncomputed_tokens) for s in candidates]

    class Idle:
        def schedule(self, candidates, budget):
            return []

    llm = LLM(model_dir, scheduler_policy=OverBudget(), max_num_batched_tokens=64)
    with pytest.raises(RuntimeError, match="max_num_batched_tokens"):
        llm.generate(prompts([50, 50]), SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="Idle admitted nothing.*never progress"):
        LLM(model_dir, scheduler_policy=Idle()).generate([1, 2, 3], SamplingParams(max_tokens=2))


class WaitingOnly(FCFSPolicy):
    """Never continues a prompt it started: only waiting candidates."""

    def schedule(self, candidates, budget):
        return super().schedule([s for s in candidates if s.is_waiting], budget)


class StaticNoChunk(FCFSPolicy):
    """Static batching that forgets started prompts: nothing at all while any slot is taken."""

    def schedule(self, candidates, budget):
        return super().schedule(candidates, budget) if budget.slots == 4 else []


@pytest.mark.parametrize("policy", [WaitingOnly, StaticNoChunk])
def test_policy_that_starves_a_started_prompt_raises_instead_of_spinning(model_dir, policy):
    """With chunked prefill, a prompt's next chunk that is never scheduled once nothing else runs used to
    be preempted and re-prefilled forever (a hung notebook); now the engine names the fault."""
    llm = LLM(model_dir, scheduler_policy=policy, max_num_seqs=4, max_num_batched_tokens=8)
    with pytest.raises(RuntimeError, match=f"{policy.__name__} starved a started prompt.*is_waiting False"):
        llm.generate(prompts([30, 5]), SamplingParams(max_tokens=3, **GREEDY))
    assert len(llm.engine.step_stats) < 10


class HalfEach(FCFSPolicy):
    """Starts two prompts at once, half the budget each: partly prefilled prompts can fill the cache."""

    def schedule(self, candidates, budget):
        picked, share = [], max(1, budget.tokens // 2)
        for seq in candidates:
            n = min(seq.num_uncomputed_tokens, share)
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
        return picked


def test_a_full_cache_still_preempts_instead_of_blaming_the_policy(model_dir):
    """Two half-prefilled prompts fill the cache and neither can grow: picking nothing is the cache's
    fault, so the newest is preempted (not an error)."""
    ps = prompts([60, 60], seed=4)
    llm = LLM(model_dir, scheduler_policy=HalfEach, num_blocks=5, block_size=16, max_num_seqs=2,
              max_num_batched_tokens=32)
    assert run(llm, ps, (4, 4)) == one_at_a_time(model_dir, ps, (4, 4))
    assert sum(s.num_preempted for s in llm.engine.step_stats) > 0


def test_custom_block_allocator_is_used(model_dir, reference):
    class Counting(BlockAllocator):
        allocs = 0

        def allocate(self):
            Counting.allocs += 1
            return super().allocate()

    ps, ref = reference
    llm = LLM(model_dir, block_allocator=Counting)
    assert run(llm, ps) == ref and Counting.allocs > 0
    assert isinstance(llm.engine.block_manager.allocator, Counting)


def test_triton_backend_matches_torch_backend(model_dir, reference):
    ps, ref = reference
    llm = LLM(model_dir, attention_backend="triton", max_num_seqs=4, max_num_batched_tokens=32)
    assert run(llm, ps[1:3], (5, 6)) == [ref[1][:5], ref[2][:6]]  # the interpreter is slow: keep it short
