"""The server's command-line options and their defaults (`course serve`, `python -m reference_engine.server`).

Kept apart from the server so that building a parser imports nothing heavy.
"""
from __future__ import annotations

import argparse

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: a full-context prompt as token ids is a few KiB to a few hundred KiB
DEFAULT_READ_TIMEOUT_S = 30.0  # to send one request; a 1 MiB body in 30 s needs 35 KB/s
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
DEFAULT_KEEP_ALIVE_S = 5.0  # uvicorn's default: an idle kept-alive connection is closed after this
API_KEY_ENV = "COURSE_API_KEY"  # vLLM reads VLLM_API_KEY the same way


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The serve command's options (python -m reference_engine.server)."""
    p.add_argument("--model", help="local model directory (default: the shipped target model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--served-model-name", help="the model id clients send (default: the directory's name)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="shard the model over this many worker processes")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="larger request bodies get a 413 before they are read (default: %(default)s)")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                   help="seconds a SIGTERM/SIGINT waits for requests in progress before cutting them (default: "
                        "%(default)s); a second signal exits at once")
    p.add_argument("--request-read-timeout", type=float, default=DEFAULT_READ_TIMEOUT_S,
                   help="seconds a client may take to send one request, headers and body, before its connection "
                        "is closed (default: %(default)s)")
    p.add_argument("--keep-alive-timeout", type=float, default=DEFAULT_KEEP_ALIVE_S,
                   help="seconds an idle kept-alive connection stays open (default: %(default)s)")
    p.add_argument("--api-key", default=None,
                   help="every /v1 route needs `Authorization: Bearer <key>` (as vLLM's --api-key; default: the "
                        f"environment variable {API_KEY_ENV} if set, else no key). /health, /metrics, /version, "
                        "/tokenize and /detokenize stay open")


def run(args, error) -> int:
    """Serve with the parsed options; `error(message)` reports a bad one (exits)."""
    from pathlib import Path

    from ..shipped import TARGET
    from .runner import serve
    model = args.model or TARGET
    if not Path(model).is_dir():
        error(f"no model directory {model}")
    api_key = api_key_of(args)
    if api_key == "":
        error("--api-key is empty: give a key, or leave the option out for a server without one")
    serve(model, host=args.host, port=args.port, model_name=args.served_model_name,
          max_body_bytes=args.max_request_bytes, shutdown_timeout_s=args.shutdown_timeout,
          read_timeout_s=args.request_read_timeout, keep_alive_s=args.keep_alive_timeout,
          tensor_parallel_size=args.tensor_parallel_size, api_key=api_key)
    return 0


def api_key_of(args) -> str | None:
    """--api-key, else the COURSE_API_KEY environment variable (unless empty), else None (no key)."""
    import os
    return args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
