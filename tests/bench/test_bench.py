"""course_utils.bench: timing with a fake clock, FLOPs, peaks, memory arithmetic, the correctness
gate, SDPA backend detection; course_utils.instructor.bench_impls: the non-exercise
implementations and the benchmark command; and that course_utils.bench holds no answers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from course_utils import bench, reference
from course_utils.bench.cli import main as bench_command
from course_utils.instructor import bench_impls

GPU_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA events, max_memory_allocated)")


class FakeClock:
    """Returns the next value of a scripted sequence each time it is read."""

    def __init__(self, readings):
        self.readings = list(readings)
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.readings.pop(0)


# ---------------------------------------------------------------------------------------- timing
def test_time_fn_reports_the_median_and_skips_warmup_calls():
    calls = []
    # Three repeats lasting 5 s, 1 s and 3 s: median 3 s, whatever the outlier.
    clock = FakeClock([0.0, 5.0, 10.0, 11.0, 20.0, 23.0])
    timing = bench.time_fn(lambda: calls.append(1), warmup=2, repeats=3, clock=clock)
    assert len(calls) == 5, "2 warm-up calls + 3 timed calls"
    assert clock.reads == 6, "the clock is read only around timed calls"
    assert timing.times_s == [5.0, 1.0, 3.0]
    assert timing.median_s == 3.0
    assert timing.repeats == 3 and timing.warmup == 2 and timing.method == "perf_counter"
    assert "3000.000 ms" in str(timing)


def test_time_fn_even_number_of_repeats_and_spread():
    clock = FakeClock([0.0, 1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 10.0])
    timing = bench.time_fn(lambda: None, warmup=0, repeats=4, clock=clock)
    assert timing.median_s == 2.5
    assert timing.spread == pytest.approx((10.0 - 1.0) / 2.5)


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"warmup": -1}])
def test_time_fn_rejects_bad_counts(kwargs):
    with pytest.raises(ValueError):
        bench.time_fn(lambda: None, **kwargs)


def test_time_fn_real_clock_on_cpu():
    x = torch.randn(32, 32)
    timing = bench.time_fn(lambda: x @ x, warmup=1, repeats=3)
    assert timing.repeats == 3 and all(t >= 0 for t in timing.times_s)


@GPU_ONLY
def test_time_fn_uses_cuda_events_on_gpu():
    x = torch.randn(256, 256, device="cuda")
    timing = bench.time_fn(lambda: x @ x, device="cuda", warmup=2, repeats=5)
    assert timing.method == "cuda-events" and timing.median_s > 0


# ------------------------------------------------------------------------------------ FLOPs, peaks
def test_flops_and_throughput():
    assert bench_impls.attention_flops(1, 1, 4, 2, causal=False) == 128
    assert bench_impls.attention_flops(1, 1, 4, 2) == 64
    assert bench_impls.attention_flops(8, 12, 1024, 64) == reference.attention_flops(8, 12, 1024, 64)
    assert bench.training_flops(10) == 30
    assert bench.tflops_per_s(2e12, 0.5) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        bench.tflops_per_s(1.0, 0.0)


@pytest.mark.parametrize(
    "name, product, tensor16, fp32",
    [
        ("Tesla T4", "T4", 65.0, 8.1),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 312.0, 19.5),
        ("NVIDIA A100-PCIE-40GB", "A100 80GB SXM", 312.0, 19.5),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5, 67.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0, 51.0),
        ("NVIDIA H100 NVL", "H100 NVL", 835.0, 60.0),
        ("NVIDIA H200", "H200 SXM", 989.5, 67.0),
        ("NVIDIA H200 NVL", "H200 NVL", 835.0, 60.0),
    ],
)
def test_gpu_spec_matching(name, product, tensor16, fp32):
    spec = bench.gpu_spec(name=name)
    assert spec is not None and spec.name == product
    assert spec.tensor_16bit_tflops == tensor16 and spec.fp32_tflops == fp32
    assert "data sheet" in spec.source


def test_unknown_gpu_and_cpu_have_no_peak():
    assert bench.gpu_spec(name="Some Future GPU") is None
    assert bench.peak_tflops("cpu", torch.float32) is None
    assert bench.percent_of_peak(1.0, None) is None
    assert bench.percent_of_peak(50.0, 200.0) == 25.0


def test_t4_has_no_bf16_tensor_peak():
    assert not bench.GPU_SPECS["T4"].bf16_supported


# ------------------------------------------------------------------------------------------ memory
def test_score_matrix_bytes_and_largest_t():
    assert bench.score_matrix_bytes(8, 12, 1024, torch.float32) == 8 * 12 * 1024 * 1024 * 4
    assert bench.score_matrix_bytes(8, 12, 1024, torch.bfloat16) == 8 * 12 * 1024 * 1024 * 2
    t = bench.max_seq_len_for_scores(80e9, 8, 12, torch.float16)
    assert bench.score_matrix_bytes(8, 12, t, torch.float16) <= 80e9 < bench.score_matrix_bytes(8, 12, t + 1, torch.float16)
    t2 = bench.max_seq_len_for_scores(80e9, 8, 12, torch.float16, copies=4)
    assert 4 * bench.score_matrix_bytes(8, 12, t2, torch.float16) <= 80e9 < 4 * bench.score_matrix_bytes(8, 12, t2 + 1, torch.float16)


def test_peak_memory_on_cpu_says_it_cannot_measure():
    calls = []
    report = bench.peak_memory(lambda: calls.append(1), "cpu")
    assert calls == [1], "the function still runs"
    assert report.peak_bytes is None and "tracemalloc" in report.method
    assert "not measured" in str(report)


@GPU_ONLY
def test_peak_memory_on_gpu_sees_an_allocation():
    report = bench.peak_memory(lambda: torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda"), "cuda")
    assert report.peak_bytes is not None and report.peak_bytes >= 64 * 2**20


# ----------------------------------------------------------------------------- correctness gate
def _mha_pair():
    torch.manual_seed(0)
    source = reference.MultiHeadAttention(8, 8, 6, 0.0, 2).eval()
    x = torch.rand(2, 6, 8)
    return source, x


def test_checked_time_refuses_a_wrong_implementation_without_timing_it():
    source, x = _mha_pair()
    expected = source(x).detach()
    clock = FakeClock([])  # reading it would raise IndexError: nothing may be timed
    with pytest.raises(bench.IncorrectImplementation, match="not timed.*values differ"):
        bench.checked_time(lambda: source(x) + 0.1, expected, name="off by 0.1", clock=clock)
    assert clock.reads == 0
    with pytest.raises(bench.IncorrectImplementation, match="shape"):
        bench.checked_time(lambda: source(x)[:, :3], expected, clock=clock)


def test_checked_time_times_a_correct_implementation():
    source, x = _mha_pair()
    clock = FakeClock([0.0, 2.0])
    timing = bench.checked_time(lambda: source(x), source(x).detach(), warmup=0, repeats=1, clock=clock)
    assert timing.median_s == 2.0


def test_verify_tolerances_follow_the_dtype():
    expected = torch.ones(4)
    assert bench.verify(expected, torch.ones(4) + 1e-2) is not None
    assert bench.verify(expected, (torch.ones(4) + 1e-2).to(torch.bfloat16)) is None
    assert bench.verify(expected, torch.ones(4) + 1e-6) is None


# ------------------------------------------------------------------------------- SDPA backends
def test_sdpa_backend_detection_on_cpu():
    q, k, v = torch.randn(3, 1, 2, 16, 8).unbind(0)
    assert bench.sdpa_backend_used(lambda: q + 1) == []
    used = bench.sdpa_backend_used(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert len(used) == 1 and (used[0] in bench.SDPA_KERNELS.values() or used[0] == "math")
    # Forcing the math backend must be seen as math.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        assert bench.sdpa_backend_used(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)) == ["math"]


def test_sdpa_backends_available_always_has_math():
    q, k, v = torch.randn(3, 1, 2, 16, 8).unbind(0)
    result = bench.sdpa_backends_available(q, k, v)
    assert result["MATH"] == "ok"
    assert set(result) == {"FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"}
    assert all(status == "ok" or status.startswith("refused") or "not in this" in status for status in result.values())


# -------------------------------------------------------------------------- implementations
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("name", ["combined_qkv", "einsum", "sdpa_is_causal", "sdpa_explicit_mask", "nn_multiheadattention"])
def test_every_variant_matches_notebook05_after_copy_weights(name, qkv_bias):
    torch.manual_seed(1)
    args = (8, 8, 10, 0.0, 2, qkv_bias)
    source = reference.MultiHeadAttention(*args).eval()
    target = bench.copy_weights(source, bench_impls.IMPLEMENTATIONS[name](*args)).eval()
    for T in (10, 7):
        x = torch.rand(3, T, 8)
        with torch.no_grad():
            assert bench.verify(source(x), target(x), atol=1e-5, rtol=1e-4) is None, (name, T)


def test_nn_multiheadattention_needs_square_projection():
    with pytest.raises(ValueError, match="d_in == d_out"):
        bench_impls.MHAPyTorchClass(4, 8, 6, 0.0, 2)


def test_flex_attention_status_is_a_decision_with_a_reason():
    ok, why = bench.flex_attention_status("cpu", compile=False)
    assert isinstance(ok, bool) and why
    if ok:
        torch.manual_seed(2)
        source = reference.MultiHeadAttention(8, 8, 10, 0.0, 2).eval()
        flex = bench.copy_weights(source, bench_impls.MHAFlexAttention(8, 8, 10, 0.0, 2)).eval()
        x = torch.rand(2, 9, 8)
        with torch.no_grad():
            assert bench.verify(source(x), flex(x)) is None


def test_flex_attention_is_not_tried_while_a_notebook_is_graded(monkeypatch):
    """Notebooks 06 and 08 ask for the status in every graded kernel, where no graded cell needs it (on a GPU,
    trying means compiling): under nbgrader it says no, and why, without importing FlexAttention."""
    import sys

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setitem(sys.modules, "torch.nn.attention.flex_attention", None)  # an import would raise
    assert bench.flex_attention_status("cpu") == (False, "not tried while the notebook is graded (no graded cell "
                                                         "needs it)")


# ---------------------------------------------------------------------------- the command
def test_benchmark_command_reports_a_wrong_implementation_and_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "results"
    code = bench_command(["--out", str(out), "--device", "cpu", "--seq-lens", "16", "32", "--batch", "1",
                       "--d-model", "16", "--num-heads", "2", "--warmup", "0", "--repeats", "1", "--broken-demo"])
    assert code == 0
    data = json.loads((out / "attention_bench.json").read_text())
    assert (out / "attention_bench.png").stat().st_size > 0
    env = data["environment"]
    assert env["device_type"] == "cpu" and env["torch"] == torch.__version__ and env["dtype"] == "float32"
    assert data["config"]["seq_lens"] == [16, 32]
    rows = data["results"]
    broken = [r for r in rows if r["impl"] == "broken_no_causal"]
    assert broken and all(r["status"] == "wrong" and r["median_ms"] is None for r in broken)
    timed = [r for r in rows if r["impl"] == "sdpa_is_causal"]
    assert {(r["mode"], r["seq_len"]) for r in timed} == {(m, t) for m in ("inference", "training") for t in (16, 32)}
    assert all(r["status"] == "ok" and r["median_ms"] > 0 and r["tflops"] > 0 and r["flops"] > 0 for r in timed)
    printed = capsys.readouterr().out
    assert "sdpa_is_causal" in printed and "WRONG" in printed and "vs SDPA" in printed


# ------------------------------------------------------------------------- the student edition
_WITHOUT_ANSWERS = textwrap.dedent("""
    import sys
    # The student edition has neither the answers nor the instructor package.
    sys.modules["course_utils.reference"] = None
    sys.modules["course_utils.instructor"] = None
    from course_utils.bench.cli import main
    assert "course_utils.reference" not in [m for m in sys.modules if sys.modules[m] is not None]
    try:
        main(["--out", "unused"])
    except SystemExit as exc:
        print("EXIT:", exc.code)
    else:
        print("ran the benchmark without the instructor edition")
