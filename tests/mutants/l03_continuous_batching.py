"""Plausible wrong answers for lesson 03; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here
are prefixed `_m_`, and a wrong policy class is given as a factory function of the class's name (the
engine harness calls it as it would call the class)."""
from solutions.l03_continuous_batching import _result
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
    res = sol.simulate_static(requests, B)
    busy = sum(1 for s in res["slots_used"] if s)  # a batch always has a useful slot in its steps
    res["occupancy"] = sum(r.output_len for r in requests) / (B * busy)
    return res


@mutant(check="simulate_static", message="records no step while a batch waits for its last arrival")
def simulate_static(requests, B):  # noqa: F811
    finish, slots_used, end = [0] * len(requests), [], 0
    for k in range(0, len(requests), B):
        batch = range(k, min(k + B, len(requests)))
        start = max(end, max(requests[i].arrival for i in batch))
        longest = max(requests[i].output_len for i in batch)
        slots_used += [sum(requests[i].output_len > s for i in batch) for s in range(longest)]  # no idle 0s
        end = start + longest
        for i in batch:
            finish[i] = end
    return _result(finish, slots_used, requests, B)


@mutant(check="simulate_static", message="a short last batch still holds B slots")
def simulate_static(requests, B):  # noqa: F811
    res = sol.simulate_static(requests, B)
    slot_steps = sum(min(B, len(requests) - k) * max(r.output_len for r in requests[k:k + B])
                     for k in range(0, len(requests), B))  # the slots each batch filled, not B
    res["occupancy"] = sum(r.output_len for r in requests) / slot_steps
    return res


# -- 2.1 the step -----------------------------------------------------------------------------------

def _m_step(variant, running, waiting, requests, B, step):
    retired = [rid for rid, left in running if left == 0]
    if variant != "retire_after":
        running = [(rid, left) for rid, left in running if left > 0]
    waiting = list(waiting)
    while waiting and (len(running) <= B if variant == "beyond_B" else len(running) < B):
        if variant == "static" and running:
            break
        arrival = requests[waiting[0]].arrival
        if (variant == "strict_arrival" and arrival >= step) or (variant not in ("no_arrival", "strict_arrival")
                                                                 and arrival > step):
            break
        rid = waiting.pop(0)
        running.append((rid, requests[rid].output_len))
    running = [(rid, left) for rid, left in running if left > 0 or variant != "retire_after"]
    return [(rid, left - 1) for rid, left in running], waiting, retired


@mutant(check="continuous_step", message="admits only when the whole batch is empty")
def continuous_step(running, waiting, requests, B, step):
    return _m_step("static", running, waiting, requests, B, step)


@mutant(check="continuous_step", message="retires finished requests after admitting")
def continuous_step(running, waiting, requests, B, step):  # noqa: F811
    return _m_step("retire_after", running, waiting, requests, B, step)


@mutant(check="continuous_step", message="admits beyond B slots")
def continuous_step(running, waiting, requests, B, step):  # noqa: F811
    return _m_step("beyond_B", running, waiting, requests, B, step)


@mutant(check="continuous_step", message="ignores arrival times")
def continuous_step(running, waiting, requests, B, step):  # noqa: F811
    return _m_step("no_arrival", running, waiting, requests, B, step)


@mutant(check="continuous_step", message="arrival <= step")
def continuous_step(running, waiting, requests, B, step):  # noqa: F811
    return _m_step("strict_arrival", running, waiting, requests, B, step)


@mutant(check="continuous_step", message="modified its argument")
def continuous_step(running, waiting, requests, B, step):  # noqa: F811
    retired = [rid for rid, left in running if left == 0]
    running[:] = [(rid, left) for rid, left in running if left > 0]  # edits the caller's list
    while waiting and len(running) < B and requests[waiting[0]].arrival <= step:
        rid = waiting.pop(0)
        running.append((rid, requests[rid].output_len))
    return [(rid, left - 1) for rid, left in running], waiting, retired


# -- 2.2 the driver ---------------------------------------------------------------------------------

def _m_drive(requests, B, step_fn, count_last=False, finish_shift=0):
    running, waiting = [], list(range(len(requests)))
    finish, slots_used, step = [0] * len(requests), [], 0
    while running or waiting:
        running, waiting, retired = step_fn(running, waiting, requests, B, step)
        for rid in retired:
            finish[rid] = step + finish_shift
        if running or waiting or count_last:
            slots_used.append(len(running))
        step += 1
    return _result(finish, slots_used, requests, B)


@mutant(check="simulate_continuous", message="counts the last, empty step")
def simulate_continuous(requests, B):
    return _m_drive(requests, B, sol.continuous_step, count_last=True)  # also the final step that only retires


@mutant(check="simulate_continuous", message="admits only when the whole batch is empty")
def simulate_continuous(requests, B):  # noqa: F811 - a learner's driver over a static step
    return _m_drive(requests, B, lambda *a: _m_step("static", *a))


@mutant(check="simulate_continuous", message="records the step of a request's last token")
def simulate_continuous(requests, B):  # noqa: F811
    return _m_drive(requests, B, sol.continuous_step, finish_shift=-1)


