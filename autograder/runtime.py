"""Device setup for the grader and the notebooks: the engine's, in one place.

Triton reads TRITON_INTERPRET when a kernel is decorated (@triton.jit), so
without CUDA it must be set before any module defining a kernel is imported;
`reference_engine.device.ensure_triton_mode` does that (importing
`reference_engine` calls it too, which is how lesson modules get it).
"""
from __future__ import annotations

import contextlib
import os
import sys


def cuda_available() -> bool:
    """A CUDA device is present. Asked through NVML (reference_engine.device sets that up), so asking starts no
    CUDA driver in this process and a child forked from it can still use CUDA; on a machine that cannot have
    one, answered without importing torch (reference_engine.device.cuda_available)."""
    from reference_engine.device import cuda_available
    return cuda_available()


def setup() -> str:
    """Choose the device; on CPU switch Triton to its interpreter. Returns 'cuda' or 'cpu'."""
    from reference_engine.device import ensure_triton_mode
    ensure_triton_mode(strict=False)
    return "cuda" if cuda_available() else "cpu"


# Grading on CPU runs several processes side by side: the grader and its learner process, and on `course check`
# a second grader with its own. With torch's default of one OpenMP thread a core, their threads outnumber the
# cores and spin waiting on each other: a kernel check that takes 0.6 s alone took 2 s beside another check on
# 2 cores. So graders and learner processes compute with one thread each (the lessons' own timing helpers
# already do), and the parallelism comes from the processes.
GRADING_THREADS = 1


def limit_threads(n: int = GRADING_THREADS) -> None:
    """From now on torch in this process computes with n threads: set now if torch is imported, else through
    OMP_NUM_THREADS, which torch reads when it is (a process for a lesson without tensors, Lesson.torch False,
    may never import it). For a forked process: it must not reuse its parent's thread pool either."""
    torch = sys.modules.get("torch")
    if torch is None:
        os.environ["OMP_NUM_THREADS"] = str(n)
        return
    try:
        torch.set_num_threads(n)
    except Exception:  # noqa: BLE001 - a torch that refuses keeps its own setting
        pass


@contextlib.contextmanager
def grading_threads():
    """torch uses GRADING_THREADS CPU threads inside, and what it used before afterwards (a notebook that
    grades goes on with its own setting). In a grader that has not imported torch (a lesson that needs none)
    OMP_NUM_THREADS says it, for a check that imports torch after all."""
    torch = sys.modules.get("torch")
    if torch is None:
        before_env = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(GRADING_THREADS)
        try:
            yield
        finally:
            if "torch" not in sys.modules:
                if before_env is None:
                    os.environ.pop("OMP_NUM_THREADS", None)
                else:
                    os.environ["OMP_NUM_THREADS"] = before_env
        return
    before = torch.get_num_threads()
    torch.set_num_threads(GRADING_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)
