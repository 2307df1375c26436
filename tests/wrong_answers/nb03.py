"""Answers for notebook 03 (trainable self-attention). See the package docstring for the format."""

WRONG = {
    "scaled_dot_product_attention": {
        "no scaling": '''
def scaled_dot_product_attention(queries, keys, values):
    weights = torch.softmax(queries @ keys.transpose(-2, -1), dim=-1)
    return weights @ values
''',
        "divides by d_k instead of sqrt(d_k)": '''
def scaled_dot_product_attention(queries, keys, values):
    d_k = keys.shape[-1]
    weights = torch.softmax(queries @ keys.transpose(-2, -1) / d_k, dim=-1)
    return weights @ values
''',
        "keys.T, which breaks batches": '''
def scaled_dot_product_attention(queries, keys, values):
    weights = torch.softmax(queries @ keys.T / keys.shape[-1] ** 0.5, dim=-1)
    return weights @ values
''',
        "softmax over dim=-2": '''
def scaled_dot_product_attention(queries, keys, values):
    scores = queries @ keys.transpose(-2, -1) / math.sqrt(keys.shape[-1])
    return torch.softmax(scores, dim=-2) @ values
''',
        "scales by the size of the values": '''
def scaled_dot_product_attention(queries, keys, values):
    scores = queries @ keys.transpose(-2, -1) / math.sqrt(values.shape[-1])
    return torch.softmax(scores, dim=-1) @ values
''',
        "keys.shape[0] is the number of tokens, not d_k": '''
def scaled_dot_product_attention(queries, keys, values):
    scores = queries @ keys.transpose(-2, -1) / keys.shape[0] ** 0.5
    return torch.softmax(scores, dim=-1) @ values
''',
        "scales after the softmax": '''
def scaled_dot_product_attention(queries, keys, values):
    weights = torch.softmax(queries @ keys.transpose(-2, -1), dim=-1) / math.sqrt(keys.shape[-1])
    return weights @ values
''',
        "library kernel": '''
def scaled_dot_product_attention(queries, keys, values):
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(queries, keys, values)
''',
    },
    "SelfAttention_v1": {
        "parameters created in the wrong order": '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x):
        q, k, v = x @ self.W_query, x @ self.W_key, x @ self.W_value
        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
''',
        "torch.randn instead of torch.rand": '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.randn(d_in, d_out))
        self.W_key = nn.Parameter(torch.randn(d_in, d_out))
        self.W_value = nn.Parameter(torch.randn(d_in, d_out))

    def forward(self, x):
        q, k, v = x @ self.W_query, x @ self.W_key, x @ self.W_value
        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
''',
        "no scaling": '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x):
        q, k, v = x @ self.W_query, x @ self.W_key, x @ self.W_value
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
''',
        "keys.T (the book's listing), which breaks batches": '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x):
        keys = x @ self.W_key
        queries = x @ self.W_query
        values = x @ self.W_value
        attn_scores = queries @ keys.T
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values
''',
        "scales by sqrt(d_in) instead of sqrt(d_out)": '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x):
        q, k, v = x @ self.W_query, x @ self.W_key, x @ self.W_value
        w = torch.softmax(q @ k.transpose(-2, -1) / x.shape[-1] ** 0.5, dim=-1)
        return w @ v
''',
        "weights stored as (d_out, d_in)": '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_out, d_in))
        self.W_key = nn.Parameter(torch.rand(d_out, d_in))
        self.W_value = nn.Parameter(torch.rand(d_out, d_in))

    def forward(self, x):
        q, k, v = x @ self.W_query.T, x @ self.W_key.T, x @ self.W_value.T
        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
''',
        "keys @ queries^T: queries and keys swapped": '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x):
        q, k, v = x @ self.W_query, x @ self.W_key, x @ self.W_value
        w = torch.softmax(k @ q.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
''',
    },
    "SelfAttention_v2": {
        "ignores qkv_bias": '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = nn.Linear(d_in, d_out, bias=False)
        self.W_value = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
''',
        "default bias of nn.Linear (always on)": '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out)
        self.W_key = nn.Linear(d_in, d_out)
        self.W_value = nn.Linear(d_in, d_out)

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
''',
        "layers created in the wrong order": '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
''',
        "nn.Linear(d_out, d_in): sizes swapped": '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_out, d_in, bias=qkv_bias)
        self.W_key = nn.Linear(d_out, d_in, bias=qkv_bias)
        self.W_value = nn.Linear(d_out, d_in, bias=qkv_bias)

    def forward(self, x):
        q = x @ self.W_query.weight
        k = x @ self.W_key.weight
        v = x @ self.W_value.weight
        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
''',
        "keys.T, which breaks batches": '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        keys = self.W_key(x)
        w = torch.softmax(self.W_query(x) @ keys.T / keys.shape[-1] ** 0.5, dim=-1)
        return w @ self.W_value(x)
''',
        "multiplies by the weight without transposing": '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        q = x @ self.W_query.weight
        k = x @ self.W_key.weight
        v = x @ self.W_value.weight
        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)
        return w @ v
''',
        "no scaling": '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        w = torch.softmax(self.W_query(x) @ self.W_key(x).transpose(-2, -1), dim=-1)
        return w @ self.W_value(x)
''',
    },
    "copy_v2_weights_to_v1": {
        "no transpose, with copy_": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight)
        sa_v1.W_key.copy_(sa_v2.W_key.weight)
        sa_v1.W_value.copy_(sa_v2.W_value.weight)
''',
        "no transpose, with .data =": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    sa_v1.W_query.data = sa_v2.W_query.weight.data.clone()
    sa_v1.W_key.data = sa_v2.W_key.weight.data.clone()
    sa_v1.W_value.data = sa_v2.W_value.weight.data.clone()
''',
        "reshape instead of transpose": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight.reshape(sa_v1.W_query.shape))
        sa_v1.W_key.copy_(sa_v2.W_key.weight.reshape(sa_v1.W_key.shape))
        sa_v1.W_value.copy_(sa_v2.W_value.weight.reshape(sa_v1.W_value.shape))
