"""Lesson 10: autoscaling a fleet of LLM replicas on concurrency, with a replica that takes a minute to boot.

The model of a fleet used everywhere here (one event loop, no simulation library):

    a Job arrives, waits in one FIFO queue in front of the fleet (Knative's activator plays this part),
    starts on a ready replica that has a free slot, and holds that slot for service_s seconds; its TTFT is
    (start - arrival) + prefill_s. A job still queued timeout_s after it arrived is dropped (TTFT = inf).
    A replica runs at most `slots` jobs at once; it is paid for (one GPU) from launch to stop, booting
    included, and serves nothing for boot_s seconds after its launch.
    Every `tick` seconds the autoscaler observes the fleet and says how many replicas it wants.

Job sizes come from the Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA 2024) and their
seconds from the modeled GPU clock (reference_engine/sim/gpu_model.py: Llama-3-8B on a modeled H100, an
estimate, not a measurement). The scaler follows Knative's Pod Autoscaler (KPA); its defaults are those of
knative/serving config/core/configmaps/autoscaler.yaml (cited where they are used).

The bottom of the file holds the workload builder the notebook and the checks use (given, not exercises).
"""
from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import deque
from typing import NamedTuple, Sequence

# -- the data ----------------------------------------------------------------------------------------


class Job(NamedTuple):
    """One request as the fleet sees it: when it arrives, the seconds its prefill takes (the part of TTFT
    after it starts), and the seconds it holds a replica's slot (prefill + every decode step)."""
    arrival: float
    prefill_s: float
    service_s: float


class Fleet(NamedTuple):
    """The fleet's fixed facts. slots: jobs one replica runs at once (its max_num_seqs); boot_s: launch ->
    ready (weights loaded, engine warmed up: lesson 11's cold start); timeout_s: a queued job is dropped
    after this long; initial: replicas ready at t = 0; tick: seconds between autoscaler decisions (Knative's
    tick-interval default is 2 s)."""
    slots: int = 16
    boot_s: float = 60.0
    timeout_s: float = 30.0
    initial: int = 1
    tick: float = 2.0


class KPAConfig(NamedTuple):
    """The three numbers and the timers of Knative's KPA. Defaults: knative/serving
    config/core/configmaps/autoscaler.yaml (container-concurrency-target-default 100,
    container-concurrency-target-percentage 70, stable-window 60s, panic-window-percentage 10.0,
    panic-threshold-percentage 200.0, max-scale-up-rate 1000.0, max-scale-down-rate 2.0) and Knative's
    scale-down-delay default 0s. min/max replicas are the per-service bounds (min-scale / max-scale)."""
    target: float = 100.0
    utilization: float = 0.70
    min_replicas: int = 1
    max_replicas: int = 1000
    stable_window: float = 60.0
    panic_window_pct: float = 10.0
    panic_threshold_pct: float = 200.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_down_delay: float = 0.0


class KPAState(NamedTuple):
    """What the KPA remembers between decisions. panic_since: the last time the panic window was over
    the threshold (None: stable mode); max_panic: the most replicas wanted during this panic; recent:
    ((time, wanted), ...) the decisions inside the scale-down delay."""
    panic_since: float | None = None
    max_panic: int = 0
    recent: tuple = ()


class UtilConfig(NamedTuple):
    """A scaler on GPU utilization, as Kubernetes' HorizontalPodAutoscaler scales on a resource metric:
    target utilization (a fraction), the averaging window, the tolerance (HPA's default 0.1: no change
    while |utilization / target - 1| <= 0.1) and the replica bounds."""
    target: float = 0.70
    window: float = 60.0
    tolerance: float = 0.1
    min_replicas: int = 1
    max_replicas: int = 1000


def window_average(samples: Sequence[tuple[float, float]], now: float, window: float) -> float:
    """Mean of the values of the samples (time, value) with now - window < time <= now; 0.0 if none.
    The KPA averages concurrency over a window this way (it buckets per second; one sample per tick
    here)."""
    vals = [v for t, v in samples if now - window < t <= now]
    return sum(vals) / len(vals) if vals else 0.0


def ceil_count(x: float) -> int:
    """Round a replica count up; within 1e-9 of an integer counts as that integer (so 0.1 * 3 / 0.3 is 1,
    not 2: float noise must not buy a GPU)."""
    return math.ceil(x - 1e-9)


