"""Answers for notebook 06 (efficient attention). See the package docstring for the format.

Most wrong answers are a correct base answer (``_combined(_COMBINED_FORWARD)``,
``_sdpa(_SDPA_FORWARD)``, ``_FLOPS``) with one change made by ``_edit``.
"""

from tests.wrong_answers import edit as _edit
from tests.wrong_answers import wrong

# A correct __init__ for MultiHeadAttentionCombinedQKV.
_COMBINED_INIT = '''
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.d_out = d_out
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1))
'''

_MASK_BUFFER = 'self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1))'

# MHAPyTorchSDPA needs no mask buffer, and keeps the dropout probability to pass to SDPA.
_SDPA_INIT = _edit(
    _edit(_COMBINED_INIT, "        " + _MASK_BUFFER + "\n", ""), "self.dropout = nn.Dropout(dropout)", "self.dropout = dropout")


def _combined(forward: str, init: str = _COMBINED_INIT) -> str:
    return "class MultiHeadAttentionCombinedQKV(nn.Module):" + init + forward


def _sdpa(forward: str, init: str = _SDPA_INIT) -> str:
    return "class MHAPyTorchSDPA(nn.Module):" + init + forward


# The projection split into (b, H, T, D) queries, keys and values, as both classes do it.
_QKV_SPLIT = "view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)"
# The same split for a (b, T, H, 3, D) layout, which the qkv weights are not in.
_QKV_SPLIT_HEADS_FIRST = "view(b, T, self.num_heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)"

# A correct forward for MultiHeadAttentionCombinedQKV.
_COMBINED_FORWARD = '''
    def forward(self, x):
        b, T, _ = x.shape
        q, k, v = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        scores = (q @ k.transpose(-2, -1)).masked_fill(self.mask[:T, :T], -torch.inf)
        w = self.dropout(torch.softmax(scores / self.head_dim**0.5, dim=-1))
        return self.out_proj((w @ v).transpose(1, 2).reshape(b, T, self.d_out))
'''
_COMBINED_QKV_LINE = f"        q, k, v = self.qkv(x).{_QKV_SPLIT}.unbind(0)\n"
_COMBINED_SOFTMAX_LINE = "        w = self.dropout(torch.softmax(scores / self.head_dim**0.5, dim=-1))\n"

# A correct forward for MHAPyTorchSDPA.
_SDPA_FORWARD = '''
    def forward(self, x):
        b, T, _ = x.shape
        q, k, v = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.out_proj(out.transpose(1, 2).reshape(b, T, self.d_out))
'''
_SDPA_DROPOUT = "dropout_p=self.dropout if self.training else 0.0"
_SDPA_FORWARD_NO_DROPOUT = _edit(_SDPA_FORWARD, _SDPA_DROPOUT + ", ", "")

# MHAPyTorchSDPA with an explicit boolean mask (True = allowed) instead of is_causal (a RIGHT answer).
_SDPA_MASK_FORWARD = '''
    def forward(self, x):
        b, T, _ = x.shape
        q, k, v = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        allowed = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(b, T, self.d_out))
'''

# A correct attention_flops: two (T x T x D) matrix products of 2 FLOPs per multiply-add, halved when causal.
_FLOPS = '''
def attention_flops(batch, num_heads, seq_len, head_dim, causal=True):
    flops = 4 * batch * num_heads * seq_len**2 * head_dim
    return flops // 2 if causal else flops
'''

