"""Drive a learner's streaming components, alone and inside the real server, and report plain data.

Learner side (autograder/harnesses/__init__.py): checks call these in the learner's process through `t.run` /
`t.run_against`, with learner classes passed as `t.learner("Name")`; the grader runs the same function with the
server's own defaults (reference_engine/server/streaming.py) and judges the difference. Nothing here is trusted
by the grader: it runs next to learner code and returns only what a client or an operator could observe. The
answers a client must receive are the engine's own greedy answers to the prompts below, computed by the grader
(autograder/checks/l12_streaming.py, expected_answers).

    drive_buffer / drive_watcher / drive_cache / drive_resume / drive_framer / drive_streamer: one component,
        scripted (drive_streamer over ByteDecoder, a byte-level tokenizer's decode on a table of byte strings);
        drive_streamer_cost: how many token ids a streamer decodes over a long answer
    run_server: create_app(engine, components=StreamComponents(<the parts>)) under uvicorn on a free port
        (small socket and write buffers, so that a reader that stops reading stalls the server's writes
        after a few KiB), then scripted clients, one after another: a vanishing one, polite ones beside a
        long stream read by a client that keeps up and then beside a stalled one (their pace compared), a
        retrying one, a resuming one, and the text of an answer with a stop string, streamed and whole.
        Every wait is bounded; the server, its threads and sockets are closed before it returns.
"""
from __future__ import annotations

import asyncio
import collections
import json
import socket
import threading
import time

from autograder.harnesses import harness
from reference_engine.shipped import DRAFT

MODEL = "m"
# The prompts of run_server's clients whose whole answer is judged (greedy, so the answer is a fact of the model).
POLITE_PROMPTS = [[31, 32, 33], [31, 32, 34], [31, 32, 35]]
RETRY_PROMPT = [41, 42, 43]
RESUME_PROMPT = [51, 52]
# The text case: the draft's greedy answer to TEXT_PROMPT is "(self, other):\n        self._writing =
# self._writing()..." in tokens '(', 'self', ',', ' other', '):', '\n       ', ' self', '._', 'w', 'rit', 'ing',
# ' =', ...: TEXT_STOP spans four tokens, and "writing" is held back once (until ' =' rules it out) before the
# stop string completes. TEXT_SHORT tokens end on "writ", the start of TEXT_STOP, which only the end of the answer releases.
TEXT_PROMPT, TEXT_STOP, TEXT_TOKENS, TEXT_SHORT = [71, 72], "writing()", 40, 10

# -- one component at a time -------------------------------------------------------------------------------


@harness
def drive_buffer(cls, high_water: int, max_lag_s: float, ops: list) -> list:
    """ops: ("push", token_ids, now) or ("pop", now). Returns, per op, (what it returned, pending after)."""
    buf = cls(high_water, max_lag_s)
    out = []
    for op in ops:
        value = buf.push(list(op[1]), op[2]) if op[0] == "push" else buf.pop(op[1])
        value = list(value) if op[0] == "pop" and isinstance(value, (list, tuple)) else value
        out.append((value, buf.pending))
    return out


@harness
def drive_buffer_lists(cls) -> dict:
    """Whether a buffer leaves its caller's lists alone: push [1, 2], push [3], pop, push [4], push [5], pop
    on cls(16, 60.0); returns the pushed lists and the popped ones as the caller holds them afterwards."""
    buf = cls(16, 60.0)
    pushed = [[1, 2], [3], [4], [5]]
    buf.push(pushed[0], 0.0)
    buf.push(pushed[1], 0.1)
    first = buf.pop(0.2)
    buf.push(pushed[2], 0.3)
    buf.push(pushed[3], 0.4)
    second = buf.pop(0.5)
    return {"pushed": [list(x) for x in pushed], "popped": [list(first), list(second)]}


BLOCKED_S = 0.02  # every gap between handing watch a message and its next receive() longer than this: blocked
HUNG_S = 5.0  # how long drive_watcher waits, past its own deadline, for a watcher that never returns


