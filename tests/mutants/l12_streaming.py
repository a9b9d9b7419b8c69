"""Plausible wrong answers for lesson 12; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace; a wrong class
subclasses the right one and overrides the method that goes wrong."""
import asyncio
import time

import solutions.l12_streaming as sol
from reference_engine.server.interfaces import ResumePlan
from tests.mutants import mutant

# -- 12.1 the buffer -------------------------------------------------------------------------------------------


@mutant(check="coalescing_buffer", message="checks the limit without the tokens being pushed")
class CoalescingBuffer(sol.CoalescingBuffer):
    def push(self, token_ids, now):
        if self.dead:
            return False
        too_old = self._oldest is not None and now - self._oldest > self.max_lag_s
        if len(self._tokens) > self.high_water or too_old:  # the new tokens are not counted
            self.dead, self._tokens, self._oldest = True, [], None
            return False
        if token_ids and self._oldest is None:
            self._oldest = now
        self._tokens = self._tokens + list(token_ids)
        return True


@mutant(check="coalescing_buffer", message="measures the lag from the newest waiting token")
class CoalescingBuffer(sol.CoalescingBuffer):  # noqa: F811 - one mutant per definition
    def push(self, token_ids, now):
        ok = super().push(token_ids, now)
        if ok and token_ids:
            self._oldest = now  # every push restarts the clock
        return ok


@mutant(check="coalescing_buffer", message="returns one push's tokens per pop")
class CoalescingBuffer(sol.CoalescingBuffer):  # noqa: F811
    def __init__(self, high_water=256, max_lag_s=10.0):
        super().__init__(high_water, max_lag_s)
        self._sizes = []

    def push(self, token_ids, now):
        ok = super().push(token_ids, now)
        self._sizes = self._sizes + [len(token_ids)] if ok else []
        return ok

    def pop(self, now):
        if not self._sizes:
            return []
        n, self._sizes = self._sizes[0], self._sizes[1:]
        out, self._tokens = self._tokens[:n], self._tokens[n:]
        if not self._tokens:
            self._oldest = None
        return out


@mutant(check="coalescing_buffer", message="checks the limit against this push alone")
class CoalescingBuffer(sol.CoalescingBuffer):  # noqa: F811
    def push(self, token_ids, now):
        if self.dead:
            return False
        too_old = self._oldest is not None and now - self._oldest > self.max_lag_s
        if len(token_ids) > self.high_water or too_old:  # what already waits is not counted
            self.dead, self._tokens, self._oldest = True, [], None
            return False
        if token_ids and self._oldest is None:
            self._oldest = now
        self._tokens = self._tokens + list(token_ids)
        return True


@mutant(check="coalescing_buffer", message="gives up when the oldest token has waited exactly max_lag_s")
class CoalescingBuffer(sol.CoalescingBuffer):  # noqa: F811
    def push(self, token_ids, now):
        if not self.dead and self._oldest is not None and now - self._oldest >= self.max_lag_s:
            self.dead, self._tokens, self._oldest = True, [], None
        return super().push(token_ids, now)


@mutant(check="coalescing_buffer", message="starts the lag clock at time 0")
class CoalescingBuffer(sol.CoalescingBuffer):  # noqa: F811
    def __init__(self, high_water=256, max_lag_s=10.0):
        super().__init__(high_water, max_lag_s)
        self._oldest = 0.0  # "nothing waiting" is not told apart from "waiting since t=0"


@mutant(check="coalescing_buffer", message="starts the lag clock on an empty push")
class CoalescingBuffer(sol.CoalescingBuffer):  # noqa: F811
    def push(self, token_ids, now):
        ok = super().push(token_ids, now)
        if ok and self._oldest is None:
            self._oldest = now
        return ok


@mutant(check="coalescing_buffer", message="keeps the lag clock after pop")
class CoalescingBuffer(sol.CoalescingBuffer):  # noqa: F811
    def pop(self, now):
        out, self._tokens = self._tokens, []
        return out


@mutant(check="coalescing_buffer", message="keeps the list passed to push and appends to it later")
class CoalescingBuffer(sol.CoalescingBuffer):  # noqa: F811
    def push(self, token_ids, now):
        if self.dead:
            return False
        too_many = len(self._tokens) + len(token_ids) > self.high_water
        too_old = self._oldest is not None and now - self._oldest > self.max_lag_s
        if too_many or too_old:
            self.dead, self._tokens, self._oldest = True, [], None
            return False
        if token_ids and self._oldest is None:
            self._oldest = now
        if self._tokens:
            self._tokens.extend(token_ids)
        else:
            self._tokens = token_ids  # the caller's own list, extended by the next push
        return True


