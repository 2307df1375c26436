"""The reference answers are right: they agree with PyTorch's own implementations, reproduce the
book's printed tensors, never look at the future, and reject bad input with a clear error."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

from course_utils import reference as R
from course_utils.data import book_batch, book_inputs

CAUSAL_CLASSES = [R.CausalAttention, R.MultiHeadAttention, R.MultiHeadAttentionEinsum,
                  R.MultiHeadAttentionCombinedQKV, R.MHAPyTorchSDPA]
MHA_CLASSES = [R.MultiHeadAttention, R.MultiHeadAttentionEinsum, R.MultiHeadAttentionCombinedQKV, R.MHAPyTorchSDPA]


def book(t: list) -> torch.Tensor:
    return torch.tensor(t)


def assert_4dp(actual: torch.Tensor, printed: list) -> None:
    """Equal to the book's printed numbers to 4 decimals."""
    assert_close(actual.detach(), book(printed), atol=5e-5, rtol=0)


# ---------------------------------------------------------------- the book's printed numbers
def test_book_scores_weights_and_context():
    inputs = book_inputs()
    assert_4dp(R.attention_scores_for_query(inputs, inputs[1]), [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865])
    assert_4dp(R.dot(inputs[0], inputs[1]), 0.9544)
    assert_4dp(R.softmax_stable(R.attention_scores(inputs))[1], [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581])
    assert_4dp(R.context_vectors(inputs)[1], [0.4419, 0.6515, 0.5683])
    assert_4dp(R.context_vectors(inputs)[4], [0.4671, 0.5910, 0.5266])


def test_book_self_attention_v1_and_v2():
    inputs = book_inputs()
    torch.manual_seed(123)
    assert_4dp(R.SelfAttention_v1(3, 2)(inputs)[:2], [[0.2996, 0.8053], [0.3061, 0.8210]])
    torch.manual_seed(789)
    assert_4dp(R.SelfAttention_v2(3, 2)(inputs)[[0, 5]], [[-0.0739, 0.0713], [-0.0754, 0.0693]])


def test_book_causal_wrapper_and_multihead():
    batch = book_batch()
    torch.manual_seed(123)
    out = R.CausalAttention(3, 2, 6, 0.0)(batch)
    assert out.shape == (2, 6, 2)
    assert_4dp(out[1, [0, 1, 5]], [[-0.4519, 0.2216], [-0.5874, 0.0058], [-0.5299, -0.1081]])
    torch.manual_seed(123)
    out = R.MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)(batch)
    assert_4dp(out[0, [0, 5]], [[-0.4519, 0.2216, 0.4772, 0.1063], [-0.5299, -0.1081, 0.5077, 0.3493]])
    torch.manual_seed(123)
    out = R.MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)(batch)
    assert_4dp(out[0], [[0.3190, 0.4858], [0.2943, 0.3897], [0.2856, 0.3593],
                        [0.2693, 0.3873], [0.2639, 0.3928], [0.2575, 0.4028]])


def test_book_causal_weights_from_v2():
    inputs = book_inputs()
    torch.manual_seed(789)
    sa = R.SelfAttention_v2(3, 2)
    w = R.causal_attention_weights(sa.W_query(inputs), sa.W_key(inputs))
    assert_4dp(w[[1, 3]], [[0.5517, 0.4483, 0, 0, 0, 0], [0.2758, 0.2460, 0.2462, 0.2319, 0, 0]])


def test_gpt2_small_parameter_count():
    mha = R.MultiHeadAttention(768, 768, 1024, 0.0, num_heads=12)
    assert R.count_parameters(mha) == 2_360_064


def test_count_parameters_skips_frozen():
    layer = nn.Linear(4, 3)
    layer.bias.requires_grad_(False)
    assert R.count_parameters(layer) == 12


# ---------------------------------------------------------------- agreement with PyTorch
@pytest.mark.parametrize("fn", [R.softmax_naive, R.softmax_stable])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_matches_torch(fn, dim):
    x = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(0))
    assert_close(fn(x, dim=dim), F.softmax(x, dim=dim))


def test_stable_softmax_large_and_minus_inf():
    x = torch.tensor([[1000.0, 1001.0, 999.0], [-torch.inf, 0.0, -torch.inf], [-1e4, -1e4 + 1, -1e4]])
    assert_close(R.softmax_stable(x), F.softmax(x, dim=-1))
    assert torch.isnan(R.softmax_naive(x[:1])).any(), "the naive version should overflow on 1000s"


