"""Answers for notebook 04 (causal attention). See the package docstring for the format.

Most wrong answers are a correct base answer (``_CAW``, or ``_ca`` of ``_COMPACT_FORWARD`` or
``_BOOK_FORWARD`` with ``_CA_INIT``) with one change made by ``_edit``, so each reads as "the
base answer, except this line".
"""

from tests.wrong_answers import edit as _edit
from tests.wrong_answers import wrong

_CA_INIT = '''
class CausalAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
'''
_MASK_BUFFER = 'self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))'


def _ca(forward: str, init: str = _CA_INIT) -> str:
    """A CausalAttention with the book's __init__ and the given forward body."""
    return init + "\n    def forward(self, x):\n" + "\n".join("        " + line for line in forward.strip("\n").splitlines()) + "\n"


# The book's forward (a RIGHT answer with _CA_INIT: float mask, in-place masked_fill_).
_BOOK_FORWARD = '''
b, num_tokens, d_in = x.shape
keys = self.W_key(x)
queries = self.W_query(x)
values = self.W_value(x)
attn_scores = queries @ keys.transpose(1, 2)
attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
attn_weights = self.dropout(attn_weights)
return attn_weights @ values
'''

# A correct, more compact forward: the base of most CausalAttention wrong answers.
_COMPACT_FORWARD = '''
b, num_tokens, d_in = x.shape
keys, queries, values = self.W_key(x), self.W_query(x), self.W_value(x)
attn_scores = queries @ keys.transpose(1, 2)
attn_scores = attn_scores.masked_fill(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
attn_weights = self.dropout(torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1))
return attn_weights @ values
'''
_COMPACT_SOFTMAX = "attn_weights = self.dropout(torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1))\n"

# A correct causal_attention_weights, the base of its wrong answers: each variant adds exactly one
# mistake, so the test that rejects it shows that the hidden tests catch that mistake.
_CAW = '''
def causal_attention_weights(queries, keys):
    T = queries.shape[-2]
    scores = queries @ keys.transpose(-2, -1)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=scores.device), 1)
    scores = scores.masked_fill(future, -torch.inf)
    return torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)
'''
_CAW_NO_SCALING = _edit(_CAW, "torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)", "torch.softmax(scores, dim=-1)")

_MASK = "\ndef causal_mask(num_tokens):\n    return {}\n"

