"""Self-checks for notebook 06: efficient multi-head attention and FLOP counting.

The module checks follow notebook 05's order: parameter shapes (one ``qkv`` layer, ``out_proj``,
``qkv_bias``), a finite output, the values compared in ``eval()`` mode with the known mistakes
named (a wrong layout of ``qkv(x)``, a missing ``is_causal``, SDPA's mask convention), then
causality, the mask buffer, dropout only in ``train()`` mode, and for SDPA a single call of the
fused kernel. A wrong FLOP count is named by its ratio to the expected one. A timer runs on a
simulated device (:class:`FakeDevice`): a GPU whose work finishes only when synchronised, whose first
calls are slow, and a CPU without CUDA; the device counts calls, synchronisations and clock reads, so
a missing warm-up or synchronisation is named.

Each check is a spec (:mod:`course_utils.checks.spec`): the module classes are one probed construction per
set of constructor arguments, with every forward pass their checks make (:mod:`course_utils.checks.probed`),
for ``MHAPyTorchSDPA`` with each pass's count of ``F.scaled_dot_product_attention`` calls
(``probe.CallCounter``); ``attention_flops`` is called; the timer runs once per simulated device, which
gives what it returned or raised and its counts of calls, synchronisations and clock reads. The same
judge reads them in the kernel and, under the grader, outside.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable
from unittest import mock

import torch

from course_utils.checks import probe as _probe
from course_utils.checks import probed, spec
from course_utils.checks.core import NOT_IMPLEMENTED, Case, CheckFailed, fail, hidden_cases, is_stub_error, rand, \
    reference_function
from course_utils.checks.expected import expect
from course_utils.checks.modules import ProbePlan, causal_probes
from course_utils.checks.probe import Probe
from course_utils.data import book_batch

__all__ = ["check_MultiHeadAttentionCombinedQKV", "check_MHAPyTorchSDPA", "check_attention_flops", "check_time_cuda_aware"]


def _configs() -> list[tuple[tuple, list[Case]]]:
    """Constructor arguments and inputs shared by both module checks, without dropout."""
    return [
        ((3, 2, 6, 0.0, 2), [Case("book batch (2, 6, 3)", (book_batch(),))]),
        ((8, 12, 10, 0.0, 3), [Case("T=10 = context_length", (rand(2, 10, 8, seed=61),)),
                               Case("T=7 < context_length", (rand(2, 7, 8, seed=62),))]),
    ]


def _dropout_config() -> tuple[tuple, list[Case]]:
    return (4, 6, 8, 0.5, 2), [Case("dropout=0.5, T=8", (rand(2, 8, 4, seed=76),))]


#: Compared first, in eval() mode: T = context_length (a shorter input gets its own message later).
def _values_config() -> tuple[tuple, list[Case]]:
    build, cases = _configs()[1]
    return build, cases[:1]


def _qkv_shapes(got: list, want: list, build: tuple) -> str | None:
    d_in, d_out = build[0], build[1]
    if got.count((d_out, d_in)) == 3 and (3 * d_out, d_in) in want:
        return ("three projections instead of one: self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias) computes "
                "queries, keys and values with one matrix product")
    return None


# ------------------------------------------------------------------------------------------
# MultiHeadAttentionCombinedQKV
# ------------------------------------------------------------------------------------------
def _combined_configs(more: dict) -> list[tuple[tuple, list[Case]]]:
    return [_dropout_config()] + _configs() + more["configs"]


def _combined_hidden(hidden: bool) -> dict:
    return hidden_cases("MultiHeadAttentionCombinedQKV") if hidden else {"configs": [], "causal": []}


def _combined_plan(hidden: bool) -> list[spec.Step]:
    more = _combined_hidden(hidden)
    configs = _combined_configs(more)
    return probed.steps(probed.attention_class_plan([build for build, _ in configs], _values_config(), configs,
                                                    more["causal"]))


def _combined_judge(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "MultiHeadAttentionCombinedQKV"
    more = _combined_hidden(outcomes.hidden)
    configs = _combined_configs(more)
    return probed.attention_class(exercise, probed.views(exercise, plan, outcomes), [build for build, _ in configs],
                                  _values_config(), configs, more["causal"], _qkv_shapes)


check_MultiHeadAttentionCombinedQKV = spec.declare(spec.Spec(
    "MultiHeadAttentionCombinedQKV", _combined_plan, _combined_judge, runners={spec.MODULE: spec.run_module}),
    """Outputs equal the expected ones for the same seed in eval() and train() mode; one ``qkv`` layer;
    a causal mask buffer cut to the input's length; no position sees the future.""")


