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


@mutant(check="first_suspect", message="names a straggler bad_replica although its own requests were preempted")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    n = 1 + max(r["replica"] for r in requests)
    lats = [[sol.per_token_latency(r) for r in requests if r["replica"] == i] for i in range(n)]
    if sol.straggler_replica(lats, ratio) is not None:
        return "bad_replica"
    return sol.first_suspect(requests, steps_by_replica, q, min_share, ratio)


@mutant(check="first_suspect", message="checks the replicas last")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    """The order of older versions of the lesson: the engine's suspects first, the per-replica split last."""
    return _m_suspect(requests, steps_by_replica, q, min_share, ratio, order=sol.CAUSES)


@mutant(check="first_suspect", message="rules out bad_replica when any request in the fleet was preempted")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    """The preemption guard asked of the whole fleet, not of the slow replica's own requests."""
    n = 1 + max(r["replica"] for r in requests)
    per_replica = [[sol.per_token_latency(r) for r in requests if r["replica"] == i] for i in range(n)]
    slow = sol.straggler_replica(per_replica, ratio)
    if slow is not None and not any(r["num_preemptions"] > 0 for r in requests):
        return "bad_replica"
    rest = [c for c in sol.SUSPECT_ORDER if c != "bad_replica"]
    return _m_suspect(requests, steps_by_replica, q, min_share, ratio, order=rest)


@mutant(check="first_suspect", message="tests prefill interference before queueing")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    return _m_suspect(requests, steps_by_replica, q, min_share, ratio,
                      order=("bad_replica", "prefill_interference", "queueing", "preemption", "host_stall"))


# -- edge cases: arguments passed on, empty replicas, ties, exact cuts, host gaps clipped at arrival ---------

@mutant(check="tail_summary", message="on requests of one token each")
def tail_summary(requests, q=99):  # noqa: F811 - no guard for a metric with no values
    ttft = [r["token_times"][0] - r["arrival"] for r in requests]
    e2e = [r["finish"] - r["arrival"] for r in requests]
    itl = [b - a for r in requests for a, b in zip(r["token_times"], r["token_times"][1:])]
    return {name: (float(np.percentile(x, 50)), float(np.percentile(x, q)))
            for name, x in (("ttft", ttft), ("itl", itl), ("e2e", e2e))}


def _m_attribute(request, steps, host_gap=None, stall=None):
    """The right attribution with host_gap(gaps, arrival, finish) or stall(step, base) swapped in."""
    out = sol.attribute_request(request, steps)
    times = request["token_times"]
    if host_gap is not None:
        gaps = [(a["end"], b["start"]) for a, b in zip(steps, steps[1:]) if b["start"] > a["end"]]
        out["host_gap_s"] = host_gap(gaps, request["arrival"], times[-1])
    if stall is not None:
        by_end = {s["end"]: s for s in steps}
        plain = [s["end"] - s["start"] for s in steps if s["prefill_tokens"] == 0]
        base = float(np.median(plain)) if plain else 0.0
        out["prefill_stall_s"] = sum(stall(by_end[t], base) for t in times[1:] if by_end[t]["prefill_tokens"] > 0)
    return out


@mutant(check="attribute_request", message="counts a host gap the request arrived in whole")
def attribute_request(request, steps):  # noqa: F811
    return _m_attribute(request, steps, host_gap=lambda gaps, lo, hi: sum(b - a for a, b in gaps if b > lo and a < hi))


@mutant(check="attribute_request", message="counts only the host gaps wholly inside")
def attribute_request(request, steps):  # noqa: F811
    return _m_attribute(request, steps, host_gap=lambda gaps, lo, hi: sum(b - a for a, b in gaps if a >= lo and b <= hi))


@mutant(check="attribute_request", message="lets a prefill step faster than the base count negative")
def attribute_request(request, steps):  # noqa: F811
    return _m_attribute(request, steps, stall=lambda s, base: s["end"] - s["start"] - base)


@mutant(check="attribute_request", message="has no base when the replica has no decode-only step")
def attribute_request(request, steps):  # noqa: F811
    plain = [s["end"] - s["start"] for s in steps if s["prefill_tokens"] == 0]
    if plain:
        return sol.attribute_request(request, steps)
    return _m_attribute(request, steps, stall=lambda s, base: max(0.0, s["end"] - s["start"] - float("nan")))


@mutant(check="attribute_request", message="counts the first token's own prefill step as stall")
def attribute_request(request, steps):  # noqa: F811
    out = sol.attribute_request(request, steps)
    first = next(s for s in steps if s["end"] == request["token_times"][0])
    plain = [s["end"] - s["start"] for s in steps if s["prefill_tokens"] == 0]
    base = float(np.median(plain)) if plain else 0.0
    if first["prefill_tokens"] > 0:
        out["prefill_stall_s"] += max(0.0, first["end"] - first["start"] - base)
    return out


