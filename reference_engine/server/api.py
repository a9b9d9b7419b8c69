"""The OpenAI-compatible HTTP API: create_app(engine) -> a FastAPI app.

    POST /v1/completions        {"model", "prompt", "max_tokens", "temperature", ..., "stream"}
    POST /v1/chat/completions   {"model", "messages", ...}   (chat.py's template)
    GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text), /version
    POST /tokenize, /detokenize (vLLM's shapes)

The request fields each endpoint implements, refuses and ignores are protocol.py's (README: the table beside
vLLM's). Beyond OpenAI: each choice carries "token_ids" (vLLM's return_token_ids) and "stop_reason" (vLLM's),
and two request headers: Idempotency-Key (a retry with the same key gets the same answer, generated once)
and X-Resume-From (with the key: the number of tokens the client already received; the stream continues
after them). Keys are scoped by the Authorization header (two API keys never share an answer), at most 256
characters and never empty. With api_key, every /v1 route needs `Authorization: Bearer <api_key>` (auth.py).

Errors are {"error": {"message", "type", "param", "code"}}: a 400 naming the field for anything the client
sent wrong or asked for that is not implemented, 401 for a wrong API key, 404 for an unknown model, 413 for a
body over max_body_bytes (limits.py), 500 (or, mid-stream, an error event and [DONE]) for a request the
engine failed; that failure ends only that request.

Each choice's text comes from its TextStreamer (components.make_detokenizer; interfaces.py): an incremental
detokenizer that decodes a window of the last tokens, never shows text that a stop string may still claim (it
holds back the longest tail that a stop string begins with, and a UTF-8 character not yet complete, until the
next tokens rule it out) and cuts the text at the stop string as the engine does. Streamed and whole answers go
through it alike, so they are the same text, and the engine's.

Nothing slow runs on the event loop: prompts are tokenized in a worker thread, after a bound on their
length in characters that refuses what cannot fit without tokenizing it.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..sampling import MAX_TOKENS_LIMIT, SamplingParams
from .async_engine import AsyncEngine
from .auth import APIKeyAuth
from .chat import apply_chat_template
from .limits import BodyLimit, BodyTooLarge, too_large_body
from .metrics import ServerMetrics
from .options import DEFAULT_MAX_BODY_BYTES
from .protocol import (
    MAX_LOGPROBS,
    MAX_N,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    UNSUPPORTED_CHAT,
    UNSUPPORTED_COMPLETION,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    error_body,
    refuse_unsupported,
)
from .serving import GenerationService, Subscriber, fingerprint
from .streaming import StreamComponents

log = logging.getLogger(__name__)
# /v1/completions without max_tokens: 16, OpenAI's default and vLLM's (its CompletionRequest.max_tokens defaults
# to 16). /v1/chat/completions without max_tokens or max_completion_tokens: the rest of the context, as vLLM's
# get_max_tokens (max_model_len - prompt tokens).
DEFAULT_MAX_TOKENS = 16
MAX_IDEMPOTENCY_KEY_CHARS = 256
# No token of a tokenizer in use spans more characters than this (the shipped one's longest is 41: a newline
# and 40 spaces), so a prompt longer than max_seq_len * this many characters cannot fit, tokenized or not.
MAX_CHARS_PER_TOKEN = 64
_RESUME_COUNT = re.compile(r"[0-9]{1,18}")  # digits only: int() would also read "1_0", " 10", "+10" and "١٠"


def create_app(engine, model_name: str | None = None, components: StreamComponents | None = None,
               metrics: ServerMetrics | None = None, startup_report=None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, api_key: str | None = None) -> FastAPI:
    """A FastAPI app serving `engine` (an LLMEngine the app now owns: its background loop starts with the
    app and stops with it). model_name: the id clients must send (default: the model directory's name).
    max_body_bytes: larger request bodies get a 413 before they are read (limits.BodyLimit). api_key: every
    /v1 route needs `Authorization: Bearer <api_key>` (auth.APIKeyAuth; None: no key)."""
    metrics = metrics or ServerMetrics()
    components = components or StreamComponents()
    aengine = AsyncEngine(engine, metrics)
    service = GenerationService(aengine, components)
    name = model_name or getattr(engine.config, "name", None) or "model"

    @asynccontextmanager
    async def lifespan(app):
        aengine.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            service.closing = True
            await asyncio.to_thread(aengine.shutdown)

    app = FastAPI(title="course inference server", lifespan=lifespan)
    app.state.engine, app.state.aengine, app.state.service = engine, aengine, service
    app.state.metrics, app.state.components, app.state.model_name = metrics, components, name
    app.state.startup_report = startup_report
    _error_handlers(app, metrics)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes,
                       on_refused=lambda: metrics.request_validation_failures.labels("413", "body").inc())
    if api_key is not None:  # added last: the outermost, so a wrong key is refused before the body is read
        app.add_middleware(APIKeyAuth, api_key=api_key,
                           on_refused=lambda: metrics.request_validation_failures.labels("401", "Authorization").inc())
    api = _Handlers(engine, aengine, service, components, name)

    app.post("/v1/completions")(api.completions)
    app.post("/v1/chat/completions")(api.chat)
    app.post("/tokenize")(api.tokenize)
    app.post("/detokenize")(api.detokenize)

    def card() -> dict:
        return {"id": name, "object": "model", "created": api.created, "owned_by": "course", "root": name,
                "parent": None, "max_model_len": engine.max_seq_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        api.check_model(model_id)
        return card()

    @app.get("/version")
    async def version():
        return {"version": _version()}

    @app.get("/health")
    async def health():
        if not aengine.running:
            return JSONResponse(error_body("the engine loop is not running", "server_error"), status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        from prometheus_client import CONTENT_TYPE_LATEST
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


def _error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def refuse(status: int, body: dict, label: str | None = None) -> JSONResponse:
        if status in (400, 413):  # what the client sent: counted by the field it names (a bounded set)
            label = label or body["error"]["param"] or "none"
            metrics.request_validation_failures.labels(str(status), label).inc()
        return JSONResponse(body, status_code=status)

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return refuse(exc.status, exc.body())

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        if first.get("type") == "json_invalid":  # loc holds a character offset, not a field
            at = f" at character {loc[0]}" if loc else ""
            detail = (first.get("ctx") or {}).get("error", "JSON decode error")
            return refuse(400, error_body(f"the request body is not valid JSON: {detail}{at}", "invalid_request_error"))
        msg = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid request')}"
        # param: the top-level field (the rest of the path, union members included, is in the message)
        return refuse(400, error_body(msg, "invalid_request_error", loc[0] if loc else None))

    @app.exception_handler(BodyTooLarge)
    async def body_too_large(request, exc: BodyTooLarge):
        return refuse(413, too_large_body(exc.limit), label="body")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        body = error_body(str(exc.detail), kind)
        if _client_left(exc):  # the body never fully arrived (read timeout, disconnect): nobody reads this
            return JSONResponse(body, status_code=exc.status_code)
        return refuse(exc.status_code, body)

    @app.exception_handler(Exception)
    async def server_error(request, exc: Exception):  # a bug: still an OpenAI-shaped body
        log.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("inference-course")
    except PackageNotFoundError:
        return "unknown"


def _client_left(exc: BaseException) -> bool:
    from starlette.requests import ClientDisconnect
    return isinstance(exc.__cause__, ClientDisconnect)


def _failure(err) -> str:
    """What a client is told about a request the engine failed."""
    what = f"{type(err).__name__}: {str(err)[:300]}" if err is not None else "unknown error"
    return f"the engine failed while generating this answer and ended it ({what})"


def _scoped_key(key: str, authorization: str | None) -> str:
    """The cache key of an Idempotency-Key: prefixed by a hash of the Authorization header when there is one,
    so that two API keys never see each other's answers. Without the header the key is used as sent; a
    client cannot reach a scoped entry that way without knowing the other client's Authorization value."""
    if not authorization:
        return key
    return hashlib.sha256(authorization.encode("latin-1")).hexdigest()[:32] + "/" + key


@dataclass
class _Options:
    """How one response presents its answers (what is not in SamplingParams)."""
    echo: str | None = None  # completions' echo: the prompt text put before each choice's text
    logprobs: int | None = None  # alternatives shown per token (None: no logprobs)
    include_usage: bool = False  # stream_options: a last chunk with the usage
    continuous_usage: bool = False  # stream_options (vLLM): every chunk with the usage so far
    request_id: str | None = None  # vLLM's request_id: the response id's suffix


class _Handlers:
    def __init__(self, engine, aengine: AsyncEngine, service: GenerationService, components: StreamComponents,
                 name: str):
        self.engine, self.aengine, self.service, self.c, self.name = engine, aengine, service, components, name
        self.created = int(time.time())

    # ---- endpoints ---------------------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, request: Request):
        self.check_model(body.model)
        refuse_unsupported(body, UNSUPPORTED_COMPLETION)
        key, received = self._resume_headers(request)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "batched prompts are not supported: send one request per prompt", param="prompt")
            prompt = prompt[0]
        if prompt is None or prompt == "" or prompt == []:
            raise APIError(400, "prompt is empty: give a string or at least one token id", param="prompt")
        _check_range(body.logprobs, 0, MAX_LOGPROBS, "logprobs")
        max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        params = self._params(body, max_tokens, "max_tokens", body.logprobs,
                              body.logprobs if body.echo and body.logprobs is not None else None)
        ids = await self._tokenize(prompt, "prompt")
        params = self._fit(params, ids, False, "max_tokens")
        echo = None
        if body.echo:
            echo = prompt if isinstance(prompt, str) else self._tokenizer().decode(ids)
        return await self._serve("completion", ids, params, body, request, key, received,
                                 self._options(body, echo, body.logprobs))

    async def chat(self, body: ChatCompletionRequest, request: Request):
        self.check_model(body.model)
        refuse_unsupported(body, UNSUPPORTED_CHAT)
        key, received = self._resume_headers(request)
        if not body.messages:
            raise APIError(400, "messages is empty: give at least one message", param="messages")
        _check_range(body.top_logprobs, 0, MAX_LOGPROBS, "top_logprobs")
        if body.top_logprobs and not body.logprobs:  # OpenAI's and vLLM's rule
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        shown = (body.top_logprobs or 0) if body.logprobs else None
        field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params = self._params(body, max_tokens, field, shown, None)
        prompt = apply_chat_template([m.model_dump() for m in body.messages])
        ids = await self._tokenize(prompt, "messages")
        params = self._fit(params, ids, max_tokens is None, field)
        return await self._serve("chat", ids, params, body, request, key, received, self._options(body, None, shown))

    async def tokenize(self, body: TokenizeRequest):
        """vLLM's /tokenize: {"prompt"} or {"messages"} -> {"count", "max_model_len", "tokens", "token_strs"}."""
        if body.model is not None:
            self.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give either prompt or messages", param="prompt")
        if body.messages is not None:
            if not body.messages:
                raise APIError(400, "messages is empty: give at least one message", param="messages")
            text = apply_chat_template([m.model_dump() for m in body.messages], body.add_generation_prompt)
        else:
            text = body.prompt
        tok = self._tokenizer()
        ids = await asyncio.to_thread(tok.encode, text)
        strs = [tok.decode([t]) for t in ids] if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": self.engine.max_seq_len, "tokens": ids, "token_strs": strs}

    async def detokenize(self, body: DetokenizeRequest):
        """vLLM's /detokenize: {"tokens"} -> {"prompt"}."""
        if body.model is not None:
            self.check_model(body.model)
        vocab = self.engine.config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token ids outside the vocabulary [0, {vocab}): {bad[:5]}", param="tokens")
        return {"prompt": await asyncio.to_thread(self._tokenizer().decode, body.tokens)}

    # ---- validation --------------------------------------------------------------------------------------
    def check_model(self, model: str) -> None:
        if model != self.name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {self.name!r}",
                           type="not_found_error", param="model", code="model_not_found")

    def _tokenizer(self):
        if self.engine.tokenizer is None:
            raise APIError(400, "this model directory has no tokenizer.json", param="prompt")
        return self.engine.tokenizer

    def _params(self, body, max_tokens: int | None, max_tokens_field: str, logprobs: int | None,
                prompt_logprobs: int | None) -> SamplingParams:
        """SamplingParams from the body's fields (max_tokens None: a placeholder _fit replaces). A 400 naming
        the field for anything out of range."""
        _check_range(body.n, 1, min(MAX_N, self.engine.max_num_seqs), "n")
        if body.best_of is not None and body.best_of != body.n:
            raise APIError(400, f"best_of={body.best_of} with n={body.n}: only best_of == n is supported (every "
                                "sample generated is returned; none is ranked and dropped)", param="best_of")
        if body.stream_options is not None and not body.stream:  # vLLM's rule
            raise APIError(400, "stream_options needs stream: true", param="stream_options")
        if body.stop:
            self._tokenizer()  # stop strings are matched on text
        kw = dict(max_tokens=MAX_TOKENS_LIMIT if max_tokens is None else max_tokens, seed=body.seed, n=body.n,
                  stop_token_ids=body.stop_token_ids or [], ignore_eos=body.ignore_eos, stop=_stop_strings(body.stop),
                  include_stop_str_in_output=body.include_stop_str_in_output, min_tokens=body.min_tokens,
                  logit_bias=self._logit_bias(body.logit_bias), logprobs=logprobs, prompt_logprobs=prompt_logprobs)
        for k in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                  "repetition_penalty"):
            if getattr(body, k) is not None:
                kw[k] = getattr(body, k)
        return _sampling_params(kw, max_tokens_field)

    def _logit_bias(self, bias: dict[str, float] | None) -> dict[int, float] | None:
        """OpenAI's {"token id": bias}: ids in the vocabulary, biases clamped to [-100, 100] as vLLM clamps them."""
        if not bias:
            return None
        out, vocab = {}, self.engine.config.vocab_size
        for k, v in bias.items():
            if not _TOKEN_ID.fullmatch(k) or int(k) >= vocab:
                raise APIError(400, f"logit_bias: {k[:40]!r} is not a token id in [0, {vocab})", param="logit_bias")
            if not math.isfinite(v):
                raise APIError(400, f"logit_bias[{k}] = {v}: a bias must be a finite number", param="logit_bias")
            out[int(k)] = min(100.0, max(-100.0, float(v)))
        return out

    def _fit(self, params: SamplingParams, ids: list[int], to_context: bool, field: str) -> SamplingParams:
        """The params for this prompt: max_tokens the rest of the context when to_context (chat without a
        max_tokens), else checked against it."""
        limit = self.engine.max_seq_len
        if to_context:
            return _sampling_params(dict(vars(params), max_tokens=limit - len(ids)), field)
        if len(ids) + params.max_tokens > limit:
            raise APIError(400, f"this model's context holds {limit} tokens; the request needs {len(ids)} (prompt) + "
                                f"{params.max_tokens} ({field}) = {len(ids) + params.max_tokens}: shorten the "
                                f"prompt or lower {field}", param=field, code="context_length_exceeded")
        return params

    def _options(self, body, echo: str | None, logprobs: int | None) -> _Options:
        so = body.stream_options
        return _Options(echo, logprobs, bool(so and so.include_usage), bool(so and so.include_usage and
                                                                           so.continuous_usage_stats), body.request_id)

    def _resume_headers(self, request: Request) -> tuple[str | None, int]:
        """(the scoped Idempotency-Key or None, the X-Resume-From count), both checked."""
        key, raw = request.headers.get("idempotency-key"), request.headers.get("x-resume-from")
        if key is not None:
            if not key.strip():
                raise APIError(400, "Idempotency-Key is empty: send a unique key per request (a UUID), or no header",
                               param="Idempotency-Key", code="invalid_idempotency_key")
            if len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
                raise APIError(400, f"Idempotency-Key has {len(key)} characters; at most {MAX_IDEMPOTENCY_KEY_CHARS} "
                                    "are accepted (a UUID has 36)", param="Idempotency-Key",
                               code="invalid_idempotency_key")
            key = _scoped_key(key, request.headers.get("authorization"))
        if raw is None:
            return key, 0
        if not _RESUME_COUNT.fullmatch(raw):
            raise APIError(400, f"X-Resume-From must be a count of tokens in decimal digits (0-9 only), got {raw[:40]!r}",
                           param="X-Resume-From")
        return key, int(raw)

    async def _tokenize(self, prompt, param: str) -> list[int]:
        """Token ids of the prompt, tokenized in a worker thread (a long prompt takes milliseconds to seconds
        of CPU the event loop must not spend). A string that cannot fit whatever its tokens is refused first."""
        limit = self.engine.max_seq_len
        if isinstance(prompt, str) and len(prompt) > limit * MAX_CHARS_PER_TOKEN:
            raise APIError(400, f"the prompt has {len(prompt)} characters: more than this model's context of {limit} "
                                f"tokens can hold at {MAX_CHARS_PER_TOKEN} characters per token: shorten the prompt",
                           param=param, code="context_length_exceeded")
        try:
            return await asyncio.to_thread(self.engine.tokenize, prompt)
        except (ValueError, TypeError) as e:
            code = "context_length_exceeded" if "fit" in str(e) else None
            raise APIError(400, str(e), param=param, code=code) from None

    # ---- responses -----------------------------------------------------------------------------------------
    async def _serve(self, kind: str, ids: list[int], params: SamplingParams, body, request: Request,
                     key: str | None, received: int, opts: _Options):
        fp = fingerprint(kind, ids, params)
        if params.n > 1:
            if key is not None or received:
                raise APIError(400, "n > 1 cannot be combined with an Idempotency-Key or X-Resume-From (a key names "
                                    "one answer): send n requests with a key each", param="n")
            subs = self.service.open_group(ids, params, fp)
        else:
            subs = [self.service.open(ids, params, fp, key, received)]
        resp = _Response(kind, self.name, ids, self.engine.tokenizer, subs, params, opts, self.c)
        if body.stream:
            return EventStreamResponse(self._events(subs, resp), subs, self.service, self.c)

        def drop_all():
            for sub in subs:
                self.service.drop(sub, "client_disconnect")
        watch = asyncio.ensure_future(self.c.disconnect.watch(request.receive, drop_all))
        try:
            async for item in self.service.iterate_group(subs, 3600.0):
                if item is not None:
                    resp.add(*item)
        finally:
            watch.cancel()
        reasons = [sub.finish_reason for sub in subs]
        if "abort" in reasons:
            raise APIError(503, "the request was aborted before it finished (server shutting down?)",
                           type="server_error", code="aborted")
        if "error" in reasons:
            raise APIError(500, _failure(subs[reasons.index("error")].gen.error), type="server_error",
                           code="engine_error")
        return resp.full()

    async def _events(self, subs: list[Subscriber], resp: "_Response"):
        framer = self.c.framer
        if resp.kind == "chat":
            for i in range(len(subs)):
                yield framer.event(json.dumps(resp.role_chunk(i)))
        async for item in self.service.iterate_group(subs, framer.keep_alive_interval):
            if item is None:
                yield framer.keep_alive()
                continue
            yield framer.event(json.dumps(resp.delta_chunk(*item)))
            for chunk in resp.finish_chunks(only_complete=True):
                yield framer.event(json.dumps(chunk))
        dropped = next((sub.dropped for sub in subs if sub.dropped), None)
        if dropped == "client_disconnect":
            return
        if dropped:  # best effort: a slow reader may never read it
            yield framer.event(json.dumps(error_body(f"stream aborted by the server: {dropped}", "server_error",
                                                     code=dropped)))
            return
        failed = next((sub for sub in subs if sub.finish_reason == "error"), None)
        if failed is not None:  # as vLLM ends a stream that failed: an error event, then [DONE]
            yield framer.event(json.dumps(error_body(_failure(failed.gen.error), "server_error", code="engine_error")))
            yield framer.done()
            return
        for chunk in resp.finish_chunks(only_complete=False):
            yield framer.event(json.dumps(chunk))
        if resp.opts.include_usage:
            yield framer.event(json.dumps(resp.usage_chunk()))
        yield framer.done()


