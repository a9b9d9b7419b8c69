"""Device setup shared by the grader, the notebooks and the learner's modules.

Triton reads TRITON_INTERPRET when a kernel is decorated (@triton.jit), so
without CUDA it must be set before any module defining a kernel is imported.
"""
from __future__ import annotations

import os


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def setup() -> str:
    """Choose the device; on CPU switch Triton to its interpreter. Returns 'cuda' or 'cpu'."""
    if cuda_available():
        return "cuda"
    os.environ["TRITON_INTERPRET"] = "1"
    return "cpu"
