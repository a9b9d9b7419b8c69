"""Checks of lesson 04: the block allocator (op by op and in the engine), slot mapping, paged decode."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from autograder.core import NotStarted, check, learner_traceback

ENGINE_TAIL = "the engine's own BlockAllocator"


# ---------------------------------------------------------------- 2. the allocator, op by op


class _Drive:
    """Runs the same operations on the learner's allocator and the engine's, checking invariants.

    Block ids may differ between the two (the free-list order is not part of the spec): what is
    compared is what a caller can observe: ref counts of held blocks, num_free, can_allocate, which
    append_slot calls copy, and that errors are raised.
    """

    def __init__(self, t, num_blocks: int):
        from reference_engine.block_manager import BlockAllocator
        self.t, self.n = t, num_blocks
        cls = t.fn("PagedBlockAllocator")
        self.mine = self._call(cls, num_blocks, what="PagedBlockAllocator")
        self.ref = BlockAllocator(num_blocks)
        self.tables: list[tuple[list[int], list[int]]] = []  # (learner table, engine table)
        self.log: list[str] = []

    def _call(self, fn, *args, what: str):
        return self.t.call_fn(fn, *args, what=what)

    def m(self, name, *args):
        return self._call(getattr(self.mine, name), *args, what=f"PagedBlockAllocator.{name}")

    def fail(self, msg: str):
        ops = "; ".join(self.log[-6:])
        self.t.fail(f"{msg}\n  (num_blocks={self.n}; last operations: {ops})")

    # -- invariants ----------------------------------------------------------
    def held(self) -> dict[int, int]:
        c: dict[int, int] = {}
        for mt, _ in self.tables:
            for b in mt:
                c[b] = c.get(b, 0) + 1
        return c

    def check(self, after: str):
        held = self.held()
        for b, k in held.items():
            rc = self.m("ref_count", b)
            if rc != k:
                if after in ("free", "append_slot") and rc < k:
                    self.fail(f"block {b} is held by {k} table(s) but ref_count says {rc} after {after}. Looks like "
                              "your code frees a shared block (free without ref counting): free drops ONE "
                              "reference, and the block returns to the pool only when the count reaches 0")
                if after == "append_slot" and rc > k:
                    self.fail(f"block {b} is held by {k} table(s) but ref_count says {rc} after copy-on-write. "
                              "Looks like your code leaks the old block on copy-on-write: the table gave it "
                              "up, so drop its reference (free it once)")
                self.fail(f"after {after}: block {b} is held by {k} table(s) but ref_count({b}) = {rc}")
        free, want = self.m("num_free"), self.n - len(held)
        if free != want or free != self.ref.num_free():
            if after == "append_slot" and free < want:
                self.fail(f"num_free() = {free}, expected {want} after copy-on-write. Looks like your code leaks "
                          "the old block on copy-on-write (drop the table's reference to it)")
            if after in ("free", "append_slot") and free > want:
                self.fail(f"num_free() = {free}, expected {want}: a block still held by a table is free. "
                          "Looks like your code frees a shared block (free without ref counting)")
            self.fail(f"after {after}: num_free() = {free}, expected {want} "
                      f"({self.n} blocks, {len(held)} held)")
        for k in sorted({0, 1, free, free + 1}):
            got, exp = self.m("can_allocate", k), self.ref.can_allocate(k)
            if bool(got) != exp:
                self.fail(f"can_allocate({k}) = {got!r} with {free} free blocks, expected {exp}. "
                          "Looks like your code is off by one in can_allocate (n allocations succeed iff "
                          "n <= num_free())")

    # -- operations ----------------------------------------------------------
    def _alloc(self, pending: tuple[int, ...] = ()) -> tuple[int, int]:
        held = self.held()
        for x in pending:
            held[x] = held.get(x, 0) + 1
        b = self.m("allocate")
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < self.n:
            self.fail(f"allocate() returned {b!r}: expected a block id in 0..{self.n - 1}")
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
        child = self.m("fork", list(mt))
        if not isinstance(child, list) or child != mt:
            if isinstance(child, list) and len(child) == len(mt):
                self.fail(f"fork({mt}) returned {child}. Looks like your code copies blocks in fork instead "
                          "of sharing them: the child must hold the SAME block ids, each incref'd "
                          "(copies happen later, on write)")
            self.fail(f"fork({mt}) returned {child!r}: expected a new list with the same block ids")
        self.tables.append((child, self.ref.fork(rt)))
        self.check("fork")

    def write(self, i: int):
        """A token is about to be written into table i's last block."""
        mt, rt = self.tables[i]
        self.log.append(f"append_slot on table {i} (last block {mt[-1]}, shared by {self.held()[mt[-1]]})")
        before = list(mt)
        with self.t.learner_code("PagedBlockAllocator.append_slot()"):
            got = self.mine.append_slot(mt)  # in place on purpose: the engine relies on it
        new_r, old_r = self.ref.append_slot(rt)
        shared = old_r is not None
        if not (isinstance(got, tuple) and len(got) == 2):
            self.fail(f"append_slot returned {got!r}: expected a (block, old block or None) pair")
        new, old = got
        if shared and old is None:
            self.fail(f"append_slot on a table whose last block {before[-1]} is shared by 2+ tables returned "
                      f"{got!r}. Looks like your code never copies in append_slot: writing there would "
                      "change the other sequences' tokens too; allocate a new block and return (new, old)")
        if not shared and old is not None:
            self.fail(f"append_slot on a table whose last block {before[-1]} has ref count 1 returned {got!r}. "
                      "Looks like your code copies in append_slot although the last block is not shared: "
                      "copy only when ref_count > 1, else return (block_table[-1], None)")
        if not shared:
            if new != before[-1] or mt != before:
                self.fail(f"append_slot on an unshared last block must return ({before[-1]}, None) and leave "
                          f"the table alone; got {got!r}, table now {mt}")
        else:
            if old != before[-1] or new == old or mt[:-1] != before[:-1] or mt[-1] != new:
                self.fail(f"copy-on-write of block {before[-1]}: expected (new, {before[-1]}) with the table's "
                          f"last entry replaced in place by new; got {got!r}, table {before} -> {mt}")
            others = {b for j, (t2, _) in enumerate(self.tables) if j != i for b in t2}
            if new in others:
                self.fail(f"append_slot gave block {new} as the copy, but other tables still hold it")
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
        """Free again a block of a just-freed table that is now free."""
        for a, b in zip(mt, rt):
            if self.ref.ref_count(b) == 0:
                self.log.append(f"free block {a} again (it is free)")
                fn = self.mine.free
                try:
                    fn(a)
                except NotImplementedError as e:
                    raise NotStarted(str(e)) from None
                except Exception:  # noqa: BLE001 - any error is right here
                    self.check("a refused double free")
                    return
                self.fail(f"free({a}) of a block that is already free did not raise. Looks like your code lets "
                          "a free block be freed again: raise an error, or the block enters the free list "
                          "twice and is later handed to two sequences")


