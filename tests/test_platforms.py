"""Where learners are: a machine without Triton (macOS, native Windows), and JupyterLab reached from a browser.

Triton has Linux wheels only. These tests run the course in processes where `import triton` fails (a package
named `triton` first on PYTHONPATH whose import raises ImportError, as a missing wheel would), across every
lesson: grading (the Triton exercises "not graded here", everything else graded as usual), the engine, and
`course doctor`. (The notebooks without Triton: tests/test_notebooks.py.)
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from autograder import lessons

ROOT = Path(__file__).resolve().parents[1]
TRITON_CHECKS = {("l04_paged_attention", "paged_decode_triton"), ("l15_attention_layouts", "gqa_decode_triton"),
                 ("l16_quantization", "w4a16_kernel")}


@pytest.fixture(scope="module")
def no_triton(tmp_path_factory) -> dict:
    """The environment of a process in which `import triton` fails."""
    blocker = tmp_path_factory.mktemp("no_triton")
    (blocker / "triton").mkdir()
    (blocker / "triton" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'triton\' (blocked for this test)", name="triton")\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(ROOT)])}


def _run(env, *args, timeout=600):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_blocker_blocks(no_triton):
    r = _run(no_triton, "-c", "import triton")
    assert r.returncode != 0 and "blocked for this test" in r.stderr


@pytest.mark.parametrize("solved", [True, False], ids=["solutions", "untouched"])
def test_every_lesson_grades_without_triton(no_triton, tmp_path, solved):
    """`course grade` of every lesson: the three Triton checks are "not graded here", saying why and what to do;
    every other check is graded as it is with Triton (all passed for the solutions, all "not started" for the
    stubs: no error from a missing import)."""
    out = tmp_path / "grade.json"
    r = _run(no_triton, "-m", "autograder.cli", "grade", *(["--solutions"] if solved else []), "--json", str(out))
    assert out.exists(), r.stdout + r.stderr
    graded = json.loads(out.read_text())
    assert set(graded["lessons"]) == {lesson.stem for lesson in lessons.available()}
    for stem, lesson in graded["lessons"].items():
        for c in lesson["checks"]:
            if (stem, c["name"]) in TRITON_CHECKS:
                assert c["status"] == "not graded here", (stem, c)
                assert "Triton is not available on this platform" in c["message"] and "WSL" in c["message"]
            else:
                assert c["status"] == ("passed" if solved else "not started"), (stem, c["name"], c["message"][:500])
    assert graded["possible"] == sum(l["possible"] for l in graded["lessons"].values()) > 0
    assert "Triton" in r.stdout, "the score table says why points were not graded"
    assert r.returncode == (0 if solved else 1)


def test_the_engine_runs_without_triton(no_triton):
    """The engine generates the same tokens with and without Triton (its torch attention backend on CPU), and
    asking for the Triton backend says why it cannot run."""
    code = """
