"""Shipping a request's KV cache from a prefill instance to a decode instance (vLLM calls this a KV connector).

Three layers, each replaceable:
  pack_kv / unpack_kv   gather one sequence's K and V from the paged cache into one contiguous buffer, and
                        scatter such a buffer into another cache's blocks. Any pair with these signatures plugs
                        in (lesson 17's exercise does).
  KVSender / KVReceiver the protocol: per request a START message (metadata), one LAYER message per layer, or
                        an ABORT that drops the request on both sides. Layer by layer, so the link carries
                        bounded messages and an abort can land between two layers.
  a transport           moves (header, payload) pairs in order: LoopbackTransport (a queue inside one
                        process) or GlooTransport (torch.distributed send/recv between two processes; gloo on
                        CPU, NCCL when the tensors live on CUDA).

The packed layout is [layers, 2, num_tokens, kv_heads, head_dim], index 0 of dim 1 being K: layer-major, so
layer l's slice buf[l] is contiguous and leaves as one message. A float8 cache travels as its bytes: CPU torch
cannot index float8 tensors, so pack/unpack see uint8 views of it (same shape, one byte an element).
"""
from __future__ import annotations

import pickle
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .model_runner import raw_view  # the cache as pack/unpack index it (float8 as its uint8 bytes)

START, LAYER, ABORT, STOP = 1, 2, 3, 4  # message kinds (header[0])
HEADER_LEN = 4  # int64 words: kind, request serial, layer index (LAYER), payload bytes


# ---------------------------------------------------------------- pack and unpack (the engine's own)

