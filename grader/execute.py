"""nbgrader's ``Execute`` step, hardened for untrusted notebooks.

* The kernel is a :class:`grader.kernels.SandboxedKernelManager` (bubblewrap, memory cap).
* Each cell has a time limit (nbgrader's ``timeout``, the kernel is interrupted) and the whole
  notebook has one (``notebook_timeout``): once it is spent, the remaining cells are not run and
  carry an error saying so, so their tests score 0.
* A kernel that dies (``os._exit``, a memory cap hit in C code, a segfault) or that ignores the
  interrupt after a time-out (``except KeyboardInterrupt: pass`` in a loop) costs only that cell:
  the cell gets an error output, a fresh kernel is started, the cells before it are replayed
  silently, and execution goes on with the next cell. Cells that needed what the lost cell
  defined then fail on their own.
* The kernel can write into two of the grader's folders on its disk: its socket folder and the
  hand-off folder (``grader/judge.py``). A :class:`FolderGuard` watches both; when they hold more than
  ``disk_limit`` bytes, it empties the hand-off folder and stops the kernel, which then costs that
  cell as above (its error says why). So a notebook cannot fill the grader's disk.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from typing import Callable

from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Enum, Integer

from grader.config import SETTINGS

KERNEL_DIED = "KernelDied"
NOTEBOOK_TIMEOUT = "NotebookTimeLimit"
CELL_TIMEOUT = "CellTimeoutError"
#: Bytes a kernel may write into the grader's folders it can reach, all files together
#: (``Settings.disk_limit``). A judged test hands out at most ``wire.MAX_BYTES`` (16 MB); honest
#: notebooks hand out well under 1 MB.
DISK_LIMIT = SETTINGS.disk_limit
#: How a cell's error says the kernel was stopped for writing too much (``autograde.limit_events`` reads it).
DISK_LIMIT_WORDS = "into the grader's folders"


def folder_bytes(folder: str) -> int:
    """Bytes held by the files under ``folder`` (links not followed; 0 if it is gone)."""
    total, stack = 0, [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    info = entry.stat(follow_symlinks=False)
                    total += max(info.st_size, info.st_blocks * 512)
            except OSError:
                continue
    return total


class FolderGuard:
    """A thread that sums the bytes in ``folders()`` every ``every`` seconds; above ``limit`` it calls
    ``stop()`` (which stops the kernel writing them) and counts a trip."""

    def __init__(self, folders: Callable[[], list[str]], limit: int, stop: Callable[[], None], every: float = 0.2):
        self.folders, self.limit, self.stop, self.every = folders, limit, stop, every
        self.trips = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="grader-folder-guard", daemon=True)

    def __enter__(self) -> "FolderGuard":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(self.every):
            try:
                if sum(folder_bytes(f) for f in self.folders()) > self.limit:
                    self.trips += 1
                    self.stop()
            except Exception as exc:  # noqa: BLE001 - the guard keeps watching, and says what went wrong
                print(f"grader: the folder guard met {type(exc).__name__}: {exc}", file=sys.stderr)


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class RobustExecute(Execute):
    """``Execute`` that survives dead or stuck kernels and enforces a notebook-wide time limit."""

    #: After the last cell nothing the kernel does counts (its hand-off is written as each test cell ends),
    #: so it is stopped at once: no waiting 1 to 2 s per notebook for Python to wind torch down, and no
    #: ``atexit`` hook of the student's ever runs.
    shutdown_kernel = Enum(["graceful", "immediate"], default_value="immediate",
                           help="how the kernel is stopped after the last cell").tag(config=True)
    notebook_timeout = Integer(600, help="seconds for the whole notebook (0: no limit)").tag(config=True)
    max_restarts = Integer(5, help="kernel restarts allowed per notebook").tag(config=True)
    disk_limit = Integer(DISK_LIMIT, help="bytes the kernel may write into the grader's folders it can reach "
                                          "(its socket folder, the hand-off folder); 0: no limit").tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        self._deadline = time.monotonic() + self.notebook_timeout if self.notebook_timeout else None
        self._lost: set[int] = set()  # cells whose execution killed or hung the kernel
        self._restarts = 0
        # The hand-off of grader/judge.py, made by its PrepareHandOff step before this one: its folder is
        # bound into the kernel's sandbox (grader/sandbox.py) and watched by the disk guard below.
        self._handoff = (resources or {}).get("course_handoff")
        if self._handoff is not None:
            from grader import warm

            parent = warm.current()
            if parent is not None:  # where the notebook's forked kernels can have it bound
                warm.adopt_hand_off(self._handoff, parent)
        if not self.disk_limit:
            return super().preprocess(nb, resources, km=km)
        with FolderGuard(self._kernel_folders, self.disk_limit, self._stop_writer) as self._guard:
            return super().preprocess(nb, resources, km=km)

    def _kernel_folders(self) -> list[str]:
        """The grader's folders the running kernel can write to."""
        folders = [getattr(self.km, "_socket_dir", None)]
        if self._handoff is not None:
            folders.append(self._handoff.outputs)
        return [f for f in folders if f]

    def _stop_writer(self) -> None:
        """Called by the guard (another thread): empty the hand-off folder and kill the kernel's process;
        its socket folder goes with its kernel manager."""
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        if process is not None:
            try:
                process.kill()
            except OSError:
                pass
        if self._handoff is not None:
            try:
                entries = list(os.scandir(self._handoff.outputs))
            except OSError:
                entries = []
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    try:
                        os.unlink(entry.path)
                    except OSError:
                        pass

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        handoff = getattr(self, "_handoff", None)
        if handoff is not None:  # every kernel of this notebook (restarts too) hands out to the same folder
            km.probe_dir, km.probe_inputs = handoff.outputs, handoff.inputs
            km.student_edition = handoff.student_edition
            km.reference_subset = handoff.reference
        return km

    def _remaining(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    def _get_timeout(self, cell):
        timeout = super()._get_timeout(cell)
        remaining = self._remaining()
        if remaining is not None:
            timeout = max(1, int(min(timeout or remaining, remaining)))
        return timeout

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        if cell.cell_type != "code" or not cell.source.strip():
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        remaining = self._remaining()
        if remaining is not None and remaining <= 0:
            cell.outputs = [_error(NOTEBOOK_TIMEOUT, f"not run: the notebook's time limit of "
                                                     f"{self.notebook_timeout} s was used up by earlier cells")]
            return cell
        trips = self._trips()
        try:
            cell = await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        except CellTimeoutError:
            # The reply came (or was faked after the interrupt) but the output stream never went idle.
            cell.outputs = list(cell.get("outputs", [])) + [_error(
                CELL_TIMEOUT, f"this cell ran longer than the time limit ({self._get_timeout(cell)} s) and "
                              "did not stop when interrupted; the grader restarted the kernel")]
            if not await self._responsive():
                await self._recover(cell_index)
            return cell
        except DeadKernelError:
            why = (f"the kernel wrote more than {self.disk_limit / 1024**2:g} MB {DISK_LIMIT_WORDS} while "
                   f"running this cell, so the grader stopped it" if self._trips() > trips else
                   "the kernel stopped while running this cell (os._exit, a crash, or the memory limit)")
            cell.outputs = list(cell.get("outputs", [])) + [_error(
                KERNEL_DIED, f"{why}; the grader restarted it and went on with the next cell")]
            await self._recover(cell_index)
            return cell
        if any(o.get("output_type") == "error" and o.get("ename") == CELL_TIMEOUT for o in cell.outputs):
            cell.outputs = [o for o in cell.outputs if o.get("ename") != CELL_TIMEOUT] + [_error(
                CELL_TIMEOUT, f"this cell ran longer than the time limit ({self._get_timeout(cell)} s) "
                              "and was interrupted")]
            if not await self._responsive():
                await self._recover(cell_index)
        return cell

    def _trips(self) -> int:
        guard = getattr(self, "_guard", None)
        return guard.trips if guard is not None else 0

    # nbconvert's ExecutePreprocessor calls the sync wrapper, bound to the base class's coroutine.
    execute_cell = run_sync(async_execute_cell)

    async def _responsive(self, wait: float = 5.0) -> bool:
        """Whether the kernel answers a ``kernel_info`` request within ``wait`` seconds."""
        try:
            msg_id = await ensure_async(self.kc.kernel_info())
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=max(0.1, deadline - time.monotonic())))
                except Exception:  # noqa: BLE001 - queue.Empty
                    return False
                if msg["parent_header"].get("msg_id") == msg_id:
                    return True
        except Exception:  # noqa: BLE001
            return False
        return False

    async def _recover(self, lost_index: int) -> None:
        """Fresh kernel, replay the cells before ``lost_index`` (except lost ones) without outputs."""
        self._lost.add(lost_index)
        self._restarts += 1
        cwd = self.resources.get("metadata", {}).get("path") or None
        try:
            await self._async_cleanup_kernel()
        except Exception:  # noqa: BLE001 - the old kernel may be half dead
            self.km, self.kc = None, None
        if self._restarts > self.max_restarts:
            self._deadline = time.monotonic() - 1  # give up on the rest of the notebook
            return
        self.km = self.create_kernel_manager()
        await self.async_start_new_kernel(**({"cwd": cwd} if cwd else {}))
        await self.async_start_new_kernel_client()
        for index, cell in enumerate(self.nb.cells[:lost_index]):
            if cell.cell_type != "code" or index in self._lost or not cell.source.strip():
                continue
            remaining = self._remaining()
            if remaining is not None and remaining <= 0:
                return
            msg_id = await ensure_async(self.kc.execute(cell.source, store_history=False, stop_on_error=False))
            try:
                reply = await self.async_wait_for_reply(msg_id, cell)
            except (DeadKernelError, CellTimeoutError):
                reply = None
            if reply is None:  # this earlier cell cannot be replayed: stop replaying
                if not await self._responsive():
                    await self._recover(index)
                return
