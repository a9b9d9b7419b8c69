"""Checks for lesson 17: the bytes a request ships and their time on a link, pack/unpack of the paged KV cache
(alone, and plugged into the engine's prefill -> decode transfer), the break-even link speed from the modeled
prefill stall, and sizing prefill and decode pools.

Wrong answers are named by computing the usual wrong versions here on the same inputs (the `*_variant`
functions), never in the learner's process. The engine check runs reference_engine.disagg.DisaggPair (a
prefill engine and a decode engine in one process, a loopback link between them: the grader's sandbox opens
no socket and spawns no process) with the learner's pack_kv/unpack_kv, and judges its tokens against one
plain engine's run here, and every KV block back in both pools.
"""
from __future__ import annotations

import math
import random
from functools import partial

import torch

from autograder import compare as cmp
from autograder.checks._engine import judged
from autograder.core import LearnerRaised, check
from autograder.harnesses.l17_disaggregation import ENGINE_KW, engine_kw, pack_layout, pair_harness
from autograder.mistakes import looks_like, name_of
from autograder.reference import answer_code

MODELS = ("llama-3-8b", "llama-3-70b")

# ---------------------------------------------------------------- 1.1 bytes on the wire

# (prompt_len, layers, kv_heads, head_dim, dtype bytes, tp_prefill, tp_decode)
BYTES_VISIBLE = [
    ("Llama-3-70B, 8k prompt, bf16, no TP", (8192, 80, 8, 128, 2, 1, 1)),
    ("Llama-3-70B, TP 8 -> TP 16 (each head on two decode GPUs)", (8192, 80, 8, 128, 2, 8, 16)),
    ("Llama-3-8B, fp8 KV, TP 16 -> TP 4", (3000, 32, 8, 128, 1, 16, 4)),
    ("4 layers, 2 KV heads, fp32, TP 4 -> TP 2", (777, 4, 2, 32, 4, 4, 2)),
]


@answer_code
def bytes_variant(P, L, H, D, b, tp_p, tp_d, k_only=False, heads=None, share=False, bits=False) -> int:
    """kv_transfer_bytes with one thing changed: one of K/V, another head count, one decode GPU's share, bits."""
    n = (1 if k_only else 2) * L * P * (max(H, tp_d) if heads is None else heads) * D * b
    return n // tp_d if share else n * 8 if bits else n


def random_bytes_case(rng):
    H = rng.choice([1, 2, 4, 8])
    tps = [t for t in (1, 2, 4, 8, 16) if H % t == 0 or t % H == 0]
    return (rng.randint(1, 20000), rng.choice([4, 32, 80]), H, rng.choice([32, 64, 128]), rng.choice([1, 2, 4]),
            rng.choice(tps), rng.choice(tps))


@check(points=2, section="1.1")
def kv_transfer_bytes(t):
    """KV bytes one request ships, with TP and head replication on either side; invalid TP refused."""
    for label, case in t.cases(visible=BYTES_VISIBLE, hidden=random_bytes_case, n=4):
        with t.case(label):
            P, L, H, D, b, tp_p, tp_d = case
            got, expected = t.both("kv_transfer_bytes", *case)
            if isinstance(got, float) and got == expected:
                t.fail(f"bytes: got the float {got!r}, expected the int {expected}.", "returns a float byte count: "
                       "true division (tp_decode / num_kv_heads) gives a float even when it divides evenly; a byte "
                       "count is an int (max(num_kv_heads, tp_decode) stays in integers)", end="")
            t.expect(got, expected, "bytes", mistakes={
                "counts only K (or only V): both cross the link": bytes_variant(*case, k_only=True),
                "ignores decode-side replication: a head held by several decode GPUs is received by each":
                    bytes_variant(*case, heads=H),
                "counts the prefill side's replicas instead of the decode side's (the sender sends each head once "
                "per decode GPU that needs it, from one replica)": bytes_variant(*case, heads=max(H, tp_p)),
                "counts one decode GPU's share, not the whole request": bytes_variant(*case, share=True),
                "sends every head to every decode GPU (heads x tp_decode): a decode GPU receives only the heads it "
                "holds": bytes_variant(*case, heads=H * tp_d),
                "counts bits, not bytes": bytes_variant(*case, bits=True)})
    with t.case("a TP that neither divides nor is a multiple of the KV heads is refused"):
        t.expect_raises(ValueError, "kv_transfer_bytes", 100, 32, 8, 128, 2, 1, 3,
                        why="tp_decode=3 with 8 KV heads: no way to shard the heads")
        t.expect_raises(ValueError, "kv_transfer_bytes", 100, 32, 8, 128, 2, 12, 1,
                        why="tp_prefill=12 with 8 KV heads: no way to shard the heads")
    with t.case("a TP that is not a positive int is refused (0, negative, 8.0)"):
        t.expect_raises(ValueError, "kv_transfer_bytes", 100, 32, 8, 128, 2, 1, 0,
                        why="tp_decode=0: no GPU holds the heads (0 is a multiple of 8, but not a GPU count)")
        t.expect_raises(ValueError, "kv_transfer_bytes", 100, 32, 8, 128, 2, -8, 1,
                        why="tp_prefill=-8: a GPU count is positive")
        t.expect_raises(ValueError, "kv_transfer_bytes", 100, 32, 8, 128, 2, 1, 8.0,
                        why="tp_decode=8.0: a GPU count is an int (the docstring refuses floats)")


