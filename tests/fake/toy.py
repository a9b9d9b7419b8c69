"""Checks of the fake lesson: double a tensor, and count to n."""
from autograder.core import check


@check(points=2, timeout=5)
def double(t):
    """Two visible cases and two hidden ones."""
    for label, n in [("visible n=3", 3), ("visible n=5", 5),
                     ("hidden", t.rng.randint(2, 50)), ("hidden", t.rng.randint(2, 50))]:
        with t.case(f"{label} ({n} values)"):
            x = (torch_randn(n, t))
            expected = t.ref.double(x)
            t.expect(t.call("double", x), expected, "double(x)",
                     mistakes={"squares instead of doubling": x * x})


@check(points=1, timeout=5)
def count(t):
    with t.case("count(4)"):
        t.expect(t.call("count", 4), 4, "count(4)")


def torch_randn(n, t):
    import torch
    return torch.randn(n, generator=t.gen)
