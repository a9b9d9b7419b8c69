"""Lesson 12: streaming robustness. Five defenses of a GPU slot against the clients of a streamed answer,
and the text each chunk shows.

A streamed answer holds an engine slot and its KV blocks from the first token to the last. Four kinds of
client waste that slot, each in its own way, and each has its own defense, written here against the
server's interfaces (reference_engine/server/interfaces.py) and plugged into the real server:

    12.1 CoalescingBuffer  a reader that falls behind: coalesce what waits into one event; past a
                           token limit or a time limit, give up (the server then aborts the request)
    12.2 DisconnectWatcher a reader that vanishes: notice http.disconnect, so the abort lands within
                           one engine step instead of after the last token
    12.3 IdempotencyCache  a client that retries: one Generation per Idempotency-Key (this server's header,
                           not OpenAI's API), never two
    12.4 plan_resume       a client that lost the tail: replay what it lacks, generate only what no
                           one has generated yet
    12.5 SSEFramer         the bytes on the wire: `data:` events, keep-alive comments, [DONE]
    12.6 StopStringDetokenizer  the text of each chunk: decode a window of tokens, hold back a character
                           not yet complete and any tail a stop string may still claim, cut at the stop string

`components(...)` (given) builds the server's StreamComponents from these classes. The bottom of the file
holds the cost model the notebook and the interview use (given, not an exercise).
"""
from __future__ import annotations

import math
from collections import OrderedDict

from reference_engine.server.interfaces import Generation, ResumePlan
from reference_engine.server.streaming import StreamComponents

# -- 12.1 the per-stream buffer -------------------------------------------------------------------------


class CoalescingBuffer:
    """Exercise 12.1: the tokens of one stream that its socket has not taken yet (a StreamBuffer).

    CoalescingBuffer(high_water, max_lag_s): at most `high_water` tokens may wait, and the oldest waiting
    token may not wait longer than `max_lag_s` seconds.

      push(token_ids, now) -> bool: if the buffer is dead, return False. Otherwise the stream is too slow
          when the tokens already waiting plus the new ones would exceed high_water, or when a token is
          waiting and the oldest one arrived more than max_lag_s before `now` (now - oldest > max_lag_s).
          Then the buffer becomes dead, drops everything it held (a dead stream keeps no memory) and
          returns False. Else it appends the tokens (the oldest's arrival time is `now` if nothing was
          waiting; an empty push adds no token and starts no clock) and returns True. Decide BEFORE
          appending: pending never exceeds high_water. Keep a copy: the caller's list is not yours to change.
      pop(now) -> list[int]: every waiting token, in order, as one list (a reader that fell behind gets
          one bigger event, not many small ones); the buffer is then empty, and the lag clock starts
          again with the next token pushed. [] when nothing waits.
      pending (property) -> int: the number of tokens waiting.
      dead (attribute) -> bool: True once push has returned False.

    `now` is in seconds (time.monotonic() in the server). Example: high_water=4, max_lag_s=1:
    push([1], 0.0) True, push([2, 3], 0.5) True, pop(0.6) [1, 2, 3]; push([4, 5, 6, 7], 0.7) True,
    push([8], 0.8) False (5 > 4), pending 0, push([9], 0.9) False (dead).
    """

    def __init__(self, high_water: int = 256, max_lag_s: float = 10.0):
        if high_water < 1 or max_lag_s <= 0:
            raise ValueError(f"high_water ({high_water}) must be >= 1 and max_lag_s ({max_lag_s}) > 0")
        self.high_water, self.max_lag_s = high_water, max_lag_s
        ### BEGIN SOLUTION
        self._tokens: list[int] = []
        self._oldest: float | None = None  # arrival time of the oldest waiting token
        self.dead = False
        ### END SOLUTION

    def push(self, token_ids: list[int], now: float) -> bool:
        ### BEGIN SOLUTION
        if self.dead:
            return False
        too_many = len(self._tokens) + len(token_ids) > self.high_water
        too_old = self._oldest is not None and now - self._oldest > self.max_lag_s
        if too_many or too_old:
            self.dead, self._tokens, self._oldest = True, [], None
            return False
        if token_ids and self._oldest is None:
            self._oldest = now
        self._tokens = self._tokens + list(token_ids)
        return True
        ### END SOLUTION

    def pop(self, now: float) -> list[int]:
        ### BEGIN SOLUTION
        out, self._tokens, self._oldest = self._tokens, [], None
        return out
        ### END SOLUTION

    @property
    def pending(self) -> int:
        ### BEGIN SOLUTION
        return len(self._tokens)
        ### END SOLUTION


