"""Notebook 08's references against PyTorch's own implementations of the same ideas, and their errors.

The checks compare a student's answers with these references, so the references themselves are held
to independent definitions here: SDPA's bottom-right causal bias, SDPA's ``enable_gqa``, FlexAttention's
``create_mask``, and one causal forward over the whole sequence for any way of cutting it into chunks.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_utils import reference as R
from course_utils.checks.nb08 import decode

CHUNKINGS = [[10], [1] * 10, [4, 1, 1, 1, 1, 1, 1], [3, 2, 1, 4], [1, 9], [5, 5]]


@pytest.mark.parametrize("tq, tk", [(1, 1), (1, 6), (3, 7), (5, 5), (2, 9)])
def test_decode_mask_is_sdpa_lower_right_bias(tq, tk):
    from torch.nn.attention.bias import causal_lower_right

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, tq, 4), torch.randn(1, 2, tk, 4), torch.randn(1, 2, tk, 4)
    ours = F.scaled_dot_product_attention(q, k, v, attn_mask=~R.decode_causal_mask(tq, tk))
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(tq, tk))
    torch.testing.assert_close(ours, theirs)
    assert torch.equal(R.decode_causal_mask(tk, tk), R.causal_mask(tk))


def test_decode_mask_rejects_more_queries_than_keys():
    with pytest.raises(ValueError, match="num_queries > num_keys"):
        R.decode_causal_mask(4, 3)


@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("batch", [1, 3])
def test_cache_reproduces_the_full_forward_in_float64(chunks, batch):
    torch.manual_seed(1)
    module = R.MultiHeadAttentionKVCache(6, 8, 12, 0.0, 2).to(torch.float64).eval()
    x = torch.rand(batch, 10, 6, dtype=torch.float64)
    with torch.no_grad():
        whole = module(x)
    torch.testing.assert_close(decode(module, x, chunks), whole, atol=1e-12, rtol=1e-10)
    assert module.cache_k.shape == (batch, 2, 10, 4)
    module.reset_cache()
    assert module.cache_k is None and module.num_cached == 0


def test_cache_errors_are_clear():
    module = R.MultiHeadAttentionKVCache(4, 4, 5, 0.0, 2).eval()
    with pytest.raises(ValueError, match="empty"):
        module(torch.rand(1, 0, 4), use_cache=True)
    module(torch.rand(1, 5, 4), use_cache=True)
    with pytest.raises(ValueError, match="context_length"):
        module(torch.rand(1, 1, 4), use_cache=True)
    module.reset_cache()
    module(torch.rand(2, 2, 4), use_cache=True)
    with pytest.raises(ValueError, match="batch"):
        module(torch.rand(3, 1, 4), use_cache=True)


def test_cache_moves_with_the_module():
    module = R.MultiHeadAttentionKVCache(4, 4, 8, 0.0, 2).eval()
    module(torch.rand(1, 3, 4), use_cache=True)
    module.to(torch.float64)
    assert module.cache_k.dtype == torch.float64
    assert "cache_k" not in module.state_dict()


@pytest.mark.parametrize("heads, groups", [(4, 2), (4, 1), (4, 4), (6, 3), (8, 2)])
def test_gqa_equals_sdpa_enable_gqa(heads, groups):
    torch.manual_seed(2)
    gqa = R.GroupedQueryAttention(6, 2 * heads, 12, 0.0, heads, groups).eval()
    x = torch.rand(2, 9, 6)
    with torch.no_grad():
        q = R.split_heads(gqa.W_query(x), heads)
        k = R.split_heads(gqa.W_key(x), groups)
        v = R.split_heads(gqa.W_value(x), groups)
        core = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.testing.assert_close(gqa(x), gqa.out_proj(R.merge_heads(core)))


def test_gqa_with_one_group_per_head_is_multi_head_attention():
    torch.manual_seed(123)
    gqa = R.GroupedQueryAttention(4, 8, 10, 0.0, 4, 4).eval()
    torch.manual_seed(123)
    mha = R.MultiHeadAttention(4, 8, 10, 0.0, 4).eval()
    x = torch.rand(2, 10, 4)
    assert torch.equal(gqa(x), mha(x))


def test_gqa_rejects_groups_that_do_not_divide_the_heads():
    with pytest.raises(ValueError, match="num_kv_groups must divide num_heads"):
        R.GroupedQueryAttention(8, 8, 6, 0.0, 4, 3)


def test_repeat_kv_matches_repeat_interleave():
    x = torch.rand(2, 3, 5, 4)
    assert torch.equal(R.repeat_kv(x, 4), x.repeat_interleave(4, dim=1))
    assert R.repeat_kv(x, 1) is x


@pytest.mark.parametrize("T, window", [(1, 1), (6, 1), (6, 2), (7, 3), (5, 5), (5, 9)])
def test_sliding_window_mask_and_mask_mod_agree(T, window):
    from torch.nn.attention.flex_attention import create_mask

    hidden = R.sliding_window_mask(T, window)
    allowed = create_mask(R.sliding_window_mask_mod(window), None, None, T, T, device="cpu")[0, 0]
    assert torch.equal(allowed, ~hidden)
    assert bool((~hidden).sum(-1).le(window).all()) and bool((~hidden).diagonal().all())
    if window >= T:
        assert torch.equal(hidden, R.causal_mask(T))


def test_sliding_window_rejects_an_empty_window():
    with pytest.raises(ValueError, match="window"):
        R.sliding_window_mask(4, 0)
    with pytest.raises(ValueError, match="window"):
        R.sliding_window_mask_mod(0)


# ------------------------------------------------------------------------------------------
# One mistake, one exercise: a module's tests run with our versions of the notebook's other answers
# ------------------------------------------------------------------------------------------
NOTEBOOK = "08_kv_cache_gqa_and_windows"


def _namespace_with(*sources: tuple[str, str]) -> dict:
    """The executed solution notebook's namespace, with each ``(label, source)`` run in it, in order."""
    from tests.support import harness

    base, _ = harness._executed(NOTEBOOK)
    namespace = dict(base)
    for label, source in sources:
        harness.run_source(source, namespace, f"{NOTEBOOK}:{label}")
    return namespace