def _scripted(d: _Drive, which: str):
    if which == "fork, then write into the shared last block (copy-on-write)":
        d.new(2)
        d.fork(0)
        d.write(1)           # child writes: copy
        d.write(0)           # parent now alone on its last block: no copy
        d.free_table(1)
        d.free_table(0)
    elif which == "free after fork drops one reference":
        d.new(3)
        d.fork(0)
        d.fork(1)
        d.free_table(0)
        d.grow(0)
        d.free_table(1)
        d.free_table(0)
    elif which == "can_allocate at the boundary; allocate until empty":
        d.new(d.n - 2)
        d.grow(0)
        d.grow(0)
        d.free_table(0)
    elif which == "freeing a free block raises":
        d.new(2)
        mt, rt = d.free_table(0)
        d.double_free(mt, rt)


def _random_ops(d: _Drive, rng, steps: int):
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


@check(points=4, section="2.1", timeout=20)
def block_allocator(t):
    """The ref-counted allocator, op by op against the engine's: fork shares, append_slot copies on write."""
    for which in ("fork, then write into the shared last block (copy-on-write)",
                  "free after fork drops one reference", "can_allocate at the boundary; allocate until empty",
                  "freeing a free block raises"):
        with t.case(f"visible: {which}"):
            _scripted(_Drive(t, 8), which)
    for k in range(3):
        n = t.rng.randint(4, 24)
        with t.case(f"hidden: 60 random operations on {n} blocks (#{k + 1})"):
            _random_ops(_Drive(t, n), t.rng, 60)


# ---------------------------------------------------------------- 2.2 the allocator in the engine

def _target_path() -> str:
    import reference_engine
    return str(Path(reference_engine.__file__).resolve().parent / "checkpoints" / "target")


def engine_workload(rng) -> tuple[list[list[int]], list[list[int]]]:
    """(greedy prompts, parallel-sampling prompts): token ids, avoiding the EOS id 0."""
    greedy = [[rng.randrange(1, 2048) for _ in range(rng.randint(10, 30))] for _ in range(4)]
    parallel = [[rng.randrange(1, 2048) for _ in range(rng.randint(9, 21))] for _ in range(2)]
    return greedy, parallel


