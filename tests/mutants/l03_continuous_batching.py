"""Plausible wrong answers for lesson 03; each must be caught, and named, by its check."""
from solutions.l03_continuous_batching import _result, expected_max as _emax
from tests.mutants import mutant

# -- 1.1 static batching ----------------------------------------------------------------------------


@mutant(check="simulate_static", message="before its requests have arrived")
def simulate_static(requests, B):
    finish, slots_used, end = [0] * len(requests), [], 0
    for k in range(0, len(requests), B):
        batch = range(k, min(k + B, len(requests)))
        longest = max(requests[i].output_len for i in batch)
        slots_used += [sum(requests[i].output_len > s for i in batch) for s in range(longest)]
        end += longest  # never waits for the batch's last arrival
        for i in batch:
            finish[i] = end
    return _result(finish, slots_used, requests, B)


@mutant(check="simulate_static", message="returns each request at its own last token")
def simulate_static(requests, B):  # noqa: F811 - one mutant per definition
    finish, slots_used, end = [0] * len(requests), [], 0
    for k in range(0, len(requests), B):
        batch = range(k, min(k + B, len(requests)))
        start = max(end, max(requests[i].arrival for i in batch))
        longest = max(requests[i].output_len for i in batch)
        slots_used += [0] * (start - end)
        slots_used += [sum(requests[i].output_len > s for i in batch) for s in range(longest)]
        end = start + longest
        for i in batch:
            finish[i] = start + requests[i].output_len
    return _result(finish, slots_used, requests, B)


@mutant(check="simulate_static", message="leaves the idle steps")
def simulate_static(requests, B):  # noqa: F811
    from solutions.l03_continuous_batching import simulate_static as ref
    res = ref(requests, B)
    busy = sum(1 for s in res["slots_used"] if s)  # a batch always has a useful slot in its steps
    res["occupancy"] = sum(r.output_len for r in requests) / (B * busy)
    return res


# -- 2.1 the step -----------------------------------------------------------------------------------

def _step(variant):
    def step_fn(running, waiting, requests, B, step):
        retired = [rid for rid, left in running if left == 0]
        if variant != "retire_after":
            running = [(rid, left) for rid, left in running if left > 0]
        waiting = list(waiting)
        while waiting and (len(running) <= B if variant == "beyond_B" else len(running) < B):
            if variant == "static" and running:
                break
            if variant != "no_arrival" and requests[waiting[0]].arrival > step:
                break
            rid = waiting.pop(0)
            running.append((rid, requests[rid].output_len))
        running = [(rid, left) for rid, left in running if left > 0 or variant != "retire_after"]
        return [(rid, left - 1) for rid, left in running], waiting, retired
    step_fn.__name__ = "continuous_step"  # the name it replaces in the module
    return step_fn


mutant(check="continuous_step", message="admits only when the whole batch is empty")(
    _step("static"))
mutant(check="continuous_step", message="retires finished requests after admitting")(
    _step("retire_after"))
mutant(check="continuous_step", message="admits beyond B slots")(
    _step("beyond_B"))
mutant(check="continuous_step", message="ignores arrival times")(
    _step("no_arrival"))


@mutant(check="continuous_step", message="modified its argument")
def continuous_step(running, waiting, requests, B, step):
    retired = [rid for rid, left in running if left == 0]
    running[:] = [(rid, left) for rid, left in running if left > 0]  # edits the caller's list
    while waiting and len(running) < B and requests[waiting[0]].arrival <= step:
        rid = waiting.pop(0)
        running.append((rid, requests[rid].output_len))
    return [(rid, left - 1) for rid, left in running], waiting, retired


# -- 2.2 the driver ---------------------------------------------------------------------------------

@mutant(check="simulate_continuous", message="counts the last, empty step")
def simulate_continuous(requests, B):
    from solutions.l03_continuous_batching import continuous_step as step_fn
    running, waiting = [], list(range(len(requests)))
    finish, slots_used, step = [0] * len(requests), [], 0
    while running or waiting:
        running, waiting, retired = step_fn(running, waiting, requests, B, step)
        for rid in retired:
            finish[rid] = step
        slots_used.append(len(running))  # also the final step that only retires
        step += 1
    return _result(finish, slots_used, requests, B)


