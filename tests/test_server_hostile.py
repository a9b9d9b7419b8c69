"""The server against faults and hostile clients: one request failing inside an engine step, bodies too large
to hold, connections that never finish sending, shutdown with such connections open, and metrics that must be
true at every moment. Real HTTP (uvicorn on a free port), the real `openai` client where a polite client
talks; raw sockets where a client misbehaves on purpose. Every wait is bounded.
"""
from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch

from reference_engine import SamplingParams
from reference_engine import sampling as sampling_module
from reference_engine.sampling import make_generator, sample, sample_isolated
from reference_engine.server.api import create_app
from reference_engine.server.runner import ServerThread
from reference_engine.server.streaming import LRUIdempotencyCache
from reference_engine.shipped import TARGET
from reference_engine.tools.startup import build_engine
from tests.server_helpers import idle, wait_until

MODEL = "target"
READ_TIMEOUT_S = 1.0  # the module server's: a request not fully sent within this is cut off
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server():
    engine, _ = build_engine(TARGET, warm_up=False, max_num_seqs=32)
    app = create_app(engine, MODEL)
    with ServerThread(app, read_timeout_s=READ_TIMEOUT_S) as s:
        s.engine, s.aengine, s.app = engine, app.state.aengine, app
        yield s
    assert engine.block_manager.num_free() == engine.num_blocks, "KV blocks still held after the server stopped"


def metrics(server) -> dict[str, float]:
    """Every sample of /metrics: 'name{labels}' -> value."""
    out = {}
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def greedy(offline, prompt, max_tokens):
    return offline.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))[0]


