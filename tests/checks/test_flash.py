"""Notebook 07's machinery: the references agree with PyTorch's attention, the tensor watcher catches a
(T, T) tensor and names its line, the counter of computed scores sees skipped causal tiles, peak
memory is measured, and the Triton kernel runs (interpreted on a CPU) or is skipped with a reason."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from course_utils import checks, flash
from course_utils import reference as R
from course_utils.checks import nb07
from course_utils.checks.core import CheckFailed
from course_utils.checks.tensors import TensorWatcher, watch

HAS_TRITON = importlib.util.find_spec("triton") is not None


def _qkv(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g, dtype=dtype) for _ in range(3))


def _lse(q, k, causal):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[-2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return s.logsumexp(-1)


# ------------------------------------------------------------------------------ the references
@pytest.mark.parametrize("shape", [(7, 4), (2, 37, 8), (2, 3, 40, 16), (1, 1, 1, 8)])
@pytest.mark.parametrize("blocks", [(8, 16), (16, 8), (5, 3), (64, 64), (1, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_forward_agrees_with_sdpa_to_1e5(shape, blocks, causal):
    q, k, v = _qkv(*shape, seed=sum(shape))
    out, lse = R.flash_attention_forward(q, k, v, *blocks, causal=causal)
    assert out.shape == q.shape and lse.shape == q.shape[:-1]
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal), atol=1e-5, rtol=0)
    assert_close(lse, _lse(q, k, causal), atol=1e-5, rtol=0)


def test_flash_attention_forward_is_stable_and_differentiable_in_float64():
    q, k, v = _qkv(2, 9, 4, seed=1, dtype=torch.float64)
    big = q * 300  # scores in the thousands: exp would overflow without the running maximum
    out, _ = R.flash_attention_forward(big, k, v, 4, 3)
    assert_close(out, F.scaled_dot_product_attention(big, k, v, is_causal=True))
    q, k, v = (t[:, :5].clone().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: R.flash_attention_forward(a, b, c, 2, 3)[0], (q, k, v))


@pytest.mark.parametrize("block_size", [1, 2, 3, 8])
def test_online_softmax_agrees_with_torch_including_minus_inf_and_large_values(block_size):
    inf = float("-inf")
    x = torch.tensor([[inf, inf, 1.0, 1000.0, 2.0], [1000.0, 1001.0, 1002.0, -5.0, inf], [3.0, 1.0, 4.0, 1.0, 5.0]])
    assert_close(R.online_softmax(x, block_size), torch.softmax(x, dim=-1))
    batch = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(2)) * 50
    assert_close(R.online_softmax(batch, block_size), torch.softmax(batch, dim=-1))


@pytest.mark.parametrize("call, message", [
    (lambda q: R.flash_attention_forward(q, q, q, 0, 4), "block_q must be a positive int"),
    (lambda q: R.flash_attention_forward(q, q, q, 4, 2.5), "block_k must be a positive int"),
    (lambda q: R.flash_attention_forward(q, q[:3], q[:3], 2, 2), "as many keys as queries"),
    (lambda q: R.flash_attention_forward(q, q[:, :2], q, 2, 2), "last dimension"),
    (lambda q: R.online_softmax(q, 0), "block_size must be a positive int"),
])
def test_bad_input_gets_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(6, 4))


# ------------------------------------------------------------------------------ the watcher
def _naive(q, k, v):
    scores = q @ k.transpose(-2, -1)  # the line the check must name
    return torch.softmax(scores, dim=-1) @ v


def test_watcher_catches_a_full_score_matrix_and_names_the_line():
    q, k, v = _qkv(2, 40, 4)
    _, watcher = watch(_naive, q, k, v)
    problem = nb07.full_matrix_problem(watcher, 40)
    assert problem and "(2, 40, 40)" in problem and "scores = q @ k.transpose(-2, -1)" in problem
    assert f"line {_naive.__code__.co_firstlineno + 1}" in problem


def test_watcher_sees_no_full_matrix_in_the_tiled_reference_and_counts_its_scores():
    q, k, v = _qkv(2, 40, 4)
    _, watcher = watch(R.flash_attention_forward, q, k, v, 8, 16)
    assert nb07.full_matrix_problem(watcher, 40) is None
    needed, crossing, total = nb07.computed_tiles(40, 8, 16)
    assert watcher.score_entries(4, 4) == 2 * needed < 2 * total
    assert nb07.skipped_blocks_problem(watcher, 40, 4, 4, 8, 16, heads=2) is None


def test_counter_names_a_loop_that_skips_no_tile_and_one_that_skips_too_few():
    q, k, v = _qkv(2, 40, 4)
    _, everything = watch(R.flash_attention_forward, q, k, v, 8, 16, causal=False)
    assert "no key block was skipped" in nb07.skipped_blocks_problem(everything, 40, 4, 4, 8, 16, heads=2)

    def one_tile_too_many(q, k, v):  # an off-by-one: the key loop runs one block past the query block
        for start in range(0, 40, 8):
            stop = min(40, (start // 16 + 2) * 16)
            for k_start in range(0, stop, 16):
                q[:, start:start + 8] @ k[:, k_start:k_start + 16].transpose(-2, -1)

    _, extra = watch(one_tile_too_many, q, k, v)
    assert "still computed" in nb07.skipped_blocks_problem(extra, 40, 4, 4, 8, 16, heads=2)


def test_causal_block_grid_for_a_long_sequence():
    grid = flash.causal_block_grid(4096, 128, 128)
    assert int((grid > 0).sum()) == 528 and int((grid == 1).sum()) == 32 and int((grid == 0).sum()) == 496
    assert flash.causal_block_grid(40, 8, 16).tolist()[0] == [1, 0, 0]


def test_peak_memory_is_measured_on_the_cpu():
    q, k, v = _qkv(1, 2, 256, 16)
    naive = flash.measure_peak_memory(_naive, q, k, v)
    tiled = flash.measure_peak_memory(R.flash_attention_forward, q, k, v, 32, 32)
    one_scores = 2 * 256 * 256 * 4
    assert one_scores <= naive <= 3 * one_scores, "the scores and the weights"
    assert tiled < one_scores / 4
    assert flash.measure_peak_memory(lambda t: t.transpose(-2, -1)[0], q) == 0, "a view of an input is not new memory"


def test_watcher_sees_reductions_over_a_whole_row():
    x = torch.randn(3, 12)
    with TensorWatcher() as watcher:
        x.amax(dim=-1)
        x[:, :4].sum(dim=-1)
    assert [r.reduces_last_dim_longer_than(4) for r in watcher.reductions] == [True, False]


# ------------------------------------------------------------------------------ Triton
@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_reference_kernel_agrees_with_sdpa():
    for causal in (True, False):
        q, k, v = _qkv(2, 1, 37, 16, seed=3)
        out, lse = flash.launch(R.flash_attention_triton, q, k, v, causal=causal, block_m=16, block_n=16)
        tolerance = 5e-3 if torch.cuda.is_available() else 1e-5
        assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal), atol=tolerance, rtol=0)
        assert_close(lse, _lse(q, k, causal), atol=tolerance, rtol=0)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_launch_refuses_sizes_the_kernel_cannot_take():
    q = torch.randn(1, 8, 12)
    with pytest.raises(ValueError, match="head size D"):
        flash.launch(R.flash_attention_triton, q, q, q)
    q = torch.randn(1, 8, 16)
    with pytest.raises(ValueError, match="block_m must be a power of two"):
        flash.launch(R.flash_attention_triton, q, q, q, block_m=24)


def _overflowing_kernel(X, OUT, N: tl.constexpr):  # noqa: F821 - ``tl`` is set by the test that jit-compiles it
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    tl.store(OUT + offs, x * 1_000_000 + x)  # int32: overflows for 3,000 and 4,000


@pytest.mark.skipif(not HAS_TRITON or torch.cuda.is_available(), reason="the interpreter runs without a GPU only")
def test_the_interpreter_s_overflow_checks_are_off_and_were_dropped_anyway(monkeypatch):
    """flash._skip_dropped_overflow_checks: Triton's interpreter computes an overflow check for each integer
    operation and hands it to device_assert, which drops it outside debug mode. With the check on or off, an
    int32 product that overflows runs the same: no error, the same wrapped values."""
    import dataclasses

    from triton.runtime import interpreter

    monkeypatch.setitem(globals(), "tl", flash.import_triton()[1])  # what the kernel's annotation and body read
    builder = interpreter.interpreter_builder
    assert builder.options.debug is False and builder.options.sanitize_overflow is False
    x = torch.tensor([1, 2, 3_000, 4_000], dtype=torch.int32)
    run = flash._jitted(_overflowing_kernel)
    results = []
    for sanitize in (True, False):
        monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=sanitize))
        out = torch.zeros_like(x)
        run[(1,)](x, out, N=4)
        results.append(out)
    wrapped = ((x.long() * 1_000_001 + 2**31) % 2**32 - 2**31).int()
    assert torch.equal(results[0], wrapped) and torch.equal(results[1], wrapped)


@pytest.mark.skipif(not HAS_TRITON or torch.cuda.is_available(), reason="the interpreter runs without a GPU only")
def test_the_interpreter_finds_the_builtins_once_and_replaces_what_its_own_walk_would(monkeypatch):
    """flash._find_builtins_once: the interpreter's patching of triton.language, before a launch and at a helper's
    call inside one, replaces the same attributes in the same order as Triton's own walk, restores them all,
    and the course's kernel computes the same output either way."""
    from triton.runtime import interpreter

    from course_utils import reference

    flash.import_triton()
    ours = interpreter._patch_builtin
    assert getattr(ours, "course_utils_fix", False), "use_interpreter_without_gpu did not install the fix"
    fn = flash._jitted(reference.flash_attention_triton).fn

    def replaced(patch_builtin) -> tuple[list, list, dict]:
        monkeypatch.setattr(interpreter, "_patch_builtin", patch_builtin)
        before = {id(o): dict(vars(o)) for o in (interpreter.tl, interpreter.tl.core, interpreter.tl.math, interpreter.tl.tensor)}
        outer = interpreter._patch_lang(fn)
        names = [(id(obj), name) for obj, name, _ in outer._changes]
        inner = interpreter._patch_lang(fn)  # a helper's call inside the launch
        nested = [(id(obj), name) for obj, name, _ in inner._changes if not name.startswith("__")]
        inner.restore()
        outer.restore()
        after = {id(o): dict(vars(o)) for o in (interpreter.tl, interpreter.tl.core, interpreter.tl.math, interpreter.tl.tensor)}
        return names, nested, {k: before[k] == after[k] for k in before}

    replaced(ours.course_utils_original)  # the first restore leaves tl.tensor's inherited attributes its own
    mine, walk = replaced(ours), replaced(ours.course_utils_original)
    assert mine[0] == walk[0] and len(mine[0]) > 100
    assert mine[1] == walk[1]
    assert all(mine[2].values()) and all(walk[2].values())
    q = torch.randn(1, 2, 40, 16, generator=torch.Generator().manual_seed(0))  # (B, H, T, D)
    outputs = []
    for patch_builtin in (ours, ours.course_utils_original):
        monkeypatch.setattr(interpreter, "_patch_builtin", patch_builtin)
        outputs.append(flash.launch(reference.flash_attention_triton, q, q, q))
    assert all(torch.equal(a, b) for a, b in zip(*outputs))


