"""Measured HBM bandwidth per chip, with where each number came from: the table the calibrated clock reads.

The calibrated clock (calibration.py) prices every memory-bound kernel at a fraction of the chip's datasheet
bandwidth. For A100 that fraction is cited (gpt-fast's 1,700 of 2,039 GB/s); for H100 and H200 it is an
assumption until a GPU machine measures it. `python -m autograder.gpu_check --perf` does: it times a read-bound
and a copy kernel over a buffer far larger than L2 with CUDA events and writes one record to
`gpu-check-report/measured-memory.json`. Adding that record to this module's table,

    python -m reference_engine.sim.measured --add gpu-check-report/measured-memory.json

makes calibration.calibration_for use it for that chip (the newest record per chip), and the validation table
(validation.py) says so beside its cases. A record carries its provenance: the device's own name, the date, the
torch and triton versions, the method and the measured numbers; a record without them is refused.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TABLE = Path(__file__).with_name("measured_memory.json")
FIELDS = {"chip": str, "device_name": str, "date": str, "torch": str, "triton": (str, type(None)), "method": str,
          "read_GB_s": float, "copy_GB_s": float, "peak_GB_s": float, "buffer_GiB": float}


def validate(record: dict) -> dict:
    """record, if it has every provenance field of the right type and a plausible bandwidth; else ValueError."""
    if not isinstance(record, dict):
        raise ValueError(f"a measured-memory record is a JSON object, not {type(record).__name__}")
    missing = [k for k in FIELDS if k not in record]
    if missing:
        raise ValueError(f"measured-memory record lacks {', '.join(missing)}: every number says where it came from")
    for k, kind in FIELDS.items():
        v = record[k]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float else isinstance(v, kind)
        if not ok:
            raise ValueError(f"measured-memory record: {k} = {v!r} is not a {getattr(kind, '__name__', kind)}")
    if not 0 < record["read_GB_s"] <= record["peak_GB_s"]:
        raise ValueError(f"measured-memory record for {record['chip']}: read {record['read_GB_s']} GB/s is not "
                         f"between 0 and the datasheet peak {record['peak_GB_s']} GB/s")
    return record


def load(path: Path = TABLE) -> dict[str, dict]:
    """The newest valid record per chip name (gpu_model's Chip.name), from the table at path (missing: none)."""
    if not path.exists():
        return {}
    newest: dict[str, dict] = {}
    for record in json.loads(path.read_text()):
        validate(record)
        if record["chip"] not in newest or record["date"] >= newest[record["chip"]]["date"]:
            newest[record["chip"]] = record
    return newest


def mem_eff(record: dict) -> float:
    """The achievable fraction of the datasheet bandwidth a record measured (its read-bound kernel)."""
    return record["read_GB_s"] / record["peak_GB_s"]


def source(record: dict) -> str:
    return (f"measured by gpu_check on {record['device_name']}, {record['date']} (torch {record['torch']}, "
            f"{record['method']}): {record['read_GB_s']:.0f} of {record['peak_GB_s']:.0f} GB/s")


def measure(chip, buffer_gib: float = 4.0, repeats: int = 20) -> dict:
    """One record for `chip` (gpu_model's Chip the device is) from the current CUDA device: the best of `repeats`
    CUDA-event-timed passes of a read-bound reduction (x.sum() in fp32 accumulation over a bf16 buffer: bytes read
    = buffer) and of a copy (bytes moved = 2 x buffer), the buffer `buffer_gib` GiB, far past any L2."""
    import datetime

    import torch

    n = int(buffer_gib * 2**30) // 2
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    out = torch.empty((), dtype=torch.float32, device="cuda")

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return min(times)

    read_s = best(lambda: torch.sum(x, dtype=torch.float32, out=out))
    copy_s = best(lambda: y.copy_(x))
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    nbytes = 2 * n
    return validate({"chip": chip.name, "device_name": torch.cuda.get_device_name(0),
                     "date": datetime.date.today().isoformat(), "torch": torch.__version__,
                     "triton": triton_version,
                     "method": f"CUDA events, best of {repeats}: torch.sum of a bf16 buffer (read), copy_ (read+write)",
                     "read_GB_s": nbytes / read_s / 1e9, "copy_GB_s": 2 * nbytes / copy_s / 1e9,
                     "peak_GB_s": float(chip.bandwidth / 1e9), "buffer_GiB": float(buffer_gib)})


def add(record_path: Path, table: Path = TABLE) -> dict:
    """Append the record gpu_check wrote at record_path to the table (validated first)."""
    record = validate(json.loads(Path(record_path).read_text()))
    records = json.loads(table.read_text()) if table.exists() else []
    records.append(record)
    table.write_text(json.dumps(records, indent=1) + "\n")
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reference_engine.sim.measured", description=__doc__.split("\n")[0])
    p.add_argument("--add", metavar="RECORD", help="a measured-memory.json that gpu_check --perf wrote")
    args = p.parse_args(argv)
    if args.add:
        print("added:", source(add(Path(args.add))))
    records = load()
    if not records:
        print("no measured chip yet: the calibrated clock uses the cited or assumed fractions (calibration.py)")
    for chip, r in sorted(records.items()):
        print(f"{chip}: mem_eff {mem_eff(r):.3f}, {source(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
