"""The leak scan's search for hidden case names and seeds (grader.leaks.scan_text): one pass per file,
finding what one search per name finds."""

from __future__ import annotations

from grader import leaks


def _said(text: str, names: set[str], seeds: set[int]) -> list[str]:
    secrets = leaks.Secrets(hidden_names=names, hidden_seeds=seeds)
    return [leak.what for leak in leaks.scan_text("f", text, secrets, [])]


def test_hidden_names_are_found_between_equal_quotes_only():
    names = {"T=7, d=3", "T=7", "odd 'one'"}
    text = "a = 'T=7'\nb = \"T=7, d=3\"\nc = 'T=7, d=3\"\nd = \"odd 'one'\"\n"
    found = _said(text, names, set())
    assert sorted(found) == sorted([f"the name of a hidden case: {n!r}" for n in names])
    assert _said("c = 'T=7, d=3\"  # quotes that do not match", {"T=7, d=3"}, set()) == []


def test_overlapping_quoted_names_are_all_found():
    assert len(_said("x = 'a'b'", {"a", "b"}, set())) == 2


def test_hidden_seeds_are_found_as_written():
    assert _said("rand(3, seed = 42)", set(), {42}) == ["seed=42, a seed of a hidden case"]
    assert _said("rand(3, seed=420)\nrand(3, seed=042)\nmyseed=42", set(), {42}) == []