def test_without_triton_the_check_is_skipped_with_a_reason_and_grading_fails(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    runs, why = flash.triton_status()
    assert not runs and "not installed" in why
    triton, tl = flash.import_triton()
    kernel = triton.jit(lambda x: x)
    assert kernel(3) == 3 and tl.constexpr is not None
    checks.check_flash_attention_triton(kernel)
    assert "skipped" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="grader needs Triton"):
        checks.check_flash_attention_triton(kernel, hidden=True)


def test_grading_follows_nbgrader_execution(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert not flash.grading()
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert flash.grading()


_COMPILE = """
import os
os.environ.pop("TRITON_INTERPRET", None)  # a compiled kernel, not an interpreted one
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from course_utils import reference

kernel = triton.jit(reference.flash_attention_triton)
for dtype, causal in (("bf16", True), ("fp32", False)):
    signature = {name: "*" + dtype for name in ("Q", "K", "V", "O")}
    signature["LSE"] = "*fp32"
    signature.update({name: "i32" for name in ("stride_qb", "stride_qt", "stride_kb", "stride_kt", "stride_vb",
                                               "stride_vt", "stride_ob", "stride_ot", "T")})
    signature["scale"] = "fp32"
    signature.update({name: "constexpr" for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL")})
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={"HEAD_DIM": 64, "BLOCK_M": 128, "BLOCK_N": 64, "CAUSAL": causal})
    compiled = triton.compile(source, target=GPUTarget("cuda", 80, 32))
    print(dtype, causal, "cubin" in compiled.asm)
"""


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_reference_kernel_compiles_for_a_gpu_without_one():
    """The interpreter runs Python, not the compiler: compile the kernel for an A100 (sm_80) too, in bf16
    (the benchmark) and float32 (a student's self-check on a GPU). Triton's bundled ptxas needs no GPU."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["bf16", "True", "True", "fp32", "False", "True"], done.stdout


def test_the_pinned_triton_is_the_one_the_student_edition_installs_on_linux():
    from grader import edition

    assert f"triton=={flash.TRITON_VERSION}" in (course_root() / "constraints.txt").read_text().splitlines()
    assert f"triton=={flash.TRITON_VERSION}; platform_system == 'Linux'" in edition._requirements().splitlines()


def test_the_skip_message_names_the_one_command_that_makes_the_check_run(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    monkeypatch.setattr(flash.sys, "platform", "linux")
    runs, why = flash.triton_status()
    assert not runs and f'%pip install "triton=={flash.TRITON_VERSION}"' in why
    monkeypatch.setattr(flash.sys, "platform", "darwin")
    assert "Colab" in flash.triton_status()[1]


def course_root():
    from grader import course

    return course.repo_root()


# ------------------------------------------------------------------------------ the engine's shared diagnoses
def _raised(fn):
    try:
        fn()
    except Exception as error:  # noqa: BLE001
        return error
    raise AssertionError("expected an error")


def test_a_raw_matmul_shape_error_is_translated_into_operands_and_a_missing_transpose():
    from course_utils.checks.core import shape_error_hint

    hint = shape_error_hint(_raised(lambda: torch.randn(4, 3) @ torch.randn(4, 2)))
    assert "(4, 3)" in hint and "(4, 2)" in hint and "columns (3) must equal the second's rows (4)" in hint
    assert "missing transpose" in hint and "A.T @ B" in hint
    hint = shape_error_hint(_raised(lambda: torch.randn(5, 3) @ torch.randn(4, 3)))
    assert "A @ B.T" in hint
    error = _raised(lambda: torch.randn(2, 6, 2) - torch.randn(2, 6))
    hint = shape_error_hint(error, [(2, 6, 2)])  # the sizes of a (2, 6, 2) tensor minus its sum over dim 2
    assert "keepdim=True" in hint and "(2, 6, 2) tensor meeting itself reduced over dimension 2" in hint
    hint = shape_error_hint(error)  # nothing to confirm a lost reduction with: says what it saw, asks
    assert "2 entries along dimension 2, the other 6" in hint and "keepdim" not in hint
    assert "keepdim" not in shape_error_hint(error, [(3, 5, 4)])
    assert shape_error_hint(ValueError("something else")) is None


def test_factors_name_a_mix_of_natural_and_base_2_logs_and_exact_multiples():
    from course_utils.checks.core import name_factor, transformation_hint

    assert "log2(e)" in name_factor(1 / math.log(2)) and "base-2" in name_factor(1 / math.log(2))
    assert "ln 2" in name_factor(math.log(2))
    want = torch.rand(3, 4) + 0.5
    assert "2 times the expected" in transformation_hint(want, 2 * want)
    assert "log2(e)" in transformation_hint(want, want / math.log(2))
    assert name_factor(3.7) == ""


def test_an_online_softmax_hint_never_speaks_of_a_dim_argument():
    x = torch.randn(4, 6)
    wrong = torch.softmax(x, dim=0)  # sums to 1 along dim 0: what statistics without keepdim can give
    hint = nb07._online_diagnose(nb07.Case("c", (x, 2)), wrong, torch.softmax(x, dim=-1))
    assert "`dim`" not in hint and "keepdim" in hint


@pytest.mark.parametrize("shape, blocks, words", [
    ((1, 2, 32, 12), (16, 16), "head size D in"),
    ((1, 2, 32, 16), (24, 16), "block_m must be a power of two of at least 16, got 24"),
    ((1, 2, 32, 16), (16, 8), "block_n must be a power of two of at least 16, got 8"),
])
def test_both_kernel_launchers_name_what_triton_cannot_take(shape, blocks, words):
    """The forward (notebook 07) and backward (notebook 10) launchers check their inputs in one place."""
    from course_utils import backward

    q = torch.zeros(shape)
    with pytest.raises(ValueError, match=words):
        flash.launch(lambda *a, **k: None, q, q, q, True, *blocks)
    with pytest.raises(ValueError, match=words):
        backward.launch_backward(lambda *a, **k: None, q, q, q, q, torch.zeros(shape[:-1]), q, True, *blocks)
