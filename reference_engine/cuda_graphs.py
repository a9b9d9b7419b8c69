"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A decode step of a small model is a few hundred tiny kernels; launched one by one from Python, the host's launch
time is the step time (the GPU idles between kernels). A CUDA graph records the launches of one forward once and
replays them with one call. nano-vllm (`ModelRunner.capture_cudagraph`) and vLLM (`cudagraph_capture_sizes`) do this
for decode batches: a graph is fixed to its tensors' shapes and addresses, so

- one graph is captured per bucket of batch sizes (1, 2, 4, 8, then every 16 up to the largest), all sharing one
  memory pool, largest first;
- inputs are copied into static buffers of the largest bucket's size before a replay, and a batch of n runs the
  smallest bucket >= n: the padded rows read and write the runner's *null block* (an extra cache block the block
  manager never hands out), so they touch no sequence's KV;
- a batch above the largest bucket, any step with a prefill chunk or verification rows, and `enforce_eager=True`
  run eagerly;
- the block table has a fixed width (the longest sequence's blocks), so the attention kernel's split count is the
  same at every replay (flash_decode_triton bounds the context by the table's width: no device sync).

The engine captures only on CUDA, with the Triton backend (the default there), the model's own KV dtype and one
rank (`engine.cuda_graph_factory`). `EagerReplay` stands in for a CUDA graph where there is none: it re-runs the
captured function on the static buffers, which tests the buffers and the padding on a CPU (not the capture itself).
"""
from __future__ import annotations

import bisect

import torch

from .attention import AttentionMetadata

MAX_CAPTURE_SIZE = 512  # vLLM's default max_cudagraph_capture_size (vllm/config/compilation.py, v0.11)


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 16 up to max_batch (nano-vllm's buckets), max_batch itself included."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sorted(set(sizes) | {max_batch})


class TorchCUDAGraph:
    """One torch.cuda.CUDAGraph in a shared pool."""

    def __init__(self, pool=None):
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, fn):
        with torch.cuda.graph(self.graph, pool=self.pool):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()

    def shared_pool(self):
        return self.graph.pool()


class EagerReplay:
    """A stand-in with CUDAGraph's contract (capture returns static outputs, replay refreshes them) that re-runs the
    function: for the static-buffer and padding logic on machines without CUDA."""

    def __init__(self, pool=None):
        self.fn = self.out = None

    def capture(self, fn):
        self.fn, self.out = fn, fn()
        return self.out

    def replay(self) -> None:
        with torch.inference_mode():  # the captured output is an inference tensor, as the model made it
            self.out.copy_(self.fn())

    def shared_pool(self):
        return None


class DecodeGraphs:
    """Graphs of `forward(ids, positions, meta) -> hidden` for decode-only batches up to max_batch sequences."""

    def __init__(self, forward, max_batch: int, max_blocks: int, block_size: int, null_block: int, device,
                 graph_class=TorchCUDAGraph):
        self.forward, self.block_size, self.null_block = forward, block_size, null_block
        self.sizes = capture_sizes(max_batch)
        n = self.sizes[-1]
        self.ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.pos = torch.zeros(n, dtype=torch.int64, device=device)
        self.slots = torch.full((n,), null_block * block_size, dtype=torch.int64, device=device)
        self.ctx = torch.ones(n, dtype=torch.int32, device=device)
        self.tables = torch.full((n, max_blocks), null_block, dtype=torch.int32, device=device)
        self.graphs: dict[int, tuple] = {}
        pool = None
        for b in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory
            meta = AttentionMetadata(slot_mapping=self.slots[:b], num_decode_tokens=b, decode_block_tables=self.tables[:b],
                                     decode_context_lens=self.ctx[:b], prefill_cu_seqlens=[0], prefill_context_lens=[],
                                     prefill_block_tables=None)
            forward(self.ids[:b], self.pos[:b], meta)  # warm-up: Triton compiles, the allocator settles
            graph = graph_class(pool)
            out = graph.capture(lambda b=b, meta=meta: forward(self.ids[:b], self.pos[:b], meta))
            pool = pool or graph.shared_pool()
            self.graphs[b] = (graph, out)
        self.replays = 0

    def bucket(self, n: int) -> int | None:
        """The smallest captured batch size >= n, or None (run eagerly)."""
        i = bisect.bisect_left(self.sizes, n)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        """Replay the bucket's graph for a decode-only batch; None where it must run eagerly."""
        n = ids.shape[0]
        b = self.bucket(n)
        width = meta.decode_block_tables.shape[1] if meta.decode_block_tables is not None else 0
        if b is None or meta.num_decode_tokens != n or width > self.tables.shape[1]:
            return None
        self.ids[:n].copy_(ids)
        self.pos[:n].copy_(positions)
        self.slots[:n].copy_(meta.slot_mapping)
        self.ctx[:n].copy_(meta.decode_context_lens)
        self.tables[:n, :width].copy_(meta.decode_block_tables)
        self.tables[:n, width:].fill_(self.null_block)
        if n < b:  # padded rows: one token at the null block
            self.ids[n:b].zero_()
            self.pos[n:b].zero_()
            self.slots[n:b].fill_(self.null_block * self.block_size)
            self.ctx[n:b].fill_(1)
            self.tables[n:b].fill_(self.null_block)
        graph, out = self.graphs[b]
        graph.replay()
        self.replays += 1
        return out[:n]