# ------------------------------------------------------------------------------------------
# MHAPyTorchSDPA
# ------------------------------------------------------------------------------------------
_SDPA = "scaled_dot_product_attention"


def _counted(exercise: str, plan: list[spec.Step], outcomes: spec.Outcomes) -> None:
    """Refuse (``spec.refuse``) unless every pass that ran came back with its count of SDPA calls, a whole
    number within ``probe.MAX_CALLS``: ``spec.run_module`` counts them in every pass."""
    for step in plan:
        found = outcomes[step.key]
        for one in found.get("passes", []) if isinstance(found, dict) and isinstance(found.get("passes"), list) else []:
            calls = one.get("calls") if isinstance(one, dict) else None
            if not (isinstance(calls, dict) and set(calls) == {_SDPA} and type(calls[_SDPA]) is int
                    and 0 <= calls[_SDPA] <= _probe.MAX_CALLS):
                spec.refuse(exercise, "count of calls")


def _check_one_sdpa_call(exercise: str, view: spec.ModuleView, x: torch.Tensor) -> None:
    """The ``eval()`` pass on ``x`` (under no seed of the check's) called the fused kernel once."""
    probed.output(exercise, view, "eval", None, x, f"T={x.shape[1]}")
    count = view.calls("eval", None, x)[_SDPA]
    if count != 1:
        fail(exercise, f"forward called F.scaled_dot_product_attention {count} times; it should call it once, "
                       f"on queries, keys and values of shape (b, num_heads, T, head_dim)")


def _sdpa_hidden(hidden: bool) -> dict:
    return hidden_cases("MHAPyTorchSDPA") if hidden else {"configs": [], "dropout": [], "causal": []}


def _sdpa_inputs() -> tuple[tuple, torch.Tensor, torch.Tensor]:
    """The construction checked for causality and its count of calls, and the inputs of both."""
    return _values_config()[0], rand(2, 10, 8, seed=74), rand(2, 10, 8, seed=73)


def _sdpa_plan(hidden: bool) -> list[spec.Step]:
    extra = _sdpa_hidden(hidden)
    configs, dropout = _configs() + extra["configs"], [_dropout_config()] + extra["dropout"]
    main_build, x_causal, x_calls = _sdpa_inputs()
    plan = ProbePlan()
    for build, _ in configs + dropout:
        plan.add(build)
    for build, cases in configs:  # finite_then_values
        plan.add(build, *[Probe("eval", 7, case.args[0]) for case in cases])
    plan.compared(configs, diagnosed_causal=True)
    plan.add(main_build, *causal_probes(x_causal))
    plan.causal(extra["causal"])
    plan.add(main_build, Probe("eval", None, x_calls))  # _check_one_sdpa_call: its calls are counted
    for build, cases in dropout:  # finite, dropout_modes
        plan.add(build, *[Probe("eval", 7, case.args[0]) for case in cases],
                 *[Probe(mode, seed, cases[0].args[0]) for mode in ("eval", "train") for seed in (1, 2)])
    plan.compared(dropout, train=True, diagnosed_causal=True)
    return probed.steps(plan.items())


