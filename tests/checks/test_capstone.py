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
from tests.support.graded_class import solved, submissions

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


# ---------------------------------------------------------------- one mistake, one exercise (issue 19)
def _notebook_with(helper: str, source: str) -> tuple[dict, dict]:
    """The graded notebook's namespace with ``helper``'s answer replaced by ``source``, and the notebook's
    own TinyGPT defined again in it (so that its code looks its helpers up in this namespace)."""
    from tests.support import harness

    base, cells = harness._executed(NOTEBOOK)
    namespace = dict(base)
    harness.run_source(source, namespace, f"{NOTEBOOK}:{helper}:wrong")
    harness.run_source(cells["TinyGPT"], namespace, f"{NOTEBOOK}:TinyGPT")
    return namespace, cells


def _run_tests(namespace: dict, cells: dict, exercise: str, visible_only: bool = False) -> None:
    from tests.support import harness

    for gid in harness.test_ids_for(exercise, cells, NOTEBOOK):
        source = harness.visible_source(cells[gid]) if visible_only else cells[gid]
        harness.run_source(source, namespace, f"{NOTEBOOK}:{gid}")


HELPER_MISTAKES = [("LearnedPositionalEmbedding", "positions reversed"),
                   ("LearnedPositionalEmbedding", "no ValueError past context_length"),
                   ("TransformerBlock", "LayerNorm after instead of before (post-LN)"),
                   ("TransformerBlock", "residual missing around the attention"),
                   ("sinusoidal_positions", "sin and cos swapped")]


@pytest.mark.parametrize("helper, label", HELPER_MISTAKES)
def test_a_wrong_helper_costs_only_its_own_points(helper, label):
    from tests.fixtures.answers import nb09

    namespace, cells = _notebook_with(helper, nb09.WRONG[helper][label])
    students = namespace[helper]
    with pytest.raises(AssertionError):
        _run_tests(namespace, cells, helper)  # the helper loses its points
    for exercise in ("TinyGPT", "TransformerBlock", "train_step"):
        if exercise != helper:
            _run_tests(namespace, cells, exercise)  # visible and hidden tests: full marks
    assert namespace[helper] is students  # the student's own version is back for the demos
    if helper != "sinusoidal_positions":
        torch.manual_seed(0)
        model = namespace["TinyGPT"](tasks.VOCAB_SIZE, 8, 2, 1, 6, 0.0)
        used = model.pos_emb if helper == "LearnedPositionalEmbedding" else model.blocks[0]
        assert type(used) is students


@pytest.mark.parametrize("helper, label", HELPER_MISTAKES[:1] + HELPER_MISTAKES[2:3])
def test_the_student_editions_check_names_the_broken_helper(helper, label):
    from course_utils.checks import expected
    from tests.fixtures.answers import nb09

    namespace, cells = _notebook_with(helper, nb09.WRONG[helper][label])
    with expected.using(expected.RECORDED), pytest.raises(AssertionError) as info:
        _run_tests(namespace, cells, "TinyGPT", visible_only=True)
    message = str(info.value)
    assert f"your TinyGPT uses your {helper}, which does not pass its own check yet" in message
    assert "costs TinyGPT no points" in message
    assert namespace[helper] is not getattr(reference, helper)


def test_a_tiny_gpt_that_relies_on_its_own_helpers_attributes_still_passes():
    """An answer may reach into its own helper (a table it named ``pos``): it is tried with it too."""
    from tests.fixtures.answers import nb09

    helper = nb09._LEARNED.replace("self.embedding", "self.pos")
    own = """
        x = self.tok_emb(idx)
        T = x.shape[1]
        if isinstance(self.pos_emb, training.FixedPositions):
            x = self.pos_emb(x, start=start)
        else:
            if start + T > self.pos_emb.pos.num_embeddings:
                raise ValueError(f"{start + T} positions, but context_length is {self.pos_emb.pos.num_embeddings}")
            x = x + self.pos_emb.pos.weight[start:start + T]
"""
    gpt = nb09._GPT.replace("        x = self.pos_emb(self.tok_emb(idx), start=start)\n", own.lstrip("\n"))
    assert gpt != nb09._GPT
    namespace, cells = _notebook_with("LearnedPositionalEmbedding", helper)
    from tests.support import harness

    harness.run_source(gpt, namespace, f"{NOTEBOOK}:TinyGPT:own")
    _run_tests(namespace, cells, "TinyGPT")