# ---------------------------------------------------------------- 1.2 time on the link

TIME_VISIBLE = [
    ("70B / 8k prompt (2.68 GB) on 100 Gb/s", (2684354560, 100.0, 0.0, 1)),
    ("the same on 400 Gb/s, 80 messages of 20 us", (2684354560, 400.0, 20e-6, 80)),
    ("1 MB on 25 Gb/s, one message of 1 ms", (1e6, 25.0, 1e-3, 1)),
]


def random_time_case(rng):
    return (rng.randint(10**5, 10**10), rng.choice([10.0, 25.0, 100.0, 200.0, 400.0, 800.0]),
            rng.choice([0.0, 5e-6, 1e-4, 2e-3]), rng.choice([1, 32, 80]))


@check(points=1, section="1.2")
def transfer_time(t):
    """bytes * 8 / (Gb/s * 1e9) + messages * latency."""
    for label, (n, bw, lat, m) in t.cases(visible=TIME_VISIBLE, hidden=random_time_case, n=3):
        with t.case(label):
            got, expected = t.both("transfer_time", n, bw, lat, m)
            t.expect(got, expected, "seconds", rtol=1e-9, mistakes=time_mistakes(n, bw, lat, m))


@answer_code
def time_mistakes(n, bw, lat, m) -> dict:
    """The usual wrong transfer times of n bytes on bw Gb/s, m messages of lat seconds."""
    return {"reads Gb/s as GB/s (a byte is 8 bits)": n / (bw * 1e9) + m * lat,
            "uses 2**30 bits per Gb (link speeds are decimal: 1 Gb/s = 1e9 bit/s)": n * 8 / (bw * 2**30) + m * lat,
            "pays the latency once, not once per message": n * 8 / (bw * 1e9) + lat,
            "leaves out the latency": n * 8 / (bw * 1e9)}


# ---------------------------------------------------------------- 2. pack / unpack

@answer_code
def _blocks(table: list, nb: int, order: str) -> list:
    """The nb blocks a sequence uses, in the table's order (right), sorted, or 0, 1, 2, ... (wrong)."""
    return {"table": table[:nb], "sorted": sorted(table[:nb]), "range": list(range(nb))}[order]