def _sdpa_judge(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "MHAPyTorchSDPA"
    views = probed.views(exercise, plan, outcomes)
    _counted(exercise, plan, outcomes)
    extra = _sdpa_hidden(outcomes.hidden)
    configs, dropout = _configs() + extra["configs"], [_dropout_config()] + extra["dropout"]
    main_build, x_causal, x_calls = _sdpa_inputs()
    probed.module_checks(exercise, views, [build for build, _ in configs + dropout], _qkv_shapes)
    diagnose = probed.not_causal(exercise, views)
    for config in configs:
        probed.finite_then_values(exercise, views, config, diagnose)
    main = views[main_build]
    probed.built(exercise, main, main_build)
    probed.causal_module(exercise, main, x_causal)
    for case in extra["causal"]:
        probed.built(exercise, views[case.build], case.build)
        probed.causal_module(exercise, views[case.build], case.args[0])
    _check_one_sdpa_call(exercise, main, x_calls)
    for build, cases in dropout:
        probed.built(exercise, views[build], build)
        for case in cases:
            probed.finite(exercise, views[build], case.args[0], f"built with {build}, {case.name}")
        probed.dropout_modes(exercise, views[build], cases[0].args[0], f"built with {build}", fix="sdpa")
    probed.compare(exercise, views, dropout, train=True, diagnose=diagnose)
    return (f"outputs agree with the expected ones for {len(configs) + len(dropout)} constructions, dropout only "
            f"in train() mode, one SDPA call, no position sees the future")


check_MHAPyTorchSDPA = spec.declare(spec.Spec(
    "MHAPyTorchSDPA", _sdpa_plan, _sdpa_judge,
    runners={spec.MODULE: functools.partial(spec.run_module, count=(_SDPA,))}),
    """Outputs equal the expected ones for the same seed (in train() mode too, with dropout), no position
    sees the future, and the core is one call of ``F.scaled_dot_product_attention``.""")


# ------------------------------------------------------------------------------------------
# attention_flops
# ------------------------------------------------------------------------------------------
def _flops_diagnose(case: Case, got: object, want: object) -> str | None:
    """Name a wrong count by its ratio to the expected one."""
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not isinstance(want, (int, float)) or not want:
        return None
    args = case.args
    seq_len = args[2]
    causal = case.kwargs.get("causal", args[4] if len(args) > 4 else None)  # None: the default
    ratio = got / want

    def near(value: float) -> bool:
        return math.isclose(ratio, value, rel_tol=1e-9)

    if near(2.0):
        if causal is None:
            return ("twice too large with causal left out: causal must default to True "
                    "(def attention_flops(..., causal=True)), and then the count is halved.")
        if causal:
            return "twice too large with causal=True: halve the count when causal is True (and only then)."
        return "twice too large with causal=False: 4 * B * H * T^2 * D in all, the two matrix products together."
    if near(0.5):
        if causal is False:
            return ("half the expected value with causal=False: the count is halved only when causal is True. Or is "
                    "the factor 2 per multiply-add, or one of the two matrix products, forgotten?")
        return ("half the expected value: halved twice, the factor 2 per multiply-add forgotten, or only one of the "
                "two matrix products (Q K^T and weights @ V) counted?")
    if near(0.25):
        return ("a quarter of the expected value: the factor 2 per multiply-add and the factor 2 for two matrix "
                "products, are both there?")
    batch, heads = args[0], args[1]
    if batch * heads > 1 and near(1 / (batch * heads)):
        return "the count is that of one batch entry and one head: multiply by batch * num_heads."
    if seq_len > 1 and near(1 / seq_len):
        return "T appears once, but each of the T queries meets T keys: T^2."
    if seq_len > 1 and causal is not False and near((seq_len + 1) / seq_len):
        return ("the diagonal is counted on top of half the pairs: T(T+1)/2 query-key pairs. Count exactly half of "
                "the T^2 pairs: T^2 / 2.")
    return None


def _flops_cases() -> list[Case]:
    return [
        Case("GPT-2 small: B=8, H=12, T=1024, D=64, causal=True", (8, 12, 1024, 64), {"causal": True}),
        Case("GPT-2 small, causal left to its default", (8, 12, 1024, 64)),
        Case("GPT-2 small, causal=False", (8, 12, 1024, 64), {"causal": False}),
        Case("all ones, causal=False", (1, 1, 1, 1), {"causal": False}),
    ]


check_attention_flops = spec.declare(
    spec.function_spec("attention_flops", _flops_cases, atol=0.0, rtol=1e-12, diagnose=_flops_diagnose),
    """Exact FLOP counts for causal and non-causal attention, with the default ``causal=True``.""")


# ------------------------------------------------------------------------------------------
# time_cuda_aware
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TimerCase:
    """One run of a timer on a simulated device.

    Attributes:
        name: what a student reads.
        warmup, repeats: the arguments the timer is called with.
        gpu: a simulated GPU (work runs in the background and is finished only by a synchronize) or
            a CPU without CUDA (work runs at once; ``torch.cuda.synchronize`` raises, as it does there).
        cold_calls, cold_s: the first ``cold_calls`` calls of ``fn`` take ``cold_s`` seconds each
            (allocation, kernel choice, compilation).
        costs_s: the time each later call takes, in turn.
    """

    name: str
    warmup: int
    repeats: int
    gpu: bool
    cold_calls: int
    cold_s: float
    costs_s: tuple[float, ...]

    def warm_costs(self) -> list[float]:
        """The costs of the calls a correct timer measures: those after the warm-up."""
        calls = range(self.warmup, self.warmup + self.repeats)
        return [self.cost(i) for i in calls]

    def cost(self, call: int) -> float:
        return self.cold_s if call < self.cold_calls else self.costs_s[(call - self.cold_calls) % len(self.costs_s)]

    @property
    def args(self) -> tuple:
        """Everything but the name, as plain data: how a case travels to the grading kernel and back
        (as a :class:`Case`'s arguments, ``probe``)."""
        return self.warmup, self.repeats, self.gpu, self.cold_calls, self.cold_s, tuple(self.costs_s)

    @property
    def kwargs(self) -> dict:
        return {}

    @property
    def build(self) -> None:
        return None

    @classmethod
    def from_case(cls, case: Case) -> "TimerCase":
        """The timer case that travelled as ``case`` (:attr:`args`)."""
        warmup, repeats, gpu, cold_calls, cold_s, costs_s = case.args
        return cls(case.name, warmup, repeats, gpu, cold_calls, cold_s, tuple(costs_s))


class FakeDevice:
    """A simulated device and its clock, for checking a timer without a GPU.

    ``fn()`` (:meth:`work`) costs the host :attr:`LAUNCH_S` seconds. On the simulated GPU that is all
    it costs the host: the work is queued and runs in the background, and only :meth:`synchronize`
    waits for it, so a clock read right after ``fn()`` measures the launch alone. On the simulated
    CPU the work is done before ``fn()`` returns. The clock (:meth:`clock`) stands in for
    ``time.perf_counter`` and counts its reads; calls and synchronisations are counted too.
    """

    LAUNCH_S = 1e-5
    START_S = 1000.0

    def __init__(self, case: TimerCase) -> None:
        self.case = case
        self.now = self.busy_until = self.START_S
        self.calls = self.syncs = self.reads = 0

    def clock(self) -> float:
        self.reads += 1
        return self.now

    def clock_ns(self) -> int:
        return int(round(self.clock() * 1e9))

    def work(self) -> None:
        cost = self.case.cost(self.calls)
        self.calls += 1
        if self.case.gpu:
            start = max(self.now, self.busy_until)
            self.busy_until = start + cost
            self.now += self.LAUNCH_S
        else:
            self.now += cost

    def synchronize(self, *args, **kwargs) -> None:
        if not self.case.gpu:
            raise RuntimeError("Torch not compiled with CUDA enabled (simulated CPU: no GPU to synchronise)")
        self.syncs += 1
        self.now = max(self.now, self.busy_until)

    @contextlib.contextmanager
    def installed(self):
        """``time.perf_counter`` (and ``perf_counter_ns``) read this device's clock, and ``torch.cuda`` is
        this device (or absent).

        ``time.monotonic`` and ``time.time`` stay real: the kernel's own threads (their event loops)
        read them, and a fake clock there could stall them.
        """
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(time, "perf_counter", self.clock))
            stack.enter_context(mock.patch.object(time, "perf_counter_ns", self.clock_ns))
            stack.enter_context(mock.patch.object(torch.cuda, "is_available", lambda: self.case.gpu))
            stack.enter_context(mock.patch.object(torch.cuda, "synchronize", self.synchronize))
            yield self


