"""The rules check reads each function's source and parses it once, and never answers from a stale copy."""

from __future__ import annotations

import linecache

from course_utils import rules


def _define(source: str, filename: str):
    """The function ``f`` defined by ``source`` from a 'cell' named ``filename``, as IPython registers cells."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["f"]


def test_a_cell_run_again_under_the_same_name_gives_its_new_source():
    first = _define("def f(x):\n    return x.softmax(-1)\n", "<cell rules-cache>")
    assert "softmax" in rules.source_of(first)
    assert rules.violations_of(first, "softmax_naive"), "the first definition calls softmax"
    second = _define("def f(x):\n    return x.exp() / x.exp().sum(-1, keepdim=True)\n", "<cell rules-cache>")
    assert "softmax" not in rules.source_of(second)
    assert rules.violations_of(second, "softmax_naive") == []
    assert "softmax" in rules.source_of(first), "the first function's own source is still its own"


def test_a_wrapper_is_read_through_to_what_it_wraps_each_time():
    inner = _define("def f(x):\n    return x.softmax(-1)\n", "<cell rules-cache-inner>")
    outer = _define("def f(x):\n    return x\n", "<cell rules-cache-outer>")
    assert "softmax" not in rules.source_of(outer)
    outer.__wrapped__ = inner  # inspect.getsource follows __wrapped__, as the cache must
    assert "softmax" in rules.source_of(outer)


def test_violations_are_new_objects_each_call():
    found = rules.find_violations("def f(x):\n    return x.softmax(-1)\n", "softmax_naive")
    assert found
    found[0].message = "changed by a caller"
    found.append(rules.Violation("added by a caller"))
    again = rules.find_violations("def f(x):\n    return x.softmax(-1)\n", "softmax_naive")
    assert len(again) == 1 and again[0].message != "changed by a caller"
    assert rules.find_violations("def f(:\n", "softmax_naive")[0].message.startswith("the code does not parse")