# -- 2. the desired-replica functions ----------------------------------------------------------------

def kpa_decide(samples: Sequence[tuple[float, float]], now: float, ready: int, cfg: KPAConfig,
               state: KPAState) -> tuple[int, KPAState]:
    """Exercise 2.1: one KPA decision. Do not modify the arguments.

    samples: (time, observed concurrency) one per tick, oldest first, the last at `now`; concurrency is
    the jobs in the fleet (running + queued). ready: replicas serving now (not booting, not draining).
    In this order:
      1. per = target * utilization (the concurrency one replica should carry).
         stable = window_average over stable_window; panic = window_average over
         stable_window * panic_window_pct / 100.
      2. r = max(ready, 1); up = ceil(max_scale_up_rate * r); down = floor(r / max_scale_down_rate).
         want_stable = ceil_count(stable / per) and want_panic = ceil_count(panic / per), each clamped
         to [down, up].
      3. over = ceil_count(panic / per) / r >= panic_threshold_pct / 100: the panic window's replica count,
         rounded up and not clamped, is at least twice what serves (Knative v1.23,
         pkg/autoscaler/scaling/autoscaler.go: ceil first, then divide). With one ready replica a panic
         average just over one replica's load rounds up to 2 and panics. If over: panic_since = now. Else, if panicking and panic_since + stable_window < now: leave panic
         mode (panic_since None, max_panic 0).
      4. desired = want_stable; while panicking, desired = max(want_stable, want_panic, max_panic) and
         max_panic = desired (panic mode never scales down).
      5. Scale-down delay: recent = the previous entries with time > now - scale_down_delay, plus
         (now, desired); desired = the largest wanted in recent.
      6. Clamp to [min_replicas, max_replicas].
    Returns (desired, new KPAState(panic_since, max_panic, recent)).

    Example: samples [(2, 10), (4, 10), (6, 13)], now=6, ready=1, cfg target 10, utilization 1.0 ->
    stable 11 -> 2, panic (window 6 s: all three) 11 -> 2; ceil(1.1) / 1 = 2 >= 2: panic (unrounded,
    1.1 / 1 would not be); desired 2.
    """
    ### BEGIN SOLUTION
    per = cfg.target * cfg.utilization
    stable = window_average(samples, now, cfg.stable_window)
    panic = window_average(samples, now, cfg.stable_window * cfg.panic_window_pct / 100)
    r = max(ready, 1)
    up, down = math.ceil(cfg.max_scale_up_rate * r), math.floor(r / cfg.max_scale_down_rate)
    want_stable = min(max(ceil_count(stable / per), down), up)
    want_panic = min(max(ceil_count(panic / per), down), up)
    panic_since, max_panic = state.panic_since, state.max_panic
    if ceil_count(panic / per) / r >= cfg.panic_threshold_pct / 100:
        panic_since = now
    elif panic_since is not None and panic_since + cfg.stable_window < now:
        panic_since, max_panic = None, 0
    desired = want_stable
    if panic_since is not None:
        desired = max(want_stable, want_panic, max_panic)
        max_panic = desired
    recent = tuple((t, d) for t, d in state.recent if t > now - cfg.scale_down_delay) + ((now, desired),)
    desired = max(d for _, d in recent)
    desired = min(max(desired, cfg.min_replicas), cfg.max_replicas)
    return desired, KPAState(panic_since, max_panic, recent)
    ### END SOLUTION


def utilization_decide(samples: Sequence[tuple[float, float]], now: float, replicas: int,
                       cfg: UtilConfig) -> int:
    """Exercise 2.2: the GPU-utilization scaler (HPA's rule). Do not modify the arguments.

    samples: (time, fleet GPU utilization in [0, 1]) one per tick, the last at `now`; utilization is
    NVML's: the fraction of the tick during which a kernel ran, i.e. the replica had at least one job,
    averaged over ready replicas. replicas: the replicas the fleet has now (ready + booting).
      u = window_average over cfg.window; ratio = u / cfg.target.
      If |ratio - 1| <= tolerance: desired = replicas; else desired = ceil_count(max(replicas, 1) * ratio).
      Clamp to [min_replicas, max_replicas].

    Example: u = 1.0 (every replica had a job all the time), target 0.7, replicas 4 -> ceil(5.71) = 6.
    """
    ### BEGIN SOLUTION
    ratio = window_average(samples, now, cfg.window) / cfg.target
    desired = replicas if abs(ratio - 1) <= cfg.tolerance else ceil_count(max(replicas, 1) * ratio)
    return min(max(desired, cfg.min_replicas), cfg.max_replicas)
    ### END SOLUTION


