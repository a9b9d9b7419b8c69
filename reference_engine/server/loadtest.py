"""Hostile load test (a benchmark whose correctness items pass or fail): many concurrent streams through a real
server while other clients attack it.

    python -m reference_engine.server.loadtest [--streams 200] [--partials 1000] [--model DIR] [--seed 0]

One server (the shipped model by default, in this process, on a free port, with small socket buffers so that a
slow reader pushes back on it after a few KiB) serves the same --streams streams (prompts, lengths, order) twice:
  baseline  every stream well-behaved
  hostile   10% disconnect mid-stream (half close their connection, half vanish: reset the socket), 10% read
            one event per 0.1 s from a 4 KiB socket buffer, 10% are retried with the same Idempotency-Key (half
            while the first still streams, half after dropping it, resuming with X-Resume-From), 70% are
            well-behaved; and while they run
              --partials connections that send half a request line, half the headers, or headers and part of a
                body, then stall (reopened whenever the server's read deadline, --read-timeout, 10 s here and
                30 s in `course serve`, closes them, until the streams end),
              --invalid requests (bad field types, out-of-range values, a NaN temperature written as Python's
                json.dumps writes it, broken JSON): each must get a 400 naming its field,
              --oversized 10 MiB bodies (half with a Content-Length, half chunked): each must get a 413.
A thread polls /health on a kept-alive connection throughout both runs. Every answer is compared with an
offline greedy LLM.generate of the same prompts, computed at the start of the run by a separate engine.

The report: the good streams (those that should get a whole answer: well-behaved, slow, retried) lost 0 tokens,
duplicated 0, token-identical to offline, and their finish reasons; the cut streams' tokens a prefix of offline's;
each hostile kind's outcome (status codes; aborts by cause, finish reasons and validation failures from
/metrics; partial connections closed by the read deadline); leaked KV blocks once idle; RSS before and after
(server and clients share this process); /health p50/p99/max in both runs (target: p99 under 100 ms); the
well-behaved streams' TTFT and inter-token latency (ITL, client-side) in both runs and their ratio. The exit
status is 1 if a correctness item fails, a /health poll goes unanswered, or the hostile run's /health p99 is not
under --health-p99-ms.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

PROMPTS = ["Once upon a time", "The river", "In the morning", "She said", "A long road", "The old house",
           "Far away", "Numbers are", "When the rain", "He opened the door"]
COMPLETE_KINDS = ("good", "slow", "retry-attach", "retry-resume")  # the good streams: a whole answer is due
CUT_KINDS = ("disconnect", "vanish")  # leave mid-stream: what they got must be a prefix of the answer
HEALTH_TARGET_S = 0.1
OVERSIZED_BYTES = 10 << 20
# A partial connection sends one of these and stalls: half a request line, half the headers, or whole headers
# announcing 1000 bytes of body and 15 of them.
PARTIAL_REQUESTS = (
    b"POST /v1/completions HTT",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    b'{"model": "targ',
)


def invalid_requests(model: str) -> list[tuple[str, str, bytes, str | None]]:
    """(what, path, raw body, the field the 400 must name) for each kind of invalid request."""
    ok = {"model": model, "prompt": "Hello", "max_tokens": 4}
    chat = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    return [(what, path, body if isinstance(body, bytes) else json.dumps(body).encode(), param)
            for what, path, body, param in [
                ("max_tokens a string", "/v1/completions", {**ok, "max_tokens": "ten"}, "max_tokens"),
                ("top_p 1.5", "/v1/completions", {**ok, "top_p": 1.5}, "top_p"),
                ("temperature NaN", "/v1/completions", {**ok, "temperature": float("nan")}, "temperature"),
                ("chat temperature NaN", "/v1/chat/completions", {**chat, "temperature": float("nan")},
                 "temperature"),
                ("temperature -0.5", "/v1/completions", {**ok, "temperature": -0.5}, "temperature"),
                ("stream a string", "/v1/completions", {**ok, "stream": "yes"}, "stream"),
                ("n 0", "/v1/completions", {**ok, "n": 0}, "n"),
                ("prompt a number", "/v1/completions", {**ok, "prompt": 7}, "prompt"),
                ("broken JSON", "/v1/completions", b'{"model": ', None),
                ("a JSON array", "/v1/completions", [1, 2], None)]]


@dataclass
class Stream:
    kind: str  # "good", "disconnect", "vanish", "slow", "retry-attach", "retry-resume"
    prompt: str
    max_tokens: int
    key: str | None = None
    token_ids: list[int] = field(default_factory=list)
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    coalesced_events: int = 0
    error: str | None = None


def plan_streams(n: int, rng: random.Random, min_tokens: int = 64, max_tokens: int = 128) -> list[Stream]:
    """The hostile run's streams: 10% leaving mid-stream (half disconnect, half vanish), 10% slow, 10% retried
    (half attach, half resume), the rest well-behaved."""
    k = n // 10
    kinds = (["disconnect"] * (k // 2) + ["vanish"] * (k - k // 2) + ["slow"] * k + ["retry-attach"] * (k // 2)
             + ["retry-resume"] * (k - k // 2) + ["good"] * (n - 3 * k))
    rng.shuffle(kinds)
    return [Stream(kind, rng.choice(PROMPTS), rng.randint(min_tokens, max_tokens), key=f"k{i}-{rng.random():.9f}"
                   if kind.startswith("retry") else None) for i, kind in enumerate(kinds)]


def polite(streams: list[Stream]) -> list[Stream]:
    """The baseline: the same streams (prompts, lengths, order), every one well-behaved."""
    return [Stream("good", s.prompt, s.max_tokens) for s in streams]


def _stream_body(model: str, s: Stream) -> dict:
    return {"model": model, "prompt": s.prompt, "max_tokens": s.max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}


async def read_stream(client, url: str, model: str, s: Stream, headers: dict, stop_after: int | None = None,
                      record: bool = True) -> list[int]:
    ids, t0, last = [], time.monotonic(), None
    async with client.stream("POST", url + "/v1/completions", json=_stream_body(model, s), headers=headers) as r:
        if r.status_code != 200:
            s.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            return ids
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                s.error = ev["error"]["code"]
                break
            new = ev["choices"][0]["token_ids"]
            now = time.monotonic()
            if new and record:
                if last is None:
                    s.ttft = now - t0
                else:
                    s.gaps.append(now - last)
                last = now
                s.coalesced_events += len(new) > 1
            ids += new
            s.finish_reason = ev["choices"][0]["finish_reason"] or s.finish_reason
            if stop_after is not None and len(ids) >= stop_after:
                break
    return ids


async def read_raw(url: str, model: str, s: Stream, delay_s: float = 0.0, vanish_after: int | None = None) -> list[int]:
    """A stream read from a raw socket with a small receive buffer (an HTTP client library would read ahead
    64 KiB and hide a slow reader from the server): one event every delay_s; vanish_after: after that many
    tokens, reset the connection (SO_LINGER 0: an RST, as from a client whose process died)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    body = json.dumps(_stream_body(model, s)).encode()
    writer.write(b"POST /v1/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    ids = []
    try:
        while line := (await reader.readline()).decode():
            if line.startswith("data: {"):
                ev = json.loads(line[6:])
                if "error" in ev:
                    s.error = ev["error"]["code"]
                    break
                ids += ev["choices"][0]["token_ids"]
                s.coalesced_events += len(ev["choices"][0]["token_ids"]) > 1
                s.finish_reason = ev["choices"][0]["finish_reason"] or s.finish_reason
                if vanish_after is not None and len(ids) >= vanish_after:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    break
                await asyncio.sleep(delay_s)
    finally:
        writer.close()
    return ids


async def run_stream(client, url: str, model: str, s: Stream, rng: random.Random) -> None:
    cut = rng.randint(1, max(1, min(20, s.max_tokens // 2)))  # where a leaving client leaves
    try:
        if s.kind == "good":
            s.token_ids = await read_stream(client, url, model, s, {})
        elif s.kind == "slow":
            s.token_ids = await read_raw(url, model, s, delay_s=0.1)
        elif s.kind == "disconnect":  # closes its connection (FIN)
            s.token_ids = await read_stream(client, url, model, s, {}, stop_after=cut)
        elif s.kind == "vanish":  # resets it (RST)
            s.token_ids = await read_raw(url, model, s, vanish_after=cut)
        elif s.kind == "retry-attach":  # the retry arrives while the first request still streams
            first = asyncio.ensure_future(read_stream(client, url, model, s, {"Idempotency-Key": s.key}))
            await asyncio.sleep(0.05)
            second = Stream(s.kind, s.prompt, s.max_tokens, s.key)
            b = await read_stream(client, url, model, second, {"Idempotency-Key": s.key}, record=False)
            a = await first
            s.token_ids = a if a == b else []
            s.error = None if a == b else "the retry received a different answer"
        else:  # retry-resume: the first connection drops after a few tokens; the retry resumes
            head = await read_stream(client, url, model, s, {"Idempotency-Key": s.key},
                                     stop_after=rng.randint(1, max(1, min(30, s.max_tokens - 1))))
            rest = Stream(s.kind, s.prompt, s.max_tokens, s.key)
            tail = await read_stream(client, url, model, rest, {"Idempotency-Key": s.key,
                                                                "X-Resume-From": str(len(head))}, record=False)
            s.token_ids, s.finish_reason, s.error = head + tail, rest.finish_reason, s.error or rest.error
    except Exception as e:  # counted, not raised: one broken client must not end the benchmark
        s.error = f"{type(e).__name__}: {e}"


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


# ---- what attacks the server while the streams run ------------------------------------------------------------
class HealthProbe(threading.Thread):
    """Polls /health on one kept-alive connection from a thread of its own (the clients' event loop is busy
    with hundreds of streams; a poll queued behind them would measure the clients). A poll that fails or does
    not answer within 5 s is a failure."""

    def __init__(self, url: str, interval_s: float = 0.01):
        super().__init__(name="health-probe", daemon=True)
        self.url, self.interval_s = url, interval_s
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._done = threading.Event()

    def run(self) -> None:
        import httpx
        with httpx.Client(timeout=5) as c:
            c.get(self.url + "/health")  # connect first: the polls measure answers, not connection setup
            while not self._done.is_set():
                t0 = time.perf_counter()
                try:
                    r = c.get(self.url + "/health")
                    failure = None if r.status_code == 200 and r.json() == {"status": "ok"} else \
                        f"HTTP {r.status_code}: {r.text[:100]}"
                except httpx.HTTPError as e:
                    failure = f"{type(e).__name__}: {e}"
                if failure is None:
                    self.latencies.append(time.perf_counter() - t0)
                else:
                    self.failures.append(failure)
                self._done.wait(self.interval_s)

    def finish(self) -> dict:
        self._done.set()
        self.join(10)
        xs = self.latencies
        return {"polls": len(xs) + len(self.failures), "failures": len(self.failures), "first_failures": self.failures[:3],
                "p50_s": pct(xs, 50), "p99_s": pct(xs, 99), "max_s": max(xs, default=float("nan")),
                "over_100ms": sum(x >= HEALTH_TARGET_S for x in xs)}


@dataclass
class Partials:
    """Connections that send part of a request and stall, each reopened when the server closes it."""
    opened: int = 0
    closed_by_server: int = 0
    connect_errors: int = 0
    open_now: int = 0
    most_open: int = 0
    still_open: int = 0  # at the end, past the read deadline and a margin: the server never closed them
    held_s: list[float] = field(default_factory=list)
    answers: Counter = field(default_factory=Counter)  # bytes some got before the close: the status line

    async def hold(self, host: str, port: int, data: bytes, until: asyncio.Event) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                self.connect_errors += 1
                if until.is_set():
                    return
                await asyncio.sleep(0.1)
                continue
            self.opened += 1
            self.open_now += 1
            self.most_open = max(self.most_open, self.open_now)
            t0, got = time.monotonic(), b""
            try:
                writer.write(data)
                while chunk := await reader.read(4096):  # until the server closes it
                    got += chunk
            except (ConnectionResetError, BrokenPipeError):
                pass
            finally:
                self.open_now -= 1
                writer.close()
            self.closed_by_server += 1
            self.held_s.append(time.monotonic() - t0)
            if got:
                self.answers[got.split(b"\r\n", 1)[0].decode("latin-1")] += 1
            if until.is_set():
                return

    def summary(self, asked: int, read_timeout_s: float) -> dict:
        return {"asked": asked, "opened": self.opened, "most_open": self.most_open,
                "closed_by_server": self.closed_by_server, "still_open": self.still_open,
                "connect_errors": self.connect_errors, "answers": dict(self.answers), "read_timeout_s": read_timeout_s,
                "held_min_s": min(self.held_s, default=float("nan")), "held_max_s": max(self.held_s, default=float("nan"))}


@dataclass
class Attack:
    partials: int
    invalid: int
    oversized: int
    spread_s: float  # the invalid and oversized requests go out at random times in [0.05 s, spread_s)
    read_timeout_s: float


async def side_request(client, url: str, kind: str, what: str, path: str, body, want_status: int,
                       want_param, delay_s: float, live: dict, out: list) -> None:
    """One invalid or oversized request, sent after delay_s; out gets what came back."""
    await asyncio.sleep(delay_s)
    row = {"kind": kind, "what": what, "want": want_status, "streams_in_flight": live["streams"]}
    try:
        r = await client.post(url + path, content=body() if callable(body) else body,
                              headers={"content-type": "application/json"})
        err = r.json().get("error") or {}
        row.update(status=r.status_code, param=err.get("param"), code=err.get("code"))
        row["ok"] = r.status_code == want_status and (want_param is None or err.get("param") == want_param) and \
            (kind != "oversized" or err.get("code") == "request_too_large")
    except Exception as e:  # a client error is an outcome too
        row.update(status=type(e).__name__, ok=False)
    out.append(row)


async def drive(url: str, model: str, streams: list[Stream], seed: int, attack: Attack | None = None) -> dict:
    """Run the streams (and, with attack, the attack alongside them). Returns the streams' wall time and what
    the attacking clients saw."""
    import httpx

    rng = random.Random(seed)
    live = {"streams": 0}
    host, port = url.removeprefix("http://").rsplit(":", 1)
    limits = httpx.Limits(max_connections=len(streams) * 2 + 50, max_keepalive_connections=0)

    async def stream(s, r):
        live["streams"] += 1
        try:
            await run_stream(client, url, model, s, r)
        finally:
            live["streams"] -= 1

    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        side, partials, until, holders = [], Partials(), asyncio.Event(), []
        t0 = time.monotonic()
        tasks = [asyncio.ensure_future(stream(s, random.Random(rng.random()))) for s in streams]
        if attack is not None:
            holders = [asyncio.ensure_future(partials.hold(host, int(port), PARTIAL_REQUESTS[i % 3], until))
                       for i in range(attack.partials)]
            bad = invalid_requests(model)
            for i in range(attack.invalid):
                what, path, body, param = bad[i % len(bad)]
                tasks.append(asyncio.ensure_future(side_request(
                    client, url, "invalid", what, path, body, 400, param,
                    rng.uniform(0.05, attack.spread_s), live, side)))
            big = b'{"model": "%s", "prompt": "' % model.encode() + b"x" * OVERSIZED_BYTES + b'"}'

            async def chunked():
                for j in range(0, len(big), 1 << 16):
                    yield big[j:j + (1 << 16)]
            for i in range(attack.oversized):
                what = "10 MiB, Content-Length" if i % 2 == 0 else "10 MiB, chunked"
                tasks.append(asyncio.ensure_future(side_request(
                    client, url, "oversized", what, "/v1/completions", big if i % 2 == 0 else chunked, 413,
                    None, rng.uniform(0.05, attack.spread_s), live, side)))
        await asyncio.gather(*tasks)
        wall = time.monotonic() - t0
        until.set()  # the streams are done: no partial connection is reopened; the open ones must be closed
        if holders:
            _, pending = await asyncio.wait(holders, timeout=attack.read_timeout_s + 5)
            partials.still_open = len(pending)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    return {"wall_s": wall, "side": side,
            "partials": partials.summary(attack.partials, attack.read_timeout_s) if attack else None}


# ---- what the server says about itself, and the process ---------------------------------------------------
def scrape(url: str) -> dict[str, float]:
    """Every sample of /metrics: 'name{labels}' -> value."""
    import httpx
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _by_label(before: dict, after: dict, family: str) -> dict[str, float]:
    """The increase of each series of a counter family, by its labels: {'cause="client_disconnect"': 30.0}."""
    out = {}
    for name, value in after.items():
        if name.startswith(family + "{"):
            d = value - before.get(name, 0.0)
            if d:
                out[name[len(family) + 1:-1]] = d
    return out


def rss_bytes() -> tuple[int | None, str]:
    """(bytes, what): the resident set now (Linux, /proc/self/status VmRSS), else the peak (getrusage)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024, "VmRSS"
    except OSError:
        pass
    try:
        import resource
        import sys
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak * (1 if sys.platform == "darwin" else 1024), "peak RSS (getrusage)"
    except (ImportError, OSError):
        return None, "unknown"


def fit_partials(partials: int, streams: int) -> tuple[int, str | None]:
    """Raise this process's open-file limit to its hard limit if the partial connections need it (each holds two
    descriptors here, the client's and the server's); if that is not enough, fewer partials, with a note."""
    need = 2 * partials + 4 * streams + 256
    try:
        import resource
    except ImportError:
        return partials, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    note = None
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(hard, max(need, soft))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            note = f"raised the open-file limit from {soft} to {target}"
            soft = target
        except (ValueError, OSError) as e:
            note = f"could not raise the open-file limit ({soft}): {e}"
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64
    if soft != resource.RLIM_INFINITY and need - 256 + in_use > soft:
        fit = max(0, (soft - in_use - 4 * streams - 256) // 2)
        note = (note + "; " if note else "") + (f"open-file limit {soft}: {fit} partial connections instead of "
                                                f"{partials}")
        partials = fit
    return partials, note


# ---- the run ---------------------------------------------------------------------------------------------------
def offline_answers(model, pairs) -> dict[tuple[str, int], list[int]]:
    """Greedy LLM.generate of each (prompt, max_tokens), on an engine of its own (up to 256 sequences a step:
    on a CPU the larger batch takes half the time of 64)."""
    from ..llm import LLM
    from ..sampling import SamplingParams

    pairs = sorted(pairs)
    outs = LLM(model, max_num_seqs=256).generate([p for p, _ in pairs], [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
                                                       for _, n in pairs])
    return {pair: list(o.token_ids) for pair, o in zip(pairs, outs)}


def judge(streams: list[Stream], offline: dict) -> dict:
    """The good streams against offline (lost, duplicated, identical, finish reasons), the cut ones (a
    prefix of offline's answer), and per kind: how many, complete, client errors."""
    good = [s for s in streams if s.kind in COMPLETE_KINDS]
    cut = [s for s in streams if s.kind in CUT_KINDS]
    refs = [offline[(s.prompt, s.max_tokens)] for s in good]
    kinds = {}
    for s in streams:
        k = kinds.setdefault(s.kind, {"count": 0, "complete": 0, "client_errors": 0, "coalesced_events": 0})
        k["count"] += 1
        k["complete"] += len(s.token_ids) == s.max_tokens and s.error is None
        k["client_errors"] += s.error is not None
        k["coalesced_events"] += s.coalesced_events
    return {"good": {"count": len(good),
                     "lost": sum(max(0, len(r) - len(s.token_ids)) for s, r in zip(good, refs)),
                     "duplicated": sum(max(0, len(s.token_ids) - len(r)) for s, r in zip(good, refs)),
                     "identical": sum(s.token_ids == r for s, r in zip(good, refs)),
                     "finish_reasons": dict(Counter(str(s.finish_reason) for s in good)),
                     "client_errors": [s.error for s in good if s.error][:5],
                     "client_error_count": sum(s.error is not None for s in good)},
            "cut": {"count": len(cut), "tokens": sum(len(s.token_ids) for s in cut),
                    "not_prefix": sum(s.token_ids != offline[(s.prompt, s.max_tokens)][:len(s.token_ids)] for s in cut)},
            "kinds": kinds}


def run_load_test(streams: int = 200, partials: int = 1000, invalid: int | None = None, oversized: int | None = None,
                  model=None, max_num_seqs: int = 64, seed: int = 0, read_timeout_s: float = 10.0,
                  min_tokens: int = 64, max_tokens: int = 128, health_interval_s: float = 0.01,
                  health_p99_limit_s: float = HEALTH_TARGET_S, app_kwargs: dict | None = None, log=print) -> dict:
    """Both runs; returns the report (format_report prints it, problems() lists what failed). invalid /
    oversized: how many of each the hostile run sends (default: streams // 4 and max(2, streams // 20)).
    health_p99_limit_s: the hostile run fails if /health's p99 reaches it. app_kwargs: for create_app."""
    from ..shipped import TARGET
    from ..tools.startup import build_engine
    from .api import create_app, model_name_for
    from .runner import ServerThread

    model = str(model or TARGET)
    invalid = streams // 4 if invalid is None else invalid
    oversized = max(2, streams // 20) if oversized is None else oversized
    hostile = plan_streams(streams, random.Random(seed), min_tokens, max_tokens)
    measured = [i for i, s in enumerate(hostile) if s.kind == "good"]  # well-behaved in both runs
    asked = partials
    partials, fd_note = fit_partials(partials, streams)
    if fd_note:
        log(f"note: {fd_note}")

    t0 = time.monotonic()
    offline = offline_answers(model, {(s.prompt, s.max_tokens) for s in hostile})
    offline_s = time.monotonic() - t0
    peak_offline = _peak_rss()  # the offline engine's batch of up to 256 sequences, before any server
    engine, _ = build_engine(model, max_num_seqs=max_num_seqs)
    name = model_name_for(model)
    app = create_app(engine, name, **(app_kwargs or {}))
    aengine, service = app.state.aengine, app.state.service
    report = {"config": {"streams": streams, "partials": partials, "partials_asked": asked, "fd_note": fd_note,
                         "invalid": invalid, "oversized": oversized, "model": model, "max_num_seqs": max_num_seqs,
                         "kv_blocks": engine.num_blocks, "seed": seed, "read_timeout_s": read_timeout_s,
                         "tokens": (min_tokens, max_tokens), "health_interval_s": health_interval_s,
                         "health_p99_limit_s": health_p99_limit_s},
              "offline_s": offline_s, "offline_answers": len(offline), "runs": {}, "rss": {"peak_offline": peak_offline}}
    report["rss"]["start"], report["rss"]["what"] = rss_bytes()
    with ServerThread(app, sndbuf=4096, write_buffer_bytes=2048, read_timeout_s=read_timeout_s) as srv:
        for run, plan in (("baseline", polite(hostile)), ("hostile", hostile)):
            attack = None
            if run == "hostile":
                spread = max(0.5, 0.6 * report["runs"]["baseline"]["wall_s"])
                attack = Attack(partials, invalid, oversized, spread, read_timeout_s)
            before = scrape(srv.base_url)
            probe = HealthProbe(srv.base_url, health_interval_s)
            probe.start()
            result = asyncio.run(drive(srv.base_url, name, plan, seed, attack))
            health = probe.finish()
            deadline = time.monotonic() + 60
            while aengine.snapshot[2] and time.monotonic() < deadline:
                time.sleep(0.01)
            _, free, in_engine = aengine.snapshot
            after = scrape(srv.base_url)
            row = {"wall_s": result["wall_s"], "streams": len(plan), **judge(plan, offline),
                   "duplicated_generations": _duplicated(service, plan), "leaked_blocks": engine.num_blocks - free,
                   "requests_left": in_engine, "health": health, "partials": result["partials"],
                   "aborts": _by_label(before, after, "course:request_aborts_total"),
                   "finished": _by_label(before, after, "course:request_success_total"),
                   "validation_failures": _by_label(before, after, "course:request_validation_failures_total"),
                   "pace": _pace(plan, measured)}
            row.update(_side_outcomes(result["side"]))
            report["runs"][run] = row
            report["rss"][f"after {run}"] = rss_bytes()[0]
        report["rss"]["peak"] = _peak_rss()
    b, h = report["runs"]["baseline"]["pace"], report["runs"]["hostile"]["pace"]
    report["pace_ratio"] = {k: h[k] / b[k] if b[k] else float("nan") for k in b if k != "complete"}
    report["problems"] = problems(report)
    return report


def _pace(streams: list[Stream], measured: list[int]) -> dict:
    """TTFT / ITL over the streams at the indices `measured` (well-behaved in both runs)."""
    good = [streams[i] for i in measured if streams[i].ttft is not None]
    gaps = [g for s in good for g in s.gaps]
    return {"ttft_p50": pct([s.ttft for s in good], 50), "ttft_p99": pct([s.ttft for s in good], 99),
            "itl_p50": pct(gaps, 50), "itl_p99": pct(gaps, 99),
            "complete": sum(len(streams[i].token_ids) == streams[i].max_tokens for i in measured)}


def _side_outcomes(side: list[dict]) -> dict:
    out = {}
    for kind in ("invalid", "oversized"):
        rows = [r for r in side if r["kind"] == kind]
        statuses: dict[str, Counter] = {}
        for r in rows:
            statuses.setdefault(r["what"], Counter())[str(r["status"])] += 1
        out[kind] = {"sent": len(rows), "as_expected": sum(r["ok"] for r in rows),
                     "statuses": {w: dict(c) for w, c in statuses.items()},
                     "unexpected": [r for r in rows if not r["ok"]][:5],
                     "min_streams_in_flight": min((r["streams_in_flight"] for r in rows), default=0)}
    return out


def _peak_rss() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _duplicated(service, streams: list[Stream]) -> int:
    """Answers whose tokens were generated more than once: per Idempotency-Key, tokens the engine produced
    beyond the answer's length, or a retry that received different tokens."""
    dup = 0
    for s in streams:
        if s.key is None:
            continue
        gen = service.components.cache.get(s.key)
        if gen is None or gen.engine_tokens > min(len(gen.token_ids), gen.max_tokens) or s.error == "the retry received a different answer":
            dup += 1
    return dup


def problems(report: dict) -> list[str]:
    """What failed (empty: the load test passed): the correctness items, a /health poll unanswered, and in the
    hostile run a /health p99 at or over the limit (config's health_p99_limit_s)."""
    out = []
    for run, r in report["runs"].items():
        g = r["good"]
        for what, n in (("tokens lost", g["lost"]), ("tokens duplicated", g["duplicated"]),
                        ("answers not token-identical to offline", g["count"] - g["identical"]),
                        ("good streams with a client error", g["client_error_count"]),
                        ("answers generated twice", r["duplicated_generations"]),
                        ("cut streams whose tokens are not a prefix of offline's", r["cut"]["not_prefix"]),
                        ("leaked KV blocks", r["leaked_blocks"]), ("requests left in the engine", r["requests_left"]),
                        ("/health polls unanswered", r["health"]["failures"])):
            if n:
                out.append(f"{run}: {what}: {n}")
        if not r["health"]["polls"] - r["health"]["failures"]:
            out.append(f"{run}: /health never answered")
        if run != "hostile":
            continue
        limit = report["config"]["health_p99_limit_s"]
        if not r["health"]["p99_s"] < limit:
            out.append(f"hostile: /health p99 {r['health']['p99_s'] * 1e3:.0f} ms, not under {limit * 1e3:.0f} ms")
        for kind, status in (("invalid", 400), ("oversized", 413)):
            s = r[kind]
            if s["as_expected"] != s["sent"]:
                out.append(f"hostile: {s['sent'] - s['as_expected']} of {s['sent']} {kind} requests did not get "
                           f"the {status} expected: {s['unexpected'][:2]}")
        v = r["validation_failures"]
        counted = (sum(n for k, n in v.items() if 'status="400"' in k), v.get('param="body",status="413"', 0))
        if counted != (r["invalid"]["sent"], r["oversized"]["sent"]):
            out.append(f"hostile: /metrics counted {counted[0]:.0f} 400s and {counted[1]:.0f} 413s for "
                       f"{r['invalid']['sent']} invalid and {r['oversized']['sent']} oversized requests")
        p = r["partials"]
        if p["still_open"] or p["connect_errors"]:
            out.append(f"hostile: partial connections: {p['still_open']} still open {p['read_timeout_s'] + 5:.0f} s "
                       f"after the streams ended, {p['connect_errors']} refused")
    return out


# ---- the printout ------------------------------------------------------------------------------------------
def _ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x * 1e3:.0f} ms"


def _mb(x) -> str:
    return "?" if x is None else f"{x / 2 ** 20:.0f} MiB"


def format_report(rep: dict) -> str:
    c = rep["config"]
    lines = [f"load test: {c['streams']} streams of {c['tokens'][0]}-{c['tokens'][1]} greedy tokens, model {c['model']}, "
             f"max_num_seqs {c['max_num_seqs']}, {c['kv_blocks']} KV blocks, seed {c['seed']}; server and clients in "
             f"this process (pid {os.getpid()}, {os.cpu_count()} CPUs)",
             f"offline reference: {rep['offline_answers']} greedy answers by LLM.generate in {rep['offline_s']:.1f} s"]
    if c["fd_note"]:
        lines.append(f"note: {c['fd_note']}")
    for run, r in rep["runs"].items():
        g, cut, h = r["good"], r["cut"], r["health"]
        lines += ["", f"[{run}] {r['streams']} streams in {r['wall_s']:.1f} s",
                  f"  good streams: {g['count']}, lost tokens {g['lost']}, duplicated {g['duplicated']}, "
                  f"token-identical to offline {g['identical']}/{g['count']}, finish reasons {g['finish_reasons']}, "
                  f"client errors {g['client_error_count']} {g['client_errors'] or ''}".rstrip(),
                  f"  answers generated twice (Idempotency-Key) {r['duplicated_generations']}; leaked KV blocks "
                  f"{r['leaked_blocks']}; requests left {r['requests_left']}"]
        if run == "hostile":
            k = r["kinds"]
            lines.append("  by kind (count / complete / client errors): " + ", ".join(
                f"{n} {v['count']}/{v['complete']}/{v['client_errors']}" for n, v in sorted(k.items())))
            lines.append(f"  cut streams (disconnect, vanish): {cut['count']}, {cut['tokens']} tokens received, "
                         f"not a prefix of offline's {cut['not_prefix']}; slow readers' coalesced events "
                         f"{k.get('slow', {}).get('coalesced_events', 0)}")
            for kind in ("invalid", "oversized"):
                s = r[kind]
                lines.append(f"  {kind}: {s['as_expected']}/{s['sent']} as expected (while >= "
                             f"{s['min_streams_in_flight']} streams were in flight): {s['statuses']}")
            p = r["partials"]
            lines.append(f"  partial connections: {p['opened']} opened ({p['asked']} at once asked, {p['most_open']} "
                         f"open at once), {p['closed_by_server']} closed by the server's {p['read_timeout_s']:g} s read "
                         f"deadline (held {p['held_min_s']:.1f}-{p['held_max_s']:.1f} s), {p['still_open']} still open, "
                         f"{p['connect_errors']} refused, answers {p['answers']}")
        lines.append(f"  /metrics: aborts by cause {r['aborts']}; finished {r['finished']}; validation failures "
                     f"{r['validation_failures']}")
        lines.append(f"  /health: {h['polls']} polls, {h['failures']} failed, p50 {_ms(h['p50_s'])}, p99 "
                     f"{_ms(h['p99_s'])}, max {_ms(h['max_s'])}, {h['over_100ms']} at or over 100 ms "
                     f"(target: p99 under {c['health_p99_limit_s'] * 1e3:.0f} ms)")
        p = r["pace"]
        lines.append(f"  well-behaved in both runs: {p['complete']} complete; TTFT p50 {_ms(p['ttft_p50'])}, p99 "
                     f"{_ms(p['ttft_p99'])}; ITL p50 {_ms(p['itl_p50'])}, p99 {_ms(p['itl_p99'])}")
    q = rep["pace_ratio"]
    rss = rep["rss"]
    lines += ["", f"pace, hostile / baseline: TTFT p50 {q['ttft_p50']:.2f}x, p99 {q['ttft_p99']:.2f}x; ITL p50 "
                  f"{q['itl_p50']:.2f}x, p99 {q['itl_p99']:.2f}x",
              f"RSS ({rss['what']}, server and clients together): {_mb(rss['start'])} before, "
              f"{_mb(rss['after baseline'])} after the baseline, {_mb(rss['after hostile'])} after the hostile run; "
              f"peak {_mb(rss['peak'])} ({_mb(rss['peak_offline'])} before the server started: the offline reference)",
              "PASS" if not rep["problems"] else "FAIL:\n  " + "\n  ".join(rep["problems"])]
    return "\n".join(lines)


def main(argv=None) -> int:
    from ..shipped import TARGET

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--partials", type=int, default=1000, help="partial connections held during the hostile run")
    ap.add_argument("--invalid", type=int, default=None, help="invalid requests (default: streams / 4)")
    ap.add_argument("--oversized", type=int, default=None, help="10 MiB bodies (default: streams / 20, at least 2)")
    ap.add_argument("--model", default=str(TARGET))
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--read-timeout", type=float, default=10.0,
                    help="the server's request read deadline, which closes the partial connections (default: 10 s)")
    ap.add_argument("--health-p99-ms", type=float, default=HEALTH_TARGET_S * 1e3,
                    help="the hostile run fails if /health's p99 latency reaches this (default: %(default)g)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rep = run_load_test(streams=args.streams, partials=args.partials, invalid=args.invalid, oversized=args.oversized,
                        model=args.model, max_num_seqs=args.max_num_seqs, seed=args.seed,
                        read_timeout_s=args.read_timeout, health_p99_limit_s=args.health_p99_ms / 1e3)
    print(format_report(rep))
    return 1 if rep["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
