"""The learner side of lesson 16's checks (autograder/harnesses/__init__.py): the learner's W4A16 kernel timed on
CUDA against a bf16 matmul of the same weight, inputs built in the learner's process (copying a 14336 x 4096 weight
per call would swamp the timing)."""
from __future__ import annotations

import torch

from autograder.harnesses import harness
from autograder.harnesses.timing import seconds_per_call


@harness
def time_w4a16(fn, quantize, seed: int, reps: int = 20) -> dict:
    """(A harness: runs in the learner's process, on CUDA.) Seconds per call of fn(x, qw) and of x @ W.T in bf16."""
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(14336, 4096, generator=gen) * 0.02).cuda()
    x = torch.randn(16, 4096, generator=gen).cuda().bfloat16()
    qw = quantize(w, 128, False)
    wb = w.bfloat16()
    return {"mine": seconds_per_call(lambda: fn(x, qw), reps), "bf16": seconds_per_call(lambda: x @ wb.T, reps)}