WRONG = {
    "causal_mask": {
        "diagonal masked too (triu, diagonal=0)": wrong(
            _MASK.format("torch.triu(torch.ones(num_tokens, num_tokens), diagonal=0).bool()"), "diagonal is masked"),
        "inverted meaning: tril marks the allowed positions": wrong(
            _MASK.format("torch.tril(torch.ones(num_tokens, num_tokens)).bool()"), "inverted"),
        "inverted: tril(-1) marks the past": wrong(
            _MASK.format("torch.tril(torch.ones(num_tokens, num_tokens, dtype=torch.bool), diagonal=-1)"), "inverted"),
        "float mask instead of bool": wrong(
            _MASK.format("torch.triu(torch.ones(num_tokens, num_tokens), diagonal=1)"), "torch.bool"),
        "integer mask instead of bool": wrong(
            _MASK.format("torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.long), diagonal=1)"), "torch.bool"),
        "additive float mask (0 and -inf) instead of bool": wrong(_MASK.format(
            "torch.zeros(num_tokens, num_tokens).masked_fill(torch.ones(num_tokens, num_tokens).triu(1).bool(), "
            "float('-inf'))"), "torch.bool"),
        "off by one: diagonal=2 lets each token see the next one": wrong(
            _MASK.format("torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool), diagonal=2)"),
            "position 0 sees token 1"),
        "hard-coded for six tokens": wrong(
            _MASK.format("torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)"), "build it from num_tokens"),
        "one token too many": wrong(
            _MASK.format("torch.triu(torch.ones(num_tokens + 1, num_tokens + 1, dtype=torch.bool), diagonal=1)"),
            "build it from num_tokens"),
        "an extra batch dimension": wrong(
            _MASK.format("torch.triu(torch.ones(1, num_tokens, num_tokens, dtype=torch.bool), diagonal=1)"),
            "without extra dimensions"),
        "a numpy array": wrong("\nimport numpy as np\n" + _MASK.format(
            "np.triu(np.ones((num_tokens, num_tokens), dtype=bool), k=1)"), "torch.Tensor"),
    },
    "causal_attention_weights": {
        "mask built on the CPU: breaks as soon as the scores live on a GPU": wrong(
            _edit(_CAW, ", device=scores.device", ""), "scores' device"),
        "mask after softmax without renormalising": wrong('''
def causal_attention_weights(queries, keys):
    T = queries.shape[-2]
    w = torch.softmax(queries @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5, dim=-1)
    return w * torch.tril(torch.ones(T, T, device=w.device))
''', "renormalise"),
        "mask with -inf after softmax": wrong(_edit(
            _CAW,
            "    scores = scores.masked_fill(future, -torch.inf)\n"
            "    return torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)\n",
            "    weights = torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)\n"
            "    return weights.masked_fill(future, -torch.inf)\n"), "before the softmax"),
        "masked_fill with 0 instead of -inf": wrong(
            _edit(_CAW, "masked_fill(future, -torch.inf)", "masked_fill(future, 0.0)"), "instead of -inf"),
        "no mask at all": wrong(_edit(_CAW, "    scores = scores.masked_fill(future, -torch.inf)\n", ""),
                                "no mask is applied"),
        "no scaling": wrong(_CAW_NO_SCALING, "not scaled"),
        "scaled by d_k instead of sqrt(d_k)": wrong(
            _edit(_CAW, "keys.shape[-1] ** 0.5", "keys.shape[-1]"), "divided by d_k instead of sqrt(d_k)"),
        "multiplied by sqrt(d_k) instead of divided": wrong(
            _edit(_CAW, "scores / keys.shape[-1] ** 0.5", "scores * keys.shape[-1] ** 0.5"),
            "multiplied by sqrt(d_k)"),
        "scaled by sqrt(T) (queries.shape[-2]) instead of sqrt(d_k)": wrong(
            _edit(_CAW, "keys.shape[-1] ** 0.5", "queries.shape[-2] ** 0.5"), "sqrt(T)"),
        "scaled twice: queries and scores": wrong(_edit(
            _CAW, "    scores = queries @ keys.transpose(-2, -1)\n",
            "    scores = (queries / keys.shape[-1] ** 0.5) @ keys.transpose(-2, -1)\n"),
            "divided by d_k instead of sqrt(d_k)"),
        "softmax too early: weights divided by sqrt(d_k) after it": wrong(_edit(
            _CAW, "torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)",
            "torch.softmax(scores, dim=-1) / keys.shape[-1] ** 0.5"), "after the softmax"),
        "tril: masks the past instead of the future": wrong(_edit(
            _CAW, "torch.triu(torch.ones(T, T, dtype=torch.bool, device=scores.device), 1)",
            "torch.tril(torch.ones(T, T, dtype=torch.bool, device=scores.device), -1)"), "inverted"),
        "tril with the diagonal: the allowed positions used as the mask": wrong(_edit(
            _CAW, "torch.triu(torch.ones(T, T, dtype=torch.bool, device=scores.device), 1)",
            "torch.tril(torch.ones(T, T, dtype=torch.bool, device=scores.device))"), "inverted"),
        "diagonal masked": wrong(_edit(_CAW, "device=scores.device), 1)", "device=scores.device))"),
                                 "diagonal is masked"),
        "diagonal masked with a large negative number": wrong(_edit(_edit(
            _CAW, "device=scores.device), 1)", "device=scores.device))"), "-torch.inf", "-1e9"),
            "diagonal is masked"),
        "off by one: diagonal=2": wrong(_edit(_CAW, "device=scores.device), 1)", "device=scores.device), 2)"),
                                        "off by one"),
        "softmax over the queries (dim=-2)": wrong(_edit(_CAW, "dim=-1)", "dim=-2)"), "dim=-1"),
        "scores transposed: keys @ queries^T": wrong(
            _edit(_CAW, "queries @ keys.transpose(-2, -1)", "keys @ queries.transpose(-2, -1)"), "transposed"),
        "softmax applied twice": wrong(_edit(
            _CAW, "return torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)",
            "return torch.softmax(torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1), dim=-1)"), "twice"),
        "keys.T breaks batch dimensions": wrong(_edit(_CAW, "keys.transpose(-2, -1)", "keys.T"),
                                                "transpose(-2, -1)"),
        "shape unpacked for 2-D inputs only": wrong(_edit(
            _CAW, "    T = queries.shape[-2]\n", "    T, d_k = queries.shape\n"), "batch dimensions"),
        "modifies the caller's tensor in place": wrong(_edit(
            _CAW_NO_SCALING,
            "    scores = queries @ keys.transpose(-2, -1)\n",
            "    queries /= keys.shape[-1] ** 0.5\n"
            "    scores = queries @ keys.transpose(-2, -1)\n",
        ), "in place"),
    },
    "CausalAttention": {
        "mask not truncated to num_tokens": wrong(_ca(_edit(
            _COMPACT_FORWARD, "self.mask.bool()[:num_tokens, :num_tokens]", "self.mask.bool()")), "not truncated"),
        "mask as a plain attribute instead of a buffer": wrong(_ca(_BOOK_FORWARD, init=_edit(
            _CA_INIT, _MASK_BUFFER, "self.mask = torch.triu(torch.ones(context_length, context_length), diagonal=1)")),
            "not a buffer"),
        "mask buffer not persistent (missing from state_dict)": wrong(_ca(_BOOK_FORWARD, init=_edit(
            _CA_INIT, "diagonal=1))\n", "diagonal=1),\n                             persistent=False)\n")),
            "persistent=False"),
        "mask rebuilt on the CPU in every forward, no buffer": wrong(_ca('''
b, T, _ = x.shape
q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
s = (q @ k.transpose(1, 2)).masked_fill(torch.triu(torch.ones(T, T), 1).bool(), -torch.inf)
return self.dropout(torch.softmax(s / k.shape[-1] ** 0.5, dim=-1)) @ v
''', init=_edit(_CA_INIT, "        " + _MASK_BUFFER + "\n", "")), "no buffer of shape"),
        "dropout before softmax": wrong(_ca(_edit(
            _COMPACT_FORWARD,
            _COMPACT_SOFTMAX,
            "attn_scores = self.dropout(attn_scores)\n"
            "attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)\n",
        )), "before the softmax"),
        "dropout on the context vectors": wrong(_ca(_edit(
            _COMPACT_FORWARD,
            _COMPACT_SOFTMAX + "return attn_weights @ values\n",
            "attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)\n"
            "return self.dropout(attn_weights @ values)\n",
        )), "context vectors"),
        "dropout on the values": wrong(_ca(_edit(
            _COMPACT_FORWARD,
            _COMPACT_SOFTMAX + "return attn_weights @ values\n",
            "attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)\n"
            "return attn_weights @ self.dropout(values)\n",
        )), "applied to the values"),
        "dropout active in eval mode (F.dropout with training=True)": wrong(_ca(_edit(
            _COMPACT_FORWARD,
            _COMPACT_SOFTMAX,
            "attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)\n"
            "attn_weights = torch.nn.functional.dropout(attn_weights, self.dropout.p, training=True)\n",
        )), "eval() mode"),
        "no scaling": wrong(_ca(_edit(
            _COMPACT_FORWARD,
            _COMPACT_SOFTMAX + "return attn_weights @ values\n",
            "return self.dropout(torch.softmax(attn_scores, dim=-1)) @ values\n",
        )), "not scaled"),
        "scaled by sqrt(d_in) instead of sqrt(d_out)": wrong(_ca(_edit(
            _COMPACT_FORWARD, "keys.shape[-1]**0.5", "d_in**0.5")), "sqrt(d_in)"),
        "scaled by d_k instead of sqrt(d_k)": wrong(_ca(_edit(
            _COMPACT_FORWARD, "keys.shape[-1]**0.5", "keys.shape[-1]")), "divided by d_k instead of sqrt(d_k)"),
        "softmax too early: weights divided by sqrt(d_k) after it": wrong(_ca(_edit(
            _COMPACT_FORWARD, "torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)",
            "torch.softmax(attn_scores, dim=-1) / keys.shape[-1]**0.5")), "after the softmax"),
        "mask after softmax without renormalising": wrong(_ca(_edit(
            _COMPACT_FORWARD,
            "attn_scores = attn_scores.masked_fill(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)\n"
            + _COMPACT_SOFTMAX,
            "attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)\n"
            "attn_weights = attn_weights.masked_fill(self.mask.bool()[:num_tokens, :num_tokens], 0.0)\n"
            "attn_weights = self.dropout(attn_weights)\n")), "renormalise"),
        "masked_fill with 0 instead of -inf": wrong(_ca(_edit(_COMPACT_FORWARD, "-torch.inf)", "0.0)")),
                                                    "instead of -inf"),
        "softmax over the queries (dim=1)": wrong(_ca(_edit(_COMPACT_FORWARD, "dim=-1)", "dim=1)")), "dim=-1"),
        "scores transposed: keys @ queries^T": wrong(_ca(_edit(
            _COMPACT_FORWARD, "queries @ keys.transpose(1, 2)", "keys @ queries.transpose(1, 2)")), "transposed"),
        "values from W_key": wrong(_ca(_edit(
            _COMPACT_FORWARD, "self.W_key(x), self.W_query(x), self.W_value(x)",
            "self.W_key(x), self.W_query(x), self.W_key(x)")), "W_value(x)"),
        "returns the attention weights, not the context vectors": wrong(_ca(_edit(
            _COMPACT_FORWARD, "return attn_weights @ values", "return attn_weights")), "attention weights"),
        "mask includes the diagonal": wrong(_ca('''
b, T, _ = x.shape
q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
s = (q @ k.transpose(1, 2)).masked_fill(self.mask.bool()[:T, :T], -1e9)
return self.dropout(torch.softmax(s / k.shape[-1] ** 0.5, dim=-1)) @ v
''', init=_edit(_CA_INIT, "diagonal=1))", "diagonal=0))")), "diagonal is masked"),
        "mask includes the diagonal, filled with -inf (row 0 is NaN)": wrong(
            _ca(_COMPACT_FORWARD, init=_edit(_CA_INIT, "diagonal=1))", "diagonal=0))")), "diagonal is masked"),
        "inverted mask: tril marks the past": wrong(_ca(_COMPACT_FORWARD, init=_edit(
            _CA_INIT, "torch.triu(torch.ones(context_length, context_length), diagonal=1)",
            "torch.tril(torch.ones(context_length, context_length), diagonal=-1)")), "inverted"),
        "no mask at all": wrong(_ca('''
keys, queries, values = self.W_key(x), self.W_query(x), self.W_value(x)
attn_weights = torch.softmax(queries @ keys.transpose(1, 2) / keys.shape[-1]**0.5, dim=-1)
return self.dropout(attn_weights) @ values
'''), "no mask is applied"),
        "layers created in a different order (keys first)": wrong(_ca(_BOOK_FORWARD, init=_edit(
            _CA_INIT,
            "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n",
            "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n",
        )), "another order"),
        "layers created in a different order (values first)": wrong(_ca(_BOOK_FORWARD, init=_edit(
            _CA_INIT,
            "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)\n",
            "        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n",
        )), "created in the order"),
        "qkv_bias ignored": wrong(_ca(_BOOK_FORWARD, init=_edit(_CA_INIT, "bias=qkv_bias", "bias=False", count=3)),
                                  "expected parameters of shapes"),
        "library kernel (F.scaled_dot_product_attention)": wrong(_ca('''
q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
p = self.dropout.p if self.training else 0.0
return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
'''), "scaled_dot_product_attention"),
    },
}

