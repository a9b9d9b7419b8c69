"""`course doctor`: what this machine is, and whether Triton gives right numbers on it.

The self-test matters because a Triton/torch version mismatch under the
interpreter can silently return zeros instead of failing, and every kernel
check would then blame the learner.
"""
from __future__ import annotations

import platform
import time

from . import oslimits, runtime, sandbox


def run() -> int:
    device = runtime.setup()
    import torch

    from reference_engine.kernels import triton_compat
    print(f"python   {platform.python_version()} ({platform.machine()}, {platform.system()})")
    print(f"torch    {torch.__version__}  threads={torch.get_num_threads()}")
    print(f"triton   {triton_compat.triton.__version__ if triton_compat.AVAILABLE else 'not installed'}")
    if triton_compat.AVAILABLE:
        print("mode     with Triton: every exercise, the Triton kernels included, is graded on this machine")
    else:
        print("mode     without Triton: everything runs, the engine uses its torch attention, and the Triton exercise "
              "checks (lessons 04, 15, 16) are reported 'not graded here'.\n"
              f"         {triton_compat.why()}")
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        mem = torch.cuda.get_device_properties(0).total_memory / 2**30
        print(f"device   CUDA: {name}, {mem:.0f} GiB; kernels compile natively, bf16/fp8 cases run")
    else:
        print("device   CPU: " + ("Triton kernels run under the interpreter (TRITON_INTERPRET=1), in fp32 at small "
                                    "sizes; " if triton_compat.AVAILABLE else "")
              + "GPU-only cases are reported as 'not graded here'")
    print("sandbox  " + oslimits.describe().removeprefix("isolation: "))
    if not triton_compat.AVAILABLE:
        print("self-test skipped: no Triton to test")
        return 0
    start = time.perf_counter()
    kind, value, _ = sandbox.run_harness("autograder.harnesses.doctor:selftest", timeout=120)
    if kind != "ok":
        print(f"self-test FAILED: the Triton kernels {kind}: {value}")
        return 1
    if value:
        print(f"self-test FAILED: {value}. Kernel checks on this machine cannot be trusted; "
              "install matching torch/triton versions (see README).")
        return 1
    print(f"self-test passed: a Triton add and a tl.dot matmul match torch ({time.perf_counter() - start:.1f} s)")
    return 0