# -- 3. the fleet ------------------------------------------------------------------------------------

COMPLETE, READY, DROP, ARRIVE, TICK = range(5)  # events at the same time run in this order


class Replica:
    """One replica's bookkeeping in simulate_fleet (given). busy_s: seconds it has had >= 1 job so far
    (counted up to busy_since while busy); busy_mark: busy_s at the previous tick. start_job, finish_job and
    retire keep that busy time and the stop time right; which replica gets a job or is removed, and when, is
    simulate_fleet's to decide."""

    def __init__(self, launch: float, ready_at: float):
        self.launch, self.ready_at, self.stop = launch, ready_at, None
        self.ready = launch == ready_at
        self.draining = False
        self.running = 0
        self.busy_s, self.busy_since, self.busy_mark = 0.0, None, 0.0

    def live(self) -> bool:
        """Still counted by the autoscaler: not stopped, not draining."""
        return self.stop is None and not self.draining

    def busy_until(self, t: float) -> float:
        """Seconds busy from launch up to t."""
        return self.busy_s + (t - self.busy_since if self.busy_since is not None else 0.0)

    def start_job(self, t: float) -> None:
        """A job starts here at t (busy from t if it was idle)."""
        if self.running == 0:
            self.busy_since = t
        self.running += 1

    def finish_job(self, t: float) -> None:
        """A job ends here at t: busy time counted up to t if none is left, and a draining replica left with
        no job stops now."""
        self.running -= 1
        if self.running == 0:
            self.busy_s, self.busy_since = self.busy_until(t), None
            if self.draining:
                self.stop = t

    def retire(self, t: float) -> None:
        """Removed from the fleet at t: a booting replica stops now (its boot is cancelled); a ready one
        drains: no new jobs, and it stops when empty (now if it already is)."""
        self.draining = self.ready
        if self.running == 0:
            self.stop = t


