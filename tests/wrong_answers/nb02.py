"""Answers for notebook 02 (softmax and context vectors). See the package docstring for the format.

Most wrong answers are a correct base answer (``_NAIVE``, ``_STABLE``, ``_CONTEXT``) with one
change made by ``_edit``, so each reads as "the correct answer, except this line". Each states the
words that its failure message must contain: the mistake, named.
"""

from tests.wrong_answers import edit as _edit
from tests.wrong_answers import wrong

# A correct softmax_naive.
_NAIVE = '''
def softmax_naive(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)
'''

# A correct softmax_stable.
_STABLE = '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)
'''

# The same with the positional dim and x.max(...).values (a RIGHT answer for both exercises).
_STABLE_MAX_VALUES = _edit(
    _edit(_STABLE, "x.amax(dim=dim, keepdim=True)", "x.max(dim, keepdim=True).values"),
    "e.sum(dim=dim, keepdim=True)",
    "e.sum(dim, keepdim=True)",
)

# A correct context_vectors.
_CONTEXT = '''
def context_vectors(inputs):
    scores = inputs @ inputs.transpose(-2, -1)
    return torch.softmax(scores, dim=-1) @ inputs
'''

WRONG = {
    "softmax_naive": {
        "library softmax": wrong('''
def softmax_naive(x, dim=-1):
    return torch.softmax(x, dim=dim)
''', "a library softmax skips the point"),
        "divides the scores by their sum, no exp": wrong('''
def softmax_naive(x, dim=-1):
    return x / x.sum(dim=dim, keepdim=True)
''', "exp is missing"),
        "sums over dim=0 whatever dim says (the book's 1-D version)": wrong('''
def softmax_naive(x, dim=-1):
    return torch.exp(x) / torch.exp(x).sum(dim=0)
''', "runs over dim=0 whatever the `dim` argument says"),
        "forgets keepdim, so the sums broadcast along the wrong axis": wrong(_edit(
            _NAIVE, "e.sum(dim=dim, keepdim=True)", "e.sum(dim=dim)"), "without keepdim=True"),
        "normalises over the whole tensor": wrong(
            _edit(_NAIVE, "e.sum(dim=dim, keepdim=True)", "e.sum()"), "the whole tensor sums to 1"),
        "divides by the largest exp instead of the sum": wrong(_edit(
            _NAIVE, "e.sum(dim=dim, keepdim=True)", "e.amax(dim=dim, keepdim=True)"), "divided by its largest entry"),
        "divides exp(x) by the sum of x": wrong(_edit(
            _NAIVE, "e / e.sum(dim=dim, keepdim=True)", "e / x.sum(dim=dim, keepdim=True)"), "not by the sum of x"),
        "forgets to normalise": wrong(_edit(_NAIVE, "e / e.sum(dim=dim, keepdim=True)", "e"), "was not normalised"),
        "always normalises the last dimension": wrong(_edit(_NAIVE, "dim=dim", "dim=-1"),
                                                     "along the last dimension whatever the `dim` argument says"),
    },
    "softmax_stable": {
        "no max subtraction (overflows on 1000s)": wrong(_edit(
            _STABLE, "torch.exp(x - x.amax(dim=dim, keepdim=True))", "torch.exp(x)"), "exp overflowed"),
        "library softmax": wrong('''
def softmax_stable(x, dim=-1):
    return torch.nn.functional.softmax(x, dim=dim)
''', "a library softmax skips the point"),
        "max without keepdim broadcasts along the wrong axis": wrong(_edit(
            _STABLE, "x.amax(dim=dim, keepdim=True)", "x.max(dim=dim).values"), "the maximum lost its dimension"),
        "subtracts the max of the whole tensor (underflows rows far below it)": wrong(_edit(
            _STABLE, "x.amax(dim=dim, keepdim=True)", "x.max()"),
            "The maximum of the whole tensor is not enough"),
        "subtracts the mean instead of the max": wrong(_edit(
            _STABLE, "x.amax(dim=dim, keepdim=True)", "x.mean(dim=dim, keepdim=True)"), "not the mean or the minimum"),
        "subtracts the min instead of the max": wrong(_edit(
            _STABLE, "x.amax(dim=dim, keepdim=True)", "x.amin(dim=dim, keepdim=True)"), "not the mean or the minimum"),
        "clamps the scores instead of shifting them": wrong(_edit(
            _STABLE, "torch.exp(x - x.amax(dim=dim, keepdim=True))", "torch.exp(x.clamp(max=80.0))"),
            "clamping the scores changes the result"),
        "always normalises the last dimension": wrong(_edit(_STABLE, "dim=dim", "dim=-1", count=2),
                                                     "along the last dimension whatever the `dim` argument says"),
        "replaces -inf by a large negative number, then forgets the max": wrong(_edit(
            _STABLE,
            "    e = torch.exp(x - x.amax(dim=dim, keepdim=True))\n",
            "    x = torch.nan_to_num(x, neginf=-1e4)\n"
            "    e = torch.exp(x)\n",
        ), "exp overflowed"),
        "shifts the numerator only": wrong(_edit(
            _STABLE, "e / e.sum(dim=dim, keepdim=True)", "e / torch.exp(x).sum(dim=dim, keepdim=True)"),
            "only the numerator was shifted"),
        "takes the max along the last dimension only": wrong(_edit(
            _STABLE, "x.amax(dim=dim, keepdim=True)", "x.amax(dim=-1, keepdim=True)"),
            "the maximum is taken along the last dimension whatever `dim` says"),
    },
    "context_vectors": {
        "softmax over dim=0": wrong(_edit(_CONTEXT, "dim=-1", "dim=0"), "the softmax ran over the queries' dimension"),
        "no softmax: raw scores as weights": wrong('''
