"""Scan a student edition for anything that gives an answer away.

Three kinds of secret, looked for in every file of the edition (the built wheel too):

- **solution code**: every run of six consecutive code lines of a solution cell (between
  ``### BEGIN SOLUTION`` and ``### END SOLUTION``), after comments, blank lines and whitespace are
  normalised away;
- **reference code**: the body of every function and method of ``course_utils.reference``,
  normalised the same way (bodies of two lines or more);
- **instructor code**: the body of every function of ``course_utils.instructor`` (the known mistakes and the
  families of mistakes: a family's model is the right computation with one thing changed, the answer with one
  edit), the same way, in the package and every file that is not a notebook;
- **hidden cases**: the name of every hidden case and every ``seed=N`` that a hidden case uses.

In the package and every file that is not a notebook, any hit is a leak. A notebook may show the
answers of earlier notebooks (it is released after their deadline), so in notebook ``NN`` only its
own and later notebooks' answers count, and hidden cases everywhere.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from grader import course

WINDOW = 6
PACKAGE_ONLY = "(package)"
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".json", ".yml", ".yaml", ".html", ".ipynb", ""}


@dataclass(frozen=True)
class Leak:
    file: str
    what: str

    def __str__(self) -> str:
        return f"{self.file}: {self.what}"


def normalise(code: str) -> list[str]:
    """Code lines without comments and blank lines, whitespace collapsed (formatting-proof)."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type != tokenize.COMMENT]
        code = tokenize.untokenize(tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        code = re.sub(r"#[^\n]*", "", code)
    return [" ".join(line.split()) for line in code.splitlines() if line.strip()]


def _windows(lines: list[str], size: int = WINDOW) -> set[tuple[str, ...]]:
    return {tuple(lines[i:i + size]) for i in range(len(lines) - size + 1)}


def _contains(haystack: list[str], block: tuple[str, ...]) -> bool:
    n = len(block)
    first = block[0]
    return any(haystack[i] == first and tuple(haystack[i:i + n]) == block for i in range(len(haystack) - n + 1))


@dataclass
class Secrets:
    """What must not leak, per notebook (``solution`` windows and ``reference`` bodies) and overall."""

    solution: dict[str, set[tuple[str, ...]]] = field(default_factory=dict)
    reference: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    hidden_names: set[str] = field(default_factory=set)
    hidden_seeds: set[int] = field(default_factory=set)


def _solution_code(cell_source: str) -> str:
    inside, kept = False, []
    for line in cell_source.splitlines():
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside:
            kept.append(line)
    return "\n".join(kept)


def _function_bodies(obj: object) -> dict[str, tuple[str, ...]]:
    """``qualified name -> normalised body`` of a function, or of each method of a class."""
    source = inspect.getsource(obj)
    tree = ast.parse(inspect.cleandoc("\n" + source) if source.startswith((" ", "\t")) else source)
    lines = source.splitlines()
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]  # the docstring is prose, not an answer
            if not body:
                continue
            text = "\n".join(lines[body[0].lineno - 1:body[-1].end_lineno])
            normal = tuple(normalise(inspect.cleandoc("\n" + text)))
            if len(normal) >= 2:
                found[f"{getattr(obj, '__name__', '?')}.{node.name}"] = normal
    return found


def _cases_in(value: object) -> list:
    from course_utils.checks.core import Case

    if isinstance(value, Case):
        return [value]
    if isinstance(value, (list, tuple)):
        return [c for v in value for c in _cases_in(v)]
    if isinstance(value, dict):
        return [c for v in value.values() for c in _cases_in(v)]
    return []


def collect_secrets() -> Secrets:
    """Everything that must not leak, read from the instructor edition."""
    from course_utils import instructor, reference

    secrets = Secrets()
    owner = {exercise: nb for nb, exercises in course.EXERCISES.items() for exercise in exercises}
    for name in course.available_notebooks():
        nb = nbformat.read(course.solutions_dir() / f"{name}.ipynb", as_version=4)
        windows: set[tuple[str, ...]] = set()
        for cell in nb.cells:
            if cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
                windows |= _windows(normalise(_solution_code(cell.source)))
        secrets.solution[name] = windows
    for attr in reference.__all__:
        # Reference code that answers no exercise (a variant a notebook shows) may be shown in
        # notebooks, but never ships in the package.
        notebook = owner.get(attr, PACKAGE_ONLY)
        secrets.reference.setdefault(notebook, {}).update(
            {f"course_utils.reference {name}": body for name, body in _function_bodies(getattr(reference, attr)).items()})
    for module in instructor._modules():
        bodies = _function_bodies(module)
        secrets.reference.setdefault(PACKAGE_ONLY, {}).update(
            {f"{module.__name__}.{name.rsplit('.', 1)[1]}": body for name, body in bodies.items()})
        for exercise, make in getattr(module, "HIDDEN", {}).items():
            secrets.hidden_names |= {case.name for case in _cases_in(make())}
        secrets.hidden_seeds |= {int(s) for s in re.findall(r"\bseed=(\d+)", inspect.getsource(module))}
    return secrets


