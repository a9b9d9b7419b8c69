"""Reading a typed answer: a number in any usual notation, maybe a unit, converted to the unit the question asks.

The number: 12, 12.5, .5, 1,024, 8,030,000,000, 3.5e9, 3.5E+09, 3.5x10^9. The unit, if any, follows it and
is read in the same way as the question's own unit, so one table (below) says what every unit means:

- bytes: B, bytes, kB/KB, MB, GB, TB, PB (powers of 1,000) and KiB, MiB, GiB, TiB, PiB (powers of 1,024);
  bits: bit(s), Kb, Mb, Gb, Tb, Gbit... (an upper-case prefix with a lower-case b). Bytes and bits are never
  converted into each other: a bits answer to a bytes question is asked again.
- times: ns, us (µs), ms, s, min, h; rates: an amount over a time (GB/s, TB/s, Gb/s, Gbps, tokens/s,
  req/s, rps, "requests per second", req/min).
- counts: an optional multiplier (k = thousand, M = million, B = billion, T = trillion, or the words) and
  an optional noun (parameters, tokens, users...): 8.03B, 8.03 billion, 8030M, 8,030,000,000 params.
- %, x and FLOP/byte are their own units, and so is GPU-h (which also takes h and min).

A unit of the same kind as the question's converts exactly (GiB = 2**30 bytes, GB = 1e9 bytes, 1 ms = 1e-3 s);
a unit of another kind, an ambiguous one ('G': GB or GiB?) or an unreadable one comes back as a message
saying what to type instead, and the question is asked again. A bare number is in the question's unit,
except for a count asked in millions or billions. There a bare number below 1,000 is in the question's
unit (8.03 is 8.03 billion), one of at least a thousandth of that unit is a raw count (8.03e9 and
957,924,864 are parameters; for millions, anything from 1,000 up), and one in between (1,000 to 999,999
for billions) is ambiguous.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction

_NUMBER = re.compile(r"""^\s*[~≈]?\s*
    (?P<num>[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+))
    (?:[eE](?P<e>[-+]?\d+)|\s*[x×*·]\s*10\s*(?:\^|\*\*)\s*(?P<e10>[-+]?\d+))?
    \s*(?P<rest>.*?)\s*$""", re.VERBOSE)
_DECIMAL_COMMA = re.compile(r"^\s*[-+]?\d+,\d{1,2}(?!\d)")
_MAX_EXPONENT = 300


@dataclass(frozen=True)
class Unit:
    """What a unit means: its kind ("bytes", "bits", "time", "count", a rate "bytes/time", "%", "x"...),
    how many base units (bytes, bits, seconds, things) one of it is, the thing counted (counts and count
    rates: "parameters"; None: unsaid), and how to write it."""
    kind: str
    factor: Fraction
    noun: str | None
    name: str


@dataclass(frozen=True)
class Reading:
    """A typed answer as read: value (in the question's unit) and shown ("read as ..."), or problem (a message)."""
    value: float | None
    shown: str | None
    problem: str | None


_POWERS = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
_WORD_PREFIX = {"kilo": (1, False), "mega": (2, False), "giga": (3, False), "tera": (4, False), "peta": (5, False),
                "kibi": (1, True), "mebi": (2, True), "gibi": (3, True), "tebi": (4, True), "pebi": (5, True)}
_TIMES = {**dict.fromkeys(["ns", "nsec", "nanosecond", "nanoseconds"], (Fraction(1, 10**9), "ns")),
          **dict.fromkeys(["us", "usec", "microsecond", "microseconds"], (Fraction(1, 10**6), "µs")),
          **dict.fromkeys(["ms", "msec", "msecs", "millisecond", "milliseconds"], (Fraction(1, 1000), "ms")),
          **dict.fromkeys(["s", "sec", "secs", "second", "seconds"], (Fraction(1), "s")),
          **dict.fromkeys(["min", "mins", "minute", "minutes"], (Fraction(60), "min")),
          **dict.fromkeys(["h", "hr", "hrs", "hour", "hours"], (Fraction(3600), "h"))}
# Count multipliers: single letters are case-sensitive (m is also million: "1.5m tokens"), words are not.
_MULTIPLIERS = {"k": 10**3, "K": 10**3, "M": 10**6, "m": 10**6, "B": 10**9, "b": 10**9, "T": 10**12,
                "thousand": 10**3, "million": 10**6, "millions": 10**6, "mn": 10**6, "mio": 10**6,
                "billion": 10**9, "billions": 10**9, "bn": 10**9, "trillion": 10**12, "trillions": 10**12}
_MULTIPLIER_NAMES = {10**3: "thousand", 10**6: "million", 10**9: "billion", 10**12: "trillion"}
_MULTIPLIER_LETTERS = {10**3: "k", 10**6: "M", 10**9: "B", 10**12: "T"}
# The things a question counts, each spelling to its name; names in one group answer for each other.
_NOUNS = {**dict.fromkeys(["param", "params", "parameter", "parameters"], "parameters"),
          **dict.fromkeys(["tok", "toks", "token", "tokens"], "tokens"),
          **dict.fromkeys(["user", "users"], "users"),
          **dict.fromkeys(["seq", "seqs", "sequence", "sequences"], "sequences"),
          **dict.fromkeys(["conversation", "conversations"], "conversations"),
          **dict.fromkeys(["req", "reqs", "request", "requests", "query", "queries"], "requests"),
          **dict.fromkeys(["step", "steps"], "steps"),
          **dict.fromkeys(["block", "blocks"], "blocks"),
          **dict.fromkeys(["replica", "replicas"], "replicas"),
          **dict.fromkeys(["pair", "pairs"], "pairs"),
          **dict.fromkeys(["batch", "batches"], "batches")}
_SAME_THING = [{"users", "sequences", "conversations"}]
_SPECIAL = {**dict.fromkeys(["%", "percent", "per cent", "pct"], Unit("%", Fraction(1), None, "%")),
            **dict.fromkeys(["x", "×", "times", "fold"], Unit("x", Fraction(1), None, "x")),
            **dict.fromkeys(["flop/byte", "flop/b", "flops/byte", "flops/b", "flop per byte", "flops per byte"],
                            Unit("FLOP/byte", Fraction(1), None, "FLOP/byte")),
            **dict.fromkeys(["gpu-h", "gpu h", "gpuh", "gpu-hour", "gpu-hours", "gpu hour", "gpu hours"],
                            Unit("GPU time", Fraction(3600), None, "GPU-h"))}
_PER_SECOND = {"rps": "requests/s", "qps": "requests/s"}


def _data(word: str) -> list[Unit]:
    """Byte and bit units (several where the spelling allows several)."""
    low = word.lower()
    if low in ("byte", "bytes") or word == "B":
        return [Unit("bytes", Fraction(1), None, "bytes")]
    if low in ("bit", "bits"):
        return [Unit("bits", Fraction(1), None, "bits")]
    if word == "b":
        return [Unit("bytes", Fraction(1), None, "bytes"), Unit("bits", Fraction(1), None, "bits")]
    m = re.fullmatch(r"(kilo|mega|giga|tera|peta|kibi|mebi|gibi|tebi|pebi)(bytes?|bits?)", low)
    if m:
        power, binary = _WORD_PREFIX[m.group(1)]
        return [_prefixed("bytes" if m.group(2).startswith("byte") else "bits", "KMGTP"[power - 1], binary)]
    m = re.fullmatch(r"([kKMGTPmgtp])([iI]?)(B|b|bytes?|bits?)", word)
    if m:
        prefix, binary, tail = m.group(1).upper(), bool(m.group(2)), m.group(3)
        if tail.startswith("bit"):
            return [_prefixed("bits", prefix, binary)]
        if tail == "B" or tail.startswith("byte"):
            return [_prefixed("bytes", prefix, binary)]
        if m.group(1).isupper():
            return [_prefixed("bits", prefix, binary)]  # Gb, Mb, Kb: an upper-case prefix and a lower-case b
        return [_prefixed("bytes", prefix, binary), _prefixed("bits", prefix, binary)]  # gb, kb: either
    if word in ("K", "k", "M", "G", "T"):  # a prefix alone: decimal or binary bytes, or decimal bits
        prefix = word.upper()
        return [_prefixed("bytes", prefix, False), _prefixed("bytes", prefix, True), _prefixed("bits", prefix, False)]
    return []


def _prefixed(kind: str, prefix: str, binary: bool) -> Unit:
    power = _POWERS[prefix]
    factor = Fraction(1024**power if binary else 1000**power)
    name = ("k" if prefix == "K" and not binary else prefix) + ("i" if binary else "") + ("B" if kind == "bytes" else "b")
    return Unit(kind, factor, None, name)


def _counts(word: str) -> list[Unit]:
    """Counts: a multiplier, a noun, or a multiplier then a noun ("8.03B params", "1.5k tokens")."""
    out = []
    for i in range(len(word) + 1):
        mult, noun = word[:i].strip(), word[i:].strip().lower()
        if (mult or noun) and (not mult or mult in _MULTIPLIERS or mult.lower() in _MULTIPLIERS and len(mult) > 1) \
                and (not noun or noun in _NOUNS):
            factor = _MULTIPLIERS.get(mult, _MULTIPLIERS.get(mult.lower(), 1)) if mult else 1
            thing = _NOUNS.get(noun)
            name = " ".join(x for x in (_MULTIPLIER_NAMES.get(factor), thing) if x)
            out.append(Unit("count", Fraction(factor), thing, name))
    return list(dict.fromkeys(out))


def _amount(word: str) -> list[Unit]:
    out = _data(word) + _counts(word)
    if word.lower() in _TIMES:
        factor, name = _TIMES[word.lower()]
        out.append(Unit("time", factor, None, name))
    return out


@functools.lru_cache(maxsize=None)
def units(text: str) -> tuple[Unit, ...]:
    """Every meaning of a unit as written (a typed one or a question's); () if none."""
    text = re.sub(r"\s+", " ", text.strip().replace("μ", "u").replace("µ", "u"))
    if text.lower() in _SPECIAL:
        return (_SPECIAL[text.lower()],)
    text = _PER_SECOND.get(text.lower(), text)
    text = re.sub(r"^(.*[a-zA-Z])ps$", r"\1/s", text) if re.fullmatch(r"[kKMGTP]i?[bB]ps", text) else text
    text = re.sub(r"\s*/\s*|\s+per\s+", "/", text)
    if "/" in text:
        top, _, bottom = text.partition("/")
        times = [u for u in _amount(bottom) if u.kind == "time"]
        tops = _amount(top) if top.strip() else [Unit("count", Fraction(1), None, "")]  # "/s": things per second
        return tuple(Unit(f"{u.kind}/time", u.factor / t.factor, u.noun, f"{u.name}/{t.name}")
                     for u in tops if u.kind in ("bytes", "bits", "count") for t in times)
    return tuple(_amount(text))


@functools.lru_cache(maxsize=None)
def asked(unit: str) -> Unit:
    """What a question's unit means ("" is a plain count). A unit the table does not know matches only itself."""
    if not unit:
        return Unit("count", Fraction(1), None, "")
    found = units(unit)
    kinds = {(u.kind, u.factor, u.noun) for u in found}
    if len(kinds) == 1:
        return Unit(*next(iter(kinds)), unit)
    return Unit(f"unit {unit}", Fraction(1), None, unit)


def _fits(typed: Unit, want: Unit) -> bool:
    if want.kind == "GPU time":
        return typed.kind in ("GPU time", "time")
    if typed.kind != want.kind:
        return False
    if typed.noun is None or want.noun is None:
        return True
    return typed.noun == want.noun or any({typed.noun, want.noun} <= group for group in _SAME_THING)


def _what(u: Unit) -> str:
    """What a unit measures, for a sentence: "bytes", "a time", "a count of users", "bits per second"..."""
    base = u.kind.removesuffix("/time")
    if u.kind.endswith("/time"):
        return {"bytes": "bytes per second", "bits": "bits per second"}.get(base) or f"{u.noun or 'things'} per second"
    if base == "count":
        return f"a count of {u.noun}" if u.noun else "a count"
    return {"bytes": "bytes", "bits": "bits", "time": "a time", "%": "a percentage", "x": "a ratio (x)",
            "FLOP/byte": "FLOP per byte", "GPU time": "GPU time"}.get(base, u.name)


def _wanted(want: Unit) -> str:
    """What the question asks for, for a sentence: "bytes, in GB", "a count of parameters in billions"..."""
    if not want.name:
        return "a plain number"
    if want.kind == "count" and want.factor == 1:
        return _what(want)
    if want.kind == "count":
        return f"{_what(want)} in {_MULTIPLIER_NAMES.get(int(want.factor), want.name)}s"
    what = _what(want)
    return what if what == want.name or want.kind in ("%", "x", "FLOP/byte") else f"{what}, in {want.name}"


def _show(x) -> str:
    """A converted value for the feedback: whole numbers with thousands separators, others to 6 significant digits."""
    x = float(x)
    return f"{int(x):,}" if x.is_integer() and abs(x) < 1e15 else f"{x:.6g}"


def _with_unit(number: str, name: str) -> str:
    return f"{number}{name}" if name in ("%", "x") else f"{number} {name}".rstrip()


def _base(u: Unit) -> str:
    """The unit a factor counts in: bytes, bits, s, bytes/s, parameters..."""
    base = u.kind.removesuffix("/time")
    name = {"bytes": "bytes", "bits": "bits", "time": "s", "GPU time": "GPU-s"}.get(base, u.noun or "")
    return f"{name}/s" if u.kind.endswith("/time") else name


def _problem(message: str) -> Reading:
    return Reading(None, None, message)


DECIMALS = "write decimals with a point (1.5); a comma only separates thousands (1,024)."


def read(text: str, unit: str) -> Reading:
    """The typed answer `text` to a question asked in `unit`, as a Reading."""
    want, text = asked(unit), text.strip()
    in_unit = f" in {unit}" if unit else ""
    if not text:
        return _problem(f"Type a number{in_unit}, or 'skip' to see the answer.")
    m = _NUMBER.match(text)
    if not m:
        return _problem(f"{text!r} is not a number I can read: type digits such as 12.5, 1,024 or 3.5e9"
                        f"{', then the unit if you like (' + unit + ')' if unit else ''}.")
    typed = m.group("rest")
    if _DECIMAL_COMMA.match(text) or re.match(r",\d", typed):
        return _problem(f"{text!r}: {DECIMALS}")
    exponent = int(m.group("e") or m.group("e10") or 0)
    if abs(exponent) > _MAX_EXPONENT:
        return _problem(f"{text!r} is out of range: type a number between 1e-300 and 1e300 in size.")
    number = text[:len(text) - len(typed)].strip()  # as typed, for the feedback
    magnitude = Fraction(m.group("num").replace(",", "")) * Fraction(10) ** exponent
    got = want
    if not typed:
        if want.kind == "count" and want.factor > 1:  # a count in millions or billions: 8.03, or 8.03e9
            letter = _MULTIPLIER_LETTERS.get(int(want.factor), "")
            if abs(magnitude) >= max(1000, want.factor / 1000):
                got = Unit("count", Fraction(1), want.noun, want.noun or "")
            elif abs(magnitude) >= 1000:
                scaled = _show(magnitude / want.factor)
                raw = f"{number} {want.noun}" if want.noun else f"{scaled}{letter}"
                return _problem(f"{number!r} could be {number} {want.noun or ''} ({scaled} {want.name}) or {number} "
                                f"{want.name}: add the unit, as in '{raw}' or '{number}{letter}'.".replace("  ", " "))
    elif want.kind.startswith("unit ") and typed.lower() == unit.lower():
        got = want
    else:
        found = units(typed)
        if not found:
            return _problem(f"{typed!r} is not a unit I can read: type the number{in_unit}"
                            f"{' (the unit may follow it)' if unit else ''}.")
        fits = [u for u in found if _fits(u, want)]
        if not fits:
            kinds = list(dict.fromkeys(_what(u) for u in found))
            bits = (" (an upper-case prefix and a lower-case b, as in Gb or Mb, are bits)"
                    if "bits" in kinds and want.kind == "bytes" else "")
            return _problem(f"{typed!r} reads as {' or '.join(kinds)}{bits}: this question asks for {_wanted(want)}.")
        if len({u.factor for u in fits}) > 1:
            options = " or ".join(dict.fromkeys(f"{u.name} ({_show(u.factor)} {_base(u)})" for u in fits))
            return _problem(f"{typed!r} could mean {options}: type the unit in full.")
        got = fits[0]
        if got.kind == "count" and got.noun is None and want.noun:
            got = Unit(got.kind, got.factor, want.noun, " ".join(x for x in (got.name, want.noun) if x))
    try:
        value = float(magnitude * got.factor / want.factor)
    except OverflowError:
        return _problem(f"{text!r} is out of range for this question.")
    shown = f"read as {_with_unit(number, want.name)}" if got.factor == want.factor else \
        f"read as {_with_unit(number, got.name)} = {_with_unit(_show(value), want.name)}"
    return Reading(value, shown, None)


def parse(text: str, unit: str) -> tuple[float | None, str | None]:
    """(value in the question's unit, None) for an accepted answer, (None, a message saying what to type) otherwise."""
    r = read(text, unit)
    return r.value, r.problem


def hint(unit: str) -> str:
    """What a bare number means, where that needs saying (counts in millions or billions); "" elsewhere."""
    want = asked(unit)
    letter = _MULTIPLIER_LETTERS.get(int(want.factor)) if want.kind == "count" and want.factor > 1 else None
    if not letter:
        return ""
    return f"7, 7{letter} and 7e{len(str(int(want.factor))) - 1} all read as 7 {want.name}"
