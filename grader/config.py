"""Build nbgrader's API objects on a course folder, with the course's configuration."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from nbgrader.apps import NbGraderAPI
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

CONFIG_FILE = Path(__file__).with_name("nbgrader_config.py")


def load_config(root: Path) -> Config:
    """The course's nbgrader config with ``CourseDirectory.root`` set to ``root``."""
    config = PyFileConfigLoader(CONFIG_FILE.name, path=str(CONFIG_FILE.parent)).load_config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
    return config


def make_api(root: Path, extra: Config | None = None) -> NbGraderAPI:
    """An ``NbGraderAPI`` working in the nbgrader course folder ``root`` (created if missing)."""
    root.mkdir(parents=True, exist_ok=True)
    ensure_venv_on_path()
    config = load_config(root)
    if extra is not None:
        config.merge(extra)
    return NbGraderAPI(config=config)


def ensure_venv_on_path() -> None:
    """nbgrader runs the ``alembic`` command by name; make this interpreter's scripts findable."""
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
