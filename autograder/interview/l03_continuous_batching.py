"""Lesson 03 questions: E[max of B], padding waste, the continuous-batching gain, small schedules, and the rows a
CUDA graph pads a continuous batch with."""
from __future__ import annotations

import math

from .pools import pick
from .question import Numeric, Open, fmt, template

STEM = "l03_continuous_batching"


def random_pmf(rng) -> dict[int, float]:
    """Two or three output lengths with round probabilities, short ones likelier (as in chat traces)."""
    k = pick(rng, [2, 3])
    lengths = [rng.randrange(16, 129)]
    for _ in range(k - 1):  # each length a few times the one before: a long tail
        lengths.append(lengths[-1] * rng.randrange(3, 9))
    probs = pick(rng, [[0.6, 0.4], [0.7, 0.3], [0.8, 0.2], [0.9, 0.1]] if k == 2 else
                 [[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.7, 0.2, 0.1], [0.6, 0.25, 0.15]])
    return dict(zip(lengths, probs))


def pmf_text(pmf: dict[int, float]) -> str:
    return ", ".join(f"{k} tokens with probability {p:g}" for k, p in pmf.items())


def mean(pmf: dict[int, float]) -> float:
    return sum(k * p for k, p in pmf.items())


@template(STEM, "expected longest of a batch")
def expected_max(rng, ref):
    pmf, b = random_pmf(rng), pick(rng, [2, 3, 4])

    def ask(n, prompt):
        e = ref.expected_max(pmf, n)
        return Numeric(
            prompt, "tokens", e,
            [f"for whole lengths E[M] = sum over k >= 1 of P(M >= k) = sum_k (1 - F(k - 1)^{n})",
             f"F steps only at the support {sorted(pmf)}, so the sum is a few flat pieces: E[max of {n}] = {fmt(e)}",
             f"for comparison E[L] = {fmt(mean(pmf))}"],
            "A static batch lasts as long as its longest member, and the longest of B draws creeps toward the tail.",
            rtol=0.01, mistakes={"uses the mean length E[L]": mean(pmf), "uses the longest possible length": max(pmf)})

    q = ask(b, f"Output lengths are i.i.d.: {pmf_text(pmf)}. A static batch of {b} requests runs until its longest one "
               "is done. Expected length of the longest, E[max of B]?")
    q.follow_ups.append(ask(2 * b, f"Now the batch is {2 * b}: E[max of B]?"))
    return q


@template(STEM, "padding waste")
def padding_waste(rng, ref):
    pmf, b = random_pmf(rng), pick(rng, [4, 8, 16])

    def ask(n, prompt):
        g = ref.batching_gain(pmf, n)
        return Numeric(
            prompt, "%", 100 * g["padding_waste"],
            [f"useful slot-steps per slot: E[L] = {fmt(mean(pmf))}", f"paid: E[max of {n}] = {fmt(ref.expected_max(pmf, n))}",
             f"waste = 1 - E[L] / E[max] = {fmt(100 * g['padding_waste'])}%"],
            "Finished requests keep their slot until the longest is done: the gap between the mean and the max is waste.",
            mistakes={"divides by the longest possible length, not E[max]": 100 * (1 - mean(pmf) / max(pmf)),
                      "gives the useful share, E[L] / E[max], not the waste": 100 * (1 - g["padding_waste"])})

    q = ask(b, f"Output lengths are i.i.d.: {pmf_text(pmf)}. Static batches of {b}, every request waiting. What share "
               "of the slot-steps compute padding for requests that already finished?")
    q.follow_ups.append(ask(64, "Now the batch is 64: the share wasted?"))
    q.follow_ups[0].why = "The bigger the static batch, the surer it holds one long request: waste grows with B."
    return q


@template(STEM, "continuous batching gain")
def gain(rng, ref):
    pmf, b = random_pmf(rng), pick(rng, [4, 8, 16])

    def ask(n, prompt):
        g = ref.batching_gain(pmf, n)
        return Numeric(
            prompt, "x", g["gain"],
            [f"static: a batch costs E[max of {n}] = {fmt(ref.expected_max(pmf, n))} steps for {n} x E[L] useful tokens",
             f"continuous: every slot useful while requests wait: E[L] = {fmt(mean(pmf))} steps per request per slot",
             f"gain = E[max] / E[L] = {fmt(g['gain'])}x (steps cost the same however many rows are useful)"],
            "Refilling slots every step turns the longest-in-batch cost into the average cost.",
            mistakes={"uses the longest possible length over the mean": max(pmf) / mean(pmf),
                      "inverts the ratio (E[L] / E[max])": 1 / g["gain"]})

    q = ask(b, f"Output lengths are i.i.d.: {pmf_text(pmf)}; batch size {b}, a decode step costs the same however "
               "many of its rows are useful. Throughput of continuous over static batching?")
    q.follow_ups.append(ask(4 * b, f"Now the batch is {4 * b}: the gain?"))
    return q


