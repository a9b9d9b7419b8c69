"""What a user porting from vLLM expects of the server's request parameters and endpoints, with the real `openai`
client over real HTTP (uvicorn on a free port, one server per module).

Every answer is compared with an independent computation: the offline engine's greedy tokens (cut by hand at a
stop string), a direct torch computation of logprobs from the offline model's logits, or a decode loop that
applies vLLM's penalty and bias formulas itself.
"""
from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest
import torch

from reference_engine import SamplingParams
from reference_engine.server.api import create_app
from reference_engine.server.chat import apply_chat_template
from reference_engine.server.runner import ServerThread
from reference_engine.shipped import TARGET
from reference_engine.tools.startup import build_engine
from tests.server_helpers import idle, wait_until

MODEL = "target"
PROMPT = "Once upon a time"  # greedy: '.', '\n   ', ' """', '\n   ', ' if', ' not', ' isinstance', '(', 'self', ...


@pytest.fixture(scope="module")
def server():
    engine, _ = build_engine(TARGET, max_num_seqs=16)
    app = create_app(engine, MODEL)
    with ServerThread(app) as s:
        s.engine, s.aengine, s.app = engine, app.state.aengine, app
        yield s
    assert engine.block_manager.num_free() == engine.num_blocks, "KV blocks still held after the server stopped"


def greedy(offline, prompt, max_tokens, **kw):
    return offline.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, **kw))[0]


def post(server, path, body):
    return httpx.post(server.base_url + path, content=json.dumps(body), headers={"content-type": "application/json"},
                      timeout=60)


def streamed(chunks, kind="completion"):
    """{index: (texts per chunk, token ids, finish_reason, stop_reason)} of a streamed answer."""
    out = {}
    for c in chunks:
        for ch in c.choices:
            texts, ids, _, _ = out.setdefault(ch.index, ([], [], None, None))
            texts.append((ch.delta.content or "") if kind == "chat" else ch.text)
            ids += ch.model_extra["token_ids"]
            if ch.finish_reason:
                out[ch.index] = (texts, ids, ch.finish_reason, ch.model_extra.get("stop_reason"))
    return out


def cut_at_stop(tokenizer, ids, stops, include=False):
    """An independent stop-string cut of greedy tokens: the first token count whose text contains a stop
    string (the earliest ending), the text cut before it (after it with include), and that string."""
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k])
        hits = [(text.find(s) + len(s), s) for s in stops if s in text]
        if hits:
            end, s = min(hits)
            return k, text[:end] if include else text[:end - len(s)], s
    raise AssertionError(f"no stop string of {stops} in the greedy answer: pick another")


# ---- stop strings -------------------------------------------------------------------------------------------
def test_a_stop_string_split_across_two_chunks_is_never_shown(client, offline):
    """'instance(' begins inside the token ' isinstance' and ends with the next token '(' (one chunk per token):
    the stream holds 'instance' back, and drops it when '(' completes the stop string."""
    tok, stop = offline.tokenizer, "instance("
    ref = greedy(offline, PROMPT, 40)
    k, want, _ = cut_at_stop(tok, ref.token_ids, [stop])
    assert tok.decode(ref.token_ids[:k - 1]).endswith("instance"), "the stop string must straddle two tokens"
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=stop,
                                            stream=True))
    (texts, ids, reason, stop_reason), = streamed(chunks).values()
    shown = ""
    for t in texts:
        shown += t
        assert want.startswith(shown), f"the stream showed {shown!r}, which is not a prefix of the answer {want!r}"
    assert shown == want and ids == ref.token_ids[:k] and reason == "stop" and stop_reason == stop
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=stop)
    assert whole.choices[0].text == want and whole.choices[0].model_extra["token_ids"] == ref.token_ids[:k]
    assert whole.choices[0].finish_reason == "stop" and whole.choices[0].model_extra["stop_reason"] == stop
    assert whole.usage.completion_tokens == k


def test_a_held_back_prefix_is_released_when_the_stop_string_cannot_match(client, offline):
    """'instance)' never completes ('instance' is followed by '('): the held-back text comes out with the next
    chunk, and the answer is the whole greedy one."""
    ref = greedy(offline, PROMPT, 12)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                            stop=["instance)"], stream=True))
    (texts, ids, reason, stop_reason), = streamed(chunks).values()
    assert "".join(texts) == ref.text and ids == ref.token_ids and reason == "length" and stop_reason is None
    at = [i for i, t in enumerate(texts) if "instance" in "".join(texts[:i + 1])][0]
    assert texts[at].endswith("("), f"'instance' should come out with '(' once it cannot start a match: {texts}"


