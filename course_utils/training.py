"""Notebook 09's given training apparatus: the loop, accuracy, greedy generation and attention maps.

The loop calls *your* ``train_step(model, batch, optimizer)`` once per step; everything else here is
given. Under the grader (the environment variable ``NBGRADER_EXECUTION`` is set) :func:`train` does
not train: no graded cell needs a trained model, and grading stays fast.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import matplotlib.pyplot as plt
import torch
import torch.nn as nn

from course_utils.device import under_grader
from course_utils.tasks import Batch, ReversalTask

try:  # a text progress bar; without tqdm the loop prints a line now and then instead
    from tqdm import tqdm as _tqdm
except ImportError:  # pragma: no cover - tqdm is in the course environment and on Colab
    _tqdm = None


#: Whether this notebook runs under the grader (nbgrader sets ``NBGRADER_EXECUTION``): the course's
#: one test, :func:`course_utils.device.under_grader`.
grading = under_grader


class FixedPositions(nn.Module):
    """Fixed position vectors, added to the token embeddings: ``x (b, T, d) -> x + table[:T]``.

    ``table`` is ``(context_length, d_model)``, e.g. ``sinusoidal_positions(context_length, d_model)``.
    It is kept as a buffer: it moves with ``.to(device)`` and is never trained (no parameters). An input
    longer than the table raises a ``ValueError`` that names the limit.
    """

    def __init__(self, table: torch.Tensor):
        super().__init__()
        if not isinstance(table, torch.Tensor) or table.dim() != 2:
            raise ValueError(f"table must be a (context_length, d_model) tensor, got "
                             f"{tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__}")
        self.context_length = table.shape[0]
        self.register_buffer("table", table.detach().clone().float(), persistent=False)  # (context_length, d)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """``x + table[start : start + T]``; ``start`` > 0 when decoding with a KV cache."""
        T = x.shape[1]
        if start < 0 or start + T > self.context_length:
            raise ValueError(f"positions {start}..{start + T - 1} do not fit: only {self.context_length} positions "
                             f"(context_length = {self.context_length})")
        return x + self.table[start:start + T].to(x.dtype)  # (b, T, d) + (T, d)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without parameters)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


@torch.no_grad()
def answer_accuracy(model: nn.Module, batch: Batch) -> float:
    """The fraction of sequences whose **whole** answer is right (greedy, exact match).

    One forward pass in ``eval()`` mode: every answer position predicts its most likely next token.
    If all of a sequence's predictions are right, greedy generation would write the same answer
    token by token, so this equals exact-match accuracy of greedy generation. The model's mode is
    restored afterwards.
    """
    was_training = model.training
    model.eval()
    device = model_device(model)
    predictions = model(batch.inputs.to(device)).argmax(dim=-1)  # (b, T)
    right = (predictions == batch.targets.to(device)) | ~batch.answer_mask.to(device)  # (b, T)
    model.train(was_training)
    return right.all(dim=1).float().mean().item()


@dataclass
class TrainingRun:
    """What :func:`train` did: the loss of every step, held-out accuracy every ``eval_every`` steps."""

    losses: list[float] = field(default_factory=list)
    accuracy: dict[int, float] = field(default_factory=dict)  # step -> held-out exact-answer accuracy
    seconds: float = 0.0
    skipped: bool = False

    @property
    def final_accuracy(self) -> float:
        return self.accuracy[max(self.accuracy)] if self.accuracy else math.nan


def _steps(steps: int, desc: str) -> Iterable[int]:
    if _tqdm is not None:
        return _tqdm(range(steps), desc=desc, mininterval=0.5, ncols=90)
    return range(steps)


def train(model: nn.Module, train_step: Callable, task: ReversalTask, *, steps: int, batch_size: int = 64,
          lr: float = 3e-3, seed: int = 0, eval_every: int = 100, desc: str = "training") -> TrainingRun:
    """Train ``model`` on ``task`` for ``steps`` steps of ``train_step(model, batch, optimizer)``.

    AdamW with learning rate ``lr``; the batches come from a generator seeded with ``seed``, so two
    calls with the same seed and the same freshly built model train the same way. Every
    ``eval_every`` steps (and after the last) the exact-answer accuracy on the task's held-out
    sequences is recorded. Under the grader nothing is trained and the run is marked ``skipped``.
    """
    run = TrainingRun()
    if grading():
        print(f"{desc}: skipped while grading (no graded cell needs a trained model)")
        run.skipped = True
        return run
    device = model_device(model)
    generator = torch.Generator().manual_seed(seed)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    held_out = task.held_out()
    start = time.perf_counter()
    bar = _steps(steps, desc)
    model.train()
    for step in bar:
        batch = Batch(*(t.to(device) for t in task.batch(batch_size, generator)))
        loss = float(train_step(model, batch, optimizer))
        run.losses.append(loss)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            run.accuracy[step + 1] = answer_accuracy(model, held_out)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{loss:.3f}", accuracy=f"{run.accuracy[step + 1]:.0%}")
            elif _tqdm is None:
                print(f"{desc}: step {step + 1}/{steps}, loss {loss:.3f}, held-out accuracy {run.accuracy[step + 1]:.0%}")
    if hasattr(bar, "close"):
        bar.close()
    run.seconds = time.perf_counter() - start
    model.eval()
    return run


def plot_losses(runs: dict[str, TrainingRun], title: str = "training loss (answer positions only)") -> "plt.Figure":
    """The loss curves of several runs on one log-scaled axis, with a dotted line at chance level."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, run in runs.items():
        ax.plot(range(1, len(run.losses) + 1), run.losses, label=name, linewidth=1.2)
    ax.axhline(math.log(10), color="gray", linestyle=":", label="guessing a digit: ln 10")
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(title)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy generation by full recompute: ``(b, T0)`` prompt -> ``(b, T0 + max_new_tokens)``.

    Each step runs the model on the whole sequence so far and appends the most likely next token. A
    KV cache (notebook 08) would reuse the keys and values of the earlier tokens instead.
    """
    model.eval()
    tokens = prompt.to(model_device(model))
    for _ in range(max_new_tokens):
        logits = model(tokens)  # (b, T, vocab): the model recomputes every position
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (b, 1)
        tokens = torch.cat([tokens, next_token], dim=1)  # (b, T + 1)
    return tokens


@torch.no_grad()
def attention_maps(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The causal attention weights of every head of every block: ``(num_layers, b, H, T, T)``.

    Each block's attention module (``block.att``, with ``W_query``, ``W_key``, ``num_heads`` and
    ``head_dim`` as notebook 05's ``MultiHeadAttention``) is called with its input recorded; the
    weights are then recomputed from its own query and key projections, as in notebook 05.
    """
    seen: list[tuple[nn.Module, torch.Tensor]] = []
    hooks = [block.att.register_forward_hook(lambda module, args, out: seen.append((module, args[0])))
             for block in model.blocks]
    try:
        model.eval()
        model(inputs.to(model_device(model)))
    finally:
        for hook in hooks:
            hook.remove()
    maps = []
    for att, x in seen:
        b, T, _ = x.shape
        shape = (b, T, att.num_heads, att.head_dim)
        q = att.W_query(x).view(shape).transpose(1, 2)  # (b, H, T, D)
        k = att.W_key(x).view(shape).transpose(1, 2)  # (b, H, T, D)
        later = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # (T, T): True above the diagonal
        scores = (q @ k.transpose(-2, -1) / math.sqrt(att.head_dim)).masked_fill(later, -math.inf)
        maps.append(scores.softmax(dim=-1).cpu())  # (b, H, T, T)
    return torch.stack(maps)  # (L, b, H, T, T)


