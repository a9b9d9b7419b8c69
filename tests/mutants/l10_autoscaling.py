"""Plausible wrong answers for lesson 10; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here
are prefixed `_m_`."""
import math

from solutions.l10_autoscaling import KPAConfig, KPAState, ceil_count, window_average
from tests.mutants import mutant

# -- 2.1 the KPA ------------------------------------------------------------------------------------


def _m_kpa(samples, now, ready, cfg, state, hold_panic=True, use_utilization=True, want_ceil=ceil_count,
           over_ceil=ceil_count, least_ready=1):
    per = cfg.target * (cfg.utilization if use_utilization else 1.0)
    stable = window_average(samples, now, cfg.stable_window)
    panic = window_average(samples, now, cfg.stable_window * cfg.panic_window_pct / 100)
    r = max(ready, least_ready)
    up, down = math.ceil(cfg.max_scale_up_rate * r), math.floor(r / cfg.max_scale_down_rate)
    want_stable = min(max(want_ceil(stable / per), down), up)
    want_panic = min(max(want_ceil(panic / per), down), up)
    panic_since, max_panic = state.panic_since, state.max_panic
    if over_ceil(panic / per) / r >= cfg.panic_threshold_pct / 100:
        panic_since = now
    elif panic_since is not None and panic_since + cfg.stable_window < now:
        panic_since, max_panic = None, 0
    desired = want_stable
    if panic_since is not None:
        desired = max(want_stable, want_panic, max_panic if hold_panic else 0)
        max_panic = desired
    recent = tuple((t, d) for t, d in state.recent if t > now - cfg.scale_down_delay) + ((now, desired),)
    desired = min(max(max(d for _, d in recent), cfg.min_replicas), cfg.max_replicas)
    return desired, KPAState(panic_since, max_panic, recent)


@mutant(check="kpa_decide", message="scales down while panicking")
def kpa_decide(samples, now, ready, cfg, state):
    return _m_kpa(samples, now, ready, cfg, state, hold_panic=False)  # follows the panic window down


@mutant(check="kpa_decide", message="modified its argument #1 (the samples) in place")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    while samples and samples[0][0] <= now - cfg.stable_window:  # trims the window off the caller's list
        samples.pop(0)
    return _m_kpa(samples, now, ready, cfg, state)


@mutant(check="kpa_decide", message="should return (desired, KPAState)")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa(samples, now, ready, cfg, state)[0]  # forgets the state


@mutant(check="kpa_decide", message="divides by the target alone")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa(samples, now, ready, cfg, state, use_utilization=False)  # a replica filled to 100%


@mutant(check="kpa_decide", message="rounds with math.ceil")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa(samples, now, ready, cfg, state, want_ceil=math.ceil, over_ceil=math.ceil)


@mutant(check="kpa_decide", message="rounds with math.ceil")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa(samples, now, ready, cfg, state, want_ceil=math.ceil)  # only the replicas wanted


@mutant(check="kpa_decide", message="rounds the panic test's count with math.ceil")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa(samples, now, ready, cfg, state, over_ceil=math.ceil)  # only the panic test


@mutant(check="kpa_decide", message="divides by the ready replicas with no floor of 1")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa(samples, now, ready, cfg, state, least_ready=1e-12)  # 0 ready: any load panics


# -- 2.2 the utilization scaler -----------------------------------------------------------------------

@mutant(check="utilization_decide", message="has no tolerance band")
def utilization_decide(samples, now, replicas, cfg):
    ratio = window_average(samples, now, cfg.window) / cfg.target
    return min(max(ceil_count(max(replicas, 1) * ratio), cfg.min_replicas), cfg.max_replicas)


# -- 3. the fleet -------------------------------------------------------------------------------------

@mutant(check="simulate_fleet", message="makes a new replica ready at once")
def simulate_fleet(jobs, fleet, scaler):
    return sol.simulate_fleet(jobs, fleet._replace(boot_s=0.0), scaler)  # noqa: F821 - forgets the cold start


@mutant(check="fleet_report", message="leaves dropped jobs out of the percentile")
def fleet_report(sim, ttft_slo):
    served = [x for x in sim["ttft"] if x != math.inf]
    rep = sol.fleet_report({**sim, "ttft": served}, ttft_slo)  # noqa: F821
    return {**rep, "dropped": len(sim["ttft"]) - len(served)}


# -- 4. headroom and the tuned policy -----------------------------------------------------------------

