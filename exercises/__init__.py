"""Your code: one module per lesson. Generated from solutions/ by `course sync`; edit freely."""
from autograder.runtime import setup as _setup

_setup()  # before any kernel module imports triton: no GPU means the Triton interpreter
