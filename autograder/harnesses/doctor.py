"""`course doctor`'s Triton self-test, run in a learner process (as every kernel check is): whether Triton gives
right numbers on this machine."""
from __future__ import annotations

from autograder.harnesses import harness


@harness
def selftest() -> str:
    """Run a masked add and a tl.dot matmul (with a reduction loop); return '' or what is wrong."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

    @triton.jit
    def matmul_kernel(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            rk = k0 + tl.arange(0, BK)
            ta = tl.load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            tb = tl.load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(ta, tb)
        tl.store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1000, generator=g).to(dev), torch.randn(1000, generator=g).to(dev)
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(1000, 256),)](x, y, out, 1000, BLOCK=256)
    problems = []
    if not torch.allclose(out, x + y):
        problems.append(f"masked add wrong (max error {(out - x - y).abs().max().item():.3g})")
    M, N, K = 40, 24, 72
    a, b = torch.randn(M, K, generator=g).to(dev), torch.randn(K, N, generator=g).to(dev)
    c = torch.zeros(M, N, device=dev)
    matmul_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](a, b, c, M, N, K, BM=16, BN=16, BK=16)
    if not torch.allclose(c, a @ b, atol=1e-2, rtol=1e-2):
        problems.append(f"tl.dot matmul wrong (max error {(c - a @ b).abs().max().item():.3g}; "
                        f"all zeros: {bool((c == 0).all())})")
    return "; ".join(problems)
