"""Answers for notebook 03 (trainable self-attention). See the package docstring for the format.

Most wrong answers are a correct base answer (``_SDPA``, ``_V1``, ``_V2``, ``_COPY``) with one
change made by ``_edit``, so each reads as "the correct answer, except this line". Each states the
words that its failure message must contain: the mistake, named.
"""

from tests.wrong_answers import edit as _edit
from tests.wrong_answers import wrong

# A correct scaled_dot_product_attention.
_SDPA = '''
def scaled_dot_product_attention(queries, keys, values):
    scores = queries @ keys.transpose(-2, -1) / math.sqrt(keys.shape[-1])
    return torch.softmax(scores, dim=-1) @ values
'''

# A correct SelfAttention_v1, in two parts so that a variant can swap the whole forward.
_V1_INIT = '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))
'''
_V1_FORWARD = '''
    def forward(self, x):
        q, k, v = x @ self.W_query, x @ self.W_key, x @ self.W_value
        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
'''
_V1 = _V1_INIT + _V1_FORWARD

# A correct SelfAttention_v2, likewise.
_V2_INIT = '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
'''
_V2_FORWARD = '''
    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
'''
_V2 = _V2_INIT + _V2_FORWARD

# SelfAttention_v2 projecting with the raw weight matrices, which nn.Linear stores as (d_out, d_in).
_V2_WEIGHT_NOT_TRANSPOSED = _edit(
    _V2,
    "        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)\n",
    "        q = x @ self.W_query.weight\n"
    "        k = x @ self.W_key.weight\n"
    "        v = x @ self.W_value.weight\n",
)

# The book's SelfAttention_v1 listing with transpose(-2, -1) instead of .T (a RIGHT answer). Its
# __init__ differs from _V1_INIT only in the book's aligned "=".
_V1_BOOK = _edit(_V1_INIT, "self.W_key =", "self.W_key   =") + '''
    def forward(self, x):
        keys = x @ self.W_key
        queries = x @ self.W_query
        values = x @ self.W_value
        attn_scores = queries @ keys.transpose(-2, -1)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        return attn_weights @ values
'''

# A correct copy_v2_weights_to_v1: nn.Linear keeps (d_out, d_in), SelfAttention_v1 keeps (d_in, d_out).
_COPY = '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight.T)
        sa_v1.W_key.copy_(sa_v2.W_key.weight.T)
        sa_v1.W_value.copy_(sa_v2.W_value.weight.T)
'''

# The same through .data (a RIGHT answer).
_COPY_DATA = '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    sa_v1.W_query.data = sa_v2.W_query.weight.T.clone()
    sa_v1.W_key.data = sa_v2.W_key.weight.T.clone()
    sa_v1.W_value.data = sa_v2.W_value.weight.T.clone()
'''

