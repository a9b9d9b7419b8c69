"""AsyncEngine: one background thread owns the LLMEngine and steps it; the event loop never waits on it.

The HTTP handlers run on an asyncio event loop. A forward pass takes milliseconds to seconds, so it must
not run there: one thread (the engine loop) is the only code that touches the LLMEngine. Handlers talk to
it through a command queue (add, abort); it answers by scheduling callbacks on the event loop
(loop.call_soon_threadsafe) with each step's outputs, grouped by request.

Timing contract: a command queued while step k runs is applied before step k + 1 starts. So an abort
frees its KV blocks within one engine step of being queued (abort_delays records the steps it took), and
the gauges (running, waiting, KV usage) are set right after, not at the next step (which may never come).

Failures: a request whose own sampling fails in a step (LLMEngine.step_errors) ends alone, with
finish_reason "error" and its exception; the rest of the batch goes on. A step that fails as a whole (the
forward pass) ends every request in it with "error". Either way every block is freed.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable

from ..sampling import SamplingParams
from ..sequence import StepOutput

log = logging.getLogger(__name__)

# What the engine loop delivers for one request: (its StepOutputs of one step, error or None). An error
# means the request has ended with finish_reason "error" (its last StepOutput says so, if it has one).
OnOutputs = Callable[[list[StepOutput], BaseException | None], None]


class AsyncEngine:
    def __init__(self, engine, metrics=None, idle_wait_s: float = 0.05):
        self.engine, self.metrics, self.idle_wait_s = engine, metrics, idle_wait_s
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._sinks: dict[str, OnOutputs] = {}  # engine-thread only
        self._timing: dict[str, list[float]] = {}  # request -> [arrival, last token time], engine-thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.steps = 0  # engine steps run so far (written by the engine thread only)
        self.abort_delays: list[int] = []  # per applied abort: steps between queueing and applying it
        # (steps, free KV blocks, requests in the engine), replaced as a whole after every loop turn, so any
        # thread can read a consistent snapshot.
        self.snapshot = (0, engine.block_manager.num_free(), 0)

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop after its current step; abort whatever is still in the engine (blocks freed)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("engine loop did not stop within %.0f s", timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- commands (any thread) -------------------------------------------------------------------
    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, on_outputs: OnOutputs,
            output_prefix: list[int] | None = None) -> None:
        """Queue a validated request. on_outputs runs on the event loop with each step's outputs for it;
        the last call has a finished StepOutput (or an error). output_prefix: LLMEngine.add_request's (the
        tokens a continued answer already has)."""
        self._cmds.put(("add", request_id, prompt_token_ids, params, on_outputs, time.monotonic(), output_prefix))
        self._wake.set()

    def abort(self, request_id: str, cause: str) -> None:
        """Queue an abort; applied before the next step. Its on_outputs gets a final "abort" StepOutput."""
        self._cmds.put(("abort", request_id, cause, self.steps))
        self._wake.set()

    # ---- the loop (engine thread) -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._apply_commands():
                    self._publish_snapshot()  # an abort shows at once, even if no step follows
                if self.engine.has_unfinished():
                    self._step()
                else:
                    self._wake.wait(self.idle_wait_s)
                    self._wake.clear()
                self._publish_snapshot()
        finally:
            self._apply_commands()
            for rid in list(self._sinks):
                self._abort_now(rid, "shutdown", self.steps)
            self._publish_snapshot()

    def _apply_commands(self) -> bool:
        """Apply every queued command; True if there was any."""
        applied = False
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return applied
            applied = True
            if cmd[0] == "add":
                _, rid, ids, params, sink, arrival, prefix = cmd
                try:
                    if prefix:
                        self.engine.add_request(ids, params, request_id=rid, output_prefix=prefix)
                    else:
                        self.engine.add_request(ids, params, request_id=rid)
                except Exception as e:  # validated before queueing; this is a server bug, reported to the request
                    log.exception("adding request %s failed", rid)
                    self._count_errors(1)
                    self._deliver({rid: ([], e)}, {rid: sink})
                    continue
                self._sinks[rid], self._timing[rid] = sink, [arrival, arrival]
                if self.metrics is not None:
                    self.metrics.prompt_tokens.inc(len(ids))
            else:
                _, rid, cause, requested_at = cmd
                self._abort_now(rid, cause, requested_at)

    def _abort_now(self, rid: str, cause: str, requested_at: int) -> None:
        sink = self._sinks.pop(rid, None)
        self._timing.pop(rid, None)
        if sink is None:  # finished already, or never added
            return
        self.engine.abort(rid)
        self.abort_delays.append(self.steps - requested_at)
        if self.metrics is not None:
            self.metrics.request_aborts.labels(cause).inc()
            self.metrics.request_success.labels("abort").inc()
        self._set_gauges()  # before the client can hear of it
        self._deliver({rid: ([StepOutput(rid, 0, [], True, "abort")], None)}, {rid: sink})

    def _step(self) -> None:
        n_stats = len(self.engine.step_stats)
        try:
            outputs = self.engine.step()
        except Exception as e:  # a failed forward: fail every request rather than hang them
            log.exception("engine step failed")
            sinks, self._sinks = self._sinks, {}
            self._timing.clear()
            for rid in sinks:
                self.engine.abort(rid)
            self._count_errors(len(sinks))
            self._set_gauges()
            self._deliver({rid: ([], e) for rid in sinks}, sinks)
            return
        self.steps += 1
        now, batch = time.monotonic(), {}
        errors = getattr(self.engine, "step_errors", None) or {}  # requests this step ended with "error"
        for out in outputs:
            if out.request_id in self._sinks:
                batch.setdefault(out.request_id, ([], errors.get(out.request_id)))[0].append(out)
        for rid, e in errors.items():
            log.error("request %s failed in the engine and was ended: %s: %s", rid, type(e).__name__, e)
        sinks = {rid: self._sinks[rid] for rid in batch}
        for rid, (outs, _) in batch.items():
            self._record(rid, outs, now)
            if any(o.finished for o in outs):
                del self._sinks[rid]
                self._timing.pop(rid, None)
        self._count_step(self.engine.step_stats[n_stats:])
        if len(self.engine.step_stats) > 4096:  # a server runs for days: keep the recent history only
            del self.engine.step_stats[:-1024]
        self._set_gauges()  # a client that has its last token never scrapes itself still running
        self._deliver(batch, sinks)

    def _record(self, rid: str, outs: list[StepOutput], now: float) -> None:
        m = self.metrics
        if m is None:
            return
        timing = self._timing[rid]
        for o in outs:
            if o.new_token_ids:
                m.generation_tokens.inc(len(o.new_token_ids))
                first = timing[1] == timing[0]
                (m.time_to_first_token if first else m.inter_token_latency).observe(now - timing[1])
                timing[1] = now
            if o.output is not None and o.finish_reason != "abort":  # the request's last sequence (n > 1: of n)
                m.request_success.labels(o.finish_reason).inc()

    def _count_step(self, new_stats) -> None:
        m = self.metrics
        if m is None:
            return
        m.engine_steps.inc()
        preempted = sum(s.num_preempted for s in new_stats)
        if preempted:
            m.num_preemptions.inc(preempted)

    def _count_errors(self, n: int) -> None:
        if self.metrics is not None and n:
            self.metrics.request_success.labels("error").inc(n)

    def _set_gauges(self) -> None:
        m, e = self.metrics, self.engine
        if m is None:
            return
        m.num_requests_running.set(len(e.scheduler.running))
        m.num_requests_waiting.set(len(e.scheduler.waiting))
        m.kv_cache_usage_perc.set(1 - e.block_manager.num_free() / e.num_blocks)

    def _deliver(self, batch: dict, sinks: dict) -> None:
        if not batch or self._loop is None or self._loop.is_closed():
            return

        def run():
            for rid, (outs, err) in batch.items():
                try:
                    sinks[rid](outs, err)
                except Exception:  # one broken stream must not starve the others
                    log.exception("output callback for request %s failed", rid)
        try:
            self._loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop closed during shutdown
            pass

    def _publish_snapshot(self) -> None:
        """The gauges first, then the snapshot: whoever sees the engine idle in the snapshot scrapes idle
        gauges."""
        self._set_gauges()
        self.snapshot = (self.steps, self.engine.block_manager.num_free(), len(self.engine.requests))