import json, torch
from reference_engine import LLM, SamplingParams
from reference_engine.shipped import TARGET
from reference_engine.kernels import triton_compat
llm = LLM(TARGET, dtype=torch.float32, max_num_seqs=4)
outs = llm.generate([[1, 2, 3, 4, 5], [9, 8, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                    use_tqdm=False)
try:
    LLM(TARGET, dtype=torch.float32, attention_backend="triton", max_num_seqs=4)
    refused = ""
except triton_compat.TritonUnavailable as e:
    refused = str(e)
print(json.dumps({"available": triton_compat.AVAILABLE, "tokens": [o.outputs[0].token_ids for o in outs],
                  "refused": refused}))
"""
    without = json.loads(_run(no_triton, "-c", code).stdout.strip().splitlines()[-1])
    with_triton = json.loads(_run({**os.environ, "PYTHONPATH": str(ROOT)}, "-c", code).stdout.strip().splitlines()[-1])
    assert without["available"] is False and with_triton["available"] is True
    assert without["tokens"] == with_triton["tokens"] and all(len(t) == 8 for t in without["tokens"])
    assert "needs Triton" in without["refused"] and "WSL" in without["refused"]
    assert with_triton["refused"] == ""


def test_a_kernel_module_imports_without_triton_and_its_kernels_refuse_to_launch(no_triton):
    code = """
from reference_engine.kernels.triton_compat import TritonUnavailable, triton, tl
import exercises.l04_paged_attention as ex
import solutions.l16_quantization as sol
assert triton.cdiv(10, 4) == 3 and triton.next_power_of_2(33) == 64 and triton.next_power_of_2(1) == 1
try:
    import torch
    qw = sol.quantize_int4(torch.randn(16, 64), 32, False)
    sol.w4a16_matmul(torch.randn(2, 64), qw)
    print("launched")
except TritonUnavailable as e:
    print("refused:", e)
"""
    r = _run(no_triton, "-c", code)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "Triton is not available on this platform" in r.stdout, r.stdout


def test_doctor_says_which_mode(no_triton):
    r = _run(no_triton, "-m", "autograder.cli", "doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "triton   not installed" in r.stdout and "mode     without Triton" in r.stdout
    assert "not graded here" in r.stdout and "self-test skipped" in r.stdout
    r = _run({**os.environ, "PYTHONPATH": str(ROOT)}, "-m", "autograder.cli", "doctor")
    assert "mode     with Triton" in r.stdout and "self-test passed" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("how,status", [
    # the engine's own exception: lesson 15's stub does not import it, so the scan names the line
    ("    from reference_engine.kernels.triton_compat import TritonUnavailable\n", ("rejected",)),
    # a class of the same name: graded, and it raised
    ("    class TritonUnavailable(RuntimeError):\n        pass\n", ("error", "failed")),
])
def test_a_learner_cannot_skip_a_triton_check_by_raising_triton_unavailable(tmp_path, how, status):
    """Whether Triton is there is decided by the grader, never by what the learner's code raises: on a machine
    with Triton, a kernel that raises TritonUnavailable earns nothing."""
    src = (ROOT / "solutions" / "l15_attention_layouts.py").read_text()
    src += ("\n\ndef gqa_decode_triton(q, k_cache, v_cache, seq_lens, block_n=16):\n" + how +
            "    raise TritonUnavailable('Triton is not available on this platform')\n")
    path = tmp_path / "l15_cheat.py"
    path.write_text(src)
    out = tmp_path / "r.json"
    _run({**os.environ, "PYTHONPATH": str(ROOT)}, "-m", "autograder.cli", "check", "15", "--file", str(path),
         "--only", "gqa_decode_triton", "--json", str(out))
    (c,) = json.loads(out.read_text())["lessons"]["l15_attention_layouts"]["checks"]
    assert c["status"] in status and c["earned"] == 0, c


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_course_lab_serves_the_exercises(tmp_path):
    """`course lab 04` roots Jupyter at the course directory: the notebook and exercises/, where its answers are
    written, are both reachable through the server's contents API (a learner with only a browser can edit them),
    and the lesson is the file it opens."""
    from autograder.cli import lab_command
    port, token = _free_port(), "course-lab-test"
    cmd = lab_command("04", ["--no-browser", f"--port={port}", f"--IdentityProvider.token={token}",
                             "--ServerApp.ip=127.0.0.1"])
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def get(path):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                status, _ = get("/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the lab server did not start: " + (proc.stdout.read() if proc.poll() is not
                                                                              None else "timeout")) from None
                time.sleep(0.5)
        status, ex = get("/api/contents/exercises/l04_paged_attention.py?content=1&type=file&format=text")
        assert status == 200 and ex["content"] == (ROOT / "exercises" / "l04_paged_attention.py").read_text()
        status, nb = get("/api/contents/lessons/l04_paged_attention.ipynb?content=0")
        assert status == 200 and nb["type"] == "notebook"
        status, top = get("/api/contents/?content=1")
        assert {"lessons", "exercises"} <= {item["name"] for item in top["content"]}
        # What a browser is sent to (the server writes it for `--no-browser` too): the lesson, in JupyterLab.
        opened = list((tmp_path / "rt").glob("jpserver-*-open.html"))
        assert opened and any("lab/tree/lessons/l04_paged_attention.ipynb" in p.read_text() for p in opened), opened
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