@harness
def drive_watcher(cls, messages: list, timeout_s: float = 1.0) -> dict:
    """Run watch() over a scripted receive channel: `messages` are the ASGI message types it returns in
    order, after which receive() waits forever (like a connection that stays open). Returns how many
    messages watch read, how many times it called on_disconnect, whether it returned by itself (False: it
    was still waiting, and was cancelled), and whether it blocked the event loop: every gap between
    receive() handing it a message and its next call to receive() took over BLOCKED_S (a watcher that only
    awaits takes microseconds; one that calls time.sleep takes the sleep; asking for every gap, not one,
    keeps a machine's hiccup from counting).

    "By itself" means within timeout_s of the channel going silent (every message read and receive() called
    once more), or within 3 * timeout_s of the start for a watcher that never asks again: the clock starts
    when the watcher is waiting on a silent connection, so a machine that is slow to start the loop cannot
    cut a right watcher short."""
    async def main():
        read, calls, handed, gaps, silent_since = [0], [0], [None], [], [None]
        loop = asyncio.get_running_loop()

        async def receive():
            if handed[0] is not None:
                gaps.append(time.monotonic() - handed[0])
            if read[0] < len(messages):
                read[0] += 1
                await asyncio.sleep(0)
                handed[0] = time.monotonic()
                return {"type": messages[read[0] - 1], "body": b"", "more_body": False}
            handed[0] = None
            if silent_since[0] is None:
                silent_since[0] = loop.time()
            await asyncio.sleep(3600)

        def on_disconnect():
            calls[0] += 1
        task = asyncio.ensure_future(cls().watch(receive, on_disconnect))
        start = loop.time()
        while not task.done():
            now = loop.time()
            if (silent_since[0] is not None and now - silent_since[0] >= timeout_s) or now - start >= 3 * timeout_s:
                break
            await asyncio.wait({task}, timeout=timeout_s / 10)
        returned = await _finish(task)
        return {"read": read[0], "on_disconnect_calls": calls[0], "returned": returned,
                "blocked": bool(gaps) and min(gaps) > BLOCKED_S}
    # A watcher that never gives its event loop back (a loop with no await, a blocking call) holds that thread
    # for good: after HUNG_S more, report it as data (the check then ends; its process goes with it).
    return _run_in_thread(main, 3 * timeout_s + HUNG_S, "watcher-driver")


async def _finish(task) -> bool:
    """Whether the task returned by itself: if not, cancel it (and wait for it); if it raised, raise that."""
    if not task.done():
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return False
    if task.exception() is not None:
        raise task.exception()
    return True


def _run_in_thread(main, join_s: float, name: str):
    """asyncio.run(main()) in a thread of its own (the caller may already run an event loop, a notebook's, where
    asyncio.run fails); {"hung": True} if it has not ended after join_s; what main raised is raised here."""
    box: dict = {}

    def run():
        try:
            box["value"] = asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(join_s)
    if thread.is_alive():
        return {"hung": True}
    if "error" in box:
        raise box["error"]
    return box["value"]


@harness
def drive_cache(cls, max_entries: int, ops: list) -> list:
    """ops: ("put", key, in_flight, subscribers[, finish_reason]), ("get", key), ("set", key, in_flight,
    subscribers[, finish_reason]) (change the state of the Generation put under key). Returns per op: put
    or set -> len(cache); get -> the key of the Generation returned, or None."""
    from reference_engine.server.interfaces import Generation
    cache, gens, out = cls(max_entries), {}, []
    for op in ops:
        reason = op[4] if len(op) > 4 else None
        if op[0] == "put":
            gens[op[1]] = g = Generation(op[1], "fp", [1], 8, finish_reason=reason, in_flight=op[2],
                                         subscribers=op[3])
            cache.put(op[1], g)
            out.append(len(cache))
        elif op[0] == "get":
            g = cache.get(op[1])
            out.append(None if g is None else g.key)
        else:
            g = gens[op[1]]
            g.in_flight, g.subscribers, g.finish_reason = op[2], op[3], reason
            out.append(len(cache))
    return out


