"""An OpenAI-compatible HTTP server on the engine (FastAPI + uvicorn, as vLLM's).

    course serve [--model DIR] [--port N] [--host H]
    python -m reference_engine.server [...] [--max-request-bytes B] [--shutdown-timeout S] [--request-read-timeout S]

api.py (routes), async_engine.py (the engine's background loop), serving.py (answers and the streams
reading them), interfaces.py + streaming.py (the pluggable streaming parts), protocol.py (request and
error bodies), chat.py (the chat template), limits.py (request body size and read deadline), metrics.py
(Prometheus), runner.py (uvicorn in a thread, and serve(): shutdown with a deadline), loadtest.py (hostile
clients, a benchmark).
"""