def run_engine(allocator_cls, greedy, parallel, num_blocks: int = 10, block_size: int = 8):
    """Greedy prompts (preemption forced by the small cache), then n=2 seeded sampling (copy-on-write).

    Returns (greedy token ids, parallel token ids per completion, engine, preemptions)."""
    from reference_engine import LLM, SamplingParams
    llm = LLM(_target_path(), block_allocator=allocator_cls, num_blocks=num_blocks, block_size=block_size,
              max_num_seqs=4)
    outs = llm.generate(greedy, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    g = [o.token_ids for o in outs]
    outs = llm.generate(parallel, SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=8, ignore_eos=True))
    p = [[c.token_ids for c in o.outputs] for o in outs]
    pre = sum(s.num_preempted for s in llm.engine.step_stats)
    return g, p, llm.engine, pre


@check(points=3, section="2.2", timeout=120)
def allocator_in_engine(t):
    """LLM(..., block_allocator=PagedBlockAllocator): same tokens as the engine's allocator, nothing leaked."""
    from reference_engine.block_manager import BlockAllocator
    greedy, parallel = engine_workload(t.rng)
    cls = t.fn("PagedBlockAllocator")
    g_ref, p_ref, _, pre = run_engine(BlockAllocator, greedy, parallel)
    try:
        g, p, engine, _ = run_engine(cls, greedy, parallel)
    except NotImplementedError as e:
        raise NotStarted(str(e)) from None
    except Exception as e:  # noqa: BLE001 - the engine ran learner code
        with t.case("the engine runs on your allocator"):
            t.fail(f"the engine, running on your allocator, raised:\n{learner_traceback(e, ())}")
        return
    with t.case(f"greedy, 4 prompts, 10 blocks of 8 tokens ({pre} preemption(s) with {ENGINE_TAIL}): same tokens"):
        t.expect(g, g_ref, "generated token ids per request",
                 hint="The engine's own allocator gives these tokens; yours changes what attention reads.")
    with t.case("parallel sampling n=2 (forked blocks, copy-on-write): same tokens"):
        t.expect(p, p_ref, "token ids per completion",
                 hint="Forked children share blocks; a child writing into a shared block without a copy "
                      "overwrites its sibling's K/V.")
    with t.case("nothing leaked: every block free and ref counts consistent afterwards"):
        bm = engine.block_manager
        try:
            bm.check_consistency([])
        except AssertionError as e:
            t.fail(f"after every request finished: {e}")
        t.expect(bm.allocator.num_free(), bm.num_blocks, "num_free() after all requests finished")


# ---------------------------------------------------------------- 3. slot mapping


def _slot_case(t, n_blocks: int, bs: int, T: int):
    pool = list(range(4 * n_blocks + 8))
    t.rng.shuffle(pool)
    bt = torch.tensor(pool[:n_blocks], dtype=torch.int32)
    pos = torch.tensor(sorted(t.rng.sample(range(n_blocks * bs), T)), dtype=torch.int64)
    return bt, pos