@harness
def drive_resume(plan, cases: list) -> list:
    """cases: dicts of Generation fields (prompt_token_ids, token_ids, max_tokens, finish_reason, in_flight)
    and "received". Returns per case (replay, continue_prompt, max_tokens), or (exception type name, message)
    when the plan raised ValueError or TypeError (the spec asks for ValueError; TypeError is the usual
    wrong one)."""
    from reference_engine.server.interfaces import Generation
    out = []
    for c in cases:
        g = Generation("k", "fp", list(c["prompt_token_ids"]), c["max_tokens"], token_ids=list(c["token_ids"]),
                       finish_reason=c["finish_reason"], in_flight=c["in_flight"])
        try:
            p = plan(g, c["received"])
        except (ValueError, TypeError) as e:
            out.append(("ValueError" if isinstance(e, ValueError) else "TypeError", str(e)[:200]))
            continue
        cont = None if p.continue_prompt is None else list(p.continue_prompt)
        out.append((list(p.replay), cont, p.max_tokens))
    return out


@harness
def drive_framer(cls, interval: float, payloads: list) -> dict:
    """Every output of an SSEFramer(interval), as bytes; and whether event() refused a two-line payload
    (split by \\n) and a payload ending in \\r (SSE ends a line at either)."""
    f = cls(interval)
    try:
        f.event('{"a": 1}\n{"b": 2}')
        refused = False
    except ValueError:
        refused = True
    try:
        f.event('{"a": 1}\r')
        refused_cr = False
    except ValueError:
        refused_cr = True
    return {"interval": f.keep_alive_interval, "events": [f.event(p) for p in payloads],
            "keep_alive": f.keep_alive(), "done": f.done(), "refuses_newline": refused,
            "refuses_cr": refused_cr}


class ByteDecoder:
    """decode(token_ids) -> str as a byte-level tokenizer decodes: token i stands for the bytes pieces[i]; the
    bytes are joined and read as UTF-8, with U+FFFD for what is not (yet) a whole character. Counts what it is
    asked: calls, and token ids decoded in all."""

    def __init__(self, pieces: list):
        self.pieces = [bytes(p) for p in pieces]
        self.calls = self.ids_decoded = 0

    def __call__(self, token_ids) -> str:
        ids = list(token_ids)
        self.calls += 1
        self.ids_decoded += len(ids)
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


@harness
def drive_streamer(cls, pieces: list, stop: list, include: bool, min_tokens: int, ops: list) -> list:
    """cls(ByteDecoder(pieces), stop, include, min_tokens) driven by ops: ("add", token_ids) or ("finish",).
    Returns per op (what it returned, stop_reason after it)."""
    s = cls(ByteDecoder(pieces), list(stop), include, min_tokens)
    out = []
    for op in ops:
        got = s.add(list(op[1])) if op[0] == "add" else s.finish()
        out.append((got, s.stop_reason))
    return out


COST_TOKENS = 2000
COST_STOP = "<|end|>"


def cost_pieces(n: int = COST_TOKENS) -> list[bytes]:
    """n tokens of text with multi-byte characters (some split across tokens) and the start of COST_STOP now and
    then, but never all of it: token i stands for pieces[i]."""
    words = ["the ", "caf\u00e9 ", "<|en", "d ", "\u20ac5 ", "\U0001f600 ", "<", "|e", "x ", "na\u00efve "]
    data = "".join(words[i % len(words)] for i in range(n)).encode()
    out, at = [], 0
    for i in range(n):
        out.append(data[at:at + 1 + i % 3])
        at += 1 + i % 3
    return out


