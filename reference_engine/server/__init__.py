"""An OpenAI-compatible HTTP server on the engine (FastAPI + uvicorn, as vLLM's).

    course serve [--model DIR] [--port N] [--host H]

api.py (routes), async_engine.py (the engine's background loop), serving.py (answers and the streams
reading them), interfaces.py + streaming.py (the pluggable streaming parts), protocol.py (request and
error bodies), chat.py (the chat template), metrics.py (Prometheus), runner.py (uvicorn in a thread,
and serve()), loadtest.py (hostile clients, a benchmark).
"""