@mutant(check="simulate_continuous", message="admits only when the whole batch is empty")
def simulate_continuous(requests, B):  # noqa: F811 - a learner's driver over a static step
    step_fn = _step("static")
    running, waiting = [], list(range(len(requests)))
    finish, slots_used, step = [0] * len(requests), [], 0
    while running or waiting:
        running, waiting, retired = step_fn(running, waiting, requests, B, step)
        for rid in retired:
            finish[rid] = step
        if running or waiting:
            slots_used.append(len(running))
        step += 1
    return _result(finish, slots_used, requests, B)


# -- 3. closed form ---------------------------------------------------------------------------------

@mutant(check="expected_max", message="off by one")
def expected_max(pmf, B):
    cdf, total = 0.0, 0.0
    for k in range(1, max(pmf) + 1):
        cdf += pmf.get(k, 0.0)
        total += 1.0 - cdf ** B  # P(M > k): F(k), not F(k - 1)
    return total


@mutant(check="expected_max", message="returns E[L]")
def expected_max(pmf, B):  # noqa: F811
    return sum(k * p for k, p in pmf.items())


@mutant(check="expected_max", message="expected minimum")
def expected_max(pmf, B):  # noqa: F811
    total, cdf, prev = 0.0, 0.0, 0
    for k in sorted(pmf):
        total += (k - prev) * (1.0 - cdf) ** B
        cdf += pmf[k]
        prev = k
    return total


@mutant(check="batching_gain", message="inverts the gain")
def batching_gain(pmf, B):
    mean, emax = sum(k * p for k, p in pmf.items()), _emax(pmf, B)
    return {"padding_waste": 1.0 - mean / emax, "gain": mean / emax}


@mutant(check="batching_gain", message="divides the wasted slot-steps by E[L]")
def batching_gain(pmf, B):  # noqa: F811
    mean, emax = sum(k * p for k, p in pmf.items()), _emax(pmf, B)
    return {"padding_waste": (emax - mean) / mean, "gain": emax / mean}


# -- 4. policies ------------------------------------------------------------------------------------

class _ContinuousStatic:
    """Static batching written as the continuous policy: remembers the free slots of the first call
    (nothing runs yet) and admits only when they are all free again."""

    def schedule(self, candidates, budget):
        if any(not s.is_waiting for s in candidates):
            return []
        picked = []
        if not hasattr(self, "B"):
            self.B = budget.slots  # the first call: nothing runs yet, every slot is free
        if budget.slots != self.B:
            return []
        for seq in candidates:
            if not budget.try_take(seq, seq.num_uncomputed_tokens):
                break
            picked.append((seq, seq.num_uncomputed_tokens))
        return picked


mutant(check="continuous_policy", message="admits only when nothing is running")(
    type("ContinuousPolicy", (_ContinuousStatic,), {}))


class _SkipAhead:
    def schedule(self, candidates, budget):
        picked = []
        for seq in candidates:
            n = seq.num_uncomputed_tokens
            if budget.chunked_prefill:
                n = min(n, budget.tokens)
            if budget.try_take(seq, n):  # a request that does not fit is skipped, not waited for
                picked.append((seq, n))
        return picked


mutant(check="continuous_policy", message="lets a later request overtake")(
    type("ContinuousPolicy", (_SkipAhead,), {}))


class _NoChunk:
    def schedule(self, candidates, budget):
        picked = []
        for seq in candidates:
            if not budget.try_take(seq, seq.num_uncomputed_tokens):
                break
            picked.append((seq, seq.num_uncomputed_tokens))
        return picked


mutant(check="continuous_policy", message="admitted nothing")(type("ContinuousPolicy", (_NoChunk,), {}))


class _IgnoresBudget:
    def schedule(self, candidates, budget):
        return [(s, s.num_uncomputed_tokens) for s in candidates[:budget.slots]]  # slots only, no blocks


mutant(check="continuous_policy", message="KV blocks")(type("ContinuousPolicy", (_IgnoresBudget,), {}))


class _StaticIsContinuous:
    def __init__(self, max_num_seqs):
        pass

    def schedule(self, candidates, budget):
        return _NoChunk().schedule(candidates, budget)


mutant(check="static_policy", message="admits while requests are still running")(
    type("StaticPolicy", (_StaticIsContinuous,), {}))


class _StaticSkipAhead:
    def __init__(self, max_num_seqs):
        self.max_num_seqs = max_num_seqs

    def schedule(self, candidates, budget):
        if budget.slots != self.max_num_seqs:
            return []
        return _SkipAhead().schedule(candidates, budget)


mutant(check="static_policy", message="lets a later request overtake")(
    type("StaticPolicy", (_StaticSkipAhead,), {}))
