"""GenerationService: answers (Generations), the streams attached to them, and the engine requests behind.

One Generation per answer; one Subscriber per HTTP response reading it. A retry with the same
Idempotency-Key becomes a second Subscriber of the same Generation (never a second generation). The
engine request is aborted when the last subscriber leaves (disconnect, slow reader); a later retry with
the key continues from the tokens already made (ResumePolicy). Everything here runs on the event loop.

A continuation is a new engine request whose prompt is the original prompt plus the tokens so far: greedy
answers come out exactly as uninterrupted ones (the recomputed prefix gives the same logits); a seeded
sampled answer restarts its generator, so its tail differs from an uninterrupted run's (never a token the
client already holds, though).
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from dataclasses import replace

from ..sampling import SamplingParams
from .async_engine import AsyncEngine
from .interfaces import Generation
from .protocol import APIError
from .streaming import StreamComponents


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
            gen = Generation(key, fp, list(prompt_token_ids), params.max_tokens, params=params)
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

    def _attach(self, gen: Generation, replay: list[int], received: int) -> Subscriber:
        sub = Subscriber(gen, self.components.new_buffer(), replay, received)
        self._subs.setdefault(gen.uid, []).append(sub)
        gen.subscribers += 1
        return sub

    def _start(self, gen: Generation, prompt: list[int], params: SamplingParams) -> None:
        gen.request_id = f"{gen.uid}-{gen.engine_requests}"
        gen.engine_requests += 1
        gen.in_flight, gen.finish_reason = True, None
        rid = gen.request_id
        self.aengine.add(rid, prompt, params, lambda outs, err: self._on_outputs(gen, rid, outs, err))

    # ---- engine outputs ---------------------------------------------------------------------------------
    def _on_outputs(self, gen: Generation, rid: str, outs, err) -> None:
        subs = self._subs.get(gen.uid, [])
        if err is not None:  # the engine failed this request (alone, or with its whole step): it has ended
            gen.in_flight, gen.finish_reason = False, "error"
            gen.error = err
        now = time.monotonic()
        for o in outs:
            if o.new_token_ids:
                gen.token_ids += o.new_token_ids
                gen.engine_tokens += len(o.new_token_ids)
                for sub in list(subs):
                    if not sub.buffer.push(list(o.new_token_ids), now):
                        self.drop(sub, "slow_reader")
            if o.finished:
                gen.in_flight, gen.finish_reason = False, o.finish_reason
        if gen.finish_reason == "abort" and err is None and gen.subscribers and not self.closing:
            # Aborted because its last reader left, but a retry attached before the abort landed: go on.
            plan = self.components.resume.plan(gen, len(gen.token_ids))
            if plan.continue_prompt is not None:
                self._start(gen, plan.continue_prompt, replace(gen.params, max_tokens=plan.max_tokens))
        for sub in subs:
            sub.wake.set()
        if not gen.in_flight and not gen.subscribers:
            self._subs.pop(gen.uid, None)

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
        if gen.subscribers == 0:
            if gen.in_flight:
                self.aengine.abort(gen.request_id, cause)
            else:
                self._subs.pop(gen.uid, None)

    # ---- reading -----------------------------------------------------------------------------------------
    async def iterate(self, sub: Subscriber, keep_alive_s: float):
        """Yield lists of new token ids as they come (coalesced when the reader is behind), None after
        keep_alive_s of silence; return when the answer is complete or the stream was dropped."""
        try:
            if sub.replay:
                replay, sub.replay = sub.replay, []
                yield replay
            while True:
                tokens = sub.buffer.pop(time.monotonic())
                if tokens:
                    yield tokens
                    continue
                if sub.dropped or (not sub.gen.in_flight and sub.gen.finish_reason is not None):
                    return
                sub.wake.clear()
                try:
                    await asyncio.wait_for(sub.wake.wait(), keep_alive_s)
                except asyncio.TimeoutError:
                    yield None
        finally:
            self.release(sub)
