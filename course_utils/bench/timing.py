"""Timing: warm-up, synchronisation, the median of repeats."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Timing:
    """Result of :func:`time_fn`.

    Attributes:
        median_s: median of the repeats, in seconds: the number to report.
        times_s: every repeat, in seconds, in the order they ran.
        warmup: calls made (and discarded) before timing.
        method: ``"cuda-events"`` (timestamps recorded on the GPU) or ``"perf_counter"`` (host
            clock, after synchronising the device).
    """

    median_s: float
    times_s: list[float]
    warmup: int
    method: str

    @property
    def repeats(self) -> int:
        return len(self.times_s)

    @property
    def median_ms(self) -> float:
        return 1e3 * self.median_s

    @property
    def spread(self) -> float:
        """``(max - min) / median``: large values mean a noisy machine."""
        return (max(self.times_s) - min(self.times_s)) / self.median_s if self.median_s > 0 else 0.0

    def __str__(self) -> str:
        return f"{self.median_ms:.3f} ms (median of {self.repeats}, {self.warmup} warm-up, {self.method})"


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on ``device`` has finished (no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_fn(
    fn: Callable[[], object],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    repeats: int = 10,
    clock: Callable[[], float] | None = None,
) -> Timing:
    """Median wall time of ``fn()`` after ``warmup`` discarded calls.

    On a CUDA device (and no ``clock`` given) each repeat is measured with a pair of CUDA events;
    elsewhere with ``clock`` (default ``time.perf_counter``), synchronising the device before
    starting and before stopping the clock, so queued GPU work is neither missed nor charged to
    the next repeat.

    Args:
        fn: the work to time, called with no arguments. Wrap it in ``torch.no_grad()`` yourself for
            inference timings.
        device: where ``fn`` runs; decides how to synchronise.
        warmup: calls made first and not timed (``>= 0``).
        repeats: timed calls (``>= 1``).
        clock: a function returning seconds; tests pass a fake one.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be non-negative, got {warmup}")
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    if device.type == "cuda" and clock is None:
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)  # elapsed_time is in milliseconds
        method = "cuda-events"
    else:
        clock = clock or time.perf_counter
        for _ in range(repeats):
            synchronize(device)
            t0 = clock()
            fn()
            synchronize(device)
            times.append(clock() - t0)
        method = "perf_counter"
    return Timing(median_s=statistics.median(times), times_s=times, warmup=warmup, method=method)
