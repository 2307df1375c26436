"""Answers for notebook 09 (the capstone). See the package docstring for the format.

Every wrong answer is a correct base answer (``_SINUSOID``, ``_LEARNED``, ``_BLOCK``, ``_GPT``,
``_STEP``) with one change made by ``_edit``. The first four of each exercise go through nbgrader
in tests/test_autograde.py: the issue's own list comes first (residual missing, LayerNorm after
instead of before, positions added after the blocks, the loss on the prompt positions too,
``optimizer.zero_grad`` forgotten).
"""

from tests.wrong_answers import edit as _edit
from tests.wrong_answers import wrong

_SINUSOID = '''
def sinusoidal_positions(num_positions, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    pos = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    angles = pos / 10000 ** (two_i / d_model)
    pe = torch.zeros(num_positions, d_model)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe
'''

_LEARNED = '''
class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, context_length, d_model):
        super().__init__()
        self.embedding = nn.Embedding(context_length, d_model)

    def forward(self, x):
        T = x.shape[1]
        return x + self.embedding(torch.arange(T, device=x.device))
'''

_BLOCK = '''
class TransformerBlock(nn.Module):
    def __init__(self, d_model, num_heads, context_length, dropout):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.att = MultiHeadAttention(d_model, d_model, context_length, dropout, num_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.drop_resid = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop_resid(self.att(self.norm1(x)))
        x = x + self.drop_resid(self.ff(self.norm2(x)))
        return x
'''

_GPT = '''
class TinyGPT(nn.Module):
    def __init__(self, vocab_size, d_model, num_heads, num_layers, context_length, dropout):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = LearnedPositionalEmbedding(context_length, d_model)
        self.drop_emb = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[TransformerBlock(d_model, num_heads, context_length, dropout)
                                      for _ in range(num_layers)])
        self.final_norm = nn.LayerNorm(d_model)
        self.out_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx):
        x = self.pos_emb(self.tok_emb(idx))
        x = self.blocks(self.drop_emb(x))
        return self.out_head(self.final_norm(x))
'''

_STEP = '''
def train_step(model, batch, optimizer):
    inputs, targets, answer_mask = batch
    logits = model(inputs)
    loss = F.cross_entropy(logits[answer_mask], targets[answer_mask])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
'''

