"""Answers for notebook 07 (FlashAttention from scratch). See the package docstring for the format.

Most wrong answers are a correct base answer (``_OS``, ``_FA``, ``_KERNEL``) with one change made
by ``_edit``, so each reads as "the base answer, except this line".
"""

from tests.wrong_answers import edit as _edit
from tests.wrong_answers import wrong

# ------------------------------------------------------------------------------------------
# online_softmax
# ------------------------------------------------------------------------------------------
_OS = '''
def online_softmax(x, block_size):
    m = torch.full(x.shape[:-1] + (1,), float("-inf"), dtype=x.dtype)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        l = l * torch.exp(m - shift) + torch.exp(block - shift).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l
'''
_OS_UPDATE = "        l = l * torch.exp(m - shift) + torch.exp(block - shift).sum(dim=-1, keepdim=True)\n"

# ------------------------------------------------------------------------------------------
# flash_attention_forward
# ------------------------------------------------------------------------------------------
_FA = '''
def flash_attention_forward(q, k, v, block_q, block_k, causal=True):
    T, D = q.shape[-2], q.shape[-1]
    out = torch.empty_like(q)
    lse = q.new_empty(q.shape[:-1])
    for qs in range(0, T, block_q):
        qe = min(qs + block_q, T)
        qb = q[..., qs:qe, :] / math.sqrt(D)
        m = torch.full(qb.shape[:-1], float("-inf"), dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qb)
        for ks in range(0, qe if causal else T, block_k):
            ke = min(ks + block_k, T)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[..., None])
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v[..., ks:ke, :]
            m = m_new
        out[..., qs:qe, :] = acc / l[..., None]
        lse[..., qs:qe] = m + torch.log(l)
    return out, lse
'''
_FA_L = "            l = alpha * l + p.sum(dim=-1)\n"
_FA_ACC = "            acc = alpha[..., None] * acc + p @ v[..., ks:ke, :]\n"

# ------------------------------------------------------------------------------------------
# flash_attention_triton
# ------------------------------------------------------------------------------------------
_KERNEL_HEAD = '''
@triton.jit
def flash_attention_triton(Q, K, V, O, LSE, stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
                           stride_ob, stride_ot, T, scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + bh * stride_qb + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=offs_m[:, None] < T, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    hi = (start_m + 1) * BLOCK_M if CAUSAL else T
    for start_n in range(0, hi, BLOCK_N):
'''
_KERNEL_TAIL = '''    acc = acc / l_i[:, None]
    tl.store(O + bh * stride_ob + offs_m[:, None] * stride_ot + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=offs_m[:, None] < T)
    tl.store(LSE + bh * T + offs_m, m_i + tl.log(l_i), mask=offs_m < T)
'''
_LOOP = '''        cols = start_n + offs_n
        k = tl.load(K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :], mask=cols[:, None] < T, other=0.0)
        v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :], mask=cols[:, None] < T, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = cols[None, :] < T
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
'''


def _kernel(loop: str) -> str:
    """The notebook's kernel with ``loop`` as the body of the loop over key blocks."""
    return _KERNEL_HEAD + loop + _KERNEL_TAIL


