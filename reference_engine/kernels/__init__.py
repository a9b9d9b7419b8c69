"""Attention kernels over the paged KV cache, each with a plain-torch reference.

KV cache layout (per layer, for K and for V): [num_blocks, block_size, num_kv_heads, head_dim].
Token t of a sequence lives in block block_table[t // block_size] at offset t % block_size, i.e. at
slot block_id * block_size + offset of the cache viewed as [num_blocks * block_size, kv_heads, head_dim].

The Triton kernels live in *_triton modules and are imported lazily, after ensure_triton_mode(),
so that importing the engine on a CPU machine never touches triton.
"""
from .cache import write_kv_torch
from .paged_attention import paged_decode_torch
from .prefill_attention import prefill_torch

__all__ = ["paged_decode_torch", "prefill_torch", "write_kv_torch", "triton_kernels"]


def triton_kernels():
    """Import and return the Triton kernel module (sets the interpreter first on CPU). Where Triton is not
    installed (macOS, native Windows) raises triton_compat.TritonUnavailable, which says what to do."""
    from ..device import ensure_triton_mode

    ensure_triton_mode()
    from . import triton_compat

    triton_compat.require("the engine's Triton attention kernels")
    from . import attention_triton

    return attention_triton
