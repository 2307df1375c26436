"""Start JupyterLab for the course and print the URL to open, with its token.

    python scripts/lab.py [--notebook-dir notebooks] [--port 8888] [--no-browser]

``make lab`` runs this, and so do the browser tests (tests/release/test_browser.py), so what the tests open
is what a student opens. The token is ``$JUPYTER_TOKEN`` when set, else a new random one; it is
passed to Jupyter through the environment, not the command line (where ``ps`` would show it).

A port that is already taken ends with a one-line message and exit code 1, not a traceback, and
Jupyter is told not to wander to another port (``port_retries=0``), so the URL printed is the URL
that works.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"
READY_TIMEOUT = 120  # seconds; a first start on a slow machine imports a lot


def port_in_use(port: int, host: str = HOST) -> bool:
    """Whether something already listens on (or holds) ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def command(notebook_dir: Path, port: int, open_browser: bool = True) -> list[str]:
    """The JupyterLab command line (the token comes from ``$JUPYTER_TOKEN``)."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={notebook_dir}", f"--ServerApp.ip={HOST}",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")  # containers and cloud machines often run as root; Jupyter refuses it otherwise
    if not open_browser:
        cmd.append("--no-browser")
    return cmd


def url(port: int, token: str, path: str = "lab") -> str:
    """The address to open, token included."""
    return f"http://{HOST}:{port}/{path}?token={token}"


def wait_ready(process: subprocess.Popen, port: int, token: str, timeout: float = READY_TIMEOUT) -> bool:
    """Poll the server's status API until it answers (True) or the process ends or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url(port, token, "api/status"), timeout=2) as reply:
                if reply.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    return False


def start(notebook_dir: Path, port: int, token: str, open_browser: bool = True, **popen) -> subprocess.Popen:
    """Start JupyterLab in ``notebook_dir`` on ``port`` with ``token``; does not wait for it."""
    env = {**os.environ, **popen.pop("env", {}), "JUPYTER_TOKEN": token}
    return subprocess.Popen(command(notebook_dir, port, open_browser), env=env, **popen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebook-dir", type=Path, default=Path("notebooks"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT") or 8888))
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    args = parser.parse_args(argv)

    if not args.notebook_dir.is_dir():
        print(f"{args.notebook_dir} is not a folder: run this from the course's folder", file=sys.stderr)
        return 1
    if port_in_use(args.port):
        print(f"Port {args.port} is already in use, perhaps by a JupyterLab you started earlier (see "
              f"`.venv/bin/jupyter server list`, and open its URL). To start another one: "
              f"make lab PORT={args.port + 1}", file=sys.stderr)
        return 1
    token = os.environ.get("JUPYTER_TOKEN") or secrets.token_hex(24)
    process = start(args.notebook_dir.resolve(), args.port, token, open_browser=not args.no_browser)
    # Ctrl+C reaches Jupyter too (same process group); Jupyter asks before it shuts down, we wait for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: process.terminate())  # stopping us stops Jupyter
    if wait_ready(process, args.port, token):
        print(f"\nJupyterLab is running. Open this URL in your browser:\n\n    {url(args.port, token)}\n\n"
              f"Stop it with Ctrl+C (twice) in this terminal.\n", flush=True)
    elif process.poll() is None:
        print(f"JupyterLab did not answer on port {args.port} within {READY_TIMEOUT} s; its log is above.",
              file=sys.stderr, flush=True)
    return process.wait()


if __name__ == "__main__":
    sys.exit(main())