RIGHT = {
    "causal_mask": {
        "ones(...).triu(1).bool()": '''
def causal_mask(num_tokens):
    return torch.ones(num_tokens, num_tokens).triu(1).bool()
''',
        "comparison of index grids": '''
def causal_mask(num_tokens):
    i = torch.arange(num_tokens)
    return i[None, :] > i[:, None]
''',
        "logical not of tril": '''
def causal_mask(num_tokens):
    return ~torch.tril(torch.ones(num_tokens, num_tokens, dtype=torch.bool))
''',
    },
    "causal_attention_weights": {
        "the base of the wrong answers above": _CAW,
        "einsum and a large negative number": '''
def causal_attention_weights(queries, keys):
    T, d_k = queries.shape[-2], keys.shape[-1]
    scores = torch.einsum("...qd,...kd->...qk", queries, keys) / d_k ** 0.5
    mask = torch.ones(T, T, device=scores.device).triu(1).bool()
    return torch.softmax(scores.masked_fill(mask, -1e9), dim=-1)
''',
        "renormalised tril after softmax": '''
def causal_attention_weights(queries, keys):
    T = queries.shape[-2]
    w = torch.softmax(queries @ keys.transpose(-2, -1) / math.sqrt(keys.shape[-1]), dim=-1)
    w = w * torch.tril(torch.ones(T, T, dtype=w.dtype, device=w.device))
    return w / w.sum(dim=-1, keepdim=True)
''',
        "finfo min, mask applied after scaling": '''
def causal_attention_weights(queries, keys):
    T = queries.shape[-2]
    scores = queries @ keys.mT / math.sqrt(keys.shape[-1])
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=scores.device), diagonal=1)
    scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1)
''',
        "torch.where with -inf": '''
def causal_attention_weights(queries, keys):
    T = queries.shape[-2]
    scores = torch.matmul(queries, keys.transpose(-1, -2)) * keys.shape[-1] ** -0.5
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool, device=scores.device))
    return torch.softmax(torch.where(allowed, scores, float("-inf")), dim=-1)
''',
    },
    "CausalAttention": {
        "the book's listing (float mask, in-place masked_fill_)": _ca(_BOOK_FORWARD),
        "F.dropout with self.training, einsum, -1e9": "\nimport torch.nn.functional as F\n" + _ca('''
T = x.shape[1]
q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
scores = torch.einsum("bqd,bkd->bqk", q, k) / math.sqrt(k.shape[-1])
scores = scores.masked_fill(self.mask[:T, :T], -1e9)
w = F.dropout(torch.softmax(scores, dim=-1), self.p, self.training)
return torch.einsum("bqk,bkd->bqd", w, v)
''', init=_edit(
            _CA_INIT,
            "        self.dropout = nn.Dropout(dropout)\n        " + _MASK_BUFFER + "\n",
            "        self.p = dropout\n"
            '        self.register_buffer("mask", torch.ones(context_length, context_length).triu(1).bool())\n',
        )),
        "uses the student's causal_mask and a length check": _ca('''
b, T, _ = x.shape
if T > self.context_length:
    raise ValueError(f"input has {T} tokens, at most {self.context_length} allowed")
q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
w = causal_attention_weights(q, k)
return self.dropout(w) @ v
''', init=_edit(_edit(
            _CA_INIT, "super().__init__()\n", "super().__init__()\n        self.context_length = context_length\n"),
            _MASK_BUFFER, 'self.register_buffer("mask", causal_mask(context_length))')),
    },
}


