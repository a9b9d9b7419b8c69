"""Lesson 05 questions: TTFT, TPOT and ITL of one request, percentiles, SLO attainment and goodput."""
from __future__ import annotations

import math

from .pools import pick
from .question import Numeric, Open, fmt, template

STEM = "l05_latency_metrics"


def evenly(ref, arrival: float, first: float, finish: float, n: int, scheduled: float | None = None):
    """A request whose n tokens come evenly from `first` to `finish` (seconds)."""
    times = [first + i * (finish - first) / (n - 1) for i in range(n)] if n > 1 else [first]
    return ref.RequestTimes(arrival=arrival, token_times=times, finish=finish, scheduled=scheduled)


@template(STEM, "TTFT")
def ttft(rng, ref):
    a = round(rng.uniform(0, 100), 3)
    queue, prefill = round(rng.uniform(0.05, 2.0), 3), round(rng.uniform(0.02, 0.8), 3)
    n, gap = rng.randrange(20, 400), rng.uniform(0.01, 0.06)
    first = round(a + queue + prefill, 3)
    r = evenly(ref, a, first, round(first + (n - 1) * gap, 3), n, scheduled=round(a + queue, 3))

    def ask(req, prompt):
        t = ref.ttft(req) * 1e3
        return Numeric(
            prompt, "ms", t,
            [f"TTFT = first token - arrival = {first:.3f} - {req.arrival:.3f} s = {fmt(t)} ms (the queue counts: the user waited through it)"],
            "The user's clock starts when the request is sent, not when the engine gets round to it.",
            rtol=0.01, mistakes={"starts the clock when the engine scheduled it": (first - req.scheduled) * 1e3})

    q = ask(r, f"A request arrives at t = {a:.3f} s, is first scheduled at {r.scheduled:.3f} s, and its first token "
               f"comes out at {first:.3f} s; {n} tokens in all. Its TTFT?")
    earlier = round(rng.uniform(0.2, 1.5), 3)
    r2 = ref.RequestTimes(arrival=round(a - earlier, 3), token_times=r.token_times, finish=r.finish, scheduled=r.scheduled)
    q.follow_ups.append(ask(r2, f"Now it had arrived {earlier * 1e3:.0f} ms earlier and waited in the queue that much longer "
                                "(same schedule and tokens): its TTFT?"))
    return q


@template(STEM, "TPOT and ITL")
def tpot(rng, ref):
    n = rng.randrange(10, 120)
    first = round(rng.uniform(0.3, 2.0), 3)
    finish = round(first + (n - 1) * rng.uniform(0.008, 0.05), 3)
    r = evenly(ref, 0.0, first, finish, n)
    t = ref.tpot(r) * 1e3
    q = Numeric(
        f"A request arrives at t = 0, its first token comes at {first:.3f} s, its last ({n} tokens in all) at "
        f"{finish:.3f} s, when it finishes. Its TPOT, as vLLM's benchmark defines it?", "ms", t,
        [f"latency = {finish:.3f} s; TTFT = {first:.3f} s", f"TPOT = (latency - TTFT) / (tokens - 1) = "
         f"({finish:.3f} - {first:.3f}) / {n - 1} = {fmt(t)} ms"],
        "TPOT is how fast the text streams once it starts: the first token's wait belongs to TTFT.",
        rtol=0.005, mistakes={"divides by the number of tokens, not the gaps": (finish - first) / n * 1e3,
                             "includes the TTFT (latency / tokens)": finish / n * 1e3})
    stall = round(rng.uniform(0.2, 1.0), 3)
    k = rng.randrange(2, n - 1)
    times = [x + (stall if i >= k else 0.0) for i, x in enumerate(r.token_times)]
    r2 = ref.RequestTimes(arrival=0.0, token_times=times, finish=times[-1])
    t2 = ref.tpot(r2) * 1e3
    q.follow_ups.append(Numeric(
        f"Now token {k + 1} comes {stall * 1e3:.0f} ms late (a stall; every later token shifts with it): the TPOT?", "ms", t2,
        [f"latency grows by {stall:.3f} s, TTFT does not: ({times[-1]:.3f} - {first:.3f}) / {n - 1} = {fmt(t2)} ms"],
        "TPOT spreads the stall over every gap (it rises by stall / (tokens - 1)), which hides how long the stream froze.",
        rtol=0.01))
    worst = max(ref.itl(r2)) * 1e3
    q.follow_ups.append(Numeric(
        "And the worst inter-token latency of that request?", "ms", worst,
        [f"ITL = each gap between successive tokens; the stalled gap is {fmt(worst)} ms"],
        "ITL percentiles show the stutter that TPOT averages away: put ITL p99 on the dashboard.", rtol=0.01,
        mistakes={"reports the TPOT": t2}))
    return q