def _run_tests(namespace: dict, exercise: str, visible: bool = False) -> None:
    from tests.support import harness

    _, cells = harness._executed(NOTEBOOK)
    for gid in harness.test_ids_for(exercise, cells, NOTEBOOK):
        source = harness.visible_source(cells[gid]) if visible else cells[gid]
        harness.run_source(source, namespace, f"{NOTEBOOK}:{gid}")


def _helper_cases():
    from tests.fixtures.answers import nb08

    for label, source in nb08.WRONG["repeat_kv"].items():
        yield pytest.param("repeat_kv", source, "GroupedQueryAttention", None, id=f"repeat_kv-{label}")
    user = nb08.RIGHT["MultiHeadAttentionKVCache"]["cache kept as (b, T, H, D), before the transpose"]
    assert "decode_causal_mask(" in user  # this answer calls the helper
    for label, source in nb08.WRONG["decode_causal_mask"].items():
        yield pytest.param("decode_causal_mask", source, "MultiHeadAttentionKVCache", user,
                           id=f"decode_causal_mask-{label}")
    for label, source in nb08.WRONG["apply_rope"].items():  # the solution's cache calls apply_rope with rope=True
        yield pytest.param("apply_rope", source, "MultiHeadAttentionKVCache", None, id=f"apply_rope-{label}")
    for label, source in nb08.WRONG["rope_angles"].items():
        yield pytest.param("rope_angles", source, "apply_rope", None, id=f"rope_angles-{label}")


@pytest.mark.parametrize("helper, wrong_helper, module, module_answer", list(_helper_cases()))
def test_a_wrong_helper_costs_only_its_own_points(helper, wrong_helper, module, module_answer):
    """Graded (instructor edition): the helper's tests fail, the module that calls it keeps its points."""
    from course_utils.checks import expected
    from tests.support import harness

    _, cells = harness._executed(NOTEBOOK)
    with expected.using(expected.LIVE), harness._under_grader():
        namespace = _namespace_with((helper, wrong_helper), (module, module_answer or cells[module]))
        with pytest.raises(AssertionError):
            _run_tests(namespace, helper)
        _run_tests(namespace, module)  # hidden tests included: no exception, full points
        assert namespace[helper].__code__.co_filename.endswith(f"{helper}>")  # the student's helper is back