def _first(answers: dict, labels: list[str]) -> dict:
    """``answers`` with ``labels`` first, in that order (tests/test_autograde.py sends the first ones
    through nbgrader, so the long-standing fixtures stay in that end-to-end run)."""
    return {**{label: answers[label] for label in labels}, **answers}


WRONG["causal_attention_weights"] = _first(WRONG["causal_attention_weights"], [
    "mask built on the CPU: breaks as soon as the scores live on a GPU", "mask after softmax without renormalising",
    "masked_fill with 0 instead of -inf", "no scaling", "scaled by d_k instead of sqrt(d_k)",
    "tril: masks the past instead of the future", "diagonal masked", "softmax over the queries (dim=-2)",
    "keys.T breaks batch dimensions", "modifies the caller's tensor in place"])
WRONG["CausalAttention"] = _first(WRONG["CausalAttention"], [
    "mask not truncated to num_tokens", "mask as a plain attribute instead of a buffer",
    "mask buffer not persistent (missing from state_dict)", "mask rebuilt on the CPU in every forward, no buffer",
    "dropout before softmax", "dropout on the context vectors", "dropout active in eval mode (F.dropout with training=True)",
    "no scaling", "mask includes the diagonal", "no mask at all", "layers created in a different order (keys first)",
    "library kernel (F.scaled_dot_product_attention)"])
