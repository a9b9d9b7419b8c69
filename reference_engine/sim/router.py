"""A router in front of several engine replicas, for trace replays on each replica's own clock.

Round robin (request i goes to replica i mod n) is what a Kubernetes Service or a plain load balancer
does: the choice never looks at the replicas' state, so each replica's replay is independent of the
others and can run on its own clock (every clock starts at the same modeled t = 0). That is also why one
slow replica shows in the tail: it keeps receiving its share of the traffic however far behind it falls.
"""
from __future__ import annotations

from .replay import replay


def round_robin(num_requests: int, num_replicas: int) -> list[int]:
    """The replica of each request, in arrival order: 0, 1, ..., n - 1, 0, 1, ..."""
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be a positive integer, got {num_replicas!r}")
    return [i % num_replicas for i in range(num_requests)]


def replay_replicas(engines, requests, prompts, assignment: list[int] | None = None,
                    step_hooks=None) -> tuple[list, list[int], list[float]]:
    """Replay `requests` (trace.Request, arrivals from t = 0) split across `engines` by `assignment`
    (default round_robin). Each engine replays its share with replay.replay, arrivals unchanged, so all
    replicas' timestamps share one origin when their clocks start equal. step_hooks: one hook (or None)
    per engine. Returns (outputs in request order, the assignment, each engine's clock at its start)."""
    assignment = round_robin(len(requests), len(engines)) if assignment is None else list(assignment)
    if len(assignment) != len(requests) or any(not 0 <= r < len(engines) for r in assignment):
        raise ValueError(f"assignment must give each of the {len(requests)} requests a replica in 0..{len(engines) - 1}")
    hooks = list(step_hooks) if step_hooks is not None else [None] * len(engines)
    outputs, starts = [None] * len(requests), []
    for r, engine in enumerate(engines):
        mine = [i for i, a in enumerate(assignment) if a == r]
        # replay() re-bases nothing: arrivals stay on the common timeline
        reqs = [requests[i] for i in mine]
        outs, t0, _ = replay(engine, reqs, [prompts[i] for i in mine], step_hook=hooks[r]) if mine else ([], engine.clock(), 0)
        starts.append(t0)
        for i, out in zip(mine, outs):
            outputs[i] = out
    return outputs, assignment, starts