def run_timer(timer: Callable, case: TimerCase) -> tuple[object, FakeDevice]:
    """``timer(fn, warmup, repeats)`` on the simulated device of ``case``: its result, and the device."""
    device = FakeDevice(case)
    with device.installed():
        result = timer(device.work, case.warmup, case.repeats)
    return result, device


def _timer_outcome(timer: Callable, case: TimerCase) -> tuple[object, int, int, int]:
    """``(what the timer returned, fn calls, synchronisations, clock reads)`` of ``timer`` on the
    simulated device of ``case``; raises what the timer raised. What the check judges, and under the
    grader what the kernel hands out (the runner :func:`_timer_run`): the verdict is computed outside."""
    with contextlib.redirect_stdout(io.StringIO()):
        got, device = run_timer(timer, case)
    if isinstance(got, float) and type(got) is not float:  # numpy's float64 is a float to the check
        got = float(got)
    elif isinstance(got, int) and not isinstance(got, bool) and type(got) is not int:
        got = int(got)
    return got, device.calls, device.syncs, device.reads


def _timer_run(timer: Callable, case: Case) -> tuple[object, int, int, int]:
    """The kernel's run of ``timer`` on the simulated device of the timer case that travelled as ``case``
    (:meth:`TimerCase.from_case`): :func:`_timer_outcome`."""
    return _timer_outcome(timer, TimerCase.from_case(case))