@pytest.mark.parametrize("kind, stops, include", [
    ("completion", ["get_re"], False), ("completion", ["nope", " not", "self"], False),
    ("completion", ["isinstance"], True), ("completion", ['"""\n'], False),
    ("chat", ["\n#\n"], False), ("chat", ["x", "#\n#\n#"], True), ("chat", ["\n#"], False)])
def test_stop_strings_streamed_whole_and_offline_agree(client, offline, stops, include, kind):
    """Greedy answers: the completion's begins '.', newline, triple quote, newline, 'if not isinstance(self',
    the chat's is '#', newline, '#', newline, ..."""
    extra = {"include_stop_str_in_output": True} if include else {}
    messages = [{"role": "user", "content": PROMPT}]
    prompt = PROMPT if kind == "completion" else apply_chat_template(messages)
    ref = greedy(offline, prompt, 40)
    k, want, hit = cut_at_stop(offline.tokenizer, ref.token_ids, stops, include)
    engine_ref = greedy(offline, prompt, 40, stop=stops, include_stop_str_in_output=include)
    assert (engine_ref.text, engine_ref.token_ids, engine_ref.outputs[0].stop_reason) == (want, ref.token_ids[:k], hit)
    if kind == "completion":
        call = lambda **kw: client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0,  # noqa: E731
                                                      stop=stops, extra_body=extra, **kw)
        whole = call().choices[0]
        text = whole.text
    else:
        call = lambda **kw: client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40,  # noqa: E731
                                                           temperature=0, stop=stops, extra_body=extra, **kw)
        whole = call().choices[0]
        text = whole.message.content
    assert text == want and whole.finish_reason == "stop" and whole.model_extra["stop_reason"] == hit
    (texts, ids, reason, stop_reason), = streamed(list(call(stream=True)), kind).values()
    assert "".join(texts) == want and ids == ref.token_ids[:k] and (reason, stop_reason) == ("stop", hit)


def test_stop_token_ids_report_the_token_as_stop_reason(client, offline):
    ref = greedy(offline, PROMPT, 12)
    token = ref.token_ids[4]
    assert token not in ref.token_ids[:4]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                  extra_body={"stop_token_ids": [token]})
    c = r.choices[0]
    assert c.model_extra["token_ids"] == ref.token_ids[:5] and c.finish_reason == "stop"
    assert c.model_extra["stop_reason"] == token


@pytest.mark.parametrize("stop, why", [([""], "empty"), (["x"] * 33, "too many"), (["x" * 257], "too long"),
                                       ([1], "not a string")])
def test_bad_stop_strings_are_refused(server, stop, why):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "stop": stop})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop", (why, r.text)


