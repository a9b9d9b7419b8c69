"""Reading checkpoint files, and the measurements of lesson 11 (cold start).

read_range / read_json / file_size are how the lesson's exercises touch the disk: they read only
checkpoint files (*.safetensors, *.json), nothing else. The rest measures loading on this machine: write a
synthetic safetensors checkpoint, evict it from the page cache, see how much of it is cached, time eager,
memory-mapped and sharded loads, and (CUDA only) host-to-device copy bandwidth from pinned and pageable memory.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import time
from pathlib import Path
from typing import Sequence

import torch

from ..loader import weight_files

_READABLE = (".safetensors", ".json")


def _checked(path) -> Path:
    path = Path(path)
    if path.suffix not in _READABLE:
        raise ValueError(f"{path}: only checkpoint files ({', '.join(_READABLE)}) are read here")
    return path


def file_size(path) -> int:
    """Size in bytes of a checkpoint file."""
    return _checked(path).stat().st_size


def read_range(path, start: int, end: int) -> bytes:
    """Bytes [start, end) of a checkpoint file (fewer if the file ends first)."""
    with open(_checked(path), "rb") as f:
        f.seek(start)
        return f.read(max(0, end - start))


def read_json(path) -> dict:
    """A JSON file of a checkpoint (config.json, model.safetensors.index.json)."""
    return json.loads(_checked(path).read_text())


def write_random_checkpoint(model_dir, total_bytes: float, hidden: int = 2048, inter: int = 5632,
                            files: int = 4, seed: int = 0) -> list[Path]:
    """Write a Llama-shaped fp16 checkpoint of about `total_bytes` into `model_dir`, split over `files`
    safetensors files plus an index. The bytes are random (a 32 MiB random pool, each tensor a copy of it
    from a random offset: drawing gigabytes of fresh random numbers would take longer than the reads being
    measured), so no zero page or compression makes reading it cheaper than a real checkpoint. Returns the
    files. Peak memory: about two copies of one file."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    per_layer = 2 * (2 * hidden * hidden + 3 * hidden * inter + hidden)
    layers = max(files, int(total_bytes // per_layer))
    g = torch.Generator().manual_seed(seed)
    pool = torch.empty(32 << 20, dtype=torch.uint8).random_(generator=g)

    def random_fp16(shape):
        n = 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        start = 2 * int(torch.randint(0, pool.numel() // 2, (1,), generator=g))
        pieces, left = [], n
        while left:
            take = min(left, pool.numel() - start)
            pieces.append(pool[start:start + take])
            left, start = left - take, 0
        return torch.cat(pieces).view(torch.float16).view(shape)

    weight_map, paths = {}, []
    for k in range(files):
        tensors = {}
        for i in range(k * layers // files, (k + 1) * layers // files):
            p = f"model.layers.{i}."
            shapes = {"self_attn.q_proj.weight": (hidden, hidden), "self_attn.o_proj.weight": (hidden, hidden),
                      "mlp.gate_proj.weight": (inter, hidden), "mlp.up_proj.weight": (inter, hidden),
                      "mlp.down_proj.weight": (hidden, inter), "input_layernorm.weight": (hidden,)}
            for n, s in shapes.items():
                tensors[p + n] = random_fp16(s)
        name = f"model-{k + 1:05d}-of-{files:05d}.safetensors"
        save_file(tensors, str(model_dir / name))
        weight_map.update(dict.fromkeys(tensors, name))
        paths.append(model_dir / name)
        del tensors
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return paths


def drop_from_page_cache(paths: Sequence[Path]) -> None:
    """Ask the kernel to evict these files' pages (posix_fadvise DONTNEED, no root needed). It drops only
    clean pages, so each file is fsync'ed first; /proc/sys/vm/drop_caches would need root."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(paths: Sequence[Path]) -> float:
    """Fraction of these files' pages that sit in the page cache now (mincore(2) on a read-only map), or
    nan where mincore is not available. It is how the notebook knows whether a drop worked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mincore = libc.mincore
    except (OSError, AttributeError):
        return float("nan")
    page = mmap.PAGESIZE
    resident = total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        n = (size + page - 1) // page
        vec = (ctypes.c_ubyte * n)()
        # A private (copy-on-write) map is writable, which ctypes needs to take its address; nothing is
        # written, so its pages are the file's page-cache pages.
        with open(p, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
            anchor = ctypes.c_char.from_buffer(m)
            ok = mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec) == 0
            del anchor  # the map cannot close while ctypes holds a view of it
        if not ok:
            return float("nan")
        resident += sum(v & 1 for v in vec)
        total += n
    return resident / total if total else float("nan")


def touch(t: torch.Tensor) -> int:
    """Read one byte of every page of `t` (a memory-mapped tensor costs nothing until its pages are read);
    returns the tensor's size in bytes."""
    flat = t.reshape(-1).view(torch.uint8)
    int(flat[::mmap.PAGESIZE].sum())
    return flat.numel()


def load_read(model_dir) -> int:
    """The eager path: read each file whole into memory, then parse it (safetensors.torch.load on the bytes
    copies every tensor out): two copies of a file at a time, nothing left mapped. Returns bytes loaded."""
    from safetensors.torch import load

    n = 0
    for p in weight_files(Path(model_dir)):
        n += sum(touch(t) for t in load(p.read_bytes()).values())
    return n


def load_eager(model_dir) -> int:
    """safetensors.torch.load_file on every file, then every page touched. In safetensors 0.8 load_file
    does not copy: its tensors sit on a private (copy-on-write) memory map of the file. Returns bytes."""
    from safetensors.torch import load_file

    n = 0
    for p in weight_files(Path(model_dir)):
        n += sum(touch(t) for t in load_file(str(p)).values())
    return n


def load_mmap(model_dir) -> int:
    """safe_open on every file, taking every tensor one at a time and touching its pages; returns bytes."""
    from safetensors import safe_open

    n = 0
    for p in weight_files(Path(model_dir)):
        with safe_open(str(p), framework="pt") as f:
            for name in f.keys():
                n += touch(f.get_tensor(name))
    return n


def pages_touched(ranges, page: int = mmap.PAGESIZE) -> int:
    """Bytes of the whole pages that byte ranges (objects with .file, .start, .end) fall in: what a cold
    read through the page cache pulls from disk, since the kernel reads whole pages (and reads ahead)."""
    pages = set()
    for r in ranges:
        pages.update((r.file, i) for i in range(r.start // page, (r.end - 1) // page + 1) if r.end > r.start)
    return len(pages) * page


def timed(fn, *args) -> tuple[float, object]:
    """(seconds of wall time, fn(*args))."""
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def h2d_bandwidth(nbytes: int = 1 << 30, pinned: bool = True, repeats: int = 5) -> float | None:
    """Host-to-device copy bandwidth in bytes/s (best of `repeats`) from pinned or pageable host memory,
    or None without CUDA. Pageable memory is first copied by the driver into a pinned staging buffer,
    which is why it is slower."""
    if not torch.cuda.is_available():
        return None
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dev.copy_(host, non_blocking=pinned)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return nbytes / best