WRONG = {
    "scaled_dot_product_attention": {
        "no scaling": wrong('''
def scaled_dot_product_attention(queries, keys, values):
    weights = torch.softmax(queries @ keys.transpose(-2, -1), dim=-1)
    return weights @ values
''', "the scores were not scaled"),
        "divides by d_k instead of sqrt(d_k)": wrong('''
def scaled_dot_product_attention(queries, keys, values):
    d_k = keys.shape[-1]
    weights = torch.softmax(queries @ keys.transpose(-2, -1) / d_k, dim=-1)
    return weights @ values
''', "divided by d_k"),
        "keys.T, which breaks batches": wrong('''
def scaled_dot_product_attention(queries, keys, values):
    weights = torch.softmax(queries @ keys.T / keys.shape[-1] ** 0.5, dim=-1)
    return weights @ values
''', "`.T` reverses every dimension"),
        "softmax over dim=-2": wrong(_edit(_SDPA, "dim=-1", "dim=-2"), "the softmax ran over the queries' dimension"),
        "scales by the size of the values": wrong(
            _edit(_SDPA, "math.sqrt(keys.shape[-1])", "math.sqrt(values.shape[-1])"), "sqrt of the values' size"),
        "keys.shape[0] is the number of tokens, not d_k": wrong(
            _edit(_SDPA, "math.sqrt(keys.shape[-1])", "keys.shape[0] ** 0.5"), "sqrt(.shape[0])"),
        "scales after the softmax": wrong('''
def scaled_dot_product_attention(queries, keys, values):
    weights = torch.softmax(queries @ keys.transpose(-2, -1), dim=-1) / math.sqrt(keys.shape[-1])
    return weights @ values
''', "came after the softmax"),
        "library kernel": wrong('''
def scaled_dot_product_attention(queries, keys, values):
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(queries, keys, values)
''', "the library kernel comes in notebook 06"),
        "multiplies by sqrt(d_k) instead of dividing": wrong(
            _edit(_SDPA, "/ math.sqrt(keys.shape[-1])", "* math.sqrt(keys.shape[-1])"), "multiplied by sqrt(d_k)"),
        "keys.shape[1] is d_k only for 2-D keys": wrong(
            _edit(_SDPA, "math.sqrt(keys.shape[-1])", "math.sqrt(keys.shape[1])"), "sqrt(.shape[1])"),
        "d_k from queries.size(1), the number of queries of a batch": wrong(
            _edit(_SDPA, "math.sqrt(keys.shape[-1])", "math.sqrt(queries.size(1))"), "sqrt(.shape[1])"),
        "weights times the keys instead of the values": wrong(
            _edit(_SDPA, "dim=-1) @ values", "dim=-1) @ keys"), "the weights multiply the keys"),
        "keys @ queries^T": wrong(
            _edit(_SDPA, "queries @ keys.transpose(-2, -1)", "keys @ queries.transpose(-2, -1)"),
            "queries and keys are swapped"),
        "softmax over dim=0, the batch dimension of batched inputs": wrong(
            _edit(_SDPA, "dim=-1", "dim=0"), "which is dim=0 of 2-D scores"),
    },
    "SelfAttention_v1": {
        "parameters created in the wrong order": wrong(_edit(
            _V1,
            "        self.W_query = nn.Parameter(torch.rand(d_in, d_out))\n"
            "        self.W_key = nn.Parameter(torch.rand(d_in, d_out))\n",
            "        self.W_key = nn.Parameter(torch.rand(d_in, d_out))\n"
            "        self.W_query = nn.Parameter(torch.rand(d_in, d_out))\n",
        ), "W_key is created before W_query"),
        "W_value created first": wrong(_edit(
            _V1,
            "        self.W_value = nn.Parameter(torch.rand(d_in, d_out))\n",
            "",
        ).replace("        self.W_query =", "        self.W_value = nn.Parameter(torch.rand(d_in, d_out))\n"
                                            "        self.W_query ="), "created in another order"),
        "torch.randn instead of torch.rand": wrong(_edit(_V1, "torch.rand(", "torch.randn(", count=3), "torch.randn"),
        "no scaling": wrong(_edit(
            _V1,
            "        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)\n"
            "        return w @ v\n",
            "        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v\n",
        ), "the scores were not scaled"),
        "keys.T (the book's listing), which breaks batches": wrong(_V1_INIT + '''
    def forward(self, x):
        keys = x @ self.W_key
        queries = x @ self.W_query
        values = x @ self.W_value
        attn_scores = queries @ keys.T
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values
''', "`.T` reverses every dimension"),
        "scales by sqrt(d_in) instead of sqrt(d_out)": wrong(
            _edit(_V1, "k.shape[-1] ** 0.5", "x.shape[-1] ** 0.5"), "divided by sqrt(d_in)"),
        "weights stored as (d_out, d_in)": wrong(_edit(
            _edit(_V1, "torch.rand(d_in, d_out)", "torch.rand(d_out, d_in)", count=3),
            "x @ self.W_query, x @ self.W_key, x @ self.W_value",
            "x @ self.W_query.T, x @ self.W_key.T, x @ self.W_value.T",
        ), "each matrix must be (d_in, d_out)"),
        "keys @ queries^T: queries and keys swapped": wrong(
            _edit(_V1, "q @ k.transpose(-2, -1)", "k @ q.transpose(-2, -1)"), "queries and keys are swapped"),
        "scales after the softmax": wrong(_edit(
            _V1, "torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)",
            "torch.softmax(q @ k.transpose(-2, -1), dim=-1) / k.shape[-1] ** 0.5"), "came after the softmax"),
        "divides by d_out instead of its square root": wrong(
            _edit(_V1, "k.shape[-1] ** 0.5", "k.shape[-1]"), "divided by d_k"),
        "softmax over dim=-2": wrong(_edit(_V1, "dim=-1", "dim=-2"), "the softmax ran over the queries' dimension"),
        "nn.Linear layers, as in v2": wrong(_edit(
            _edit(_V1, "nn.Parameter(torch.rand(d_in, d_out))", "nn.Linear(d_in, d_out, bias=False)", count=3),
            "x @ self.W_query, x @ self.W_key, x @ self.W_value",
            "self.W_query(x), self.W_key(x), self.W_value(x)",
        ), "SelfAttention_v1 keeps each projection as a matrix"),
    },
    "SelfAttention_v2": {
        "ignores qkv_bias": wrong(_edit(_V2, "bias=qkv_bias", "bias=False", count=3), "pass bias=qkv_bias"),
        "default bias of nn.Linear (always on)": wrong(
            _edit(_V2, ", bias=qkv_bias)", ")", count=3), "bias=True is its default"),
        "layers created in the wrong order": wrong(_edit(
            _V2,
            "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)\n",
            "        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n",
        ), "created in another order"),
        # x @ weight only has the right shape if the layers are built the wrong way round.
        "nn.Linear(d_out, d_in): sizes swapped": wrong(_edit(
            _V2_WEIGHT_NOT_TRANSPOSED, "nn.Linear(d_in, d_out,", "nn.Linear(d_out, d_in,", count=3),
            "nn.Linear takes the input size first"),
        "keys.T, which breaks batches": wrong(_V2_INIT + '''
    def forward(self, x):
        keys = self.W_key(x)
        w = torch.softmax(self.W_query(x) @ keys.T / keys.shape[-1] ** 0.5, dim=-1)
        return w @ self.W_value(x)
''', "`.T` reverses every dimension"),
        "multiplies by the weight without transposing": wrong(
            _V2_WEIGHT_NOT_TRANSPOSED, "nn.Linear stores its weight as (d_out, d_in)"),
        "no scaling": wrong(_V2_INIT + '''
    def forward(self, x):
        w = torch.softmax(self.W_query(x) @ self.W_key(x).transpose(-2, -1), dim=-1)
        return w @ self.W_value(x)
''', "the scores were not scaled"),
        "scales after the softmax": wrong(_edit(
            _V2, "torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)",
            "torch.softmax(q @ k.transpose(-2, -1), dim=-1) / k.shape[-1] ** 0.5"), "came after the softmax"),
        "softmax over dim=0, the batch dimension of batched inputs": wrong(
            _edit(_V2, "dim=-1", "dim=0"), "the softmax ran over"),
        "keys @ queries^T": wrong(
            _edit(_V2, "q @ k.transpose(-2, -1)", "k @ q.transpose(-2, -1)"), "queries and keys are swapped"),
        "scales by sqrt(d_in)": wrong(_edit(_V2, "k.shape[-1] ** 0.5", "x.shape[-1] ** 0.5"), "divided by sqrt(d_in)"),
        "v1's nn.Parameter matrices instead of nn.Linear": wrong(_edit(
            _edit(_V2, "nn.Linear(d_in, d_out, bias=qkv_bias)", "nn.Parameter(torch.rand(d_in, d_out))", count=3),
            "self.W_query(x), self.W_key(x), self.W_value(x)",
            "x @ self.W_query, x @ self.W_key, x @ self.W_value",
        ), "SelfAttention_v2 builds each projection as a layer"),
    },
    "copy_v2_weights_to_v1": {
        "no transpose, with copy_": wrong(_edit(_COPY, ".weight.T)", ".weight)", count=3), "did you transpose?"),
        "no transpose, with .data =": wrong(
            _edit(_COPY_DATA, ".weight.T.clone()", ".weight.data.clone()", count=3), "did you transpose?"),
        "reshape instead of transpose": wrong('''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight.reshape(sa_v1.W_query.shape))
        sa_v1.W_key.copy_(sa_v2.W_key.weight.reshape(sa_v1.W_key.shape))
        sa_v1.W_value.copy_(sa_v2.W_value.weight.reshape(sa_v1.W_value.shape))
''', "they do not transpose"),
        "copies in the wrong direction (v1 into v2)": wrong('''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    with torch.no_grad():
        sa_v2.W_query.weight.copy_(sa_v1.W_query.T)
        sa_v2.W_key.weight.copy_(sa_v1.W_key.T)
        sa_v2.W_value.weight.copy_(sa_v1.W_value.T)
''', "Copy FROM sa_v2"),
        "forgets W_value": wrong(
            _edit(_COPY, "        sa_v1.W_value.copy_(sa_v2.W_value.weight.T)\n", ""), "sa_v1.W_value was not changed"),
        "query and key swapped": wrong(_edit(
            _COPY,
            "        sa_v1.W_query.copy_(sa_v2.W_query.weight.T)\n"
            "        sa_v1.W_key.copy_(sa_v2.W_key.weight.T)\n",
            "        sa_v1.W_query.copy_(sa_v2.W_key.weight.T)\n"
            "        sa_v1.W_key.copy_(sa_v2.W_query.weight.T)\n",
        ), "copy each projection into the one of the same name"),
        "returns a new module instead of changing sa_v1": wrong('''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    new = SelfAttention_v1(sa_v1.W_query.shape[0], sa_v1.W_query.shape[1])
    with torch.no_grad():
        new.W_query.copy_(sa_v2.W_query.weight.T)
        new.W_key.copy_(sa_v2.W_key.weight.T)
        new.W_value.copy_(sa_v2.W_value.weight.T)
    return new
''', "its return value is ignored"),
        "assigns a plain tensor to a parameter": wrong('''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    sa_v1.W_query = sa_v2.W_query.weight.T
    sa_v1.W_key = sa_v2.W_key.weight.T
    sa_v1.W_value = sa_v2.W_value.weight.T
''', "are nn.Parameters"),
        "copy_ outside torch.no_grad()": wrong(
            _edit(_COPY, "    with torch.no_grad():\n", "    if True:\n"), "inside `with torch.no_grad():`"),
        "W_query's weight copied into all three": wrong(
            _edit(_COPY, "sa_v2.W_key.weight.T", "sa_v2.W_query.weight.T").replace(
                "sa_v2.W_value.weight.T", "sa_v2.W_query.weight.T"),
            "holds what belongs in sa_v1.W_query"),
        "assigns a plain tensor in place of the parameter, without nn.Parameter": wrong('''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    for name in ("W_query", "W_key", "W_value"):
        del sa_v1._parameters[name]
        setattr(sa_v1, name, getattr(sa_v2, name).weight.detach().T.clone())
''', "is no longer an nn.Parameter"),
    },
}

