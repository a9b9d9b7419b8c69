"""Bounds on what one client can make the server hold: the bytes of a request body, and the time it may
take to send a request.

    BodyLimit               ASGI middleware: a body over max_body_bytes gets a 413 (OpenAI's error shape).
                            A Content-Length over the limit is refused before a byte of the body is read; a
                            body without one (chunked) is counted as it streams in and refused the moment it
                            passes the limit. The server never holds more than the limit plus one chunk.
    read_deadline_protocol  uvicorn's HTTP protocol with a deadline on receiving each request: a connection
                            that has not sent a whole request (headers and body) within read_timeout_s of
                            connecting, or of the first byte of a later request on it, is closed.

uvicorn bounds the idle time between two requests (timeout_keep_alive) and the size of a header block
(h11_max_incomplete_event_size, 16 KiB), but not the time a request may take to arrive: a client that sends a
header line a minute (slowloris), or headers and half a body, would hold its connection, its buffers and its
request task for good, and a graceful shutdown would wait for it. After a 413 uvicorn reads and discards the
rest of the body so that the client can read the answer; the read deadline bounds that too.
"""
from __future__ import annotations

import json

from starlette.exceptions import HTTPException as StarletteHTTPException


class BodyTooLarge(StarletteHTTPException):
    """Raised by BodyLimit's receive when a streamed body passes the limit. An HTTPException, because FastAPI
    turns any other exception raised while it reads the body into "400: There was an error parsing the
    body"; the app's handler for this class answers 413 (BodyLimit does if the exception reaches it)."""

    def __init__(self, limit: int):
        super().__init__(413, f"the request body exceeds this server's limit of {limit} bytes")
        self.limit = limit


def too_large_body(limit: int) -> dict:
    return {"error": {"message": f"the request body exceeds this server's limit of {limit} bytes (--max-request-"
                                 "bytes): send a shorter prompt", "type": "invalid_request_error", "param": None,
                      "code": "request_too_large"}}


class BodyLimit:
    """ASGI middleware: refuse request bodies over max_body_bytes with a 413. on_refused() is called once per
    refusal (the server counts them)."""

    def __init__(self, app, max_body_bytes: int, on_refused=None):
        if not isinstance(max_body_bytes, int) or isinstance(max_body_bytes, bool) or max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be a positive integer, got {max_body_bytes!r}")
        self.app, self.max_body_bytes, self.on_refused = app, max_body_bytes, on_refused

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            return await self._refuse(send)  # before the body: the app never runs
        received, started = 0, False

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        async def watched_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge:
            if started:  # the app answered already; nothing more can be said on this response
                raise
            await self._refuse(send)

    async def _refuse(self, send) -> None:
        if self.on_refused is not None:
            self.on_refused()
        body = json.dumps(too_large_body(self.max_body_bytes)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:  # h11 refuses a malformed one before the app runs; be safe anyway
                return None
    return None


def read_deadline_protocol(base, read_timeout_s: float):
    """A subclass of uvicorn's h11 protocol class `base` (uvicorn.protocols.http.h11_impl.H11Protocol or a
    subclass of it) that closes a connection whose request has not fully arrived within read_timeout_s.

    The deadline runs from the connection's start, and on a kept-alive connection from the first byte of each
    later request (between requests uvicorn's timeout_keep_alive applies); it stops once the request's last
    byte is in. On expiry the connection is closed: a request the app was reading sees a disconnect."""
    import h11

    if not read_timeout_s > 0:
        raise ValueError(f"read_timeout_s must be > 0, got {read_timeout_s!r}")

    class ReadDeadlineProtocol(base):
        _read_deadline = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:  # runs on every data_received, and for pipelined requests
            super().handle_events()
            state = self.conn.their_state
            if state is h11.SEND_BODY or (state is h11.IDLE and self.conn.trailing_data[0]):
                self._arm()  # a request is partly here
            elif state is not h11.IDLE:  # DONE, MUST_CLOSE, CLOSED, ERROR: no request is being received
                self._disarm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._read_deadline is None:
                self._read_deadline = self.loop.call_later(read_timeout_s, self._read_timed_out)

        def _disarm(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
                self._read_deadline = None

        def _read_timed_out(self) -> None:
            self._read_deadline = None
            if not self.transport.is_closing():
                self.logger.info("closing a connection that did not send its request within %.0f s", read_timeout_s)
                self.transport.close()

    return ReadDeadlineProtocol
