"""Integrity flags: dynamic code in an answer cell is named for the instructor, and honest answers
(innocent getattr with a literal name, einsum, loops) are not flagged."""

from __future__ import annotations

import pytest

from grader import integrity

CHEATS = {
    "import by a computed name": ("m = __import__('course_utils.' + 'refer' + 'ence')", "__import__"),
    "importlib": ("import importlib\nref = importlib.import_module('course_utils.' + 'reference')", "importlib"),
    "exec": ("exec(''.join(['im', 'port os']))", "exec"),
    "eval": ("f = eval('lambda x: x')", "eval"),
    "compile": ("code = compile('x = 1', 'c', 'exec')", "compile"),
    "frames": ("import sys\nf = sys._getframe(1)", "frames"),
    "frames by name": ("from sys import _getframe\nf = _getframe(2)", "frames"),
    "inspect stack": ("import inspect\nwant = inspect.stack()[1].frame.f_locals['want']", "frames"),
    "f_back": ("def dot(x, y):\n    return x.f_back", "call stack"),
    "gc": ("import gc\nobjs = gc.get_objects()", "gc"),
    "ctypes": ("import ctypes", "ctypes"),
    "sys.modules": ("import sys\nchecks = sys.modules['course_utils.checks']", "sys.modules"),
    "computed getattr": ("name = 'check_' + 'dot'\nf = getattr(checks, name)", "getattr with a name computed"),
    "computed setattr": ("setattr(checks, 'c' + 'heck_dot', lambda *a: None)", "setattr with a name computed"),
    "__code__": ("def f(): pass\nf.__code__ = (lambda: None).__code__", "__code__"),
    "__globals__": ("g = dot.__globals__", "__globals__"),
    "builtins": ("import builtins\nbuiltins.print = None", "builtins"),
    "__builtins__": ("__builtins__['len'] = None", "__builtins__"),
    "set_custom_exc": ("get_ipython().set_custom_exc((AssertionError,), lambda *a: None)", "set_custom_exc"),
}

HONEST = {
    "literal getattr": "def f(module):\n    return getattr(module, 'weight', None)",
    "einsum": "def attention_scores(inputs):\n    return torch.einsum('...id,...jd->...ij', inputs, inputs)",
    "loop": "def dot(x, y):\n    total = 0.0\n    for a, b in zip(x, y):\n        total += a * b\n    return total",
    "module": ("class CausalAttention(nn.Module):\n    def __init__(self, d_in, d_out, context_length, dropout):\n"
               "        super().__init__()\n        self.register_buffer('mask', torch.triu(torch.ones(3, 3), 1))"),
    "does not parse": "def dot(x, y)\n    return",
    "getattr over a literal list": ("def copy(a, b):\n    for name in ['W_query', 'W_key']:\n"
                                    "        getattr(b, name).data.copy_(getattr(a, name).weight.T)"),
}


@pytest.mark.parametrize("source, words", CHEATS.values(), ids=CHEATS.keys())
def test_each_cheat_is_flagged(source, words):
    found = integrity.scan(source)
    assert found and any(words in what for _, what in found), found


@pytest.mark.parametrize("source", HONEST.values(), ids=HONEST.keys())
def test_honest_answers_are_not_flagged(source):
    assert integrity.scan(source) == []


def test_flags_go_to_a_column_and_a_report_section():
    class Row:
        def __init__(self, student_id, notebook, answers):
            self.student_id, self.notebook, self.answers = student_id, notebook, answers

    rows = [Row("ada", "02_softmax_and_context", {"softmax_stable": "import sys\nx = sys.modules['torch']"}),
            Row("bo", "02_softmax_and_context", {"softmax_stable": HONEST["loop"]})]
    found = integrity.flags(rows)
    assert [(f.student_id, f.exercise, f.line) for f in found] == [("ada", "softmax_stable", 2)]
    assert integrity.column(found, "ada", "02_softmax_and_context").startswith("softmax_stable line 2: sys.modules")
    assert integrity.column(found, "bo", "02_softmax_and_context") == ""
    section = integrity.report_section(found, "ada")
    assert section[0] == "## Integrity (instructor only)" and "| 02_softmax_and_context | softmax_stable | 2 |" in section[-2]
    assert integrity.report_section(found, "bo") == []
