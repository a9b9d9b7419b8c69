"""Run the app under uvicorn: serve() in the foreground (`course serve`), ServerThread in the background
(tests, the load test)."""
from __future__ import annotations

import socket
import threading
import time


def bind_socket(host: str = "127.0.0.1", port: int = 0, sndbuf: int | None = None) -> socket.socket:
    """A listening socket (port 0: any free port). sndbuf sets SO_SNDBUF, which Linux copies to every
    accepted connection: a small one makes a stalled reader push back on the server after a few KiB
    instead of after the kernel's default megabytes (tests of slow readers need that)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
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
                 write_buffer_bytes: int | None = None, log_level: str = "warning", startup_timeout_s: float = 60.0):
        """sndbuf / write_buffer_bytes (both None: the defaults, kernel-tuned socket buffers and asyncio's
        64 KiB): shrink the kernel's and asyncio's buffers per connection so that a stalled reader makes
        the server's writes wait after a few KiB, as it would after megabytes with real payloads."""
        import uvicorn

        self.app, self.sock = app, bind_socket(host, port, sndbuf)
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}"
        http = _small_write_buffer_protocol(write_buffer_bytes) if write_buffer_bytes else "auto"
        config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=2, access_log=False, http=http)
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


def _WakeableServer(config):
    """uvicorn.Server that stops at once when nothing is in flight: uvicorn looks at should_exit every 0.1 s
    and then gives open connections a fixed 0.1 s, and every test and check that starts a server would wait
    out both. With connections or tasks still open, shutdown is uvicorn's own."""
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
            if self.server_state.connections or self.server_state.tasks:
                return await super().shutdown(sockets)
            for server in self.servers:  # what uvicorn's shutdown does when it has nothing to wait for
                server.close()
            for sock in sockets or []:
                sock.close()
            for server in self.servers:
                await server.wait_closed()
            if not self.force_exit:
                await self.lifespan.shutdown()

        def wake(self) -> None:
            """From any thread; before main_loop runs, should_exit is seen at its first tick."""
            if self._loop is not None:
                try:
                    self._loop.call_soon_threadsafe(self._woken.set)
                except RuntimeError:  # the loop has closed: the server is down already
                    pass

    return WakeableServer(config)


def _small_write_buffer_protocol(high: int):
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class SmallWriteBufferProtocol(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            transport.set_write_buffer_limits(high=high)

    return SmallWriteBufferProtocol


def serve(model, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None, **engine_kwargs) -> None:
    """Build the engine (printing the startup report), then serve it until Ctrl-C."""
    import uvicorn

    from ..startup import build_engine
    from .api import create_app, model_name_for

    engine, report = build_engine(model, **engine_kwargs)
    print(report.format(), flush=True)
    name = model_name or model_name_for(model)
    print(f"serving {name!r} on http://{host}:{port} (OpenAI API under /v1, metrics at /metrics)", flush=True)
    uvicorn.run(create_app(engine, name, startup_report=report), host=host, port=port, log_level="info")