def partial_request(port: int, body_bytes: bytes = b'{"model": "targ') -> socket.socket:
    """A client that sends headers announcing 1000 bytes of body, then part of it, then nothing."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n" + body_bytes)
    return sock


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes this connection within timeout (EOF or reset; any bytes before are read)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


# ---- what no engine can run ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, field", [
    (dict(temperature=float("nan")), "temperature"), (dict(temperature=float("inf")), "temperature"),
    (dict(temperature=True), "temperature"), (dict(top_p=float("nan")), "top_p"), (dict(top_k=2 ** 63), "top_k"),
    (dict(top_k=True), "top_k"), (dict(min_p=1.01), "min_p"), (dict(min_p=float("nan")), "min_p"),
    (dict(max_tokens=True), "max_tokens"), (dict(max_tokens=2 ** 31), "max_tokens"), (dict(max_tokens=-3), "max_tokens"),
    (dict(seed=True), "seed"), (dict(stop_token_ids=[2 ** 63]), "stop_token_ids"), (dict(logprobs=True), "logprobs"),
])
def test_sampling_params_refuse_what_no_engine_can_run(kw, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}="):
        SamplingParams(**kw)


def test_tiny_temperatures_are_greedy_and_min_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]] * 2))
    for t in (1e-6, 1e-40, 1e-300, 5e-324):
        assert SamplingParams(temperature=t).greedy
        assert sample(logits, [SamplingParams(temperature=t)] * 2, [None, None]).tolist() == [0, 0]
    assert not SamplingParams(temperature=1e-5).greedy  # vLLM's bound: below 1e-5, not at it
    kept = torch.isfinite(sampling_module.warp_logits(logits, [SamplingParams(min_p=0.35), SamplingParams(min_p=0.0)]))
    assert kept.tolist() == [[True, True, False, False, False], [True] * 5]


def test_prompts_are_tokenized_off_the_event_loop_after_a_length_bound(server, client, monkeypatch):
    """The event loop runs on the thread "uvicorn"; tokenizing there stalls every stream. A prompt longer in
    characters than the context could hold is refused without being tokenized at all."""
    threads, real = [], server.engine.tokenize

    def tokenize(prompt):
        if isinstance(prompt, str):  # (the engine loop validates the token ids it is given again)
            threads.append(threading.current_thread().name)
        return real(prompt)
    monkeypatch.setattr(server.engine, "tokenize", tokenize)
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
    assert len(threads) == 1 and threads[0] != server.thread.name, threads
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x" * 40_000, max_tokens=2, temperature=0)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
    assert len(threads) == 1, "a prompt that cannot fit was tokenized anyway"


# ---- one request failing inside an engine step ------------------------------------------------------------
def test_a_failing_row_leaves_the_other_rows_and_their_generators_alone():
    """sample_isolated on a batch with one NaN row: the other rows get the tokens sample() gives them without
    it, and their generators end in the same state."""
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    params = [SamplingParams(temperature=0.8, seed=s) for s in range(5)]
    bad = SamplingParams(temperature=0.8)
    bad.temperature = float("nan")  # past validation, as a bug would be
    clean_gens, gens = [make_generator(s, 0, "cpu") for s in range(5)], [make_generator(s, 0, "cpu") for s in range(5)]
    want = sample(logits, params, clean_gens)
    got, errors = sample_isolated(logits, params[:2] + [bad] + params[3:], gens)
    assert list(errors) == [2] and "nan" in str(errors[2]).lower()
    assert [got[i] for i in (0, 1, 3, 4)] == [want[i] for i in (0, 1, 3, 4)]
    for i in (0, 1, 3, 4):
        assert torch.equal(gens[i].get_state(), clean_gens[i].get_state()), f"row {i}'s generator moved differently"


def test_the_engine_ends_only_the_failing_request(offline):
    """A request whose temperature became NaN after validation, batched with five seeded sampled requests: it
    ends with finish_reason "error" and its exception; the five produce exactly the tokens they produce beside
    a healthy request that ends at the same step; no block is left held."""
    engine = offline.engine
    prompts = ["Once upon", "The river", "A long road", "Far away", "Hello"]

    def run(odd: SamplingParams):
        ids = [engine.add_request(p, SamplingParams(temperature=0.9, seed=i, max_tokens=10, ignore_eos=True))
               for i, p in enumerate(prompts)]
        odd_id = engine.add_request("Patience", odd)
        tokens, reasons, errors = {}, {}, {}
        while engine.has_unfinished():
            for o in engine.step():
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finished:
                    reasons[o.request_id] = o.finish_reason
            errors.update(engine.step_errors)
        return [tokens[r] for r in ids], reasons[odd_id], errors.get(odd_id)

    nan = SamplingParams(temperature=0.7)
    nan.temperature = float("nan")
    faulty, reason, error = run(nan)
    clean, clean_reason, _ = run(SamplingParams(temperature=0.7, max_tokens=1))
    assert reason == "error" and isinstance(error, RuntimeError), (reason, error)
    assert clean_reason == "length" and faulty == clean
    assert engine.block_manager.num_free() == engine.num_blocks and not engine.requests


@pytest.fixture
def faulty_seed(monkeypatch):
    """Sampling raises for any request with seed 666 (a stand-in for a per-request bug: a broken logits
    processor, parameters the sampler cannot take). A batched warp that includes it raises for the whole
    batch, as a real fault would; the sizes of the batches it was in are recorded."""
    real, batches = sampling_module.warp_logits, []

    def warp(logits, params):
        if any(p.seed == 666 for p in params):
            batches.append(len(params))
            raise RuntimeError("injected fault: logits processor failed for seed 666")
        return real(logits, params)
    monkeypatch.setattr(sampling_module, "warp_logits", warp)
    return batches


def test_one_failing_request_among_30_streams_ends_alone(server, client, offline, faulty_seed):
    """30 concurrent streams; one request's sampling raises. That stream gets an error event (the openai client
    raises APIError with the server's message); the other 29 finish with exactly their clean answers (sampled
    with top_k=1, so they go through the same sampler path as the faulty one and must equal greedy); the error is
    counted; no KV block is left held."""
    prompts = [f"Story number {i}:" for i in range(30)]
    refs = [o.token_ids for o in offline.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))]
    errors0 = metrics(server).get('course:request_success_total{finished_reason="error"}', 0)

    def stream(i):
        seed = 666 if i == 7 else i
        try:
            chunks = list(client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=12, temperature=0.8,
                                                    seed=seed, stream=True, extra_body={"top_k": 1, "ignore_eos": True}))
        except openai.APIError as e:
            return e
        return ([t for c in chunks for t in c.choices[0].model_extra["token_ids"]], chunks[-1].choices[0].finish_reason)

    with ThreadPoolExecutor(30) as pool:
        results = list(pool.map(stream, range(30)))
    err = results[7]
    assert isinstance(err, openai.APIError) and "injected fault" in err.message, err
    assert err.body["type"] == "server_error" and err.body["code"] == "engine_error", err.body
    for i, r in enumerate(results):
        if i != 7:
            assert r == (refs[i], "length"), f"stream {i} did not finish as in a clean run: {r!r:.200}"
    assert max(faulty_seed) > 1, "the fault never hit a batch shared with other sampled rows"
    wait_until(lambda: idle(server), "every KV block to be freed")
    assert metrics(server)['course:request_success_total{finished_reason="error"}'] == errors0 + 1


def test_a_failing_non_streamed_request_gets_a_500_naming_the_error(server, client, faulty_seed):
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model=MODEL, prompt="Doomed", max_tokens=8, temperature=0.8, seed=666)
    body = e.value.body
    assert body["code"] == "engine_error" and "RuntimeError" in body["message"] and "injected fault" in body["message"]
    ok = client.completions.create(model=MODEL, prompt="Fine", max_tokens=8, temperature=0.8, seed=1)
    assert ok.choices[0].finish_reason in ("stop", "length"), "the server serves on after a failed request"
    wait_until(lambda: idle(server), "every KV block to be freed")


# ---- bodies too large to hold --------------------------------------------------------------------------------
def test_a_declared_10_mb_body_is_refused_before_it_is_sent(server):
    """Content-Length 10 MB: the 413 comes after the headers and 64 KiB, without the rest of the body."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 10485760\r\n\r\n" + b" " * 65536)
        sock.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            assert chunk, f"connection closed before a response: {head!r}"
            head += chunk
    finally:
        sock.close()
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


