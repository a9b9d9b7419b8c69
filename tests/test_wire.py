"""autograder.wire: what crosses between the grader and a learner process comes back with exact builtin types."""
import math

import pytest
import torch

from autograder import wire


def same(a, b) -> bool:
    """Equal, with the same exact type at every level (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


class LyingInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class MyFloat(float):
    pass


@pytest.mark.parametrize("value", [
    [1, 2, 3], [1.5, -0.0, 2.0], [True, False, None, "a"], (1, 2.5, "x"), [(1, 2.0), (3, 4.0)],
    [float("nan"), float("inf"), -float("inf"), 1.0], (float("nan"),), [], (), [[1, 2], [3, [4, (5,)]]],
    {"a": [1, 2], 3: (4.0, None)}, {1, 2, 3}, [torch.arange(6).reshape(2, 3), 7], [b"raw", 1],
], ids=repr)
def test_round_trip_keeps_values_and_exact_types(value):
    assert same(wire.decode(wire.encode(value)), value)


def test_subclasses_of_builtins_come_back_as_the_builtins():
    """A learner's int whose __eq__ always says True is rebuilt as a plain int, inside a list or a tuple too."""
    for value in ([LyingInt(3), 4], (LyingInt(3),), LyingInt(3), [MyFloat(1.5)], (MyFloat(2.5), 1)):
        back = wire.decode(wire.encode(value))
        flat = back if isinstance(back, (list, tuple)) else [back]
        assert all(type(v) in (int, float) for v in flat), back
    assert wire.decode(wire.encode([LyingInt(3)])) == [3]
    assert wire.decode(wire.encode((MyFloat(2.5), 1))) == (2.5, 1)


def test_bool_stays_bool_and_int_stays_int():
    back = wire.decode(wire.encode([True, 1, (False, 0)]))
    assert [type(v) for v in back[:2]] == [bool, int] and [type(v) for v in back[2]] == [bool, int]


def test_non_finite_floats_cross_as_tags_in_strict_json():
    msg = wire.encode([1.0, float("nan"), float("inf")])
    assert b"NaN" not in msg and b"Infinity" not in msg
    back = wire.decode(msg)
    assert back[0] == 1.0 and math.isnan(back[1]) and back[2] == math.inf


def test_unsupported_objects_are_refused():
    with pytest.raises(wire.WireError):
        wire.encode([1, object()])
    with pytest.raises(wire.WireError):
        wire.encode((1, lambda: 0))


def test_named_tuples_come_back_with_their_fields():
    from typing import NamedTuple

    class Job(NamedTuple):
        arrival: float
        tokens: int

    back = wire.decode(wire.encode([Job(0.5, 3), Job(float("inf"), 4)]))
    assert [tuple(j) for j in back] == [(0.5, 3), (math.inf, 4)] and back[0].tokens == 3
    assert type(back[0]).__name__ == "Job" and type(back[0]) is not Job  # our own class, no learner methods


def test_a_malformed_tuple_is_a_wire_error():
    import json
    import struct
    header = json.dumps({"$t": "tuple", "v": {"a": 1}}).encode()
    with pytest.raises(wire.WireError):
        wire.decode(struct.pack("<Q", len(header)) + header)


def test_lists_of_rows_cross_in_one_header_and_come_back_with_exact_types():
    """A list of tuples or of one NamedTuple class (jobs, timeline rows) is encoded as one table; what comes back
    is the same list of tuples / NamedTuples of exact builtins, a lying int subclass included."""
    from typing import NamedTuple

    class Job(NamedTuple):
        arrival: float
        prefill_s: float
        n: int

    rows = [(0.0, 1, 2), (1.5, float("inf"), None), (2.0, LyingInt(3), "x")]
    back = wire.decode(wire.encode(rows))
    assert same(back, [(0.0, 1, 2), (1.5, float("inf"), None), (2.0, 3, "x")])
    jobs = [Job(0.5 * i, 0.1, i) for i in range(5)]
    back = wire.decode(wire.encode(jobs))
    assert [tuple(j) for j in back] == [tuple(j) for j in jobs] and type(back[0]).__name__ == "Job"
    assert back[2].prefill_s == 0.1 and type(back[2].n) is int
    header = wire.encode(jobs)[8:]
    assert header.count(b"namedtuple") == 1, "one header for the whole list"
    mixed = [Job(0.0, 0.1, 1), (0.0, 0.1, 1), [1, 2]]
    assert same(wire.decode(wire.encode(mixed))[1:], mixed[1:])
