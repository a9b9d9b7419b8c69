"""Run the reference engine with a learner's component plugged in, and report what a caller can observe.

Checks call these in the learner's process, through `t.run`:

    obs = t.run(engine_harness.run_engine, prompts, lens,
                llm_kwargs={"num_blocks": 8}, make={"scheduler_policy": (t.learner("StaticPolicy"), 4)},
                what="the engine, running your policy,")

and the same function here, in the grader, with the engine's own component for the expected run.
What comes back is plain data (token ids, the per-step schedule, the block pool at the end); the
grader judges it. Nothing here is trusted by the grader: it runs next to learner code.
"""
from __future__ import annotations

from pathlib import Path

TARGET = Path(__file__).resolve().parent.parent / "reference_engine" / "checkpoints" / "target"


def target_path() -> str:
    """The shipped target model's directory."""
    return str(TARGET)


def build_llm(llm_kwargs: dict | None = None, make: dict | None = None):
    """LLM(target, dtype=float32, **llm_kwargs), with each `make[name] = (factory, *args)` called first:
    make={"scheduler_policy": (StaticPolicy, 4)} passes StaticPolicy(4) as scheduler_policy."""
    import torch

    from reference_engine import LLM
    torch.set_num_threads(1)
    kwargs = dict(llm_kwargs or {})
    for name, (factory, *args) in (make or {}).items():
        kwargs[name] = factory(*args)
    kwargs.setdefault("dtype", torch.float32)
    return LLM(target_path(), **kwargs)


def consistency(engine) -> str | None:
    """None when every KV block is back in the pool with ref count 0 and nothing is queued; else why not."""
    try:
        engine.block_manager.check_consistency([])
    except Exception as e:  # noqa: BLE001 - the learner's allocator may raise anything here
        return f"KV blocks leaked or miscounted after the run: {e}"
    if engine.scheduler.has_unfinished():
        return "requests are still queued after every request finished"
    return None


def run_engine(prompts: list, max_tokens: list[int] | int, llm_kwargs: dict | None = None,
               make: dict | None = None, max_steps: int = 10_000) -> dict:
    """Greedy generation of `prompts` (token-id lists), EOS ignored, stepping at most `max_steps` times.

    Returns {"tokens": token ids per request (None if unfinished), "schedule": per step
    (prompts prefilled, prefill tokens, decodes, preemptions), "steps", "finished" (bool),
    "num_blocks", "free_blocks", "leak" (None or a message), "max_num_batched_tokens",
    "step_tokens": prefill + decode tokens per step}.
    """
    from reference_engine import SamplingParams
    llm = build_llm(llm_kwargs, make)
    engine = llm.engine
    lens = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    ids = [engine.add_request(list(p), SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
           for p, n in zip(prompts, lens)]
    done: dict = {}
    while engine.has_unfinished() and len(engine.step_stats) < max_steps:
        for out in engine.step():
            if out.output is not None:
                done[out.request_id] = list(out.output.token_ids)
    finished = not engine.has_unfinished()
    stats = engine.step_stats
    return {
        "tokens": [done.get(i) for i in ids],
        "schedule": [(s.num_prefill_seqs, s.num_prefill_tokens, s.num_decode_seqs, s.num_preempted) for s in stats],
        "step_tokens": [s.num_prefill_tokens + s.num_decode_tokens for s in stats],
        "steps": len(stats),
        "finished": finished,
        "num_blocks": engine.num_blocks,
        "free_blocks": engine.block_manager.num_free(),
        "leak": consistency(engine) if finished else None,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
    }
