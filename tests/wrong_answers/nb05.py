"""Answers for notebook 05 (multi-head attention). See the package docstring for the format.

Most wrong answers are a correct base answer (``_WRAPPER``, ``_SPLIT``, ``_MERGE``,
``_mha(_book_forward())``) with one change, made by ``_edit`` or by an argument of ``_book_forward``.
"""

from tests.wrong_answers import edit as _edit

# A correct MultiHeadAttentionWrapper.
_WRAPPER = '''
class MultiHeadAttentionWrapper(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList([CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)
                                    for _ in range(num_heads)])

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)
'''

# A correct split_heads and merge_heads (the latter is also a RIGHT answer).
_SPLIT = '''
def split_heads(x, num_heads):
    b, T, d = x.shape
    return x.view(b, T, num_heads, d // num_heads).transpose(1, 2)
'''
_MERGE = '''
def merge_heads(x):
    b, H, T, D = x.shape
    return x.transpose(1, 2).reshape(b, T, H * D)
'''

_MHA_INIT = '''
class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
'''


def _mha(forward: str, init: str = _MHA_INIT) -> str:
    """A MultiHeadAttention with the book's __init__ and the given forward body."""
    return init + "\n    def forward(self, x):\n" + "\n".join("        " + line for line in forward.strip("\n").splitlines()) + "\n"


def _book_forward(split: str = "view(b, T, self.num_heads, self.head_dim).transpose(1, 2)",
                  merge: str = "transpose(1, 2).contiguous().view(b, T, self.d_out)",
                  scale: str = "self.head_dim ** 0.5", mask: str = "self.mask.bool()[:T, :T]",
                  weights: str = "self.dropout(w)", out: str = "self.out_proj(c)") -> str:
    return f'''
b, T, _ = x.shape
q = self.W_query(x).{split}
k = self.W_key(x).{split}
v = self.W_value(x).{split}
s = (q @ k.transpose(2, 3)).masked_fill({mask}, -torch.inf)
w = torch.softmax(s / {scale}, dim=-1)
w = {weights}
c = (w @ v).{merge}
return {out}
'''


# Some wrong answers were written without the assert; they start from this __init__.
_MHA_INIT_NO_ASSERT = _edit(_MHA_INIT, "        assert d_out % num_heads == 0\n", "")
_OUT_PROJ_LINE = "        self.out_proj = nn.Linear(d_out, d_out)\n"


