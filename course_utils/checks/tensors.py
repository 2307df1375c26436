"""Watch every tensor that a piece of code makes: its shape, the line of the caller's code that made
it, the matrix products and reductions it ran, and how many bytes were alive at the peak.

Notebook 07 uses it twice. Its checks prove that a tiled attention never builds a ``(T, T)`` tensor
(and say at which line one was built), count the score entries a causal kernel computed (so
blocks wholly in the future must be skipped, not masked) and see whether a softmax reduced a whole
row at once. Its memory lesson measures the peak tensor memory of naive and tiled attention on a
CPU, where PyTorch offers no peak counter.

How: a :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every ATen operator that runs
while it is active, factory functions (``torch.ones``) and the pieces of composite operators
(``@`` becomes ``bmm``) included. Nothing here knows an exercise's answer.
"""

from __future__ import annotations

import functools
import linecache
import sys
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Made", "Product", "Reduction", "TensorWatcher", "watch", "code_line"]

#: Matrix products: ``(op, index of the first factor, index of the second)``.
_PRODUCTS = {"aten.mm.default": (0, 1), "aten.bmm.default": (0, 1), "aten.addmm.default": (1, 2),
             "aten.baddbmm.default": (1, 2), "aten.matmul.default": (0, 1), "aten.addbmm.default": (1, 2)}
#: Reductions that can take a row's maximum or sum.
_REDUCTIONS = ("aten.amax.", "aten.max.", "aten.sum.", "aten.logsumexp.", "aten.amin.", "aten.min.", "aten.mean.")

_OURS = str(Path(__file__).resolve().parent.parent)
_LIBRARIES = tuple({str(Path(p).resolve()) for p in (torch.__file__, Path(torch.__file__).parent.parent)} |
                   {str(Path(p).resolve()) for p in sys.path if p and ("site-packages" in p or "lib/python" in p)})


@functools.lru_cache(maxsize=512)
def _is_callers(filename: str) -> bool:
    """Whether a frame's file is the code under watch (a notebook cell, a script), not a library or ours."""
    if filename.startswith("<frozen"):
        return False
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return True
    return not resolved.startswith((_OURS,) + _LIBRARIES)