WRONG = {
    "online_softmax": {
        "the running sum is not rescaled when the maximum grows": wrong(
            _edit(_OS, "l * torch.exp(m - shift) + ", "l + "), "not rescaled"),
        "rescaled by exp(m_new - m_old), the inverse": wrong(_edit(
            _OS, _OS_UPDATE,
            "        alpha = torch.exp(shift - m) if start > 0 else torch.ones_like(m)\n"
            "        l = l * alpha + torch.exp(block - shift).sum(dim=-1, keepdim=True)\n"), "the inverse"),
        "each block normalised by its own sum": wrong('''
def online_softmax(x, block_size):
    parts = []
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        e = torch.exp(block - block.amax(dim=-1, keepdim=True))
        parts.append(e / e.sum(dim=-1, keepdim=True))
    return torch.cat(parts, dim=-1)
''', "normalised by its own sum"),
        "no maximum subtracted: exp overflows on large scores": wrong('''
def online_softmax(x, block_size):
    l = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        l = l + torch.exp(x[..., start:start + block_size]).sum(dim=-1, keepdim=True)
    return torch.exp(x) / l
''', "no maximum is subtracted"),
        "NaN when a row's first block is all -inf": wrong(
            _edit(_OS, "torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)", "m_new"),
            "first block is all -inf"),
        "the maximum of the whole row taken at once": wrong('''
def online_softmax(x, block_size):
    m = x.amax(dim=-1, keepdim=True)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], block_size):
        l = l + torch.exp(x[..., start:start + block_size] - m).sum(dim=-1, keepdim=True)
    return torch.exp(x - m) / l
''', "reduced a whole row"),
        "a library softmax": wrong('''
def online_softmax(x, block_size):
    for start in range(0, x.shape[-1], block_size):
        pass
    return torch.softmax(x, dim=-1)
''', "does not allow"),
    },
    "flash_attention_forward": {
        "tiled, but the rescaling forgotten": wrong(
            _edit(_edit(_FA, _FA_L, "            l = l + p.sum(dim=-1)\n"), _FA_ACC,
                  "            acc = acc + p @ v[..., ks:ke, :]\n"), "rescaling is forgotten"),
        "acc not rescaled": wrong(_edit(_FA, _FA_ACC, "            acc = acc + p @ v[..., ks:ke, :]\n"),
                                  "acc is not rescaled"),
        "l not rescaled": wrong(_edit(_FA, _FA_L, "            l = l + p.sum(dim=-1)\n"), "l is not rescaled"),
        "full score matrix built": wrong('''
def flash_attention_forward(q, k, v, block_q, block_k, causal=True):
    T, D = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-2, -1) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.arange(T)[None, :] > torch.arange(T)[:, None], float("-inf"))
    out = torch.empty_like(q)
    lse = q.new_empty(q.shape[:-1])
    for qs in range(0, T, block_q):
        rows = s[..., qs:qs + block_q, :]
        m = rows.amax(dim=-1, keepdim=True)
        p = torch.exp(rows - m)
        l = p.sum(dim=-1, keepdim=True)
        out[..., qs:qs + block_q, :] = (p @ v) / l
        lse[..., qs:qs + block_q] = (m + torch.log(l))[..., 0]
    return out, lse
''', "full score matrix"),
        "a (T, T) causal mask built up front": wrong(_edit(
            _edit(_FA, "    out = torch.empty_like(q)\n",
                  "    future = torch.ones(T, T, dtype=torch.bool).triu(1)\n    out = torch.empty_like(q)\n"),
            "s.masked_fill(torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None], float(\"-inf\"))",
            "s.masked_fill(future[qs:qe, ks:ke], float(\"-inf\"))"), "a mask"),
        "causal tiles computed and masked, not skipped": wrong(
            _edit(_FA, "range(0, qe if causal else T, block_k)", "range(0, T, block_k)"), "no key block was skipped"),
        "diagonal tile not masked": wrong(_edit(
            _FA, "            if causal:\n                s = s.masked_fill(torch.arange(ks, ke)[None, :] > "
                 "torch.arange(qs, qe)[:, None], float(\"-inf\"))\n", ""), "not masked"),
        "lse without the maximum": wrong(_edit(_FA, "m + torch.log(l)", "torch.log(l)"), "m + log(l)"),
        "scores not scaled": wrong(_edit(_FA, "q[..., qs:qe, :] / math.sqrt(D)", "q[..., qs:qe, :]"), "not scaled"),
        "SDPA called inside a loop": wrong('''
def flash_attention_forward(q, k, v, block_q, block_k, causal=True):
    for _ in range(1):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return out, out.sum(-1)
''', "does not allow"),
    },
    "flash_attention_triton": {
        "tiled, but the rescaling forgotten": wrong(_kernel(_edit(_edit(
            _LOOP, "l_i = l_i * alpha + tl.sum(p, 1)", "l_i = l_i + tl.sum(p, 1)"),
            "acc = acc * alpha[:, None] + tl.dot", "acc = acc + tl.dot")), "rescaling is forgotten"),
        "acc not rescaled": wrong(_kernel(_edit(_LOOP, "acc = acc * alpha[:, None] + tl.dot", "acc = acc + tl.dot")),
                                  "acc is not rescaled"),
        "no causal mask inside the diagonal tile": wrong(_kernel(_edit(
            _LOOP, "        if CAUSAL:\n            keep = keep & (cols[None, :] <= offs_m[:, None])\n", "")),
            "not masked"),
        "scores not scaled": wrong(_kernel(_edit(_LOOP, "tl.dot(q, tl.trans(k)) * scale", "tl.dot(q, tl.trans(k))")),
                                   "not scaled"),
        "the exercise left as it was": wrong(_kernel("        # YOUR CODE HERE\n        raise NotImplementedError()\n"),
                                             "not implemented"),
    },
}

