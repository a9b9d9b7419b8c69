"""Attention backends: the per-step metadata they read and the two implementations.

Every layer calls run_attention(): write this step's K/V into the paged cache at slot_mapping, then
paged decode for the first num_decode_tokens rows (one query token per sequence) and ragged prefill
for the rest (chunks of prompts, or of prompt + generated tokens after a preemption).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from . import kernels


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: cache slot of every token in the batch
    num_decode_tokens: int  # rows [0, num_decode_tokens) are decodes, one per sequence
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] int32
    decode_context_lens: torch.Tensor | None  # [num_decodes] int32, the new token included
    prefill_cu_seqlens: list[int]  # chunk offsets within the prefill rows, len num_prefills + 1
    prefill_context_lens: list[int]  # tokens in the cache per prefill sequence after this step's write
    prefill_block_tables: torch.Tensor | None  # [num_prefills, max_blocks] int32

    @cached_property
    def prefill_cu_seqlens_tensor(self) -> torch.Tensor:
        return torch.tensor(self.prefill_cu_seqlens, dtype=torch.int32, device=self.slot_mapping.device)

    @cached_property
    def prefill_max_query_len(self) -> int:
        c = self.prefill_cu_seqlens
        return max(b - a for a, b in zip(c, c[1:]))

    @cached_property
    def prefill_context_lens_tensor(self) -> torch.Tensor:
        return torch.tensor(self.prefill_context_lens, dtype=torch.int32, device=self.slot_mapping.device)


def run_attention(backend, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [T, kv_heads, D] -> [T, H, D]; see interfaces.AttentionBackend."""
    backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    nd = meta.num_decode_tokens
    if nd == q.shape[0]:
        return backend.decode(q, k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale)
    prefill = backend.prefill(q[nd:], k[nd:], v[nd:], k_cache, v_cache, meta, scale)
    if nd == 0:
        return prefill
    decode = backend.decode(q[:nd], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale)
    return torch.cat([decode, prefill])


class TorchBackend:
    """Reference backend (default on CPU): index_copy_ into the cache, gather + SDPA for attention."""

    name = "torch"

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
        kernels.write_kv_torch(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale):
        return kernels.paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale)

    def prefill(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale):
        return kernels.prefill_torch(q, k, v, k_cache, v_cache, meta.prefill_cu_seqlens, meta.prefill_context_lens,
                                     meta.prefill_block_tables, scale)


class TritonBackend:
    """Triton kernels (default on CUDA; under the interpreter on CPU, which is slow: tests only)."""

    name = "triton"

    def __init__(self):
        self.k = kernels.triton_kernels()

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
        self.k.write_kv_triton(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale):
        return self.k.flash_decode_triton(q.contiguous(), k_cache, v_cache, block_tables, context_lens, scale)

    def prefill(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale):
        if meta.prefill_max_query_len <= self.k.MAX_QUERY_ROWS:  # verification rows, short chunks: split-K kernel
            return self.k.flash_decode_triton(q.contiguous(), k_cache, v_cache, meta.prefill_block_tables,
                                              meta.prefill_context_lens_tensor, scale,
                                              cu_seqlens_q=meta.prefill_cu_seqlens_tensor,
                                              max_context=max(meta.prefill_context_lens),
                                              max_query_len=meta.prefill_max_query_len)
        return self.k.prefill_triton(q.contiguous(), k, v, k_cache, v_cache, meta.prefill_cu_seqlens_tensor,
                                     meta.prefill_context_lens_tensor, meta.prefill_block_tables, scale,
                                     max_query_len=meta.prefill_max_query_len)


BACKENDS = {"torch": TorchBackend, "triton": TritonBackend}


TRITON_MIN_BLOCK_SIZE = 16  # the prefill kernel's tl.dot tiles a block of the cache: 16 rows at least


def get_backend(spec, device: torch.device, block_size: int = 16):
    """None -> "triton" on CUDA where Triton is installed, "torch" elsewhere and for cache blocks too small for
    the Triton prefill kernel (teaching configurations use blocks of 4 or 8 tokens); a name from BACKENDS; or an
    object used as is."""
    if spec is None:
        from .kernels import triton_compat
        spec = ("triton" if device.type == "cuda" and block_size >= TRITON_MIN_BLOCK_SIZE and triton_compat.AVAILABLE
                else "torch")
    if isinstance(spec, str):
        if spec not in BACKENDS:
            raise ValueError(f"unknown attention_backend {spec!r}; choose one of {sorted(BACKENDS)} or pass an object")
        if spec == "triton" and block_size < TRITON_MIN_BLOCK_SIZE:
            raise ValueError(f"attention_backend='triton' needs block_size >= {TRITON_MIN_BLOCK_SIZE} (the prefill "
                             f"kernel's smallest tl.dot tile), got {block_size}; use 'torch' or larger blocks")
        return BACKENDS[spec]()
    missing = [m for m in ("write_kv", "decode", "prefill") if not callable(getattr(spec, m, None))]
    if missing:
        raise TypeError(f"attention_backend {spec!r} lacks method(s) {missing}; see reference_engine.interfaces.AttentionBackend")
    return spec