@dataclass(frozen=True)
class Line:
    """A line of the watched code: file, number, and the text on it (read from ``linecache`` when first asked:
    a watcher records a line for every operator, and a check reads the text of one or two, right after the run)."""

    filename: str
    lineno: int

    @functools.cached_property
    def text(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()

    def __str__(self) -> str:
        where = f"line {self.lineno}"
        return f"{where}: `{self.text}`" if self.text else where


def code_line(skip: int = 0) -> Line | None:
    """The innermost line of the caller's own code (not a library's, not the course's) on the stack."""
    frame = sys._getframe(skip + 1)
    while frame is not None:
        if _is_callers(frame.f_code.co_filename):
            return Line(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return None


@dataclass(frozen=True)
class Made:
    """A tensor with its own new memory, made by one operator."""

    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    line: Line | None


@dataclass(frozen=True)
class Product:
    """One matrix product: ``(..., m, n) @ (..., n, p) -> (..., m, p)``; ``entries`` = ``numel`` of the output."""

    op: str
    contraction: int
    out_shape: tuple[int, ...]
    line: Line | None

    @property
    def entries(self) -> int:
        return int(torch.Size(self.out_shape).numel())


@dataclass(frozen=True)
class Reduction:
    """A max/sum-like reduction: the input's shape and the dimensions reduced (``None``: all)."""

    op: str
    in_shape: tuple[int, ...]
    dims: tuple[int, ...] | None
    line: Line | None

    def reduces_last_dim_longer_than(self, size: int) -> bool:
        if not self.in_shape or self.in_shape[-1] <= size:
            return False
        n = len(self.in_shape)
        return self.dims is None or any(d % n == n - 1 for d in self.dims)


@dataclass(frozen=True)
class _Op:
    """What the watcher asks of an operator, found once per operator (``str(func)`` alone costs a microsecond)."""

    name: str
    product: tuple[int, int] | None  # the factors' indices, for a matrix product
    reduction: bool
    is_view: bool
    new_memory: bool  # neither a view, nor in place, nor writing into ``out=``


@functools.lru_cache(maxsize=None)
def _op(func: Any) -> _Op:
    name = str(func)
    is_view = bool(getattr(func, "is_view", False))
    return _Op(name, _PRODUCTS.get(name), name.startswith(_REDUCTIONS), is_view,
               not is_view and not name.split(".")[1].endswith("_") and ".out" not in name)


def _tensors_in(value: Any, found: list | None = None) -> list[torch.Tensor]:
    """The tensors in an operator's arguments or result (nested tuples, lists and dicts of them), in
    order. What ``torch.utils._pytree.tree_flatten`` gives for these, at a tenth of its cost: the
    watcher asks on every operator a check runs (about 120,000 times for notebook 07's checks)."""
    found = [] if found is None else found
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _tensors_in(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors_in(item, found)
    return found


@dataclass(eq=False)
class TensorWatcher(TorchDispatchMode):
    """Record, while active, every new tensor, matrix product and reduction, and the peak live bytes.

    Use as a context manager (``with TensorWatcher() as w: fn()``) or through :func:`watch`.

    Attributes:
        made: every operator output with memory of its own (views and in-place results are not new).
        products: every matrix product (``@``, ``matmul``, ``einsum`` and ``bmm`` all end up here).
        reductions: every max/sum/logsumexp-like reduction.
        ops: how often each operator ran.
        peak_bytes: the most bytes held at once by tensors made inside the block (inputs made
            before it are not counted): a measurement of tensor memory, on any device.
        with_lines: find the line of the caller's code for each record (a little slower).
        memory: count live and peak bytes (``False``: ``peak_bytes`` stays 0, and each operator costs less;
            for a check that asks only what was made, multiplied or reduced).
    """

    with_lines: bool = True
    memory: bool = True
    made: list[Made] = field(default_factory=list)
    products: list[Product] = field(default_factory=list)
    reductions: list[Reduction] = field(default_factory=list)
    ops: Counter = field(default_factory=Counter)
    live_bytes: int = 0
    peak_bytes: int = 0

    def __post_init__(self) -> None:
        super().__init__()
        self._storages: dict[int, list[int]] = {}  # data_ptr -> [number of live tensors, bytes]

    # -- the dispatch hook -------------------------------------------------------------------
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """PyTorch (2.6 and later) wraps a mode's ``__torch_dispatch__`` in ``torch._dynamo.disable`` unless this
        says no: about 10 microseconds on every operator, two thirds of a watched run's cost on the CPU. The
        watcher runs in eager code only (the checks' watched runs, the memory lesson), where that wrapper has
        nothing to disable."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = _op(func)
        name = op.name
        self.ops[name] += 1
        line = code_line() if self.with_lines else None
        if op.product is not None:
            first = args[op.product[0]]
            self.products.append(Product(name, int(first.shape[-1]), tuple(out.shape), line))
        elif op.reduction and args and isinstance(args[0], torch.Tensor):
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            if isinstance(dims, int):
                dims = (dims,)
            elif isinstance(dims, (list, tuple)):
                dims = tuple(dims) or None
            else:
                dims = None
            self.reductions.append(Reduction(name, tuple(args[0].shape), dims, line))
        outputs = (out,) if isinstance(out, torch.Tensor) else _tensors_in(out)
        if not outputs or not (self.memory or op.new_memory):
            return out
        inputs = {id(a) for a in _tensors_in(args)}
        if kwargs:
            inputs.update(id(a) for a in _tensors_in(kwargs))
        for tensor in outputs:
            if id(tensor) not in inputs:
                if self.memory:
                    self._track(tensor, new_storage=not op.is_view)
                if op.new_memory and tensor.device.type != "meta":
                    self.made.append(Made(name, tuple(tensor.shape), tensor.dtype,
                                          tensor.numel() * tensor.element_size(), line))
        return out

    def _track(self, tensor: torch.Tensor, new_storage: bool) -> None:
        """Count ``tensor``'s storage as alive until its last tensor made here is gone.

        A view (``new_storage=False``) of memory made before the block (the inputs) is not counted.
        """
        if tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if not nbytes:
            return
        entry = self._storages.get(ptr)
        if entry is None:
            if not new_storage:
                return
            entry = self._storages[ptr] = [0, nbytes]
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        entry[0] += 1
        weakref.finalize(tensor, self._release, ptr)

    def _release(self, ptr: int) -> None:
        entry = self._storages.get(ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self._storages[ptr]

    # -- questions asked afterwards ------------------------------------------------------------
    def first_made(self, predicate: Callable[[Made], bool]) -> Made | None:
        """The first new tensor for which ``predicate`` holds."""
        return next((m for m in self.made if predicate(m)), None)

    def score_entries(self, head_dim: int, value_dim: int | None = None) -> int:
        """Entries of every product that contracts over ``head_dim`` (``Q K^T`` blocks, not ``P V``).

        Products whose output's last dimension is ``value_dim`` (``P V``) are left out even when
        they happen to contract over a length equal to ``head_dim``.
        """
        return sum(p.entries for p in self.products
                   if p.contraction == head_dim and (value_dim is None or p.out_shape[-1] != value_dim))


def watch(fn: Callable[..., Any], *args: Any, with_lines: bool = True, **kwargs: Any) -> tuple[Any, TensorWatcher]:
    """``(fn(*args, **kwargs), watcher)``: the result, and what the call made (see :class:`TensorWatcher`).

    Runs under ``torch.no_grad()`` so that tensors saved for a backward pass do not count.
    """
    watcher = TensorWatcher(with_lines=with_lines)
    with torch.no_grad(), watcher:
        result = fn(*args, **kwargs)
    return result, watcher
