"""Where a check's expected values come from: the live reference, or a recording of it.

The same check code runs in both editions of the course:

- **Instructor edition** (this repository, and the grading sandbox): ``course_utils.reference`` and
  ``course_utils.instructor`` are installed, and every expected value is computed live from them.
- **Student edition** (``make release`` -> ``release/``): those modules are absent. Every expected
  value a self-check needs on its visible cases was recorded when the instructor ran ``make build``
  and ships as data, ``course_utils/expected/<notebook>.pt``: tensors, shapes and the outputs of the
  known mistakes, keyed by exercise and case. No answer code and no hidden case ships.

A check asks for a value with :func:`expect`, giving a key and a function that computes it from the
reference. Live, the function runs; recorded, the key is looked up and the function never runs.
While :func:`recording` is active the function runs and its value is stored under the key.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import torch

T = TypeVar("T")

LIVE, RECORDED, RECORDING = "live", "recorded", "recording"
#: Set to ``live`` or ``recorded`` to force where expected values come from (tests, parity checks).
MODE_VARIABLE = "COURSE_EXPECTATIONS"
#: The recorded expectations, one file per notebook: ``<notebook>.pt``.
DATA_DIR = Path(__file__).resolve().parent.parent / "expected"

_forced: list[str] = []
_recording: list[dict[str, Any]] = []
_remembered: list[dict[str, Any]] = []
_loaded: dict[str, Any] | None = None


class MissingExpectation(LookupError):
    """A recorded value that this edition of the course does not hold."""


class InstructorOnly(ImportError):
    """Something only the instructor edition has (the reference answers, the hidden cases)."""


@functools.lru_cache(maxsize=1)
def _instructor_edition() -> bool:
    """Whether the answers are installed (asked once: in the student edition the import always fails)."""
    try:
        importlib.import_module("course_utils.reference")
    except ImportError:
        return False
    return True


def mode() -> str:
    """``live``, ``recorded`` or ``recording``: where :func:`expect` takes its values from now."""
    if _recording:
        return RECORDING
    if _forced:
        return _forced[-1]
    chosen = os.environ.get(MODE_VARIABLE, "").strip().lower()
    if chosen in (LIVE, RECORDED):
        return chosen
    return LIVE if _instructor_edition() else RECORDED


@contextlib.contextmanager
def using(which: str) -> Iterator[None]:
    """Take expected values from ``which`` (``live`` or ``recorded``) inside the ``with`` block."""
    if which not in (LIVE, RECORDED):
        raise ValueError(f"expected {LIVE!r} or {RECORDED!r}, got {which!r}")
    _forced.append(which)
    try:
        yield
    finally:
        _forced.pop()


@contextlib.contextmanager
def recording() -> Iterator[dict[str, Any]]:
    """Compute expected values live and collect them in the yielded dict (key -> value)."""
    store: dict[str, Any] = {}
    _recording.append(store)
    try:
        yield store
    finally:
        _recording.pop()


@contextlib.contextmanager
def remembering(store: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Inside the block, compute each live expectation once: the first value of a key is kept in ``store``
    and given again for that key, as a recording gives it.

    For a process that judges many answers against the same reference and keeps ``store`` between blocks
    (the test suite's known answers ask for 555 keys about 30,000 times). A key names its value (the rule
    :func:`recording` enforces), so this changes no verdict. Not for the grader: there a key's value is
    computed again for every submission, so that nothing of one submission can reach the next."""
    _remembered.append(store)
    try:
        yield store
    finally:
        _remembered.pop()


def is_recording() -> bool:
    return bool(_recording)


def _key(exercise: str, key: str) -> str:
    return f"{exercise}|{key}"


def expect(exercise: str, key: str, compute: Callable[[], T]) -> T:
    """The expected value named ``key`` for ``exercise``: ``compute()`` live, the recording otherwise.

    ``compute`` may use :func:`reference` and :func:`instructor`; it runs only in the instructor
    edition. Keys are deterministic strings (a case's name, its constructor arguments, a mode).
    """
    full = _key(exercise, key)
    current = mode()
    if current == RECORDED:
        data = recorded()
        if full not in data:
            raise MissingExpectation(
                f"this edition of the course has no recorded expectation {full!r}. Its checks are newer "
                f"than its recorded data: ask your instructor for an updated student edition")
        return data[full]
    if current == LIVE and _remembered:
        kept = _remembered[-1].get(full, _MISSING)
        if kept is _MISSING:
            kept = _remembered[-1][full] = compute()
        return kept
    value = compute()
    if current == RECORDING:
        stored = _recording[-1].get(full, _MISSING)
        if stored is not _MISSING and not same_value(stored, value):
            raise RuntimeError(f"expectation {full!r} was recorded twice with different values: make its key unique")
        _recording[-1][full] = _detached(value)
    return value


_MISSING = object()


def reference(name: str) -> Any:
    """``course_utils.reference.<name>``, the answer; only the instructor edition has it."""
    return getattr(_import_instructor_only("course_utils.reference"), name)


def instructor() -> Any:
    """The package ``course_utils.instructor`` (hidden cases, known mistakes); instructor edition only."""
    return _import_instructor_only("course_utils.instructor")


def _import_instructor_only(name: str) -> Any:
    if mode() == RECORDED:
        raise InstructorOnly(f"{name} is not used by the student edition's checks: they compare with recorded "
                             f"expectations")
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise InstructorOnly(f"{name} is part of the instructor edition of the course only") from exc


