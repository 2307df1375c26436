"""Known-wrong and known-right student answers, one module per notebook (``nb01.py`` ...).

Each module defines two dicts keyed by exercise name (the answer cell's grade_id):

    WRONG[exercise][label] = wrong(source, hint)  # a plausible mistake; the hidden tests must take
                                                  # points for it, and the failure message must
                                                  # contain ``hint`` (words that name the mistake)
    RIGHT[exercise][label] = source               # a correct alternative; it must get full marks

``source`` replaces the whole answer cell. The tests in ``tests/test_hidden_tests.py`` run each
one against that exercise's test cells in-process (fast), and ``tests/test_autograde.py`` sends
them through the real nbgrader pipeline.
"""

import importlib

NOTEBOOK_MODULES = {
    "01_dot_products": "nb01",
    "02_softmax_and_context": "nb02",
    "03_trainable_self_attention": "nb03",
    "04_causal_attention": "nb04",
    "05_multi_head_attention": "nb05",
    "06_efficient_attention_gpu": "nb06",
    "07_flash_attention_from_scratch": "nb07",
    "08_kv_cache_gqa_and_windows": "nb08",
    "09_capstone_tiny_transformer": "nb09",
}


class Wrong(str):
    """A wrong answer's source (it is a ``str``), with the words its failure message must contain."""

    hint: str


def wrong(source: str, hint: str) -> Wrong:
    """``source`` marked as a wrong answer whose failure message must contain ``hint``."""
    if not hint:
        raise ValueError("a wrong answer must state the hint its message contains")
    answer = Wrong(source)
    answer.hint = hint
    return answer


def load(notebook: str):
    """The answers module of a notebook, or ``None`` if it has none yet."""
    try:
        return importlib.import_module(f"tests.wrong_answers.{NOTEBOOK_MODULES[notebook]}")
    except ModuleNotFoundError:
        return None


def edit(src: str, old: str, new: str, count: int = 1) -> str:
    """``src`` with ``old`` replaced by ``new``; ``old`` must occur exactly ``count`` times.

    Wrong answers are written as "the correct answer, except this line": the assertion makes
    sure a stale replacement can never silently leave the correct answer in place.
    """
    assert src.count(old) == count, f"expected {count} of {old!r}, found {src.count(old)}"
    return src.replace(old, new)
