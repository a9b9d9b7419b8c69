"""Run the reference engine with a learner's component plugged in, and report what a caller can observe.

Learner side (autograder/harnesses/__init__.py): checks call these in the learner's process, through `t.run`:

    obs = t.run(engine.run_engine, prompts, lens,
                llm_kwargs={"num_blocks": 8}, make={"scheduler_policy": (t.learner("StaticPolicy"), 4)},
                what="the engine, running your policy,")

and the same function in the grader, with the engine's own component, for the expected run.
What comes back is plain data (token ids, the per-step schedule, the block pool at the end, and on
request every scheduler-policy call's inputs and picks); the grader judges it. Nothing here is
trusted by the grader: it runs next to learner code.

The grader's side (`stub_guard()`, "not started" before any engine is built; `stopped()`, a run that ended
in an error as a failure message that names the mistake when the engine's error reveals it; the engine's
refusals of a policy, POLICY_ERRORS; `step_bound()`) is autograder/checks/_engine.py.
"""
from __future__ import annotations

import dataclasses

from autograder.harnesses import harness
from reference_engine.shipped import DRAFT, TARGET


@harness
def target_path() -> str:
    """The shipped target model's directory."""
    return str(TARGET)


def build_llm(llm_kwargs: dict | None = None, make: dict | None = None, model: str = "target"):
    """LLM(model, dtype=float32, **llm_kwargs), with each `make[name] = (factory, *args)` called first:
    make={"scheduler_policy": (StaticPolicy, 4)} passes StaticPolicy(4) as scheduler_policy.

    model: "target" (the shipped 3.3M model) or "draft" (the 0.6M one, three times faster a step), for
    checks that judge the schedule, not the model: both sides of a comparison must use the same one."""
    import torch

    from reference_engine import LLM
    torch.set_num_threads(1)
    kwargs = dict(llm_kwargs or {})
    for name, (factory, *args) in (make or {}).items():
        kwargs[name] = factory(*args)
    kwargs.setdefault("dtype", torch.float32)
    return LLM(str({"target": TARGET, "draft": DRAFT}[model]), **kwargs)


def consistency(engine) -> str | None:
    """None when every KV block is back in the pool with ref count 0 and nothing is queued; else why not."""
    try:
        engine.block_manager.check_consistency([])
    except Exception as e:  # noqa: BLE001 - ConsistencyError, or whatever a learner's allocator raises in it
        return f"KV blocks leaked or miscounted after the run: {e}"
    if engine.scheduler.has_unfinished():
        return "requests are still queued after every request finished"
    return None


# -- recording a scheduler policy's decisions ------------------------------------------------------------

def _observe(seq, bm) -> dict:
    """What a policy can see of one candidate, and what the budget needs to price it (blocks held, and
    whether its next token lands in a shared block: one copy-on-write block more)."""
    return {"seq_id": seq.seq_id, "uncomputed": seq.num_uncomputed_tokens, "prompt": seq.num_prompt_tokens,
            "waiting": seq.is_waiting, "computed": seq.num_computed_tokens, "blocks": len(seq.block_table),
            "slots": seq.num_slots, "cow": int(bm._writes_shared_block(seq))}


def _picks(picked) -> list | None:
    """(seq_id, num_tokens) per pick, or None when the return value is not a list of pairs (the engine's
    own validation then says what is wrong with it)."""
    if not isinstance(picked, (list, tuple)):
        return None
    try:
        return [(getattr(s, "seq_id", None), n if type(n) in (int, float, bool) else repr(n)[:40]) for s, n in picked]
    except (TypeError, ValueError):
        return None


class _Recorder:
    """Stands in for the engine's policy: passes every call through unchanged and keeps, per call, the
    budget and candidates it was given (before the policy spends anything) and the picks it returned."""

    def __init__(self, policy, engine):
        self.policy, self.engine, self.calls = policy, engine, []

    def schedule(self, candidates, budget):
        bm = self.engine.block_manager
        call = {"step": len(self.engine.step_stats), "tokens": budget.tokens, "slots": budget.slots,
                "free_blocks": budget.free_blocks, "chunked": budget.chunked_prefill,
                "candidates": [_observe(s, bm) for s in candidates], "picks": None}
        self.calls.append(call)
        picked = self.policy.schedule(candidates, budget)
        call["picks"] = _picks(picked)
        return picked


