"""Where things are: the repository's folders and the course's notebooks, in order."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from pathlib import Path

#: The course's notebooks (file stems), as fixed by the contract in docs/design.md. Each is one nbgrader assignment.
NOTEBOOKS: tuple[str, ...] = (
    "01_dot_products",
    "02_softmax_and_context",
    "03_trainable_self_attention",
    "04_causal_attention",
    "05_multi_head_attention",
    "06_efficient_attention_gpu",
    "07_flash_attention_from_scratch",
    "08_kv_cache_gqa_and_windows",
    "09_capstone_tiny_transformer",
    "10_flash_attention_backward",
    "11_serving_paged_attention_and_speculative_decoding",
)


def repo_root() -> Path:
    """The repository root: ``$COURSE_ROOT`` if set, else the folder above this package."""
    env = os.environ.get("COURSE_ROOT")
    return Path(env).resolve() if env else Path(__file__).resolve().parent.parent


def solutions_dir() -> Path:
    return repo_root() / "solutions"


def sources_dir() -> Path:
    """Text sources of the solution notebooks (jupytext percent format), one ``.py`` per notebook."""
    return solutions_dir() / "src"


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


def available_notebooks() -> list[str]:
    """The course notebooks that have a source in ``solutions/src``, in course order."""
    return [name for name in NOTEBOOKS if (sources_dir() / f"{name}.py").exists()]


def project_url(label: str) -> str:
    """An address from ``[project.urls]`` in pyproject.toml, the one place the course keeps them."""
    import tomllib

    urls = tomllib.loads((repo_root() / "pyproject.toml").read_text(encoding="utf-8"))["project"].get("urls", {})
    if label not in urls:
        raise RuntimeError(f"pyproject.toml has no [project.urls] {label!r} entry")
    return urls[label]



#: Notebooks written for a GPU: their Colab badge says to pick a GPU runtime.
GPU_NOTEBOOKS: frozenset[str] = frozenset({"06_efficient_attention_gpu", "07_flash_attention_from_scratch"})

class _Exercises(Mapping):
    """notebook -> its graded exercises, in order: the grade ids of its answer cells (``# %% grade_id="X"``,
    not ``test_...``) in ``solutions/src/<notebook>.py``, read once. The exercise's source is where it is
    declared; docs/design.md ("The contract") lists the same names, and
    ``tests/grader_messy/test_grader_cells.py`` holds the two (and the reference, and the checks) together."""

    _ANSWER = re.compile(r'^# %%.*\bgrade_id="(?!test_)([A-Za-z_]\w*)"', re.MULTILINE)

    @functools.cached_property
    def _found(self) -> dict[str, tuple[str, ...]]:
        return {name: tuple(self._ANSWER.findall((sources_dir() / f"{name}.py").read_text(encoding="utf-8")))
                for name in available_notebooks()}

    def __getitem__(self, notebook: str) -> tuple[str, ...]:
        return self._found[notebook]

    def __iter__(self):
        return iter(self._found)

    def __len__(self) -> int:
        return len(self._found)


#: Graded exercises of each notebook (docs/design.md, "The contract"): answer cells have these grade ids, test
#: cells ``test_<name>``, ``course_utils.reference`` defines each name and ``course_utils.checks`` checks it.
EXERCISES: Mapping[str, tuple[str, ...]] = _Exercises()


COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"


def colab_url(name: str) -> str:
    """Where Colab opens the student edition's notebook ``name`` (from ``[project.urls] "Student edition"``)."""
    edition = project_url("Student edition").removesuffix(".git").rstrip("/")
    path = edition.split("github.com/", 1)[-1]
    return f"https://colab.research.google.com/github/{path}/blob/main/notebooks/{name}.ipynb"


def colab_badge(name: str) -> str:
    """The "Open in Colab" badge of notebook ``name``, as Markdown."""
    return f"[![Open In Colab]({COLAB_BADGE})]({colab_url(name)})"


def badge_markdown(name: str) -> str:
    """The badge line at the top of notebook ``name``, with the GPU advice where the notebook wants one."""
    gpu = " In Colab, choose Runtime → Change runtime type → GPU before you run it." if name in GPU_NOTEBOOKS else ""
    return colab_badge(name) + gpu