RIGHT = {
    "online_softmax": {
        "split into blocks, torch.max and a masked shift": '''
def online_softmax(x, block_size):
    m = x.new_full(x.shape[:-1] + (1,), float("-inf"))
    l = x.new_zeros(x.shape[:-1] + (1,))
    for block in x.split(block_size, dim=-1):
        m_new = torch.max(m, block.max(dim=-1, keepdim=True).values)
        safe = m_new.masked_fill(m_new == float("-inf"), 0.0)
        alpha = torch.exp(m - safe)
        l = alpha * l + torch.exp(block - safe).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l
''',
        "statistics without keepdim, one while loop": '''
def online_softmax(x, block_size):
    n = x.shape[-1]
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)
    l = torch.zeros_like(m)
    start = 0
    while start < n:
        block = x[..., start:start + block_size]
        m_new = torch.maximum(m, torch.amax(block, dim=-1))
        shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        l = l * torch.exp(m - shift) + torch.exp(block - shift[..., None]).sum(-1)
        m = m_new
        start += block_size
    return torch.exp(x - m[..., None]) / l[..., None]
''',
    },
    "flash_attention_forward": {
        "FlashAttention-1 order: key blocks outside, query blocks inside": '''
def flash_attention_forward(q, k, v, block_q, block_k, causal=True):
    T, D = q.shape[-2], q.shape[-1]
    scale = D ** -0.5
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros_like(q)
    for ks in range(0, T, block_k):
        ke = min(ks + block_k, T)
        kb, vb = k[..., ks:ke, :], v[..., ks:ke, :]
        first_q = (ks // block_q) * block_q if causal else 0
        for qs in range(first_q, T, block_q):
            qe = min(qs + block_q, T)
            s = torch.einsum("...qd,...kd->...qk", q[..., qs:qe, :] * scale, kb)
            if causal:
                s = torch.where(torch.arange(ks, ke) <= torch.arange(qs, qe)[:, None], s, float("-inf"))
            m_old = m[..., qs:qe]
            m_new = torch.maximum(m_old, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m_old - safe)
            p = torch.exp(s - safe[..., None])
            l[..., qs:qe] = alpha * l[..., qs:qe] + p.sum(-1)
            acc[..., qs:qe, :] = alpha[..., None] * acc[..., qs:qe, :] + p @ vb
            m[..., qs:qe] = m_new
    return acc / l[..., None], m + l.log()
''',
        "blocks collected in lists and concatenated": '''
def flash_attention_forward(q, k, v, block_q, block_k, causal=True):
    T = q.shape[-2]
    outs, lses = [], []
    for q_blk_start in range(0, T, block_q):
        q_blk = q[..., q_blk_start:q_blk_start + block_q, :] * q.shape[-1] ** -0.5
        rows = torch.arange(q_blk_start, q_blk_start + q_blk.shape[-2])
        last_key = rows[-1].item() + 1 if causal else T
        m = None
        for k_blk_start in range(0, last_key, block_k):
            cols = torch.arange(k_blk_start, min(k_blk_start + block_k, T))
            s = q_blk @ k[..., cols, :].mT
            if causal and cols[-1] > rows[0]:
                s = s.masked_fill(cols[None, :] > rows[:, None], -math.inf)
            if m is None:
                m = s.amax(-1)
                p = (s - m[..., None]).exp()
                l, acc = p.sum(-1), p @ v[..., cols, :]
            else:
                m_new = torch.maximum(m, s.amax(-1))
                p = (s - m_new[..., None]).exp()
                alpha = (m - m_new).exp()
                l = l * alpha + p.sum(-1)
                acc = acc * alpha[..., None] + p @ v[..., cols, :]
                m = m_new
        outs.append(acc / l[..., None])
        lses.append(m + l.log())
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)
''',
    },
    "flash_attention_triton": {
        "exp2 with log2(e), and the causal mask as its own where": _kernel('''        cols = start_n + offs_n
        in_range = cols < T
        k = tl.load(K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :], mask=in_range[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(in_range[None, :], s, float("-inf"))
        if CAUSAL:
            s = tl.where(cols[None, :] > offs_m[:, None], float("-inf"), s)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        log2e = 1.4426950408889634
        alpha = tl.exp2((m_i - m_new) * log2e)
        p = tl.exp2((s - m_new[:, None]) * log2e)
        v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :], mask=in_range[:, None], other=0.0)
        acc = acc * alpha[:, None]
        acc += tl.dot(p.to(v.dtype), v)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
'''),
        "pointer blocks built once, scale folded into q": _kernel('''        key_pos = start_n + offs_n
        k_ptrs = K + bh * stride_kb + key_pos[:, None] * stride_kt + offs_d[None, :]
        v_ptrs = V + bh * stride_vb + key_pos[:, None] * stride_vt + offs_d[None, :]
        valid = key_pos[:, None] < T
        k = tl.load(k_ptrs, mask=valid, other=0.0)
        v = tl.load(v_ptrs, mask=valid, other=0.0)
        s = tl.dot(q * scale, tl.trans(k))
        ok = key_pos[None, :] < T
        if CAUSAL:
            ok = ok & (offs_m[:, None] >= key_pos[None, :])
        s = tl.where(ok, s, float("-inf"))
        row_max = tl.max(s, 1)
        m_new = tl.where(row_max > m_i, row_max, m_i)
        p = tl.exp(s - m_new[:, None])
        correction = tl.exp(m_i - m_new)
        l_i = correction * l_i + tl.sum(p, 1)
        acc = correction[:, None] * acc + tl.dot(p, v)
        m_i = m_new
'''),
    },
}
