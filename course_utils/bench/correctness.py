"""Correctness before speed: an implementation is timed only once it agrees with the reference."""

from __future__ import annotations

from typing import Callable

import torch

from course_utils.bench.timing import Timing, time_fn
from course_utils.checks.core import tensor_difference


class IncorrectImplementation(AssertionError):
    """An implementation's output differs from the expected one, so it is not timed."""


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` that separate rounding from bugs for outputs of order 1 in ``dtype``."""
    if dtype in (torch.float16, torch.bfloat16):
        return 3e-2, 3e-2
    return 1e-4, 1e-3


def verify(expected: torch.Tensor, got: object, *, atol: float | None = None, rtol: float | None = None) -> str | None:
    """``None`` if ``got`` matches ``expected``, else one sentence saying how it differs."""
    d_atol, d_rtol = default_tolerance(got.dtype if isinstance(got, torch.Tensor) else torch.float32)
    return tensor_difference(expected, got, atol=d_atol if atol is None else atol, rtol=d_rtol if rtol is None else rtol)


def checked_time(
    fn: Callable[[], torch.Tensor],
    expected: torch.Tensor,
    *,
    name: str = "implementation",
    device: torch.device | str = "cpu",
    warmup: int = 3,
    repeats: int = 10,
    atol: float | None = None,
    rtol: float | None = None,
    clock: Callable[[], float] | None = None,
) -> Timing:
    """Check ``fn()`` against ``expected`` first; time it with :func:`time_fn` only if it agrees.

    Raises:
        IncorrectImplementation: the output differs; the message says how. Nothing was timed.
    """
    with torch.no_grad():
        got = fn()
    problem = verify(expected, got, atol=atol, rtol=rtol)
    if problem:
        raise IncorrectImplementation(f"{name} is wrong, so it was not timed: {problem}")
    return time_fn(fn, device=device, warmup=warmup, repeats=repeats, clock=clock)
