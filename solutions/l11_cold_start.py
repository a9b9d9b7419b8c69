"""Lesson 11: cold start. Where the seconds go between "launch a replica" and "it serves".

Two halves:
  2. A model of moving a checkpoint to the GPUs: a chain of hops (object store over the network, local NVMe,
     the page cache, host-to-GPU over PCIe), each with a bandwidth per link and a number of links working at
     once. Done one hop after the other the times add up; streamed in chunks the slowest hop bounds the
     total, plus the time to fill the pipeline with the first chunk.
  3. Reading only what a rank needs: the safetensors layout (an 8-byte little-endian header length, a JSON
     header, then raw bytes), the byte ranges each tensor-parallel rank reads, and a loader that reads them
     through a memory map.

Units: bandwidths in 1e9 bytes/s ("GB/s") or 1e9 bits/s ("Gb/s", as network links are rated); sizes in
bytes. Tensor parallelism (TP) here splits the way lesson 06 and Megatron-LM (Shoeybi et al., 2019) do:
  column-parallel  q/k/v/gate/up projections: weight [out, in] split by output rows (and their bias too)
  row-parallel     o/down projections: weight [out, in] split by input columns (their bias is replicated:
                   it is added once, after the all-reduce)
  vocab-parallel   embed_tokens and lm_head: split by vocabulary rows (as vLLM's VocabParallelEmbedding /
                   ParallelLMHead do), so no rank holds the whole [vocab, hidden] table
  replicated       everything else (the RMSNorm weights): every rank reads all of it

Files are read through reference_engine.tools.checkpoint_io (read_range, read_json: checkpoint files only), which
also holds the measurement helpers the notebook uses (writing a synthetic checkpoint, dropping it from the
page cache, timing loads).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import NamedTuple, Sequence

import torch

from reference_engine.loader import weight_files
from reference_engine.tools.checkpoint_io import file_size, read_json, read_range

# -- 2. the hops -------------------------------------------------------------------------------------------

UNITS = {"GB/s": 1e9, "Gb/s": 1e9 / 8}  # bytes per second per unit


class Hop(NamedTuple):
    """One stage the checkpoint crosses. rate: one link's bandwidth in `unit`; links: how many such links
    carry the bytes at once (8 GPUs each on its own PCIe Gen5 x16 link: links=8; one NIC: links=1).

    links=8 for PCIe assumes a topology: each GPU's x16 link reaches host memory on its own path (its own
    root port, or a switch whose uplink is not shared). Two GPUs behind one PCIe switch with a single x16
    uplink share that uplink's ~63 GB/s: count the uplinks, not the GPUs (`nvidia-smi topo -m` shows it)."""
    name: str
    rate: float
    unit: str = "GB/s"
    links: int = 1


def hop_seconds(nbytes: float, hop: Hop) -> float:
    """Exercise 2.1: seconds for `nbytes` (spread evenly over the hop's links) to cross `hop`.

    The hop moves rate x links, converted to bytes per second: "GB/s" is 1e9 bytes/s, "Gb/s" is 1e9 bits/s
    (1/8 of that in bytes). Any other unit: raise ValueError.

    Example: 141e9 bytes over Hop("net", 100, "Gb/s") -> 141e9 / 12.5e9 = 11.28 s;
             over Hop("pcie", 63, "GB/s", links=8) -> 141e9 / 504e9 = 0.28 s.
    The result is the time at the stated rate: with a link's line rate (PCIe's ~63 GB/s) it is a lower bound.
    A copy from pageable memory (a memory-mapped file's pages) goes through a pinned staging buffer and takes
    page faults, so it runs below line rate; give the hop the rate such copies reach, if you know it.
    """
    ### BEGIN SOLUTION
    if hop.unit not in UNITS:
        raise ValueError(f"unknown unit {hop.unit!r} for hop {hop.name!r}: use one of {sorted(UNITS)}")
    return nbytes / (hop.rate * UNITS[hop.unit] * hop.links)
    ### END SOLUTION


