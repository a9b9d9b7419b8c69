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


# E4M3 (float8_e4m3fn) without saturation, as a GPU's conversion without its saturating flag and PyTorch's eager
# cast before 2.12 behave: a value that rounds past 448 (|v| > 464, the midpoint to the next binade's 480, which
# is the NaN pattern S.1111.111) and an infinity both become NaN. PyTorch 2.12 and later saturate to +-448 instead,
# so on them a quantizer that forgets the clamp looks right; under this mode it does not.
_E4M3_ROUNDS_TO_448 = 464.0


def cast_e4m3_without_saturation(x: torch.Tensor) -> torch.Tensor:
    """x cast to float8_e4m3fn, NaN (0x7F / 0xFF) wherever |x| > 464 or x is infinite."""
    fp8 = torch.float8_e4m3fn
    q = x.to(fp8)
    over = x.abs() > _E4M3_ROUNDS_TO_448
    if bool(over.any()):
        bits = q.view(torch.uint8).clone()
        bits[over] = torch.where(x[over] < 0, 0xFF, 0x7F).to(torch.uint8)
        q = bits.view(fp8)
    return q


def _no_saturation_mode():
    from torch.overrides import TorchFunctionMode  # (a dispatch mode would import torch._dynamo: a second more)

    fp8 = torch.float8_e4m3fn

    def wide(a) -> bool:
        return isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != fp8

    def narrowed(a):
        return cast_e4m3_without_saturation(a.float()) if wide(a) else a

    class NoSaturation(TorchFunctionMode):
        """Every conversion into float8_e4m3fn goes through cast_e4m3_without_saturation: a cast (`.to(fp8)`,
        `.type(fp8)`: an fp8 result of the same shape as a wider float input) and a write of wider floats into an
        fp8 tensor (`copy_`, `x[i] = v`, `index_copy_`, `index_put_`, ... in place)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if args and isinstance(args[0], torch.Tensor) and args[0].dtype == fp8 and \
                    (name.endswith("_") and not name.startswith("__") or name == "__setitem__"):
                args = (args[0],) + tuple(narrowed(a) for a in args[1:])
                kwargs = {k: narrowed(v) for k, v in kwargs.items()}
                return func(*args, **kwargs)
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out.dtype == fp8 and args and wide(args[0]) \
                    and out.shape == args[0].shape:
                out = cast_e4m3_without_saturation(args[0].float()).to(out.device)
            return out

    return NoSaturation()


@harness
def call_without_saturation(fn, *args):
    """(A harness: runs in the learner's process.) fn(*args) with every cast into float8_e4m3fn non-saturating,
    so that an fp8 quantizer's missing clamp shows as NaN on every PyTorch version."""
    with _no_saturation_mode():
        return fn(*args)