@template(STEM, "percentile")
def percentile(rng, ref):
    n = pick(rng, [n for n in range(8, 17)])
    q_ = pick(rng, [75, 90, 95, 99])
    while ((n - 1) * q_ / 100).is_integer():
        n += 1
    values = rng.sample(range(10, 2000, 10), n)
    s = sorted(values)
    k = (n - 1) * q_ / 100

    def ask(q, prompt, wrong):
        v = ref.percentile(values, q)
        kk = (n - 1) * q / 100
        return Numeric(
            prompt, "ms", v,
            [f"sorted: {s}", f"position k = (n - 1) x q / 100 = {n - 1} x {q} / 100 = {fmt(kk)}",
             f"interpolate between s[{math.floor(kk)}] and s[{min(math.floor(kk) + 1, n - 1)}]: {fmt(v)} ms"],
            "State the percentile method and the sample size: with few samples p99 is nearly the maximum.",
            rtol=0.001, mistakes=wrong)

    q = ask(q_, f"{n} TTFT samples in ms: {values}. Their p{q_}, by linear interpolation (numpy's default)?",
            {"takes the next sample up (nearest rank)": s[math.ceil(k)], "takes the sample below": s[math.floor(k)],
             "interpolates without sorting first": values[math.floor(k)] + (k - math.floor(k)) * (values[math.floor(k) + 1] - values[math.floor(k)])})
    q.follow_ups.append(ask(50, "And their p50?", {"takes the mean": sum(values) / n}))
    return q


def fleet(rng, ref):
    """6-10 requests (arrival, first token, finish, tokens; seconds, 3 decimals) and SLOs none of them sits on;
    at least one request meets both SLOs and at least one misses exactly one."""
    while True:
        reqs, ttft_slo, tpot_slo = _fleet(rng, ref)
        ok = [(ref.ttft(r) <= ttft_slo) + (ref.tpot(r) <= tpot_slo) for r in reqs]
        if 2 in ok and 1 in ok:
            return reqs, ttft_slo, tpot_slo


def _fleet(rng, ref):
    ttft_slo, tpot_slo = pick(rng, [0.5, 0.8, 1.0, 2.0]), pick(rng, [0.03, 0.05, 0.08])
    reqs, a = [], 0.0
    for _ in range(rng.randrange(6, 11)):
        a = round(a + rng.uniform(0.05, 0.8), 3)
        t = ttft_slo * pick(rng, [rng.uniform(0.2, 0.9), rng.uniform(1.1, 3.0)])
        p = tpot_slo * pick(rng, [rng.uniform(0.3, 0.9), rng.uniform(1.1, 2.0)])
        n = rng.randrange(2, 200)
        first = round(a + t, 3)
        reqs.append(evenly(ref, a, first, round(first + (n - 1) * p, 3), n))
    return reqs, ttft_slo, tpot_slo


def fleet_text(reqs) -> str:
    return "\n".join(f"  #{i + 1}: arrival {r.arrival:.3f} s, first token {r.token_times[0]:.3f} s, finish "
                     f"{r.finish:.3f} s, {r.output_tokens} tokens" for i, r in enumerate(reqs))


def judged(ref, reqs, ttft_slo, tpot_slo) -> str:
    return "; ".join(f"#{i + 1} TTFT {ref.ttft(r) * 1e3:.0f} ms, TPOT {ref.tpot(r) * 1e3:.1f} ms "
                     f"{'meets both' if ref.meets_slo(r, ttft_slo, tpot_slo) else 'misses'}" for i, r in enumerate(reqs))


@template(STEM, "goodput")
def goodput(rng, ref):
    reqs, ttft_slo, tpot_slo = fleet(rng, ref)

    def ask(tp, prompt):
        g = ref.goodput(reqs, ttft_slo, tp)
        either = sum(ref.ttft(r) <= ttft_slo or ref.tpot(r) <= tp for r in reqs)
        return Numeric(
            prompt, "requests/s", g["goodput_rps"],
            [judged(ref, reqs, ttft_slo, tp), f"met both: {g['met']} of {g['requests']}",
             f"run: first arrival to last finish = {fmt(g['duration_s'])} s",
             f"goodput = {g['met']} / {fmt(g['duration_s'])} = {fmt(g['goodput_rps'])} requests/s"],
            "Goodput counts only requests served well on both latencies; throughput counts everything.",
            mistakes={"counts every request (throughput, not goodput)": g["request_rps"],
                      "counts requests meeting either SLO": either / g["duration_s"]})

    q = ask(tpot_slo, f"SLOs: TTFT <= {ttft_slo * 1e3:.0f} ms and TPOT <= {tpot_slo * 1e3:.0f} ms. A run's requests:\n"
                      f"{fleet_text(reqs)}\nIts goodput (DistServe's definition)?")
    tighter = round(tpot_slo * 0.6, 3)
    q.follow_ups.append(ask(tighter, f"Now the TPOT SLO tightens to {tighter * 1e3:.0f} ms: the goodput?"))
    return q


