"""Checks for lesson 11: the hop model of a cold start, the safetensors header, the shard plan under TP and
the sharded loader.

Checkpoints are written here, by the grader, into a temp dir (`write_checkpoint`, from a plain-data spec);
the learner's function gets the path. The reference answer is computed with `t.reference(...)` on the spec
(it writes its own copy of the same bytes), so a student's copy can replay it. Wrong answers are named by
running the usual wrong variants here (`chain_variant`, `plan_variant`, `shard_variant`), the last two inside
`@answer_code` functions of the spec (`plan_mistakes`, `shard_mistakes`, ...) that write their own copy of the
same bytes, so that a student's copy replays them too. What the learner's code reads is counted in the learner's process by two harnesses
(`count_header_reads`, `count_shard_reads`, autograder/harnesses/l11_cold_start.py), which wrap read_range and
safetensors.safe_open there and return only counts: the verdict is made here.
"""
from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

from autograder import compare as cmp
from autograder.core import LearnerRaised, check
from autograder.harnesses.l11_cold_start import count_header_reads, count_shard_reads
from autograder.mistakes import looks_like
from autograder.reference import answer_code


class Hop(NamedTuple):
    name: str
    rate: float
    unit: str = "GB/s"
    links: int = 1


_UNITS = {"GB/s": 1e9, "Gb/s": 1e9 / 8}

# -- 2.1 one hop --------------------------------------------------------------------------------------------


@answer_code
def hop_variant(nbytes, hop, bits_as_bytes=False, no_links=False, times_eight=False):
    per = 1e9 if bits_as_bytes else _UNITS[hop.unit]
    if times_eight and hop.unit == "Gb/s":
        per = 8e9
    return nbytes / (hop.rate * per * (1 if no_links else hop.links))


HOP_MISTAKES = {"reads Gb/s as GB/s (a network link is rated in bits: divide by 8)": {"bits_as_bytes": True},
                "ignores the hop's links (the hop moves rate x links: each link carries its share of the bytes)": {"no_links": True},
                "multiplies Gb/s by 8 instead of dividing": {"times_eight": True}}


def random_hop(rng) -> Hop:
    unit = rng.choice(["GB/s", "Gb/s"])
    rate = rng.choice([25.0, 100.0, 200.0, 400.0]) if unit == "Gb/s" else round(rng.uniform(2.0, 64.0), 1)
    return Hop(rng.choice(["net", "nvme", "pcie"]), rate, unit, rng.choice([1, 2, 4, 8]))


VISIBLE_HOPS = [
    ("141 GB over one 100 Gb/s NIC", (141e9, Hop("network", 100.0, "Gb/s"))),
    ("141 GB to 8 GPUs over PCIe Gen5 x16 each", (141e9, Hop("pcie", 63.0, "GB/s", 8))),
    ("16 GB over two 400 Gb/s NICs", (16e9, Hop("network", 400.0, "Gb/s", 2))),
]


@check(points=2, section="2.1", timeout=10)
def hop_seconds(t):
    """Seconds for n bytes through one hop (units, links)."""
    for label, (nbytes, hop) in t.cases(visible=VISIBLE_HOPS, hidden=lambda r: (r.uniform(1e9, 2e11), random_hop(r)),
                                        n=4):
        with t.case(label):
            got, expected = t.both("hop_seconds", nbytes, hop)
            t.expect(got, expected, f"seconds for {nbytes:.3g} bytes over {hop}", rtol=1e-6,
                     mistakes={k: hop_variant(nbytes, hop, **v) for k, v in HOP_MISTAKES.items()})
    with t.case("an unknown unit"):
        t.expect_raises(ValueError, "hop_seconds", 1e9, Hop("net", 100.0, "MB/s"),
                        why="'MB/s' is neither GB/s nor Gb/s: guessing a unit is how a 8x error gets in")


# -- 2.2 the chain -------------------------------------------------------------------------------------------

@answer_code
def chain_variant(nbytes, hops, overlap, chunk_bytes, serial=False, no_fill=False, always_overlap=False,
                  fill_all=False, no_clamp=False, ties_out=False, before_only=False, **hop_flags):
    if not hops:
        return 0.0
    whole = [hop_variant(nbytes, h, **hop_flags) for h in hops]
    if (not overlap or serial) and not always_overlap:
        return sum(whole)
    chunk = chunk_bytes if no_clamp else min(chunk_bytes, nbytes)
    slow = max(range(len(hops)), key=lambda i: whole[i])

    def in_fill(i):
        if fill_all:
            return True
        if ties_out:  # every hop as slow as the slowest left out, not just one of them
            return whole[i] != whole[slow]
        return i < slow if before_only else i != slow

    fill = sum(hop_variant(chunk, h, **hop_flags) for i, h in enumerate(hops) if in_fill(i))
    return whole[slow] + (0.0 if no_fill else fill)