def test_a_resumed_stream_keeps_stop_strings_and_penalties(server, offline):
    """A stream with a stop string and a frequency penalty, cut after 3 tokens and resumed with its key: the
    continuation counts the tokens it already has as output (the penalty) and is searched for the stop
    string from where the first request left off, so head + tail is the uninterrupted answer."""
    params = dict(temperature=0, max_tokens=80, stop=["def _is"], frequency_penalty=0.5)
    ref = offline.generate(PROMPT, SamplingParams(**params))[0]
    plain = greedy(offline, PROMPT, 80, stop=["def _is"])
    assert ref.finish_reason == "stop" and plain.finish_reason == "length", "the penalty should make the stop match"
    assert len(ref.token_ids) > 40
    body = {"model": MODEL, "prompt": PROMPT, "stream": True, **params}
    key = {"Idempotency-Key": "resume-with-stop"}
    head, texts = [], []
    with httpx.Client(timeout=30) as c, c.stream("POST", server.base_url + "/v1/completions", json=body,
                                                 headers=key) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                ch = json.loads(line[6:])["choices"][0]
                head += ch["token_ids"]
                texts.append(ch["text"])
                if len(head) >= 3:
                    break
    gen = server.app.state.components.cache.get("resume-with-stop")
    wait_until(lambda: idle(server) and not gen.in_flight, "the abandoned stream to be aborted")
    assert gen.finish_reason == "abort" and len(gen.token_ids) < len(ref.token_ids)
    tail, reason, stop_reason = [], None, None
    with httpx.Client(timeout=30) as c, c.stream("POST", server.base_url + "/v1/completions", json=body,
                                                 headers={**key, "X-Resume-From": str(len(head))}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                ch = json.loads(line[6:])["choices"][0]
                tail += ch["token_ids"]
                texts.append(ch["text"])
                reason, stop_reason = ch["finish_reason"] or reason, ch["stop_reason"] or stop_reason
    assert gen.engine_requests == 2, "the answer should have been continued, not replayed"
    assert head + tail == ref.token_ids and (reason, stop_reason) == ("stop", "def _is")
    assert "".join(texts) == ref.text


# ---- max_tokens defaults ----------------------------------------------------------------------------------------
def test_chat_max_tokens_defaults_to_the_rest_of_the_context(client, server):
    """vLLM's get_max_tokens: a chat request without max_tokens may use all of the context the prompt leaves."""
    messages = [{"role": "user", "content": "word " * 240}]
    n_prompt = len(server.engine.tokenize(apply_chat_template(messages)))
    rest = server.engine.max_seq_len - n_prompt
    assert 0 < rest < 40, rest
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == rest and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == n_prompt


def test_max_completion_tokens_wins_and_completions_default_to_16(client):
    messages = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=3,
                                       max_completion_tokens=5, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5
    r = client.completions.create(model=MODEL, prompt="hi", temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16


# ---- n > 1 ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_n_samples_are_the_engines_forked_samples(client, offline, stream):
    """n = 3 with a seed: choice i is sample i of the offline engine's n = 3 request (its copy-on-write forks),
    the three differ, and the same seed gives the same three again."""
    sp = SamplingParams(temperature=1.0, max_tokens=10, n=3, seed=11, ignore_eos=True)
    want = [o.token_ids for o in offline.generate(PROMPT, sp)[0].outputs]
    assert len({tuple(w) for w in want}) == 3, "the samples should differ"
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=1.0, n=3, seed=11,
              extra_body={"ignore_eos": True})
    if stream:
        got = streamed(client.completions.create(stream=True, **kw))
        assert sorted(got) == [0, 1, 2]
        assert [got[i][1] for i in range(3)] == want and all(got[i][2] == "length" for i in range(3))
        return
    r = client.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.model_extra["token_ids"] for c in r.choices] == want
    assert [c.text for c in r.choices] == [offline.tokenizer.decode(w) for w in want]
    assert r.usage.completion_tokens == 30
    again = client.completions.create(**kw)
    assert [c.model_extra["token_ids"] for c in again.choices] == want


def test_chat_n_streams_every_choice_with_its_own_index(client, offline):
    messages = [{"role": "user", "content": "Tell me a story."}]
    sp = SamplingParams(temperature=0.8, max_tokens=8, n=2, seed=3, ignore_eos=True)
    want = offline.generate(apply_chat_template(messages), sp)[0].outputs
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0.8,
                                                 n=2, seed=3, stream=True, extra_body={"ignore_eos": True}))
    roles = [c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1]
    got = streamed(chunks, "chat")
    assert ["".join(got[i][0]) for i in range(2)] == [o.text for o in want]


def test_a_client_leaving_an_n_stream_frees_every_sample(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 400, "temperature": 1.0, "n": 3, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=30) as c, c.stream("POST", server.base_url + "/v1/completions", json=body) as r:
        seen = set()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen.add(json.loads(line[6:])["choices"][0]["index"])
                if seen == {0, 1, 2}:
                    break
    steps = server.aengine.snapshot[0]
    wait_until(lambda: idle(server), "the three samples to leave the engine and free their blocks")
    assert server.aengine.snapshot[0] - steps <= 10 and server.aengine.abort_delays[-1] <= 1


@pytest.mark.parametrize("headers", [{"Idempotency-Key": "k"}, {"X-Resume-From": "1"}])
def test_n_with_an_idempotency_key_is_refused(server, headers):
    r = httpx.post(server.base_url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "n": 2},
                   headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text


