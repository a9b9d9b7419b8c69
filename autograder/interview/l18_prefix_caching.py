"""Lesson 18 questions: tokens a prefill still computes, prefill time saved, the KV a cached prefix holds, a
workload's hit rate, hash-chain hits after an edit, what eviction frees under a lock, and hits across replicas
under round robin vs prefix-aware routing; in words, a dashboard, routing, and isolating tenants."""
from __future__ import annotations

from dataclasses import replace

from reference_engine.sim import gpu_model as gm

from .pools import SHAPES, describe, hf_config, pick
from .question import Numeric, Open, fmt, template

STEM = "l18_prefix_caching"
# The lesson's prefill_seconds prices one GPU running the whole model: Llama-3-8B, which fits on each chip.
MODELS = {"llama-3-8b": gm.LLAMA_3_8B}
SHARED_IDS, OWN_IDS = (1, 16_000), (16_000, 32_000)  # shared text and a request's own text never share an id


def ids(rng, n: int, span=SHARED_IDS) -> list[int]:
    """n seeded token ids (content does not matter to a prefix cache, only which tokens repeat)."""
    return [rng.randrange(*span) for _ in range(n)]


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def not_multiple(rng, lo: int, hi: int, page: int) -> int:
    """A length in lo..hi-1 that is not a whole number of pages (so a partial block exists)."""
    while True:
        n = rng.randrange(lo, hi)
        if n % page:
            return n


