"""Checks of lesson 04: the block allocator (op by op and in the engine), slot mapping, paged decode,
and the cost of swapping or recomputing a preempted sequence.

The learner's allocator lives in the learner's process: the op-by-op driver sends each operation
there and runs the same one here on the engine's BlockAllocator, comparing what a caller can
observe. The engine checks run the shipped target model with the learner's allocator or decode
function plugged in (`run_engine` and `sample_in_engine`, over there: autograder/harnesses/engine.py and
l04_paged_attention.py) and here with the engine's own, and compare tokens and the block pool afterwards. Wrong attention outputs are
named by computing the usual wrong answers (`decode_variant`) on the same inputs. The preemption cost
model is judged key by key against the reference, its wrong answers computed by `preemption_variant`.
The grader's code that computes a mistake's value or a reference is `@answer_code` (autograder/reference.py):
a student's copy holds its name and docstring, and replays its results on the visible cases.
"""
from __future__ import annotations

import random

import torch

from autograder.checks._configs import non_default
from autograder.checks._drive import Differential
from autograder.checks._engine import judged
from autograder.core import LearnerRaised, check
from autograder.harnesses.engine import run_engine
from autograder.harnesses.l04_paged_attention import (
    call_with_table_view,
    fork_aliasing,
    make_decode_case,
    observe,
    sample_in_engine,
    time_decode,
)
from autograder.reference import answer_code
from reference_engine.block_manager import BlockAllocator

ENGINE_TAIL = "the engine's own BlockAllocator"
SHARED_FREE = "frees a shared block (free without ref counting)"
COW_LEAK = "leaks the old block on copy-on-write"


# ---------------------------------------------------------------- 2. the allocator, op by op