WRONG = {
    "MultiHeadAttentionCombinedQKV": {
        "view(b, T, H, 3, D): heads first, slices Q, K and V wrongly": wrong(_combined(_edit(
            _COMBINED_FORWARD, _COMBINED_QKV_LINE,
            f"        qkv = self.qkv(x).{_QKV_SPLIT_HEADS_FIRST}\n        q, k, v = qkv.unbind(0)\n")),
            "(b, T, num_heads, 3, head_dim)"),
        "unbinds in the order keys, queries, values": wrong(_combined(_edit(
            _COMBINED_FORWARD, _COMBINED_QKV_LINE,
            f"        qkv = self.qkv(x).{_QKV_SPLIT}\n        k, q, v = qkv.unbind(0)\n")), "in the wrong order"),
        "no causal mask": wrong(_combined(_edit(
            _COMBINED_FORWARD,
            "        scores = (q @ k.transpose(-2, -1)).masked_fill(self.mask[:T, :T], -torch.inf)\n"
            + _COMBINED_SOFTMAX_LINE,
            "        w = self.dropout(torch.softmax(q @ k.transpose(-2, -1) / self.head_dim**0.5, dim=-1))\n")),
            "no mask is applied"),
        "scales by sqrt(d_out) instead of sqrt(head_dim)": wrong(_combined(_edit(
            _COMBINED_FORWARD, "scores / self.head_dim**0.5", "scores / self.d_out**0.5")), "sqrt(d_out)"),
        "mask not cut to T (fails for T < context_length)": wrong(_combined(_edit(
            _COMBINED_FORWARD, "self.mask[:T, :T]", "self.mask")), "mask not truncated"),
        "merges heads without moving T back first": wrong(_combined(_edit(
            _COMBINED_FORWARD, "(w @ v).transpose(1, 2).reshape", "(w @ v).reshape")),
            "reshaped straight to (b, T, d_out)"),
        "dropout on the context vectors instead of the weights": wrong(_combined(_edit(
            _edit(_COMBINED_FORWARD, _COMBINED_SOFTMAX_LINE,
                  "        w = torch.softmax(scores / self.head_dim**0.5, dim=-1)\n"),
            "self.out_proj((w @ v).transpose(1, 2).reshape(b, T, self.d_out))",
            "self.out_proj(self.dropout((w @ v).transpose(1, 2).reshape(b, T, self.d_out)))")), "context vectors"),
        "ignores qkv_bias": wrong(_combined(_COMBINED_FORWARD, init=_edit(_COMBINED_INIT, "bias=qkv_bias", "bias=False")),
                                  "qkv_bias=True"),
        # the forward of MHAPyTorchSDPA, less its dropout
        "uses the library kernel (not allowed in this exercise)": wrong(_combined(_SDPA_FORWARD_NO_DROPOUT),
                                                                        "scaled_dot_product_attention"),
        "mask kept as a plain attribute, not a buffer": wrong(_combined(
            _edit(_COMBINED_FORWARD, "self.mask[:T, :T]", "self.causal[:T, :T]"),
            init=_edit(
                _COMBINED_INIT, _MASK_BUFFER,
                "self.causal = torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1)")),
            "plain attribute"),
        "three projections instead of one qkv layer": wrong(_combined(_edit(
            _COMBINED_FORWARD, _COMBINED_QKV_LINE,
            "        q, k, v = (layer(x).view(b, T, self.num_heads, self.head_dim).transpose(1, 2)\n"
            "                   for layer in (self.W_query, self.W_key, self.W_value))\n"),
            init=_edit(_COMBINED_INIT, "        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)\n",
                       "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
                       "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
                       "        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)\n")),
            "three projections instead of one"),
        "qkv reshaped straight to (3, b, H, T, D)": wrong(_combined(_edit(
            _COMBINED_FORWARD, _QKV_SPLIT, "reshape(3, b, self.num_heads, T, self.head_dim)")),
            "reshaped straight to (3, b, num_heads, T, head_dim)"),
        # the review finding of notebook 05: NaN in row 0 must be named as such, not as a dropout problem
        "masks the diagonal too (NaN in row 0)": wrong(_combined(_COMBINED_FORWARD, init=_edit(
            _COMBINED_INIT, "diagonal=1)", "diagonal=0)")), "diagonal"),
        "dropout never applied": wrong(_combined(_edit(
            _COMBINED_FORWARD, _COMBINED_SOFTMAX_LINE, "        w = torch.softmax(scores / self.head_dim**0.5, dim=-1)\n")),
            "no dropout in train() mode"),
    },
    "MHAPyTorchSDPA": {
        "is_causal missing": wrong(_sdpa(_edit(_SDPA_FORWARD, ", is_causal=True)", ")")), "is_causal=True is missing"),
        "dropout_p applied in eval() mode too": wrong(
            _sdpa(_edit(_SDPA_FORWARD, _SDPA_DROPOUT, "dropout_p=self.dropout")), "dropout is active in eval() mode"),
        "dropout never applied": wrong(_sdpa(_SDPA_FORWARD_NO_DROPOUT), "no dropout in train() mode"),
        # SDPA's boolean attn_mask marks the positions that MAY be attended to
        "mask passed with the wrong convention (True = blocked)": wrong(_sdpa(_edit(
            _edit(
                _edit(_SDPA_MASK_FORWARD, "attn_mask=allowed", "attn_mask=blocked"),
                "        allowed = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))\n",
                "        blocked = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)\n"),
            "self.out_proj(out.transpose", "self.out_proj(torch.nan_to_num(out).transpose")), "wrong convention"),
        "heads not moved before SDPA: attends over heads, not tokens": wrong(_sdpa(_edit(
            _edit(_SDPA_FORWARD, ".permute(2, 0, 3, 1, 4)", ".permute(2, 0, 1, 3, 4)"),
            "out.transpose(1, 2).reshape", "out.reshape")), "not moved in front of the tokens"),
        "view(b, T, H, 3, D) layout": wrong(_sdpa(_edit(_SDPA_FORWARD, _QKV_SPLIT, _QKV_SPLIT_HEADS_FIRST)),
                                            "(b, T, num_heads, 3, head_dim)"),
        "hand-written softmax instead of SDPA": wrong(_sdpa(_edit(
            _edit(
                _SDPA_FORWARD,
                "        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)\n",
                "        blocked = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)\n"
                "        w = torch.softmax((q @ k.transpose(-2, -1) / self.head_dim**0.5).masked_fill(blocked, -torch.inf), dim=-1)\n"),
            "self.out_proj(out.transpose", "self.out_proj((w @ v).transpose")), "softmax"),
        "no out_proj": wrong(_sdpa(
            _edit(_SDPA_FORWARD, "return self.out_proj(out.transpose(1, 2).reshape(b, T, self.d_out))",
                  "return out.transpose(1, 2).reshape(b, T, self.d_out)"),
            init=_edit(_SDPA_INIT, "        self.out_proj = nn.Linear(d_out, d_out)\n", "")), "out_proj is missing"),
        "queries scaled by hand as well": wrong(_sdpa(_edit(
            _SDPA_FORWARD, "F.scaled_dot_product_attention(q, k,", "F.scaled_dot_product_attention(q / self.head_dim**0.5, k,")),
            "scaled by hand"),
        "merges heads without moving T back first": wrong(_sdpa(_edit(
            _SDPA_FORWARD, "out.transpose(1, 2).reshape", "out.reshape")), "merged without transpose"),
        "unbinds in the order keys, queries, values": wrong(_sdpa(_edit(
            _SDPA_FORWARD, "q, k, v = self.qkv(x)", "k, q, v = self.qkv(x)")), "in the wrong order"),
        "ignores qkv_bias": wrong(_sdpa(_SDPA_FORWARD, init=_edit(_SDPA_INIT, "bias=qkv_bias", "bias=False")),
                                  "qkv_bias=True"),
    },
    "attention_flops": {
        "not halved when causal": wrong('''
def attention_flops(batch, num_heads, seq_len, head_dim, causal=True):
    return 4 * batch * num_heads * seq_len**2 * head_dim
''', "halve the count when causal is True"),
        "halved twice when causal": wrong(_edit(_FLOPS, "head_dim\n", "head_dim // 2\n"), "halved twice"),
        "T instead of T^2": wrong(_edit(_FLOPS, "seq_len**2", "seq_len"), "T^2"),
        "forgets 2 FLOPs per multiply-add": wrong(_edit(_FLOPS, "flops = 4 *", "flops = 2 *"), "multiply-add"),
        "default causal=False": wrong(_edit(_FLOPS, "causal=True", "causal=False"), "default to True"),
        "condition inverted": wrong(_edit(_FLOPS, "return flops // 2 if causal else flops",
                                          "return flops if causal else flops // 2"), "halve the count when causal is True"),
        "counts only one of the two matrix products": wrong('''
def attention_flops(batch, num_heads, seq_len, head_dim, causal=True):
    flops = 2 * batch * num_heads * seq_len * seq_len * head_dim
    return flops if not causal else flops // 2
''', "two matrix products"),
        "causal counts the lower triangle with the diagonal, T(T+1)/2": wrong('''
def attention_flops(batch, num_heads, seq_len, head_dim, causal=True):
    pairs = seq_len * (seq_len + 1) // 2 if causal else seq_len * seq_len
    return 4 * batch * num_heads * pairs * head_dim
''', "diagonal"),
        "batch and heads left out": wrong(_edit(_FLOPS, "4 * batch * num_heads * seq_len**2", "4 * seq_len**2"),
                                          "batch * num_heads"),
        "returns a string": wrong(_edit(_FLOPS, "return flops // 2 if causal else flops",
                                        "return f'{flops // 2 if causal else flops:,}'"), "expected a number"),
    },
}