RIGHT = {
    "scaled_dot_product_attention": {
        "einsum": '''
def scaled_dot_product_attention(queries, keys, values):
    scores = torch.einsum("...qd,...kd->...qk", queries, keys) / keys.shape[-1] ** 0.5
    return torch.einsum("...qk,...kv->...qv", torch.softmax(scores, dim=-1), values)
''',
        "scale the queries first, mT, F.softmax": '''
def scaled_dot_product_attention(queries, keys, values):
    import torch.nn.functional as F
    q = queries / math.sqrt(keys.size(-1))
    return F.softmax(q @ keys.mT, dim=-1) @ values
''',
        "torch.matmul, swapaxes and a tensor sqrt": '''
def scaled_dot_product_attention(queries, keys, values):
    d_k = torch.tensor(keys.shape[-1], dtype=queries.dtype)
    scores = torch.matmul(queries, keys.swapaxes(-2, -1)) / torch.sqrt(d_k)
    return torch.matmul(scores.softmax(dim=-1), values)
''',
    },
    "SelfAttention_v1": {
        "reuses scaled_dot_product_attention": _V1_INIT + '''
    def forward(self, x):
        return scaled_dot_product_attention(x @ self.W_query, x @ self.W_key, x @ self.W_value)
''',
        "einsum and register_parameter": '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        for name in ("W_query", "W_key", "W_value"):
            self.register_parameter(name, nn.Parameter(torch.rand(d_in, d_out)))

    def forward(self, x):
        q = torch.einsum("...ti,io->...to", x, self.W_query)
        k = torch.einsum("...ti,io->...to", x, self.W_key)
        v = torch.einsum("...ti,io->...to", x, self.W_value)
        w = torch.softmax(torch.einsum("...qo,...ko->...qk", q, k) / math.sqrt(k.shape[-1]), dim=-1)
        return w @ v
''',
        "book listing with transpose(-2, -1)": _V1_BOOK,
    },
    "SelfAttention_v2": {
        "F.linear and the book's forward with transpose(-2, -1)": _V2_INIT + '''
    def forward(self, x):
        import torch.nn.functional as F
        keys = F.linear(x, self.W_key.weight, self.W_key.bias)
        queries = F.linear(x, self.W_query.weight, self.W_query.bias)
        values = F.linear(x, self.W_value.weight, self.W_value.bias)
        attn_weights = torch.softmax(queries @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values
''',
        "setattr loop and explicit x @ weight.T + bias": '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        for name in ["W_query", "W_key", "W_value"]:
            setattr(self, name, nn.Linear(d_in, d_out, bias=qkv_bias))

    def _project(self, layer, x):
        out = x @ layer.weight.T
        return out + layer.bias if layer.bias is not None else out

    def forward(self, x):
        q = self._project(self.W_query, x)
        k = self._project(self.W_key, x)
        v = self._project(self.W_value, x)
        return scaled_dot_product_attention(q, k, v)
''',
        "math.sqrt and mT": _edit(
            _edit(_V2, ", bias=qkv_bias)", ", qkv_bias)", count=3),
            "        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)\n"
            "        return w @ v\n",
            "        return torch.softmax(q @ k.mT / math.sqrt(k.shape[-1]), dim=-1) @ v\n",
        ),
    },
    "copy_v2_weights_to_v1": {
        "the book's answer: new nn.Parameter from weight.T": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    sa_v1.W_query = torch.nn.Parameter(sa_v2.W_query.weight.T)
    sa_v1.W_key = torch.nn.Parameter(sa_v2.W_key.weight.T)
    sa_v1.W_value = torch.nn.Parameter(sa_v2.W_value.weight.T)
''',
        "load_state_dict with transposes": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    state = sa_v2.state_dict()
    sa_v1.load_state_dict({name: state[f"{name}.weight"].T for name in ("W_query", "W_key", "W_value")})
''',
        ".data.copy_ with .t() in a loop": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    for name in ["W_query", "W_key", "W_value"]:
        getattr(sa_v1, name).data.copy_(getattr(sa_v2, name).weight.data.t())
''',
        ".data = weight.T.clone()": _COPY_DATA,
    },
}
