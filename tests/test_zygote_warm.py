"""What a lesson's zygote imports once for all its learner processes (Lesson.warm, zygote.BASE_WARM)."""
import ast
import subprocess
import sys

from autograder import lessons, zygote


def test_warm_lists_name_lessons_and_real_modules_and_start_no_thread():
    """Importing them in a zygote starts no thread: a fork keeps only the thread that forked, so a thread
    holding a lock at that moment would leave the lock held forever in every learner process."""
    stems = [lesson.stem for lesson in lessons.LESSONS]
    every = lessons.warm_imports(stems) + lessons.later_imports(stems)
    code = ("import sys, threading\nfrom autograder import zygote\n"
            f"zygote._warm_imports({every!r})\n"
            f"print(threading.active_count(), [m for m in {zygote.BASE_WARM + every!r} if m not in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split(None, 1) == ["1", "[]\n"], out


def _top_level_imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_an_exercise_that_imports_triton_has_its_zygote_import_it():
    """Triton is not in the base set (a quarter of a second on every `course check`): a lesson whose exercise
    imports it must name it, or each of its checks' processes pays the import."""
    for lesson in lessons.LESSONS:
        path = lessons.ROOT / "exercises" / f"{lesson.stem}.py"
        if path.exists() and "triton" in _top_level_imports(path):
            assert "triton" in lessons.warm_imports([lesson.stem]), lesson.stem


def test_want_adds_to_every_zygote_started_later():
    saved = zygote._WANTED, zygote._WANTED_BASE
    try:
        zygote.want(("a", "b"))
        zygote.want(("b", "c"))
        assert zygote._WANTED[-3:] == ("a", "b", "c") and zygote._WANTED_BASE
    finally:
        zygote._WANTED, zygote._WANTED_BASE = saved


def test_lessons_without_tensors_import_no_torch():
    """A lesson whose record says torch=False: what grading such a lesson imports (the grader's modules, its checks, solution and
    exercise) leaves torch out; were one of them to import it, its zygote would lack it and every learner
    process would import it itself (1-2 s each)."""
    no_torch = [lesson.stem for lesson in lessons.LESSONS if not lesson.torch]
    assert len(no_torch) >= 6, no_torch
    mods = ["autograder.cli", "autograder.runner", "autograder.parallel", "autograder.reference"] + [
        f"{pkg}.{stem}" for stem in no_torch for pkg in ("autograder.checks", "solutions", "exercises")]
    code = f"import sys\nfor m in {mods!r}: __import__(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert lessons.needs_torch(["l10_autoscaling", "l04_paged_attention"]) and not lessons.needs_torch(no_torch)


def test_a_lesson_without_tensors_is_graded_without_torch_in_any_process(tmp_path):
    """A fresh grader of such a lesson (`course check 13`) never imports torch, nor do its learner processes;
    learner code that imports it still gets it, computing with one thread."""
    (tmp_path / "probe.py").write_text("import sys\n\ndef has(name):\n    return name in sys.modules\n\n"
                                       "def threads():\n    import torch\n    return torch.get_num_threads()\n")
    code = f"""
import sys, time
from autograder import wire, zygote
from autograder.runner import Target, grade_lesson
from autograder.sandbox import LearnerProcess
results = grade_lesson("l13_gpu_utilization", Target.for_lesson("l13_gpu_utilization", solutions=True), 1, jobs=2)
assert all(r.status == "passed" for r in results), results
proc = LearnerProcess.start(time.monotonic() + 60, target={str(tmp_path / "probe.py")!r})
try:
    proc.load({str(tmp_path / "probe.py")!r}, "probe", [])
    call = lambda name, *args: proc.call(wire.LearnerRef(name), args, {{}}, what=name)[0]
    print(call("has", "torch"), call("threads"), zygote.get().base, "torch" in sys.modules)
finally:
    proc.close()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=lessons.ROOT)
    assert out.stdout.split() == ["False", "1", "False", "False"], out.stdout + out.stderr


def test_a_forked_zygote_that_needs_torch_inherits_it_from_the_grader():
    """The grader imports torch before forking such a zygote: forked first, the zygote imported it beside the
    grader (which imports it too) and held back every learner process of lessons 03 and 07 by 0.8 s."""
    code = """
import sys
from autograder import zygote
assert "torch" not in sys.modules
z = zygote.get(base=True)
print(z.mode, "torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=lessons.ROOT)
    assert out.stdout.split() == ["fork", "True"], out.stdout + out.stderr


def test_a_zygote_without_torch_is_replaced_when_a_lesson_needs_it():
    """Grading a lesson without tensors, then one with (a notebook, a test session): the second gets a zygote
    with torch and the engine imported, not the first one's."""
    code = """
from autograder import zygote
first = zygote.get(base=False)
assert zygote.get() is first and not first.base
second = zygote.get(base=True)
assert second is not first and second.base and not first.alive()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=lessons.ROOT)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_learner_processes_and_the_grader_compute_with_one_thread_while_grading(tmp_path):
    """Graders and learner processes run side by side on CPU: with a thread a core each, their OpenMP threads
    outnumber the cores and spin (runtime.grading_threads). A notebook that grades keeps its own setting."""
    import time

    import torch

    from autograder import runtime, wire
    from autograder.sandbox import LearnerProcess
    (tmp_path / "threads.py").write_text("import torch\n\ndef n():\n    return torch.get_num_threads()\n")
    proc = LearnerProcess.start(time.monotonic() + 30, target=str(tmp_path / "threads.py"))
    try:
        proc.load(str(tmp_path / "threads.py"), "threads", [])
        value, _, _ = proc.call(wire.LearnerRef("n"), (), {}, what="n")
    finally:
        proc.close()
    assert value == runtime.GRADING_THREADS == 1
    before = torch.get_num_threads()
    with runtime.grading_threads():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_grading_hands_back_the_thread_count_and_the_collector_as_it_found_them():
    """A notebook that grades goes on with its own torch threads and a collector that sees all its objects."""
    import gc

    import torch

    from autograder.runner import Target, grade_lesson
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = grade_lesson("l13_gpu_utilization", Target.for_lesson("l13_gpu_utilization", solutions=True), 1)
        assert all(r.status == "passed" for r in results)
        assert torch.get_num_threads() == 2 and gc.get_freeze_count() == 0
    finally:
        torch.set_num_threads(before)


def test_a_zygote_serves_before_its_later_modules_and_imports_them_while_idle(tmp_path):
    """Lesson.warm_later: the first learner process is forked at once (it imports what it lacks itself); one
    forked once the zygote has been idle finds them imported."""
    import time

    from autograder import wire
    from autograder.sandbox import LearnerProcess
    (tmp_path / "mods.py").write_text("import sys\n\ndef has(name):\n    return name in sys.modules\n")
    saved = zygote._ZYGOTE
    zygote._ZYGOTE = None
    try:
        zygote.get(later=("http.server", "xml.dom.minidom"))
        asks = []
        for _ in range(2):
            proc = LearnerProcess.start(time.monotonic() + 30, target=str(tmp_path / "mods.py"))
            try:
                proc.load(str(tmp_path / "mods.py"), "mods", [])
                asks.append(proc.call(wire.LearnerRef("has"), ("xml.dom.minidom",), {}, what="has")[0])
            finally:
                proc.close()
            time.sleep(1.0)
        assert asks == [False, True], asks
    finally:
        zygote.shutdown()
        zygote._ZYGOTE = saved
