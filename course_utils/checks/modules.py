"""What every probed attention module's plan and words share, and the notebooks' exercises checked alone.

The plans of a causal attention module's passes (:class:`ProbePlan`, :func:`causal_probes`), its inputs
(:func:`_class_inputs`) and the words of its checks (:func:`shape_problem`, :data:`DROPOUT_FIX`), read by the
judges that check a probed construction (:mod:`course_utils.checks.probed`, ``spec.ModuleView``); and
:func:`alone`, the one way an exercise that calls the notebook's other exercises is checked.

A module exercise is more than its outputs: its output must be finite, its mask a registered
buffer cut to the input's length, dropout active only in ``train()``, no position may see the
future, a too-long input must raise, and everything must move with ``.to(dtype)`` and
``.to(device)``. Each check names the mistake it finds, in an order where a symptom is never
blamed on the wrong cause (NaN is looked at first).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from course_utils.checks import expected as _expected
from course_utils.checks import probe as _probe
from course_utils.checks.core import NOT_IMPLEMENTED, Case, CheckFailed, causal_inputs, rand

__all__ = [
    "shape_problem",
    "helpers_used",
    "check_alone",
    "alone",
    "helper_checks",
    "two_tries",
    "replayed_tries",
    "ProbePlan",
    "causal_probes",
]


#: What to do about dropout in the wrong mode, for a module that uses ``nn.Dropout`` (the default)
#: and for one that passes ``dropout_p`` to ``F.scaled_dot_product_attention``.
DROPOUT_FIX = {
    "module": ("Use nn.Dropout, or F.dropout(weights, p, training=self.training)",
               "Apply self.dropout to the attention weights"),
    "sdpa": ("SDPA does not know the module's mode: pass dropout_p=self.dropout only when self.training, else 0.0",
             "Pass dropout_p=self.dropout to F.scaled_dot_product_attention when self.training"),
}


def _later_tokens_changed(x: torch.Tensor) -> torch.Tensor:
    """``x`` with tokens 2.. replaced: whether position 1 moves tells a masked diagonal from a missing mask."""
    changed = x.clone()
    changed[:, 2:] = rand(*changed[:, 2:].shape, seed=99) * 3
    return changed


def _class_inputs(first: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_full, x_short, x_too_long)``: the inputs ``probed.module_class`` gives the module built
    with ``first`` (``d_in, d_out, context_length, ...``)."""
    d_in, context_length = first[0], first[2]
    return (rand(2, context_length, d_in, seed=71), rand(2, max(1, context_length - 2), d_in, seed=72),
            rand(1, context_length + 1, d_in, seed=77))


def causal_probes(x: torch.Tensor) -> list[_probe.Probe]:
    """The forward passes :func:`check_causal_module` makes on ``x`` (``eval()`` mode, no seed of its own)."""
    xs = [x, *causal_inputs(x)] + ([_later_tokens_changed(x)] if x.shape[1] > 2 else [])
    return [_probe.Probe("eval", None, v) for v in xs]


class ProbePlan:
    """The forward passes a module check makes, per construction (constructor arguments), in the
    order it first makes them: what the kernel hands out under the grader
    (``probe.record_module_probes``). Adding a pass already planned adds nothing."""

    def __init__(self) -> None:
        self.plan: dict[tuple, list[_probe.Probe]] = {}

    def add(self, build: tuple, *probes: _probe.Probe) -> None:
        found = self.plan.setdefault(tuple(build), [])
        found += [p for p in probes if not any(p.same(q) for q in found)]

    def causal(self, cases: Sequence[Case]) -> None:
        """:func:`check_causal_module` on each case's input, the module built with ``case.build``."""
        for case in cases:
            self.add(case.build, *causal_probes(case.args[0]))

    def compared(self, configs: Sequence[tuple[tuple, Sequence[Case]]], train: bool = False,
                 diagnosed_causal: bool = False) -> None:
        """``compare_module(configs, train=train)``; with ``diagnosed_causal``, also what its
        :func:`not_causal` diagnosis makes on each case's input."""
        for build, cases in configs:
            self.add(build, *[_probe.Probe(mode, 7, case.args[0]) for mode in ("eval", "train")[:1 + train]
                              for case in cases])
            if diagnosed_causal:
                self.add(build, *[p for case in cases if case.args[0].dim() == 3 and case.args[0].shape[1] > 1
                                  for p in causal_probes(case.args[0])])

    def items(self) -> list[tuple[tuple, list[_probe.Probe]]]:
        return list(self.plan.items())


