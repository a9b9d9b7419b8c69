"""Lesson 10 questions: KPA replica counts, panic mode, the utilization scaler, headroom from boot time."""
from __future__ import annotations

from .question import Numeric, Open, fmt, template

STEM = "l10_autoscaling"


def _decide(ref, conc: list[float], ready: int, cfg):
    """The KPA's decision after one sample per 2 s tick of `conc` (the last at now)."""
    samples = [(2.0 * (i + 1), float(c)) for i, c in enumerate(conc)]
    return ref.kpa_decide(samples, samples[-1][0], ready, cfg, ref.KPAState())[0]


@template(STEM, "KPA steady state")
def steady(rng, ref):
    target = rng.choice([8, 16, 32, 64])
    util = rng.choice([0.5, 0.6, 0.7, 0.8])
    conc = round(rng.uniform(3, 12) * target, 0)
    cfg = ref.KPAConfig(target=float(target), utilization=util)
    want = _decide(ref, [conc] * 30, max(1, int(conc // (target * util))), cfg)
    q = Numeric(
        f"A KPA-scaled LLM service: target concurrency {target} per replica, target utilization {util:.0%}. Over the "
        f"last minute the fleet held {fmt(conc)} requests in flight on average (queued ones included), steadily. "
        "How many replicas does the autoscaler want?", "", want,
        [f"per replica: {target} x {util:.0%} = {fmt(target * util)} concurrent requests",
         f"{fmt(conc)} / {fmt(target * util)} = {fmt(conc / (target * util))} -> round up: {want}"],
        "Utilization below 100% is the headroom: the replicas run fuller than the target only during a burst.",
        rtol=0, mistakes={"divides by the target alone": ref.ceil_count(conc / target),
                          "rounds down": int(conc / (target * util))})
    low = round(util - 0.2, 1)
    more = _decide(ref, [conc] * 30, want, cfg._replace(utilization=low))
    q.follow_ups.append(Numeric(
        f"Replicas take a minute to boot and bursts keep catching you out, so you lower the target utilization to "
        f"{low:.0%}. Same load: how many replicas now?", "", more,
        [f"{fmt(conc)} / ({target} x {low:.0%}) = {fmt(conc / (target * low))} -> {more}"],
        "Headroom is bought with replicas that idle between bursts: that is the price of the boot time.", rtol=0))
    return q


@template(STEM, "panic mode")
def panic(rng, ref):
    target = rng.choice([8, 16])
    ready = rng.randint(2, 6)
    per = target * 0.7
    base = round(ready * per * rng.uniform(0.7, 0.95), 0)
    burst = max(round(base * rng.uniform(2.6, 4.0), 0), float(int(2 * ready * per) + 1))  # over the 2x threshold
    cfg = ref.KPAConfig(target=float(target))
    want = _decide(ref, [base] * 27 + [burst] * 3, ready, cfg)
    stable_only = ref.ceil_count((base * 27 + burst * 3) / 30 / (target * 0.7))
    q = Numeric(
        f"KPA with Knative's defaults (70% target utilization, 60 s stable window, panic window 10% of it, panic "
        f"threshold 200%, 2 s ticks), target {target} concurrent requests per replica, {ready} replicas ready. "
        f"Concurrency sat at {fmt(base)} for 54 s, then jumped to {fmt(burst)} for the last 6 s. How many replicas "
        "does it want now?", "", want,
        [f"per replica {target} x 0.7 = {fmt(target * 0.7)}",
         f"panic window (6 s): {fmt(burst)} / {fmt(target * 0.7)} = {fmt(burst / (target * 0.7))} -> round up: "
         f"{ref.ceil_count(burst / (target * 0.7))} replicas, "
         f"{fmt(ref.ceil_count(burst / (target * 0.7)) / ready)}x the {ready} ready >= 2x: panic (Knative rounds "
         "up before comparing)",
         f"in panic the count is the larger of the two windows' wants: {want}"],
        "The stable window would still be averaging the old load; the panic window sees the burst in seconds.",
        rtol=0, mistakes={"uses the stable window only": stable_only})
    samples = [(2.0 * (i + 1), c) for i, c in enumerate([base] * 27 + [burst] * 3 + [base] * 10)]
    state, out = ref.KPAState(), None
    for k in range(len(samples)):
        out, state = ref.kpa_decide(samples[:k + 1], samples[k][0], want if k >= 30 else ready, cfg, state)
    q.follow_ups.append(Numeric(
        f"The burst ends as fast as it came: concurrency is back at {fmt(base)} for the next 20 s, and the {want} "
        "replicas are up. How many does the autoscaler want at the end of those 20 s?", "", out,
        ["still in panic mode: it lasts until a whole stable window (60 s) passes without the panic signal",
         f"panic mode never scales down: it keeps the {want} it wanted"],
        "Panic mode holds its peak so that a second wave does not find the fleet shrunk.", rtol=0,
        mistakes={"follows the panic window down": ref.ceil_count(base / (target * 0.7))}))
    just = round(per * rng.uniform(1.05, 1.4), 1)
    ratio = ref.ceil_count(just / per) / 1
    q.follow_ups.append(Numeric(
        f"Another service, same settings, one replica ready. The 6 s panic window averages {fmt(just)} requests in "
        "flight. What ratio does the KPA compare with the 200% panic threshold (as a multiple, e.g. 2 for 200%)?",
        "x", ratio,
        [f"{fmt(just)} / {fmt(per)} = {fmt(just / per)} -> round up: {ref.ceil_count(just / per)} replicas",
         f"{ref.ceil_count(just / per)} / 1 ready = {fmt(ratio)} >= 2: panic (Knative v1.23, "
         "pkg/autoscaler/scaling/autoscaler.go rounds up before dividing)"],
        "With one replica, anything over one replica's load is already 'twice what serves' once rounded up.",
        rtol=0, mistakes={"compares the unrounded panic / per": just / per}))
    return q


@template(STEM, "utilization scaler")
def utilization(rng, ref):
    replicas = rng.randint(3, 12)
    target = rng.choice([0.6, 0.7, 0.8])
    cfg = ref.UtilConfig(target=target)
    want = ref.utilization_decide([(2.0, 1.0)], 2.0, replicas, cfg)
    q = Numeric(
        f"A fleet of {replicas} LLM replicas scales like Kubernetes' HPA on GPU utilization, target {target:.0%} "
        "(10% tolerance). Every replica runs continuous batching and holds at least one request at all times, "
        "so NVML reports 100% everywhere. How many replicas does it want after one decision?", "", want,
        [f"ratio = 100% / {target:.0%} = {fmt(1 / target)}", f"ceil({replicas} x {fmt(1 / target)}) = {want}"],
        "A replica with one request reads 100% like one with a full batch: the scaler multiplies the fleet every "
        "decision and never learns how much load there is.", rtol=0,
        mistakes={"inverts the ratio": ref.ceil_count(replicas * target)})
    again = ref.utilization_decide([(2.0, 1.0)], 2.0, want, cfg)
    q.follow_ups.append(Numeric(
        "The load has not changed; the new replicas each got a request, and utilization still reads 100%. The next "
        "decision?", "", again, [f"ceil({want} x {fmt(1 / target)}) = {again}"],
        "It keeps multiplying until max_replicas: the bill grows while the load stays the same.", rtol=0))
    return q


@template(STEM, "headroom from boot time")
def headroom(rng, ref):
    slope = round(rng.uniform(0.05, 0.5), 2)
    boot = rng.choice([45.0, 60.0, 90.0, 120.0])
    service = round(rng.uniform(1.0, 6.0), 1)
    per = rng.choice([5.6, 11.2, 22.4])
    h = ref.min_headroom(slope, boot, service, per)
    q = Numeric(
        f"Traffic ramps by {slope} requests/s every second; each request stays {service} s in the system; a replica "
        f"boots in {boot:.0f} s. The autoscaler decides every 2 s on a 6 s panic window. By how many concurrent "
        "requests does the load grow between the moment the autoscaler could notice the ramp and the moment a "
        "replica it orders then can serve?", "requests", h["concurrency"],
        [f"lead = 2 s tick + 6/2 s window lag + {boot:.0f} s boot = {fmt(h['lead_s'])} s",
         f"extra rate = {slope} x {fmt(h['lead_s'])} = {fmt(slope * h['lead_s'])} requests/s",
         f"Little's law: x {service} s in the system = {fmt(h['concurrency'])} concurrent requests"],
        "Whatever arrives while a replica boots must fit in capacity you already pay for.", rtol=0.02,
        mistakes={"forgets the boot time": slope * 5.0 * service,
                  "adds requests/s, not concurrency (Little's law)": slope * h["lead_s"],
                  "forgets the window's lag": slope * (2.0 + boot) * service})
    q.follow_ups.append(Numeric(
        f"A replica carries {per} concurrent requests at its target. How many replicas of headroom must already run?",
        "replicas", h["replicas"], [f"{fmt(h['concurrency'])} / {per} -> round up: {h['replicas']}"],
        "Round up: a fraction of a replica is a whole GPU.", rtol=0))
    fast = ref.min_headroom(slope, boot / 4, service, per)
    q.follow_ups.append(Numeric(
        f"You cut the boot to {boot / 4:.0f} s (weights cached on local disk, a warm engine image). Headroom in "
        "replicas now?", "replicas", fast["replicas"],
        [f"lead = 2 + 3 + {boot / 4:.0f} = {fmt(fast['lead_s'])} s", f"{slope} x {fmt(fast['lead_s'])} x {service} = "
         f"{fmt(fast['concurrency'])} -> {fast['replicas']}"],
        "A faster boot is headroom you no longer pay for all day.", rtol=0))
    return q


@template(STEM, "node provisioning and warm pools")
def nodes(rng, ref):
    slope = round(rng.uniform(0.05, 0.3), 2)
    boot = rng.choice([45.0, 60.0, 90.0])
    node = rng.choice([180.0, 300.0])
    service = round(rng.uniform(1.0, 4.0), 1)
    per = rng.choice([5.6, 11.2])
    cold = ref.min_headroom(slope, node + boot, service, per)
    warm = ref.min_headroom(slope, boot, service, per)
    q = Numeric(
        f"Your cluster has no free GPU node: a new replica waits {node / 60:.0f} min for the node autoscaler to "
        f"provision one (VM boot, driver, image pull), then boots in {boot:.0f} s. Traffic ramps by {slope} "
        f"requests/s every second, each request stays {service} s, a replica carries {per} at its target, and "
        "the autoscaler decides every 2 s on a 6 s window. How many replicas of headroom must already run?",
        "replicas", cold["replicas"],
        [f"lead = 2 + 3 + {node:.0f} + {boot:.0f} = {fmt(cold['lead_s'])} s",
         f"{slope} x {fmt(cold['lead_s'])} x {service} = {fmt(cold['concurrency'])} concurrent requests",
         f"/ {per} -> round up: {cold['replicas']}"],
        "The node's minutes count as boot time: the headroom grows with the whole wait, not just the engine's.",
        rtol=0, mistakes={"forgets the node provisioning": warm["replicas"]})
    q.follow_ups.append(Numeric(
        "You keep a warm pool of provisioned GPU nodes (paid for, idle) so that a new replica only boots. "
        "Headroom in replicas now?", "replicas", warm["replicas"],
        [f"lead = 2 + 3 + {boot:.0f} = {fmt(warm['lead_s'])} s", f"{slope} x {fmt(warm['lead_s'])} x {service} = "
         f"{fmt(warm['concurrency'])} -> {warm['replicas']}"],
        "A warm pool trades idle nodes for fewer idle replicas; both are GPUs you pay for.", rtol=0))
    return q


@template(STEM, "GPU-hours of a fleet")
def gpu_hours(rng, ref):
    base, peak = rng.randint(2, 6), rng.randint(8, 20)
    hours = rng.randint(2, 6)
    boot_min = rng.choice([1, 2, 5])
    sim = {"ttft": [0.1], "end": 24 * 3600.0,
           "replicas": [(0.0, 24 * 3600.0)] * base + [(3600.0 * 10, 3600.0 * (10 + hours))] * (peak - base)}
    gh = ref.fleet_report(sim, 1.0)["gpu_hours"]
    q = Numeric(
        f"A day of an LLM service: {base} replicas run all 24 h; at 10:00 the autoscaler launches {peak - base} more, "
        f"which stop {hours} h later. Each replica is one GPU, paid from launch (boot included) to stop. GPU-hours for "
        "the day?", "GPU-h", gh,
        [f"{base} x 24 = {base * 24}", f"{peak - base} x {hours} = {(peak - base) * hours}", f"sum = {fmt(gh)}"],
        "You pay for booting replicas too: every scale-up costs boot time before it serves.", rtol=0.001,
        mistakes={"provisions the peak all day": peak * 24.0})
    wasted = (peak - base) * boot_min / 60
    q.follow_ups.append(Numeric(
        f"Of those, how many GPU-hours went to booting if each new replica took {boot_min} min to become ready?",
        "GPU-h", wasted, [f"{peak - base} x {boot_min}/60 = {fmt(wasted)}"],
        "Small per day; what costs is the headroom you keep all day because boots are slow.", rtol=0.01))
    return q


@template(STEM, "design the autoscaler")
def design(rng, ref):
    return Open(
        "Your LLM fleet scales on GPU utilization at 70%. It is slow to react at lunchtime and never shrinks at "
        "night. What would you scale on instead, which numbers and timers would you set, and how do you size the "
        "headroom when a replica needs a minute to boot?",
        ["GPU utilization (NVML: any kernel running) saturates at ~100% with one request per replica under "
         "continuous batching; it cannot say how much load there is",
         "scale on concurrency (in-flight + queued) or queue depth; Little's law links it to rate x latency",
         "three numbers: target concurrency per replica (the batch a replica runs within its latency SLO) with a "
         "utilization below 100%, min replicas, max replicas",
         "two timers: a long stable window for the steady size and a short panic window for bursts (Knative: 60 s, "
         "6 s, panic at 2x), panic mode never scales down; a scale-down delay against churn",
         "headroom = ramp slope x (boot + decision lag) x time in system, kept as spare capacity or a lower target "
         "utilization; measure it against the cost-vs-SLO frontier",
         "reduce the boot time and pre-scale for known daily peaks; keep min replicas for the trough"],
        "A replica arrives a minute after you ask for it; the autoscaler's job is to ask early enough.")