_TOKEN_ID = re.compile(r"[0-9]{1,18}")


def _check_range(value: int | None, lo: int, hi: int, param: str) -> None:
    if value is not None and not lo <= value <= hi:
        raise APIError(400, f"{param}={value}: must be an integer in [{lo}, {hi}]", param=param)


def _stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise APIError(400, f"stop has {len(stops)} strings; at most {MAX_STOP_STRINGS} are accepted", param="stop")
    for x in stops:
        if not x or len(x) > MAX_STOP_CHARS:
            raise APIError(400, f"stop strings must have 1 to {MAX_STOP_CHARS} characters, got {len(x)}", param="stop")
    return stops


def _sampling_params(kw: dict, max_tokens_field: str) -> SamplingParams:
    try:
        return SamplingParams(**kw)
    except ValueError as e:  # "SamplingParams.<field>=<value>: <rule>"
        param = str(e).split("=", 1)[0].removeprefix("SamplingParams.")
        raise APIError(400, str(e), param=max_tokens_field if param == "max_tokens" else param) from None


class EventStreamResponse(Response):
    """text/event-stream with a disconnect watcher beside the writer, and a write timeout.

    Starlette's StreamingResponse (1.10.0, starlette/responses.py) listens for http.disconnect beside the
    writer and cancels the stream when the server reports an ASGI spec version below 2.4 (uvicorn 0.55.0's
    HTTP protocols report "2.3"); with a 2.4 server it notices only a failed write, which may be never while
    kernel buffers absorb the writes. Either way it only stops the generator: nothing aborts the engine
    request. Here the watcher task reads the receive channel for http.disconnect and drops the stream (and
    queues the abort) at once. A write that takes longer than
    components.write_timeout_s means the reader has stopped reading: the stream is dropped as a slow reader.
    subs: the response's subscribers (one per choice), dropped and released together.
    """
    media_type = "text/event-stream"

    def __init__(self, events, subs: list[Subscriber], service: GenerationService, components: StreamComponents):
        super().__init__(status_code=200, media_type=self.media_type)
        self.events, self.subs, self.service, self.c = events, subs, service, components

    def _drop(self, cause: str) -> None:
        for sub in self.subs:
            self.service.drop(sub, cause)

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                                (b"x-accel-buffering", b"no")]})
        watch = asyncio.ensure_future(self.c.disconnect.watch(receive, lambda: self._drop("client_disconnect")))
        try:
            async for chunk in self.events:
                try:
                    await asyncio.wait_for(send({"type": "http.response.body", "body": chunk, "more_body": True}),
                                           self.c.write_timeout_s)
                except asyncio.TimeoutError:
                    self._drop("slow_reader")
                    return  # the response stays incomplete; the server closes the connection
                except OSError:
                    self._drop("client_disconnect")
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            self._drop("client_disconnect")
        finally:
            watch.cancel()
            await self.events.aclose()
            for sub in self.subs:
                self.service.release(sub)


