"""Prometheus metrics, named as vLLM names them (vllm:num_requests_running ...) under another prefix.

Each server gets its own CollectorRegistry, so several servers (tests) can live in one process.
The engine loop sets the gauges after every turn that changed the engine (a step, an added request, an
abort), so a scrape never shows a request that has left; it also counts tokens and engine requests by
finish reason. The API counts the requests it refuses. prometheus-client's objects are thread-safe.

What an operator alerts on: request_success_total{finished_reason="error"} (requests the engine failed),
{finished_reason="abort"} with request_aborts_total{cause} (clients leaving, slow readers, shutdown), and
request_validation_failures_total (clients sending what the API refuses, by status and field).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

PREFIX = "course:"
disable_created_metrics()  # no *_created series (vLLM drops them too): one series per name is easier to read
# Buckets as vLLM's: TTFT from 1 ms to minutes, ITL from 10 ms to tens of seconds (plus finer ones for a CPU).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]


class ServerMetrics:
    def __init__(self, prefix: str = PREFIX):
        self.registry = CollectorRegistry()
        r, p = self.registry, prefix
        self.num_requests_running = Gauge(p + "num_requests_running", "Requests in the running batch", registry=r)
        self.num_requests_waiting = Gauge(p + "num_requests_waiting", "Requests waiting to be scheduled", registry=r)
        self.kv_cache_usage_perc = Gauge(p + "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0 to 1)",
                                         registry=r)
        self.num_preemptions = Counter(p + "num_preemptions", "Sequences preempted (recomputed later)", registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of requests admitted", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated", registry=r)
        self.request_success = Counter(p + "request_success", "Engine requests finished, by finish reason (stop, "
                                       "length, abort, error)", ["finished_reason"], registry=r)
        self.request_aborts = Counter(p + "request_aborts", "Engine requests aborted by the server, by cause",
                                      ["cause"], registry=r)
        self.time_to_first_token = Histogram(p + "time_to_first_token_seconds", "Arrival to first token",
                                             buckets=TTFT_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(p + "inter_token_latency_seconds", "Time between consecutive tokens",
                                             buckets=ITL_BUCKETS, registry=r)
        self.engine_steps = Counter(p + "engine_steps", "Engine steps run", registry=r)
        self.request_validation_failures = Counter(
            p + "request_validation_failures", "Requests refused for what the client sent (400: a bad field, "
            "401: a wrong API key, 413: a body over the limit), by status and the field named", ["status", "param"],
            registry=r)
        for reason in ("stop", "length", "abort", "error"):  # every series exists from the start, at 0
            self.request_success.labels(reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)