@mutant(check="simulate_continuous", message="depends on continuous_step, which fails")
def continuous_step(running, waiting, requests, B, step):
    """A right driver (the solution's simulate_continuous) over a wrong step: the driver's check blames the step."""
    return _m_step("retire_after", list(running), list(waiting), requests, B, step)


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


@mutant(check="expected_max", message="walks the pmf in its dict order")
def expected_max(pmf, B):  # noqa: F811
    total, cdf, prev = 0.0, 0.0, 0
    for k in pmf:  # assumes the keys come sorted
        total += (k - prev) * (1.0 - cdf ** B)
        cdf += pmf[k]
        prev = k
    return total


@mutant(check="batching_gain", message="inverts the gain")
def batching_gain(pmf, B):
    mean, emax = sum(k * p for k, p in pmf.items()), sol.expected_max(pmf, B)
    return {"padding_waste": 1.0 - mean / emax, "gain": mean / emax}


@mutant(check="batching_gain", message="divides the wasted slot-steps by E[L]")
def batching_gain(pmf, B):  # noqa: F811
    mean, emax = sum(k * p for k, p in pmf.items()), sol.expected_max(pmf, B)
    return {"padding_waste": (emax - mean) / mean, "gain": emax / mean}


@mutant(check="batching_gain", message="depends on expected_max, which fails")
def expected_max(pmf, B):
    """A right batching_gain over a wrong expected_max (E[L]): the gain's check blames expected_max."""
    return sum(k * p for k, p in pmf.items())


# -- 4. policies ------------------------------------------------------------------------------------

class _m_ContinuousStatic:
    """Static batching written as the continuous policy: remembers the free slots of the first call
    (nothing runs yet) and admits only when they are all free again."""

    def schedule(self, candidates, budget):
        if not hasattr(self, "B"):
            self.B = budget.slots  # the first call: nothing runs yet, every slot is free
        empty, picked = budget.slots == self.B, []
        for seq in candidates:
            if seq.is_waiting and not empty:
                break
            n = min(seq.num_uncomputed_tokens, budget.tokens) if budget.chunked_prefill else seq.num_uncomputed_tokens
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
        return picked


class _m_SkipAhead:
    def schedule(self, candidates, budget):
        picked = []
        for seq in candidates:
            n = seq.num_uncomputed_tokens
            if budget.chunked_prefill:
                n = min(n, budget.tokens)
            if budget.try_take(seq, n):  # a request that does not fit is skipped, not waited for
                picked.append((seq, n))
        return picked


class _m_NoChunk:
    def schedule(self, candidates, budget):
        picked = []
        for seq in candidates:
            if not budget.try_take(seq, seq.num_uncomputed_tokens):
                break
            picked.append((seq, seq.num_uncomputed_tokens))
        return picked


class _m_IgnoresBudget:
    def schedule(self, candidates, budget):
        return [(s, s.num_uncomputed_tokens) for s in candidates[:budget.slots]]  # slots only, no blocks


class _m_WaitingOnly:
    """Looks only at new requests: a prompt it started never gets its next chunk."""

    def schedule(self, candidates, budget):
        picked = []
        for seq in [s for s in candidates if s.is_waiting]:
            n = min(seq.num_uncomputed_tokens, budget.tokens) if budget.chunked_prefill else seq.num_uncomputed_tokens
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
        return picked


@mutant(check="continuous_policy", message="admits only when nothing is running")
def ContinuousPolicy():
    return _m_ContinuousStatic()


@mutant(check="continuous_policy", message="lets a later request overtake")
def ContinuousPolicy():  # noqa: F811
    return _m_SkipAhead()


@mutant(check="continuous_policy", message="never chunks a prompt")
def ContinuousPolicy():  # noqa: F811
    return _m_NoChunk()


@mutant(check="continuous_policy", message="KV blocks")
def ContinuousPolicy():  # noqa: F811
    return _m_IgnoresBudget()


@mutant(check="continuous_policy", message="never continues a started prompt")
def ContinuousPolicy():  # noqa: F811
    return _m_WaitingOnly()


class _m_StaticSkipAhead:
    def __init__(self, max_num_seqs):
        self.max_num_seqs = max_num_seqs

    def schedule(self, candidates, budget):
        empty = budget.slots == self.max_num_seqs
        return _m_SkipAhead().schedule([s for s in candidates if empty or not s.is_waiting], budget)


class _m_StaticStarves:
    """Static batching that forgets chunked prefill: nothing at all while the batch runs, so a prompt the
    batch started never gets its next chunk (in the engine, before it checked, this froze)."""

    def __init__(self, max_num_seqs):
        self.max_num_seqs = max_num_seqs

    def schedule(self, candidates, budget):
        if budget.slots != self.max_num_seqs:
            return []
        return sol.ContinuousPolicy().schedule(candidates, budget)


@mutant(check="static_policy", message="admits while requests are still running")
def StaticPolicy(max_num_seqs):
    return sol.ContinuousPolicy()


@mutant(check="static_policy", message="lets a later request overtake")
def StaticPolicy(max_num_seqs):  # noqa: F811
    return _m_StaticSkipAhead(max_num_seqs)


@mutant(check="static_policy", message="not even the next chunk of a prompt the batch already started")
def StaticPolicy(max_num_seqs):  # noqa: F811
    return _m_StaticStarves(max_num_seqs)
