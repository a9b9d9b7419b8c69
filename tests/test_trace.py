import csv
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_engine.sim import trace as T
from reference_engine.sim.trace import Request


@pytest.fixture(scope="module")
def conv():
    return T.load("conv")


def _raw_rows(name):
    with open(T.DATA_DIR / T.TRACES[name], newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", ["conv", "code"])
def test_load_matches_csv(name):
    reqs, rows = T.load(name), _raw_rows(name)
    assert len(reqs) == len(rows)
    assert reqs[0].arrival == 0.0
    arr = T.to_arrays(reqs)
    assert np.all(np.diff(arr["arrival"]) >= 0)
    # the CSVs are already in time order, so sizes line up row by row
    assert arr["prompt_tokens"].tolist() == [int(r["ContextTokens"]) for r in rows]
    assert arr["output_tokens"].tolist() == [int(r["GeneratedTokens"]) for r in rows]
    # second row's offset, parsed independently of numpy (7-digit fractional seconds)
    def secs(ts):
        hms = ts.split(" ")[1].split(":")
        return int(hms[0]) * 3600 + int(hms[1]) * 60 + float(hms[2])
    assert reqs[1].arrival == pytest.approx(secs(rows[1]["TIMESTAMP"]) - secs(rows[0]["TIMESTAMP"]), abs=1e-6)
    # the whole trace spans about an hour
    assert 3000 < reqs[-1].arrival < 4000


def test_loaded_requests_are_plain_immutable_requests(conv):
    """load builds its Requests without Request.__init__ (for speed): they must be the same objects."""
    import dataclasses
    r = conv[5]
    assert type(r) is Request and r == Request(r.arrival, r.prompt_tokens, r.output_tokens)
    assert hash(r) == hash(Request(r.arrival, r.prompt_tokens, r.output_tokens))
    assert dataclasses.asdict(r) == {"arrival": r.arrival, "prompt_tokens": r.prompt_tokens,
                                     "output_tokens": r.output_tokens}
    assert type(r.prompt_tokens) is int and type(r.arrival) is float
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.arrival = 1.0


def test_load_from_path_equals_name():
    assert T.load(T.DATA_DIR / T.TRACES["code"]) == T.load("code")


def test_load_sorts_unordered_csv(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:00:02.5000000,30,3\n"
                 "2023-11-16 18:00:00.0000000,10,1\n"
                 "2023-11-16 18:00:01.2500000,20,2\n")
    reqs = T.load(p)
    assert [r.arrival for r in reqs] == [0.0, 1.25, 2.5]
    assert [r.prompt_tokens for r in reqs] == [10, 20, 30]


def test_sample_contiguous_is_a_window(conv):
    s = T.sample(50, seed=3, trace=conv)
    assert len(s) == 50 and s[0].arrival == 0.0
    sizes = [(r.prompt_tokens, r.output_tokens) for r in s]
    full = [(r.prompt_tokens, r.output_tokens) for r in conv]
    starts = [i for i in range(len(full) - 49) if full[i:i + 50] == sizes]
    assert starts, "window not found in the trace"
    i = starts[0]
    gaps = np.diff([r.arrival for r in s])
    assert np.allclose(gaps, np.diff([r.arrival for r in conv[i:i + 50]]))


def test_sample_seeded_and_varies(conv):
    assert T.sample(20, 1, conv) == T.sample(20, 1, conv)
    assert T.sample(20, 1, conv) != T.sample(20, 2, conv)
    assert T.sample(20, 1, "conv") == T.sample(20, 1, conv)


def test_sample_random_subset(conv):
    s = T.sample(200, seed=0, trace=conv, contiguous=False)
    assert len(s) == 200 and s[0].arrival == 0.0
    assert all(a.arrival <= b.arrival for a, b in zip(s, s[1:]))
    # thinning an hour-long trace: the subset spans much more than 200 consecutive rows would
    assert s[-1].arrival > 10 * T.sample(200, 0, conv)[-1].arrival


def test_sample_rejects_bad_n(conv):
    with pytest.raises(ValueError):
        T.sample(0, 0, conv)
    with pytest.raises(ValueError):
        T.sample(len(conv) + 1, 0, conv)


def test_scale_default_factor_uses_quantile(conv):
    reqs = T.sample(500, 0, conv)
    tot = np.array([r.prompt_tokens + r.output_tokens for r in reqs])
    factor = np.quantile(tot, 0.99) / 512
    out = T.scale_to_context(reqs, 512)
    assert all(r.prompt_tokens + r.output_tokens <= 512 for r in out)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in out)
    # requests that did not overflow are just divided by the factor
    r0, s0 = next((r, s) for r, s in zip(reqs, out) if r.prompt_tokens + r.output_tokens < 400)
    assert s0.prompt_tokens == max(1, round(r0.prompt_tokens / factor))
    assert s0.output_tokens == max(1, round(r0.output_tokens / factor))
    # only about 1% need the proportional clip
    clipped = sum(s.prompt_tokens + s.output_tokens == 512 for s in out)
    assert clipped <= 0.03 * len(out)
    assert [r.arrival for r in out] == [r.arrival for r in reqs]


