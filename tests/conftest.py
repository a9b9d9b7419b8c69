"""Choose the device before any test imports triton: without CUDA, kernels run under the interpreter.

Then start the grader's zygote while this process has imported no solutions (test modules import
them): learner processes are forked from it, as in `course check`. Tests that need the other kind,
a fresh interpreter, swap it in (tests/test_hostile.py, tests/test_isolation.py).
"""
import pytest

from autograder import zygote
from autograder.runtime import setup

setup()
zygote.prepare()


# -- shared by the server's test modules (each defines its own `server`, a ServerThread) --------------------

@pytest.fixture(scope="module")
def offline():
    """The offline engine on the shipped model: what every greedy answer is compared with."""
    from reference_engine.llm import LLM
    from reference_engine.shipped import TARGET
    return LLM(TARGET)


@pytest.fixture
def client(server):
    """The real `openai` client on the module's server."""
    import openai
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
