"""What a solution may not do, found by reading its source (never by running it).

Used twice: by the self-checks (so a student learns before submitting) and by the grader (so a
rule broken in a submission costs that exercise its points, with the reason in the report).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rule:
    """Per-exercise restrictions.

    Attributes:
        forbidden_calls: names that may not be called or referenced as attributes
            (``softmax`` catches ``torch.softmax``, ``F.softmax``, ``x.softmax`` and ``nn.Softmax``).
        forbid_matmul_operator: the ``@`` operator is not allowed.
        require_loop: the solution must contain a ``for``/``while`` loop or a comprehension.
        why: one sentence for the student.
    """

    forbidden_calls: tuple[str, ...] = ()
    forbid_matmul_operator: bool = False
    require_loop: bool = False
    why: str = ""


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


def find_violations(source: str, exercise: str | None = None) -> list[Violation]:
    """Every rule that ``source`` (a cell or a function's code) breaks.

    The general rules (no importing the answers, no rewriting ``torch`` or ``builtins``) always
    apply; ``exercise`` adds that exercise's own rules from :data:`RULES`.
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


#: The source of each function's code object read so far (``id(code) -> (code, source)``; the code
#: object is kept, so its id is not reused while it is here).
_SOURCES: dict[int, tuple[object, str]] = {}


def _getsource(obj: object) -> str:
    """``inspect.getsource(obj)``, remembered per code object for functions: a code object's text does
    not change (a notebook cell that is run again makes new code objects), and reading it (the cell's
    lines, then tokenising them to find the function's end) is most of what a rules check costs."""
    target = inspect.unwrap(obj) if callable(obj) else obj  # as inspect.getsource reads it
    code = getattr(target, "__code__", None) if inspect.isfunction(target) else None
    if code is None:
        return inspect.getsource(obj)  # type: ignore[arg-type]
    known = _SOURCES.get(id(code))
    if known is not None and known[0] is code:
        return known[1]
    source = inspect.getsource(obj)  # type: ignore[arg-type]
    if len(_SOURCES) >= 4096:
        _SOURCES.clear()
    _SOURCES[id(code)] = (code, source)
    return source


def violations_of(obj: object, exercise: str) -> list[Violation]:
    """:func:`find_violations` on the source of a student's function or class (empty if unknown)."""
    source = source_of(obj)
    return find_violations(source, exercise) if source else []
