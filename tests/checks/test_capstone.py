"""Notebook 09's given apparatus: the reversal task, the training loop and its helpers.

Cheap on purpose: nothing here trains a model for long. That training reaches the accuracy the
notebook promises is read from the stored, executed solution notebook (nbval re-runs it and fails
when its printed accuracy changes).
"""

from __future__ import annotations

import math
import re

import nbformat
import pytest
import torch

from course_utils import reference, tasks, training
from grader import course

NOTEBOOK = "09_capstone_tiny_transformer"


def test_a_sequence_is_digits_separator_and_the_digits_reversed():
    digits = torch.tensor([[3, 1, 4], [0, 0, 9]])
    batch = tasks.batch_from_digits(digits)
    assert tasks.as_text(tasks.sequences_from_digits(digits)[0]) == "3 1 4 | 4 1 3"
    assert batch.inputs.tolist() == [[3, 1, 4, 10, 4, 1], [0, 0, 9, 10, 9, 0]]
    assert batch.targets.tolist() == [[1, 4, 10, 4, 1, 3], [0, 9, 10, 9, 0, 0]]
    assert batch.answer_mask.tolist() == [[False, False, False, True, True, True]] * 2
    assert batch.targets[batch.answer_mask].view(2, 3).tolist() == digits.flip(1).tolist()


def test_training_batches_never_hold_a_held_out_sequence():
    task = tasks.ReversalTask(num_digits=2, held_out_size=60, seed=3)  # 100 sequences, 60 held out
    held = {tuple(row) for row in task.held_out_digits.tolist()}
    generator = torch.Generator().manual_seed(0)
    seen = {tuple(row) for _ in range(20) for row in task.sample_digits(64, generator).tolist()}
    assert seen and not seen & held
    assert len(seen) == 100 - len(held)  # every other sequence is drawn


def test_the_task_is_the_same_for_the_same_seeds():
    a, b = tasks.ReversalTask(8, 10, seed=0), tasks.ReversalTask(8, 10, seed=0)
    assert torch.equal(a.held_out().inputs, b.held_out().inputs)
    assert torch.equal(a.batch(4, torch.Generator().manual_seed(1)).inputs,
                       b.batch(4, torch.Generator().manual_seed(1)).inputs)


def test_bad_digits_are_refused():
    with pytest.raises(ValueError, match="shape"):
        tasks.sequences_from_digits(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="0..9"):
        tasks.sequences_from_digits(torch.tensor([[1, 10]]))


def _tiny_model(num_digits: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    return reference.TinyGPT(tasks.VOCAB_SIZE, 8, 2, 2, 2 * num_digits, 0.0)


def test_answer_accuracy_is_exact_match_of_greedy_generation():
    task = tasks.ReversalTask(num_digits=3, held_out_size=200, seed=1)
    model = _tiny_model()
    training.train(model, reference.train_step, task, steps=30, seed=0, eval_every=30, desc="test")
    held = task.held_out()
    written = training.generate(model, held.inputs[:, :4], max_new_tokens=3)  # (200, 7)
    exact = (written[:, 4:] == task.held_out_digits.flip(1)).all(dim=1).float().mean().item()
    assert training.answer_accuracy(model, held) == pytest.approx(exact)


def test_under_the_grader_nothing_is_trained(monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert training.grading()

    def never(*args):
        raise AssertionError("train_step called while grading")

    run = training.train(_tiny_model(), never, tasks.ReversalTask(3, 10), steps=1000)
    assert run.skipped and not run.losses
    monkeypatch.delenv("NBGRADER_EXECUTION")
    assert not training.grading()


def test_attention_maps_are_causal_rows_that_sum_to_one():
    model = _tiny_model()
    maps = training.attention_maps(model, tasks.ReversalTask(3, 4).held_out().inputs)  # (L, b, H, T, T)
    assert maps.shape == (2, 4, 2, 6, 6)
    assert torch.allclose(maps.sum(-1), torch.ones(2, 4, 2, 6))
    assert not maps.triu(1).any()
    assert training.reversal_score(maps, 3).shape == (2, 2)


def test_the_stored_notebook_reaches_95_percent_on_held_out_sequences():
    nb = nbformat.read(course.solutions_dir() / f"{NOTEBOOK}.ipynb", as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    final = re.search(r"final held-out accuracy: ([\d.]+)%", text)
    assert final, "the solution notebook prints no final accuracy"
    assert float(final.group(1)) >= 95.0
    failed = re.findall(r"(no positions|mean instead of attention)\s+([\d.]+)%", text)
    assert len(failed) == 2 and all(float(acc) < 50.0 for _, acc in failed), failed


# ---------------------------------------------------------------- the references themselves
def test_sinusoids_follow_the_formula_and_refuse_an_odd_size():
    pe = reference.sinusoidal_positions(50, 8)
    for pos, i in ((0, 0), (1, 0), (7, 1), (49, 3)):
        angle = pos / 10000 ** (2 * i / 8)
        assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
        assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)
    with pytest.raises(ValueError, match="even"):
        reference.sinusoidal_positions(4, 5)


def test_the_block_is_pytorchs_pre_ln_encoder_layer_with_a_causal_mask():
    d, H, T = 12, 3, 7
    torch.manual_seed(0)
    ours = reference.TransformerBlock(d, H, T, 0.0).eval()
    theirs = torch.nn.TransformerEncoderLayer(d, H, dim_feedforward=4 * d, dropout=0.0, activation="gelu",
                                              batch_first=True, norm_first=True).eval()
    with torch.no_grad():
        att = ours.att
        theirs.self_attn.in_proj_weight.copy_(torch.cat([att.W_query.weight, att.W_key.weight, att.W_value.weight]))
        theirs.self_attn.in_proj_bias.zero_()
        theirs.self_attn.out_proj.load_state_dict(att.out_proj.state_dict())
        theirs.linear1.load_state_dict(ours.ff[0].state_dict())
        theirs.linear2.load_state_dict(ours.ff[2].state_dict())
        theirs.norm1.load_state_dict(ours.norm1.state_dict())
        theirs.norm2.load_state_dict(ours.norm2.state_dict())
    x = torch.randn(2, T, d)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    torch.testing.assert_close(ours(x), theirs(x, src_mask=mask), atol=1e-5, rtol=1e-4)


def test_tiny_gpt_is_causal_and_refuses_too_long_input():
    model = _tiny_model().eval()
    idx = torch.randint(0, tasks.VOCAB_SIZE, (2, 6), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % tasks.VOCAB_SIZE
    torch.testing.assert_close(model(idx)[:, :4], model(changed)[:, :4])
    assert not torch.allclose(model(idx)[:, 4:], model(changed)[:, 4:])
    with pytest.raises(ValueError, match="num_tokens > context_length"):
        model(torch.zeros(1, 7, dtype=torch.long))


def test_train_step_uses_the_answer_positions_only():
    model = _tiny_model()
    batch = tasks.ReversalTask(3, 4).batch(5, torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(batch.inputs)
        expected = torch.nn.functional.cross_entropy(logits[:, 3:].flatten(0, 1), batch.targets[:, 3:].flatten())
    before = [p.detach().clone() for p in model.parameters()]
    loss = reference.train_step(model, batch, torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(loss, float) and loss == pytest.approx(expected.item(), rel=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
