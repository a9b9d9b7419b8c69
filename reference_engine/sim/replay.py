"""Replay timed requests through the step API on the engine's clock, as a serving benchmark drives a server."""
from __future__ import annotations

import time

from ..sampling import SamplingParams


def replay(engine, requests, prompts, step_hook=None) -> tuple[list, float, float]:
    """Run `requests` (trace.Request: arrival seconds, output_tokens) with `prompts` (token ids).

    Between steps, every request whose arrival time has passed is added, stamped with its
    scheduled arrival, so time spent waiting for a running step counts against its TTFT. Idle
    gaps (nothing to run before the next arrival) are slept through on the wall clock, or skipped
    with advance_to on a modeled clock (gpu_model.ModeledClock), which no step would move. Greedy
    with EOS ignored: each request produces exactly its output_tokens. Returns (outputs in request
    order, clock at the start, seconds elapsed on the engine's clock).

    step_hook: called as step_hook(engine) right before each engine.step(), for host-side work the
    loop does between steps (faults.HostPause charges a stall on the clock there). None: nothing.
    """
    index, done, nxt = {}, {}, 0
    t0 = engine.clock()
    while len(done) < len(requests):
        now = engine.clock() - t0
        while nxt < len(requests) and requests[nxt].arrival <= now:
            params = SamplingParams(temperature=0, max_tokens=requests[nxt].output_tokens, ignore_eos=True)
            index[engine.add_request(prompts[nxt], params, arrival_time=t0 + requests[nxt].arrival)] = nxt
            nxt += 1
        if engine.has_unfinished():
            if step_hook is not None:
                step_hook(engine)
            for out in engine.step():
                if out.output is not None and out.request_id in index:
                    done[index[out.request_id]] = out.output
        elif nxt < len(requests):
            _wait_until(engine.clock, t0 + requests[nxt].arrival)
    return [done[i] for i in range(len(requests))], t0, engine.clock() - t0


def _wait_until(clock, t: float) -> None:
    """Idle until the clock reads t: a modeled clock jumps there (only steps move it otherwise, so waiting on
    it would never end); the wall clock is slept through."""
    from ..engine_config import IdleClock  # (here: the engine, and torch, are loaded by now)
    if isinstance(clock, IdleClock):
        clock.advance_to(t)
    else:
        time.sleep(max(0.0, t - clock()))