WRONG = {
    "sinusoidal_positions": {
        "sin and cos swapped": wrong(_edit(_edit(_SINUSOID, "torch.sin(angles)", "COS"), "torch.cos(angles)",
                                           "torch.sin(angles)").replace("COS", "torch.cos(angles)"),
                                     "sin and cos are swapped"),
        "sines and cosines in two halves": wrong(_edit(
            _SINUSOID, "    pe = torch.zeros(num_positions, d_model)\n    pe[:, 0::2] = torch.sin(angles)\n"
                       "    pe[:, 1::2] = torch.cos(angles)\n",
            "    pe = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)\n"), "interleave them"),
        "exponent i / d instead of 2i / d": wrong(_edit(_SINUSOID, "(two_i / d_model)", "(two_i / 2 / d_model)"),
                                                  "it must be 2i / d_model"),
        "positions start at 1": wrong(_edit(_SINUSOID, "torch.arange(num_positions,", "torch.arange(1, num_positions + 1,"),
                                      "the positions start at 1"),
        "odd d_model accepted": wrong(_edit(_edit(_SINUSOID, "    if d_model % 2:\n        raise ValueError(\"d_model must be even\")\n", ""),
                                            "torch.zeros(num_positions, d_model)",
                                            "torch.zeros(num_positions, d_model + d_model % 2)")
                                      .replace("    return pe\n", "    return pe[:, :d_model]\n"),
                                      "must raise a ValueError"),
        "frequencies multiply the positions": wrong(_edit(_SINUSOID, "pos / 10000 ** (two_i / d_model)",
                                                          "pos * 10000 ** (two_i / d_model)"),
                                                    "multiply 10000^(2i/d_model)"),
    },
    "LearnedPositionalEmbedding": {
        "the position vectors alone": wrong(_edit(_LEARNED, "return x + self.embedding(", "return self.embedding("),
                                            "position vectors alone"),
        "positions reversed": wrong(_edit(_LEARNED, "torch.arange(T, device=x.device)",
                                          "torch.arange(T - 1, -1, -1, device=x.device)"), "the positions are reversed"),
        "positions from 1": wrong(_edit(_LEARNED, "torch.arange(T, device=x.device)",
                                        "torch.arange(1, T + 1, device=x.device)"), "the positions start at 1"),
        "positions made on the CPU": wrong(_edit(_LEARNED, "torch.arange(T, device=x.device)", "torch.arange(T)"),
                                           "device=x.device"),
        "table transposed": wrong(_edit(_edit(_LEARNED, "nn.Embedding(context_length, d_model)",
                                              "nn.Embedding(d_model, context_length)"),
                                        "self.embedding(torch.arange(T, device=x.device))",
                                        "self.embedding.weight.T[:T]"), "one ROW per position"),
    },
    "TransformerBlock": {
        "residual missing around the attention": wrong(_edit(
            _BLOCK, "x = x + self.drop_resid(self.att(", "x = self.drop_resid(self.att("),
            "residual connection around the attention is missing"),
        "LayerNorm after instead of before (post-LN)": wrong(_edit(_edit(
            _BLOCK, "x = x + self.drop_resid(self.att(self.norm1(x)))", "x = self.norm1(x + self.drop_resid(self.att(x)))"),
            "x = x + self.drop_resid(self.ff(self.norm2(x)))", "x = self.norm2(x + self.drop_resid(self.ff(x)))"),
            "post-LN"),
        "residual missing around the feed-forward": wrong(_edit(
            _BLOCK, "x = x + self.drop_resid(self.ff(", "x = self.drop_resid(self.ff("),
            "residual connection around the feed-forward network is missing"),
        "ReLU instead of GELU": wrong(_edit(_BLOCK, "nn.GELU()", "nn.ReLU()"), "GELU"),
        "feed-forward 2x wide": wrong(_edit(_BLOCK, "4 * d_model", "2 * d_model", count=2), "4 * d_model"),
        "no dropout on the branches": wrong(_edit(_edit(
            _BLOCK, "self.drop_resid(self.att(self.norm1(x)))", "self.att(self.norm1(x))"),
            "self.drop_resid(self.ff(self.norm2(x)))", "self.ff(self.norm2(x))"), "branches have no dropout"),
        "norm1 before both branches": wrong(_edit(_BLOCK, "self.ff(self.norm2(x))", "self.ff(self.norm1(x))"),
                                            "norm1 is used before both branches"),
    },
    "TinyGPT": {
        "positions added after the blocks": wrong(_edit(_edit(
            _GPT, "x = self.pos_emb(self.tok_emb(idx))", "x = self.tok_emb(idx)"),
            "return self.out_head(self.final_norm(x))", "return self.out_head(self.final_norm(self.pos_emb(x)))"),
            "positions are added after the blocks"),
        "no final LayerNorm": wrong(_edit(_edit(
            _GPT, "        self.final_norm = nn.LayerNorm(d_model)\n", ""),
            "self.out_head(self.final_norm(x))", "self.out_head(x)"), "final LayerNorm is missing"),
        "softmax on the logits": wrong(_edit(
            _GPT, "return self.out_head(self.final_norm(x))", "return torch.softmax(self.out_head(self.final_norm(x)), dim=-1)"),
            "the logits are passed through a softmax"),
        "no dropout on the embeddings": wrong(_edit(_GPT, "self.blocks(self.drop_emb(x))", "self.blocks(x)"),
                                              "the embeddings get no dropout"),
        "head with a bias": wrong(_edit(_GPT, "nn.Linear(d_model, vocab_size, bias=False)",
                                        "nn.Linear(d_model, vocab_size)"), "bias=False"),
        "no positions at all": wrong(_edit(_GPT, "x = self.pos_emb(self.tok_emb(idx))", "x = self.tok_emb(idx)"),
                                     "no positions are added"),
    },
    "train_step": {
        "loss on the prompt positions too": wrong(_edit(
            _STEP, "F.cross_entropy(logits[answer_mask], targets[answer_mask])",
            "F.cross_entropy(logits.flatten(0, 1), targets.flatten())"), "every position"),
        "optimizer.zero_grad forgotten": wrong(_edit(_STEP, "    optimizer.zero_grad()\n", ""), "zero_grad"),
        "optimizer.step forgotten": wrong(_edit(_STEP, "    optimizer.step()\n", ""), "optimizer.step() is never called"),
        "zero_grad between backward and step": wrong(_edit(
            _STEP, "    optimizer.zero_grad()\n    loss.backward()\n", "    loss.backward()\n    optimizer.zero_grad()\n"),
            "BEFORE loss.backward()"),
        "summed loss": wrong(_edit(_STEP, "targets[answer_mask])", "targets[answer_mask], reduction='sum')"),
                             "take their mean"),
        "targets are the inputs": wrong(_edit(_STEP, "targets[answer_mask])", "inputs[answer_mask])"), "NEXT token"),
    },
}

