"""Lesson 11 beyond the shared tests: the checks' variants against the solution, every named mistake shown by
a visible case, the shard plan against the bytes the loader returns, and the measurement helpers."""
import collections
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from autograder.checks import l11_cold_start as C
from autograder.compare import compare
from reference_engine.shipped import TARGET as SHIPPED
from reference_engine.tools import checkpoint_io as ck
from solutions import l11_cold_start as S


def _same(a, b):
    return compare(a, b, rtol=1e-12, atol=1e-12) is None


def _hop(h):
    return S.Hop(*h)


def test_hop_and_chain_variants_with_no_mistake_are_the_solution():
    rng = random.Random(1)
    for _ in range(300):
        nbytes, hop = rng.uniform(1e9, 2e11), C.random_hop(rng)
        assert S.hop_seconds(nbytes, _hop(hop)) == pytest.approx(C.hop_variant(nbytes, hop), rel=1e-12)
        nbytes, hops, overlap, chunk = C.random_chain(rng)
        got = S.cold_start_seconds(nbytes, [_hop(h) for h in hops], overlap, chunk)
        assert got == pytest.approx(C.chain_variant(nbytes, hops, overlap, chunk), rel=1e-12)


def test_plan_and_shard_variants_with_no_mistake_are_the_solution(tmp_path):
    rng = random.Random(2)
    for i in range(6):
        spec, tp, rank = C._hidden_plan(rng)
        d = tmp_path / str(i)
        d.mkdir()
        C.write_checkpoint(spec, d)
        assert [list(r) for r in S.shard_plan(d, tp, rank)] == C.plan_variant(d, tp, rank)
        assert _same(dict(S.load_shard(d, tp, rank)), C.shard_variant(d, tp, rank))


def test_every_named_mistake_shows_in_a_visible_case(tmp_path):
    seen = set()
    for _, (nbytes, hop) in C.VISIBLE_HOPS:
        exp = S.hop_seconds(nbytes, _hop(hop))
        seen |= {k for k, v in C.HOP_MISTAKES.items() if abs(C.hop_variant(nbytes, hop, **v) - exp) > 1e-9 * exp}
    assert seen == set(C.HOP_MISTAKES)
    seen = set()
    for _, (nbytes, hops, overlap, chunk) in C.VISIBLE_CHAINS:
        exp = S.cold_start_seconds(nbytes, [_hop(h) for h in hops], overlap, chunk)
        seen |= {k for k, v in C.CHAIN_MISTAKES.items()
                 if abs(C.chain_variant(nbytes, hops, overlap, chunk, **v) - exp) > 1e-9 * max(exp, 1e-9)}
    assert seen == set(C.CHAIN_MISTAKES)
    plan_seen, shard_seen = set(), set()
    for i, (_, (spec, tp, rank)) in enumerate(C._plan_cases(_Cases())):
        d = tmp_path / str(i)
        d.mkdir()
        C.write_checkpoint(spec, d)
        exp = C.plan_variant(d, tp, rank)
        plan_seen |= {k for k, v in C.PLAN_MISTAKES.items() if C.plan_variant(d, tp, rank, **v) != exp}
        exp = C.shard_variant(d, tp, rank)
        shard_seen |= {k for k, v in C.SHARD_MISTAKES.items() if not _same(C.shard_variant(d, tp, rank, **v), exp)}
    assert plan_seen == set(C.PLAN_MISTAKES) and shard_seen == set(C.SHARD_MISTAKES)


class _Cases:
    """Just enough of the check context for `_plan_cases` to list the visible cases."""
    def cases(self, visible, hidden, n):
        return list(visible)


def test_docstring_examples():
    assert S.hop_seconds(141e9, S.Hop("net", 100, "Gb/s")) == pytest.approx(11.28)
    assert S.hop_seconds(141e9, S.Hop("pcie", 63, "GB/s", links=8)) == pytest.approx(141 / 504)
    hops = [S.Hop("a", 1), S.Hop("b", 2)]
    assert S.cold_start_seconds(10e9, hops, False, 1e9) == pytest.approx(15.0)
    assert S.cold_start_seconds(10e9, hops, True, 1e9) == pytest.approx(10.5)
    assert S.cold_start_seconds(1e9, [], True) == 0.0
    with pytest.raises(ValueError):
        S.hop_seconds(1.0, S.Hop("x", 1, "MB/s"))


def test_pipelined_is_never_slower_than_serial_nor_faster_than_the_slowest_hop():
    rng = random.Random(3)
    for _ in range(300):
        nbytes, hops, _, chunk = C.random_chain(rng)
        hops = [_hop(h) for h in hops]
        piped, serial = S.cold_start_seconds(nbytes, hops, True, chunk), S.cold_start_seconds(nbytes, hops, False, chunk)
        assert max(S.hop_seconds(nbytes, h) for h in hops) <= piped * (1 + 1e-12) and piped <= serial * (1 + 1e-12)


