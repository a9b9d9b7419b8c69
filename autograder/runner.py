"""Grade one lesson: check code and expected values here, learner code in its own process.

For each check the grader starts a learner process (a fork of the zygote, which
never imported the solutions), loads the learner's module there, and runs the
check function here: every `t.call` is a request to that process, and what comes
back is plain data judged here. When the check ends, the learner process and
everything it started are killed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import os
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

from . import core, lessons, reference, runtime, scan, zygote
from .core import (
    CRASHED,
    ERROR,
    FAILED,
    NOT_GRADED,
    NOT_STARTED,
    PASSED,
    REJECTED,
    TIMEOUT,
    CheckResult,
    CheckSpec,
    Part,
    load_checks,
)
from .parallel import run_checks
from .sandbox import LearnerGone, LearnerProcess, LearnerRaised

ROOT = Path(__file__).resolve().parent.parent
_STATUS_OF = {"timeout": TIMEOUT, "signal": CRASHED, "exit": ERROR}


@dataclasses.dataclass
class Target:
    """The code under test: a Python file, loaded in the learner's process under `module_name`."""
    path: str
    label: str = ""
    module_name: str = "learner_module"
    sys_path: tuple[str, ...] = ()

    @classmethod
    def for_lesson(cls, stem: str, solutions: bool = False) -> "Target":
        pkg = "solutions" if solutions else "exercises"
        return cls(path=str(ROOT / pkg / f"{stem}.py"), label=f"{pkg}/{stem}.py", module_name=f"course_{pkg}_{stem}")

    @classmethod
    def from_source(cls, source: str, directory: str | os.PathLike, name: str, label: str = "") -> "Target":
        """Write `source` to DIRECTORY/NAME.py and target it (mutants, notebooks' answer cells)."""
        path = Path(directory) / f"{name}.py"
        path.write_text(source)
        return cls(path=str(path), label=label or name, module_name=name)


def check_seed(seed: int, name: str) -> int:
    return zlib.crc32(f"{seed}:{name}".encode()) & 0x7FFFFFFF


def _summarise(spec: CheckSpec, parts: list[Part]) -> tuple[float, str, str]:
    graded = [p for p in parts if p.graded]
    if not graded:
        if parts:
            return 0.0, NOT_GRADED, parts[0].message
        return 0.0, ERROR, "the check recorded no result (a bug in the grader: please report it)"
    earned = _earned(spec, parts)
    bad = [p for p in graded if not p.passed]
    if not bad:
        return earned, PASSED, f"{len(graded)} case(s) passed"
    first = bad[0]
    more = f"\n({len(bad) - 1} more of {len(graded)} cases failed)" if len(bad) > 1 else ""
    # The status is that of the case the message shows, the first one failed: "error" when the learner's code
    # raised there (its traceback follows), "failed" when it returned a wrong value.
    status = ERROR if first.kind == core.RAISED else FAILED
    return earned, status, f"{first.label}: {first.message}{more}"


def _earned(spec: CheckSpec, parts: list[Part]) -> float:
    graded = [p for p in parts if p.graded]
    total = sum(p.weight for p in graded)
    if not total:
        return 0.0
    return round(spec.points * sum(p.weight for p in graded if p.passed) / total, 2)


def _gone_message(e: LearnerGone, timeout: float) -> str:
    if e.kind == "timeout":
        return f"your code is still running after {timeout:g} s (an infinite loop, or far too slow)"
    if e.kind == "signal":
        return f"your code crashed the process: {e.detail}"
    return e.detail


def _raised_status(e: LearnerRaised) -> tuple[str, str]:
    if e.not_implemented:
        return NOT_STARTED, e.stub_message
    if e.type_name == "SystemExit":
        return ERROR, f"your code called sys.exit() ({e.info.get('message')}); return a value instead"
    return ERROR, f"{e.what}() raised:\n{e.tb_text}"


