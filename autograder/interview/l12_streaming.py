"""Lesson 12 questions: what vanished, slow and retrying clients cost a GPU slot, the defenses (an idempotency cache
across replicas included), and what streaming an answer's text costs. Idempotency-Key and X-Resume-From are this
course's server's headers, not OpenAI's API."""
from __future__ import annotations

from reference_engine.sim.gpu_model import H100, LLAMA_3_8B, Composition, kv_bytes_per_token, step_time

from .pools import pick
from .question import Numeric, Open, fmt, template

STEM = "l12_streaming"


def itl_s(batch: int, context: int) -> float:
    """Modeled H100 (estimate) decode step of Llama-3-8B."""
    return step_time(LLAMA_3_8B, H100, Composition.decode_batch(batch, context)).time_s


def setting(rng):
    batch, context = pick(rng, [32, 64, 128]), pick(rng, [1024, 2048, 4096])
    prompt = pick(rng, [500, 1000, 2000])
    max_tokens = pick(rng, [500, 1000, 2000])
    received = pick(rng, [10, 50, 100, 200])
    return batch, context, prompt, max_tokens, received


def _where(batch, context) -> str:
    return (f"Llama-3-8B on one H100, decode batch {batch} at {context} tokens of context: one decode step takes "
            f"{fmt(itl_s(batch, context) * 1e3)} ms (modeled)")


@template(STEM, "slot-seconds of a vanished client")
def vanished_slot_seconds(rng, ref):
    batch, context, prompt, max_tokens, received = setting(rng)
    step = itl_s(batch, context)
    c = ref.vanished_cost(prompt, received, max_tokens, step)
    d = ref.vanished_cost(prompt, received, max_tokens, step, detect_steps=1)
    q = Numeric(
        f"{_where(batch, context)}. A client asked for {max_tokens} tokens and closed the connection after {received}. "
        "The server never notices. How many slot-seconds does the engine spend on tokens nobody reads?", "s",
        c["slot_seconds"],
        [f"tokens left: {max_tokens} - {received} = {c['wasted_tokens']}",
         f"one step each: {c['wasted_tokens']} x {fmt(step * 1e3)} ms = {fmt(c['slot_seconds'])} s"],
        "Without disconnect detection the request runs to its last token for nobody.",
        mistakes={"counts the whole answer": max_tokens * step, "counts only the tokens received": received * step})
    q.follow_ups.append(Numeric(
        "Now the server watches for the disconnect and the abort lands before the next step. Slot-seconds wasted?", "s",
        d["slot_seconds"], [f"one step: {fmt(d['slot_seconds'] * 1e3)} ms"],
        "The engine loop applies queued aborts between steps: one step at most.",
        mistakes={"still counts the rest of the answer": c["slot_seconds"]}))
    return q


