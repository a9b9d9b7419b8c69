"""The OpenAI-compatible HTTP API: create_app(engine) -> a FastAPI app.

    POST /v1/completions        {"model", "prompt", "max_tokens", "temperature", ..., "stream"}
    POST /v1/chat/completions   {"model", "messages", ...}   (chat.py's template)
    GET  /v1/models, /health, /metrics (Prometheus text)

Beyond OpenAI: each choice carries "token_ids" (vLLM's return_token_ids), and two request headers:
Idempotency-Key (a retry with the same key gets the same answer, generated once) and X-Resume-From
(with the key: the number of tokens the client already received; the stream continues after them).
Keys are scoped by the Authorization header (two API keys never share an answer), at most 256 characters
and never empty.

Errors are {"error": {"message", "type", "param", "code"}}: a 400 naming the field for anything the client
sent wrong, 413 for a body over max_body_bytes (limits.py), 500 (or, mid-stream, an error event and
[DONE]) for a request the engine failed; that failure ends only that request.

Nothing slow runs on the event loop: prompts are tokenized in a worker thread, after a bound on their
length in characters that refuses what cannot fit without tokenizing it.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..sampling import SamplingParams
from .async_engine import AsyncEngine
from .chat import apply_chat_template
from .limits import BodyLimit, BodyTooLarge, too_large_body
from .metrics import ServerMetrics
from .options import DEFAULT_MAX_BODY_BYTES
from .protocol import APIError, ChatCompletionRequest, CompletionRequest, error_body
from .serving import GenerationService, Subscriber, fingerprint
from .streaming import StreamComponents

log = logging.getLogger(__name__)
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_IDEMPOTENCY_KEY_CHARS = 256
# No token of a tokenizer in use spans more characters than this (the shipped one's longest is 41: a newline
# and 40 spaces), so a prompt longer than max_seq_len * this many characters cannot fit, tokenized or not.
MAX_CHARS_PER_TOKEN = 64
_RESUME_COUNT = re.compile(r"[0-9]{1,18}")  # digits only: int() would also read "1_0", " 10", "+10" and "١٠"


def create_app(engine, model_name: str | None = None, components: StreamComponents | None = None,
               metrics: ServerMetrics | None = None, startup_report=None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """A FastAPI app serving `engine` (an LLMEngine the app now owns: its background loop starts with the
    app and stops with it). model_name: the id clients must send (default: the model directory's name).
    max_body_bytes: larger request bodies get a 413 before they are read (limits.BodyLimit)."""
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
    api = _Handlers(engine, aengine, service, components, name)

    app.post("/v1/completions")(api.completions)
    app.post("/v1/chat/completions")(api.chat)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": api.created,
                                            "owned_by": "course", "max_model_len": engine.max_seq_len}]}

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


class _Handlers:
    def __init__(self, engine, aengine: AsyncEngine, service: GenerationService, components: StreamComponents,
                 name: str):
        self.engine, self.aengine, self.service, self.c, self.name = engine, aengine, service, components, name
        self.created = int(time.time())

    # ---- endpoints ---------------------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, request: Request):
        self._check_model(body.model)
        key, received = self._resume_headers(request)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "batched prompts are not supported: send one request per prompt", param="prompt")
            prompt = prompt[0]
        if prompt is None or prompt == "" or prompt == []:
            raise APIError(400, "prompt is empty: give a string or at least one token id", param="prompt")
        params = self._params(body, body.max_tokens, "max_tokens")
        ids = await self._tokenize(prompt, params, "prompt")
        return await self._serve("completion", ids, params, body.stream, request, key, received)

    async def chat(self, body: ChatCompletionRequest, request: Request):
        self._check_model(body.model)
        key, received = self._resume_headers(request)
        if not body.messages:
            raise APIError(400, "messages is empty: give at least one message", param="messages")
        prompt = apply_chat_template([m.model_dump() for m in body.messages])
        if body.max_completion_tokens is not None:
            params = self._params(body, body.max_completion_tokens, "max_completion_tokens")
        else:
            params = self._params(body, body.max_tokens, "max_tokens")
        ids = await self._tokenize(prompt, params, "messages")
        return await self._serve("chat", ids, params, body.stream, request, key, received)

    # ---- validation --------------------------------------------------------------------------------------
    def _check_model(self, model: str) -> None:
        if model != self.name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {self.name!r}",
                           type="not_found_error", param="model", code="model_not_found")

    def _params(self, body, max_tokens: int | None, max_tokens_field: str) -> SamplingParams:
        if body.n != 1:
            raise APIError(400, "only n=1 is supported: send n requests", param="n")
        if body.stop:
            raise APIError(400, "stop strings are not supported; use stop_token_ids", param="stop")
        if body.logprobs:
            raise APIError(400, "logprobs are not supported by this server", param="logprobs")
        kw = dict(max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens, seed=body.seed,
                  stop_token_ids=body.stop_token_ids or [], ignore_eos=body.ignore_eos)
        for k in ("temperature", "top_p", "top_k", "min_p"):
            if getattr(body, k) is not None:
                kw[k] = getattr(body, k)
        try:
            return SamplingParams(**kw)
        except ValueError as e:  # "SamplingParams.<field>=<value>: <rule>"
            param = str(e).split("=", 1)[0].removeprefix("SamplingParams.")
            raise APIError(400, str(e), param=max_tokens_field if param == "max_tokens" else param) from None

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

    async def _tokenize(self, prompt, params: SamplingParams, param: str) -> list[int]:
        """Token ids of the prompt, tokenized in a worker thread (a long prompt takes milliseconds to seconds
        of CPU the event loop must not spend). A string that cannot fit whatever its tokens is refused first."""
        limit = self.engine.max_seq_len
        if isinstance(prompt, str) and len(prompt) > limit * MAX_CHARS_PER_TOKEN:
            raise APIError(400, f"the prompt has {len(prompt)} characters: more than this model's context of {limit} "
                                f"tokens can hold at {MAX_CHARS_PER_TOKEN} characters per token: shorten the prompt",
                           param=param, code="context_length_exceeded")
        try:
            ids = await asyncio.to_thread(self.engine.tokenize, prompt)
        except (ValueError, TypeError) as e:
            code = "context_length_exceeded" if "fit" in str(e) else None
            raise APIError(400, str(e), param=param, code=code) from None
        if len(ids) + params.max_tokens > limit:
            raise APIError(400, f"this model's context holds {limit} tokens; the request needs {len(ids)} (prompt) + "
                                f"{params.max_tokens} (max_tokens) = {len(ids) + params.max_tokens}: shorten the "
                                "prompt or lower max_tokens", param="max_tokens", code="context_length_exceeded")
        return ids

    # ---- responses -----------------------------------------------------------------------------------------
    async def _serve(self, kind: str, ids: list[int], params: SamplingParams, stream: bool, request: Request,
                     key: str | None, received: int):
        sub = self.service.open(ids, params, fingerprint(kind, ids, params), key, received)
        fmt = _Formatter(kind, self.name, len(ids), self.engine.tokenizer, sub)
        if stream:
            return EventStreamResponse(self._events(sub, fmt), sub, self.service, self.c)
        watch = asyncio.ensure_future(self.c.disconnect.watch(request.receive,
                                                              lambda: self.service.drop(sub, "client_disconnect")))
        try:
            async for tokens in self.service.iterate(sub, 3600.0):
                if tokens:
                    fmt.add(tokens)
        finally:
            watch.cancel()
        if sub.finish_reason == "abort":
            raise APIError(503, "the request was aborted before it finished (server shutting down?)",
                           type="server_error", code="aborted")
        if sub.finish_reason == "error":
            raise APIError(500, _failure(sub.gen.error), type="server_error", code="engine_error")
        return fmt.full()

    async def _events(self, sub: Subscriber, fmt: "_Formatter"):
        framer = self.c.framer
        if fmt.kind == "chat":
            yield framer.event(json.dumps(fmt.chunk([], "", None, role=True)))
        async for tokens in self.service.iterate(sub, framer.keep_alive_interval):
            if tokens is None:
                yield framer.keep_alive()
                continue
            yield framer.event(json.dumps(fmt.chunk(tokens, fmt.add(tokens), None)))
        if sub.dropped == "client_disconnect":
            return
        if sub.dropped:  # best effort: a slow reader may never read it
            yield framer.event(json.dumps(error_body(f"stream aborted by the server: {sub.dropped}", "server_error",
                                                     code=sub.dropped)))
            return
        if sub.finish_reason == "error":  # as vLLM ends a stream that failed: an error event, then [DONE]
            yield framer.event(json.dumps(error_body(_failure(sub.gen.error), "server_error", code="engine_error")))
            yield framer.done()
            return
        yield framer.event(json.dumps(fmt.chunk([], "", sub.finish_reason)))
        yield framer.done()


class EventStreamResponse(Response):
    """text/event-stream with a disconnect watcher beside the writer, and a write timeout.

    Starlette's StreamingResponse notices a vanished client only when a write fails (with ASGI spec 2.4
    servers), which may be never while the kernel buffers absorb the writes; here the watcher task reads
    the receive channel for http.disconnect and drops the stream at once. A write that takes longer than
    components.write_timeout_s means the reader has stopped reading: the stream is dropped as a slow reader.
    """
    media_type = "text/event-stream"

    def __init__(self, events, sub: Subscriber, service: GenerationService, components: StreamComponents):
        super().__init__(status_code=200, media_type=self.media_type)
        self.events, self.sub, self.service, self.c = events, sub, service, components

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                                (b"x-accel-buffering", b"no")]})
        watch = asyncio.ensure_future(self.c.disconnect.watch(
            receive, lambda: self.service.drop(self.sub, "client_disconnect")))
        try:
            async for chunk in self.events:
                try:
                    await asyncio.wait_for(send({"type": "http.response.body", "body": chunk, "more_body": True}),
                                           self.c.write_timeout_s)
                except asyncio.TimeoutError:
                    self.service.drop(self.sub, "slow_reader")
                    return  # the response stays incomplete; the server closes the connection
                except OSError:
                    self.service.drop(self.sub, "client_disconnect")
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            self.service.drop(self.sub, "client_disconnect")
        finally:
            watch.cancel()
            await self.events.aclose()
            self.service.release(self.sub)


class _Formatter:
    """OpenAI response bodies for one answer; detokenizes incrementally (a token that ends inside a UTF-8
    character is held back until the character is complete)."""

    def __init__(self, kind: str, model: str, num_prompt_tokens: int, tokenizer, sub: Subscriber):
        self.kind, self.model, self.num_prompt = kind, model, num_prompt_tokens
        self.decode = tokenizer.decode if tokenizer is not None else (lambda ids: "")
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.sub = sub
        self.ids = list(sub.gen.token_ids[:sub.start])  # what the client already has (a resumed stream)
        self.text = self.decode(self.ids) if self.ids else ""
        self.new_ids: list[int] = []

    def add(self, tokens: list[int]) -> str:
        """Append tokens; return the text they complete (maybe "")."""
        self.ids += tokens
        self.new_ids += tokens
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        delta, self.text = text[len(self.text):], text
        return delta

    def chunk(self, tokens: list[int], text: str, finish_reason: str | None, role: bool = False) -> dict:
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text or tokens else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, "token_ids": tokens}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "token_ids": tokens}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}

    def full(self) -> dict:
        text = self.decode(self.ids)[len(self.decode(self.ids[:self.sub.start])) if self.sub.start else 0:]
        usage = {"prompt_tokens": self.num_prompt, "completion_tokens": len(self.new_ids),
                 "total_tokens": self.num_prompt + len(self.new_ids)}
        reason = self.sub.finish_reason
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason, "token_ids": self.new_ids}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "token_ids": self.new_ids}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice],
                "usage": usage}


def model_name_for(path) -> str:
    """The id a model directory is served under: its folder name (the shipped target: "target")."""
    return Path(path).resolve().name