# ---- logprobs ---------------------------------------------------------------------------------------------------
def raw_logprobs(offline, prompt_ids, out_ids):
    """Log-softmax of the offline model's logits at every position of prompt + output: row j scores token j + 1."""
    logits = offline.engine.score(list(prompt_ids) + list(out_ids))
    return torch.log_softmax(logits.float(), -1)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_are_the_models_log_softmax(client, offline, stream):
    ref = greedy(offline, PROMPT, 6)
    lp = raw_logprobs(offline, ref.prompt_token_ids, ref.token_ids)
    P = len(ref.prompt_token_ids)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3, stream=stream)
    chunks = list(r) if stream else [r]
    tokens, token_lps, tops, offsets = [], [], [], []
    for c in chunks:
        for ch in c.choices:
            if ch.logprobs is not None:
                tokens += ch.logprobs.tokens
                token_lps += ch.logprobs.token_logprobs
                tops += ch.logprobs.top_logprobs
                offsets += ch.logprobs.text_offset
    tok = offline.tokenizer
    assert tokens == [tok.decode([t]) for t in ref.token_ids]
    for j, t in enumerate(ref.token_ids):
        row = lp[P - 1 + j]
        assert token_lps[j] == pytest.approx(row[t].item(), abs=1e-4)
        top = row.topk(3)
        want = {tok.decode([i]): v for i, v in zip(top.indices.tolist(), top.values.tolist())}
        want[tok.decode([t])] = row[t].item()
        assert tops[j].keys() == want.keys() and all(tops[j][k] == pytest.approx(v, abs=1e-4) for k, v in want.items())
    assert offsets == [sum(len(s) for s in tokens[:j]) for j in range(len(tokens))]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_and_top_logprobs(client, offline, stream):
    messages = [{"role": "user", "content": "Tell me a story."}]
    ref = greedy(offline, apply_chat_template(messages), 5)
    lp = raw_logprobs(offline, ref.prompt_token_ids, ref.token_ids)
    P = len(ref.prompt_token_ids)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=2, stream=stream)
    content = [e for c in (list(r) if stream else [r]) for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    tok = offline.tokenizer
    assert [e.token for e in content] == [tok.decode([t]) for t in ref.token_ids]
    for j, (e, t) in enumerate(zip(content, ref.token_ids)):
        row = lp[P - 1 + j]
        assert e.logprob == pytest.approx(row[t].item(), abs=1e-4) and e.bytes == list(e.token.encode())
        top = row.topk(2)
        assert [x.token for x in e.top_logprobs] == [tok.decode([i]) for i in top.indices.tolist()]
        assert [x.logprob for x in e.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_echo_with_logprobs_scores_the_prompt(client, offline):
    ref = greedy(offline, PROMPT, 3)
    ids, P = ref.prompt_token_ids, len(ref.prompt_token_ids)
    lp = raw_logprobs(offline, ids, ref.token_ids)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1)
    c = r.choices[0]
    assert c.text == PROMPT + ref.text
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    want = [lp[j - 1, t].item() for j, t in enumerate(list(ids) + list(ref.token_ids)) if j]
    assert c.logprobs.token_logprobs[1:] == pytest.approx(want, abs=1e-4)
    assert len(c.logprobs.tokens) == P + 3 and c.model_extra["token_ids"] == ref.token_ids
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True,
                                            stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == PROMPT + ref.text


@pytest.mark.parametrize("body, param", [({"logprobs": 21}, "logprobs"), ({"logprobs": True}, "logprobs")])
def test_completion_logprobs_bounds(server, body, param):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("body, param", [({"top_logprobs": 2}, "top_logprobs"),
                                         ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                                         ({"logprobs": 3}, "logprobs")])
def test_chat_logprobs_bounds(server, body, param):
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# ---- stream_options ---------------------------------------------------------------------------------------------
def test_include_usage_ends_the_stream_with_the_usage(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=7, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(client.completions.create(stream=True, **kw))
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)
    running = list(client.completions.create(  # vLLM's continuous_usage_stats: the usage so far on every chunk
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}, **kw))
    counts = [c.usage.completion_tokens for c in running]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 7 and running[-1].choices == []


def test_stream_options_need_stream(server):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options", r.text


# ---- penalties, min_tokens, logit_bias ---------------------------------------------------------------------------
def decode_loop(offline, prompt, n, presence=0.0, frequency=0.0, repetition=1.0, bias=None, suppress=(),
                min_tokens=0):
    """Greedy decoding written out with vLLM's formulas: logit_bias added, `suppress` masked while fewer than
    min_tokens are out, repetition penalty on prompt + output tokens (divide a positive logit, multiply a
    negative one), then frequency (times the count) and presence (once) on output tokens."""
    ids = offline.engine.tokenize(prompt)
    out = []
    for _ in range(n):
        row = offline.engine.score(ids + out)[-1].double()
        for t, b in (bias or {}).items():
            row[t] += b
        if len(out) < min_tokens:
            for t in suppress:
                row[t] = float("-inf")
        for t in set(ids + out):
            if repetition != 1.0:
                row[t] = row[t] / repetition if row[t] > 0 else row[t] * repetition
        for t in set(out):
            row[t] -= frequency * out.count(t) + presence
        out.append(int(row.argmax()))
    return out


