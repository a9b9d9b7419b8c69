"""Operating-system limits on a learner process: Landlock (Linux >= 5.13), through ctypes syscalls.

The source scan (autograder/scan.py) and the import blocker (learner_side._SolutionsBlocker) stop the honest
ways of reaching the reference solutions; a determined learner has others (os.open, runpy, linecache, its own
sys.path entry, /proc/<grader pid>/fd/N, signals to the grader). Landlock closes them in the kernel: once a
process calls `restrict`, it and every process it starts can open only the paths listed in the rules, and
(kernel ABI >= 6) cannot signal, nor connect to an abstract Unix socket of, a process outside its domain.
Landlock also forbids ptrace of a process outside the domain. What the process opened before `restrict`
(its socket to the grader, its capture file, the GPU driver's files) stays usable.

`make_undumpable` is for the grader and the zygote: no other process of the same user may ptrace them or
read their /proc/<pid>/fd, mem or environ (root keeps that power: Landlock is what stops a learner there).

COURSE_SANDBOX=off turns Landlock off (for debugging); `describe()` says which mode grading runs in.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys

# <linux/landlock.h>; the syscall numbers are the same on x86-64 and arm64 (the generic table).
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 4, 38

# Filesystem access rights, in the order the kernel added them: bit i exists from the ABI in _FS_SINCE[i].
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_ALL_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM: every right of ABI 1
_FS_BY_ABI = {1: _FS_ALL_ABI1, 2: _FS_ALL_ABI1 | REFER, 3: _FS_ALL_ABI1 | REFER | TRUNCATE,
              4: _FS_ALL_ABI1 | REFER | TRUNCATE}
_FS_LATEST = _FS_ALL_ABI1 | REFER | TRUNCATE | IOCTL_DEV  # ABI 5 and later (6 and 7 add no file right)
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI >= 6

READ = EXECUTE | READ_FILE | READ_DIR  # read, list, execute and mmap(PROT_EXEC)
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the only rights a rule on a file may hold


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the uapi header: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class SandboxError(OSError):
    pass


@functools.cache
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _syscall(nr: int, *args) -> int:
    ret = _libc().syscall(ctypes.c_long(nr), *args)
    if ret < 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"syscall {nr}: {os.strerror(err)}")
    return ret


def enabled() -> bool:
    return os.environ.get("COURSE_SANDBOX", "").lower() not in ("off", "0", "no", "false")


@functools.cache
def abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (not Linux, too old, disabled at boot)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        return _syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0


def active() -> bool:
    """Learner processes started now will be put under Landlock."""
    return enabled() and abi() >= 1


def describe() -> str:
    """One line for a report's header: the isolation grading runs under."""
    if not active():
        return "isolation: source scan only, not for high-stakes grading"
    what = ["files"] + (["signals"] if abi() >= 6 else [])
    return f"isolation: Landlock (ABI {abi()}): {', '.join(what)}"


def make_undumpable() -> None:
    """No ptrace, no /proc/<pid>/{fd,mem,environ} of this process for other (unprivileged) processes."""
    try:
        _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def make_dumpable() -> None:
    """Undo make_undumpable in a forked child (a learner process: debuggable as any process of its user)."""
    try:
        _libc().prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def restrict(rules: dict[str, int]) -> int:
    """Put this process (and what it starts from now on) under Landlock: only `rules` ({path: rights}; a
    directory's rights cover everything beneath it) are reachable in the file system, and (ABI >= 6) no signal
    or abstract Unix socket reaches a process outside. TCP is left as it is: lesson 12's checks run a server on
    an ephemeral loopback port in the learner process (a later change may pass it a fixed port to allow).
    Paths that do not exist are skipped. Returns the ABI used; raises SandboxError where Landlock is unavailable."""
    version = abi()
    if version < 1:
        raise SandboxError(0, "Landlock is not available on this kernel")
    handled = _FS_BY_ABI.get(version, _FS_LATEST)  # as samples/landlock/sandboxer.c: only the rights it knows
    # (An older kernel accepts the whole struct as long as the fields it does not know are zero.)
    attr = _RulesetAttr(handled, 0, (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if version >= 6 else 0)
    ruleset = _syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    try:
        for path, rights in rules.items():
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not on this machine (no /lib64 here, no GPU there)
            try:
                if not os.path.isdir(path):
                    rights &= _FILE_RIGHTS
                beneath = _PathBeneathAttr(rights & handled, fd)
                _syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(beneath),
                         ctypes.c_uint32(0))
            finally:
                os.close(fd)
        if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # required to restrict without CAP_SYS_ADMIN
            raise SandboxError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        _syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return version


def learner_rules(target: str | None, scratch: str, capture: str, readable=()) -> dict[str, int]:
    """What a learner process may reach: read (and execute) the Python installation, the engine and the grader's
    package (harness functions run in the learner's process: see below), the one file graded, `readable` (the
    grader's hand-off directory of the check); a few device and system files; read and write its `scratch`
    directory and its capture file. Nothing else: not solutions/, tests/, other lessons' files, $HOME."""
    import importlib.util
    engine = importlib.util.find_spec("reference_engine").submodule_search_locations[0]
    rules = {p: READ for p in (sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix)}
    rules.update({p: READ for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")})
    rules[engine] = READ  # its code, checkpoints/ and data/
    # The learner-side harness functions live in autograder/ today (engine_harness, server_harness, and the
    # check modules' own harnesses under autograder/checks/, which import each other): the learner process reads
    # that whole package, the checks' hidden logic included. Moving the harnesses out is a later change.
    rules[os.path.dirname(os.path.abspath(__file__))] = READ
    if target:
        rules[os.path.abspath(target)] = READ_FILE
    rules.update({os.path.abspath(p): READ for p in readable})
    for dev in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"):
        rules[dev] = READ_FILE | WRITE_FILE | IOCTL_DEV
    for path in ("/proc/self", "/proc/thread-self", "/proc/cpuinfo", "/proc/meminfo", "/sys/devices/system/cpu",
                 "/etc/localtime", "/etc/ld.so.cache",
                 "/usr/share/zoneinfo", "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/bin", "/bin",
                 "/usr/libexec", "/usr/include"):  # (a compiler, for Triton's launchers on a GPU machine)
        rules[path] = READ
    if os.path.exists("/dev/nvidiactl"):  # CUDA, first initialised in the learner process (never in the zygote)
        for dev in glob.glob("/dev/nvidia*"):
            rules[dev] = READ_FILE | WRITE_FILE | IOCTL_DEV
        rules.update({p: READ for p in ("/proc/driver/nvidia", "/sys/devices", "/sys/bus/pci", "/sys/module/nvidia")})
        rules["/dev/shm"] = READ | _FS_LATEST
    rules[scratch] = _FS_LATEST  # everything, beneath its private scratch directory
    rules[capture] = READ_FILE | WRITE_FILE | TRUNCATE
    return rules