def test_the_plan_reads_exactly_the_loaders_bytes():
    raw = (SHIPPED / "model.safetensors").read_bytes()
    full = load_file(str(SHIPPED / "model.safetensors"))
    for tp in (1, 2):
        for rank in range(tp):
            shard = S.load_shard(SHIPPED, tp, rank)
            by = collections.defaultdict(bytes)
            for r in S.shard_plan(SHIPPED, tp, rank):
                by[r.tensor] += raw[r.start:r.end]
            assert set(by) == set(shard) == set(full)
            assert all(by[k] == t.numpy().tobytes() for k, t in shard.items())
    assert S.plan_bytes(S.shard_plan(SHIPPED, 1, 0)) == sum(t.numel() * t.element_size() for t in full.values())


def test_tp1_is_the_checkpoint_and_ranks_concatenate_back():
    full = load_file(str(SHIPPED / "model.safetensors"))
    one = S.load_shard(SHIPPED, 1, 0)
    assert set(one) == set(full) and all(torch.equal(one[k], full[k]) for k in full)
    parts = [S.load_shard(SHIPPED, 2, r) for r in range(2)]
    for k, x in full.items():
        kind = S.split_kind(k)
        dim = 0 if kind in ("column", "vocab") else 1 if kind == "row" and x.dim() == 2 else None
        back = parts[0][k] if dim is None else torch.cat([p[k] for p in parts], dim)
        assert torch.equal(back, x), k


