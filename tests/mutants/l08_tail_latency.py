"""Wrong answers to lesson 08 that its checks must catch, one per typical mistake.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here
are prefixed `_m_`."""
import numpy as np

from solutions import l08_tail_latency as sol
from tests.mutants import mutant

# -- 1.1 tail_summary --------------------------------------------------------------------------------

@mutant(check="tail_summary", message="averages the gaps within each request")
def tail_summary(requests, q=99):
    out = sol.tail_summary(requests, q)
    per_request = [(r["token_times"][-1] - r["token_times"][0]) / (len(r["token_times"]) - 1)
                   for r in requests if len(r["token_times"]) > 1]
    out["itl"] = (float(np.percentile(per_request, 50)), float(np.percentile(per_request, q)))
    return out


@mutant(check="tail_summary", message="measures TTFT from first_scheduled")
def tail_summary(requests, q=99):  # noqa: F811 - each mutant is its own wrong answer
    out = sol.tail_summary(requests, q)
    ttft = [r["token_times"][0] - r["first_scheduled"] for r in requests]
    out["ttft"] = (float(np.percentile(ttft, 50)), float(np.percentile(ttft, q)))
    return out


# -- 2.1 attribute_request ---------------------------------------------------------------------------

@mutant(check="attribute_request", message="leaves the host gaps in queue_s")
def attribute_request(request, steps):
    out = sol.attribute_request(request, steps)
    out["queue_s"] = request["first_scheduled"] - request["arrival"]
    return out


@mutant(check="attribute_request", message="counts a whole prefill-carrying step as stall")
def attribute_request(request, steps):  # noqa: F811
    out = sol.attribute_request(request, steps)
    by_end = {s["end"]: s for s in steps}
    t = request["token_times"]
    out["prefill_stall_s"] = sum(by_end[c]["end"] - by_end[c]["start"] for c in t[1:] if by_end[c]["prefill_tokens"] > 0)
    return out


# -- 2.2 tail_shares ---------------------------------------------------------------------------------

@mutant(check="tail_shares", message="averages per-request shares")
def tail_shares(requests, steps_by_replica, q=90):
    e2e = [r["finish"] - r["arrival"] for r in requests]
    cut = np.percentile(e2e, q)
    tail = [r for r, x in zip(requests, e2e) if x >= cut]
    parts = [(sol.attribute_request(r, steps_by_replica[r["replica"]]), r["finish"] - r["arrival"]) for r in tail]
    return {k: sum(a[k] / d for a, d in parts) / len(parts) for k in sol.COMPONENTS}


# -- 3.1 straggler_replica -----------------------------------------------------------------------------

@mutant(check="straggler_replica", message="compares means")
def straggler_replica(latencies_by_replica, ratio=1.5):
    return sol.straggler_replica([[float(np.mean(x))] if len(x) else [] for x in latencies_by_replica], ratio)


# -- 3.2 first_suspect ---------------------------------------------------------------------------------

@mutant(check="first_suspect", message="names queueing although requests were preempted")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):
    shares = sol.tail_shares(requests, steps_by_replica, q)
    if shares["queue_s"] >= min_share:
        return "queueing"
    return sol.first_suspect(requests, steps_by_replica, q, min_share, ratio)


@mutant(check="first_suspect", message="checks the replicas before the engine's own suspects")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    n = 1 + max(r["replica"] for r in requests)
    lats = [[sol.per_token_latency(r) for r in requests if r["replica"] == i] for i in range(n)]
    if sol.straggler_replica(lats, ratio) is not None:
        return "bad_replica"
    return sol.first_suspect(requests, steps_by_replica, q, min_share, ratio)
