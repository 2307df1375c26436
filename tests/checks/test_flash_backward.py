"""Notebook 10's machinery: the backward references agree with autograd and PyTorch's SDPA, the
autograd.Function keeps only q, k, v, o and lse and passes gradcheck, the tile counter sees skipped
causal tiles in a backward, what autograd keeps is measured, the capstone's core swap keeps the
model's weights and trains like SDPA, and the Triton kernel for dK and dV agrees with autograd in the
interpreter and compiles for an A100 without a GPU."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from course_utils import backward, checks, flash, tasks
from course_utils import reference as R
from course_utils.checks import nb10
from course_utils.instructor import nb10 as family  # the backward family: instructor only
from course_utils.checks.core import CheckFailed
from course_utils.checks.nb07 import computed_tiles
from course_utils.checks.tensors import watch


def _inputs(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g, dtype=dtype) for _ in range(4))  # q, k, v, do


def _autograd(q, k, v, do, causal):
    return nb10.attention_with_grads(q, k, v, do, causal)[1:]


# ------------------------------------------------------------------------------ the references
@pytest.mark.parametrize("shape", [(1, 4), (7, 4), (2, 9, 3), (2, 3, 17, 8)])
@pytest.mark.parametrize("causal", [True, False])
def test_untiled_reference_equals_autograd_in_float64(shape, causal):
    q, k, v, do = _inputs(*shape, seed=sum(shape))
    for got, want in zip(R.attention_backward_reference(q, k, v, do, causal), _autograd(q, k, v, do, causal)):
        assert_close(got, want, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("shape", [(7, 4), (2, 3, 37, 8), (1, 1, 1, 8)])
@pytest.mark.parametrize("blocks", [(8, 16), (16, 8), (5, 3), (64, 64), (1, 1), (8, 8)])
@pytest.mark.parametrize("causal", [True, False])
def test_tiled_backward_equals_autograd_for_any_blocks(shape, blocks, causal):
    q, k, v, do = _inputs(*shape, seed=sum(shape) + 1)
    o, lse = R.flash_attention_forward(q, k, v, *blocks, causal=causal)
    got = R.flash_attention_backward(q, k, v, o, lse, do, *blocks, causal=causal)
    for g, w in zip(got, _autograd(q, k, v, do, causal)):
        assert g.shape == w.shape
        assert_close(g, w, atol=1e-12, rtol=1e-10)


def test_the_check_statistics_are_the_forward_s():
    q, k, v, _ = _inputs(2, 11, 4, seed=3)
    for causal in (True, False):
        o, lse = nb10.forward_statistics(q, k, v, causal)
        o_ref, lse_ref = R.flash_attention_forward(q, k, v, 4, 3, causal=causal)
        assert_close(o, o_ref)
        assert_close(lse, lse_ref)


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_function_matches_sdpa_at_256_in_float32(causal):
    q, k, v, do = _inputs(1, 2, 256, 16, seed=5, dtype=torch.float32)
    got = nb10.run_function(R.FlashAttention, q, k, v, do, causal, 48, 40)
    want = nb10.attention_with_grads(q, k, v, do, causal)
    for g, w in zip(got, want):
        assert_close(g, w, atol=1e-4, rtol=1e-3)


def test_flash_attention_function_passes_gradcheck_and_keeps_five_tensors():
    q, k, v, _ = (t[:, :6].clone().requires_grad_() for t in _inputs(2, 9, 3, seed=7))
    for causal in (True, False):
        assert torch.autograd.gradcheck(lambda a, b, c: R.FlashAttention.apply(a, b, c, causal, 4, 2), (q, k, v))
    out = R.FlashAttention.apply(q, k, v, True, 4, 2)
    assert [tuple(t.shape) for t in out.grad_fn.saved_tensors] == [(2, 6, 3)] * 4 + [(2, 6)]
    assert nb10._kept_problem(R.FlashAttention) is None


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [True, False])
def test_the_backward_runs_in_half_precision_with_float32_tiles(half, causal):
    """07's forward returns lse in float32: the backward computes its tiles and sums in float32, returns the
    inputs' dtype, and is within the check's bfloat16 tolerance of float64 attention without its rtol."""
    q, k, v, do = (t.to(half) for t in _inputs(1, 2, 50, 16, seed=13, dtype=torch.float32))
    got = nb10.run_function(R.FlashAttention, q, k, v, do, causal, 16, 24)
    want = nb10.attention_with_grads(*(t.double() for t in (q, k, v, do)), causal)
    for g, w in zip(got, want):
        assert g.dtype == half
        assert_close(g.double(), w, atol=nb10.HALF_ATOL, rtol=0)  # the check adds rtol=HALF_RTOL


def test_a_backward_with_tiles_in_bfloat16_fails_the_check_with_the_float32_hint():
    """The half-precision case of check_FlashAttention: a backward that keeps the inputs' dtype in its tiles
    fails there (P = exp(S - lse) is float32), and the message says to compute every tile in float32."""
    def uncast_backward(q, k, v, o, lse, do, block_q, block_k, causal=True):
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for ks in range(0, q.shape[-2], block_k):
            for qs in range(0, q.shape[-2], block_q):
                s = q[..., qs:qs + block_q, :] @ k[..., ks:ks + block_k, :].mT
                p = torch.exp(s - lse[..., qs:qs + block_q, None])
                dv[..., ks:ks + block_k, :] += p.mT @ do[..., qs:qs + block_q, :]  # float32 P, bfloat16 dO
        return dq, dk, dv

    class Uncast(torch.autograd.Function):
        forward = R.FlashAttention.forward

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            return (*uncast_backward(q, k, v, o, lse, do, ctx.block_q, ctx.block_k, ctx.causal), None, None, None)

    def outcome(cls, case):  # what the step's runner gives: its value, or the error it raised
        try:
            return nb10._function_run(cls, case)
        except Exception as error:  # noqa: BLE001
            return error

    case = nb10._half_cases()[0]
    with pytest.raises(CheckFailed, match="compute every tile in float32"):
        nb10._judge_half("FlashAttention", case, outcome(Uncast, case), ("o", *nb10.GRADS))
    nb10._judge_half("FlashAttention", case, outcome(R.FlashAttention, case), ("o", *nb10.GRADS))


def test_a_wrong_gradient_no_known_mistake_explains_is_named_with_those_that_agree():
    """Issue 36: "dv agrees; dq and dk do not: look at dS or delta", and the like for each pattern."""
    q, k, v, do = _inputs(2, 7, 4, seed=23)
    want = _autograd(q, k, v, do, True)
    dq, dk, dv = want

    def hint(got, names=nb10.GRADS, expected=want):
        return nb10._agreement_hint(expected, got, names, 1e-8, 1e-6)

    assert hint((dq * 2, dk * 2, dv)).startswith("dv agrees; dq and dk do not: dv = P^T dO needs only P")
    assert hint((dq * 2, dk, dv)).startswith("dk and dv agree; dq does not")
    assert hint((dq, dk * 2, dv)).startswith("dq and dv agree; dk does not")
    assert hint((dq, dk, dv * 2)).startswith("dq and dk agree; dv does not")
    assert hint((dq * 2, dk * 2, dv * 2)).startswith("dq, dk and dv all differ: P itself is off")
    assert hint((dq * 2, dk, dv * 2)) == "dk agrees; dq and dv do not."
    assert hint((dk * 2, dv), ("dk", "dv"), (dk, dv)).startswith("dv agrees; dk does not")
    o = torch.zeros_like(dq)
    assert hint((o + 1, dq * 2, dk, dv), ("o", *nb10.GRADS), (o, dq, dk, dv)) is None, "a wrong forward is not that"
    assert hint((dq, dk)) is None and hint((dq[:1], dk, dv)) is None


def test_forward_s_parameters_in_the_tiled_order_are_named(capsys):
    """Issue 36: a forward(ctx, q, k, v, block_q, block_k, causal) gets apply's True as block_q; the hint reads the
    class's source and names forward's order, not the call of flash_attention_forward, which is right."""
    class Tiled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, block_q=32, block_k=32, causal=True):
            return R.flash_attention_forward(q, k, v, block_q, block_k, causal)[0]

    error = ValueError("block_q must be a positive int, got True: the causal flag in a block size's place?")
    assert "forward(ctx, q, k, v, causal, block_q, block_k)" in nb10._function_diagnose(error, Tiled)
    assert nb10._function_diagnose(error, R.FlashAttention) is None


@pytest.mark.parametrize("call", [lambda q: R.flash_attention_forward(q, q, q, True, 4, 4),
                                  lambda q: R.flash_attention_backward(q, q, q, q, q[..., 0], q, True, 4, 4)])
def test_a_bool_as_a_block_size_is_named_with_the_argument_order(call):
    """FlashAttention.apply takes (q, k, v, causal, block_q, block_k), the tiled functions (..., block_q,
    block_k, causal): the causal flag passed first lands in block_q, and the message names both orders."""
    with pytest.raises(ValueError, match=r"causal flag in a block size's place\? The order is flash_attention_"):
        call(torch.randn(6, 4))


def test_apply_takes_keywords_only_after_every_earlier_argument_as_notebook_10_says():
    """Notebook 10, section 3: on the pinned torch, apply binds keywords to forward's parameters but fills in
    no default before them (a forward that takes ctx), so positional arguments stay the advice."""
    q, k, v, do = _inputs(1, 6, 4, seed=19)
    positional = R.FlashAttention.apply(q, k, v, True, 4, 4)
    assert torch.equal(R.FlashAttention.apply(q, k, v, True, block_q=4, block_k=4), positional)
    with pytest.raises(TypeError, match="missing required argument: 'causal'"):
        R.FlashAttention.apply(q, k, v, block_q=4)


@pytest.mark.parametrize("call, message", [
    (lambda q: R.flash_attention_backward(q, q, q, q, q[..., 0], q, 0, 4), "block_q must be a positive int"),
    (lambda q: R.flash_attention_backward(q, q, q, q, q, q, 2, 2), "lse must have shape"),
    (lambda q: R.flash_attention_backward(q, q[:3], q[:3], q, q[..., 0], q, 2, 2), "as many keys as queries"),
    (lambda q: R.attention_backward_reference(q, q, q, q[:, :2]), "do must have the output's shape"),
    (lambda q: R.attention_backward_reference(q, q[:, :2], q, q), "last dimension"),
])
def test_bad_input_gets_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(6, 4))


# ------------------------------------------------------------------------------ the structure check
def test_tile_counter_accepts_the_reference_and_names_a_backward_that_skips_nothing():
    q, k, v, do = _inputs(2, 40, 4, seed=11, dtype=torch.float32)
    o, lse = R.flash_attention_forward(q, k, v, 8, 16)
    _, watcher = watch(R.flash_attention_backward, q, k, v, o, lse, do, 8, 16)
    needed, _, total = computed_tiles(40, 8, 16)
    counted = sum(p.entries for p in watcher.products if p.contraction == 4 and p.out_shape[-1] != 4)
    assert counted == 2 * 2 * needed < 2 * 2 * total  # two heads, S and dP per tile
    assert nb10.tiles_problem(watcher, 40, 4, 8, 16, heads=2) is None
    _, everything = watch(R.flash_attention_backward, q, k, v, o, lse, do, 8, 16, causal=False)
    assert "no tile was skipped" in nb10.tiles_problem(everything, 40, 4, 8, 16, heads=2)


def test_kept_check_names_p_saved_and_a_tensor_on_ctx():
    class SavesP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal=True, block_q=8, block_k=8):
            s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, T)
            p = torch.softmax(s, dim=-1)
            ctx.save_for_backward(q, k, v, p)
            return p @ v

        @staticmethod
        def backward(ctx, do):
            q, k, v, p = ctx.saved_tensors
            return torch.zeros_like(q), torch.zeros_like(k), p.transpose(-2, -1) @ do, None, None, None

    assert "that is P" in nb10._kept_problem(SavesP)

    class KeepsOnCtx(R.FlashAttention):
        @staticmethod
        def forward(ctx, q, k, v, causal=True, block_q=8, block_k=8):
            o = R.FlashAttention.forward(ctx, q, k, v, causal, block_q, block_k)
            ctx.extra = o.detach().clone()
            return o

    assert "attributes of ctx" in nb10._kept_problem(KeepsOnCtx)


# ------------------------------------------------------------------------------ measuring and the capstone
def _naive(q, k, v):
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def test_saved_for_backward_sees_p_in_naive_attention_and_only_o_and_lse_in_flash():
    q, k, v, _ = _inputs(1, 2, 32, 8, seed=13, dtype=torch.float32)
    naive = [s for s in backward.saved_for_backward(_naive, q, k, v) if not s.is_input]
    assert (1, 2, 32, 32) in [s.shape for s in naive]
    flash = [s for s in backward.saved_for_backward(lambda a, b, c: R.FlashAttention.apply(a, b, c, True, 8, 8),
                                                    q, k, v) if not s.is_input]
    assert sorted(s.shape for s in flash) == [(1, 2, 32), (1, 2, 32, 8)]
    assert q.grad is None and not q.requires_grad  # the caller's tensors are untouched


def test_peak_memory_with_backward_grows_like_t_squared_for_naive_only():
    peaks = {}
    for T in (64, 128):
        q, k, v, _ = _inputs(1, 2, T, 8, seed=T, dtype=torch.float32)
        peaks[T] = (backward.peak_memory_with_backward(_naive, q, k, v),
                    backward.peak_memory_with_backward(lambda a, b, c: R.FlashAttention.apply(a, b, c, True, 16, 16),
                                                       q, k, v))
    assert peaks[128][0] / peaks[64][0] > 3  # naive: about 4x for twice T
    assert peaks[128][1] / peaks[64][1] < 2.5  # tiled: about 2x
    assert peaks[128][1] < peaks[128][0] / 4


def _model(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return R.TinyGPT(tasks.VOCAB_SIZE, 16, 2, 2, 8, dropout)


def test_swapping_the_core_keeps_the_weights_and_the_outputs():
    model = _model()
    before = [(n, p) for n, p in model.named_parameters()]
    idx = torch.randint(0, tasks.VOCAB_SIZE, (3, 8), generator=torch.Generator().manual_seed(1))
    logits = model.eval()(idx)
    swapped = backward.swap_attention_core(model, lambda q, k, v: R.FlashAttention.apply(q, k, v, True, 4, 4))
    after = [(n, p) for n, p in swapped.named_parameters()]
    assert [n for n, _ in before] == [n for n, _ in after] and all(a is b for (_, a), (_, b) in zip(before, after))
    assert_close(swapped(idx), logits, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="dropout"):
        backward.swap_attention_core(_model(dropout=0.1), lambda q, k, v: q)
    with pytest.raises(TypeError, match="blocks"):
        backward.swap_attention_core(torch.nn.Linear(2, 2), lambda q, k, v: q)


def test_a_model_on_the_flash_core_trains_like_one_on_sdpa():
    task = tasks.ReversalTask(num_digits=4, held_out_size=10, seed=0)
    cores = [lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             lambda q, k, v: R.FlashAttention.apply(q, k, v, True, 4, 4)]
    losses = []
    for core in cores:
        model = backward.swap_attention_core(_model(), core)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(0)
        losses.append([R.train_step(model, task.batch(16, generator), optimizer) for _ in range(5)])
    assert_close(torch.tensor(losses[0]), torch.tensor(losses[1]), atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------ Triton
HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
@pytest.mark.parametrize("causal, shape, blocks", [(True, (2, 1, 37, 16), (16, 16)), (False, (1, 2, 20, 32), (16, 32)),
                                                   (True, (1, 1, 48, 16), (32, 16))])
def test_reference_backward_kernel_agrees_with_autograd(causal, shape, blocks):
    flash.use_interpreter_without_gpu()
    q, k, v, do = _inputs(*shape, seed=sum(shape), dtype=torch.float32)
    o, lse = nb10.forward_statistics(q, k, v, causal)
    dk, dv = backward.launch_backward(R.flash_attention_backward_triton, q, k, v, o, lse, do, causal, *blocks)
    _, _, dk_want, dv_want = nb10.attention_with_grads(q, k, v, do, causal)
    tolerance = 5e-3 if torch.cuda.is_available() else 1e-5
    assert_close(dk, dk_want, atol=tolerance, rtol=0)
    assert_close(dv, dv_want, atol=tolerance, rtol=0)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_the_kernel_needs_its_two_casts_in_half_precision():
    """lse and delta are float32, so p and ds are: tl.dot refuses them with float16 dO and q unless cast, as the
    notebook says. float16, not bfloat16: Triton 3.6's interpreter computes bfloat16 wrongly (NumPy has none);
    the bfloat16 kernel is compiled for a GPU below."""
    import inspect

    import triton

    flash.use_interpreter_without_gpu()
    q, k, v, do = (t.half() for t in _inputs(1, 2, 40, 16, seed=17, dtype=torch.float32))
    o, lse = R.flash_attention_forward(q, k, v, 16, 16)
    dk, dv = backward.launch_backward(R.flash_attention_backward_triton, q, k, v, o, lse, do, True, 16, 16)
    _, _, dk_want, dv_want = nb10.attention_with_grads(*(t.double() for t in (q, k, v, do)), True)
    assert dk.dtype == dv.dtype == torch.float16
    assert_close(dk.double(), dk_want, atol=2e-3, rtol=0)
    assert_close(dv.double(), dv_want, atol=2e-3, rtol=0)
    source = inspect.getsource(R.flash_attention_backward_triton)
    for cast in ("tl.trans(p).to(do.dtype)", "tl.trans(ds).to(q.dtype)"):
        assert source.count(cast) == 1
    namespace = {"tl": R.tl}
    exec(source.replace(".to(do.dtype), do)", ", do)").replace(".to(q.dtype), q)", ", q)"), namespace)  # noqa: S102
    with pytest.raises(Exception, match="same dtype"):
        backward.launch_backward(triton.jit(namespace["flash_attention_backward_triton"]), q, k, v, o, lse, do, True,
                                 16, 16)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_launch_backward_refuses_sizes_the_kernel_cannot_take():
    q = torch.randn(1, 8, 12)
    with pytest.raises(ValueError, match="head size D"):
        backward.launch_backward(R.flash_attention_backward_triton, q, q, q, q, q[..., 0], q)
    q = torch.randn(1, 8, 16)
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        backward.launch_backward(R.flash_attention_backward_triton, q, q, q, q, q[..., 0], q, block_n=24)
    with pytest.raises(ValueError, match="lse must have shape"):
        backward.launch_backward(R.flash_attention_backward_triton, q, q, q, q, q, q)


def test_without_triton_the_kernel_check_is_skipped_with_a_reason_and_grading_fails(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    checks.check_flash_attention_backward_triton(lambda *a: None)
    assert "skipped" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="grader needs Triton"):
        checks.check_flash_attention_backward_triton(lambda *a: None, hidden=True)


_COMPILE = """
import os
os.environ.pop("TRITON_INTERPRET", None)  # a compiled kernel, not an interpreted one
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from course_utils import reference

