"""The prepared GPU check runs on a CPU too: GPU parts are reported as skipped (never passed), and a part that
breaks is reported as failed with its traceback while the other parts still run."""
import json

import torch

from autograder import gpu_check

GPU_PARTS = ("paged decode bandwidth", "W4A16 vs bf16 (lesson 16's kernel)", "HBM bandwidth (measured table)", "modeled clock vs measured kernels",
             "engine benchmark")


def test_gpu_check_on_this_machine_writes_its_reports(tmp_path, capsys):
    code = gpu_check.main(["--out", str(tmp_path), "--lessons", "02", "--quick"])
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    parts = {p["part"]: p for p in report["parts"]}
    assert code == 0, gpu_check.summary(report)
    assert parts["doctor"]["status"] == parts["triton kernels"]["status"] == "passed"
    lessons = parts["lessons with the solutions"]
    assert lessons["status"] == "passed" and set(lessons["data"]["lessons"]) == {"l02_kv_cache"}
    for name in GPU_PARTS:
        assert parts[name]["status"] == ("passed" if torch.cuda.is_available() else "skipped"), parts[name]
    if not torch.cuda.is_available():
        assert set(parts["triton kernels"]["data"]["cases"]) == {"paged_decode fp32", "flash_decode fp32", "write_kv fp32",
                                                           "prefill fp32", "flash_decode verification rows fp32"}
    text = (tmp_path / "gpu-check.txt").read_text()
    assert text.strip() in capsys.readouterr().out
    assert ("skipped" in text) != torch.cuda.is_available()


def test_a_broken_part_fails_alone(tmp_path, monkeypatch):
    def broken(device):
        raise RuntimeError("kernel exploded")
    monkeypatch.setattr(gpu_check, "kernels", broken)
    code = gpu_check.main(["--out", str(tmp_path), "--lessons", "01"])
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    parts = {p["part"]: p for p in report["parts"]}
    assert code == 1
    assert parts["triton kernels"]["status"] == "failed" and "kernel exploded" in parts["triton kernels"]["detail"]
    assert parts["lessons with the solutions"]["status"] == "passed"


def test_a_kernel_that_disagrees_with_torch_is_a_failure(monkeypatch):
    from reference_engine import kernels
    real = kernels.triton_kernels()

    class Wrong:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def paged_decode_triton(*args):
            return real.paged_decode_triton(*args) * 1.01
    monkeypatch.setattr(kernels, "triton_kernels", lambda: Wrong())
    status, detail, data = gpu_check.kernels("cuda" if torch.cuda.is_available() else "cpu")
    assert status == "failed" and "paged_decode fp32" in detail and data["cases"]["write_kv fp32"] == "ok"


def test_perf_runs_the_performance_parts_only(tmp_path):
    code = gpu_check.main(["--out", str(tmp_path), "--perf", "--quick"])
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    names = [p["part"] for p in report["parts"]]
    assert code == 0 and "lessons with the solutions" not in names
    assert names[-5:] == list(GPU_PARTS)
    assert all(p["status"] == "skipped" for p in report["parts"][-5:])  # a CPU: skipped, never passed
