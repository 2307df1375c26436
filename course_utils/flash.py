"""Helpers for notebook 07 (FlashAttention from scratch) that are not an exercise's answer.

- :func:`triton_status`, :func:`import_triton`: whether Triton can run here, and how (compiled
  on a CUDA GPU, or in Triton's interpreter on a CPU), and the ``triton`` modules, or stand-ins
  that let a notebook define a kernel it cannot run;
- :func:`launch`: the host side of the notebook's Triton kernel (shapes, strides, grid);
- :func:`grading`: whether the notebook runs under the grader (skip slow demonstrations);
- :func:`measure_peak_memory`: the peak bytes of tensors alive during a call, on any device;
- :func:`causal_block_grid`: which (query block, key block) tiles a causal kernel computes.

The answers (``online_softmax``, ``flash_attention_forward`` and the kernel's inner loop) are in
the notebook, never here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any, Callable

import torch

from course_utils.checks.tensors import watch
from course_utils.device import under_grader

__all__ = ["grading", "triton_status", "import_triton", "use_interpreter_without_gpu", "launch",
           "measure_peak_memory", "causal_block_grid", "TRITON_HEAD_DIMS"]

#: The Triton the course pins (constraints.txt; the student edition's requirements.txt installs it on Linux).
TRITON_VERSION = "3.6.0"
#: The one command that installs it from a notebook cell.
TRITON_INSTALL = f'%pip install "triton=={TRITON_VERSION}"'

#: The oldest Triton whose interpreter runs the course's kernels (notebooks 07 and 10) correctly: 3.0
#: and 3.1 refuse ``tl.arange`` over block sizes, or compute other values (tested: 3.0.0, 3.1.0 fail;
#: 3.2.0, 3.6.0 and 3.7.1 pass). With an older one, :func:`triton_status` says so and the Triton
#: sections and checks of notebooks 07 and 10 are skipped.
TRITON_FLOOR = "3.2"

#: Head sizes the notebook's kernel accepts: ``tl.arange`` needs a power of two, ``tl.dot`` at least 16.
TRITON_HEAD_DIMS = (16, 32, 64, 128)


#: Whether nbgrader runs the notebook (slow demonstrations are skipped then): the course's one test.
grading = under_grader


# --------------------------------------------------------------------------------------------
# Triton: compiled on a GPU, interpreted on a CPU, skipped where it is not installed
# --------------------------------------------------------------------------------------------
def triton_status() -> tuple[bool, str]:
    """``(runs, how)``: whether Triton kernels can run on this machine, and how, or why not."""
    if importlib.util.find_spec("triton") is None:
        if sys.platform.startswith("linux"):
            return False, (f"Triton is not installed here, so the Triton section is skipped. To run it, run "
                           f"`{TRITON_INSTALL}` in a cell, then restart the kernel")
        return False, ("Triton is not installed here: it has no build for macOS or Windows, so the Triton section "
                       "is skipped. To run it, open this notebook in Google Colab, where Triton comes with PyTorch")
    from importlib.metadata import version

    from torch.torch_version import TorchVersion

    installed = version("triton")
    if TorchVersion(installed) < TRITON_FLOOR:
        return False, (f"this kernel has Triton {installed}, older than the {TRITON_FLOOR} these kernels need, so the "
                       f"Triton section is skipped. To run it, run `{TRITON_INSTALL}` in a cell, then restart the kernel")
    if torch.cuda.is_available():
        return True, f"compiled for the GPU ({torch.cuda.get_device_name()})"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, "no GPU: kernels run in Triton's interpreter (TRITON_INTERPRET=1), in Python, on the CPU"
    return True, "no GPU: call use_interpreter_without_gpu() before defining a kernel"


def use_interpreter_without_gpu() -> bool:
    """Without a CUDA GPU, run Triton kernels in Triton's interpreter (NumPy on the CPU). Returns
    whether it did.

    Sets ``TRITON_INTERPRET=1``, which ``@triton.jit`` reads when it decorates a kernel: kernels
    decorated *afterwards* are interpreted. Triton's own library functions (``tl.zeros``,
    ``tl.max``, ``tl.sum``) were decorated when ``triton`` was first imported; if that happened
    before (``torch.compile`` imports it), they are switched to their interpreted versions too.
    """
    if torch.cuda.is_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    if sys.modules.get("triton") is not None and importlib.util.find_spec("triton") is not None:
        _interpret_language()
        _index_scalars_with_numpy_2()
        _skip_dropped_overflow_checks()
        _find_builtins_once()
    return True


def _skip_dropped_overflow_checks() -> None:
    """Skip the interpreter's integer overflow checks, which it computes and then drops.

    For every integer ``+``, ``-`` and ``*`` in a kernel, Triton redoes the operation in int64 and compares it
    with the int32 limits (``sanitize_overflow``), then hands the result to ``device_assert``, which does
    nothing unless the kernel runs in debug mode: never in the interpreter, and on a GPU only when asked.
    In the interpreter that is NumPy work on every operation (about a quarter of the course's kernels' time
    there, measured with cProfile), for nothing: turning it off changes nothing a kernel computes or raises
    (``tests/checks/test_flash.py``).
    """
    import dataclasses

    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and getattr(options, "debug", True) is False \
            and getattr(options, "sanitize_overflow", False) is True:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _find_builtins_once() -> None:
    """Let the interpreter find ``triton.language``'s builtins once, not at every call of a kernel's helper.

    Before each launch, and again at each call of a ``@triton.jit`` helper inside the kernel, the interpreter walks
    ``triton.language``, ``tl.tensor`` and ``tl.math`` with ``inspect.getmembers`` to find the builtins it
    replaces by interpreted ones (``_patch_builtin``). Inside a launch they are already replaced, so those walks
    replace nothing, but they cost about a quarter of a launch of notebook 07's kernel (37 walks of 6 namespaces,
    0.5 ms each, measured with ``time.perf_counter``). Here each namespace's builtins are listed once (again if
    its names change), and each of those names is replaced where it still holds a builtin, as the walk would
    (``tests/checks/test_flash.py``: the same attributes replaced, the same results, everything restored).
    """
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_builtin", None)
    is_builtin = getattr(getattr(tl, "core", None), "is_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if original is None or is_builtin is None or patch_attr is None or getattr(original, "course_utils_fix", False):
        return
    found: dict[int, tuple[int, list[str]]] = {}

    def patch(pkg: Any, builder: Any, *scope: Any) -> None:  # Triton 3.2 and later pass a scope; 3.0 and 3.1 do not
        names = len(dir(pkg))
        known = found.get(id(pkg))
        if known is None or known[0] != names:
            known = found[id(pkg)] = (names, [n for n, m in inspect.getmembers(pkg) if is_builtin(m)])
        for name in known[1]:
            member = getattr(pkg, name, None)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, *scope)

    patch.course_utils_fix = True  # type: ignore[attr-defined]
    patch.course_utils_original = original  # type: ignore[attr-defined]
    interpreter._patch_builtin = patch


def _index_scalars_with_numpy_2() -> None:
    """Let the interpreter use a scalar computed from ``tl.program_id`` as a loop bound.

    The interpreter keeps scalars as one-element arrays of shape ``(1,)`` and turns them into
    ints with ``int(array)``, which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted
    to Python scalars"), so ``range(0, (start_m + 1) * BLOCK_M, BLOCK_N)`` fails. After the
    interpreter's own patching, ``__index__`` reads the single element with ``.item()`` instead.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "course_utils_fix", False):
        return

    def patch(tensor: Any, *scope: Any) -> None:  # Triton 3.2 and later pass a scope; 3.0 and 3.1 do not
        original(tensor, *scope)

        def index(self: Any) -> int:
            return int(self.handle.data.reshape(-1)[0].item())

        if scope:
            scope[0].set_attr(tensor, "__index__", index)
        else:
            tensor.__index__ = index

    patch.course_utils_fix = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patch