@mutant(check="min_headroom", message="forgets the boot time")
def min_headroom(slope_rps_per_s, boot_s, service_s, per_replica, tick_s=2.0, window_s=6.0):
    lead = tick_s + window_s / 2  # only the scaler's own lag
    conc = slope_rps_per_s * lead * service_s
    return {"lead_s": lead, "concurrency": conc, "replicas": ceil_count(conc / per_replica)}


@mutant(check="tuned_kpa", message="misses the SLO")
def tuned_kpa(fleet):
    return KPAConfig(target=fleet.slots, max_replicas=64)  # Knative's defaults: 70% of the slots, no delay


# -- wrong answers an earlier version of the checks missed (each once passed) ---------------------------------

def _m_kpa_edit(samples, now, ready, cfg, state, exit_keeps_max=False, exit_before_over=False,
                strict_threshold=False, up_floor=False, panic_ignores_stable=False, plain_ceil=False,
                unrounded=False, clamped=False, panic_window_s=None):
    per = cfg.target * cfg.utilization
    stable = window_average(samples, now, cfg.stable_window)
    window = cfg.stable_window * cfg.panic_window_pct / 100 if panic_window_s is None else panic_window_s
    panic = window_average(samples, now, window)
    r = max(ready, 1)
    up = (math.floor if up_floor else math.ceil)(cfg.max_scale_up_rate * r)
    down = math.floor(r / cfg.max_scale_down_rate)
    rnd = math.ceil if plain_ceil else ceil_count
    want_stable = min(max(rnd(stable / per), down), up)
    want_panic = min(max(rnd(panic / per), down), up)
    panic_since, max_panic = state.panic_since, state.max_panic
    wanted = want_panic if clamped else panic / per if unrounded else rnd(panic / per)
    ratio, threshold = wanted / r, cfg.panic_threshold_pct / 100
    over = ratio > threshold if strict_threshold else ratio >= threshold
    expired = panic_since is not None and panic_since + cfg.stable_window < now
    if exit_before_over and expired:
        panic_since, max_panic = None, 0
    if over:
        panic_since = now
    elif expired:
        panic_since = None
        max_panic = max_panic if exit_keeps_max else 0
    desired = want_stable
    if panic_since is not None:
        desired = max(want_panic, max_panic) if panic_ignores_stable else max(want_stable, want_panic, max_panic)
        max_panic = desired
    recent = tuple((t, d) for t, d in state.recent if t > now - cfg.scale_down_delay) + ((now, desired),)
    desired = min(max(max(d for _, d in recent), cfg.min_replicas), cfg.max_replicas)
    return desired, KPAState(panic_since, max_panic, recent)


@mutant(check="kpa_decide", message="keeps max_panic when it leaves panic mode")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa_edit(samples, now, ready, cfg, state, exit_keeps_max=True)


@mutant(check="kpa_decide", message="leaves panic mode before testing the threshold")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa_edit(samples, now, ready, cfg, state, exit_before_over=True)


@mutant(check="kpa_decide", message="panics only above the threshold")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa_edit(samples, now, ready, cfg, state, strict_threshold=True)


@mutant(check="kpa_decide", message="rounds max_scale_up_rate * ready down")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa_edit(samples, now, ready, cfg, state, up_floor=True)


@mutant(check="kpa_decide", message="leaves want_stable out of the panic decision")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa_edit(samples, now, ready, cfg, state, panic_ignores_stable=True)


@mutant(check="kpa_decide", message="rounds with math.ceil")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa_edit(samples, now, ready, cfg, state, plain_ceil=True)


@mutant(check="kpa_decide", message="tests the panic threshold on panic / per unrounded")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa_edit(samples, now, ready, cfg, state, unrounded=True)  # 1.5x one replica's load: no panic


@mutant(check="kpa_decide", message="tests the panic threshold on want_panic clamped to the scale-up rate")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa_edit(samples, now, ready, cfg, state, clamped=True)


@mutant(check="kpa_decide", message="averages the panic window over panic_window_pct seconds")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa_edit(samples, now, ready, cfg, state, panic_window_s=cfg.panic_window_pct)  # 10 s, not 6 s


@mutant(check="kpa_decide", message="the / 100 is missing")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    return _m_kpa_edit(samples, now, ready, cfg, state, panic_window_s=cfg.stable_window * cfg.panic_window_pct)


@mutant(check="kpa_decide", message="ZeroDivisionError")
def kpa_decide(samples, now, ready, cfg, state):  # noqa: F811
    per = cfg.target * cfg.utilization
    panic = window_average(samples, now, cfg.stable_window * cfg.panic_window_pct / 100)
    if ceil_count(panic / per) / ready >= cfg.panic_threshold_pct / 100:  # r = ready, not max(ready, 1)
        pass
    return sol.kpa_decide(samples, now, ready, cfg, state)  # noqa: F821