LOGPROB_FLOOR = -9999.0  # what vLLM reports for a logprob of -inf (JSON has no infinity)


class _Choice:
    """One choice of a response: its tokens so far, and the text its detokenizer released for them.

    Every token the choice reads goes through its TextStreamer (components.make_detokenizer), which shows text
    once no stop string can claim it and no character is half there; once the answer is complete (finished "stop"
    or "length", every token read) finish() releases what it still held back. What it returns only appends, so
    the deltas a stream sends add up to the whole answer's text. A resumed stream feeds it the tokens the client
    already has first, and drops that text: the client holds it.
    """

    def __init__(self, index: int, sub: Subscriber, streamer):
        self.index, self.sub, self.gen, self.streamer = index, sub, sub.gen, streamer
        self.ids = list(sub.gen.token_ids[:sub.start])  # what the client already has (a resumed stream)
        if self.ids:
            streamer.add(list(self.ids))
        self.text = ""  # the text this response released
        self.new_ids: list[int] = []
        self.finished_sent = False
        self.ended = False  # finish() called
        self.offset = 0  # completions' text_offset of the next token

    @property
    def complete(self) -> bool:
        g = self.gen
        return not g.in_flight and g.finish_reason in ("stop", "length") and len(self.ids) == len(g.token_ids)

    @property
    def stop_reason(self):
        """The stop string the detokenizer found, else the engine's (a stop token id, or None)."""
        found = self.streamer.stop_reason
        return found if found is not None else self.gen.stop_reason

    def add(self, tokens: list[int]) -> str:
        """Append tokens; return the text they release (maybe "")."""
        self.ids += tokens
        self.new_ids += tokens
        return self._shown(self.streamer.add(list(tokens)))

    def release(self) -> str:
        """Once the answer is complete: the text the detokenizer still held back (else "")."""
        if self.ended or not self.complete:
            return ""
        self.ended = True
        return self._shown(self.streamer.finish())

    def _shown(self, delta: str) -> str:
        self.text += delta
        return delta


