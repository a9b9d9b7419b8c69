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

Namespaces (`enter_namespaces`, `seal_init`), where the kernel lets an unprivileged process make them: each
learner process gets a user namespace of its own (its own uid, capabilities that mean nothing outside), a PID
namespace whose init it is (when it ends, the kernel kills every process it started, double-forked into a new
session or not; at most PROCESS_LIMIT of them), a network namespace with only a loopback interface (lesson 12's
server and its clients talk there; nothing reaches another machine or a port of this one), and a mount namespace
where its scratch directory is a size-capped tmpfs. (Being its namespace's init, the learner process ignores a
signal it sends itself that it has no handler for, os.kill(os.getpid(), SIGKILL) say; a real fault still ends
it.) Its files are capped at FILE_BYTES each, core dumps are off, and it ends up with no capability at all
(`no_new_privs`: an exec gains none either). `confine` does all of it, in order.

COURSE_SANDBOX=off turns all of this off, COURSE_SANDBOX=landlock the namespaces only (for debugging); `describe()`
says which mode grading runs in.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import signal
import socket
import struct
import sys

# <linux/landlock.h>; the syscall numbers are the same on x86-64 and arm64 (the generic table).
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECUREBITS = 1, 4, 38, 28
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = \
    0x20000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 2, 4, 1 << 14, 1 << 18
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS_LOCKED, SECBIT_NO_CAP_AMBIENT_RAISE, each with its lock
_SECUREBITS = 0b1 | 0b10 | 0b100 | 0b1000 | 0b100000 | 0b1000000 | 0b10000000
PROCESS_LIMIT = 512  # tasks (threads count) in a learner's PID namespace; the kernel allows 301 at the least
FILE_BYTES = 256 << 20  # the largest file a learner process may write (RLIMIT_FSIZE)
SCRATCH_BYTES = 512 << 20  # its scratch tmpfs (memory, while the check runs)

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
    ns = namespaces()
    if ns["available"]:
        limit = f", at most {PROCESS_LIMIT}" if ns["pid_max"] or os.geteuid() != 0 else ", no count limit"
        what += [f"processes (own PID namespace{limit})", "network (loopback only)"]
    else:
        what += [f"no namespaces here ({ns['why']}): processes and network not isolated"]
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


# The subdirectories of autograder/ a learner process may read: the harnesses that run there (and compiled copies).
# Not checks/ (expected values, mistake models, the checks' own reference code), not interview/ (its answers).
LEARNER_SIDE_DIRS = ("harnesses", "__pycache__")


def _grader_package_rules() -> dict[str, int]:
    """autograder/'s own modules (the learner side of the wire: learner_side, wire, runtime, this one) and
    LEARNER_SIDE_DIRS; its directory may be listed (the import system does), nothing else beneath it read."""
    pkg = os.path.dirname(os.path.abspath(__file__))
    rules = {pkg: READ_DIR}
    for entry in os.scandir(pkg):
        if entry.is_file():
            rules[entry.path] = READ_FILE | EXECUTE
        elif entry.is_dir() and entry.name in LEARNER_SIDE_DIRS:
            rules[entry.path] = READ
    return rules


# What a non-editable install (`pip install .`) would put in site-packages beside the libraries: never readable.
_NOT_FROM_SITE = ("solutions", "tests", "autograder")


def _site_rules(site: str) -> dict[str, int]:
    """Read a site-packages directory; where the course itself was installed there (solutions/ beside torch), each
    entry but the course's own instead (the grader's learner side comes from _grader_package_rules)."""
    if not any(os.path.isdir(os.path.join(site, name)) for name in _NOT_FROM_SITE):
        return {site: READ}
    rules = {site: READ_DIR}
    for entry in os.scandir(site):
        if entry.name not in _NOT_FROM_SITE:
            rules[entry.path] = READ if entry.is_dir() else READ_FILE | EXECUTE
    return rules