def _interpret_language() -> None:
    """Replace the compiled-only (``JITFunction``) helpers of ``triton.language`` by interpreted ones."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for owner in (tl, tl.standard, tl.math, tl.core.tensor):
        for name, member in list(vars(owner).items()):
            if isinstance(member, JITFunction) and not isinstance(member, InterpretedFunction):
                setattr(owner, name, InterpretedFunction(member.fn))


class _Constexpr:
    """Stand-in for ``tl.constexpr`` where Triton is missing: annotations only."""


def _stand_ins() -> tuple[Any, Any]:
    def jit(fn: Callable | None = None, **_: Any) -> Any:
        return fn if fn is not None else (lambda f: f)

    triton = types.SimpleNamespace(jit=jit, cdiv=lambda a, b: -(-a // b), missing=True)
    tl = types.SimpleNamespace(constexpr=_Constexpr, float32=None, missing=True)
    return triton, tl


def import_triton() -> tuple[Any, Any]:
    """``(triton, triton.language)``, or stand-ins whose ``jit`` returns the function unchanged
    where Triton is not installed, so that a notebook can still define (not run) its kernel."""
    if importlib.util.find_spec("triton") is None:
        return _stand_ins()
    use_interpreter_without_gpu()
    import triton
    import triton.language as tl

    use_interpreter_without_gpu()  # now that triton is imported: the interpreter's NumPy 2 fix
    return triton, tl


def _jitted(kernel: Any) -> Any:
    """``kernel`` ready to launch: a ``@triton.jit`` kernel as it is, a plain function jit-compiled
    (in the interpreter without a GPU)."""
    if hasattr(kernel, "__getitem__") and hasattr(kernel, "fn"):
        return kernel
    cached = _JIT_CACHE.get(kernel)
    if cached is None:
        triton, _ = import_triton()
        cached = _JIT_CACHE[kernel] = triton.jit(kernel)
    return cached


_JIT_CACHE: dict[Callable, Any] = {}


def check_launch(q: torch.Tensor, block_m: int, block_n: int) -> tuple[int, int]:
    """``(T, D)`` of ``q`` ``(..., T, D)``, or a ``ValueError`` naming what a Triton launch of the course's
    kernels (forward and backward) cannot take: a head size outside :data:`TRITON_HEAD_DIMS`, a block
    size that is not a power of two of at least 16, inputs off the GPU the kernel is compiled for."""
    T, D = q.shape[-2], q.shape[-1]
    if D not in TRITON_HEAD_DIMS:
        raise ValueError(f"the kernel needs a head size D in {TRITON_HEAD_DIMS} (a power of two, at least 16 for "
                         f"tl.dot), got D={D}")
    for value, name in ((block_m, "block_m"), (block_n, "block_n")):
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two of at least 16, got {value}")
    if torch.cuda.is_available() and q.device.type != "cuda":
        raise ValueError(f"the inputs are on {q.device}: move them to the GPU the kernel is compiled for")
    return T, D


def launch(kernel: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
           block_m: int = 16, block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the notebook's FlashAttention kernel on ``q``, ``k``, ``v`` of shape ``(..., T, D)``.

    The host side of a Triton kernel: flatten the batch dimensions into one (``BH``), make the
    tensors contiguous so that the last dimension has stride 1, allocate the output ``(..., T, D)``
    (``q``'s dtype) and the log-sum-exp ``(..., T)`` (float32), and launch one program per block of
    ``block_m`` queries and per (batch, head): the grid ``(cdiv(T, block_m), BH)``. Returns
    ``(out, lse)``. ``kernel`` is a ``@triton.jit`` function (or a plain one, compiled here).
    """
    if q.dim() < 2 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k and v must have the same shape (..., T, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    T, D = check_launch(q, block_m, block_n)
    run = _jitted(kernel)
    batch = q.shape[:-2]
    # Each in a buffer with NaN rows after the last (batch, head): a kernel that reads past T without a mask reads
    # that NaN (or the next head's rows), the same on every run, never whatever the memory past the end held; and
    # NaN, unlike zeros, shows such a read even where the scores of those keys are masked (0 * NaN is NaN in p @ v).
    pad = (-(-T // block_m) + 1) * max(block_m, block_n)
    q3, k3, v3 = (_padded(t.reshape(-1, T, D), pad) for t in (q, k, v))  # (BH, T, D)
    # NaN until the kernel writes them: an entry a kernel never writes shows as NaN, never as whatever the
    # memory held (which would differ from run to run, and from the GPU to the CPU).
    out = torch.full_like(q3, float("nan"))  # (BH, T, D)
    lse = torch.full(q3.shape[:-1], float("nan"), device=q.device, dtype=torch.float32)  # (BH, T)
    grid = (-(-T // block_m), q3.shape[0])
    run[grid](q3, k3, v3, out, lse, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0),
              v3.stride(1), out.stride(0), out.stride(1), T, 1.0 / D ** 0.5,
              HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal))
    return out.reshape(*batch, T, D), lse.reshape(*batch, T)


def _padded(t: torch.Tensor, pad: int) -> torch.Tensor:
    """``t`` ``(BH, T, D)``, contiguous, as the front of a buffer that holds ``pad`` NaN rows after it."""
    BH, T, D = t.shape
    buffer = torch.full((BH * T + pad, D), float("nan"), dtype=t.dtype, device=t.device)
    buffer[:BH * T] = t.reshape(BH * T, D)
    return buffer[:BH * T].view(BH, T, D)


# --------------------------------------------------------------------------------------------
# Memory and tiles
# --------------------------------------------------------------------------------------------
def measure_peak_memory(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Peak bytes held at once by the tensors that ``fn(*args, **kwargs)`` makes (its inputs not
    counted, its result counted), measured by watching every tensor it creates.

    PyTorch has a peak counter for GPU memory only (``torch.cuda.max_memory_allocated``); this one
    works on any device, a CPU included, by adding up tensor storages as they are made and freed.
    """
    _, watcher = watch(fn, *args, with_lines=False, **kwargs)
    return watcher.peak_bytes


def causal_block_grid(T: int, block_q: int, block_k: int) -> torch.Tensor:
    """``(n_q, n_k)`` int tensor: 2 where a causal kernel computes the tile unmasked (wholly in the
    past), 1 where it computes and masks it (it crosses the diagonal), 0 where it skips it (wholly
    in the future). Rows are query blocks of ``block_q``, columns key blocks of ``block_k``."""
    n_q, n_k = -(-T // block_q), -(-T // block_k)
    grid = torch.zeros(n_q, n_k, dtype=torch.int64)
    for i in range(n_q):
        q_start, q_end = i * block_q, min((i + 1) * block_q, T)
        for j in range(n_k):
            k_start, k_end = j * block_k, min((j + 1) * block_k, T)
            if k_start >= q_end:
                continue
            grid[i, j] = 1 if k_end - 1 > q_start else 2
    return grid
