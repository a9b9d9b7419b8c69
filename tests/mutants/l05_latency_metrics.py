"""Plausible wrong answers for lesson 05; each must be caught, and named, by its check."""
from __future__ import annotations

import math

from solutions import l05_latency_metrics as sol
from tests.mutants import mutant

# -- 1.1-1.3 per-request latencies -----------------------------------------------------------

# A wrong upstream answer is named by its own check only: every check of a function that calls it (the
# reference's tpot, latency_summary, meets_slo and goodput do) says it depends on it, which fails.
@mutant(check="goodput", message="goodput depends on ttft, which fails")
@mutant(check="meets_slo", message="meets_slo depends on ttft, which fails")
@mutant(check="latency_summary", message="latency_summary depends on ttft, which fails")
@mutant(check="tpot", message="tpot depends on ttft, which fails")
@mutant(check="ttft", message="first scheduled, not from its arrival")
def ttft(r):
    return r.token_times[0] - r.scheduled


@mutant(check="ttft", message="first token's timestamp")
def ttft(r):  # noqa: F811 - each mutant is its own wrong answer
    return r.token_times[0]


@mutant(check="tpot", message="divides by output_tokens instead of output_tokens - 1")
def tpot(r):
    n = len(r.token_times)
    if n < 2:
        return None
    return (r.finish - r.arrival - sol.ttft(r)) / n


@mutant(check="tpot", message="includes the TTFT in the numerator")
def tpot(r):  # noqa: F811
    n = len(r.token_times)
    return (r.finish - r.arrival) / (n - 1) if n > 1 else None


@mutant(check="goodput", message="goodput depends on tpot, which fails")
@mutant(check="meets_slo", message="meets_slo depends on tpot, which fails")
@mutant(check="latency_summary", message="latency_summary depends on tpot, which fails")
@mutant(check="tpot", message="measures up to the last token instead of the finish time")
def tpot(r):  # noqa: F811 - the mean ITL: right only when a request finishes at its last token
    n = len(r.token_times)
    return (r.token_times[-1] - r.token_times[0]) / (n - 1) if n > 1 else None


@mutant(check="tpot", message="returns 0 for a one-token request")
def tpot(r):  # noqa: F811
    n = len(r.token_times)
    return (r.finish - r.token_times[0]) / (n - 1) if n > 1 else 0.0


@mutant(check="latency_summary", message="latency_summary depends on itl, which fails")
@mutant(check="itl", message="includes the TTFT gap")
def itl(r):
    times = [r.arrival] + list(r.token_times)
    return [b - a for a, b in zip(times, times[1:])]


@mutant(check="itl", message="time since the first token")
def itl(r):  # noqa: F811
    return [x - r.token_times[0] for x in r.token_times[1:]]


# -- 2.1 percentiles -------------------------------------------------------------------------

@mutant(check="percentile", message="without interpolating")
def percentile(values, q):
    if not values or not 0 <= q <= 100:
        raise ValueError("bad input")
    s = sorted(values)
    return float(s[min(len(s) - 1, int(len(s) * q / 100))])


@mutant(check="percentile", message="without interpolating")
def percentile(values, q):  # noqa: F811 - the "nearest rank" textbook method
    if not values or not 0 <= q <= 100:
        raise ValueError("bad input")
    s = sorted(values)
    return float(s[max(0, math.ceil(len(s) * q / 100) - 1)])


def _m_interpolated(values, q, position):
    if not values or not 0 <= q <= 100:
        raise ValueError("bad input")
    s = sorted(float(v) for v in values)
    k = min(max(position(len(s), q), 0.0), len(s) - 1)
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (k - lo) * (s[hi] - s[lo])


@mutant(check="percentile", message="interpolates at position n * q / 100")
def percentile(values, q):  # noqa: F811 - interpolates, but at the wrong position
    return _m_interpolated(values, q, lambda n, q: n * q / 100)


@mutant(check="percentile", message="PERCENTILE.EXC")
def percentile(values, q):  # noqa: F811
    return _m_interpolated(values, q, lambda n, q: (n + 1) * q / 100 - 1)


@mutant(check="percentile", message="instead of raising ValueError")
def percentile(values, q):  # noqa: F811 - refuses q > 100 but not q < 0
    if q > 100:
        raise ValueError(f"q must be at most 100, got {q}")
    return sol.percentile(values, max(q, 0))


@mutant(check="latency_summary", message="latency_summary depends on percentile, which fails")
@mutant(check="percentile", message="does not sort the values first")
def percentile(values, q):  # noqa: F811
    if not values or not 0 <= q <= 100:
        raise ValueError("bad input")
    s = [float(v) for v in values]
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (k - lo) * (s[hi] - s[lo])