def _slot_mistakes(bt, pos, bs) -> dict:
    b = bt.long()
    out = {"uses the position as the slot (the slot is block_table[p // block_size] * block_size + offset)": pos.clone(),
           "multiplies the block id by the number of blocks in the table instead of block_size":
               b[pos // bs] * len(bt) + pos % bs,
           "adds the block id instead of block_id * block_size": b[pos // bs] + pos % bs}
    if bs != 16:
        out["multiplies by block size 16 instead of the block_size argument"] = b[pos // bs] * 16 + pos % bs
    if int(pos.max()) < len(bt):
        out["indexes the block table by position (use block_table[p // block_size])"] = b[pos] * bs + pos % bs
    out["indexes the block table by position modulo its length (use block_table[p // block_size])"] = \
        b[pos % len(bt)] * bs + pos % bs
    return out


@check(points=2, section="3.1", timeout=10)
def slot_mapping(t):
    """Slot of every position from a block table: block_table[p // bs] * bs + p % bs."""
    cases = [("visible: 3 blocks of 4, all positions", 3, 4, 12), ("visible: 5 blocks of 16, a decode + a chunk", 5, 16, 9),
             ("visible: 8 blocks of 2", 8, 2, 6)]
    for _ in range(3):
        cases.append(("hidden", t.rng.randint(2, 12), t.rng.choice([1, 8, 32, 64]), t.rng.randint(1, 10)))
    for label, n, bs, T in cases:
        with t.case(f"{label}: {n} blocks, block_size {bs}, {T} positions"):
            bt, pos = _slot_case(t, n, bs, min(T, n * bs))
            expected = t.ref.slot_mapping(bt, pos, bs)
            got = t.call("slot_mapping", bt, pos, bs)
            t.expect(got, expected, f"slots for block_table={bt.tolist()}, positions={pos.tolist()}",
                     mistakes=_slot_mistakes(bt, pos, bs))


# ---------------------------------------------------------------- 4. paged decode


def decode_variant(q, k_cache, v_cache, block_tables, context_lens, scale, kv_map="div", ignore_lens=False):
    """Paged decode with one thing changed, to name what a wrong answer did."""
    B, H, D = q.shape
    _, bs, H_kv, _ = k_cache.shape
    nb = block_tables.shape[1]
    idx = block_tables.long()
    k = k_cache[idx].reshape(B, nb * bs, H_kv, D).double()
    v = v_cache[idx].reshape(B, nb * bs, H_kv, D).double()
    heads = torch.arange(H)
    kv = heads // (H // H_kv) if kv_map == "div" else heads % H_kv
    s = torch.einsum("bhd,blhd->bhl", q.double(), k[:, :, kv]) * scale
    if not ignore_lens:
        past = torch.arange(nb * bs)[None, :] >= context_lens.long()[:, None]
        s = s.masked_fill(past[:, None, :], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", s.softmax(-1), v[:, :, kv]).to(q.dtype)


def make_decode_case(gen, rng, B, H, H_kv, D, bs, lens, dtype=torch.float32, device="cpu", strided=False):
    """Random q, caches and block tables; each sequence gets distinct shuffled blocks, padded with junk ids.

    strided: the block table is a view into a wider buffer (row stride > width), as an engine's
    persistent [max_seqs, max_blocks] table sliced to this batch would be."""
    need = [-(-n // bs) for n in lens]
    width = max(need)
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    rows, at = [], 0
    for n in need:
        rows.append(perm[at:at + n] + [rng.randrange(num_blocks) for _ in range(width - n)])
        at += n
    table = torch.tensor(rows, dtype=torch.int32)
    if strided:
        wide = torch.randint(0, num_blocks, (B, width + 3), generator=gen, dtype=torch.int32)
        wide[:, :width] = table
        table = wide[:, :width]
    q = torch.randn(B, H, D, generator=gen)
    kc = torch.randn(num_blocks, bs, H_kv, D, generator=gen)
    vc = torch.randn(num_blocks, bs, H_kv, D, generator=gen)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    return (q.to(device, dtype), kc.to(device, dtype), vc.to(device, dtype), table.to(device),
            lens_t.to(device), D ** -0.5)


def decode_mistakes(q, kc, vc, bt, lens, scale) -> dict:
    out = {"ignores context_lens (attends to the padding past each sequence's last token)":
           decode_variant(q, kc, vc, bt, lens, scale, ignore_lens=True),
           "misses the softmax scale (scores must be multiplied by scale)":
           decode_variant(q, kc, vc, bt, lens, 1.0)}
    bs = kc.shape[1]
    rounded = (lens.long() + bs - 1) // bs * bs
    if not torch.equal(rounded, lens.long()):
        out["masks whole blocks only: it attends to the unwritten tail of each sequence's last block "
            "(mask positions >= context_len inside the block too)"] = decode_variant(q, kc, vc, bt, rounded, scale)
    if q.shape[1] != kc.shape[2] and kc.shape[2] > 1:
        out["maps query head h to KV head h % num_kv_heads; GQA shares KV head h // (num_heads // num_kv_heads)"] = \
            decode_variant(q, kc, vc, bt, lens, scale, kv_map="mod")
    if bt.stride(0) != bt.shape[1]:
        flat = bt.as_strided((bt.numel() + bt.shape[0] * (bt.stride(0) - bt.shape[1]),), (1,))
        wrong = flat[: bt.numel()].view(bt.shape)  # row s read at s * width instead of s * stride
        out["reads the block table with the wrong stride (row s starts at s * stride_bt, not s * max_blocks)"] = \
            decode_variant(q, kc, vc, wrong, lens, scale)
    return out


def _decode_configs(t) -> list:
    cfgs = [("visible: 2 seqs, 8 heads on 2 KV heads, blocks of 4", 2, 8, 2, 16, 4, [9, 3]),
            ("visible: MHA (4 heads, 4 KV heads), blocks of 8, one seq exactly fills its blocks", 3, 4, 4, 8, 8, [16, 1, 11]),
            ("visible: MQA (4 heads, 1 KV head)", 2, 4, 1, 16, 4, [5, 13])]
    for _ in range(2):
        H_kv = t.rng.choice([1, 2, 4])
        H = H_kv * t.rng.choice([1, 2, 4])
        bs = t.rng.choice([2, 4, 8, 16])
        B = t.rng.randint(1, 4)
        cfgs.append(("hidden", B, H, H_kv, t.rng.choice([8, 16, 32]), bs,
                     [t.rng.randint(1, 5 * bs) for _ in range(B)]))
    return cfgs


def _run_decode(t, name: str, strided_case: bool, tol: dict):
    for label, B, H, H_kv, D, bs, lens in _decode_configs(t):
        with t.case(f"{label}: heads {H}/{H_kv}, head_dim {D}, block_size {bs}, context_lens {lens}"):
            args = make_decode_case(t.gen, t.rng, B, H, H_kv, D, bs, lens)
            from reference_engine.kernels import paged_decode_torch as engine_ref
            expected = engine_ref(*args)
            got = t.call(name, *args)
            t.expect(got, expected, "attention output", mistakes=decode_mistakes(*args), **tol)
    if strided_case:
        with t.case("block table that is a view of a wider buffer (row stride > width)"):
            lens = [t.rng.randint(5, 20) for _ in range(3)]
            args = make_decode_case(t.gen, t.rng, 3, 4, 2, 16, 4, lens, strided=True)
            from reference_engine.kernels import paged_decode_torch as engine_ref
            t.expect(t.call(name, *args), engine_ref(*args), "attention output",
                     mistakes=decode_mistakes(*args), **tol)


@check(points=3, section="4.1", timeout=60)
def paged_decode_torch(t):
    """Paged decode in torch against the engine's reference; then plugged into the engine end to end."""
    _run_decode(t, "paged_decode_torch", strided_case=False, tol={})
    with t.case("in the engine: LLM(..., attention_backend=DecodeBackend(paged_decode_torch)), same greedy tokens"):
        from reference_engine import LLM, SamplingParams
        fn = t.fn("paged_decode_torch")
        greedy, _ = engine_workload(t.rng)
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        ref = [o.token_ids for o in LLM(_target_path(), num_blocks=16, block_size=8).generate(greedy[:3], params)]
        with t.learner_code("the engine, running your paged_decode_torch,"):
            llm = LLM(_target_path(), num_blocks=16, block_size=8, attention_backend=t.ref.DecodeBackend(fn))
            got = [o.token_ids for o in llm.generate(greedy[:3], params)]
        t.expect(got, ref, "generated token ids per request")


def _time(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


@check(points=4, section="4.2", timeout=120)
def paged_decode_triton(t):
    """The Triton paged decode kernel against the engine's reference (fp32; bf16 and timing on CUDA)."""
    # The kernel uses tl.sum, not tl.dot, so fp32 stays exact-ish even on a GPU (no TF32).
    _run_decode(t, "paged_decode_triton", strided_case=True, tol={})
    with t.case("bf16 inputs, 8 seqs up to 1000 tokens, blocks of 16", requires_cuda=True) as on:
        if on:
            lens = [t.rng.randint(1, 1000) for _ in range(8)]
            args = make_decode_case(t.gen, t.rng, 8, 32, 8, 128, 16, lens, torch.bfloat16, "cuda")
            from reference_engine.kernels import paged_decode_torch as engine_ref
            t.expect(t.call("paged_decode_triton", *args), engine_ref(*args), "bf16 attention output")
    with t.case("speed: within 1.5x of the engine's Triton kernel (bf16, 64 seqs x 2048-4096 tokens)",
                requires_cuda=True) as on:
        if on:
            from reference_engine.kernels import triton_kernels
            lens = [t.rng.randint(2048, 4096) for _ in range(64)]
            args = make_decode_case(t.gen, t.rng, 64, 32, 8, 128, 16, lens, torch.bfloat16, "cuda")
            fn = t.fn("paged_decode_triton")
            try:  # called directly: copying gigabytes of cache per call would swamp the timing
                mine = _time(lambda: fn(*args))
            except Exception as e:  # noqa: BLE001 - learner code
                t.fail(f"paged_decode_triton() raised {type(e).__name__}: {e}")
            ref = _time(lambda: triton_kernels().paged_decode_triton(*args))
            kv_bytes = 2 * sum(lens) * 8 * 128 * 2
            t.expect_true(mine <= 1.5 * ref, f"your kernel takes {mine * 1e3:.3f} ms per call "
                          f"({kv_bytes / mine / 1e9:.0f} GB/s of K/V), the engine's {ref * 1e3:.3f} ms "
                          f"({kv_bytes / ref / 1e9:.0f} GB/s): load each K/V block once per KV head, not per query head")