def simulate_fleet(jobs: Sequence[Job], fleet: Fleet, scaler) -> dict:
    """Exercise 3.1: run the fleet over `jobs` (sorted by arrival) with an autoscaler. Do not modify the
    arguments.

    scaler: a KPAConfig (decide with your kpa_decide, its state starting at KPAState(recent=((0.0,
    fleet.initial),)): the initial size counts as a decision made at t = 0), a UtilConfig
    (your utilization_decide), or a list of (time, replicas): a fixed schedule, desired at a tick = the
    replicas of the last entry with time <= tick (fleet.initial before the first). Tell them apart by
    type(scaler).__name__ ("KPAConfig", "UtilConfig", "list"): callers may build them from their own copy
    of these NamedTuples.

    Events, in time order; at equal times COMPLETE, READY, DROP, ARRIVE, TICK, and in push order within a kind:
      COMPLETE: the job frees its slot; a draining replica left with no job stops now.
      READY:    a booting replica (not cancelled) becomes ready.
      DROP:     pushed for every job at arrival + timeout_s: if it is still the head of the queue, it is
                dropped (TTFT inf). ARRIVE: the job joins the queue's tail.
      TICK:     at k * tick (k = 1, 2, ...), while jobs remain:
                concurrency = jobs running on any replica + queued; utilization = mean over ready replicas
                of (busy seconds since the previous tick) / tick (0.0 if none ready);
                ready = ready replicas that are not draining; current = live replicas (ready or booting);
                desired from the scaler (kpa_decide gets `ready`, utilization_decide gets `current`);
                if desired > current: launch the difference now (ready at now + boot_s);
                if desired < current: remove the difference, booting replicas first (latest launched first,
                stopped now), then ready ones with the fewest jobs (ties: the highest index), which drain:
                no new jobs, stop when empty (now if already empty).
                Append (now, concurrency, ready, desired) to the timeline.
    After every event, dispatch: while the queue is not empty and a ready, non-draining replica has a free
    slot, the queue's head starts on the one with the fewest jobs (ties: the lowest index).
    The run ends at the event that settles the last job (finished or dropped); replicas still up stop then.
    fleet.initial replicas are launched and ready at t = 0; a replica busy = it has >= 1 job. Keep one Replica
    (given, above) per replica: its start_job, finish_job and retire do the busy-time and stop bookkeeping.

    Returns {"ttft": [per job, input order; inf if dropped], "replicas": [(launch, stop) per replica, in
    launch order], "timeline": [(t, concurrency, ready, desired) per tick], "end": end time}.
    """
    ### BEGIN SOLUTION
    heap, seq = [], itertools.count()  # seq: push order, the tie-break between events of one kind and time
    for i, job in enumerate(jobs):
        heapq.heappush(heap, (job.arrival, ARRIVE, next(seq), i))
        heapq.heappush(heap, (job.arrival + fleet.timeout_s, DROP, next(seq), i))
    heapq.heappush(heap, (fleet.tick, TICK, next(seq), 1))
    scaler_kind = type(scaler).__name__
    reps = [Replica(0.0, 0.0) for _ in range(fleet.initial)]
    queue, ttft, settled, t = deque(), [math.inf] * len(jobs), 0, 0.0
    conc, util, state, timeline = [], [], KPAState(recent=((0.0, fleet.initial),)), []
    while settled < len(jobs):
        t, kind, _, x = heapq.heappop(heap)
        if kind == COMPLETE:
            reps[x].finish_job(t)
            settled += 1
        elif kind == READY:
            reps[x].ready = reps[x].stop is None
        elif kind == DROP:
            if queue and queue[0] == x:  # still waiting, at the head: dropped
                queue.popleft()
                settled += 1
        elif kind == ARRIVE:
            queue.append(x)
        else:  # TICK: measure, decide, scale
            ready = sum(rep.ready and rep.live() for rep in reps)
            busy = [rep.busy_until(t) - rep.busy_mark for rep in reps if rep.ready and rep.stop is None]
            for rep in reps:
                rep.busy_mark = rep.busy_until(t)
            conc.append((t, sum(rep.running for rep in reps) + len(queue)))
            util.append((t, sum(busy) / len(busy) / fleet.tick if busy else 0.0))
            if scaler_kind == "KPAConfig":
                desired, state = kpa_decide(conc, t, ready, scaler, state)
            elif scaler_kind == "UtilConfig":
                desired = utilization_decide(util, t, sum(rep.live() for rep in reps), scaler)
            else:
                desired = next((n for when, n in reversed(scaler) if when <= t), fleet.initial)
            live = [r for r, rep in enumerate(reps) if rep.live()]
            for _ in range(desired - len(live)):
                reps.append(Replica(t, t + fleet.boot_s))
                heapq.heappush(heap, (t + fleet.boot_s, READY, next(seq), len(reps) - 1))
            booting = sorted((r for r in live if not reps[r].ready), key=lambda r: (-reps[r].launch, -r))
            serving = sorted((r for r in live if reps[r].ready), key=lambda r: (reps[r].running, -r))
            for r in (booting + serving)[:max(len(live) - desired, 0)]:  # booting ones first, then the emptiest
                reps[r].retire(t)
            timeline.append((t, conc[-1][1], ready, desired))
            heapq.heappush(heap, (t + fleet.tick, TICK, next(seq), x + 1))
        # dispatch: the queue's head to the ready, live replica with a free slot and the fewest jobs (lowest index)
        while queue and (free := [r for r, rep in enumerate(reps)
                                  if rep.ready and rep.live() and rep.running < fleet.slots]):
            r, i = min(free, key=lambda r: (reps[r].running, r)), queue.popleft()
            reps[r].start_job(t)
            ttft[i] = t - jobs[i].arrival + jobs[i].prefill_s
            heapq.heappush(heap, (t + jobs[i].service_s, COMPLETE, next(seq), r))
    return {"ttft": ttft, "replicas": [(rep.launch, t if rep.stop is None else rep.stop) for rep in reps],
            "timeline": timeline, "end": t}
    ### END SOLUTION