class _Drive(Differential):
    """Runs the same operations on the learner's allocator and the engine's, checking invariants.

    Block ids may differ between the two (the free-list order is not part of the spec): what is
    compared is what a caller can observe: ref counts of held blocks, num_free, can_allocate, which
    append_slot calls copy, and that errors are raised.
    """
    cls = "PagedBlockAllocator"

    def __init__(self, t, num_blocks: int):
        self.n = num_blocks
        super().__init__(t, num_blocks)
        self.ref = BlockAllocator(num_blocks)
        self.tables: list[tuple[list[int], list[int]]] = []  # (learner table, engine table)

    def where(self) -> str:
        return f"\n  (num_blocks={self.n}; last operations: {'; '.join(self.log[-6:]) or 'none yet'})"

    # -- invariants ----------------------------------------------------------
    def held(self) -> dict[int, int]:
        c: dict[int, int] = {}
        for mt, _ in self.tables:
            for b in mt:
                c[b] = c.get(b, 0) + 1
        return c

    def observe(self, blocks: list[int], ks: list[int]) -> dict:
        """ref_count(b) for each block, num_free(), can_allocate(k) for each k: one round trip (the
        `observe` harness) instead of one per query. A query that raised fails the case as a call would."""
        got = self.t.run(observe, self.mine.handle, blocks, ks, what="PagedBlockAllocator's queries")
        asked = {"ref_count": blocks, "num_free": [None], "can_allocate": ks}

        def well_formed(answers, args) -> bool:  # one (kind, value) pair per query asked
            return type(answers) is list and len(answers) == len(args) and \
                all(type(a) in (list, tuple) and len(a) == 2 for a in answers)
        if type(got) is not dict or not all(well_formed(got.get(name), args) for name, args in asked.items()):
            self.fail("the answers to ref_count / num_free / can_allocate came back malformed")
        for name, args in asked.items():
            for arg, (kind, value) in zip(args, got[name]):
                if kind == "raised":
                    info = value if type(value) is dict else {}
                    if info.get("not_implemented") is True:
                        raise LearnerRaised(f"PagedBlockAllocator.{name}", {**info, "not_implemented": True})
                    self.fail(f"PagedBlockAllocator.{name}({'' if arg is None else repr(arg)}) raised:\n"
                              f"{str(info.get('tb', ''))[-6000:]}")
        return {name: [v for _, v in got[name]] for name in asked}

    def check(self, after: str):
        held = self.held()
        want = self.n - len(held)
        ks = sorted({0, 1, want, want + 1})
        seen = self.observe(list(held), ks)
        for (b, k), rc in zip(held.items(), seen["ref_count"]):
            if rc != k:
                if after in ("free", "append_slot") and isinstance(rc, int) and rc < k:
                    self.fail(f"block {b} is held by {k} table(s) but ref_count says {rc} after {after}.",
                              SHARED_FREE + ": free drops ONE reference, and the block returns to the pool only "
                              "when the count reaches 0", end="")
                if after == "append_slot" and isinstance(rc, int) and rc > k:
                    self.fail(f"block {b} is held by {k} table(s) but ref_count says {rc} after copy-on-write.",
                              COW_LEAK + ": the table gave it up, so drop its reference (free it once)", end="")
                self.fail(f"after {after}: block {b} is held by {k} table(s) but ref_count({b}) = {rc!r}")
        (free,) = seen["num_free"]
        if free != want or free != self.ref.num_free():
            if after == "append_slot" and isinstance(free, int) and free < want:
                self.fail(f"num_free() = {free}, expected {want} after copy-on-write.",
                          COW_LEAK + " (drop the table's reference to it)", end="")
            if after in ("free", "append_slot") and isinstance(free, int) and free > want:
                self.fail(f"num_free() = {free}, expected {want}: a block still held by a table is free.",
                          SHARED_FREE, end="")
            self.fail(f"after {after}: num_free() = {free!r}, expected {want} "
                      f"({self.n} blocks, {len(held)} held)")
        for k, got in zip(ks, seen["can_allocate"]):  # free == want here
            exp = self.ref.can_allocate(k)
            if type(got) not in (bool, int) or bool(got) != exp:
                self.fail(f"can_allocate({k}) = {got!r} with {free} free blocks, expected {exp}.",
                          "is off by one in can_allocate (n allocations succeed iff n <= num_free())"
                          if k in (free, free + 1) and type(got) is bool else None, end="")

    # -- operations ----------------------------------------------------------
    def _alloc(self, pending: tuple[int, ...] = ()) -> tuple[int, int]:
        held = self.held()
        for x in pending:
            held[x] = held.get(x, 0) + 1
        b = self.m("allocate")
        if type(b) is not int or not 0 <= b < self.n:
            self.fail(f"allocate() returned {b!r}: expected a block id (an int) in 0..{self.n - 1}")
        if b in held:
            self.fail(f"allocate() handed out block {b}, which {held[b]} table(s) still hold: a block may be "
                      "handed out again only once its ref count is back to 0")
        return b, self.ref.allocate()

    def new(self, k: int):
        self.log.append(f"new table of {k} block(s)")
        mine, ref = [], []
        for _ in range(k):
            a, b = self._alloc(tuple(mine))
            mine.append(a)
            ref.append(b)
        self.tables.append((mine, ref))
        self.check("allocate")

    def grow(self, i: int):
        self.log.append(f"table {i} grows by one block")
        a, b = self._alloc()
        self.tables[i][0].append(a)
        self.tables[i][1].append(b)
        self.check("allocate")

    def fork(self, i: int):
        self.log.append(f"fork table {i}")
        mt, rt = self.tables[i]
        child, (after,) = self.m("fork", list(mt), inplace=True)
        if after != mt:
            self.fail(f"fork({mt}) changed the parent's table to {after!r}: the parent keeps its blocks; "
                      "return a NEW list for the child")
        if not isinstance(child, list) or child != mt:
            if isinstance(child, list) and len(child) == len(mt):
                self.fail(f"fork({mt}) returned {child}.", "copies blocks in fork instead of sharing them: the "
                          "child must hold the SAME block ids, each incref'd (copies happen later, on write)", end="")
            self.fail(f"fork({mt}) returned {child!r}: expected a new list with the same block ids")
        self.tables.append((child, self.ref.fork(rt)))
        self.check("fork")

    def write(self, i: int):
        """A token is about to be written into table i's last block: append_slot edits the table in place."""
        mt, rt = self.tables[i]
        self.log.append(f"append_slot on table {i} (last block {mt[-1]}, shared by {self.held()[mt[-1]]})")
        before = list(mt)
        got, (after,) = self.m("append_slot", list(mt), inplace=True)
        new_r, old_r = self.ref.append_slot(rt)
        shared = old_r is not None
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            self.fail(f"append_slot returned {got!r}: expected a (block, old block or None) pair")
        if not (isinstance(after, list) and len(after) == len(before)):
            self.fail(f"append_slot changed the table {before} to {after!r}: it may only replace the last entry")
        new, old = got
        for what, b in (("block", new), ("old block", old)):
            if b is not None and (type(b) is not int or not 0 <= b < self.n):
                self.fail(f"append_slot returned {got!r}: the {what} in it must be a block id (an int in "
                          f"0..{self.n - 1}), got {type(b).__name__} {str(b)[:40]}")
        if shared and old is None:
            self.fail(f"append_slot on a table whose last block {before[-1]} is shared by 2+ tables returned "
                      f"{got!r}.", "never copies in append_slot: writing there would change the other sequences' "
                      "tokens too; allocate a new block and return (new, old)", end="")
        if not shared and old is not None:
            self.fail(f"append_slot on a table whose last block {before[-1]} has ref count 1 returned {got!r}.",
                      "copies in append_slot although the last block is not shared: copy only when ref_count > 1, "
                      "else return (block_table[-1], None)", end="")
        if not shared:
            if new != before[-1] or after != before:
                self.fail(f"append_slot on an unshared last block must return ({before[-1]}, None) and leave "
                          f"the table alone; got {got!r}, table now {after}")
        else:
            if old == before[-1] and new != old and after == before:
                self.fail(f"copy-on-write of block {old}: append_slot returned {got!r} but left the table as "
                          f"{after}.", "puts the new block into a copy of the table: set block_table[-1] = new in "
                          "place (the engine keeps using the list it passed)", end="")
            if old != before[-1] or new == old or after[:-1] != before[:-1] or after[-1] != new:
                self.fail(f"copy-on-write of block {before[-1]}: expected (new, {before[-1]}) with the table's "
                          f"last entry replaced in place by new; got {got!r}, table {before} -> {after}")
            others = {b for j, (t2, _) in enumerate(self.tables) if j != i for b in t2}
            if new in others:
                self.fail(f"append_slot gave block {new} as the copy, but other tables still hold it")
        mt[:] = after
        self.check("append_slot")

    def free_table(self, i: int) -> tuple[list[int], list[int]]:
        mt, rt = self.tables.pop(i)
        self.log.append(f"free table {i} ({mt})")
        for a, b in zip(reversed(mt), reversed(rt)):
            self.m("free", a)
            self.ref.free(b)
        self.check("free")
        return mt, rt

    def double_free(self, mt: list[int], rt: list[int]):
        """Free again a block of a just-freed table that is now free: it must raise."""
        for a, b in zip(mt, rt):
            if self.ref.ref_count(b) == 0:
                self.log.append(f"free block {a} again (it is free)")
                if self.refused("free", a):
                    self.check("a refused double free")  # any error is right, if it changed nothing
                    return
                self.fail(f"free({a}) of a block that is already free did not raise.", "lets a free block be freed "
                          "again: raise an error, or the block enters the free list twice and is later handed to two "
                          "sequences", end="")


    def must_raise(self, op: str, *args, why: str):
        """op(*args) must raise RuntimeError (the interface's error) and change nothing."""
        call = f"{op}({', '.join(map(repr, args))})"
        self.log.append(f"{call} (must raise)")
        raised = self.refused(op, *args)
        if raised:
            if not raised.is_a(RuntimeError):
                self.fail(f"{call} raised {raised.type_name}, expected RuntimeError.", f"lets {raised.type_name} "
                          f"escape ({why}): the BlockAllocator interface raises RuntimeError, which is what a caller "
                          "catches", end="")
            self.check(f"a refused {op}")
            return
        self.fail(f"{call} did not raise: {why}")

    def exhaust(self):
        """allocate() on an empty pool raises RuntimeError."""
        self.must_raise("allocate", why="no block is free; check can_allocate() first")

    def incref_free(self):
        """incref of a block no table holds raises RuntimeError."""
        held = self.held()
        a = next(b for b in range(self.n) if b not in held)
        self.must_raise("incref", a, why="incref of a free block would make a block with no owner look held, "
                        "and it would never return to the pool (or be handed out while counted as held)")


