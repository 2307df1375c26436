"""Answers for notebook 08 (KV cache, GQA, sliding windows). See the package docstring for the format.

Most wrong answers are a correct base answer (``_DECODE``, ``_KV``, ``_REPEAT``, ``_GQA``, ``_WINDOW``)
with one change made by ``_edit``.
"""

from tests.wrong_answers import edit as _edit
from tests.wrong_answers import wrong

_DECODE = '''
def decode_causal_mask(num_queries, num_keys):
    if num_queries > num_keys:
        raise ValueError("more queries than keys")
    return torch.triu(torch.ones(num_queries, num_keys, dtype=torch.bool), diagonal=num_keys - num_queries + 1)
'''

# A correct cache: (b, H, t, D) buffers, grown along dim 2, the bottom-right rows of the mask buffer.
_KV = '''
class MultiHeadAttentionKVCache(MultiHeadAttention):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.register_buffer("cache_k", None, persistent=False)
        self.register_buffer("cache_v", None, persistent=False)

    def reset_cache(self):
        self.cache_k, self.cache_v = None, None

    def forward(self, x, use_cache=False):
        if not use_cache:
            return super().forward(x)
        b, T, _ = x.shape
        if T == 0:
            raise ValueError("empty prompt")
        start = 0 if self.cache_k is None else self.cache_k.shape[2]
        if start + T > self.mask.shape[0]:
            raise ValueError("past context_length")
        q = split_heads(self.W_query(x), self.num_heads)
        k = split_heads(self.W_key(x), self.num_heads)
        v = split_heads(self.W_value(x), self.num_heads)
        if self.cache_k is not None:
            k = torch.cat([self.cache_k, k], dim=2)
            v = torch.cat([self.cache_v, v], dim=2)
        self.cache_k, self.cache_v = k, v
        scores = (q @ k.transpose(2, 3)).masked_fill(self.mask[start:start + T, :start + T], -torch.inf)
        w = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
        return self.out_proj(merge_heads(w @ v))
'''
_KV_MASK = "self.mask[start:start + T, :start + T]"
_KV_ATTEND = '''        scores = (q @ k.transpose(2, 3)).masked_fill(self.mask[start:start + T, :start + T], -torch.inf)
        w = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
        return self.out_proj(merge_heads(w @ v))
'''

_REPEAT = '''
def repeat_kv(x, n_rep):
    b, G, T, D = x.shape
    return x[:, :, None].expand(b, G, n_rep, T, D).reshape(b, G * n_rep, T, D)
'''

_GQA = '''
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, num_kv_groups, qkv_bias=False):
        super().__init__()
        if num_heads % num_kv_groups:
            raise ValueError("num_kv_groups must divide num_heads")
        self.H, self.G, self.D = num_heads, num_kv_groups, d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, num_kv_groups * self.D, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, num_kv_groups * self.D, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", causal_mask(context_length))

    def forward(self, x):
        b, T, _ = x.shape
        q = split_heads(self.W_query(x), self.H)
        k = repeat_kv(split_heads(self.W_key(x), self.G), self.H // self.G)
        v = repeat_kv(split_heads(self.W_value(x), self.G), self.H // self.G)
        s = (q @ k.transpose(2, 3)).masked_fill(self.mask[:T, :T], -torch.inf)
        w = self.dropout(torch.softmax(s / math.sqrt(self.D), dim=-1))
        return self.out_proj(merge_heads(w @ v))
'''

_WINDOW = '''
def sliding_window_mask(num_tokens, window):
    if window < 1:
        raise ValueError("window must be at least 1")
    i = torch.arange(num_tokens).unsqueeze(1)
    j = torch.arange(num_tokens).unsqueeze(0)
    return (j > i) | (i - j >= window)


def sliding_window_mask_mod(window):
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)
    return mask_mod
'''
_MOD_LINE = "        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)\n"