def requests(rng, ref, n: int):
    return [ref.Request(0, rng.randrange(1, 13)) for _ in range(n)]


def req_text(reqs) -> str:
    return "[" + ", ".join(str(r.output_len) for r in reqs) + "]"


@template(STEM, "static schedule length")
def static_steps(rng, ref):
    b = pick(rng, [2, 3, 4])
    reqs = requests(rng, ref, rng.randrange(2 * b, 3 * b + 2))
    st, ct = ref.simulate_static(reqs, b), ref.simulate_continuous(reqs, b)
    batches = [reqs[i:i + b] for i in range(0, len(reqs), b)]
    q = Numeric(
        f"{len(reqs)} requests all waiting at step 0, output lengths in arrival order {req_text(reqs)} (one token per "
        f"step each). Static batching with B = {b}: how many steps until the last is returned?", "steps",
        st["total_steps"],
        [f"batches in arrival order: {', '.join(req_text(x) for x in batches)}",
         f"each runs for its longest: {' + '.join(str(max(r.output_len for r in x)) for x in batches)} = {st['total_steps']}"],
        "A static batch is as slow as its longest member; the others' slots idle.",
        rtol=0, mistakes={"schedules continuously (refills freed slots)": ct["total_steps"],
                          "divides the total work by B": math.ceil(sum(r.output_len for r in reqs) / b)})
    q.follow_ups.append(Numeric(
        "Now continuous batching (a freed slot is refilled from the queue at the next step): how many steps?", "steps",
        ct["total_steps"],
        [f"slots used per step: {ct['slots_used']}", f"{ct['total_steps']} steps, occupancy {fmt(ct['occupancy'])}"],
        "Every step each free slot takes the next request, so the slots stay busy while work waits.",
        rtol=0, mistakes={"keeps the static schedule": st["total_steps"]}))
    return q


@template(STEM, "when a request finishes")
def finish(rng, ref):
    b = pick(rng, [2, 3, 4])
    reqs = requests(rng, ref, rng.randrange(2 * b, 3 * b + 1))
    st, ct = ref.simulate_static(reqs, b), ref.simulate_continuous(reqs, b)
    differ = [i for i in range(len(reqs)) if st["finish"][i] != ct["finish"][i]] or list(range(len(reqs)))
    i = pick(rng, differ)
    q = Numeric(
        f"{len(reqs)} requests all waiting at step 0, output lengths in arrival order {req_text(reqs)}, B = {b}, "
        f"continuous batching (a slot freed at the end of a step is refilled at the next). After how many steps is "
        f"request #{i + 1} (output length {reqs[i].output_len}) done?", "steps", ct["finish"][i],
        [f"slots used per step: {ct['slots_used']}", f"finish step of each request: {ct['finish']}",
         f"request #{i + 1}: {ct['finish'][i]}"],
        "A request's latency under continuous batching is its wait for a slot plus its own length, nobody else's.",
        rtol=0, mistakes={"uses the static schedule": st["finish"][i]})
    q.follow_ups.append(Numeric(
        f"Under static batching (batches of {b} in arrival order), after how many steps is request #{i + 1} returned?", "steps",
        st["finish"][i], [f"its batch's end step: {st['finish'][i]} (finish of each request: {st['finish']})"],
        "Static batching returns a request with its whole batch, however early it finished.",
        rtol=0, mistakes={"uses the continuous schedule": ct["finish"][i]}))
    return q


@template(STEM, "slot occupancy")
def occupancy(rng, ref):
    b = pick(rng, [2, 3, 4])
    reqs = requests(rng, ref, rng.randrange(2 * b, 3 * b + 1))
    st, ct = ref.simulate_static(reqs, b), ref.simulate_continuous(reqs, b)
    work = sum(r.output_len for r in reqs)
    batches = [reqs[i:i + b] for i in range(0, len(reqs), b)]
    q = Numeric(
        f"{len(reqs)} requests all waiting at step 0, output lengths {req_text(reqs)}, static batches of {b} in arrival "
        "order. What share of the slot-steps do useful work?", "%", 100 * st["occupancy"],
        [f"useful slot-steps = sum of lengths = {work}", f"paid: B x total steps = {b} x {st['total_steps']}",
         f"occupancy = {work} / {b * st['total_steps']} = {fmt(100 * st['occupancy'])}%"],
        "Occupancy is the fraction of paid-for slot-steps that produce a token someone wanted.",
        mistakes={"divides by the number of steps only (that is the mean busy slots)": 100 * work / st["total_steps"],
                  "averages each batch's occupancy instead of pooling slot-steps":
                  100 * sum(sum(r.output_len for r in x) / (b * max(r.output_len for r in x)) for x in batches) / len(batches),
                  "leaves out the empty slots of the last, smaller batch":
                  100 * work / sum(len(x) * max(r.output_len for r in x) for x in batches)})
    q.follow_ups.append(Numeric(
        "Now continuous batching: the occupancy?", "%", 100 * ct["occupancy"],
        [f"{work} useful slot-steps over {b} x {ct['total_steps']}: {fmt(100 * ct['occupancy'])}%"],
        "Only the drain at the end, when the queue is empty, leaves continuous slots idle."))
    return q