SCRIPTS = ["fork, then write into the shared last block (copy-on-write)", "free after fork drops one reference",
           "can_allocate at the boundary; allocate until empty", "freeing or incref'ing a free block raises"]


def _scripted(d: _Drive, which: str):
    if which == SCRIPTS[0]:
        d.new(2)
        d.fork(0)
        d.write(1)           # child writes: copy
        d.write(0)           # parent now alone on its last block: no copy
        d.free_table(1)
        d.free_table(0)
    elif which == SCRIPTS[1]:
        d.new(3)
        d.fork(0)
        d.fork(1)
        d.free_table(0)
        d.grow(0)
        d.free_table(1)
        d.free_table(0)
    elif which == SCRIPTS[2]:
        d.new(d.n - 2)
        d.grow(0)
        d.grow(0)
        d.exhaust()
        d.free_table(0)
    elif which == SCRIPTS[3]:
        d.new(2)
        mt, rt = d.free_table(0)
        d.double_free(mt, rt)
        d.incref_free()


def _random_ops(d: _Drive, rng: random.Random, steps: int):
    for _ in range(steps):
        free = d.ref.num_free()
        ops = ["new"] * (free >= 1) + ["grow"] * (bool(d.tables) and free >= 1) + ["fork"] * bool(d.tables) * 2
        ops += ["write"] * bool(d.tables) * 3 + ["free"] * bool(d.tables) * 2
        op = rng.choice(ops)
        i = rng.randrange(len(d.tables)) if d.tables else 0
        if op == "new":
            d.new(rng.randint(1, min(free, 3)))
        elif op == "grow":
            d.grow(i)
        elif op == "fork":
            d.fork(i)
        elif op == "write":
            shared = d.ref.ref_count(d.tables[i][1][-1]) > 1
            if shared and free == 0:
                d.free_table(rng.randrange(len(d.tables)))
            else:
                d.write(i)
        else:
            mt, rt = d.free_table(i)
            if rng.random() < 0.3:
                d.double_free(mt, rt)
    while d.tables:
        d.free_table(0)