@template(STEM, "KV blocks a vanished client holds")
def vanished_blocks(rng, ref):
    batch, context, prompt, max_tokens, received = setting(rng)
    c = ref.vanished_cost(prompt, received, max_tokens, itl_s(batch, context))
    per_token = kv_bytes_per_token(LLAMA_3_8B)
    gib = c["blocks_held"] * 16 * per_token / 2**30
    q = Numeric(
        f"Llama-3-8B (bf16 KV cache: {per_token // 1024} KiB per token), 16-token blocks. A request with a {prompt}-token "
        f"prompt and max_tokens {max_tokens}; its client vanishes after {received} tokens and the server does not notice. "
        "How many GiB of KV cache does it hold by the time it finishes?", "GiB", gib,
        [f"it runs to the end: {prompt} + {max_tokens} = {prompt + max_tokens} tokens in context",
         f"ceil({prompt + max_tokens} / 16) = {c['blocks_held']} blocks x 16 x {per_token} B = {fmt(gib)} GiB"],
        "An undetected disconnect keeps growing the KV footprint of an answer nobody reads.",
        mistakes={"counts only the prompt": -(-prompt // 16) * 16 * per_token / 2**30,
                  "stops at the tokens received": -(-(prompt + received) // 16) * 16 * per_token / 2**30})
    d = ref.vanished_cost(prompt, received, max_tokens, 1.0, detect_steps=1)
    q.follow_ups.append(Numeric(
        "Now the server notices the disconnect and aborts before the next step. GiB held when it is freed?", "GiB",
        d["blocks_held"] * 16 * per_token / 2**30,
        [f"{prompt} + {received} + 1 = {prompt + received + 1} tokens: {d['blocks_held']} blocks",
         f"{d['blocks_held']} x 16 x {per_token} B = {fmt(d['blocks_held'] * 16 * per_token / 2**30)} GiB, then freed"],
        "Detection caps the footprint at what the client actually received.",
        mistakes={"still counts the whole answer": gib}))
    return q


@template(STEM, "share of decode capacity lost to vanished clients")
def capacity_lost(rng, ref):
    frac = pick(rng, [0.05, 0.1, 0.2])
    max_tokens, received = pick(rng, [500, 1000]), pick(rng, [50, 100, 200])
    wasted = ref.vanished_cost(0, received, max_tokens, 1.0)["wasted_tokens"]
    # per request on average: useful tokens are max_tokens for the others and received for the vanished ones
    useful = (1 - frac) * max_tokens + frac * received
    share = 100 * frac * wasted / (useful + frac * wasted)
    q = Numeric(
        f"Every answer is {max_tokens} tokens; {fmt(100 * frac)}% of clients vanish after {received} tokens and the server "
        "does not notice. What share of all generated tokens does nobody read?", "%", share,
        [f"per request: useful {fmt(1 - frac)} x {max_tokens} + {fmt(frac)} x {received} = {fmt(useful)} tokens",
         f"wasted {fmt(frac)} x {wasted} = {fmt(frac * wasted)} tokens",
         f"share = {fmt(frac * wasted)} / {fmt(useful + frac * wasted)} = {fmt(share)}%"],
        "That share of the decode capacity is lost for good: the same GPUs serve fewer real tokens.",
        mistakes={"gives the share of clients": 100 * frac})
    d = ref.vanished_cost(0, received, max_tokens, 1.0, detect_steps=1)["wasted_tokens"]
    share1 = 100 * frac * d / (useful + frac * d)
    q.follow_ups.append(Numeric(
        "Now the server aborts within one step of each disconnect. Share of generated tokens nobody reads?", "%", share1,
        [f"wasted per vanished client: {d} token", f"share = {fmt(frac * d)} / {fmt(useful + frac * d)} = {fmt(share1)}%"],
        "Detection turns the waste from the rest of the answer into one step.",
        mistakes={"still counts the rest of the answer": share}))
    return q


@template(STEM, "buffer memory bound")
def buffer_memory(rng, ref):
    streams, hw = pick(rng, [1000, 5000, 20000]), pick(rng, [64, 256, 1024])
    size = pick(rng, [4, 8])
    b = ref.buffer_bytes(streams, hw, size)
    q = Numeric(
        f"A server holds {streams} streams; each per-stream buffer gives up past {hw} waiting tokens, stored as {size}-byte "
        "ids. The most memory those buffers can hold together, in MB?", "MB", b / 1e6,
        [f"{streams} x {hw} tokens x {size} B = {fmt(b / 1e6)} MB"],
        "A high-water mark turns 'unbounded while a reader stalls' into a number you can provision.",
        mistakes={"counts one stream": hw * size / 1e6})
    b2 = ref.buffer_bytes(streams, 4 * hw, size)
    q.follow_ups.append(Numeric(
        f"Slow mobile readers get dropped too often, so the high-water mark goes up to {4 * hw} tokens. The bound now, "
        "in MB?", "MB", b2 / 1e6, [f"{streams} x {4 * hw} x {size} B = {fmt(b2 / 1e6)} MB"],
        "The bound scales linearly: a more patient server buys tolerance with memory.",
        mistakes={"keeps the old bound": b / 1e6}))
    return q


@template(STEM, "tokens generated twice without idempotency")
def retry_tokens(rng, ref):
    n, frac, before = pick(rng, [1000, 10000]), pick(rng, [0.02, 0.05, 0.1]), pick(rng, [100, 300, 500])
    w = ref.retry_waste(n, frac, before, False)
    q = Numeric(
        f"{n} requests; {fmt(100 * frac)}% lose the connection after {before} tokens and retry the same request. Without "
        "an idempotency key each retry is a new generation. How many tokens are generated twice?", "tokens", w,
        [f"{fmt(frac * n)} retries x {before} tokens made again = {fmt(w)}"],
        "A retry without a key is indistinguishable from a new request, so its answer is generated again.",
        mistakes={"counts every request": n * before})
    q.follow_ups.append(Numeric(
        "Now each retry carries an Idempotency-Key and X-Resume-From with the count it holds. Tokens generated twice?",
        "tokens", ref.retry_waste(n, frac, before, True),
        ["the retry replays the cached tokens and continues from the last one: none is decoded again"],
        "One generation per key; the continuation prefills prompt + tokens once instead of decoding them again.",
        rtol=0))
    return q


@template(STEM, "an idempotency cache across replicas")
def replica_cache(rng, ref):
    replicas, n, frac = pick(rng, [2, 3, 4, 8]), pick(rng, [1000, 10000]), pick(rng, [0.02, 0.05, 0.1])
    before = pick(rng, [100, 300, 500])
    retries = n * frac
    miss = 1 - 1 / replicas
    twice = miss * ref.retry_waste(n, frac, before, False)
    q = Numeric(
        f"The server runs as {replicas} replicas behind a load balancer that routes each request at random. Each "
        f"replica keeps its own Idempotency-Key cache. Of {n} requests, {fmt(100 * frac)}% lose the connection after "
        f"{before} tokens and retry with their key. How many tokens are generated twice?", "tokens", twice,
        [f"a retry lands on the replica holding its key with probability 1/{replicas}",
         f"misses: {fmt(retries)} retries x {fmt(miss)} = {fmt(retries * miss)}, each regenerating {before} tokens",
         f"= {fmt(twice)} tokens"],
        "A per-replica cache only deduplicates retries that reach the same replica: share the key store, or route "
        "by key (hash it) so a retry reaches the replica that holds its generation.",
        mistakes={"assumes the per-replica cache catches every retry": 0.0,
                  "counts every retry as a miss": ref.retry_waste(n, frac, before, False),
                  "takes the hit rate 1/R as the miss rate": retries * before / replicas})
    q.follow_ups.append(Numeric(
        "The balancer now hashes the Idempotency-Key to pick the replica (sticky by key). Tokens generated twice, "
        "if no replica restarts?", "tokens", 0.0,
        ["every retry reaches the replica that holds its key: the cache finds it, replay and resume"],
        "Routing by key turns a per-replica cache into a correct one, as long as that replica lives.",
        mistakes={"keeps the random-routing miss rate": twice}, rtol=0))
    return q


@template(STEM, "token ids decoded to stream an answer's text")
def decode_cost(rng, ref):
    n, per, window = pick(rng, [600, 1000, 1200, 2000, 2400, 4000]), pick(rng, [1, 2, 4]), pick(rng, [2, 3, 4])
    chunks = n // per
    whole = per * chunks * (chunks + 1) // 2
    each = "one token" if per == 1 else f"{per} tokens"
    q = Numeric(
        f"A server streams an answer of {n} tokens, {each} per chunk. For each chunk it decodes every token of the "
        "answer so far and sends the text that is new. How many token ids does it decode over the whole answer?",
        "tokens", whole,
        [f"{chunks} chunks; chunk k decodes {per if per > 1 else ''}{'k' if per == 1 else ' x k'} token ids",
         f"{per} x (1 + 2 + ... + {chunks}) = {per} x {chunks} x {chunks + 1} / 2 = {fmt(whole)}"],
        "Decoding the whole answer at every chunk is quadratic in its length, and it runs on the event loop that "
        "serves every stream.",
        mistakes={"counts each token once": n, "counts n^2": n * n})
    q.follow_ups.append(Numeric(
        f"It now decodes a window instead, as vLLM does: per token, the tokens since the text last ended in a whole "
        f"character and the run before them, {window} token ids on average here. Token ids decoded over the answer?",
        "tokens", window * n, [f"{n} tokens x {window} = {fmt(window * n)}"],
        "Linear in the answer's length: the text already decoded is kept, and only a window can still change.",
        mistakes={"still counts the whole answer": whole}))
    return q


@template(STEM, "four kinds of hostile client")
def hostile_clients(rng, ref):
    return Open(
        "A streamed answer holds a GPU slot until its last token. Name the ways clients waste that slot and the "
        "server-side defense for each.",
        ["slow reader: bounded per-stream buffer, coalesce the backlog into fewer events, abort past a high-water "
         "mark or time limit; the engine never waits for a socket",
         "vanished client: watch for the disconnect (ASGI http.disconnect) and abort the engine request before the "
         "next step, freeing slot and KV blocks",
         "retry: Idempotency-Key -> one generation; attach while in flight, replay when finished; never evict a "
         "live entry",
         "half-finished answer: resume from the count the client holds; continue with prompt + generated tokens "
         "(one prefill), never regenerate; the tail matches an uninterrupted greedy run only with batch-invariant "
         "kernels on a GPU",
         "deployment: a per-replica key cache misses (R - 1) / R of retries under random routing (shared store or "
         "routing by key); a buffering proxy holds SSE chunks (nginx proxy_buffering; X-Accel-Buffering: no); a "
         "half-open client needs a write deadline or heartbeat, since Linux TCP keepalive starts after 7,200 s",
         "SSE framing: blank line ends an event, keep-alive comments for idle proxies, [DONE]; bad input 4xx",
         "measure it: aborts by cause, leaked blocks = 0, duplicate generations = 0"],
        "Each client failure mode wastes the slot in a different way, so each needs its own defense.")
