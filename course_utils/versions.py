"""Which PyTorch each notebook needs, and one clear line when the installed one is older.

The floors are the versions in which the APIs the notebooks and their checks call first appeared
(:data:`API_FLOORS`); ``tests/release/test_versions.py`` reads the student notebooks and the student
package for those APIs and checks that every notebook's floor covers what it uses, and that
``pyproject.toml`` declares the highest floor. The course itself is tested with the exact versions in
``constraints.txt``.
"""

from __future__ import annotations

import functools

import torch
from torch.torch_version import TorchVersion

#: API (as written in the code) -> the first PyTorch release that has it.
API_FLOORS: dict[str, str] = {
    "torch.unravel_index": "2.2",  # the checks: where the largest error is
    "sdpa_kernel": "2.3",  # notebook 06: choosing SDPA's backend
    "causal_lower_right": "2.3",  # notebook 08: the decoding mask as SDPA's attn_mask
    "enable_gqa": "2.5",  # notebook 08: grouped-query attention inside SDPA
    "flex_attention": "2.5",  # notebooks 06 and 08: FlexAttention
}

#: The PyTorch every notebook needs at least.
TORCH_FLOOR = "2.3"

#: Notebooks that need more than :data:`TORCH_FLOOR`: name -> (version, what for).
NEEDS: dict[str, tuple[str, str]] = {
    "06_efficient_attention_gpu": ("2.5", "FlexAttention"),
    "08_kv_cache_gqa_and_windows": ("2.5", "SDPA's enable_gqa and FlexAttention"),
}


#: What the PyTorch that recorded ``course_utils/expected/`` (the version in ``constraints.txt``) draws
#: from a seed: :func:`random_streams` there. ``tests/release/test_recordings.py`` checks it.
RECORDED_RANDOM_STREAMS = {
    "dropout": "0x1cbdbc90857c43",
    "sampling": "6507552767473673455477715064653772774775657074756075634266477657",
}


@functools.lru_cache(maxsize=1)
def random_streams() -> dict[str, str]:
    """What this PyTorch draws right after ``torch.manual_seed(7)``, for each kind of random output the
    checks record: ``dropout`` (which of 64 ones ``F.dropout(p=0.5)`` keeps, as a hex number) and
    ``sampling`` (64 draws of ``torch.multinomial(probs, 1)``, as digits).

    PyTorch releases draw differently from the same seed (2.5 and 2.13 do, for both), so outputs with
    dropout or sampling recorded with one release cannot be matched with another. The global random
    state is left as it was. Computed once per process (a check asks on every module comparison).
    """
    import torch.nn.functional as F

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        kept = F.dropout(torch.ones(64), 0.5, training=True) > 0  # (64,)
        torch.manual_seed(7)
        probs = torch.softmax(torch.arange(8.0) / 4, dim=-1).repeat(64, 1)  # (64, 8)
        drawn = torch.multinomial(probs, 1)  # (64, 1)
    return {"dropout": hex(sum(int(bit) << i for i, bit in enumerate(kept.tolist()))),
            "sampling": "".join(str(i) for i in drawn.flatten().tolist())}


def same_random_stream(kind: str) -> bool:
    """Whether this PyTorch draws ``kind`` (``dropout`` or ``sampling``) as the one that recorded the
    expectations did."""
    return random_streams()[kind] == RECORDED_RANDOM_STREAMS[kind]


def torch_needed(notebook: str) -> tuple[str, str]:
    """``(version, what for)``: the oldest PyTorch ``notebook`` runs on."""
    return NEEDS.get(notebook, (TORCH_FLOOR, "torch.nn.attention.sdpa_kernel and the checks"))


def require(notebook: str, installed: str | None = None) -> str | None:
    """Print one line, and return it, when the installed PyTorch is older than ``notebook`` needs.

    ``installed`` defaults to ``torch.__version__``; nothing is printed when it is new enough.
    """
    version, why = torch_needed(notebook)
    have = TorchVersion(installed or torch.__version__)
    if have >= version:
        return None
    line = (f"⚠️ This notebook needs PyTorch {version} or newer ({why}); this kernel has {have}. "
            f"Run `pip install -U \"torch>={version}\"`, then restart the kernel.")
    print(line)
    return line
