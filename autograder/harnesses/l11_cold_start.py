"""The learner side of lesson 11's checks (autograder/harnesses/__init__.py): what the learner's code reads, counted
in the learner's process (count_header_reads wraps checkpoint_io.read_range and reads /proc/self/io's rchar;
count_shard_reads wraps safetensors.safe_open), returned as plain numbers for the checks to judge."""
from __future__ import annotations

import functools

import torch

from autograder.harnesses import harness


@harness
def count_header_reads(header_fn, path: str) -> dict:
    """(A harness: runs in the learner's process under `t.run`.) Call header_fn(path) once to warm up (a
    first call may import modules, which reads files), then again while counting the bytes read: those
    returned by checkpoint_io.read_range (wrapped in that module and wherever the learner's module holds
    it by name), and the process's rchar from /proc/self/io (every read() call, open() or Path.read_bytes
    included; None where /proc is not there)."""
    from reference_engine.tools import checkpoint_io

    header_fn(path)
    real, asked = checkpoint_io.read_range, [0]

    def counting(p, start, end):
        out = real(p, start, end)
        asked[0] += len(out)
        return out

    with _patched([(checkpoint_io.__dict__, "read_range"), *_holders(getattr(header_fn, "__globals__", {}), real)],
                  counting):
        before = _rchar()
        header_fn(path)
        after = _rchar()
    return {"read_range": asked[0], "rchar": None if before is None or after is None else after - before}


def _holders(namespace: dict, obj) -> list:
    return [(namespace, k) for k, v in list(namespace.items()) if v is obj]


class _patched:
    """Set namespace[key] = value for each (namespace, key) inside the with block, then put them back."""
    def __init__(self, places, value):
        self.places, self.value, self.saved = places, value, []

    def __enter__(self):
        self.saved = [(ns, k, ns[k]) for ns, k in self.places]
        for ns, k in self.places:
            ns[k] = self.value

    def __exit__(self, *exc):
        for ns, k, v in self.saved:
            ns[k] = v


def _rchar() -> int | None:
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration, ValueError):
        return None


class _ReadCounter:
    """Bytes of the tensors (or arrays) that safe_open handed out."""
    def __init__(self):
        self.bytes = 0

    def add(self, x):
        if isinstance(x, torch.Tensor):
            self.bytes += x.numel() * x.element_size()
        elif isinstance(x, dict):  # get_tensors(): every tensor of the file
            for v in x.values():
                self.add(v)
        elif hasattr(x, "nbytes") and not isinstance(x, (str, bytes)):  # framework="np"
            self.bytes += int(x.nbytes)
        return x


class _CountingSlice:
    def __init__(self, sl, counter: _ReadCounter):
        self._sl, self._counter = sl, counter

    def __getitem__(self, index):
        return self._counter.add(self._sl[index])

    def __getattr__(self, name):
        return getattr(self._sl, name)


class _CountingOpen:
    """safetensors.safe_open, counting what get_tensor and get_slice(...)[...] read."""
    def __init__(self, real, counter: _ReadCounter, *args, **kwargs):
        self._f, self._counter = real(*args, **kwargs), counter

    def __enter__(self):
        self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def get_tensor(self, name):
        return self._counter.add(self._f.get_tensor(name))

    def get_slice(self, name):
        return _CountingSlice(self._f.get_slice(name), self._counter)

    def __getattr__(self, name):  # get_tensors (what load_file calls), and whatever a later version adds
        attr = getattr(self._f, name)
        if not callable(attr):
            return attr
        return lambda *args, **kwargs: self._counter.add(attr(*args, **kwargs))


@harness
def count_shard_reads(load_fn, model_dir: str, tp: int, rank: int) -> dict:
    """(A harness: runs in the learner's process under `t.run`.) load_fn(model_dir, tp, rank) with
    safetensors.safe_open wrapped (in safetensors, in safetensors.torch, whose load_file uses it, and
    wherever the learner's module holds it by name) so that the bytes of every get_tensor and every indexed
    get_slice are counted. Returns that count and the names of the non-contiguous tensors it returned
    (a tensor crosses to the grader as a contiguous copy, so only this side can tell)."""
    import safetensors
    import safetensors.torch

    real, counter = safetensors.safe_open, _ReadCounter()
    places = {(id(ns), k): (ns, k) for ns in (safetensors.__dict__, safetensors.torch.__dict__,
                                               getattr(load_fn, "__globals__", {}))
              for k, v in list(ns.items()) if v is real}
    with _patched(list(places.values()), functools.partial(_CountingOpen, real, counter)):
        out = load_fn(model_dir, tp, rank)
    tensors = out if isinstance(out, dict) else {}
    return {"read": counter.bytes,
            "non_contiguous": sorted(k for k, v in tensors.items() if isinstance(v, torch.Tensor) and not v.is_contiguous())}
