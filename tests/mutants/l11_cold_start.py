"""Plausible wrong answers for lesson 11; each must be caught, and named, by its check.

Graded as source (see tests/mutants/__init__.py): `sol` is the right answer's namespace, helpers here
are prefixed `_m_`."""
import json
import struct
from pathlib import Path

from reference_engine.checkpoint_io import file_size, read_range
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
