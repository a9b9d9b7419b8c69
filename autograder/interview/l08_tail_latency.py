"""Lesson 08 questions: the ITL tail a host pause makes, a request's queue, prefill-stall and preempted time
from a step log, the fan-out of a slow server, the straggler replica, a prefix-cache collapse, and the order of
suspects."""
from __future__ import annotations

from .pools import pick
from .question import Numeric, Open, fmt, template

STEM = "l08_tail_latency"


def stream(d: float, pause: float, every: int, n: int) -> dict:
    """One stream's request record: a token every decode step of d s, the host pausing `pause` s before
    every `every`-th step."""
    t, times = 0.0, []
    for i in range(1, n + 1):
        t += d + (pause if i % every == 0 else 0.0)
        times.append(t)
    return {"arrival": 0.0, "first_scheduled": 0.0, "token_times": times, "finish": times[-1]}


@template(STEM, "ITL p99 under host pauses")
def host_pause(rng, ref):
    d = pick(rng, [5, 6, 7, 8, 10]) * 1e-3
    pause = rng.randrange(40, 301, 10) * 1e-3
    every, n = pick(rng, [10, 20, 25, 40, 50]), 2000

    def ask(k, prompt):
        got = ref.tail_summary([stream(d, pause, k, n)], 99)["itl"]
        share = 1 / k
        return Numeric(
            prompt, "ms", got[1] * 1e3,
            [f"one gap in {k} holds a pause: {share:.1%} of the gaps are {fmt((d + pause) * 1e3)} ms, the rest {fmt(d * 1e3)} ms",
             f"p99 sits in the slowest 1%: {'inside' if share > 0.01 else 'below'} the paused gaps -> {fmt(got[1] * 1e3)} ms"],
            "A stall that hits fewer than 1% of the gaps is invisible at p99 and shows at p99.9: pick the percentile "
            "that matches how often users meet it.",
            rtol=0.01, mistakes={"averages the pause over all steps": (d + pause / k) * 1e3,
                                 "reports the median": got[0] * 1e3})

    q = ask(every, f"A stream gets a token every decode step of {fmt(d * 1e3)} ms, but before every {every}th step the "
                   f"host stalls {fmt(pause * 1e3)} ms (a GC pause). Over {n:,} tokens, what is the stream's p99 ITL?")
    q.follow_ups.append(ask(250, "Now the pause comes before every 250th step instead: the p99 ITL?"))
    return q


def log_text(steps: list[dict]) -> str:
    return "; ".join(f"[{fmt(s['start'] * 1e3)}, {fmt(s['end'] * 1e3)}] ms with {s['prefill_tokens']} prompt + "
                     f"{s['decode_tokens']} decode tokens" for s in steps)


def draw(rng) -> dict:
    return {"d": pick(rng, [5, 6, 8]) * 1e-3, "gap": rng.randrange(20, 121, 10) * 1e-3,
            "long": pick(rng, [2, 3, 4]), "sat_out": rng.randrange(2, 6)}


def scenario(p: dict):
    """A small step log: a request arrives during a step, waits through a host gap, prefills, decodes through
    a step carrying another request's long prompt (p["long"] decode steps long), is evicted for p["sat_out"]
    steps, then recomputes. Returns (request, steps)."""
    d, t, steps = p["d"], 0.0, []

    def add(dur, pre, dec):
        nonlocal t
        steps.append({"start": t, "end": t + dur, "prefill_tokens": pre, "decode_tokens": dec})
        t += dur

    add(d, 0, 8)
    t += p["gap"]  # host gap before the next step
    add(d * 1.5, 200, 8)  # the request's own prefill: first token at its end
    add(d, 0, 9)  # token 2
    add(d * p["long"], 1500, 9)  # another request's long prompt rides along: token 3
    for _ in range(p["sat_out"]):
        add(d, 0, 8)  # evicted: these steps run without it
    add(d * 1.5, 230, 8)  # recompute: token 4 at its end
    add(d, 0, 9)  # token 5
    times = [steps[1]["end"], steps[2]["end"], steps[3]["end"], steps[-2]["end"], steps[-1]["end"]]
    return {"arrival": d / 2, "first_scheduled": steps[1]["start"], "token_times": times, "finish": times[-1]}, steps