def _upload_10_mb_while_polling_health(base_url) -> tuple[dict, list[float]]:
    """POST 10 MiB chunked (no Content-Length) while polling /health on a kept-alive connection; returns the
    upload's outcome and every /health latency (s) measured while it ran."""
    done, latencies, result = threading.Event(), [], {}

    def upload():
        def body():
            for _ in range(160):
                yield b" " * 65536  # 10 MiB
        t0 = time.monotonic()
        try:
            r = httpx.post(base_url + "/v1/completions", content=body(), headers={"content-type": "application/json"},
                           timeout=30)
            result.update(status=r.status_code, error=r.json()["error"], took=time.monotonic() - t0)
        finally:
            done.set()

    with httpx.Client(base_url=base_url, timeout=5) as c:
        c.get("/health")  # connect first: the poll measures answers, not connection setup
        uploader = threading.Thread(target=upload)
        uploader.start()
        while not done.is_set() or len(latencies) < 5:
            t0 = time.monotonic()
            assert c.get("/health").json() == {"status": "ok"}
            latencies.append(time.monotonic() - t0)
        uploader.join(30)
    return result, latencies


def test_a_streamed_10_mb_body_gets_413_while_health_answers_fast(server):
    """A chunked 10 MB upload is counted as it arrives and refused past 1 MiB; /health, polled all the while,
    answers every time in under 100 ms. Server and clients share this process and a loaded 2-core machine can
    deschedule it for that long once in a while, so a slow poll gets one more upload: a server that stalls its
    event loop on a large body stalls it on every upload."""
    too_large0 = metrics(server).get('course:request_validation_failures_total{param="body",status="413"}', 0)
    uploads = 0
    while uploads < 2:
        result, latencies = _upload_10_mb_while_polling_health(server.base_url)
        uploads += 1
        assert result["status"] == 413 and result["error"]["code"] == "request_too_large", result
        assert result["took"] < 5, f"the 413 took {result['took']:.1f} s"
        if max(latencies) < 0.1:
            break
    assert max(latencies) < 0.1, f"/health took up to {max(latencies) * 1000:.0f} ms during the upload, twice"
    after = metrics(server)['course:request_validation_failures_total{param="body",status="413"}']
    assert after == too_large0 + uploads


