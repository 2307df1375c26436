"""The grading processes (``grader.autograde.grading_pool``): forks of a server that has imported torch,
nbgrader and the course, which still see their caller's environment as it is at the call, and read the
caller's matplotlib font list instead of building their own."""

from __future__ import annotations

import os
import sys

import pytest

from grader import autograde, sandbox


def _state(variable: str) -> dict:
    """What a grading process sees (run inside one)."""
    return {"env": os.environ.get(variable), "preloaded": [m for m in autograde.PRELOAD if m in sys.modules],
            "fonts": str(sandbox.font_cache()), "pid": os.getpid()}


def test_a_grading_process_sees_the_callers_environment_at_the_call(monkeypatch):
    monkeypatch.delenv("COURSE_POOL_TEST", raising=False)
    with autograde.grading_pool(1) as pool:  # starts the fork server, if no earlier test did
        before = pool.submit(_state, "COURSE_POOL_TEST").result()
    monkeypatch.setenv("COURSE_POOL_TEST", "set after the fork server started")
    with autograde.grading_pool(1) as pool:
        after = pool.submit(_state, "COURSE_POOL_TEST").result()
    assert before["env"] is None
    assert after["env"] == "set after the fork server started"
    assert after["pid"] != before["pid"] != os.getpid()


def test_a_grading_process_starts_with_the_course_imported():
    if autograde.pool_context().get_start_method() != "forkserver":
        pytest.skip("no fork server on this platform: each grading process is a fresh interpreter")
    with autograde.grading_pool(1) as pool:
        state = pool.submit(_state, "PATH").result()
    assert state["preloaded"] == autograde.PRELOAD, "the fork server did not import what it should"


def test_a_grading_process_reads_the_callers_font_list():
    ok, why = sandbox.check_bwrap()
    if not ok:
        pytest.skip(why)
    with autograde.grading_pool(2) as pool:
        seen = {pool.submit(_state, "PATH").result()["fonts"] for _ in range(4)}
    assert seen == {str(sandbox.font_cache())}, "each grading process built a font list of its own"
    with autograde.grading_pool(1, sandboxed=False) as pool:  # no sandbox: no font list handed down
        assert pool.submit(_state, "PATH").result()["fonts"] != str(sandbox.font_cache())


def test_the_fork_server_started_early_is_the_one_the_grading_processes_come_from():
    """``autograde()`` starts the fork server before it reads the class (``start_fork_server``), so that the
    server's imports overlap that work; the grading processes are then its forks, not a second server's."""
    if autograde.pool_context().get_start_method() != "forkserver":
        pytest.skip("no fork server on this platform: each grading process is a fresh interpreter")
    from multiprocessing import forkserver

    autograde.start_fork_server()
    server = forkserver._forkserver._forkserver_pid  # noqa: SLF001 - the standard library's one fork server
    assert server is not None, "start_fork_server started no fork server"
    autograde.start_fork_server()  # already running: the same one
    assert forkserver._forkserver._forkserver_pid == server  # noqa: SLF001
    with autograde.grading_pool(1) as pool:
        assert pool.submit(os.getppid).result() == server


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc/self/task (Linux)")
def test_the_fork_servers_imports_start_no_thread():
    """The grading processes are forks of a process that imported autograde.PRELOAD. A thread started there (an
    OpenMP pool, which a parallel PyTorch operation run at import time starts) does not survive the fork, and a
    forked process then deadlocks on its first parallel operation. Run as an instructor may run the grader: with
    OMP_NUM_THREADS unset (make test sets it to 1, under which OpenMP starts no pool at all)."""
    import subprocess
    from pathlib import Path

    code = ("import importlib, os, torch; threads = lambda: len(os.listdir('/proc/self/task')); before = threads(); "
            f"[importlib.import_module(m) for m in {autograde.PRELOAD!r}]; "
            "print(before, threads())")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert after == before, f"importing the fork server's modules started {after - before} thread(s)"
