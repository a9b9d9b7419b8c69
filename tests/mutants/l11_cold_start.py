"""Plausible wrong answers for lesson 11; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here
are prefixed `_m_`."""
import json
import struct
from pathlib import Path

from reference_engine.tools.checkpoint_io import file_size, read_range
from solutions.l11_cold_start import Read, safetensors_header, split_kind, weight_files
from tests.mutants import mutant

# -- 2. the hops ------------------------------------------------------------------------------------------


@mutant(check="hop_seconds", message="reads Gb/s as GB/s")
def hop_seconds(nbytes, hop):
    return nbytes / (hop.rate * 1e9 * hop.links)  # a 100 Gb/s NIC taken for 100 GB/s


@mutant(check="cold_start_seconds", message="adds the hops' times even when they overlap")
def cold_start_seconds(nbytes, hops, overlap, chunk_bytes=256e6):
    return sum(sol.hop_seconds(nbytes, h) for h in hops)  # noqa: F821 - serial always


@mutant(check="cold_start_seconds", message="leaves out the pipeline fill")
def cold_start_seconds(nbytes, hops, overlap, chunk_bytes=256e6):  # noqa: F811
    times = [sol.hop_seconds(nbytes, h) for h in hops]  # noqa: F821
    if not times:
        return 0.0
    return max(times) if overlap else sum(times)  # the slowest hop alone, as if the pipe were full at t=0


@mutant(check="cold_start_seconds", message="ignores the hops' links")
def cold_start_seconds(nbytes, hops, overlap, chunk_bytes=256e6):  # noqa: F811
    one = [h._replace(links=1) for h in hops]  # one PCIe link for the whole node
    return sol.cold_start_seconds(nbytes, one, overlap, chunk_bytes)  # noqa: F821


# -- 3. safetensors --------------------------------------------------------------------------------------


@mutant(check="safetensors_header", message="keeps the __metadata__ entry")
def safetensors_header(path):
    (n,) = struct.unpack("<Q", read_range(path, 0, 8))
    if 8 + n > file_size(path):
        raise ValueError("truncated")
    return json.loads(read_range(path, 8, 8 + n)), 8 + n  # the "__metadata__" entry left in


