"""Grade on two cores: several lessons at once (`course grade --jobs N`), or one lesson's checks shared by two
graders (`course check`).

A lesson's checks run one after another (each one's learner process beside the grader's reference
work), which keeps a machine's second core mostly idle. `grade_lessons` forks N graders, each taken
before anything imports the solutions or the checks (this process never imports the checks: their names
are read by a forked child), so each starts its own zygote as a clean fork (autograder/zygote.py) and
grades whole lessons, one at a time, as they are handed out. A grader sends back each lesson's results
as JSON (CheckResult.to_dict): the grader's own verdicts, no learner object crosses. Seeds are per lesson
and per check, so the scores are the ones a one-at-a-time run gives.

A check that measures this machine's wall-clock time (`@check(timed=True)`) is graded by this process
once the workers are done, alone; its lesson's other checks go to the workers. Where forking is not clean
(solutions already imported here, or a CUDA machine) every lesson is graded in this process, one after
another. A worker that dies leaves its task to this process too.
"""
from __future__ import annotations

import json
import os
import select
import signal
from collections.abc import Callable

from . import lessons, zygote
from .core import CheckResult, Part, load_checks


def grade_lessons(stems: list[str], grade: Callable[..., list[CheckResult]], jobs: int) -> dict:
    """{stem: grade(stem)} for every stem, in the order given; `jobs` graders at a time when that is clean.
    grade(stem, only=None) grades the lesson's checks named in `only` (default: all of them)."""
    if jobs <= 1 or len(stems) <= 1 or not zygote.can_fork_clean() or zygote._ZYGOTE is not None:
        return {stem: grade(stem) for stem in stems}
    if lessons.needs_torch(stems):
        import torch  # noqa: F401 - imported once, here: every grader forked below (and its zygote) inherits it
    # The graders first: each starts its zygote (with every lesson's imports: one zygote serves them all) while
    # the checks' names are read.
    zygote_args = (lessons.warm_imports(stems), lessons.later_imports(stems), lessons.needs_torch(stems))
    workers: list[_Worker] = []
    for _ in range(min(jobs, len(stems))):
        workers.append(_Worker.start(grade, workers, zygote_args))
    specs = _check_specs(stems)
    if specs is None:  # the child that reads them failed: one lesson at a time, here
        for w in workers:
            w.close()
        return {stem: grade(stem) for stem in stems}
    order = {stem: [name for name, _ in specs[stem]] for stem in stems}
    timed = {stem: [name for name, is_timed in specs[stem] if is_timed] for stem in stems}
    shared = [(stem, [n for n in order[stem] if n not in timed[stem]]) for stem in stems]
    todo = [task for task in shared if task[1]]
    alone = [(stem, names) for stem, names in timed.items() if names]  # graded here once the workers are done
    done: dict[str, list[CheckResult]] = {stem: [] for stem in stems}
    for w in workers:
        w.give(todo.pop(0) if todo else None)
    while any(w.task for w in workers):
        ready, _, _ = select.select([w.results for w in workers if w.task], [], [])
        for w in workers:
            if w.results not in ready:
                continue
            got = w.take()
            if got is None:  # the worker died: this process grades its task at the end
                alone.append(w.task)
                w.task = None
                continue
            done[w.task[0]] += got
            w.give(todo.pop(0) if todo else None)
    for w in workers:
        w.close()
    for stem, names in alone:
        done[stem] += grade(stem, only=names)
    return {stem: sorted(done[stem], key=lambda r: order[stem].index(r.name)) for stem in stems}


def _check_specs(stems: list[str]) -> dict[str, list[tuple[str, bool]]] | None:
    """{stem: [(check name, timed), ...] in the lesson's order}, read by a forked child (None if it failed). Not
    here: no zygote may be forked from a process that imported a check module (zygote.holds_solutions), and this
    process grades the timed checks at the end with a zygote forked from it. (Importing every lesson's checks
    takes about 0.25 s, while the graders start their zygotes.)"""
    r, w = os.pipe()

    def child():  # (zygote._fork: never returns)
        os.close(r)
        names = {stem: [(spec.name, spec.timed) for spec in load_checks(stem)] for stem in stems}
        with os.fdopen(w, "wb") as out:
            out.write(json.dumps(names).encode())
    pid = zygote._fork(child)
    os.close(w)
    with os.fdopen(r, "rb") as got:
        data = got.read()
    os.waitpid(pid, 0)
    try:
        return {stem: [(str(name), bool(t)) for name, t in v] for stem, v in json.loads(data).items()}
    except (ValueError, TypeError):
        return None


