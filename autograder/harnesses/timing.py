"""Timing on a CUDA device, for the harnesses that time a learner's kernel (lessons 04, 15, 16) and for the
checks that time a reference beside it."""
from __future__ import annotations

import time


def seconds_per_call(fn, reps: int) -> float:
    """Mean wall-clock seconds of fn() over `reps` calls, after one warm-up call, the device synchronised before
    the clock starts and after it stops."""
    import torch

    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps
