"""Load test (a benchmark, not a test): many concurrent streams, some of them hostile, through a real server.

    python -m reference_engine.server.loadtest [--streams 200] [--model DIR] [--seed 0]

Two runs of the same --streams streams (prompts, lengths, order) on one server (the shipped model by
default, in this process, on a free port):
  baseline  every stream well-behaved
  hostile   10% disconnect mid-stream, 10% read slowly (one event per 0.1 s, from a small socket buffer),
            10% are retried with the same Idempotency-Key (half while the first is still streaming, half
            after dropping it, resuming with X-Resume-From), the other 70% well-behaved
and prints, for the hostile run: completed, aborted (by cause, from the server's metrics), duplicated
(answers with more tokens generated than delivered: must be 0), leaked KV blocks once idle (must be 0),
and TTFT and inter-event latency p50/p99 of the 70% that are well-behaved in both runs (client-side: TTFT
from sending the request to the first token; ITL between consecutive token-bearing events).

The server's sockets are small (as in tests/test_server.py) so a slow reader pushes back on the server
after a few KiB; the clients run in the same process as the server and share its CPU.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import time
from dataclasses import dataclass, field

PROMPTS = ["Once upon a time", "The river", "In the morning", "She said", "A long road", "The old house",
           "Far away", "Numbers are", "When the rain", "He opened the door"]


@dataclass
class Stream:
    kind: str  # "good", "disconnect", "slow", "retry-attach", "retry-resume"
    prompt: str
    max_tokens: int
    key: str | None = None
    token_ids: list[int] = field(default_factory=list)
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    coalesced_events: int = 0
    error: str | None = None


def plan_streams(n: int, rng: random.Random) -> list[Stream]:
    """The hostile run's streams: 10% each disconnecting, slow, retried (half attach, half resume)."""
    k = n // 10
    kinds = (["disconnect"] * k + ["slow"] * k + ["retry-attach"] * (k // 2) + ["retry-resume"] * (k - k // 2)
             + ["good"] * (n - 3 * k))
    rng.shuffle(kinds)
    return [Stream(kind, rng.choice(PROMPTS), rng.randint(64, 128), key=f"k{i}-{rng.random():.9f}"
                   if kind.startswith("retry") else None) for i, kind in enumerate(kinds)]


def polite(streams: list[Stream]) -> list[Stream]:
    """The baseline: the same streams (prompts, lengths, order), every one well-behaved."""
    return [Stream("good", s.prompt, s.max_tokens) for s in streams]


async def read_stream(client, url: str, model: str, s: Stream, headers: dict, stop_after: int | None = None,
                      delay_s: float = 0.0, record: bool = True) -> list[int]:
    body = {"model": model, "prompt": s.prompt, "max_tokens": s.max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    ids, t0, last = [], time.monotonic(), None
    async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
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
            if delay_s:
                await asyncio.sleep(delay_s)
    return ids


async def read_slowly(url: str, model: str, s: Stream, delay_s: float = 0.1) -> list[int]:
    """A reader that takes one event every delay_s from a raw socket with a small receive buffer (an HTTP
    client library would read ahead 64 KiB and hide the slowness from the server)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    body = json.dumps({"model": model, "prompt": s.prompt, "max_tokens": s.max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
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
                await asyncio.sleep(delay_s)
    finally:
        writer.close()
    return ids


async def run_stream(client, url: str, model: str, s: Stream, rng: random.Random) -> None:
    try:
        if s.kind == "good":
            s.token_ids = await read_stream(client, url, model, s, {})
        elif s.kind == "slow":
            s.token_ids = await read_slowly(url, model, s)
        elif s.kind == "disconnect":
            s.token_ids = await read_stream(client, url, model, s, {}, stop_after=rng.randint(1, 20))
        elif s.kind == "retry-attach":  # the retry arrives while the first request still streams
            first = asyncio.ensure_future(read_stream(client, url, model, s, {"Idempotency-Key": s.key}))
            await asyncio.sleep(0.05)
            second = Stream(s.kind, s.prompt, s.max_tokens, s.key)
            b = await read_stream(client, url, model, second, {"Idempotency-Key": s.key}, record=False)
            a = await first
            s.token_ids = a if a == b else []
            s.error = None if a == b else "the retry received a different answer"
        else:  # retry-resume: the first connection drops after a few tokens; the retry resumes
            head = await read_stream(client, url, model, s, {"Idempotency-Key": s.key}, stop_after=rng.randint(1, 30))
            tail = await read_stream(client, url, model, Stream(s.kind, s.prompt, s.max_tokens, s.key),
                                     {"Idempotency-Key": s.key, "X-Resume-From": str(len(head))}, record=False)
            s.token_ids = head + tail
    except Exception as e:  # counted, not raised: one broken client must not end the benchmark
        s.error = f"{type(e).__name__}: {e}"


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


async def drive(url: str, model: str, streams: list[Stream], seed: int) -> float:
    import httpx

    limits = httpx.Limits(max_connections=len(streams) * 2 + 10, max_keepalive_connections=0)
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        rng = random.Random(seed)
        await asyncio.gather(*(run_stream(client, url, model, s, random.Random(rng.random()))
                               for s in streams))
    return time.monotonic() - t0


def summarize(name: str, streams: list[Stream], wall: float, measured: list[int]) -> dict:
    """TTFT / ITL over the streams at the indices `measured` (those well-behaved in both runs)."""
    good = [streams[i] for i in measured if streams[i].ttft is not None]
    gaps = [g for s in good for g in s.gaps]
    return {"run": name, "streams": len(streams), "wall_s": wall,
            "ttft_p50": pct([s.ttft for s in good], 50), "ttft_p99": pct([s.ttft for s in good], 99),
            "itl_p50": pct(gaps, 50), "itl_p99": pct(gaps, 99),
            "good_complete": sum(len(streams[i].token_ids) == streams[i].max_tokens for i in measured),
            "good": len(measured)}


def main(argv=None) -> int:
    from ..startup import SHIPPED_TARGET, build_engine
    from .api import create_app, model_name_for
    from .runner import ServerThread

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--model", default=str(SHIPPED_TARGET))
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    engine, report = build_engine(args.model, max_num_seqs=args.max_num_seqs)
    name = model_name_for(args.model)
    app = create_app(engine, name)
    aengine, service = app.state.aengine, app.state.service
    results = []
    with ServerThread(app, sndbuf=4096, write_buffer_bytes=2048) as srv:
        hostile = plan_streams(args.streams, random.Random(args.seed))
        measured = [i for i, s in enumerate(hostile) if s.kind == "good"]
        for run, streams in (("baseline", polite(hostile)), ("hostile", hostile)):
            before = _abort_counts(app.state.metrics)
            wall = asyncio.run(drive(srv.base_url, name, streams, args.seed))
            deadline = time.monotonic() + 60
            while aengine.snapshot[2] and time.monotonic() < deadline:
                time.sleep(0.01)
            _, free, in_engine = aengine.snapshot
            aborts = {k: v - before.get(k, 0) for k, v in _abort_counts(app.state.metrics).items()}
            row = summarize(run, streams, wall, measured)
            row.update(leaked_blocks=engine.num_blocks - free, requests_left=in_engine, aborts=aborts,
                       errors=sum(s.error is not None for s in streams if s.kind != "slow"),
                       completed=sum(len(s.token_ids) == s.max_tokens and s.error is None for s in streams),
                       slow_complete=sum(len(s.token_ids) == s.max_tokens for s in streams if s.kind == "slow"),
                       slow_coalesced=sum(s.coalesced_events for s in streams if s.kind == "slow"),
                       slow_dropped=sum(s.error is not None for s in streams if s.kind == "slow"),
                       duplicated=_duplicated(service, streams))
            results.append(row)
    _print(results, args, engine)
    return 0 if all(r["duplicated"] == 0 and r["leaked_blocks"] == 0 for r in results) else 1


def _abort_counts(metrics) -> dict:
    out = {}
    for fam in metrics.request_aborts.collect():
        for sample in fam.samples:
            if sample.name.endswith("_total"):
                out[sample.labels["cause"]] = sample.value
    return out


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


def _print(results: list[dict], args, engine) -> None:
    print(f"load test: {args.streams} streams, model {args.model}, max_num_seqs {args.max_num_seqs}, "
          f"{engine.num_blocks} KV blocks, seed {args.seed}")
    for r in results:
        print(f"\n[{r['run']}] {r['streams']} streams in {r['wall_s']:.1f} s")
        print(f"  completed {r['completed']}   aborted by cause {r['aborts']}   duplicated {r['duplicated']}   "
              f"leaked blocks {r['leaked_blocks']}   requests left {r['requests_left']}   client errors {r['errors']}")
        if r["run"] == "hostile":
            print(f"  slow readers: {r['slow_complete']} complete, {r['slow_dropped']} dropped, "
                  f"{r['slow_coalesced']} coalesced events")
        print(f"  well-behaved: {r['good_complete']}/{r['good']} complete; TTFT p50 {r['ttft_p50'] * 1e3:.0f} ms, "
              f"p99 {r['ttft_p99'] * 1e3:.0f} ms; ITL p50 {r['itl_p50'] * 1e3:.1f} ms, p99 {r['itl_p99'] * 1e3:.1f} ms")


if __name__ == "__main__":
    raise SystemExit(main())
