"""The reference cut down to a few of its definitions: the answers a grading kernel may hold.

``modules.check_alone`` checks an exercise that builds on others (02's ``context_vectors`` calls
``softmax_stable``; 08's ``GroupedQueryAttention`` calls ``repeat_kv``; 09's ``TinyGPT`` builds
``TransformerBlock``s; each checks module's ``HELPERS`` names them) first with
the reference's versions of those helpers swapped in, so that a wrong helper costs only the helper's
points. That first try needs the helpers' answers in the kernel, and nothing else of the reference:
this module writes a ``course_utils/reference.py`` that holds only the named definitions and those they
use (found in the reference's own syntax tree), for a sandboxed kernel to see in place of the student
edition's stub (``grader.sandbox.student_edition_binds``). A kernel that sees it can steal only those
helpers, so its hand-off is read only for the first try of the exercises that build on them, never for
the helpers' own tests (docs/design.md, "Threat model").
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable
from pathlib import Path

#: Top-level statements kept whatever the names: imports (libraries and ``course_utils.validation``,
#: which the student edition has) and ``try`` blocks that only import.
_IMPORTS = (ast.Import, ast.ImportFrom)


def reference_path() -> Path:
    """The instructor edition's ``course_utils/reference.py``."""
    import course_utils

    return Path(course_utils.__file__).resolve().parent / "reference.py"


def _defined(tree: ast.Module) -> dict[str, ast.stmt]:
    """Top-level function and class definitions by name."""
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _names_used(node: ast.AST) -> set[str]:
    """The names ``node`` reads (annotations left out: they are strings at run time, and a type hint
    that names another answer must not bring that answer along)."""
    found: set[str] = set()

    def visit(n: ast.AST) -> None:
        if isinstance(n, ast.arg):
            return  # a parameter's annotation only
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for part in (*n.decorator_list, *n.args.defaults, *n.args.kw_defaults):
                if part is not None:
                    visit(part)
            for statement in n.body:
                visit(statement)
            return
        if isinstance(n, ast.AnnAssign):
            for part in (n.target, n.value):
                if part is not None:
                    visit(part)
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            found.add(n.id)
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(node)
    return found


def needed(names: Iterable[str], source: str | None = None) -> list[str]:
    """``names`` and every top-level definition of the reference they use, in the file's order.

    Raises ``ValueError`` naming a name the reference does not define."""
    tree = ast.parse(source if source is not None else reference_path().read_text(encoding="utf-8"))
    defined = _defined(tree)
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in defined]
    if unknown:
        raise ValueError(f"the reference defines no {', '.join(unknown)}")
    keep: set[str] = set()
    todo = list(wanted)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        todo.extend(n for n in _names_used(defined[name]) if n in defined and n not in keep)
    return [n for n in defined if n in keep]


def _only_imports(node: ast.stmt) -> bool:
    if isinstance(node, _IMPORTS):
        return True
    if isinstance(node, ast.Try):
        body = [*node.body, *(s for h in node.handlers for s in h.body), *node.orelse, *node.finalbody]
        return all(isinstance(s, _IMPORTS) or (isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant))
                   for s in body)
    return False


def subset_source(names: Iterable[str], source: str | None = None) -> str:
    """The text of a ``reference.py`` that holds only ``names`` and the definitions they use (each copied
    as written, comments included), after the reference's imports."""
    text = source if source is not None else reference_path().read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    keep = needed(names, text)
    defined = _defined(tree)
    header = (f'"""The course\'s reference answers, cut down to {", ".join(keep)}: written by the grader\n'
              f'(grader/reference_subset.py) for a grading kernel that checks an exercise with these helpers\n'
              f'swapped in (modules.check_alone). Nothing else of the reference is here."""\n\n')
    parts = [header]
    for node in tree.body:
        if _only_imports(node):
            parts.append("".join(lines[node.lineno - 1:node.end_lineno]))
    for name in keep:
        node = defined[name]
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        parts.append("\n\n" + "".join(lines[first - 1:node.end_lineno]))
    parts.append(f"\n\n__all__ = {keep!r}\n")
    return "".join(parts)


def write_subset(names: Iterable[str], folder: Path) -> Path:
    """``folder/reference.py`` with :func:`subset_source` of ``names``, read-only; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "reference.py"
    path.write_text(subset_source(names), encoding="utf-8")
    os.chmod(path, 0o444)
    return path


def alone_helpers(notebook: str | None) -> dict[str, list[str]]:
    """exercise -> the exercises of the same notebook it is checked with (``modules.check_alone``'s
    helpers, swapped in for its first try), for the exercises of ``notebook`` that have any: the
    ``HELPERS`` of its checks' module (``course_utils.checks.nb02`` ...)."""
    import importlib

    number = (notebook or "")[:2]
    if not (len(number) == 2 and number.isdigit()):
        return {}
    try:
        module = importlib.import_module(f"course_utils.checks.nb{number}")
    except ModuleNotFoundError:
        return {}
    return {exercise: list(names) for exercise, names in getattr(module, "HELPERS", {}).items()}


def first_try_groups(notebook: str | None, source: str | None = None) -> list[tuple[list[str], list[str]]]:
    """``[(exercises, helpers), ...]``: the exercises whose first tries one kernel can make, and the helpers
    its cut-down reference holds. No group's reference holds (or uses) one of its own exercises: 08's
    ``apply_rope`` is a helper of the cache class and is itself checked with ``rope_angles``, so its first
    try needs a kernel of its own, whose reference has ``rope_angles`` but not ``apply_rope``."""
    groups: list[tuple[list[str], list[str]]] = []
    for exercise, helpers in alone_helpers(notebook).items():
        for exercises, held in groups:
            merged = list(dict.fromkeys([*held, *helpers]))
            if not set([*exercises, exercise]) & set(needed(merged, source)):
                exercises.append(exercise)
                held[:] = merged
                break
        else:
            if exercise in needed(helpers, source):
                raise ValueError(f"{exercise} is among the definitions its own helpers use: no kernel can "
                                 f"make its first try without its answer")
            groups.append(([exercise], list(helpers)))
    return groups