@pytest.mark.parametrize("penalties", [dict(presence_penalty=1.5), dict(frequency_penalty=0.8),
                                       dict(repetition_penalty=1.6),
                                       dict(presence_penalty=0.5, frequency_penalty=0.4, repetition_penalty=1.2)])
def test_penalties_follow_vllms_formulas(client, offline, penalties):
    prompt = "The river"  # greedy repeats ' the same, and the same'
    names = {"presence_penalty": "presence", "frequency_penalty": "frequency", "repetition_penalty": "repetition"}
    want = decode_loop(offline, prompt, 14, **{names[k]: v for k, v in penalties.items()})
    assert want != greedy(offline, prompt, 14).token_ids, "the penalty should change the greedy answer"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=14, temperature=0,
                                  presence_penalty=penalties.get("presence_penalty"),
                                  frequency_penalty=penalties.get("frequency_penalty"),
                                  extra_body={"ignore_eos": True, **({"repetition_penalty": penalties[
                                      "repetition_penalty"]} if "repetition_penalty" in penalties else {})})
    assert r.choices[0].model_extra["token_ids"] == want


def test_min_tokens_suppresses_stop_tokens_until_then(client, offline):
    ref = greedy(offline, PROMPT, 8)
    stop = ref.token_ids[0]  # would stop the answer at its first token
    want = decode_loop(offline, PROMPT, 6, suppress=(stop, 0), min_tokens=4)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                  extra_body={"stop_token_ids": [stop], "min_tokens": 4})
    got = r.choices[0].model_extra["token_ids"]
    assert len(got) >= 4 and stop not in got[:4]
    end = next((i + 1 for i, t in enumerate(want) if i >= 4 and t == stop), len(want))
    assert got == want[:end]
    short = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                      extra_body={"stop_token_ids": [stop]})
    assert short.choices[0].model_extra["token_ids"] == [stop] and short.choices[0].finish_reason == "stop"


def test_min_tokens_keeps_stop_strings_from_matching_early(client, offline):
    """vLLM's detokenizer searches no text made while at most min_tokens tokens are out: the '.' of the first
    token does not stop the answer; the first '.' after token 2 does."""
    ref = greedy(offline, PROMPT, 40)
    tok = offline.tokenizer
    assert tok.decode(ref.token_ids[:1]) == "."
    early = len(tok.decode(ref.token_ids[:2]))
    k = next(k for k in range(3, 41) if "." in tok.decode(ref.token_ids[:k])[early:])
    text = tok.decode(ref.token_ids[:k])
    want = text[:text.index(".", early)]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=["."],
                                  extra_body={"min_tokens": 2})
    assert r.choices[0].text == want and r.choices[0].model_extra["token_ids"] == ref.token_ids[:k]


def test_logit_bias(client, offline):
    ref = greedy(offline, PROMPT, 6)
    first = ref.token_ids[0]
    want = decode_loop(offline, PROMPT, 6, bias={first: -100.0})
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                  logit_bias={str(first): -100}, extra_body={"ignore_eos": True})
    assert r.choices[0].model_extra["token_ids"] == want and first not in want
    forced = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0,
                                       logit_bias={"42": 100}, extra_body={"ignore_eos": True})
    assert forced.choices[0].model_extra["token_ids"] == [42] * 5


@pytest.mark.parametrize("bias", [{"x": 1}, {"99999": 1}, {"-1": 1}, {"1": "a"}, {"1": float("nan")}])
def test_bad_logit_bias_is_refused(server, bias):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "logit_bias": bias})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text


@pytest.mark.parametrize("body, param", [({"presence_penalty": 2.5}, "presence_penalty"),
                                         ({"frequency_penalty": -3}, "frequency_penalty"),
                                         ({"repetition_penalty": 0}, "repetition_penalty"),
                                         ({"min_tokens": 20, "max_tokens": 5}, "min_tokens"),
                                         ({"min_tokens": -1}, "min_tokens")])
