"""The learner side of lesson 15's checks (autograder/harnesses/__init__.py): the learner's GQA decode kernel timed
on CUDA (the reference it is compared with is timed by the check), and the shapes of the tensors the learner's
absorbed MLA builds, watched by a TorchFunctionMode as it runs."""
from __future__ import annotations

import torch

from autograder.harnesses import harness
from autograder.harnesses.timing import seconds_per_call


def gqa_timing_inputs(lens: list[int], seed: int) -> tuple:
    """The timing case of the GQA decode kernel, on CUDA: bf16 q [B, 32, 128], K and V caches [B, 4096, 8, 128],
    seq_lens [B] (B = len(lens)), from `seed`. Built where it is timed (copying 0.5 GB of inputs per call would
    swamp the timing): in the learner's process for its kernel, in the grader for the reference."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=gen).to("cuda", torch.bfloat16)
               for shape in ((len(lens), 32, 128), (len(lens), 4096, 8, 128), (len(lens), 4096, 8, 128)))
    return q, k, v, torch.tensor(lens, dtype=torch.int32, device="cuda")


@harness
def time_gqa(fn, lens: list[int], seed: int, reps: int = 20) -> dict:
    """(A harness: runs in the learner's process, on CUDA.) {"mine": seconds per call of fn(q, k, v, seq_lens)} on
    gqa_timing_inputs(lens, seed). The torch reference it is compared with is timed by the check, in the grader,
    on the same inputs (it is the lesson's answer: it stays out of the learner's process)."""
    q, k, v, seq_lens = gqa_timing_inputs(lens, seed)
    return {"mine": seconds_per_call(lambda: fn(q, k, v, seq_lens), reps)}


class _ShapeWatch(torch.overrides.TorchFunctionMode):
    """Notes every tensor an op returns whose shape has the cache length next to a per-head width."""

    def __init__(self, S: int, widths: set[int]):
        super().__init__()
        self.S, self.widths, self.seen = S, widths, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor) and self.S in o.shape and self.widths & set(o.shape):
                self.seen.append(tuple(o.shape))
        return out


@harness
def watch_shapes(fn, S: int, widths: set, *args) -> dict:
    """(A harness: runs in the learner's process.) fn(*args) under a _ShapeWatch: returns {"out": its
    result, "seen": the shapes of the tensors it built with S and one of `widths` in their shape}."""
    watch = _ShapeWatch(S, set(widths))
    with watch:
        out = fn(*args)
    return {"out": out, "seen": watch.seen[:20]}
