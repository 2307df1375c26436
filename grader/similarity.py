"""Copy detection for the instructor: answers that are near-identical after normalisation (MOSS-style).

Nothing here is ever shown to students or changes a score: :func:`grader.autograde.autograde`
writes what :func:`find_similar` returns to ``DIR/similarity.csv`` and to a section of the
instructor's ``DIR/reports/<student>.md``, after the grades are written, and never to
``results.json`` (the source of the students' feedback pages).

How, per exercise (the unit compared is one answer cell):

1. **Normalise**: the answer is printed back from its syntax tree (:func:`ast.unparse`: one layout,
   no comments, no redundant parentheses or trailing commas), then ``copydetect`` (MOSS-style
   winnowing over pygments tokens) turns every identifier into ``V``, function names into ``F``,
   class names into ``O``, string contents into ``S`` and drops all whitespace. Renaming
   variables, reformatting, adding comments or blank lines leaves the text unchanged.
2. **Fingerprint**: hashes of every ``K``-character run of that text (``K`` is the noise threshold:
   shorter shared runs are never counted), winnowed with a window of ``WINDOW`` hashes (any shared
   run of ``K + WINDOW - 1`` characters, a short statement, is guaranteed to be seen).
3. **Ignore what everyone shares**, as MOSS does: fingerprints of the stub the students were given
   (the released answer cell) are boilerplate, and a fingerprint found in more than ``max_share``
   students' answers to the exercise (MOSS's default: 10) is common code; both are dropped from
   every answer, as copydetect drops boilerplate. What is left is each answer's own code. An
   answer left as the stub has none and is never compared.
4. **Compare** every pair of students, and every student with the instructor's solution
   (``<solution>``) and the reference implementation (``<reference>``):
   ``similarity = |own fingerprints the two share| / |own fingerprints of the smaller answer|``
   (0..1), and ``matched_tokens``: how much normalised code those shared fingerprints cover.
5. **Flag** a pair when ``similarity >= THRESHOLD`` (0.8: the smaller answer's own code is, but for
   a line or two, in the other) and ``matched_tokens >= MIN_MATCHED_TOKENS`` (50, about three
   statements: answers whose own code is shorter, such as the 3-line loop most of a class writes
   for ``dot`` with a personal touch or two, are too short to tell copying from coincidence).

A flagged pair is a lead for a person to read both answers, not a verdict: short exercises have
few ways to be written, and the course teaches one of them.

The ``copydetect`` library (0.5) does the tokenising and normalising
(:func:`copydetect.utils.filter_code`), the winnowing (:func:`copydetect.utils.winnow`) and the
measure of copied code (:func:`copydetect.utils.get_copied_slices`). Only the k-gram hash is
computed here: copydetect's ``hashed_kgrams`` uses Python's ``hash()``, which is salted per
process, so which fingerprints winnowing keeps, and thus the similarities, would change from one
run to the next; a fixed polynomial hash gives the same similarity.csv every run. Its
``CodeFingerprint``/``compare_files`` are not used: they compare two files at a time, and a class
is compared through an index of which students hold each fingerprint (a fingerprint held by at
most ``max_share`` students makes at most ``max_share * (max_share - 1) / 2`` candidate pairs).
"""

from __future__ import annotations

import ast
import inspect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations
from typing import Iterable, Mapping, Protocol

import nbformat
import numpy as np

from grader import cells as nbcells
from grader import course

#: Length of a fingerprinted run of normalised text (copydetect's "noise threshold").
K = 8
#: Winnowing window, in hashes: a shared run of ``K + WINDOW - 1`` characters always shares a fingerprint.
WINDOW = 4
#: A fingerprint in more than this many students' answers to an exercise is ignored (MOSS ``-m``).
MAX_SHARE = 10
#: Flag a pair from this similarity on (0..1).
THRESHOLD = 0.8
#: ...and only when the shared code covers at least this many normalised tokens (characters of
#: the normalised text, where an identifier counts 1: about three statements).
MIN_MATCHED_TOKENS = 50

SOLUTION = "<solution>"
REFERENCE = "<reference>"

_BASE = np.uint64(1_000_003)


class Answered(Protocol):
    """What :func:`find_similar` reads from a graded notebook (:class:`grader.autograde.Result`)."""

    student_id: str
    notebook: str
    answers: Mapping[str, str]  # exercise -> the answer cell's source


