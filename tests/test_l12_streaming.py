"""Lesson 12: the reference answers, and the checks' own helpers (the wrong-answer variants must agree
with the reference when they have no variant, and each must differ from it on a visible case)."""
from __future__ import annotations

import random
import time
from functools import partial

import pytest

import solutions.l12_streaming as sol
from autograder.checks import l12_streaming as chk
from autograder.harnesses import server as harness
from autograder.harnesses.server import drive_buffer, drive_cache, drive_framer, drive_resume, drive_watcher
from reference_engine.server import interfaces
from reference_engine.server.interfaces import Generation, ResumePlan

# -- the reference answers ------------------------------------------------------------------------------------

def test_buffer_docstring_example():
    b = sol.CoalescingBuffer(4, 1.0)
    assert b.push([1], 0.0) and b.push([2, 3], 0.5) and b.pop(0.6) == [1, 2, 3]
    assert b.push([4, 5, 6, 7], 0.7) and not b.push([8], 0.8) and b.pending == 0 and b.dead
    assert not b.push([9], 0.9) and b.pop(1.0) == []


def test_buffer_gives_up_on_the_oldest_token_not_the_newest():
    b = sol.CoalescingBuffer(100, 1.0)
    assert b.push([1], 0.0) and b.push([2], 0.9)  # the newest is fresh, the oldest is 0.9 s old
    assert not b.push([3], 1.2), "the oldest token waited 1.2 s > max_lag_s"


@pytest.mark.parametrize("bad", [(0, 1.0), (4, 0.0)])
def test_buffer_refuses_bad_limits(bad):
    with pytest.raises(ValueError):
        sol.CoalescingBuffer(*bad)


def test_watcher_reads_until_the_disconnect():
    assert drive_watcher(sol.DisconnectWatcher, ["http.request", "http.disconnect", "http.request"], 0.2) == \
        {"read": 2, "on_disconnect_calls": 1, "returned": True, "blocked": False}
    assert drive_watcher(sol.DisconnectWatcher, ["http.request"], 0.1) == \
        {"read": 1, "on_disconnect_calls": 0, "returned": False, "blocked": False}


def test_cache_docstring_example():
    c = sol.IdempotencyCache(2)
    a, b, cc = (Generation(k, "fp", [1], 4) for k in "abc")
    b.in_flight = True
    c.put("a", a), c.put("b", b)
    assert c.get("a") is a
    c.put("c", cc)
    assert c.get("a") is None and c.get("b") is b and c.get("c") is cc and len(c) == 2


def test_cache_keeps_live_entries_past_its_bound():
    c = sol.IdempotencyCache(1)
    gens = [Generation(str(i), "fp", [1], 4, in_flight=True) for i in range(3)]
    for g in gens:
        c.put(g.key, g)
    assert len(c) == 3, "in-flight entries are never evicted"
    gens[0].in_flight = False
    c.put("x", Generation("x", "fp", [1], 4))
    # "0" (no longer live) goes first; "x" is finished too, so it goes as well: only the live ones stay
    assert c.get("0") is None and c.get("1") is gens[1] and c.get("2") is gens[2] and len(c) == 2


def test_plan_resume_docstring_example_and_limits():
    g = Generation("k", "fp", [5, 6], 5, token_ids=[7, 8, 9], finish_reason="abort")
    assert sol.plan_resume(g, 1) == ResumePlan([8, 9], [5, 6, 7, 8, 9], 2)
    for bad in (-1, 4):
        with pytest.raises(ValueError):
            sol.plan_resume(g, bad)
    g.finish_reason = "length"
    assert sol.plan_resume(g, 3) == ResumePlan([])
    g.finish_reason, g.in_flight = None, True
    assert sol.plan_resume(g, 0) == ResumePlan([7, 8, 9])


def test_framer():
    f = sol.SSEFramer(2.0)
    assert f.keep_alive_interval == 2.0 and f.event('{"a": 1}') == b'data: {"a": 1}\n\n'
    assert f.done() == b"data: [DONE]\n\n" and f.keep_alive().startswith(b":") and f.keep_alive().endswith(b"\n\n")
    with pytest.raises(ValueError):
        f.event("a\nb")


