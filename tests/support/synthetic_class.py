"""A synthetic class for copy detection: 200 students (or any number) answering every exercise of
notebooks 01 to 06, each answer the solution or the reference rewritten the way students vary code,
with 5 % copied from an earlier student. Used by ``tests/grader_messy/test_similarity.py`` (what is
flagged) and ``scripts/bench_checks.py`` (how long it takes)."""

from __future__ import annotations

import ast
import random
import re

from grader import course, similarity
from grader.autograde import Result


def rename(source: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        source = re.sub(rf"\b{old}\b", new, source)
    return source



NAME_POOL = ["tmp", "val", "out", "res", "acc", "mat", "vec", "arr", "buf", "cur", "t", "z", "w2", "data",
             "thing", "x1", "y1", "q1", "k1", "v1", "scores_", "attn", "h", "dim", "n", "idx", "my_var"]


def _answer_templates() -> dict[tuple[str, str], list[str]]:
    """(notebook, exercise) -> ways the answer is written: the solution, and the reference pasted."""
    out = {}
    for notebook in SYNTHETIC_NOTEBOOKS:
        for exercise in course.EXERCISES[notebook]:
            originals = similarity.course_originals(notebook, exercise)
            out[(notebook, exercise)] = [originals[k] for k in sorted(originals)]
    return out


#: Equivalent ways to write one piece of code; each occurrence is rewritten with probability 1/2.
REWRITES = [
    (r"transpose\(-2, -1\)", "transpose(-1, -2)"),
    (r"transpose\(1, 2\)", "transpose(2, 1)"),
    (r"\b(\w+(?:\.\w+)*) @ (\w+(?:\.\w+)*)(?![\w.(\[])", r"torch.matmul(\1, \2)"),
    (r"\.shape\[(-?\d)\]", r".size(\1)"),
    (r"dim=-1\)", "-1)"),
    (r"diagonal=1\)", "1)"),
    (r"float\(\"-inf\"\)", "-torch.inf"),
    (r"\*\* 0\.5", "** (1 / 2)"),
    (r"\.contiguous\(\)\.view\(", ".reshape("),
    (r"^(\s*)return (.+)$", r"\1result = \2\n\1return result"),
]


def _mutate(source: str, rng: random.Random) -> str:
    for pattern, replacement in REWRITES:
        source = re.sub(pattern, lambda m: m.expand(replacement) if rng.random() < 0.5 else m.group(0), source,
                        flags=re.M)
    return source


def _vary(source: str, rng: random.Random, mutate: bool = True) -> str:
    """``source`` as one student writes it: some equivalent rewrites (``mutate``), own local names,
    a few extra statements, comments and blank lines."""
    if mutate:
        source = _mutate(source, rng)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    own = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                 | {a.arg for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for a in f.args.args} - {"self"})
    names = {old: f"{rng.choice(NAME_POOL)}_{i}" for i, old in enumerate(own) if rng.random() < 0.7}
    source = rename(source, names)
    local = [names.get(old, old) for old in own] or ["x"]
    lines = source.splitlines()
    simple = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Assign, ast.Expr, ast.Return))
              and not isinstance(getattr(n, "value", None), ast.Constant)]
    for node in sorted(rng.sample(simple, min(len(simple), rng.randrange(4))), key=lambda n: -n.end_lineno):
        extra = rng.choice(["print('here', {n})", "assert {v}.dim() >= {n}", "{v} = {v} * {n}", "{v} = {v}.detach()",
                            "print({v}.shape[{n}])", "{v} = {v} if {v} is not None else {n}"])
        lines.insert(node.end_lineno, " " * node.col_offset + extra.format(v=rng.choice(local), n=rng.randrange(10)))
    for _ in range(rng.randrange(4)):
        lines.insert(rng.randrange(len(lines) + 1),
                     rng.choice(["", "# " + rng.choice(["TODO", "this works", "see the book", "shapes!"])]))
    return "\n".join(lines)


#: The synthetic class works notebooks 01 to 06 (the size its time limit was set for).
SYNTHETIC_NOTEBOOKS = [n for n in course.available_notebooks() if n[:2] <= "06"]
SYNTHETIC_EXERCISES = sum(len(course.EXERCISES[n]) for n in SYNTHETIC_NOTEBOOKS)


def synthetic_class(n_students: int, seed: int = 0) -> tuple[list[Result], dict[tuple[str, str], str]]:
    """A class's graded notebooks, and who first wrote each answer: (exercise, student) -> author
    (the student, or for the 5% of answers copied from an earlier student, that student's author)."""
    rng = random.Random(seed)
    templates = _answer_templates()
    results: list[Result] = []
    author: dict[tuple[str, str], str] = {}
    for s in range(n_students):
        sid = f"student{s:03d}"
        for notebook in SYNTHETIC_NOTEBOOKS:
            answers = {}
            for exercise in course.EXERCISES[notebook]:
                author[(exercise, sid)] = sid
                if rng.random() < 0.05:
                    answers[exercise] = similarity.course_stub(notebook, exercise)  # not answered
                elif s and rng.random() < 0.05:  # copied from an earlier student, then disguised
                    donor = rng.choice([r for r in results if r.notebook == notebook])
                    answers[exercise] = _vary(donor.answers[exercise], rng, mutate=False)
                    author[(exercise, sid)] = author[(exercise, donor.student_id)]
                else:
                    answers[exercise] = _vary(rng.choice(templates[(notebook, exercise)]), rng)
            results.append(Result(sid, notebook, 0.0, 0.0, "ok", f"{sid}/{notebook}.ipynb", answers=answers))
    return results, author