@mutant(check="percentile", message="instead of raising ValueError")
def percentile(values, q):  # noqa: F811 - right on data, but quietly answers 0 for no values
    if not values:
        return 0.0
    return sol.percentile(values, min(max(q, 0), 100))


# -- 2.2 the summary -------------------------------------------------------------------------

def _m_row(xs, percentiles, center=None):
    if not xs:
        return None
    row = {"count": len(xs), "mean": sum(xs) / len(xs)}
    for q in percentiles:
        row[f"p{q:g}"] = sol.percentile(xs, q)
    if center is not None:
        row["p50"] = center(xs)
    return row


@mutant(check="latency_summary", message="mean where the median (p50) belongs")
def latency_summary(requests, percentiles=sol.PERCENTILES):
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    values = {"ttft": [sol.ttft(r) for r in requests],
              "tpot": [x for x in (sol.tpot(r) for r in requests) if x is not None],
              "itl": [g for r in requests for g in sol.itl(r)],
              "e2el": [r.finish - r.arrival for r in requests]}
    return {k: _m_row(v, percentiles, center=mean) for k, v in values.items()}


@mutant(check="latency_summary", message="names the keys with f'p{q}'")
def latency_summary(requests, percentiles=sol.PERCENTILES):  # noqa: F811
    out = sol.latency_summary(requests, percentiles)
    for row in out.values():
        for q in percentiles if row is not None else ():
            row[f"p{q}"] = row.pop(f"p{q:g}")  # 50.0 -> "p50.0"
    return out


@mutant(check="latency_summary", message="instead of pooling every gap")
def latency_summary(requests, percentiles=sol.PERCENTILES):  # noqa: F811
    out = sol.latency_summary(requests, percentiles)
    gaps = [g for g in (sol.itl(r) for r in requests) if g]
    if gaps:
        out["itl"] = {"count": len(gaps), "mean": sum(sum(g) / len(g) for g in gaps) / len(gaps)}
        for q in percentiles:
            out["itl"][f"p{q:g}"] = sum(sol.percentile(g, q) for g in gaps) / len(gaps)
    return out


@mutant(check="latency_summary", message="measures the end-to-end latency to the last token")
def latency_summary(requests, percentiles=sol.PERCENTILES):  # noqa: F811
    out = sol.latency_summary(requests, percentiles)
    out["e2el"] = _m_row([r.token_times[-1] - r.arrival for r in requests], percentiles)
    return out


@mutant(check="latency_summary", message="ignores the percentiles argument")
def latency_summary(requests, percentiles=sol.PERCENTILES):  # noqa: F811
    return sol.latency_summary(requests)


@mutant(check="latency_summary", message="counts one-token requests in TPOT as 0")
def latency_summary(requests, percentiles=sol.PERCENTILES):  # noqa: F811
    out = sol.latency_summary(requests, percentiles)
    out["tpot"] = _m_row([sol.tpot(r) or 0.0 for r in requests], percentiles)
    return out


# -- 3.1 / 3.2 SLOs and goodput --------------------------------------------------------------

@mutant(check="goodput", message="goodput depends on meets_slo, which fails")
@mutant(check="meets_slo", message="meets either SLO")
def meets_slo(r, ttft_slo, tpot_slo):
    p = sol.tpot(r)
    return sol.ttft(r) <= ttft_slo or (p is None or p <= tpot_slo)


@mutant(check="meets_slo", message="exactly at its SLO as a miss")
def meets_slo(r, ttft_slo, tpot_slo):  # noqa: F811
    p = sol.tpot(r)
    return sol.ttft(r) < ttft_slo and (p is None or p < tpot_slo)


@mutant(check="meets_slo", message="fails a one-token request on TPOT")
def meets_slo(r, ttft_slo, tpot_slo):  # noqa: F811
    p = sol.tpot(r)
    return p is not None and sol.ttft(r) <= ttft_slo and p <= tpot_slo


@mutant(check="meets_slo", message="judges TPOT up to the last token instead of the finish time")
def meets_slo(r, ttft_slo, tpot_slo):  # noqa: F811
    n = len(r.token_times)
    p = (r.token_times[-1] - r.token_times[0]) / (n - 1) if n > 1 else None
    return sol.ttft(r) <= ttft_slo and (p is None or p <= tpot_slo)


def _m_goodput(requests, good, duration_of=None, per_request=False):
    out = sol.goodput(requests, 1e9, 1e9)  # every key, with everything "met"; then overwrite
    if not requests:
        return out
    met = sum(bool(good(r)) for r in requests)
    duration = (duration_of or (lambda rs: max(r.finish for r in rs) - min(r.arrival for r in rs)))(requests)
    n = len(requests)
    out.update(met=met, attainment=met / n, duration_s=duration,
               goodput_rps=met / n if per_request else met / duration,
               request_rps=n / duration, output_tok_s=sum(r.output_tokens for r in requests) / duration)
    return out