def attribution_question(p, ref, key, what, mistakes_of, why):
    req, steps = scenario(p)
    a = ref.attribute_request(req, steps)
    prompt = (f"Step log of one replica: {log_text(steps)}. A request arrives at {fmt(req['arrival'] * 1e3)} ms, is first "
              f"scheduled at {fmt(req['first_scheduled'] * 1e3)} ms, and its tokens come at "
              f"{', '.join(fmt(x * 1e3) for x in req['token_times'])} ms. {what}")
    steps_text = [f"host gap {fmt(a['host_gap_s'] * 1e3)} ms between the first two steps",
                  f"queue = first scheduled - arrival - host gap = {fmt(a['queue_s'] * 1e3)} ms",
                  f"decode-only steps take {fmt(p['d'] * 1e3)} ms (the base); prompt-carrying token steps beyond it: "
                  f"{fmt(a['prefill_stall_s'] * 1e3)} ms", f"steps ending strictly between two tokens: {p['sat_out']}, "
                  f"{fmt(a['preempted_s'] * 1e3)} ms preempted"]
    return Numeric(prompt, "ms", a[key] * 1e3, steps_text, why, rtol=0.01,
                   mistakes={k: v * 1e3 for k, v in mistakes_of(req, steps, a).items() if v is not None}), req, steps


@template(STEM, "queue time from a step log")
def queue_time(rng, ref):
    p = draw(rng)
    q, req, steps = attribution_question(
        p, ref, "queue_s", "How long did it queue (excluding host gaps)?",
        lambda req, steps, a: {"leaves the host gap in the queue": req["first_scheduled"] - req["arrival"],
                               "measures to the first token": req["token_times"][0] - req["arrival"]},
        "Time between steps is the host's, not the scheduler's: count it once, as host time.")
    a = ref.attribute_request(req, steps)
    q.follow_ups.append(Numeric("And its host-gap time?", "ms", a["host_gap_s"] * 1e3,
                                [f"the idle time between steps inside [arrival, finish]: {fmt(a['host_gap_s'] * 1e3)} ms"],
                                "On a healthy engine there is none while work is pending.", rtol=0.01,
                                mistakes={"adds the queue to it": (a["host_gap_s"] + a["queue_s"]) * 1e3}))
    return q


@template(STEM, "prefill stall from a step log")
def prefill_stall(rng, ref):
    p = draw(rng)

    def whole(req, steps, a):
        return {"counts whole prompt-carrying steps": sum(s["end"] - s["start"] for s in steps
                                                          if s["end"] in req["token_times"][1:] and s["prefill_tokens"])}

    q, _, _ = attribution_question(
        p, ref, "prefill_stall_s",
        "How much of its decode time was stall behind prompt tokens (beyond a decode-only step, after its first token)?",
        whole, "A step with a long prompt in it costs every decoding stream the difference, once per such step.")
    capped = {**p, "long": 2}
    f, _, _ = attribution_question(capped, ref, "prefill_stall_s",
                                   "Chunked prefill now caps the long prompt's step at two decode steps (the rest of the "
                                   "log unchanged but shifted). The stall?", whole,
                                   "Chunking bounds every step, so it bounds every stall.")
    q.follow_ups.append(f)
    return q


@template(STEM, "preempted time from a step log")
def preempted(rng, ref):
    p = draw(rng)
    q, req, steps = attribution_question(
        p, ref, "preempted_s", "How much time did it spend evicted (steps it sat out between two of its tokens)?",
        lambda req, steps, a: {"also counts the step that produced the token": a["preempted_s"] + steps[-2]["end"] - steps[-2]["start"],
                               "counts only one step": steps[4]["end"] - steps[4]["start"]},
        "A decoding request gets a token every step it is in: a step without its token is a step it was evicted from.")
    n = len([s for s in steps if req["token_times"][2] < s["end"] < req["token_times"][3]])
    q.follow_ups.append(Numeric("How many steps did it sit out?", "", float(n),
                                [f"steps ending strictly between its 3rd and 4th token: {n}"],
                                "Count steps, then price them.", rtol=0, mistakes={"counts the recompute step too": n + 1.0}))
    return q


@template(STEM, "fan-out tail")
def fanout(rng, ref):
    p = pick(rng, [0.01, 0.005, 0.02, 0.001])
    n = pick(rng, [10, 20, 50, 100, 200])

    def ask(k, prompt):
        f = ref.fanout_slow_fraction(p, k) * 100
        return Numeric(prompt, "%", f, [f"1 - (1 - {p:g})^{k} = {fmt(f)}%"],
                       "Fan-out turns a rare per-server tail into the common case (Dean and Barroso, The Tail at Scale).",
                       rtol=0.01, mistakes={"multiplies p by the fan-out": min(100.0, p * k * 100) if p * k < 1 else None,
                                            "reports one server's chance": p * 100})

    q = ask(n, f"Each server is slow on {p:.1%} of requests, independently. A request fans out to {n} servers and waits "
               "for all of them. On what percentage of requests is it slow?")
    q.follow_ups.append(ask(2 * n, f"And with {2 * n} servers?"))
    return q