def test_scaled_dot_product_attention_matches_torch():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 3, 7, 8, generator=g), torch.randn(2, 3, 7, 4, generator=g)
    assert_close(R.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


def test_causal_weights_match_sdpa_is_causal():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 9, 16, generator=g) for _ in range(3))
    assert_close(R.causal_attention_weights(q, k) @ v, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_causal_mask_shape_and_meaning():
    m = R.causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert not m.diagonal().any(), "a token must see itself"
    assert m[0, 1] and not m[1, 0]


def _copy_to_torch_mha(ref: R.MultiHeadAttention) -> nn.MultiheadAttention:
    d = ref.d_out
    torch_mha = nn.MultiheadAttention(d, ref.num_heads, bias=True, batch_first=True)
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([ref.W_query.weight, ref.W_key.weight, ref.W_value.weight]))
        torch_mha.in_proj_bias.zero_()
        torch_mha.out_proj.weight.copy_(ref.out_proj.weight)
        torch_mha.out_proj.bias.copy_(ref.out_proj.bias)
    return torch_mha


def test_multihead_matches_nn_multiheadattention():
    torch.manual_seed(3)
    ref = R.MultiHeadAttention(16, 16, 10, 0.0, num_heads=4)
    torch_mha = _copy_to_torch_mha(ref)
    x = torch.randn(2, 7, 16)
    mask = R.causal_mask(7)  # True = not allowed, as nn.MultiheadAttention expects
    expected, _ = torch_mha(x, x, x, attn_mask=mask, need_weights=False)
    assert_close(ref(x), expected, atol=1e-5, rtol=1e-4)


def _tie_mha_variants(src: R.MultiHeadAttention, dst: nn.Module) -> None:
    with torch.no_grad():
        if hasattr(dst, "qkv"):
            dst.qkv.weight.copy_(torch.cat([src.W_query.weight, src.W_key.weight, src.W_value.weight]))
        else:
            for name in ("W_query", "W_key", "W_value"):
                getattr(dst, name).weight.copy_(getattr(src, name).weight)
        dst.out_proj.load_state_dict(src.out_proj.state_dict())


@pytest.mark.parametrize("cls", [R.MultiHeadAttentionEinsum, R.MultiHeadAttentionCombinedQKV, R.MHAPyTorchSDPA])
def test_efficient_variants_agree_with_multihead(cls):
    torch.manual_seed(4)
    ref = R.MultiHeadAttention(12, 24, 16, 0.0, num_heads=3)
    other = cls(12, 24, 16, 0.0, num_heads=3)
    _tie_mha_variants(ref, other)
    x = torch.randn(3, 11, 12)
    assert_close(other(x), ref(x), atol=1e-5, rtol=1e-4)


def test_wrapper_and_split_heads_agree_with_tied_weights():
    torch.manual_seed(5)
    d_in, head_out, H = 5, 3, 4
    wrapper = R.MultiHeadAttentionWrapper(d_in, head_out, 8, 0.0, num_heads=H)
    mha = R.MultiHeadAttention(d_in, head_out * H, 8, 0.0, num_heads=H)
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            getattr(mha, name).weight.copy_(torch.cat([getattr(h, name).weight for h in wrapper.heads]))
        mha.out_proj.weight.copy_(torch.eye(head_out * H))
        mha.out_proj.bias.zero_()
    x = torch.randn(2, 6, d_in)
    assert_close(mha(x), wrapper(x))


def test_split_and_merge_heads_are_inverse():
    x = torch.randn(2, 5, 12)
    heads = R.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert_close(heads[:, 1], x[..., 4:8])
    assert_close(R.merge_heads(heads), x)


def test_attention_flops():
    assert R.attention_flops(2, 12, 1024, 64, causal=False) == 4 * 2 * 12 * 1024**2 * 64
    assert R.attention_flops(2, 12, 1024, 64) == 2 * 2 * 12 * 1024**2 * 64


# ---------------------------------------------------------------- causality, dropout, buffers
def _build(cls, d_in=6, d_out=6, context=8, dropout=0.0):
    if cls is R.CausalAttention:
        return cls(d_in, d_out, context, dropout)
    return cls(d_in, d_out, context, dropout, num_heads=2)