@mutant(check="utilization_decide", message="rounds with math.ceil")
def utilization_decide(samples, now, replicas, cfg):  # noqa: F811
    ratio = window_average(samples, now, cfg.window) / cfg.target
    desired = replicas if abs(ratio - 1) <= cfg.tolerance else math.ceil(max(replicas, 1) * ratio)
    return min(max(desired, cfg.min_replicas), cfg.max_replicas)


@mutant(check="utilization_decide", message="leaves the band open at its edge")
def utilization_decide(samples, now, replicas, cfg):  # noqa: F811
    ratio = window_average(samples, now, cfg.window) / cfg.target
    desired = replicas if abs(ratio - 1) < cfg.tolerance else ceil_count(max(replicas, 1) * ratio)
    return min(max(desired, cfg.min_replicas), cfg.max_replicas)


def _m_dispatch(t, queue, reps, jobs, slots, ttft, push):
    """_m_simulate's dispatch: the queue's head to the free replica with the fewest jobs, lowest index."""
    while queue:
        free = [r for r, rep in enumerate(reps) if rep.ready and rep.live() and rep.running < slots]
        if not free:
            return
        r, i = min(free, key=lambda r: (reps[r].running, r)), queue.popleft()
        if reps[r].running == 0:
            reps[r].busy_since = t
        reps[r].running += 1
        ttft[i] = t - jobs[i].arrival + jobs[i].prefill_s
        push(t + jobs[i].service_s, 0, r)


def _m_scale(t, desired, reps, boot_s, push):
    """_m_simulate's scaling: launch the difference, or stop booting replicas and drain the emptiest."""
    live = [r for r, rep in enumerate(reps) if rep.live()]
    for _ in range(desired - len(live)):
        reps.append(sol.Replica(t, t + boot_s))  # noqa: F821
        push(t + boot_s, 1, len(reps) - 1)
    extra = len(live) - desired
    for r in sorted((r for r in live if not reps[r].ready), key=lambda r: (-reps[r].launch, -r)):
        if extra > 0:
            reps[r].stop, extra = t, extra - 1
    for r in sorted((r for r in live if reps[r].ready), key=lambda r: (reps[r].running, -r)):
        if extra > 0:
            reps[r].draining, extra = True, extra - 1
            if reps[r].running == 0:
                reps[r].stop = t


def _m_decide(scaler, conc, util, t, ready, current, state, initial):
    """_m_simulate's scaler call: (desired, the KPA state)."""
    if type(scaler).__name__ == "KPAConfig":
        return sol.kpa_decide(conc, t, ready, scaler, state)  # noqa: F821
    if type(scaler).__name__ == "UtilConfig":
        return sol.utilization_decide(util, t, current, scaler), state  # noqa: F821
    return next((n for when, n in reversed(scaler) if when <= t), initial), state


def _m_simulate(jobs, fleet, scaler, fresh_state=False, drop_before_ready=False):
    """simulate_fleet written out again, with one slip switched on."""
    import heapq
    from collections import deque

    order = {0: 0, 2: 1, 3: 2, 1: 3, 4: 4} if drop_before_ready else {k: k for k in range(5)}
    heap, seq, reps = [], [0], [sol.Replica(0.0, 0.0) for _ in range(fleet.initial)]  # noqa: F821

    def push(t, kind, x):
        heapq.heappush(heap, (t, order[kind], seq[0], kind, x))
        seq[0] += 1

    for i, job in enumerate(jobs):
        push(job.arrival, 3, i)
        push(job.arrival + fleet.timeout_s, 2, i)
    push(fleet.tick, 4, 1)
    queue, ttft, settled, t, conc, util, timeline = deque(), [math.inf] * len(jobs), 0, 0.0, [], [], []
    state = KPAState() if fresh_state else KPAState(recent=((0.0, fleet.initial),))
    while settled < len(jobs):
        t, _, _, kind, x = heapq.heappop(heap)
        if kind == 0:
            rep = reps[x]
            rep.running -= 1
            settled += 1
            if rep.running == 0:
                rep.busy_s, rep.busy_since = rep.busy_until(t), None
                if rep.draining:
                    rep.stop = t
        elif kind == 1:
            reps[x].ready = reps[x].stop is None
        elif kind == 2:
            if queue and queue[0] == x:
                queue.popleft()
                settled += 1
        elif kind == 3:
            queue.append(x)
        else:
            ready = [rep for rep in reps if rep.ready and rep.live()]
            busy = [rep.busy_until(t) - rep.busy_mark for rep in reps if rep.ready and rep.stop is None]
            for rep in reps:
                rep.busy_mark = rep.busy_until(t)
            conc.append((t, sum(rep.running for rep in reps) + len(queue)))
            util.append((t, sum(busy) / len(busy) / fleet.tick if busy else 0.0))
            current = sum(rep.live() for rep in reps)
            desired, state = _m_decide(scaler, conc, util, t, len(ready), current, state, fleet.initial)
            _m_scale(t, desired, reps, fleet.boot_s, push)
            timeline.append((t, conc[-1][1], len(ready), desired))
            push(t + fleet.tick, 4, x + 1)
        _m_dispatch(t, queue, reps, jobs, fleet.slots, ttft, push)
    return {"ttft": ttft, "replicas": [(rep.launch, t if rep.stop is None else rep.stop) for rep in reps],
            "timeline": timeline, "end": t}


