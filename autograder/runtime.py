"""Device setup for the grader and the notebooks: the engine's, in one place.

Triton reads TRITON_INTERPRET when a kernel is decorated (@triton.jit), so
without CUDA it must be set before any module defining a kernel is imported;
`reference_engine.device.ensure_triton_mode` does that (importing
`reference_engine` calls it too, which is how lesson modules get it).
"""
from __future__ import annotations


def cuda_available() -> bool:
    """A CUDA device is present. Asked through NVML (reference_engine.device sets that up), so asking starts no
    CUDA driver in this process and a child forked from it can still use CUDA."""
    import torch

    import reference_engine.device  # noqa: F401
    return torch.cuda.is_available()


def setup() -> str:
    """Choose the device; on CPU switch Triton to its interpreter. Returns 'cuda' or 'cpu'."""
    from reference_engine.device import ensure_triton_mode
    ensure_triton_mode(strict=False)
    return "cuda" if cuda_available() else "cpu"