@template(STEM, "SLO attainment")
def attainment(rng, ref):
    reqs, ttft_slo, tpot_slo = fleet(rng, ref)

    def ask(ts, prompt):
        g = ref.goodput(reqs, ts, tpot_slo)
        return Numeric(
            prompt, "%", 100 * g["attainment"],
            [judged(ref, reqs, ts, tpot_slo), f"attainment = {g['met']} / {g['requests']} = {fmt(100 * g['attainment'])}%"],
            "A request is served well only if it meets every SLO; attainment is the share that does.",
            mistakes={"judges TTFT only": 100 * sum(ref.ttft(r) <= ts for r in reqs) / len(reqs),
                      "judges TPOT only": 100 * sum(ref.tpot(r) <= tpot_slo for r in reqs) / len(reqs)})

    q = ask(ttft_slo, f"SLOs: TTFT <= {ttft_slo * 1e3:.0f} ms and TPOT <= {tpot_slo * 1e3:.0f} ms. Requests:\n"
                      f"{fleet_text(reqs)}\nWhat share of them meets the SLOs?")
    q.follow_ups.append(ask(2 * ttft_slo, f"Now the TTFT SLO is relaxed to {2 * ttft_slo * 1e3:.0f} ms: the share?"))
    return q


# vLLM's TTFT histogram bounds from 40 ms to 1 s (vllm/v1/metrics/loggers.py, v0.11+), seconds
TTFT_BOUNDS = [0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0]


def _histogram_quantile(q: float, bounds: list[float], counts: list[int]) -> float:
    """Prometheus' histogram_quantile on cumulative counts per bound (all values under the last bound here)."""
    rank = q * counts[-1]
    k = next(i for i, c in enumerate(counts) if c >= rank)
    lo, below = (0.0, 0) if k == 0 else (bounds[k - 1], counts[k - 1])
    return lo + (bounds[k] - lo) * (rank - below) / (counts[k] - below)


@template(STEM, "server histogram quantile")
def histogram_quantile(rng, ref):
    per_bucket = [0, rng.randint(10, 60), rng.randint(100, 400), rng.randint(200, 600), rng.randint(50, 300),
                  rng.randint(5, 40), rng.randint(1, 10), rng.randint(0, 5)]
    counts = [sum(per_bucket[:i + 1]) for i in range(len(per_bucket))]
    shown = ", ".join(f'le="{b:g}": {c}' for b, c in zip(TTFT_BOUNDS, counts))

    def ask(q, prompt):
        v = _histogram_quantile(q, TTFT_BOUNDS, counts)
        k = next(i for i, c in enumerate(counts) if c >= q * counts[-1])
        lo = 0.0 if k == 0 else TTFT_BOUNDS[k - 1]
        return Numeric(
            prompt, "ms", v * 1e3,
            [f"rank = {q:g} x {counts[-1]} requests = {fmt(q * counts[-1])}",
             f"it falls in the bucket ({lo:g} s, {TTFT_BOUNDS[k]:g} s]: {counts[k - 1] if k else 0} below it, "
             f"{counts[k]} up to its top",
             f"linear inside it: {lo:g} + ({TTFT_BOUNDS[k]:g} - {lo:g}) x ({fmt(q * counts[-1])} - "
             f"{counts[k - 1] if k else 0}) / {counts[k] - (counts[k - 1] if k else 0)} = {fmt(v * 1e3)} ms"],
            "A histogram keeps counts per bucket, so its quantile is an interpolation whose error is the bucket's width.",
            mistakes={"returns the bucket's upper bound (no interpolation inside it)": TTFT_BOUNDS[k] * 1e3,
                      "returns the bucket's lower bound": lo * 1e3})

    q = ask(0.99, "A vLLM server's /metrics shows the cumulative TTFT histogram vllm:time_to_first_token_seconds "
                  f"(bounds in seconds, all of its {counts[-1]} requests under 1 s): {shown}. What does Prometheus' "
                  "histogram_quantile(0.99, ...) return?")
    q.follow_ups.append(ask(0.5, "And histogram_quantile(0.5, ...), the median?"))
    q.follow_ups[0].why = ("Neither number is a measured TTFT, and both leave out what the client adds: the network, "
                           "the streaming, the client itself.")
    return q


@template(STEM, "explain the dashboard")
def explain(rng, ref):
    return Open(
        "The fleet dashboard shows one number, output tokens per second, and a new scheduler raised it by a third. Why "
        "can users be worse off, and what would you put on the dashboard instead?",
        ["tokens/s measures work done; letting queues grow raises it (bigger batches) while users wait longer",
         "TTFT measured from arrival, queue included, at p50 and p99",
         "TPOT (or ITL) at p50 and p99: how fast the text streams, and its stutters",
         "percentiles over a time window with the sample count shown, not means",
         "goodput: requests per second meeting both the TTFT and the TPOT SLO, plus attainment (the share that does)",
         "tokens/s stays, as a cost or efficiency number beside them"],
        "Measure what each user waits for, at the tail, and count only the requests served within both promises.")