def test_the_body_limit_is_configurable():
    engine, _ = build_engine(TARGET, warm_up=False)
    app = create_app(engine, MODEL, max_body_bytes=200)
    with ServerThread(app) as s:
        small = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
        assert httpx.post(s.base_url + "/v1/completions", json=small).status_code == 200
        r = httpx.post(s.base_url + "/v1/completions", json={**small, "prompt": "x" * 300})
        assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error", r.text


# ---- connections that never finish sending -------------------------------------------------------------------
def test_partial_connections_are_closed_by_the_read_timeout(server):
    """200 clients send headers and part of a body (and 20 only part of the headers), then stall. The read
    timeout closes every one of them; /health answers meanwhile."""
    socks = [partial_request(server.port) for _ in range(200)]
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        socks.append(s)
    t0 = time.monotonic()
    try:
        with httpx.Client(base_url=server.base_url, timeout=5) as c:
            assert c.get("/health").status_code == 200
        still_open = [s for s in socks if not closed_by_server(s, READ_TIMEOUT_S + 3 - (time.monotonic() - t0))]
    finally:
        for s in socks:
            s.close()
    assert not still_open, f"{len(still_open)} of {len(socks)} stalled connections still open after " \
                           f"{time.monotonic() - t0:.1f} s (read timeout {READ_TIMEOUT_S} s)"
    wait_until(lambda: idle(server), "the server to hold nothing for them")


def test_shutdown_does_not_wait_past_its_deadline_for_partial_connections():
    """With a long read timeout, 200 stalled uploads would hold the server; stopping it takes the shutdown
    deadline (1 s) and closes them all."""
    engine, _ = build_engine(TARGET, warm_up=False)
    s = ServerThread(create_app(engine, MODEL), read_timeout_s=60.0, shutdown_timeout_s=1.0).start()
    socks = [partial_request(s.port) for _ in range(200)]
    try:
        with httpx.Client(base_url=s.base_url, timeout=5) as c:
            assert c.get("/health").status_code == 200  # all 200 are accepted and held by now
        t0 = time.monotonic()
        s.stop()
        took = time.monotonic() - t0
        assert not s.thread.is_alive() and took < 2.5, f"stop took {took:.1f} s with a 1 s shutdown deadline"
        assert all(closed_by_server(x, 2.0) for x in socks), "a stalled connection outlived the server"
    finally:
        for x in socks:
            x.close()
    assert engine.block_manager.num_free() == engine.num_blocks


