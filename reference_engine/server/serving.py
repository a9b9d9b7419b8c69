"""GenerationService: answers (Generations), the streams attached to them, and the engine requests behind.

One Generation per answer; one Subscriber per HTTP response reading it. A retry with the same
Idempotency-Key becomes a second Subscriber of the same Generation (never a second generation). The
engine request is aborted when the last subscriber leaves (disconnect, slow reader); a later retry with
the key continues from the tokens already made (ResumePolicy). Everything here runs on the event loop.

A continuation is a new engine request for the original prompt whose output starts with the tokens so far
(LLMEngine.add_request's output_prefix: they count toward max_tokens, min_tokens and the penalties, and stop
strings are not searched in them again). The tokens come from this server's Generation, not from the client,
and are never sampled again: the engine prefills prompt + tokens as input (recomputing their KV) and decodes
on from there. The tokens the client already holds never change. Whether the tail equals an uninterrupted
run's depends on the kernels: on this CPU engine (fp32) a greedy continuation gives the same tokens
(tests/test_server_params.py, test_a_resumed_stream_keeps_stop_strings_and_penalties), but on a GPU in bf16
with dynamic batching the recomputed prefix goes through a prefill kernel, in a batch of another shape, and
kernels whose reduction order depends on the batch give logits that differ in the last bits, enough to flip
a near-tie greedy choice (Thinking Machines, "Defeating Nondeterminism in LLM Inference", Sept 2025). The tail
is then exact only with batch-invariant kernels (vLLM: VLLM_BATCH_INVARIANT=1, docs features/batch_invariance,
beta; SGLang: its deterministic-inference mode, docs advanced_features/deterministic_inference). A seeded
sampled answer restarts its generator, so its tail differs from an uninterrupted run's anyway.
Idempotency-Key and X-Resume-From are this server's conventions, not part of OpenAI's API.

n > 1 (open_group): one engine request, whose n samples the engine forks after the prompt (sharing its KV
blocks copy-on-write), read as n Answers with one Subscriber each; the subscribers share one wake event and
the engine request is aborted when the last of them leaves. No Idempotency-Key: a key names one answer.
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..sampling import SamplingParams
from .async_engine import AsyncEngine
from .interfaces import Generation
from .protocol import APIError
from .streaming import StreamComponents


@dataclass
class Answer(Generation):
    """A Generation with what the engine reports beside the tokens."""
    index: int = 0  # the choice's index (n > 1)
    logprobs: list = field(default_factory=list)  # per token with SamplingParams.logprobs: {token: logprob}
    prompt_logprobs: list | None = None  # with SamplingParams.prompt_logprobs (echo with logprobs)
    text: str | None = None  # the engine's output text once finished: cut at a stop string
    text_whole: bool = True  # text covers every token of token_ids (False after a continuation without prefix)
    stop_reason: Any = None  # the stop string or stop token id that ended it (vLLM's stop_reason)
    error: Any = None  # the exception, for finish_reason "error"
    group: list | None = None  # the n Answers of one engine request (n > 1)

    @property
    def members(self) -> list:
        return self.group or [self]


class Subscriber:
    """One response reading a Generation: the tokens to replay first, then a live buffer."""

    def __init__(self, gen: Generation, buffer, replay: list[int], received: int):
        self.gen, self.buffer, self.replay = gen, buffer, replay
        self.start = received  # tokens of gen.token_ids the client had before this response
        self.wake = asyncio.Event()
        self.dropped: str | None = None  # why the server gave up on this stream ("slow_reader", ...)
        self.attached = True

    @property
    def finish_reason(self) -> str | None:
        return "abort" if self.dropped else self.gen.finish_reason


def fingerprint(kind: str, prompt_token_ids: list[int], params: SamplingParams) -> str:
    """What makes two requests the same request (stream on or off does not)."""
    return hashlib.sha256(repr((kind, prompt_token_ids, replace(params))).encode()).hexdigest()


class GenerationService:
    def __init__(self, aengine: AsyncEngine, components: StreamComponents):
        self.aengine, self.components = aengine, components
        self._subs: dict[str, list[Subscriber]] = {}  # generation uid -> attached subscribers
        self._uids = itertools.count()
        self.closing = False

    # ---- opening a stream -----------------------------------------------------------------------------
    def open(self, prompt_token_ids: list[int], params: SamplingParams, fp: str, key: str | None = None,
             received: int = 0) -> Subscriber:
        """Attach a new subscriber: to the key's Generation if the cache has it (replaying, resuming), else
        to a new Generation whose engine request is queued now. Raises APIError for a misused key."""
        cache = self.components.cache
        gen = cache.get(key) if key is not None else None
        if gen is None:
            if received:
                raise APIError(400, "X-Resume-From needs the Idempotency-Key of an answer this server still holds",
                               param="X-Resume-From", code="unknown_idempotency_key")
            gen = Answer(key, fp, list(prompt_token_ids), params.max_tokens, params=params)
            gen.uid = f"gen-{next(self._uids)}"
            sub = self._attach(gen, [], 0)
            self._start(gen, gen.prompt_token_ids, params)
            if key is not None:
                # Put only once the Generation is subscribed and in flight: a cache full of live entries
                # would otherwise evict the new one at once, and its retry would start a second answer.
                try:
                    cache.put(key, gen)
                except BaseException:
                    self.release(sub)  # aborts the request just queued: nobody will read it
                    raise
            return sub
        if gen.fingerprint != fp:
            raise APIError(422, "this Idempotency-Key was first used with a different request body; use a new key "
                                "for a new request", param="Idempotency-Key", code="idempotency_key_reused")
        try:
            plan = self.components.resume.plan(gen, received)
        except ValueError as e:
            raise APIError(400, str(e), param="X-Resume-From") from None
        sub = self._attach(gen, list(plan.replay), received)
        if plan.continue_prompt is not None:
            self._start(gen, plan.continue_prompt, replace(gen.params, max_tokens=plan.max_tokens))
        return sub

    def open_group(self, prompt_token_ids: list[int], params: SamplingParams, fp: str) -> list[Subscriber]:
        """n = params.n > 1 samples of one prompt: one engine request, n Answers (choice i reads sample i),
        one subscriber each, sharing one wake event."""
        gens = []
        for i in range(params.n):
            gen = Answer(None, fp, list(prompt_token_ids), params.max_tokens, params=params, index=i)
            gen.uid = f"gen-{next(self._uids)}"
            gens.append(gen)
        subs = []
        for gen in gens:
            gen.group = gens
            subs.append(self._attach(gen, [], 0))
            subs[-1].wake = subs[0].wake
        self._start(gens[0], gens[0].prompt_token_ids, params)
        return subs

    def _attach(self, gen: Generation, replay: list[int], received: int) -> Subscriber:
        sub = Subscriber(gen, self.components.new_buffer(), replay, received)
        self._subs.setdefault(gen.uid, []).append(sub)
        gen.subscribers += 1
        return sub

    def _start(self, gen: Generation, prompt: list[int], params: SamplingParams) -> None:
        """Queue the engine request for gen (and its group). A prompt that is gen's prompt plus tokens it
        has (a resume plan's continue_prompt) continues it: those tokens are the request's output_prefix and
        max_tokens counts them again."""
        rid, prefix, base = f"{gen.uid}-{gen.engine_requests}", None, gen.prompt_token_ids
        if len(prompt) > len(base) and prompt[:len(base)] == base and prompt[len(base):] == gen.token_ids:
            prefix, prompt = prompt[len(base):], base
            params = replace(params, max_tokens=params.max_tokens + len(prefix), prompt_logprobs=None)
        for g in getattr(gen, "members", [gen]):
            g.request_id = rid
            g.engine_requests += 1
            g.in_flight, g.finish_reason = True, None
            if isinstance(g, Answer):
                g.text_whole = prefix is not None or not g.token_ids
        sink = lambda outs, err: self._on_outputs(gen, rid, outs, err)  # noqa: E731
        if prefix:
            self.aengine.add(rid, prompt, params, sink, output_prefix=prefix)
        else:  # (the signature of AsyncEngine stand-ins without continuations)
            self.aengine.add(rid, prompt, params, sink)

    # ---- engine outputs ---------------------------------------------------------------------------------
    def _on_outputs(self, gen: Answer, rid: str, outs, err) -> None:
        group = gen.members
        if err is not None:  # the engine failed this request (alone, or with its whole step): it has ended
            for g in group:
                g.in_flight, g.finish_reason, g.error = False, "error", err
        now = time.monotonic()
        for o in outs:
            self._apply(group[o.index] if o.index < len(group) else gen, group, o, now)
        if len(group) == 1 and gen.finish_reason == "abort" and err is None and gen.subscribers and not self.closing:
            # Aborted because its last reader left, but a retry attached before the abort landed: go on.
            plan = self.components.resume.plan(gen, len(gen.token_ids))
            if plan.continue_prompt is not None:
                self._start(gen, plan.continue_prompt, replace(gen.params, max_tokens=plan.max_tokens))
        for g in group:
            for sub in self._subs.get(g.uid, []):
                sub.wake.set()
            if not g.in_flight and not g.subscribers:
                self._subs.pop(g.uid, None)

    def _apply(self, g: Answer, group: list, o, now: float) -> None:
        """One engine output of answer g (of `group`, the answers of its engine request): its tokens go to every
        reader's buffer (a reader too far behind is dropped), its end to every answer the request ended."""
        if o.new_token_ids:
            g.token_ids += o.new_token_ids
            g.engine_tokens += len(o.new_token_ids)
            if g.params is not None and g.params.logprobs is not None:
                g.logprobs += o.logprobs or [None] * len(o.new_token_ids)
            for sub in list(self._subs.get(g.uid, [])):
                if not sub.buffer.push(list(o.new_token_ids), now):
                    self.drop(sub, "slow_reader")
        if o.prompt_logprobs is not None:
            g.prompt_logprobs = o.prompt_logprobs
        if o.finished:
            g.in_flight, g.finish_reason, g.stop_reason, g.text = False, o.finish_reason, o.stop_reason, o.text
            if o.finish_reason in ("abort", "error"):  # the request ended: every sample with it (some of
                for other in group:  # which the engine may not have forked yet)
                    if other.in_flight:
                        other.in_flight, other.finish_reason = False, o.finish_reason

    # ---- leaving -----------------------------------------------------------------------------------------
    def drop(self, sub: Subscriber, cause: str) -> None:
        """The server gives up on this stream (cause: "client_disconnect", "slow_reader", ...). The last
        subscriber leaving aborts the engine request: its slot and KV blocks are freed next step."""
        if not sub.attached:
            return
        sub.dropped = cause
        self._detach(sub, cause)
        sub.wake.set()

    def release(self, sub: Subscriber) -> None:
        """The stream ended normally (or its handler exited): detach; abort if it was the last reader."""
        if sub.attached:
            self._detach(sub, "client_gone")

    def _detach(self, sub: Subscriber, cause: str) -> None:
        gen = sub.gen
        sub.attached = False
        subs = self._subs.get(gen.uid, [])
        if sub in subs:
            subs.remove(sub)
        gen.subscribers -= 1
        group = getattr(gen, "members", [gen])
        if all(g.subscribers == 0 for g in group):
            if any(g.in_flight for g in group):
                self.aengine.abort(gen.request_id, cause)
            else:
                for g in group:
                    self._subs.pop(g.uid, None)

    # ---- reading -----------------------------------------------------------------------------------------
    async def iterate(self, sub: Subscriber, keep_alive_s: float):
        """Yield lists of new token ids as they come (coalesced when the reader is behind), None after
        keep_alive_s of silence; return when the answer is complete or the stream was dropped."""
        async for item in self.iterate_group([sub], keep_alive_s):
            yield None if item is None else item[1]

    async def iterate_group(self, subs: list[Subscriber], keep_alive_s: float):
        """iterate() over the subscribers of one response (sharing one wake event): yield (index in subs,
        new token ids), or None after keep_alive_s of silence; return when every answer is complete, or when
        one stream was dropped (the others are dropped with it: one response, one fate)."""
        try:
            for i, sub in enumerate(subs):
                if sub.replay:
                    replay, sub.replay = sub.replay, []
                    yield i, replay
            while True:
                got = False
                for i, sub in enumerate(subs):
                    tokens = sub.buffer.pop(time.monotonic())
                    if tokens:
                        got = True
                        yield i, tokens
                if got:
                    continue
                dropped = next((sub.dropped for sub in subs if sub.dropped), None)
                if dropped:
                    for sub in subs:
                        self.drop(sub, dropped)
                    return
                if all(not sub.gen.in_flight and sub.gen.finish_reason is not None for sub in subs):
                    return
                subs[0].wake.clear()
                try:
                    await asyncio.wait_for(subs[0].wake.wait(), keep_alive_s)
                except asyncio.TimeoutError:
                    yield None
        finally:
            for sub in subs:
                self.release(sub)
