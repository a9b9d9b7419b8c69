"""Every kept wrong answer is caught by the check it targets, with a message naming the mistake."""
import re

import pytest

from autograder import lessons
from autograder.runner import Target, grade_lesson
from tests.mutants import load

ALL = [m for lesson in lessons.available() for m in load(lesson.stem)]


def mutant_target(m, directory) -> Target:
    name = "mutant_" + re.sub(r"\W", "_", m.label)
    return Target.from_source(m.source(), directory, name, label=m.label)


@pytest.mark.parametrize("m", ALL, ids=lambda m: m.label)
@pytest.mark.parametrize("seed", [0, 12345])
def test_mutant_is_caught(m, seed, tmp_path):
    (r,) = grade_lesson(m.lesson, mutant_target(m, tmp_path), seed, only=[m.check])
    assert r.status not in ("passed", "rejected"), f"{m.label} got {r.status} on check {m.check}: {r.message}"
    assert r.earned < r.points
    assert m.message.lower() in r.message.lower(), (
        f"{m.label}: check {m.check} failed but did not name the mistake "
        f"({m.message!r}); it said:\n{r.message}")


@pytest.mark.parametrize("lesson", [lesson.stem for lesson in lessons.available()])
def test_each_lesson_keeps_at_least_four_mutants(lesson):
    assert len(load(lesson)) >= 4
