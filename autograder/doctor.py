"""`course doctor`: what this machine is, and whether Triton gives right numbers on it.

The self-test matters because a Triton/torch version mismatch under the
interpreter can silently return zeros instead of failing, and every kernel
check would then blame the learner.
"""
from __future__ import annotations

import platform
import time

from . import runtime, sandbox


def _selftest() -> str:
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
    if not triton_compat.AVAILABLE:
        print("self-test skipped: no Triton to test")
        return 0
    start = time.perf_counter()
    kind, value, _ = sandbox.run_harness("autograder.doctor:_selftest", timeout=120)
    if kind != "ok":
        print(f"self-test FAILED: the Triton kernels {kind}: {value}")
        return 1
    if value:
        print(f"self-test FAILED: {value}. Kernel checks on this machine cannot be trusted; "
              "install matching torch/triton versions (see README).")
        return 1
    print(f"self-test passed: a Triton add and a tl.dot matmul match torch ({time.perf_counter() - start:.1f} s)")
    return 0