def _read_text(path: Path) -> str | None:
    if path.suffix not in TEXT_SUFFIXES:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def scan_recording(label: str, path: Path, secrets: Secrets) -> list[Leak]:
    """A recording holds visible cases only: no key may end in a hidden case's name."""
    from course_utils.checks import expected

    leaks = []
    for key in expected.load(path):
        for name in secrets.hidden_names:
            if key.endswith(name) and key[: -len(name)].endswith(("|", ": ", ") ")):
                leaks.append(Leak(label, f"a recorded value of the hidden case {name!r} ({key!r})"))
    return leaks


def _notebook_code(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def _quoted(text: str, names: set[str]) -> set[str]:
    """The ``names`` that ``text`` holds between two equal quotes (``"name"`` or ``'name'``): one pass
    over the text for all of them, overlapping occurrences included (names with quotes in them are
    looked for one by one)."""
    plain = sorted((n for n in names if "'" not in n and '"' not in n), key=len, reverse=True)
    found: set[str] = set()
    if plain:
        pattern = re.compile(r"""(?=(["'])(""" + "|".join(map(re.escape, plain)) + r")\1)")
        found = {m.group(2) for m in pattern.finditer(text)}
    for name in names - set(plain):
        if re.search(r"""(["'])""" + re.escape(name) + r"\1", text):
            found.add(name)
    return found


def scan_text(label: str, text: str, secrets: Secrets, answers_from: list[str]) -> list[Leak]:
    """Leaks in one file's ``text``: answers of the notebooks ``answers_from``, and hidden cases
    (a hidden case's name as a string literal, or one of its seeds)."""
    leaks = []
    for case_name in sorted(_quoted(text, secrets.hidden_names)):
        leaks.append(Leak(label, f"the name of a hidden case: {case_name!r}"))
    written = set(re.findall(r"\bseed\s*=\s*(\d+)\b", text))  # as written: seed=012 is not seed 12
    for seed in sorted(s for s in secrets.hidden_seeds if str(s) in written):
        leaks.append(Leak(label, f"seed={seed}, a seed of a hidden case"))
    lines = normalise(text)
    present = _windows(lines)
    for notebook in answers_from:
        for window in sorted(secrets.solution.get(notebook, set()) & present):
            leaks.append(Leak(label, f"six lines of the solution of {notebook}, from: {window[0]!r}"))
        for qualname, body in sorted(secrets.reference.get(notebook, {}).items()):
            if _contains(lines, body):
                leaks.append(Leak(label, f"the body of {qualname} ({notebook})"))
    return leaks


def scan_edition(folder: Path, wheel: Path | None = None, secrets: Secrets | None = None) -> list[Leak]:
    """Every leak in the student edition at ``folder`` (and in the built ``wheel``, if given)."""
    secrets = secrets or collect_secrets()
    order = list(course.NOTEBOOKS)
    everything = order + [PACKAGE_ONLY]
    leaks: list[Leak] = []
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        label = str(path.relative_to(folder))
        if path.suffix == ".ipynb" and path.stem in order:
            later = order[order.index(path.stem):]
            leaks += scan_text(label, _notebook_code(path), secrets, later)
        elif path.suffix == ".pt":
            leaks += scan_recording(label, path, secrets)
        else:
            text = _read_text(path)
            if text is not None:
                leaks += scan_text(label, text, secrets, everything)
    if wheel is not None:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                raw = archive.read(info)
                label = f"{wheel.name}:{info.filename}"
                if info.filename.endswith(".pt"):
                    continue  # the same bytes as the edition's recordings, scanned above
                try:
                    leaks += scan_text(label, raw.decode("utf-8"), secrets, everything)
                except UnicodeDecodeError:
                    continue
    return leaks