def test_penalty_and_min_tokens_bounds(server, body, param):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# ---- endpoints ----------------------------------------------------------------------------------------------------
def test_retrieve_a_model(client, server):
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.model_extra["max_model_len"] == server.engine.max_seq_len
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-9")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def test_tokenize_and_detokenize(server, offline):
    tok = offline.tokenizer
    r = post(server, "/tokenize", {"model": MODEL, "prompt": PROMPT, "return_token_strs": True}).json()
    ids = tok.encode(PROMPT)
    assert r == {"count": len(ids), "max_model_len": server.engine.max_seq_len, "tokens": ids,
                 "token_strs": [tok.decode([t]) for t in ids]}
    messages = [{"role": "user", "content": "hi"}]
    r = post(server, "/tokenize", {"messages": messages}).json()
    assert r["tokens"] == tok.encode(apply_chat_template(messages)) and r["token_strs"] is None
    r = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()
    assert r["tokens"] == tok.encode(apply_chat_template(messages, add_generation_prompt=False))
    assert post(server, "/detokenize", {"model": MODEL, "tokens": ids}).json() == {"prompt": PROMPT}
    bad = post(server, "/detokenize", {"tokens": [1, 99999]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert post(server, "/tokenize", {"model": "gpt-9", "prompt": "x"}).status_code == 404


def test_version(server):
    from importlib.metadata import version
    assert httpx.get(server.base_url + "/version").json() == {"version": version("inference-course")}


def test_api_key_guards_every_v1_route():
    engine, _ = build_engine(TARGET, warm_up=False, max_num_seqs=2)
    app = create_app(engine, MODEL, api_key="s3cret")
    with ServerThread(app) as s:
        url = s.base_url
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}):
            for method, path in (("GET", "/v1/models"), ("GET", f"/v1/models/{MODEL}"), ("POST", "/v1/completions"),
                                 ("POST", "/v1/chat/completions")):
                r = httpx.request(method, url + path, headers=headers, json={"model": MODEL, "prompt": "hi"})
                assert r.status_code == 401, (headers, path, r.status_code)
                assert r.json()["error"]["code"] == "invalid_api_key" and set(r.json()["error"]) == {
                    "message", "type", "param", "code"}
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="hi", max_tokens=2).usage.completion_tokens >= 1
        assert [m.id for m in good.models.list().data] == [MODEL]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="s3cre", max_retries=0).models.list()
        for path in ("/health", "/metrics", "/version"):  # open, as in vLLM
            assert httpx.get(url + path).status_code == 200, path
        assert httpx.post(url + "/tokenize", json={"prompt": "hi"}).status_code == 200
        assert 'course:request_validation_failures_total{param="Authorization",status="401"} 17.0' in \
            httpx.get(url + "/metrics").text


def test_api_key_option():
    from autograder.cli import parser
    from reference_engine.server.options import add_serve_arguments, api_key_of
    args = parser().parse_args(["serve", "--api-key", "k1"])
    assert args.api_key == "k1" and api_key_of(args) == "k1"
    import argparse
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    assert p.parse_args([]).api_key is None and p.parse_args(["--api-key", "x"]).api_key == "x"


# ---- what is not implemented ----------------------------------------------------------------------------------------
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "echo": True}, "echo"),
    ("/v1/completions", {**COMPLETION, "suffix": "end"}, "suffix"),
    ("/v1/completions", {**COMPLETION, "best_of": 2}, "best_of"),
    ("/v1/completions", {**COMPLETION, "use_beam_search": True}, "use_beam_search"),
    ("/v1/completions", {**COMPLETION, "guided_json": {"type": "object"}}, "guided_json"),
    ("/v1/completions", {**COMPLETION, "prompt_logprobs": 1}, "prompt_logprobs"),
    ("/v1/completions", {**COMPLETION, "skip_special_tokens": False}, "skip_special_tokens"),
])
def test_known_but_unsupported_fields_are_refused_by_name(server, path, body, param):
    r = post(server, path, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_fields_that_ask_for_nothing_and_unknown_fields_are_accepted(client, offline, caplog):
    ref = greedy(offline, "hi", 3)
    with caplog.at_level(logging.WARNING, logger="reference_engine.server.protocol"):
        r = client.completions.create(model=MODEL, prompt="hi", max_tokens=3, temperature=0, user="someone",
                                      best_of=1, extra_body={"response_format": {"type": "text"}, "colour": "blue",
                                                             "tool_choice": None, "suffix": None, "request_id": "r1"})
    assert r.choices[0].model_extra["token_ids"] == ref.token_ids and r.id == "cmpl-r1"
    assert any("ignored" in m and "colour" in m for m in caplog.messages), caplog.messages
    assert not any("user" in m for m in caplog.messages)
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       tool_choice="none", parallel_tool_calls=False)
    assert c.choices[0].finish_reason in ("length", "stop")


def test_the_server_is_idle_after_the_module(server):
    wait_until(lambda: idle(server), "every request to leave the engine")