WRONG = {
    "MultiHeadAttentionWrapper": {
        "one head repeated: ModuleList([head] * n)": _edit(
            _WRAPPER,
            "        self.heads = nn.ModuleList([CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)\n"
            "                                    for _ in range(num_heads)])\n",
            "        head = CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)\n"
            "        self.heads = nn.ModuleList([head] * num_heads)\n",
        ),
        "heads concatenated on the batch dim": _edit(_WRAPPER, "dim=-1)", "dim=0)"),
        "heads concatenated on the token dim": _edit(_WRAPPER, "dim=-1)", "dim=1)"),
        "heads stacked instead of concatenated": _edit(
            _WRAPPER, "torch.cat([head(x) for head in self.heads], dim=-1)",
            "torch.stack([head(x) for head in self.heads], dim=2)"),
        "first head called for every slot": _edit(
            _WRAPPER, "[head(x) for head in self.heads]", "[self.heads[0](x) for _ in self.heads]"),
        "d_out split between the heads (MultiHeadAttention's meaning)": _edit(
            _WRAPPER, "CausalAttention(d_in, d_out,", "CausalAttention(d_in, d_out // num_heads,"),
        "plain list: heads are not submodules": _edit(
            _WRAPPER,
            "nn.ModuleList([CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)\n"
            "                                    for _ in range(num_heads)])",
            "[CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]",
        ),
        "heads summed instead of concatenated": _edit(
            _WRAPPER, "torch.cat([head(x) for head in self.heads], dim=-1)", "sum(head(x) for head in self.heads)"),
    },
    "split_heads": {
        "view without transpose": _edit(
            _SPLIT, "x.view(b, T, num_heads, d // num_heads).transpose(1, 2)", "x.view(b, num_heads, T, d // num_heads)"),
        "transpose forgotten: (b, T, H, D)": _edit(_SPLIT, ".transpose(1, 2)", ""),
        "heads interleaved: view (b, T, D, H)": _edit(
            _SPLIT, "view(b, T, num_heads, d // num_heads).transpose(1, 2)",
            "view(b, T, d // num_heads, num_heads).permute(0, 3, 1, 2)"),
        "transposes the wrong pair of dims": _edit(_SPLIT, ".transpose(1, 2)", ".transpose(0, 2)"),
    },
    "merge_heads": {
        "view without contiguous": _edit(_MERGE, ".reshape(", ".view("),
        "reshape without transpose": _edit(_MERGE, ".transpose(1, 2)", ""),
        "heads interleaved: permute(0, 2, 3, 1)": _edit(_MERGE, ".transpose(1, 2)", ".permute(0, 2, 3, 1)"),
        "only the first head kept": '''
def merge_heads(x):
    b, H, T, D = x.shape
    return x[:, 0].repeat(1, 1, H)
''',
    },
    "MultiHeadAttention": {
        "view without transpose when splitting": _mha(_book_forward(split="view(b, self.num_heads, T, self.head_dim)")),
        "merge without transpose": _mha(_book_forward(merge="reshape(b, T, self.d_out)")),
        "out_proj missing": _mha(_book_forward(out="c"), init=_edit(_MHA_INIT_NO_ASSERT, _OUT_PROJ_LINE, "")),
        "out_proj created but not applied": _mha(_book_forward(out="c")),
        "scaled by sqrt(d_out) instead of sqrt(head_dim)": _mha(_book_forward(scale="self.d_out ** 0.5")),
        # every size in __init__ changes, so it is written out in full
        "d_out per head (the wrapper's meaning)": _mha(_book_forward(), init='''
class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.d_out = d_out * num_heads
        self.num_heads = num_heads
        self.head_dim = d_out
        self.W_query = nn.Linear(d_in, self.d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, self.d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, self.d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(self.d_out, self.d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
'''),
        "mask not truncated to num_tokens": _mha(_book_forward(mask="self.mask.bool()")),
        "dropout before softmax": _mha(_edit(
            _book_forward(),
            "w = torch.softmax(s / self.head_dim ** 0.5, dim=-1)\nw = self.dropout(w)\n",
            "w = torch.softmax(self.dropout(s) / self.head_dim ** 0.5, dim=-1)\n",
        )),
        "dropout active in eval mode": _mha(_book_forward(
            weights="torch.nn.functional.dropout(w, self.dropout.p, training=True)")),
        "mask as a plain attribute": _mha(_book_forward(), init=_edit(
            _MHA_INIT_NO_ASSERT,
            'self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))',
            "self.mask = torch.triu(torch.ones(context_length, context_length), diagonal=1)",
        )),
        "out_proj created before the projections": _mha(_book_forward(), init=_edit(
            _edit(_MHA_INIT_NO_ASSERT, _OUT_PROJ_LINE, ""), "        self.W_query", _OUT_PROJ_LINE + "        self.W_query")),
    },
    "count_parameters": {
        "counts buffers too (state_dict)": '''
def count_parameters(module):
    return sum(t.numel() for t in module.state_dict().values())
''',
        "counts frozen parameters": '''
def count_parameters(module):
    return sum(p.numel() for p in module.parameters())
''',
        "counts tensors, not numbers": '''
def count_parameters(module):
    return len([p for p in module.parameters() if p.requires_grad])
''',
        "weights only, biases forgotten": '''
def count_parameters(module):
    return sum(p.numel() for name, p in module.named_parameters() if "weight" in name and p.requires_grad)
''',
        "parameters plus buffers": '''
def count_parameters(module):
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return trainable + sum(b.numel() for b in module.buffers())
''',
    },
}

