"""The rules on what ran (issue 35): each forbidden name maps to the ATen operations it dispatches, which the
grading kernel records (``probe.OpRecorder``) and the grader refuses (``rules.op_violations``); honest
alternatives (a softmax from exp and sum, a loop of products, ``@`` and einsum where allowed) run none of them.
And the policy on machinery no exercise needs (``rules.policy_violations``), which every solution passes."""

from __future__ import annotations

import nbformat
import pytest
import torch
import torch.nn.functional as F

from course_utils import rules
from course_utils.checks import probe
from grader import course
from tests.fixtures import answers

torch.manual_seed(0)
X, Y, Z = torch.randn(3, 5), torch.randn(5), torch.randn(5)
Q = torch.randn(2, 2, 6, 4)


def _ran(fn) -> set[str]:
    """The operations of ``rules.WATCHED_OPS`` that ``fn()`` dispatched, by name."""
    seen: set = set()
    with probe.OpRecorder(seen):
        fn()
    return {probe.op_name(f) for f in seen} & rules.WATCHED_OPS


def _refused(exercise: str, fn) -> list[str]:
    return [str(v) for v in rules.op_violations(exercise, _ran(fn))]


#: exercise -> a library function reached however, that its rule forbids: each is refused on what ran.
FORBIDDEN = {
    "softmax by a name built at run time": ("softmax_stable", lambda: getattr(torch, "soft" + "max")(X, -1)),
    "softmax of a tensor by a name built at run time": ("softmax_stable", lambda: getattr(X, "soft" + "max")(-1)),
    "nn.Softmax": ("softmax_naive", lambda: torch.nn.Softmax(dim=-1)(X)),
    "softmin": ("softmax_naive", lambda: -F.softmin(X, -1)),
    "softmax in float64": ("softmax_stable", lambda: F.softmax(X, -1, dtype=torch.float64)),
    "the private safe softmax": ("softmax_stable", lambda: torch._safe_softmax(X, -1)),
    "log_softmax": ("softmax_stable", lambda: F.log_softmax(X, -1).exp()),
    "logsumexp": ("online_softmax", lambda: (X - torch.logsumexp(X, -1, keepdim=True)).exp()),
    "torch.dot": ("dot", lambda: torch.dot(Y, Z)),
    "@ on vectors": ("dot", lambda: Y @ Z),
    "matmul by a name built at run time": ("dot", lambda: getattr(Y, "mat" + "mul")(Z)),
    "__matmul__": ("dot", lambda: Y.__matmul__(Z)),
    "inner": ("dot", lambda: torch.inner(Y, Z)),
    "vdot": ("dot", lambda: torch.vdot(Y, Z)),
    "einsum": ("dot", lambda: torch.einsum("i,i->", Y, Z)),
    "tensordot": ("dot", lambda: torch.tensordot(Y, Z, dims=1)),
    "SDPA, fused CPU flash kernel": ("scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(Q, Q, Q)),
    "SDPA's CPU flash kernel called directly": (
        "causal_attention_weights", lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(Q, Q, Q)),
    "SDPA's math path (3-D inputs)": ("CausalAttention", lambda: F.scaled_dot_product_attention(Q[0], Q[0], Q[0])),
    "SDPA's math path (dropout)": ("MultiHeadAttention", lambda: F.scaled_dot_product_attention(Q, Q, Q, dropout_p=0.5)),
    "SDPA on the meta device": ("flash_attention_forward", lambda: F.scaled_dot_product_attention(*[Q.to("meta")] * 3)),
    "nn.TransformerEncoderLayer's fused path": (
        "TransformerBlock", lambda: torch.nn.TransformerEncoderLayer(4, 2, 8, batch_first=True).eval()(Q[0])),
}


@pytest.mark.parametrize("exercise, fn", FORBIDDEN.values(), ids=FORBIDDEN.keys())
def test_a_forbidden_function_is_refused_on_what_it_ran(exercise, fn):
    with torch.no_grad():
        found = _refused(exercise, fn)
    assert found and "which this exercise does not allow" in found[0], found


def test_flex_attention_runs_under_the_recorder_and_is_refused():
    """FlexAttention's eager path runs torch.compile underneath: the recorder (an infrastructure mode that
    handles higher-order operators) lets it run, and sees it."""
    from torch.nn.attention.flex_attention import flex_attention

    seen: set = set()
    with probe.OpRecorder(seen):
        out = flex_attention(Q, Q, Q)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(Q, Q, Q))
    assert "flex_attention" in {probe.op_name(f) for f in seen}
    assert rules.op_violations("CausalAttention", ["flex_attention"])


