"""The OpenAI-compatible server on the shipped model, over real HTTP (uvicorn on a free port, one per module).

Polite clients use the `openai` package; hostile ones use raw httpx or sockets. Every wait is bounded
and fails with what it was waiting for.
"""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from reference_engine import SamplingParams
from reference_engine.server.api import create_app
from reference_engine.server.chat import apply_chat_template
from reference_engine.server.runner import ServerThread
from reference_engine.server.streaming import BoundedStreamBuffer, DefaultSSEFramer, StreamComponents
from reference_engine.shipped import TARGET
from reference_engine.tools.startup import StartupReport, build_engine
from tests.server_helpers import idle, wait_until

MODEL = "target"
HIGH_WATER = 48  # tokens a stream may have pending before it is dropped as a slow reader


@pytest.fixture(scope="module")
def server():
    engine, report = build_engine(TARGET, max_num_seqs=16)
    comps = StreamComponents(make_buffer=lambda: BoundedStreamBuffer(high_water=HIGH_WATER, max_lag_s=30.0),
                             framer=DefaultSSEFramer(keep_alive_interval=0.5), write_timeout_s=30.0)
    app = create_app(engine, MODEL, components=comps, startup_report=report)
    # Small socket buffers: a reader that stops reading blocks the server's writes after a few KiB.
    with ServerThread(app, sndbuf=4096, write_buffer_bytes=2048) as s:
        s.engine, s.aengine, s.service, s.comps, s.report = engine, app.state.aengine, app.state.service, comps, report
        yield s
    assert engine.block_manager.num_free() == engine.num_blocks, "KV blocks still held after the server stopped"


def greedy(offline, prompt, max_tokens, **kw):
    return offline.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, **kw))[0]


def metric(server, name: str, labels: str = "") -> float:
    text = httpx.get(server.base_url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
            return float(line.split()[-1])
    return 0.0


def sse_events(lines):
    """Yield parsed JSON of each `data:` line until [DONE]."""
    for line in lines:
        if line.startswith("data: "):
            if line == "data: [DONE]":
                return
            yield json.loads(line[6:])


def stream_body(prompt, max_tokens, **kw):
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, **kw}


# ---- polite clients -------------------------------------------------------------------------------------
def test_completion_equals_offline_generate(client, offline):
    ref = greedy(offline, "Once upon a time", 24)
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0)
    choice = r.choices[0]
    assert choice.model_extra["token_ids"] == ref.token_ids
    assert choice.text == ref.text and choice.finish_reason == ref.finish_reason
    assert r.usage.completion_tokens == len(ref.token_ids) and r.usage.prompt_tokens == len(ref.prompt_token_ids)


def test_streamed_completion_equals_offline_generate(client, offline):
    ref = greedy(offline, "The river", 30)
    chunks = list(client.completions.create(model=MODEL, prompt="The river", max_tokens=30, temperature=0,
                                            stream=True))
    assert [t for c in chunks for t in c.choices[0].model_extra["token_ids"]] == ref.token_ids
    assert "".join(c.choices[0].text for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason


def test_chat_streaming_and_not(client, offline):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
    ref = greedy(offline, apply_chat_template(messages), 20)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    assert r.choices[0].message.content == ref.text and r.choices[0].message.role == "assistant"
    assert r.choices[0].model_extra["token_ids"] == ref.token_ids
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    text = httpx.get(server.base_url + "/metrics").text
    for name in ("course:num_requests_running", "course:num_requests_waiting", "course:kv_cache_usage_perc",
                 "course:time_to_first_token_seconds_bucket", "course:inter_token_latency_seconds_bucket",
                 "course:num_preemptions_total", "course:prompt_tokens_total", "course:generation_tokens_total"):
        assert name in text, f"/metrics lacks {name}"
    gen0 = metric(server, "course:generation_tokens_total")
    ok0 = metric(server, "course:request_success_total", '{finished_reason="length"}')
    ttft0 = metric(server, "course:time_to_first_token_seconds_count")
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=7, temperature=0, extra_body={"ignore_eos": True})
    assert metric(server, "course:generation_tokens_total") == gen0 + 7
    assert metric(server, "course:request_success_total", '{finished_reason="length"}') == ok0 + 1
    assert metric(server, "course:time_to_first_token_seconds_count") == ttft0 + 1


def test_startup_report(server):
    r = server.report
    assert isinstance(r, StartupReport) and r.device == "cpu" and r.graph_capture is None
    assert all(v >= 0 for v in (r.imports, r.config, r.tokenizer, r.weights, r.kv_allocation, r.warm_up))
    assert "n/a on CPU" in r.format() and "kv_allocation" in r.format()