''',
        "copies in the wrong direction (v1 into v2)": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    with torch.no_grad():
        sa_v2.W_query.weight.copy_(sa_v1.W_query.T)
        sa_v2.W_key.weight.copy_(sa_v1.W_key.T)
        sa_v2.W_value.weight.copy_(sa_v1.W_value.T)
''',
        "forgets W_value": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight.T)
        sa_v1.W_key.copy_(sa_v2.W_key.weight.T)
''',
        "query and key swapped": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_key.weight.T)
        sa_v1.W_key.copy_(sa_v2.W_query.weight.T)
        sa_v1.W_value.copy_(sa_v2.W_value.weight.T)
''',
        "returns a new module instead of changing sa_v1": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    new = SelfAttention_v1(sa_v1.W_query.shape[0], sa_v1.W_query.shape[1])
    with torch.no_grad():
        new.W_query.copy_(sa_v2.W_query.weight.T)
        new.W_key.copy_(sa_v2.W_key.weight.T)
        new.W_value.copy_(sa_v2.W_value.weight.T)
    return new
''',
        "assigns a plain tensor to a parameter": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    sa_v1.W_query = sa_v2.W_query.weight.T
    sa_v1.W_key = sa_v2.W_key.weight.T
    sa_v1.W_value = sa_v2.W_value.weight.T
''',
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
        "reuses scaled_dot_product_attention": '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

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
        "book listing with transpose(-2, -1)": '''
class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key   = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x):
        keys = x @ self.W_key
        queries = x @ self.W_query
        values = x @ self.W_value
        attn_scores = queries @ keys.transpose(-2, -1)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        return attn_weights @ values
''',
    },
    "SelfAttention_v2": {
        "F.linear and the book's forward with transpose(-2, -1)": '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

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
        "math.sqrt and mT": '''
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, qkv_bias)

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        return torch.softmax(q @ k.mT / math.sqrt(k.shape[-1]), dim=-1) @ v
''',
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
        ".data = weight.T.clone()": '''
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    sa_v1.W_query.data = sa_v2.W_query.weight.T.clone()
    sa_v1.W_key.data = sa_v2.W_key.weight.T.clone()
    sa_v1.W_value.data = sa_v2.W_value.weight.T.clone()
''',
    },
}