def fleet_report(sim: dict, ttft_slo: float) -> dict:
    """Exercise 3.2: what a run cost and how it served, from simulate_fleet's dict.

      "gpu_hours":     sum over replicas of (stop - launch), in hours (booting time is paid for);
      "mean_replicas": the same replica-seconds divided by sim["end"];
      "p99_ttft":      the nearest-rank 99th percentile of every job's TTFT, dropped ones included as inf
                       (sorted, the value at index ceil(0.99 n) - 1);
      "late":          jobs served with TTFT > ttft_slo; "dropped": jobs dropped (TTFT inf);
      "slo_met":       p99_ttft <= ttft_slo.
    A run with no jobs (simulate_fleet([], ...): ttft [], end 0) is valid: p99_ttft 0.0, mean_replicas 0.0
    (no division by zero), late 0, dropped 0, slo_met True.

    Example: ttft [0.1, 0.2, inf], replicas [(0, 3600), (1800, 3600)], end 3600, slo 0.15 ->
    gpu_hours 1.5, mean_replicas 1.5, p99 inf, late 1, dropped 1, slo_met False.
    """
    ### BEGIN SOLUTION
    seconds = sum(stop - launch for launch, stop in sim["replicas"])
    ttft = sorted(sim["ttft"])
    p99 = ttft[math.ceil(0.99 * len(ttft)) - 1] if ttft else 0.0
    return {"gpu_hours": seconds / 3600, "mean_replicas": seconds / sim["end"] if sim["end"] else 0.0,
            "p99_ttft": p99, "late": sum(ttft_slo < x < math.inf for x in ttft),
            "dropped": sum(x == math.inf for x in ttft), "slo_met": p99 <= ttft_slo}
    ### END SOLUTION


# -- 4. headroom and a tuned policy ------------------------------------------------------------------

def min_headroom(slope_rps_per_s: float, boot_s: float, service_s: float, per_replica: float,
                 tick_s: float = 2.0, window_s: float = 6.0) -> dict:
    """Exercise 4.1: the spare capacity a fleet must already hold when load ramps at a steady slope.

    A replica ordered now serves only after the decision waits for its tick (tick_s), the window average
    catches up with a linear ramp (it lags by half the window, window_s / 2) and the replica boots (boot_s):
      "lead_s":      tick_s + window_s / 2 + boot_s;
      "concurrency": the concurrency the ramp adds meanwhile: slope_rps_per_s * lead_s more requests per
                     second, each in the fleet for service_s seconds (Little's law);
      "replicas":    ceil_count(concurrency / per_replica), per_replica = the concurrency one replica carries.

    Example: slope 0.5 rps/s, boot 60 s, service 1.5 s, per_replica 12 -> lead 65 s, concurrency 48.75,
    replicas 5.
    """
    ### BEGIN SOLUTION
    lead = tick_s + window_s / 2 + boot_s
    conc = slope_rps_per_s * lead * service_s
    return {"lead_s": lead, "concurrency": conc, "replicas": ceil_count(conc / per_replica)}
    ### END SOLUTION


def tuned_kpa(fleet: Fleet) -> KPAConfig:
    """Exercise 4.2: your KPA settings for `fleet` (any slots and boot_s). Graded on unseen ramps and bursts
    cut from the Azure trace (see section 4): p99 TTFT within TTFT_SLO_S, at no more GPU-hours than
    GPU_HOURS_BOUND times those of a fleet that knows the load in advance (`oracle_gpu_hours`)."""
    ### BEGIN SOLUTION
    # Section 4's sweep: 40% of the slots leaves room for a ramp while replicas boot; a panic threshold of
    # 400% keeps a queue that builds during a boot from buying a replica per queued job; holding replicas
    # for 3 minutes before giving them back avoids paying a second boot on the next wave.
    return KPAConfig(target=fleet.slots, utilization=0.4, min_replicas=1, max_replicas=64,
                     panic_threshold_pct=400.0, scale_down_delay=180.0)
    ### END SOLUTION


# -- the workload (given) ----------------------------------------------------------------------------

TTFT_SLO_S = 2.0       # p99 TTFT the tuned policy must meet (seconds)
GPU_HOURS_BOUND = 4.0  # ... at no more than this many times the oracle's GPU-hours


def modeled_job_times(prompt_tokens: int, output_tokens: int, decode_step_s: float, chip: str = "H100",
                      model: str = "llama-3-8b") -> tuple[float, float]:
    """(prefill_s, service_s) of one request on a modeled GPU: the prefill of the whole prompt as one
    step, then one decode step (decode_step_s, the replica's step at full batch) per further output token."""
    prefill = _prefill_s(prompt_tokens, chip, model)
    return prefill, prefill + (output_tokens - 1) * decode_step_s


