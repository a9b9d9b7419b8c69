"""Plain data across the trust boundary, without pickle.

Whatever learner code returns travels from its process to the grader as JSON
plus raw tensor bytes, and is rebuilt on the grader's side from exact builtin
types only: an `int` subclass whose `__eq__` lies arrives as a plain `int`, a
tensor subclass as a plain `torch.Tensor`, and nothing in a message can run
code when it is decoded (which a pickle can).

A message is: 8-byte header length, a JSON header, then the tensors' bytes.

    encode(value) -> bytes          decode(bytes) -> value

Supported: None, bool, int, float (NaN and infinities too), str, bytes, list,
tuple, dict (any supported hashable keys), torch.Tensor (any dtype, bf16 and
fp8 included, device recorded), torch dtypes and devices, numpy arrays and scalars, NamedTuples (rebuilt
as namedtuples of the same name and fields), dataclass instances (sent as `Record`s), and references to objects
that stay on the other side (`Handle`, `LearnerRef`, see `autograder.sandbox`).
Anything else is refused with `WireError` unless `on_object` maps it to a handle.
"""
from __future__ import annotations

import dataclasses
import json
import math
import struct
import sys
import time
from typing import Any, Callable

# A message's data, either way. Every check's largest message is about 2 MiB (measured over a whole
# `course grade --solutions`): 64 MiB leaves room to spare, and bounds what a reply costs the grader to read
# (a 64 MiB header of small tuples decodes in seconds; one of 1 GiB took minutes and gigabytes).
MAX_MESSAGE = 64 << 20
_MAX_DEPTH = 64


class WireError(ValueError):
    """A value that cannot cross the boundary, or a message that is not well-formed."""


@dataclasses.dataclass(frozen=True)
class Record:
    """A dataclass instance that crossed the boundary: its class name and its fields, as data.

    Attribute access reads the fields (`r.time_s`); two records are equal when their class
    names and fields are. Built from exact types only, so it cannot lie.
    """
    cls: str
    fields: dict

    def __getattr__(self, name):
        fields = object.__getattribute__(self, "fields")
        if name in fields:
            return fields[name]
        raise AttributeError(f"{object.__getattribute__(self, 'cls')} has no field {name!r}")

    def __hash__(self):
        return hash((self.cls, tuple(self.fields)))


@dataclasses.dataclass(frozen=True)
class Handle:
    """An object that lives in the learner's process (a policy, an allocator): an id and a type name."""
    id: int
    type: str
    callable: bool = False


@dataclasses.dataclass(frozen=True)
class MethodRef:
    """A bound method of a handle's object: `handle.attr`."""
    handle: int
    attr: str


@dataclasses.dataclass(frozen=True)
class LearnerRef:
    """A top-level name of the learner's module (a function or a class), resolved on the learner side."""
    name: str


_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
                "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
_DTYPE_CACHE: dict = {}


def _dtypes() -> dict:
    """{"torch.float32": torch.float32, ...}: the dtypes a tensor may have (fp8 where this torch has it). torch is
    imported here, on first use: a lesson that sends no tensors never imports it (1-2 s of a fresh grader)."""
    if not _DTYPE_CACHE:
        import torch
        for name in _DTYPE_NAMES:
            if hasattr(torch, name):
                _DTYPE_CACHE[str(getattr(torch, name))] = getattr(torch, name)
    return _DTYPE_CACHE


def _float(x: float):
    if math.isfinite(x):
        return x
    return {"$t": "float", "v": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}


_SCALARS = frozenset((int, str, bool, type(None)))  # exact types that are their own JSON
_JSON_SCALARS = frozenset((int, float, str, bool, type(None)))


def _scalars(x):
    """The JSON form of an exact list or tuple whose items all have exact scalar types, else None: the common
    case (token ids, times, rows of numbers) encoded in one pass, without a call per item."""
    out = []
    for v in x:
        tv = type(v)
        if tv in _SCALARS:
            out.append(v)
        elif tv is float:
            out.append(v if v - v == 0.0 else _float(v))  # v - v is nan for nan and the infinities
        else:
            return None
    return out


def _rows(x: list):
    """The JSON form of an exact list of two or more items of one exact type, a tuple or one NamedTuple class, each
    holding only exact scalars (a list of jobs, of (time, count) samples), else None: one header for the list
    instead of one per item. A NamedTuple's values are read through tuple's own iterator, never its class's."""
    if len(x) < 2:
        return None
    cls = type(x[0])
    named = cls is not tuple
    if named and not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
        return None
    rows = []
    for item in x:
        if type(item) is not cls:
            return None
        row = _scalars(tuple.__iter__(item))
        if row is None:
            return None
        rows.append(row)
    if not named:
        return {"$t": "tuples", "v": rows}
    return {"$t": "namedtuples", "cls": cls.__name__, "fields": [str(f) for f in cls._fields], "v": rows}