def _streamed(cls, pieces, stop, chunks, include=False, min_tokens=0):
    s = cls(harness.ByteDecoder(pieces), stop, include, min_tokens)
    return [s.add(c) for c in chunks] + [s.finish()], s.stop_reason


def test_detokenizer_docstring_example():
    pieces = [b"Hi", b" E", b"ND", b"!"]
    got = _streamed(sol.StopStringDetokenizer, pieces, ["END"], [[0], [1], [2], [3]])
    assert got == (["Hi", " ", "", "", ""], "END")
    pieces = [b"caf", b"\xc3", b"\xa9"]
    assert _streamed(sol.StopStringDetokenizer, pieces, [], [[0], [1], [2]]) == (["caf", "", "\u00e9", ""], None)


def test_detokenizer_releases_a_held_back_start_once_at_finish():
    s = sol.StopStringDetokenizer(harness.ByteDecoder([b"a E", b"N"]), ["END"])
    assert (s.add([0]), s.add([1]), s.finish(), s.finish(), s.stop_reason) == ("a ", "", "EN", "", None)


def test_components_satisfy_the_server_interfaces():
    c = sol.components(high_water=8)
    assert isinstance(c.new_buffer(), interfaces.StreamBuffer) and c.new_buffer().high_water == 8
    assert isinstance(c.disconnect, interfaces.DisconnectWatcher) and isinstance(c.cache, interfaces.IdempotencyCache)
    assert isinstance(c.resume, interfaces.ResumePolicy) and isinstance(c.framer, interfaces.SSEFramer)
    streamer = c.new_detokenizer(lambda ids: "", ["x"])
    assert isinstance(streamer, interfaces.TextStreamer) and isinstance(streamer, sol.StopStringDetokenizer)


def test_cost_model():
    c = sol.vanished_cost(1000, 100, 1000, 0.01)
    assert c == {"wasted_tokens": 900, "slot_seconds": pytest.approx(9.0), "blocks_held": 125}
    d = sol.vanished_cost(1000, 100, 1000, 0.01, detect_steps=1)
    assert d["wasted_tokens"] == 1 and d["blocks_held"] == 69  # ceil(1101 / 16)
    assert sol.retry_waste(1000, 0.1, 300, False) == pytest.approx(30000) and sol.retry_waste(1000, 0.1, 300, True) == 0
    assert sol.buffer_bytes(1000, 256, 8) == 2_048_000


# -- the checks' helpers ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_buffer_variant_without_a_mistake_is_the_reference(seed):
    hw, lag, ops = chk.random_ops(random.Random(seed))
    assert drive_buffer(chk._Buffer, hw, lag, ops) == drive_buffer(sol.CoalescingBuffer, hw, lag, ops)


@pytest.mark.parametrize("seed", range(20))
def test_cache_variant_without_a_mistake_is_the_reference(seed):
    n, ops = chk.random_cache_ops(random.Random(seed))
    assert drive_cache(chk._Cache, n, ops) == drive_cache(sol.IdempotencyCache, n, ops)


@pytest.mark.parametrize("seed", range(20))
def test_resume_variant_without_a_mistake_is_the_reference(seed):
    cases = chk.random_resume_case(random.Random(seed))
    assert chk._plans(drive_resume(chk._plan_variant(""), cases)) == chk._plans(drive_resume(sol.plan_resume, cases))


@pytest.mark.parametrize("seed", range(200))
def test_streamer_variant_without_a_mistake_and_the_servers_default_are_the_reference(seed):
    from reference_engine.server.streaming import IncrementalDetokenizer
    case = chk.random_streamer_case(random.Random(seed))
    drive = harness.drive_streamer
    want = drive(sol.StopStringDetokenizer, *case)
    assert drive(chk._Streamer, *case) == want and drive(IncrementalDetokenizer, *case) == want