def cached_tokens(ref, page: int, cached: list[int], prompt: list[int]) -> tuple[int, int]:
    """(matched tokens, tokens the prefill may skip) for `prompt` against a RadixTree(page) holding `cached`:
    skipped = the matched whole pages, at most prompt - 1 tokens (the lesson's admission rule: the last prompt
    token is computed, its logits give the first output token)."""
    tree = ref.RadixTree(page)
    tree.insert(cached, list(range(len(cached) // page)))
    blocks, _ = tree.match_prefix(prompt)
    return len(blocks) * page, min(len(blocks), (len(prompt) - 1) // page) * page


@template(STEM, "tokens a prefill computes")
def computed(rng, ref):
    P = pick(rng, [16, 32])
    S = rng.randrange(600, 4001)
    k = not_multiple(rng, 100, S - 1, P)
    prev = ids(rng, S)
    prompt = prev[:k] + ids(rng, rng.randrange(50, 1500), OWN_IDS)
    L = len(prompt)
    _, skip = cached_tokens(ref, P, prev, prompt)
    _, per_token = cached_tokens(ref, 1, prev, prompt)
    q = Numeric(
        f"A prefix cache with {P}-token blocks holds the KV of an earlier request's {S:,}-token prompt (its full "
        f"blocks). A new request's prompt is {L:,} tokens: its first {k:,} equal the earlier prompt's (an agent "
        f"branching off that context), token {k + 1:,} differs. How many of its prompt tokens must the prefill compute?", "tokens", L - skip,
        [f"matches are whole blocks: blocks 1..{k // P} ({k // P * P:,} tokens) match in full; block {k // P + 1} "
         f"(tokens {k // P * P + 1:,}..{(k // P + 1) * P:,}) differs at token {k + 1:,}: a miss, though part of it matches",
         f"skipped: {skip:,} tokens (at most the prompt minus its last token, {L - 1:,})",
         f"computed: {L:,} - {skip:,} = {L - skip:,}"],
        "A block is shared only if every token in it, and every token before it, is the same.", rtol=0,
        mistakes={"counts a partly matched block as a hit (matches per token)": L - per_token,
                  "gives the cached tokens, not the ones computed": skip})
    m = S // P
    again = prev[:m * P]
    matched, skip2 = cached_tokens(ref, P, prev, again)
    q.follow_ups.append(Numeric(
        f"Now a request's prompt is exactly the earlier prompt's first {m * P:,} tokens ({m} full blocks, all cached). "
        "How many tokens does its prefill compute?", "tokens", m * P - skip2,
        [f"all {m} blocks match ({matched:,} tokens), but the first output token needs the logits of the last prompt "
         "token, so that token must be computed",
         f"block-aligned, the skip stops one block short: {skip2:,} skipped, the last block's {m * P - skip2} tokens "
         "computed"],
        "A fully cached prompt still computes its last token; with whole blocks, vLLM recomputes that token's block.",
        rtol=0, mistakes={"forgets that the last prompt token is always computed": m * P - matched,
                          "recomputes only the last token, as if the cache were per token, not per block": 1}))
    return q


@template(STEM, "prefill time saved")
def prefill_saved(rng, ref):
    model, chip = pick(rng, sorted(MODELS)), pick(rng, sorted(gm.CHIPS))
    S, U = pick(rng, [1000, 2000, 4000, 8000]), rng.randrange(200, 3001, 100)

    def saved(s):
        return ref.prefill_seconds(s + U, 0, model, chip) - ref.prefill_seconds(U, s, model, chip)

    def ask(s, prompt):
        full, rest = ref.prefill_seconds(s + U, 0, model, chip), ref.prefill_seconds(U, s, model, chip)
        alone = ref.prefill_seconds(U, 0, model, chip)
        return Numeric(
            prompt, "ms", saved(s) * 1e3,
            [f"without the cache: one prefill of {s + U:,} tokens: {fmt(full * 1e3)} ms (modeled)",
             f"with it: {U:,} new tokens, each still attending to the {s:,} cached ones: {fmt(rest * 1e3)} ms",
             f"saved: {fmt(full * 1e3)} - {fmt(rest * 1e3)} = {fmt(saved(s) * 1e3)} ms per request"],
            "The cache skips the prefix's GEMMs and its attention to itself; the new tokens still read the prefix's KV.",
            rtol=0.02, mistakes={"forgets that the new tokens still attend to the cached prefix": (full - alone) * 1e3,
                                 "scales the full prefill by the prefix's share of the tokens": full * s / (s + U) * 1e3,
                                 "gives the prefill time with the cache, not the time saved": rest * 1e3,
                                 "gives the prefill time without the cache, not the time saved": full * 1e3})

    q = ask(S, f"Modeled {gm.CHIPS[chip].name} (reference_engine/sim/gpu_model.py: roofline kernels at achievable fractions "
               f"of the datasheet peaks), {MODELS[model].name} in bf16 on one GPU. Every request starts with the same "
               f"{S:,}-token system prompt followed by {U:,} tokens of its own. With a prefix cache holding the system "
               "prompt's KV, how many ms of prefill does each request save? (The prefill alone in its step, no per-step "
               "overhead.)")
    q.follow_ups.append(ask(20_000, f"Now the shared prefix is 20,000 tokens (the same {U:,} of its own): ms saved per "
                                    "request?"))
    q.follow_ups[0].why = (f"{20_000 / S:g}x the prefix tokens save {fmt(saved(20_000) / saved(S))}x the time: the "
                           "prefix's attention to itself grows with its square.")
    per_hour = pick(rng, [1000, 3600, 36_000])
    fill = ref.prefill_seconds(S, 0, model, chip)
    total = per_hour * saved(S) - fill
    q.follow_ups.append(Numeric(
        f"Back to the {S:,}-token prefix, at {per_hour:,} requests an hour: GPU-seconds of prefill saved per hour, "
        "counting the one prefill per hour that fills the cache?", "s", total,
        [f"{per_hour:,} x {fmt(saved(S) * 1e3)} ms = {fmt(per_hour * saved(S))} s",
         f"- one prefill of the prefix alone, {fmt(fill * 1e3)} ms: {fmt(total)} GPU-seconds per hour "
         f"({fmt(total / 3600)} of one GPU's hour)"],
        "The saving scales with the request rate; the cost of filling the cache does not.", rtol=0.02,
        mistakes={"forgets that the new tokens still attend to the cached prefix":
                  per_hour * (ref.prefill_seconds(S + U, 0, model, chip) - ref.prefill_seconds(U, 0, model, chip)) - fill,
                  "gives the saving of one request": saved(S)}))
    return q


def gpus_text(tp: int) -> str:
    return "one GPU" if tp == 1 else f"tensor parallel over {tp} GPUs"


@template(STEM, "KV a cached prefix holds")
def prefix_memory(rng, ref):
    shape, P = pick(rng, SHAPES), 16
    tp = 1 if shape is gm.LLAMA_3_8B else 4  # the 70B's bf16 weights need several GPUs
    S, n = not_multiple(rng, 500, 20_001, P), pick(rng, [1, 2, 4, 8])
    blocks = len(ref.block_hashes(ids(rng, S), P))  # the full blocks vLLM keys and can share

    def ask(kv_bytes, t, prompt):
        per = gm.kv_bytes_per_token(replace(shape, kv_bytes=kv_bytes), t)
        b = n * blocks * P * per
        mistakes = {"counts only K, not K and V": b / 2 / 1e6, "gives MiB where MB is asked": b / 2**20,
                    "counts the partly filled last block as cached": n * -(-S // P) * P * per / 1e6}
        if t > 1:
            mistakes["forgets the tensor-parallel split of the KV heads"] = b * t / 1e6
        return Numeric(
            prompt, "MB", b / 1e6,
            [f"cached: whole blocks only: floor({S:,} / {P}) = {blocks} blocks = {blocks * P:,} tokens per prompt (the "
             f"last {S % P} tokens stay in the request's own partial block)",
             f"KV per token per GPU: 2 (K and V) x {shape.layers} layers x {shape.kv_heads // t} KV head(s) x "
             f"{shape.head_dim} x {kv_bytes} byte(s) = {per:,} bytes" + (f" ({shape.kv_heads} KV heads / {t} GPUs)" if t > 1 else ""),
             f"{n} x {blocks * P:,} tokens x {per:,} bytes = {fmt(b)} bytes = {fmt(b / 1e6)} MB"],
            "A cached prefix is pool memory running requests could use: its price is tokens x the model's KV per token.",
            rtol=0.01, mistakes=mistakes)

    q = ask(2, tp, f"{shape.name} ({describe(hf_config(shape))}), {gpus_text(tp)}, KV cache in bf16 with {P}-token "
                   f"blocks. The prefix cache keeps the KV of {plural(n, 'system prompt')} of {S:,} tokens"
                   f"{' each' if n > 1 else ''} (vLLM-style: it shares only full blocks). How many MB (1e6 bytes) of it does each GPU hold?")
    q.follow_ups.append(ask(1, tp, "Now the KV cache is fp8: MB per GPU?"))
    q.follow_ups.append(ask(2, 8, "Back to bf16, with the model tensor parallel over 8 GPUs: MB per GPU?"))
    q.follow_ups[1].why = "Tensor parallelism splits the KV heads across GPUs, so each holds its share of every token."
    return q


def per_token_rate(ref, calls) -> float:
    """shared_upper_bound's hit rate with 1-token pages, found with a RadixTree(1) (sha256 per token is slow)."""
    tree, hit = ref.RadixTree(1), 0
    for c in calls:
        hit += min(len(tree.match_prefix(c.prompt)[0]), len(c.prompt) - 1)
        seen = c.prompt + c.output[:-1]
        tree.insert(seen, list(range(len(seen))))
    return hit / sum(len(c.prompt) for c in calls)


@template(STEM, "hit rate of a shared system prompt")
def hit_rate(rng, ref):
    P, apps, N = pick(rng, [16, 32, 64]), pick(rng, [1, 2, 3, 4]), rng.randrange(6, 13)
    S = rng.randrange(8, 26) * P + rng.randrange(P // 2, P)  # a partial last block of at least half a block
    systems = [ids(rng, S) for _ in range(apps)]
    order = [rng.randrange(apps) for _ in range(N)]
    users = [[OWN_IDS[0] + i] + ids(rng, rng.randrange(20, 400), OWN_IDS) for i in range(N)]  # unique first token
    calls = [ref.Call(float(i), systems[a] + u, [1], -1) for i, (a, u) in enumerate(zip(order, users))]
    rate, per_token = ref.shared_upper_bound(calls, P), per_token_rate(ref, calls)
    total, used, h = sum(len(c.prompt) for c in calls), len(set(order)), S // P * P
    q = Numeric(
        f"{plural(apps, 'app')}, {'each ' if apps > 1 else ''}with its own {S:,}-token system prompt. {N} requests arrive, as (app, tokens of its own "
        f"after the system prompt): {[(a + 1, len(u)) for a, u in zip(order, users)]}. A prefix cache with {P}-token "
        "blocks caches every request's KV the moment it arrives and evicts nothing. Hit rate: cached prompt tokens "
        "over all prompt tokens, in %?", "%", 100 * rate,
        [f"the first request of each app used ({used}) finds nothing; the other {N - used} find their app's system "
         "prompt",
         f"a hit is whole blocks only: floor({S:,} / {P}) x {P} = {h:,} of the {S:,} system-prompt tokens",
         f"prompt tokens: {N} x {S:,} + {sum(map(len, users)):,} of their own = {total:,}",
         f"hit rate = {N - used} x {h:,} / {total:,} = {fmt(100 * rate)}%"],
        "Hits are counted in tokens over all prompt tokens: the first request of each prefix and every request's own "
        "text are misses.",
        rtol=0.01, mistakes={"matches per token, counting the partly matched last block": 100 * per_token,
                             "counts each app's first request as a hit too": 100 * N * h / total,
                             "divides by the system-prompt tokens only, not all prompt tokens": 100 * (N - used) * h / (N * S)})
    q.follow_ups.append(Numeric(
        "Now the cache matches per token (pages of 1 token, SGLang's default page size): the hit rate?", "%", 100 * per_token,
        [f"each hit now covers the whole {S:,}-token system prompt (its first own token differs)",
         f"hit rate = {N - used} x {S:,} / {total:,} = {fmt(100 * per_token)}%"],
        "Smaller pages waste less of each shared prefix, for more entries to match and to manage.",
        rtol=0.01, mistakes={f"keeps whole {P}-token blocks": 100 * rate}))
    return q


@template(STEM, "hash-chain hits after an edit")
def edit(rng, ref):
    P = 16
    T = rng.randrange(1000, 4001)
    j = not_multiple(rng, P + 1, T - P, P)  # 0-based position of the edited token, not at a block's start
    a = ids(rng, T)
    table = {h: i for i, h in enumerate(ref.block_hashes(a, P))}
    own = {ref.block_hashes(a[i * P:(i + 1) * P], P)[0] for i in range(T // P)}  # each block hashed alone

    def ask(pos, prompt):
        b = list(a)
        b[pos] = OWN_IDS[0]  # an id the shared text never uses
        hits = len(ref.hash_table_match(b, table, P))
        alone = sum(ref.block_hashes(b[i * P:(i + 1) * P], P)[0] in own for i in range(T // P))
        return Numeric(
            prompt, "blocks", hits,
            ["a block's key hashes its parent block's key and its own tokens: equal keys mean equal whole prefixes",
             f"token {pos + 1:,} lies in block {pos // P + 1}: " + (f"blocks 1..{hits} match; " if hits else "")
             + f"block {pos // P + 1} differs, and every later key differs too: it chains through that block",
             f"hits: {hits} blocks ({hits * P:,} tokens) of the {T // P} full blocks"],
            "One changed token misses its block and everything after it: keep what varies after what is shared.",
            rtol=0, mistakes={"hashes each block's tokens alone, so the blocks after the edit look cached": alone,
                              "counts the block holding the edit as a hit": pos // P + 1})

    q = ask(j, f"A vLLM-style prefix cache with {P}-token blocks: every full block is keyed by sha256 of its parent "
               f"block's key and its own token ids. The cache holds request A's {T:,}-token prompt. Request B sends the "
               f"same {T:,} tokens except token {j + 1:,} (counting from 1), which differs (a timestamp, say). How many "
               "of B's blocks does the lookup find cached?")
    q.follow_ups.append(ask(0, "Now the differing token is the very first one (the timestamp heads the system prompt): "
                               "blocks found?"))
    return q


@template(STEM, "what eviction frees")
def eviction(rng, ref):
    P = 16
    prefix = ids(rng, rng.randrange(20, 130) * P)
    convs = [[OWN_IDS[0] + i] + ids(rng, rng.randrange(2, 60) * P - 1, OWN_IDS) for i in range(rng.randrange(3, 7))]
    r = rng.randrange(len(convs))

    def build(locked: bool):
        tree, next_block = ref.RadixTree(P), 0
        for conv in convs:
            seq = prefix + conv
            tree.insert(seq, list(range(next_block, next_block + len(seq) // P)))
            next_block += len(seq) // P
        _, node = tree.match_prefix(prefix + convs[r])
        if locked:
            tree.lock(node)
        return tree

    tree = build(True)
    total, evictable = tree.total_size(), tree.evictable_size()
    E = not_multiple(rng, evictable + 1, total, P)
    freed = len(tree.evict(E)) * P
    q = Numeric(
        f"A radix-tree prefix cache with {P}-token pages holds a {len(prefix):,}-token system prompt and {len(convs)} "
        f"conversations that continue it, with {', '.join(f'{len(c):,}' for c in convs)} tokens of their own. "
        f"Conversation {r + 1} is running and holds a lock on its path. The pool runs short and evict({E:,}) is called "
        "(free at least that many tokens: unlocked leaf pages, least recently used first). How many tokens does it "
        "free?", "tokens", freed,
        [f"cached: {len(prefix):,} + {sum(map(len, convs)):,} = {total:,} tokens",
         f"locked: the running conversation's whole path, the system prompt and its own {len(convs[r]):,} tokens: "
         f"{total - evictable:,}",
         f"evictable: {evictable:,} tokens, the other conversations (the system prompt has a locked branch below it)",
         f"asked {E:,} > {evictable:,}: it frees all {freed:,} evictable tokens; the caller must wait or preempt"],
        "A lock protects the whole path a running request reads, shared prefix included; eviction takes only the rest.",
        rtol=0, mistakes={"counts the running request's pages as evictable": -(-E // P) * P,
                          "assumes evict always frees what it is asked": E})
    tree = build(False)
    again = len(tree.evict(E)) * P
    q.follow_ups.append(Numeric(
        f"Now conversation {r + 1} has finished and unlocked (nothing runs). Tokens freed by the same evict({E:,})?",
        "tokens", again,
        ["nothing is locked: every leaf page can go, oldest first, and a parent's pages once its children are gone",
         f"whole pages: ceil({E:,} / {P}) = {-(-E // P)} pages = {again:,} tokens"],
        "A finished request leaves its KV cached but unlocked: it stays until the pool needs the room.", rtol=0,
        mistakes={"frees exactly the tokens asked, not whole pages": E,
                  "still treats the finished conversation's path as locked": freed}))
    return q


def replica_hits(ref, systems: list, users: list, apps: list[int], replica_of: list[int], P: int) -> float:
    """The hit rate (cached prompt tokens / prompt tokens) when request i (app apps[i], its own tokens users[i]) goes
    to replica replica_of[i], each replica with its own RadixTree(P) that never evicts; a request's KV is cached
    when it arrives, and the last prompt token is always computed."""
    trees = {r: ref.RadixTree(P) for r in set(replica_of)}
    hit = total = next_block = 0
    for a, own, r in zip(apps, users, replica_of):
        prompt = systems[a] + own
        blocks, _ = trees[r].match_prefix(prompt)
        hit += min(len(blocks), (len(prompt) - 1) // P) * P
        total += len(prompt)
        n = len(prompt) // P
        trees[r].insert(prompt, list(range(next_block, next_block + n)))
        next_block += n
    return hit / total


@template(STEM, "prefix hits across replicas")
def replicas(rng, ref):
    P, A, N = 16, pick(rng, [2, 3, 4]), pick(rng, [4, 8])
    R = rng.randrange(2, 5) * N  # requests per app, spread evenly by round robin: R / N on each replica
    S = rng.randrange(40, 160) * P + rng.randrange(1, P)  # a partial last block
    U = rng.randrange(100, 1500, 50)
    systems = [ids(rng, S) for _ in range(A)]
    apps = [a for _ in range(R) for a in range(A)]  # interleaved: app 0, 1, ..., A - 1, app 0, ...
    users = [[OWN_IDS[0] + i] + ids(rng, U - 1, OWN_IDS) for i in range(len(apps))]  # a unique first own token
    turn = [i // A for i in range(len(apps))]  # the k-th request of its app
    rr = replica_hits(ref, systems, users, apps, [k % N for k in turn], P)
    aware = replica_hits(ref, systems, users, apps, [a % N for a in apps], P)
    h, total = S // P * P, A * R * (S + U)
    q = Numeric(
        f"{plural(A, 'app')}, each with its own {S:,}-token system prompt, each send {R} requests: the system prompt "
        f"followed by {U:,} tokens of the request's own. {N} replicas serve them, each with its own prefix cache "
        f"({P}-token blocks, large enough never to evict; a request's KV is cached when it arrives). Round robin "
        f"spreads each app's requests evenly over the {N} replicas. Hit rate (cached prompt tokens over all prompt "
        "tokens), in %?", "%", 100 * rr,
        [f"each replica misses each app's system prompt once: {A} x {N} = {A * N} misses; the other "
         f"{A * R - A * N} requests hit it",
         f"a hit is whole blocks: floor({S:,} / {P}) x {P} = {h:,} tokens",
         f"prompt tokens: {A * R} x ({S:,} + {U:,}) = {total:,}",
         f"hit rate = {A * R - A * N} x {h:,} / {total:,} = {fmt(100 * rr)}%"],
        "Each replica caches its own copy: round robin pays one miss per prefix per replica.", rtol=0.01,
        mistakes={"counts one miss per app, as if the replicas shared one cache": 100 * aware,
                  "counts the system prompt's partial last block as cached": 100 * (A * R - A * N) * S / total,
                  "divides by the system-prompt tokens only, not all prompt tokens":
                      100 * (A * R - A * N) * h / (A * R * S)})
    q.follow_ups.append(Numeric(
        "Now a prefix-aware router sends every request of an app to the replica that already holds its system "
        "prompt. Hit rate, in %?", "%", 100 * aware,
        [f"one miss per app: {A} misses, {A * R - A} hits of {h:,} tokens",
         f"hit rate = {A * R - A} x {h:,} / {total:,} = {fmt(100 * aware)}%"],
        "Routing on the prefix makes N caches behave as one.", rtol=0.01,
        mistakes={"keeps round robin's one miss per app per replica": 100 * rr}))
    weights = [1 / (a + 1) for a in range(A)]
    shares = [w / sum(weights) for w in weights]
    busiest = max(shares) * N
    q.follow_ups.append(Numeric(
        f"With that router each app lives on one replica. The apps' shares of the traffic are "
        f"{', '.join(f'{x:.0%}' for x in shares)} (Zipf). How many times the mean load (all requests / {N} replicas) "
        "does the busiest replica serve?", "x", busiest,
        [f"the busiest replica serves the largest app: {max(shares):.1%} of all requests",
         f"the mean replica serves 1 / {N} = {1 / N:.1%}",
         f"{max(shares):.3f} x {N} = {fmt(busiest)}x the mean (and {N - A} replica(s) serve nothing)"],
        "Affinity concentrates load: a real router bounds it and spills to the least loaded replica.", rtol=0.02,
        mistakes={"gives the busiest replica's share of the traffic, not its ratio to the mean": max(shares),
                  "divides by the apps, not the replicas": max(shares) * A}))
    return q


@template(STEM, "explain a prefix-cache dashboard")
def dashboard(rng, ref):
    return Open(
        "You turned on prefix caching for a chat product with a few long system prompts and many multi-turn "
        "conversations. What do you put on its dashboard, and what would make you act?",
        ["hit rate in tokens (cached prompt tokens over prompt tokens), per app or tenant, not only the share of "
         "requests with any hit",
         "TTFT p50/p99 split by hit and miss, and prefill tokens computed per second (the GPU time the cache saves)",
         "occupancy: cached blocks, evictable versus locked by running requests, as a share of the KV pool",
         "evictions per second and how often an evicted block is needed again soon (thrashing: the pool is too "
         "small, or the order scatters requests that share)",
         "a ceiling to compare with: the share of prompt tokens the traffic has sent before",
         "alerts on a sudden hit-rate drop: a changed token early in a system prompt (a date, a version) or a "
         "routing change"],
        "The cache pays only in tokens it lets prefill skip; everything on the dashboard explains that number.")


@template(STEM, "explain routing for cache affinity")
def routing(rng, ref):
    return Open(
        "Eight replicas of the same model sit behind a load balancer; requests share a few system prompts and long "
        "multi-turn conversations. How do you route so that prefix caching helps, and what can go wrong?",
        ["round-robin scatters a conversation's turns: every replica caches its own copy and most turns miss",
         "route on the prefix: a session or conversation id, or a hash of the first blocks, with consistent hashing "
         "so that adding a replica moves few keys",
         "or route to the replica whose cache holds the longest match (a shared index of block hashes or an "
         "approximate tree per replica)",
         "bound the load: a hot prefix on one replica overloads it, so fall back to the least loaded replica or "
         "replicate hot prefixes",
         "the key is a stable hash of the tokens after the chat template, the same in every process (not Python's "
         "salted hash())",
         "watch per-replica hit rate, TTFT and load imbalance"],
        "Affinity turns eight small caches into one large one; a load bound keeps it from becoming one hot replica.")


@template(STEM, "explain isolating tenants in a shared prefix cache")
def tenants(rng, ref):
    return Open(
        "Two enterprise customers share your vLLM fleet and its automatic prefix cache. One asks whether the other "
        "can learn anything about its prompts. What do you answer, and what do you change?",
        ["yes: a cache hit makes the time to first token shorter (the prefix is not prefilled), so a tenant who "
         "guesses how another's prompt starts can test each guess by timing it, block by block",
         "isolate the tenants' cache entries: vLLM's per-request cache_salt goes into the first block's hash, and the "
         "hash chain carries it into every later block, so differently salted requests never share a block",
         "the salt per tenant (not per user), secret and unguessable (random, about 256 bits), set by the gateway, "
         "never by the client",
         "the cost: no sharing across tenants, so a system prompt common to all of them is cached and prefilled once "
         "per tenant; hit rate and TTFT move accordingly",
         "the alternatives: a separate deployment per tenant, or disabling prefix caching for sensitive traffic; "
         "routing by tenant keeps each tenant's hits on few replicas",
         "check what else is shared: logs, metrics per prefix, a cache offloaded to CPU or disk, a KV store "
         "between nodes"],
        "A shared prefix cache is a shared resource whose speed depends on what others sent: salt it per tenant.")
