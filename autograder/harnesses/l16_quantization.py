"""The learner side of lesson 16's checks (autograder/harnesses/__init__.py): the learner's W4A16 kernel timed on
CUDA against a bf16 matmul of the same weight, inputs built in the learner's process (copying a 14336 x 4096 weight
per call would swamp the timing). The int4 weight is packed by the engine's own quantizer
(reference_engine/quantization.py), so the timing grades the kernel alone, whatever state quantize_int4 is in."""
from __future__ import annotations

from typing import NamedTuple

import torch

from autograder.harnesses import harness
from autograder.harnesses.timing import seconds_per_call


class PackedInt4(NamedTuple):
    """The fields of the lesson's Int4Weight that launch_w4a16 reads."""
    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int


def timing_inputs(seed: int, device: str = "cuda", n: int = 14336, k: int = 4096, m: int = 16) -> tuple:
    """(x bf16 [m, k], the int4 weight (asymmetric, groups of 128), w bf16 [n, k]) on `device`, from `seed`."""
    from reference_engine.quantization import pack_int4, quantize_groups

    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.02
    x = torch.randn(m, k, generator=gen).bfloat16()
    q, scales, zeros = quantize_groups(w, 4, 128, symmetric=False)
    qw = PackedInt4(pack_int4(q).to(device), scales.to(device), zeros.to(device), 128)
    return x.to(device), qw, w.bfloat16().to(device)


@harness
def time_w4a16(fn, seed: int, reps: int = 20) -> dict:
    """(A harness: runs in the learner's process, on CUDA.) Seconds per call of fn(x, qw) and of x @ W.T in bf16."""
    x, qw, wb = timing_inputs(seed)
    return {"mine": seconds_per_call(lambda: fn(x, qw), reps), "bf16": seconds_per_call(lambda: x @ wb.T, reps)}
