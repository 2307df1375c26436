"""The benchmark's implementations and runner: instructor edition only, never released.

``python -m course_utils.bench`` (``make bench``) runs :func:`main` here. It times every
implementation of notebook 06, and notebook 07's tiled ones (the Python loop on a CPU at small
``T``, the Triton kernel on a GPU), over a sweep of sequence lengths on the best device present, after
checking each one against notebook 05's ``MultiHeadAttention`` (a wrong implementation is
reported, never timed), and writes ``attention_bench.json`` and ``attention_bench.png`` into the
output folder. ``python -m course_utils.bench --help`` lists the options (``--threads 1`` gives
steadier numbers on a busy CPU; ``--broken-demo`` adds a deliberately wrong implementation to show
the gate).

Why this is not in :mod:`course_utils.bench`: the benchmark compares the exercises' answers
(``course_utils.reference``), and the comparison classes below are written with those answers
(``causal_mask``, ``merge_heads``). The student edition ships ``course_utils.bench`` (timing,
FLOP arithmetic, peaks, memory, verification: no answers) but neither this module nor the reference.
Notebook 06 shows the comparison classes' source with ``# %% shows="course_utils.instructor.
bench_impls:with_explicit_mask ..."`` cells, so they call the helpers by plain name
(``causal_mask(...)``, ``merge_heads(...)``), which the notebook's earlier "where we left off"
cells define, and use nothing else from the reference.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import warnings
from pathlib import Path
from typing import Callable, Sequence
from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils import reference
from course_utils.bench import causal_mask_mod, copy_weights, flex_attention_status
from course_utils.bench.runner import (
    BenchConfig,
    BenchResult,
    BenchRow,
    as_dtype,
    forgetting_causal,
    format_table,
    plot_results,
    run,
)
from course_utils.device import describe_device, get_device
from course_utils.reference import causal_mask, merge_heads
from course_utils.validation import check_heads_divide, check_input_3d

__all__ = [
    "attention_flops",
    "with_explicit_mask",
    "MHAPyTorchClass",
    "MHAFlexAttention",
    "MHAFlashPython",
    "MHAFlashTriton",
    "FLASH_PYTHON_MAX_T",
    "flash_status",
    "IMPLEMENTATIONS",
    "BenchConfig",
    "BenchRow",
    "BenchResult",
    "build_implementations",
    "run_benchmark",
    "format_table",
    "plot_results",
    "default_config",
    "main",
]

DEFAULT_OUT = "bench-results"


def attention_flops(batch: int, num_heads: int, seq_len: int, head_dim: int, causal: bool = True) -> int:
    """Forward FLOPs of the attention core: ``4 * B * H * T^2 * D``, halved when causal.

    Notebook 06's exercise: the benchmark uses the reference answer.
    """
    return reference.attention_flops(batch, num_heads, seq_len, head_dim, causal)


# --------------------------------------------------------------------------------------------
# The implementations that are not exercises (notebook 06 shows their source)
# --------------------------------------------------------------------------------------------
def with_explicit_mask(base: type) -> type:
    """``base`` (a ``MHAPyTorchSDPA``: yours, or the course's own) with one change: SDPA gets the causal
    mask as an explicit boolean ``attn_mask`` instead of ``is_causal=True``.

    The mask is kept as a buffer, built once for ``context_length``. SDPA's boolean ``attn_mask``
    means True = "may attend", the opposite of ``causal_mask`` (True = blocked), hence the ``~``.
    With an arbitrary mask SDPA cannot assume the causal pattern, so it may pick a slower kernel.
    The base's own ``forward`` runs unchanged; only its call of ``F.scaled_dot_product_attention``
    is redirected while it runs. Input ``(b, T, d_in)``, output ``(b, T, d_out)``.
    """

    class MHASDPAExplicitMask(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            context_length = inspect.signature(base).bind(*args, **kwargs).arguments["context_length"]
            self.register_buffer("explicit_mask", causal_mask(context_length))  # True = future, blocked

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            T = x.shape[1]
            allowed = ~self.explicit_mask[:T, :T]  # (T, T), True = may attend
            sdpa = F.scaled_dot_product_attention

            def sdpa_with_mask(q, k, v, *args, is_causal=False, **kwargs):
                if is_causal:
                    kwargs["attn_mask"] = allowed
                return sdpa(q, k, v, *args, **kwargs)

            with mock.patch.object(F, "scaled_dot_product_attention", sdpa_with_mask):
                return super().forward(x)

    MHASDPAExplicitMask.__qualname__ = MHASDPAExplicitMask.__name__
    return MHASDPAExplicitMask


class MHAPyTorchClass(nn.Module):
    """Multi-head causal attention with PyTorch's ``nn.MultiheadAttention``.

    ``nn.MultiheadAttention`` needs ``d_in == d_out`` (its ``embed_dim``); its one ``bias`` flag
    covers both the input and the output projection, so it is built with ``bias=True`` and the
    input bias is zeroed when ``qkv_bias=False`` (the course's ``out_proj`` always has a bias).
    Its boolean ``attn_mask`` means True = NOT allowed, the same convention as ``causal_mask``.
    ``need_weights=False`` lets it call SDPA instead of materialising the weights.
    Input ``(b, T, d)``, output ``(b, T, d)``.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int, qkv_bias: bool = False
    ):
        super().__init__()
        if d_in != d_out:
            raise ValueError(f"nn.MultiheadAttention needs d_in == d_out, got {d_in} and {d_out}")
        self.d_in, self.d_out, self.context_length = d_in, d_out, context_length
        self.multihead_attn = nn.MultiheadAttention(
            embed_dim=d_out, num_heads=num_heads, dropout=dropout, bias=True, batch_first=True
        )
        if not qkv_bias:
            with torch.no_grad():
                self.multihead_attn.in_proj_bias.zero_()
            self.multihead_attn.in_proj_bias.requires_grad_(False)
        self.register_buffer("mask", causal_mask(context_length))  # True = blocked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, T, _ = check_input_3d(x, self.d_in, self.context_length)
        out, _ = self.multihead_attn(x, x, x, attn_mask=self.mask[:T, :T], need_weights=False, is_causal=True)
        return out


class MHAFlexAttention(nn.Module):
    """Multi-head causal attention with FlexAttention (``torch.nn.attention.flex_attention``).

    The causal pattern is a ``mask_mod`` function, turned into a block-sparse ``BlockMask`` once
    per sequence length; blocks entirely in the future are skipped, not computed and masked.
    ``compile=True`` wraps ``flex_attention`` in ``torch.compile`` (needed for the fused kernel).
    No dropout: FlexAttention has no ``dropout_p``. Parameters as in ``MHAPyTorchSDPA``.
    Input ``(b, T, d_in)``, output ``(b, T, d_out)``.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
        qkv_bias: bool = False, compile: bool = False,
    ):
        super().__init__()
        from torch.nn.attention.flex_attention import flex_attention

        check_heads_divide(d_out, num_heads)
        if dropout:
            raise ValueError("FlexAttention has no dropout; build MHAFlexAttention with dropout=0.0")
        self.d_in, self.d_out, self.num_heads = d_in, d_out, num_heads
        self.head_dim = d_out // num_heads
        self.context_length = context_length
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self._flex = torch.compile(flex_attention) if compile else flex_attention
        self._block_masks: dict = {}

    def _block_mask(self, T: int, device: torch.device):
        from torch.nn.attention.flex_attention import create_block_mask

        key = (T, str(device))
        if key not in self._block_masks:
            self._block_masks[key] = create_block_mask(causal_mask_mod, None, None, T, T, device=device)
        return self._block_masks[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = check_input_3d(x, self.d_in, self.context_length)
        # Written out, not the answers' split_qkv helper: notebook 06 shows this class, and the split
        # is part of that notebook's own exercise, which a shown class must not give away.
        qkv = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (b, H, T, D)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            context = self._flex(q, k, v, block_mask=self._block_mask(T, x.device))
        return self.out_proj(merge_heads(context))


# --------------------------------------------------------------------------------------------
# Notebook 07's tiled implementations: the Python loop (CPU, small T) and the Triton kernel (GPU)
# --------------------------------------------------------------------------------------------
#: The Python loop runs thousands of small operators: it is timed on a CPU up to this length only.
FLASH_PYTHON_MAX_T = 1024


class MHAFlashPython(reference.MHAPyTorchSDPA):
    """``MHAPyTorchSDPA`` whose core is notebook 07's tiled loop, ``flash_attention_forward``.

    Same parameters and weights as ``MHAPyTorchSDPA``; dropout is not applied (build it with 0.0).
    Tiles of ``block`` queries by ``block`` keys. Input ``(b, T, d_in)``, output ``(b, T, d_out)``.
    """

    block = 64

    def skip_reason(self, seq_len: int, device: torch.device) -> str | None:
        """Why this implementation is not run at ``seq_len`` on ``device`` (``None``: it is)."""
        if device.type != "cpu":
            return "the Python loop is timed on a CPU only"
        if seq_len > FLASH_PYTHON_MAX_T:
            return f"the Python loop is timed up to T={FLASH_PYTHON_MAX_T} only"
        return None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return reference.flash_attention_forward(q, k, v, self.block, self.block, causal=True)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = check_input_3d(x, self.d_in, self.context_length)
        q, k, v = reference.split_qkv(self.qkv(x), self.num_heads)  # each (b, H, T, D)
        return self.out_proj(merge_heads(self.attend(q, k, v)))  # (b, T, d_out)


class MHAFlashTriton(MHAFlashPython):
    """``MHAPyTorchSDPA`` whose core is notebook 07's Triton kernel (forward only: it has no backward).

    Compiled on a GPU; in Triton's interpreter on a CPU (correct, far too slow to time, so the
    benchmark adds it on a GPU only). Tiles of ``block_m`` queries by ``block_n`` keys.
    """

    block_m, block_n = 128, 64

    def skip_reason(self, seq_len: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "the Triton kernel is timed on a CUDA GPU only"
        return None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise NotImplementedError("notebook 07's Triton kernel is forward only (no backward)")
        from course_utils import flash

        return flash.launch(reference.flash_attention_triton, q.contiguous(), k.contiguous(), v.contiguous(),
                            causal=True, block_m=self.block_m, block_n=self.block_n)[0]


def flash_status(device: torch.device | str) -> dict[str, str | None]:
    """``{name: None}`` for each tiled implementation the benchmark runs on ``device``, or the reason it does not."""
    from course_utils import flash

    device = torch.device(device)
    runs, how = flash.triton_status()
    return {
        "flash_python": None if device.type == "cpu" else "the Python loop is timed on a CPU only",
        "flash_triton": ("the Triton kernel is timed on a CUDA GPU only" if device.type != "cuda"
                         else None if runs else how),
    }


# --------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------
#: name -> constructor with the book's signature. Flex is added when it runs on the device.
IMPLEMENTATIONS: dict[str, Callable[..., nn.Module]] = {
    "notebook05_mha": reference.MultiHeadAttention,
    "combined_qkv": reference.MultiHeadAttentionCombinedQKV,
    "einsum": reference.MultiHeadAttentionEinsum,
    "sdpa_is_causal": reference.MHAPyTorchSDPA,
    "sdpa_explicit_mask": with_explicit_mask(reference.MHAPyTorchSDPA),
    "nn_multiheadattention": MHAPyTorchClass,
}


#: A deliberately wrong implementation (``is_causal`` lost), to show the correctness gate.
_BrokenSDPA = forgetting_causal(reference.MHAPyTorchSDPA)


def build_implementations(config: BenchConfig, log: Callable[[str], None] = print) -> dict[str, nn.Module]:
    """Every implementation, with weights copied from one seeded notebook-05 module, in ``config.dtype``."""
    device, dtype = torch.device(config.device), as_dtype(config.dtype)
    args = (config.d_model, config.d_model, max(config.seq_lens), 0.0, config.num_heads)
    torch.manual_seed(123)
    source = reference.MultiHeadAttention(*args)
    constructors = dict(IMPLEMENTATIONS)
    ok, why = flex_attention_status(device, compile=config.compile or device.type == "cuda")
    if ok:
        compiled = config.compile or device.type == "cuda"
        constructors["flex_attention"] = lambda *a: MHAFlexAttention(*a, compile=compiled)
    else:
        log(f"flex_attention skipped: {why}")
    for name, why in flash_status(device).items():
        if why is None:
            constructors[name] = {"flash_python": MHAFlashPython, "flash_triton": MHAFlashTriton}[name]
        else:
            log(f"{name} skipped: {why}")
    if config.broken_demo:
        constructors["broken_no_causal"] = _BrokenSDPA
    modules = {}
    for name, make in constructors.items():
        module = copy_weights(source, make(*args)).to(device=device, dtype=dtype).eval()
        modules[name] = module
        if config.compile and name in ("notebook05_mha", "sdpa_is_causal"):
            modules[name + "+compile"] = torch.compile(module)
    return modules


def run_benchmark(config: BenchConfig, log: Callable[[str], None] = print) -> BenchResult:
    """Check, then time, every implementation at every sequence length and mode (see
    :func:`course_utils.bench.runner.run`); the expected output is notebook 05's module in float32,
    or SDPA's where that does not fit in memory."""
    modules = build_implementations(config, log)
    flops = lambda b, h, t, d: attention_flops(b, h, t, d, causal=True)  # noqa: E731
    return run(modules, config, flops, expected_from=("notebook05_mha", "sdpa_is_causal"), log=log)