# A correct time_cuda_aware.
_TIMER = '''
def time_cuda_aware(fn, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
'''
_SYNC = "        if torch.cuda.is_available():\n            torch.cuda.synchronize()\n"
_WARMUP = "    for _ in range(warmup):\n        fn()\n"

WRONG["time_cuda_aware"] = {
    "no warm-up": wrong(_edit(_TIMER, _WARMUP, ""), "warm-up calls are missing"),
    "never synchronises": wrong(_edit(_TIMER, _SYNC, "", count=2), "torch.cuda.synchronize() was never called"),
    "synchronises only before starting the clock": wrong(
        _edit(_TIMER, "        fn()\n" + _SYNC, "        fn()\n"), "launch only"),
    "synchronises even without a GPU": wrong(
        _edit(_TIMER, _SYNC, "        torch.cuda.synchronize()\n", count=2), "only when torch.cuda.is_available()"),
    "the mean, not the median": wrong(_edit(_TIMER, "statistics.median(times)", "statistics.mean(times)"),
                                      "mean of the repeats"),
    "the fastest repeat": wrong(_edit(_TIMER, "statistics.median(times)", "min(times)"), "fastest repeat"),
    "milliseconds": wrong(_edit(_TIMER, "return statistics.median(times)", "return 1000 * statistics.median(times)"),
                          "milliseconds"),
    "perf_counter imported by name, so the simulated clock is never read": wrong(
        "from time import perf_counter\n" + _TIMER.replace("time.perf_counter()", "perf_counter()"),
        "never read time.perf_counter()"),
    "the warm-up calls timed too": wrong(_edit(_edit(_TIMER, _WARMUP, ""), "range(repeats)", "range(warmup + repeats)"),
                                         "warm-up"),
}

