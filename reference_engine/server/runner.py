"""Run the app under uvicorn: serve() in the foreground (`course serve`, `python -m reference_engine.server`),
ServerThread in the background (tests, the load test).

Both bound what a connection may hold (limits.py: the request read deadline; uvicorn's keep-alive timeout
between requests) and stop with a deadline: on SIGTERM or SIGINT (should_exit) the server stops accepting,
closes idle connections, lets requests in progress finish for up to shutdown_timeout_s, then cancels what
is left, closes every connection and stops the engine. A second SIGTERM or SIGINT exits at once.
"""
from __future__ import annotations

import argparse
import logging
import socket
import threading
import time

from .limits import read_deadline_protocol
from .options import DEFAULT_KEEP_ALIVE_S, DEFAULT_MAX_BODY_BYTES, DEFAULT_READ_TIMEOUT_S, DEFAULT_SHUTDOWN_TIMEOUT_S

log = logging.getLogger(__name__)


def bind_socket(host: str = "127.0.0.1", port: int = 0, sndbuf: int | None = None) -> socket.socket:
    """A listening socket (port 0: any free port). sndbuf sets SO_SNDBUF, which Linux copies to every
    accepted connection: a small one makes a stalled reader push back on the server after a few KiB
    instead of after the kernel's default megabytes (tests of slow readers need that)."""
    # proto=IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it every response written in two pieces (head, then body) waits out the client's delayed ACK
    # (40 ms on Linux): /health took 44 ms.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sndbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class ServerThread:
    """uvicorn serving `app` on a background thread. Use as a context manager; base_url is set once up."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, sndbuf: int | None = None,
                 write_buffer_bytes: int | None = None, log_level: str = "warning", startup_timeout_s: float = 60.0,
                 shutdown_timeout_s: float = 2.0, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
                 keep_alive_s: float = DEFAULT_KEEP_ALIVE_S):
        """sndbuf / write_buffer_bytes (both None: the defaults, kernel-tuned socket buffers and asyncio's
        64 KiB): shrink the kernel's and asyncio's buffers per connection so that a stalled reader makes
        the server's writes wait after a few KiB, as it would after megabytes with real payloads.
        shutdown_timeout_s, read_timeout_s, keep_alive_s: see server_config()."""
        self.app, self.sock = app, bind_socket(host, port, sndbuf)
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}"
        config = server_config(app, log_level=log_level, shutdown_timeout_s=shutdown_timeout_s,
                               read_timeout_s=read_timeout_s, keep_alive_s=keep_alive_s,
                               write_buffer_bytes=write_buffer_bytes, access_log=False)
        self.server = _WakeableServer(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="uvicorn")
        self.startup_timeout_s = startup_timeout_s

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {self.startup_timeout_s:.0f} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.server.wake()
        self.thread.join(30)
        self.sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def server_config(app, log_level: str = "info", shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
                  read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
                  write_buffer_bytes: int | None = None, access_log: bool = True):
    """The uvicorn.Config both runners use. shutdown_timeout_s: how long a shutdown waits for requests in
    progress (uvicorn's timeout_graceful_shutdown); read_timeout_s: how long a client may take to send one
    request, headers and body (limits.read_deadline_protocol); keep_alive_s: how long an idle kept-alive
    connection stays open (uvicorn's timeout_keep_alive). The HTTP protocol is h11 (uvicorn's pure-Python
    one, which "auto" picks when httptools is not installed), with the read deadline added."""
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    if not shutdown_timeout_s >= 0:
        raise ValueError(f"shutdown_timeout_s must be >= 0, got {shutdown_timeout_s!r}")
    base = _small_write_buffer_protocol(write_buffer_bytes) if write_buffer_bytes else H11Protocol
    return uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout_s,
                          timeout_keep_alive=keep_alive_s, access_log=access_log,
                          http=read_deadline_protocol(base, read_timeout_s))


def _WakeableServer(config):
    """uvicorn.Server that stops at once when nothing is in flight: uvicorn looks at should_exit every 0.1 s
    and then gives open connections a fixed 0.1 s, and every test and check that starts a server would wait
    out both. With connections still open it drains them for up to timeout_graceful_shutdown and then
    closes them (shutdown()); a second SIGTERM or SIGINT ends the wait at once (uvicorn forces only on a
    second SIGINT)."""
    import asyncio

    import uvicorn

    class WakeableServer(uvicorn.Server):
        _loop = _woken = None

        async def main_loop(self) -> None:  # uvicorn's loop, with the 0.1 s sleep cut short by wake()
            self._loop, self._woken = asyncio.get_running_loop(), asyncio.Event()
            counter = 0
            should_exit = await self.on_tick(counter)
            while not should_exit:
                counter = (counter + 1) % 864000
                try:
                    await asyncio.wait_for(self._woken.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass
                should_exit = await self.on_tick(counter)

        async def shutdown(self, sockets=None) -> None:
            await _shutdown(self, sockets)

        async def _drained(self, timeout_s) -> bool:
            return await _drained(self, timeout_s)

        def handle_exit(self, sig, frame) -> None:
            if self.should_exit:  # the second signal: stop waiting for requests, skip the engine's shutdown
                self.force_exit = True
            super().handle_exit(sig, frame)

        def wake(self) -> None:
            """From any thread; before main_loop runs, should_exit is seen at its first tick."""
            if self._loop is not None:
                try:
                    self._loop.call_soon_threadsafe(self._woken.set)
                except RuntimeError:  # the loop has closed: the server is down already
                    pass

    return WakeableServer(config)


async def _shutdown(srv, sockets=None) -> None:
    """WakeableServer.shutdown (srv: the uvicorn.Server): uvicorn's shutdown, with its deadline ending in closed connections rather than cancelled tasks:
    stop accepting, close idle connections, wait up to timeout_graceful_shutdown for requests in
    progress, then close every connection still open (a request still arriving or a stream still
    being written sees a disconnect and ends as any abandoned one does: its engine request aborted),
    cancel what has not ended a second later, and stop the engine (the lifespan), unless forced."""
    for server in srv.servers:
        server.close()
    for sock in sockets or []:
        sock.close()
    state, timeout = srv.server_state, srv.config.timeout_graceful_shutdown
    for conn in list(state.connections):
        conn.shutdown()  # idle (or half-sent headers): closed now; answering: closed after its answer
    if state.connections or state.tasks:
        log.info("shutting down: waiting up to %s s for %d connection(s) (a second signal exits now)",
                 timeout, len(state.connections))
    if not await _drained(srv, timeout):
        if srv.force_exit:
            log.warning("shutdown: a second signal: exiting now, closing %d connection(s)",
                        len(state.connections))
        else:
            log.warning("shutdown: %d connection(s) still open after %s s: closing them",
                        len(state.connections), timeout)
        for conn in list(state.connections):
            conn.transport.close()
        if not await _drained(srv, 1.0):
            for task in list(state.tasks):
                task.cancel()
    for server in srv.servers:
        await server.wait_closed()
    if not srv.force_exit:
        await srv.lifespan.shutdown()


async def _drained(srv, timeout_s) -> bool:
    """Wait until no connection and no request task is left (True), for at most timeout_s (None:
    no limit) or until a second signal forces the exit (False)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    while srv.server_state.connections or srv.server_state.tasks:
        if srv.force_exit or (deadline is not None and loop.time() >= deadline):
            return False
        await asyncio.sleep(0.05)
    return True


def _small_write_buffer_protocol(high: int):
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class SmallWriteBufferProtocol(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            transport.set_write_buffer_limits(high=high)

    return SmallWriteBufferProtocol


def serve(model, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
          read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
          api_key: str | None = None, **engine_kwargs) -> None:
    """Build the engine (printing the startup report), then serve it until SIGTERM or Ctrl-C (which drain
    for up to shutdown_timeout_s; a second one exits at once). port 0: any free port (the line printed
    names it). api_key: every /v1 route needs it as a bearer token."""
    from ..tools.startup import build_engine
    from .api import create_app, model_name_for

    engine, report = build_engine(model, **engine_kwargs)
    print(report.format(), flush=True)
    name = model_name or model_name_for(model)
    app = create_app(engine, name, startup_report=report, max_body_bytes=max_body_bytes, api_key=api_key)
    sock = bind_socket(host, port)
    port = sock.getsockname()[1]
    print(f"serving {name!r} on http://{host}:{port} (OpenAI API under /v1{', API key required' if api_key else ''}"
          ", metrics at /metrics)", flush=True)
    config = server_config(app, shutdown_timeout_s=shutdown_timeout_s, read_timeout_s=read_timeout_s,
                           keep_alive_s=keep_alive_s)
    _WakeableServer(config).run(sockets=[sock])


def main(argv=None) -> int:
    from . import options
    p = argparse.ArgumentParser(prog="python -m reference_engine.server", description="an OpenAI-compatible "
                                "HTTP server on the engine (default: the shipped model)")
    options.add_serve_arguments(p)
    return options.run(p.parse_args(argv), p.error)
