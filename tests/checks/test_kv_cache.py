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