@harness
def drive_streamer_cost(cls, n: int = COST_TOKENS) -> dict:
    """An answer of n tokens (cost_pieces) added one at a time, then finish(): the token ids decode was given
    in all (an incremental detokenizer decodes a few per token), its calls, and the text returned, joined."""
    decode = ByteDecoder(cost_pieces(n))
    s = cls(decode, [COST_STOP], False, 0)
    text = "".join(s.add([i]) for i in range(n)) + s.finish()
    return {"tokens": n, "ids_decoded": decode.ids_decoded, "calls": decode.calls, "text": text}


# -- the server ------------------------------------------------------------------------------------------------


class _Recording:
    """Wraps a stream buffer to record the most tokens it ever held (per-stream memory) and, each time it gave a
    reader up, whether the contract allowed it: more than high_water tokens waiting, or one older than max_lag_s
    (drops: a list of True for those, False for a reader given up early)."""

    def __init__(self, inner, peaks: list, drops: list, high_water: int, max_lag_s: float, live: list | None = None):
        self.inner, self.peaks, self.i, self.drops = inner, peaks, len(peaks), drops
        self.high_water, self.max_lag_s = high_water, max_lag_s
        self.waiting = collections.deque()  # [push time, tokens] the reader has not taken yet
        self.held = 0  # tokens pushed and not yet popped, counted here (an int: read from other threads)
        peaks.append(0)
        if live is not None:
            live.append(self)

    def push(self, token_ids, now):
        ok = self.inner.push(token_ids, now)
        self.peaks[self.i] = max(self.peaks[self.i], self.inner.pending)
        if token_ids:
            self.waiting.append([now, len(token_ids)])
            self.held += len(token_ids)
        if not ok:
            held = sum(n for _, n in self.waiting)
            self.drops.append(held > self.high_water or bool(self.waiting and now - self.waiting[0][0] > self.max_lag_s))
        return ok

    def pop(self, now):
        out = self.inner.pop(now)
        taken = len(out) if isinstance(out, list) else 0
        self.held = max(0, self.held - taken)
        while taken and self.waiting:
            n = min(taken, self.waiting[0][1])
            self.waiting[0][1] -= n
            taken -= n
            if not self.waiting[0][1]:
                self.waiting.popleft()
        return out

    @property
    def pending(self):
        return self.inner.pending


class _PlanAdapter:
    def __init__(self, plan):
        self.plan = plan


def _sse(lines):
    """Parsed `data:` events until [DONE] (which yields "DONE")."""
    for line in lines:
        if line.startswith("data: "):
            if line == "data: [DONE]":
                yield "DONE"
                return
            yield json.loads(line[6:])


def _body(prompt: list[int], max_tokens: int) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}


def _read(base_url: str, body: dict, headers: dict | None = None, stop_after: int | None = None,
          until: threading.Event | None = None) -> dict:
    """One streamed answer read by an SSE parser that follows the spec (an event ends at a blank line).
    Returns token ids, finish_reason, whether [DONE] came, or the error. stop_after: close the connection
    after that many tokens; until: close it once this event is set (checked after each event)."""
    import httpx
    ids, reason, done = [], None, False
    try:
        # verify=False: plain HTTP to this machine, so no TLS context to build (building one reads the CA
        # bundle: ~20 ms of CPU a client, which the server beside it would feel).
        with httpx.Client(timeout=15, verify=False) as c, c.stream("POST", base_url + "/v1/completions", json=body,
                                                     headers=headers or {}) as r:
            if r.status_code != 200:
                return {"tokens": ids, "finish_reason": None, "done": False, "error": f"HTTP {r.status_code}"}
            data: list[str] = []
            for line in r.iter_lines():
                if line.startswith(":"):
                    continue
                if line.startswith("data: "):
                    data.append(line[6:])
                    continue
                if line or not data:
                    continue
                payload, data = "\n".join(data), []
                if payload == "[DONE]":
                    done = True
                    break
                ev = json.loads(payload)
                if "error" in ev:
                    return {"tokens": ids, "finish_reason": None, "done": False, "error": ev["error"]["code"]}
                ids += ev["choices"][0]["token_ids"]
                reason = ev["choices"][0]["finish_reason"] or reason
                if (stop_after is not None and len(ids) >= stop_after) or (until is not None and until.is_set()):
                    break
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
        return {"tokens": ids, "finish_reason": reason, "done": done, "error": f"{type(e).__name__}: {str(e)[:120]}"}
    return {"tokens": ids, "finish_reason": reason, "done": done, "error": None}