def _timer_outcome_of(exercise: str, outcome: object) -> object:
    """What came back from a simulated device (:func:`_timer_run`): the outcome, or what the timer raised;
    refused (``spec.refuse``) unless its three counts are whole numbers."""
    if isinstance(outcome, BaseException):
        return outcome
    if not (isinstance(outcome, tuple) and len(outcome) == 4
            and all(type(n) is int and 0 <= n < 2**63 for n in outcome[1:])):
        spec.refuse(exercise, "simulated device (the timer's result and three counts: calls, synchronisations, "
                              "clock reads)")
    return outcome


def _timer_cases() -> list[TimerCase]:
    return [
        TimerCase("simulated GPU, warmup=3, repeats=5, three slow first calls", 3, 5, True, 3, 0.5,
                  (0.010, 0.012, 0.011, 0.050, 0.009)),
        TimerCase("simulated GPU, warmup=1, repeats=3", 1, 3, True, 1, 0.2, (0.004, 0.002, 0.003)),
        TimerCase("CPU without CUDA, warmup=2, repeats=3", 2, 3, False, 2, 0.2, (0.003, 0.001, 0.002)),
    ]


def _timer_diagnosis(case: TimerCase, got: float) -> str:
    """Why a timer's result differs from the median of the warm calls, in words."""
    warm = case.warm_costs()

    def near(value: float) -> bool:
        return math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-12)

    if case.gpu and near(FakeDevice.LAUNCH_S):
        return ("that is the time of the kernel launch only: on a GPU, fn() returns before the work is done. Call "
                "torch.cuda.synchronize() after fn() and before reading the clock again.")
    if case.gpu and got < min(warm) / 10:
        return ("far less than one call takes: the GPU's work was not waited for. Synchronise "
                "(torch.cuda.synchronize()) before starting and before stopping the clock.")
    every_call = [case.cost(i) for i in range(case.warmup + case.repeats)]
    if case.warmup and near(statistics.median(every_call)):
        return ("that is the median over the warm-up calls too: time only the repeats, and throw the warm-up "
                "calls' times away.")
    if near(1e3 * statistics.median(warm)):
        return "that is the median in milliseconds: return seconds, as time.perf_counter() gives them."
    if near(statistics.fmean(warm)):
        return "that is the mean of the repeats: return the median, which ignores an outlier such as a slow repeat."
    if near(min(warm)):
        return "that is the fastest repeat: return the median of the repeats, not the minimum."
    if near(sum(warm)):
        return "that is the total of the repeats: time each call on its own and return the median."
    if got >= case.cold_s * 0.99:
        return "a slow first call was timed: run fn() warmup times before timing, and throw those times away."
    return "return the median of the repeats' times, in seconds."


