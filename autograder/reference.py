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

The grader's own code that computes a lesson's answers (a mistake's value, a
reference computation) is marked `@answer_code`. While a Recorder or a Replayer
grades, a call to such a function is a question like `t.ref`'s: recorded at release,
answered from the store in the copy. The release strips those functions' bodies
(`strip_answer_code`), so a student's copy holds their names and docstrings, not
the code that would compute an answer.

The store is data (`autograder/visible/<stem>.bin`, in `autograder.wire`'s format),
not code.
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import functools
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


# -- the grader's answer code -------------------------------------------------------------------------

_CHANNEL: contextvars.ContextVar = contextvars.ContextVar("answer_channel", default=None)
ANSWER_CODE = "answer_code"


def answer_code(fn):
    """Marks a grader function that computes a lesson's answer or a mistake's value. Graded against the
    solutions it runs as written; while a release records, its result is stored (keyed by its name and
    arguments, which must be plain data), and in a student's copy, where its body is stripped, the result
    is read from the store. What it calls runs as written (one question, not one per inner call)."""
    @functools.wraps(fn)
    def answered(*args, **kwargs):
        channel = _CHANNEL.get()
        if channel is None:
            return fn(*args, **kwargs)
        token = _CHANNEL.set(None)
        try:
            return channel._answer_code(fn, args, kwargs)
        finally:
            _CHANNEL.reset(token)
    answered.__answer_code__ = True
    return answered


@contextlib.contextmanager
def answering(ref):
    """Within it, `@answer_code` calls are recorded (ref a Recorder) or replayed (a Replayer)."""
    channel = ref if isinstance(ref, (Recorder, Replayer)) else None
    token = _CHANNEL.set(channel)
    try:
        yield
    finally:
        _CHANNEL.reset(token)


def recording(ref) -> bool:
    """True while a release records the visible cases (`ref` is a Recorder grading the solutions). A check whose
    answer code runs only for a wrong answer (an engine run per wrong policy, say) makes every such call up front
    when this is true, so that a student's copy can name the mistake from its store."""
    return isinstance(ref, Recorder)


def _answer_key(fn, args, kwargs) -> str:
    return _key("answer", f"{fn.__module__}:{fn.__qualname__}", list(args), dict(kwargs))


class AnswerStripped(NotRecorded):
    """An `@answer_code` function called in a student's copy for a question the store does not hold."""


def strip_answer_code(source: str) -> str:
    """`source` with the body of every function decorated `@answer_code` (by that name, or as an attribute)
    replaced by its docstring and a `raise AnswerStripped(...)`: what a release ships."""
    tree = ast.parse(source)
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                (isinstance(d, ast.Name) and d.id == ANSWER_CODE)
                or (isinstance(d, ast.Attribute) and d.attr == ANSWER_CODE) for d in node.decorator_list):
            body = node.body
            doc = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str) else None
            first = body[1] if doc is not None and len(body) > 1 else (None if doc is not None else body[0])
            if first is None:
                continue
            spans.append((first.lineno, first.col_offset, node.end_lineno, node.name))
    lines = source.splitlines(keepends=True)
    spans = [s for s in spans if not any(o is not s and o[0] <= s[0] and s[2] <= o[2] for o in spans)]
    for start, col, end, name in sorted(spans, reverse=True):
        indent = " " * col
        lines[start - 1:end] = [f"{indent}from autograder.reference import AnswerStripped\n",
                                f"{indent}raise AnswerStripped({name!r})  # not in a student's copy\n"]
    out = "".join(lines)
    ast.parse(out)
    return out


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

    def _answer_code(self, fn, args, kwargs):
        return self._store(_answer_key(fn, args, kwargs), fn(*args, **kwargs))


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

    def _answer_code(self, fn, args, kwargs):
        return self._answer(_answer_key(fn, args, kwargs), fn.__qualname__)


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


def save(stem: str, entries: dict, seed: int, directory: Path | None = None, engine: dict | None = None) -> Path:
    """`engine`: what of the engine the lesson's stub imports (scan.EngineUse.to_dict()), recorded so that a
    copy's grading allows that and no more, whatever its exercise file imports."""
    path = (directory or STORE_DIR) / f"{stem}.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(wire.encode({"stem": stem, "seed": seed, "entries": entries, "engine": engine or {}}))
    return path


def stored_engine_use(stem: str) -> dict | None:
    """What the release recorded of the engine the lesson's stub imports; None without a store."""
    if not store_path(stem).exists():
        return None
    return dict(wire.decode(store_path(stem).read_bytes()).get("engine") or {})


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
