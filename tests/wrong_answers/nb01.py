"""Answers for notebook 01 (dot products). See the package docstring for the format."""

from tests.wrong_answers import wrong

WRONG = {
    "dot": {
        "library call instead of a loop": wrong('''
def dot(x, y):
    return torch.dot(x, y)
''', 'torch.dot'),
        "loop stops one short": wrong('''
def dot(x, y):
    total = torch.tensor(0.0)
    for i in range(len(x) - 1):
        total = total + x[i] * y[i]
    return total
''', 'stops one entry early'),
        "adds instead of multiplying": wrong('''
def dot(x, y):
    total = torch.tensor(0.0)
    for i in range(len(x)):
        total = total + x[i] + y[i]
    return total
''', 'not of their products'),
        "returns the elementwise products, not their sum": wrong('''
def dot(x, y):
    out = torch.empty_like(x)
    for i in range(len(x)):
        out[i] = x[i] * y[i]
    return out
''', 'expected shape ()'),
    },
    "attention_scores_for_query": {
        "scores against the first token, not the query": wrong('''
def attention_scores_for_query(inputs, query):
    return inputs @ inputs[0]
''', 'not against `query`'),
        "transposed product gives (d,) instead of (T,)": wrong('''
def attention_scores_for_query(inputs, query):
    return query @ inputs.T @ inputs
''', 'expected shape'),
        "cosine similarity instead of dot product": wrong('''
def attention_scores_for_query(inputs, query):
    return (inputs @ query) / (inputs.norm(dim=-1) * query.norm())
''', 'cosine similarity'),
        "hard-coded for the book's six tokens": wrong('''
def attention_scores_for_query(inputs, query):
    scores = torch.empty(6)
    for i in range(6):
        scores[i] = torch.dot(inputs[i], query)
    return scores
''', 'fixed number of tokens'),
    },
    "attention_scores": {
        "uses .T, which breaks batches": wrong('''
def attention_scores(inputs):
    return inputs @ inputs.T
''', 'transpose(-2, -1)'),
        "Gram matrix of the features (d, d)": wrong('''
def attention_scores(inputs):
    return inputs.transpose(-2, -1) @ inputs
''', 'expected shape'),
        "elementwise square instead of a matrix product": wrong('''
def attention_scores(inputs):
    return (inputs * inputs).sum(-1, keepdim=True).expand(*inputs.shape[:-1], inputs.shape[-2])
''', 'values differ'),
        "only handles exactly one batch dimension": wrong('''
def attention_scores(inputs):
    return torch.bmm(inputs, inputs.transpose(1, 2))
''', 'your code raised'),
    },
}

RIGHT = {
    "dot": {
        "while loop over python floats": '''
def dot(x, y):
    total = 0.0
    i = 0
    while i < len(x):
        total += float(x[i]) * float(y[i])
        i += 1
    return torch.tensor(total)
''',
        "zip and sum over a generator": '''
def dot(x, y):
    return sum((a * b for a, b in zip(x, y)), torch.tensor(0.0))
''',
    },
    "attention_scores_for_query": {
        "explicit loop": '''
def attention_scores_for_query(inputs, query):
    scores = torch.empty(inputs.shape[0])
    for i, x_i in enumerate(inputs):
        scores[i] = torch.dot(x_i, query)
    return scores
''',
        "einsum": '''
def attention_scores_for_query(inputs, query):
    return torch.einsum("td,d->t", inputs, query)
''',
        "broadcast multiply and sum": '''
def attention_scores_for_query(inputs, query):
    return (inputs * query).sum(dim=-1)
''',
    },
    "attention_scores": {
        "einsum with an ellipsis": '''
def attention_scores(inputs):
    return torch.einsum("...id,...jd->...ij", inputs, inputs)
''',
        "mT": '''
def attention_scores(inputs):
    return inputs @ inputs.mT
''',
        "torch.matmul with swapaxes": '''
def attention_scores(inputs):
    return torch.matmul(inputs, inputs.swapaxes(-1, -2))
''',
        "correct, but torch prints a UserWarning (stderr must not cost points)": '''
def attention_scores(inputs):
    x = torch.tensor(inputs)  # torch warns "To copy construct from a tensor, use clone()"
    return x @ x.transpose(-2, -1)
''',
    },
}