class _NoText:
    """The TextStreamer of a model without a tokenizer: token ids only."""
    stop_reason = None

    def add(self, token_ids: list[int]) -> str:
        return ""

    def finish(self) -> str:
        return ""


class _Response:
    """OpenAI response bodies (whole, or chunks) for the choices of one request."""

    def __init__(self, kind: str, model: str, prompt_ids: list[int], tokenizer, subs: list[Subscriber],
                 params: SamplingParams, opts: _Options, components: StreamComponents | None = None):
        self.kind, self.model, self.prompt_ids, self.opts = kind, model, prompt_ids, opts
        self.decode = tokenizer.decode if tokenizer is not None else (lambda ids: "")
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        self.id = prefix + (opts.request_id or uuid.uuid4().hex[:24])
        self.created = int(time.time())
        comps = components or StreamComponents()

        def streamer():
            if tokenizer is None:
                return _NoText()
            return comps.new_detokenizer(self.decode, params.stop, params.include_stop_str_in_output,
                                         params.min_tokens)
        self.choices = [_Choice(i, sub, streamer()) for i, sub in enumerate(subs)]
        self._strs: dict[int, str] = {}
        # echo: each choice's text starts with the prompt's (not again for a resumed stream: the client has it)
        self.echo = opts.echo if opts.echo is not None and not any(sub.start for sub in subs) else None

    # ---- streamed -------------------------------------------------------------------------------------------
    def role_chunk(self, i: int) -> dict:
        return self._chunk({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None, "stop_reason": None, "token_ids": []})

    def delta_chunk(self, i: int, tokens: list[int]) -> dict:
        c = self.choices[i]
        echo, start = self.echo is not None and not c.new_ids, len(c.ids)
        text = c.add(tokens)
        lps = self._logprobs(c, start, len(c.ids), echo)
        if self.kind == "chat":
            delta = {"content": text} if text or tokens else {}
            return self._chunk({"index": i, "delta": delta, "logprobs": lps, "finish_reason": None,
                                "stop_reason": None, "token_ids": tokens})
        return self._chunk({"index": i, "text": self.echo + text if echo else text, "logprobs": lps,
                            "finish_reason": None, "stop_reason": None, "token_ids": tokens})

    def finish_chunks(self, only_complete: bool) -> list[dict]:
        """The last chunk of each choice not yet finished (only_complete: of those complete now): the text
        still held back, if any, and the finish and stop reasons."""
        out = []
        for c in self.choices:
            if c.finished_sent or (only_complete and not c.complete):
                continue
            c.finished_sent = True
            text = c.release()
            body = {"delta": {"content": text} if text else {}} if self.kind == "chat" else {"text": text}
            out.append(self._chunk({"index": c.index, **body, "logprobs": None, "finish_reason": c.sub.finish_reason,
                                    "stop_reason": c.stop_reason, "token_ids": []}))
        return out

    def usage_chunk(self) -> dict:
        return {"id": self.id, "object": self._object(True), "created": self.created, "model": self.model,
                "choices": [], "usage": self.usage()}

    def _chunk(self, choice: dict) -> dict:
        out = {"id": self.id, "object": self._object(True), "created": self.created, "model": self.model,
               "choices": [choice]}
        if self.opts.include_usage:  # OpenAI: null on every chunk but the last; vLLM's continuous stats: so far
            out["usage"] = self.usage() if self.opts.continuous_usage else None
        return out

    def _object(self, chunk: bool) -> str:
        if self.kind == "chat":
            return "chat.completion.chunk" if chunk else "chat.completion"
        return "text_completion"

    # ---- whole ------------------------------------------------------------------------------------------------
    def add(self, i: int, tokens: list[int]) -> None:
        self.choices[i].add(tokens)

    def full(self) -> dict:
        choices = []
        for c in self.choices:
            c.release()
            text = c.text
            lps = self._logprobs(c, len(c.ids) - len(c.new_ids), len(c.ids), self.echo is not None)
            base = {"index": c.index, "logprobs": lps, "finish_reason": c.sub.finish_reason,
                    "stop_reason": c.stop_reason, "token_ids": c.new_ids}
            if self.kind == "chat":
                choices.append({**base, "message": {"role": "assistant", "content": text}})
            else:
                choices.append({**base, "text": self.echo + text if self.echo is not None else text})
        return {"id": self.id, "object": self._object(False), "created": self.created, "model": self.model,
                "choices": choices, "usage": self.usage()}

    def usage(self) -> dict:
        done = sum(len(c.new_ids) for c in self.choices)
        return {"prompt_tokens": len(self.prompt_ids), "completion_tokens": done,
                "total_tokens": len(self.prompt_ids) + done}

    # ---- logprobs ---------------------------------------------------------------------------------------------
    def _token_str(self, token: int) -> str:
        s = self._strs.get(token)
        if s is None:
            s = self._strs[token] = self.decode([token])
        return s

    def _logprobs(self, c: _Choice, start: int, end: int, echo: bool = False) -> dict | None:
        """Logprobs of the choice's tokens start..end-1 (positions in its answer), in the endpoint's shape;
        echo: the prompt tokens' first (completions), the first one's null."""
        if self.opts.logprobs is None:
            return None
        entries = list(zip(c.gen.token_ids[start:end], (c.gen.logprobs + [None] * end)[start:end]))
        if echo:
            entries = list(zip(self.prompt_ids, c.gen.prompt_logprobs or [None] * len(self.prompt_ids))) + entries
        return self._shape(c, entries) if entries else None

    def _shape(self, c: _Choice, entries: list) -> dict:
        k = self.opts.logprobs
        if self.kind == "chat":  # OpenAI's: the token, its logprob and bytes, and the top k in rank order
            return {"content": [self._chat_entry(t, d, k) for t, d in entries]}
        # completions' legacy shape: the top k and the sampled token per position, text_offset as vLLM counts it
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, d in entries:
            s = self._token_str(t)
            out["tokens"].append(s)
            out["token_logprobs"].append(None if d is None else max(d[t], LOGPROB_FLOOR))
            out["top_logprobs"].append(None if d is None else {self._token_str(x): max(v, LOGPROB_FLOOR)
                                                               for x, v in d.items()})
            out["text_offset"].append(c.offset)
            c.offset += len(s)
        return out

    def _chat_entry(self, token: int, d: dict | None, k: int) -> dict:
        def one(t, v):
            s = self._token_str(t)
            return {"token": s, "logprob": max(v, LOGPROB_FLOOR), "bytes": list(s.encode("utf-8"))}
        entry = one(token, d[token] if d else LOGPROB_FLOOR)
        entry["top_logprobs"] = [one(t, v) for t, v in list((d or {}).items())[:k]]
        return entry


def model_name_for(path) -> str:
    """The id a model directory is served under: its folder name (the shipped target: "target")."""
    return Path(path).resolve().name