def _softmax_by_hand():
    e = torch.exp(X - X.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def _dot_by_loop():
    total = torch.zeros(())
    for i in range(Y.shape[0]):
        total = total + Y[i] * Z[i]
    return total


#: exercise -> honest code: nothing it runs is refused.
HONEST = {
    "softmax from exp and sum": ("softmax_stable", _softmax_by_hand),
    "a loop of products": ("dot", _dot_by_loop),
    "products summed": ("dot", lambda: (Y * Z).sum()),
    "@ where it is allowed": ("attention_scores", lambda: X @ X.T),
    "einsum where it is allowed": ("causal_attention_weights",
                                   lambda: torch.softmax(torch.einsum("id,jd->ij", X, X), -1)),
    "a library softmax where it is allowed": ("causal_attention_weights", lambda: torch.softmax(X @ X.T, -1)),
    "SDPA where it is the point (fused)": ("MHAPyTorchSDPA", lambda: F.scaled_dot_product_attention(Q, Q, Q)),
    "SDPA where it is the point (math path)": (
        "MHAPyTorchSDPA", lambda: F.scaled_dot_product_attention(Q, Q, Q, dropout_p=0.5)),
    "a softmax's gradient where softmax is allowed": (
        "CausalAttention", lambda: torch.softmax(X.clone().requires_grad_(), -1).sum().backward()),
}


@pytest.mark.parametrize("exercise, fn", HONEST.values(), ids=HONEST.keys())
def test_honest_code_runs_nothing_its_rule_forbids(exercise, fn):
    assert _refused(exercise, fn) == []


def test_the_einsum_and_the_matmul_operator_dispatch_the_products_a_loop_does_not():
    """What the table rests on: ``@`` and einsum become ``mm``/``bmm``/``dot``, F.softmax becomes
    ``_softmax``; a loop of products and a softmax from exp and sum become none of them."""
    A, B = torch.randn(2, 4, 3), torch.randn(2, 3, 4)
    assert _ran(lambda: A @ B) == {"aten.bmm"} and _ran(lambda: X @ X.T) == {"aten.mm"}
    assert _ran(lambda: torch.einsum("bij,bjk->bik", A, B)) == {"aten.bmm"}
    assert _ran(lambda: F.softmax(X, -1)) == {"aten._softmax"}
    assert _ran(_dot_by_loop) == set() and _ran(_softmax_by_hand) == set()


def test_every_forbidden_operation_belongs_to_a_forbidden_name():
    """One table: an exercise's forbidden operations come from its rule's forbidden names, less those of the
    functions it is meant to use."""
    for exercise, rule in rules.RULES.items():
        for op, name in rules.forbidden_ops(exercise).items():
            assert name in rule.forbidden_calls and op in rules.ATEN_OPS[name], (exercise, op, name)
    assert "aten._safe_softmax" not in rules.forbidden_ops("MHAPyTorchSDPA")
    assert "aten._softmax" in rules.forbidden_ops("MHAPyTorchSDPA")
    assert rules.forbidden_ops("time_cuda_aware") == {} and rules.forbidden_ops("no such exercise") == {}


# --------------------------------------------------------------------------------------------
# The policy on machinery no exercise needs
# --------------------------------------------------------------------------------------------
POLICY = {
    "getattr on torch by a computed name": ('def f(x, dim):\n    return getattr(torch, "soft" + "max")(x, dim)',
                                            "name built at run time"),
    "getattr on F": ("def f(q):\n    name = 'scaled_dot_product_' + 'attention'\n    return getattr(F, name)(q, q, q)",
                     "name built at run time"),
    "getattr on a module under another name": ("t = torch\ndef f(x):\n    return getattr(t, 'soft' + 'max')(x, -1)",
                                               "name built at run time"),
    "getattr on an imported module": ("import torch.nn.functional as fn\nfun = getattr(fn, 'soft' + 'max')",
                                      "name built at run time"),
    "getattr passed around": ("g = getattr\nsm = g(torch, 'soft' + 'max')", "passed around"),
    "attrgetter": ("import operator\nsm = operator.attrgetter('soft' + 'max')(torch)", "attrgetter"),
    "sys.modules": ("import sys\n_probe = sys.modules['course_utils.checks.' + 'probe']", "sys.modules"),
    "from sys import modules": ("from sys import modules\nm = modules['torch']", "sys.modules"),
    "globals()[...]": ("globals()['checks'] = None", "globals()[...]"),
    "vars()[...]": ("vars()['checks'] = None", "vars()[...]"),
    "locals().update": ("locals().update(checks=None)", "locals().update"),
    "vars of a module": ("sm = vars(torch)['soft' + 'max']", "vars(torch)"),
    "exec": ("exec('import os')", "exec"),
    "eval": ("f = eval('lambda x: x')", "eval"),
    "compile": ("code = compile('x = 1', 'c', 'exec')", "compile"),
    "__import__": ("m = __import__('course_utils.' + 'reference')", "__import__"),
    "importlib": ("import importlib\nref = importlib.import_module('course_utils.reference')", "importlib"),
    "sys._getframe": ("import sys\ndef f():\n    return sys._getframe(1)", "frames"),
    "inspect.stack": ("import inspect\nwant = inspect.stack()[1]", "frames"),
    "f_back": ("def f(frame):\n    return frame.f_back", "frames"),
    "tb_frame": ("def f(e):\n    return e.__traceback__.tb_frame", "frames"),
    "gc": ("import gc\nobjs = gc.get_objects()", "garbage collector"),
    "ctypes": ("import ctypes", "ctypes"),
    "a dunder beyond the allowlist": ("def dot(x, y):\n    return x.__matmul__(y)", "dunder"),
    "__dict__": ("sm = torch.__dict__['soft' + 'max']", "dunder"),
    "__builtins__": ("__builtins__.len = None", "dunder"),
    "torch's private internals": ("def f(q):\n    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q)",
                                  "private internals"),
    "torch's dispatch internals imported": ("from torch.utils._python_dispatch import _pop_mode", "private internals"),
    "IPython's events": ("get_ipython().events.register('post_run_cell', print)", "IPython's events"),
    "set_custom_exc": ("ip.set_custom_exc((AssertionError,), print)", "IPython's events"),
    "IPython imported": ("from IPython import get_ipython as g", "IPython"),
}


@pytest.mark.parametrize("source, words", POLICY.values(), ids=POLICY.keys())
def test_the_policy_names_each_piece_of_machinery(source, words):
    found = [str(v) for v in rules.find_violations(source) + rules.policy_violations(source)]  # what the grader reads
    assert any(words in f for f in found), found


POLICY_HONEST = {
    "getattr on an instance": "def f(x):\n    return getattr(x, 'soft' + 'max')(-1)",
    "getattr over a literal list": ("def copy(a, b):\n    for name in ['W_query', 'W_key']:\n"
                                    "        getattr(b, name).data.copy_(getattr(a, name).weight.T)"),
    "getattr with a written name": "def f(m):\n    return getattr(torch, 'float64')",
    "super().__init__ and type(...).__name__": ("class A(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                                               "        self.name = type(self).__name__ + torch.__version__"),
    "a compiled module": "fast = torch.compile(model)",
    "a tensor's own underscore method": "def f(x):\n    return x.clone().add_(1)",
}


@pytest.mark.parametrize("source", POLICY_HONEST.values(), ids=POLICY_HONEST.keys())
def test_the_policy_leaves_honest_code_alone(source):
    assert rules.policy_violations(source) == []


def _solution_answer_cells():
    for notebook in course.available_notebooks():
        nb = nbformat.read(course.solutions_dir() / f"{notebook}.ipynb", as_version=4)
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.cell_type == "code" and meta.get("solution"):
                yield pytest.param(cell.source, id=f"{notebook[:2]}-{meta.get('grade_id')}")


@pytest.mark.parametrize("source", list(_solution_answer_cells()))
def test_every_solution_passes_the_policy(source):
    assert rules.policy_violations(source) == []


def _right_fixtures():
    for notebook in course.available_notebooks():
        module = answers.load(notebook)
        for exercise, right in (getattr(module, "RIGHT", {}) if module else {}).items():
            for label, source in right.items():
                yield pytest.param(exercise, source, id=f"{notebook[:2]}-{exercise}-{label}"[:120])


@pytest.mark.parametrize("exercise, source", list(_right_fixtures()))
def test_every_right_fixture_passes_the_rules_and_the_policy(exercise, source):
    assert rules.find_violations(source, exercise) == [] and rules.policy_violations(source) == []


# --------------------------------------------------------------------------------------------
# The hand-off carries what ran as plain data, and the judge refuses a forbidden operation
# --------------------------------------------------------------------------------------------
_LOOP_DOT = ("def dot(x, y):\n    total = torch.zeros((), dtype=x.dtype)\n    for i in range(x.shape[0]):\n"
             "        total = total + x[i] * y[i]\n    return total\n")
_RUNTIME_DOT = "def dot(x, y):\n    for _ in range(1):\n        total = getattr(x, 'mat' + 'mul')(y)\n    return total\n"


@pytest.mark.parametrize("source, ran, verdict", [
    (_LOOP_DOT, [], None),
    (_RUNTIME_DOT, ["aten.dot"], "your code ran `aten.dot`, the operation of `dot`"),
], ids=["a loop", "matmul by a name built at run time"])
def test_the_kernel_hands_out_what_ran_and_the_judge_refuses_a_forbidden_operation(source, ran, verdict, monkeypatch):
    from grader import judge
    from tests.grader_answers.test_judge import _handed_out

    handoff, _ = _handed_out("01_dot_products", "dot", source, monkeypatch)
    try:
        records, sources, ops = judge.load_handed_out(handoff.outputs, "test_dot")
        assert ops == {"dot": ran}, ops
        got = judge.judge_handed_out(handoff.outputs, "01_dot_products", "test_dot", {"dot": source})
    finally:
        handoff.remove()
    assert (got.ename, got.evalue.split(", which")[0]) == \
        ((None, "") if verdict is None else ("CheckFailed", f"❌ dot: {verdict}")), got


def test_a_source_that_breaks_a_rule_as_written_is_told_so_first():
    """The replayed check says what the kernel's check said (the name in the source); the operations it ran
    decide only where the source reads clean."""
    from grader import judge

    ops = {"dot": ["aten.dot"]}
    assert judge.forbidden_ran(["dot"], ops, {"dot": "def dot(x, y):\n    return torch.dot(x, y)\n"}) is None
    refused = judge.forbidden_ran(["dot"], ops, {"dot": _RUNTIME_DOT})
    assert refused is not None and refused.ename == "CheckFailed" and "`aten.dot`" in refused.evalue
    assert judge.forbidden_ran(["dot"], {"dot": ["aten.mul", "aten.add"]}, {"dot": _LOOP_DOT}) is None
    assert judge.forbidden_ran(["attention_scores"], {"attention_scores": ["aten.bmm"]}, {}) is None


@pytest.mark.parametrize("ops", [
    "aten._softmax", {"softmax_stable": "aten._softmax"}, {"softmax stable": ["aten._softmax"]},
    {"softmax_stable": [1]}, {"softmax_stable": ["x" * 101]}, {"softmax_stable": ["aten.mul"] * (probe.MAX_OPS + 1)},
], ids=["not a mapping", "not a list", "not a name", "not text", "too long", "too many"])
def test_malformed_operations_in_a_hand_off_are_refused(ops, tmp_path):
    from grader import judge

    probe.write_hand_off({"format": probe.FORMAT, "test": "test_softmax_stable", "records": [], "sources": {},
                          "ops": ops}, probe.hand_off_path(tmp_path, "test_softmax_stable"))
    with pytest.raises(judge.BadHandOff, match="operations handed out"):
        judge.load_handed_out(tmp_path, "test_softmax_stable")
