"""Integrity flags (instructor only): answer cells that reach for dynamic code no exercise needs.

No exercise of the course needs ``exec``, ``eval``, ``compile``, frames (``sys._getframe``,
``inspect.currentframe``/``stack``), the garbage collector, ``ctypes``, ``sys.modules``, ``getattr`` or
``setattr`` with a name computed at run time, a function's ``__code__``/``__globals__``, builtins
rewired, or IPython's ``set_custom_exc``. These are the tools of a student who attacks the grader from
inside the kernel: importing the answers by a computed name, patching the checks through text that
the static rules (:mod:`course_utils.rules`) cannot read, reading expected values out of the checker's
frames.

A flag is a lead for the instructor, not a verdict and not a score change: an answer that uses
``getattr`` innocently keeps its points. Flags go to the instructor's report ("Integrity (instructor
only)") and to the ``integrity`` column of ``grades.csv``, never to ``results.json`` or the students'
feedback. The grader reads the answer cells' source itself, outside the kernel.

Since issue 35 most of this machinery also costs the exercise its points, by the policy that every
answer cell is held to (:func:`course_utils.rules.policy_violations`, announced in notebook 01 and the
README; a "rule broken" in the report, with its reason). The flags here keep listing all they find,
that included, and more than the policy scores (``getattr`` by a computed name on any object,
``inspect``, ``pickle``, ``marshal``, ``builtins``): a lead is cheap, a lost point is not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

#: Calls flagged whatever their arguments: name as written -> what it is.
CALLS = {
    "exec": "exec runs code built at run time",
    "eval": "eval runs code built at run time",
    "compile": "compile builds code at run time",
    "__import__": "__import__ imports a module by a computed name",
    "importlib.import_module": "importlib.import_module imports a module by a computed name",
    "import_module": "import_module imports a module by a computed name",
    "sys._getframe": "sys._getframe reads the callers' frames",
    "inspect.currentframe": "inspect.currentframe reads the callers' frames",
    "inspect.stack": "inspect.stack reads the callers' frames",
    "inspect.getouterframes": "inspect.getouterframes reads the callers' frames",
    "inspect.trace": "inspect.trace reads frames",
    "set_custom_exc": "set_custom_exc rewires how IPython reports errors",
    "vars": "vars reads a namespace as a dict",
    "globals": "globals reads or rewires the notebook's namespace",
}
#: The same, however they are reached (``from sys import _getframe``, ``get_ipython().set_custom_exc``).
BY_LAST_NAME = {name.rsplit(".", 1)[-1]: what for name, what in CALLS.items()
                if name.rsplit(".", 1)[-1] in ("_getframe", "currentframe", "set_custom_exc", "import_module")}
#: Calls flagged only when the attribute name is not a literal string.
COMPUTED_NAME_CALLS = {"getattr", "setattr", "delattr", "hasattr"}
#: Modules whose import or use is flagged.
MODULES = {
    "gc": "gc reaches every object in memory",
    "ctypes": "ctypes reads and writes memory directly",
    "inspect": "inspect reads frames and source",
    "importlib": "importlib imports modules by computed names",
    "builtins": "builtins rewires Python's own functions",
    "marshal": "marshal loads code objects",
    "pickle": "pickle runs code on load",
}
#: Attributes flagged wherever they are read or written.
ATTRIBUTES = {
    "__code__": "__code__ swaps a function's code",
    "__globals__": "__globals__ reaches another module's namespace",
    "__builtins__": "__builtins__ rewires Python's own functions",
    "__subclasses__": "__subclasses__ walks every class in memory",
    "f_back": "f_back walks up the call stack",
    "f_locals": "f_locals reads another function's variables",
    "f_globals": "f_globals reads another module's namespace",
}


@dataclass(frozen=True, order=True)
class Flag:
    """One use of dynamic code in one answer cell."""

    notebook: str
    exercise: str
    student_id: str
    line: int
    what: str

    def short(self) -> str:
        return f"{self.exercise} line {self.line}: {self.what}"


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a name or attribute chain, ``""`` for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def scan(source: str) -> list[tuple[int, str]]:
    """``[(line, what), ...]``: every use of dynamic code in one answer cell's ``source``.

    Source that does not parse is not flagged here (the grade already says so).
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: set[tuple[int, str]] = set()
    # ``for name in ["W_query", "W_key"]: getattr(module, name)``: names known without running anything.
    literal_names = {loop.target.id for loop in ast.walk(tree) if isinstance(loop, ast.For)
                     and isinstance(loop.target, ast.Name) and isinstance(loop.iter, (ast.List, ast.Tuple))
                     and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in loop.iter.elts)}
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            short = node.func.attr if isinstance(node.func, ast.Attribute) else name
            if name in CALLS:
                found.add((line, CALLS[name]))
            elif short in BY_LAST_NAME:  # from sys import _getframe; ip.set_custom_exc(...)
                found.add((line, BY_LAST_NAME[short]))
            attribute = node.args[1] if len(node.args) >= 2 else None
            if short in COMPUTED_NAME_CALLS and name == short and attribute is not None and not (
                    (isinstance(attribute, ast.Constant) and isinstance(attribute.value, str))
                    or (isinstance(attribute, ast.Name) and attribute.id in literal_names)):
                found.add((line, f"{short} with a name computed at run time"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                root = module.split(".")[0]
                if root in MODULES:
                    found.add((line, f"imports {module}: {MODULES[root]}"))
                if root == "sys" and isinstance(node, ast.ImportFrom) and any(
                        a.name in ("modules", "_getframe") for a in node.names):
                    found.add((line, "sys.modules or sys._getframe imported by name"))
        elif isinstance(node, ast.Attribute):
            name = _dotted(node)
            if node.attr == "modules" and name.endswith("sys.modules"):
                found.add((line, "sys.modules: reaches or replaces any loaded module"))
            elif ATTRIBUTES.get(node.attr):
                found.add((line, ATTRIBUTES[node.attr]))
        elif isinstance(node, ast.Name) and node.id in ("__builtins__",):
            found.add((line, ATTRIBUTES["__builtins__"]))
    return sorted(found)


def flags(results) -> list[Flag]:
    """Every flag in the answer cells of ``results`` (rows of the grader, with ``answers``)."""
    out = []
    for r in results:
        for exercise, source in (getattr(r, "answers", None) or {}).items():
            for line, what in scan(source):
                out.append(Flag(r.notebook, exercise, r.student_id, line, what))
    return sorted(out)


def column(found: list[Flag], student_id: str, notebook: str) -> str:
    """The ``integrity`` cell of one ``grades.csv`` row: its flags, ``; ``-separated (empty when none)."""
    return "; ".join(f.short() for f in found if f.student_id == student_id and f.notebook == notebook)


def report_section(found: list[Flag], student_id: str) -> list[str]:
    """The "Integrity (instructor only)" section of one student's report (no lines when no flag)."""
    mine = [f for f in found if f.student_id == student_id]
    if not mine:
        return []
    lines = ["## Integrity (instructor only)", "",
             "Answer cells that use dynamic code no exercise needs (exec, frames, gc, sys.modules, computed "
             "getattr...). A lead to read the answer, not a verdict: no score depends on it.", "",
             "| notebook | exercise | line | what |", "|---|---|---|---|"]
    lines += [f"| {f.notebook} | {f.exercise} | {f.line} | {f.what} |" for f in mine]
    return lines + [""]
