"""One prepared check of the whole course on a GPU machine (and, with the GPU parts skipped, on a CPU).

    PYTHONPATH=. python3 -m autograder.gpu_check [--out DIR] [--lessons 01 04 ...] [--quick] [--perf]

Needs only what a GPU machine already has (torch, triton; transformers for the engine benchmark's
baseline): no network, no install. Within a few minutes it
  1. runs `course doctor` (versions, device, a Triton self-test);
  2. compiles and tests the engine's Triton kernels natively against their torch references, in fp32 and,
     on CUDA, in bf16 (on a CPU: the interpreter, fp32, small sizes);
  3. grades every ready lesson with the solutions; on CUDA the GPU-only cases are graded too;
  4. times the engine's paged decode kernel on a Llama-3-8B-shaped decode batch and reports the bandwidth
     it reaches as a share of the chip's HBM peak (CUDA only);
     and times lesson 16's W4A16 kernel against the bf16 matmul at 1, 4 and 16 rows (CUDA only);
  5. measures the chip's HBM bandwidth and writes it, with its provenance, as a record for the calibrated
     clock's table (`reference_engine.sim.measured`), then prints the modeled-vs-measured kernel table of
     `reference_engine.sim.gpu_model` (CUDA only);
  6. runs the engine benchmark (`reference_engine.tools.bench`) on CUDA (CUDA only);
and writes `gpu-check.json` and `gpu-check.txt` to DIR. Each part is "passed", "failed" or "skipped"
(with the reason); a part that needs a GPU is "skipped" on a CPU, never "passed". Exit code 0 when no
part failed.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import platform
import sys
import time
import traceback
from pathlib import Path

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def _part(name: str, fn, *args) -> dict:
    """Run one part; whatever it raises is that part's failure, never the whole run's."""
    start, out = time.perf_counter(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            status, detail, data = fn(*args)
    except Exception:  # noqa: BLE001 - a broken part is reported, the next part still runs
        status, detail, data = FAILED, traceback.format_exc(limit=6), {}
    return {"part": name, "status": status, "detail": detail, "data": data, "output": out.getvalue(),
            "seconds": round(time.perf_counter() - start, 2)}


# ---------------------------------------------------------------- 1. doctor


def doctor() -> tuple[str, str, dict]:
    from autograder import doctor as d
    code = d.run()
    return (PASSED if code == 0 else FAILED), "course doctor " + ("passed" if code == 0 else f"exited {code}"), {}


# ---------------------------------------------------------------- 2. the engine's Triton kernels


def _cache(num_blocks, block_size, kv_heads, head_dim, dtype, device, g):
    import torch
    return tuple(torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(device, dtype) for _ in "kv")


def _tables(context_lens, block_size, num_blocks, device, g):
    """Distinct shuffled blocks per sequence (non-contiguous, as after churn); padding repeats block 0."""
    import torch
    perm = torch.randperm(num_blocks, generator=g).tolist()
    need = [-(-c // block_size) for c in context_lens]
    rows, at = [], 0
    for n in need:
        rows.append(perm[at:at + n] + [0] * (max(need) - n))
        at += n
    return torch.tensor(rows, dtype=torch.int32, device=device)


def _kernel_cases(device: str) -> list[tuple[str, object]]:
    """(name, dtype) pairs: fp32 everywhere, bf16 only natively (the interpreter keeps bf16 out)."""
    import torch
    return [("fp32", torch.float32)] + ([("bf16", torch.bfloat16)] if device == "cuda" else [])


def _tol(dtype):
    import torch
    return dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=2e-3, rtol=2e-3)


def kernels(device: str) -> tuple[str, str, dict]:
    """paged decode, chunked prefill and the KV write: Triton == torch reference, per dtype."""
    import torch

    from reference_engine.kernels import paged_decode_torch, prefill_torch, triton_kernels, write_kv_torch
    tk, results = triton_kernels(), {}
    for label, dtype in _kernel_cases(device):
        g = torch.Generator().manual_seed(0)
        kvh, group, d, bs, nb = 2, 4, 32, 16, 48
        kc, vc = _cache(nb, bs, kvh, d, dtype, device, g)
        ctx = [1, 15, 16, 17, 40, 130]
        bt = _tables(ctx, bs, nb, device, g)
        cl = torch.tensor(ctx, dtype=torch.int32, device=device)
        q = torch.randn(len(ctx), kvh * group, d, generator=g).to(device, dtype)
        ref = paged_decode_torch(q.float(), kc.float(), vc.float(), bt, cl, d ** -0.5)
        out = tk.paged_decode_triton(q, kc, vc, bt, cl, d ** -0.5)
        results[f"paged_decode {label}"] = _close(out.float(), ref, dtype)
        out = tk.flash_decode_triton(q, kc, vc, bt, cl, d ** -0.5, splits=3)
        results[f"flash_decode {label}"] = _close(out.float(), ref, dtype)

        chunks = [(5, 5), (7, 20), (16, 40)]  # (chunk tokens, context after the chunk)
        ctx = [c for _, c in chunks]
        bt = _tables(ctx, bs, nb, device, g)
        cu = [0]
        for n, _ in chunks:
            cu.append(cu[-1] + n)
        q = torch.randn(cu[-1], kvh * group, d, generator=g).to(device, dtype)
        k = torch.randn(cu[-1], kvh, d, generator=g).to(device, dtype)
        v = torch.randn(cu[-1], kvh, d, generator=g).to(device, dtype)
        slots = torch.cat([bt[i, (torch.arange(c - n, c, device=device) // bs)] * bs
                           + torch.arange(c - n, c, device=device) % bs for i, (n, c) in enumerate(chunks)])
        kc2, vc2 = kc.clone(), vc.clone()
        write_kv_torch(k, v, kc, vc, slots)
        tk.write_kv_triton(k, v, kc2, vc2, slots)
        results[f"write_kv {label}"] = "" if torch.equal(kc, kc2) and torch.equal(vc, vc2) else \
            "the Triton KV write differs from the torch one"
        ref = prefill_torch(q.float(), k.float(), v.float(), kc.float(), vc.float(), cu, ctx, bt, d ** -0.5)
        out = tk.prefill_triton(q, k, v, kc, vc, cu, ctx, bt, d ** -0.5)
        results[f"prefill {label}"] = _close(out.float(), ref, dtype)
        out = tk.flash_decode_triton(q, kc, vc, bt, torch.tensor(ctx, dtype=torch.int32, device=device), d ** -0.5,
                                     cu_seqlens_q=cu, splits=2)
        results[f"flash_decode verification rows {label}"] = _close(out.float(), ref, dtype)
    bad = {k: v for k, v in results.items() if v}
    detail = "; ".join(f"{k}: {v}" for k, v in bad.items()) or \
        f"{len(results)} kernel cases match torch ({', '.join(results)})" + (
            "" if device == "cuda" else "; under the Triton interpreter, fp32 only (bf16 needs a GPU)")
    return (FAILED if bad else PASSED), detail, {"cases": {k: v or "ok" for k, v in results.items()}}


def _close(out, ref, dtype) -> str:
    import torch
    try:
        torch.testing.assert_close(out, ref, **_tol(dtype))
        return ""
    except AssertionError as e:
        return str(e).splitlines()[-1] if str(e) else "mismatch"


# ---------------------------------------------------------------- 3. every lesson, with the solutions


def lessons_part(stems: list[str], seed: int) -> tuple[str, str, dict]:
    from autograder import lessons
    from autograder.runner import Target, grade_lesson
    rows, failed, not_graded = {}, [], 0
    for stem in stems:
        results = grade_lesson(stem, Target.for_lesson(stem, solutions=True), seed)
        rows[stem] = {r.name: {"status": r.status, "earned": r.earned, "points": r.points,
                               # a failing check's whole message: its traceback is what a fix on the GPU machine needs
                               "message": r.message if r.status != "passed" else r.message[:300]}
                   for r in results}
        failed += [f"{stem}.{r.name}: {r.status}" for r in results if r.status not in ("passed", "not graded here")]
        not_graded += sum(1 for r in results for p in r.parts if not getattr(p, "graded", True)) + \
            sum(1 for r in results if r.status == "not graded here")
    known = {lesson.stem for lesson in lessons.available()}
    detail = (f"{len(stems)} lesson(s) of {len(known)} graded with the solutions, seed {seed}; "
              + (f"FAILED: {'; '.join(failed)}" if failed else "every check passed")
              + (f"; {not_graded} GPU-only case(s) or check(s) not graded here" if not_graded else ""))
    return (FAILED if failed else PASSED), detail, {"seed": seed, "lessons": rows, "not_graded_here": not_graded}


# ---------------------------------------------------------------- 4. paged decode vs HBM bandwidth


def paged_decode_bandwidth(device: str, quick: bool) -> tuple[str, str, dict]:
    """Llama-3-8B decode attention of one layer (32 query heads, 8 KV heads, head_dim 128), bf16, batch B at
    context L: a kernel must read B * L * 8 * 128 * 2 (K and V) * 2 bytes; bandwidth = bytes / time. Three kernels
    side by side, each timed with CUDA events over a queued window: the engine's flash-decoding kernel (split
    context, tensor-core tiles), the simple one-program-per-KV-head kernel lesson 04's learner kernel is timed
    against, and torch's SDPA (its FlashAttention/efficient backend) on contiguous K/V, which needs no block table."""
    if device != "cuda":
        return SKIPPED, "needs a CUDA GPU (a CPU time of the interpreter says nothing about HBM bandwidth)", {}
    import torch
    import torch.nn.functional as F

    from reference_engine.kernels import triton_kernels
    from reference_engine.sim.gpu_model import H100, _chip_of_device, _time_rotating
    tk = triton_kernels()
    chip = _chip_of_device(torch.cuda.get_device_name(0), H100)
    rows = []
    for batch, context in ([(8, 4096), (64, 4096)] if quick else [(8, 4096), (64, 4096), (256, 2048)]):
        bs, kvh, heads, d = 16, 8, 32, 128
        nb = batch * context // bs
        g = torch.Generator().manual_seed(0)
        kc = torch.randn(nb, bs, kvh, d, generator=g).to("cuda", torch.bfloat16)
        vc = torch.randn_like(kc)
        bt = torch.randperm(nb, generator=g).view(batch, context // bs).to("cuda", torch.int32)
        cl = torch.full((batch,), context, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, heads, d, device="cuda", dtype=torch.bfloat16)
        kq = kc.view(batch, context, kvh, d).transpose(1, 2)  # contiguous per sequence: SDPA's layout
        vq = vc.view(batch, context, kvh, d).transpose(1, 2).contiguous()
        kq = kq.contiguous()
        qg = q.view(batch, kvh, heads // kvh, d)
        nbytes = 2 * batch * context * kvh * d * 2
        kernels = [("flash_decode (engine)", functools.partial(tk.flash_decode_triton, max_context=context),
                    (q, kc, vc, bt, cl, d ** -0.5)),
                   ("paged_decode (simple)", tk.paged_decode_triton, (q, kc, vc, bt, cl, d ** -0.5)),
                   ("torch SDPA, contiguous K/V", F.scaled_dot_product_attention, (qg, kq, vq))]
        for name, fn, args in kernels:
            seconds = _time_rotating(fn, [args], torch.device("cuda"))
            rows.append({"kernel": name, "batch": batch, "context": context, "us": seconds * 1e6,
                         "GB/s": nbytes / seconds / 1e9, "pct_of_peak": 100 * nbytes / seconds / chip.bandwidth})
        del kernels, kc, vc, kq, vq
    text = "; ".join(f"{r['kernel']} B={r['batch']} L={r['context']}: {r['us']:.0f} us, {r['GB/s']:.0f} GB/s = "
                     f"{r['pct_of_peak']:.0f}%" for r in rows)
    return PASSED, (f"measured on {torch.cuda.get_device_name(0)} with CUDA events (% of {chip.name}'s "
                    f"{chip.bandwidth / 1e9:.0f} GB/s): {text}"), {"chip": chip.name, "rows": rows}


def w4a16_speed(device: str, quick: bool) -> tuple[str, str, dict]:
    """Lesson 16's W4A16 kernel (the solution's) against the bf16 matmul of the same weight, on Llama-3-8B's MLP
    shapes (gate_up [28672, 4096], down [4096, 14336]; int4, groups of 128, asymmetric) at 1, 4 and 16 rows, each
    timed as the lesson's check times it (autograder.harnesses.timing: CUDA events, L2 flushed before each call).
    The goal is at least 2x at these batches (a measurement: reported, not judged)."""
    if device != "cuda":
        return SKIPPED, "needs a CUDA GPU (the interpreter's time says nothing about a kernel's speed)", {}
    from autograder.harnesses.l16_quantization import timing_inputs
    from autograder.harnesses.timing import seconds_per_call
    from solutions import l16_quantization as l16
    rows = []
    for name, n, k in [("gate_up", 28672, 4096), ("down", 4096, 14336)][: 1 if quick else 2]:
        x16, qw, wb = timing_inputs(0, "cuda", n, k, 16)  # the check's inputs: the engine's quantizer and packing
        for m in (1, 4, 16):
            x = x16[:m]
            mine = seconds_per_call(lambda x=x, qw=qw: l16.w4a16_matmul(x, qw), 50)
            bf16 = seconds_per_call(lambda x=x, wb=wb: x @ wb.T, 50)
            nbytes = n * k / 2 + 3 * n * k / 128  # packed int4, an fp16 scale and a uint8 zero per group of 128
            rows.append({"weight": name, "N": n, "K": k, "M": m, "w4a16_us": mine * 1e6, "bf16_us": bf16 * 1e6,
                         "speedup": bf16 / mine, "w4a16_GB_s": nbytes / mine / 1e9})
    text = "; ".join(f"{r['weight']} M={r['M']}: {r['w4a16_us']:.1f} vs {r['bf16_us']:.1f} us = {r['speedup']:.2f}x"
                     for r in rows)
    low = [r for r in rows if r["speedup"] < 2]
    return PASSED, (f"{text} (goal >= 2x at these batches: {'met' if not low else f'not met in {len(low)} of {len(rows)}'})"), \
        {"rows": rows}


# ---------------------------------------------------------------- 5. HBM bandwidth, and the modeled clock vs measured kernels


def memory_bandwidth(device: str, out_dir: Path) -> tuple[str, str, dict]:
    """The chip's achievable HBM bandwidth (reference_engine.sim.measured.measure), written as a record with its
    provenance to DIR/measured-memory.json for the calibrated clock's table."""
    if device != "cuda":
        return SKIPPED, "needs a CUDA GPU (the calibrated clock's memory fraction is measured on the chip itself)", {}
    import torch

    from reference_engine.sim import gpu_model as gm
    from reference_engine.sim import measured
    chip = gm._chip_of_device(torch.cuda.get_device_name(0), gm.H100)
    record = measured.measure(chip)
    path = out_dir / "measured-memory.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return PASSED, (f"{record['read_GB_s']:.0f} GB/s read, {record['copy_GB_s']:.0f} GB/s copy = "
                    f"{measured.mem_eff(record):.3f} of {chip.name}'s {record['peak_GB_s']:.0f} GB/s; add it to the "
                    f"calibrated clock's table: python -m reference_engine.sim.measured --add {path}"), record


def calibration(device: str, quick: bool) -> tuple[str, str, dict]:
    if device != "cuda":
        return SKIPPED, "needs a CUDA GPU (the modeled clock is compared with measured GPU kernels)", {}
    import torch

    from reference_engine.sim import gpu_model as gm
    chip = gm._chip_of_device(torch.cuda.get_device_name(0), gm.H100)
    rows = gm.calibrate(gm.LLAMA_3_8B, chip, batches=(1, 64) if quick else (1, 16, 64, 256),
                        chunks=(512,) if quick else (256, 1024))
    print(gm._calibration_text(rows, chip, torch.cuda.get_device_name(0)))
    ratios = [r["measured_s"] / r["modeled_s"] for r in rows]
    return PASSED, (f"{len(rows)} kernels timed; measured/modeled from {min(ratios):.2f} to {max(ratios):.2f} "
                    "(the table is in the output)"), {"chip": chip.name, "rows": rows}


# ---------------------------------------------------------------- 6. the engine benchmark


def engine_bench(device: str, quick: bool, out_dir: Path) -> tuple[str, str, dict]:
    if device != "cuda":
        return SKIPPED, ("needs a CUDA GPU (on a CPU, run `python -m reference_engine.tools.bench`: it measures this "
                         "machine, which teaches nothing about GPU serving)"), {}
    import importlib.util

    from reference_engine.tools import bench
    args = ["--device", "cuda", "--num-requests", "32" if quick else "64", "--json", str(out_dir / "bench.json")]
    if importlib.util.find_spec("transformers") is None:
        args.append("--skip-hf")
    report = bench.main(args)
    return PASSED, "engine benchmark ran on cuda (bench.json)", {"report": report}


# ---------------------------------------------------------------- the run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="gpu-check-report", help="directory for gpu-check.json / gpu-check.txt")
    p.add_argument("--lessons", nargs="*", help="lesson numbers or stems (default: every ready lesson)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smaller timing sweeps")
    p.add_argument("--perf", action="store_true",
                   help="the performance parts only (kernels, bandwidth sweep, calibration, engine benchmark): no "
                        "lesson grading; fits a few minutes of a lent GPU")
    args = p.parse_args(argv)
    from autograder import lessons, runtime
    device = runtime.setup()
    import torch
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stems = [lessons.find(x).stem for x in args.lessons] if args.lessons else \
        [lesson.stem for lesson in lessons.available()]
    start, parts = time.perf_counter(), []
    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({platform.machine()})",
              "torch": torch.__version__, "python": platform.python_version(), "seconds": 0.0, "parts": parts}
    try:
        import triton
        report["triton"] = triton.__version__
    except ImportError:
        report["triton"] = None
    plan = [("doctor", doctor), ("triton kernels", kernels, device)] + \
        ([] if args.perf else [("lessons with the solutions", lessons_part, stems, args.seed)]) + [
            ("paged decode bandwidth", paged_decode_bandwidth, device, args.quick),
            ("W4A16 vs bf16 (lesson 16's kernel)", w4a16_speed, device, args.quick),
            ("HBM bandwidth (measured table)", memory_bandwidth, device, out_dir),
            ("modeled clock vs measured kernels", calibration, device, args.quick),
            ("engine benchmark", engine_bench, device, args.quick, out_dir)]
    for name, fn, *fn_args in plan:
        parts.append(_part(name, fn, *fn_args))
        # The report is rewritten after every part, so a run stopped by a time limit still leaves what it did.
        report["seconds"] = round(time.perf_counter() - start, 1)
        _write(report, out_dir)
        print("\n".join(summary({**report, "parts": parts[-1:]}).splitlines()[1:]), flush=True)
    text = _write(report, out_dir)
    print(text)
    return 1 if any(part["status"] == FAILED for part in parts) else 0


def _write(report: dict, out_dir: Path) -> str:
    (out_dir / "gpu-check.json").write_text(json.dumps(report, indent=1, default=str))
    text = summary(report)
    (out_dir / "gpu-check.txt").write_text(text + "\n")
    return text


def summary(report: dict) -> str:
    lines = [f"gpu-check on {report['device']} (torch {report['torch']}, triton {report['triton']}, "
             f"python {report['python']}), {report['seconds']} s"]
    for part in report["parts"]:
        lines.append(f"  {part['status']:<8} {part['part']:<36} {part['seconds']:>7.1f} s  {part['detail'].strip()}")
        if part["status"] == FAILED and part["output"]:
            lines += ["      " + line for line in part["output"].strip().splitlines()[-15:]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