@template(STEM, "straggler replica")
def straggler(rng, ref):
    k = rng.randrange(3, 6)
    lats = [[round(rng.uniform(0.9, 1.1), 2) for _ in range(5)] for _ in range(k)]
    slow = rng.randrange(k)
    lats[slow] = [round(x * rng.uniform(1.8, 2.5), 2) for x in lats[slow]]
    spike = (slow + 1) % k
    lats[spike][0] = round(rng.uniform(30, 60), 1)  # one pathological request on a healthy replica
    means = [[sum(x) / len(x)] for x in lats]
    ans = ref.straggler_replica(lats, 1.5)
    q = Numeric(f"Per-token latencies (s) of requests on {k} replicas: "
                + "; ".join(f"replica {i}: {x}" for i, x in enumerate(lats))
                + ". Which replica (index) is the straggler, more than 1.5x the others' median?", "", float(ans),
                [f"medians: {', '.join(fmt(sorted(x)[2]) for x in lats)}", f"replica {ans} is the one far above the rest"],
                "Medians: one pathological request must not condemn a healthy replica.", rtol=0,
                mistakes={"compares means (the outlier wins)": ref.straggler_replica(means, 1.5)})
    strict = ref.straggler_replica(lats, 3.0)
    q.follow_ups.append(Numeric("With a threshold of 3x instead of 1.5x, which replica is the straggler (-1 for none)?",
                                "", -1.0 if strict is None else float(strict),
                                ["the same medians against 3x the others' median"],
                                "The threshold is a choice: compare with how much slower a bad node usually is.", rtol=0,
                                mistakes={"keeps the answer for 1.5x": float(ans)}))
    return q


@template(STEM, "prefix-cache collapse")
def prefix_collapse(rng, ref):
    prompt = pick(rng, [1500, 2000, 3000, 4000])
    variable = pick(rng, [100, 200, 250, 400])
    shared = prompt - variable

    q = Numeric(
        f"Prompts are a {shared:,}-token shared template followed by {variable} tokens of each user's text; the prefix "
        "cache serves the template. A new release moves the user's text to the front of the prompt. By what factor do "
        "the prefill tokens per request grow (x)?", "x", prompt / variable,
        [f"before: the cache matches the {shared:,}-token template, {variable} tokens to prefill",
         f"after: the cache matches from the first token, and the first token now differs: all {prompt:,} tokens",
         f"{prompt:,} / {variable} = {fmt(prompt / variable)}x"],
        "A prefix cache matches from the front: put what is shared first, what varies last. Check the hit-rate metric "
        "next to the deploy log.", rtol=0.01,
        mistakes={"counts the shared part instead of the whole prompt": shared / variable,
                  "gives the share of the prompt that was cached": shared / prompt})
    hit = pick(rng, [0.5, 0.7, 0.8])
    eff = prompt - hit * shared
    q.follow_ups.append(Numeric(
        f"The fix restores the order, but only {hit:.0%} of requests find the template cached (the rest land on a "
        "replica that evicted it). Mean prefill tokens per request?", "tokens", eff,
        [f"{hit:g} x {variable} + {1 - hit:g} x {prompt:,} = {fmt(eff)}"],
        "Hit rate is per replica: prefix-aware routing keeps it high.", rtol=0.01,
        mistakes={"assumes every request hits": float(variable)}))
    return q


@template(STEM, "the order of suspects")
def order(rng, ref):
    return Open(
        "p50 latency is flat but p99 doubled since yesterday. How do you find the cause, and in what order do you check "
        "the suspects?",
        ["ask what changed first: a deploy, a config flag, a prompt template, the traffic mix (the change log is the "
         "cheapest evidence)",
         "split the tail by metric: TTFT, ITL and end-to-end break for different reasons",
         "split by replica next: one slow replica is the textbook flat p50 and broken p99 of a fleet, and a "
         "group-by is cheap; drain it and check clocks, ECC, thermals (unless its own requests were preempted)",
         "then queueing under a burst (queue depth, arrival rate); with preemptions a long queue is a KV symptom",
         "then prefill interference: long prompts in steps with decodes (chunked prefill, a smaller budget)",
         "then KV exhaustion: preemption counter and KV usage",
         "then host stalls: gaps between steps (GC, tokenization on the loop, CPU contention)",
         "know the quieter ones: a prefix-cache hit rate that collapsed after a template change (TTFT), decode "
         "batches above the largest captured CUDA graph running eager (ITL)",
         "compare with a healthy baseline, fix the first cause and measure again: causes stack"],
        "The order is cost times likelihood: what changed, then the per-replica split, then the engine's suspects.")