RIGHT = {
    "sinusoidal_positions": {
        "exp and log, interleaved with stack": '''
def sinusoidal_positions(num_positions, d_model):
    if d_model % 2 == 1:
        raise ValueError(f"d_model={d_model} is odd")
    position = torch.arange(num_positions).float()[:, None]
    div = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    angles = position * div
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).reshape(num_positions, d_model)
''',
        "two loops with math": '''
def sinusoidal_positions(num_positions, d_model):
    if d_model % 2:
        raise ValueError("odd d_model")
    pe = torch.zeros(num_positions, d_model)
    for pos in range(num_positions):
        for i in range(0, d_model, 2):
            angle = pos / (10000 ** (i / d_model))
            pe[pos, i] = math.sin(angle)
            pe[pos, i + 1] = math.cos(angle)
    return pe
''',
    },
    "LearnedPositionalEmbedding": {
        "an nn.Parameter, sliced, with a ValueError": '''
class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, context_length, d_model):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(context_length, d_model))

    def forward(self, x):
        T = x.shape[1]
        if T > self.weight.shape[0]:
            raise ValueError(f"sequence of {T} tokens is longer than the {self.weight.shape[0]} positions")
        return x + self.weight[:T]
''',
        "embedding weight sliced, unsqueezed": '''
class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, context_length, d_model):
        super().__init__()
        self.context_length = context_length
        self.pos = nn.Embedding(context_length, d_model)

    def forward(self, x):
        b, T, d = x.shape
        assert T <= self.context_length, "too many tokens"
        return x + self.pos.weight[:T].unsqueeze(0)
''',
    },
    "TransformerBlock": {
        "attention with F.scaled_dot_product_attention": '''
class SDPAAttention(nn.Module):
    def __init__(self, d_model, context_length, dropout, num_heads):
        super().__init__()
        self.num_heads, self.head_dim, self.dropout = num_heads, d_model // num_heads, dropout
        self.W_query = nn.Linear(d_model, d_model, bias=False)
        self.W_key = nn.Linear(d_model, d_model, bias=False)
        self.W_value = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, T, d = x.shape
        q, k, v = (w(x).view(b, T, self.num_heads, self.head_dim).transpose(1, 2)
                   for w in (self.W_query, self.W_key, self.W_value))
        c = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.out_proj(c.transpose(1, 2).reshape(b, T, d))


class TransformerBlock(nn.Module):
    def __init__(self, d_model, num_heads, context_length, dropout):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.att = SDPAAttention(d_model, context_length, dropout, num_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.drop_resid = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop_resid(self.att(self.norm1(x)))
        return x + self.drop_resid(self.ff(self.norm2(x)))
''',
        "named layers, F.gelu, two dropout modules": '''
class TransformerBlock(nn.Module):
    def __init__(self, d_model, num_heads, context_length, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.att = MultiHeadAttention(d_in=d_model, d_out=d_model, context_length=context_length,
                                      dropout=dropout, num_heads=num_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)
        self.drop_1 = nn.Dropout(dropout)
        self.drop_2 = nn.Dropout(dropout)

    def forward(self, x):
        h = self.att(self.ln_1(x))
        x = x + self.drop_1(h)
        h = self.proj(F.gelu(self.fc(self.ln_2(x))))
        return x + self.drop_2(h)
''',
    },
    "TinyGPT": {
        "nn.Embedding for the positions": '''
class TinyGPT(nn.Module):
    def __init__(self, vocab_size, d_model, num_heads, num_layers, context_length, dropout):
        super().__init__()
        self.context_length = context_length
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)
        self.drop_emb = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[TransformerBlock(d_model, num_heads, context_length, dropout)
                                      for _ in range(num_layers)])
        self.final_norm = nn.LayerNorm(d_model)
        self.out_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx):
        b, T = idx.shape
        if T > self.context_length:
            raise ValueError("sequence too long")
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))
        return self.out_head(self.final_norm(self.blocks(self.drop_emb(x))))
''',
        "blocks in a ModuleList, looped": '''
class TinyGPT(nn.Module):
    def __init__(self, vocab_size, d_model, num_heads, num_layers, context_length, dropout):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = LearnedPositionalEmbedding(context_length, d_model)
        self.drop_emb = nn.Dropout(dropout)
        self.blocks = nn.ModuleList()
        for _ in range(num_layers):
            self.blocks.append(TransformerBlock(d_model, num_heads, context_length, dropout))
        self.final_norm = nn.LayerNorm(d_model)
        self.out_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx):
        h = self.drop_emb(self.pos_emb(self.tok_emb(idx)))
        for block in self.blocks:
            h = block(h)
        h = self.final_norm(h)
        return self.out_head(h)
''',
    },
    "train_step": {
        "targets masked with ignore_index": '''
def train_step(model, batch, optimizer):
    inputs, targets, answer_mask = batch
    optimizer.zero_grad(set_to_none=True)
    logits = model(inputs)
    masked_targets = targets.masked_fill(~answer_mask, -100)
    loss = F.cross_entropy(logits.transpose(1, 2), masked_targets, ignore_index=-100)
    loss.backward()
    optimizer.step()
    return loss
''',
        "per-token losses averaged, zero_grad at the end": '''
def train_step(model, batch, optimizer):
    inputs, targets, answer_mask = batch
    losses = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), reduction="none")
    loss = losses[answer_mask.flatten()].mean()
    loss.backward()
    optimizer.step()
    model.zero_grad()
    return float(loss.detach())
''',
    },
}
