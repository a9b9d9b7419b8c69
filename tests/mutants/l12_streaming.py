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


@mutant(check="disconnect_watcher", message="calls on_disconnect more than once for one disconnect")
class DisconnectWatcher:  # noqa: F811
    async def watch(self, receive, on_disconnect):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                on_disconnect()
                on_disconnect()  # "to be sure": the abort is queued twice
                return


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


# -- 12.6 the text streamer ------------------------------------------------------------------------------------


class _m_Streamer:
    """A plain StopStringDetokenizer with one hook per decision, so that each mutant below changes one."""

    def __init__(self, decode, stop, include_stop_str_in_output=False, min_tokens=0):
        self.decode, self.stop, self.include = decode, list(stop), include_stop_str_in_output
        self.min_tokens = min_tokens
        self.stop_reason, self.ids, self.text, self.shown, self.searched = None, [], "", 0, 0
        self.window, self.done = [0, 0], False

    def new_text(self, finishing=False):
        """The text the tokens past the window's read offset add (the window moves on when it is whole)."""
        p, r = self.window
        text = self.decode(self.ids[p:])[len(self.decode(self.ids[p:r])):]
        if finishing or (text and not text.endswith("\ufffd")):
            self.window = [r, len(self.ids)]
            return text
        return ""

    def search_from(self, start, s, first):
        return max(0, start - len(s) + 1)

    def pick(self, hits):
        return min(hits)

    def cut(self, at, s):
        return at + len(s) if self.include else at

    def held(self):
        if self.include:
            return 0
        return next((k for k in range(min(max(map(len, self.stop), default=0), len(self.text)), 0, -1)
                     if any(s.startswith(self.text[-k:]) for s in self.stop)), 0)

    def searches(self):
        return len(self.ids) > self.min_tokens

    def add(self, token_ids):
        if self.done:
            return ""
        first = len(self.text)
        for token in token_ids:
            self.ids.append(token)
            self.text += self.new_text()
            start, self.searched = self.searched, len(self.text)
            if not self.searches():
                continue
            hits = [(at + len(s), i, at) for i, s in enumerate(self.stop)
                    if (at := self.text.find(s, self.search_from(start, s, first))) != -1]
            if hits:
                _, i, at = self.pick(hits)
                self.stop_reason, self.done = self.stop[i], True
                self.text = self.text[:self.cut(at, self.stop[i])]
                break
        end = max(self.shown, len(self.text) - (0 if self.done else self.held()))
        out, self.shown = self.text[self.shown:end], end
        return out

    def finish(self):
        if self.done:
            return ""
        self.done = True
        self.text += self.new_text(finishing=True)
        out, self.shown = self.text[self.shown:], len(self.text)
        return out


@mutant(check="stop_string_detokenizer", message="holds back nothing")
class StopStringDetokenizer(_m_Streamer):
    def held(self):
        return 0  # shows every character at once, the start of a stop string too


@mutant(check="stop_string_detokenizer", message="finds a stop string only inside one add's text")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def search_from(self, start, s, first):
        return first  # the text of this add only: a stop string that began earlier is missed


@mutant(check="stop_string_detokenizer", message="cuts the text after the stop string instead of before it")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def cut(self, at, s):
        return at + len(s)


@mutant(check="stop_string_detokenizer", message="takes the first stop string in the list that appears")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def pick(self, hits):
        return min(hits, key=lambda h: h[1])  # by place in the list, not by where it ends


@mutant(check="stop_string_detokenizer", message="drops a multi-byte character split across tokens")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def new_text(self, finishing=False):
        return self.decode(self.ids[-1:]).replace("\ufffd", "") if self.ids and not finishing else ""


@mutant(check="stop_string_detokenizer", message="shows a character before all its bytes have come")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def new_text(self, finishing=False):
        return self.decode(self.ids)[len(self.text):]  # all that is new, a character still incomplete included


@mutant(check="stop_string_detokenizer", message="never releases the held-back text at finish()")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def finish(self):
        self.done = True
        return ""


@mutant(check="stop_string_detokenizer", message="releases the held-back text at every finish() call")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def finish(self):
        if self.stop_reason is not None:
            return ""
        self.text += self.new_text(finishing=True)
        return self.text[self.shown:]  # shown is not moved on: a second call returns it again


@mutant(check="stop_string_detokenizer", message="always holds back the longest stop string's length - 1 characters")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def held(self):
        return 0 if self.include else min(len(self.text), max(map(len, self.stop), default=1) - 1)


@mutant(check="stop_string_detokenizer", message="matches a stop string inside the text of the first min_tokens tokens")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def searches(self):
        return True


@mutant(check="stop_string_detokenizer", message="decodes the whole output at every token")
class StopStringDetokenizer(sol.StopStringDetokenizer):  # noqa: F811
    def add(self, token_ids):
        self.decode(self._ids + list(token_ids))  # "to be safe", the whole answer so far, at every add
        return super().add(token_ids)


@mutant(check="streaming_server", message="finds a stop string only inside one add's text")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def search_from(self, start, s, first):
        return first


@mutant(check="streaming_server", message="holds back nothing")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def held(self):
        return 0


@mutant(check="streaming_server", message="never releases the held-back text")
class StopStringDetokenizer(_m_Streamer):  # noqa: F811
    def finish(self):
        self.done = True
        return ""
