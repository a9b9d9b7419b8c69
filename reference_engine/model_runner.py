"""Owns the paged KV cache and turns a SchedulerOutput into one forward over a flat token batch."""
from __future__ import annotations

import time

import torch

from .attention import AttentionMetadata
from .model import CausalLM
from .scheduler import ScheduledSeq, SchedulerOutput


def raw_view(cache: torch.Tensor) -> torch.Tensor:
    """The cache as index operations can take it: float8 as uint8 (the same bytes; CPU torch cannot index
    float8 tensors), anything else unchanged."""
    return cache.view(torch.uint8) if cache.element_size() == 1 else cache


def zeros_cache(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.zeros, but a 1-byte (float8) cache is zeroed as uint8 and viewed as its dtype: the same bytes
    (0x00 is +0.0 in E4M3), and older CPU torch (2.2) has no fill for float8."""
    if dtype.itemsize == 1 and dtype.is_floating_point:
        return torch.zeros(shape, dtype=torch.uint8, device=device).view(dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


class ModelRunner:
    clock = staticmethod(time.perf_counter)  # LLMEngine sets its own clock, so forward and wall time agree
    last_forward_time: float | None = None  # seconds the last execute() spent in the forward (prepare() excluded)

    def __init__(self, model: CausalLM, block_size: int, num_blocks: int, device, dtype, backend, cache_dtype=None,
                 null_block: bool = False):
        c = model.config
        self.model, self.block_size, self.device = model, block_size, device
        # null_block: one more block than the block manager hands out, for the padded rows of CUDA-graph replays
        self.null_block = num_blocks if null_block else None
        self.graphs = None  # cuda_graphs.DecodeGraphs once capture_decode_graphs() ran
        num_blocks += bool(null_block)
        # [layers, num_blocks, block_size, kv_heads, head_dim] for K and for V; layer i's view is the
        # [num_blocks, block_size, kv_heads, head_dim] cache the kernels take. Zeroed: masked slots
        # still pass through the torch gather, and 0 * NaN garbage would poison the softmax sum.
        # cache_dtype (default: dtype) may be torch.float8_e4m3fn, with a backend that quantizes (quantization.py).
        kv_heads = model.layers[0].self_attn.num_kv_heads  # this rank's (all of them at tensor_parallel_size 1)
        shape = (c.num_hidden_layers, num_blocks, block_size, kv_heads, c.head_dim)
        self.k_cache = zeros_cache(shape, cache_dtype or dtype, device)
        self.v_cache = zeros_cache(shape, cache_dtype or dtype, device)
        for i, layer in enumerate(model.layers):
            layer.self_attn.k_cache, layer.self_attn.v_cache = self.k_cache[i], self.v_cache[i]
            layer.self_attn.backend = backend

    def capture_decode_graphs(self, max_batch: int, max_blocks: int, graph_class) -> None:
        """Capture a decode graph per batch bucket up to max_batch sequences of up to max_blocks blocks
        (cuda_graphs.DecodeGraphs; needs null_block=True)."""
        from .cuda_graphs import DecodeGraphs

        if self.null_block is None:
            raise ValueError("capture_decode_graphs needs a runner built with null_block=True")
        self.graphs = DecodeGraphs(self.model, max_batch, max_blocks, self.block_size, self.null_block, self.device,
                                   graph_class)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate whole blocks (all layers) before a forked sequence writes into them."""
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for cache in (self.k_cache, self.v_cache):
            c = raw_view(cache)
            c[:, dst] = c[:, src]

    def _block_tables(self, scheduled: list[ScheduledSeq]) -> torch.Tensor | None:
        if not scheduled:
            return None
        width = max(len(s.seq.block_table) for s in scheduled)
        rows = [s.seq.block_table + [0] * (width - len(s.seq.block_table)) for s in scheduled]  # pad: masked anyway
        return torch.tensor(rows, dtype=torch.int32, device=self.device)

    def prepare(self, out: SchedulerOutput):
        """Flat input_ids/positions/slots for decodes then prefill chunks, and the rows whose logits are needed
        (each chunk's last num_logits)."""
        bs = self.block_size
        ids, pos, slots, logit_rows = [], [], [], []
        cu, ctx = [0], []
        for s in out.scheduled:
            seq, p0 = s.seq, s.seq.num_computed_tokens
            p1 = p0 + s.num_tokens
            bt = seq.block_table
            ids += seq.token_ids[p0:p1]
            pos += range(p0, p1)
            slots += [bt[p // bs] * bs + p % bs for p in range(p0, p1)]
            logit_rows += range(len(ids) - s.num_logits, len(ids))
        for s in out.prefills:
            cu.append(cu[-1] + s.num_tokens)
            ctx.append(s.seq.num_computed_tokens + s.num_tokens)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            num_decode_tokens=len(out.decodes),
            decode_block_tables=self._block_tables(out.decodes),
            decode_context_lens=torch.tensor([s.seq.num_computed_tokens + 1 for s in out.decodes], dtype=torch.int32, device=dev),
            prefill_cu_seqlens=cu,
            prefill_context_lens=ctx,
            prefill_block_tables=self._block_tables(out.prefills),
        )
        ids_t = torch.tensor(ids, dtype=torch.int64, device=dev)
        pos_t = torch.tensor(pos, dtype=torch.int64, device=dev)
        return ids_t, pos_t, meta, torch.tensor(logit_rows, dtype=torch.int64, device=dev)

    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Run the forward; logits [sum of num_logits, vocab] float32: each scheduled chunk's last num_logits
        tokens, in batch order (out.scheduled)."""
        return self.forward(*self.prepare(out))

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        """The forward over prepare()'s tensors (a tensor-parallel worker gets them from the engine, tp_runner.py)."""
        _sync(self.device)  # earlier work (inputs, block copies) finished: the timer holds this forward only
        t0 = self.clock()
        hidden = self.graphs.run(ids, pos, meta) if self.graphs is not None else None
        if hidden is None:
            hidden = self.model(ids, pos, meta)
        logits = self.model.compute_logits(hidden[rows])
        _sync(self.device)  # CUDA kernels run asynchronously: wait for them before reading the clock
        self.last_forward_time = self.clock() - t0
        return logits


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