def context_vectors(inputs):
    return (inputs @ inputs.transpose(-2, -1)) @ inputs
''', "no softmax"),
        "sum-normalised weights": wrong(_edit(
            _CONTEXT, "torch.softmax(scores, dim=-1)", "(scores / scores.sum(dim=-1, keepdim=True))"),
            "divided by their sum instead of softmaxed"),
        "uses .T, which breaks batches": wrong('''
def context_vectors(inputs):
    return torch.softmax(inputs @ inputs.T, dim=-1) @ inputs
''', "`.T` reverses every dimension"),
        "uses softmax_naive, which overflows on large inputs": wrong(
            _edit(_CONTEXT, "torch.softmax(", "softmax_naive("), "not softmax_naive"),
        "scales by sqrt(d) (that is notebook 03)": wrong(_edit(
            _CONTEXT, "inputs.transpose(-2, -1)\n", "inputs.transpose(-2, -1) / inputs.shape[-1] ** 0.5\n"),
            "divided by sqrt(d)"),
        "returns the weights, not the context vectors": wrong('''
def context_vectors(inputs):
    return torch.softmax(inputs @ inputs.transpose(-2, -1), dim=-1)
''', "these are the attention weights"),
        "weights softmaxed over the batch-unaware dim=1": wrong(
            _edit(_CONTEXT, "dim=-1", "dim=1"), "the softmax ran over the queries' dimension"),
        "softmax too early: on the inputs, before the dot products": wrong('''
def context_vectors(inputs):
    weights = torch.softmax(inputs, dim=-1) @ inputs.transpose(-2, -1)
    return weights @ inputs
''', "the softmax came too early"),
        "scores of the features, inputs^T @ inputs": wrong('''
def context_vectors(inputs):
    weights = torch.softmax(inputs.transpose(-2, -1) @ inputs, dim=-1)
    return inputs @ weights
''', "the scores compare features"),
        "softmax applied twice": wrong(
            _edit(_CONTEXT, "torch.softmax(scores, dim=-1)", "torch.softmax(torch.softmax(scores, dim=-1), dim=-1)"),
            "the softmax was applied twice"),
        "divides by d instead of nothing": wrong(_edit(
            _CONTEXT, "inputs.transpose(-2, -1)\n", "inputs.transpose(-2, -1) / inputs.shape[-1]\n"),
            "divided by d before the softmax"),
        "matrix product with torch.mm, which is 2-D only": wrong('''
def context_vectors(inputs):
    weights = torch.softmax(torch.mm(inputs, inputs.transpose(-2, -1)), dim=-1)
    return torch.mm(weights, inputs)
''', "breaks on a batched input"),
    },
}

RIGHT = {
    "softmax_naive": {
        "max subtraction is fine here too": _edit(_STABLE_MAX_VALUES, "def softmax_stable(", "def softmax_naive("),
        "torch.sum and division by unsqueeze": '''
def softmax_naive(x, dim=-1):
    e = x.exp()
    return e / torch.sum(e, dim=dim).unsqueeze(dim)
''',
        "loop over the slices with movedim": '''
def softmax_naive(x, dim=-1):
    moved = torch.movedim(x, dim, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    rows = [torch.exp(row) / torch.exp(row).sum() for row in flat]
    out = torch.stack(rows).reshape(moved.shape)
    return torch.movedim(out, -1, dim)
''',
    },
    "softmax_stable": {
        "x.max(dim, keepdim=True).values": _STABLE_MAX_VALUES,
        "logsumexp": '''
def softmax_stable(x, dim=-1):
    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))
''',
        "max detached, with an explicit guard for all -inf slices": '''
def softmax_stable(x, dim=-1):
    m = x.detach().amax(dim=dim, keepdim=True)
    m = torch.nan_to_num(m, neginf=0.0)
    e = (x - m).exp()
    return e / e.sum(dim=dim, keepdim=True)
''',
        "reuses softmax_naive on the shifted scores": '''
def softmax_stable(x, dim=-1):
    return softmax_naive(x - x.amax(dim=dim, keepdim=True), dim=dim)
''',
    },
    "context_vectors": {
        "einsum": '''
def context_vectors(inputs):
    scores = torch.einsum("...id,...jd->...ij", inputs, inputs)
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("...ij,...jd->...id", weights, inputs)
''',
        "own softmax_stable and mT": '''
def context_vectors(inputs):
    return softmax_stable(inputs @ inputs.mT, dim=-1) @ inputs
''',
        "torch.matmul with swapaxes and F.softmax": '''
def context_vectors(inputs):
    import torch.nn.functional as F
    weights = F.softmax(torch.matmul(inputs, inputs.swapaxes(-1, -2)), dim=-1)
    return torch.matmul(weights, inputs)
''',
    },
}