def test_header_errors(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes((10**6).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="truncated"):
        S.safetensors_header(p)
    with pytest.raises(ValueError):
        S.shard_plan(SHIPPED, 4, 0)  # 2 KV heads cannot be split 4 ways
    with pytest.raises(ValueError):
        S.shard_plan(SHIPPED, 2, 2)


def test_checkpoint_io_reads_only_checkpoint_files_and_measures(tmp_path):
    with pytest.raises(ValueError, match="only checkpoint files"):
        ck.read_range(Path(S.__file__), 0, 10)
    files = ck.write_random_checkpoint(tmp_path, 8e6, hidden=64, inter=128, files=2)
    n = sum(p.stat().st_size for p in files)
    assert ck.load_eager(tmp_path) == ck.load_mmap(tmp_path) and 0.9 * n < ck.load_eager(tmp_path) <= n
    ck.drop_from_page_cache(files)
    frac = ck.resident_fraction(files)
    assert frac != frac or 0.0 <= frac <= 1.0  # nan where mincore is unavailable
    shard = S.load_shard(tmp_path, 8, 3)
    assert sum(t.numel() * t.element_size() for t in shard.values()) < n / 4
    assert ck.h2d_bandwidth(1 << 20) is None or torch.cuda.is_available()


def test_the_fill_mistakes_are_each_named_alone_on_some_visible_case():
    # A mistake is named only when its value is unique on a case; make sure each of these has such a case.
    for flag in ("no_clamp", "ties_out", "before_only"):
        unique = False
        for _, (nbytes, hops, overlap, chunk) in C.VISIBLE_CHAINS:
            exp = C.chain_variant(nbytes, hops, overlap, chunk)
            vals = {k: C.chain_variant(nbytes, hops, overlap, chunk, **v) for k, v in C.CHAIN_MISTAKES.items()}
            mine = C.chain_variant(nbytes, hops, overlap, chunk, **{flag: True})
            others = [v for k, v in vals.items() if C.CHAIN_MISTAKES[k] != {flag: True}]
            unique |= mine != pytest.approx(exp) and all(mine != pytest.approx(v) for v in others)
        assert unique, flag


def test_written_checkpoint_options(tmp_path):
    spec = C.PLAN_SPECS["keys out of offset order"]
    (path,) = C.write_checkpoint(spec, tmp_path)
    header, start = S.safetensors_header(path)
    begins = [info["data_offsets"][0] for info in header.values()]
    assert begins == sorted(begins, reverse=True)  # really out of offset order
    assert [list(r) for r in S.shard_plan(tmp_path, 2, 1)] == C.plan_variant(tmp_path, 2, 1)
    assert C.plan_variant(tmp_path, 2, 1, unsorted=True) != C.plan_variant(tmp_path, 2, 1)
    plain = tmp_path / "plain"
    plain.mkdir()
    C.write_checkpoint({**spec, "reorder": False}, plain)
    assert _same(S.load_shard(tmp_path, 2, 1), S.load_shard(plain, 2, 1))  # same tensors, other key order
    stray = tmp_path / "stray"
    stray.mkdir()
    C.write_checkpoint(C.PLAN_SPECS["an index plus a stray consolidated.safetensors"], stray)
    assert (stray / "consolidated.safetensors").is_file()
    assert "consolidated.safetensors" not in {p.name for p in S.weight_files(stray)}
    assert C.STRAY_TENSOR not in S.load_shard(stray, 2, 0)
    assert C.STRAY_TENSOR in C.shard_variant(stray, 2, 0, glob_files=True)


def test_the_solution_refuses_every_refusal_case(tmp_path):
    for i, (_, spec, tp, rank, _) in enumerate(C.REFUSALS):
        d = tmp_path / str(i)
        d.mkdir()
        C.write_checkpoint(C.PLAN_SPECS[spec] if isinstance(spec, str) else spec, d)
        for fn in (S.shard_plan, S.load_shard):
            with pytest.raises(ValueError):
                fn(d, tp, rank)


def test_header_cases_of_the_check_hold_for_the_solution(tmp_path):
    for i, spec in enumerate(C.HEADER_SPECS.values()):
        d = tmp_path / str(i)
        d.mkdir()
        (path,) = C.write_checkpoint(spec, d)
        raw, start = C._raw_header(path)
        raw.pop("__metadata__")
        assert S.safetensors_header(path) == (raw, start)
    empty = C.write_checkpoint(C.HEADER_SPECS["no tensors: the file ends where its header does (8 + N bytes)"],
                               tmp_path / "0")[0]
    assert S.safetensors_header(empty) == ({}, empty.stat().st_size)
    (tmp_path / "short.safetensors").write_bytes(b"\x05\x00\x00")
    with pytest.raises(ValueError):
        S.safetensors_header(tmp_path / "short.safetensors")


def test_header_read_counter(tmp_path):
    (path,) = C.write_checkpoint(C.READ_SPEC, tmp_path)
    _, start = C._raw_header(path)
    size = path.stat().st_size
    seen = C.count_header_reads(S.safetensors_header, str(path))
    assert seen["read_range"] == start  # exactly [0, 8) and [8, 8 + N)
    assert S.read_range is ck.read_range  # put back

    def whole_by_read_range(p):  # the harness wraps read_range in checkpoint_io and in this module's globals
        return S.safetensors_header(p) if ck.read_range(p, 0, ck.file_size(p)) else None

    assert C.count_header_reads(whole_by_read_range, str(path))["read_range"] >= size
    if seen["rchar"] is None:
        pytest.skip("no /proc/self/io here: reads made without read_range are not counted")
    assert seen["rchar"] < size // 2
    assert C.count_header_reads(lambda p: Path(p).read_bytes(), str(path))["rchar"] >= size


def test_shard_read_counter(tmp_path):
    spec = C.PLAN_SPECS[C.READ_CASE[0]]
    C.write_checkpoint(spec, tmp_path)
    _, tp, rank = C.READ_CASE
    shard = S.load_shard(tmp_path, tp, rank)
    seen = C.count_shard_reads(S.load_shard, str(tmp_path), tp, rank)
    assert seen == {"read": sum(C._nbytes(x) for x in shard.values()), "non_contiguous": []}

    def whole(d, tp, rank):  # load_file goes through safetensors.torch's safe_open: counted
        return {k: v for p in S.weight_files(Path(d)) for k, v in load_file(str(p)).items()}

    total = sum(C._nbytes(x) for x in C.shard_variant(tmp_path, 1, 0).values())
    assert C.count_shard_reads(whole, str(tmp_path), tp, rank)["read"] == total

    def strided(d, tp, rank):
        return {"w": torch.zeros(4, 4)[:, :2]}

    assert C.count_shard_reads(strided, str(tmp_path), tp, rank)["non_contiguous"] == ["w"]
    import safetensors
    import safetensors.torch
    assert safetensors.safe_open is safetensors.torch.safe_open  # put back
    assert getattr(safetensors.safe_open, "__name__", None) == "safe_open"  # the class, not the counting partial


def test_a_page_cache_restart_is_graded_above_the_pcie_floor_and_the_floor_is_named():
    from autograder.interview import l11_cold_start as iv

    for seed in range(20):
        q = iv.restart(random.Random(seed), S)
        warm = q.follow_ups[0]
        floor = warm.mistakes["takes PCIe's line rate, a lower bound, as the load time"]
        assert warm.answer > floor and not warm.grade(floor) and "lower bound" in warm.mistake(floor)
        assert "pageable" in warm.prompt and "assumed" in warm.prompt


def test_the_docstrings_state_the_bound_and_the_topology():
    assert "lower bound" in S.hop_seconds.__doc__ and "pageable" in S.hop_seconds.__doc__
    assert "uplink" in S.Hop.__doc__


def test_the_shard_plan_check_reads_every_files_header(tmp_path):
    spec = C.PLAN_SPECS["two files, F16, lm_head, biases"]
    headers = C.ref_headers(S, spec)
    paths = C.write_checkpoint(spec, tmp_path)
    assert [h[0] for h in headers] == [p.name for p in paths] and len(paths) == 2
    assert all(list(S.safetensors_header(p)) == h[1:] for p, h in zip(paths, headers))
