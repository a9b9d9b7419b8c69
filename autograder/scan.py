"""A static look at a learner's module before anything of it runs.

The learner's process cannot import `solutions/` and holds no expected value, but
files on disk stay readable and Python can reach far. No exercise needs any of
the following, so a module that uses them is rejected (0 points, status
"rejected") with a message naming each line:

- importing `solutions`, `autograder` or `tests` (the answers and the grader);
- file and process access: `open`, `exec`/`eval`/`compile`/`__import__`,
  `importlib`, `inspect`, `gc`, `ctypes`, `subprocess`, `multiprocessing`,
  `os.fork`/`os.system`/`os.exec*`/`os.spawn*`/`os.popen`, `pty`, `socket`, `signal`;
- introspection that reaches the grader: frames (`sys._getframe`, `f_back`,
  `f_globals`, `tb_frame`, ...), `__globals__`, `__subclasses__`, `__code__`,
  `__builtins__`, `sys.modules`, `globals()`/`vars()`/`setattr` on modules, `builtins`.

It is a guard against the easy ways, not a proof: high-stakes grading should also
run in a container (see the README).
"""
from __future__ import annotations

import ast
import dataclasses

BANNED_MODULES = {
    "solutions": "the reference solutions are not yours to import",
    "autograder": "your code must not reach into the grader",
    "tests": "your code must not reach into the course's tests",
    "importlib": "dynamic imports are not needed by any exercise",
    "inspect": "introspection of the caller is not needed by any exercise",
    "gc": "the garbage collector's object lists reach the grader's objects",
    "ctypes": "raw memory access is not needed by any exercise",
    "subprocess": "starting processes is not needed by any exercise",
    "multiprocessing": "starting processes is not needed by any exercise",
    "pty": "starting processes is not needed by any exercise",
    "socket": "network access is not needed by any exercise",
    "signal": "signal handlers are not needed by any exercise",
    "builtins": "patching builtins is not needed by any exercise",
    "pickle": "pickle runs code when it loads",
    "marshal": "code objects are not needed by any exercise",
    "shutil": "file operations are not needed by any exercise",
    "threading": "threads are not needed by any exercise",
    "_thread": "threads are not needed by any exercise",
}
BANNED_CALLS = {
    "open": "reading or writing files is not needed by any exercise",
    "exec": "running generated code is not needed by any exercise",
    "eval": "running generated code is not needed by any exercise",
    "compile": "running generated code is not needed by any exercise",
    "__import__": "dynamic imports are not needed by any exercise",
    "globals": "your module's namespace is not needed by any exercise",
    "vars": "namespaces are not needed by any exercise",
    "locals": "namespaces are not needed by any exercise",
    "setattr": "setting attributes by name can patch other modules",
    "delattr": "deleting attributes by name can patch other modules",
    "breakpoint": "a debugger would hang the grader",
    "input": "the grader has no keyboard",
}
BANNED_ATTRS = {
    "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next", "gi_frame", "cr_frame",
    "ag_frame", "_getframe", "__globals__", "__subclasses__", "__code__", "__builtins__", "__closure__",
    "__dict__", "__reduce__", "__reduce_ex__", "__loader__", "__spec__", "__mro__", "__bases__", "__base__",
    "modules", "meta_path", "path_hooks", "settrace", "setprofile", "addaudithook", "read_text", "read_bytes",
    "write_text", "write_bytes", "fork", "forkpty", "system", "popen", "execv", "execve", "execl", "execvp",
    "execlp", "spawnv", "spawnl", "posix_spawn", "kill", "killpg", "setsid", "_exit", "fdopen", "dup2",
    "environ", "putenv", "chdir", "remove", "unlink", "rmdir", "rename", "listdir", "scandir", "walk",
}
# Attribute names that are only a problem on these modules (a tensor's .T or .view is fine).
_MODULE_ONLY = {"modules", "fork", "system", "popen", "kill", "environ", "remove", "listdir", "walk", "rename",
                "chdir", "putenv", "unlink", "rmdir", "scandir", "setsid", "dup2", "fdopen", "_exit"}
_MODULE_NAMES = {"os", "sys", "posix", "nt"}


@dataclasses.dataclass
class Finding:
    line: int
    what: str
    why: str

    def __str__(self):
        return f"line {self.line}: {self.what} ({self.why})"


def scan_source(source: str, filename: str = "<your module>") -> list[Finding]:
    """Every banned construct in `source`, in line order (a syntax error is left to the import)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return []
    found: list[Finding] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _module(found, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(Finding(node.lineno, "a relative import", "your module stands alone"))
            elif node.module:
                _module(found, node.lineno, node.module)
                if node.module in _MODULE_NAMES:
                    for alias in node.names:
                        if alias.name in BANNED_ATTRS:
                            found.append(Finding(node.lineno, f"from {node.module} import {alias.name}",
                                                 "reaches outside your code"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BANNED_CALLS:
            found.append(Finding(node.lineno, f"{node.func.id}()", BANNED_CALLS[node.func.id]))
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__"):
            found.append(Finding(node.lineno, node.id, "reaches outside your code"))
        elif isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRS:
            if node.attr in _MODULE_ONLY and not (isinstance(node.value, ast.Name) and node.value.id in _MODULE_NAMES):
                continue
            found.append(Finding(node.lineno, f".{node.attr}", "reaches into the interpreter or the grader"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _dunder_name(node.value):
            found.append(Finding(node.lineno, repr(node.value)[:40], "names an interpreter internal"))
    found.sort(key=lambda f: f.line)
    return found


def _dunder_name(s: str) -> bool:
    return any(name in s for name in ("__globals__", "__subclasses__", "__builtins__", "__code__", "__import__",
                                      "_getframe", "f_back", "f_globals"))


def _module(found: list[Finding], line: int, name: str):
    top = name.split(".")[0]
    if top in BANNED_MODULES:
        found.append(Finding(line, f"import {name}", BANNED_MODULES[top]))
    elif name in ("os.path",):
        return


def scan_file(path: str) -> list[Finding]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return scan_source(f.read(), path)


def report(findings: list[Finding], label: str) -> str:
    lines = [f"{label} was not graded: it uses what no exercise needs and what could reach the answers or "
             "the grader:"]
    lines += [f"  {f}" for f in findings[:12]]
    if len(findings) > 12:
        lines.append(f"  ... and {len(findings) - 12} more")
    lines.append("Remove these and check again.")
    return "\n".join(lines)
