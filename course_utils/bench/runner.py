"""The benchmark runner: check every implementation against an expected output, then time the
correct ones at every sequence length and mode, and report a table and a figure.

It takes the implementations as built modules and the FLOP count as a function, so it holds no
answer: notebook 06 passes the student's classes and ``attention_flops``, the instructor's
``make bench`` passes the reference's (``course_utils.instructor.bench_impls``).
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence
from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.bench.correctness import verify
from course_utils.bench.memory import peak_memory
from course_utils.bench.peaks import gpu_spec, peak_tflops, percent_of_peak, tflops_per_s, training_flops
from course_utils.bench.timing import time_fn

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` or ``torch.bfloat16`` -> ``torch.bfloat16``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


@dataclass
class BenchConfig:
    """Sizes and settings of one benchmark run (``dtype`` by name: ``"float32"``, ``"bfloat16"``...)."""

    device: str
    dtype: str
    batch: int
    d_model: int
    num_heads: int
    seq_lens: list[int]
    modes: list[str]
    warmup: int
    repeats: int
    compile: bool = False
    broken_demo: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


@dataclass
class BenchRow:
    """One (implementation, mode, T) measurement, or why there is none."""

    impl: str
    mode: str
    seq_len: int
    status: str  # "ok", "wrong" (failed the correctness gate), "error" (raised), "skipped" (not supported here)
    median_ms: float | None = None
    min_ms: float | None = None  # the fastest repeat: a hint of how noisy the machine was
    flops: int | None = None
    tflops: float | None = None
    percent_of_peak: float | None = None
    peak_memory_bytes: int | None = None
    message: str = ""


@dataclass
class BenchResult:
    config: BenchConfig
    environment: dict
    rows: list[BenchRow] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"environment": self.environment, "config": asdict(self.config),
                "results": [asdict(r) for r in self.rows]}

    def row(self, impl: str, mode: str, seq_len: int) -> BenchRow | None:
        return next((r for r in self.rows if (r.impl, r.mode, r.seq_len) == (impl, mode, seq_len)), None)


def environment(device: torch.device, dtype: torch.dtype) -> dict:
    """What the numbers were measured on."""
    from course_utils.device import describe_device

    spec = gpu_spec(device)
    return {"device": describe_device(device), "device_type": device.type, "dtype": str(dtype).replace("torch.", ""),
            "torch": torch.__version__, "python": platform.python_version(), "cpu_threads": torch.get_num_threads(),
            "peak_tflops": peak_tflops(device, dtype), "peak_source": spec.source if spec else None}


def run(modules: dict[str, nn.Module], config: BenchConfig, flops: Callable[..., int],
        expected_from: Sequence[str], log: Callable[[str], None] = print) -> BenchResult:
    """Check, then time, every module at every sequence length and mode.

    ``modules``: name -> module with input and output ``(batch, T, d_model)``, already on the
    device in ``config.dtype``. ``flops(batch, num_heads, T, head_dim)``: forward FLOPs of
    attention. ``expected_from``: the modules whose float32 output is the expected one, in order
    of preference (the next is used where the first runs out of memory).

    A module that disagrees gets ``status="wrong"`` and is not timed; one that raises gets
    ``status="error"``; a module with ``skip_reason(T, device)`` returning a sentence is skipped.
    """
    device, dtype = torch.device(config.device), as_dtype(config.dtype)
    result = BenchResult(config, environment(device, dtype))
    gen = torch.Generator().manual_seed(0)
    for T in config.seq_lens:
        x = torch.randn(config.batch, T, config.d_model, generator=gen).to(device)  # (b, T, d_model)
        expected = _expected_output(modules, expected_from, x, dtype, log)
        x = x.to(dtype)
        fwd = flops(config.batch, config.num_heads, T, config.head_dim)
        for name, module in modules.items():
            reason = module.skip_reason(T, device) if hasattr(module, "skip_reason") else None
            if reason:
                result.rows += [BenchRow(name, mode, T, "skipped", message=reason) for mode in config.modes]
                continue
            try:
                with torch.no_grad():
                    got = module(x)
            except Exception as exc:  # noqa: BLE001 - out of memory included: reported, not fatal
                _free_memory(device)
                result.rows += [BenchRow(name, mode, T, "error", message=f"{type(exc).__name__}: {exc}"[:200])
                                for mode in config.modes]
                continue
            problem = verify(expected, got)
            if problem:
                result.rows += [BenchRow(name, mode, T, "wrong", message=problem[:200]) for mode in config.modes]
                continue
            for mode in config.modes:
                result.rows.append(_measure(name, module, x, mode, fwd, device, dtype, config))
        log(f"T={T}: done")
    return result


def _expected_output(modules: dict[str, nn.Module], names: Sequence[str], x: torch.Tensor, dtype: torch.dtype,
                     log: Callable[[str], None]) -> torch.Tensor:
    for name in names:
        module = modules[name]
        try:
            with torch.no_grad():
                return module.float()(x)
        except torch.cuda.OutOfMemoryError:
            _free_memory(x.device)
            log(f"T={x.shape[1]}: {name} in float32 ran out of memory for the expected output; trying the next")
        finally:
            module.to(dtype)
    raise RuntimeError(f"no expected output fits in memory at T={x.shape[1]}")


def _free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _measure(name, module, x, mode, fwd_flops, device, dtype, config) -> BenchRow:
    if mode == "inference":
        def step():
            with torch.no_grad():
                return module(x)
        flops = fwd_flops
    elif mode == "training":
        xg = x.detach().clone().requires_grad_(True)

        def step():
            out = module(xg)
            out.float().sum().backward()
            return out
        flops = training_flops(fwd_flops)
    else:
        raise ValueError(f"mode must be 'inference' or 'training', got {mode!r}")
    try:
        timing = time_fn(step, device=device, warmup=config.warmup, repeats=config.repeats)
        memory = peak_memory(step, device)
    except NotImplementedError as exc:  # e.g. FlexAttention has no backward on a CPU
        return BenchRow(name, mode, x.shape[1], "skipped", message=f"not supported here: {exc}"[:200])
    except Exception as exc:  # noqa: BLE001 - out of memory included: reported, not fatal
        _free_memory(device)
        return BenchRow(name, mode, x.shape[1], "error", message=f"{type(exc).__name__}: {exc}"[:200])
    finally:
        module.zero_grad(set_to_none=True)
    achieved = tflops_per_s(flops, timing.median_s)
    return BenchRow(name, mode, x.shape[1], "ok", timing.median_ms, 1e3 * min(timing.times_s), flops, achieved,
                    percent_of_peak(achieved, peak_tflops(device, dtype)), memory.peak_bytes)


def format_table(result: BenchResult, mode: str, baseline: str = "sdpa_is_causal", label: str = "SDPA") -> str:
    """Median ms per implementation (rows) and T (columns), plus each one's time relative to
    ``baseline`` (called ``label`` in the header) at the largest T (``2.0x`` = twice as slow) and
    its TFLOP/s there."""
    rows = [r for r in result.rows if r.mode == mode]
    seq_lens = sorted({r.seq_len for r in rows})
    impls = list(dict.fromkeys(r.impl for r in rows))
    cell = {(r.impl, r.seq_len): r for r in rows}
    t_max = seq_lens[-1] if seq_lens else 0
    base = cell.get((baseline, t_max))
    width = max([24] + [len(i) + 2 for i in impls])
    header = f"{'implementation':{width}s}" + "".join(f"{'T=' + str(t):>11s}" for t in seq_lens) + f"{'vs ' + label + f' @T={t_max}':>22s}"
    lines = [f"{mode} (median ms; TFLOP/s at T={t_max} in brackets)", header, "-" * len(header)]
    for impl in impls:
        line = f"{impl:{width}s}"
        for t in seq_lens:
            r = cell.get((impl, t))
            line += f"{(f'{r.median_ms:.3f}' if r and r.status == 'ok' else (r.status.upper() if r else '-')):>11s}"
        r = cell.get((impl, t_max))
        if r and r.status == "ok" and base and base.status == "ok":
            line += f"{r.median_ms / base.median_ms:>8.2f}x [{r.tflops:.3g}]".rjust(22)
        elif r and r.status != "ok":
            line += f"  {r.message[:60]}"
        lines.append(line)
    return "\n".join(lines)


def plot_results(result: BenchResult, path: Path | None = None):
    """Median time against T, log-log, one panel per mode. Saved as a PNG at ``path`` (and the
    figure closed), or returned for a notebook to show."""
    import matplotlib.pyplot as plt

    from course_utils.plotting import readable_log_axes

    modes = list(dict.fromkeys(r.mode for r in result.rows))
    fig, axes = plt.subplots(1, max(1, len(modes)), figsize=(6 * max(1, len(modes)), 4.8), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        rows = [r for r in result.rows if r.mode == mode and r.status == "ok"]
        for impl in dict.fromkeys(r.impl for r in rows):
            pts = sorted((r.seq_len, r.median_ms) for r in rows if r.impl == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        readable_log_axes(ax, sorted({r.seq_len for r in result.rows}))
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("median time (ms)")
        ax.set_title(f"{mode}: {result.environment['device_type']}, {result.environment['dtype']}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=10, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))  # room for the shared legend below the panels
    if path is None:
        return fig
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def forgetting_causal(base: type) -> type:
    """``base`` with a bug planted: its calls to ``F.scaled_dot_product_attention`` lose
    ``is_causal=True``. A wrong implementation that a benchmark must refuse to time."""

    class ForgotCausal(base):
        def forward(self, *args, **kwargs):
            sdpa = F.scaled_dot_product_attention

            def sdpa_forgetting_causal(*a, is_causal=False, **kw):
                return sdpa(*a, **kw)  # is_causal dropped

            with mock.patch.object(F, "scaled_dot_product_attention", sdpa_forgetting_causal):
                return super().forward(*args, **kwargs)

    ForgotCausal.__name__ = ForgotCausal.__qualname__ = f"ForgotCausal({base.__name__})"
    return ForgotCausal


__all__ = ["BenchConfig", "BenchRow", "BenchResult", "as_dtype", "environment", "run", "format_table",
           "plot_results", "forgetting_causal"]
