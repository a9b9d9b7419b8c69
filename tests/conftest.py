"""Choose the device before any test imports triton: without CUDA, kernels run under the interpreter.

Then start the grader's zygote while this process has imported no solutions (test modules import
them): learner processes are forked from it, as in `course check`. Tests that need the other kind,
a fresh interpreter, swap it in (tests/test_hostile.py, tests/test_isolation.py).
"""
from autograder import zygote
from autograder.runtime import setup

setup()
zygote.prepare()
