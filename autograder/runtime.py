"""Device setup shared by the grader, the notebooks and the learner's modules.

Triton reads TRITON_INTERPRET when a kernel is decorated, so without CUDA it
must be set before any module with a @triton.jit kernel is imported.
"""
from __future__ import annotations

import os
import sys


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def setup() -> str:
    """Choose the device; on CPU switch Triton to its interpreter. Returns 'cuda' or 'cpu'."""
    if cuda_available():
        return "cuda"
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # Kernels decorated before this point would try to compile for a GPU that is not there.
        import warnings
        warnings.warn("triton was imported before the course set TRITON_INTERPRET=1; "
                      "restart the kernel/process if kernels fail to launch", stacklevel=2)
    os.environ["TRITON_INTERPRET"] = "1"
    return "cpu"
