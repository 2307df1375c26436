"""The registered gradebook kept between runs (``grader.autograde.prepare_course``): a second run with the same
solution notebooks, nbgrader and configuration copies it instead of running ``generate_assignment``; any change
to one of them, or a damaged copy, means a fresh registration; nowhere a kernel can read."""

from __future__ import annotations

import re
import sqlite3
import sys
from pathlib import Path

import pytest

from grader import autograde as ag

NOTEBOOK = "02_softmax_and_context"


def _dump(db: Path) -> str:
    """The gradebook's content with nbgrader's random ids numbered in order of appearance."""
    with sqlite3.connect(db) as connection:
        text = "\n".join(connection.iterdump())
    ids: dict[str, str] = {}
    return re.sub(r"'[0-9a-f]{32}'", lambda m: ids.setdefault(m.group(0), f"'id{len(ids)}'"), text)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("GRADER_CACHE_DIR", str(folder))
    return folder


def _registrations(monkeypatch) -> list[list[str]]:
    calls: list[list[str]] = []
    register = ag.register_assignments

    def counted(root, notebooks, db_url=None):
        calls.append(list(notebooks))
        return register(root, notebooks, db_url)

    monkeypatch.setattr(ag, "register_assignments", counted)
    return calls


def test_a_second_run_copies_the_registered_gradebook(tmp_path, cache, monkeypatch):
    calls = _registrations(monkeypatch)
    ag.prepare_course(tmp_path / "first", [NOTEBOOK])
    ag.prepare_course(tmp_path / "second", [NOTEBOOK])
    assert calls == [[NOTEBOOK]], "the second run registered the notebook again"
    assert _dump(tmp_path / "second" / "gradebook.db") == _dump(tmp_path / "first" / "gradebook.db")
    assert (tmp_path / "second" / "source" / NOTEBOOK / f"{NOTEBOOK}.ipynb").is_file()
    assert oct((cache / "gradebooks").stat().st_mode & 0o777) == oct(0o700)


def test_any_change_to_what_registration_reads_gives_a_new_key(tmp_path, cache, monkeypatch):
    import nbgrader

    ag.prepare_course(tmp_path / "course", [NOTEBOOK])
    root = tmp_path / "course"
    key = ag._registration_key(root, [NOTEBOOK])
    assert ag._registration_key(root, [NOTEBOOK]) == key
    source = root / "source" / NOTEBOOK / f"{NOTEBOOK}.ipynb"
    original = source.read_bytes()
    source.write_bytes(original.replace(b"softmax", b"softmaX", 1))
    assert ag._registration_key(root, [NOTEBOOK]) != key, "a changed solution notebook kept its key"
    source.write_bytes(original)
    monkeypatch.setattr(nbgrader, "__version__", nbgrader.__version__ + ".post1")
    assert ag._registration_key(root, [NOTEBOOK]) != key, "another nbgrader kept the key"
    monkeypatch.undo()
    monkeypatch.setattr(ag, "REGISTRATION_VERSION", ag.REGISTRATION_VERSION + 1)
    assert ag._registration_key(root, [NOTEBOOK]) != key


def test_a_damaged_copy_is_registered_again(tmp_path, cache, monkeypatch):
    ag.prepare_course(tmp_path / "first", [NOTEBOOK])
    (kept,) = (cache / "gradebooks").glob("*.db")
    kept.write_bytes(b"not a database")
    calls = _registrations(monkeypatch)
    ag.prepare_course(tmp_path / "second", [NOTEBOOK])
    assert calls == [[NOTEBOOK]]
    assert _dump(tmp_path / "second" / "gradebook.db") == _dump(tmp_path / "first" / "gradebook.db")
    assert ag._assignments(kept) == {NOTEBOOK}, "the damaged copy was not replaced"


def test_no_cache_where_a_kernel_could_read_it(tmp_path, monkeypatch):
    inside = Path(sys.prefix) / "grader-cache-test-never-made"
    monkeypatch.setenv("GRADER_CACHE_DIR", str(inside))
    calls = _registrations(monkeypatch)
    ag.prepare_course(tmp_path / "first", [NOTEBOOK])
    ag.prepare_course(tmp_path / "second", [NOTEBOOK])
    assert calls == [[NOTEBOOK], [NOTEBOOK]]
    assert not inside.exists()