@check(points=4, section="2.1", timeout=30, cost=0.3)
def block_allocator(t):
    """The ref-counted allocator, op by op against the engine's: fork shares, append_slot copies on write."""
    # Each hidden case gets its own seed and size, drawn up front: how far a wrong allocator gets
    # does not change what the later cases draw.
    cases = t.cases(visible=[(f"visible: {w}", ("script", w, 8)) for w in SCRIPTS],
                    hidden=lambda rng: ("random", rng.randrange(2**31), rng.randint(4, 24)), n=3)
    with t.case("visible: fork returns a new list (the child's table is not the parent's)"):
        got = t.run(fork_aliasing, t.learner("PagedBlockAllocator"), what="fork, then append_slot on the child,")
        if not isinstance(got, dict) or got.get("same_object") is not False:
            t.fail("fork(parent_table) returned the parent's own list object.", "returns the parent's own list from "
                   "fork: the two sequences then share ONE table, so the child's copy-on-write (append_slot edits the "
                   "table in place) rewrites the parent's table too. Return a new list, list(block_table)", end="")
        if got["parent_after"] != got["parent_before"]:
            t.fail(f"copy-on-write on the child changed the parent's table {got['parent_before']} -> "
                   f"{got['parent_after']}: the child's table must be a separate list")
    for label, (kind, what, n) in cases:
        name = label if kind == "script" else f"{label}: 60 random operations on {n} blocks"
        with t.case(name):
            d = _Drive(t, n)
            if kind == "script":
                _scripted(d, what)
            else:
                _random_ops(d, random.Random(what), 60)


# ---------------------------------------------------------------- 2.2 the allocator in the engine

ENGINE_KW = {"num_blocks": 10, "block_size": 8, "max_num_seqs": 4}  # small: greedy prompts get preempted
SAMPLING = {"n": 2, "max_tokens": 8, "seed": 7}


def engine_workload(rng) -> tuple[list[list[int]], list[list[int]]]:
    """(greedy prompts, parallel-sampling prompts): token ids, avoiding the EOS id 0. The sampling
    prompts never fill their last block, so the forked completions' first token is a copy-on-write."""
    greedy = [[rng.randrange(1, 2048) for _ in range(rng.randint(10, 30))] for _ in range(4)]
    lens = [rng.choice([n for n in range(9, 22) if n % ENGINE_KW["block_size"]]) for _ in range(2)]
    parallel = [[rng.randrange(1, 2048) for _ in range(n)] for n in lens]
    return greedy, parallel


def _leak_report(run: dict | None) -> str | None:
    """Why the pool after a finished run is not back to all-free (judged here from its numbers), or None."""
    if run is None or run.get("error") or run.get("finished") is False:
        return "the run stopped before every request finished, so the pool could not be checked"
    if run["leak"]:
        return run["leak"]
    if run["free_blocks"] != run["num_blocks"]:
        return f"num_free() = {run['free_blocks']!r} of {run['num_blocks']} blocks"
    return None


@check(points=3, section="2.2", timeout=120, cost=0.4)
def allocator_in_engine(t):
    """LLM(..., block_allocator=PagedBlockAllocator): same tokens as the engine's allocator, nothing leaked."""
    greedy, parallel = engine_workload(t.rng)
    mine = {**ENGINE_KW, "block_allocator": t.learner("PagedBlockAllocator")}
    g_ref = run_engine(greedy, 10, llm_kwargs=ENGINE_KW)
    p_ref = sample_in_engine(parallel, ENGINE_KW, **SAMPLING)
    pre = sum(s[3] for s in g_ref["schedule"])
    runs: dict = {}
    with t.case(f"greedy, 4 prompts, 10 blocks of 8 tokens ({pre} preemption(s) with {ENGINE_TAIL}): same tokens"):
        runs["greedy"] = g = t.run(run_engine, greedy, 10, llm_kwargs=mine, catch=True,
                                   what="the engine, running on your allocator,")
        with judged(t, g, who="on your allocator", leak=False):  # the third case judges the leaks
            t.expect(g["tokens"], g_ref["tokens"], "generated token ids per request",
                     hint="The engine's own allocator gives these tokens; yours changes what attention reads.")
    with t.case("parallel sampling n=2 (forked blocks, copy-on-write): same tokens"):
        runs["parallel"] = p = t.run(sample_in_engine, parallel, mine, **SAMPLING,
                                     what="the engine, running on your allocator,")
        t.expect(p["tokens"], p_ref["tokens"], "token ids per completion",
                 hint="Forked children share blocks; a child writing into a shared block without a copy "
                      "overwrites its sibling's K/V.")
    with t.case("nothing leaked: every block free and ref counts consistent afterwards"):
        for name in ("greedy", "parallel"):
            why = _leak_report(runs.get(name))
            if why:
                t.fail(f"after every request finished ({name} run): {why}")


# ---------------------------------------------------------------- 3. slot mapping