def _record(engine) -> _Recorder:
    """Wrap the engine's policy; the wrapper's class takes the policy's class name, so the engine's
    error messages ("scheduler policy ContinuousPolicy ...") still name the learner's class."""
    policy = engine.scheduler.policy
    cls = type(type(policy).__name__, (_Recorder,), {})
    engine.scheduler.policy = rec = cls(policy, engine)
    return rec


# -- the run ------------------------------------------------------------------------------------------

def _not_implemented(e: BaseException) -> bool:
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, NotImplementedError):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _error(e: Exception) -> dict:
    from autograder.learner_side import learner_traceback
    try:
        tb = learner_traceback(e)
    except Exception:  # noqa: BLE001 - an exception whose message cannot be printed
        tb = type(e).__name__
    return {"type": type(e).__name__, "message": str(e)[:2000], "tb": tb[-4000:]}


@harness
def run_engine(prompts: list, max_tokens: list[int] | int, llm_kwargs: dict | None = None,
               make: dict | None = None, max_steps: int = 10_000, record_policy: bool = False,
               catch: bool = False, model: str = "target") -> dict:
    """Greedy generation of `prompts` (token-id lists), EOS ignored, stepping at most `max_steps` times.

    Returns {"tokens": token ids per request (None if unfinished), "schedule": per step
    (prompts prefilled, prefill tokens, decodes, preemptions), "steps", "finished" (bool),
    "num_blocks", "free_blocks", "leak" (None or a message), "max_num_batched_tokens",
    "step_tokens": prefill + decode tokens per step, "block_size", "error": None,
    "cached": per request, prompt tokens found in the prefix cache (RequestOutput.num_cached_tokens;
    0 without it, None if unfinished), "step_cached": per step, StepStats.num_cached_tokens,
    "cache_stats": the engine's PrefixCacheStats as a dict (None without prefix caching)}.

    record_policy: also "policy_calls", one dict per scheduler-policy call: "step", the budget's
    "tokens" / "slots" / "free_blocks" / "chunked" before the policy spent any, "candidates" (per
    candidate: "seq_id", "uncomputed", "prompt" tokens, "waiting", "computed", "blocks" held, "slots",
    "cow"), and "picks": [(seq_id, num_tokens)] as returned (None if not a list of pairs).
    model: "target" or "draft" (see build_llm).
    catch: an exception (building the engine with the learner's component, the engine refusing the
    policy's decisions, the policy raising) comes back as "error": {"type", "message", "tb"} with
    everything observed up to it, instead of raising; a stub's NotImplementedError still raises (the
    check is "not started").
    """
    from reference_engine import SamplingParams
    engine, rec, done, cached, ids, error = None, None, {}, {}, [], None
    lens = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    try:
        engine = build_llm(llm_kwargs, make, model).engine  # constructs the learner's component: it may raise
        rec = _record(engine) if record_policy else None
        ids = [engine.add_request(list(p), SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
               for p, n in zip(prompts, lens)]
        while engine.has_unfinished() and len(engine.step_stats) < max_steps:
            for step_out in engine.step():
                if step_out.output is not None:
                    done[step_out.request_id] = list(step_out.output.token_ids)
                    cached[step_out.request_id] = step_out.output.num_cached_tokens
    except Exception as e:
        if not catch or _not_implemented(e):
            raise
        error = _error(e)
    out = _observed(engine, ids, done, error) if engine is not None else _unbuilt(len(prompts), error)
    out["cached"] = [cached.get(i) for i in ids]
    if record_policy:
        out["policy_calls"] = rec.calls if rec is not None else []
    return out


def _observed(engine, ids: list, done: dict, error) -> dict:
    """What run_engine returns about a run (see its docstring)."""
    finished = error is None and not engine.has_unfinished()
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
        "block_size": engine.block_size,
        "error": error,
        "step_cached": [s.num_cached_tokens for s in stats],
        "cache_stats": dataclasses.asdict(engine.prefix_cache_stats) if engine.prefix_cache_stats else None,
    }