@mutant(check="shard_plan", message="splits o_proj/down_proj by rows like q/k/v")
def shard_plan(model_dir, tp, rank):
    reads = [r for r in sol.shard_plan(model_dir, tp, rank) if split_kind(r.tensor) != "row"]  # noqa: F821
    for path in weight_files(Path(model_dir)):
        header, start = safetensors_header(path)
        for name, info in header.items():
            if split_kind(name) == "row":  # every 2-D projection split the same way, by output rows
                row = sol.DTYPE_BYTES[info["dtype"]] * info["shape"][1]  # noqa: F821
                b, rows = start + info["data_offsets"][0], info["shape"][0]
                reads.append(Read(path.name, name, b + rank * rows // tp * row, b + (rank + 1) * rows // tp * row))
    return sorted(reads, key=lambda r: (r.file, r.start))


@mutant(check="shard_plan", message="uses data_offsets as file offsets")
def shard_plan(model_dir, tp, rank):  # noqa: F811
    starts = {p.name: safetensors_header(p)[1] for p in weight_files(Path(model_dir))}
    return [r._replace(start=r.start - starts[r.file], end=r.end - starts[r.file])  # forgets data_start
            for r in sol.shard_plan(model_dir, tp, rank)]  # noqa: F821


@mutant(check="load_shard", message="replicates embed_tokens/lm_head")
def load_shard(model_dir, tp, rank):
    from safetensors import safe_open

    sol.check_tp(model_dir, tp, rank)  # noqa: F821
    out = {}
    for path in weight_files(Path(model_dir)):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                kind, sl = split_kind(name), f.get_slice(name)
                shape = sl.get_shape()
                if kind == "column":
                    out[name] = sl[rank * shape[0] // tp:(rank + 1) * shape[0] // tp].contiguous()
                elif kind == "row" and len(shape) == 2:
                    out[name] = sl[:, rank * shape[1] // tp:(rank + 1) * shape[1] // tp].contiguous()
                else:  # the embedding table whole on every rank
                    out[name] = f.get_tensor(name)
    return out


# -- 2.2 the fill, done wrong in ways the other mutants are not --------------------------------------------


@mutant(check="cold_start_seconds", message="fills with chunk_bytes even when the checkpoint is smaller")
def cold_start_seconds(nbytes, hops, overlap, chunk_bytes=256e6):  # noqa: F811
    if not hops:
        return 0.0
    whole = [sol.hop_seconds(nbytes, h) for h in hops]  # noqa: F821
    if not overlap:
        return sum(whole)
    slowest = max(range(len(hops)), key=lambda i: whole[i])
    # a 4 GB chunk of a 1 GB checkpoint: the fill pays for bytes that do not exist
    return whole[slowest] + sum(sol.hop_seconds(chunk_bytes, h) for i, h in enumerate(hops) if i != slowest)  # noqa: F821


@mutant(check="cold_start_seconds", message="leaves every hop tied for slowest out of the fill")
def cold_start_seconds(nbytes, hops, overlap, chunk_bytes=256e6):  # noqa: F811
    if not hops:
        return 0.0
    whole = [sol.hop_seconds(nbytes, h) for h in hops]  # noqa: F821
    if not overlap:
        return sum(whole)
    chunk, top = min(chunk_bytes, nbytes), max(whole)
    # "the other hops" read as "the hops that are not the slowest": two equally slow hops both drop out
    return top + sum(sol.hop_seconds(chunk, h) for h, w in zip(hops, whole) if w != top)  # noqa: F821


@mutant(check="cold_start_seconds", message="counts only the hops before the slowest in the fill")
def cold_start_seconds(nbytes, hops, overlap, chunk_bytes=256e6):  # noqa: F811
    if not hops:
        return 0.0
    whole = [sol.hop_seconds(nbytes, h) for h in hops]  # noqa: F821
    if not overlap:
        return sum(whole)
    chunk = min(chunk_bytes, nbytes)
    slowest = max(range(len(hops)), key=lambda i: whole[i])
    # only the time for the first chunk to reach the slowest hop; the last chunk's trip after it is lost
    return whole[slowest] + sum(sol.hop_seconds(chunk, h) for h in hops[:slowest])  # noqa: F821


# -- 3.1 the header: short, cut and odd files; reading more than the header -----------------------------------


@mutant(check="safetensors_header", message="a file under 8 bytes cannot even hold the header length")
def safetensors_header(path):  # noqa: F811
    (n,) = struct.unpack("<Q", read_range(path, 0, 8))  # a 3-byte file: struct.error, not ValueError
    if 8 + n > file_size(path):
        raise ValueError("truncated")
    header = json.loads(read_range(path, 8, 8 + n))
    header.pop("__metadata__", None)
    return header, 8 + n


@mutant(check="safetensors_header", message="raised ValueError on a valid file that ends exactly where its header")
def safetensors_header(path):  # noqa: F811
    size = file_size(path)
    if size < 8:
        raise ValueError("too short")
    (n,) = struct.unpack("<Q", read_range(path, 0, 8))
    if 8 + n >= size:  # off by one: a checkpoint with no tensors ends right at 8 + N
        raise ValueError("truncated")
    header = json.loads(read_range(path, 8, 8 + n))
    header.pop("__metadata__", None)
    return header, 8 + n


@mutant(check="safetensors_header", message="only comparing 8 + N with the file size catches the cut")
def safetensors_header(path):  # noqa: F811
    if file_size(path) < 8:
        raise ValueError("too short")
    (n,) = struct.unpack("<Q", read_range(path, 0, 8))
    # no size check: a cut JSON fails to parse (JSONDecodeError is a ValueError), unless only its padding is cut
    header = json.loads(read_range(path, 8, 8 + n))
    header.pop("__metadata__", None)
    return header, 8 + n


@mutant(check="safetensors_header", message="only comparing 8 + N with the file size catches the cut")
def safetensors_header(path):  # noqa: F811
    size = file_size(path)
    if size < 8:
        raise ValueError("too short")
    (n,) = struct.unpack("<Q", read_range(path, 0, 8))
    if n > size:  # forgets the 8 length bytes in front of the JSON
        raise ValueError("truncated")
    header = json.loads(read_range(path, 8, 8 + n))
    header.pop("__metadata__", None)
    return header, 8 + n


@mutant(check="safetensors_header", message="reads the whole file to find the header")
def safetensors_header(path):  # noqa: F811
    size = file_size(path)
    if size < 8:
        raise ValueError("too short")
    data = read_range(path, 0, size)  # every tensor's bytes too, to parse a header of a few KB
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > size:
        raise ValueError("truncated")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return header, 8 + n


@mutant(check="safetensors_header", message="N is all 8 bytes, one little-endian unsigned 64-bit integer")
def safetensors_header(path):  # noqa: F811
    size = file_size(path)
    if size < 8:
        raise ValueError("too short")
    (n,) = struct.unpack("<I", read_range(path, 0, 4))  # the low 4 bytes only
    if 8 + n > size:
        raise ValueError("truncated")
    header = json.loads(read_range(path, 8, 8 + n))
    header.pop("__metadata__", None)
    return header, 8 + n


@mutant(check="safetensors_header", message="drops every name that starts with '_'")
def safetensors_header(path):  # noqa: F811
    header, start = sol.safetensors_header(path)  # noqa: F821
    return {k: v for k, v in header.items() if not k.startswith("_")}, start  # "private" keys dropped


# -- 3.2 the shard plan: uneven splits, order, which files ----------------------------------------------------


def _m_plan(model_dir, tp, rank, rank_range, files):
    """The shard plan with how a dimension is split and which files are read swappable."""
    sol.check_tp(model_dir, tp, rank)  # noqa: F821
    reads = []
    for path in files(Path(model_dir)):
        header, data_start = safetensors_header(path)
        for name, info in header.items():
            e, shape, kind = sol.DTYPE_BYTES[info["dtype"]], info["shape"], split_kind(name)  # noqa: F821
            b, end = data_start + info["data_offsets"][0], data_start + info["data_offsets"][1]
            if kind == "replicated" or not shape or (kind == "row" and len(shape) < 2):
                reads.append(Read(path.name, name, b, end))
            elif kind in ("column", "vocab"):
                row = e * sol._prod(shape[1:])  # noqa: F821
                lo, hi = rank_range(shape[0], tp, rank, name)
                reads.append(Read(path.name, name, b + lo * row, b + hi * row))
            else:
                cols = sol._prod(shape[1:])  # noqa: F821
                c0, c1 = rank_range(cols, tp, rank, name)
                for i in range(shape[0]):
                    s, t = b + (i * cols + c0) * e, b + (i * cols + c1) * e
                    if reads and reads[-1].tensor == name and reads[-1].end == s:
                        reads[-1] = reads[-1]._replace(end=t)
                    else:
                        reads.append(Read(path.name, name, s, t))
    return sorted(reads, key=lambda r: (r.file, r.start))


@mutant(check="shard_plan", message="which 4 ranks cannot share evenly")
def shard_plan(model_dir, tp, rank):  # noqa: F811
    def floor_range(n, tp, rank, name):  # 30 rows at tp=4: 7, 8, 7, 8, and no refusal
        return rank * n // tp, (rank + 1) * n // tp
    return _m_plan(model_dir, tp, rank, floor_range, weight_files)


@mutant(check="shard_plan", message="returns the reads in header order")
def shard_plan(model_dir, tp, rank):  # noqa: F811
    reads = sol.shard_plan(model_dir, tp, rank)  # noqa: F821
    order = {}
    for path in weight_files(Path(model_dir)):
        order.update((name, (path.name, i)) for i, name in enumerate(safetensors_header(path)[0]))
    return sorted(reads, key=lambda r: order[r.tensor])  # the JSON's key order, not (file, start)


@mutant(check="shard_plan", message="reads every *.safetensors file in the folder")
def shard_plan(model_dir, tp, rank):  # noqa: F811
    return _m_plan(model_dir, tp, rank, sol.rank_range,  # noqa: F821
                   lambda d: sorted(d.glob("*.safetensors")))  # the index ignored


# -- 3.3 the loader: refusals, whole reads, layout, which files -------------------------------------------------


def _m_load(model_dir, tp, rank, check=True, split=None, files=None):
    """The loader with its parts swappable: split(f, name, kind, shape) -> tensor for the split tensors."""
    from safetensors import safe_open

    if check:
        sol.check_tp(model_dir, tp, rank)  # noqa: F821
    out = {}
    for path in (files or weight_files)(Path(model_dir)):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                shape, kind = sl.get_shape(), split_kind(name)
                if (kind in ("column", "vocab") and shape) or (kind == "row" and len(shape) == 2):
                    out[name] = split(f, name, kind, shape)
                else:
                    out[name] = f.get_tensor(name)
    return out


def _m_exact(f, name, kind, shape, tp, rank):
    dim = 0 if kind in ("column", "vocab") else 1
    lo, hi = sol.rank_range(shape[dim], tp, rank, name)  # noqa: F821
    return (f.get_slice(name)[lo:hi] if dim == 0 else f.get_slice(name)[:, lo:hi]).contiguous()


@mutant(check="load_shard", message="4 ranks cannot share 2 KV heads")
def load_shard(model_dir, tp, rank):  # noqa: F811
    return _m_load(model_dir, tp, rank, check=False,  # no check_tp: rank 2 of 2 gets empty slices
                   split=lambda f, n, k, s: _m_exact(f, n, k, s, tp, rank))


@mutant(check="load_shard", message="which 4 ranks cannot share evenly")
def load_shard(model_dir, tp, rank):  # noqa: F811
    def floor_split(f, name, kind, shape):
        dim = 0 if kind in ("column", "vocab") else 1
        lo, hi = rank * shape[dim] // tp, (rank + 1) * shape[dim] // tp  # 30 rows at tp=4: 7, 8, 7, 8
        return (f.get_slice(name)[lo:hi] if dim == 0 else f.get_slice(name)[:, lo:hi]).contiguous()
    return _m_load(model_dir, tp, rank, split=floor_split)


@mutant(check="load_shard", message="which 4 ranks cannot share evenly")
def load_shard(model_dir, tp, rank):  # noqa: F811
    def chunk(f, name, kind, shape):  # torch.chunk of the whole tensor: uneven parts, and every byte read
        return f.get_tensor(name).chunk(tp, dim=0 if kind in ("column", "vocab") else 1)[rank].contiguous()
    return _m_load(model_dir, tp, rank, split=chunk)


@mutant(check="load_shard", message="reads every tensor whole (get_tensor) and slices it afterwards")
def load_shard(model_dir, tp, rank):  # noqa: F811
    def whole_then_slice(f, name, kind, shape):
        dim = 0 if kind in ("column", "vocab") else 1
        lo, hi = sol.rank_range(shape[dim], tp, rank, name)  # noqa: F821
        x = f.get_tensor(name)  # the whole tensor read, three quarters of it thrown away at tp=4
        return (x[lo:hi] if dim == 0 else x[:, lo:hi]).contiguous()
    return _m_load(model_dir, tp, rank, split=whole_then_slice)


@mutant(check="load_shard", message="returned non-contiguous tensors")
def load_shard(model_dir, tp, rank):  # noqa: F811
    def strided(f, name, kind, shape):
        if kind != "row":
            return _m_exact(f, name, kind, shape, tp, rank)
        lo, hi = sol.rank_range(shape[1], tp, rank, name)  # noqa: F821
        return f.get_tensor(name)[:, lo:hi]  # a view with the whole row's stride, no .contiguous()
    return _m_load(model_dir, tp, rank, split=strided)


@mutant(check="load_shard", message="reads every *.safetensors file in the folder")
def load_shard(model_dir, tp, rank):  # noqa: F811
    return _m_load(model_dir, tp, rank, split=lambda f, n, k, s: _m_exact(f, n, k, s, tp, rank),
                   files=lambda d: sorted(Path(d).glob("*.safetensors")))  # the index ignored


# ---------------------------------------------------------------- malformed return values

@mutant(check="safetensors_header", message="header a dict keyed by tensor name (str), got keys of types int and str")
def safetensors_header(path):  # noqa: F811
    header, start = sol.safetensors_header(path)  # noqa: F821
    first = next(iter(header))
    header[0] = header.pop(first)  # the first entry keyed by its position instead of its name
    return header, start


@mutant(check="load_shard", message="load_shard should return a dict keyed by tensor name (str), got keys of types int")
def load_shard(model_dir, tp, rank):  # noqa: F811
    out = sol.load_shard(model_dir, tp, rank)  # noqa: F821
    return {i if name.endswith("bias") else name: x for i, (name, x) in enumerate(out.items())}


_M_LOADED: set = set()  # the folders load_shard has read in this process


@mutant(check="load_shard", message="cannot be put back together")
def load_shard(model_dir, tp, rank):  # noqa: F811
    # a second rank of a folder already loaded takes lm_head from a flattened cache: right shape for rank 0 only
    out = sol.load_shard(model_dir, tp, rank)  # noqa: F821
    if model_dir in _M_LOADED and "lm_head.weight" in out:
        out["lm_head.weight"] = out["lm_head.weight"].flatten()
    _M_LOADED.add(model_dir)
    return out


# -- a wrong upstream exercise is blamed by the check of the exercise that calls it -------------------------------


@mutant(check="cold_start_seconds", message="cold_start_seconds depends on hop_seconds, which fails")
def hop_seconds(nbytes, hop):  # noqa: F811 - the solution's cold_start_seconds calls this one
    return nbytes / (hop.rate * 1e9 * hop.links)  # Gb/s read as GB/s: a hop_seconds mistake, not a chain one


@mutant(check="shard_plan", message="shard_plan depends on safetensors_header, which fails")
def safetensors_header(path):  # noqa: F811 - the solution's shard_plan calls this one
    header, start = sol.safetensors_header(path)  # noqa: F821
    return header, start - 8  # the JSON length N, not where the data starts (8 + N): every read lands 8 bytes early