def test_student_edition_names_the_helper_to_fix_first():
    """Student edition (no reference code): a module whose helper fails its own check names that helper
    first (what the module's check found comes after it)."""
    from course_utils.checks import expected
    from tests.fixtures.answers import nb08
    from tests.support import harness

    _, cells = harness._executed(NOTEBOOK)
    with expected.using(expected.RECORDED):
        namespace = _namespace_with(("repeat_kv", nb08.WRONG["repeat_kv"]["tiled with repeat"]),
                                    ("GroupedQueryAttention", cells["GroupedQueryAttention"]))
        with pytest.raises(AssertionError) as info:
            _run_tests(namespace, "GroupedQueryAttention", visible=True)
    message = str(info.value)
    first_sentence = message.split(": fix it first")[0]
    assert "uses your repeat_kv, which does not pass its own check yet" in first_sentence, message
    with expected.using(expected.RECORDED):  # with a right repeat_kv, the student's module passes as before
        namespace = _namespace_with(("repeat_kv", nb08.RIGHT["repeat_kv"]["repeat_interleave"]),
                                    ("GroupedQueryAttention", cells["GroupedQueryAttention"]))
        _run_tests(namespace, "GroupedQueryAttention", visible=True)


def test_every_rule_is_announced_in_its_exercise_text():
    """Each forbidden call of an exercise of 08 is named in the markdown just before its answer cell."""
    from course_utils import rules
    from tests.support import harness

    nb = harness.solution_notebook(NOTEBOOK)
    for index, cell in enumerate(nb.cells):
        exercise = harness.grade_id(cell)
        if exercise not in rules.RULES or not cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            continue
        text = nb.cells[index - 1].source
        missing = [name for name in rules.RULES[exercise].forbidden_calls if name not in text]
        assert not missing, f"{exercise}: the exercise text does not announce {missing}"


