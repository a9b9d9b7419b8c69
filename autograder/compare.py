"""Comparisons that explain themselves: shape, then dtype, then values.

Every function returns None when the values agree and otherwise a message
that says what differs and where, in the learner's terms.
"""
from __future__ import annotations

import math
import numbers
import sys

# (rtol, atol) per dtype (by name: torch is imported only by a lesson that has tensors). fp32 is loose enough
# for a different summation order (Triton's interpreter, a blocked online softmax) but tight enough that a
# missing 1/sqrt(d) scale or a dropped term is far outside it.
TOLERANCES = {
    "torch.float64": (1e-7, 1e-9),
    "torch.float32": (1e-4, 1e-5),
    "torch.float16": (1e-3, 1e-3),
    "torch.bfloat16": (1.6e-2, 1e-2),
}
FP8_TOLERANCE = (1.25e-1, 1e-1)


def _is_tensor(x) -> bool:
    """isinstance(x, torch.Tensor), without importing torch: where it is not imported, nothing is a tensor."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def tolerance_for(dtype) -> tuple[float, float]:
    if str(dtype) in TOLERANCES:
        return TOLERANCES[str(dtype)]
    if "float8" in str(dtype):
        return FP8_TOLERANCE
    return (0.0, 0.0)  # integer and bool tensors compare exactly


def key_types(d: dict) -> str | None:
    """None when every key of `d` is a str; else the types of its keys and one that is not a str, for a
    message: "int and str (e.g. 50)". Check before sorting or string-matching a learner's keys."""
    if all(isinstance(k, str) for k in d):
        return None
    odd = next(k for k in d if not isinstance(k, str))
    return f"{' and '.join(sorted({type(k).__name__ for k in d}))} (e.g. {repr(odd)[:40]})"


def describe(x) -> str:
    """A short description of a value's type, for 'expected X, got Y' messages."""
    if _is_tensor(x):
        return f"Tensor(shape={tuple(x.shape)}, dtype={x.dtype}, device={x.device.type})"
    if x is None:
        return "None"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__} of length {len(x)}"
    return type(x).__name__


def fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.6g}"
    if _is_tensor(x) and x.numel() == 1:
        return fmt(x.item())
    return repr(x)


def is_number(x) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


def compare_number(got, expected, rtol: float = 1e-9, atol: float = 0.0) -> str | None:
    if _is_tensor(got) and got.numel() == 1:
        got = got.item()
    if hasattr(got, "item") and not isinstance(got, numbers.Number):  # numpy scalars
        try:
            got = got.item()
        except (TypeError, ValueError):
            pass
    if not is_number(got):
        return f"expected a number, got {describe(got)} ({fmt(got)[:80]})"
    if isinstance(got, complex):
        return f"expected a real number, got the complex number {got}"
    if isinstance(expected, float) and math.isnan(expected):  # as for tensors: only a NaN matches a NaN
        return None if math.isnan(got) else f"got {fmt(got)}, expected NaN"
    if math.isnan(got):
        return "got NaN"
    if math.isinf(expected) or math.isinf(got):
        return None if got == expected else f"got {fmt(got)}, expected {fmt(expected)}"
    if abs(got - expected) <= atol + rtol * abs(expected):
        return None
    if fmt(got) == fmt(expected):  # equal to 6 digits: show all of them, and by how much they differ
        return f"got {got!r}, expected {expected!r} (they differ by {abs(got - expected):.3g})"
    return f"got {fmt(got)}, expected {fmt(expected)}"


def _first_bad_index(bad) -> tuple[int, ...]:
    """The index of the first True in `bad`, in row-major order. (Unravelled by hand: torch.unravel_index
    imports torch's symbolic-shape machinery and sympy on first use, half a second in a fresh grader.)"""
    import torch
    flat = int(torch.nonzero(bad.flatten())[0])
    index = []
    for size in reversed(bad.shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def compare_tensor(got, expected, rtol: float | None = None,
                   atol: float | None = None, check_dtype: bool = True) -> str | None:
    import torch
    if not isinstance(got, torch.Tensor):
        return f"expected a torch.Tensor, got {describe(got)}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if check_dtype and got.dtype != expected.dtype:
        return f"dtype {got.dtype}, expected {expected.dtype}"
    d_rtol, d_atol = tolerance_for(expected.dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    if got.numel() == 0:
        return None
    g = got.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    nan_got, nan_exp = torch.isnan(g), torch.isnan(e)
    if (nan_got & ~nan_exp).any():
        idx = _first_bad_index(nan_got & ~nan_exp)
        return f"NaN at index {idx} (expected {fmt(e[idx].item())}); {int((nan_got & ~nan_exp).sum())} NaNs in all"
    diff = (g - e).abs()
    diff = torch.where(nan_got & nan_exp, torch.zeros_like(diff), diff)
    bad = (diff > atol + rtol * e.abs()) | (nan_exp & ~nan_got)  # NaN compares False: an expected NaN needs one
    if not bad.any():
        return None
    idx = _first_bad_index(bad)
    rel = diff / e.abs().clamp_min(1e-12)
    return (f"{int(bad.sum())} of {bad.numel()} values differ; first at index {idx}: "
            f"yours {fmt(g[idx].item())} vs expected {fmt(e[idx].item())}; "
            f"max abs error {diff.max().item():.3g}, max rel error {rel[bad].max().item():.3g} "
            f"(tolerance rtol={rtol:g}, atol={atol:g})")


def _identical(got, expected) -> bool:
    """A fast yes for a large container that matches exactly: equal reprs of plain data mean the same values of
    the same types (bool vs int and 1 vs 1.0 included), which compare() would pass at any tolerance. Containers
    whose repr may be truncated or inexact (tensors, arrays) and NaNs (which compare() treats specially) take
    the slow path, as does any difference."""
    if type(got) is not type(expected) or not isinstance(expected, (list, tuple, dict)) or len(expected) < 32:
        return False
    try:
        r = repr(expected)
        return not any(w in r for w in ("nan", "tensor", "array", "...")) and repr(got) == r
    except Exception:  # noqa: BLE001 (a repr that fails: compare element by element)
        return False


def compare(got, expected, rtol: float | None = None, atol: float | None = None,
            check_dtype: bool = True) -> str | None:
    """Compare any supported value: tensors, numbers, and (nested) lists/tuples/dicts of them."""
    if _identical(got, expected):
        return None
    if _is_tensor(expected):
        return compare_tensor(got, expected, rtol, atol, check_dtype)
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return None if got == expected and type(got) is type(expected) else \
            f"got {fmt(got)[:80]}, expected {fmt(expected)}"
    if is_number(expected):
        exact = isinstance(expected, numbers.Integral)
        return compare_number(got, expected, rtol=(0.0 if exact and rtol is None else (rtol or 1e-9)),
                              atol=(atol or 0.0))
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"expected a dict, got {describe(got)}"
        missing = [k for k in expected if k not in got]
        if missing:
            return f"missing key(s) {missing[:5]}"
        for k in expected:
            msg = compare(got[k], expected[k], rtol, atol, check_dtype)
            if msg:
                return f"[{k!r}]: {msg}"
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"expected a {type(expected).__name__}, got {describe(got)}"
        if len(got) != len(expected):
            return f"length {len(got)}, expected {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            msg = compare(g, e, rtol, atol, check_dtype)
            if msg:
                return f"[{i}]: {msg}"
        return None
    return None if got == expected else f"got {fmt(got)[:80]}, expected {fmt(expected)[:80]}"
