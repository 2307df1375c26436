"""Answers for notebook 02 (softmax and context vectors). See the package docstring for the format."""

WRONG = {
    "softmax_naive": {
        "library softmax": '''
def softmax_naive(x, dim=-1):
    return torch.softmax(x, dim=dim)
''',
        "divides the scores by their sum, no exp": '''
def softmax_naive(x, dim=-1):
    return x / x.sum(dim=dim, keepdim=True)
''',
        "sums over dim=0 whatever dim says (the book's 1-D version)": '''
def softmax_naive(x, dim=-1):
    return torch.exp(x) / torch.exp(x).sum(dim=0)
''',
        "forgets keepdim, so the sums broadcast along the wrong axis": '''
def softmax_naive(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim=dim)
''',
        "normalises over the whole tensor": '''
def softmax_naive(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum()
''',
        "divides by the largest exp instead of the sum": '''
def softmax_naive(x, dim=-1):
    e = torch.exp(x)
    return e / e.amax(dim=dim, keepdim=True)
''',
    },
    "softmax_stable": {
        "no max subtraction (overflows on 1000s)": '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)
''',
        "library softmax": '''
def softmax_stable(x, dim=-1):
    return torch.nn.functional.softmax(x, dim=dim)
''',
        "max without keepdim broadcasts along the wrong axis": '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x - x.max(dim=dim).values)
    return e / e.sum(dim=dim, keepdim=True)
''',
        "subtracts the max of the whole tensor (underflows rows far below it)": '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(dim=dim, keepdim=True)
''',
        "subtracts the mean instead of the max": '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x - x.mean(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)
''',
        "subtracts the min instead of the max": '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x - x.amin(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)
''',
        "clamps the scores instead of shifting them": '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x.clamp(max=80.0))
    return e / e.sum(dim=dim, keepdim=True)
''',
        "always normalises the last dimension": '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)
''',
        "replaces -inf by a large negative number, then forgets the max": '''
def softmax_stable(x, dim=-1):
    x = torch.nan_to_num(x, neginf=-1e4)
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)
''',
    },
    "context_vectors": {
        "softmax over dim=0": '''
def context_vectors(inputs):
    scores = inputs @ inputs.transpose(-2, -1)
    return torch.softmax(scores, dim=0) @ inputs
''',
        "no softmax: raw scores as weights": '''
def context_vectors(inputs):
    return (inputs @ inputs.transpose(-2, -1)) @ inputs
''',
        "sum-normalised weights": '''
def context_vectors(inputs):
    scores = inputs @ inputs.transpose(-2, -1)
    return (scores / scores.sum(dim=-1, keepdim=True)) @ inputs
''',
        "uses .T, which breaks batches": '''
def context_vectors(inputs):
    return torch.softmax(inputs @ inputs.T, dim=-1) @ inputs
''',
        "uses softmax_naive, which overflows on large inputs": '''
def context_vectors(inputs):
    scores = inputs @ inputs.transpose(-2, -1)
    return softmax_naive(scores, dim=-1) @ inputs
''',
        "scales by sqrt(d) (that is notebook 03)": '''
def context_vectors(inputs):
    scores = inputs @ inputs.transpose(-2, -1) / inputs.shape[-1] ** 0.5
    return torch.softmax(scores, dim=-1) @ inputs
''',
        "returns the weights, not the context vectors": '''
def context_vectors(inputs):
    return torch.softmax(inputs @ inputs.transpose(-2, -1), dim=-1)
''',
        "weights softmaxed over the batch-unaware dim=1": '''
def context_vectors(inputs):
    scores = inputs @ inputs.transpose(-2, -1)
    return torch.softmax(scores, dim=1) @ inputs
''',
    },
}

RIGHT = {
    "softmax_naive": {
        "max subtraction is fine here too": '''
def softmax_naive(x, dim=-1):
    e = torch.exp(x - x.max(dim, keepdim=True).values)
    return e / e.sum(dim, keepdim=True)
''',
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
        "x.max(dim, keepdim=True).values": '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x - x.max(dim, keepdim=True).values)
    return e / e.sum(dim, keepdim=True)
''',
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
