"""The reference cut down to a few helpers (grader/reference_subset.py): what a kernel may hold for
``modules.check_alone``'s first try, and nothing more."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from course_utils import reference
from grader import reference_subset, sandbox

NB08, NB09 = "08_kv_cache_gqa_and_windows", "09_capstone_tiny_transformer"


def _loaded(names: list[str]) -> dict:
    namespace: dict = {"__name__": "course_utils.reference"}
    exec(compile(reference_subset.subset_source(names), "reference_subset", "exec"), namespace)  # noqa: S102
    return namespace


def test_each_notebook_names_the_helpers_its_checks_swap_in():
    assert reference_subset.alone_helpers(NB08) == {
        "MultiHeadAttentionKVCache": ["decode_causal_mask", "apply_rope"], "GroupedQueryAttention": ["repeat_kv"],
        "apply_rope": ["rope_angles"]}
    assert reference_subset.alone_helpers(NB09) == {
        "TinyGPT": ["LearnedPositionalEmbedding", "TransformerBlock", "sinusoidal_positions"]}
    assert reference_subset.alone_helpers("05_multi_head_attention") == {"MultiHeadAttention": ["split_heads",
                                                                                              "merge_heads"]}
    assert reference_subset.alone_helpers("02_softmax_and_context") == {
        "softmax_stable": ["softmax_naive"], "context_vectors": ["softmax_naive", "softmax_stable"]}
    for notebook in ("01_dot_products", "06_efficient_attention_gpu", "07_flash_attention_from_scratch", None, "xx"):
        assert reference_subset.alone_helpers(notebook) == {}, notebook  # no exercise there calls another
        assert reference_subset.first_try_groups(notebook) == []


def test_no_first_try_kernel_holds_the_answer_of_an_exercise_it_checks():
    """08's apply_rope is a helper of the cache class and is checked with rope_angles itself: its first
    try gets a kernel of its own, whose reference has rope_angles and not apply_rope."""
    groups = reference_subset.first_try_groups(NB08)
    assert groups == [(["MultiHeadAttentionKVCache", "GroupedQueryAttention"], ["decode_causal_mask", "apply_rope",
                                                                               "repeat_kv"]),
                      (["apply_rope"], ["rope_angles"])]
    from grader import course

    for notebook in course.NOTEBOOKS:
        for exercises, helpers in reference_subset.first_try_groups(notebook):
            assert not set(exercises) & set(reference_subset.needed(helpers)), (notebook, exercises)
    assert reference_subset.first_try_groups("04_causal_attention") == [  # CausalAttention's reference holds
        (["causal_attention_weights"], ["causal_mask"]),  # causal_attention_weights: a kernel of its own
        (["CausalAttention"], ["causal_mask", "causal_attention_weights"])]


def test_a_helper_that_needs_its_own_exercise_is_refused(monkeypatch):
    monkeypatch.setattr(reference_subset, "alone_helpers", lambda notebook: {"apply_rope": ["apply_rope"]})
    with pytest.raises(ValueError, match="apply_rope is among the definitions its own helpers use"):
        reference_subset.first_try_groups(NB08)


def test_notebook_08s_helpers_come_alone():
    """apply_rope uses rope_angles, so both come; the exercises that build on the helpers stay out."""
    kept = reference_subset.needed(["decode_causal_mask", "apply_rope", "repeat_kv"])
    assert kept == ["decode_causal_mask", "repeat_kv", "rope_angles", "apply_rope"]
    namespace = _loaded(kept)
    for name in ("GroupedQueryAttention", "MultiHeadAttentionKVCache", "sliding_window_mask", "softmax_stable",
                 "TinyGPT", "flash_attention_forward"):
        assert name not in namespace, f"{name} came along"
    assert namespace["__all__"] == kept


def test_a_helper_brings_the_definitions_it_uses():
    """09's TransformerBlock is built from the reference's cached multi-head attention, which is built on
    split_heads, merge_heads and the others: they come too, in the file's order, and work."""
    kept = reference_subset.needed(reference_subset.alone_helpers(NB09)["TinyGPT"])
    assert {"TransformerBlock", "MultiHeadAttentionKVCache", "split_heads", "merge_heads"} <= set(kept)
    assert "TinyGPT" not in kept and "generate" not in kept and "train_step" not in kept
    namespace = _loaded(kept)
    torch.manual_seed(0)
    mine = namespace["TransformerBlock"](8, 2, 6, 0.0).eval()
    torch.manual_seed(0)
    theirs = reference.TransformerBlock(8, 2, 6, 0.0).eval()
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(mine(x), theirs(x))


def test_an_unknown_name_is_refused_by_name():
    with pytest.raises(ValueError, match="no NotAnExercise"):
        reference_subset.needed(["repeat_kv", "NotAnExercise"])


def test_annotations_bring_nothing_along():
    source = ("from __future__ import annotations\nimport torch\n\n"
              "class Answer:\n    pass\n\n"
              "def helper(x: Answer) -> Answer:\n    return x\n\n"
              "def other(x):\n    return helper(x)\n")
    assert reference_subset.needed(["helper"], source) == ["helper"]
    assert reference_subset.needed(["other"], source) == ["helper", "other"]


def test_the_file_is_written_read_only(tmp_path):
    path = reference_subset.write_subset(["repeat_kv"], tmp_path)
    assert path.name == "reference.py" and not path.stat().st_mode & 0o222
    assert "def repeat_kv" in path.read_text() and "class GroupedQueryAttention" not in path.read_text()


def test_a_kernel_shown_the_subset_finds_the_helpers_and_nothing_else(tmp_path):
    """In the real sandbox: the helpers' answers import as course_utils.reference, the rest of the
    reference and the hidden cases are not there."""
    with pytest.raises(ValueError, match="only over the student edition"):
        sandbox.sandbox_command(["python"], socket_dir=str(tmp_path), memory=0, bwrap="bwrap",
                                reference=str(tmp_path / "reference.py"))
    ok, why = sandbox.check_bwrap()
    if not ok:
        pytest.skip(why)
    subset = reference_subset.write_subset(["repeat_kv"], tmp_path / "subset")
    probe = ("import os, course_utils, course_utils.reference as r\n"
             "print(sorted(os.listdir(os.path.join(os.path.dirname(course_utils.__file__), 'instructor'))))\n"
             "print(r.repeat_kv.__name__, hasattr(r, 'GroupedQueryAttention'), hasattr(r, 'softmax_stable'))\n")
    cmd = sandbox.sandbox_command([sys.executable, "-c", probe], socket_dir=str(tmp_path), memory=0,
                                  bwrap=sandbox.bwrap_path(), student_edition=True, reference=str(subset))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[]", "repeat_kv False False"], done.stdout
