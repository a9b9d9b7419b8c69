"""Where the engine runs, and how Triton runs there.

On a machine without CUDA, Triton kernels still run under its interpreter (numpy on the CPU), but only
if TRITON_INTERPRET=1 is set before triton is first imported: ensure_triton_mode() does that.
"""
from __future__ import annotations

import os
import sys

# torch.cuda.is_available() by default asks cudaGetDeviceCount, which starts the CUDA driver and marks this
# process so that no child forked from it can use CUDA. Asked through NVML it starts nothing: the grader
# forks learner processes from a zygote that must stay usable for CUDA. (setdefault: an explicit setting wins.)
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")


def default_device():
    import torch
    return torch.device("cuda" if cuda_available() else "cpu")


def default_dtype(device):
    """bf16 on GPUs that support it (halves weight and KV bytes), fp32 on CPU (bf16 matmuls are slow there)."""
    import torch
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float16 if device.type == "cuda" else torch.float32


def interpret_mode() -> bool:
    """True when Triton kernels run under the interpreter (no GPU compile)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def ensure_triton_mode(strict: bool = True) -> bool:
    """Turn on the interpreter when there is no CUDA device and triton is not imported yet.

    Returns interpret_mode(). Triton's own library functions (tl.sum, tl.max, ...) are defined when
    triton is first imported, so the switch must come before that (transformers' model code imports
    triton, for one). Too late on a CPU-only machine: raises if strict, else returns False.
    reference_engine calls this, non-strict, when it is imported.
    """
    if cuda_available() or interpret_mode():
        return interpret_mode()
    if "triton" in sys.modules:
        if strict:
            raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set and there is no CUDA device, so "
                               "Triton kernels cannot run: import reference_engine (or call "
                               "reference_engine.device.ensure_triton_mode()) before transformers/triton, or set TRITON_INTERPRET=1")
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def cuda_possible() -> bool:
    """Whether this machine may have a CUDA (or ROCm) device, known without importing torch: on Linux a GPU
    driver shows itself under /dev or /proc; macOS has no CUDA. Where it is False, cuda_available() answers
    without importing torch (1-2 s), so that what needs no tensors (lesson 10's fleet, a grader for it) never
    pays for it."""
    if sys.platform == "darwin":
        return False
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg"))


def cuda_available() -> bool:
    """torch.cuda.is_available(), importing torch only where a device is possible (cuda_possible)."""
    if not cuda_possible() and "torch" not in sys.modules:
        return False
    import torch
    return torch.cuda.is_available()
