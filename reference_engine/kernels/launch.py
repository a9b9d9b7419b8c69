"""Launching an exercise's Triton kernel, so that an unwritten one reads as a stub, not as a crash.

    launch(paged_decode_kernel, (num_seqs, num_kv_heads), q, k_cache, ..., GROUP=4, ...,
           stub="Exercise 4.2 (paged_decode_kernel): see section 4.2 of lessons/l04_paged_attention.ipynb")

A stub kernel's body is `raise NotImplementedError(...)`. Triton's interpreter (on CPU) wraps that
error in its own InterpreterError, and the GPU compiler rejects the `raise` statement when it
compiles the kernel; either way the learner should read the stub's message, and the grader should
report the exercise as "not started" rather than as a crash. Only the stub's own error counts
(its message names the exercise): a NotImplementedError from Triton itself, say an operation the
interpreter lacks, is re-raised as it is.
"""
from __future__ import annotations


def _is_stub_error(e: BaseException, name: str) -> bool:
    """Whether `e`, or an error it wraps, is the stub's NotImplementedError (its message names the exercise)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        try:
            text = str(e)
        except Exception:  # noqa: BLE001 - an exception whose message cannot be printed
            text = ""
        if name in text and (isinstance(e, NotImplementedError) or "NotImplementedError" in text):
            return True
        e = e.__cause__ or e.__context__
    return False


def launch(kernel, grid, *args, stub: str, **meta):
    """Run kernel[grid](*args, **meta); if the kernel is still its stub, raise NotImplementedError(stub)."""
    try:
        return kernel[grid](*args, **meta)
    except Exception as e:  # noqa: BLE001 - re-raised unless it is the stub's own error
        if _is_stub_error(e, stub.split(":")[0]):  # "Exercise 4.2 (paged_decode_kernel)"
            raise NotImplementedError(stub) from None
        raise
