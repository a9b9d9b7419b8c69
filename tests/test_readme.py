"""The README's grading sample is a real run's output: regenerated here, so that it cannot go stale."""
import re
import subprocess
import sys
from pathlib import Path

from tests.mutants import load

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["check", "02", "--seed", "7", "--only", "dtype_bytes", "kv_bytes_per_token", "kv_cache_bytes"]


def readme_sample() -> str:
    """The first fenced block of the README's "## Grading" section."""
    grading = re.search(r"^## Grading\n(.*?)(?=^## )", (ROOT / "README.md").read_text(), flags=re.M | re.S).group(1)
    return re.search(r"^```\n(.*?)\n```", grading, flags=re.M | re.S).group(1)


def test_grading_sample_is_the_real_output_of_a_learner_who_counts_only_k(tmp_path):
    """Lesson 02's solutions with one mistake, the one the README names: kv_bytes_per_token counts only K."""
    (mistake,) = [m for m in load("l02_kv_cache") if m.check == "kv_bytes_per_token"
                  and m.message == "counts only K, not K and V"]
    learner = tmp_path / "l02_kv_cache.py"
    learner.write_text(mistake.source())
    r = subprocess.run([sys.executable, "-m", "autograder.cli", *COMMAND, "--file", str(learner)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("check "))
    end = next(i for i, line in enumerate(lines) if line.startswith("score "))
    real = "\n".join(lines[start:end] + [re.sub(r"  in [\d.]+ s$", "", lines[end])])
    assert readme_sample() == real, f"README.md's grading sample is stale; the real output is:\n{real}"