# ---------------------------------------------------------------- rules announced, one error standard
def test_every_rule_of_notebook_09_is_announced_in_its_exercise_text():
    from course_utils import rules

    nb = nbformat.read(course.notebooks_dir() / f"{NOTEBOOK}.ipynb", as_version=4)
    for exercise in course.EXERCISES[NOTEBOOK]:
        rule = rules.RULES.get(exercise)
        if rule is None:
            continue
        heading = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                       and re.search(rf"### Exercise \d+: `{exercise}`", c.source))
        text = []
        for cell in nb.cells[heading:]:
            if cell.cell_type != "markdown":
                break
            text.append(cell.source)
        text = "\n".join(text)
        for name in rule.forbidden_calls:
            assert name in text, f"{exercise}: the exercise text does not announce that {name} is forbidden"


def test_too_long_inputs_raise_a_value_error_that_names_the_limit():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="5"):
        reference.LearnedPositionalEmbedding(5, 4)(torch.zeros(1, 6, 4))
    with pytest.raises(ValueError, match="6"):
        reference.TinyGPT(tasks.VOCAB_SIZE, 8, 2, 1, 6, 0.0, positions="sinusoidal")(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="learned"):
        reference.TinyGPT(tasks.VOCAB_SIZE, 8, 2, 1, 6, 0.0, positions="rotary")


def test_sinusoidal_positions_are_a_fixed_buffer_of_the_model():
    torch.manual_seed(0)
    model = reference.TinyGPT(tasks.VOCAB_SIZE, 8, 2, 1, 6, 0.0, positions="sinusoidal")
    assert not any(name.startswith("pos_emb") for name, _ in model.named_parameters())
    torch.testing.assert_close(model.pos_emb.table, reference.sinusoidal_positions(6, 8))
    x = torch.zeros(2, 4, 8)
    torch.testing.assert_close(model.pos_emb(x), reference.sinusoidal_positions(4, 8).expand(2, 4, 8))