@mutant(check="streaming_server", message="busy-waits or blocks while a reader is behind")
class CoalescingBuffer(sol.CoalescingBuffer):  # noqa: F811
    def push(self, token_ids, now):
        deadline = time.monotonic() + 0.1
        while self.pending > self.high_water // 2 and time.monotonic() < deadline:
            pass  # wait for the reader to catch up (it cannot: its coroutine needs this loop)
        return super().push(token_ids, now)


# -- 12.2 the watcher ------------------------------------------------------------------------------------------


@mutant(check="disconnect_watcher", message="calls on_disconnect for any message")
class DisconnectWatcher:
    async def watch(self, receive, on_disconnect):
        await receive()  # the first message, whatever it is, is taken for a disconnect
        on_disconnect()


@mutant(check="disconnect_watcher", message="keeps reading after the disconnect")
class DisconnectWatcher:  # noqa: F811
    async def watch(self, receive, on_disconnect):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                on_disconnect()


@mutant(check="disconnect_watcher", message="blocks the event loop between reads")
class DisconnectWatcher:  # noqa: F811
    async def watch(self, receive, on_disconnect):
        while True:
            time.sleep(0.05)  # "polls" the channel: every other coroutine on the loop waits meanwhile
            message = await receive()
            if message["type"] == "http.disconnect":
                on_disconnect()
                return


@mutant(check="disconnect_watcher", message="keep waiting")
class DisconnectWatcher:  # noqa: F811
    async def watch(self, receive, on_disconnect):
        while True:
            try:
                message = await asyncio.wait_for(receive(), 0.05)
            except asyncio.TimeoutError:
                return  # "nothing for a while: the client must be gone" (a quiet client is still there)
            if message["type"] == "http.disconnect":
                on_disconnect()
                return


# -- 12.3 the cache --------------------------------------------------------------------------------------------


@mutant(check="idempotency_cache", message="evicts an entry whose generation is in flight")
class IdempotencyCache(sol.IdempotencyCache):
    def put(self, key, generation):
        self._entries[key] = generation
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)  # plain LRU: live or not


@mutant(check="idempotency_cache", message="does not refresh a key on get")
class IdempotencyCache(sol.IdempotencyCache):  # noqa: F811
    def get(self, key):
        return self._entries.get(key)


@mutant(check="streaming_server", message="duplicate generations")
class IdempotencyCache(sol.IdempotencyCache):  # noqa: F811
    def put(self, key, generation):
        self._entries[key] = generation
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


def _m_evicting_put(cache, key, generation, may_go, at_most=None):
    cache._entries[key] = generation
    cache._entries.move_to_end(key)
    evicted = 0
    for old in [k for k, g in cache._entries.items() if may_go(g)]:
        if len(cache._entries) <= cache.max_entries or evicted == at_most:
            break
        del cache._entries[old]
        evicted += 1


@mutant(check="idempotency_cache", message="evicts a finished entry that a stream is still reading")
class IdempotencyCache(sol.IdempotencyCache):  # noqa: F811
    def put(self, key, generation):
        _m_evicting_put(self, key, generation, lambda g: not g.in_flight)


@mutant(check="idempotency_cache", message="evicts an entry in flight that no stream reads yet")
class IdempotencyCache(sol.IdempotencyCache):  # noqa: F811
    def put(self, key, generation):
        _m_evicting_put(self, key, generation, lambda g: g.subscribers == 0)


@mutant(check="idempotency_cache", message="evicts only finished answers")
class IdempotencyCache(sol.IdempotencyCache):  # noqa: F811
    def put(self, key, generation):
        _m_evicting_put(self, key, generation, lambda g: g.finished and not g.in_flight and g.subscribers == 0)


@mutant(check="idempotency_cache", message="evicts at most one entry per put")
class IdempotencyCache(sol.IdempotencyCache):  # noqa: F811
    def put(self, key, generation):
        _m_evicting_put(self, key, generation, lambda g: not g.in_flight and g.subscribers == 0, at_most=1)


@mutant(check="idempotency_cache", message="stops evicting when the least recently used entry is live")
class IdempotencyCache(sol.IdempotencyCache):  # noqa: F811
    def put(self, key, generation):
        self._entries[key] = generation
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            old, g = next(iter(self._entries.items()))
            if g.in_flight or g.subscribers > 0:
                break
            del self._entries[old]


