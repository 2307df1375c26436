"""New gradebooks are stamped with nbgrader's newest revision read in-process: the one that the
``alembic heads`` command nbgrader itself would run prints, and the one a new gradebook holds."""

from __future__ import annotations

import subprocess

import nbgrader.api
import sqlalchemy
from nbgrader.api import Gradebook
from nbgrader.dbutil import _temp_alembic_ini

from grader import config


def test_the_in_process_revision_is_the_one_alembic_prints(tmp_path):
    config.ensure_venv_on_path()
    assert nbgrader.api.get_alembic_version is config.alembic_head
    with _temp_alembic_ini(f"sqlite:///{tmp_path / 'unused.db'}") as ini:  # as nbgrader.api does
        printed = subprocess.check_output(["alembic", "-c", ini, "heads"], text=True)
    assert printed.split()[0] == config.alembic_head()


def test_a_new_gradebook_holds_that_revision(tmp_path):
    config.ensure_venv_on_path()
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}", "course") as gb:
        version = gb.db.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).scalar()
    assert version == config.alembic_head()
