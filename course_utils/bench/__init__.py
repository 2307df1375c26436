"""Measuring attention: timing, FLOP arithmetic, throughput, GPU peaks, memory, and the
correctness gate. Used by notebook 06.

Nothing here is an exercise's answer: the attention implementations that the benchmark compares,
and the benchmark runner, are in the instructor edition (``course_utils.instructor.bench_impls``;
notebook 06 shows the comparison classes it uses). ``python -m course_utils.bench --out DIR``
(``make bench``) runs that benchmark where the instructor edition is installed, and says so where
it is not.

Timing rules this module follows (notebook 06 explains why):
    1. warm up first (the first calls pay for allocation, kernel selection and compilation);
    2. synchronise the GPU before reading a clock (CUDA kernels run asynchronously), or use CUDA
       events, which are timestamps recorded on the GPU itself;
    3. report the median of several repeats, which one slow outlier cannot move.

Shape letters: ``b`` batch, ``T`` tokens, ``d`` model size, ``H`` heads, ``D`` head size.

The package's modules, one job each: ``timing`` (warm-up, synchronisation, median), ``peaks``
(FLOPs, throughput, GPU peaks), ``memory`` (peak memory, score-matrix size), ``correctness`` (the gate
before timing), ``sdpa`` (which backend ran, FlexAttention, shared weights), ``runner`` (check, then
time, a set of implementations; the table and the figure) and ``cli`` (the command, which the
package does not import: the command loads the instructor edition's runner, which imports this package).
"""

from __future__ import annotations

from course_utils.bench.correctness import IncorrectImplementation, checked_time, verify
from course_utils.bench.memory import MemoryReport, max_seq_len_for_scores, peak_memory, score_matrix_bytes
from course_utils.bench.runner import (
    BenchConfig,
    BenchResult,
    BenchRow,
    forgetting_causal,
    format_table,
    plot_results,
    run,
)
from course_utils.bench.peaks import GPU_SPECS, GpuSpec, gpu_spec, peak_tflops, percent_of_peak, tflops_per_s, training_flops
from course_utils.bench.sdpa import (
    SDPA_KERNELS,
    causal_mask_mod,
    copy_weights,
    flex_attention_status,
    sdpa_backend_used,
    sdpa_backends_available,
)
from course_utils.bench.timing import Timing, synchronize, time_fn

__all__ = [
    "Timing",
    "synchronize",
    "time_fn",
    "training_flops",
    "tflops_per_s",
    "GpuSpec",
    "GPU_SPECS",
    "gpu_spec",
    "peak_tflops",
    "percent_of_peak",
    "MemoryReport",
    "peak_memory",
    "score_matrix_bytes",
    "max_seq_len_for_scores",
    "IncorrectImplementation",
    "verify",
    "checked_time",
    "SDPA_KERNELS",
    "sdpa_backend_used",
    "sdpa_backends_available",
    "flex_attention_status",
    "causal_mask_mod",
    "copy_weights",
    "BenchConfig",
    "BenchRow",
    "BenchResult",
    "run",
    "format_table",
    "plot_results",
    "forgetting_causal",
]