@functools.lru_cache(maxsize=None)
def _prefill_s(prompt_tokens: int, chip: str, model: str) -> float:
    from reference_engine.sim.gpu_model import CHIPS, MODELS, Composition, step_time

    return step_time(MODELS[model], CHIPS[chip], Composition(prefills=((prompt_tokens, 0),))).time_s


def decode_step_s(slots: int, context: int, chip: str = "H100", model: str = "llama-3-8b") -> float:
    """Modeled seconds of one decode step of a full replica: `slots` sequences at `context` tokens each.
    Every job decodes at this speed (a replica is assumed full: conservative when it is not)."""
    from reference_engine.sim.gpu_model import CHIPS, MODELS, Composition, step_time

    return step_time(MODELS[model], CHIPS[chip], Composition.decode_batch(slots, context)).time_s


def warp(arrivals: Sequence[float], profile: Sequence[tuple[float, float]]) -> list[float]:
    """New arrival times whose rate follows `profile` [(t, rps), ...] (linear between points, flat after
    the last), keeping the trace's burstiness: the i-th arrival lands where the profile's expected count
    reaches the count the original trace had by then (original time * its mean rate)."""
    import numpy as np

    a = np.asarray(arrivals, dtype=np.float64) - arrivals[0]
    mean = (len(a) - 1) / a[-1] if a[-1] > 0 else 1.0
    pts = np.asarray(profile, dtype=np.float64)
    horizon = pts[-1, 0] + 10 * len(a) / max(pts[:, 1].min(), 1e-3)
    grid = np.linspace(0.0, horizon, 200_001)
    lam = np.interp(grid, pts[:, 0], pts[:, 1])
    cum = np.concatenate([[0.0], np.cumsum((lam[1:] + lam[:-1]) / 2 * np.diff(grid))])
    return np.interp(a * mean, cum, grid).tolist()


def trace_jobs(profile: Sequence[tuple[float, float]], duration: float, seed: int = 0, trace: str = "conv",
               slots: int = 16, chip: str = "H100", model: str = "llama-3-8b") -> list[Job]:
    """Jobs from the Azure trace (consecutive requests from a seeded start, wrapping around to the first row)
    whose arrivals follow `profile` for `duration` seconds; token counts as recorded, seconds from the
    modeled GPU clock. Raises ValueError if the profile asks for more than three laps of the trace."""
    import numpy as np

    from reference_engine.sim import trace as tr

    reqs = tr.load(trace)
    start = int(np.random.default_rng(seed).integers(0, len(reqs)))
    gaps = np.diff([r.arrival for r in reqs])
    gaps = np.concatenate([gaps, [np.median(gaps)]])  # the gap from the last row back to the first
    gaps = np.tile(np.concatenate([gaps[start:], gaps[:start]]), 3)  # from a seeded row on, wrapped around
    reqs = (reqs[start:] + reqs[:start]) * 3  # three laps: enough rows for any profile of this lesson
    times = warp(np.concatenate([[0.0], np.cumsum(gaps[:-1])]).tolist(), profile)
    ctx = int(round(np.mean([r.prompt_tokens + r.output_tokens / 2 for r in reqs])))
    step = decode_step_s(slots, ctx, chip, model)
    if times[-1] <= duration:
        raise ValueError(f"the profile {profile} needs more than {len(reqs)} requests in {duration} s")
    return [Job(round(t, 6), *modeled_job_times(r.prompt_tokens, r.output_tokens, step, chip, model))
            for t, r in zip(times, reqs) if t <= duration]


def oracle_gpu_hours(jobs: Sequence[Job], fleet: Fleet, bucket_s: float = 60.0) -> float:
    """GPU-hours of a fleet that knows the future and boots instantly: in each bucket_s interval it runs
    just enough replicas for the interval's mean concurrency at full slots (sum of service seconds that
    fall in the interval / bucket_s / slots, rounded up, at least 1). A lower bound no real scaler reaches."""
    if not jobs:
        return 0.0
    end = max(j.arrival + j.service_s for j in jobs)
    n = int(end // bucket_s) + 1
    busy = [0.0] * n
    for j in jobs:
        s, e = j.arrival, j.arrival + j.service_s
        while s < e:
            b = int(s // bucket_s)
            cut = min(e, (b + 1) * bucket_s)
            busy[b] += cut - s
            s = cut
    return sum(max(1, ceil_count(x / bucket_s / fleet.slots)) for x in busy) * bucket_s / 3600