_NOT_MINE = object()  # an _Encoder kind's answer for a value of another kind


class _Encoder:
    def __init__(self, on_object: Callable[[Any], Any] | None):
        self.blobs: list[bytes] = []
        self.size = 0
        self.on_object = on_object

    def blob(self, data: bytes) -> dict:
        self.size += len(data)
        if self.size > MAX_MESSAGE:
            raise WireError(f"more than {MAX_MESSAGE >> 20} MiB of data")
        self.blobs.append(data)
        return {"i": len(self.blobs) - 1, "n": len(data)}

    def enc(self, x, depth: int = 0):
        if depth > _MAX_DEPTH:
            raise WireError("nested too deeply (a cycle?)")
        d = depth + 1
        # bool before int (bool is an int); exact-type tests first: subclasses are rebuilt below.
        tx = type(x)
        if tx in _SCALARS:
            return x
        if tx is float:
            return _float(x)
        if tx is list or tx is tuple:
            plain = _scalars(x)
            if plain is not None:
                return plain if tx is list else {"$t": "tuple", "v": plain}
            rows = _rows(x) if tx is list else None
            if rows is not None:
                return rows
        for kind in (self._scalar, self._special, self._container):
            out = kind(x, d)
            if out is not _NOT_MINE:
                return out
        if self.on_object is not None:
            return self.enc(self.on_object(x), d)
        raise WireError(f"a {type(x).__name__} cannot be sent as data")

    def _scalar(self, x, d):
        """A bool, int, float, str, bytes or complex, or a subclass of one (sent as the builtin)."""
        if isinstance(x, bool):
            return bool(x)
        if isinstance(x, int):
            return int.__index__(x) if type(x) is not int else x
        if isinstance(x, float):
            return _float(float.__float__(x))
        if isinstance(x, str):
            return str.__str__(x)
        if isinstance(x, (bytes, bytearray)):
            return {"$t": "bytes", **self.blob(bytes(x))}
        if isinstance(x, complex):
            return {"$t": "complex", "re": _float(x.real), "im": _float(x.imag)}
        return _NOT_MINE

    def _special(self, x, d):
        """A tensor, dtype or device (when torch is imported), a reference, a Record, a numpy scalar or array."""
        torch = sys.modules.get("torch")  # (not imported: nothing here can be a tensor)
        if torch is not None:
            if isinstance(x, torch.Tensor):
                return self.tensor(x)
            if isinstance(x, torch.dtype):
                return {"$t": "dtype", "v": str(x)}
            if isinstance(x, torch.device):
                return {"$t": "device", "v": str(x)}
        if isinstance(x, (Handle, MethodRef, LearnerRef)):
            return {"$t": type(x).__name__, **dataclasses.asdict(x)}
        if isinstance(x, Record):
            return {"$t": "record", "cls": x.cls, "fields": self.enc(dict(x.fields), d)}
        np = _numpy()
        if np is not None and isinstance(x, np.generic):
            return self.enc(x.item(), d)
        if np is not None and isinstance(x, np.ndarray):
            if x.dtype == object:
                return self.enc(x.tolist(), d)
            return {"$t": "ndarray", "dtype": x.dtype.str, "shape": list(x.shape),
                    **self.blob(np.ascontiguousarray(x).tobytes())}
        return _NOT_MINE

    def _container(self, x, d):
        """A NamedTuple, tuple, list, dict, set or dataclass instance (or a subclass of one), item by item."""
        if isinstance(x, tuple) and hasattr(type(x), "_fields"):  # a NamedTuple: its values
            plain = _scalars(tuple.__iter__(x))
            return {"$t": "namedtuple", "cls": type(x).__name__, "fields": [str(f) for f in type(x)._fields],
                    "v": plain if plain is not None else [self.enc(v, d) for v in tuple.__iter__(x)]}
        if isinstance(x, tuple):
            return {"$t": "tuple", "v": [self.enc(v, d) for v in tuple.__iter__(x)]}
        if isinstance(x, list):
            return [self.enc(v, d) for v in list.__iter__(x)]
        if isinstance(x, dict):
            return {"$t": "dict", "v": [[self.enc(k, d), self.enc(v, d)] for k, v in dict.items(x)]}
        if isinstance(x, (set, frozenset)):
            return {"$t": "set", "v": [self.enc(v, d) for v in x]}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            fields = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
            return {"$t": "record", "cls": type(x).__name__, "fields": self.enc(fields, d)}
        return _NOT_MINE

    def tensor(self, x) -> dict:
        import torch
        t = torch.Tensor.detach(x)
        dtype = str(t.dtype)
        if dtype not in _dtypes():
            raise WireError(f"tensors of dtype {dtype} are not supported")
        device = t.device.type
        t = t.to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8) if t.numel() and t.dtype != torch.bool else t.reshape(-1)
        data = raw.numpy().tobytes() if t.numel() else b""
        return {"$t": "tensor", "dtype": dtype, "shape": list(t.shape), "device": device, **self.blob(data)}


