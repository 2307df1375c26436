"""The sandbox command is built so that what the kernel needs stays visible wherever the course lives."""

from __future__ import annotations

from grader import sandbox


def test_private_tmp_is_mounted_before_the_binds(monkeypatch):
    # A checkout under /tmp (as CI's may be): its venv must not vanish under the private /tmp.
    monkeypatch.setattr(sandbox, "readable_paths", lambda: ["/tmp/ci-checkout/.venv", "/usr/lib/python3"])
    cmd = sandbox.sandbox_command(["python", "-m", "ipykernel"], socket_dir="/tmp/grader-kernel-x",
                                  memory=0, bwrap="bwrap")
    tmpfs_at = cmd.index("--tmpfs")
    assert cmd[tmpfs_at + 1] == "/tmp"
    venv_bind = cmd.index("/tmp/ci-checkout/.venv")
    assert cmd[venv_bind - 1] == "--ro-bind" and venv_bind > tmpfs_at
    assert cmd.index("/tmp/grader-kernel-x") > tmpfs_at
    assert "--unshare-all" in cmd and "--clearenv" in cmd