def _unbuilt(num_prompts: int, error) -> dict:
    """run_engine's answer when the engine could not even be built (the learner's component raised)."""
    return {"tokens": [None] * num_prompts, "schedule": [], "step_tokens": [], "steps": 0, "finished": False,
            "num_blocks": None, "free_blocks": None, "leak": None, "max_num_batched_tokens": None,
            "block_size": None, "error": error, "step_cached": [], "cache_stats": None}


# -- speculative decoding with a learner's verifier (lesson 14) ------------------------------------------------


class YourVerifier:
    """The learner's verify_greedy and verify as the engine's interfaces.SpeculativeVerifier (the engine's
    messages name this class: "verifier YourVerifier returned ...")."""

    def __init__(self, verify_greedy, verify):
        self._greedy, self._verify = verify_greedy, verify

    def verify_greedy(self, target_logits, draft_tokens):
        return self._greedy(target_logits, draft_tokens)

    def verify(self, target_probs, draft_probs, draft_tokens, generator):
        return self._verify(target_probs, draft_probs, draft_tokens, generator)


@harness
def run_speculative(prompts: list, params: list[dict], proposer: str | None, k: int = 4,
                    llm_kwargs: dict | None = None, verify_greedy=None, verify=None) -> dict:
    """Generate `prompts` (token-id lists) with speculative decoding on, one SamplingParams(**params[i]) per
    prompt (ignore_eos set), and report what a caller sees. proposer: "draft" (the shipped draft model),
    "ngram" (prompt lookup, n-grams of 1 to 3 tokens) or None (no speculation: plain decoding). The verifier
    is YourVerifier(verify_greedy, verify) when both are given, else the engine's own.

    Returns {"tokens": token ids per request (None if unfinished), "proposed" / "accepted": draft tokens
    verified / kept per request (RequestMetrics.num_draft_tokens / num_accepted_tokens), "verifications":
    per request, steps that verified drafts, "steps", "finished", "num_blocks", "free_blocks", "leak"
    (None, or what consistency() and the draft model's pool say), "error": None or {"type", "message", "tb"}
    (the engine refusing the verifier's answer, or the verifier raising); a stub's NotImplementedError raises.
    """
    from reference_engine import SamplingParams
    spec = None
    if proposer is not None:
        spec = {"model": str(DRAFT), "num_speculative_tokens": k} if proposer == "draft" else \
            {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
        if verify_greedy is not None and verify is not None:
            spec["verifier"] = YourVerifier(verify_greedy, verify)
    engine = build_llm({**(llm_kwargs or {}), "speculative_config": spec}).engine
    done, error = {}, None
    ids = [engine.add_request(list(p), SamplingParams(**{**kw, "ignore_eos": True})) for p, kw in zip(prompts, params)]
    try:
        while engine.has_unfinished() and len(engine.step_stats) < 10_000:
            for step_out in engine.step():
                if step_out.output is not None:
                    done[step_out.request_id] = step_out.output
    except Exception as e:
        if _not_implemented(e):
            raise
        error = _error(e)
    outs = [done.get(i) for i in ids]
    finished = error is None and not engine.has_unfinished()
    leak = consistency(engine) if finished else None
    if leak is None and finished and engine.spec is not None:
        try:
            engine.spec.proposer.check_consistency()
        except Exception as e:  # noqa: BLE001 - the draft model's pool
            leak = f"the draft model's KV blocks leaked or miscounted after the run: {e}"
    metric = lambda name: [getattr(o.metrics, name) if o is not None else None for o in outs]
    return {"tokens": [list(o.token_ids) if o is not None else None for o in outs],
            "proposed": metric("num_draft_tokens"), "accepted": metric("num_accepted_tokens"),
            "verifications": metric("num_drafts"), "steps": len(engine.step_stats), "finished": finished,
            "num_blocks": engine.num_blocks, "free_blocks": engine.block_manager.num_free(), "leak": leak,
            "error": error}
