"""A throw-away PostgreSQL server for tests: Debian's ``postgresql`` package, a cluster in a
temporary folder, listening only on a Unix socket in that folder, stopped and deleted afterwards."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def binaries() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl`` (Debian keeps them out of PATH), or ``None``."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    exe = shutil.which("initdb")
    return Path(exe).parent if exe else None


def _as_server_user(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; Debian's package creates the `postgres` user for it.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


@contextlib.contextmanager
def server():
    """Start a cluster in a new temporary folder; yield a SQLAlchemy URL of an empty database
    ``gradebook``. The server is stopped and the folder deleted afterwards."""
    bin_dir = binaries()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="course-postgres-"))  # directly in /tmp: the server user can reach it
    data, sock = folder / "data", folder / "socket"
    sock.mkdir()
    if os.geteuid() == 0:
        for path in (folder, sock):
            shutil.chown(path, "postgres", "postgres")
    run = lambda *cmd: subprocess.run(_as_server_user([str(bin_dir / cmd[0]), *cmd[1:]]),  # noqa: E731
                                      check=True, capture_output=True, text=True)
    run("initdb", "-D", str(data), "-A", "trust", "-U", "grader", "--no-sync")
    run("pg_ctl", "-D", str(data), "-w", "-l", str(folder / "server.log"), "-o",
        f"-k {sock} -c listen_addresses='' -c fsync=off", "start")
    try:
        run("createdb", "-h", str(sock), "-U", "grader", "gradebook")
        yield f"postgresql+psycopg2://grader@/gradebook?host={sock}"
    finally:
        subprocess.run(_as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