# -- 12.2 noticing a vanished client ----------------------------------------------------------------------


class DisconnectWatcher:
    """Exercise 12.2: notice that the client of a streamed answer went away (a DisconnectWatcher).

    async watch(receive, on_disconnect): runs as its own asyncio task beside the response. Await
    `receive()` again and again; each call returns one ASGI message, a dict whose "type" is
    "http.request" (request body; ignore it) or "http.disconnect" (the client closed the connection).
    On the first "http.disconnect" call on_disconnect() exactly once and return (read nothing more).
    Never call on_disconnect for any other message. The server cancels this task when the response ends
    normally, so waiting forever on receive() is fine. Do not block: only `await`.
    """

    async def watch(self, receive, on_disconnect) -> None:
        ### BEGIN SOLUTION
        while True:
            message = await receive()
            if message.get("type") == "http.disconnect":
                on_disconnect()
                return
        ### END SOLUTION


# -- 12.3 one generation per key ---------------------------------------------------------------------------


class IdempotencyCache:
    """Exercise 12.3: Idempotency-Key -> the Generation it started (an IdempotencyCache), LRU-bounded.

    IdempotencyCache(max_entries):
      get(key) -> the Generation stored under key, or None. A hit makes the key the most recently used.
      put(key, generation): store it as the most recently used key; then, while more than max_entries
          entries are held, evict the least recently used entry that may go. An entry may go only when
          its Generation is neither in flight (generation.in_flight) nor subscribed
          (generation.subscribers > 0): evicting a live one would let a retry start a second generation.
          If none may go, keep them all (the cache then briefly holds more than max_entries).
      len(cache) -> the number of entries held.

    Example, max_entries=2: put a (finished), put b (in flight), get a (order now b, a), put c (order
    b, a, c: one too many). b is the least recently used but in flight, so a is evicted: b and c remain.
    """

    def __init__(self, max_entries: int = 4096):
        self.max_entries = max_entries
        ### BEGIN SOLUTION
        self._entries: OrderedDict[str, Generation] = OrderedDict()
        ### END SOLUTION

    def get(self, key: str) -> Generation | None:
        ### BEGIN SOLUTION
        gen = self._entries.get(key)
        if gen is not None:
            self._entries.move_to_end(key)
        return gen
        ### END SOLUTION

    def put(self, key: str, generation: Generation) -> None:
        ### BEGIN SOLUTION
        self._entries[key] = generation
        self._entries.move_to_end(key)
        for old in [k for k, g in self._entries.items() if not g.in_flight and g.subscribers == 0]:
            if len(self._entries) <= self.max_entries:
                break
            del self._entries[old]
        ### END SOLUTION

    def __len__(self) -> int:
        ### BEGIN SOLUTION
        return len(self._entries)
        ### END SOLUTION


# -- 12.4 resuming a half-finished answer -----------------------------------------------------------------


def plan_resume(generation: Generation, received: int) -> ResumePlan:
    """Exercise 12.4: what a client holding `received` tokens of `generation` gets next (a ResumePolicy).

    Raise ValueError when received is not an int (a float, a string, or a bool: True is no count), is
    negative, or exceeds len(generation.token_ids) (a client cannot hold tokens the server never made).
    Otherwise:
      replay = generation.token_ids[received:], the cached tokens the client lacks (sent first);
      if the answer is finished (generation.finished: "stop" or "length", even with max_tokens left), or
      an engine request is producing it now
      (generation.in_flight: the stream attaches to it), or no token is left to make
      (max_tokens - len(token_ids) <= 0): ResumePlan(replay), nothing to generate;
      else ResumePlan(replay, continue_prompt, left): a new engine request continues from the END of
      what exists, with continue_prompt = prompt_token_ids + token_ids and left = max_tokens -
      len(token_ids). Never regenerate a token the Generation already holds.

    Example: prompt [5, 6], token_ids [7, 8, 9], max_tokens 5, aborted (not in flight), received 1 ->
    ResumePlan(replay=[8, 9], continue_prompt=[5, 6, 7, 8, 9], max_tokens=2).

    The replay comes from the server's copy, so what the client holds never changes; the continuation's own
    tokens equal an uninterrupted greedy run's only where the kernels are batch-invariant (this CPU engine;
    on a GPU, see reference_engine/server/serving.py).
    """
    ### BEGIN SOLUTION
    have = len(generation.token_ids)
    if not isinstance(received, int) or isinstance(received, bool) or not 0 <= received <= have:
        raise ValueError(f"resume from token {received!r}: this answer has {have} tokens so far, so the count of "
                         f"tokens received must be between 0 and {have}")
    replay = list(generation.token_ids[received:])
    left = generation.max_tokens - have
    if generation.finished or generation.in_flight or left <= 0:
        return ResumePlan(replay)
    return ResumePlan(replay, list(generation.prompt_token_ids) + list(generation.token_ids), left)
    ### END SOLUTION