def _read_text(base_url: str, body: dict) -> dict:
    """One answer's text. Streamed (body["stream"]): the chunks as (text, token ids) in order, with the
    finish_reason and stop_reason of the last; whole: its text as one chunk. Or the error."""
    import httpx
    chunks, reason, stop_reason, done = [], None, None, False

    def failed(error: str) -> dict:
        return {"chunks": chunks, "finish_reason": reason, "stop_reason": stop_reason, "done": False, "error": error}
    try:
        with httpx.Client(timeout=15, verify=False) as c:
            if not body.get("stream"):
                r = c.post(base_url + "/v1/completions", json=body)
                if r.status_code != 200:
                    return failed(f"HTTP {r.status_code}: {r.text[:200]}")
                ch = r.json()["choices"][0]
                return {"chunks": [(ch["text"], ch["token_ids"])], "finish_reason": ch["finish_reason"],
                        "stop_reason": ch.get("stop_reason"), "done": True, "error": None}
            with c.stream("POST", base_url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    return failed(f"HTTP {r.status_code}")
                for ev in _sse(r.iter_lines()):
                    if ev == "DONE":
                        done = True
                        break
                    if "error" in ev:
                        return failed(ev["error"]["code"])
                    ch = ev["choices"][0]
                    chunks.append((ch["text"], ch["token_ids"]))
                    reason = ch["finish_reason"] or reason
                    stop_reason = ch.get("stop_reason") or stop_reason
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        return failed(f"{type(e).__name__}: {str(e)[:120]}")
    return {"chunks": chunks, "finish_reason": reason, "stop_reason": stop_reason, "done": done, "error": None}


class _Guarded:
    """Wraps a text streamer to record what it raised in the server (where it would only break a stream)."""

    def __init__(self, inner, errors: list):
        self.inner, self.errors = inner, errors

    def _call(self, name, *args):
        try:
            return getattr(self.inner, name)(*args)
        except Exception as e:
            self.errors.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
            raise

    def add(self, token_ids):
        return self._call("add", token_ids)

    def finish(self):
        return self._call("finish")

    @property
    def stop_reason(self):
        return self.inner.stop_reason


def _wait(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


BEHIND = 8  # tokens waiting in the stalled stream's buffer before the polite streams start


def _aborts(metrics, cause: str) -> float:
    return metrics.request_aborts.labels(cause)._value.get()


POLITE_TOKENS, RETRY_TOKENS, RESUME_TOKENS = 24, 112, 40


class ServerUnderTest:
    """The real server on the draft model (greedy) with a learner's parts plugged in, instrumented: every engine
    step's (start, end), every Generation the server starts and what earlier ones were doing then, the buffers'
    peaks and drops, what the text streamer raised. Each wait gives up after wait_s, and all of them together
    at `end` (a broken part then shows as a client that got nothing, not as a hang)."""

    def __init__(self, buffer_cls, watcher_cls, cache_cls, plan, framer_cls, streamer_cls, high_water: int,
                 wait_s: float, budget_s: float):
        import torch

        from reference_engine.server.api import create_app
        from reference_engine.server.runner import ServerThread
        from reference_engine.server.streaming import StreamComponents
        from reference_engine.tools.startup import build_engine
        torch.set_num_threads(1)
        self.engine, _ = build_engine(str(DRAFT), warm_up=False, max_num_seqs=8)
        self.high_water, self.wait_s = high_water, wait_s
        self.peaks: list[int] = []
        self.drops: list[bool] = []  # per reader given up: whether the contract allowed it (see _Recording)
        lag = 60.0  # max_lag_s of every stream buffer
        self.buffers: list[_Recording] = []  # every stream's buffer, in order of creation
        self.streamer_errors: list[str] = []  # what the text streamer raised in the server
        comps = StreamComponents(
            make_buffer=lambda: _Recording(buffer_cls(high_water, lag), self.peaks, self.drops, high_water, lag,
                                           self.buffers),
            disconnect=watcher_cls(), cache=cache_cls(1), resume=_PlanAdapter(plan), framer=framer_cls(0.5),
            write_timeout_s=3.0, make_detokenizer=lambda *args: _Guarded(streamer_cls(*args), self.streamer_errors))
        app = create_app(self.engine, MODEL, components=comps)
        self.server = ServerThread(app, sndbuf=4096, write_buffer_bytes=2048).start()
        self.url, self.port = self.server.base_url, self.server.port
        self.aengine, self.metrics, self.service = app.state.aengine, app.state.metrics, app.state.service
        self.started: list = []  # every engine request the server starts: (key, Generation)
        self.steps_log: list[tuple[float, float]] = []  # (start, end) of every engine step (the engine thread's)
        # key -> {each earlier key: (in_flight, subscribers, finish_reason, tokens) of its latest Generation} when
        # key first started
        self.live_at_start: dict = {}
        engine_step, start = self.engine.step, self.service._start

        def timed_step():
            t0 = time.monotonic()
            try:
                return engine_step()
            finally:
                self.steps_log.append((t0, time.monotonic()))

        def recording_start(gen, prompt, params):
            self.live_at_start.setdefault(gen.key, {k: (g.in_flight, g.subscribers, g.finish_reason,
                                                        len(g.token_ids)) for k, g in self.started})
            self.started.append((gen.key, gen))
            start(gen, prompt, params)
        self.engine.step, self.service._start = timed_step, recording_start
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def bounded(self, cond, timeout_s: float | None = None) -> bool:
        return _wait(cond, min(self.wait_s if timeout_s is None else timeout_s, self.left()))

    def idle(self) -> bool:
        """The engine holds no request and no block, and every Generation has heard how its request ended
        (the engine thread frees blocks first; the outcome reaches the event loop after that)."""
        _, free, requests = self.aengine.snapshot
        return requests == 0 and free == self.engine.num_blocks and not any(g.in_flight for _, g in self.started)

    def generated(self, key) -> tuple[int, int, int]:
        """(engine requests, tokens generated, Generations) for every Generation started under key: a cache that
        lost the key shows as a second Generation, which a lookup by key alone would not see."""
        gens = {id(g): g for k, g in self.started if k == key}
        return sum(k == key for k, _ in self.started), sum(g.engine_tokens for g in gens.values()), len(gens)

    def aborts(self, cause: str) -> float:
        return _aborts(self.metrics, cause)

    def close(self) -> dict:
        """Stop the server; what it left behind."""
        self.server.stop()
        return {"streamer_errors": self.streamer_errors[:3],
                "leaked_blocks": self.engine.num_blocks - self.engine.block_manager.num_free(),
                "engine_stopped": not self.aengine.running}


# -- the scenarios: scripted clients against a ServerUnderTest ---------------------------------------------


def vanish(sut: ServerUnderTest, long_tokens: int) -> dict:
    """A client that vanishes after 5 tokens of a long answer."""
    head = _read(sut.url, _body([11, 12, 13], long_tokens), stop_after=5)
    steps0 = sut.aengine.snapshot[0]
    freed = sut.bounded(sut.idle)
    delays = sut.aengine.abort_delays
    return {"received": len(head["tokens"]), "error": head["error"], "freed": freed,
            "steps_until_free": sut.aengine.snapshot[0] - steps0, "abort_delay": delays[-1] if delays else None,
            "aborted_as_disconnect": sut.aborts("client_disconnect") == 1}


def _polite_phase(sut: ServerUnderTest, polite_tokens: int):
    """The three polite streams, read one after another, and the engine steps that ran meanwhile."""
    n0, t0 = len(sut.steps_log), time.monotonic()
    streams = [_read(sut.url, _body(p, polite_tokens)) for p in POLITE_PROMPTS]
    t1 = time.monotonic()
    took = [b - a for a, b in sut.steps_log[n0:] if t0 <= a and b <= t1]
    return streams, {"tokens": sum(len(x["tokens"]) for x in streams), "steps": len(took), "wall_s": t1 - t0,
                     "busy_s": sum(took)}


def _stall_round(sut: ServerUnderTest, long_tokens: int, polite_tokens: int) -> dict:
    stop, reader = threading.Event(), {}
    keeps_up = threading.Thread(target=lambda: reader.update(r=_read(sut.url, _body([21, 23], long_tokens),
                                                                      until=stop)), daemon=True)
    keeps_up.start()
    sut.bounded(lambda: sut.aengine.snapshot[2] >= 1 or not keeps_up.is_alive())
    _, baseline = _polite_phase(sut, polite_tokens)
    stop.set()
    keeps_up.join(sut.left())
    sut.bounded(sut.idle)
    slow0 = sut.aborts("slow_reader")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    try:
        sock.connect(("127.0.0.1", sut.port))
        raw = json.dumps(_body([21, 22], long_tokens)).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw)
        sut.bounded(lambda: sut.aengine.snapshot[2] >= 1)
        # The polite streams start once the stalled stream is behind (its socket full, BEHIND tokens waiting in
        # its buffer): they are then read while the buffer has a reader to give up on.
        n0 = len(sut.buffers)
        sut.bounded(lambda: any(b.held >= BEHIND for b in sut.buffers[n0 - 1:]) or sut.aborts("slow_reader") > slow0)
        polite, beside = _polite_phase(sut, polite_tokens)
        dropped = sut.bounded(lambda: sut.aborts("slow_reader") == slow0 + 1)
        return {"polite": polite, "dropped_as_slow": dropped, "freed": sut.bounded(sut.idle), "pace": [baseline, beside]}
    finally:
        sock.close()


def stall(sut: ServerUnderTest, long_tokens: int, polite_tokens: int, pace_retry_below: float) -> dict:
    """Three polite streams beside a fourth, long stream whose reader keeps up (the baseline), then the same
    three beside a long stream whose reader stops reading. Step time grows with the batch, so both phases run
    one long answer beside the polite one; what differs is only the stalled reader. On a loaded machine one
    window can be slowed by other work: a pace ratio below pace_retry_below is measured once more (a part that
    busy-waits or blocks is slow on every try)."""
    def ratio(pace):
        (b, x) = pace
        return (x["tokens"] / x["wall_s"]) / (b["tokens"] / b["wall_s"]) if b["tokens"] and x["wall_s"] else 0.0
    out = _stall_round(sut, long_tokens, polite_tokens)
    out["paces"] = [out.pop("pace")]
    if ratio(out["paces"][0]) < pace_retry_below and out["dropped_as_slow"]:
        out["paces"].append(_stall_round(sut, long_tokens, polite_tokens)["pace"])
    return out


def retry(sut: ServerUnderTest, retry_tokens: int, polite_tokens: int) -> dict:
    """A retried request: while the first attempt is in flight, another key is put into the one-entry cache
    (only a cache that evicts a live entry loses "retry") and a second attempt attaches; a third comes after the
    end (a replay). The answer is long, so that it is still being generated when "other" arrives; at_other
    records whether it was (else the case is not graded)."""
    url = sut.url
    body, key = _body(RETRY_PROMPT, retry_tokens), {"Idempotency-Key": "retry"}
    results: dict = {}
    first = threading.Thread(target=lambda: results.update(first=_read(url, body, key)), daemon=True)
    first.start()
    sut.bounded(lambda: any(k == "retry" for k, _ in sut.started) or "first" in results)
    other = threading.Thread(target=lambda: results.update(other=_read(url, _body([44], polite_tokens),
                                                                        {"Idempotency-Key": "other"})), daemon=True)
    other.start()
    sut.bounded(lambda: "other" in sut.live_at_start or "other" in results)
    second = _read(url, body, key)
    first.join(sut.left())
    other.join(sut.left())
    third = _read(url, body, key)
    requests, tokens, gens = sut.generated("retry")
    return {"streams": [results.get("first"), second, third], "other": results.get("other"),
            "engine_requests": requests, "engine_tokens": tokens, "generations": gens, "answer": retry_tokens,
            # the server puts "other" into the cache right after starting it: the state of "retry" then
            "at_other": sut.live_at_start.get("other", {}).get("retry")}


def resume(sut: ServerUnderTest, resume_tokens: int) -> dict:
    """A client that loses the tail, then resumes with the key and the count it holds."""
    body, key = _body(RESUME_PROMPT, resume_tokens), "resume"
    part = _read(sut.url, body, {"Idempotency-Key": key}, stop_after=10)
    sut.bounded(sut.idle)
    tail = _read(sut.url, body, {"Idempotency-Key": key, "X-Resume-From": str(len(part["tokens"]))})
    requests, tokens, gens = sut.generated(key)
    return {"head": part["tokens"], "tail": tail, "engine_requests": requests, "engine_tokens": tokens,
            "generations": gens}


def text(sut: ServerUnderTest) -> dict:
    """An answer whose stop string spans four tokens, streamed and whole; and the same answer cut by max_tokens
    just after the start of the stop string, which only its end releases. The stream is read again (five times
    at most) while its last two tokens came in one chunk (the buffer coalesces what the event loop had no time
    to send): the stop string should come across several chunks."""
    body = {"model": MODEL, "prompt": TEXT_PROMPT, "max_tokens": TEXT_TOKENS, "temperature": 0, "stop": [TEXT_STOP]}
    for _ in range(5):
        streamed = _read_text(sut.url, {**body, "stream": True})
        if streamed["error"] or [len(ids) for _, ids in streamed["chunks"] if ids][-2:] == [1, 1]:
            break
    return {"stream": streamed, "whole": _read_text(sut.url, body),
            "short": _read_text(sut.url, {**body, "max_tokens": TEXT_SHORT, "stream": True})}


@harness
def run_server(buffer_cls, watcher_cls, cache_cls, plan, framer_cls, streamer_cls, high_water: int = 48,
               long_tokens: int = 400, polite_tokens: int = POLITE_TOKENS, retry_tokens: int = RETRY_TOKENS,
               resume_tokens: int = RESUME_TOKENS, wait_s: float = 20.0, budget_s: float = 90.0,
               pace_retry_below: float = 0.6) -> dict:
    """The server with these parts (plan: a function plan(generation, received) -> ResumePlan; streamer_cls
    made per choice as streamer_cls(decode, stop, include_stop_str_in_output, min_tokens)) on the draft
    model, greedy, driven by the scenarios above, in order. Returns plain data: a key per scenario, then what
    the buffers and the server left behind."""
    sut = ServerUnderTest(buffer_cls, watcher_cls, cache_cls, plan, framer_cls, streamer_cls, high_water, wait_s,
                          budget_s)
    out = {}
    try:
        out["vanish"] = vanish(sut, long_tokens)
        out["stall"] = stall(sut, long_tokens, polite_tokens, pace_retry_below)
        out["retry"] = retry(sut, retry_tokens, polite_tokens)
        out["resume"] = resume(sut, resume_tokens)
        out["text"] = text(sut)
        out["peak_pending"] = max(sut.peaks, default=0)
        out["early_drops"] = sut.drops.count(False)
        out["high_water"] = high_water
    finally:
        out.update(sut.close())
    return out