@mutant(check="goodput", message="meets either SLO")
def goodput(requests, ttft_slo, tpot_slo):
    def good(r):
        p = sol.tpot(r)
        return sol.ttft(r) <= ttft_slo or p is None or p <= tpot_slo
    return _m_goodput(requests, good)


@mutant(check="goodput", message="checks only the TTFT SLO")
def goodput(requests, ttft_slo, tpot_slo):  # noqa: F811
    return _m_goodput(requests, lambda r: sol.ttft(r) <= ttft_slo)


@mutant(check="goodput", message="divides by the number of requests instead of the duration")
def goodput(requests, ttft_slo, tpot_slo):  # noqa: F811
    return _m_goodput(requests, lambda r: sol.meets_slo(r, ttft_slo, tpot_slo), per_request=True)


@mutant(check="goodput", message="from the first to the last arrival")
def goodput(requests, ttft_slo, tpot_slo):  # noqa: F811
    return _m_goodput(requests, lambda r: sol.meets_slo(r, ttft_slo, tpot_slo),
                    duration_of=lambda rs: max(r.arrival for r in rs) - min(r.arrival for r in rs))


@mutant(check="goodput", message="measures the run to the last token, not to the last finish")
def goodput(requests, ttft_slo, tpot_slo):  # noqa: F811
    return _m_goodput(requests, lambda r: sol.meets_slo(r, ttft_slo, tpot_slo),
                      duration_of=lambda rs: max(r.token_times[-1] for r in rs) - min(r.arrival for r in rs))


# -- 5.1 open and closed loop ------------------------------------------------------------------

def _m_client(plan, service_s, closed_loop, queue=True, send_at_finish=False, measured="send",
              check_lengths=True, check_order=True):
    if check_lengths and len(plan) != len(service_s):
        raise ValueError("lengths differ")
    if check_order and any(b < a for a, b in zip(plan, plan[1:])):
        raise ValueError("plan decreases")
    send, finish, prev = [], [], -math.inf
    for i, (p, work) in enumerate(zip(plan, service_s)):
        if closed_loop:
            sent = prev if send_at_finish and i > 0 else max(p, prev)
        else:
            sent = p
        prev = (max(sent, prev) if queue else sent) + work
        send.append(sent)
        finish.append(prev)
    logged = {"send": [f - s for s, f in zip(send, finish)], "plan": [f - p for p, f in zip(plan, finish)],
              "service": list(service_s)}[measured]
    return {"send": send, "finish": finish, "measured": logged, "from_plan": [f - p for p, f in zip(plan, finish)]}


@mutant(check="client_latencies", message="measures the closed loop's latency from the plan")
def client_latencies(plan, service_s, closed_loop):
    return _m_client(plan, service_s, closed_loop, measured="plan" if closed_loop else "send")


@mutant(check="client_latencies", message="sends the closed loop's next request at the previous finish")
def client_latencies(plan, service_s, closed_loop):  # noqa: F811
    return _m_client(plan, service_s, closed_loop, send_at_finish=True)


@mutant(check="client_latencies", message="as if the server had no queue")
def client_latencies(plan, service_s, closed_loop):  # noqa: F811
    return _m_client(plan, service_s, closed_loop, queue=False)


@mutant(check="client_latencies", message="logs the service time as the measured latency")
def client_latencies(plan, service_s, closed_loop):  # noqa: F811
    return _m_client(plan, service_s, closed_loop, measured="service")


@mutant(check="client_latencies", message="instead of raising ValueError")
def client_latencies(plan, service_s, closed_loop):  # noqa: F811 - zip drops the unmatched plan entries
    return _m_client(plan, service_s, closed_loop, check_lengths=False)


@mutant(check="client_latencies", message="instead of raising ValueError")
def client_latencies(plan, service_s, closed_loop):  # noqa: F811
    return _m_client(plan, service_s, closed_loop, check_order=False)


# ---------------------------------------------------------------- malformed return values

@mutant(check="latency_summary", message="expected a dict keyed by str ('count', 'mean', 'p50', ...), got keys of types int and str")
def latency_summary(requests, percentiles=sol.PERCENTILES):  # noqa: F811
    out = sol.latency_summary(requests, percentiles)
    for row in out.values():
        if row is not None:
            for q in percentiles:  # each percentile keyed by the number itself: row[50], not row["p50"]
                row[q] = row.pop(f"p{q:g}")
    return out