""")


def test_bench_imports_without_the_answers_and_the_command_says_why_it_cannot_run():
    done = subprocess.run([sys.executable, "-c", _WITHOUT_ANSWERS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("EXIT:")]
    assert len(lines) == 1 and "instructor edition" in lines[0], done.stdout
    assert "\n" not in lines[0].removeprefix("EXIT:"), "one line"


def test_comparison_classes_call_the_notebook_helpers_by_plain_name():
    """Notebook 06 shows these classes' source; in the notebook, causal_mask and merge_heads are the
    earlier notebooks' answers shown above them, so the source must not reach into the reference."""
    import inspect

    for cls in (bench_impls.with_explicit_mask, bench_impls.MHAPyTorchClass, bench_impls.MHAFlexAttention):
        source = inspect.getsource(cls)
        assert "reference" not in source and "bench." not in source, cls.__name__


# ------------------------------------------------------------- notebook 07's tiled implementations
def test_flash_python_matches_notebook05_after_copy_weights():
    torch.manual_seed(3)
    args = (16, 16, 40, 0.0, 2)
    source = reference.MultiHeadAttention(*args).eval()
    tiled = bench.copy_weights(source, bench_impls.MHAFlashPython(*args)).eval()
    tiled.block = 16
    for T in (40, 23):
        x = torch.rand(2, T, 16)
        with torch.no_grad():
            assert bench.verify(source(x), tiled(x), atol=1e-5, rtol=1e-4) is None, T


