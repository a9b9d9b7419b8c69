"""Disaggregated prefill and decode: one engine computes prompts, another generates, the KV cache crosses a link.

    PrefillInstance(engine, sender)   runs each request with max_tokens=1 through its own scheduler (prompts
                                      batch and chunk as usual), keeps the finished request's blocks
                                      (hold_kv), and hands them to a KVSender, which ships and then frees them.
    DecodeInstance(engine, receiver)  applies arrived transfers (blocks allocated, KV unpacked, the sequence
                                      running with its prompt computed and the first token appended) and
                                      decodes.
    DisaggPair(prefill_engine, decode_engine, pack=, unpack=)
                                      both in one process over a LoopbackTransport: the same code path as two
                                      processes, minus the link; what lesson 17's engine check runs.
    run_disaggregated(model, prompts, params)
                                      two processes (torch.multiprocessing spawn), each owning an LLMEngine,
                                      the KV over torch.distributed send/recv (gloo on CPU, NCCL on CUDA).
    measure_link(sizes)               bytes/s of torch.distributed send/recv between two processes here.
    replay_disaggregated(...)         a trace replay with prefill and decode pools on modeled GPU clocks.

Greedy decoding gives the same tokens as one engine: the decode side attends over exactly the K/V the prefill
side computed. Sampled requests continue from a fresh per-request generator on the decode side. Not combined
here: tensor parallelism (tensor_parallel_size > 1), n > 1, speculative decoding on the decode side.
"""
from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace

from .kv_transfer import STOP, GlooTransport, KVReceiver, KVSender, LoopbackTransport, pack_kv, unpack_kv
from .sampling import SamplingParams
from .sequence import StepOutput


def _check_engine(engine) -> None:
    """The transfer reads and writes engine.runner's caches in this process: one rank, no speculative decoding."""
    if getattr(engine, "tensor_parallel_size", 1) != 1:
        raise ValueError("disaggregation is not combined with tensor_parallel_size > 1 here: the KV cache lives in "
                         "the worker processes")


class PrefillInstance:
    """The prefill side of a pair: an LLMEngine plus a KVSender. step() runs one engine step, queues every
    prompt it finished for shipping, then sends up to messages_per_step messages (None: all queued)."""

    def __init__(self, engine, sender: KVSender, messages_per_step: int | None = None):
        _check_engine(engine)
        self.engine, self.sender, self.messages_per_step = engine, sender, messages_per_step
        self.live: dict[str, tuple] = {}  # request id -> (Sequence, the caller's params, arrival)

    def add_request(self, prompt, params: SamplingParams, request_id: str, arrival_time: float | None = None) -> None:
        self.engine.add_request(prompt, replace(params, max_tokens=1), request_id, arrival_time, hold_kv=True)
        self.live[request_id] = (self.engine.requests[request_id][0], params, arrival_time)

    def has_work(self) -> bool:
        return self.engine.has_unfinished() or bool(self.sender.queue)

    def step(self) -> None:
        outs = self.engine.step() if self.engine.has_unfinished() else []
        for out in outs:
            if out.output is None or out.finish_reason == "abort":
                continue
            seq, params, arrival = self.live.pop(out.request_id)
            self.sender.enqueue(out.request_id, seq, {
                "request_id": out.request_id, "prompt_token_ids": seq.token_ids[:seq.num_prompt_tokens],
                "num_tokens": seq.num_prompt_tokens, "first_token": out.new_token_ids[0], "params": params,
                "arrival_time": arrival})
        self.sender.pump(self.messages_per_step)

    def abort(self, request_id: str) -> bool:
        """Wherever the request is here (queued, prefilling, or prefilled and not yet shipped), its blocks go
        back to the pool; an in-flight transfer is cut with an ABORT message."""
        self.live.pop(request_id, None)
        return self.engine.abort(request_id) is not None or self.sender.abort(request_id)


def decode_receiver(transport, engine, unpack=unpack_kv) -> KVReceiver:
    """A KVReceiver into `engine`: its runner's caches, its config.json, its received-request operations."""
    return KVReceiver(transport, engine.runner, engine.config, engine.allocate_received, engine.admit_received,
                      engine.free_received, engine.abort, unpack=unpack)