def cold_start_seconds(nbytes: float, hops: Sequence[Hop], overlap: bool, chunk_bytes: float = 256e6) -> float:
    """Exercise 2.2: seconds for a checkpoint of `nbytes` to cross every hop in `hops` (in order).

    overlap=False (serial): each hop starts when the one before has finished with all the bytes: the sum
    of hop_seconds over the hops.
    overlap=True (pipelined): the bytes flow in chunks of chunk_bytes (the whole checkpoint if it is
    smaller), and every hop works on one chunk while the next hop works on the one before. The slowest hop
    (largest hop_seconds for all the bytes) sets the pace, plus the fill time: one chunk's trip through
    each of the other hops.
        total = max_i hop_seconds(nbytes, h_i) + sum over the other hops of hop_seconds(chunk, h_j)
    (with equal slowest hops, count one of them as the slowest). No hops: 0.0.

    Example: 10 GB through [Hop("a", 1), Hop("b", 2)]: serial 10 + 5 = 15 s; overlapped in 1 GB chunks
    10 + 0.5 = 10.5 s.
    """
    ### BEGIN SOLUTION
    if not hops:
        return 0.0
    whole = [hop_seconds(nbytes, h) for h in hops]
    if not overlap:
        return sum(whole)
    chunk = min(chunk_bytes, nbytes)
    slowest = max(range(len(hops)), key=lambda i: whole[i])
    return whole[slowest] + sum(hop_seconds(chunk, h) for i, h in enumerate(hops) if i != slowest)
    ### END SOLUTION


# -- 3. safetensors and the shard plan ------------------------------------------------------------------

DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
               "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
VOCAB = ("embed_tokens", "lm_head")


def split_kind(name: str) -> str:
    """How tensor `name` (a Hugging Face Llama name) is split under TP: "column", "row", "vocab" or
    "replicated" (see the module docstring). A 1-D tensor of a row-parallel layer (its bias) is replicated."""
    parts = name.split(".")
    if any(p in VOCAB for p in parts):
        return "vocab"
    if any(p in COLUMN for p in parts):
        return "column"
    if any(p in ROW for p in parts):
        return "row" if parts[-1] == "weight" else "replicated"
    return "replicated"


def safetensors_header(path) -> tuple[dict, int]:
    """Exercise 3.1: parse a .safetensors file's header without reading its tensors.

    Layout: 8 bytes, little-endian unsigned int64 N; then N bytes of UTF-8 JSON; then the tensor bytes. The
    JSON maps each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, offsets
    relative to the first byte after the JSON; an optional "__metadata__" entry holds strings.
    Returns (header without "__metadata__", data_start = 8 + N): tensor t's bytes sit at
    [data_start + begin, data_start + end) in the file.
    Read only the header, with read_range: bytes [0, 8), then [8, 8 + N); never the tensor bytes after it.
    Raise ValueError if the file is shorter than 8 bytes (no room for N) or shorter than 8 + N bytes (a
    truncated download). A file of exactly 8 + N bytes (a checkpoint with no tensors) is valid.
    """
    ### BEGIN SOLUTION
    size = file_size(path)
    if size < 8:
        raise ValueError(f"{path} is {size} bytes: too short for a safetensors header length")
    (n,) = struct.unpack("<Q", read_range(path, 0, 8))
    if 8 + n > size:
        raise ValueError(f"{path}: header says {n} bytes of JSON but the file has {size} bytes (truncated?)")
    header = json.loads(read_range(path, 8, 8 + n))
    header.pop("__metadata__", None)
    return header, 8 + n
    ### END SOLUTION


class Read(NamedTuple):
    """Bytes [start, end) of file `file` (a name inside the model directory) that belong to `tensor`."""
    file: str
    tensor: str
    start: int
    end: int


def check_tp(model_dir, tp: int, rank: int) -> None:
    """Refuse a TP degree the model cannot take: rank outside [0, tp), or (when config.json says) attention
    or KV heads not divisible by tp, which would cut a head in two."""
    if tp < 1 or not 0 <= rank < tp:
        raise ValueError(f"rank {rank} is outside [0, {tp}) (tp={tp})")
    cfg_path = Path(model_dir) / "config.json"
    if cfg_path.is_file():
        cfg = read_json(cfg_path)
        heads = cfg.get("num_attention_heads", 1)
        kv = cfg.get("num_key_value_heads") or heads
        if heads % tp or kv % tp:
            raise ValueError(f"tp={tp} does not divide {heads} attention heads and {kv} KV heads")


