"""nbgrader's ``Execute`` step, hardened for untrusted notebooks.

* The kernel is a :class:`grader.sandbox.SandboxedKernelManager` (bubblewrap, memory cap).
* Each cell has a time limit (nbgrader's ``timeout``, the kernel is interrupted) and the whole
  notebook has one (``notebook_timeout``): once it is spent, the remaining cells are not run and
  carry an error saying so, so their tests score 0.
* A kernel that dies (``os._exit``, a memory cap hit in C code, a segfault) or that ignores the
  interrupt after a time-out (``except KeyboardInterrupt: pass`` in a loop) costs only that cell:
  the cell gets an error output, a fresh kernel is started, the cells before it are replayed
  silently, and execution goes on with the next cell. Cells that needed what the lost cell
  defined then fail on their own.
"""

from __future__ import annotations

import time

from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Bool, Integer

KERNEL_DIED = "KernelDied"
NOTEBOOK_TIMEOUT = "NotebookTimeLimit"
CELL_TIMEOUT = "CellTimeoutError"


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class RobustExecute(Execute):
    """``Execute`` that survives dead or stuck kernels and enforces a notebook-wide time limit."""

    notebook_timeout = Integer(600, help="seconds for the whole notebook (0: no limit)").tag(config=True)
    max_restarts = Integer(5, help="kernel restarts allowed per notebook").tag(config=True)
    hand_off = Bool(False, help="prepare the hand-off of grader/judge.py for the notebooks it judges "
                                "(set together with its JudgeOutside step)").tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        self._deadline = time.monotonic() + self.notebook_timeout if self.notebook_timeout else None
        self._lost: set[int] = set()  # cells whose execution killed or hung the kernel
        self._restarts = 0
        self._handoff = None
        if self.hand_off and resources is not None:
            from grader import judge

            self._handoff = judge.prepare(resources.get("nbgrader", {}).get("notebook"))
            if self._handoff is not None:
                resources["course_handoff"] = self._handoff
        return super().preprocess(nb, resources, km=km)

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        handoff = getattr(self, "_handoff", None)
        if handoff is not None:  # every kernel of this notebook (restarts too) hands out to the same folder
            km.probe_dir, km.probe_inputs = handoff.outputs, handoff.inputs
            km.student_edition = handoff.student_edition
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
            cell.outputs = list(cell.get("outputs", [])) + [_error(
                KERNEL_DIED, "the kernel stopped while running this cell (os._exit, a crash, or the "
                             "memory limit); the grader restarted it and went on with the next cell")]
            await self._recover(cell_index)
            return cell
        if any(o.get("output_type") == "error" and o.get("ename") == CELL_TIMEOUT for o in cell.outputs):
            cell.outputs = [o for o in cell.outputs if o.get("ename") != CELL_TIMEOUT] + [_error(
                CELL_TIMEOUT, f"this cell ran longer than the time limit ({self._get_timeout(cell)} s) "
                              "and was interrupted")]
            if not await self._responsive():
                await self._recover(cell_index)
        return cell

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
