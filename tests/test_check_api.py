"""The check API's shared pieces, without a learner process: the mistake rule (autograder/mistakes.py) as the checks,
the differential driver and the interview use it, "Looks like your code ..." made from a mistake's name,
t.not_graded, t.require_started and the engine run's verdict (autograder/checks/_engine.py)."""
import pytest

from autograder import core
from autograder.checks._drive import Differential
from autograder.checks._engine import judged
from autograder.interview.question import Numeric
from autograder.mistakes import groups, looks_like, name_of, named
from autograder.sandbox import LearnerRaised

eq = lambda a, b: a == b  # noqa: E731


def _raised(not_implemented=False, kind="ValueError") -> LearnerRaised:
    return LearnerRaised("f", {"type": kind, "mro": [kind, "Exception"], "message": "stub" if not_implemented else "no",
                               "tb": "Traceback ...", "not_implemented": not_implemented})


def _trial() -> core.Trial:
    return core.Trial(None, None, seed=1, cuda=False)


def test_the_mistake_rule():
    mistakes = {"a": 4, "b": 3, "c": 5, "d": 5}
    found = groups(mistakes, eq, expected=3)  # b gives the right answer here: never named
    assert found == [(["a"], 4), (["c", "d"], 5)]
    assert named(4, found, eq) == ["a"] and named(5, found, eq) == ["c", "d"] and named(6, found, eq) == []
    assert name_of(5, mistakes, eq, 3) == ["c", "d"]
    near = lambda x, v: abs(x - v) <= 0.1  # noqa: E731 - 1.05 matches both groups: it names neither
    assert name_of(1.05, {"x": 1.0, "y": 1.15}, near) == [] and name_of(1.0, {"x": 1.0, "y": 1.15}, near) == ["x"]


def test_looks_like_is_made_from_the_names():
    assert looks_like("counts only K") == "Looks like your code counts only K."
    assert looks_like(["a", "b"]) == "Looks like your code a; or your code b."
    assert looks_like("returns a list", end="", who="your pack_kv") == "Looks like your pack_kv returns a list"


def test_expect_and_fail_say_it_the_same_way():
    t = _trial()
    with t.case("one"):
        t.expect(8, 4, "bytes", mistakes={"uses bits": 32, "doubles it": 8, "adds K twice": 8, "is right": 4})
    with t.case("two"):
        t.fail("dtype_bytes(True) returned 1.", "accepts a bool")
    with t.case("three"):
        t.fail("plain")
    assert [p.message for p in t.parts] == [
        "bytes: got 8, expected 4. Looks like your code doubles it; or your code adds K twice.",
        "dtype_bytes(True) returned 1. Looks like your code accepts a bool.", "plain"]
    assert t.offered == {"uses bits", "doubles it", "adds K twice"}


def test_not_graded_records_a_skipped_part():
    t = _trial()
    for label, _ in t.cases([("visible", 1)], lambda rng: 2, n=1):
        t.not_graded(f"{label}: a scenario", "the machine was too slow")
    assert [(p.graded, p.passed, p.kind, p.message, p.hidden) for p in t.parts] == [
        (False, False, core.SKIPPED, "not graded: the machine was too slow", ""),
        (False, False, core.SKIPPED, "not graded: the machine was too slow", "hidden 1")]


def test_require_started_ends_the_check_only_for_a_stub():
    t = _trial()

    def stub():
        raise _raised(not_implemented=True)

    def buggy():
        raise _raised()
    assert t.require_started(lambda: 3) is None and t.require_started(buggy) is None  # left to the cases
    with pytest.raises(core.NotStarted, match="stub"):
        t.require_started(stub)


def _run(**kw) -> dict:
    return {"error": None, "finished": True, "steps": 7, "leak": None, "tokens": [[1]], **kw}


@pytest.mark.parametrize("run, message", [
    (_run(error={"message": "tokens to seq 3", "tb": "TB"}),
     "Looks like your code gives a prompt a number of tokens outside 1 .. num_uncomputed_tokens.\n"
     "The engine, running your policy, stopped at step 7:\nTB"),
    (_run(finished=False), "the requests did not finish in 7 steps"),
    (_run(tokens=[[2]]), "tokens: "),
    (_run(leak="block 3 leaked"), "block 3 leaked"),
    (_run(), None),
])
def test_an_engine_runs_verdict_comes_in_one_order(run, message):
    from autograder.checks._engine import POLICY_ERRORS
    t = _trial()
    with t.case("run"):
        with judged(t, run, POLICY_ERRORS):
            t.expect(run["tokens"], [[1]], "tokens")
    (part,) = t.parts
    assert part.passed == (message is None)
    if message is not None:
        assert part.message.startswith(message), part.message


def test_a_check_may_word_the_error_of_a_run_of_its_own():
    """on_error: lesson 17's pair of engines states its error and what a probe of the learner's parts names."""
    t = _trial()
    for run in (_run(error={"type": "ValueError", "message": "bad KV", "tb": "TB"}), _run(leak="2 blocks")):
        with t.case("pair"):
            with judged(t, run, on_error=lambda r: f"the pair stopped at step {r['steps']}: {r['error']['message']}"):
                pass
    assert [p.message for p in t.parts] == ["the pair stopped at step 7: bad KV", "2 blocks"]


def test_the_differential_drivers_judge_rules_out_what_a_right_answer_refuted():
    d = object.__new__(Differential)
    d.t, d.refuted = _trial(), set()
    assert d.judge(3, 3, {"a": 4, "b": 3}) == (True, [])           # b made no difference here
    assert d.refuted == {"a"} and d.t.offered == {"a"}
    assert d.judge(4, 3, {"a": 4, "b": 4}) == (False, ["b"])       # a was ruled out by the right answer above
    assert d.judge(5, 3, {"c": 5, "d": 5}) == (False, ["c", "d"])  # the same value: named together
    assert d.judge([1, 2], [1], {"e": (1, 2), "f": None}) == (False, ["e"])  # lists and tuples alike; None: unknown


def test_the_interview_names_by_the_same_rule():
    q = Numeric("How many?", "", 100.0, ["100"], "because", rtol=0.02,
                mistakes={"halves it": 50, "forgets the half": 50.5, "doubles it": 200, "is right": 101})
    assert "is right" not in q.mistakes
    assert q.mistake(200) == "doubles it" and q.mistake(50.2) == "halves it or forgets the half"
    assert q.mistake(300) is None