CHAIN_MISTAKES = {"adds the hops' times even when they overlap": {"serial": True},
                  "leaves out the pipeline fill (one chunk's trip through each of the other hops)": {"no_fill": True},
                  "overlaps the hops even when overlap=False": {"always_overlap": True},
                  "counts the slowest hop in the fill too": {"fill_all": True},
                  "reads Gb/s as GB/s (a network link is rated in bits: divide by 8)": {"bits_as_bytes": True},
                  "ignores the hops' links (a hop moves rate x links: each link carries its share of the bytes)":
                  {"no_links": True},
                  "fills with chunk_bytes even when the checkpoint is smaller (then the one chunk is the whole "
                  "checkpoint: min(chunk_bytes, nbytes))": {"no_clamp": True},
                  "leaves every hop tied for slowest out of the fill (one of them sets the pace; the others still "
                  "add one chunk's time)": {"ties_out": True},
                  "counts only the hops before the slowest in the fill (the last chunk still has to cross the hops "
                  "after it)": {"before_only": True}}

NODE = [Hop("object store -> host (network)", 100.0, "Gb/s"), Hop("host -> NVMe cache", 7.0, "GB/s", 4),
        Hop("page cache -> GPU (PCIe Gen5 x16)", 63.0, "GB/s", 8)]


def random_chain(rng):
    hops = [random_hop(rng) for _ in range(rng.randint(1, 4))]
    return rng.uniform(1e9, 2e11), hops, rng.random() < 0.5, rng.choice([64e6, 256e6, 1e9, 4e9])


VISIBLE_CHAINS = [
    ("141 GB, serial", (141e9, NODE, False, 256e6)),
    ("141 GB, pipelined in 256 MB chunks", (141e9, NODE, True, 256e6)),
    ("10 GB, two hops, 1 GB chunks, overlapped", (10e9, [Hop("a", 1.0), Hop("b", 2.0)], True, 1e9)),
    ("a chunk larger than the checkpoint", (1e9, [Hop("a", 1.0), Hop("b", 16.0, "Gb/s", 2)], True, 4e9)),
    ("two hops tied for slowest, not first, 1 GB chunks",
     (10e9, [Hop("b", 4.0), Hop("a", 1.0), Hop("d", 2.0), Hop("c", 1.0)], True, 1e9)),
    ("no hops", (1e9, [], True, 1e8)),
]


def _short(arg) -> str:
    """An argument as a message shows it: a path by its file name."""
    return repr(Path(arg).name) if isinstance(arg, str) else repr(arg)


@check(points=3, section="2.2", timeout=10)
def cold_start_seconds(t):
    """The chain of hops, serial and pipelined. A wrong hop_seconds is blamed, not this function."""
    for label, args in t.cases(visible=VISIBLE_CHAINS, hidden=random_chain, n=6):
        with t.case(label):
            nbytes, hops = args[0], args[1]
            hop_calls = [(nbytes, h) for h in hops]
            hop_expected = [t.ref.hop_seconds(*c) for c in hop_calls]
            got, expected = t.both("cold_start_seconds", *args)
            mistakes = {k: chain_variant(*args, **v) for k, v in CHAIN_MISTAKES.items()}
            if cmp.compare(got, expected, 1e-6) is not None:
                t.blame_upstream("cold_start_seconds", "hop_seconds", zip(hop_calls, hop_expected), show=_short)
            t.expect(got, expected, f"cold start of {args[0]:.3g} bytes (overlap={args[2]})", rtol=1e-6,
                     mistakes=mistakes)


# -- checkpoints written by the grader -------------------------------------------------------------------------

_TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def llama_tensors(hidden: int, inter: int, heads: int, kv_heads: int, layers: int, vocab: int, dtype: str,
                  bias: bool = False, lm_head: bool = False) -> list:
    """[name, dtype, shape] of a Llama checkpoint of these dimensions (head_dim = hidden // heads)."""
    d = hidden // heads
    out = [["model.embed_tokens.weight", dtype, [vocab, hidden]], ["model.norm.weight", dtype, [hidden]]]
    if lm_head:
        out.append(["lm_head.weight", dtype, [vocab, hidden]])
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [[p + "input_layernorm.weight", dtype, [hidden]], [p + "post_attention_layernorm.weight", dtype, [hidden]],
                [p + "self_attn.q_proj.weight", dtype, [heads * d, hidden]],
                [p + "self_attn.k_proj.weight", dtype, [kv_heads * d, hidden]],
                [p + "self_attn.v_proj.weight", dtype, [kv_heads * d, hidden]],
                [p + "self_attn.o_proj.weight", dtype, [hidden, heads * d]],
                [p + "mlp.gate_proj.weight", dtype, [inter, hidden]], [p + "mlp.up_proj.weight", dtype, [inter, hidden]],
                [p + "mlp.down_proj.weight", dtype, [hidden, inter]]]
        if bias:
            out += [[p + f"self_attn.{n}.bias", dtype, [r]] for n, r in
                    (("q_proj", heads * d), ("k_proj", kv_heads * d), ("v_proj", kv_heads * d))]
            out.append([p + "self_attn.o_proj.bias", dtype, [hidden]])
    return out


