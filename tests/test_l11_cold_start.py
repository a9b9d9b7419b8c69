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
from reference_engine import checkpoint_io as ck
from solutions import l11_cold_start as S

SHIPPED = Path(__file__).resolve().parents[1] / "reference_engine" / "checkpoints" / "target"


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
