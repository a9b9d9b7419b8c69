"""Reference solutions, one module per lesson; exercises/ is generated from these."""
from autograder.runtime import setup as _setup

_setup()  # before any kernel module imports triton: no GPU means the Triton interpreter