def _timer_plan(hidden: bool) -> list[spec.Step]:
    cases = _timer_cases() + ([c if isinstance(c, TimerCase) else TimerCase.from_case(c)
                               for c in hidden_cases("time_cuda_aware")] if hidden else [])
    return [spec.Step(case.name, Case(case.name, case.args), "timer") for case in cases]


def _timer_judge(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "time_cuda_aware"
    reference = reference_function(exercise)
    cases = [TimerCase.from_case(step.case) for step in plan]
    for step, case in zip(plan, cases):
        want = expect(exercise, case.name, lambda: run_timer(reference, case)[0])
        outcome = _timer_outcome_of(exercise, outcomes[step.key])
        if is_stub_error(outcome):
            fail(exercise, NOT_IMPLEMENTED)
        if isinstance(outcome, BaseException):
            exc = outcome
            if not case.gpu and "CUDA" in str(exc):
                hint = ("torch.cuda.synchronize() raised on a machine without a GPU: synchronise only when "
                        "torch.cuda.is_available().")
            elif "Event" in str(exc) or "CUDA" in str(exc):
                hint = ("the check simulates a GPU through time.perf_counter() and torch.cuda.synchronize() only "
                        "(CUDA events and other CUDA calls cannot be simulated): use those two.")
            else:
                hint = "fn is called with no arguments: fn()."
            try:
                fail(exercise, f"your code raised {type(exc).__name__}: {exc}. Hint: {hint}", Case(case.name))
            except CheckFailed as error:
                error.student_error = exc
                raise error from None
        got, calls, syncs, reads = outcome
        expected_calls = case.warmup + case.repeats
        if calls != expected_calls:
            why = (" The warm-up calls are missing: call fn() warmup times before timing, and throw those times away."
                   if calls == case.repeats else
                   " Call fn() warmup times untimed, then once per timed repeat.")
            fail(exercise, f"fn was called {calls} times with warmup={case.warmup}, repeats={case.repeats}; "
                           f"expected warmup + repeats = {expected_calls}.{why}", Case(case.name))
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            fail(exercise, f"expected a number of seconds (a float), got {type(got).__name__}", Case(case.name))
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12):
            continue
        if reads == 0:  # then got is a real time, different on every run: not shown
            fail(exercise, "your timer never read time.perf_counter(), so it did not time the (simulated) device. "
                           "Read the clock as time.perf_counter() (with `import time`): the check replaces it with "
                           "the simulated device's clock.", Case(case.name))
        if case.gpu and syncs == 0:
            fail(exercise, f"expected {want:.6g} s, got {got:.6g} s: torch.cuda.synchronize() was never called on the "
                           f"(simulated) GPU, so the clock measured the kernel launches, not the work. Synchronise "
                           f"whenever torch.cuda.is_available(), before starting and before stopping the clock.",
                 Case(case.name))
        fail(exercise, f"expected {want:.6g} s, got {got:.6g} s. Hint: {_timer_diagnosis(case, got)}",
             Case(case.name))
    return f"{len(cases)} simulated devices timed right ({'; '.join(c.name for c in cases)})"


check_time_cuda_aware = spec.declare(spec.Spec("time_cuda_aware", _timer_plan, _timer_judge,
                                               runners={"timer": _timer_run}),
    """The median of the warm calls, in seconds, on a simulated GPU (whose work finishes only when
    synchronised) and on a CPU without CUDA; ``fn`` called ``warmup + repeats`` times.""")