@pytest.mark.parametrize("variant", list(chk.STREAMER_MISTAKES.values()))
def test_each_streamer_mistake_shows_on_a_visible_case(variant):
    drive = harness.drive_streamer
    assert any(drive(partial(chk._Streamer, variant=variant), *case) != drive(chk._Streamer, *case)
               for _, case in chk.STREAMER_CASES)


def test_the_streamer_decodes_a_window_per_token():
    got = harness.drive_streamer_cost(sol.StopStringDetokenizer)
    n = got["tokens"]
    assert got["text"] == harness.ByteDecoder(harness.cost_pieces(n))(range(n)) and got["ids_decoded"] <= 5 * n

    class WholeEachTime(sol.StopStringDetokenizer):
        def add(self, token_ids):
            self.decode(self._ids + list(token_ids))
            return super().add(token_ids)
    assert harness.drive_streamer_cost(WholeEachTime)["ids_decoded"] > chk.DECODE_BUDGET * n


def test_the_servers_detokenizer_gives_the_engines_text_with_the_shipped_tokenizer():
    """With the shipped tokenizer's decode, any chunking: the deltas joined are the text the engine makes (it decodes
    every token's whole output and cuts it at the first stop string, sampling.StopStrings), with the same stop."""
    from reference_engine.loader import Tokenizer
    from reference_engine.sampling import StopStrings
    from reference_engine.server.streaming import IncrementalDetokenizer
    from reference_engine.shipped import TARGET
    tok, rng = Tokenizer(TARGET / "tokenizer.json"), random.Random(0)
    for _ in range(300):
        words = ["a", "\u00e9", " the", "\U0001f600", "\n", "\u20ac", "def ", "x("]
        text = "".join(rng.choice(words) for _ in range(30))
        ids = tok.encode(text) if rng.random() < 0.5 else [rng.randrange(2048) for _ in range(40)]
        full = tok.decode(ids)
        stops = [full[i:i + rng.randint(2, 4)] for i in (rng.randrange(max(1, len(full))) for _ in range(2))]
        stops = [s for s in stops if s] or ["zz"]
        include, min_tokens = rng.random() < 0.3, rng.choice([0, 0, 2])
        engine, want, reason = StopStrings(stops, include, min_tokens), full, None
        for k in range(1, len(ids) + 1):
            hit = engine.check(tok.decode(ids[:k]), k)
            if hit is not None:
                reason, want, ids = hit[0], tok.decode(ids[:k])[:hit[1]], ids[:k]
                break
        d, out, i = IncrementalDetokenizer(tok.decode, stops, include, min_tokens), "", 0
        while i < len(ids):
            step = rng.randint(1, 3)
            out += d.add(ids[i:i + step])
            i += step
        out += d.finish()
        assert (out, d.stop_reason) == (want, reason), (ids, stops, include, min_tokens)


def _visible_differs(results_of, cases) -> bool:
    return any(results_of(c) for c in cases)


@pytest.mark.parametrize("variant", list(chk.BUFFER_MISTAKES.values()))
def test_each_buffer_mistake_shows_on_a_visible_case(variant):
    assert any(drive_buffer(partial(chk._Buffer, variant=variant), hw, lag, ops) != drive_buffer(chk._Buffer, hw, lag, ops)
               for _, (hw, lag, ops) in chk.BUFFER_CASES)


@pytest.mark.parametrize("variant", list(chk.CACHE_MISTAKES.values()))
def test_each_cache_mistake_shows_on_a_visible_case(variant):
    assert any(drive_cache(partial(chk._Cache, variant=variant), n, ops) != drive_cache(chk._Cache, n, ops)
               for _, (n, ops) in chk.CACHE_CASES)


@pytest.mark.parametrize("variant", list(chk.RESUME_MISTAKES.values()))
def test_each_resume_mistake_shows_on_a_visible_case(variant):
    assert any(chk._plans(drive_resume(chk._plan_variant(variant), cases)) !=
               chk._plans(drive_resume(chk._plan_variant(""), cases)) for _, cases in chk.RESUME_CASES)


