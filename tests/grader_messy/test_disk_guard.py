"""grader.execute.FolderGuard: a kernel that writes too much into the grader's folders is stopped.
(The end-to-end case, a notebook that floods them under the real grader, is in test_grader_e2e.py.)"""

from __future__ import annotations

import os
import threading

from grader.execute import FolderGuard, folder_bytes


def test_folder_bytes_counts_files_below_and_follows_no_link(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"x" * 3000)
    with open(tmp_path / "sparse", "wb") as f:  # a sparse file counts at its length
        f.truncate(10_000)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * 50_000)
    os.symlink(outside, tmp_path / "link")
    assert 14_000 <= folder_bytes(str(tmp_path)) < 50_000
    assert folder_bytes(str(tmp_path / "gone")) == 0


def test_the_guard_stops_the_writer_past_the_limit_only(tmp_path):
    stopped = threading.Event()
    with FolderGuard(lambda: [str(tmp_path)], limit=10_000, stop=stopped.set, every=0.02) as guard:
        (tmp_path / "small").write_bytes(b"x" * 5_000)
        assert not stopped.wait(0.2), "stopped under the limit"
        (tmp_path / "more").write_bytes(b"x" * 6_000)
        assert stopped.wait(5), "not stopped past the limit"
    assert guard.trips >= 1


def test_the_guard_watches_the_folders_of_the_moment(tmp_path):
    """The kernel's socket folder changes when a kernel is restarted: the guard asks each time."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    current = [str(first)]
    stopped = threading.Event()
    with FolderGuard(lambda: list(current), limit=1_000, stop=stopped.set, every=0.02):
        current[:] = [str(second)]
        (second / "flood").write_bytes(b"x" * 2_000)
        assert stopped.wait(5)