def spec_of(seed: int, files: int = 1, metadata: dict | None = None, config: dict | None = None, **dims) -> dict:
    return {"tensors": llama_tensors(**dims), "files": files, "seed": seed, "metadata": metadata, "config": config}


def write_checkpoint(spec: dict, model_dir: Path) -> list[Path]:
    """Write the spec's tensors (values drawn from its seed) over spec["files"] safetensors files (with an
    index when more than one) and its config.json. Same spec, same bytes. Options: spec["reorder"] writes
    each header's JSON keys in reverse (a valid file whose keys are not in offset order, as a hand-written
    or other-library header may be); spec["stray"] (with an index) adds a consolidated.safetensors that the
    index does not list, as some Hugging Face repos ship next to their shards."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(spec["seed"])
    tensors = {n: torch.randn(s, generator=g).to(_TORCH[dt]) for n, dt, s in spec["tensors"]}
    names, k = list(tensors), spec["files"]
    paths, weight_map = [], {}
    for j in range(k):
        part = {n: tensors[n] for n in names[j * len(names) // k:(j + 1) * len(names) // k]}
        fname = "model.safetensors" if k == 1 else f"model-{j + 1:05d}-of-{k:05d}.safetensors"
        save_file(part, str(model_dir / fname), metadata=spec.get("metadata"))
        if spec.get("reorder"):
            _reverse_header(model_dir / fname)
        weight_map.update(dict.fromkeys(part, fname))
        paths.append(model_dir / fname)
    if k > 1:
        (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    if spec.get("stray"):
        assert k > 1, "a stray file is only stray next to an index"
        save_file({STRAY_TENSOR: torch.randn(4, 4, generator=g)}, str(model_dir / "consolidated.safetensors"))
    if spec.get("config"):
        (model_dir / "config.json").write_text(json.dumps(spec["config"]))
    return paths


STRAY_TENSOR = "layers.0.attention.wq.weight"  # the original (non-Hugging Face) name of a q_proj weight


def _reverse_header(path: Path) -> None:
    """Rewrite a safetensors file with its JSON keys in reverse order; the offsets (relative to the end of
    the header) and the tensor bytes stay as they are."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    js = json.dumps(dict(reversed(list(header.items()))), separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    path.write_bytes(struct.pack("<Q", len(js)) + js + raw[8 + n:])


def ref_header(ref, spec: dict):
    with tempfile.TemporaryDirectory() as d:
        header, start = ref.safetensors_header(write_checkpoint(spec, Path(d))[0])
    return [header, start]


def ref_headers(ref, spec: dict):
    """[[file name, header, data_start], ...] of every file of the checkpoint `spec` (what shard_plan reads first)."""
    with tempfile.TemporaryDirectory() as d:
        return [[p.name, *ref.safetensors_header(p)] for p in write_checkpoint(spec, Path(d))]


def ref_plan(ref, spec: dict, tp: int, rank: int):
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(spec, Path(d))
        return [list(r) for r in ref.shard_plan(d, tp, rank)]


def ref_shard(ref, spec: dict, tp: int, rank: int):
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(spec, Path(d))
        return dict(ref.load_shard(d, tp, rank))