def reversal_score(maps: torch.Tensor, num_digits: int) -> torch.Tensor:
    """How much each head attends to the digit it must copy next: ``(L, b, H, T, T)`` -> ``(L, H)``.

    At input position ``t`` (``num_digits <= t < 2 * num_digits``) the next answer token is the digit
    at position ``2 * num_digits - 1 - t``: the anti-diagonal. The score is the mean weight there.
    """
    rows = torch.arange(num_digits, 2 * num_digits)  # (n,): the separator and the answer so far
    cols = 2 * num_digits - 1 - rows  # (n,): the digit each of them must copy
    return maps[..., rows, cols].mean(dim=(1, 3))  # (L, b, H, n) -> (L, H)


def plot_heads(maps: torch.Tensor, tokens: list[str], title: str, highlight: tuple[int, int] | None = None) -> "plt.Figure":
    """One heatmap per head and layer of one example, ``(L, H, T, T)``; ``highlight`` = (layer, head) is framed."""
    L, H, T, _ = maps.shape
    fig, axes = plt.subplots(L, H, figsize=(3.4 * H, 3.2 * L), squeeze=False)
    for layer in range(L):
        for head in range(H):
            ax = axes[layer, head]
            image = ax.imshow(maps[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_xticks(range(T), tokens, fontsize=7)
            ax.set_yticks(range(T), tokens, fontsize=7)
            ax.set_xlabel("key (attended to)", fontsize=8)
            ax.set_ylabel("query", fontsize=8)
            ax.set_title(f"layer {layer}, head {head}", fontsize=9,
                         fontweight="bold" if highlight == (layer, head) else "normal")
            if highlight == (layer, head):
                for spine in ax.spines.values():
                    spine.set_edgecolor("red")
                    spine.set_linewidth(2.5)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
    fig.suptitle(title)
    return fig