def learner_rules(target: str | None, scratch: str, capture: str, readable=()) -> dict[str, int]:
    """What a learner process may reach: read (and execute) the Python installation, the engine and the grader's
    package's learner side (not its checks: _grader_package_rules), the one file graded, `readable` (the
    grader's hand-off directory of the check); a few device and system files; read and write its `scratch`
    directory and its capture file. Nothing else: not solutions/, tests/, other lessons' files, $HOME."""
    import importlib.util
    engine = importlib.util.find_spec("reference_engine").submodule_search_locations[0]
    rules = {p: READ for p in (sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix)}
    for p in sys.path:
        if os.path.basename(p) in ("site-packages", "dist-packages"):
            rules.update(_site_rules(p))
    rules[engine] = READ  # its code, checkpoints/ and data/
    rules.update(_grader_package_rules())
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


# -- namespaces ----------------------------------------------------------------------------------------------------

def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter_namespaces() -> None:
    """Move this process into new user, mount, IPC (System V shared memory, queues, semaphores) and network
    namespaces, and have its next child start a new PID
    namespace (as its init). It keeps its own uid and gid there (mapped to themselves); the network namespace has
    a loopback interface, brought up. Needs a single-threaded process (a fresh fork) that is dumpable."""
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWPID | _CLONE_NEWNET), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _loopback_up()


def _loopback_up() -> None:
    """`ip link set lo up`: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP."""
    import fcntl
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))


def relay(child: int) -> None:
    """The process that made the namespaces, once it has forked their init `child`: hold nothing, wait for the
    child and end as it ended (its exit code, or the same signal), so the grader and the zygote see the
    learner's own ending. Never returns. Killing this process kills the child (seal_init's parent-death signal)."""
    os.closerange(0, 1 << 16)
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    while True:
        try:
            _, status = os.waitpid(child, 0)
        except InterruptedError:
            continue
        except OSError:
            os._exit(70)
        break
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)


def seal_init(scratch: str) -> bool:
    """In the init of the new PID namespace, before any learner code: die with the parent, mount a size-capped
    tmpfs over `scratch`, cap the namespace's processes (pid_max, Linux >= 6.14; RLIMIT_NPROC, which binds where
    the user is not root), file sizes and core dumps, then give up every capability for good. Returns whether
    the namespace's pid_max could be set."""
    import resource
    _check(_libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    _check(_libc().mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    _check(_libc().mount(b"tmpfs", scratch.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                         f"size={SCRATCH_BYTES},mode=0700".encode()), "mount tmpfs on the scratch directory")
    try:
        _write("/proc/sys/kernel/pid_max", str(PROCESS_LIMIT))
        capped = True
    except OSError:
        capped = False  # (older kernels: pid_max is the machine's)
    for limit, value in ((resource.RLIMIT_NPROC, PROCESS_LIMIT), (resource.RLIMIT_FSIZE, FILE_BYTES),
                         (resource.RLIMIT_CORE, 0)):
        soft, hard = resource.getrlimit(limit)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))
    _drop_capabilities()
    return capped


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> None:
    """No capability left (in the process's own user namespace, the only place it had any), none regained by
    exec as uid 0 there (securebits, locked), none from the bounding or ambient sets."""
    libc = _libc()
    _check(libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0), "prctl(PR_SET_SECUREBITS)")
    for cap in range(64):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP; EINVAL past the last capability
            break
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")  # _LINUX_CAPABILITY_VERSION_3


def namespaces() -> dict:
    """Whether learner processes can get their namespaces here: tried once in a throwaway child (and its child,
    the PID namespace's init, which tries to cap pid_max). {"available", "pid_max", "why"}."""
    if os.environ.get("COURSE_SANDBOX", "").lower() == "landlock":  # (to tell a namespace problem from others)
        return {"available": False, "pid_max": False, "why": "COURSE_SANDBOX=landlock"}
    return _probe_namespaces()


@functools.cache
def _probe_namespaces() -> dict:
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return {"available": False, "pid_max": False, "why": "not Linux"}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # (never returns)
        code = 0
        try:
            os.close(r)
            make_dumpable()
            try:
                enter_namespaces()
            except OSError as e:
                os.write(w, (e.strerror or str(e)).encode()[:200])
                os._exit(2)
            init = os.fork()
            if init == 0:
                try:
                    _write("/proc/sys/kernel/pid_max", str(PROCESS_LIMIT))
                    os._exit(0)
                except OSError:
                    os._exit(3)
            _, status = os.waitpid(init, 0)
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 4
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        why = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 4
    if code in (0, 3):
        return {"available": True, "pid_max": code == 0, "why": ""}
    return {"available": False, "pid_max": False, "why": f"unshare: {why}" if why else "the probe failed"}


