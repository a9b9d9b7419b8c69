"""Tensor parallelism across processes: one worker process per rank, driven by the engine.

    LLM(model, tensor_parallel_size=2)

The engine (scheduler, block manager, sampler) stays in the calling process, which holds no weights.
Each step it builds the flat batch once (ModelRunner.prepare) and sends the same tensors to every worker
over a pipe; each worker runs its shard of the forward (distributed.py: column-parallel qkv and gate_up,
row-parallel o and down with an all-reduce over torch.distributed: gloo on CPU, NCCL on CUDA, one GPU a
rank) and rank 0 sends the logits back. Every rank holds its own paged KV cache of the same num_blocks,
with only its KV heads: the block tables the engine hands out are valid on every rank.

The workers are fresh interpreters (`python -m reference_engine.tp_runner FD`), never forks: a forked
CUDA context is unusable, and a script that builds an engine at import time needs no `if __name__ ==
"__main__"` guard, as it would under multiprocessing's spawn. Each inherits one end of a pipe (file
descriptor FD) and stops on shutdown(), when the runner is collected, or when the pipe closes (the
calling process exited).
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import subprocess
import sys
import time
import traceback
import weakref
from dataclasses import fields, replace
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import torch

from .attention import AttentionMetadata
from .model_runner import ModelRunner

if TYPE_CHECKING:
    from .engine_config import EngineConfig

START_TIMEOUT_S = 300.0  # spawning imports torch in each worker: seconds on a loaded machine
STEP_TIMEOUT_S = 600.0


class TPModelRunner:
    """ModelRunner's interface (execute, copy_blocks, last_forward_time, clock) over `size` worker processes.

    worker_args: what each worker needs to build its shard: model path, device type, dtype, quantization,
    attention backend name, KV cache dtype, block_size, num_blocks. After start-up, kv_cache_bytes[r] is the
    bytes rank r's K and V caches actually allocated, weight_bytes[r] those of its weights."""

    clock = staticmethod(time.perf_counter)
    last_forward_time: float | None = None  # rank 0's forward, all-reduces included (not the pipe round trip)

    def __init__(self, model, config: EngineConfig):
        """model: the model directory; config: the engine's resolved EngineConfig (its parallel, model and cache
        parts: the workers build their shards and caches from them)."""
        size, m, cache = config.parallel.tensor_parallel_size, config.model, config.cache
        if m.device.type == "cuda" and torch.cuda.device_count() < size:
            raise ValueError(f"tensor_parallel_size={size} needs {size} GPUs, {torch.cuda.device_count()} visible")
        self.size, self.block_size, self.device = size, cache.block_size, m.device
        spec = dict(model=str(model), device=m.device.type, dtype=m.dtype, block_size=cache.block_size,
                    num_blocks=cache.num_blocks, backend=m.attention_backend, quantization=m.quantization,
                    cache_dtype=config.kv_cache_dtype, threads=max(1, (os.cpu_count() or 1) // size), port=_free_port())
        self.conns, self.procs = [], []
        self._finalizer = weakref.finalize(self, _shutdown, self.conns, self.procs)
        try:
            self._start(size, spec)
            infos = self._gather(START_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        self.kv_cache_bytes = [i["kv_cache_bytes"] for i in infos]
        self.weight_bytes = [i["weight_bytes"] for i in infos]
        self.kv_heads = [i["kv_heads"] for i in infos]

    def _start(self, size: int, spec: dict) -> None:
        """Launch one interpreter per rank with its end of a pipe, and tell it its rank and the spec; each replies
        when its shard and KV cache are ready (_gather)."""
        for rank in range(size):
            ours, theirs = multiprocessing.Pipe()
            fd = theirs.fileno()
            self.procs.append(subprocess.Popen([sys.executable, "-m", "reference_engine.tp_runner", str(fd)],
                                               pass_fds=(fd,), stdin=subprocess.DEVNULL))
            theirs.close()  # only the worker holds it now: its exit shows here as EOF
            _send(ours, (rank, size, spec))
            self.conns.append(ours)

    prepare = ModelRunner.prepare  # the flat batch, built once here (on the CPU) for every rank
    _block_tables = ModelRunner._block_tables

    def execute(self, out) -> torch.Tensor:
        """As ModelRunner.execute: logits [sum of num_logits, vocab] float32, from rank 0."""
        self._broadcast("execute", self.prepare(out))
        replies = self._gather(STEP_TIMEOUT_S)
        logits, self.last_forward_time = replies[0]
        return logits.to(self.device)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self._broadcast("copy_blocks", pairs)
        self._gather(STEP_TIMEOUT_S)

    def shutdown(self) -> None:
        self._finalizer()

    # ---- the pipes ------------------------------------------------------------------------------
    def _broadcast(self, cmd: str, args) -> None:
        if not self._finalizer.alive:
            raise RuntimeError("the tensor-parallel workers were shut down")
        for conn in self.conns:
            _send(conn, (cmd, args))

    def _gather(self, timeout: float) -> list:
        """Every rank's reply, in rank order; a worker's error (or death) is raised here with its traceback."""
        replies = []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(timeout):
                self.shutdown()
                raise RuntimeError(f"tensor-parallel rank {rank} did not answer within {timeout:.0f} s; workers stopped")
            try:
                status, value = _recv(conn)
            except EOFError:
                self.shutdown()
                raise RuntimeError(f"tensor-parallel rank {rank} died (exit code {self.procs[rank].returncode})") from None
            if status == "error":
                self.shutdown()
                raise RuntimeError(f"tensor-parallel rank {rank} failed:\n{value}")
            replies.append(value)
        return replies


def _send(conn: Connection, obj) -> None:
    """Plain pickle, which copies tensors: torch registers a reducer with multiprocessing that passes tensor
    storage as shared-memory file descriptors, which only processes it spawned itself can open."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection):
    return pickle.loads(conn.recv_bytes())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shutdown(conns, procs) -> None:
    for conn in conns:
        try:
            _send(conn, ("stop", None))
        except (OSError, ValueError):
            pass
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # stuck in a collective whose peer is gone
            proc.kill()
            proc.wait(timeout=5)
    for conn in conns:
        conn.close()


# ---- the worker ---------------------------------------------------------------------------------
def _worker_main(fd: int) -> None:
    """One rank: learn its rank from the engine, join the process group, load its shard, allocate its KV
    cache, then serve commands until told to stop or the engine's end of the pipe closes."""
    conn = Connection(fd)
    rank, size, spec = _recv(conn)
    try:
        from .quantization import weight_bytes

        runner, device = _build_rank(rank, size, spec)
        c = runner.k_cache
        _send(conn, ("ok", {"kv_cache_bytes": c.nbytes + runner.v_cache.nbytes, "kv_heads": c.shape[3],
                          "weight_bytes": weight_bytes(runner.model)}))
    except BaseException:
        _send(conn, ("error", traceback.format_exc()))
        return
    _serve(rank, conn, runner, device)
    import torch.distributed as dist

    dist.destroy_process_group()


def _build_rank(rank: int, size: int, spec: dict):
    import torch.distributed as dist

    from .attention import get_backend
    from .distributed import ShardSpec
    from .loader import load_model
    from .quantization import Fp8KVBackend, quantize_model

    torch.set_num_threads(spec["threads"])  # the ranks share this machine's cores
    cuda = spec["device"] == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank,
                            world_size=size, timeout=timedelta(seconds=STEP_TIMEOUT_S))
    _, model, _ = load_model(spec["model"], device, spec["dtype"], ShardSpec(rank, size))
    if spec["quantization"] is not None:
        quantize_model(model, spec["quantization"])
    backend = get_backend(spec["backend"], device, spec["block_size"])
    if spec["cache_dtype"] is not None and spec["cache_dtype"].itemsize == 1:
        backend = Fp8KVBackend(backend)
    runner = ModelRunner(model, spec["block_size"], spec["num_blocks"], device, spec["dtype"], backend,
                         cache_dtype=spec["cache_dtype"])
    return runner, device


def _serve(rank: int, conn, runner: ModelRunner, device: torch.device) -> None:
    while True:
        try:
            cmd, args = _recv(conn)
        except EOFError:  # the engine's process is gone
            return
        if cmd == "stop":
            return
        try:
            if cmd == "execute":
                ids, pos, meta, rows = (_to(x, device) for x in args)
                logits = runner.forward(ids, pos, meta, rows)
                _send(conn, ("ok", (logits.cpu() if rank == 0 else None, runner.last_forward_time)))
            elif cmd == "copy_blocks":
                runner.copy_blocks(args)
                _send(conn, ("ok", None))
            else:
                raise ValueError(f"unknown command {cmd!r}")
        except BaseException:
            _send(conn, ("error", traceback.format_exc()))
            return


def _to(x, device: torch.device):
    """A tensor, or AttentionMetadata's tensor fields, moved to this rank's device."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, AttentionMetadata):
        return replace(x, **{f.name: _to(getattr(x, f.name), device) for f in fields(x)
                             if isinstance(getattr(x, f.name), torch.Tensor)})
    return x


if __name__ == "__main__":
    _worker_main(int(sys.argv[1]))
