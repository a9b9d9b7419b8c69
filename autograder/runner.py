"""Grade one lesson: import its checks, run each in isolation, turn outcomes into rows."""
from __future__ import annotations

import dataclasses
import importlib
import os
import types
import zlib
from pathlib import Path

from . import core, runtime, sandbox
from .core import (CRASHED, ERROR, FAILED, NOT_GRADED, NOT_STARTED, PASSED, TIMEOUT, CheckSpec,
                   Part)

_PKG_DIR = str(Path(__file__).resolve().parent)
_STATUS_OF = {"timeout": TIMEOUT, "signal": CRASHED, "exit": ERROR}


@dataclasses.dataclass
class CheckResult:
    lesson: str
    name: str
    section: str
    points: float
    earned: float
    status: str
    message: str
    parts: list = dataclasses.field(default_factory=list)
    output: str = ""
    seconds: float = 0.0

    @property
    def graded(self) -> bool:
        return self.status != NOT_GRADED

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["parts"] = [dataclasses.asdict(p) if isinstance(p, Part) else p for p in self.parts]
        return d


@dataclasses.dataclass
class Target:
    """Where the code under test comes from: a module name, or (fork only) a module object."""
    module_name: str | None = None
    module: types.ModuleType | None = None
    label: str = ""

    @classmethod
    def for_lesson(cls, stem: str, solutions: bool = False) -> "Target":
        pkg = "solutions" if solutions else "exercises"
        return cls(module_name=f"{pkg}.{stem}", label=f"{pkg}/{stem}.py")

    def load(self):
        if self.module is not None:
            return self.module
        return importlib.import_module(self.module_name)


def check_seed(seed: int, name: str) -> int:
    return zlib.crc32(f"{seed}:{name}".encode()) & 0x7FFFFFFF


def load_checks(stem: str, checks_module: str | None = None) -> list[CheckSpec]:
    """The lesson's checks, in file order. `checks_module` overrides where they live (tests)."""
    importlib.import_module(checks_module or f"autograder.checks.{stem}")
    return core.registered(stem)


def _run_check(stem: str, name: str, target: Target, seed: int, cuda: bool,
               checks_module: str | None, ref_module: str) -> dict:
    """Child side: run one check and return plain data."""
    spec = next(s for s in load_checks(stem, checks_module) if s.name == name)
    impl = target.load()
    ref = importlib.import_module(ref_module)
    t = core.Trial(impl, ref, seed, cuda, skip_files=(_PKG_DIR,))
    if spec.requires_cuda and not cuda:
        return {"status": NOT_GRADED, "message": "needs a CUDA GPU", "parts": []}
    try:
        spec.func(t)
    except core.NotStarted as e:
        return {"status": NOT_STARTED, "message": str(e) or "the stub still raises NotImplementedError",
                "parts": []}
    except core.LearnerRaised as e:
        return {"status": ERROR, "message": f"{e.what}() raised:\n{e.tb_text}",
                "parts": [dataclasses.asdict(p) for p in t.parts]}
    except core.CaseFailed as e:
        t.parts.append(Part("check", 1.0, False, str(e)))
    except Exception as e:  # noqa: BLE001 - what the learner returned broke the check itself
        tb = core.learner_traceback(e, ())
        return {"status": ERROR, "message": "the check could not use what your code returned "
                f"({type(e).__name__}: {e}).\n{tb}", "parts": [dataclasses.asdict(p) for p in t.parts]}
    return {"status": None, "message": "", "parts": [dataclasses.asdict(p) for p in t.parts]}


def _summarise(spec: CheckSpec, data: dict) -> tuple[float, str, str]:
    parts = [Part(**p) for p in data["parts"]]
    if data["status"] is not None:
        earned = _earned(spec, parts) if data["status"] == ERROR else 0.0
        return earned, data["status"], data["message"]
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
    raised = all("raised:" in p.message.split("\n")[0] for p in bad)
    status = ERROR if raised and len(bad) == len(graded) else FAILED
    return earned, status, f"{first.label}: {first.message}{more}"


def _earned(spec: CheckSpec, parts: list[Part]) -> float:
    graded = [p for p in parts if p.graded]
    total = sum(p.weight for p in graded)
    if not total:
        return 0.0
    return round(spec.points * sum(p.weight for p in graded if p.passed) / total, 2)


def _import_target(target: Target) -> str:
    mod = target.load()
    return getattr(mod, "__file__", "") or ""


def preflight(target: Target, timeout: float = 60.0) -> sandbox.Outcome:
    """Import the learner module once, isolated: a broken import fails every check the same way."""
    if target.module is not None:
        return sandbox.Outcome("ok")
    return sandbox.run_isolated(_import_target, (target,), timeout=timeout)


def _import_failure(outcome: sandbox.Outcome, target: Target) -> tuple[str, str]:
    what = target.label or target.module_name
    if outcome.kind == "timeout":
        return TIMEOUT, f"importing {what} did not finish ({outcome.detail}): is there a loop at module level?"
    if outcome.kind == "signal":
        return CRASHED, f"importing {what} crashed the interpreter: {outcome.detail}"
    return ERROR, f"{what} could not be imported: {outcome.detail}"


def grade_lesson(stem: str, target: Target, seed: int, only: list[str] | None = None,
                 timeout_scale: float | None = None, checks_module: str | None = None,
                 ref_module: str | None = None) -> list[CheckResult]:
    """Grade `target` on lesson `stem`'s checks; expected values come from `ref_module`
    (default solutions.<stem>)."""
    runtime.setup()
    specs = load_checks(stem, checks_module)
    if only:
        specs = [s for s in specs if s.name in only]
    scale = timeout_scale or float(os.environ.get("COURSE_TIMEOUT_SCALE", "1"))
    cuda = runtime.cuda_available()
    ref_module = ref_module or f"solutions.{stem}"
    importlib.import_module(ref_module)  # children inherit the imported reference
    pre = preflight(target)
    results = []
    for spec in specs:
        if pre.kind != "ok":
            status, msg = _import_failure(pre, target)
            results.append(CheckResult(stem, spec.name, spec.section, spec.points, 0.0, status, msg,
                                       output=pre.output))
            continue
        out = sandbox.run_isolated(_run_check, (stem, spec.name, target, check_seed(seed, spec.name),
                                                cuda, checks_module, ref_module), timeout=spec.timeout * scale)
        if out.kind == "ok":
            earned, status, msg = _summarise(spec, out.value)
            parts = out.value["parts"]
        else:
            earned, status, parts = 0.0, _STATUS_OF[out.kind], []
            msg = {"timeout": f"your code is still running after {spec.timeout * scale:g} s "
                              "(an infinite loop, or far too slow)",
                   "signal": f"your code crashed the process: {out.detail}",
                   "exit": _exit_message(out.detail)}[out.kind]
        results.append(CheckResult(stem, spec.name, spec.section, spec.points, earned, status, msg,
                                   parts, out.output, round(out.seconds, 3)))
    return results


def _exit_message(detail: str) -> str:
    if detail.startswith("SystemExit"):
        return f"your code called sys.exit() ({detail}); return a value instead"
    if detail.startswith("KeyboardInterrupt"):
        return "interrupted"
    return detail