class _Session:
    """The learner process of one check, started on first use (a check may need none)."""

    def __init__(self, target: Target, deadline: float, handoff: str | None = None, engine: dict | None = None):
        self.target, self.deadline, self.proc, self.handoff = target, deadline, None, handoff
        self.engine = engine  # what of the engine the learner's module may import (scan.lesson_engine_use)

    def __getattr__(self, name):  # LearnerProcess API, started lazily
        if self.proc is None:
            self.proc = LearnerProcess.start(self.deadline, target=self.target.path,
                                             readable=(self.handoff, *self.target.sys_path))
            self.proc.load(self.target.path, self.target.module_name, list(self.target.sys_path), self.engine)
        return getattr(self.proc, name)

    def close(self) -> str:
        return self.proc.close() if self.proc is not None else ""


def run_check(spec: CheckSpec, target: Target, ref, seed: int, cuda: bool, timeout: float,
              visible_only: bool = False) -> CheckResult:
    start = time.monotonic()
    # The files a check writes for the learner's code to read (lesson 11's checkpoints: tempfile, here) go to a
    # directory of this check's that its learner process may read (it may read no other: autograder/oslimits.py).
    handoff = tempfile.mkdtemp(prefix="course-handoff-")
    saved_tempdir, tempfile.tempdir = tempfile.tempdir, handoff
    session = _Session(target, start + timeout, handoff, scan.lesson_engine_use(spec.lesson).to_dict())
    t = core.Trial(session, ref, check_seed(seed, spec.name), cuda, visible_only=visible_only)
    status = msg = None
    try:
        if spec.requires_cuda and not cuda:
            status, msg = NOT_GRADED, "needs a CUDA GPU"
        elif spec.requires_triton and (missing := core.triton_missing()):
            status, msg = NOT_GRADED, missing
        else:
            with reference.answering(ref):
                spec.func(t)
    except core.NotStarted as e:
        status, msg = NOT_STARTED, str(e) or "the stub still raises NotImplementedError"
    except LearnerGone as e:
        status, msg = _STATUS_OF[e.kind], _gone_message(e, timeout)
    except LearnerRaised as e:  # outside any case: importing the module, or a lookup
        status, msg = _raised_status(e)
    except core.CaseFailed as e:
        t.parts.append(Part("check", 1.0, False, str(e), kind=core.WRONG, hidden=t.hidden_now))
    except zygote.ForkFailed as e:
        status, msg = ERROR, fork_failed_message(e)
    except zygote.ZygoteGone:
        status, msg = CRASHED, ("the grader's process that starts your code's processes was killed while this "
                                "check ran (does your code kill its parent process, os.getppid()?)")
    except Exception as e:  # noqa: BLE001 - what the learner returned broke the check's own code
        status = ERROR
        msg = f"the check could not use what your code returned ({type(e).__name__}: {e})"
    finally:
        output = session.close()
        tempfile.tempdir = saved_tempdir
        shutil.rmtree(handoff, ignore_errors=True)
    seconds = round(time.monotonic() - start, 3)
    parts = [dataclasses.asdict(p) for p in t.parts]
    if status is None:
        earned, status, msg = _summarise(spec, t.parts)
    elif status in (ERROR, TIMEOUT, CRASHED):
        # The cases it passed before it stopped count; the ones it never reached weigh as one failed part.
        earned = _earned(spec, t.parts + [Part("the rest of the check", 1.0, False, msg, kind=core.RAISED)])
    else:
        earned = 0.0
    return CheckResult(spec.lesson, spec.name, spec.section, spec.points, earned, status, msg, parts, output, seconds,
                       sorted(t.offered), t.hidden_now if status is not None else "")


def fork_failed_message(e: zygote.ForkFailed) -> str:
    return (f"this machine refused to start a process for your code ({e}), even after a few seconds: it has too "
            "many processes, or too little free memory, right now. Run the check again.")


