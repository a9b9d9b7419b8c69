"""The hostile load test (reference_engine.server.loadtest), small: 30 streams of 16-48 greedy tokens, a tenth of
them leaving mid-stream, a tenth reading slowly, a tenth retried, while 100 partial connections stall (a 2 s read
deadline closes them, and they come back), 20 invalid requests and four 10 MiB bodies arrive, and a thread polls
/health. Its correctness items are asserted; its latencies are not, except a generous bound on /health: server,
clients and whatever else runs share this machine's cores, so the 100 ms target is the full run's to report
(README), not this test's to assert.
"""
from __future__ import annotations

import copy

import pytest

from reference_engine.server import loadtest

STREAMS, PARTIALS, INVALID, OVERSIZED = 30, 100, 20, 4


@pytest.fixture(scope="module")
def report():
    return loadtest.run_load_test(streams=STREAMS, partials=PARTIALS, invalid=INVALID, oversized=OVERSIZED,
                                  read_timeout_s=2.0, min_tokens=16, max_tokens=48, health_p99_limit_s=1.0)


def test_good_streams_lose_nothing_duplicate_nothing_and_equal_offline_greedy(report):
    text = loadtest.format_report(report)
    assert report["problems"] == [], text
    for run, want in (("baseline", STREAMS), ("hostile", STREAMS - STREAMS // 10)):
        r = report["runs"][run]
        g = r["good"]
        assert g["count"] == want, text
        assert (g["lost"], g["duplicated"], g["identical"], g["client_error_count"]) == (0, 0, want, 0), text
        assert g["finish_reasons"] == {"length": want}, text
        assert (r["leaked_blocks"], r["requests_left"], r["duplicated_generations"]) == (0, 0, 0), text
    h = report["runs"]["hostile"]
    assert h["kinds"]["slow"]["complete"] == h["kinds"]["slow"]["count"] > 0, text
    assert h["cut"]["count"] == STREAMS // 10 and h["cut"]["not_prefix"] == 0, text
    assert h["aborts"].get('cause="client_disconnect"', 0) >= 1, text


def test_every_invalid_request_gets_its_400_and_every_large_body_its_413(report):
    h = report["runs"]["hostile"]
    kinds = [what for what, *_ in loadtest.invalid_requests("target")]
    assert INVALID == 2 * len(kinds)
    assert h["invalid"]["statuses"] == {what: {"400": 2} for what in kinds}, h["invalid"]
    assert h["invalid"]["as_expected"] == INVALID, h["invalid"]["unexpected"]  # and each named its field
    assert h["oversized"]["statuses"] == {"10 MiB, Content-Length": {"413": 2}, "10 MiB, chunked": {"413": 2}}
    assert h["oversized"]["as_expected"] == OVERSIZED
    assert h["oversized"]["min_streams_in_flight"] > 0 and h["invalid"]["min_streams_in_flight"] > 0, \
        "an attack went out while no stream was running"
    failures = h["validation_failures"]
    assert sum(n for k, n in failures.items() if 'status="400"' in k) == INVALID, failures
    assert failures['param="body",status="413"'] == OVERSIZED, failures
    assert failures['param="temperature",status="400"'] == 6, "NaN (twice on each endpoint) and -0.5 (twice)"


def test_partial_connections_are_held_and_closed_by_the_read_deadline(report):
    p = report["runs"]["hostile"]["partials"]
    assert report["config"]["partials"] == PARTIALS, report["config"]["fd_note"]
    assert p["most_open"] >= 0.9 * PARTIALS and p["opened"] >= PARTIALS, p
    assert p["closed_by_server"] == p["opened"] and p["still_open"] == 0 and p["connect_errors"] == 0, p
    # (held: from when the clients' busy event loop saw the connection open, which may be late, until it closed)
    assert p["held_min_s"] >= 1.0, f"a partial connection was closed after {p['held_min_s']:.1f} s: not by the 2 s " \
                                   "read deadline"
    assert p["answers"] == {}, "a stalled request got an answer"


def test_health_answers_throughout(report):
    """Every poll answered; p99 under 1 s (not the 100 ms target: see the module's docstring)."""
    for run in ("baseline", "hostile"):
        h = report["runs"][run]["health"]
        assert h["failures"] == 0 and h["polls"] >= 20, (run, h)
        assert h["p99_s"] < 1.0, (run, h)
    assert report["rss"]["start"] and report["rss"]["after hostile"]


@pytest.mark.parametrize("run, path, value", [
    ("hostile", ("good", "lost"), 1), ("hostile", ("good", "duplicated"), 2), ("baseline", ("good", "identical"), 0),
    ("hostile", ("leaked_blocks",), 3), ("hostile", ("health", "failures"), 1),
    ("hostile", ("partials", "still_open"), 5), ("hostile", ("oversized", "as_expected"), 0),
    ("hostile", ("cut", "not_prefix"), 1), ("hostile", ("duplicated_generations",), 1),
    ("hostile", ("health", "p99_s"), 1.5),
])
def test_the_cli_fails_on_each_correctness_item(report, monkeypatch, capsys, run, path, value):
    bad = copy.deepcopy(report)
    node = bad["runs"][run]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad["problems"] = loadtest.problems(bad)
    monkeypatch.setattr(loadtest, "run_load_test", lambda **kw: bad)
    assert loadtest.main([]) == 1
    assert "FAIL" in capsys.readouterr().out
    monkeypatch.setattr(loadtest, "run_load_test", lambda **kw: report)
    assert loadtest.main([]) == 0