def _numpy():
    try:
        import numpy
        return numpy
    except ImportError:  # pragma: no cover - numpy is a dependency
        return None


def encode(value, on_object: Callable[[Any], Any] | None = None) -> bytes:
    """Serialise `value` as a message. `on_object(x)` may turn an unsupported object into a Handle."""
    e = _Encoder(on_object)
    header = json.dumps(e.enc(value), allow_nan=False, separators=(",", ":")).encode()
    return struct.pack("<Q", len(header)) + header + b"".join(e.blobs)


class _Decoder:
    def __init__(self, blobs: list[bytes], device_map: Callable[[str], str] | None,
                 resolve: Callable[[Any], Any] | None, rebuild: Callable[[str, str, Any], Any] | None,
                 deadline: float | None = None):
        self.blobs, self.device_map, self.resolve, self.rebuild = blobs, device_map, resolve, rebuild
        self.deadline = deadline

    def hashed(self, pairs, make):
        """A set or dict built item by item, within the deadline: keys chosen to collide (every one hashing alike)
        make each insert slower than the last, and 80,000 of them took a minute."""
        out = make()
        add = out.add if isinstance(out, set) else (lambda kv: out.__setitem__(*kv))
        for i, item in enumerate(pairs):
            if self.deadline is not None and i % 256 == 255 and time.monotonic() > self.deadline:
                raise WireError("the value took too long to read (a set or dict whose keys all hash alike?)")
            add(item)
        return out

    def items(self, v) -> list:
        """A JSON array's items, decoded (an array of scalars as it is: JSON's own types are exact builtins)."""
        if type(v) is not list:
            raise WireError("malformed message")
        return v if all(type(i) in _JSON_SCALARS for i in v) else [self.dec(i) for i in v]

    def named(self, header: dict, values) -> Any:
        """One NamedTuple of the class `header` names ("cls", "fields"), from a JSON array of its values."""
        values = tuple(self.items(values))
        if self.rebuild:
            return self.rebuild("namedtuple", str(header["cls"]), values)
        return _namedtuple(str(header["cls"]), tuple(str(f) for f in header.get("fields", ())), values)

    @staticmethod
    def rows(v) -> list:
        if type(v) is not list:
            raise WireError("malformed message")
        return v

    def dec(self, x):
        tx = type(x)
        if tx in _JSON_SCALARS:
            return x
        if tx is list:
            return self.items(x)
        if type(x) is not dict or "$t" not in x:
            raise WireError("malformed message")
        tag = x["$t"]
        rule = _DECODE.get(tag) if type(tag) is str else None
        if rule is None:
            raise WireError(f"unknown tag {tag!r}")
        return rule(self, x)

    def _dtype(self, x):
        if x["v"] not in _dtypes():
            raise WireError(f"unknown dtype {x['v']!r}")
        return _dtypes()[x["v"]]

    @staticmethod
    def _device(x):
        import torch
        return torch.device(str(x["v"]))

    def _ndarray(self, x):
        np = _numpy()
        arr = np.frombuffer(self.blobs[x["i"]], dtype=np.dtype(str(x["dtype"]))).copy()
        return arr.reshape([int(s) for s in x["shape"]])

    def _record(self, x):
        fields = self.dec(x["fields"])
        if type(fields) is not dict:
            raise WireError("malformed record")
        if self.rebuild:
            return self.rebuild("record", str(x["cls"]), fields)
        return Record(str(x["cls"]), fields)

    def _ref(self, x):
        tag = x["$t"]
        cls = {"Handle": Handle, "MethodRef": MethodRef, "LearnerRef": LearnerRef}[tag]
        obj = cls(**{f.name: x[f.name] for f in dataclasses.fields(cls)})
        if tag == "Handle":  # (a type name the learner chose is echoed in later requests: keep it short)
            obj = Handle(obj.id, str(obj.type)[:200], obj.callable)
        return self.resolve(obj) if self.resolve else obj

    def tensor(self, x: dict):
        import torch
        dtype = _dtypes().get(x["dtype"])
        if dtype is None:
            raise WireError(f"unknown dtype {x['dtype']!r}")
        shape = [int(s) for s in x["shape"]]
        if any(s < 0 for s in shape):
            raise WireError("negative tensor dimension")
        data = self.blobs[x["i"]]
        n = math.prod(shape)
        size = torch.empty((), dtype=dtype).element_size()
        if len(data) != n * size:
            raise WireError(f"tensor of shape {shape} and dtype {dtype} with {len(data)} bytes")
        if n == 0:
            t = torch.empty(shape, dtype=dtype)
        elif dtype == torch.bool:
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.bool).reshape(shape)
        else:
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
        device = self.device_map(x.get("device", "cpu")) if self.device_map else "cpu"
        return t if device == "cpu" else t.to(device)