def _import_failure(e: Exception, target: Target) -> tuple[str, str]:
    what = target.label or target.path
    if isinstance(e, LearnerGone):
        if e.kind == "timeout":
            return TIMEOUT, f"importing {what} did not finish ({e.detail}): is there a loop at module level?"
        if e.kind == "signal":
            return CRASHED, f"importing {what} crashed the interpreter: {e.detail}"
        return ERROR, f"importing {what} ended the process: {e.detail}"
    assert isinstance(e, LearnerRaised)
    if e.not_implemented:
        return NOT_STARTED, f"{what} raises NotImplementedError when imported"
    return ERROR, f"{what} could not be imported:\n{e.tb_text}"


def preflight(target: Target, timeout: float = 60.0, stem: str | None = None) -> tuple[str, str] | None:
    """Scan the learner's source, then import it once in a learner process: a module that is rejected or
    does not import fails every check the same way. Returns (status, message) or None when fine. With `stem`,
    the learner's module may use of the engine only what that lesson's stub does (scan.lesson_engine_use)."""
    engine = scan.lesson_engine_use(stem) if stem else None
    try:
        findings = scan.scan_file(target.path, engine)
    except OSError as e:
        return ERROR, f"{target.label or target.path} could not be read: {e}"
    if findings:
        return REJECTED, scan.report(findings, target.label or target.path)
    try:
        proc = LearnerProcess.start(time.monotonic() + timeout, target=target.path, readable=target.sys_path)
    except zygote.ForkFailed as e:
        return ERROR, fork_failed_message(e)
    try:
        proc.load(target.path, target.module_name, list(target.sys_path), engine.to_dict() if engine else None)
    except (LearnerRaised, LearnerGone) as e:
        return _import_failure(e, target)
    finally:
        proc.close()
    return None


def grade_lesson(stem: str, target: Target, seed: int, only: list[str] | None = None,
                 timeout_scale: float | None = None, checks_module: str | None = None,
                 ref_module: str | None = None, visible_only: bool = False, ref=None, jobs: int = 1) -> list[CheckResult]:
    """Grade `target` on lesson `stem`'s checks; expected values come from `ref` (a module-like object),
    `ref_module`, or by default solutions.<stem> (in a student's copy: the visible cases stored at release,
    see autograder/reference.py), here in the grader's process. jobs=2: a second grader shares the checks
    (parallel.run_checks; the same results)."""
    runtime.setup()
    # before the solutions are imported: a fork taken now holds none
    zygote.prepare(lessons.warm_imports([stem]), lessons.later_imports([stem]), lessons.needs_torch([stem]))
    specs = load_checks(stem, checks_module)
    if only:
        specs = [s for s in specs if s.name in only]
    scale = timeout_scale or float(os.environ.get("COURSE_TIMEOUT_SCALE", "1"))
    cuda = runtime.cuda_available()
    if ref is None and ref_module is not None:
        ref = importlib.import_module(ref_module)
    elif ref is None:
        ref, stored, forced_seed = reference.for_lesson(stem)
        if stored:  # a student's copy: the visible cases, with the seed they were recorded at
            visible_only, seed = True, forced_seed
    pre = preflight(target, stem=stem)
    if pre is not None:
        return [CheckResult(stem, spec.name, spec.section, spec.points, 0.0, pre[0], pre[1]) for spec in specs]
    with runtime.grading_threads(), _imports_out_of_the_collector():
        results = run_checks(specs, lambda spec: run_check(spec, target, ref, seed, cuda, spec.timeout * scale,
                                                           visible_only), jobs)
    sys.stdout.flush()
    return results


@contextlib.contextmanager
def _imports_out_of_the_collector():
    """What exists now (torch, the engine, the lesson's modules: hundreds of thousands of objects that live as
    long as the process) is left out of full collections while grading (gc.freeze), and handed back after
    (a notebook that grades goes on as before). A check whose reference work is Python-heavy (lesson 10's
    fleet simulations) triggers a few full collections, and each walked that whole heap: 0.1 s apiece.
    The collector runs while grading even where it was off (cli.run turns it off for its imports)."""
    enabled = gc.isenabled()
    gc.freeze()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
        if not enabled:
            gc.disable()