def pack_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: list[int], num_tokens: int) -> torch.Tensor:
    """The first num_tokens tokens of one sequence, every layer, K and V: [layers, 2, num_tokens, kv_heads,
    head_dim], a new contiguous tensor of the caches' dtype.

    k_cache, v_cache: [layers, num_blocks, block_size, kv_heads, head_dim] (ModelRunner's caches, or uint8
    views of float8 ones); token p of the sequence sits in block block_table[p // block_size] at slot
    p % block_size. The last block is read only up to num_tokens (its other slots hold nothing of this
    sequence)."""
    block_size = k_cache.shape[2]
    n_blocks = -(-num_tokens // block_size)
    idx = torch.tensor(block_table[:n_blocks], dtype=torch.long, device=k_cache.device)
    # [layers, n_blocks, block_size, h, d] -> [layers, n_blocks * block_size, h, d] -> cut the partial tail
    k = k_cache.index_select(1, idx).flatten(1, 2)[:, :num_tokens]
    v = v_cache.index_select(1, idx).flatten(1, 2)[:, :num_tokens]
    return torch.stack((k, v), dim=1).contiguous()


def unpack_kv(buf: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: list[int]) -> None:
    """Write a pack_kv buffer [layers, 2, num_tokens, kv_heads, head_dim] into the caches at the sequence's
    blocks (in place): token p goes to block block_table[p // block_size], slot p % block_size. Slots past
    num_tokens in the last block are left as they are."""
    block_size, num_tokens = k_cache.shape[2], buf.shape[2]
    pos = torch.arange(num_tokens, device=k_cache.device)
    blocks = torch.tensor(block_table, dtype=torch.long, device=k_cache.device)[pos // block_size]
    slots = pos % block_size
    k_cache[:, blocks, slots] = buf[:, 0].to(k_cache.device)
    v_cache[:, blocks, slots] = buf[:, 1].to(v_cache.device)


# ---------------------------------------------------------------- transports

class LoopbackTransport:
    """Two ends in one process: send() appends, recv() pops, in order. Payloads are copied on send, so the
    receiver never reads the sender's memory (as over a real link). Counts messages and payload bytes."""

    def __init__(self):
        self._q: deque = deque()
        self.messages, self.bytes = 0, 0

    def send(self, header: list[int], payload: torch.Tensor | None = None) -> None:
        self._q.append((list(header), None if payload is None else payload.clone()))
        self.messages += 1
        self.bytes += 0 if payload is None else payload.numel()

    def recv(self):
        """(header, payload or None), or None when nothing is queued."""
        return self._q.popleft() if self._q else None

    def pending(self) -> int:
        return len(self._q)


class GlooTransport:
    """One direction of a torch.distributed link between this rank and `peer` (the process group must be
    initialised: gloo for CPU tensors, NCCL with device="cuda:i"). A message is an int64 header of HEADER_LEN
    words, then, when header[3] > 0, a uint8 payload of header[3] bytes.

    The receiving end runs a thread that blocks in dist.recv and queues what arrives, so recv() never blocks
    the engine loop; the thread ends after a STOP message."""

    def __init__(self, peer: int, receiving: bool, device: str | torch.device = "cpu"):
        import torch.distributed as dist

        self.dist, self.peer, self.device = dist, peer, torch.device(device)
        self.messages, self.bytes = 0, 0
        self._q: queue.Queue = queue.Queue()
        self._thread = None
        if receiving:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def send(self, header: list[int], payload: torch.Tensor | None = None) -> None:
        self.dist.send(torch.tensor(header, dtype=torch.int64, device=self.device), self.peer)
        if payload is not None and payload.numel():
            self.dist.send(payload.to(self.device).contiguous(), self.peer)
        self.messages += 1
        self.bytes += 0 if payload is None else payload.numel()

    def _loop(self) -> None:
        while True:
            header = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.device)
            self.dist.recv(header, self.peer)
            h = header.tolist()
            payload = None
            if h[3] > 0:
                payload = torch.empty(h[3], dtype=torch.uint8, device=self.device)
                self.dist.recv(payload, self.peer)
            self.messages += 1
            self.bytes += h[3]
            self._q.put((h, payload))
            if h[0] == STOP:
                return

    def pending(self) -> int:
        """Messages received and not yet taken by recv()."""
        return self._q.qsize()

    def recv(self, timeout: float | None = None):
        """(header, payload or None), or None when nothing has arrived (within timeout seconds)."""
        try:
            return self._q.get(timeout=timeout) if timeout else self._q.get_nowait()
        except queue.Empty:
            return None


def _to_bytes(obj) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def _from_bytes(t: torch.Tensor):
    return pickle.loads(t.cpu().numpy().tobytes())


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(-1)


# ---------------------------------------------------------------- the protocol

@dataclass
class Transfer:
    """One request on the wire: its metadata, and the packed KV once the first message leaves."""
    serial: int
    request_id: str
    seq: object  # the prefill engine's Sequence, holding its blocks until the transfer ends
    meta: dict
    buf: torch.Tensor | None = None
    next_layer: int = -1  # -1: START not sent yet
    started_at: float = 0.0


class KVSender:
    """The prefill side. enqueue() a finished prefill (its blocks held by the engine, LLMEngine.add_request
    with hold_kv=True); pump() sends messages, oldest transfer first; when a transfer's last layer has left,
    or it is aborted, release(seq) returns its blocks to the prefill engine's pool.

    pack: pack_kv or any function with its signature and contract."""

    def __init__(self, transport, runner, release, pack=pack_kv):
        self.transport, self.runner, self.release, self.pack = transport, runner, release, pack
        self.queue: deque[Transfer] = deque()
        self._serial = 0
        self.sent_bytes = 0

    def enqueue(self, request_id: str, seq, meta: dict) -> None:
        self._serial += 1
        self.queue.append(Transfer(self._serial, request_id, seq, meta))

    def pump(self, max_messages: int | None = None) -> int:
        """Send up to max_messages messages (None: until the queue is empty). Returns how many were sent."""
        sent = 0
        while self.queue and (max_messages is None or sent < max_messages):
            self._send_next(self.queue[0])
            sent += 1
        return sent

    def _send_next(self, tr: Transfer) -> None:
        if tr.next_layer < 0:  # START: pack now (the blocks are still held), then announce the shape
            tr.buf = self.pack(raw_view(self.runner.k_cache), raw_view(self.runner.v_cache), tr.seq.block_table,
                               tr.meta["num_tokens"])
            tr.meta.update(shape=list(tr.buf.shape), dtype=str(tr.buf.dtype))
            meta = _to_bytes(tr.meta)
            self.transport.send([START, tr.serial, 0, meta.numel()], meta)
            tr.next_layer, tr.started_at = 0, time.perf_counter()
            return
        payload = _as_bytes(tr.buf[tr.next_layer])
        self.transport.send([LAYER, tr.serial, tr.next_layer, payload.numel()], payload)
        self.sent_bytes += payload.numel()
        tr.next_layer += 1
        if tr.next_layer == tr.buf.shape[0]:
            self.queue.popleft()
            self.release(tr.seq)

    def abort(self, request_id: str) -> bool:
        """Drop a queued or in-flight transfer: an in-flight one tells the receiver (ABORT); either way the
        blocks go back to the pool. False when request_id is not here."""
        for tr in self.queue:
            if tr.request_id == request_id:
                if tr.next_layer >= 0:
                    self.transport.send([ABORT, tr.serial, 0, 0])
                self.queue.remove(tr)
                self.release(tr.seq)
                return True
        return False


@dataclass
class Incoming:
    serial: int
    meta: dict
    seq: object = None  # the decode engine's Sequence once its blocks are allocated
    buf: torch.Tensor | None = None
    layers: int = 0
    cancelled: bool = False  # aborted on the decode side: the rest of its messages are read and dropped
    t0: float = 0.0


@dataclass
class KVReceiver:
    """The decode side. poll() reads what has arrived: START allocates the prompt's blocks in the decode
    engine (allocate_received; if they do not fit yet the message waits, and so does everything behind it,
    until decode steps free blocks), each LAYER fills the staging buffer, and after the last one unpack()
    writes it into the new block table and the sequence joins the running batch with its first token
    (admit_received). ABORT frees the blocks.

    It holds the decode engine's parts it uses, not the engine: runner (the caches unpack writes into),
    model_config (its config.json: a transfer's shape must match), and the request operations
    allocate_received / admit_received / free_received / abort_request (LLMEngine's methods of those names
    and abort; Scheduler.allocate_received and add_received do the queue work). disagg.decode_receiver wires
    them from an engine. unpack: unpack_kv or any function with its signature and contract."""
    transport: object
    runner: object
    model_config: object
    allocate_received: Callable  # (request_id, prompt, params, arrival_time) -> Sequence | None (no room yet)
    admit_received: Callable  # (seq, first_token) -> StepOutput
    free_received: Callable  # (seq) -> None
    abort_request: Callable  # (request_id) -> RequestOutput | None (None: not in the engine)
    unpack: object = unpack_kv
    current: Incoming | None = None
    cancelled_ids: set = field(default_factory=set)  # aborted here before their START arrived
    held: tuple | None = None  # a START waiting for blocks
    received_bytes: int = 0
    transfer_times: list = field(default_factory=list)  # seconds from START to the last layer, per request
    stopped: bool = False  # a STOP arrived: the prefill side has closed the link

    def poll(self, max_messages: int | None = None) -> list:
        """Apply arrived messages. Returns StepOutputs: a request's first token when its KV is in place, and
        (finish_reason "abort") requests the prefill side aborted mid-transfer. Stops early when a START
        waits for blocks or after a STOP (then self.stopped is True)."""
        outs, n = [], 0
        while max_messages is None or n < max_messages:
            msg = self.held or self.transport.recv()
            if msg is None:
                break
            self.held = None
            header, payload = msg
            if header[0] == STOP:
                self.stopped = True
                break
            if header[0] == START and not self._start(header, payload):
                self.held = msg
                break
            if header[0] == LAYER:
                outs += self._layer(header, payload)
            elif header[0] == ABORT:
                outs += self._abort_incoming(header)
            n += 1
        return outs

    def _start(self, header, payload) -> bool:
        meta = _from_bytes(payload)
        inc = Incoming(header[1], meta)
        if meta["request_id"] in self.cancelled_ids:
            self.cancelled_ids.discard(meta["request_id"])
            inc.cancelled = True
        else:
            _check_compatible(meta, self.model_config, self.runner)
            inc.seq = self.allocate_received(meta["request_id"], meta["prompt_token_ids"], meta["params"],
                                             meta.get("arrival_time"))
            if inc.seq is None:
                return False
            dtype = raw_view(self.runner.k_cache).dtype
            inc.buf = torch.empty(meta["shape"], dtype=dtype, device=self.runner.k_cache.device)
        inc.t0 = time.perf_counter()
        self.current = inc
        return True

    def _layer(self, header, payload) -> list:
        inc = self.current
        if inc is None or inc.serial != header[1]:
            raise RuntimeError(f"KV transfer out of order: layer {header[2]} of transfer {header[1]} arrived, "
                               f"expected transfer {None if inc is None else inc.serial}")
        self.received_bytes += payload.numel()
        if not inc.cancelled:
            layer = inc.buf[header[2]]
            layer.copy_(payload.to(layer.device).view(layer.dtype).view(layer.shape))
        inc.layers += 1
        if inc.layers < inc.meta["shape"][0]:
            return []
        self.current = None
        self.transfer_times.append(time.perf_counter() - inc.t0)
        if inc.cancelled:
            return []
        k, v = raw_view(self.runner.k_cache), raw_view(self.runner.v_cache)
        self.unpack(inc.buf, k, v, inc.seq.block_table)
        return [self.admit_received(inc.seq, inc.meta["first_token"])]

    def _abort_incoming(self, header) -> list:
        from .sequence import StepOutput

        inc, self.current = self.current, None
        if inc is None or inc.serial != header[1]:
            raise RuntimeError(f"ABORT for transfer {header[1]}, which is not in flight")
        if inc.cancelled:
            return []
        self.free_received(inc.seq)
        return [StepOutput(inc.meta["request_id"], 0, [], True, "abort")]

    def abort(self, request_id: str) -> bool:
        """Abort a request on the decode side. In flight: its blocks are freed now and its remaining layers
        are read and dropped. Not arrived yet: dropped when its START comes (no block is taken). Already
        decoding: abort_request (LLMEngine.abort). Returns False only when the request is nowhere (then it is remembered as
        not arrived)."""
        inc = self.current
        if inc is not None and inc.meta["request_id"] == request_id and not inc.cancelled:
            self.free_received(inc.seq)
            inc.cancelled, inc.seq, inc.buf = True, None, None
            return True
        if self.abort_request(request_id) is not None:
            return True
        self.cancelled_ids.add(request_id)
        return False


def _check_compatible(meta: dict, c, runner) -> None:
    """A transfer's shape and dtype against the decode engine's config.json and cache."""
    k = raw_view(runner.k_cache)
    want = [c.num_hidden_layers, 2, meta["num_tokens"], c.num_key_value_heads, c.head_dim]
    if list(meta["shape"]) != want or meta["dtype"] != str(k.dtype):
        raise ValueError(f"received KV of shape {meta['shape']} ({meta['dtype']}) but this decode instance's cache "
                         f"needs {want} ({k.dtype}): prefill and decode instances must serve the same model with "
                         "the same kv_cache_dtype")
