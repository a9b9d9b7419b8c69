"""Timing on a CUDA device, for the harnesses that time a learner's kernel (lessons 04, 15, 16) and for the
checks that time a reference beside it."""
from __future__ import annotations

# Bytes written before each timed call: more than any L2 cache (H100 50 MB, H200 60 MB, B200 126 MB), as
# triton.testing.do_bench does with its 256 MB cache buffer.
FLUSH_BYTES = 256 * 2**20


def seconds_per_call(fn, reps: int) -> float:
    """The median GPU seconds of one fn() call over `reps` calls, each timed with CUDA events and each after a write
    of FLUSH_BYTES (after one warm-up call). The write evicts the L2 cache, so every call reads its inputs from HBM
    as a model's weights are read once a step, and it keeps the GPU busy while the host launches fn: the events
    time the kernels, not the host's launch (timing on the host with a synchronize measured launch overhead for
    kernels of a few tens of microseconds)."""
    import torch

    fn()
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda.synchronize()
    for start, end in zip(starts, ends):
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in zip(starts, ends))
    return times[len(times) // 2] / 1e3