def test_scale_explicit_factors():
    reqs = [Request(0.0, 1000, 100), Request(1.0, 3, 1)]
    out = T.scale_to_context(reqs, 512, factor=10, output_factor=2)
    assert out == [Request(0.0, 100, 50), Request(1.0, 1, 1)]


def test_scale_clip_is_proportional():
    out = T.scale_to_context([Request(0.0, 3000, 1000)], 400, factor=1)
    assert out[0].prompt_tokens == 300 and out[0].output_tokens == 100


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20000), st.integers(1, 5000)), min_size=1, max_size=30),
       st.integers(2, 2048), st.one_of(st.none(), st.floats(1.0, 100.0)))
def test_scale_invariants(sizes, max_context, factor):
    reqs = [Request(float(i), p, o) for i, (p, o) in enumerate(sizes)]
    out = T.scale_to_context(reqs, max_context, factor=factor)
    for r, s in zip(reqs, out):
        assert 1 <= s.prompt_tokens and 1 <= s.output_tokens
        assert s.prompt_tokens + s.output_tokens <= max_context
        assert s.prompt_tokens <= max(1, r.prompt_tokens) and s.output_tokens <= r.output_tokens


def test_with_rate_rescales_gaps(conv):
    reqs = T.sample(100, 5, conv)
    fast = T.with_rate(reqs, 20.0)
    assert T.rate(fast) == pytest.approx(20.0)
    g0, g1 = np.diff([r.arrival for r in reqs]), np.diff([r.arrival for r in fast])
    assert np.allclose(g1, g0 * T.rate(reqs) / 20.0)  # same relative gaps
    assert [r.prompt_tokens for r in fast] == [r.prompt_tokens for r in reqs]


def test_with_rate_edge_cases():
    same = [Request(5.0, 1, 1)] * 3
    assert [r.arrival for r in T.with_rate(same, 2.0)] == [0.0, 0.5, 1.0]
    assert all(r.arrival == 0.0 for r in T.with_rate([Request(0, 1, 1), Request(3, 1, 1)], math.inf))
    with pytest.raises(ValueError):
        T.with_rate(same, 0.0)


def test_poisson_arrivals_rate():
    reqs = [Request(0.0, 1, 1)] * 4000
    p = T.with_poisson_arrivals(reqs, 8.0, seed=0)
    assert p[0].arrival == 0.0
    assert T.rate(p) == pytest.approx(8.0, rel=0.05)
    gaps = np.diff([r.arrival for r in p])
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.08)  # exponential: CV = 1


def test_summary_and_prompts(conv):
    reqs = T.scale_to_context(T.sample(64, 0, conv), 256)
    s = T.summary(reqs)
    assert s["requests"] == 64 and s["rps"] == pytest.approx(T.rate(reqs))
    assert s["prompt_tokens_p50"] == np.median([r.prompt_tokens for r in reqs])
    ids = T.prompt_token_ids(reqs, vocab_size=50, seed=1, exclude=[0])
    assert [len(x) for x in ids] == [r.prompt_tokens for r in reqs]
    flat = np.concatenate(ids)
    assert flat.min() >= 1 and flat.max() < 50
    assert ids == T.prompt_token_ids(reqs, vocab_size=50, seed=1, exclude=[0])