@mutant(check="idempotency_cache", message="leaves a key where it was when it is put again")
class IdempotencyCache(sol.IdempotencyCache):  # noqa: F811
    def put(self, key, generation):
        self._entries[key] = generation  # a known key keeps its old place in the order
        for old in [k for k, g in self._entries.items() if not g.in_flight and g.subscribers == 0]:
            if len(self._entries) <= self.max_entries:
                break
            del self._entries[old]


@mutant(check="idempotency_cache", message="reports at most max_entries from len()")
class IdempotencyCache(sol.IdempotencyCache):  # noqa: F811
    def __len__(self):
        return min(len(self._entries), self.max_entries)


# -- 12.4 resume -----------------------------------------------------------------------------------------------


@mutant(check="resume_plan", message="restarts from the prompt")
def plan_resume(generation, received):
    plan = sol.plan_resume(generation, received)
    if plan.continue_prompt is None:
        return plan
    return ResumePlan(plan.replay, list(generation.prompt_token_ids), generation.max_tokens)


@mutant(check="resume_plan", message="replays every token")
def plan_resume(generation, received):  # noqa: F811
    plan = sol.plan_resume(generation, received)
    return ResumePlan(list(generation.token_ids), plan.continue_prompt, plan.max_tokens)


@mutant(check="resume_plan", message="is off by one")
def plan_resume(generation, received):  # noqa: F811
    plan = sol.plan_resume(generation, received)
    if plan.continue_prompt is None:
        return plan
    return ResumePlan(plan.replay, plan.continue_prompt[:-1], plan.max_tokens + 1)


@mutant(check="streaming_server", message="regenerates tokens the answer already held")
def plan_resume(generation, received):  # noqa: F811
    plan = sol.plan_resume(generation, received)
    if plan.continue_prompt is None:
        return plan
    return ResumePlan(plan.replay, list(generation.prompt_token_ids), generation.max_tokens)


@mutant(check="resume_plan", message="continues an answer that is finished")
def plan_resume(generation, received):  # noqa: F811
    plan = sol.plan_resume(generation, received)
    left = generation.max_tokens - len(generation.token_ids)
    if generation.in_flight or left <= 0:
        return plan
    return ResumePlan(plan.replay, list(generation.prompt_token_ids) + list(generation.token_ids), left)


@mutant(check="resume_plan", message="does not check that received is an int")
def plan_resume(generation, received):  # noqa: F811
    have = len(generation.token_ids)
    if not received <= have or received < 0:
        raise ValueError(f"received {received} is not between 0 and {have}")
    replay = list(generation.token_ids[received:])  # a float index raises TypeError here
    left = generation.max_tokens - have
    if generation.finished or generation.in_flight or left <= 0:
        return ResumePlan(replay)
    return ResumePlan(replay, list(generation.prompt_token_ids) + list(generation.token_ids), left)


@mutant(check="resume_plan", message="raises TypeError for a count that is not an int")
def plan_resume(generation, received):  # noqa: F811
    if not isinstance(received, int) or isinstance(received, bool):
        raise TypeError("received must be an int")
    return sol.plan_resume(generation, received)


@mutant(check="resume_plan", message="converts received with int()")
def plan_resume(generation, received):  # noqa: F811
    return sol.plan_resume(generation, int(received))


@mutant(check="resume_plan", message="accepts True as a count of 1")
def plan_resume(generation, received):  # noqa: F811
    return sol.plan_resume(generation, int(received) if isinstance(received, bool) else received)


# -- 12.5 framing ----------------------------------------------------------------------------------------------


@mutant(check="sse_framer", message="ends an event with a single newline")
class SSEFramer(sol.SSEFramer):
    def event(self, payload):
        return super().event(payload)[:-1]


@mutant(check="sse_framer", message="sends no [DONE] marker")
class SSEFramer(sol.SSEFramer):  # noqa: F811
    def done(self):
        return b""


@mutant(check="streaming_server", message="single newline")
class SSEFramer(sol.SSEFramer):  # noqa: F811
    def event(self, payload):
        return f"data: {payload}\n".encode()


@mutant(check="sse_framer", message="checks for \\n only")
class SSEFramer(sol.SSEFramer):  # noqa: F811
    def event(self, payload):
        if "\n" in payload:
            raise ValueError("an SSE data payload must be one line")
        return f"data: {payload}\n\n".encode()