@pytest.mark.parametrize("cls", CAUSAL_CLASSES + [R.MultiHeadAttentionWrapper])
def test_future_tokens_do_not_change_earlier_outputs(cls):
    torch.manual_seed(6)
    module = _build(cls).eval()
    x = torch.randn(2, 8, 6)
    base = module(x)
    for t in range(7):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:]) * 5
        assert_close(module(changed)[:, : t + 1], base[:, : t + 1], msg=f"position <= {t} saw a later token")


@pytest.mark.parametrize("cls", CAUSAL_CLASSES + [R.MultiHeadAttentionWrapper])
def test_dropout_is_identity_in_eval(cls):
    torch.manual_seed(7)
    with_dropout = _build(cls, dropout=0.5)
    torch.manual_seed(7)
    without = _build(cls, dropout=0.0)
    x = torch.randn(2, 5, 6)
    assert_close(with_dropout.eval()(x), without.eval()(x))
    torch.manual_seed(0)
    assert not torch.allclose(with_dropout.train()(x), without(x)), "dropout should act in train()"


@pytest.mark.parametrize("cls", [c for c in CAUSAL_CLASSES if c is not R.MHAPyTorchSDPA])
def test_mask_is_a_buffer_that_follows_to(cls):
    module = _build(cls)
    assert "mask" in module.state_dict()
    assert "mask" not in dict(module.named_parameters())
    moved = module.to("meta")
    assert moved.mask.device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none on this machine")
@pytest.mark.parametrize("cls", CAUSAL_CLASSES)
def test_runs_on_cuda(cls):
    module = _build(cls).to("cuda")
    x = torch.randn(2, 5, 6, device="cuda")
    cpu_module = _build(cls)
    cpu_module.load_state_dict(module.state_dict())
    assert_close(module(x).cpu(), cpu_module(x.cpu()), atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("cls", CAUSAL_CLASSES)
def test_gradcheck_float64(cls):
    torch.manual_seed(8)
    module = _build(cls, d_in=4, d_out=4, context=5).double().eval()
    x = torch.randn(1, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(module, (x,), eps=1e-6, atol=1e-4)


def test_gradcheck_functions_float64():
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, 4, dtype=torch.float64, generator=g).requires_grad_() for _ in range(3))
    assert torch.autograd.gradcheck(R.scaled_dot_product_attention, (q, k, v))
    assert torch.autograd.gradcheck(R.causal_attention_weights, (q, k))
    assert torch.autograd.gradcheck(R.softmax_stable, (q,))


# ---------------------------------------------------------------- bad input, clear errors
@pytest.mark.parametrize("cls", MHA_CLASSES + [R.MultiHeadAttentionEinsum])
def test_heads_must_divide_d_out(cls):
    with pytest.raises(ValueError, match=r"d_out % num_heads != 0"):
        cls(4, 10, 8, 0.0, num_heads=3)


@pytest.mark.parametrize("cls", CAUSAL_CLASSES)
def test_too_many_tokens(cls):
    module = _build(cls, context=4)
    with pytest.raises(ValueError, match=r"num_tokens > context_length"):
        module(torch.randn(1, 5, 6))


@pytest.mark.parametrize("cls", CAUSAL_CLASSES)
def test_wrong_rank_and_width(cls):
    module = _build(cls)
    with pytest.raises(ValueError, match=r"\(batch, num_tokens, d_in\)"):
        module(torch.randn(5, 6))
    with pytest.raises(ValueError, match=r"d_in=7"):
        module(torch.randn(1, 5, 7))


def test_function_input_errors():
    with pytest.raises(ValueError, match="equal length"):
        R.dot(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match="1-D"):
        R.dot(torch.ones(2, 3), torch.ones(3))
    with pytest.raises(ValueError, match="last dimension"):
        R.attention_scores_for_query(torch.ones(6, 3), torch.ones(4))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        R.attention_scores(torch.ones(3))
    with pytest.raises(ValueError, match="same number of tokens"):
        R.scaled_dot_product_attention(torch.ones(2, 4), torch.ones(3, 4), torch.ones(5, 4))
    with pytest.raises(ValueError, match="split_heads expects"):
        R.split_heads(torch.ones(4, 6), 2)
    with pytest.raises(ValueError, match=r"d_out % num_heads != 0"):
        R.split_heads(torch.ones(1, 4, 6), 4)
    with pytest.raises(ValueError, match="non-negative integer"):
        R.attention_flops(1, 2, -3, 4)