@answer_code
def _raw_header(path: Path) -> tuple[dict, int]:
    """(the raw JSON header, __metadata__ included, and where the data starts) of a file written here. Called
    by the checks only inside header_facts and plan_variant (its argument is a path, not plain data)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), 8 + n


def _files(model_dir: Path, glob_files: bool = False) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file() and not glob_files:
        return [model_dir / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return sorted(model_dir.glob("*.safetensors"))


def _kind(name: str, vocab_replicated=False, row_as_column=False) -> str:
    parts = name.split(".")
    if any(p in ("embed_tokens", "lm_head") for p in parts):
        return "replicated" if vocab_replicated else "vocab"
    if any(p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj") for p in parts):
        return "column"
    if any(p in ("o_proj", "down_proj") for p in parts):
        if parts[-1] != "weight":
            return "replicated"
        return "column" if row_as_column else "row"
    return "replicated"


_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


@answer_code
def plan_variant(model_dir: Path, tp: int, rank: int, row_as_column=False, vocab_replicated=False,
                 relative_offsets=False, no_length_bytes=False, no_merge=False, unsorted=False,
                 glob_files=False) -> list:
    """The shard plan, or one of its usual wrong versions, as [file, tensor, start, end] lists. Called by the
    checks only inside plan_mistakes (its argument is a folder, not plain data)."""
    reads = []
    for path in _files(model_dir, glob_files):
        header, data_start = _raw_header(path)
        header.pop("__metadata__", None)
        base0 = 0 if relative_offsets else data_start - (8 if no_length_bytes else 0)
        for name, info in header.items():
            e, shape = _BYTES[info["dtype"]], info["shape"]
            b, end = base0 + info["data_offsets"][0], base0 + info["data_offsets"][1]
            kind = _kind(name, vocab_replicated, row_as_column)
            if kind == "row" and len(shape) < 2:
                kind = "replicated"
            if kind == "replicated":
                reads.append([path.name, name, b, end])
            elif kind in ("column", "vocab"):
                row = e * (shape[1] if len(shape) > 1 else 1)
                n = shape[0] // tp
                reads.append([path.name, name, b + rank * n * row, b + (rank + 1) * n * row])
            else:
                cols = shape[1]
                c0, c1 = rank * cols // tp, (rank + 1) * cols // tp
                for i in range(shape[0]):
                    s, t_ = b + (i * cols + c0) * e, b + (i * cols + c1) * e
                    if reads and reads[-1][1] == name and reads[-1][3] == s and not no_merge:
                        reads[-1][3] = t_
                    else:
                        reads.append([path.name, name, s, t_])
    return reads if unsorted else sorted(reads, key=lambda r: (r[0], r[2]))


@answer_code
def header_facts(spec: dict) -> list:
    """[the sorted keys of the raw JSON header (__metadata__ included), where the data starts (8 + N)] of the
    first file of the checkpoint `spec` (written here again: same spec, same bytes)."""
    with tempfile.TemporaryDirectory() as d:
        raw, start = _raw_header(write_checkpoint(spec, Path(d))[0])
    return [sorted(raw), start]


@answer_code
def plan_mistakes(spec: dict, tp: int, rank: int) -> dict:
    """{mistake: the plan it gives} (PLAN_MISTAKES) for rank `rank` of `tp` on the checkpoint `spec`."""
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(spec, Path(d))
        return {k: plan_variant(Path(d), tp, rank, **v) for k, v in PLAN_MISTAKES.items()}


GLOB_MISTAKE = ("reads every *.safetensors file in the folder (with an index, only the files it lists hold the "
                "model: use weight_files)")


PLAN_MISTAKES = {"splits o_proj/down_proj by rows like q/k/v (row-parallel layers split by input columns)":
                 {"row_as_column": True},
                 "replicates embed_tokens/lm_head (they are split by vocabulary rows)": {"vocab_replicated": True},
                 "uses data_offsets as file offsets (they count from the end of the JSON header)":
                 {"relative_offsets": True},
                 "forgets the 8 header-length bytes before the JSON": {"no_length_bytes": True},
                 "does not merge touching ranges (at tp=1 a tensor is one read)": {"no_merge": True},
                 "returns the reads in header order (sort them by (file, start): a header's keys need not be in "
                 "offset order)": {"unsorted": True},
                 GLOB_MISTAKE: {"glob_files": True}}


def _config(heads: int, kv_heads: int, hidden: int) -> dict:
    return {"num_attention_heads": heads, "num_key_value_heads": kv_heads, "hidden_size": hidden}


def _dims(hidden, inter, heads, kv, layers, vocab, dtype, **kw):
    return dict(hidden=hidden, inter=inter, heads=heads, kv_heads=kv, layers=layers, vocab=vocab, dtype=dtype, **kw)


VISIBLE_SPECS = {
    "one layer, F32": spec_of(1, config=_config(4, 2, 16), **_dims(16, 24, 4, 2, 1, 32, "F32")),
    "two files, F16, lm_head, biases": spec_of(2, files=2, config=_config(8, 4, 32),
                                                **_dims(32, 48, 8, 4, 2, 64, "F16", bias=True, lm_head=True)),
    "BF16 with __metadata__": spec_of(3, metadata={"format": "pt"}, config=_config(4, 4, 16),
                                      **_dims(16, 32, 4, 4, 1, 16, "BF16")),
}


def random_spec(rng) -> dict:
    heads = rng.choice([4, 8])
    kv = rng.choice([h for h in (1, 2, 4, 8) if h <= heads and heads % h == 0 and h % 2 == 0] or [heads])
    d = rng.choice([2, 4])
    hidden = heads * d
    dims = _dims(hidden, hidden * rng.choice([2, 3]), heads, kv, rng.randint(1, 2), rng.choice([16, 32, 64]),
                 rng.choice(["F32", "F16", "BF16"]), bias=rng.random() < 0.5, lm_head=rng.random() < 0.5)
    return spec_of(rng.randrange(10**6), files=rng.choice([1, 2, 3]), config=_config(heads, kv, hidden),
                   metadata={"format": "pt"} if rng.random() < 0.5 else None, **dims)


# -- 3.1 the header ---------------------------------------------------------------------------------------------

HEADER_SPECS = {
    "no tensors: the file ends where its header does (8 + N bytes)":
        {"tensors": [], "files": 1, "seed": 4, "metadata": {"format": "pt"}, "config": None},
    "a torch.compile'd model's names (the _orig_mod. prefix)":
        {"tensors": [["_orig_mod.model.norm.weight", "F32", [8]], ["_orig_mod.lm_head.weight", "F32", [4, 8]]],
         "files": 1, "seed": 5, "metadata": {"format": "pt"}, "config": None},
}
READ_SPEC = spec_of(6, **_dims(256, 512, 4, 4, 0, 4096, "F32"))  # a 1 KB header, then 4 MiB of embedding

UNDERSCORE_MISTAKE = "drops every name that starts with '_' (only the \"__metadata__\" entry is not a tensor)"


def _judge_header_reads(t, seen, size: int, start: int, blksize: int) -> None:
    """Fail if the learner's safetensors_header read at least half of the tensor bytes after the header.
    rchar counts whole buffered reads (a read of 8 bytes may fetch a block), so it is trusted only when the
    tensors are many blocks long."""
    if not isinstance(seen, dict):
        t.fail(f"the read counter got {seen!r} back (a grader bug: please report it)")
    counts = [seen.get("read_range") or 0]
    if seen.get("rchar") is not None and size - start >= 64 * max(blksize, 4096):
        counts.append(seen["rchar"])
    n = max(counts)
    if n < start + (size - start) // 2:
        return
    how = looks_like("reads the whole file to find the header", end="") if n >= size else \
        "It reads (most of) the tensor bytes too"
    t.fail(f"safetensors_header read {n:,} bytes of a {size:,}-byte file whose header is its first {start:,} bytes. "
           f"{how}: read_range(path, 0, 8) gives N, then read_range(path, 8, 8 + N) the JSON; the tensors after "
           "it are what a rank must not read unless it needs them")


def _header_call(t, path: Path, ends_at_header: bool):
    try:
        return t.call("safetensors_header", str(path))
    except LearnerRaised as e:
        if ends_at_header and not e.not_implemented and e.is_a(ValueError):
            t.fail(f"safetensors_header() raised ValueError on a valid file that ends exactly where its header "
                   f"does ({path.stat().st_size} bytes = 8 + N: a checkpoint with no tensors). Only a file shorter "
                   "than 8 + N bytes is truncated; if your test is N > size - 8, check how N is read: all 8 bytes, "
                   "one little-endian unsigned 64-bit integer (struct '<Q'), and the JSON at bytes [8, 8 + N)")
        raise


@check(points=2, section="3.1", timeout=30)
def safetensors_header(t):
    """Parse the header of a safetensors file written here; refuse short and cut files; read only the header."""
    visible = list(VISIBLE_SPECS.items()) + list(HEADER_SPECS.items())
    for label, spec in t.cases(visible=visible, hidden=random_spec, n=2):
        with t.case(label), tempfile.TemporaryDirectory() as d:
            path = write_checkpoint(spec, Path(d))[0]
            expected = t.reference(ref_header, spec)
            keys, start = header_facts(spec)
            got = _header_call(t, path, path.stat().st_size == start)
            got = list(got) if isinstance(got, tuple) else got
            if isinstance(got, list) and len(got) == 2 and isinstance(got[0], dict):
                if (types := cmp.key_types(got[0])) is not None:
                    t.fail("safetensors_header should return (header, data_start) with the header a dict keyed by "
                           f"tensor name (str), got keys of types {types}: keep the JSON's keys as they are")
                t.expect(sorted(got[0]), sorted(expected[0]), "the header's keys",
                         mistakes={"keeps the __metadata__ entry": keys,
                                   UNDERSCORE_MISTAKE: [k for k in keys if not k.startswith("_")]})
            t.expect(got, expected, f"(header, data_start) of {path.name}",
                     mistakes={"returns the JSON length, not where the data starts (8 + N)": [expected[0], start - 8]})
    with t.case("a file of 3 bytes"), tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        path.write_bytes(b"\x05\x00\x00")
        t.expect_raises(ValueError, "safetensors_header", str(path),
                        why="a file under 8 bytes cannot even hold the header length: check the size first "
                            "(struct.unpack on a short read raises struct.error, which is not a ValueError)")
    with t.case("a truncated file"), tempfile.TemporaryDirectory() as d:
        path = write_checkpoint(VISIBLE_SPECS["one layer, F32"], Path(d))[0]
        raw = path.read_bytes()
        path.write_bytes(raw[:8] + raw[8:40])  # the length says more JSON than the file holds
        t.expect_raises(ValueError, "safetensors_header", str(path),
                        why="the header length points past the end of the file: the download was cut short")
    with t.case("a file cut inside the JSON's trailing spaces"), tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        js = json.dumps({"model.norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
        n = len(js) + 4  # the JSON padded with 4 spaces (the format allows it), then 16 bytes of tensor
        path.write_bytes(struct.pack("<Q", n) + js + b" ")  # cut 3 bytes before the header's end
        t.expect_raises(ValueError, "safetensors_header", str(path),
                        why=f"N = {n}, so the file needs at least 8 + N = {8 + n} bytes, and it has {8 + len(js) + 1}. "
                            "Its JSON still parses (only trailing spaces are missing), so only comparing 8 + N "
                            "with the file size catches the cut")
    with t.case("a header length with its high 4 bytes set"), tempfile.TemporaryDirectory() as d:
        path = write_checkpoint(VISIBLE_SPECS["one layer, F32"], Path(d))[0]
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        path.write_bytes(struct.pack("<Q", n + 2**32) + raw[8:])
        t.expect_raises(ValueError, "safetensors_header", str(path),
                        why=f"the length field is {n} + 2**32, which points 4 GiB past the end of this "
                            f"{len(raw)}-byte file. N is all 8 bytes, one little-endian unsigned 64-bit "
                            "integer ('<Q'), not its low 4")
    with t.case("reads only the header (a 4 MiB file)"), tempfile.TemporaryDirectory() as d:
        path = write_checkpoint(READ_SPEC, Path(d))[0]
        _, start = header_facts(READ_SPEC)
        st = path.stat()
        seen = t.run(count_header_reads, t.learner("safetensors_header"), str(path), what="safetensors_header")
        _judge_header_reads(t, seen, st.st_size, start, st.st_blksize)


# -- 3.2 the shard plan ----------------------------------------------------------------------------------------

PLAN_SPECS = {
    **VISIBLE_SPECS,
    "keys out of offset order": {**spec_of(7, config=_config(4, 2, 16), **_dims(16, 24, 4, 2, 1, 32, "F32")),
                                 "reorder": True},
    "an index plus a stray consolidated.safetensors": {
        **spec_of(8, files=2, config=_config(4, 4, 16), **_dims(16, 32, 4, 4, 1, 32, "F16")), "stray": True},
}

VISIBLE_PLANS = [
    ("one layer, F32, tp=2 rank 1", ("one layer, F32", 2, 1)),
    ("one layer, F32, tp=1", ("one layer, F32", 1, 0)),
    ("two files, F16, lm_head, biases, tp=4 rank 2", ("two files, F16, lm_head, biases", 4, 2)),
    ("BF16 with __metadata__, tp=2 rank 0", ("BF16 with __metadata__", 2, 0)),
    ("a header whose keys are not in offset order, tp=2 rank 1", ("keys out of offset order", 2, 1)),
    ("an index plus a consolidated.safetensors it does not list, tp=2 rank 0",
     ("an index plus a stray consolidated.safetensors", 2, 0)),
]

REFUSALS = [
    ("tp=4 with 2 KV heads", "one layer, F32", 4, 0,
     "4 ranks cannot share 2 KV heads without cutting a head in two"),
    ("rank 2 of tp=2", "one layer, F32", 2, 2, "the ranks of tp=2 are 0 and 1: there is no rank 2 to read for"),
    ("a vocabulary of 30 rows at tp=4 (the heads divide, the rows do not)",
     spec_of(9, config=_config(4, 4, 16), **_dims(16, 32, 4, 4, 1, 30, "F32")), 4, 0,
     "embed_tokens has 30 rows, which 4 ranks cannot share evenly (30 / 4 = 7.5): a dimension to split that tp "
     "does not divide must be refused, not handed out in parts of different sizes"),
]


def _refusals(t, name: str) -> None:
    for label, spec, tp, rank, why in REFUSALS:
        with t.case(label), tempfile.TemporaryDirectory() as d:
            write_checkpoint(PLAN_SPECS[spec] if isinstance(spec, str) else spec, Path(d))
            t.expect_raises(ValueError, name, d, tp, rank, why=why)


def _hidden_plan(rng):
    spec = random_spec(rng)
    kv = spec["config"]["num_key_value_heads"]
    tp = rng.choice([t for t in (1, 2, 4) if kv % t == 0])
    return spec, tp, rng.randrange(tp)


def _plan_cases(t):
    visible = [(label, (PLAN_SPECS[s], tp, r)) for label, (s, tp, r) in VISIBLE_PLANS]
    return t.cases(visible=visible, hidden=_hidden_plan, n=3)


@check(points=4, section="3.2", timeout=30)
def shard_plan(t):
    """The byte ranges one TP rank reads, on checkpoints written here; the TP degrees it must refuse."""
    for label, (spec, tp, rank) in _plan_cases(t):
        with t.case(label), tempfile.TemporaryDirectory() as d:
            write_checkpoint(spec, Path(d))
            expected = t.reference(ref_plan, spec, tp, rank)
            headers = t.reference(ref_headers, spec)
            got = t.call("shard_plan", d, tp, rank)
            got = [list(r) for r in got] if isinstance(got, (list, tuple)) else got
            mistakes = plan_mistakes(spec, tp, rank)
            if cmp.compare(got, expected) is not None:
                t.blame_upstream("shard_plan", "safetensors_header",
                                 [((str(Path(d) / f),), [h, start]) for f, h, start in headers], show=_short)
            t.expect(got, expected, f"reads of rank {rank} of tp={tp}", mistakes=mistakes)
    _refusals(t, "shard_plan")


# -- 3.3 the sharded loader ---------------------------------------------------------------------------------------

@answer_code
def shard_variant(model_dir: Path, tp: int, rank: int, row_as_column=False, vocab_replicated=False,
                  glob_files=False) -> dict:
    """A rank's tensors, or one of the usual wrong versions. Called by the checks only inside the functions below
    (its argument is a folder, not plain data)."""
    from safetensors.torch import load_file

    out = {}
    for p in _files(model_dir, glob_files):
        for name, x in load_file(str(p)).items():
            kind = _kind(name, vocab_replicated, row_as_column)
            if kind == "row" and x.dim() < 2:
                kind = "replicated"
            if kind in ("column", "vocab"):
                out[name] = x.chunk(tp, 0)[rank].contiguous()
            elif kind == "row":
                out[name] = x.chunk(tp, 1)[rank].contiguous()
            else:
                out[name] = x
    return out


SHARD_MISTAKES = {"splits o_proj/down_proj by rows like q/k/v (row-parallel layers split by input columns)":
                  {"row_as_column": True},
                  "replicates embed_tokens/lm_head (they are split by vocabulary rows)": {"vocab_replicated": True}}


@answer_code
def shard_reference(spec: dict, tp: int, rank: int, glob_files=False) -> dict:
    """shard_variant(...) (the right one, or glob_files) on the checkpoint `spec`, written here again."""
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(spec, Path(d))
        return shard_variant(Path(d), tp, rank, glob_files=glob_files)


@answer_code
def shard_mistakes(spec: dict, tp: int, rank: int) -> dict:
    """{mistake: the tensors it loads} (SHARD_MISTAKES) for rank `rank` of `tp` on the checkpoint `spec`."""
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(spec, Path(d))
        return {k: shard_variant(Path(d), tp, rank, **v) for k, v in SHARD_MISTAKES.items()}


@answer_code
def read_mistakes(spec: dict, tp: int, rank: int) -> dict:
    """{mistake: the bytes it reads through safe_open} for rank `rank` of `tp` on the checkpoint `spec`."""
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(spec, Path(d))
        full, part = shard_variant(Path(d), 1, 0), shard_variant(Path(d), tp, rank)
    whole_rows = sum(_nbytes(full[k] if _kind(k) == "row" and full[k].dim() == 2 else part[k]) for k in full)
    return {"reads every tensor whole (get_tensor) and slices it afterwards: index "
            "get_slice(name) instead, which reads only this rank's bytes": sum(_nbytes(x) for x in full.values()),
            "reads o_proj/down_proj whole (get_tensor) and slices their columns afterwards: index "
            "get_slice(name)[:, lo:hi] instead": whole_rows}


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


READ_CASE = ("two files, F16, lm_head, biases", 2, 1)


def _shard_reads_case(t) -> None:
    """Two cases on one checkpoint, both seen from the learner's process: the tensors come back contiguous,
    and only this rank's bytes are read (get_tensor reads a whole tensor, an indexed get_slice its part)."""
    name, tp, rank = READ_CASE
    with t.case(f"returns contiguous tensors ({name}, tp={tp} rank {rank})"), tempfile.TemporaryDirectory() as d:
        write_checkpoint(PLAN_SPECS[name], Path(d))
        seen = t.run(count_shard_reads, t.learner("load_shard"), d, tp, rank, what="load_shard")
        strided = seen.get("non_contiguous") if isinstance(seen, dict) else None
        t.expect_true(strided == [], f"load_shard returned non-contiguous tensors: {strided}. A column slice "
                      "([:, lo:hi]) of a row-parallel weight is a strided view of the whole tensor; the docstring "
                      "promises contiguous tensors (a GPU copy or a kernel expects a dense layout): call "
                      ".contiguous() on it")
    with t.case(f"reads only its own bytes through safe_open ({name}, tp={tp} rank {rank})"), \
            tempfile.TemporaryDirectory() as d:
        spec = PLAN_SPECS[name]
        write_checkpoint(spec, Path(d))
        expected = sum(_nbytes(x) for x in t.reference(ref_shard, spec, tp, rank).values())
        seen = t.run(count_shard_reads, t.learner("load_shard"), d, tp, rank, what="load_shard")
        n = seen.get("read") if isinstance(seen, dict) else None
        if isinstance(n, int) and n < expected:
            t.fail(f"load_shard read {n:,} bytes through safetensors.safe_open, but this rank's tensors hold "
                   f"{expected:,}: read them through safe_open(...).get_slice(name), as the docstring says")
        t.expect(n, expected, "bytes read through safe_open (get_tensor and indexed get_slice)",
                 mistakes=read_mistakes(spec, tp, rank))