RIGHT = {
    "MultiHeadAttentionWrapper": {
        "explicit loop over the heads": '''
class MultiHeadAttentionWrapper(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList()
        for _ in range(num_heads):
            self.heads.append(CausalAttention(d_in, d_out, context_length, dropout, qkv_bias))

    def forward(self, x):
        outputs = []
        for head in self.heads:
            outputs.append(head(x))
        return torch.cat(outputs, dim=2)
''',
        "torch.concat with keyword arguments": '''
class MultiHeadAttentionWrapper(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            CausalAttention(d_in=d_in, d_out=d_out, context_length=context_length, dropout=dropout, qkv_bias=qkv_bias)
            for _ in range(num_heads)
        )

    def forward(self, x):
        return torch.concat(tuple(h(x) for h in self.heads), dim=-1)
''',
    },
    "split_heads": {
        "reshape and permute": '''
def split_heads(x, num_heads):
    b, T, d = x.shape
    return x.reshape(b, T, num_heads, -1).permute(0, 2, 1, 3)
''',
        "stack of chunks": '''
def split_heads(x, num_heads):
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)
''',
        "unflatten and swapaxes": '''
def split_heads(x, num_heads):
    return x.unflatten(-1, (num_heads, -1)).swapaxes(1, 2)
''',
    },
    "merge_heads": {
        "transpose then reshape": _MERGE,
        "cat of the heads": '''
def merge_heads(x):
    return torch.cat(x.unbind(dim=1), dim=-1)
''',
        "permute then flatten": '''
def merge_heads(x):
    return x.permute(0, 2, 1, 3).flatten(2)
''',
    },
    "MultiHeadAttention": {
        "reshape instead of contiguous().view, F.dropout with self.training, -1e9": '''
import torch.nn.functional as F

class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        if d_out % num_heads:
            raise ValueError("d_out must be divisible by num_heads")
        self.h, self.hd, self.p = num_heads, d_out // num_heads, dropout
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.register_buffer("mask", torch.ones(context_length, context_length).triu(1).bool())

    def forward(self, x):
        b, T, d_in = x.shape
        q = self.W_query(x).reshape(b, T, self.h, self.hd).transpose(1, 2)
        k = self.W_key(x).reshape(b, T, self.h, self.hd).transpose(1, 2)
        v = self.W_value(x).reshape(b, T, self.h, self.hd).transpose(1, 2)
        s = q @ k.mT / math.sqrt(self.hd)
        w = F.dropout(torch.softmax(s.masked_fill(self.mask[:T, :T], -1e9), dim=-1), self.p, self.training)
        return self.out_proj((w @ v).transpose(1, 2).reshape(b, T, -1))
''',
        "einsum": '''
class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0
        self.num_heads, self.head_dim = num_heads, d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1).bool())

    def forward(self, x):
        b, T, _ = x.shape
        H, D = self.num_heads, self.head_dim
        q = self.W_query(x).view(b, T, H, D)
        k = self.W_key(x).view(b, T, H, D)
        v = self.W_value(x).view(b, T, H, D)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / D ** 0.5
        w = self.dropout(torch.softmax(s.masked_fill(self.mask[:T, :T], float("-inf")), dim=-1))
        return self.out_proj(torch.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, T, H * D))
''',
        "uses the notebook's split_heads and merge_heads": '''
class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0
        self.num_heads = num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), 1))

    def forward(self, x):
        T = x.shape[1]
        q = split_heads(self.W_query(x), self.num_heads)
        k = split_heads(self.W_key(x), self.num_heads)
        v = split_heads(self.W_value(x), self.num_heads)
        s = (q @ k.transpose(-2, -1)).masked_fill(self.mask[:T, :T], -torch.inf)
        w = self.dropout(torch.softmax(s / math.sqrt(q.shape[-1]), dim=-1))
        return self.out_proj(merge_heads(w @ v))
''',
    },
    "count_parameters": {
        "loop over named_parameters": '''
def count_parameters(module):
    total = 0
    for name, p in module.named_parameters():
        if p.requires_grad:
            total += p.numel()
    return total
''',
        "math.prod of the shapes": '''
def count_parameters(module):
    return int(sum(math.prod(p.shape) for p in module.parameters() if p.requires_grad))
''',
    },
}