@answer_code
def pack_variant(k, v, table, n, order="table", partial_last="cut", swap=False, reverse_layers=False,
                 kv_first=False) -> torch.Tensor:
    """pack_kv with one thing changed: blocks in sorted order or 0, 1, 2..., the partial last block dropped,
    whole or zeroed, K and V swapped, the layers reversed, or K/V on dim 0 ([2, layers, ...])."""
    bs = k.shape[2]
    nb = -(-n // bs)
    blocks = _blocks(table, nb, order)
    keep = {"cut": n, "zero": n, "drop": (n // bs) * bs, "whole": nb * bs}[partial_last]
    if swap:
        k, v = v, k
    kk = torch.cat([k[:, b] for b in blocks], dim=1)[:, :keep]
    vv = torch.cat([v[:, b] for b in blocks], dim=1)[:, :keep]
    if partial_last == "zero":
        kk, vv = kk.clone(), vv.clone()
        kk[:, (n // bs) * bs:], vv[:, (n // bs) * bs:] = 0, 0
    out = torch.stack((kk, vv), dim=0 if kv_first else 1)
    if reverse_layers:
        out = out.flip(1 if kv_first else 0)
    return out.contiguous()


PACK_MISTAKES = {
    "reads the blocks in sorted order: the block table's order is the token order": {"order": "sorted"},
    "reads blocks 0, 1, 2, ... instead of the sequence's block table": {"order": "range"},
    "drops the partial last block (its first num_tokens % block_size slots are the sequence's)": {"partial_last": "drop"},
    "copies the whole last block, slots past num_tokens too": {"partial_last": "whole"},
    "swaps K and V (index 0 of dim 1 is K)": {"swap": True},
    "reverses the layer order": {"reverse_layers": True},
    "puts K/V first ([2, layers, ...] instead of [layers, 2, ...])": {"kv_first": True},
}


# What only the engine check names (its probe, _diagnose): a shape-preserving way to lose the partial block.
ENGINE_PACK_MISTAKES = {**PACK_MISTAKES, "leaves the partial last block's tokens as zeros": {"partial_last": "zero"}}


@answer_code
def unpack_variant(buf, k, v, table, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches after unpack_kv with one thing changed (the pack_variant keywords, on the receiving side;
    partial_last="drop": the partial last block not written, "zero": its other slots zeroed)."""
    k, v = k.clone(), v.clone()
    bs, n = k.shape[2], buf.shape[2]
    blocks = _blocks(table, -(-n // bs), kw.get("order", "table"))
    src = buf.flip(0) if kw.get("reverse_layers") else buf
    ks, vs = (src[:, 1], src[:, 0]) if kw.get("swap") else (src[:, 0], src[:, 1])
    for i, b in enumerate(blocks):
        s, e = i * bs, min(n, (i + 1) * bs)
        if e - s < bs and kw.get("partial_last") == "drop":
            continue
        if kw.get("partial_last") == "zero":
            k[:, b], v[:, b] = 0, 0
        k[:, b, :e - s], v[:, b, :e - s] = ks[:, s:e], vs[:, s:e]
    return k, v


UNPACK_MISTAKES = {
    "writes the blocks in sorted order: the block table's order is the token order": {"order": "sorted"},
    "writes blocks 0, 1, 2, ... instead of the sequence's block table": {"order": "range"},
    "skips the partial last block": {"partial_last": "drop"},
    "zeroes the rest of the partial last block (those slots are not this sequence's to touch)": {"partial_last": "zero"},
    "swaps K and V (index 0 of dim 1 is K)": {"swap": True},
    "reverses the layer order": {"reverse_layers": True},
}


def kv_case(gen, L: int, nb: int, bs: int, H: int, D: int, n: int, dtype=torch.float32, seed: int = 0):
    """(k_cache, v_cache, block table, num_tokens): random caches (uint8: the bytes of an fp8 cache), and a
    shuffled table of ceil(n / bs) of the nb blocks."""
    def cache():
        x = torch.randn(L, nb, bs, H, D, generator=gen)
        return x.to(torch.float8_e4m3fn).view(torch.uint8) if dtype == torch.uint8 else x.to(dtype)

    table = list(range(nb))
    random.Random(seed).shuffle(table)
    return cache(), cache(), table[:-(-n // bs)], n


# (layers, blocks, block_size, kv heads, head_dim, num_tokens, dtype)
PACK_VISIBLE = [
    ("3 layers, block 4, 10 tokens (last block half full)", (3, 8, 4, 2, 4, 10, torch.float32)),
    ("2 layers, block 8, 16 tokens (two full blocks)", (2, 6, 8, 1, 8, 16, torch.float32)),
    ("4 layers, block 16, 37 tokens, an fp8 cache as uint8 bytes", (4, 5, 16, 2, 8, 37, torch.uint8)),
    ("1 layer, block 4, 3 tokens (one partial block)", (1, 4, 4, 2, 2, 3, torch.float32)),
]


def random_pack_case(rng):
    bs = rng.choice([2, 4, 8, 16])
    n = rng.randint(1, 6 * bs)
    return (rng.randint(1, 5), -(-n // bs) + rng.randint(0, 4), bs, rng.choice([1, 2, 4]), rng.choice([4, 8]), n,
            rng.choice([torch.float32, torch.bfloat16, torch.uint8]))


@check(points=3, section="2.1")
def pack_kv(t):
    """[layers, 2, num_tokens, kv_heads, head_dim] from the paged caches, in token order, K first."""
    for i, (label, shape) in enumerate(t.cases(visible=PACK_VISIBLE, hidden=random_pack_case, n=3)):
        with t.case(label):
            k, v, table, n = kv_case(t.gen, *shape, seed=i)
            got, expected = t.both("pack_kv", k, v, table, n)
            t.expect(got, expected, f"packed KV of block table {table}",
                     mistakes={name: pack_variant(k, v, table, n, **kw) for name, kw in PACK_MISTAKES.items()})
            if i == 0:  # the values are right: now the layout, which only the learner's process can see
                layout = t.run(pack_layout, t.learner("pack_kv"), k, v, table, n, what="pack_kv")
                t.expect_true(layout["contiguous"], f"pack_kv returned the right values in a tensor that is not "
                              f"contiguous (strides {layout['stride']}, a view such as .transpose() or .permute()): "
                              "a real transport (RDMA) sends the buffer's memory as one block, so return a new contiguous tensor "
                              "(.contiguous(), or build it in [layers, 2, tokens, ...] order)")


@check(points=3, section="2.2")
def unpack_kv(t):
    """Scatter a packed buffer into another cache's block table; nothing else in the cache changes."""
    for i, (label, shape) in enumerate(t.cases(visible=PACK_VISIBLE, hidden=random_pack_case, n=3)):
        with t.case(label):
            src_k, src_v, table, n = kv_case(t.gen, *shape, seed=i)
            buf = pack_variant(src_k, src_v, table, n)
            k, v, dest, _ = kv_case(t.gen, *shape, seed=i + 100)  # the decode side's cache: other contents
            expected = unpack_variant(buf, k, v, dest)
            value, after = t.call_fn(t.fn("unpack_kv"), buf, k, v, dest, inplace=True)
            t.expect_true(value is None, f"unpack_kv writes in place and returns None, got {type(value).__name__}")
            t.expect(torch.equal(after[0], buf), True, "the buffer must not change")
            t.expect((after[1], after[2]), expected, f"(k_cache, v_cache) after unpacking into block table {dest}",
                     mistakes={name: unpack_variant(buf, k, v, dest, **kw) for name, kw in UNPACK_MISTAKES.items()})


# ---------------------------------------------------------------- 2.3 in the engine

# (the engines' settings, ENGINE_KW and engine_kw, are autograder/harnesses/l17_disaggregation.py's: both sides use them)
ENGINE_MODEL = "draft"  # the 0.6M model: three times faster a step; pack/unpack do not care which


def engine_workload(rng) -> dict:
    """Prompts of 3..29 tokens (block size 4: full and partial last blocks), greedy outputs of 3..9 tokens,
    and aborts: one request at its first step (queued on the prefill side), one mid-transfer."""
    n = 7
    prompts = [[rng.randrange(1, 2048) for _ in range(rng.randint(3, 29))] for _ in range(n)]
    lens = [rng.randint(3, 9) for _ in range(n)]
    return {"prompts": prompts, "lens": lens, "aborts": {0: [n - 1], 3: [rng.randrange(n - 1)]},
            "seed": rng.randrange(10**6)}


VISIBLE_WORKLOADS = [("visible workload A", engine_workload(random.Random(171))),
                     ("visible workload B", engine_workload(random.Random(172))),
                     ("visible workload C (fp8 KV cache on both sides, shipped as its uint8 bytes)",
                      {**engine_workload(random.Random(173)), "kv_cache_dtype": "fp8"})]


@answer_code
def _single_engine(work: dict) -> list:
    """Greedy tokens of one plain engine (no transfer) on the same prompts, here in the grader."""
    from autograder.harnesses.engine import run_engine
    return run_engine(work["prompts"], work["lens"], engine_kw(work), model=ENGINE_MODEL)["tokens"]


def _diagnosis_case() -> tuple:
    """The small case _diagnose probes pack_kv and unpack_kv on: (k, v, table, n) to pack, and the decode side's
    (k2, v2, dest) to unpack into."""
    k, v, table, n = kv_case(torch.Generator().manual_seed(7), 3, 8, 4, 2, 4, 10)
    k2, v2, dest, _ = kv_case(torch.Generator().manual_seed(8), 3, 8, 4, 2, 4, 10, seed=5)
    return k, v, table, n, k2, v2, dest


@answer_code
def diagnosis_values(k, v, table, n, k2, v2, dest) -> dict:
    """What _diagnose compares the learner's pack_kv and unpack_kv with on its small case: the buffer each pack
    mistake gives ("pack"), the right buffer ("buf"), and the caches each unpack mistake leaves ("unpack")."""
    buf = pack_variant(k, v, table, n)
    return {"pack": {name: pack_variant(k, v, table, n, **kw) for name, kw in ENGINE_PACK_MISTAKES.items()},
            "buf": buf,
            "unpack": {name: unpack_variant(buf, k2, v2, dest, **kw) for name, kw in UNPACK_MISTAKES.items()}}


def _diagnose(t, values: dict) -> str:
    """Name the mistake behind wrong tokens by probing pack_kv and unpack_kv on a small case here; `values`:
    diagnosis_values on that case (computed before: a student's copy replays it, as the release asked it)."""
    k, v, table, n, k2, v2, dest = _diagnosis_case()
    try:
        k8, v8, _, _ = kv_case(torch.Generator().manual_seed(7), 3, 8, 4, 2, 4, 10, torch.uint8)
        got8 = t.call("pack_kv", k8, v8, table, n)
        if isinstance(got8, torch.Tensor) and got8.dtype != torch.uint8:
            return " " + looks_like(f"returns {got8.dtype} for a uint8 cache, not the caches' dtype (an fp8 cache "
                                    "travels as its bytes; the decode side writes them into a cache of the same "
                                    "dtype)", who="your pack_kv")
        got = t.call("pack_kv", k, v, table, n)
        if not isinstance(got, torch.Tensor):
            return " " + looks_like(f"returns {cmp.describe(got)}, not one tensor: the buffer is a single tensor "
                                    "[layers, 2, num_tokens, kv_heads, head_dim] (K at [:, 0], V at [:, 1]), which "
                                    "unpack_kv reads back", who="your pack_kv")
        names = name_of(got, values["pack"], torch.equal, values["buf"])
        if names:
            return " " + looks_like(names, who="your pack_kv")
        _, after = t.call_fn(t.fn("unpack_kv"), values["buf"], k2, v2, dest, inplace=True)
        names = name_of(tuple(after[1:3]), values["unpack"], lambda a, b: all(map(torch.equal, a, b)))
        if names:
            return " " + looks_like(names, who="your unpack_kv")
    except LearnerRaised:
        pass
    return " (pack_kv then unpack_kv must give the decode side exactly the prefill side's K and V: run the 2.1 and 2.2 checks)"


@check(points=3, section="2.3", timeout=180, cost=0.4)
def pack_unpack_in_engine(t):
    """DisaggPair with your pack_kv/unpack_kv: one engine's tokens, aborted requests leak no block on either side."""
    diagnosis = diagnosis_values(*_diagnosis_case())  # asked of every run, so that a release stores it
    for label, work in t.cases(visible=VISIBLE_WORKLOADS, hidden=engine_workload, n=1, label="random workload"):
        with t.case(f"{label}: {len(work['prompts'])} prompts of {min(map(len, work['prompts']))}.."
                    f"{max(map(len, work['prompts']))} tokens, block size {ENGINE_KW['block_size']}, two aborted"):
            got, expected = t.run_against(partial(_single_engine, work), pair_harness, t.learner("pack_kv"),
                                          t.learner("unpack_kv"), work,
                                          what="the prefill -> decode pair, shipping KV with your pack_kv/unpack_kv,")
            aborted = {i for ids in work["aborts"].values() for i in ids}
            with judged(t, got, on_error=lambda run: f"the pair stopped at step {run['steps']}: "
                        f"{run['error']['type']}: {run['error']['message']}." + _diagnose(t, diagnosis)):
                for i, (g, e) in enumerate(zip(got["tokens"], expected)):
                    if i not in aborted and g != e:
                        t.fail(f"request {i} ({len(work['prompts'][i])}-token prompt): the decode instance generated "
                               f"{g}, one engine generates {e}: the KV it received is not the KV the prefill computed."
                               + _diagnose(t, diagnosis))


# ---------------------------------------------------------------- 3. break-even

@answer_code
def stall_variant(model, chip, P, C, B, ctx, tp=1, context0=False, whole=False, drop_last=False,
                  one_step=False) -> float:
    """prefill_stall with one thing changed: every chunk at context 0, the whole mixed step counted, the
    partial last chunk dropped, or the prompt priced as one step."""
    from reference_engine.sim import gpu_model as gm
    shape, gpu = gm.MODELS[model], gm.CHIPS[chip]

    def st(comp):
        return gm.step_time(shape, gpu, comp, tp=tp).time_s

    base = 0.0 if whole else st(gm.Composition.decode_batch(B, ctx))
    starts = [0] if one_step else range(0, (P // C) * C if drop_last else P, C)
    size = P if one_step else C
    return sum(st(gm.Composition.decode_batch(B, ctx, min(size, P - s), 0 if context0 else s)) - base for s in starts)


STALL_VISIBLE = [
    ("Llama-3-8B on H100: 8k prompt, chunks of 512, 64 decodes at 2k", ("llama-3-8b", "H100", 8192, 512, 64, 2048, 1)),
    ("Llama-3-70B on 4 x H100: 3000-token prompt, chunks of 1024", ("llama-3-70b", "H100", 3000, 1024, 32, 4096, 4)),
    ("Llama-3-8B on A100: 700 tokens, chunks of 256, 8 decodes", ("llama-3-8b", "A100", 700, 256, 8, 1000, 1)),
]


def random_stall_case(rng):
    model = rng.choice(MODELS)
    return (model, rng.choice(["H100", "H200", "A100"]), rng.randint(100, 16000), rng.choice([256, 512, 2048]),
            rng.choice([1, 16, 64, 128]), rng.choice([256, 2048, 8192]), 1 if model == "llama-3-8b" else rng.choice([4, 8]))


@check(points=2, section="3.1")
def prefill_stall(t):
    """Sum over chunks of (decode step + chunk) - (decode step alone), on the modeled clock."""
    for label, case in t.cases(visible=STALL_VISIBLE, hidden=random_stall_case, n=2):
        with t.case(label):
            got, expected = t.both("prefill_stall", *case)
            t.expect(got, expected, "stall seconds", rtol=1e-6, mistakes={
                "starts every chunk at context 0: chunk i attends to the i * chunk prompt tokens before it":
                    stall_variant(*case, context0=True),
                "counts the whole mixed step, not what the chunk adds to the decode step": stall_variant(*case, whole=True),
                "drops the partial last chunk": stall_variant(*case, drop_last=True),
                "prices the prompt as one step, not in chunks": stall_variant(*case, one_step=True)})


BREAK_VISIBLE = [
    ("Llama-3-8B on H100, 8k prompt, 64 decodes", ("llama-3-8b", "H100", 8192, 512, 64, 2048, 0.0, 1)),
    ("Llama-3-70B on 4 x H100, 2 ms per transfer", ("llama-3-70b", "H100", 4096, 512, 32, 4096, 2e-3, 4)),
    ("a 64-token prompt with 50 ms latency: no link is enough", ("llama-3-8b", "H100", 64, 512, 16, 1024, 0.05, 1)),
]


def random_break_case(rng):
    *c, tp = random_stall_case(rng)
    return (*c, rng.choice([0.0, 1e-4, 1e-3]), tp)


@check(points=2, section="3.2")
def break_even_gbps(t):
    """Bandwidth where the transfer time equals the prefill stall (inf when the latency alone is more)."""
    for label, case in t.cases(visible=BREAK_VISIBLE, hidden=random_break_case, n=2):
        with t.case(label):
            got, expected = t.both("break_even_gbps", *case)
            t.expect(got, expected, "break-even Gb/s", rtol=1e-6, mistakes=break_even_mistakes(*case))
    _break_even_at_equality(t)


@answer_code
def break_even_mistakes(model, chip, P, C, B, ctx, lat, tp) -> dict:
    """The usual wrong break-even bandwidths (none when the latency alone is at least the stall)."""
    from reference_engine.sim import gpu_model as gm
    s = gm.MODELS[model]
    nbytes = 2 * s.layers * P * max(s.kv_heads, tp) * s.head_dim * s.kv_bytes
    stall = stall_variant(model, chip, P, C, B, ctx, tp)
    wrong = {}
    if stall > lat:
        wrong = {"answers in GB/s (a byte is 8 bits)": nbytes / (stall - lat) / 1e9,
                 "leaves out the latency": nbytes * 8 / stall / 1e9,
                 "ships one decode GPU's share of the KV, not the whole request's": nbytes * 8 / tp / (stall - lat) / 1e9}
    return wrong


def _break_even_at_equality(t):
    """latency_s exactly the stall: "at least the stall" includes equality, so inf. The latency is the learner's
    own prefill_stall (checked against the reference first), so its break_even sees the very same float."""
    case = ("llama-3-8b", "H100", 2048, 512, 16, 1024)
    with t.case("a latency exactly equal to the stall: no link is enough (inf)"):
        stall, expected_stall = t.both("prefill_stall", *case)
        t.expect(stall, expected_stall, "prefill_stall (used as the latency here)", rtol=1e-6)
        got, raised = t.attempt(t.call, "break_even_gbps", *case, stall, 1)
        if raised and raised.is_a(ZeroDivisionError):
            t.fail(f"break_even_gbps with latency_s = the stall ({stall!r} s) raised ZeroDivisionError: stall - "
                   "latency_s is 0 there, and a latency AT LEAST the stall gives inf (the docstring): test stall <= "
                   "latency_s before dividing, equality included")
        if raised:
            raise raised
        t.expect(got, float("inf"), f"break-even Gb/s at latency_s = the stall ({stall!r} s)")


# ---------------------------------------------------------------- 4. pools

@answer_code
def plan_variant(model, chip, rate, P, O, ttft, tpot, tp=1, xfer=0.0, no_queue=False, all_steps=False,
                 prompt_ctx=False, no_memory=False, no_transfer=False, no_tpot=False, overshoot=False,
                 strict_tpot=False) -> dict | None:
    """plan_pools with one thing changed (None when that version has no answer): no_tpot = the batch only
    capped by memory, overshoot = reports the step time of the first batch over the SLO, strict_tpot = a step
    exactly at the SLO refused."""
    from reference_engine.sim import gpu_model as gm
    shape, gpu = gm.MODELS[model], gm.CHIPS[chip]
    t_p = gm.step_time(shape, gpu, gm.Composition(prefills=((P, 0),)), tp=tp).time_s
    x = (ttft - (0.0 if no_transfer else xfer)) / t_p
    if x <= 1:
        return None
    pre = 1 / t_p if no_queue else 2 * (x - 1) / (2 * x - 1) / t_p
    cap = 10**9 if no_memory else gm.kv_capacity(shape, gpu, tp=tp)["tokens"] // (P + O)
    ctx = P if prompt_ctx else P + O // 2
    best = None
    for b in range(1, min(1024, cap) + 1):
        st = gm.step_time(shape, gpu, gm.Composition.decode_batch(b, ctx), tp=tp).time_s
        if not no_tpot and (st >= tpot if strict_tpot else st > tpot):
            if overshoot and best is not None:
                best = (best[0], st)
            break
        best = (b, st)
    if best is None:
        return None
    dec = best[0] / ((O if all_steps else O - 1) * best[1])
    return {"n_prefill": math.ceil(rate / pre), "n_decode": math.ceil(rate / dec), "prefill_rps": pre,
            "decode_rps": dec, "decode_batch": best[0], "prefill_s": t_p, "decode_step_s": best[1]}


PLAN_KEYS = ("prefill_s", "prefill_rps", "n_prefill", "decode_batch", "decode_step_s", "decode_rps", "n_decode")
PLAN_VISIBLE = [
    ("Llama-3-8B on H100: 20 req/s, 2k in, 256 out, TTFT 0.5 s, TPOT 40 ms, 10 ms transfer",
     ("llama-3-8b", "H100", 20.0, 2048, 256, 0.5, 0.04, 1, 0.01)),
    ("Llama-3-70B on 4 x H100: 5 req/s, 4k in, 512 out, TTFT 1 s, TPOT 60 ms, 50 ms transfer",
     ("llama-3-70b", "H100", 5.0, 4096, 512, 1.0, 0.06, 4, 0.05)),
    ("Llama-3-70B on 8 x H200 (memory-bound batch): 40 req/s, 8k in, 2k out, TTFT 2 s, TPOT 150 ms",
     ("llama-3-70b", "H200", 40.0, 8192, 2048, 2.0, 0.15, 8, 0.0)),
    ("Llama-3-8B on H100 (TPOT-bound batch: the KV cache holds more): 20 req/s, 2k in, 256 out, TTFT 0.5 s, TPOT 20 ms",
     ("llama-3-8b", "H100", 20.0, 2048, 256, 0.5, 0.02, 1, 0.0)),
]
PLAN_MISTAKES = (
    ("loads a prefill instance to 100% (no queueing): random arrivals wait, TTFT grows as rho -> 1", "no_queue"),
    ("counts output_len decode steps: the prefill instance sampled the first token", "all_steps"),
    ("takes the prompt length as the decode context, not the mean while generating", "prompt_ctx"),
    ("ignores the KV cache: B requests of prompt + output tokens must fit", "no_memory"),
    ("forgets that the transfer spends part of the TTFT budget", "no_transfer"),
    ("ignores the TPOT SLO: the largest batch that fits memory can step slower than tpot_slo_s", "no_tpot"),
    ("reports the step time of the first batch over the SLO, not of the batch it keeps", "overshoot"),
    ("refuses a step exactly at the SLO (the docstring's test is step <= tpot_slo_s)", "strict_tpot"),
)


@answer_code
def plan_boundary_cases() -> tuple:
    """Built on the modeled clock's own values: (the case whose TPOT equals batch 100's step time, where that
    batch is allowed; t_p of its 2048-token prompt, a TTFT budget that no load meets: x = 1, ValueError)."""
    from reference_engine.sim import gpu_model as gm
    shape, gpu = gm.MODELS["llama-3-8b"], gm.CHIPS["H100"]
    step_100 = gm.step_time(shape, gpu, gm.Composition.decode_batch(100, 2048 + 256 // 2)).time_s
    t_p = gm.step_time(shape, gpu, gm.Composition(prefills=((2048, 0),))).time_s
    return (("TPOT exactly the step time of batch 100 (step <= SLO: batch 100 is allowed)",
             ("llama-3-8b", "H100", 20.0, 2048, 256, 0.5, step_100, 1, 0.0)), t_p)


def random_plan_case(rng):
    model = rng.choice(MODELS)
    tp = 1 if model == "llama-3-8b" else rng.choice([4, 8])
    return (model, rng.choice(["H100", "H200"]), rng.choice([2.0, 10.0, 50.0]), rng.choice([512, 2048, 6000]),
            rng.choice([64, 300, 1000]), rng.choice([1.0, 2.0]), rng.choice([0.03, 0.06, 0.1]), tp,
            rng.choice([0.0, 0.02]))


@check(points=3, section="4.1", cost=1)
def plan_pools(t):
    """DistServe-style pool sizes: M/D/1 prefill load under the TTFT SLO, the largest decode batch under TPOT."""
    boundary, t_p = plan_boundary_cases()
    for label, case in t.cases(visible=[*PLAN_VISIBLE, boundary], hidden=random_plan_case, n=2):
        with t.case(label):
            got, expected = t.both("plan_pools", *case)
            wrong = {name: plan_variant(*case, **{flag: True}) for name, flag in PLAN_MISTAKES}
            t.expect_dict(got, expected, "the plan", {k: v for k, v in wrong.items() if v is not None},
                          keys=PLAN_KEYS, rtol=1e-6)
    _plan_whole_multiple(t)
    with t.case("a TTFT SLO below one prefill is refused: ValueError"):
        t.expect_raises(ValueError, "plan_pools", "llama-3-8b", "H100", 20.0, 2048, 256, 0.01, 0.04, 1, 0.0,
                        why=f"TTFT 10 ms is less than one 2048-token prefill ({t_p * 1e3:.1f} ms)")
    with t.case("a TTFT SLO of exactly one prefill is refused: ValueError"):
        t.expect_raises(ValueError, "plan_pools", "llama-3-8b", "H100", 20.0, 2048, 256, t_p, 0.04, 1, 0.0,
                        why=f"TTFT exactly t_p ({t_p!r} s): x = 1 leaves no time to queue, rho = 0")
    with t.case("a TPOT SLO below a single decode's step is refused: ValueError"):
        t.expect_raises(ValueError, "plan_pools", "llama-3-8b", "H100", 20.0, 2048, 256, 0.5, 0.001, 1, 0.0,
                        why="TPOT 1 ms is less than the step of a single decode: no batch meets it")


def _plan_whole_multiple(t):
    """A rate of exactly k prefill instances' rate needs k instances (ceil), not k + 1. Judged against the
    learner's own prefill_rps, so a formula equal to the docstring's up to rounding is never failed here."""
    base = ("llama-3-8b", "H100", 1.0, 2048, 256, 0.5, 0.04, 1, 0.0)
    per = plan_variant(*base)["prefill_rps"]
    k = next(k for k in range(3, 20) if (k * per) / per == k)
    case = (base[0], base[1], k * per, *base[3:])
    with t.case(f"a rate of exactly {k} prefill instances' rate ({k * per:.4f} req/s): {k} instances"):
        got, expected = t.both("plan_pools", *case)
        t.expect_dict(got, expected, "the plan", keys=[key for key in PLAN_KEYS if key != "n_prefill"], rtol=1e-6)
        r = case[2] / got["prefill_rps"]
        t.expect(got["n_prefill"], math.ceil(r), f"the plan['n_prefill'] (rate / your prefill_rps = {r!r})",
                 mistakes={"rounds up with int(r) + 1: one instance too many when r is whole (ceil(r) is r then)":
                           int(r) + 1})
