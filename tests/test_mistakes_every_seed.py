"""Every mistake a check can name is tested on every seed, not only on the seeds that happen to draw it.

A check names a mistake when the learner's value matches that mistake's value on some case. If
the cases that tell the mistake apart from the right answer are drawn only on some seeds, a
learner who makes it passes on the others (lesson 02's `"head_dim": null` trap once passed on 19 of
40 seeds). So: grading the solutions on several seeds must test the same set of mistakes.
"""
import pytest

from autograder import lessons
from autograder.runner import Target, grade_lesson

SEEDS = [0, 1, 2, 3, 12345, 987654]


@pytest.mark.parametrize("stem", [lesson.stem for lesson in lessons.available()])
def test_every_named_mistake_is_tested_on_every_seed(stem):
    per_seed = {s: {r.name: set(r.mistakes_tested)
                    for r in grade_lesson(stem, Target.for_lesson(stem, solutions=True), s)} for s in SEEDS}
    problems = []
    for check in per_seed[SEEDS[0]]:
        sets = [per_seed[s][check] for s in SEEDS]
        always, sometimes = set.intersection(*sets), set.union(*sets)
        for name in sorted(sometimes - always):
            missing = [s for s in SEEDS if name not in per_seed[s][check]]
            problems.append(f"{check}: 'your code {name}' is not tested on seeds {missing}")
    assert not problems, "\n".join(problems)