# _Decoder.dec's rule for each tagged value ({"$t": tag, ...}), by tag
_DECODE = {
    "float": lambda d, x: {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[x["v"]],
    "complex": lambda d, x: complex(d.dec(x["re"]), d.dec(x["im"])),
    "namedtuple": lambda d, x: d.named(x, x["v"]),
    "tuple": lambda d, x: tuple(d.items(x["v"])),
    "tuples": lambda d, x: [tuple(d.items(row)) for row in d.rows(x["v"])],
    "namedtuples": lambda d, x: [d.named(x, row) for row in d.rows(x["v"])],
    "set": lambda d, x: d.hashed((d.dec(v) for v in x["v"]), set),
    "dict": lambda d, x: d.hashed(((d.dec(k), d.dec(v)) for k, v in x["v"]), dict),
    "bytes": lambda d, x: d.blobs[x["i"]],
    "tensor": lambda d, x: d.tensor(x),
    "dtype": _Decoder._dtype,
    "device": lambda d, x: _Decoder._device(x),
    "ndarray": _Decoder._ndarray,
    "record": _Decoder._record,
    "Handle": _Decoder._ref, "MethodRef": _Decoder._ref, "LearnerRef": _Decoder._ref,
}


_NAMEDTUPLES: dict = {}


def _namedtuple(cls: str, fields: tuple, values: tuple):
    """A NamedTuple rebuilt as a class of our own with the same name and fields (no learner methods)."""
    import collections
    if len(fields) != len(values):
        return values
    key = (cls, fields)
    if key not in _NAMEDTUPLES:
        try:
            _NAMEDTUPLES[key] = collections.namedtuple(cls if cls.isidentifier() else "Tuple", fields)
        except (ValueError, TypeError):
            return values
    return _NAMEDTUPLES[key](*values)


def decode(message: bytes, device_map: Callable[[str], str] | None = None,
           resolve: Callable[[Any], Any] | None = None, rebuild: Callable[[str, str, Any], Any] | None = None,
           deadline: float | None = None):
    """Rebuild a value from `encode`'s bytes using exact builtin types, torch tensors and Records.

    `device_map(device)` says where a tensor goes (default: CPU); `resolve(ref)` turns Handles,
    MethodRefs and LearnerRefs into objects, and `rebuild(kind, class_name, values)` NamedTuples and
    Records into the learner module's own classes (the learner's side uses both). Past `deadline`
    (time.monotonic()) a set or dict being built raises WireError.
    """
    if len(message) < 8:
        raise WireError("truncated message")
    (n,) = struct.unpack("<Q", message[:8])
    if n > len(message) - 8:
        raise WireError("truncated message")
    try:
        header = json.loads(message[8:8 + n])
    except (ValueError, UnicodeDecodeError) as e:
        raise WireError(f"malformed message: {e}") from None
    blobs, pos = [], 8 + n
    _collect(header, blobs_spec := [])
    for i, size in sorted(blobs_spec):
        if i != len(blobs):
            raise WireError("malformed blob table")
        blobs.append(message[pos:pos + size])
        pos += size
    if pos != len(message):
        raise WireError("message length does not match its blobs")
    return _Decoder(blobs, device_map, resolve, rebuild, deadline).dec(header)


def _collect(x, out: list):
    """The (index, size) of every blob a header refers to."""
    if type(x) is list:
        for v in x:
            _collect(v, out)
    elif type(x) is dict:
        if x.get("$t") in ("tensor", "ndarray", "bytes"):
            if type(x.get("i")) is not int or type(x.get("n")) is not int or x["n"] < 0:
                raise WireError("malformed blob reference")
            out.append((x["i"], x["n"]))
        for v in x.values():
            if type(v) in (list, dict):
                _collect(v, out)
