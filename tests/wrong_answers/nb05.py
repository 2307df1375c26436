"""Answers for notebook 05 (multi-head attention). See the package docstring for the format.

Most wrong answers are a correct base answer (``_WRAPPER``, ``_SPLIT``, ``_MERGE``,
``_mha(_book_forward())``) with one change, made by ``_edit`` or by an argument of ``_book_forward``.
"""

from tests.wrong_answers import edit as _edit
from tests.wrong_answers import wrong

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
        "one head repeated: ModuleList([head] * n)": wrong(_edit(
            _WRAPPER,
            "        self.heads = nn.ModuleList([CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)\n"
            "                                    for _ in range(num_heads)])\n",
            "        head = CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)\n"
            "        self.heads = nn.ModuleList([head] * num_heads)\n",
        ), "one head repeated"),
        "heads concatenated on the batch dim": wrong(_edit(_WRAPPER, "dim=-1)", "dim=0)"), "wrong dim (dim 0"),
        "heads concatenated on the token dim": wrong(_edit(_WRAPPER, "dim=-1)", "dim=1)"), "wrong dim (dim 1"),
        "heads stacked instead of concatenated": wrong(_edit(
            _WRAPPER, "torch.cat([head(x) for head in self.heads], dim=-1)",
            "torch.stack([head(x) for head in self.heads], dim=2)"), "torch.stack"),
        "first head called for every slot": wrong(_edit(
            _WRAPPER, "[head(x) for head in self.heads]", "[self.heads[0](x) for _ in self.heads]"),
            "every head's block of the output is the same"),
        "d_out split between the heads (MultiHeadAttention's meaning)": wrong(_edit(
            _WRAPPER, "CausalAttention(d_in, d_out,", "CausalAttention(d_in, d_out // num_heads,"),
            "d_out is the size of ONE head"),
        "plain list: heads are not submodules": wrong(_edit(
            _WRAPPER,
            "nn.ModuleList([CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)\n"
            "                                    for _ in range(num_heads)])",
            "[CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]",
        ), "nn.ModuleList"),
        "heads summed instead of concatenated": wrong(_edit(
            _WRAPPER, "torch.cat([head(x) for head in self.heads], dim=-1)", "sum(head(x) for head in self.heads)"),
            "added up"),
        "heads averaged instead of concatenated": wrong(_edit(
            _WRAPPER, "torch.cat([head(x) for head in self.heads], dim=-1)",
            "torch.stack([head(x) for head in self.heads]).mean(dim=0)"), "averaged"),
        "qkv_bias not passed to the heads": wrong(_edit(
            _WRAPPER, "dropout, qkv_bias)\n", "dropout)\n"), "qkv_bias=True"),
    },
    "split_heads": {
        "view without transpose": wrong(_edit(
            _SPLIT, "x.view(b, T, num_heads, d // num_heads).transpose(1, 2)", "x.view(b, num_heads, T, d // num_heads)"),
            "view without transpose"),
        "transpose forgotten: (b, T, H, D)": wrong(_edit(_SPLIT, ".transpose(1, 2)", ""), ".transpose(1, 2)"),
        "heads interleaved: view (b, T, D, H)": wrong(_edit(
            _SPLIT, "view(b, T, num_heads, d // num_heads).transpose(1, 2)",
            "view(b, T, d // num_heads, num_heads).permute(0, 3, 1, 2)"), "heads interleaved"),
        "transposes the wrong pair of dims": wrong(_edit(_SPLIT, ".transpose(1, 2)", ".transpose(0, 2)"),
                                                   "wrong pair of dimensions"),
        "num_heads and head_dim swapped": wrong(_edit(
            _SPLIT, "view(b, T, num_heads, d // num_heads)", "view(b, T, d // num_heads, num_heads)"),
            "num_heads and head_dim are swapped"),
    },
    "merge_heads": {
        "view without contiguous": wrong(_edit(_MERGE, ".reshape(", ".view("), "view on a transposed tensor"),
        "reshape without transpose": wrong(_edit(_MERGE, ".transpose(1, 2)", ""), "view without transpose"),
        "heads interleaved: permute(0, 2, 3, 1)": wrong(
            _edit(_MERGE, ".transpose(1, 2)", ".permute(0, 2, 3, 1)"), "heads interleaved"),
        "only the first head kept": wrong('''
def merge_heads(x):
    b, H, T, D = x.shape
    return x[:, 0].repeat(1, 1, H)
''', "every head's block"),
        "transposes the wrong pair of dims": wrong(_edit(_MERGE, ".transpose(1, 2)", ".transpose(2, 3)"),
                                                   "wrong pair of dimensions"),
    },
    "MultiHeadAttention": {
        "view without transpose when splitting": wrong(
            _mha(_book_forward(split="view(b, self.num_heads, T, self.head_dim)")), "without transpose when splitting"),
        "merge without transpose": wrong(_mha(_book_forward(merge="reshape(b, T, self.d_out)")),
                                         "reshaped straight to (b, T, d_out)"),
        "out_proj missing": wrong(_mha(_book_forward(out="c"), init=_edit(_MHA_INIT_NO_ASSERT, _OUT_PROJ_LINE, "")),
                                  "out_proj is missing"),
        "out_proj created but not applied": wrong(_mha(_book_forward(out="c")), "out_proj is created but not applied"),
        "scaled by sqrt(d_out) instead of sqrt(head_dim)": wrong(_mha(_book_forward(scale="self.d_out ** 0.5")),
                                                                 "sqrt(d_out)"),
        # every size in __init__ changes, so it is written out in full
        "d_out per head (the wrapper's meaning)": wrong(_mha(_book_forward(), init='''
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
'''), "TOTAL output size"),
        "mask not truncated to num_tokens": wrong(_mha(_book_forward(mask="self.mask.bool()")), "mask not truncated"),
        "dropout before softmax": wrong(_mha(_edit(
            _book_forward(),
            "w = torch.softmax(s / self.head_dim ** 0.5, dim=-1)\nw = self.dropout(w)\n",
            "w = torch.softmax(self.dropout(s) / self.head_dim ** 0.5, dim=-1)\n",
        )), "before the softmax"),
        "dropout active in eval mode": wrong(_mha(_book_forward(
            weights="torch.nn.functional.dropout(w, self.dropout.p, training=True)")), "dropout is active in eval() mode"),
        "mask as a plain attribute": wrong(_mha(_book_forward(), init=_edit(
            _MHA_INIT_NO_ASSERT,
            'self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))',
            "self.mask = torch.triu(torch.ones(context_length, context_length), diagonal=1)",
        )), "plain attribute"),
        "out_proj created before the projections": wrong(_mha(_book_forward(), init=_edit(
            _edit(_MHA_INIT_NO_ASSERT, _OUT_PROJ_LINE, ""), "        self.W_query", _OUT_PROJ_LINE + "        self.W_query")),
            "another order"),
        # the review finding: NaN in row 0 used to be reported as "dropout is active in eval() mode"
        "masks the diagonal too (NaN in row 0)": wrong(_mha(_book_forward(), init=_edit(
            _MHA_INIT, "diagonal=1)", "diagonal=0)")), "diagonal"),
        "scores not scaled": wrong(_mha(_book_forward(scale="1")), "not scaled"),
        "masked with 0 instead of -inf": wrong(_mha(_edit(_book_forward(), "-torch.inf)", "0.0)")), "instead of -inf"),
        "softmax over the queries (dim=-2)": wrong(_mha(_edit(_book_forward(), "dim=-1)", "dim=-2)")),
                                                   "over the queries"),
        "mask applied after the softmax": wrong(_mha(_edit(
            _edit(_book_forward(), "s = (q @ k.transpose(2, 3)).masked_fill(self.mask.bool()[:T, :T], -torch.inf)",
                  "s = q @ k.transpose(2, 3)"),
            "w = torch.softmax(s / self.head_dim ** 0.5, dim=-1)",
            "w = torch.softmax(s / self.head_dim ** 0.5, dim=-1).masked_fill(self.mask.bool()[:T, :T], 0.0)")),
            "no longer sums to 1"),
        "dropout on the context vectors": wrong(_mha(_book_forward(weights="w", out="self.out_proj(self.dropout(c))")),
                                                "context vectors"),
        "ignores qkv_bias": wrong(_mha(_book_forward(), init=_edit(_MHA_INIT, "bias=qkv_bias", "bias=False", count=3)),
                                  "qkv_bias=True"),
        "W_key created before W_query": wrong(_mha(_book_forward(), init=_edit(
            _MHA_INIT, "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
                       "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n",
            "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n")), "another order"),
    },
    "count_parameters": {
        "counts buffers too (state_dict)": wrong('''
def count_parameters(module):
    return sum(t.numel() for t in module.state_dict().values())
''', "buffers are counted too"),
        "counts frozen parameters": wrong('''
def count_parameters(module):
    return sum(p.numel() for p in module.parameters())
''', "requires_grad=False are counted too"),
        "counts tensors, not numbers": wrong('''
def count_parameters(module):
    return len([p for p in module.parameters() if p.requires_grad])
''', "TENSORS"),
        "weights only, biases forgotten": wrong('''
def count_parameters(module):
    return sum(p.numel() for name, p in module.named_parameters() if "weight" in name and p.requires_grad)
''', "biases are forgotten"),
        "parameters plus buffers": wrong('''
def count_parameters(module):
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return trainable + sum(b.numel() for b in module.buffers())
''', "buffers are counted too"),
        "a shared weight counted once per layer": wrong('''
def count_parameters(module):
    return sum(p.numel() for m in module.modules() for p in m.parameters(recurse=False) if p.requires_grad)
''', "counted twice"),
        "only the module's own parameters (recurse=False)": wrong('''
def count_parameters(module):
    return sum(p.numel() for p in module.parameters(recurse=False) if p.requires_grad)
''', "every submodule"),
        "counts the frozen parameters instead": wrong('''
def count_parameters(module):
    return sum(p.numel() for p in module.parameters() if not p.requires_grad)
''', "requires_grad=True"),
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