class DecodeInstance:
    """The decode side: an LLMEngine plus a KVReceiver into it (decode_receiver). step() applies arrived
    messages, then runs one engine step if anything is running."""

    def __init__(self, engine, receiver: KVReceiver):
        _check_engine(engine)
        self.engine, self.receiver = engine, receiver

    def step(self) -> list[StepOutput]:
        outs = self.receiver.poll()
        if self.engine.has_unfinished():
            outs += self.engine.step()
        return outs

    def abort(self, request_id: str) -> bool:
        return self.receiver.abort(request_id)


class DisaggPair:
    """A prefill engine and a decode engine in one process, a LoopbackTransport between them.

    pack / unpack: kv_transfer.pack_kv / unpack_kv or any pair with their contracts (a learner's).
    messages_per_step: messages the prefill side sends per step() (None: everything queued), so a test can
    stop a transfer between two layers. Requests are greedy or sampled, n = 1."""

    def __init__(self, prefill_engine, decode_engine, pack=pack_kv, unpack=unpack_kv,
                 messages_per_step: int | None = None):
        self.link = LoopbackTransport()
        sender = KVSender(self.link, prefill_engine.runner, prefill_engine.release_kv, pack=pack)
        self.prefill = PrefillInstance(prefill_engine, sender, messages_per_step)
        self.decode = DecodeInstance(decode_engine, decode_receiver(self.link, decode_engine, unpack))
        self._ids = 0

    def add_request(self, prompt, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        if request_id is None:
            request_id, self._ids = f"d{self._ids}", self._ids + 1
        self.prefill.add_request(prompt, params or SamplingParams(), str(request_id))
        return str(request_id)

    def abort(self, request_id: str) -> None:
        """Abort on both sides (a client disconnecting): nothing of it stays in either pool."""
        self.prefill.abort(request_id)
        self.decode.abort(request_id)

    def has_unfinished(self) -> bool:
        return (self.prefill.has_work() or self.link.pending() > 0 or self.decode.engine.has_unfinished()
                or self.decode.receiver.current is not None)

    def step(self) -> list[StepOutput]:
        """One prefill step (and its messages), then one decode step. Returns the decode side's outputs."""
        self.prefill.step()
        return self.decode.step()

    def free_blocks(self) -> tuple[int, int]:
        """(free KV blocks of the prefill engine, of the decode engine)."""
        return self.prefill.engine.block_manager.num_free(), self.decode.engine.block_manager.num_free()

    def generate(self, prompts: list, params: SamplingParams | list[SamplingParams] | None = None,
                 max_steps: int = 100_000) -> list:
        """Run prompts to completion; RequestOutputs in prompt order (None for one aborted on the way)."""
        params = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        done: dict = {}
        for _ in range(max_steps):
            if not self.has_unfinished():
                break
            for out in self.step():
                if out.finished:
                    done[out.request_id] = out.output
        else:
            raise RuntimeError(f"the pair did not finish in {max_steps} steps")
        return [done.get(i) for i in ids]


# ---------------------------------------------------------------- two processes

def _init_group(rank: int, init_file: str, backend: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=2)


def _link_device(backend: str, rank: int) -> str:
    return f"cuda:{rank}" if backend == "nccl" else "cpu"


def _worker(rank: int, model: str, engine_kwargs: dict, init_file: str, backend: str, inbox, outbox,
            faults: dict) -> None:
    """Rank 0 is the prefill instance, rank 1 the decode instance (torch.multiprocessing.spawn calls this)."""
    import torch

    from .engine import LLMEngine

    torch.set_num_threads(1)
    _init_group(rank, init_file, backend)
    kw = dict(engine_kwargs)
    if backend == "nccl":
        kw.setdefault("device", f"cuda:{rank}")
    engine = LLMEngine(model, **kw)
    dev = _link_device(backend, rank)
    free_before = engine.block_manager.num_free()
    try:
        if rank == 0:
            stats = _prefill_loop(engine, GlooTransport(1, receiving=False, device=dev), inbox, outbox, faults)
        else:
            stats = _decode_loop(engine, GlooTransport(0, receiving=True, device=dev), inbox, outbox, faults)
        engine.block_manager.check_consistency([s for seqs in engine.requests.values() for s in seqs])
        stats.update(free_before=free_before, free_after=engine.block_manager.num_free(), consistent=True)
    except Exception as e:  # noqa: BLE001 - reported to the driver, which raises it
        import traceback
        stats = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    outbox.put(("stats", rank, stats))
    import torch.distributed as dist
    dist.destroy_process_group()


def _prefill_loop(engine, link, inbox, outbox, faults: dict) -> dict:
    """Take requests from inbox until ("stop",) and nothing is left; ship each prefilled prompt.
    faults["prefill_abort_after_layers"] = {request_id: k}: abort that request after k of its layers
    left (an abort landing mid-transfer)."""
    cut = dict(faults.get("prefill_abort_after_layers", {}))
    inst = PrefillInstance(engine, KVSender(link, engine.runner, engine.release_kv), messages_per_step=1)
    stopping = False
    while True:
        while not inbox.empty() or (not stopping and not inst.has_work()):
            msg = inbox.get()
            if msg[0] == "add":
                inst.add_request(msg[2], msg[3], msg[1])
            elif msg[0] == "abort":
                inst.abort(msg[1])
            elif msg[0] == "stop":
                stopping = True
        if stopping and not inst.has_work():
            break
        inst.step()
        head = inst.sender.queue[0] if inst.sender.queue else None
        if head is not None and head.request_id in cut and head.next_layer >= cut[head.request_id]:
            cut.pop(head.request_id)
            inst.abort(head.request_id)
            outbox.put(("aborted", head.request_id))
    link.send([STOP, 0, 0, 0])
    return {"sent_bytes": inst.sender.sent_bytes, "messages": link.messages, "steps": len(engine.step_stats)}


def _decode_loop(engine, link, inbox, outbox, faults: dict) -> dict:
    """Apply transfers and decode until the prefill side has sent STOP and everything has finished.
    faults["decode_abort_on_start"] = [request_id, ...]: abort those requests here as soon as their
    transfer has begun (blocks allocated, layers still to come)."""
    cut = set(faults.get("decode_abort_on_start", []))
    inst = DecodeInstance(engine, decode_receiver(link, engine))
    while not (inst.receiver.stopped and not engine.has_unfinished() and inst.receiver.current is None):
        while not inbox.empty():
            msg = inbox.get()
            if msg[0] == "abort":
                inst.abort(msg[1])
        outs = inst.receiver.poll(max_messages=1)
        cur = inst.receiver.current
        if cur is not None and cur.meta["request_id"] in cut and not cur.cancelled:
            cut.discard(cur.meta["request_id"])
            inst.abort(cur.meta["request_id"])
            outbox.put(("aborted", cur.meta["request_id"]))
        if engine.has_unfinished():
            outs += engine.step()
        elif not outs and not link.pending():
            time.sleep(0.001)  # idle: wait for the link
        for out in outs:
            if out.finished:
                tokens = None if out.output is None else out.output.token_ids
                outbox.put(("output", out.request_id, tokens, out.finish_reason))
    r = inst.receiver
    return {"received_bytes": r.received_bytes, "transfer_times": r.transfer_times, "messages": link.messages}


def run_disaggregated(model: str, prompts: list, params: SamplingParams | list[SamplingParams] | None = None, *,
                      engine_kwargs: dict | None = None, decode_kwargs: dict | None = None,
                      backend: str = "gloo", faults: dict | None = None, timeout: float = 300.0) -> dict:
    """Serve `prompts` with a prefill process and a decode process. Returns {"tokens": per prompt, the output
    token ids (None if aborted), "finish_reasons", "aborted": request ids reported aborted, "prefill" and
    "decode": each worker's stats (free KV blocks before and after, bytes and messages over the link, decode
    transfer seconds per request)}.

    engine_kwargs: LLMEngine keywords of both instances (decode_kwargs overrides them for the decode one).
    backend: "gloo" (CPU tensors) or "nccl" (needs two CUDA devices: prefill on cuda:0, decode on cuda:1).
    faults: see _prefill_loop and _decode_loop (the tests' mid-transfer aborts). Request ids are "0", "1"..."""
    params = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
    kw = dict(engine_kwargs or {})
    per_rank = [kw, {**kw, **(decode_kwargs or {})}]
    with _two_ranks() as (ctx, init_file, start):
        inboxes, outbox = [ctx.Queue(), ctx.Queue()], ctx.Queue()
        procs = start(lambda r: (_worker, (r, model, per_rank[r], init_file, backend, inboxes[r], outbox, faults or {})))
        for i, (p, sp) in enumerate(zip(prompts, params)):
            inboxes[0].put(("add", str(i), list(p), sp))
        inboxes[0].put(("stop",))
        return _collect(outbox, len(prompts), procs, timeout)


@contextmanager
def _two_ranks():
    """Spawn context, a fresh file-store path for init_process_group, and start(spec): spec(rank) -> (target,
    args) per rank; the processes are started, and on exit joined (killed if stuck) and the store removed."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    fd, init_file = tempfile.mkstemp(prefix="disagg_")
    os.close(fd)
    os.unlink(init_file)  # the file store creates it
    procs = []

    def start(spec):
        for r in range(2):
            target, args = spec(r)
            procs.append(ctx.Process(target=target, args=args, daemon=True))
            procs[-1].start()
        return procs

    try:
        yield ctx, init_file, start
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        if os.path.exists(init_file):
            os.unlink(init_file)


def _collect(outbox, n: int, procs, timeout: float) -> dict:
    import queue

    res = {"tokens": [None] * n, "finish_reasons": [None] * n, "aborted": [], "prefill": None, "decode": None}
    deadline = time.monotonic() + timeout
    while res["prefill"] is None or res["decode"] is None:
        try:
            msg = outbox.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() > deadline or not all(p.is_alive() for p in procs) and outbox.empty():
                raise RuntimeError(f"disaggregated run stopped without reporting (exit codes "
                                   f"{[p.exitcode for p in procs]})") from None
            continue
        if msg[0] == "output":
            i = int(msg[1])
            res["tokens"][i], res["finish_reasons"][i] = msg[2], msg[3]
        elif msg[0] == "aborted":
            res["aborted"].append(msg[1])
        elif msg[0] == "stats":
            res[["prefill", "decode"][msg[1]]] = msg[2]
    for side in ("prefill", "decode"):
        if "error" in res[side]:
            raise RuntimeError(f"the {side} process failed: {res[side]['error']}")
    return res


# ---------------------------------------------------------------- the link's measured rate

def _bench_worker(rank: int, sizes: list[int], repeats: int, init_file: str, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    _init_group(rank, init_file, "gloo")
    ack = torch.zeros(1, dtype=torch.uint8)
    rows = []
    for size in sizes:
        buf = torch.ones(size, dtype=torch.uint8) if rank == 0 else torch.empty(size, dtype=torch.uint8)
        times = []
        for _ in range(repeats + 1):  # the first round warms the connection up and is dropped
            if rank == 0:
                t0 = time.perf_counter()
                dist.send(buf, 1)
                dist.recv(ack, 1)  # the receiver has the whole buffer
                times.append(time.perf_counter() - t0)
            else:
                dist.recv(buf, 0)
                dist.send(ack, 0)
        if rank == 0:
            t = sorted(times[1:])[len(times[1:]) // 2]
            rows.append({"bytes": size, "seconds": t, "bytes_per_s": size / t})
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def measure_link(sizes: list[int] = (1 << 16, 1 << 20, 16 << 20), repeats: int = 5) -> list[dict]:
    """Measured: torch.distributed (gloo) send of a uint8 buffer from one process to another on this
    machine, timed from the send until a 1-byte acknowledgement returns; the median of `repeats` rounds per
    size. Returns [{"bytes", "seconds", "bytes_per_s"}] per size. The acknowledgement's round trip is in
    the time, so small sizes show the per-message latency and large ones the bandwidth."""
    with _two_ranks() as (ctx, init_file, start):
        out = ctx.Queue()
        start(lambda r: (_bench_worker, (r, list(sizes), repeats, init_file, out)))
        return out.get(timeout=300)


# ---------------------------------------------------------------- modeled replay with pools

def replay_disaggregated(prefill_engines: list, decode_engines: list, requests, prompts, transfer_s) -> list[dict]:
    """Replay trace `requests` (arrival seconds, output_tokens; greedy, EOS ignored) with `prompts` through a
    prefill pool and a decode pool, each engine on its own modeled clock (sim.gpu_model.ModeledClock from 0).
    A request goes to the prefill engine with the fewest requests; once prefilled, its KV lands at the decode
    engine with the fewest running transfer_s(prompt_tokens) seconds later and joins that engine's batch at
    its next step. Events run in time order: whichever engine's clock is earliest steps next. Only timing is
    replayed (the KV is not moved: DisaggPair and run_disaggregated move it).

    Returns per request {"arrival", "prompt_tokens", "prefilled" (the prefill step's end), "token_times":
    every output token's time; the first is when the decode instance holds the KV (the first token reaches
    the client with the decode stream)}."""
    if not prefill_engines or not decode_engines:
        raise ValueError("need at least one prefill and one decode engine")
    rec: dict[str, dict] = {}
    landing: list[tuple[float, int, object, dict]] = []  # (time the KV is at the decode engine, order, engine, meta)
    nxt, order, done = 0, 0, 0
    inf = float("inf")
    while done < len(requests):
        t_arr = requests[nxt].arrival if nxt < len(requests) else inf
        busy_p = [e for e in prefill_engines if e.has_unfinished()]
        busy_d = [e for e in decode_engines if e.has_unfinished()]
        t_p = min((e.clock() for e in busy_p), default=inf)
        t_d = min((e.clock() for e in busy_d), default=inf)
        t_x = landing[0][0] if landing else inf
        t = min(t_arr, t_p, t_d, t_x)
        if t == inf:
            raise RuntimeError("replay stalled: nothing to run and nothing to arrive")
        if t == t_arr:  # an arrival: to the least loaded prefill engine
            r, rid = requests[nxt], str(nxt)
            p = min(prefill_engines, key=lambda e: len(e.requests))
            p.clock.advance_to(r.arrival)
            p.add_request(prompts[nxt], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), rid,
                          arrival_time=r.arrival)
            rec[rid] = {"arrival": r.arrival, "prompt_tokens": len(prompts[nxt]), "output_tokens": r.output_tokens,
                        "token_times": []}
            nxt += 1
        elif t == t_x:  # a KV transfer lands: allocate and admit (or wait for a decode step to free blocks)
            _, _, d, meta = landing.pop(0)
            d.clock.advance_to(t)
            sp = SamplingParams(temperature=0, max_tokens=meta["output_tokens"], ignore_eos=True)
            seq = d.allocate_received(meta["rid"], meta["prompt"], sp, meta["arrival"])
            if seq is None:
                landing.insert(0, (d.clock() + 1e-9, order, d, meta))
                order += 1
                continue
            out = d.admit_received(seq, meta["first_token"])
            rec[meta["rid"]]["token_times"].append(d.clock())
            done += out.finished
        elif t == t_p:  # a prefill step; finished prompts start their transfer
            p = next(e for e in busy_p if e.clock() == t_p)
            for out in p.step():
                if out.output is None:
                    continue
                r = rec[out.request_id]
                r["prefilled"] = p.clock()
                d = min(decode_engines, key=lambda e: len(e.scheduler.running))
                meta = {"rid": out.request_id, "prompt": out.output.prompt_token_ids, "arrival": r["arrival"],
                        "output_tokens": r["output_tokens"], "first_token": out.new_token_ids[0]}
                landing.append((p.clock() + transfer_s(r["prompt_tokens"]), order, d, meta))
                order += 1
            landing.sort(key=lambda x: (x[0], x[1]))
        else:  # a decode step
            d = next(e for e in busy_d if e.clock() == t_d)
            for out in d.step():
                rec[out.request_id]["token_times"].append(d.clock())
                done += out.finished
    return [rec[str(i)] for i in range(len(requests))]