# ------------------------------------------------------------------------------------------
# Parameter shapes first, and values before structure (notebooks 05 and 06)
# ------------------------------------------------------------------------------------------


def shape_problem(got: list[tuple[int, ...]], want: list[tuple[int, ...]], build: tuple) -> str | None:
    """Name what differs between two lists of parameter shapes, when it is a known pattern.

    ``build`` follows the book's constructor, ``(d_in, d_out, context_length, dropout, num_heads, ...)``; which
    bias is missing (or too many) is read from the shapes, not from ``build`` (GroupedQueryAttention's sixth
    argument is num_kv_groups, not qkv_bias).
    """
    if got == want:
        return None
    if sorted(got) == sorted(want):
        return ("the right parameters, created in another order: create the layers in the order the exercise "
                "gives, so that the course's seed gives them the same values as ours")
    d_out = build[1]
    if len(got) < len(want) and got == want[:len(got)] and want[len(got):] == [(d_out, d_out), (d_out,)]:
        return ("out_proj is missing: after merging the heads the module applies self.out_proj = nn.Linear(d_out, "
                "d_out), created after the query, key and value projections")
    matrices = [s for s in got if len(s) != 1] == [s for s in want if len(s) != 1]
    if matrices and len(got) != len(want):
        owners = _bias_owners(got, want)  # which matrices' biases are missing (or too many), read from the shapes
        matrices = sum(len(s) != 1 for s in want)
        last = matrices - 1 if matrices % 3 == 1 else None  # out_proj, after each head's query, key and value (none
        # in MultiHeadAttentionWrapper, whose 3 * num_heads matrices are the heads' own)
        if len(got) < len(want) and owners == {last}:
            return (f"out_proj's bias is missing (the last shape, {want[-1]}): only the query, key and value "
                    f"projections follow qkv_bias; out_proj keeps nn.Linear's default bias, nn.Linear(d_out, d_out) "
                    f"without bias=qkv_bias")
        if len(got) < len(want) and owners and last not in owners:
            return ("a bias is missing: with qkv_bias=True the query, key and value projections have biases: pass "
                    "bias=qkv_bias to their nn.Linear")
        if len(got) > len(want) and owners and last not in owners:
            return ("a bias too many: with qkv_bias=False the query, key and value projections have no bias: pass "
                    "bias=qkv_bias to their nn.Linear")
    return None


def _bias_owners(got: list[tuple[int, ...]], want: list[tuple[int, ...]]) -> set[int] | None:
    """The matrices (numbered in order) whose bias one list has and the other lacks, where the two lists differ
    only by biases (1-D shapes, each right after its matrix); ``None`` otherwise."""
    longer, shorter = (want, got) if len(want) > len(got) else (got, want)
    owners, j, matrix = set(), 0, -1
    for shape in longer:
        if len(shape) != 1:
            matrix += 1
        if j < len(shorter) and shorter[j] == shape:
            j += 1
        elif len(shape) == 1 and matrix >= 0:
            owners.add(matrix)
        else:
            return None
    return owners if j == len(shorter) and owners else None


# ------------------------------------------------------------------------------------------
# One mistake, one exercise: the other exercises of the notebook an answer builds on
# ------------------------------------------------------------------------------------------
def _functions_of(obj: object) -> list:
    """The Python functions that make up ``obj``: itself, or a class's own methods and properties."""
    import inspect

    if inspect.isfunction(obj):
        return [obj]
    if not isinstance(obj, type):
        return []
    found = []
    for klass in obj.__mro__:
        if klass is object or str(klass.__module__).startswith("torch"):
            continue
        for value in vars(klass).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                value = value.fget
            if inspect.isfunction(value):
                found.append(value)
    return found