# -- seccomp ---------------------------------------------------------------------------------------------------
# System calls no exercise needs, refused with EPERM: Landlock (ABI 7) has no rights for a file's metadata, and the
# learner is its files' owner (its uid is the grader's), so chmod (a setuid bit on a copy of a shell), chown,
# utime and extended attributes are refused here; the kernel keyrings (the grader's session keyring);
# inotify/fanotify (watching the grader's directories); reading or writing another process's memory, ptrace,
# userfaultfd, perf and bpf. (Not memfd_create: GPU drivers use it; its memory is one that RLIMIT_AS misses.)
_DENIED = {
    0xC000003E: {  # AUDIT_ARCH_X86_64
        "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93, "lchown": 94,
        "fchownat": 260, "utime": 132, "utimes": 235, "futimesat": 261, "utimensat": 280, "setxattr": 188,
        "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
        "setxattrat": 463, "removexattrat": 466, "add_key": 248, "request_key": 249, "keyctl": 250,
        "inotify_init": 253, "inotify_init1": 294,
        "inotify_add_watch": 254, "fanotify_init": 300, "process_vm_readv": 310, "process_vm_writev": 311,
        "ptrace": 101, "userfaultfd": 323, "perf_event_open": 298, "bpf": 321},
    0xC00000B7: {  # AUDIT_ARCH_AARCH64 (the generic table)
        "fchmod": 52, "fchmodat": 53, "fchmodat2": 452, "fchownat": 54, "fchown": 55, "utimensat": 88,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15, "fremovexattr": 16,
        "setxattrat": 463, "removexattrat": 466, "add_key": 217, "request_key": 218, "keyctl": 219,
        "inotify_init1": 26, "inotify_add_watch": 27,
        "fanotify_init": 262, "process_vm_readv": 270, "process_vm_writev": 271, "ptrace": 117, "userfaultfd": 282,
        "perf_event_open": 241, "bpf": 280},
}
_X32_BIT = 0x40000000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _audit_arch() -> int | None:
    import platform
    return {"x86_64": 0xC000003E, "aarch64": 0xC00000B7, "arm64": 0xC00000B7}.get(platform.machine())


def deny_syscalls() -> bool:
    """Install the seccomp filter (needs no_new_privs, set here too). Returns False on an architecture it has no
    table for (nothing installed)."""
    arch = _audit_arch()
    if arch is None:
        return False
    numbers = sorted(set(_DENIED[arch].values()))
    LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
    ALLOW, ERRNO_EPERM, KILL = 0x7FFF0000, 0x00050000 | 1, 0x80000000  # (KILL_PROCESS)
    prog = [(LD_W_ABS, 0, 0, 4),            # seccomp_data.arch
            (JEQ_K, 1, 0, arch),
            (RET_K, 0, 0, KILL),            # another architecture's calling convention (int 0x80): refused
            (LD_W_ABS, 0, 0, 0)]            # seccomp_data.nr
    if arch == 0xC000003E:
        prog.append((JGE_K, len(numbers) + 1, 0, _X32_BIT))  # the x32 numbers of the same calls: refused
    for i, nr in enumerate(numbers):
        prog.append((JEQ_K, len(numbers) - i, 0, nr))
    prog += [(RET_K, 0, 0, ALLOW), (RET_K, 0, 0, ERRNO_EPERM)]
    filters = (_SockFilter * len(prog))(*[_SockFilter(*f) for f in prog])
    fprog = _SockFprog(len(prog), filters)
    _check(_libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(_libc().prctl(22, 2, ctypes.byref(fprog), 0, 0), "prctl(PR_SET_SECCOMP)")  # SECCOMP_MODE_FILTER
    return True


def confine(scratch: str, rules: dict[str, int], namespaces: bool) -> None:
    """Everything, in order: namespaces (this process then forks their init, which returns from here and goes on;
    this one only relays how the init ended, and never returns), Landlock with `rules`, the seccomp filter."""
    if namespaces:
        enter_namespaces()
        init = os.fork()
        if init:
            relay(init)
        seal_init(scratch)
    restrict(rules)
    deny_syscalls()
