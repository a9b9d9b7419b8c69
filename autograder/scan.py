"""A static look at a learner's module before anything of it runs.

The learner's process cannot import `solutions/` and holds no expected value, but
files on disk stay readable and Python can reach far. No exercise needs any of
the following, so a module that uses them is rejected (0 points, status
"rejected") with a message naming each line:

- importing `solutions`, `autograder` or `tests` (the answers and the grader), or a
  lesson's module by its bare name (`import l02_kv_cache`);
- file and process access: `open`, `exec`/`eval`/`compile`/`__import__` (called or
  only named: `_r = open`), `importlib`, `runpy`, `pkgutil`, `linecache`, `codecs`,
  `inspect`, `gc`, `ctypes`, `subprocess`, `multiprocessing`, `os.open`/`os.read`/
  `os.fork`/`os.system`/`os.exec*`/`os.spawn*`/`os.popen` (under any alias of os, and
  `from os import *`), `io.open`, `pty`, `socket`, `signal`;
- introspection that reaches the grader: frames (`sys._getframe`, `f_back`,
  `f_globals`, `tb_frame`, ...), `__globals__`, `__subclasses__`, `__code__`,
  `__builtins__`, `__self__` (a builtin's module), `sys.modules`, `sys.path`, a module
  reached through another (`torch.os`, `tempfile._os`), `getattr` with a computed name,
  `globals()`/`vars()`/`setattr` on modules, `builtins`.

It is a guard against the easy ways, not a proof: the operating system's sandbox
(autograder/oslimits.py) is what holds where the kernel has it.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import re

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
    "runpy": "running other files is not needed by any exercise",
    "pkgutil": "finding and loading modules by name is not needed by any exercise",
    "linecache": "reading other files' lines is not needed by any exercise",
    "codecs": "opening files is not needed by any exercise",
    "zipimport": "loading code from archives is not needed by any exercise",
    "posix": "system calls are not needed by any exercise",
    "_posixsubprocess": "starting processes is not needed by any exercise",
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
    "__self__", "__func__", "__wrapped__", "open", "read", "write", "pipe", "openpty", "open_code", "FileIO",
    "os", "_os", "sys", "_sys", "builtins", "_bootstrap", "_bootstrap_external",
    "create_subprocess_exec", "create_subprocess_shell", "subprocess_exec", "subprocess_shell",  # (asyncio)
    "__getattribute__", "attrgetter", "methodcaller", "walk_stack", "walk_tb", "extract_stack", "format_stack",
    "print_stack", "StackSummary", "currentframe",
} | set(BANNED_MODULES)  # a banned module reached as an attribute of another (torch.ctypes, torch.importlib)
# Attribute names that are only a problem on these modules (a tensor's .T or .view is fine).
_MODULE_ONLY = {"modules", "fork", "system", "popen", "kill", "environ", "remove", "listdir", "walk", "rename",
                "chdir", "putenv", "unlink", "rmdir", "scandir", "setsid", "dup2", "fdopen", "_exit", "open", "read",
                "write", "pipe", "openpty", "open_code", "FileIO"}
_MODULE_NAMES = {"os", "sys", "posix", "nt", "io", "_io"}
# Builtins that stay banned when only named, not called (`_r, _x = open, exec`); `input` is a common parameter name.
_BANNED_NAMES = set(BANNED_CALLS) - {"input"}
_LESSON_MODULE = re.compile(r"l\d\d_\w+$")  # a solution module imported under its bare name (solutions/ on sys.path)


@dataclasses.dataclass
class Finding:
    line: int
    what: str
    why: str

    def __str__(self):
        return f"line {self.line}: {self.what} ({self.why})"


@dataclasses.dataclass(frozen=True)
class EngineUse:
    """What of the engine (`reference_engine`) a lesson's exercise may use: what its stub imports. The engine
    implements several lessons' answers (a paged KV cache, speculative decoding, a prefix cache, ...); a
    learner's module may import the parts its lesson's stub imports, and no other."""
    modules: frozenset = frozenset()   # `import reference_engine.x` (and `import reference_engine`)
    names: frozenset = frozenset()     # ("reference_engine.x", "name") for `from reference_engine.x import name`
    attrs: frozenset = frozenset()     # ("reference_engine.x", "attr") read on a module bound by `import`

    def to_dict(self) -> dict:
        return {"modules": sorted(self.modules), "names": sorted(map(list, self.names)),
                "attrs": sorted(map(list, self.attrs))}

    @classmethod
    def from_dict(cls, d: dict) -> "EngineUse":
        return cls(frozenset(d.get("modules", ())), frozenset(map(tuple, d.get("names", ()))),
                   frozenset(map(tuple, d.get("attrs", ()))))

    def allows_import(self, module: str, name: str | None = None) -> bool:
        """`import module` (name None) or `from module import name`: what the stub imports, or anything of a
        module the stub imports whole (`from reference_engine import gpu_model` lets `gpu_model.X` in)."""
        whole = self.modules | {f"{m}.{n}" for m, n in self.names}
        if name is None:
            return module in whole
        return (module, name) in self.names or module in whole


ENGINE = "reference_engine"


def _engine_bindings(tree: ast.AST) -> tuple[dict[str, str], list[tuple[int, str, str | None]]]:
    """({local name: engine module an `import` statement bound it to}, [(line, module, name or None)] of every
    engine import). (What `from ... import` binds is the stub's to use as it likes: its attributes are free.)"""
    bound, imports = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ENGINE or alias.name.startswith(ENGINE + "."):
                    imports.append((node.lineno, alias.name, None))
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and \
                (node.module == ENGINE or node.module.startswith(ENGINE + ".")):
            for alias in node.names:
                imports.append((node.lineno, node.module, alias.name))
    return bound, imports


def _engine_attrs(tree: ast.AST, bound: dict[str, str]):
    """(line, module, attr) for every `name.attr` read where `name` is bound to an engine import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            yield node.lineno, bound[node.value.id], node.attr


def engine_use(stub_source: str) -> EngineUse:
    """What a lesson's stub uses of the engine (see EngineUse)."""
    try:
        tree = ast.parse(stub_source)
    except SyntaxError:
        return EngineUse()
    bound, imports = _engine_bindings(tree)
    return EngineUse(frozenset(m for _, m, n in imports if n is None),
                     frozenset((m, n) for _, m, n in imports if n is not None),
                     frozenset((m, a) for _, m, a in _engine_attrs(tree, bound)))


def _engine_findings(tree: ast.AST, allowed: EngineUse) -> list[Finding]:
    found = []
    bound, imports = _engine_bindings(tree)
    why = "this lesson's exercise does not use that part of the engine (it may implement the lesson's answer)"
    for line, module, name in imports:
        if not allowed.allows_import(module, name):
            found.append(Finding(line, f"import {module}" if name is None else f"from {module} import {name}", why))
    for line, module, attr in _engine_attrs(tree, bound):
        if (module, attr) not in allowed.attrs:
            found.append(Finding(line, f"{module}.{attr}", why))
    return found


def scan_source(source: str, filename: str = "<your module>", engine: EngineUse | None = None) -> list[Finding]:
    """Every banned construct in `source`, in line order (a syntax error is left to the import). With `engine`
    (the lesson's EngineUse), importing any other part of the engine is banned too."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return []
    found: list[Finding] = _engine_findings(tree, engine) if engine is not None else []
    modules = _module_aliases(tree)  # names bound to os, sys, io (`import os as o` too)
    for node in ast.walk(tree):
        visit = _VISIT.get(type(node))
        if visit is not None:
            visit(found, node, tree, modules)
    found = list({(f.line, f.what): f for f in found}.values())
    found.sort(key=lambda f: f.line)
    return found


def _visit_import(found: list[Finding], node: ast.Import, tree, modules) -> None:
    for alias in node.names:
        _module(found, node.lineno, alias.name)


def _visit_import_from(found: list[Finding], node: ast.ImportFrom, tree, modules) -> None:
    if node.level:
        found.append(Finding(node.lineno, "a relative import", "your module stands alone"))
        return
    if not node.module:
        return
    _module(found, node.lineno, node.module)
    for alias in node.names:
        if (node.module in _MODULE_NAMES and (alias.name in BANNED_ATTRS or alias.name == "*")) \
                or alias.name in BANNED_MODULES or alias.name in _MODULE_NAMES \
                or (alias.name in BANNED_ATTRS and alias.name not in _MODULE_ONLY):
            found.append(Finding(node.lineno, f"from {node.module} import {alias.name}", "reaches outside your code"))


def _visit_call(found: list[Finding], node: ast.Call, tree, modules) -> None:
    if isinstance(node.func, ast.Name) and node.func.id in BANNED_CALLS:
        found.append(Finding(node.lineno, f"{node.func.id}()", BANNED_CALLS[node.func.id]))
    elif isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
        _getattr(found, node)


def _visit_name(found: list[Finding], node: ast.Name, tree, modules) -> None:
    if node.id == "getattr" and not _is_called(node, tree):
        found.append(Finding(node.lineno, "getattr (named, not called)", "attributes named at run time can "
                                                                         "reach anything"))
    elif node.id in ("__builtins__", "__loader__", "__spec__"):
        found.append(Finding(node.lineno, node.id, "reaches outside your code"))
    elif node.id in _BANNED_NAMES and isinstance(node.ctx, ast.Load) and not _is_called(node, tree):
        found.append(Finding(node.lineno, f"{node.id} (named, not called)", BANNED_CALLS[node.id]))


def _visit_keyword(found: list[Finding], node: ast.keyword, tree, modules) -> None:
    if node.arg == "capture_locals":
        found.append(Finding(getattr(node, "lineno", 0) or 0, "capture_locals=", "reads other frames' variables"))


def _visit_attribute(found: list[Finding], node: ast.Attribute, tree, modules) -> None:
    if node.attr == "path" and isinstance(node.value, ast.Name) and modules.get(node.value.id) == "sys":
        found.append(Finding(node.lineno, f"{node.value.id}.path", "changing where imports come from"))
    elif node.attr in BANNED_ATTRS:
        if node.attr in _MODULE_ONLY and not (isinstance(node.value, ast.Name) and node.value.id in modules):
            return
        found.append(Finding(node.lineno, f".{node.attr}", "reaches into the interpreter or the grader"))


def _visit_constant(found: list[Finding], node: ast.Constant, tree, modules) -> None:
    if isinstance(node.value, str) and _dunder_name(node.value):
        found.append(Finding(node.lineno, repr(node.value)[:40], "names an interpreter internal"))


# scan_source's rule for each kind of node
_VISIT = {ast.Import: _visit_import, ast.ImportFrom: _visit_import_from, ast.Call: _visit_call, ast.Name: _visit_name,
          ast.keyword: _visit_keyword, ast.Attribute: _visit_attribute, ast.Constant: _visit_constant}


def _module_aliases(tree: ast.AST) -> dict[str, str]:
    """{name: module} for every name the module binds to os, sys, posix, nt or io, under any alias."""
    names = {m: m for m in _MODULE_NAMES}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in _MODULE_NAMES:
                    names[alias.asname or alias.name] = alias.name
    return names


def _is_called(name: ast.Name, tree: ast.AST) -> bool:
    """Whether `name` is the function of a call (reported as a call, once)."""
    return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(tree))


def _getattr(found: list[Finding], node: ast.Call) -> None:
    """getattr(x, name): a name that is not a literal could be anything; a literal banned name is banned."""
    if len(node.args) < 2:
        return
    name = node.args[1]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        found.append(Finding(node.lineno, f"{node.func.id}() with a computed name",
                             "attributes named at run time can reach anything"))
    elif name.value in BANNED_ATTRS or name.value in BANNED_CALLS or name.value.startswith("__"):
        found.append(Finding(node.lineno, f"{node.func.id}(..., {name.value!r})", "reaches outside your code"))


def _dunder_name(s: str) -> bool:
    return any(name in s for name in ("__globals__", "__subclasses__", "__builtins__", "__code__", "__import__",
                                      "_getframe", "f_back", "f_globals", "__self__"))


def _module(found: list[Finding], line: int, name: str):
    top = name.split(".")[0]
    inner = next((part for part in name.split(".")[1:] if part in BANNED_MODULES), None)
    if top in BANNED_MODULES:
        found.append(Finding(line, f"import {name}", BANNED_MODULES[top]))
    elif inner is not None:  # torch.multiprocessing, torch.utils.cpp_extension's subprocess
        found.append(Finding(line, f"import {name}", BANNED_MODULES[inner]))
    elif _LESSON_MODULE.match(top):
        found.append(Finding(line, f"import {name}", "a lesson's module by its bare name: the reference solutions "
                                                      "are not yours to import"))


def scan_file(path: str, engine: EngineUse | None = None) -> list[Finding]:
    """The file as Python reads it: a `# coding:` line other than UTF-8 is itself refused (a UTF-7 file reads
    as one program to Python and as another, comments hiding code, to a scan that assumes UTF-8)."""
    import io
    import tokenize
    with open(path, "rb") as f:
        raw = f.read()
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError:
        return [Finding(1, "an encoding declaration Python does not know", "write your module in UTF-8")]
    if encoding not in ("utf-8", "utf-8-sig"):
        return [Finding(1, f"# coding: {encoding}", "write your module in UTF-8, with no other encoding declared")]
    return scan_source(raw.decode(encoding, errors="replace"), path, engine)


def report(findings: list[Finding], label: str) -> str:
    lines = [f"{label} was not graded: it uses what no exercise needs and what could reach the answers or "
             "the grader:"]
    lines += [f"  {f}" for f in findings[:12]]
    if len(findings) > 12:
        lines.append(f"  ... and {len(findings) - 12} more")
    lines.append("Remove these and check again.")
    return "\n".join(lines)


@functools.cache
def lesson_engine_use(stem: str) -> EngineUse:
    """What of the engine lesson `stem`'s exercise may use: what its stub imports. The stub is generated from
    solutions/ where they exist (an instructor's copy, whatever its exercises/ hold: an instructor's own answers,
    say); in a student's copy, what the release recorded of that stub (the exercise file there is the
    student's own, and may import more)."""
    from .lessons import ROOT, find
    sol = ROOT / "solutions" / f"{stem}.py"
    if sol.exists():
        from .sync import exercise_source
        return engine_use(exercise_source(sol, find(stem).number))
    from .reference import stored_engine_use
    stored = stored_engine_use(stem)
    if stored is not None:
        return EngineUse.from_dict(stored)
    stub = ROOT / "exercises" / f"{stem}.py"
    return engine_use(stub.read_text()) if stub.exists() else EngineUse()