WRONG = {
    "decode_causal_mask": {
        "top-left aligned, as is_causal=True": wrong(_edit(
            _DECODE, "diagonal=num_keys - num_queries + 1", "diagonal=1"), "is_causal=True"),
        "own key hidden (diagonal off by one)": wrong(_edit(
            _DECODE, "diagonal=num_keys - num_queries + 1", "diagonal=num_keys - num_queries"), "sees itself"),
        "inverted: True marks the allowed keys": wrong(_edit(
            _DECODE, "return torch.triu(", "return ~torch.triu("), "inverted"),
        "offset with the wrong sign": wrong(_edit(
            _DECODE, "diagonal=num_keys - num_queries + 1", "diagonal=num_queries - num_keys + 1"), "wrong sign"),
        "a float mask": wrong(_edit(_DECODE, "dtype=torch.bool", "dtype=torch.float32"), "torch.bool"),
        "one row per key: (Tk, Tk)": wrong(_edit(
            _DECODE, "torch.ones(num_queries, num_keys, dtype=torch.bool), diagonal=num_keys - num_queries + 1",
            "torch.ones(num_keys, num_keys, dtype=torch.bool), diagonal=1"), "one row per QUERY"),
        "no error for more queries than keys": wrong(_edit(
            _DECODE, '    if num_queries > num_keys:\n        raise ValueError("more queries than keys")\n', ""),
            "Raise a ValueError when num_queries > num_keys"),
    },
    "MultiHeadAttentionKVCache": {
        "the cache concatenated on the wrong dimension": wrong(_edit(
            _KV, "torch.cat([self.cache_k, k], dim=2)", "torch.cat([self.cache_k, k], dim=1)"), "wrong dimension"),
        "the cache concatenated on head_dim": wrong(_edit(_edit(
            _KV, "torch.cat([self.cache_k, k], dim=2)", "torch.cat([self.cache_k, k], dim=-1)"),
            "torch.cat([self.cache_v, v], dim=2)", "torch.cat([self.cache_v, v], dim=-1)"), "TOKEN dimension"),
        "is_causal=True used while decoding": wrong(_edit(_KV, _KV_ATTEND, '''\
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(merge_heads(context))
'''), "is_causal=True"),
        "the top-left rows of the mask": wrong(_edit(_KV, _KV_MASK, "self.mask[:T, :start + T]"), "top left"),
        "no mask with the cache": wrong(_edit(_KV, _KV_MASK, "torch.zeros(T, start + T, dtype=torch.bool)"),
                                        "no mask is applied"),
        "new queries see only the new keys": wrong(_edit(_KV, '''\
        self.cache_k, self.cache_v = k, v
        scores = (q @ k.transpose(2, 3)).masked_fill(self.mask[start:start + T, :start + T], -torch.inf)
''', '''\
        self.cache_k, self.cache_v = k, v
        k, v = k[:, :, start:], v[:, :, start:]
        scores = (q @ k.transpose(2, 3)).masked_fill(self.mask[:T, :T], -torch.inf)
'''), "whole cache"),
        "reset_cache does nothing": wrong(_edit(
            _KV, "        self.cache_k, self.cache_v = None, None\n", "        pass\n"), "reset_cache() does not clear"),
        "position counter not reset": wrong(_edit(_edit(_edit(
            _KV, '        self.register_buffer("cache_v", None, persistent=False)\n',
            '        self.register_buffer("cache_v", None, persistent=False)\n        self.pos = 0\n'),
            "start = 0 if self.cache_k is None else self.cache_k.shape[2]", "start = self.pos"),
            "        self.cache_k, self.cache_v = k, v\n", "        self.cache_k, self.cache_v = k, v\n        self.pos += T\n"),
            "reset_cache() does not clear"),
        "no error past context_length": wrong(_edit(
            _KV, '        if start + T > self.mask.shape[0]:\n            raise ValueError("past context_length")\n', ""),
            "context_length tokens in the cache"),
        "no error for an empty prompt": wrong(_edit(
            _KV, '        if T == 0:\n            raise ValueError("empty prompt")\n', ""), "empty prompt"),
        "a forward without the cache fills it": wrong(_edit(_KV, '''\
        if not use_cache:
            return super().forward(x)
''', '''\
        if not use_cache:
            self.reset_cache()
            return super().forward(x)
'''), "leave the cache alone"),
    },
    "repeat_kv": {
        "K and V repeated on the wrong dimension (tokens)": wrong('''
def repeat_kv(x, n_rep):
    return x.repeat_interleave(n_rep, dim=2)
''', "repeated on the wrong dimension"),
        "tiled with repeat": wrong('''
def repeat_kv(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)
''', "tiled"),
        "tiled with expand on the wrong axis": wrong(_edit(
            _REPEAT, "x[:, :, None].expand(b, G, n_rep, T, D)", "x[:, None].expand(b, n_rep, G, T, D)"), "tiled"),
        "repeated along head_dim": wrong('''
def repeat_kv(x, n_rep):
    return x.repeat_interleave(n_rep, dim=-1)
''', "head_dim (dim 3)"),
        "copies left in their own dimension": wrong(_edit(
            _REPEAT, ".reshape(b, G * n_rep, T, D)", ""), "5 dimensions"),
    },
    "GroupedQueryAttention": {
        "K and V repeated on the wrong dimension": wrong(_edit(_edit(
            _GQA, "repeat_kv(split_heads(self.W_key(x), self.G), self.H // self.G)",
            "split_heads(self.W_key(x), self.G).repeat_interleave(self.H // self.G, dim=2)"),
            "repeat_kv(split_heads(self.W_value(x), self.G), self.H // self.G)",
            "split_heads(self.W_value(x), self.G).repeat_interleave(self.H // self.G, dim=2)"),
            "along the HEAD dimension"),
        "key/value heads tiled": wrong(_edit(_edit(
            _GQA, "repeat_kv(split_heads(self.W_key(x), self.G), self.H // self.G)",
            "split_heads(self.W_key(x), self.G).repeat(1, self.H // self.G, 1, 1)"),
            "repeat_kv(split_heads(self.W_value(x), self.G), self.H // self.G)",
            "split_heads(self.W_value(x), self.G).repeat(1, self.H // self.G, 1, 1)"), "tiled"),
        "W_key and W_value as wide as W_query": wrong(_edit(_edit(
            _GQA, "self.W_key = nn.Linear(d_in, num_kv_groups * self.D", "self.W_key = nn.Linear(d_in, d_out"),
            "self.W_value = nn.Linear(d_in, num_kv_groups * self.D", "self.W_value = nn.Linear(d_in, d_out"),
            "num_kv_groups * head_dim"),
        "no error when num_kv_groups does not divide num_heads": wrong(_edit(
            _GQA, '        if num_heads % num_kv_groups:\n            raise ValueError("num_kv_groups must divide num_heads")\n',
            ""), "does not divide num_heads"),
        "scaled by sqrt(d_out)": wrong(_edit(
            _GQA, "math.sqrt(self.D)", "math.sqrt(self.H * self.D)"), "sqrt(head_dim)"),
        "out_proj not applied": wrong(_edit(_GQA, "return self.out_proj(merge_heads(w @ v))", "return merge_heads(w @ v)"),
                                      "out_proj is created but not applied"),
        "W_key created before W_query": wrong(_edit(
            _GQA, "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
                  "        self.W_key = nn.Linear(d_in, num_kv_groups * self.D, bias=qkv_bias)\n",
            "        self.W_key = nn.Linear(d_in, num_kv_groups * self.D, bias=qkv_bias)\n"
            "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"), "another order"),
    },
    "sliding_window_mask": {
        "off by one: window + 1 keys": wrong(_edit(_WINDOW, "(i - j >= window)", "(i - j > window)"), "window + 1 keys"),
        "not causal: hides by distance on both sides": wrong(_edit(
            _WINDOW, "(j > i) | (i - j >= window)", "(i - j).abs() >= window"), "not causal"),
        "inverted: True marks the window": wrong(_edit(
            _WINDOW, "(j > i) | (i - j >= window)", "(j <= i) & (i - j < window)"), "inverted"),
        "mask_mod returns the hidden keys": wrong(_edit(
            _WINDOW, _MOD_LINE, "        return (kv_idx > q_idx) | (q_idx - kv_idx >= window)\n"), "MAY attend"),
        "mask_mod with Python `and`": wrong(_edit(
            _WINDOW, _MOD_LINE, "        return (kv_idx <= q_idx) and (q_idx - kv_idx < window)\n"), "not Python's `and`"),
        "mask_mod off by one": wrong(_edit(
            _WINDOW, _MOD_LINE, "        return (kv_idx <= q_idx) & (q_idx - kv_idx <= window)\n"), "must state the same rule"),
        "a float mask": wrong(_edit(
            _WINDOW, "    return (j > i) | (i - j >= window)", "    return ((j > i) | (i - j >= window)).float()"),
            "torch.bool"),
        "no error for window 0": wrong(_edit(
            _WINDOW, '    if window < 1:\n        raise ValueError("window must be at least 1")\n', ""), "window < 1"),
    },
}

