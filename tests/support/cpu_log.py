"""A pytest plugin for ``scripts/profile_tests.py``: each test's start and end, per pytest process.

Loaded with ``-p tests.support.cpu_log`` when ``COURSE_CPU_LOG`` names a folder; it writes one JSON line per
test start and end into ``<folder>/tests-<pid>.jsonl`` (a pytest-xdist worker is its own process).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

_files: dict[int, object] = {}


def _log(record: dict) -> None:
    folder = os.environ.get("COURSE_CPU_LOG")
    if not folder:
        return
    pid = os.getpid()
    if pid not in _files:
        _files[pid] = open(Path(folder) / f"tests-{pid}.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - kept open
    f = _files[pid]
    f.write(json.dumps(record) + "\n")  # type: ignore[attr-defined]
    f.flush()  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _log({"pid": os.getpid(), "id": item.nodeid, "start": time.time()})
    yield
    _log({"pid": os.getpid(), "id": item.nodeid, "end": time.time()})