RIGHT = {
    "MultiHeadAttentionCombinedQKV": {
        "chunk(3) on the last dim, then split heads with view/transpose": _combined('''
    def forward(self, x):
        b, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(b, T, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(2, 3)
        scores.masked_fill_(self.mask.bool()[:T, :T], -torch.inf)
        w = self.dropout(torch.softmax(scores / k.shape[-1] ** 0.5, dim=-1))
        return self.out_proj((w @ v).transpose(1, 2).contiguous().view(b, T, self.d_out))
'''),
        "reshape and indexing instead of view and unbind": _combined('''
    def forward(self, x):
        b, T, _ = x.shape
        qkv = self.qkv(x).reshape(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.where(self.mask[:T, :T], float("-inf"), q @ k.mT / math.sqrt(self.head_dim))
        w = self.dropout(F.softmax(scores, dim=-1))
        return self.out_proj((w @ v).permute(0, 2, 1, 3).reshape(b, T, -1))
'''),
        "einsum with a float mask buffer": _combined('''
    def forward(self, x):
        b, T, _ = x.shape
        q, k, v = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).unbind(2)  # each (b, T, H, D)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k)
        scores = scores.masked_fill(self.mask[:T, :T].bool(), float("-inf"))
        w = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
        return self.out_proj(torch.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, T, self.d_out))
''', init=_edit(_COMBINED_INIT, "dtype=torch.bool", "dtype=torch.float32")),
    },
    "MHAPyTorchSDPA": {
        "explicit boolean mask (True = allowed) instead of is_causal": _sdpa(_SDPA_MASK_FORWARD),
        "chunk and transpose, keyword names, contiguous().view": _sdpa('''
    def forward(self, x):
        b, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(b, T, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        use_dropout = 0.0 if not self.training else self.dropout
        context = nn.functional.scaled_dot_product_attention(
            query=q, key=k, value=v, attn_mask=None, dropout_p=use_dropout, is_causal=True)
        return self.out_proj(context.transpose(1, 2).contiguous().view(b, T, self.d_out))
'''),
        "dropout stored as nn.Dropout, its p passed to SDPA": _sdpa('''
    def forward(self, x):
        b, T, _ = x.shape
        q, k, v = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        p = self.drop.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.out_proj(out.transpose(1, 2).flatten(2))
''', init=_edit(_SDPA_INIT, "self.dropout = dropout", "self.drop = nn.Dropout(dropout)")),
    },
    "attention_flops": {
        "2 products x 2 FLOPs, integer division written differently": '''
def attention_flops(batch, num_heads, seq_len, head_dim, causal=True):
    per_product = 2 * batch * num_heads * seq_len * seq_len * head_dim
    total = 2 * per_product
    if causal:
        total = total // 2
    return total
''',
        "float factor converted back to int": '''
def attention_flops(batch, num_heads, seq_len, head_dim, causal=True):
    return int(4 * batch * num_heads * seq_len ** 2 * head_dim * (0.5 if causal else 1.0))
''',
        "math.prod": '''
def attention_flops(batch, num_heads, seq_len, head_dim, causal=True):
    return math.prod([2, 2 if not causal else 1, batch, num_heads, seq_len, seq_len, head_dim])
''',
    },
    "time_cuda_aware": {
        "a sync helper, perf_counter_ns and torch's median": '''
def time_cuda_aware(fn, warmup=3, repeats=10):
    def wait():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    wait()
    elapsed = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        wait()
        elapsed.append((time.perf_counter_ns() - t0) / 1e9)
    return torch.tensor(elapsed, dtype=torch.float64).median().item()
''',
        "get_device() decides, every call timed, the warm-up dropped, sorted middle value (odd repeats)": '''
def time_cuda_aware(fn, warmup=3, repeats=10):
    on_gpu = get_device().type == "cuda"
    times = []
    for _ in range(warmup + repeats):
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times[warmup:])[repeats // 2]
''',
    },
}
