"""The engine implements several lessons' answers (lesson 02's bytes per token in reference_engine.config, a paged
KV cache, speculative decoding, a prefix cache, ...). A learner's module may import of the engine only what its
lesson's stub imports: the scan rejects the rest (line named), and with the scan bypassed the learner process
refuses the import itself."""
import importlib
import textwrap

import pytest

from autograder import core, lessons, runner, scan
from autograder.runner import Target, grade_lesson

STEMS = [lesson.stem for lesson in lessons.available()]
ENGINE_ANSWER = """
    from reference_engine.config import kv_bytes_per_token as _engine
    def kv_bytes_per_token(config, dtype):
        return _engine(config, dtype)
    """


@pytest.mark.parametrize("stem", STEMS)
def test_the_solution_and_the_stub_use_only_what_the_stub_imports(stem):
    use = scan.lesson_engine_use(stem)
    for where in ("solutions", "exercises"):
        found = scan.scan_file(str(runner.ROOT / where / f"{stem}.py"), use)
        assert not found, f"{where}/{stem}.py: {[str(f) for f in found]}"


def _target(tmp_path, body: str) -> Target:
    header = (runner.ROOT / "exercises" / "l02_kv_cache.py").read_text()
    return Target.from_source(header + "\n\n" + textwrap.dedent(body), tmp_path, "engine_answer", label="mine.py")


def test_lesson_02_cannot_take_its_answer_from_the_engine(tmp_path):
    (r,) = grade_lesson("l02_kv_cache", _target(tmp_path, ENGINE_ANSWER), 1, only=["kv_bytes_per_token"])
    assert r.status == "rejected" and r.earned == 0, (r.status, r.message)
    assert "from reference_engine.config import kv_bytes_per_token" in r.message and "line " in r.message


@pytest.mark.parametrize("body", [ENGINE_ANSWER, """
    def kv_bytes_per_token(config, dtype):
        import reference_engine.config as c
        return c.kv_bytes_per_token(config, dtype)
    """])
def test_with_the_scan_bypassed_the_learner_process_refuses_the_import(tmp_path, body):
    spec = next(s for s in core.load_checks("l02_kv_cache") if s.name == "kv_bytes_per_token")
    ref = importlib.import_module("solutions.l02_kv_cache")
    r = runner.run_check(spec, _target(tmp_path, body), ref, 1, cuda=False, timeout=20)
    assert r.earned == 0 and "cannot be imported in this lesson's exercise" in r.message, (r.status, r.message)


def test_a_lesson_whose_stub_imports_that_part_may_use_it():
    """Lesson 06 builds on lesson 02: its stub imports the engine's bytes per token, so a learner's module may."""
    use = scan.lesson_engine_use("l06_capacity_planning")
    assert use.allows_import("reference_engine.config", "kv_bytes_per_token")
    assert not scan.scan_source("from reference_engine.config import kv_bytes_per_token\n", engine=use)
    assert scan.scan_source("from reference_engine.block_manager import BlockManager\n", engine=use)


def test_a_module_the_stub_imports_whole_may_be_used_whole():
    use = scan.lesson_engine_use("l14_speculative_decoding")  # `from reference_engine import gpu_model as gm`
    assert not scan.scan_source("from reference_engine.sim.gpu_model import Composition\n", engine=use)
    assert not scan.scan_source("import reference_engine.sim.gpu_model\n", engine=use)
    assert scan.scan_source("from reference_engine.spec_decode import verify\n", engine=use)


def test_reaching_a_submodule_through_the_package_is_named():
    use = scan.lesson_engine_use("l16_quantization")  # its stub imports reference_engine.kernels.launch, not the package
    found = scan.scan_source("import reference_engine\nq = reference_engine.quantization\n", engine=use)
    assert [f.line for f in found] == [1, 2] and "reference_engine.quantization" in found[1].what
