"""Where expected values come from: the solutions, or (in a student's copy) values stored at release.

An instructor's copy grades against `solutions.<stem>` directly. A student's copy has
no solutions, so `course release` runs every check's visible cases once against the
solutions through a `Recorder`, which stores the result of every `t.ref` call (and of
every `t.reference(fn, ...)`), keyed by what was asked: the function's name and its
arguments, or, for an object the reference returned (a reference KV cache), the
object's key and the calls made on it so far. In the student's copy a `Replayer`
answers the same questions from that store, so the same check code grades the
visible cases there. A question the store cannot answer (the check asked something
only a wrong answer leads to) makes that case "graded by your instructor", never passed.

The store is data (`autograder/visible/<stem>.bin`, in `autograder.wire`'s format),
not code.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
from pathlib import Path

from . import wire

STORE_DIR = Path(__file__).resolve().parent / "visible"
RELEASE_SEED = 20240101


class NotRecorded(Exception):
    """The store holds no answer for this question (a student's copy grades visible cases only)."""


def _key(*parts) -> str:
    def on_object(x):
        if isinstance(x, (_RecObject, _ReplayObject)):
            return {"ref-object": x._key}
        raise wire.WireError(f"{type(x).__name__} cannot be part of a recorded question")
    return hashlib.sha256(wire.encode(list(parts), on_object=on_object)).hexdigest()[:32]


def _unwrap(x):
    if isinstance(x, _RecObject):
        return x._obj
    if type(x) is list:
        return [_unwrap(v) for v in x]
    if type(x) is tuple:
        return tuple(_unwrap(v) for v in x)
    if type(x) is dict:
        return {k: _unwrap(v) for k, v in x.items()}
    return x


# -- recording (release time, with the solutions) ------------------------------------------------------

class Recorder:
    """Wraps the solutions module; every answer it gives is stored in `entries`."""

    def __init__(self, module):
        self._module = module
        self.entries: dict[str, object] = {}

    def _store(self, key: str, value):
        try:
            wire.encode(value)
        except wire.WireError:
            obj = _RecObject(self, value, key)
            self.entries[key] = {"$object": key}
            return obj
        self.entries[key] = value
        return wire.decode(wire.encode(value))  # what a student's copy will get back, exactly

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if callable(value):
            return _RecCallable(self, value, ("fn", name))
        return self._store(_key("attr", name), value)

    def _course_reference(self, fn, args, kwargs):
        key = _key("reference", f"{fn.__module__}:{fn.__qualname__}", list(args), dict(kwargs))
        return self._store(key, fn(self._module, *args, **kwargs))


class _RecCallable:
    def __init__(self, rec: Recorder, fn, path: tuple, owner=None):
        self._rec, self._fn, self._path, self._owner = rec, fn, path, owner

    def __call__(self, *args, **kwargs):
        if self._owner is not None:
            key = self._owner._next_key(self._path, args, kwargs)
        else:
            key = _key("call", self._path, list(args), dict(kwargs))
        value = self._fn(*_unwrap(list(args)), **_unwrap(dict(kwargs)))
        return self._rec._store(key, value)


class _RecObject:
    """A reference object (a reference KV cache): its calls are keyed by the calls before them."""

    def __init__(self, rec: Recorder, obj, key: str):
        self._rec, self._obj, self._key, self._n = rec, obj, key, 0

    def _next_key(self, path, args, kwargs) -> str:
        self._n += 1
        return _key("method", self._key, self._n, path, list(args), dict(kwargs))

    def __getattr__(self, name):
        value = getattr(self._obj, name)
        if callable(value):
            return _RecCallable(self._rec, value, ("method", name), owner=self)
        return self._rec._store(self._next_key(("attr", name), [], {}), value)


# -- replaying (a student's copy) -------------------------------------------------------------------------

class Replayer:
    """Answers `t.ref` questions from a release's store."""

    def __init__(self, entries: dict, stem: str = ""):
        self._entries, self._stem = entries, stem

    def _answer(self, key: str, what: str):
        if key not in self._entries:
            raise NotRecorded(what)
        value = self._entries[key]
        if type(value) is dict and set(value) == {"$object"}:
            return _ReplayObject(self, value["$object"])
        return value

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        key = _key("attr", name)
        if key in self._entries:
            return self._answer(key, name)
        return _ReplayCallable(self, ("fn", name))

    def _course_reference(self, fn, args, kwargs):
        key = _key("reference", f"{fn.__module__}:{fn.__qualname__}", list(args), dict(kwargs))
        return self._answer(key, fn.__qualname__)


class _ReplayCallable:
    def __init__(self, rep: Replayer, path: tuple, owner=None):
        self._rep, self._path, self._owner = rep, path, owner

    def __call__(self, *args, **kwargs):
        if self._owner is not None:
            key = self._owner._next_key(self._path, args, kwargs)
        else:
            key = _key("call", self._path, list(args), dict(kwargs))
        return self._rep._answer(key, self._path[-1])


class _ReplayObject:
    def __init__(self, rep: Replayer, key: str):
        self._rep, self._key, self._n = rep, key, 0

    def _next_key(self, path, args, kwargs) -> str:
        self._n += 1
        return _key("method", self._key, self._n, path, list(args), dict(kwargs))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        attr_key = _key("method", self._key, self._n + 1, ("attr", name), [], {})
        if attr_key in self._rep._entries:
            self._n += 1
            return self._rep._answer(attr_key, name)
        return _ReplayCallable(self._rep, ("method", name), owner=self)


# -- the store --------------------------------------------------------------------------------------------

def store_path(stem: str) -> Path:
    return STORE_DIR / f"{stem}.bin"


def save(stem: str, entries: dict, seed: int, directory: Path | None = None) -> Path:
    path = (directory or STORE_DIR) / f"{stem}.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(wire.encode({"stem": stem, "seed": seed, "entries": entries}))
    return path


def load_store(stem: str) -> tuple[dict, int]:
    data = wire.decode(store_path(stem).read_bytes())
    return data["entries"], int(data["seed"])


def solutions_available() -> bool:
    return importlib.util.find_spec("solutions") is not None


def for_lesson(stem: str):
    """(ref, visible_only, forced seed or None): the solutions when present, else the release's store."""
    if solutions_available():
        return importlib.import_module(f"solutions.{stem}"), False, None
    if not store_path(stem).exists():
        raise FileNotFoundError(f"this copy of the course has neither solutions/ nor the stored visible "
                                f"cases of {stem} ({store_path(stem)})")
    entries, seed = load_store(stem)
    return Replayer(entries, stem), True, seed
