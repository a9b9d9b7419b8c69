"""Plausible wrong answers for lesson 12; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace; a wrong class
subclasses the right one and overrides the method that goes wrong."""
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
