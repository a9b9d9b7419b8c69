"""Lesson 04 questions: what reserving the maximum wastes, what paging leaves, slot mapping, copy-on-write, and
reserving to completion (TensorRT-LLM's GUARANTEED_NO_EVICT) against optimistic admission."""
from __future__ import annotations

from reference_engine.sim.trace import Request

from .pools import pick
from .question import Numeric, Open, fmt, template

STEM = "l04_paged_attention"


def last_step(ref, p: int, o: int, mode: str, max_context: int, block_size: int = 16) -> tuple[int, int]:
    """(tokens stored, token slots allocated) when a lone request of p prompt + o output tokens finishes."""
    r = ref.replay_kv([Request(0.0, p, o)], capacity_tokens=max_context, mode=mode, max_context=max_context,
                      block_size=block_size)
    return r.tokens[-1], r.allocated[-1]


@template(STEM, "reserve-the-maximum use")
def reserve_use(rng, ref):
    m = pick(rng, [2048, 4096, 8192])
    p, o = rng.randrange(50, m // 2), rng.randrange(20, m // 4)
    tokens, slots = last_step(ref, p, o, "max", m)
    q = Numeric(
        f"An engine reserves KV room for the model's maximum context, {m:,} tokens, when it admits a request. A request "
        f"with a {p:,}-token prompt generates {o:,} tokens. When it finishes, what share of its reservation holds tokens?",
        "%", 100 * tokens / slots,
        [f"reserved: {slots:,} token slots (the maximum: the output length is unknown at admission)",
         f"stored when it finishes: {p:,} + {o:,} = {tokens:,} tokens", f"share = {fmt(100 * tokens / slots)}%"],
        "Reserving for the worst case pays for the whole context while a typical request uses a small part of it.",
        mistakes={"gives the wasted share, not the used one": 100 * (1 - tokens / slots),
                  "counts only the prompt as stored": 100 * p / slots})
    bs = pick(rng, [16, 32])
    t2, s2 = last_step(ref, p, o, "paged", m, bs)
    q.follow_ups.append(Numeric(
        f"Now the cache is paged in blocks of {bs} tokens, a block granted when a token spills into it: the share of its "
        "blocks holding tokens when it finishes?", "%", 100 * t2 / s2,
        [f"blocks: ceil({t2:,} / {bs}) = {s2 // bs}, i.e. {s2:,} slots", f"share = {t2:,} / {s2:,} = {fmt(100 * t2 / s2)}%"],
        "Paging leaves at most one partly filled block per sequence.", rtol=0.005,
        mistakes={"keeps the reservation of the maximum": 100 * tokens / slots}))
    return q


@template(STEM, "paged tail waste")
def paged_tail(rng, ref):
    bs = pick(rng, [8, 16, 32])
    p, o = rng.randrange(20, 3000), rng.randrange(10, 1000)
    if (p + o) % bs == 0:
        o += 1
    tokens, slots = last_step(ref, p, o, "paged", 8192, bs)
    q = Numeric(
        f"A paged KV cache with {bs}-token blocks. A sequence has a {p:,}-token prompt and has generated {o:,} tokens. "
        "How many token slots of its blocks are empty?", "tokens", slots - tokens,
        [f"tokens: {tokens:,}; blocks: ceil({tokens:,} / {bs}) = {slots // bs}", f"slots: {slots:,}; empty: {slots - tokens}"],
        "Internal fragmentation is confined to the last block: under one block per sequence.", rtol=0,
        mistakes={"counts a whole block": bs, "gives the tokens in the last block, not the empty slots": tokens % bs})
    bs2 = 2 * bs
    t2, s2 = last_step(ref, p, o, "paged", 8192, bs2)
    q.follow_ups.append(Numeric(
        f"Now the blocks hold {bs2} tokens: empty slots?", "tokens", s2 - t2,
        [f"ceil({t2:,} / {bs2}) = {s2 // bs2} blocks = {s2:,} slots; empty: {s2 - t2}"],
        "Bigger blocks mean fewer table entries and longer kernel tiles, at the price of a longer tail.", rtol=0))
    return q


@template(STEM, "slot mapping")
def slot(rng, ref):
    import torch

    bs = pick(rng, [4, 8, 16])
    table = rng.sample(range(1, 64), rng.randrange(3, 6))
    pos = rng.randrange(bs, len(table) * bs)

    def ask(p, prompt):
        s = int(ref.slot_mapping(torch.tensor(table), torch.tensor([p]), bs)[0])
        j = p // bs
        return Numeric(
            prompt, "", s,
            [f"logical block = {p} // {bs} = {j}, offset = {p} % {bs} = {p % bs}",
             f"physical block = table[{j}] = {table[j]}", f"slot = {table[j]} x {bs} + {p % bs} = {s}"],
            "The block table is a page table: logical position to physical block, offset unchanged.", rtol=0,
            mistakes={"forgets to multiply the block id by the block size": table[j] + p % bs,
                      "uses the logical position (ignores the table)": p})

    q = ask(pos, f"Block size {bs}; a sequence's block table is {table}. The cache is viewed as one row per token slot "
                 f"(block id x block size + offset). Which row holds the K/V of its token at position {pos}?")
    other = pick(rng, [x for x in range(len(table) * bs) if x // bs != pos // bs])
    q.follow_ups.append(ask(other, f"And the token at position {other}?"))
    return q


@template(STEM, "requests admitted at once")
def admitted(rng, ref):
    m = pick(rng, [2048, 4096, 8192])
    cap = rng.randrange(100_000, 600_000) // 16 * 16
    p, o = rng.randrange(100, m // 2), rng.randrange(50, m // 4)
    need = -(-(p + 1) // 16) * 16
    reqs = [Request(0.0, p, o)] * (cap // need + 8)  # more than can fit, however they are counted

    def first(mode, bs=16):
        return ref.replay_kv(reqs, capacity_tokens=cap, mode=mode, max_context=m, block_size=bs, max_steps=1).running[0]

    q = Numeric(
        f"A KV pool of {cap:,} token slots; requests all waiting, each a {p:,}-token prompt that will generate {o:,} tokens. "
        f"Reserving the maximum context ({m:,} tokens) per request, how many run at once?", "requests", first("max"),
        [f"each admission reserves {m:,} slots", f"{cap:,} // {m:,} = {first('max')}"],
        "Reserve-the-maximum admits by the worst case, so the batch is capped by it.", rtol=0,
        mistakes={"reserves prompt + output (would need to know the output length)": first("oracle")})
    q.follow_ups.append(Numeric(
        "Now paged with 16-token blocks, a request admitted when the blocks for its prompt and first token are free: "
        "how many does the first step admit?", "requests", first("paged"),
        [f"blocks at admission: ceil(({p:,} + 1) / 16) = {need // 16} = {need:,} slots",
         f"{cap:,} // {need:,} = {first('paged')} (they grow a block at a time; preemption frees room if they collide)"],
        "Paging admits on what a request holds now, not on what it might need: several times the batch.", rtol=0,
        mistakes={"keeps the reservation of the maximum": first("max")}))
    return q


@template(STEM, "no-evict reservation against optimistic admission")
def no_evict(rng, ref):
    """TensorRT-LLM's GUARANTEED_NO_EVICT reserves a request's remaining blocks to completion (prompt + max_tokens:
    tensorrt_llm/_torch/pyexecutor/scheduler/scheduler.py, GuaranteedNoEvictPolicy); vLLM allocates blocks for the
    tokens it schedules (vllm/v1/core/kv_cache_manager.py, allocate_slots), so a prompt needs its own blocks."""
    bs = 16
    pool = rng.randrange(5_000, 40_001, 100)
    p, m = rng.randrange(200, 3001, 10), pick(rng, [512, 1024, 2048, 4096])
    blocks = lambda n: -(-n // bs)  # noqa: E731
    reserve = pool // blocks(p + m)
    eager = pool // blocks(p)
    q = Numeric(
        f"A KV pool of {pool:,} blocks of {bs} tokens. Requests wait, each with a {p:,}-token prompt and max_tokens "
        f"{m:,}. TensorRT-LLM's default capacity policy, GUARANTEED_NO_EVICT, never pauses a started request. How many "
        "requests does it start at once (batch-slot limits aside)?", "requests", reserve,
        [f"never pausing means reserving every block a request may need to finish: prompt + max_tokens = {p + m:,} "
         f"tokens = ceil({p + m:,} / {bs}) = {blocks(p + m)} blocks", f"{pool:,} // {blocks(p + m)} = {reserve}"],
        "A guarantee against eviction is paid for up front, in blocks reserved for tokens that may never come.",
        rtol=0, mistakes={"reserves only the prompt's blocks (that is optimistic admission)": eager,
                          "reserves max_tokens without the prompt": pool // blocks(m),
                          "divides tokens by tokens, forgetting that blocks round up": pool * bs // (p + m)})
    q.follow_ups.append(Numeric(
        "vLLM admits a request when the blocks for the tokens it schedules now are free (its whole prompt, with "
        "chunking aside) and preempts later if the pool runs out. How many start on the same pool?", "requests", eager,
        [f"the prompt's blocks: ceil({p:,} / {bs}) = {blocks(p)}", f"{pool:,} // {blocks(p)} = {eager}: "
         f"{fmt(eager / reserve)}x as many, until their outputs outgrow the pool and some are preempted"],
        "Optimistic admission runs the bigger batch and pays with preemptions (recomputes) when outputs run long.",
        rtol=0, mistakes={"keeps the reservation to completion": reserve}))
    return q


@template(STEM, "copy-on-write")
def copy_on_write(rng, ref):
    n_blocks, k, n = pick(rng, [64, 128, 256]), rng.randrange(3, 20), pick(rng, [2, 3, 4, 6, 8])
    a = ref.PagedBlockAllocator(n_blocks)
    table = [a.allocate() for _ in range(k)]
    tables = [table] + [a.fork(table) for _ in range(n - 1)]
    for t in tables:  # every sample writes its next token into the shared, partly filled last block
        a.append_slot(t)
    free = a.num_free()
    q = Numeric(
        f"A pool of {n_blocks} KV blocks. A prompt fills {k} blocks, the last one partly. Parallel sampling forks it "
        f"into {n} sequences (the original and {n - 1} forks), then each writes its next token. With ref-counted blocks "
        "and copy-on-write, how many blocks are free after those writes?", "blocks", free,
        [f"the prompt takes {k} blocks; each fork shares them all (ref count {n}), copying nothing",
         f"a write to the shared last block copies it: {n - 1} copies; the last writer finds ref count 1 and writes in place",
         f"used {k} + {n - 1} = {n_blocks - free}; free {free}"],
        "Forks share blocks by reference; only the block being written is ever copied, and only while shared.", rtol=0,
        mistakes={"copies every block at fork": n_blocks - k * n, "copies for every writer, the last one too": n_blocks - k - n})
    q.follow_ups.append(Numeric(
        "And the ref count of the prompt's first block now?", "", a.ref_count(table[0]),
        [f"it was never written, so all {n} sequences still hold it: ref count {a.ref_count(table[0])}"],
        "A full, read-only prefix stays shared for as long as the samples live.", rtol=0,
        mistakes={"treats forks as copies": 1}))
    return q


@template(STEM, "explain paging")
def explain(rng, ref):
    return Open(
        "Engines before vLLM reserved each request's maximum context up front. What did that waste, how does paging "
        "fix it, and what happens when the blocks run out?",
        ["reserving the maximum (the output length is unknown) leaves most of the reservation empty: 20-38% used in "
         "the PagedAttention paper's measurements",
         "fixed-size blocks and a per-sequence block table, like a page table: contiguous logically, anywhere physically",
         "a block is granted only when a token spills into it, so the waste is the last block's tail",
         "slot = table[p // block_size] x block_size + p % block_size; attention kernels read K/V through the table",
         "ref-counted blocks: fork shares them, a write to a shared block copies it first (copy-on-write)",
         "out of blocks: preempt (free the newest request's blocks and recompute it later: vLLM V1 has no swap path; "
         "V0 could also swap it to CPU memory), or never preempt by reserving prompt + max_tokens up front "
         "(TensorRT-LLM's default GUARANTEED_NO_EVICT), which admits fewer requests",
         "the payoff is a larger running batch, hence throughput at the same latency"],
        "Allocate KV like virtual memory: on demand, in pages, shared by reference.")