# ------------------------------------------------------------------------------------------
# Section 4: the GQA cache holds the G heads; section 1: the two-colour mask plot
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("heads, groups", [(4, 2), (6, 1), (4, 4)])
def test_a_gqa_cache_of_the_groups_reproduces_the_full_forward(heads, groups):
    torch.manual_seed(3)
    gqa = R.GroupedQueryAttention(6, 2 * heads, 12, 0.0, heads, groups).eval()
    x = torch.rand(2, 9, 6)
    cache_k = cache_v = None
    outputs = []
    with torch.no_grad():
        for t in range(x.shape[1]):
            x_t = x[:, t:t + 1]
            q = R.split_heads(gqa.W_query(x_t), heads)
            k, v = R.split_heads(gqa.W_key(x_t), groups), R.split_heads(gqa.W_value(x_t), groups)
            cache_k = k if cache_k is None else torch.cat([cache_k, k], dim=2)
            cache_v = v if cache_v is None else torch.cat([cache_v, v], dim=2)
            keys, values = R.repeat_kv(cache_k, heads // groups), R.repeat_kv(cache_v, heads // groups)
            core = F.scaled_dot_product_attention(q, keys, values)
            outputs.append(gqa.out_proj(R.merge_heads(core)))
        whole = gqa(x)
    assert cache_k.shape == (2, groups, 9, 2)  # num_kv_groups heads, not num_heads
    torch.testing.assert_close(torch.cat(outputs, dim=1), whole)


def test_gqa_past_context_length_raises_a_value_error_naming_the_limit():
    with pytest.raises(ValueError, match="context_length"):
        R.GroupedQueryAttention(4, 8, 5, 0.0, 4, 2)(torch.rand(1, 6, 4))


def test_boolean_masks_are_drawn_with_a_two_colour_legend():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_utils import plotting

    fig, ax = plt.subplots()
    plotting.plot_attention(~R.causal_mask(4), legend=("hidden", "may attend"), ax=ax)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["may attend", "hidden"]
    assert len(fig.axes) == 1  # no colour bar
    image = ax.get_images()[0].get_array()
    assert sorted({float(v) for v in image.flatten()}) == [0.0, 1.0]
    plt.close(fig)
    with pytest.raises(ValueError, match="two labels"):
        plotting.plot_mask(R.causal_mask(3), ("only one",))


# ------------------------------------------------------------------------------------------
# RoPE: the reference against an independent complex-number formulation, and with the cache
# ------------------------------------------------------------------------------------------
def _rope_complex(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE written another way: pair i = (x_i, x_{i+D/2}) is the complex number x_i + j x_{i+D/2},
    multiplied by e^{j p theta_i} with theta_i = base^(-2i/D) (float64 throughout)."""
    D = x.shape[-1]
    theta = torch.tensor([base ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    turn = torch.polar(torch.ones(len(positions), D // 2, dtype=torch.float64),
                       positions.to(torch.float64)[:, None] * theta)  # (T, D/2), |turn| = 1
    z = torch.complex(x[..., : D // 2].double(), x[..., D // 2:].double()) * turn
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


@pytest.mark.parametrize("shape, positions, atol", [((2, 3, 5, 8), range(5), 1e-5), ((4, 6), [3, 7, 8, 100], 1e-5),
                                                    ((1, 2, 3, 64), [0, 4095, 17], 1e-3)])
def test_apply_rope_is_a_complex_rotation(shape, positions, atol):
    # float32 angles: an angle of 4095 radians is stored to about 4095 * 6e-8 = 2.4e-4, hence atol=1e-3 there.
    torch.manual_seed(4)
    x = torch.randn(*shape)
    positions = torch.tensor(list(positions))
    torch.testing.assert_close(R.apply_rope(x, positions), _rope_complex(x, positions), atol=atol, rtol=1e-4)
    torch.testing.assert_close(R.apply_rope(x, positions).norm(dim=-1), x.norm(dim=-1))  # a rotation


def test_rope_angles_values_and_errors():
    angles = R.rope_angles(8, 3, base=100.0)
    assert angles.shape == (3, 4) and angles.dtype == torch.float32
    torch.testing.assert_close(angles[2], torch.tensor([2.0, 2 * 100 ** -0.25, 2 * 100 ** -0.5, 2 * 100 ** -0.75]))
    with pytest.raises(ValueError, match="even"):
        R.rope_angles(5, 3)


def test_rotated_scores_depend_only_on_the_distance():
    torch.manual_seed(5)
    q, k = torch.randn(1, 16), torch.randn(1, 16)
    def score(i, j):
        return (R.apply_rope(q, torch.tensor([i])) @ R.apply_rope(k, torch.tensor([j])).T).item()
    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5) == pytest.approx(score(102, 100), abs=1e-4)


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_a_rope_cache_rotates_at_start_plus_i_before_caching(chunks):
    torch.manual_seed(6)
    module = R.MultiHeadAttentionKVCache(6, 8, 12, 0.0, 2, rope=True).to(torch.float64).eval()
    x = torch.rand(2, 10, 6, dtype=torch.float64)
    with torch.no_grad():
        whole = module(x)
        plain = R.MultiHeadAttention.forward(module, x)
    torch.testing.assert_close(decode(module, x, chunks), whole, atol=1e-12, rtol=1e-10)
    assert (whole - plain).abs().max() > 1e-3  # the rotation changes the outputs
    keys = R.split_heads(module.W_key(x), 2)
    torch.testing.assert_close(module.cache_k, R.apply_rope(keys, torch.arange(10)))  # cached keys are rotated


def test_rope_is_off_by_default_and_the_api_is_unchanged():
    torch.manual_seed(7)
    plain = R.MultiHeadAttentionKVCache(4, 8, 10, 0.0, 2).eval()
    torch.manual_seed(7)
    mha = R.MultiHeadAttention(4, 8, 10, 0.0, 2).eval()
    x = torch.rand(1, 6, 4)
    assert plain.rope is False and torch.equal(plain(x), mha(x))
    with pytest.raises(ValueError, match="even head_dim"):
        R.MultiHeadAttentionKVCache(4, 6, 10, 0.0, 2, rope=True)


@pytest.mark.parametrize("mode", ["live", "recorded"])
def test_the_visible_kv_check_decodes_chunks_after_the_prompt(mode):
    """A cache that masks only its first call (the prompt) fails the student's own check cell, not only
    the hidden tests: a ✅ means what the check cell says."""
    from course_utils.checks import expected
    from tests.fixtures.answers import nb08
    from tests.support import harness

    answer = nb08.WRONG["MultiHeadAttentionKVCache"]["the mask applied only on the first call"]
    with expected.using(mode):
        passed, message = harness.check_verdict(NOTEBOOK, "MultiHeadAttentionKVCache", answer)
    assert not passed and "only on the first call" in message, message