class Resume:
    """plan_resume as the server's ResumePolicy object (given)."""

    def plan(self, generation: Generation, received: int) -> ResumePlan:
        return plan_resume(generation, received)


# -- 12.5 the bytes on the wire ----------------------------------------------------------------------------


class SSEFramer:
    """Exercise 12.5: server-sent events framing (an SSEFramer), what the OpenAI clients parse.

    SSEFramer(keep_alive_interval): keep the interval as the attribute keep_alive_interval (seconds of
    silence after which the server sends keep_alive()).
      event(payload) -> b"data: " + payload + b"\\n\\n" (UTF-8). The blank line ends the event; a line break
          inside the payload would end the field early, so raise ValueError if payload has one (\\n or \\r:
          SSE ends a line at either).
      keep_alive() -> a comment, a line starting with b":" and ending with b"\\n\\n" (clients ignore it;
          proxies and load balancers see traffic and keep the idle connection open).
      done() -> b"data: [DONE]\\n\\n", the OpenAI end-of-stream marker.
    """

    def __init__(self, keep_alive_interval: float = 5.0):
        self.keep_alive_interval = keep_alive_interval

    def event(self, payload: str) -> bytes:
        ### BEGIN SOLUTION
        if "\n" in payload or "\r" in payload:
            raise ValueError("an SSE data payload must be one line")
        return f"data: {payload}\n\n".encode()
        ### END SOLUTION

    def keep_alive(self) -> bytes:
        ### BEGIN SOLUTION
        return b": keep-alive\n\n"
        ### END SOLUTION

    def done(self) -> bytes:
        ### BEGIN SOLUTION
        return b"data: [DONE]\n\n"
        ### END SOLUTION


# -- 12.6 the text of each chunk ----------------------------------------------------------------------------


class StopStringDetokenizer:
    """Exercise 12.6: one choice's text as its tokens arrive, with stop strings (a TextStreamer).

    StopStringDetokenizer(decode, stop, include_stop_str_in_output=False, min_tokens=0): decode(token_ids) -> str
    is the tokenizer's (a character whose bytes are split across tokens decodes as U+FFFD until its last byte
    is there); stop is a list of stop strings. The answer's text is decode(all its tokens), cut at the first
    stop string to complete: before it, or after it with include_stop_str_in_output.

      add(token_ids) -> str: take the next tokens (one or more) and return the text they make safe to show:
          all the text not shown yet, except
            - a character not yet complete at the end (the decoded text ends in U+FFFD: wait for the rest), and
            - the longest tail of the text that some stop string begins with (the next tokens may complete
              it; hold nothing back with include_stop_str_in_output: a stop string is shown then anyway).
          Token by token, look for a stop string that ends in the text this token added (it may begin in
          text shown or held back before). When one completes (if several, the one that ends first; on a tie
          the one listed first): return the text up to it (and it, with include_stop_str_in_output), set
          stop_reason to it, and return "" from every later add. Text that the first min_tokens tokens make
          is never searched (a stop string that begins there and ends later counts).
      finish() -> str: the answer ended without a stop string (length, EOS): return everything held back, a
          character never completed included (as decode gives it: U+FFFD). "" after a stop string, and ""
          when called again.
      stop_reason (attribute): the stop string that ended the text; None until then.

    What add and finish return only appends: joined, it is the answer's text, however the tokens came.
    Decode incrementally, as vLLM does: per token, decode a window of the last few tokens (the ones since the
    text last ended in a whole character, and the run before them), not all the tokens (an answer of n tokens
    would then cost n^2 / 2 token ids of decoding); search only the new text and the longest stop string's
    length - 1 characters before it.

    Example, stop ["END"], one add per token "Hi", " E", "ND", "!": "Hi", " " (holds "E" back), "" (stop_reason
    "END"), "". With tokens "caf", b"\\xc3", b"\\xa9" (the two bytes of "é"): "caf", "", "é".
    """

    def __init__(self, decode, stop: list[str], include_stop_str_in_output: bool = False, min_tokens: int = 0):
        self.decode, self.stop = decode, list(stop)
        self.include_stop_str_in_output, self.min_tokens = include_stop_str_in_output, min_tokens
        self.stop_reason: str | None = None
        ### BEGIN SOLUTION
        self._ids: list[int] = []
        self._prefix = self._read = 0  # the window: ids[_prefix:_read] decode to text already in _text
        self._text = ""  # the whole characters decoded so far (cut at the stop string once one completes)
        self._searched = 0  # characters of _text already searched (or made by the first min_tokens tokens)
        self._shown = 0  # characters of _text returned
        self._done = False
        ### END SOLUTION

    def add(self, token_ids: list[int]) -> str:
        ### BEGIN SOLUTION
        if self._done:
            return ""
        for token in token_ids:
            self._ids.append(token)
            # What the tokens past _read add, decoded after the run before them (a tokenizer may decode a
            # token differently at the start of a string): vLLM's prefix_offset / read_offset window.
            before = self.decode(self._ids[self._prefix:self._read])
            new = self.decode(self._ids[self._prefix:])[len(before):]
            if new and not new.endswith("\ufffd"):  # else: nothing yet, or a character still incomplete
                self._text += new
                self._prefix, self._read = self._read, len(self._ids)
            start, self._searched = self._searched, len(self._text)
            if len(self._ids) <= self.min_tokens or start == len(self._text):
                continue
            hits = []
            for i, s in enumerate(self.stop):
                at = self._text.find(s, max(0, start - len(s) + 1))  # a match must end in the new text
                if at != -1:
                    hits.append((at + len(s), i, at))
            if hits:
                end, i, at = min(hits)
                self.stop_reason, self._done = self.stop[i], True
                self._text = self._text[:end if self.include_stop_str_in_output else at]
                break
        held = 0
        if not self._done and not self.include_stop_str_in_output:
            longest = max(map(len, self.stop), default=0)
            held = next((k for k in range(min(longest, len(self._text)), 0, -1)
                         if any(s.startswith(self._text[-k:]) for s in self.stop)), 0)
        out = self._text[self._shown:len(self._text) - held]
        self._shown += len(out)
        return out
        ### END SOLUTION

    def finish(self) -> str:
        ### BEGIN SOLUTION
        if self._done:
            return ""
        self._done = True
        before = self.decode(self._ids[self._prefix:self._read])
        self._text += self.decode(self._ids[self._prefix:])[len(before):]
        out, self._shown = self._text[self._shown:], len(self._text)
        return out
        ### END SOLUTION