def _names_in(code) -> set[str]:
    """Every global name a code object and the code nested in it (comprehensions, lambdas) looks up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names_in(const)
    return names


def helpers_used(obj: object, names: Sequence[str]) -> list[tuple[dict, str]]:
    """Which of ``names`` the code of ``obj`` looks up as globals, and in which namespace (the notebook's):
    ``[(namespace, name), ...]``."""
    import inspect

    used: dict[tuple[int, str], tuple[dict, str]] = {}
    todo, seen = list(_functions_of(obj)), set()
    while todo:
        function = todo.pop()
        if id(function) in seen or len(seen) > 50:
            continue
        seen.add(id(function))
        namespace = function.__globals__
        found = _names_in(function.__code__)
        for name in found & set(names):
            if name in namespace:
                used[(id(namespace), name)] = (namespace, name)
        # a helper function of the student's own that the code calls (make_block() -> TransformerBlock(...))
        todo += [namespace[n] for n in found - set(names)
                 if inspect.isfunction(namespace.get(n)) and namespace[n].__globals__ is namespace]
    return list(used.values())


def check_alone(exercise: str, obj: object, helpers: dict[str, Callable], run: Callable[[], None]) -> None:
    """Run ``run()``, the checks of ``obj``, so that a mistake in another exercise of the same notebook
    that ``obj`` builds on (``helpers``: its name -> its check) costs ``obj`` nothing.

    Instructor edition (and so the grader): the helpers ``obj``'s code looks up by name are replaced by
    the reference's while ``run()`` runs, then put back, so that the student's own versions stay in
    use everywhere else in the notebook. If ``obj`` fails with the reference's helpers, it is tried
    once more with the student's own (an answer may rely on its own helper's attributes); it fails
    only when it fails both ways, with the first message.

    Student edition (no reference code): ``run()`` uses the student's helpers; when it fails, each
    helper is put through its own check, quietly, and a helper that fails is named first.
    """
    if _probe.active(exercise):
        # Under the grader this call is the first try, handed out (the check hands out the second
        # itself). It needs the reference's helpers: a kernel with the student edition has none, so it
        # hands out no first try at all (whether or not the answer calls a helper: the grader knows which
        # kernel it ran, and reads the hand-off accordingly), and the grader makes that try in a kernel of
        # its own, which sees only these helpers' answers (grader/reference_subset.py; docs/design.md,
        # "Threat model").
        ours = _reference_helpers(list(helpers))
        if ours is None:
            return
        used = helpers_used(obj, list(helpers))
        saved = [(namespace, name, namespace[name]) for namespace, name in used]
        try:
            for namespace, name, _ in saved:
                namespace[name] = ours[name]
            run()
        finally:
            for namespace, name, value in reversed(saved):
                namespace[name] = value
        return
    used = helpers_used(obj, list(helpers))
    if not used or _expected.mode() == _expected.RECORDED:
        try:
            run()
        except CheckFailed as error:
            broken = [] if NOT_IMPLEMENTED in str(error) else _broken_helpers(used, helpers)
            if not broken:
                raise
            what = " and ".join(broken)
            them = "them" if len(broken) > 1 else "it"
            raise type(error)(
                f"❌ {exercise}: your {exercise} uses your {what}, which {'do' if len(broken) > 1 else 'does'} not pass "
                f"{'their' if len(broken) > 1 else 'its'} own check yet: fix {them} first (the check cell of {what} "
                f"says what is wrong). The grader checks {exercise} with correct versions of the notebook's other "
                f"exercises, so a mistake there costs {exercise} no points. With your {what}, this check found: "
                f"{str(error).removeprefix('❌ ')}") from None
        return
    saved = [(namespace, name, namespace[name]) for namespace, name in used]
    try:
        for namespace, name, _ in saved:
            namespace[name] = _expected.reference(name)
        run()
        return
    except CheckFailed as error:
        first = error
    finally:
        for namespace, name, value in reversed(saved):
            namespace[name] = value
    import contextlib
    import io

    try:
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            run()
    except Exception:  # noqa: BLE001 - the verdict with the reference's helpers stands
        raise first from None
    print(printed.getvalue(), end="")


def helper_checks(checks: dict, exercise: str) -> dict[str, Callable]:
    """The helpers of ``exercise`` -> their checks, from a checks module's namespace ``checks`` (its
    ``globals()``): its ``HELPERS[exercise]`` (the other exercises of the notebook the answer may call,
    by the names the notebook gives them), each checked by its ``check_<name>``."""
    return {name: checks[f"check_{name}"] for name in checks["HELPERS"][exercise]}


def alone(exercise: str, obj: object, helpers: dict[str, Callable], run: Callable[[], None],
          hand_out: Callable[[], None] | None = None) -> None:
    """:func:`check_alone` wherever the check runs: the one way an exercise that calls the notebook's
    other exercises (``helpers``: their names -> their checks) is checked, so that a mistake in one of
    them costs ``obj`` nothing.

    - In a kernel under the grader (``probe.active``): ``hand_out()`` (what the kernel's part of the
      check hands out; default ``run``) twice, its records marked as the first try (the reference's
      helpers swapped in, made only by a kernel that has them: :func:`check_alone`) and the second (the
      student's own), ``probe.trying``.
    - In the grader's replay (``obj`` is a ``probe.Replayed``): ``run()`` on the tries the kernel handed
      out, with :func:`check_alone`'s verdict (:func:`replayed_tries`).
    - Anywhere else (JupyterLab, Colab, nbval, the instructor's runs): :func:`check_alone`; in the
      student edition a failure that a helper of the student's explains names that helper.
    """
    if _probe.active(exercise):
        with _probe.trying(1):
            check_alone(exercise, obj, helpers, hand_out or run)
        with _probe.trying(2):
            (hand_out or run)()
        return
    if isinstance(obj, _probe.Replayed):
        replayed_tries(obj, run)
        return
    check_alone(exercise, obj, helpers, run)


def two_tries(run: Callable[[], None], to_second: Callable[[], None],
              after_first_passed: Callable[[], None] = lambda: None) -> None:
    """:func:`check_alone`'s verdict, judged outside: ``run()`` on the first try (the student's code
    with our helpers); only if that fails, ``to_second()`` and ``run()`` again, quietly, on the second
    (with the student's own helpers). It fails only when both fail, with the first message."""
    import contextlib
    import io

    try:
        run()
    except CheckFailed as error:
        first = error
    else:
        after_first_passed()
        return
    to_second()
    try:
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            run()
    except Exception:  # noqa: BLE001 - the verdict with our helpers stands
        raise first from None
    print(printed.getvalue(), end="")


def replayed_tries(replay: object, run: Callable[[], None]) -> None:
    """:func:`two_tries` on what the kernel handed out for an exercise (the grader's ``HandedOut``), whose
    records the kernel marked with their try (``probe.trying``, ``probe.ATTEMPTS``). It reads the first try's
    run of records from where it stands, then, where the verdict needs it, the second try's run that follows;
    either way it moves past both, so that a test cell's next check call starts at its own records. A run of
    records ends where the mark changes, and it never reads past its run.

    From a kernel that made no first tries (the student edition's: ``probe.first_tries_handed_out``), its
    records are the second tries alone, and that verdict stands (the grader may make the first try in a
    kernel of its own: ``grader.judge.JudgeOutside.first_tries``)."""
    if not _probe.first_tries_handed_out():  # a student-edition kernel made the second try alone
        run()
        return
    records: list = replay.records  # type: ignore[attr-defined]
    start = replay.used  # type: ignore[attr-defined]

    def end_of(attempt: int, begin: int) -> int:
        end = begin
        while end < len(records) and isinstance(records[end], dict) and records[end].get("attempt") == attempt:
            end += 1
        return end

    first_end = end_of(1, start)
    second_end = end_of(2, first_end)

    def read(begin: int, end: int) -> None:  # the replay sees this try's records, and no further
        replay.records, replay.used = records[:end], begin  # type: ignore[attr-defined]

    def done() -> None:
        replay.records, replay.used = records, second_end  # type: ignore[attr-defined]

    read(start, first_end)
    try:
        two_tries(run, lambda: read(first_end, second_end), done)
    except BaseException:
        replay.records = records  # type: ignore[attr-defined]
        raise
    done()


def _reference_helpers(names: Sequence[str]) -> dict[str, object] | None:
    """The reference's versions of ``names`` where this kernel has them (the instructor edition, or the
    cut-down reference the grader shows a kernel that makes ``check_alone``'s first try); else ``None``."""
    import importlib

    try:
        module = importlib.import_module("course_utils.reference")
        return {name: getattr(module, name) for name in names}
    except (ImportError, AttributeError):
        return None


def _broken_helpers(used: list[tuple[dict, str]], helpers: dict[str, Callable]) -> list[str]:
    """The helpers (by name) whose own check fails on the student's version, run quietly."""
    import contextlib
    import io

    broken = []
    for namespace, name in used:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                helpers[name](namespace[name])
        except Exception:  # noqa: BLE001 - any failure of its own check
            broken.append(name)
    return broken