# --------------------------------------------------------------------------------------------
# The recorded data
# --------------------------------------------------------------------------------------------
def data_file(notebook: str, folder: Path | None = None) -> Path:
    return (folder or DATA_DIR) / f"{notebook}.pt"


def recorded() -> dict[str, Any]:
    """Every recorded expectation shipped in ``course_utils/expected/``, loaded once."""
    global _loaded
    if _loaded is None:
        merged: dict[str, Any] = {}
        for path in sorted(DATA_DIR.glob("*.pt")):
            merged.update(load(path))
        _loaded = merged
    return _loaded


def forget_loaded() -> None:
    """Drop the cached recording (after the files changed)."""
    global _loaded
    _loaded = None


def load(path: Path) -> dict[str, Any]:
    """One notebook's recording; only plain data and tensors are accepted (``weights_only``)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def save(values: dict[str, Any], path: Path) -> None:
    """Write one notebook's recording: ``torch.save``'s zip archive, its entries deflated (``torch.load`` reads
    them as they are; the student edition ships every recording, and float tensors still shrink by a fifth)."""
    import io
    import zipfile

    path.parent.mkdir(parents=True, exist_ok=True)
    raw = io.BytesIO()
    torch.save(dict(sorted(values.items())), raw)
    raw.seek(0)
    partial = path.with_name(f".{path.name}.partial")
    with zipfile.ZipFile(raw) as plain, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as packed:
        for info in plain.infolist():
            packed.writestr(info.filename, plain.read(info.filename))
    partial.replace(path)


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def same_value(a: Any, b: Any) -> bool:
    """Exact equality of two recorded values (tensors bit for bit, NaN equal to NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _same_tensor(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return type(a) is type(b) and a == b


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        return torch.equal(nan_a, nan_b) and torch.equal(a.masked_fill(nan_a, 0), b.masked_fill(nan_b, 0))
    return torch.equal(a, b)


#: Tolerances for recorded floating-point tensors, per dtype: ``torch.testing.assert_close``'s defaults.
#: Another CPU (AVX-512, AVX2, plain SSE) sums in another order and differs by a few units in the
#: last place; a changed answer differs by far more.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
#: Python floats in a recording come out of float32 arithmetic (``tensor.item()``): float32's tolerance.
FLOAT_TOLERANCE = TOLERANCES[torch.float32]


def value_difference(old: Any, new: Any) -> str | None:
    """``None`` when ``new`` is the same recorded value as ``old`` up to arithmetic noise; otherwise why not.

    Structure must match exactly: types, lengths, dict keys, tensor dtypes and shapes, where NaN and
    infinities are (and their signs), integers, booleans and strings. Floating-point values may differ by
    the tolerance of their dtype (:data:`TOLERANCES`), which covers another CPU's float32 rounding but
    not a changed answer.
    """
    if isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor):
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return f"a {type(old).__name__} became a {type(new).__name__}"
        return _tensor_difference(old, new)
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        if type(old) is not type(new) or len(old) != len(new):
            return f"a {type(old).__name__} of {len(old)} became a {type(new).__name__} of {len(new)}"
        for i, (a, b) in enumerate(zip(old, new)):
            why = value_difference(a, b)
            if why:
                return f"item {i}: {why}"
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        if old.keys() != new.keys():
            return f"keys {sorted(map(str, old.keys() ^ new.keys()))} added or removed"
        for k in old:
            why = value_difference(old[k], new[k])
            if why:
                return f"{k!r}: {why}"
        return None
    if type(old) is not type(new):
        return f"a {type(old).__name__} became a {type(new).__name__}"
    if isinstance(old, float):
        if math.isnan(old) or math.isnan(new) or math.isinf(old) or math.isinf(new):
            return None if (old == new or (math.isnan(old) and math.isnan(new))) else f"{old!r} became {new!r}"
        rtol, atol = FLOAT_TOLERANCE
        return None if abs(old - new) <= atol + rtol * abs(old) else f"{old!r} became {new!r}"
    return None if old == new else f"{old!r} became {new!r}"


def _tensor_difference(old: torch.Tensor, new: torch.Tensor) -> str | None:
    old, new = old.detach().cpu(), new.detach().cpu()
    if old.dtype != new.dtype:
        return f"dtype {old.dtype} became {new.dtype}"
    if old.shape != new.shape:
        return f"shape {tuple(old.shape)} became {tuple(new.shape)}"
    if not (old.is_floating_point() or old.is_complex()):
        return None if torch.equal(old, new) else "integer or boolean values changed"
    if not torch.equal(torch.isnan(old), torch.isnan(new)):
        return "NaN in other places"
    if not torch.equal(torch.isinf(old) & (old > 0), torch.isinf(new) & (new > 0)) or \
            not torch.equal(torch.isinf(old) & (old < 0), torch.isinf(new) & (new < 0)):
        return "infinities in other places"
    rtol, atol = TOLERANCES.get(old.dtype, FLOAT_TOLERANCE)
    try:
        torch.testing.assert_close(new, old, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as exc:
        worst = [line.strip() for line in str(exc).splitlines() if line.strip().startswith("Greatest absolute")]
        return "values changed" + (f" ({worst[0].lower()})" if worst else "")
    return None


def differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, str]:
    """Keys that were added, removed or changed beyond arithmetic noise between two recordings, sorted,
    each with what changed (:func:`value_difference`)."""
    found = {}
    for k in sorted(set(old) | set(new)):
        if k not in new:
            found[k] = "dropped: no check asks for it any more"
        elif k not in old:
            found[k] = "new: not in the recording"
        else:
            why = value_difference(old[k], new[k])
            if why:
                found[k] = why
    return found