def _slot_case(rng, n_blocks: int, bs: int, T: int, first: int | None = None):
    """A shuffled block table and T sorted positions, drawn from the first `first` positions (default all)."""
    pool = list(range(4 * n_blocks + 8))
    rng.shuffle(pool)
    bt = torch.tensor(pool[:n_blocks], dtype=torch.int32)
    span = min(first or n_blocks * bs, n_blocks * bs)
    pos = torch.tensor(sorted(rng.sample(range(span), min(T, span))), dtype=torch.int64)
    return bt, pos


@answer_code
def _slot_mistakes(bt, pos, bs) -> dict:
    b = bt.long()
    out = {"uses the position as the slot (the slot is block_table[p // block_size] * block_size + offset)": pos.clone(),
           "multiplies the block id by the number of blocks in the table instead of block_size":
               b[pos // bs] * len(bt) + pos % bs,
           "adds the block id instead of block_id * block_size": b[pos // bs] + pos % bs,
           "multiplies by block size 16 instead of the block_size argument": b[pos // bs] * 16 + pos % bs}
    if int(pos.max()) < len(bt):
        out["indexes the block table by position (use block_table[p // block_size])"] = b[pos] * bs + pos % bs
    out["indexes the block table by position modulo its length (use block_table[p // block_size])"] = \
        b[pos % len(bt)] * bs + pos % bs
    return out


@check(points=2, section="3.1", timeout=10)
def slot_mapping(t):
    """Slot of every position from a block table: block_table[p // bs] * bs + p % bs."""
    # The third visible case keeps its positions below the table's length, where indexing the table by
    # position gives a wrong answer instead of an IndexError.
    cases = t.cases(visible=[("visible", (3, 4, 12, None)), ("visible", (5, 16, 9, None)), ("visible", (8, 2, 6, 8))],
                    hidden=lambda rng: (rng.randint(2, 12), rng.choice([1, 8, 32, 64]), rng.randint(1, 10), None), n=3)
    for label, (n, bs, T, first) in cases:
        with t.case(f"{label}: {n} blocks, block_size {bs}, {T} positions"):
            bt, pos = _slot_case(t.rng, n, bs, T, first)
            got, expected = t.both("slot_mapping", bt, pos, bs)
            t.expect(got, expected, f"slots for block_table={bt.tolist()}, positions={pos.tolist()}",
                     mistakes=_slot_mistakes(bt, pos, bs))


# ---------------------------------------------------------------- 4. paged decode


@answer_code
def decode_variant(q, k_cache, v_cache, block_tables, context_lens, scale, kv_map="div", lens=None,
                   tables=None, dtype=torch.float64):
    """Paged decode with one thing changed, to name what a wrong answer did: `kv_map` "mod" (head h reads
    KV head h % num_kv_heads), `lens` (the positions attended, None: all of the table), `tables` (the
    blocks read), `dtype` (what the scores, softmax and sum are computed in)."""
    B, H, D = q.shape
    _, bs, H_kv, _ = k_cache.shape
    nb = block_tables.shape[1]
    idx = (block_tables if tables is None else tables).long()
    k = k_cache[idx].reshape(B, nb * bs, H_kv, D).to(dtype)
    v = v_cache[idx].reshape(B, nb * bs, H_kv, D).to(dtype)
    heads = torch.arange(H, device=q.device)
    kv = heads // (H // H_kv) if kv_map == "div" else heads % H_kv
    s = torch.einsum("bhd,blhd->bhl", q.to(dtype), k[:, :, kv]) * scale
    if lens is not None:
        past = torch.arange(nb * bs, device=q.device)[None, :] >= lens.to(q.device).long()[:, None]
        s = s.masked_fill(past[:, None, :], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", s.softmax(-1), v[:, :, kv]).to(q.dtype)


@answer_code
def decode_mistakes(q, kc, vc, bt, lens, scale, kernel: bool = False) -> dict:
    """The usual wrong answers on these inputs. kernel: the mistakes as a kernel that loops over the
    sequence's blocks makes them (a position past the context is read only inside its last block)."""
    B, H, D = q.shape
    bs = kc.shape[1]
    lens = lens.long()
    rounded = (lens + bs - 1) // bs * bs
    args = (q, kc, vc, bt, lens)
    out = {"ignores context_lens (attends to the padding past each sequence's last token)":
               decode_variant(*args, scale),
           "misses the softmax scale (scores must be multiplied by scale)": decode_variant(*args, 1.0, lens=lens),
           "ignores the `scale` argument and uses 1/sqrt(head_dim) (the caller chooses the scale)":
               decode_variant(*args, D ** -0.5, lens=lens),
           "masks whole blocks only: it attends to the unwritten tail of each sequence's last block "
           "(mask positions >= context_len inside the block too)": decode_variant(*args, scale, lens=rounded),
           "drops the newest token: context_lens already counts it (attend to positions < context_len)":
               decode_variant(*args, scale, lens=lens - 1),
           "attends to one position too many (positions < context_len, not <= context_len)":
               decode_variant(*args, scale, lens=torch.minimum(lens + 1, rounded) if kernel else lens + 1),
           "maps query head h to KV head h % num_kv_heads; GQA shares KV head h // (num_heads // num_kv_heads)":
               decode_variant(*args, scale, kv_map="mod", lens=lens),
           "reads logical block b of the cache instead of the physical block block_tables[s, b]":
               decode_variant(*args, scale, lens=lens,
                              tables=torch.arange(bt.shape[1], device=bt.device).expand(B, -1)),
           "reads every sequence's blocks from row 0 of block_tables (row s belongs to sequence s)":
               decode_variant(*args, scale, lens=lens, tables=bt[:1].expand(B, -1))}
    if bt.stride(0) != bt.shape[1]:
        flat = bt.as_strided((bt.numel() + bt.shape[0] * (bt.stride(0) - bt.shape[1]),), (1,))
        wrong = flat[: bt.numel()].view(bt.shape)  # row s read at s * width instead of s * stride
        out["reads the block table with the wrong stride (row s starts at s * stride_bt, not s * max_blocks)"] = \
            decode_variant(*args, scale, lens=lens, tables=wrong)
    if q.dtype == torch.bfloat16:
        out["computes the scores and softmax in bf16: upcast q, K and V to float32 first (bf16 keeps 8 bits "
            "of a score, and exp turns that error into percents)"] = decode_variant(*args, scale, lens=lens,
                                                                                     dtype=q.dtype)
    return out


def _decode_configs(t, bf16: bool) -> list:
    """(label, (B, H, H_kv, D, bs, lens, options)): visible ones cover every named mistake on every seed."""
    visible = [("visible: 2 seqs, 8 heads on 2 KV heads, blocks of 4", (2, 8, 2, 16, 4, [9, 3], {})),
               ("visible: MHA (4 heads, 4 KV heads), blocks of 8, one seq exactly fills its blocks, scale 0.3",
                (3, 4, 4, 8, 8, [16, 1, 11], {"scale": 0.3})),
               ("visible: MQA (4 heads, 1 KV head)", (2, 4, 1, 16, 4, [5, 13], {}))]
    if bf16:
        visible.append(("visible: bf16 inputs, sharp scores (queries x6), 3 seqs up to 128 tokens",
                        (3, 8, 2, 64, 16, [100, 57, 128], {"dtype": torch.bfloat16, "q_scale": 6.0})))

    def hidden(rng):
        H_kv = rng.choice([1, 2, 4])
        H = H_kv * rng.choice([1, 2, 4])
        bs = rng.choice([2, 4, 8, 16])
        # at most 8 (sequence, KV head) pairs: under Triton's interpreter a kernel's time grows with pairs x blocks
        # (about 6 ms each here), and 4 x 4 pairs of 5 blocks took half a second
        B = rng.randint(1, min(4, 8 // H_kv))
        D = rng.choice([8, 16, 32])
        return B, H, H_kv, D, bs, [rng.randint(1, 5 * bs) for _ in range(B)], \
            {"scale": rng.choice([None, round(rng.uniform(0.05, 0.5), 3)])}
    return t.cases(visible=visible, hidden=hidden, n=2)


def _decode_case(t, name: str, label: str, cfg: tuple, kernel: bool):
    B, H, H_kv, D, bs, lens, opts = cfg
    scale = opts.get("scale") or D ** -0.5
    with t.case(f"{label}: heads {H}/{H_kv}, head_dim {D}, block_size {bs}, context_lens {lens}, scale {scale:.4g}"):
        args = make_decode_case(t.gen, t.rng, B, H, H_kv, D, bs, lens, device=t.device, **opts)
        expected = t.ref.paged_decode_torch(*args)
        bt = args[3]
        if bt.stride(0) != bt.shape[1]:
            wide = bt.as_strided((bt.shape[0], bt.stride(0)), bt.stride())
            got = t.run(call_with_table_view, t.learner(name), *args[:3], wide, bt.shape[1], *args[4:], what=name)
        else:
            got = t.call(name, *args)
        hint = ("Compute the scores, softmax and weighted sum in float32, then cast the output to q's dtype."
                if args[0].dtype == torch.bfloat16 else "")
        t.expect(got, expected, "attention output", mistakes=decode_mistakes(*args, kernel=kernel), hint=hint)


@check(points=3, section="4.1", timeout=60, cost=0.3)
def paged_decode_torch(t):
    """Paged decode in torch against the reference (fp32, and bf16 with a sharp softmax); then in the engine."""
    for label, cfg in _decode_configs(t, bf16=True):
        _decode_case(t, "paged_decode_torch", label, cfg, kernel=False)
    greedy, _ = engine_workload(t.rng)
    kw = {"num_blocks": 16, "block_size": 8}
    with t.case("in the engine: LLM(..., attention_backend=DecodeBackend(paged_decode_torch)), same greedy tokens"):
        expected = run_engine(greedy[:3], 8, llm_kwargs=kw)
        run = t.run(run_engine, greedy[:3], 8, llm_kwargs=kw, catch=True,
                    make={"attention_backend": (t.learner("DecodeBackend"), t.learner("paged_decode_torch"))},
                    what="the engine, running your paged_decode_torch,")
        with judged(t, run, who="your paged_decode_torch"):
            t.expect(run["tokens"], expected["tokens"], "generated token ids per request",
                     hint="Every decode step of the engine ran your function; its prefill is the engine's own.")


@check(points=4, section="4.2", timeout=120, cost=0.7, requires_triton=True)
def paged_decode_triton(t):
    """The Triton paged decode kernel against the reference (fp32; bf16 and timing on CUDA)."""
    # The kernel uses tl.sum, not tl.dot, so fp32 stays exact-ish even on a GPU (no TF32).
    for label, cfg in _decode_configs(t, bf16=False):
        _decode_case(t, "paged_decode_triton", label, cfg, kernel=True)
    lens = [t.rng.randint(5, 20) for _ in range(3)]
    _decode_case(t, "paged_decode_triton", "block table that is a view of a wider buffer (row stride > width)",
                 (3, 4, 2, 16, 4, lens, {"strided": True}), kernel=True)
    with t.case("bf16 inputs, 8 seqs up to 1000 tokens, blocks of 16", requires_cuda=True) as on:
        if on:
            lens = [t.rng.randint(1, 1000) for _ in range(8)]
            args = make_decode_case(t.gen, t.rng, 8, 32, 8, 128, 16, lens, torch.bfloat16, "cuda", q_scale=6.0)
            t.expect(t.call("paged_decode_triton", *args), t.ref.paged_decode_torch(*args), "bf16 attention output",
                     mistakes=decode_mistakes(*args, kernel=True),
                     hint="Load K and V, then compute the scores, online softmax and sum in float32.")
    with t.case("speed: within 1.5x of the engine's Triton kernel (bf16, 64 seqs x 2048-4096 tokens)",
                requires_cuda=True) as on:
        if on:
            lens = [t.rng.randint(2048, 4096) for _ in range(64)]
            got = t.run(time_decode, t.learner("paged_decode_triton"), lens, t.rng.randrange(2**31),
                        what="paged_decode_triton, timed,")
            mine, ref = got["mine"], got["ref"]
            if not (type(mine) is float and type(ref) is float and mine > 0 and ref > 0):
                t.fail(f"the timing of your kernel came back as {mine!r} s per call: it must be a positive time")
            kv_bytes = 2 * sum(lens) * 8 * 128 * 2
            t.expect_true(mine <= 1.5 * ref,
                          f"your kernel takes {mine * 1e3:.3f} ms per call ({kv_bytes / mine / 1e9:.0f} GB/s of K/V), "
                          f"the engine's {ref * 1e3:.3f} ms ({kv_bytes / ref / 1e9:.0f} GB/s): load each K/V block "
                          "once per KV head, not per query head")


# ---------------------------------------------------------------- 5. swap or recompute


@answer_code
def _pairs(n: int, pairs: str) -> int:
    """The (query, key) pairs of attention over n tokens: "causal" n(n+1)/2, and the usual wrong counts
    "square" n * n, "no_self" n(n-1)/2, "none" 0."""
    return {"causal": n * (n + 1) // 2, "square": n * n, "no_self": n * (n - 1) // 2, "none": 0}[pairs]


@answer_code
def preemption_variant(model: dict, n: int, kv_bytes: float, pcie: float, flops: float, transfers: int = 2,
                       tensors: int = 2, attn_heads: str = "heads", pairs: str = "causal",
                       tie: str = "recompute") -> dict:
    """preemption_cost with one thing changed, to name a wrong answer: `transfers` PCIe copies, `tensors`
    cached per token (K and V: 2), the heads that do attention's work, the (query, key) pairs counted
    (`_pairs`), and what a tie picks."""
    one_way = n * tensors * model["layers"] * model["kv_heads"] * model["head_dim"] * kv_bytes
    total = 2 * model["params"] * n + 4 * model["layers"] * model[attn_heads] * model["head_dim"] * _pairs(n, pairs)
    swap_s, recompute_s = transfers * one_way / pcie, total / flops
    cheaper = "swap" if swap_s < recompute_s or (swap_s == recompute_s and tie == "swap") else "recompute"
    return {"transfer_bytes": one_way, "swap_s": swap_s, "recompute_flops": total, "recompute_s": recompute_s,
            "cheaper": cheaper}


@answer_code
def preemption_mistakes(model: dict, n: int, kv_bytes: float, pcie: float, flops: float, defaults: dict) -> dict:
    """The usual wrong answers on these inputs, each a whole result dict."""
    args = (model, n, kv_bytes, pcie, flops)
    return {
        "counts one PCIe transfer; a swap copies the K/V out to the host and back in again (two transfers)":
            preemption_variant(*args, transfers=1),
        "counts only K in the bytes moved; the cache holds K and V (2 x layers x kv_heads x head_dim per token)":
            preemption_variant(*args, tensors=1),
        "uses kv_heads in the attention FLOPs; every query head computes its own scores (GQA shares the K/V, "
        "not the work)": preemption_variant(*args, attn_heads="kv_heads"),
        "counts n * n (query, key) pairs; causal attention has n(n+1)/2 (token i sees the i + 1 keys up to "
        "itself)": preemption_variant(*args, pairs="square"),
        "counts n(n-1)/2 (query, key) pairs, leaving out each token's own key: token i sees i + 1 keys, "
        "n(n+1)/2 in all": preemption_variant(*args, pairs="no_self"),
        "leaves out the attention FLOPs (4 x head_dim per (query, key) pair and query head, in every layer)":
            preemption_variant(*args, pairs="none"),
        "picks \"swap\" on a tie (a context of 0 costs nothing either way); a tie goes to \"recompute\", which "
        "needs no host memory": preemption_variant(*args, tie="swap"),
        "ignores the kv_bytes argument (bytes per cached element: 1 for an fp8 cache)":
            preemption_variant(model, n, defaults["kv_bytes"], pcie, flops),
        "ignores the pcie_bytes_per_s argument": preemption_variant(model, n, kv_bytes, defaults["pcie"], flops),
        "ignores the flops_per_s argument": preemption_variant(model, n, kv_bytes, pcie, defaults["flops"]),
    }


LLAMA_3_8B = {"name": "Llama-3-8B", "params": 8.03e9, "layers": 32, "heads": 32, "kv_heads": 8, "head_dim": 128}
LLAMA_2_7B = {"name": "Llama-2-7B (MHA)", "params": 6.74e9, "layers": 32, "heads": 32, "kv_heads": 32,
              "head_dim": 128}


def random_model(rng) -> dict:
    kv = rng.choice([1, 2, 4, 8])
    return {"name": "a model you have not seen", "params": round(rng.uniform(0.5, 70), 2) * 1e9,
            "layers": rng.randint(12, 80), "heads": kv * rng.choice([1, 2, 4, 8]), "kv_heads": kv,
            "head_dim": rng.choice([64, 96, 128, 256])}


@check(points=2, section="5.1", timeout=10)
def preemption_cost(t):
    """Swap (two PCIe copies of K and V) against recompute (a prefill: weights plus causal attention)."""
    defaults = {"kv_bytes": 2, "pcie": t.ref.PCIE_GEN5_X16_BYTES_PER_S, "flops": t.ref.H100_DENSE_BF16_FLOPS}
    # The first visible case is GQA at a long context (every FLOP and byte mistake shows); the second
    # passes every keyword at a value of its own (an fp8 cache, a slower link, a sustained FLOP/s) and
    # recompute wins there; the third is the tie.
    visible = [("visible: Llama-3-8B (GQA, 32 query heads on 8 KV heads), 1000 tokens, defaults",
                (LLAMA_3_8B, 1000, 2, defaults["pcie"], defaults["flops"])),
               ("visible: Llama-2-7B (MHA), 4096 tokens, fp8 cache (kv_bytes=1), 16 GB/s link, 600 TFLOP/s",
                (LLAMA_2_7B, 4096, 1, 16e9, 600e12)),
               ("visible: Llama-3-8B, a context of 0 tokens (both cost 0: a tie)",
                (LLAMA_3_8B, 0, 2, defaults["pcie"], defaults["flops"]))]

    def hidden(rng):
        n = 0 if rng.random() < 0.1 else rng.randint(1, 131072)
        return (random_model(rng), n, rng.choice([1, 2, 2, 4]), rng.choice([defaults["pcie"], 32e9, 16e9, 126e9]),
                rng.choice([defaults["flops"], 312e12, 500e12, 2.25e15]))
    for label, (model, n, kvb, pcie, flops) in t.cases(visible, hidden, n=3):
        kw = non_default(kv_bytes=(kvb, 2), pcie_bytes_per_s=(pcie, defaults["pcie"]),
                         flops_per_s=(flops, defaults["flops"]))
        shape = ", ".join(f"{k}={model[k]:g}" for k in ("params", "layers", "heads", "kv_heads", "head_dim"))
        with t.case(f"{label}: preemption_cost({{{shape}}}, {n}{''.join(f', {k}={v:g}' for k, v in kw.items())})"):
            got, expected = t.both("preemption_cost", model, n, **kw)
            t.expect_dict(got, expected, "preemption_cost", rtol=1e-9,
                          mistakes=preemption_mistakes(model, n, kvb, pcie, flops, defaults),
                          keys=("transfer_bytes", "swap_s", "recompute_flops", "recompute_s", "cheaper"))
    with t.case("a negative context raises ValueError"):
        t.expect_raises(ValueError, "preemption_cost", LLAMA_3_8B, -1,
                        why="a sequence cannot hold -1 tokens; a negative count is a caller's bug, and the "
                            "formula would return a cost for it")