@dataclass(frozen=True, order=True)
class Pair:
    """Two answers to one exercise that are near-identical; ``student_b`` may be ``<solution>``
    or ``<reference>``."""

    notebook: str
    exercise: str
    student_a: str
    student_b: str
    similarity: float  # shared own fingerprints / own fingerprints of the smaller answer, 0..1
    matched_tokens: int  # normalised tokens covered by the shared own fingerprints (the smaller side's count)


@dataclass(frozen=True)
class Fingerprint:
    """The winnowed fingerprints of one answer, boilerplate removed."""

    normalised: str  # copydetect's filtered text: identifiers V/F/O, strings S, no comments or spaces
    positions: dict[int, list[int]] = field(default_factory=dict)  # hash -> where its k-gram starts

    @property
    def hashes(self) -> set[int]:
        return set(self.positions)


def _kgram_hashes(text: str, k: int) -> np.ndarray:
    """A stable 64-bit hash of every ``k``-character run of ``text`` (polynomial, then mixed)."""
    codes = np.array([ord(ch) for ch in text], dtype=np.uint64)
    n = len(codes) - k + 1
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    h = np.zeros(n, dtype=np.uint64)
    for j in range(k):  # wraps modulo 2**64
        h = h * _BASE + codes[j:j + n]
    # splitmix64's finaliser, so that winnowing's "smallest hash in the window" is a fair pick
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    # 53 bits: copydetect's winnowing compares hashes as float64, which holds 53 bits exactly
    return (h >> np.uint64(11)).astype(np.int64)


def _canonical(source: str) -> str:
    """``source`` printed back from its syntax tree: one layout, no comments, no redundant
    parentheses or trailing commas, whatever the formatting; unchanged if it does not parse."""
    try:
        return ast.unparse(ast.parse(source))
    except (SyntaxError, ValueError, RecursionError):
        return source


@lru_cache(maxsize=4096)
def normalise(source: str) -> str:
    """``source`` (Python) as copydetect's tokeniser sees it: identifiers ``V``, function names ``F``,
    class names ``O``, string contents ``S``, no comments and no whitespace."""
    from copydetect.utils import filter_code  # here: copydetect imports matplotlib.pyplot

    return filter_code(_canonical(source), "answer.py", language="python")[0]


def fingerprint(source: str, boilerplate: Iterable[int] = (), *, k: int = K, window: int = WINDOW) -> Fingerprint:
    """Normalise ``source`` (Python) with copydetect and winnow its k-gram hashes, dropping
    those in ``boilerplate`` (the fingerprints of the stub)."""
    from copydetect.utils import winnow

    normalised = normalise(source)
    hashes = _kgram_hashes(normalised, k)
    if len(hashes) == 0:
        return Fingerprint(normalised)
    selected, index = winnow(hashes, window, remove_duplicates=False)
    skip = set(boilerplate)
    positions: dict[int, list[int]] = {}
    for h, i in zip(selected.tolist(), index.tolist()):
        if h not in skip:
            positions.setdefault(h, []).append(i)
    return Fingerprint(normalised, positions)


def _covered(fp: Fingerprint, hashes: set[int], k: int) -> int:
    """Normalised tokens of ``fp`` inside the k-grams of ``hashes`` (copydetect's count of copied code)."""
    from copydetect.utils import get_copied_slices

    if not hashes:
        return 0
    slices = get_copied_slices(np.array(sorted(i for h in hashes for i in fp.positions[h])), k)
    return int(np.sum(slices[1] - slices[0]))