RIGHT = {
    "decode_causal_mask": {
        "compare positions": '''
def decode_causal_mask(num_queries, num_keys):
    if num_queries > num_keys:
        raise ValueError(f"{num_queries} queries cannot be the last of {num_keys} keys")
    positions = torch.arange(num_keys - num_queries, num_keys).unsqueeze(1)
    return torch.arange(num_keys).unsqueeze(0) > positions
''',
        "the last rows of the causal mask": '''
def decode_causal_mask(num_queries, num_keys):
    assert num_queries <= num_keys, "num_queries > num_keys"
    return causal_mask(num_keys)[num_keys - num_queries:]
''',
    },
    "MultiHeadAttentionKVCache": {
        "preallocated cache with a position counter and SDPA": '''
class MultiHeadAttentionKVCache(MultiHeadAttention):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.context_length = context_length
        self.register_buffer("cache_k", None, persistent=False)
        self.register_buffer("cache_v", None, persistent=False)
        self.pos = 0

    def reset_cache(self):
        self.cache_k = self.cache_v = None
        self.pos = 0

    def forward(self, x, use_cache=False):
        if not use_cache:
            return super().forward(x)
        b, T, _ = x.shape
        if T == 0 or self.pos + T > self.context_length:
            raise ValueError(f"cannot add {T} tokens to a cache of {self.pos} (context_length {self.context_length})")
        if self.cache_k is None:
            shape = (b, self.num_heads, self.context_length, self.head_dim)
            self.cache_k = x.new_zeros(shape)
            self.cache_v = x.new_zeros(shape)
        q, k, v = (split_heads(layer(x), self.num_heads) for layer in (self.W_query, self.W_key, self.W_value))
        end = self.pos + T
        self.cache_k[:, :, self.pos:end] = k
        self.cache_v[:, :, self.pos:end] = v
        allowed = ~decode_causal_mask(T, end).to(x.device)
        p = self.dropout.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, self.cache_k[:, :, :end], self.cache_v[:, :, :end],
                                             attn_mask=allowed, dropout_p=p)
        self.pos = end
        return self.out_proj(merge_heads(out))
''',
        "cache kept as (b, T, H, D), before the transpose": '''
class MultiHeadAttentionKVCache(MultiHeadAttention):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.register_buffer("cache_k", None, persistent=False)
        self.register_buffer("cache_v", None, persistent=False)

    def reset_cache(self):
        self.cache_k = None
        self.cache_v = None

    def forward(self, x, use_cache=False):
        if not use_cache:
            return super().forward(x)
        b, T, _ = x.shape
        assert T > 0, "empty prompt"
        start = 0 if self.cache_k is None else self.cache_k.shape[1]
        assert start + T <= self.mask.shape[0], "past context_length"
        H, D = self.num_heads, self.head_dim
        k_new = self.W_key(x).view(b, T, H, D)
        v_new = self.W_value(x).view(b, T, H, D)
        self.cache_k = k_new if self.cache_k is None else torch.cat([self.cache_k, k_new], dim=1)
        self.cache_v = v_new if self.cache_v is None else torch.cat([self.cache_v, v_new], dim=1)
        q = self.W_query(x).view(b, T, H, D).transpose(1, 2)
        k = self.cache_k.transpose(1, 2)
        v = self.cache_v.transpose(1, 2)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        s = s.masked_fill(decode_causal_mask(T, start + T).to(s.device), float("-inf"))
        w = self.dropout(torch.softmax(s, dim=-1))
        return self.out_proj((w @ v).transpose(1, 2).reshape(b, T, self.d_out))
''',
    },
    "repeat_kv": {
        "repeat_interleave": '''
def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x, repeats=n_rep, dim=1)
''',
        "stack of copies": '''
def repeat_kv(x, n_rep):
    if n_rep == 1:
        return x
    b, G, T, D = x.shape
    return torch.stack([x] * n_rep, dim=2).flatten(1, 2)
''',
    },
    "GroupedQueryAttention": {
        "index the key/value head of each query head": '''
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, num_kv_groups, qkv_bias=False):
        super().__init__()
        assert num_heads % num_kv_groups == 0, "num_kv_groups must divide num_heads"
        self.num_heads, self.num_kv_groups = num_heads, num_kv_groups
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, num_kv_groups * self.head_dim, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, num_kv_groups * self.head_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(context_length, context_length).triu(1).bool())

    def forward(self, x):
        b, T, d_in = x.shape
        group = torch.arange(self.num_heads, device=x.device) // (self.num_heads // self.num_kv_groups)
        q = split_heads(self.W_query(x), self.num_heads)
        k = split_heads(self.W_key(x), self.num_kv_groups)[:, group]
        v = split_heads(self.W_value(x), self.num_kv_groups)[:, group]
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) / self.head_dim ** 0.5
        w = self.dropout(torch.softmax(s.masked_fill(self.mask[:T, :T], -1e9), dim=-1))
        return self.out_proj(merge_heads(w @ v))
''',
        "queries grouped instead of keys repeated": '''
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, num_kv_groups, qkv_bias=False):
        super().__init__()
        if d_out % num_heads or num_heads % num_kv_groups:
            raise ValueError("num_kv_groups must divide num_heads, which must divide d_out")
        self.d_out, self.H, self.G = d_out, num_heads, num_kv_groups
        self.D = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, num_kv_groups * self.D, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, num_kv_groups * self.D, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), 1))

    def forward(self, x):
        b, T, _ = x.shape
        H, G, D = self.H, self.G, self.D
        q = self.W_query(x).view(b, T, G, H // G, D).permute(0, 2, 3, 1, 4)
        k = self.W_key(x).view(b, T, G, 1, D).permute(0, 2, 3, 1, 4)
        v = self.W_value(x).view(b, T, G, 1, D).permute(0, 2, 3, 1, 4)
        s = (q @ k.transpose(-2, -1)).masked_fill(self.mask[:T, :T], -torch.inf) / D ** 0.5
        w = self.dropout(torch.softmax(s, dim=-1))
        out = (w @ v).reshape(b, H, T, D)
        return self.out_proj(out.transpose(1, 2).reshape(b, T, self.d_out))
''',
    },
    "sliding_window_mask": {
        "triu and tril": '''
def sliding_window_mask(num_tokens, window):
    if window < 1:
        raise ValueError("window < 1")
    ones = torch.ones(num_tokens, num_tokens, dtype=torch.bool)
    return torch.triu(ones, diagonal=1) | torch.tril(ones, diagonal=-window)


def sliding_window_mask_mod(window):
    def mask_mod(b, h, q_idx, kv_idx):
        causal = q_idx >= kv_idx
        near = q_idx - kv_idx < window
        return causal & near
    return mask_mod
''',
        "from the decode mask, mask_mod with torch.logical_and": '''
def sliding_window_mask(num_tokens, window):
    assert window >= 1, "window must be at least 1"
    too_old = ~torch.ones(num_tokens, num_tokens, dtype=torch.bool).triu(1 - window)
    return decode_causal_mask(num_tokens, num_tokens) | too_old


def sliding_window_mask_mod(window):
    return lambda b, h, q_idx, kv_idx: torch.logical_and(kv_idx <= q_idx, kv_idx > q_idx - window)
''',
    },
}