class _AnyMessage:
    async def watch(self, receive, on_disconnect):
        await receive()
        on_disconnect()


class _KeepsReading:
    async def watch(self, receive, on_disconnect):
        while True:
            if (await receive())["type"] == "http.disconnect":
                on_disconnect()


class _Once:
    async def watch(self, receive, on_disconnect):
        if (await receive())["type"] == "http.disconnect":
            on_disconnect()


class _Blocks:
    async def watch(self, receive, on_disconnect):
        while True:
            time.sleep(0.05)
            if (await receive())["type"] == "http.disconnect":
                on_disconnect()
                return


@pytest.mark.parametrize("variant,cls", [("any", _AnyMessage), ("keeps_reading", _KeepsReading), ("once", _Once),
                                         ("blocks", _Blocks)])
def test_watcher_variants_describe_those_watchers(variant, cls):
    for _, messages in chk.WATCHER_CASES:
        assert chk.watcher_variant(messages, variant) == drive_watcher(cls, messages, 0.3), messages


def test_framer_variants_differ_from_the_reference():
    expected = drive_framer(sol.SSEFramer, 1.0, chk.PAYLOADS)
    for v in chk.FRAMER_MISTAKES.values():
        assert chk.framer_variant(expected, v) != expected


# -- the server's side of the cache --------------------------------------------------------------------------------

class _QueueOnly:
    """An AsyncEngine stand-in that only records what the service queues."""

    def __init__(self):
        self.added, self.aborted = [], []

    def add(self, rid, prompt, params, on_outputs):
        self.added.append(rid)

    def abort(self, rid, cause):
        self.aborted.append(rid)


def test_a_new_answer_is_live_when_the_server_puts_it_into_a_full_cache():
    """GenerationService.open attaches and starts a new Generation before putting it into the cache: a
    cache full of live entries must keep the new one too (else its retry starts a second answer)."""
    from reference_engine.sampling import SamplingParams
    from reference_engine.server.serving import GenerationService
    comps = sol.components(max_entries=1)
    service = GenerationService(_QueueOnly(), comps)
    params = SamplingParams(temperature=0, max_tokens=8)
    first = service.open([1, 2], params, "fp1", key="a")
    second = service.open([3], params, "fp2", key="b")
    assert comps.cache.get("a") is first.gen and comps.cache.get("b") is second.gen and len(comps.cache) == 2
    assert service.open([3], params, "fp2", key="b").gen is second.gen, "a retry attaches to the same answer"


def test_the_retry_case_is_not_graded_only_when_the_machine_outran_the_scenario():
    assert chk._too_slow((False, 0, "length", 160)), "generated to its end before 'other' came: not graded"
    assert not chk._too_slow((True, 1, None, 20)) and not chk._too_slow((False, 1, "length", 160))
    assert not chk._too_slow((False, 0, "abort", 3)), "aborted early: a part's doing, graded"
    # (recorded with t.not_graded: tests/test_check_api.py)


def test_the_server_harness_tells_a_contract_drop_from_an_early_one():
    """A retry attempt dropped as a slow reader is 'not graded: the machine was too slow' only when every reader
    the buffer gave up was one the contract allowed (more than high_water waiting, or older than max_lag_s)."""
    from autograder.harnesses.server import _Recording
    from solutions.l12_streaming import CoalescingBuffer

    class Eager(CoalescingBuffer):
        def push(self, token_ids, now):
            super().push(token_ids, now)
            return self.pending < self.high_water  # gives up with exactly high_water waiting

    for cls, allowed in ((CoalescingBuffer, True), (Eager, False)):
        peaks, drops = [], []
        b = _Recording(cls(3, 60.0), peaks, drops, 3, 60.0)
        assert b.push([1, 2], 0.0) and b.pop(0.1) == [1, 2]  # taken: no longer waiting
        b.push([3], 0.2)
        b.push([4, 5], 0.3)
        if allowed:
            assert drops == [] and not b.push([6], 0.4)  # 4 waiting > high_water 3
        assert drops == [allowed], (cls.__name__, drops)


