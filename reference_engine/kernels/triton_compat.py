"""Triton where it installs, a stand-in where it does not.

Triton publishes wheels for Linux only (x86-64 and arm64), so on macOS and native Windows the course runs
without it: the engine uses its torch attention backend, and a module that defines Triton kernels still
imports. Kernel modules import Triton from here:

    from reference_engine.kernels.triton_compat import tl, triton

With Triton installed these are the real `triton` and `triton.language`. Without it, `@triton.jit` still
decorates (the kernel's body is never run), `triton.cdiv` and `triton.next_power_of_2` still compute, and
launching a kernel, `kernel[grid](...)`, raises TritonUnavailable, whose message says what to do. The grader
never runs a Triton case there: it reports it "not graded here" (autograder.core, requires_triton).
"""
from __future__ import annotations

import types

__all__ = ["AVAILABLE", "WHY", "TritonUnavailable", "triton", "tl", "require"]

HOW = ("Triton installs on Linux only (x86-64 and arm64): use WSL on Windows, a Linux machine or container, "
       "or a CUDA machine to run the Triton exercises")


class TritonUnavailable(RuntimeError):
    """A Triton kernel was launched on a platform where Triton is not installed."""


try:  # a missing wheel raises ImportError; a broken install can raise more than that
    import triton
    import triton.language as tl
    AVAILABLE, WHY = True, ""
except Exception as e:  # noqa: BLE001 - any failure to import means the same thing here: no Triton
    AVAILABLE, WHY = False, f"{type(e).__name__}: {e}"


def why() -> str:
    """One line: why Triton cannot run here, and what to do."""
    return f"Triton is not available on this platform ({WHY}); {HOW}"


def require(what: str = "this Triton kernel") -> None:
    """Raise TritonUnavailable (naming `what`) where Triton is not installed; return quietly where it is."""
    if not AVAILABLE:
        raise TritonUnavailable(f"{what} needs Triton. {why()}")


if not AVAILABLE:
    class _Kernel:
        """What @triton.jit returns without Triton: the Python function, kept, that cannot be launched."""

        def __init__(self, fn):
            self.fn = fn
            self.__name__ = getattr(fn, "__name__", "kernel")
            self.__doc__ = getattr(fn, "__doc__", None)
            self.__module__ = getattr(fn, "__module__", __name__)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                require(f"the Triton kernel {self.__name__}")
            return launch

        def run(self, *args, **kwargs):
            require(f"the Triton kernel {self.__name__}")

        def __call__(self, *args, **kwargs):
            raise TritonUnavailable(f"{self.__name__} is a Triton kernel: launch it as {self.__name__}[grid](...), "
                                    f"which needs Triton. {why()}")

    def _decorator_or_decorated(fn=None, **_kwargs):
        """`@jit` and `@jit(...)` alike."""
        if fn is None:
            return lambda f: _Kernel(f)
        return _Kernel(fn)

    def _cdiv(x, y):
        return (x + y - 1) // y

    def _next_power_of_2(n: int) -> int:
        n = int(n)
        return 1 if n <= 1 else 1 << (n - 1).bit_length()

    class _Anything:
        """A stand-in for a triton.language name (tl.float32, tl.load, ...): usable at import time in a kernel
        module, unusable when called (which only a kernel body would do, and no kernel body runs)."""

        def __init__(self, name: str):
            self._name = name

        def __getattr__(self, item):
            if item.startswith("__"):
                raise AttributeError(item)
            return _Anything(f"{self._name}.{item}")

        def __call__(self, *args, **kwargs):
            raise TritonUnavailable(f"{self._name} is part of Triton. {why()}")

        def __repr__(self):
            return f"<{self._name}: Triton is not installed>"

    class _Constexpr:
        """tl.constexpr, for annotations (`BLOCK: tl.constexpr`) and for wrapping a constant."""

        def __init__(self, value=None):
            self.value = value

    class _Module(types.ModuleType):
        def __getattr__(self, item):
            if item.startswith("__"):
                raise AttributeError(item)
            return _Anything(f"{self.__name__}.{item}")

    triton = _Module("triton")  # noqa: F811 - the stand-in
    triton.__doc__ = "A stand-in for Triton, which is not installed: " + why()
    triton.jit = _decorator_or_decorated
    triton.autotune = lambda *a, **k: _decorator_or_decorated
    triton.heuristics = lambda *a, **k: _decorator_or_decorated
    triton.Config = lambda *a, **k: None
    triton.cdiv = _cdiv
    triton.next_power_of_2 = _next_power_of_2
    triton.__version__ = "not installed"
    tl = _Module("triton.language")  # noqa: F811
    tl.constexpr = _Constexpr
    triton.language = tl
