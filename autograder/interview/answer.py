"""Reading a typed answer: a number, maybe with thousands separators and the asked unit.

"12", "12.5 GB", "1,024", "40%", "3.5e9 bytes" are numbers; a unit is accepted only when it is the
one the question asks for (no conversions: saying which unit you mean is part of the answer).
Anything else comes back as a message saying what to type instead.
"""
from __future__ import annotations

import re

_NUMBER = re.compile(r"^\s*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")

# Other spellings of a unit (lower case). A unit also matches itself, case-insensitively, and its plural.
ALIASES = {
    "%": {"percent", "pct"},
    "x": {"×", "times"},
    "FLOP/byte": {"flop/b", "flops/byte", "flops/b", "flop per byte", "flops per byte"},
    "bytes": {"b", "byte"},
    "ms": {"msec", "millisecond", "milliseconds"},
    "tokens": {"tok", "token"},
    "users": {"user", "sequences", "seqs", "sequence"},
    "sequences": {"seqs", "seq", "sequence"},
    "requests": {"request", "reqs", "req"},
    "requests/s": {"req/s", "rps", "requests per second", "request/s"},
    "billion parameters": {"b", "billion", "bn", "b params", "billion params"},
    "million tokens": {"m", "million", "m tokens", "mtok"},
}


def _matches(typed: str, unit: str) -> bool:
    t = typed.strip().lower()
    names = {unit.lower(), *ALIASES.get(unit, set())}
    return t in names or t.rstrip("s") in names or t + "s" in names


def parse(text: str, unit: str) -> tuple[float | None, str | None]:
    """(value, None) for an accepted answer, (None, a message saying what to type) otherwise."""
    if not text.strip():
        return None, f"Type a number ({unit or 'a plain count'}), or 'skip' to see the answer."
    m = _NUMBER.match(text)
    if not m:
        return None, (f"{text.strip()!r} is not a number I can read: type digits such as 12.5, 1,024 or "
                      f"3.5e9{' followed by ' + unit if unit else ''}.")
    value, typed = float(m.group(1).replace(",", "")), m.group(2)
    if "bit" in typed.lower() or re.fullmatch(r"[KMGT]i?b", typed):  # Gb, Mbit: bits, not bytes
        return None, f"{typed!r} reads as bits: this question asks for {unit or 'a plain number'}."
    if not typed or (unit and _matches(typed, unit)):
        return value, None
    wanted = f"in {unit}" if unit else "as a plain number"
    return None, (f"This question asks for the answer {wanted}, not {typed!r}. Type the number "
                  f"{wanted}{' (the unit may follow it)' if unit else ''}.")