def _cat_problem(pieces: list, whole: torch.Tensor, dim: int) -> str | None:
    """None when the ranks' pieces concatenate along `dim` (every other dimension the whole tensor's); else why not."""
    want = tuple(whole.shape)
    shapes = [tuple(p.shape) for p in pieces]
    if all(len(s) == len(want) > dim and s[:dim] + s[dim + 1:] == want[:dim] + want[dim + 1:] for s in shapes):
        return None
    return (f"rank 0 returned shape {shapes[0]} and rank 1 shape {shapes[1]}, but the checkpoint's tensor has shape "
            f"{want} and the ranks split only its dim {dim}: each rank's part keeps every other dimension whole")


@check(points=4, section="3.3", timeout=40, cost=0.3)
def load_shard(t):
    """Each rank's tensors, compared with the reference; the TP degrees it must refuse; the bytes it reads
    and the layout it returns; the ranks put back together give the checkpoint."""
    for label, (spec, tp, rank) in _plan_cases(t):
        with t.case(label), tempfile.TemporaryDirectory() as d:
            write_checkpoint(spec, Path(d))
            expected = t.reference(ref_shard, spec, tp, rank)
            got = t.call("load_shard", d, tp, rank)
            if isinstance(got, dict):
                if (types := cmp.key_types(got)) is not None:
                    t.fail(f"load_shard should return a dict keyed by tensor name (str), got keys of types {types}")
                t.expect(sorted(got), sorted(expected), "tensor names",
                         mistakes={GLOB_MISTAKE: sorted(shard_reference(spec, tp, rank, glob_files=True))})
            t.expect(got, expected, f"tensors of rank {rank} of tp={tp}", rtol=0, atol=0,
                     mistakes=shard_mistakes(spec, tp, rank))
    with t.case("ranks of tp=2 put back together"), tempfile.TemporaryDirectory() as d:
        spec = VISIBLE_SPECS["two files, F16, lm_head, biases"]
        write_checkpoint(spec, Path(d))
        full = shard_reference(spec, 1, 0)
        parts = [t.call("load_shard", d, 2, r) for r in range(2)]
        for name, x in full.items():
            kind = _kind(name)
            pieces = [p.get(name) if isinstance(p, dict) else None for p in parts]
            if any(not isinstance(p, torch.Tensor) for p in pieces):
                t.fail(f"rank 0 or 1 has no tensor {name!r}: every rank holds (its part of) every tensor")
            dim = 0 if kind in ("column", "vocab") else 1 if kind == "row" and x.dim() == 2 else None
            if dim is not None:
                if (why := _cat_problem(pieces, x, dim)) is not None:
                    t.fail(f"{name} ({kind}-parallel) cannot be put back together: {why}")
                back = torch.cat(pieces, dim)
            else:
                t.expect_true(torch.equal(pieces[0], pieces[1]), f"{name} is replicated, but ranks 0 and 1 differ")
                back = pieces[0]
            t.expect(back, x, f"{name}, ranks 0 and 1 concatenated ({kind})", rtol=0, atol=0)
    _refusals(t, "load_shard")
    _shard_reads_case(t)
