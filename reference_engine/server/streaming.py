"""The server's default streaming components (the contracts are in interfaces.py)."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..sampling import StopStrings, stop_prefix_len
from .interfaces import (
    DisconnectWatcher,
    Generation,
    IdempotencyCache,
    ResumePlan,
    ResumePolicy,
    SSEFramer,
    StreamBuffer,
    TextStreamer,
)


class BoundedStreamBuffer:
    """Coalescing token buffer with two limits: at most high_water tokens pending, and the oldest pending
    token no older than max_lag_s. Past either the reader is declared too slow (push returns False) and
    the buffer drops what it held: a dead stream keeps no memory."""

    def __init__(self, high_water: int = 256, max_lag_s: float = 10.0):
        if high_water < 1 or max_lag_s <= 0:
            raise ValueError(f"high_water ({high_water}) must be >= 1 and max_lag_s ({max_lag_s}) > 0")
        self.high_water, self.max_lag_s = high_water, max_lag_s
        self._tokens: list[int] = []
        self._oldest: float | None = None  # when the oldest pending token arrived
        self.dead = False

    def push(self, token_ids: list[int], now: float) -> bool:
        if self.dead:
            return False
        too_many = len(self._tokens) + len(token_ids) > self.high_water
        too_old = self._oldest is not None and now - self._oldest > self.max_lag_s
        if too_many or too_old:
            self.dead, self._tokens, self._oldest = True, [], None
            return False
        if token_ids and self._oldest is None:
            self._oldest = now
        self._tokens += token_ids
        return True

    def pop(self, now: float) -> list[int]:
        out, self._tokens, self._oldest = self._tokens, [], None
        return out

    @property
    def pending(self) -> int:
        return len(self._tokens)


class ReceiveDisconnectWatcher:
    """Reads the ASGI receive channel until the server reports the client gone."""

    async def watch(self, receive, on_disconnect) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                on_disconnect()
                return


class LRUIdempotencyCache:
    """At most max_entries keys holding at most about max_bytes (keys and token ids, entry_bytes()); when
    either is passed, least recently used entries that are neither in flight nor subscribed are evicted (an
    in-flight one never is, so the cache may briefly hold more). Bytes are counted at each put: an entry in
    flight grows with its answer, and a finished one no longer does."""

    TOKEN_BYTES = 36  # a token id in a Python list: an 8-byte pointer and, past 256, a 28-byte int
    ENTRY_BYTES = 512  # the Generation, its dict slot and the key string's header

    def __init__(self, max_entries: int = 4096, max_bytes: int = 64 << 20):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[str, Generation] = OrderedDict()

    @classmethod
    def entry_bytes(cls, key: str, gen: Generation) -> int:
        return cls.ENTRY_BYTES + len(key) + cls.TOKEN_BYTES * (len(gen.prompt_token_ids) + len(gen.token_ids))

    def get(self, key: str) -> Generation | None:
        gen = self._entries.get(key)
        if gen is not None:
            self._entries.move_to_end(key)
        return gen

    def put(self, key: str, generation: Generation) -> None:
        self._entries[key] = generation
        self._entries.move_to_end(key)
        held = self.bytes
        for old in [k for k, g in self._entries.items() if not g.in_flight and g.subscribers == 0]:
            if len(self._entries) <= self.max_entries and held <= self.max_bytes:
                break
            held -= self.entry_bytes(old, self._entries.pop(old))

    @property
    def bytes(self) -> int:
        """What the entries hold now, by entry_bytes()."""
        return sum(self.entry_bytes(k, g) for k, g in self._entries.items())

    def __len__(self) -> int:
        return len(self._entries)


class ContinueResumePolicy:
    """Replay what the client lacks; if nothing is producing the rest, continue from the last token."""

    def plan(self, generation: Generation, received: int) -> ResumePlan:
        have = len(generation.token_ids)
        if type(received) is not int or not 0 <= received <= have:  # a bool (True) is no count
            raise ValueError(f"resume from token {received!r}: this answer has {have} tokens so far, so the "
                             f"count of tokens received must be between 0 and {have}")
        replay = generation.token_ids[received:]
        if generation.finished or generation.in_flight:
            return ResumePlan(replay)
        left = generation.max_tokens - have
        if left <= 0:
            return ResumePlan(replay)
        return ResumePlan(replay, generation.prompt_token_ids + generation.token_ids, left)


class DefaultSSEFramer:
    """text/event-stream framing: one `data:` line per event, `: keep-alive` comments in silences."""

    def __init__(self, keep_alive_interval: float = 5.0):
        self.keep_alive_interval = keep_alive_interval

    def event(self, payload: str) -> bytes:
        if "\n" in payload or "\r" in payload:  # SSE ends a line at either: the field would end early
            raise ValueError("an SSE data payload must be one line")
        return f"data: {payload}\n\n".encode()

    def keep_alive(self) -> bytes:
        return b": keep-alive\n\n"

    def done(self) -> bytes:
        return b"data: [DONE]\n\n"


class IncrementalDetokenizer:
    """A choice's text as its tokens arrive (the TextStreamer contract). Decoding is vLLM's
    detokenize_incrementally (vllm/transformers_utils/detokenizer_utils.py) over decode(): each token decodes the
    window from prefix_offset, and the text past read_offset is taken once it ends in a whole character (then the
    window moves up); a few token ids per token, whatever the answer's length. Stop strings are matched by the
    engine's own matcher (sampling.StopStrings: vLLM's check_stop_strings, run after each token on the text that
    could end a new match), so the text is the engine's. The stream holds back the longest tail that a stop string
    begins with (vLLM holds back the longest stop string's length - 1 characters: the same text, later)."""

    def __init__(self, decode, stop: list[str], include_stop_str_in_output: bool = False, min_tokens: int = 0):
        self.decode = decode
        self.matcher = StopStrings(stop, include_stop_str_in_output, min_tokens) if stop else None
        self.hold = [] if include_stop_str_in_output else list(stop)
        self.ids: list[int] = []
        self.prefix_offset = self.read_offset = 0
        self.text = ""  # whole characters decoded so far; cut at the stop string once one matched
        self.shown = 0  # characters of text returned
        self.stop_reason: str | None = None
        self.ended = False

    def _tail(self) -> str:
        """The text the tokens past read_offset add, decoded with the window before them (as vLLM does: a
        tokenizer may decode a token differently at the start of a string)."""
        prefix = self.decode(self.ids[self.prefix_offset:self.read_offset])
        return self.decode(self.ids[self.prefix_offset:])[len(prefix):]

    def add(self, token_ids: list[int]) -> str:
        if self.ended:
            return ""
        for token in token_ids:
            self.ids.append(token)
            new = self._tail()
            if new and not new.endswith("\ufffd"):  # else: nothing yet, or a character still incomplete
                self.text += new
                self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            hit = self.matcher.check(self.text, len(self.ids)) if self.matcher else None
            if hit is not None:
                self.stop_reason, self.text, self.ended = hit[0], self.text[:hit[1]], True
                break
        held = 0 if self.ended else stop_prefix_len(self.text, self.hold)
        return self._release(len(self.text) - held)

    def finish(self) -> str:
        if self.ended:
            return ""
        self.ended = True
        self.text += self._tail()
        return self._release(len(self.text))

    def _release(self, end: int) -> str:
        out = self.text[self.shown:end]
        self.shown = max(self.shown, end)
        return out


@dataclass
class StreamComponents:
    """The parts the server streams with. make_buffer is called once per stream; make_detokenizer(decode, stop,
    include_stop_str_in_output, min_tokens) once per choice of every response, streamed or whole (its text is the
    answer's). write_timeout_s: a socket write that has not completed in this long means the reader stalled; the
    stream is aborted."""
    make_buffer: Callable[[], StreamBuffer] = field(default=lambda: BoundedStreamBuffer())
    disconnect: DisconnectWatcher = field(default_factory=ReceiveDisconnectWatcher)
    cache: IdempotencyCache = field(default_factory=LRUIdempotencyCache)
    resume: ResumePolicy = field(default_factory=ContinueResumePolicy)
    framer: SSEFramer = field(default_factory=DefaultSSEFramer)
    write_timeout_s: float = 10.0
    make_detokenizer: Callable[..., TextStreamer] = IncrementalDetokenizer

    def new_buffer(self) -> StreamBuffer:
        return self.make_buffer()

    def new_detokenizer(self, decode, stop: list[str], include_stop_str_in_output: bool = False,
                        min_tokens: int = 0) -> TextStreamer:
        return self.make_detokenizer(decode, list(stop), include_stop_str_in_output, min_tokens)
