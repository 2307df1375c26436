"""The grader's settings, in one frozen object, and nbgrader's API objects built from them.

Every default lives in :data:`SETTINGS`: the command line's defaults, ``nbgrader_config.py`` (the
file an instructor also uses with nbgrader by hand), the sandbox and the executor all read it.
One course id, one gradebook address (:func:`gradebook_url`), one way to make a file name safe.
"""

from __future__ import annotations

import functools

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from nbgrader.apps import NbGraderAPI
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

CONFIG_FILE = Path(__file__).with_name("nbgrader_config.py")
#: Settings that make PyTorch and MKL compute as another CPU would; passed on to every kernel where set
#: (sandboxed, forked or run as another user), so that it computes as the grader does.
CPU_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


@dataclass(frozen=True)
class Settings:
    """How a class is graded. ``SETTINGS`` holds the defaults; ``replace(SETTINGS, ...)`` changes one."""

    course_id: str = "attention-course"
    sandbox: bool = True  # run student kernels in bubblewrap
    cell_timeout: int = 60  # seconds a cell may run before it is interrupted
    notebook_timeout: int = 600  # seconds for a whole notebook
    startup_timeout: int = 120  # seconds a kernel may take to start
    memory: int = 4 * 1024**3  # address-space cap of a student kernel, bytes (0: none)
    disk_limit: int = 256 * 1024**2  # bytes a kernel may write into the grader's folders it reaches (0: none)
    max_output_lines: int = 200  # outputs kept per cell in the graded notebook
    max_traceback: int = 40  # traceback lines kept per error
    db_url: str | None = None  # the merged gradebook (default: SQLite in the output folder)
    #: Judge grader/judge.py's exercises outside the kernel (``GRADER_JUDGE_OUTSIDE=0``: inside it, as before).
    judge_outside: bool = field(default_factory=lambda: os.environ.get("GRADER_JUDGE_OUTSIDE", "1") != "0")
    #: Fork each sandboxed kernel from a warm, pre-imported parent (grader/warm.py); ``--cold-kernels``: no.
    warm_kernels: bool = True

    def with_(self, **changes) -> "Settings":
        """A copy with ``changes`` (``None`` values are ignored, so CLI options pass through)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


#: The defaults, used wherever a setting is not given.
SETTINGS = Settings()


def gradebook_url(root: Path, db_url: str | None = None) -> str:
    """The address of a course folder's gradebook: ``db_url`` if given (e.g. PostgreSQL), else
    ``sqlite:///<root>/gradebook.db``."""
    return db_url or f"sqlite:///{Path(root) / 'gradebook.db'}"


def safe_name(name: str) -> str:
    """``name`` as a file name: letters, digits, ``-_.`` kept, everything else ``_``."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "_"


def cache_dir() -> Path:
    """Where the grader keeps what it can build again (a registered gradebook, :func:`grader.autograde.prepare_course`):
    ``$GRADER_CACHE_DIR``, else ``attention-course-grader`` in ``$XDG_CACHE_HOME`` (default ``~/.cache``)."""
    if os.environ.get("GRADER_CACHE_DIR"):
        return Path(os.environ["GRADER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attention-course-grader"


def load_config(root: Path, db_url: str | None = None) -> Config:
    """The course's nbgrader config with ``CourseDirectory.root`` set to ``root``."""
    config = PyFileConfigLoader(CONFIG_FILE.name, path=str(CONFIG_FILE.parent)).load_config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.db_url = gradebook_url(root, db_url)
    return config


def make_api(root: Path, extra: Config | None = None, db_url: str | None = None) -> NbGraderAPI:
    """An ``NbGraderAPI`` working in the nbgrader course folder ``root`` (created if missing)."""
    root.mkdir(parents=True, exist_ok=True)
    ensure_venv_on_path()
    config = load_config(root, db_url)
    if extra is not None:
        config.merge(extra)
    return NbGraderAPI(config=config)


def ensure_venv_on_path() -> None:
    """nbgrader runs the ``alembic`` command by name; make this interpreter's scripts findable."""
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")

    _stamp_new_gradebooks_in_process()


@functools.lru_cache(maxsize=1)
def alembic_head() -> str:
    """nbgrader's newest gradebook revision, read once per process from its migration scripts."""
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory
    from nbgrader import dbutil

    config = AlembicConfig()
    config.set_main_option("script_location", dbutil.ALEMBIC_DIR)
    return ScriptDirectory.from_config(config).get_current_head()


def _stamp_new_gradebooks_in_process() -> None:
    """nbgrader stamps every new gradebook with ``alembic heads`` run as a command, a new process each
    time (seconds on a busy machine); the same answer, read once in this process, is used instead."""
    import nbgrader.api

    nbgrader.api.get_alembic_version = alembic_head