"""What a solution may not do: found by reading its source, and (under the grader) in what it ran.

Used twice: by the self-checks (so a student learns before submitting) and by the grader (so a
rule broken in a submission costs that exercise its points, with the reason in the report).

Three parts:

- each exercise's :class:`Rule` (:data:`RULES`): library functions it may not call, read from the source;
- the same rules on what ran: :data:`ATEN_OPS` maps each forbidden name to the ATen operations it
  dispatches, which the grading kernel records while the student's code runs
  (``course_utils.checks.probe``) and the grader refuses (:func:`op_violations`), so a name built at run
  time (``getattr(x, "soft" + "max")``) or a function swapped in through ``sys.modules`` is caught where it runs;
- the policy for every answer cell (:func:`policy_violations`): the machinery no exercise needs
  (computed names on modules, ``sys.modules``, ``exec``, frames, ``gc``, dunders...), which is how a
  student reaches past the rules and into the grader. The grader applies it to each submitted answer
  cell, outside the kernel (``grader/autograde.py``'s ``check_rules``); notebook 01 announces it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass, field
from typing import Iterable


@dataclass(frozen=True)
class Rule:
    """Per-exercise restrictions.

    Attributes:
        forbidden_calls: names that may not be called or referenced as attributes
            (``softmax`` catches ``torch.softmax``, ``F.softmax``, ``x.softmax`` and ``nn.Softmax``).
        forbid_matmul_operator: the ``@`` operator is not allowed.
        require_loop: the solution must contain a ``for``/``while`` loop or a comprehension.
        why: one sentence for the student.
        uses: library functions the exercise is meant to call: the ATen operations they run
            (:data:`ATEN_OPS`) are never held against it (``MHAPyTorchSDPA`` hands the softmax to SDPA,
            whose math path runs ``aten._safe_softmax``).
    """

    forbidden_calls: tuple[str, ...] = ()
    forbid_matmul_operator: bool = False
    require_loop: bool = False
    why: str = ""
    uses: tuple[str, ...] = ()


#: Always forbidden in a solution cell: importing the answers or the grader, and rewriting the
#: libraries the tests rely on.
FORBIDDEN_MODULES = ("course_utils.reference", "course_utils.checks", "grader")
PROTECTED_ROOTS = ("builtins", "torch", "course_utils", "checks", "np", "numpy", "F", "nn", "__builtins__")
#: Names the test cells rely on: a solution may import them, never rebind them to something else.
PROTECTED_NAMES = {"checks": "course_utils", "torch": "torch", "course_utils": "course_utils", "builtins": "builtins"}
#: Ways to reach into the kernel or import by name, which no exercise needs.
FORBIDDEN_NAMES = {
    "get_ipython": "reaching into the notebook kernel is not allowed",
    "__import__": "importing by name is not allowed in a solution",
    "importlib": "importing by name is not allowed in a solution",
}

RULES: dict[str, Rule] = {
    "dot": Rule(
        forbidden_calls=("dot", "matmul", "mm", "inner", "vdot", "einsum", "tensordot", "mv"),
        forbid_matmul_operator=True,
        require_loop=True,
        why="`dot` is about the arithmetic itself: multiply and add in a loop, no library dot product.",
    ),
    "softmax_naive": Rule(
        forbidden_calls=("softmax", "log_softmax", "Softmax", "LogSoftmax", "softmin"),
        why="write softmax from exp and sum; a library softmax skips the point of the exercise.",
    ),
    "softmax_stable": Rule(
        forbidden_calls=("softmax", "log_softmax", "Softmax", "LogSoftmax", "softmin"),
        why="write the max-subtraction yourself; a library softmax skips the point of the exercise.",
    ),
    "scaled_dot_product_attention": Rule(
        forbidden_calls=("scaled_dot_product_attention", "MultiheadAttention", "multi_head_attention_forward"),
        why="build attention from matrix products and softmax; the library kernel comes in notebook 06.",
    ),
    **{
        name: Rule(
            forbidden_calls=("scaled_dot_product_attention", "MultiheadAttention", "multi_head_attention_forward",
                             "flex_attention"),
            why="write the mask, softmax and dropout yourself; the fused library kernels come in notebook 06.",
        )
        for name in ("causal_attention_weights", "CausalAttention", "MultiHeadAttentionWrapper", "MultiHeadAttention")
    },
    "MultiHeadAttentionCombinedQKV": Rule(
        forbidden_calls=("scaled_dot_product_attention", "MultiheadAttention", "multi_head_attention_forward",
                         "flex_attention"),
        why="write the attention core yourself here (mask, softmax, dropout); the library kernel is the next exercise.",
    ),
    "MHAPyTorchSDPA": Rule(
        forbidden_calls=("softmax", "MultiheadAttention", "multi_head_attention_forward", "flex_attention"),
        why="hand the attention core to F.scaled_dot_product_attention instead of computing the softmax yourself.",
        uses=("scaled_dot_product_attention",),
    ),
    # Notebook 06: the timer is written by hand, not borrowed from a timing library.
    "time_cuda_aware": Rule(
        forbidden_calls=("time_fn", "checked_time", "Timer", "timeit"),
        why="write the warm-up, synchronisation and median yourself; bench.time_fn is what you are rebuilding.",
    ),
    # Notebook 08: the cache may use SDPA (with the right mask); the grouping is written by hand.
    "MultiHeadAttentionKVCache": Rule(
        forbidden_calls=("MultiheadAttention", "multi_head_attention_forward", "flex_attention"),
        why="extend notebook 05's MultiHeadAttention with the cache yourself.",
    ),
    "GroupedQueryAttention": Rule(
        forbidden_calls=("scaled_dot_product_attention", "MultiheadAttention", "multi_head_attention_forward",
                         "flex_attention"),
        why="share the key/value heads yourself with repeat_kv; SDPA's enable_gqa=True comes right after, to compare.",
    ),
    # Notebook 07: the softmax and attention are streamed block by block by hand.
    "online_softmax": Rule(
        forbidden_calls=("softmax", "log_softmax", "Softmax", "LogSoftmax", "softmin", "logsumexp"),
        require_loop=True,
        why="stream the blocks yourself with a running maximum and sum; a library softmax sees the whole row.",
    ),
    "flash_attention_forward": Rule(
        forbidden_calls=("scaled_dot_product_attention", "softmax", "log_softmax", "logsumexp", "flex_attention",
                         "MultiheadAttention", "multi_head_attention_forward"),
        require_loop=True,
        why="write the tiled loop yourself: running maximum, sum and output, rescaled as each key block arrives.",
    ),
    # Notebook 09: the block and the model are built from the course's own parts, not PyTorch's ready-made layers.
    **{
        name: Rule(
            forbidden_calls=("TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
                             "TransformerDecoder", "MultiheadAttention", "multi_head_attention_forward"),
            why="build it from notebook 08's MultiHeadAttentionKVCache (or your own attention on "
                "F.scaled_dot_product_attention, with a cache), LayerNorm and Linear layers; PyTorch's ready-made "
                "transformer layers skip the point.",
        )
        for name in ("TransformerBlock", "TinyGPT")
    },
}

# Notebook 10: the backward pass is written from its formulas, never taken from autograd.
_NO_AUTOGRAD = ("backward", "grad", "vjp", "jacobian", "autograd", "enable_grad")
RULES.update({
    "attention_backward_reference": Rule(
        forbidden_calls=_NO_AUTOGRAD + ("scaled_dot_product_attention", "flex_attention"),
        why="write dq, dk and dv from the formulas; autograd is what the check compares them with.",
    ),
    "flash_attention_backward": Rule(
        forbidden_calls=_NO_AUTOGRAD + ("scaled_dot_product_attention", "softmax", "log_softmax", "logsumexp",
                                        "flex_attention", "attention_backward_reference"),
        require_loop=True,
        why="write the tiled loops yourself: rebuild each tile of P from q, k and lse, and add up dq, dk and dv "
            "tile by tile.",
    ),
    "FlashAttention": Rule(
        forbidden_calls=("backward", "grad", "vjp", "jacobian", "enable_grad", "scaled_dot_product_attention",
                         "softmax", "log_softmax", "logsumexp", "flex_attention", "attention_backward_reference"),
        why="forward calls flash_attention_forward and backward calls your flash_attention_backward; autograd and "
            "the untiled formulas would keep the (T, T) matrix this exercise removes.",
    ),
})

# Notebook 11: paged attention reads the blocks itself, and shares each key/value head without copying it.
RULES.update({
    "paged_attention": Rule(
        forbidden_calls=("scaled_dot_product_attention", "flex_attention", "MultiheadAttention",
                         "multi_head_attention_forward", "repeat_interleave", "repeat_kv"),
        why="read each sequence's blocks and share every key/value head across its query heads yourself (a view "
            "of the queries as (kv, H // kv, D)); the fused kernels and a copy of the cache per head skip the point.",
    ),
})


# --------------------------------------------------------------------------------------------
# The rules on what ran: each forbidden name -> the ATen operations it dispatches
# --------------------------------------------------------------------------------------------
#: A library softmax, however it is reached: ``torch.softmax``, ``F.softmax``, ``x.softmax``,
#: ``nn.Softmax`` and ``F.softmin`` all dispatch ``aten._softmax``; SDPA's math path (and the private
#: ``torch._safe_softmax``) dispatches ``aten._safe_softmax``. A softmax written from ``exp`` and ``sum``
#: dispatches ``aten.exp``, ``aten.sum`` and ``aten.div``: none of these. (Their gradients are left out: an
#: honest softmax's backward runs ``_softmax_backward_data`` where a check takes gradients.)
_SOFTMAX_OPS = ("aten._softmax", "aten._safe_softmax")
_LOG_SOFTMAX_OPS = ("aten._log_softmax",)
#: The fused attention kernels: SDPA's flash (the CPU one too), memory-efficient, cuDNN and third-party
#: paths; its math path (``aten._safe_softmax``: on the CPU, 3-D inputs, dropout or the meta device take it);
#: ``nn.MultiheadAttention``'s fused path; FlexAttention (a higher-order operator, dispatched as ``flex_attention``).
_SDPA_OPS = ("aten._scaled_dot_product_flash_attention_for_cpu", "aten._scaled_dot_product_flash_attention",
             "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention",
             "aten._scaled_dot_product_fused_attention_overrideable", "aten._flash_attention_forward",
             "aten._efficient_attention_forward", "aten._safe_softmax")
_MHA_OPS = ("aten._native_multi_head_attention",)
#: A library product of two vectors: ``torch.dot``, ``@`` and ``matmul`` on 1-D tensors and ``tensordot``
#: dispatch ``aten.dot``; ``inner``, ``mm``, ``mv``, ``einsum`` (``bmm``) and ``vdot`` their own. A loop of
#: ``x[i] * y[i]`` dispatches ``aten.select``, ``aten.mul`` and ``aten.add``: none of these.
_PRODUCT_OPS = ("aten.dot", "aten.vdot", "aten.mm", "aten.mv", "aten.bmm", "aten.addmm", "aten.addmv",
                "aten.baddbmm", "aten.addbmm")
#: Each forbidden name of :data:`RULES` that has operations of its own, and those operations (an ATen
#: operation's name without its overload: ``aten._softmax``). The one table: a rule's forbidden names say
#: which operations its exercise may not run (:func:`forbidden_ops`). Not every name is here: autograd
#: (``backward``, ``grad``) and the course's own functions run no operation of their own, and
#: ``nn.MultiheadAttention``'s slow path runs the same operations as an honest attention (the static rule
#: and the policy on names built at run time catch those).
ATEN_OPS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("softmax", "Softmax", "softmin"), _SOFTMAX_OPS),
    **dict.fromkeys(("log_softmax", "LogSoftmax"), _LOG_SOFTMAX_OPS),
    "logsumexp": ("aten.logsumexp",),
    "scaled_dot_product_attention": _SDPA_OPS,
    **dict.fromkeys(("MultiheadAttention", "multi_head_attention_forward"), _MHA_OPS),
    "flex_attention": ("flex_attention",),
    **dict.fromkeys(("TransformerEncoderLayer", "TransformerEncoder"),
                    ("aten._transformer_encoder_layer_fwd",) + _MHA_OPS),
    **dict.fromkeys(("TransformerDecoderLayer", "TransformerDecoder"), _MHA_OPS),
    **dict.fromkeys(("dot", "matmul", "mm", "inner", "vdot", "einsum", "tensordot", "mv"), _PRODUCT_OPS),
}
#: Every operation of :data:`ATEN_OPS`: what the grading kernel records of what a student's code ran.
WATCHED_OPS = frozenset(op for ops in ATEN_OPS.values() for op in ops)


@functools.lru_cache(maxsize=None)
def forbidden_ops(exercise: str) -> dict[str, str]:
    """``{operation: forbidden name}``: the ATen operations ``exercise`` may not run (:data:`ATEN_OPS` of its
    rule's forbidden names, less those of the library functions it is meant to use, ``Rule.uses``), each
    with the first forbidden name that stands for it. Empty for an exercise without such a rule."""
    rule = RULES.get(exercise, Rule())
    allowed = {op for name in rule.uses for op in ATEN_OPS.get(name, ())}
    found: dict[str, str] = {}
    for name in rule.forbidden_calls:
        for op in ATEN_OPS.get(name, ()):
            if op not in allowed:
                found.setdefault(op, name)
    return found


def op_violations(exercise: str, ops: Iterable[str]) -> list[Violation]:
    """Every forbidden function whose operations are among ``ops`` (ATen operations the student's code ran,
    by name), as a violation naming the function and the operations it ran."""
    forbidden = forbidden_ops(exercise)
    by_name: dict[str, list[str]] = {}
    for op in sorted(set(ops)):
        if op in forbidden:
            by_name.setdefault(forbidden[op], []).append(op)
    return [Violation(f"your code ran {', '.join(f'`{op}`' for op in found)}, the operation{'s' * (len(found) > 1)} "
                      f"of `{name}`, which this exercise does not allow however it is reached")
            for name, found in by_name.items()]


@dataclass
class Violation:
    """One broken rule, located in the source."""

    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"{self.message}{where}"


@dataclass
class _Finder(ast.NodeVisitor):
    rule: Rule
    found: list[Violation] = field(default_factory=list)
    has_loop: bool = False

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(alias.name, node.lineno)
            self._check_binding(alias.asname or alias.name.split(".")[0], node.lineno, alias.name)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self._check_module(module, node.lineno)
        for alias in node.names:
            self._check_module(f"{module}.{alias.name}", node.lineno)
            self._check_binding(alias.asname or alias.name, node.lineno, module)
        self.generic_visit(node)

    def _check_module(self, name: str, line: int) -> None:
        for bad in FORBIDDEN_MODULES:
            if name == bad or name.startswith(bad + "."):
                self.found.append(Violation(f"imports `{name}`: solutions may not use the answers or the grader", line))
                return
        if name == "importlib" or name.startswith("importlib."):
            self.found.append(Violation(f"imports `{name}`: {FORBIDDEN_NAMES['importlib']}", line))

    def _check_binding(self, name: str | None, line: int, module: str | None = None) -> None:
        """Rebinding a name the tests use (``checks = ...``, ``def checks``, ``import x as torch``)."""
        if name in PROTECTED_NAMES and (module is None or module.split(".")[0] != PROTECTED_NAMES[name]):
            self.found.append(Violation(f"rebinds `{name}`, which the tests rely on", line))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._check_binding(node.name, node.lineno)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef  # type: ignore[assignment]

    def _check_target(self, target: ast.AST, line: int) -> None:
        if isinstance(target, ast.Name):
            self._check_binding(target.id, line)
        elif isinstance(target, ast.Subscript) and ast.unparse(target.value) == "sys.modules":
            self.found.append(Violation("changes `sys.modules`: replacing modules is not allowed", line))
        if isinstance(target, ast.Attribute):
            root = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in PROTECTED_ROOTS:
                self.found.append(
                    Violation(f"assigns to `{ast.unparse(target)}`: changing library functions is not allowed", line)
                )
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._check_target(element, line)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target, node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target, node.lineno)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (isinstance(func, ast.Attribute) and ast.unparse(func.value) == "sys.modules"
                and func.attr in ("update", "pop", "popitem", "setdefault", "clear", "__setitem__", "__delitem__")):
            self.found.append(Violation("changes `sys.modules`: replacing modules is not allowed", node.lineno))
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Name) and first.id in PROTECTED_ROOTS:
                self.found.append(
                    Violation(f"calls `{func.id}` on `{first.id}`: changing library functions is not allowed", node.lineno)
                )
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        if node.attr == "reference" and isinstance(root, ast.Name) and root.id in ("course_utils", "checks"):
            self.found.append(Violation(f"uses `{ast.unparse(node)}`: solutions may not use the answers", node.lineno))
        if node.attr in self.rule.forbidden_calls:
            self.found.append(Violation(f"uses `{ast.unparse(node)}`, which this exercise does not allow", node.lineno))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES and isinstance(node.ctx, ast.Load):
            self.found.append(Violation(f"uses `{node.id}`: {FORBIDDEN_NAMES[node.id]}", node.lineno))
        if node.id in self.rule.forbidden_calls and isinstance(node.ctx, ast.Load):
            self.found.append(Violation(f"uses `{node.id}`, which this exercise does not allow", node.lineno))

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if self.rule.forbid_matmul_operator and isinstance(node.op, ast.MatMult):
            self.found.append(Violation("uses the `@` operator, which this exercise does not allow", node.lineno))
        self.generic_visit(node)

    def _loop(self, node: ast.AST) -> None:
        self.has_loop = True
        self.generic_visit(node)

    visit_For = visit_While = visit_ListComp = visit_GeneratorExp = visit_SetComp = visit_DictComp = _loop


# --------------------------------------------------------------------------------------------
# The policy for every answer cell: machinery that no exercise needs
# --------------------------------------------------------------------------------------------
#: Names that hold a module in the course's notebooks (``import torch.nn.functional as F``...): an attribute
#: of one read by a computed name is flagged (:class:`_Policy`), as is one of any name a cell imports itself.
MODULE_NAMES = frozenset({
    "torch", "F", "nn", "np", "numpy", "math", "sys", "os", "builtins", "course_utils", "checks", "data",
    "plotting", "training", "bench", "flash", "backward", "tasks", "validation", "reference", "importlib", "gc",
    "inspect", "ctypes", "types", "operator", "functools", "IPython", "triton", "tl", "time", "random", "copy",
    "itertools", "pathlib", "io", "subprocess", "shutil", "traceback", "threading", "linecache", "runpy", "site",
})
#: Dunder attributes an answer may read or write (``super().__init__``, ``type(m).__name__``, ``torch.__version__``).
DUNDER_ALLOWED = frozenset({"__init__", "__name__", "__qualname__", "__doc__", "__version__"})
#: Modules no answer may import: they reach frames, memory, every object or the kernel.
POLICY_MODULES = {
    "gc": "the garbage collector reaches every object in memory",
    "ctypes": "ctypes reads and writes memory directly",
    "IPython": "IPython reaches into the notebook kernel (its events, its error handlers)",
}
#: Functions that read the callers' frames, by their last name (``sys._getframe``, ``inspect.stack``...).
FRAME_FUNCTIONS = frozenset({"_getframe", "_current_frames", "settrace", "setprofile", "currentframe", "stack",
                             "getouterframes", "getinnerframes", "trace", "walk_stack", "walk_tb"})
#: Attributes of frames, tracebacks and generators that lead to a frame.
FRAME_ATTRIBUTES = frozenset({"f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "tb_next", "gi_frame",
                              "cr_frame", "ag_frame"})
#: Built-in functions that run code built at run time.
CODE_BUILDERS = frozenset({"exec", "eval", "compile"})
_NAMESPACES = ("globals", "vars", "locals")
_ATTRIBUTE_FUNCTIONS = ("getattr", "setattr", "delattr", "hasattr")


def _root_name(node: ast.AST) -> str | None:
    """The name an expression starts from: ``torch`` for ``torch.nn.functional``, ``sys.modules['x']``,
    ``load('x').y``; ``None`` when it starts from no name."""
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return node.id if isinstance(node, ast.Name) else None


class _Policy(ast.NodeVisitor):
    """The policy's findings in one parsed cell (:func:`policy_violations`)."""

    def __init__(self, tree: ast.AST) -> None:
        self.found: list[Violation] = []
        self.modules = set(MODULE_NAMES)
        self.literal_names: set[str] = set()  # ``for name in ["W_query", "W_key"]``: known without running
        self.called: set[int] = set()  # ids of the Name nodes that are the function of a call
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.modules.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                self.modules.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and \
                    isinstance(node.iter, (ast.List, ast.Tuple)) and \
                    all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.iter.elts):
                self.literal_names.add(node.target.id)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                self.called.add(id(node.func))
        for node in ast.walk(tree):  # a module under another name: ``t = torch``, ``f = torch.nn.functional``
            if isinstance(node, ast.Assign) and self._is_module(node.value):
                self.modules.update(t.id for t in node.targets if isinstance(t, ast.Name))

    def _add(self, message: str, node: ast.AST) -> None:
        self.found.append(Violation(message, getattr(node, "lineno", None)))

    def _is_module(self, node: ast.AST) -> bool:
        return _root_name(node) in self.modules

    def _literal(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or \
            (isinstance(node, ast.Name) and node.id in self.literal_names)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_import(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self._check_import(module, node)
        for alias in node.names:
            if module == "sys" and alias.name == "modules":
                self._add("imports `sys.modules`: replacing or reaching modules is not allowed", node)
            elif alias.name in FRAME_FUNCTIONS and module in ("sys", "inspect", "traceback"):
                self._add(f"imports `{module}.{alias.name}`: reading the callers' frames is not allowed", node)

    def _check_import(self, name: str, node: ast.AST) -> None:
        root = name.split(".")[0]
        if root in POLICY_MODULES:
            self._add(f"imports `{name}`: {POLICY_MODULES[root]}, which no exercise needs", node)
        elif root == "torch" and any(part.startswith("_") for part in name.split(".")[1:]):
            self._add(f"imports `{name}`: torch's private internals are not allowed in a solution", node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if isinstance(func, ast.Name) and name in _ATTRIBUTE_FUNCTIONS and len(node.args) >= 2 and \
                not self._literal(node.args[1]) and self._is_module(node.args[0]):
            self._add(f"uses `{name}` on the module `{ast.unparse(node.args[0])[:60]}` with a name built at run time: "
                      "reach library functions by their written names", node)
        if name in ("attrgetter", "methodcaller") and not all(self._literal(a) for a in node.args):
            self._add(f"uses `{name}` with a name built at run time: reach functions by their written names", node)
        if isinstance(func, ast.Name) and name == "vars" and node.args and self._is_module(node.args[0]):
            self._add(f"uses `vars({ast.unparse(node.args[0])[:60]})`: reading a module as a dict is not allowed", node)
        if isinstance(func, ast.Attribute) and name in FRAME_FUNCTIONS and \
                _root_name(func) in ("sys", "inspect", "traceback") and _root_name(func) in self.modules:
            self._add(f"uses `{ast.unparse(func)[:60]}`: reading the callers' frames is not allowed", node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and \
                node.value.func.id in _NAMESPACES:
            self._add(f"uses `{node.value.func.id}()[...]`: reading or changing a namespace as a dict is not allowed", node)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        value = node.value
        if node.attr == "modules" and isinstance(value, ast.Name) and value.id == "sys":
            self._add("uses `sys.modules`: replacing or reaching modules through it is not allowed", node)
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _NAMESPACES:
            self._add(f"uses `{value.func.id}().{node.attr}`: reading or changing a namespace as a dict is not allowed",
                      node)
        if node.attr.startswith("__") and node.attr.endswith("__") and node.attr not in DUNDER_ALLOWED:
            self._add(f"uses `{node.attr}`: dunder attributes other than {', '.join(sorted(DUNDER_ALLOWED))} are not "
                      "allowed in a solution", node)
        elif node.attr.startswith("_") and not node.attr.startswith("__") and _root_name(node) in ("torch", "F", "nn") \
                and _root_name(node) in self.modules:
            self._add(f"uses `{ast.unparse(node)[:60]}`: torch's private internals are not allowed in a solution", node)
        if node.attr in FRAME_ATTRIBUTES:
            self._add(f"uses `{node.attr}`: reading frames is not allowed", node)
        if node.attr == "set_custom_exc" or (node.attr in ("register", "unregister", "callbacks")
                                              and isinstance(value, ast.Attribute) and value.attr == "events"):
            self._add(f"uses `{ast.unparse(node)[:60]}`: IPython's events and error handlers are not for solutions", node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        if node.id in CODE_BUILDERS:
            self._add(f"uses `{node.id}`: running code built at run time is not allowed in a solution", node)
        elif node.id in _ATTRIBUTE_FUNCTIONS + ("globals", "locals") and id(node) not in self.called:
            self._add(f"uses `{node.id}` passed around as a value: call it directly, with a written name", node)
        elif node.id.startswith("__") and node.id.endswith("__") and node.id not in ("__name__", "__doc__") \
                and node.id not in FORBIDDEN_NAMES:
            self._add(f"uses `{node.id}`: dunder names are not allowed in a solution", node)


def policy_violations(source: str) -> list[Violation]:
    """What ``source`` (an answer cell, or a function's code) uses of the machinery no exercise needs:
    an attribute of a module by a computed name (``getattr(torch, "soft" + "max")``), ``sys.modules``,
    ``globals()[...]`` / ``vars()`` / ``locals()``, ``exec`` / ``eval`` / ``compile``, frames
    (``sys._getframe``, ``inspect.stack``, ``f_back``...), ``gc``, ``ctypes``, dunder attributes beyond
    :data:`DUNDER_ALLOWED`, torch's private internals, IPython's events and ``set_custom_exc``
    (``__import__``, ``importlib`` and ``get_ipython``: :data:`FORBIDDEN_NAMES`, in every rule check)."""
    return [Violation(message, line) for message, line in _policy(source)]


@functools.lru_cache(maxsize=512)
def _policy(source: str) -> tuple[tuple[str, int | None], ...]:
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return ()  # find_violations says so
    finder = _Policy(tree)
    finder.visit(tree)
    return tuple(dict.fromkeys((v.message, v.line) for v in finder.found))


def find_violations(source: str, exercise: str | None = None) -> list[Violation]:
    """Every rule that ``source`` (a cell or a function's code) breaks.

    The general rules (no importing the answers, no rewriting ``torch`` or ``builtins``) always
    apply; ``exercise`` adds that exercise's own rules from :data:`RULES`. (The policy on machinery,
    :func:`policy_violations`, is the grader's, applied to each answer cell as a whole.)
    """
    return [Violation(message, line) for message, line in _violations(source, exercise or "")]


@functools.lru_cache(maxsize=512)
def _violations(source: str, exercise: str) -> tuple[tuple[str, int | None], ...]:
    """:func:`find_violations` as ``(message, line)`` pairs, parsed once per source and exercise: a
    check asks about the same function several times (every test cell, every case of a probe)."""
    rule = RULES.get(exercise, Rule())
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError as exc:
        return ((f"the code does not parse: {exc.msg}", exc.lineno),)
    finder = _Finder(rule)
    finder.visit(tree)
    if rule.require_loop and not finder.has_loop:
        finder.found.append(Violation("no loop found: this exercise asks for an explicit `for` loop"))
    return tuple((v.message, v.line) for v in finder.found)


def source_of(obj: object) -> str | None:
    """Best-effort source of a function or class, including one defined in a notebook cell.

    For a class, the source of each method is joined: ``inspect.getsource`` of a class defined in
    a notebook fails on Python < 3.13, but its methods' code objects still point at the cell.
    An object whose class carries a source as ``__course_source__`` (the grader's replay of a
    student's function, ``grader/judge.py``) gives that.
    """
    given = getattr(type(obj), "__course_source__", None)
    if isinstance(given, str):
        return given
    try:
        return _getsource(obj)
    except (OSError, TypeError):
        pass
    if isinstance(obj, type):
        parts = []
        for value in vars(obj).values():
            func = getattr(value, "__func__", value)
            if inspect.isfunction(func):
                try:
                    parts.append(textwrap.dedent(_getsource(func)))
                except (OSError, TypeError):
                    continue
        return "\n".join(parts) if parts else None
    return None


#: What reading the source of each function's code object, and of each class, gave so far (``id(key) -> (key,
#: source or the error it raised)``; the key is kept, so its id is not reused while it is here).
_SOURCES: dict[int, tuple[object, str | OSError | TypeError]] = {}


def _getsource(obj: object) -> str:
    """``inspect.getsource(obj)``, remembered per code object for functions and per class object for classes,
    failures included: a code object's text does not change (a notebook cell that is run again makes new
    code objects, and new classes), and reading it (the cell's lines, then tokenising them to find the
    function's end; for a class, parsing its whole file to find it) is most of what a rules check costs."""
    target = inspect.unwrap(obj) if callable(obj) else obj  # as inspect.getsource reads it
    key = target.__code__ if inspect.isfunction(target) else target if isinstance(target, type) else None
    if key is None:
        return inspect.getsource(obj)  # type: ignore[arg-type]
    known = _SOURCES.get(id(key))
    if known is None or known[0] is not key:
        try:
            found: str | OSError | TypeError = inspect.getsource(obj)  # type: ignore[arg-type]
        except (OSError, TypeError) as exc:
            found = exc
        if len(_SOURCES) >= 4096:
            _SOURCES.clear()
        _SOURCES[id(key)] = known = (key, found)
    if isinstance(known[1], str):
        return known[1]
    raise type(known[1])(*known[1].args)


def violations_of(obj: object, exercise: str) -> list[Violation]:
    """:func:`find_violations` on the source of a student's function or class (empty if unknown)."""
    source = source_of(obj)
    return find_violations(source, exercise) if source else []