def compare_answers(answers: Mapping[str, str], *, stub: str = "", originals: Mapping[str, str] | None = None,
                    notebook: str = "", exercise: str = "", max_share: int = MAX_SHARE,
                    threshold: float = THRESHOLD, min_tokens: int = MIN_MATCHED_TOKENS,
                    k: int = K, window: int = WINDOW) -> list[Pair]:
    """The flagged pairs among the answers to one exercise.

    ``answers``: student -> answer source. ``stub``: the code every student was given (its
    fingerprints are ignored). ``originals``: name (``<solution>``, ``<reference>``) -> source,
    each compared with every student but not counted as a submission. A fingerprint in more than
    ``max_share`` students' answers is ignored. Pairs are sorted; ``student_a < student_b``
    for two students, and an original is always ``student_b``.
    """
    boilerplate = fingerprint(stub, k=k, window=window).hashes if stub.strip() else set()
    prints = {sid: fingerprint(answers[sid], boilerplate, k=k, window=window) for sid in sorted(answers)}
    holders: dict[int, list[str]] = defaultdict(list)
    for sid, fp in prints.items():
        for h in fp.positions:
            holders[h].append(sid)
    common = {h for h, who in holders.items() if len(who) > max_share}
    own = {sid: fp.hashes - common for sid, fp in prints.items()}
    shared_count: Counter[tuple[str, str]] = Counter()
    for who in holders.values():
        if 2 <= len(who) <= max_share:
            shared_count.update(combinations(who, 2))  # ``who`` is in sorted order: a < b

    def judge(a: str, b: str, count: int) -> Pair | None:
        similarity = count / min(len(own[a]), len(own[b]))
        if similarity < threshold:
            return None
        shared = own[a] & own[b]
        tokens = min(_covered(prints[a], shared, k), _covered(prints[b], shared, k))
        return Pair(notebook, exercise, a, b, round(similarity, 6), tokens) if tokens >= min_tokens else None

    found = [judge(a, b, n) for (a, b), n in shared_count.items()]
    for name, source in sorted((originals or {}).items()):
        prints[name] = fingerprint(source, boilerplate, k=k, window=window)
        own[name] = prints[name].hashes - common
        found += [judge(sid, name, len(own[sid] & own[name])) for sid in answers if own[sid] & own[name]]
    return sorted(p for p in found if p is not None)


# ---------------------------------------------------------------------------------------------
# The course's side: the stub the students were given, the solution, the reference.


def _answer_cell(folder: str, notebook: str, exercise: str) -> str:
    path = course.repo_root() / folder / f"{notebook}.ipynb"
    if not path.exists():
        return ""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if nbcells.is_answer(cell) and nbcells.grade_id(cell) == exercise:
            return cell.source
    return ""


@lru_cache(maxsize=None)
def course_stub(notebook: str, exercise: str) -> str:
    """The answer cell of the released ``notebooks/<notebook>.ipynb``: what every student started from."""
    return _answer_cell("notebooks", notebook, exercise)


@lru_cache(maxsize=None)
def course_originals(notebook: str, exercise: str) -> dict[str, str]:
    """``<solution>``: the solution notebook's answer cell without its ``### BEGIN/END SOLUTION``
    lines (as a student would have pasted it); ``<reference>``: the source of
    ``course_utils.reference.<exercise>``. Either is left out where the course has none."""
    out = {}
    solution = _answer_cell("solutions", notebook, exercise)
    if solution.strip():
        lines = [line for line in solution.splitlines()
                 if not line.strip().startswith(("### BEGIN SOLUTION", "### END SOLUTION"))]
        out[SOLUTION] = "\n".join(lines)
    source = _reference_source(exercise)
    if source is not None:
        out[REFERENCE] = source
    return out


@lru_cache(maxsize=1)
def _reference_definitions() -> dict[str, str]:
    """Each top-level function and class of ``course_utils/reference.py`` -> its source, decorators included,
    read from the file once (no import of torch in the grading run's own process)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("course_utils.reference")
    if spec is None or not spec.origin:
        return {}
    text = Path(spec.origin).read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            found[node.name] = "".join(lines[start - 1:node.end_lineno])
    return found


def _reference_source(name: str) -> str | None:
    """The source of ``course_utils.reference.<name>``: read from the file where it is defined there
    (:func:`_reference_definitions`), else through an import, as ``inspect.getsource``."""
    if name in _reference_definitions():
        return _reference_definitions()[name]
    from course_utils import reference

    obj = getattr(reference, name, None)
    if obj is None:
        return None
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def find_similar(results: Iterable[Answered], *, max_share: int = MAX_SHARE, threshold: float = THRESHOLD,
                 min_tokens: int = MIN_MATCHED_TOKENS) -> list[Pair]:
    """Every flagged pair in a class, per notebook and exercise, sorted.

    ``results`` are the graded notebooks (anything with ``student_id``, ``notebook`` and
    ``answers``); they are only read. Each exercise is compared with :func:`compare_answers`
    against the course's stub (boilerplate), solution and reference.
    """
    per_exercise: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for r in results:
        if not r.student_id:
            continue
        for exercise, source in (r.answers or {}).items():
            if source and source.strip():
                per_exercise[(r.notebook, exercise)].setdefault(r.student_id, source)
    pairs: list[Pair] = []
    for (notebook, exercise), answers in sorted(per_exercise.items()):
        pairs += compare_answers(answers, stub=course_stub(notebook, exercise),
                                 originals=course_originals(notebook, exercise), notebook=notebook,
                                 exercise=exercise, max_share=max_share, threshold=threshold,
                                 min_tokens=min_tokens)
    return sorted(pairs)