@mutant(check="simulate_fleet", message="starts the KPA state empty")
def simulate_fleet(jobs, fleet, scaler):  # noqa: F811
    return _m_simulate(jobs, fleet, scaler, fresh_state=True)


@mutant(check="simulate_fleet", message="runs DROP (or ARRIVE) before READY")
def simulate_fleet(jobs, fleet, scaler):  # noqa: F811
    return _m_simulate(jobs, fleet, scaler, drop_before_ready=True)


@mutant(check="fleet_report", message="meets the SLO only below it")
def fleet_report(sim, ttft_slo):  # noqa: F811
    rep = sol.fleet_report(sim, ttft_slo)  # noqa: F821
    return {**rep, "slo_met": rep["p99_ttft"] < ttft_slo}


@mutant(check="fleet_report", message="IndexError")
def fleet_report(sim, ttft_slo):  # noqa: F811
    ttft = sorted(sim["ttft"])
    ttft[math.ceil(0.99 * len(ttft)) - 1]  # no guard for a run with no jobs
    return sol.fleet_report(sim, ttft_slo)  # noqa: F821


@mutant(check="fleet_report", message="ZeroDivisionError")
def fleet_report(sim, ttft_slo):  # noqa: F811
    sum(stop - launch for launch, stop in sim["replicas"]) / sim["end"]  # no guard for end = 0
    return sol.fleet_report(sim, ttft_slo)  # noqa: F821


@mutant(check="tuned_kpa", message="raise max_replicas")
def tuned_kpa(fleet):  # noqa: F811
    return KPAConfig(target=fleet.slots, min_replicas=3, max_replicas=3)  # a fixed fleet of 3: no autoscaling


@mutant(check="tuned_kpa", message="raise max_replicas")
def tuned_kpa(fleet):  # noqa: F811
    return sol.tuned_kpa(fleet)._replace(max_replicas=3)  # noqa: F821 - the tuned policy, capped at 3


# -- hostile: a timeline the grader would otherwise replay with ten million replicas ----------------


@mutant(check="tuned_kpa", message="asks for 10000000 replicas")
def simulate_fleet(jobs, fleet, scaler):  # noqa: F811
    out = sol.simulate_fleet(jobs, fleet, scaler)  # noqa: F821
    return {**out, "timeline": [(t, c, r, 10**7) for t, c, r, _ in out["timeline"]]}


# -- hostile: a timeline of 100 000 rows, each looked up at every tick of the replay (a million: minutes) --


@mutant(check="tuned_kpa", message="at most 10000 is allowed")
def simulate_fleet(jobs, fleet, scaler):  # noqa: F811
    out = sol.simulate_fleet(jobs, fleet, scaler)  # noqa: F821
    return {**out, "timeline": out["timeline"] + [(1e300, 0, 0, 1)] * 10**5}


# -- hostile: a timeline swinging from 0 to 256 replicas every tick (tens of thousands of launches) ----


@mutant(check="tuned_kpa", message="far more than these workloads need")
def simulate_fleet(jobs, fleet, scaler):  # noqa: F811
    out = sol.simulate_fleet(jobs, fleet, scaler)  # noqa: F821
    return {**out, "timeline": [(t, c, r, 256 * (k % 2)) for k, (t, c, r, _) in enumerate(out["timeline"])]}


# -- the jobs list edited in place (the caller's list, sorted by service time) --------------------------------


@mutant(check="tuned_kpa", message="modified its argument #1 (the jobs) in place")
def simulate_fleet(jobs, fleet, scaler):  # noqa: F811
    out = sol.simulate_fleet(jobs, fleet, scaler)  # noqa: F821
    jobs.sort(key=lambda j: j.service_s)
    return out