def test_flash_triton_matches_notebook05_in_the_interpreter_and_is_forward_only():
    pytest.importorskip("triton", reason="Triton is not installed")
    torch.manual_seed(4)
    args = (32, 32, 40, 0.0, 2)  # head size 16, the smallest the kernel takes
    source = reference.MultiHeadAttention(*args).eval()
    kernel = bench.copy_weights(source, bench_impls.MHAFlashTriton(*args)).eval()
    kernel.block_m = kernel.block_n = 16
    x = torch.rand(1, 37, 32)
    expected = source(x).detach()
    with torch.no_grad():
        got = kernel(x.cuda() if torch.cuda.is_available() else x).cpu()
    tolerance = 5e-3 if torch.cuda.is_available() else 1e-5  # compiled float32 products use TF32
    assert bench.verify(expected, got, atol=tolerance, rtol=tolerance) is None
    with pytest.raises(NotImplementedError, match="forward only"):
        kernel(x.requires_grad_(True))


def test_benchmark_times_the_python_loop_on_a_cpu_at_small_t_only(monkeypatch):
    monkeypatch.setattr(bench_impls, "FLASH_PYTHON_MAX_T", 16)
    config = bench_impls.BenchConfig("cpu", "float32", batch=1, d_model=16, num_heads=2, seq_lens=[16, 32],
                                     modes=["inference"], warmup=0, repeats=1)
    logged = []
    result = bench_impls.run_benchmark(config, log=logged.append)
    rows = {(r.impl, r.seq_len): r for r in result.rows}
    assert rows[("flash_python", 16)].status == "ok" and rows[("flash_python", 16)].median_ms > 0
    assert rows[("flash_python", 32)].status == "skipped" and "T=16" in rows[("flash_python", 32)].message
    assert not any(r.impl == "flash_triton" for r in result.rows), "the Triton kernel is timed on a GPU only"
    assert any("flash_triton skipped" in line and "GPU" in line for line in logged)


@GPU_ONLY
def test_benchmark_times_the_triton_kernel_on_a_gpu():
    pytest.importorskip("triton", reason="Triton is not installed")
    config = bench_impls.BenchConfig("cuda", "bfloat16", batch=1, d_model=128, num_heads=2, seq_lens=[256],
                                     modes=["inference", "training"], warmup=1, repeats=2)
    rows = {(r.impl, r.mode): r for r in bench_impls.run_benchmark(config, log=lambda line: None).rows}
    assert rows[("flash_triton", "inference")].status == "ok"
    assert rows[("flash_triton", "training")].status == "skipped"
    assert not any(impl == "flash_python" for impl, _ in rows)