def default_config(device: torch.device, dtype: str | None = None) -> BenchConfig:
    """Sizes that finish in a few minutes: GPT-2-small-like on a GPU, smaller on a CPU."""
    if device.type == "cuda":
        # BF16 needs Ampere (compute capability 8) or newer; a T4 (7.5) gets FP16.
        chosen = dtype or ("bfloat16" if torch.cuda.get_device_capability(device)[0] >= 8 else "float16")
        return BenchConfig(str(device), chosen, batch=8, d_model=768, num_heads=12, seq_lens=[256, 512, 1024, 2048, 4096],
                           modes=["inference", "training"], warmup=5, repeats=20)
    return BenchConfig(str(device), dtype or "float32", batch=2, d_model=256, num_heads=8,
                       seq_lens=[128, 256, 512, 1024], modes=["inference", "training"], warmup=2, repeats=5)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: ``python -m course_utils.bench [--out DIR] ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.bench",
        description="Check, then time, every attention implementation of notebook 06 over a sweep of "
                    "sequence lengths; write attention_bench.json and attention_bench.png into --out.",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT}/)")
    parser.add_argument("--device", default=None, help="cpu, cuda, mps (default: the best available)")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                        help="default: bfloat16 (or float16) on a GPU, float32 on a CPU")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=None, help="sequence lengths to sweep")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--d-model", type=int, default=None)
    parser.add_argument("--num-heads", type=int, default=None)
    parser.add_argument("--modes", nargs="+", default=None, choices=["inference", "training"])
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for PyTorch (torch.set_num_threads); 1 is steadier on a busy machine")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd versions (slow to compile on a CPU)")
    parser.add_argument("--broken-demo", action="store_true",
                        help="add a deliberately wrong implementation to show that it is reported, not timed")
    args = parser.parse_args(argv)

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = get_device(args.device)
    config = default_config(device, args.dtype)
    for attr in ("seq_lens", "batch", "d_model", "num_heads", "modes", "warmup", "repeats"):
        value = getattr(args, attr)
        if value is not None:
            setattr(config, attr, value)
    config.compile, config.broken_demo = args.compile, args.broken_demo
    check_heads_divide(config.d_model, config.num_heads)
    torch.manual_seed(0)

    print(f"device: {describe_device(device)}, dtype {config.dtype}, torch {torch.__version__}")
    print(f"batch {config.batch}, d_model {config.d_model}, heads {config.num_heads} (head_dim {config.head_dim}), "
          f"T in {config.seq_lens}, {config.warmup} warm-up + median of {config.repeats}")
    result = run_benchmark(config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "attention_bench.json", out / "attention_bench.png"
    json_path.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    plot_results(result, png_path)
    for mode in config.modes:
        print()
        print(format_table(result, mode))
    print()
    for status, what in (("wrong", "not timed, output differs from the reference"), ("error", "not timed, raised an error"),
                         ("skipped", "not timed, not supported on this device")):
        names = sorted({r.impl for r in result.rows if r.status == status})
        if names:
            print(f"{what}: {', '.join(names)}")
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