def _start_server_process(*args) -> tuple[subprocess.Popen, int]:
    """`python -m reference_engine.server --port 0 ...` in a new process; returns it and its port."""
    proc = subprocess.Popen([sys.executable, "-m", "reference_engine.server", "--port", "0", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 60
    for line in proc.stdout:  # the startup report, then the line naming the port
        lines.append(line)
        m = re.search(r"on http://127\.0\.0\.1:(\d+) ", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its output
            return proc, int(m.group(1))
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError("the server process did not start:\n" + "".join(lines[-20:]))


@contextlib.contextmanager
def _server_with_a_client_stuck_mid_body(*args):
    """A server process (with `args`) that answers /health, and a client that has sent half a request body."""
    proc, port = _start_server_process(*args)
    stuck = partial_request(port)
    try:
        with httpx.Client(timeout=5) as c:
            assert c.get(f"http://127.0.0.1:{port}/health").status_code == 200
        yield proc
    finally:
        stuck.close()
        proc.kill()


def _seconds_to_exit_after_sigterm(proc) -> float:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    finally:
        proc.kill()
    return time.monotonic() - t0


def test_sigterm_with_a_client_stuck_mid_body_exits_within_the_deadline():
    with _server_with_a_client_stuck_mid_body("--shutdown-timeout", "1.5") as proc:
        took = _seconds_to_exit_after_sigterm(proc)
    assert took < 3.5, f"the server took {took:.1f} s to exit after SIGTERM (shutdown deadline 1.5 s)"
    assert took > 1.0, f"it exited after {took:.1f} s: it did not drain for its deadline"


def test_a_second_sigterm_exits_at_once():
    with _server_with_a_client_stuck_mid_body("--shutdown-timeout", "60") as proc:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None, "the first SIGTERM should drain (a client is mid-body), not exit"
        took = _seconds_to_exit_after_sigterm(proc)
    assert took < 1.0, f"the server took {took:.1f} s to exit after a second SIGTERM"


# ---- the idempotency cache's byte bound ------------------------------------------------------------------------
def test_idempotency_cache_is_bounded_in_bytes_and_never_evicts_a_live_entry():
    from reference_engine.server.interfaces import Generation

    def gen(n_tokens, in_flight=False):
        return Generation("k", "fp", [1] * 100, 200, token_ids=[2] * n_tokens, in_flight=in_flight)

    one = LRUIdempotencyCache.entry_bytes("a", gen(100))
    cache = LRUIdempotencyCache(max_entries=1000, max_bytes=3 * one)
    live = gen(100, in_flight=True)
    cache.put("a", live)
    for k in "bcdef":
        cache.put(k, gen(100))
    assert cache.bytes <= 3 * one and len(cache) == 3, (cache.bytes, len(cache))
    assert cache.get("a") is live, "an in-flight entry was evicted"
    assert cache.get("f") is not None and cache.get("b") is None, "the least recently used finished entry goes first"


# ---- metrics true at every moment ------------------------------------------------------------------------------
def _gauges(server) -> tuple[float, float, float]:
    m = metrics(server)
    return (m["course:num_requests_running"], m["course:num_requests_waiting"], m["course:kv_cache_usage_perc"])


def test_gauges_drop_when_the_last_request_is_aborted(server):
    """A client leaves mid-stream and nothing else arrives: the gauges must say so at once (they used to keep
    num_requests_running 1 until the next request made the engine step)."""
    body = {"model": MODEL, "prompt": "Far away", "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True}
    aborts0 = metrics(server).get('course:request_success_total{finished_reason="abort"}', 0)
    with httpx.Client(timeout=30) as c, c.stream("POST", server.base_url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                running, _, kv = _gauges(server)
                assert running == 1 and kv > 0, "the gauges should show the running request"
                break
    wait_until(lambda: idle(server), "the aborted request to leave the engine")
    assert _gauges(server) == (0, 0, 0), "gauges still count the aborted request"
    assert metrics(server)['course:request_success_total{finished_reason="abort"}'] == aborts0 + 1


def test_gauges_are_idle_as_soon_as_the_last_answer_arrives(server, client):
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0)
    assert _gauges(server) == (0, 0, 0), "the client has its whole answer, yet the gauges count its request"


def test_requests_are_counted_by_finish_reason(server, client, offline, faulty_seed):
    def count(reason):
        return metrics(server).get(f'course:request_success_total{{finished_reason="{reason}"}}', 0)

    before = {r: count(r) for r in ("stop", "length", "abort", "error")}
    first = greedy(offline, "Hello", 1).token_ids[0]
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0,
                                  extra_body={"stop_token_ids": [first]})
    assert r.choices[0].finish_reason == "stop"
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    with pytest.raises(openai.InternalServerError):  # the engine fails it
        client.completions.create(model=MODEL, prompt="Doomed", max_tokens=3, temperature=0.8, seed=666)
    with pytest.raises(httpx.TimeoutException):  # a client that gives up: aborted
        httpx.post(server.base_url + "/v1/completions", timeout=httpx.Timeout(30, read=0.2),
                   json={"model": MODEL, "prompt": "Patience", "max_tokens": 400, "ignore_eos": True, "temperature": 0})
    wait_until(lambda: count("abort") == before["abort"] + 1, "the abandoned request to be counted as aborted")
    assert {r: count(r) - before[r] for r in before} == {"stop": 1, "length": 1, "abort": 1, "error": 1}
    wait_until(lambda: idle(server), "every KV block to be freed")


def test_validation_failures_are_counted_by_field(server):
    def count(param):
        return metrics(server).get(f'course:request_validation_failures_total{{param="{param}",status="400"}}', 0)

    before = count("temperature"), count("none")
    bad = json.dumps({"model": MODEL, "prompt": "hi", "temperature": float("nan")})
    r = httpx.post(server.base_url + "/v1/completions", content=bad, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = httpx.post(server.base_url + "/v1/completions", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] is None
    assert (count("temperature"), count("none")) == (before[0] + 1, before[1] + 1)