def _m_shares(requests, steps_by_replica, tail, replica=None):
    sums = dict.fromkeys(sol.COMPONENTS, 0.0)
    for r in tail:
        for k, v in sol.attribute_request(r, steps_by_replica[r["replica"] if replica is None else replica]).items():
            sums[k] += v
    total = sum(r["finish"] - r["arrival"] for r in tail)
    return {k: v / total for k, v in sums.items()}


@mutant(check="tail_shares", message="takes the tail as E2E > the cut")
def tail_shares(requests, steps_by_replica, q=90):  # noqa: F811
    cut = np.percentile([r["finish"] - r["arrival"] for r in requests], q)
    return _m_shares(requests, steps_by_replica, [r for r in requests if r["finish"] - r["arrival"] > cut])


@mutant(check="tail_shares", message="takes the ceil(n * (1 - q/100)) slowest requests")
def tail_shares(requests, steps_by_replica, q=90):  # noqa: F811
    k = int(np.ceil(len(requests) * (1 - q / 100)))
    return _m_shares(requests, steps_by_replica, sorted(requests, key=lambda r: r["arrival"] - r["finish"])[:k])


@mutant(check="tail_shares", message="judges a request against another replica's steps")
def tail_shares(requests, steps_by_replica, q=90):  # noqa: F811
    cut = np.percentile([r["finish"] - r["arrival"] for r in requests], q)
    return _m_shares(requests, steps_by_replica, [r for r in requests if r["finish"] - r["arrival"] >= cut], replica=0)


def _m_medians(lats):
    return {i: float(np.median(x)) for i, x in enumerate(lats) if len(x)}


def _m_straggler(meds, ratio, others):
    """The worst replica over ratio x others(its others' medians), lowest index on a tie."""
    if len(meds) < 2:
        return None
    best, best_excess = None, ratio
    for i, m in meds.items():
        o = others(i)
        excess = m / o if o > 0 else float("inf")
        if excess > best_excess:
            best, best_excess = i, excess
    return best


@mutant(check="straggler_replica", message="returns the straggler's position among the non-empty replicas")
def straggler_replica(latencies_by_replica, ratio=1.5):  # noqa: F811
    return sol.straggler_replica([x for x in latencies_by_replica if len(x)], ratio)


@mutant(check="straggler_replica", message="counts an empty replica among the others as median 0")
def straggler_replica(latencies_by_replica, ratio=1.5):  # noqa: F811
    meds = {i: float(np.median(x)) if len(x) else 0.0 for i, x in enumerate(latencies_by_replica)}
    if sum(1 for x in latencies_by_replica if len(x)) < 2:
        return None
    return _m_straggler(meds, ratio, lambda i: float(np.median([v for j, v in meds.items() if j != i])))


@mutant(check="straggler_replica", message="combines the others' medians by their mean")
def straggler_replica(latencies_by_replica, ratio=1.5):  # noqa: F811
    meds = _m_medians(latencies_by_replica)
    return _m_straggler(meds, ratio, lambda i: float(np.mean([v for j, v in meds.items() if j != i])))


@mutant(check="straggler_replica", message="compares with the fastest other replica")
def straggler_replica(latencies_by_replica, ratio=1.5):  # noqa: F811
    meds = _m_medians(latencies_by_replica)
    return _m_straggler(meds, ratio, lambda i: min(v for j, v in meds.items() if j != i))


@mutant(check="straggler_replica", message="takes the median of the others' pooled latencies")
def straggler_replica(latencies_by_replica, ratio=1.5):  # noqa: F811
    meds = _m_medians(latencies_by_replica)
    return _m_straggler(meds, ratio, lambda i: float(np.median(
        [v for j, x in enumerate(latencies_by_replica) if j != i for v in x])))


@mutant(check="straggler_replica", message="returns the last of two equally slow stragglers")
def straggler_replica(latencies_by_replica, ratio=1.5):  # noqa: F811
    meds = _m_medians(latencies_by_replica)
    if len(meds) < 2:
        return None
    excess = {i: m / float(np.median([v for j, v in meds.items() if j != i])) for i, m in meds.items()}
    flagged = {i: e for i, e in excess.items() if e > ratio}
    return max(flagged, key=lambda i: (flagged[i], i)) if flagged else None


@mutant(check="straggler_replica", message="uses ratio 1.5 whatever ratio it is given")
def straggler_replica(latencies_by_replica, ratio=1.5):  # noqa: F811
    return sol.straggler_replica(latencies_by_replica, 1.5)