# -- given: plugging them into the server -----------------------------------------------------------------


def components(high_water: int = 256, max_lag_s: float = 10.0, max_entries: int = 4096,
               keep_alive_interval: float = 5.0, write_timeout_s: float = 10.0) -> StreamComponents:
    """The server's StreamComponents built from this module's six classes:
    create_app(engine, components=components(...))."""
    return StreamComponents(make_buffer=lambda: CoalescingBuffer(high_water, max_lag_s), disconnect=DisconnectWatcher(),
                            cache=IdempotencyCache(max_entries), resume=Resume(),
                            framer=SSEFramer(keep_alive_interval), write_timeout_s=write_timeout_s,
                            make_detokenizer=StopStringDetokenizer)


# -- given: what a vanished client costs --------------------------------------------------------------------


def vanished_cost(prompt_tokens: int, received: int, max_tokens: int, step_s: float, block_size: int = 16,
                  detect_steps: int | None = None) -> dict:
    """What one client that vanishes after `received` tokens of a `max_tokens` answer costs the server.

    Without detection (detect_steps None) the engine generates the rest of the answer for nobody:
    max_tokens - received more steps in its slot. With detection, detect_steps more steps (one, when the
    abort is applied before the next step). step_s: seconds per decode step (the inter-token latency).
    Returns wasted_tokens, slot_seconds (= wasted steps * step_s), and the KV blocks the request holds at
    the end (ceil(tokens in context / block_size)), which stay taken for those slot-seconds."""
    left = max_tokens - received
    wasted = left if detect_steps is None else min(left, detect_steps)
    context = prompt_tokens + received + wasted
    return {"wasted_tokens": wasted, "slot_seconds": wasted * step_s,
            "blocks_held": math.ceil(context / block_size)}


def retry_waste(requests: int, retry_fraction: float, tokens_before_retry: float, deduplicated: bool) -> float:
    """Tokens generated twice over `requests` requests when `retry_fraction` of them are retried after their
    client received `tokens_before_retry` tokens. Without a cache each retry is a new generation that makes
    those tokens again (its first attempt, aborted on disconnect, made them for nobody); with a cache and
    resume, the retry replays them and continues: nothing is generated twice."""
    return 0.0 if deduplicated else requests * retry_fraction * tokens_before_retry


def buffer_bytes(streams: int, high_water: int, bytes_per_token: float) -> float:
    """The most memory the per-stream buffers can hold: streams * high_water tokens."""
    return streams * high_water * bytes_per_token