def test_the_expected_answers_are_what_the_reference_server_streams():
    """The retry, resume and polite cases judge whole answers against the engine's offline greedy answers: a
    server with its own defaults streams exactly those."""
    from autograder.checks.l12_streaming import expected_answers
    from autograder.harnesses.server import RESUME_TOKENS, TEXT_STOP, run_server
    from reference_engine.server.streaming import (
        BoundedStreamBuffer,
        ContinueResumePolicy,
        DefaultSSEFramer,
        IncrementalDetokenizer,
        LRUIdempotencyCache,
        ReceiveDisconnectWatcher,
    )
    run = run_server(BoundedStreamBuffer, ReceiveDisconnectWatcher, LRUIdempotencyCache,
                     ContinueResumePolicy().plan, DefaultSSEFramer, IncrementalDetokenizer)
    want = expected_answers()
    assert [p["tokens"] for p in run["stall"]["polite"]] == [a["tokens"] for a in want["polite"]]
    assert all(a["finish_reason"] == "length" and len(a["tokens"]) == 24 for a in want["polite"])
    whole = [p for p in run["retry"]["streams"] if p["done"] and p["error"] is None]
    assert whole and all(p["tokens"] == want["retry"]["tokens"] for p in whole)
    assert run["resume"]["head"] + run["resume"]["tail"]["tokens"] == want["resume"]["tokens"]
    assert run["resume"]["engine_tokens"] == len(want["resume"]["tokens"]) == RESUME_TOKENS
    text, stream = run["text"], run["text"]["stream"]
    assert want["text"]["finish_reason"] == "stop" and want["text"]["stop_reason"] == TEXT_STOP
    assert "".join(t for t, _ in stream["chunks"]) == text["whole"]["chunks"][0][0] == want["text"]["text"]
    assert [i for _, ids in stream["chunks"] for i in ids] == want["text"]["tokens"]
    assert (stream["finish_reason"], stream["stop_reason"]) == ("stop", TEXT_STOP)
    # the stop string came across two chunks at least (run_server reads it again until it does), and its start was
    # held back once ("writing" then " =": released with the token that ruled it out)
    assert [len(ids) for _, ids in stream["chunks"] if ids][-2:] == [1, 1], stream["chunks"]
    assert any(282 in ids and "writing =" in t for t, ids in stream["chunks"]), stream["chunks"]
    assert "".join(t for t, _ in text["short"]["chunks"]) == want["short"]["text"]
    assert want["short"]["finish_reason"] == "length" and want["short"]["text"].endswith("writ")
    assert text["short"]["chunks"][-1] == ("writ", []), "the start of the stop string, held back until the end"


@pytest.mark.parametrize("body", ["while True:\n            pass", "time.sleep(3600)"])
def test_a_watcher_that_never_gives_the_loop_back_fails_in_seconds(tmp_path, body):
    """A watch() that spins or blocks holds its event loop for good: both checks that run it fail, naming it,
    in seconds (their deadlines are 30 s and 240 s)."""
    from autograder.runner import Target, grade_lesson
    src = open(sol.__file__).read()
    start = src.index("    async def watch(self, receive, on_disconnect) -> None:")
    end = src.index("### END SOLUTION", start) + len("### END SOLUTION")
    src = src[:start] + ("    async def watch(self, receive, on_disconnect) -> None:\n        import time\n        "
                         + body + "\n") + src[end:]
    target = Target.from_source(src, tmp_path, "hung_watcher", label="hung_watcher.py")
    began = time.monotonic()
    results = grade_lesson("l12_streaming", target, 1, only=["disconnect_watcher", "streaming_server"])
    took = time.monotonic() - began
    assert took < 60, f"{took:.0f} s"
    for r in results:
        assert r.earned == 0 and "never gave the event loop back" in r.message, (r.name, r.status, r.message)