def shard_plan(model_dir, tp: int, rank: int) -> list[Read]:
    """Exercise 3.2: the byte ranges rank `rank` of `tp` reads from the checkpoint in `model_dir`.

    For every tensor of every file in weight_files(Path(model_dir)) (from reference_engine.loader), by
    split_kind(name), with the tensor's shape [R, C] (1-D: [R]), element size e = DTYPE_BYTES[dtype] and
    b = data_start + data_offsets[0] (rank_range below gives a rank's [lo, hi) of a dimension):
      "column", "vocab": rows [rank * R/tp, (rank+1) * R/tp): one range (a 1-D bias: the same slice of it);
      "row" (2-D):      columns [c0, c1) = [rank * C/tp, (rank+1) * C/tp) of every row i: bytes
                        [b + (i*C + c0)*e, b + (i*C + c1)*e); ranges that touch (end == next start) are
                        merged, so at tp=1 a tensor is one range;
      "replicated":     the whole tensor, [b, b + (end - begin)).
    A dimension to split that tp does not divide, or check_tp's conditions: raise ValueError.
    Returns Reads sorted by (file, start), file as the name inside model_dir.

    Example: an F32 o_proj of shape [2, 4] at b = 100, tp=2, rank 1 reads columns 2..3 of rows 0 and 1:
    Read(f, name, 108, 116), Read(f, name, 124, 132).
    """
    ### BEGIN SOLUTION
    check_tp(model_dir, tp, rank)

    def tensor_reads(file: str, name: str, info: dict, data_start: int) -> list[Read]:
        e, shape = DTYPE_BYTES[info["dtype"]], info["shape"]
        b = data_start + info["data_offsets"][0]
        kind = split_kind(name)
        if kind == "replicated" or not shape or (kind == "row" and len(shape) < 2):
            return [Read(file, name, b, data_start + info["data_offsets"][1])]
        if kind in ("column", "vocab"):  # whole rows: one contiguous range
            row_bytes = e * _prod(shape[1:])
            lo, hi = rank_range(shape[0], tp, rank, name)
            return [Read(file, name, b + lo * row_bytes, b + hi * row_bytes)]
        cols = _prod(shape[1:])  # "row": a slice of every row
        c0, c1 = rank_range(cols, tp, rank, name)
        out = []
        for i in range(shape[0]):
            s, t = b + (i * cols + c0) * e, b + (i * cols + c1) * e
            if out and out[-1].end == s:
                out[-1] = out[-1]._replace(end=t)
            else:
                out.append(Read(file, name, s, t))
        return out

    reads = []
    for path in weight_files(Path(model_dir)):
        header, data_start = safetensors_header(path)
        for name, info in header.items():
            reads += tensor_reads(path.name, name, info, data_start)
    return sorted(reads, key=lambda r: (r.file, r.start))
    ### END SOLUTION


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= x
    return p


def rank_range(n: int, tp: int, rank: int, name: str) -> tuple[int, int]:
    """Rank `rank`'s [lo, hi) of a dimension of n; ValueError if tp does not divide n."""
    if n % tp:
        raise ValueError(f"tensor {name}: dimension {n} is not divisible by tp={tp}")
    return rank * n // tp, (rank + 1) * n // tp


def load_shard(model_dir, tp: int, rank: int) -> dict[str, torch.Tensor]:
    """Exercise 3.3: rank `rank`'s tensors, read through safetensors' memory map.

    Open each file of weight_files(Path(model_dir)) with safetensors.safe_open(path, framework="pt") and, for
    each tensor, take only this rank's part with get_slice(name) (indexing the slice reads just those bytes;
    rank_range below gives the [lo, hi) to index with):
      "column", "vocab": rows [rank*R/tp, (rank+1)*R/tp);  "row" (2-D): columns [rank*C/tp, (rank+1)*C/tp);
      "replicated" (and 1-D row-parallel tensors): the whole tensor.
    Read nothing more: get_tensor(name) only for the tensors this rank keeps whole. Returns {name: contiguous
    CPU tensor}, in the checkpoint's dtype. Same refusals as shard_plan (check_tp's, and a dimension to split
    that tp does not divide: ValueError).
    At tp=1 this is the whole checkpoint; concatenating the ranks' tensors (dim 0 for column/vocab, dim 1
    for row) gives each full tensor back.
    """
    ### BEGIN SOLUTION
    from safetensors import safe_open

    check_tp(model_dir, tp, rank)
    out = {}
    for path in weight_files(Path(model_dir)):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                shape, kind = sl.get_shape(), split_kind(name)
                if kind in ("column", "vocab") and shape:
                    lo, hi = rank_range(shape[0], tp, rank, name)
                    t = sl[lo:hi]
                elif kind == "row" and len(shape) == 2:
                    lo, hi = rank_range(shape[1], tp, rank, name)
                    t = sl[:, lo:hi]
                else:
                    t = f.get_tensor(name)
                out[name] = t.contiguous()
    return out
    ### END SOLUTION


# -- given ---------------------------------------------------------------------------------------------------

def plan_bytes(plan: Sequence[Read]) -> int:
    """Total bytes a shard plan reads."""
    return sum(r.end - r.start for r in plan)