def test_train_step_that_returns_the_loss_tensor_fails_and_says_why():
    from course_utils import checks

    def returns_tensor(model, batch, optimizer):
        inputs, targets, mask = batch
        loss = torch.nn.functional.cross_entropy(model(inputs)[mask], targets[mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    with pytest.raises(AssertionError, match="still holds its computation graph"):
        checks.check_train_step(returns_tensor)


#: The submission graded in the suite's one class (``tests/support/graded_class.py``): notebook 09 solved but for
#: LearnedPositionalEmbedding.
WRONG_EMBEDDING = ("capstone_wrong_embedding", NOTEBOOK)


@submissions("test_capstone")
def _submissions(taken: set) -> dict:
    """Notebook 09 whose only mistake is in LearnedPositionalEmbedding (its positions reversed)."""
    from tests.fixtures.answers import nb09

    wrong = nb09.WRONG["LearnedPositionalEmbedding"]["positions reversed"]
    return {WRONG_EMBEDDING: (solved(NOTEBOOK, {"LearnedPositionalEmbedding": wrong}), None)}


def test_graded_by_nbgrader_a_wrong_embedding_costs_only_its_own_points(graded_class):
    """The same through the real pipeline (a sandboxed IPython kernel, nbgrader's scores), in the suite's one
    graded class: a notebook whose only mistake is in LearnedPositionalEmbedding keeps every point of TinyGPT,
    TransformerBlock and train_step."""
    from tests.support import harness

    assert graded_class.code == 0
    cells = {gid: (float(r["score"]), float(r["max_score"])) for gid, r in graded_class.cells[WRONG_EMBEDDING].items()}
    for exercise in course.EXERCISES[NOTEBOOK]:
        ids = harness.test_ids_for(exercise, cells, NOTEBOOK)
        score, max_score = sum(cells[i][0] for i in ids), sum(cells[i][1] for i in ids)
        if exercise == "LearnedPositionalEmbedding":
            assert score < max_score
        else:
            assert score == max_score, f"{exercise} lost points for the embedding's mistake: {cells}"


# ---------------------------------------------------------------- generation with notebook 08's KV cache (issue 20)
def _random_gpt(positions: str = "learned", context_length: int = 12) -> torch.nn.Module:
    torch.manual_seed(3)
    return reference.TinyGPT(tasks.VOCAB_SIZE, 16, 2, 2, context_length, 0.0, positions=positions).eval()


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_the_cached_model_gives_the_full_forward_logits(positions):
    model = _random_gpt(positions)
    idx = torch.randint(0, tasks.VOCAB_SIZE, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        model.reset_cache()
        parts = [model(idx[:, :4], use_cache=True), model(idx[:, 4:5], use_cache=True),
                 model(idx[:, 5:8], use_cache=True), model(idx[:, 8:], use_cache=True)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-4)
    assert model.num_cached == 10
    model.reset_cache()
    assert model.num_cached == 0 and all(block.att.num_cached == 0 for block in model.blocks)


def test_greedy_generation_writes_the_same_tokens_with_and_without_the_cache():
    model = _random_gpt()
    prompt = torch.randint(0, tasks.VOCAB_SIZE, (4, 5), generator=torch.Generator().manual_seed(2))
    cached = reference.generate(model, prompt, 7, temperature=0.0)
    recomputed = reference.generate(model, prompt, 7, temperature=0.0, use_cache=False)
    assert cached.shape == (4, 12) and torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, recomputed)
    assert torch.equal(cached, training.generate(model, prompt, 7))  # the given full-recompute greedy loop
    assert torch.equal(reference.generate(model, prompt, 7, temperature=0.8, top_k=1), cached)  # top-1 is greedy


def test_sampling_is_seeded_and_top_k_keeps_k_tokens():
    model = _random_gpt()
    prompt = torch.randint(0, tasks.VOCAB_SIZE, (64, 3), generator=torch.Generator().manual_seed(4))
    runs = []
    for use_cache in (True, True, False):
        torch.manual_seed(11)
        runs.append(reference.generate(model, prompt, 6, temperature=1.5, use_cache=use_cache))
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    assert not torch.equal(runs[0], reference.generate(model, prompt, 6, temperature=0.0))
    torch.manual_seed(12)
    two = reference.generate(model, prompt, 1, temperature=5.0, top_k=2)[:, -1]  # (64,)
    with torch.no_grad():
        allowed = model(prompt)[:, -1].topk(2).indices  # (64, 2)
    assert (two[:, None] == allowed).any(dim=1).all()


def test_generation_past_context_length_raises_a_value_error_that_names_it():
    model = _random_gpt(context_length=12)
    prompt = torch.zeros(1, 5, dtype=torch.long)
    assert reference.generate(model, prompt, 8, temperature=0.0).shape == (1, 13)  # reads 12 tokens: fits
    for use_cache in (True, False):
        with pytest.raises(ValueError, match="context_length is 12"):
            reference.generate(model, prompt, 9, temperature=0.0, use_cache=use_cache)
    with pytest.raises(ValueError, match="temperature"):
        reference.generate(model, prompt, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        reference.generate(model, prompt, 2, top_k=0)


def test_helpers_reached_through_the_students_own_functions_are_replaced_too():
    from course_utils.checks import modules

    namespace: dict = {"TransformerBlock": object(), "LearnedPositionalEmbedding": object()}
    exec("def make_block():\n    return TransformerBlock()\n"  # noqa: S102 - a student's cell
         "class Model:\n    def __init__(self):\n        self.blocks = [make_block() for _ in range(2)]\n",
         namespace)
    used = {name for _, name in modules.helpers_used(namespace["Model"], ["TransformerBlock", "LearnedPositionalEmbedding"])}
    assert used == {"TransformerBlock"}