kernel = triton.jit(reference.flash_attention_backward_triton)
for dtype, causal in (("bf16", True), ("fp32", False)):
    signature = {name: "*" + dtype for name in ("Q", "K", "V", "DO", "DK", "DV")}
    signature.update({"LSE": "*fp32", "DELTA": "*fp32", "stride_b": "i32", "stride_t": "i32", "T": "i32",
                      "scale": "fp32"})
    signature.update({name: "constexpr" for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL")})
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={"HEAD_DIM": 64, "BLOCK_M": 64, "BLOCK_N": 64, "CAUSAL": causal})
    compiled = triton.compile(source, target=GPUTarget("cuda", 80, 32))
    print(dtype, causal, "cubin" in compiled.asm)
"""


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_reference_backward_kernel_compiles_for_a_gpu_without_one():
    """The interpreter runs Python, not the compiler: compile the kernel for an A100 (sm_80) too, in bf16
    and float32. Triton's bundled ptxas needs no GPU."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["bf16", "True", "True", "fp32", "False", "True"], done.stdout


@pytest.mark.parametrize("notebook, exercise, label, words", [
    ("10_flash_attention_backward", "flash_attention_backward_triton", "held-out D: query_loop_stops_at_key_block",
     "not stopping at its own key block"),
    ("07_flash_attention_from_scratch", "flash_attention_triton", None, None),
    ("10_flash_attention_backward", "flash_attention_backward_triton", None, None),
])
def test_a_kernels_ladder_runs_where_the_kernel_is_compiled(monkeypatch, notebook, exercise, label, words):
    """A Triton kernel's ladder (checks/ladder.py, compiled_only) runs only where the kernel runs compiled (a GPU):
    in the interpreter its seven rungs cost about 0.2 s a check. Here, as on a GPU, in the interpreter: the
    solution still passes with the rungs in the plan (their recorded values agree), and a wrong kernel's message
    names the first rung that goes wrong."""
    from course_utils.checks import ladder
    from tests.fixtures.answers import load, solution_answers
    from tests.support import harness

    monkeypatch.setattr(ladder, "compiled_here", lambda: True)
    spec = checks.SPECS[exercise]
    assert any(ladder.is_rung(s) for s in spec.steps(hidden=False))
    source = load(notebook).WRONG[exercise][label] if label else solution_answers(notebook)[exercise]
    passed, message = harness.check_verdict(notebook, exercise, source)
    assert passed == (label is None), message
    if words:
        assert words in message, message
    monkeypatch.setattr(ladder, "compiled_here", lambda: False)
    assert not any(ladder.is_rung(s) for s in spec.steps(hidden=False))


def test_rows_wrong_by_key_block_blame_the_query_loop_only_while_dv_is_wrong_too():
    """symptoms.where_wrong's key-block patterns (dk wrong for the first key blocks: does the query loop run to T?)
    are not said where dv agrees (``loops_right``): dv = P^T dO sums over every tile the loops visit, so a loop's
    range cannot be what is wrong (held-out G: delta read at the key positions was blamed on the query loop)."""
    from course_utils.checks import symptoms

    want = torch.ones(1, 1, 8, 2, dtype=torch.float64)  # (B, H, T, D): two key blocks of 4
    got = want.clone()
    got[..., :4, :] += 1.0  # the first key block wrong, the last right
    tokens = symptoms.Tokens(block=4, other_block=4, causal=True, rows="key")
    assert "Does the query loop for a key block run to T" in symptoms.where_wrong(tokens, want, got, "dk")
    assert "query loop" not in (symptoms.where_wrong(tokens, want, got, "dk", loops_right=True) or "")


@pytest.mark.parametrize("kind", ["reference", "tiled", "kernel"])
def test_the_backward_family_names_each_variant_and_not_the_right_gradients(kind: str) -> None:
    """Issue 36, batch H: each one-thing-changed backward of nb10's family (a comparison turned, a slice shifted, an
    operand swapped, a sign flipped) is named by its own words, whichever the exercise's layout; the right gradients
    get no words. Float64 models on a small case: no launch."""
    q, k, v, do = nb10._inputs(1, 2, 12, 4, seed=7)
    o, lse = nb10.forward_statistics(q, k, v, True)
    case = {"reference": nb10.Case("ref", (q, k, v, do), {"causal": True}),
            "tiled": nb10.Case("tiled", (q, k, v, o, lse, do, 4, 4), {"causal": True}),
            "kernel": nb10.Case("kernel", (q, k, v, o, lse, do), {"causal": True, "block_m": 4, "block_n": 4})}[kind]
    names = ("dk", "dv") if kind == "kernel" else nb10.GRADS
    pick = (lambda grads: grads[1:]) if kind == "kernel" else (lambda grads: grads)
    exercise = {"reference": "attention_backward_reference", "tiled": "flash_attention_backward",
                "kernel": "flash_attention_backward_triton"}[kind]
    want = pick(nb10.attention_with_grads(q, k, v, do, True)[1:])
    assert nb10._backward_family_hint(exercise, case, want, want, names, 1e-8, 1e-6) is None
    variants = family._backward_variants(kind)
    assert len(variants) >= 6
    named = 0
    for words, change in variants:
        model = family._backward_model(case, *nb10._backward_layout(case)[1:], **change)
        got = tuple(g.reshape(w.shape) for g, w in zip(pick(model), want))
        hint = nb10._backward_family_hint(exercise, case, want, got, names, 1e-8, 1e-6)
        if all(torch.allclose(g, w) for g, w in zip(got, want)):  # a change this case cannot show (dq in a kernel)
            assert hint is None
            continue
        assert hint is not None and words in hint, (words, hint)
        named += 1
    assert named >= 6