def vllm_capture_sizes(max_num_seqs: int = 1024, ceiling: int = 512) -> list[int]:
    """vLLM v0.33.0's default CUDA-graph batch sizes for one-token decode (vllm/config/vllm.py, _set_cudagraph_sizes):
    1, 2, 4, multiples of 8 below 256, multiples of 16 from 256 up to min(2 x max_num_seqs, ceiling); the ceiling is
    512 on an H100 (1,024 on data-center Blackwell)."""
    top = min(2 * max_num_seqs, ceiling)
    return [s for s in [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16)) if s <= top]


def padded_rows(batch: int, sizes: list[int]) -> int:
    """Rows of padding in the graph a decode batch replays: the smallest captured size >= batch; none above them all
    (that batch runs without a graph)."""
    return next((s - batch for s in sizes if s >= batch), 0)


@template(STEM, "CUDA-graph padding")
def graph_padding(rng, ref):
    sizes = vllm_capture_sizes()
    pow2 = lambda n: 1 << (n - 1).bit_length()  # noqa: E731 - the mistake's rule, in one line
    # batches where the next power of two and the next multiple of 16 are both another graph than the right one
    small = pick(rng, [n for n in range(17, 250) if 0 < n % 16 < 8 and pow2(n) != -(-n // 8) * 8])
    large = pick(rng, [n for n in range(257, 500) if 0 < n % 16 < 8 and pow2(n) != -(-n // 16) * 16])

    def ask(n, prompt, extra):
        pad = padded_rows(n, sizes)
        graph = n + pad
        return Numeric(
            prompt, "rows", pad,
            ["vLLM v0.33.0 captures decode graphs for batch sizes 1, 2, 4, every multiple of 8 below 256, every "
             "multiple of 16 from 256 to 512 (an H100, max_num_seqs 1024)",
             f"a batch of {n} replays the smallest captured size at least {n}: {graph}",
             f"padded rows: {graph} - {n} = {pad} ({fmt(100 * pad / graph)}% of the graph's rows)"],
            "Continuous batching changes the batch size every step, so most steps replay a slightly larger graph; the "
            "padded rows cost almost nothing while decode is memory-bound.", rtol=0,
            mistakes={"pads to the next power of two": pow2(n) - n, **extra})

    q = ask(small, f"A server runs vLLM v0.33.0 on one H100 with its default CUDA graphs for decode (sizes 1, 2, 4, then every "
                   f"multiple of 8 below 256, then every multiple of 16 up to 512). A decode step has {small} running "
                   "requests. How many padded rows does the graph it replays compute?",
            {"pads to a multiple of 16 below 256 too (the sizes there are multiples of 8)": -(-small // 16) * 16 - small})
    q.follow_ups.append(ask(large, f"Now {large} requests are running: padded rows?",
                            {"keeps padding to multiples of 8 past 256 (the sizes there are multiples of 16)":
                             -(-large // 8) * 8 - large}))
    return q


@template(STEM, "explain the costs of continuous batching")
def explain(rng, ref):
    return Open(
        "Re-forming the batch after every decode step raises throughput. What does it cost, and what does an engine "
        "need before it can do it?",
        ["a scheduling decision every step (CPU overhead between steps, which has to stay small)",
         "ragged batches: sequences at different positions, so attention needs per-sequence lengths (varlen kernels)",
         "KV memory freed and granted at fine grain, i.e. a paged KV cache, or reserving the maximum wastes it",
         "new prompts' prefill lands in decode steps and slows them (chunked prefill bounds that)",
         "an admission rule (FCFS) and preemption when memory runs out, so long requests are not starved",
         "the gain is E[max of B] / E[L] when steps are memory-bound; larger for long-tailed output lengths"],
        "The unit of scheduling becomes one step, so everything a step touches must be cheap to change.")