# ---- bad input ----------------------------------------------------------------------------------------------
HI = {"model": MODEL, "prompt": "hi"}
BAD = {
    "empty prompt": ({"model": MODEL, "prompt": ""}, 400, "prompt"),
    "empty token list": ({"model": MODEL, "prompt": []}, 400, "prompt"),
    "prompt over the context": ({"model": MODEL, "prompt": "word " * 700}, 400, "prompt"),
    "prompt longer in characters than the context could hold": ({"model": MODEL, "prompt": "x" * (512 * 64 + 1)},
                                                                400, "prompt"),
    "max_tokens past the context": ({**HI, "max_tokens": 5000}, 400, "max_tokens"),
    "negative temperature": ({**HI, "temperature": -1}, 400, "temperature"),
    "temperature NaN": ({**HI, "temperature": float("nan")}, 400, "temperature"),
    "temperature infinite": ({**HI, "temperature": float("inf")}, 400, "temperature"),
    "top_p of 0": ({**HI, "top_p": 0}, 400, "top_p"),
    "top_p above 1": ({**HI, "top_p": 1.5}, 400, "top_p"),
    "top_p NaN": ({**HI, "top_p": float("nan")}, 400, "top_p"),
    "top_k of -2": ({**HI, "top_k": -2}, 400, "top_k"),
    "top_k of 2**63 (no int64 holds it)": ({**HI, "top_k": 2 ** 63}, 400, "top_k"),
    "min_p above 1": ({**HI, "min_p": 1.5}, 400, "min_p"),
    "min_p negative": ({**HI, "min_p": -0.1}, 400, "min_p"),
    "max_tokens of 0": ({**HI, "max_tokens": 0}, 400, "max_tokens"),
    "max_tokens negative": ({**HI, "max_tokens": -5}, 400, "max_tokens"),
    "max_tokens absurd": ({**HI, "max_tokens": 10 ** 12}, 400, "max_tokens"),
    "max_tokens true": ({**HI, "max_tokens": True}, 400, "max_tokens"),
    "max_tokens a string": ({**HI, "max_tokens": "16"}, 400, "max_tokens"),
    "max_tokens a float": ({**HI, "max_tokens": 16.5}, 400, "max_tokens"),
    "temperature not a number": ({**HI, "temperature": "hot"}, 400, "temperature"),
    "temperature true": ({**HI, "temperature": True}, 400, "temperature"),
    "seed a string": ({**HI, "seed": "7"}, 400, "seed"),
    "token id true": ({"model": MODEL, "prompt": [1, True]}, 400, "prompt"),
    "token id outside the vocabulary": ({"model": MODEL, "prompt": [1, 99999]}, 400, "prompt"),
    "unknown model": ({"model": "gpt-9", "prompt": "hi"}, 404, "model"),
    "n of 0": ({**HI, "n": 0}, 400, "n"),
    "n above the server's bound": ({**HI, "n": 17}, 400, "n"),
    "best_of above n": ({**HI, "n": 2, "best_of": 3, "temperature": 1.0}, 400, "best_of"),
    "an unsupported field": ({**HI, "suffix": "!"}, 400, "suffix"),
    "no model field": ({"prompt": "hi"}, 400, "model"),
}


def post_json(url, body, **kw):
    """POST body as JSON with Python's encoder, which writes NaN and Infinity as JavaScript does (httpx's json=
    refuses them; Python's json.loads, which FastAPI uses, reads them)."""
    return httpx.post(url, content=json.dumps(body), headers={"content-type": "application/json", **kw.pop("headers", {})},
                      **kw)


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_a_4xx_with_an_openai_error_body(server, case):
    body, status, param = BAD[case]
    failures0 = metric(server, "course:request_validation_failures_total", f'{{param="{param}",status="400"}}')
    for stream in (False, True):
        r = post_json(server.base_url + "/v1/completions", {**body, "stream": stream})
        assert r.status_code == status, f"{case}: expected {status}, got {r.status_code}: {r.text[:200]}"
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], err
        assert err["param"] == param, f"{case}: error names param {err['param']!r}, expected {param!r}"
    if status == 400:
        assert metric(server, "course:request_validation_failures_total",
                      f'{{param="{param}",status="400"}}') == failures0 + 2, "each 400 is counted, by the field it names"
    wait_until(lambda: idle(server), f"no request left in the engine after '{case}'")