class _Worker:
    """One forked grader: tasks (a lesson and the checks to run) arrive as JSON lines, each task's results
    leave as one JSON line."""

    def __init__(self, pid: int, tasks, results):
        self.pid, self.tasks, self.results, self.task = pid, tasks, results, None
        self._buf = b""

    @classmethod
    def start(cls, grade, siblings: list[_Worker], zygote_args: tuple = ((), (), True)) -> _Worker:
        """zygote_args: zygote.prepare's (warm, later, base), for the zygote it starts before its first task."""
        task_r, task_w = os.pipe()
        res_r, res_w = os.pipe()

        def worker():  # (zygote._fork: flushes first, never returns; the parent grades what this could not)
            os.close(task_w)
            os.close(res_r)
            for w in siblings:  # else a sibling would never see the end of its task pipe
                w.tasks.close()
                os.close(w.results)
            try:
                _serve(grade, os.fdopen(task_r, "rb"), os.fdopen(res_w, "wb"), zygote_args)
            finally:
                zygote.shutdown()  # its own zygote, and every learner process left
        pid = zygote._fork(worker)
        os.close(task_r)
        os.close(res_w)
        return cls(pid, os.fdopen(task_w, "wb"), res_r)

    def give(self, task: tuple[str, list[str]] | None):
        self.task = task
        if task is None:
            return
        try:
            self.tasks.write(json.dumps(task).encode() + b"\n")
            self.tasks.flush()
        except OSError:  # it died: take() reports it
            pass

    def take(self) -> list[CheckResult] | None:
        """This worker's results for its task, or None if it died."""
        while b"\n" not in self._buf:
            chunk = os.read(self.results, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:  # (only a grader of ours writes here; a line it did not write is its task lost, graded again)
            return [_result(d) for d in json.loads(line)]
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def close(self):
        for close in (self.tasks.close, lambda: os.close(self.results)):
            try:
                close()
            except OSError:
                pass
        os.waitpid(self.pid, 0)


def _serve(grade, tasks, results, zygote_args: tuple):
    zygote._ZYGOTE = None  # the parent's, if any, is not this process's to use
    zygote.prepare(*zygote_args)  # now, while it is a clean fork: grading a lesson imports its checks
    for line in tasks:
        stem, names = json.loads(line)
        out = [r.to_dict() for r in grade(stem, only=names)]
        results.write(json.dumps(out).encode() + b"\n")
        results.flush()


def run_checks(specs: list, run_one: Callable[..., CheckResult], jobs: int) -> list[CheckResult]:
    """[run_one(spec) for spec in specs], with a second grader when jobs > 1 and forking is clean.

    A check keeps both its processes busy only part of the time (the reference and the learner's code each
    wait on the other, or one side is idle while a Triton kernel is interpreted), so one lesson's checks
    graded one after another leave a core idle. Here a fork of this grader, taken before any check runs,
    takes checks from the same queue (a pipe of check indices, costliest first) and sends each result back
    as JSON; its learner processes come from a clone of this grader's zygote (Zygote.clone), as warm and as
    clean, that cleans up only its own. Seeds are per check, so the results are those of a one-at-a-time
    run. Timed checks run here afterwards, alone. A check the fork took but never reported (it died) is
    graded here at the end."""
    shared = [spec for spec in specs if not spec.timed]
    if jobs <= 1 or not 2 <= len(shared) <= 255 or not zygote.fork_is_safe():
        return [run_one(spec) for spec in specs]
    try:
        clone_pid, clone_sock = zygote.get().clone()
    except (zygote.ZygoteGone, zygote.ForkFailed):  # one grader then
        return [run_one(spec) for spec in specs]
    queue_r, queue_w = os.pipe()
    order = sorted(range(len(shared)), key=lambda i: -shared[i].cost)
    os.write(queue_w, bytes(order))  # one byte a check; a pipe holds 64 KiB
    os.close(queue_w)
    res_r, res_w = os.pipe()

    def second_grader():  # (zygote._fork: flushes first, and the fork never returns)
        os.close(res_r)
        zygote.adopt(clone_pid, clone_sock)
        try:
            with os.fdopen(res_w, "wb") as out:
                for i in _take(queue_r):
                    out.write(json.dumps(run_one(shared[i]).to_dict()).encode() + b"\n")
                    out.flush()
        finally:  # an exception leaves its checks to the first grader
            zygote.shutdown()  # closes the clone's socket: it kills what is left and exits
    pid = zygote._fork(second_grader)
    os.close(res_w)
    clone_sock.close()
    done: dict[str, CheckResult] = {}
    names = {spec.name for spec in shared}
    try:
        for i in _take(queue_r):
            done[shared[i].name] = run_one(shared[i])
        with os.fdopen(res_r, "rb") as got:
            for line in got:
                try:
                    r = _result(json.loads(line))
                except (ValueError, TypeError, KeyError, AttributeError):
                    continue
                if r.name in names and r.name not in done:  # this grader's own results are never overridden
                    done[r.name] = r
    except BaseException:  # Ctrl-C, say: the second grader stops too
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(queue_r)
        os.waitpid(pid, 0)
    return [done[spec.name] if spec.name in done else run_one(spec) for spec in specs]


def _take(queue_r: int):
    """The indices left in the queue, one at a time (a one-byte read from a pipe is atomic between readers)."""
    while True:
        b = os.read(queue_r, 1)
        if not b:
            return
        yield b[0]


def _result(d: dict) -> CheckResult:
    return CheckResult(**{**d, "parts": [Part(**p) for p in d["parts"]]})
