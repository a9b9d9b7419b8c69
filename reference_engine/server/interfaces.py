"""The streaming path's pluggable parts. The server (api.py) calls them; streaming.py has its defaults.

A streamed answer passes through five decisions, each a defense against one way a client wastes a slot,
and one that decides what text each chunk shows:

  StreamBuffer       a reader that falls behind        -> coalesce, then give up (abort) past a limit
  DisconnectWatcher  a reader that vanishes            -> abort the engine request within one engine step
  IdempotencyCache   a client that retries             -> attach to, or replay, the one generation per key
  ResumePolicy       a client that lost the tail       -> continue from the tokens it already has
  SSEFramer          the bytes on the wire             -> `data:` events, keep-alive comments, [DONE]
  TextStreamer       the text of each chunk            -> decode a window of tokens; never show a character
                                                          not yet complete or text a stop string may claim

Pass replacements to api.create_app(components=StreamComponents(...)). Every method is called on the
server's event loop (never concurrently with itself), so implementations need no locks; none may block.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class StreamBuffer(Protocol):
    """Tokens produced for one stream and not yet written to its socket.

    The engine pushes tokens as steps finish; the writer pops whatever has accumulated. Contract:
      - push(token_ids, now) appends and returns True, or returns False when the reader is too far behind
        (the server then aborts the stream: the engine request ends and its KV blocks are freed). Once it
        returned False the buffer is dead: later pushes return False too.
      - pop(now) returns every pending token id in order, as ONE list (coalescing: a reader that fell
        behind gets one larger event, not many small ones), and empties the buffer; [] when nothing waits.
      - pending is the number of tokens waiting. It never exceeds the high-water mark the
        implementation chose: per-stream memory is bounded whatever the reader does.
      - No token is lost or reordered while push keeps returning True.
    `now` is time.monotonic() seconds (passed in so tests can drive the clock).
    """

    def push(self, token_ids: list[int], now: float) -> bool: ...

    def pop(self, now: float) -> list[int]: ...

    @property
    def pending(self) -> int: ...


@runtime_checkable
class DisconnectWatcher(Protocol):
    """Notices that the client went away while its answer streams.

    watch(receive, on_disconnect) runs as its own task for the life of the response: it reads ASGI
    messages from `receive` and calls on_disconnect() once when it sees {"type": "http.disconnect"}, then
    returns. The server cancels it when the response ends normally. on_disconnect queues the engine abort,
    which the engine loop applies before its next step: the slot is free within one engine step.
    """

    def watch(self, receive: Callable[[], Awaitable[dict]], on_disconnect: Callable[[], None]) -> Awaitable[None]: ...


@dataclass
class Generation:
    """One answer, shared by every stream attached to it (the first request and its retries).

    token_ids grows as the engine produces tokens; finish_reason is set once the answer is complete
    ("stop", "length"), given up ("abort") or failed in the engine ("error", with error set). engine_tokens
    counts tokens the engine generated for this answer over all its engine requests: with a correct cache
    and resume it equals len(token_ids), and any excess is duplicated work. in_flight: an engine request is
    producing tokens for it now.
    """
    key: str | None
    fingerprint: str
    prompt_token_ids: list[int]
    max_tokens: int
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    engine_tokens: int = 0
    engine_requests: int = 0
    in_flight: bool = False
    subscribers: int = 0
    params: Any = None  # the request's SamplingParams (a continuation reuses them with fewer max_tokens)
    request_id: str = ""  # the engine request producing it now (or last)
    uid: str = ""  # the server's name for this answer
    error: Any = None  # the engine's exception, if a step failed under it

    @property
    def finished(self) -> bool:
        return self.finish_reason in ("stop", "length")


@runtime_checkable
class IdempotencyCache(Protocol):
    """Idempotency-Key -> the Generation it started, so a retried request is never generated twice.

    Contract:
      - get(key) returns the Generation stored under key, or None (never seen, or evicted).
      - put(key, generation) stores it; a key is put once, by the first request that carries it.
      - Entries are kept while in flight or subscribed; finished ones may be evicted (by age or count)
        but only finished or abandoned ones: evicting an in-flight entry would let a retry start a
        second generation.
      - len(cache) is the number of entries held (bounded).
    The server checks the fingerprint (the request body's hash): the same key with a different body
    is the client's bug and gets a 422, not somebody else's answer.
    """

    def get(self, key: str) -> Generation | None: ...

    def put(self, key: str, generation: Generation) -> None: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class ResumePlan:
    """What to send a client that already holds `received` tokens of a Generation.

    replay: the cached tokens it does not have yet (send these first).
    continue_prompt: None when nothing must be generated (the answer is finished, or an engine request
    is producing it now and the stream attaches to it); else the token ids to start a new engine request
    with (the prompt followed by every token generated so far), for max_tokens more tokens.
    """
    replay: list[int]
    continue_prompt: list[int] | None = None
    max_tokens: int = 0


@runtime_checkable
class ResumePolicy(Protocol):
    """plan(generation, received) -> ResumePlan. Contract: never regenerate a token the Generation
    already holds (continue from the end of token_ids, with max_tokens - len(token_ids) left); raise
    ValueError when received is negative or exceeds len(generation.token_ids) (the client cannot hold
    tokens the server never produced)."""

    def plan(self, generation: Generation, received: int) -> ResumePlan: ...


@runtime_checkable
class SSEFramer(Protocol):
    """Server-sent events framing (the text/event-stream format the OpenAI clients parse).

      event(payload: str) -> b"data: <payload>\\n\\n" (payload is one line of JSON)
      keep_alive()        -> a comment line, b": ...\\n\\n", which clients ignore but proxies count as traffic
      done()              -> b"data: [DONE]\\n\\n", the OpenAI end-of-stream marker
      keep_alive_interval -> seconds of silence after which the server sends keep_alive()
    """
    keep_alive_interval: float

    def event(self, payload: str) -> bytes: ...

    def keep_alive(self) -> bytes: ...

    def done(self) -> bytes: ...


@runtime_checkable
class TextStreamer(Protocol):
    """One choice's text as its tokens arrive: incremental detokenization with stop strings (vLLM's
    IncrementalDetokenizer and check_stop_strings, vllm/v1/engine/detokenizer.py).

    Made per choice by StreamComponents.make_detokenizer(decode, stop, include_stop_str_in_output, min_tokens),
    with decode the tokenizer's (token ids -> str; bytes of a character not all there decode as U+FFFD). The
    answer's text is decode(all its token ids), cut at the first stop string to complete: before it, or after it
    with include_stop_str_in_output; text made by the first min_tokens tokens is never searched. Contract:
      - add(token_ids) takes the next tokens and returns the text they make safe to show: all of the text not
        shown yet except a trailing character not yet complete and the longest tail that a stop string begins
        with (the next tokens may complete it; nothing is held back with include_stop_str_in_output). Once a
        stop string completes (the one that ends first; on a tie the one listed first) it returns the text up
        to the cut, sets stop_reason, and every later add returns "".
      - finish() is called once the answer ended without a stop string (length, EOS): it returns what is
        still held back (a character never completed as U+FFFD); "" after a stop string, or when called again.
      - What add and finish return only appends: joined, it is the answer's text, whatever the chunking.
      - It decodes incrementally: a window of the last tokens per token, not the whole answer (which would
        cost O(n^2) over an answer of n tokens), and searches only text that could end a new match.
    The server feeds a resumed stream the tokens its client already holds first, and drops that text.
    """
    stop_reason: str | None

    def add(self, token_ids: list[int]) -> str: ...

    def finish(self) -> str: ...