@pytest.mark.parametrize("temperature", [1e-6, 1e-40, 1e-300, 5e-324])
def test_a_temperature_below_the_epsilon_is_greedy(client, offline, temperature):
    """vLLM's convention (_SAMPLING_EPS = 1e-5): dividing logits by 1e-40 overflows float32 and 1e-300 is 0 in
    float32; the answer must be the greedy one, not a crash."""
    ref = greedy(offline, "Once upon a time", 12)
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=temperature)
    assert r.choices[0].model_extra["token_ids"] == ref.token_ids


def test_min_p_of_1_keeps_only_the_most_likely_token(client, offline):
    """min_p (vLLM's extension) drops every token less likely than min_p times the most likely one: at 1.0 a
    sampled answer is the greedy one."""
    ref = greedy(offline, "The river", 12)
    r = client.completions.create(model=MODEL, prompt="The river", max_tokens=12, temperature=1.0, seed=3,
                                  extra_body={"min_p": 1.0})
    assert r.choices[0].model_extra["token_ids"] == ref.token_ids


def test_chat_refuses_a_bool_max_completion_tokens(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": True}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens", r.text
    r = httpx.post(server.base_url + "/v1/chat/completions", json={**body, "max_completion_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens", r.text


def test_bad_chat_and_bad_json(server):
    for body in ({"model": MODEL, "messages": []}, {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}):
        r = httpx.post(server.base_url + "/v1/chat/completions", json=body)
        assert r.status_code == 400 and "error" in r.json(), r.text
    r = httpx.post(server.base_url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert r.json()["error"]["param"] is None, "malformed JSON names no field (not a character offset)"


@pytest.mark.parametrize("value", ["1_0", "+1", "0x1", "1e1", "1.0", "", b"\xb2", "9" * 19])
def test_resume_count_is_digits_only(server, value):
    """int() reads "1_0" as 10 and "+1" as 1, and str.isdigit() passes "\xb2" (superscript two): the header
    takes decimal digits only. The key holds a 12-token answer, so a lax parse would resume it (a 200)."""
    body, key = {**HI, "max_tokens": 12, "temperature": 0, "ignore_eos": True}, {"Idempotency-Key": "digits"}
    assert httpx.post(server.base_url + "/v1/completions", json=body, headers=key).status_code == 200
    r = httpx.post(server.base_url + "/v1/completions", json=body, headers={**key, "X-Resume-From": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Resume-From", r.text
    ok = httpx.post(server.base_url + "/v1/completions", json=body, headers={**key, "X-Resume-From": "10"})
    assert ok.status_code == 200 and len(ok.json()["choices"][0]["token_ids"]) == 2, ok.text


@pytest.mark.parametrize("key, ok", [("", False), ("k" * 257, False), ("k" * 256, True)])
def test_idempotency_key_must_be_non_empty_and_short(server, key, ok):
    r = httpx.post(server.base_url + "/v1/completions", json={**HI, "max_tokens": 2, "temperature": 0},
                   headers={"Idempotency-Key": key})
    if ok:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == "Idempotency-Key", r.text


def test_idempotency_keys_are_scoped_by_api_key(server, offline):
    """Two clients with different API keys choosing the same Idempotency-Key get their own answers: no 422
    (the other client's body), no replay of the other's tokens."""
    a = openai.OpenAI(base_url=server.base_url + "/v1", api_key="key-a", max_retries=0, timeout=60)
    b = openai.OpenAI(base_url=server.base_url + "/v1", api_key="key-b", max_retries=0, timeout=60)
    hdr = {"Idempotency-Key": "shared-key"}
    ra = a.completions.create(model=MODEL, prompt="The river", max_tokens=6, temperature=0, extra_headers=hdr)
    rb = b.completions.create(model=MODEL, prompt="Far away", max_tokens=6, temperature=0, extra_headers=hdr)
    assert ra.choices[0].model_extra["token_ids"] == greedy(offline, "The river", 6).token_ids
    assert rb.choices[0].model_extra["token_ids"] == greedy(offline, "Far away", 6).token_ids
    again = a.completions.create(model=MODEL, prompt="The river", max_tokens=6, temperature=0, extra_headers=hdr)
    assert again.choices[0].model_extra["token_ids"] == ra.choices[0].model_extra["token_ids"]
    with pytest.raises(openai.UnprocessableEntityError):  # the same client reusing its key for another body
        a.completions.create(model=MODEL, prompt="Far away", max_tokens=6, temperature=0, extra_headers=hdr)


# ---- hostile clients ----------------------------------------------------------------------------------------
def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    aborts0 = metric(server, "course:request_aborts_total", '{cause="client_disconnect"}')
    with httpx.Client(timeout=30) as c, c.stream("POST", server.base_url + "/v1/completions",
                                                 json=stream_body("Far away", 480, ignore_eos=True)) as r:
        got = 0
        for ev in sse_events(r.iter_lines()):
            got += len(ev["choices"][0]["token_ids"])
            if got >= 5:
                break
    steps_at_close = server.aengine.snapshot[0]  # the socket is closed now
    wait_until(lambda: idle(server), "the aborted request to leave the engine and free its KV blocks")
    steps = server.aengine.snapshot[0] - steps_at_close
    assert steps <= 10, f"the engine ran {steps} steps after the client left before freeing its blocks"
    assert server.aengine.abort_delays[-1] <= 1, "an abort must be applied before the next engine step"
    assert metric(server, "course:request_aborts_total", '{cause="client_disconnect"}') == aborts0 + 1, \
        "the request finished instead of being aborted: the disconnect was not noticed"


def test_stalled_reader_does_not_stop_others_and_is_dropped(server, client, offline):
    slow0 = metric(server, "course:request_aborts_total", '{cause="slow_reader"}')
    body = json.dumps(stream_body("A long road", 400, ignore_eos=True)).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connect: a small window
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:  # never read: the server's writes for this stream stall
        ref = greedy(offline, "Meanwhile", 40)
        t0 = time.monotonic()
        for _ in range(3):
            r = client.completions.create(model=MODEL, prompt="Meanwhile", max_tokens=40, temperature=0)
            assert r.choices[0].model_extra["token_ids"] == ref.token_ids
        assert time.monotonic() - t0 < 20, "other requests were held up by a stalled reader"
        wait_until(lambda: metric(server, "course:request_aborts_total", '{cause="slow_reader"}') == slow0 + 1,
                   "the stalled stream to be dropped as a slow reader")
        wait_until(lambda: idle(server), "the slow reader's KV blocks to be freed")
    finally:
        sock.close()


def _read_stream(base_url, body, headers=None, stop_after=None):
    """(token ids received, finish_reason) of one streamed answer; stop_after: disconnect after that many."""
    ids, reason = [], None
    with httpx.Client(timeout=30) as c, c.stream("POST", base_url + "/v1/completions", json=body,
                                                 headers=headers or {}) as r:
        assert r.status_code == 200, r.read()
        for ev in sse_events(r.iter_lines()):
            ids += ev["choices"][0]["token_ids"]
            reason = ev["choices"][0]["finish_reason"] or reason
            if stop_after is not None and len(ids) >= stop_after:
                break
    return ids, reason


def test_idempotent_retry_is_generated_once(server, offline):
    ref = greedy(offline, "Twice told", 120, ignore_eos=True)
    body, headers = stream_body("Twice told", 120, ignore_eos=True), {"Idempotency-Key": "retry-1"}
    results = []
    first = threading.Thread(target=lambda: results.append(_read_stream(server.base_url, body, headers)))
    first.start()
    wait_until(lambda: server.comps.cache.get("retry-1") is not None, "the first request to reach the server")
    results.append(_read_stream(server.base_url, body, headers))  # a retry while the first is in flight
    first.join(30)
    results.append(_read_stream(server.base_url, body, headers))  # and one after it finished: a replay
    assert all(ids == ref.token_ids and reason == "length" for ids, reason in results), \
        "every retry must receive the same answer"
    gen = server.comps.cache.get("retry-1")
    assert gen.engine_requests == 1 and gen.engine_tokens == len(ref.token_ids), \
        f"generated {gen.engine_tokens} tokens in {gen.engine_requests} engine requests for one {len(ref.token_ids)}-token answer"
    other = httpx.post(server.base_url + "/v1/completions", json={**body, "prompt": "Other"}, headers=headers)
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"


def test_resume_continues_where_the_client_stopped(server, offline):
    ref = greedy(offline, "Halfway there", 200, ignore_eos=True)
    body, key = stream_body("Halfway there", 200, ignore_eos=True), "resume-1"
    head, _ = _read_stream(server.base_url, body, {"Idempotency-Key": key}, stop_after=20)
    gen = server.comps.cache.get(key)
    # The engine thread frees the blocks first; the abort reaches the Generation on the event loop after that.
    wait_until(lambda: idle(server) and not gen.in_flight, "the abandoned stream to be aborted")
    assert gen.finish_reason == "abort" and len(gen.token_ids) < 200, "the first stream should have been aborted"
    tail, reason = _read_stream(server.base_url, body, {"Idempotency-Key": key, "X-Resume-From": str(len(head))})
    assert head + tail == ref.token_ids and reason == "length"
    assert gen.engine_requests == 2 and gen.engine_tokens == len(ref.token_ids), \
        f"resume regenerated tokens: {gen.engine_tokens} generated for a {len(ref.token_ids)}-token answer"
    bad = httpx.post(server.base_url + "/v1/completions", json=body, headers={"Idempotency-Key": key, "X-Resume-From": "999"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Resume-From"


# ---- the components on their own --------------------------------------------------------------------------
def test_buffer_coalesces_then_drops_past_its_limits():
    b = BoundedStreamBuffer(high_water=4, max_lag_s=1.0)
    assert b.push([1], 0.0) and b.push([2, 3], 0.1) and b.pop(0.2) == [1, 2, 3] and b.pending == 0
    assert b.push([4, 5, 6, 7], 0.3) and not b.push([8], 0.3) and b.pending == 0 and not b.push([9], 9.0)
    old = BoundedStreamBuffer(high_water=100, max_lag_s=1.0)
    assert old.push([1], 0.0) and not old.push([2], 1.5), "a token pending longer than max_lag_s must drop the stream"


def test_sse_framing():
    f = DefaultSSEFramer()
    assert f.event('{"a": 1}') == b'data: {"a": 1}\n\n' and f.done() == b"data: [DONE]\n\n"
    assert f.keep_alive().startswith(b":") and f.keep_alive().endswith(b"\n\n")
    for broken in ("two\nlines", "two\rlines", "two\r\nlines"):  # SSE ends a line at \r too
        with pytest.raises(ValueError):
            f.event(broken)


def test_resume_refuses_counts_that_are_not_ints():
    """The server's resume policy, held to lesson 12's contract: a bool (True) or a float is no count."""
    from reference_engine.server.interfaces import Generation
    from reference_engine.server.streaming import ContinueResumePolicy
    gen = Generation(key=None, fingerprint="f", prompt_token_ids=[5, 6], max_tokens=5, token_ids=[7, 8, 9])
    assert ContinueResumePolicy().plan(gen, 1).replay == [8, 9]
    for bad in (True, 1.0, "1", -1, 4):
        with pytest.raises(ValueError):
            ContinueResumePolicy().plan(gen, bad)


def test_nonstreaming_client_that_gives_up_is_aborted(server):
    aborts0 = metric(server, "course:request_aborts_total", '{cause="client_disconnect"}')
    body = {"model": MODEL, "prompt": "Patience", "max_tokens": 480, "ignore_eos": True, "temperature": 0}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.2))
    wait_until(lambda: metric(server, "course:request_aborts_total", '{cause="client_disconnect"}') == aborts0 + 1,
               "the abandoned non-streaming request to be aborted")
    wait_until(lambda: idle(server), "its KV blocks to be freed")


def _quietly(fn, *args):
    try:
        fn(*args)
    except httpx.HTTPError:  # the server stopped under it: what the test is about
        pass


def test_queued_stream_gets_keep_alives_and_shutdown_frees_everything():
    """One slot: a second stream waits in the queue, hearing keep-alive comments; stopping the server
    mid-stream aborts what runs and frees every block."""
    engine, _ = build_engine(TARGET, warm_up=False, max_num_seqs=1)
    app = create_app(engine, MODEL, components=StreamComponents(framer=DefaultSSEFramer(keep_alive_interval=0.05)))
    s = ServerThread(app).start()
    try:
        first = threading.Thread(target=_quietly, args=(_read_stream, s.base_url, stream_body("First", 400, ignore_eos=True)),
                                 daemon=True)
        first.start()
        wait_until(lambda: app.state.aengine.snapshot[2] == 1, "the first request to be running")
        lines = []
        with httpx.Client(timeout=30) as c, c.stream("POST", s.base_url + "/v1/completions",
                                                     json=stream_body("Second", 5)) as r:
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data: {"):
                    break  # its first token: the first request has finished
        assert ": keep-alive" in lines[:lines.index(next(x for x in lines if x.startswith("data: {")))], \
            "a stream waiting for its first token should get keep-alive comments"
        third = threading.Thread(target=_quietly, args=(_read_stream, s.base_url, stream_body("Third", 400, ignore_eos=True)),
                                 daemon=True)
        third.start()
        wait_until(lambda: "gen-2-0" in engine.requests, "the third request to be in the engine")
    finally:
        s.stop()
    assert not app.state.aengine.running, "the engine loop should stop with the server"
    assert engine.block_manager.num_free() == engine.num_blocks and not engine.requests, \
        "stopping the server must abort what was running and free its blocks"


def test_course_serve_command_parses():
    from autograder.cli import cmd_serve, parser

    args = parser().parse_args(["serve", "--port", "8123", "--host", "0.0.0.0"])
    assert args.func is cmd_serve and args.port == 8123 and args.host == "0.0.0.0" and args.model is None