@mutant(check="straggler_replica", message="compares the difference m - others with ratio")
def straggler_replica(latencies_by_replica, ratio=1.5):  # noqa: F811
    meds = _m_medians(latencies_by_replica)
    if len(meds) < 2:
        return None
    gaps = {i: m - float(np.median([v for j, v in meds.items() if j != i])) for i, m in meds.items()}
    over = [i for i, g in gaps.items() if g > ratio]
    return max(over, key=lambda i: (gaps[i], -i)) if over else None


def _m_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5, order=sol.SUSPECT_ORDER, preempted=None,
               per_replica=sol.per_token_latency, big=lambda v, m: v >= m):
    """first_suspect with the order, the preemption test, the replica latency or the share test swapped (the
    straggler keeps its guard: a replica whose own requests were preempted is no bad replica)."""
    shares = sol.tail_shares(requests, steps_by_replica, q)
    if preempted is None:
        preempted = any(r["num_preemptions"] > 0 for r in requests)
    n = 1 + max(r["replica"] for r in requests)
    lats = [[per_replica(r) for r in requests if r["replica"] == i] for i in range(n)]
    tests = {"queueing": big(shares["queue_s"], min_share) and not preempted,
             "prefill_interference": big(shares["prefill_stall_s"], min_share),
             "preemption": big(shares["preempted_s"], min_share) or preempted,
             "host_stall": big(shares["host_gap_s"], min_share),
             "bad_replica": _m_unpreempted_straggler(requests, sol.straggler_replica(lats, ratio))}
    return next((c for c in order if tests[c]), "none")


def _m_unpreempted_straggler(requests, slow):
    return slow is not None and not any(r["num_preemptions"] > 0 for r in requests if r["replica"] == slow)


@mutant(check="first_suspect", message="asks whether a request was preempted of the tail only")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    cut = np.percentile([r["finish"] - r["arrival"] for r in requests], q)
    tail_preempted = any(r["num_preemptions"] > 0 for r in requests if r["finish"] - r["arrival"] >= cut)
    return _m_suspect(requests, steps_by_replica, q, min_share, ratio, preempted=tail_preempted)


@mutant(check="first_suspect", message="does not pass q on to tail_shares")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    return sol.first_suspect(requests, steps_by_replica, 90, min_share, ratio)


@mutant(check="first_suspect", message="uses min_share 0.06 whatever min_share it is given")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    return sol.first_suspect(requests, steps_by_replica, q, 0.06, ratio)


@mutant(check="first_suspect", message="does not pass ratio on to straggler_replica")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    return sol.first_suspect(requests, steps_by_replica, q, min_share)


@mutant(check="first_suspect", message="compares the replicas by raw E2E")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    return _m_suspect(requests, steps_by_replica, q, min_share, ratio, per_replica=lambda r: r["finish"] - r["arrival"])


@mutant(check="first_suspect", message="tests the shares with > min_share")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    return _m_suspect(requests, steps_by_replica, q, min_share, ratio, big=lambda v, m: v > m)


@mutant(check="first_suspect", message="rules out preemption before prefill interference")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    return _m_suspect(requests, steps_by_replica, q, min_share, ratio,
                      order=("bad_replica", "queueing", "preemption", "prefill_interference", "host_stall"))


@mutant(check="first_suspect", message="rules out host stall before preemption")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    return _m_suspect(requests, steps_by_replica, q, min_share, ratio,
                      order=("bad_replica", "queueing", "prefill_interference", "host_stall", "preemption"))


@mutant(check="first_suspect", message="names preemption as soon as a big queue comes with preemptions")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    shares = sol.tail_shares(requests, steps_by_replica, q)
    if shares["queue_s"] >= min_share and any(r["num_preemptions"] > 0 for r in requests):
        return "preemption"
    return sol.first_suspect(requests, steps_by_replica, q, min_share, ratio)


@mutant(check="first_suspect", message="judges a request against another replica's steps")
def first_suspect(requests, steps_by_replica, q=90, min_share=0.06, ratio=1.5):  # noqa: F811
    return sol.first_suspect(requests, [steps_by_replica[0]] * len(steps_by_replica), q, min_share, ratio)



@mutant(check="straggler_replica", message="keeps an empty replica")
def straggler_replica(latencies_by_replica, ratio=1.5):  # noqa: F811
    """The reference without its `if len(x)`: an empty replica's median is nan, and it stays among the others."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # np.median([]) warns, then gives nan
        meds = {i: float(np.median(x)) for i, x in enumerate(latencies_by_replica)}
    return _m_straggler(meds, ratio, lambda i: float(np.median([v for j, v in meds.items() if j != i])))
