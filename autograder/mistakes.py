"""The mistake rule, one for the checks (Trial.expect, the differential drivers) and the interview (Numeric.mistake).

A mistake is a name (read after "your code": "counts only K, not K and V") and the value it gives. A wrong value
names a mistake when it matches that mistake's value and no other's; mistakes that give the same value are named
together, since the value cannot tell them apart; a mistake that gives the right value is never named.

    found = groups(mistakes, same, expected)   # [(names, value)]: the mistakes this case can tell apart
    names = named(got, found, same)            # [] unless got matches exactly one group
    names = name_of(got, mistakes, same, expected)   # the two at once
    looks_like(names)                          # "Looks like your code X; or your code Y."

`same(x, value)` says whether x matches value (the checks: autograder.compare within the case's tolerance; the
interview: within the question's).
"""
from __future__ import annotations

from typing import Any, Callable

_NOTHING = object()


def groups(mistakes: dict[str, Any], same: Callable[[Any, Any], bool], expected: Any = _NOTHING,
           ) -> list[tuple[list[str], Any]]:
    """[(names, value)], in the order the mistakes come: each mistake whose value is not `expected`, joined to
    the first group whose value it matches (a group keeps its first mistake's value)."""
    out: list[tuple[list[str], Any]] = []
    for name, wrong in mistakes.items():
        if expected is not _NOTHING and same(wrong, expected):
            continue  # this mistake makes no difference here
        group = next((g for g in out if same(wrong, g[1])), None)
        if group is None:
            out.append(([name], wrong))
        else:
            group[0].append(name)
    return out


def named(got: Any, found: list[tuple[list[str], Any]], same: Callable[[Any, Any], bool]) -> list[str]:
    """The names of the one group `got` matches; [] when it matches none, or more than one."""
    hits = [names for names, value in found if same(got, value)]
    return hits[0] if len(hits) == 1 else []


def name_of(got: Any, mistakes: dict[str, Any], same: Callable[[Any, Any], bool], expected: Any = _NOTHING,
            ) -> list[str]:
    """named(got, groups(mistakes, same, expected), same)."""
    return named(got, groups(mistakes, same, expected), same)


def looks_like(names: str | list[str], end: str = ".", who: str = "your code") -> str:
    """"Looks like your code X." for a mistake's name; several named together ("X; or your code Y."); `who` for
    another subject ("your pack_kv"), `end` for what closes the sentence."""
    names = [names] if isinstance(names, str) else names
    return f"Looks like {who} " + f"; or {who} ".join(names) + end
