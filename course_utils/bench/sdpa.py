"""SDPA introspection: which fused backend ran, which are available; FlexAttention's status; weights shared between implementations."""

from __future__ import annotations

import warnings
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.bench.correctness import verify
from course_utils.device import under_grader


#: The ATen operator each fused backend of ``F.scaled_dot_product_attention`` dispatches to. The
#: math backend has no operator of its own: it decomposes into ``bmm``, ``_safe_softmax``, ...
SDPA_KERNELS: dict[str, str] = {
    "aten._scaled_dot_product_flash_attention_for_cpu": "flash (CPU kernel)",
    "aten._scaled_dot_product_flash_attention": "flash",
    "aten._scaled_dot_product_efficient_attention": "memory-efficient",
    "aten._scaled_dot_product_cudnn_attention": "cuDNN",
    "aten._scaled_dot_product_fused_attention_overrideable": "overrideable (third-party device)",
}


def sdpa_backend_used(fn: Callable[[], object]) -> list[str]:
    """Names of the SDPA backends that ran during ``fn()``, e.g. ``["flash"]`` or ``["math"]``.

    Watches the call at two levels: a ``TorchFunctionMode`` sees every call of
    ``F.scaled_dot_product_attention``; a ``TorchDispatchMode`` sees the ATen operators it turns
    into, and each fused backend has its own (:data:`SDPA_KERNELS`). An SDPA call that reached
    none of them ran the math backend. Empty list: no SDPA call happened. (``torch.profiler``
    shows the same operators, but prints log lines into a notebook.)
    """
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[int] = []
    ops: list[str] = []

    class _Calls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "scaled_dot_product_attention":
                calls.append(len(ops))
            return func(*args, **(kwargs or {}))

    class _Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with _Calls(), _Ops():
        fn()
    labels: list[str] = []
    # Calls made by user code: the operators between one call and the next belong to it.
    bounds = calls + [len(ops)]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        fused = [SDPA_KERNELS[op] for op in ops[start:stop] if op in SDPA_KERNELS]
        labels.append(fused[0] if fused else "math")
    # Calls made inside another torch function (nn.MultiheadAttention) are invisible to the
    # function mode; their operators still show. ``_safe_softmax`` is the math backend's softmax.
    for op in ops:
        if op in SDPA_KERNELS:
            labels.append(SDPA_KERNELS[op])
        elif op == "aten._safe_softmax":
            labels.append("math")
        elif op == "aten._native_multi_head_attention":
            labels.append("nn.MultiheadAttention fast path (fused C++ kernel)")
    return list(dict.fromkeys(labels))


def sdpa_backends_available(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True
) -> dict[str, str]:
    """Try ``q, k, v`` with each backend forced by ``sdpa_kernel``: ``"ok"`` or why it refused.

    Returns:
        ``{"FLASH_ATTENTION": "ok", "EFFICIENT_ATTENTION": "No available kernel ...", ...}``.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    result: dict[str, str] = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            result[name] = "not in this torch version"
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
                result[name] = "ok"
                continue
            except RuntimeError as exc:
                error = str(exc).strip().splitlines()[0]
        # On CUDA, SDPA explains each refusal in warnings ("... not used because:", then the reason).
        reasons = [str(w.message).strip() for w in caught if not str(w.message).strip().endswith(":")]
        if reasons:
            result[name] = "refused: " + reasons[-1].splitlines()[0][:110]
        elif q.device.type == "cpu" and name in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
            result[name] = "refused: no CPU implementation (on a CPU only FLASH_ATTENTION and MATH exist)"
        else:
            result[name] = "refused: " + error[:110]
    return result


def flex_attention_status(device: torch.device | str, compile: bool | None = None,
                          head_dim: int = 16) -> tuple[bool, str]:
    """Whether FlexAttention runs here: ``(True, how)`` or ``(False, why not)``.

    Tries a tiny causal call on ``(1, 1, 128, head_dim)`` inputs: give the smallest head size you will
    use (PyTorch 2.5's FlexAttention refuses head sizes under 16). ``compile`` defaults to True on CUDA
    (the fused kernel only exists compiled) and False elsewhere (eager FlexAttention runs everywhere but
    materialises the scores, so it shows the API, not the speed).

    While nbgrader grades the notebook (:func:`course_utils.device.under_grader`) it is not tried: no graded
    cell needs it, and the try costs a second on a CPU and a compilation on a GPU in every graded notebook.
    """
    if under_grader():
        return False, "not tried while the notebook is graded (no graded cell needs it)"
    device = torch.device(device)
    compile = device.type == "cuda" if compile is None else compile
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        return False, f"torch {torch.__version__} has no torch.nn.attention.flex_attention ({exc}); it needs torch >= 2.5"
    try:
        q = torch.randn(1, 1, 128, head_dim, device=device)  # (B, H, T, head_dim)
        block_mask = create_block_mask(causal_mask_mod, None, None, 128, 128, device=device)
        fn = torch.compile(flex_attention) if compile else flex_attention
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(q, q, q, block_mask=block_mask)
        expected = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        problem = verify(expected, out)
        if problem:
            return False, f"FlexAttention ran but disagrees with SDPA: {problem}"
    except Exception as exc:  # noqa: BLE001 - any failure means "not here", with the reason
        return False, f"FlexAttention failed on {device.type}: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
    if compile:
        return True, f"compiled with torch.compile on {device.type} (fused kernel)"
    return True, f"eager on {device.type}: unfused, it materialises the scores (compile it for speed)"


def causal_mask_mod(b, h, q_idx, kv_idx):
    """FlexAttention ``mask_mod``: True where query ``q_idx`` may see key ``kv_idx`` (not a later one)."""
    return q_idx >= kv_idx


def copy_weights(source: nn.Module, target: nn.Module) -> nn.Module:
    """Give ``target`` the weights of ``source``, a notebook-05 style ``MultiHeadAttention``
    (``W_query``, ``W_key``, ``W_value``, ``out_proj``), so that both compute the same function.

    Handles targets with separate projections (``W_query``...), a combined ``qkv`` layer (rows
    ``[W_query; W_key; W_value]``), and a wrapper of ``nn.MultiheadAttention`` kept in
    ``target.multihead_attn`` (``MHAPyTorchClass``). Returns ``target``.
    """
    ws = [getattr(source, n).weight for n in ("W_query", "W_key", "W_value")]
    bs = [getattr(source, n).bias for n in ("W_query", "W_key", "W_value")]
    with torch.no_grad():
        if hasattr(target, "W_query"):
            target.load_state_dict(source.state_dict())
            return target
        if isinstance(getattr(target, "multihead_attn", None), nn.MultiheadAttention):
            mha = target.multihead_attn
            mha.in_proj_weight.copy_(torch.cat(ws, dim=0))
            mha.in_proj_bias.copy_(torch.cat(bs) if bs[0] is not None else torch.zeros_like(mha.in_proj_bias))
            mha.out_proj.weight.copy_(source.out_proj.weight)
            mha.out_proj.bias.copy_(source.out_proj.bias)
            return target
        if hasattr(target, "qkv"):
            target.qkv.weight.copy_(torch.cat(ws, dim=0))  # (3 * d_out, d_in)
            if target.qkv.bias is not None:
                target.qkv.bias.copy_(torch.cat(bs) if bs[0] is not None else torch.zeros_like(target.qkv.bias))
            target.out_proj.load_state_dict(source.out_proj.state_dict())
            return target
    raise TypeError(f"do not know how to copy weights into {type(target).__name__}")
