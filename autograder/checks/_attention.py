"""Inputs shared by the attention checks of several lessons."""
from __future__ import annotations

import torch


def bf16_qkv(queries: int):
    """A fixed bf16 case (the same on every seed): q [queries, 4, 32], k and v [16, 1, 32], whose keys share a
    large common component, as real keys often do: the exact softmax cancels it, but scores of that size keep
    only 2-3 significant digits in bf16, so attention computed in bf16 is visibly off."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(queries, 4, 32, generator=g)
    k, v = torch.randn(16, 1, 32, generator=g), torch.randn(16, 1, 32, generator=g)
    u = q.mean(dim=(0, 1))
    return q.bfloat16(), (k + 64 * u / u.norm()).bfloat16(), v.bfloat16()
