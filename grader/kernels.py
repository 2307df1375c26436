"""The grader's kernel manager: each notebook's kernel started cold in bubblewrap (:mod:`grader.sandbox`),
forked from the grading process's warm parent (:mod:`grader.warm`), or, where bubblewrap cannot run
(Gradescope), as an unprivileged user (:mod:`grader.runas`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, Integer, List, Type, Unicode

from grader import cgroups, runas, warm
from grader.sandbox import (DEFAULT_MEMORY, bwrap_path, kernel_env, limits_prefix, probe_env,
                            sandbox_command)


class ReadyClient(AsyncKernelClient):
    """jupyter_client's kernel client, ready as soon as the kernel is.

    ``AsyncKernelClient.wait_for_ready`` ends by reading IOPub until it has been quiet for 0.2 s: a fixed
    0.2 s of idle waiting for every kernel started, a sixth of a warm kernel's whole notebook. Here the same
    handshake (a ``kernel_info`` reply on shell, then one IOPub message, which shows that IOPub is connected)
    ends by taking only what IOPub already holds. What arrives later (the ``kernel_info`` requests' status
    messages) is never waited for: nbclient reads only the messages of the cell it runs.
    """

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        while True:
            self.kernel_info()
            try:
                reply = await self.shell_channel.get_msg(timeout=1)
            except Empty:
                pass
            else:
                if reply["msg_type"] == "kernel_info_reply":
                    try:  # IOPub is connected once a message (this request's status) arrives on it
                        await self.iopub_channel.get_msg(timeout=0.2)
                    except Empty:
                        pass
                    else:
                        self._handle_kernel_info_reply(reply)
                        break
            if not await self.is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:g} seconds")
        while True:
            try:
                await self.iopub_channel.get_msg(timeout=0)
            except Empty:
                break


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs in bubblewrap (or, if ``sandbox`` is off, only under limits).

    nbclient creates one per notebook (``Execute.kernel_manager_class``); the traits below are
    set through the nbgrader config.
    """

    client_factory = Type(ReadyClient, klass=AsyncKernelClient)
    sandbox = Bool(True, help="run the kernel in bubblewrap").tag(config=True)
    memory_limit = Integer(DEFAULT_MEMORY, help="address-space cap for the kernel, bytes (0: none)").tag(config=True)
    bwrap = Unicode("", help="bubblewrap executable (default: found on PATH)").tag(config=True)
    extra_env = List(Unicode(), help="VAR=VALUE pairs for the kernel's environment").tag(config=True)
    # Set per notebook by ``grader.execute.RobustExecute`` (see ``grader/judge.py``).
    probe_dir = Unicode("", help="the grader's folder the kernel hands its outputs out to")
    probe_inputs = Unicode("", help="the grader's file of hidden inputs the kernel reads")
    student_edition = Bool(False, help="show the kernel course_utils without answers or hidden cases")
    reference_subset = Unicode("", help="with student_edition: a file of a few helpers' answers "
                                        "(grader/reference_subset.py) shown as course_utils/reference.py")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # The grading process's warm parent (grader/warm.py), or None: cold kernels. A warm kernel's files
        # live in a folder of its own under the parent's staging folder, where the parent can bind them.
        self._warm = warm.current() if self.sandbox else None
        self._stage = self._warm.stage() if self._warm is not None else None
        # Unix sockets in a private folder, bound into the sandbox at the same path.
        self._socket_dir = str(self._stage / "sockets") if self._stage is not None \
            else tempfile.mkdtemp(prefix="grader-kernel-")
        os.chmod(self._socket_dir, 0o700)
        self.transport = "ipc"
        self.ip = os.path.join(self._socket_dir, "k")
        self.connection_file = os.path.join(self._socket_dir, "kernel.json")

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        inner = super().format_kernel_cmd(extra_arguments)
        # Interrupt over the control channel: a SIGINT to the process group would hit bubblewrap
        # itself (which then ends the sandbox) rather than only the kernel.
        self.kernel_spec.interrupt_mode = "message"
        if not self.sandbox:
            user = runas.kernel_user()  # Gradescope: no bubblewrap, the kernel runs as an unprivileged user
            if user is not None:
                runas.hand_over(user, writable=[self._socket_dir], readable=[])
                return [*runas.drop_prefix(user), *limits_prefix(self.memory_limit), *inner]
            return [*limits_prefix(self.memory_limit), *inner]
        if self._forks():
            return inner  # for the record only: the warm parent forks the kernel (_async_launch_kernel)
        exe = self.bwrap or bwrap_path()
        if not exe:
            raise RuntimeError("bubblewrap is not available; refusing to run student code unsandboxed")
        cmd = sandbox_command(inner, socket_dir=self._socket_dir, memory=self.memory_limit, bwrap=exe,
                              probe_dir=self.probe_dir, probe_inputs=self.probe_inputs,
                              student_edition=self.student_edition, reference=self.reference_subset)
        # Caps on the kernel's processes, and on the memory they hold together (grader/cgroups.py), where
        # this machine lets the grader set them.
        self._remove_pids_group()
        self._pids_group = cgroups.make_group(memory_max=self.memory_limit or None)
        return (self._pids_group.join_prefix() if self._pids_group is not None else []) + cmd

    def _remove_pids_group(self) -> None:
        group = getattr(self, "_pids_group", None)
        if group is not None:
            group.remove()
            self._pids_group = None

    def _forks(self) -> bool:
        """Whether this kernel is forked from the warm parent: a sandboxed student-edition kernel (the one
        edition the parent imported) in a grading process with warm kernels on."""
        return self._warm is not None and self.sandbox and self.student_edition

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        if self._forks():
            try:
                process = self._warm.spawn(self._stage, connection_file=self.connection_file,
                                           env=kernel_env(self.probe_dir, self.probe_inputs), probe_dir=self.probe_dir,
                                           probe_inputs=self.probe_inputs, reference=self.reference_subset,
                                           memory=self.memory_limit)
            except (OSError, ValueError) as exc:
                print(f"grader: a warm kernel could not start ({exc}); this one is cold", file=sys.stderr)
                self._warm = None
                kernel_cmd = self.format_kernel_cmd()
            else:
                provisioner = self.provisioner
                provisioner.process, provisioner.pid, provisioner.pgid = process, process.pid, None
                provisioner.cwd = kw.get("cwd")
                self._reconcile_connection_info(provisioner.connection_info)
                return
        await super()._async_launch_kernel(kernel_cmd, **kw)

    async def _async_start_kernel(self, **kw):
        # The kernel's own banner goes to its stdout; the student's output travels over ZeroMQ.
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stdin", subprocess.DEVNULL)
        user = None if self.sandbox else runas.kernel_user()
        if user is not None:  # its own empty home, the student edition, only the hand-off of the grader's
            self._home = runas.make_home(user, self.reference_subset)
            hand_off = probe_env(self.probe_dir, self.probe_inputs, inside=False) if self.probe_dir else {}
            runas.hand_over(user, writable=[self.probe_dir], readable=[self.probe_inputs])
            kw["env"] = runas.kernel_env(self._home, extra=hand_off)
            kw["cwd"] = str(self._home)
        elif not self.sandbox and self.probe_dir and self.probe_inputs:
            # Unsandboxed (--allow-unsandboxed) the kernel inherits the environment: add the hand-off.
            kw["env"] = {**(kw.get("env") or os.environ),
                         **probe_env(self.probe_dir, self.probe_inputs, inside=False)}
        return await super()._async_start_kernel(**kw)

    start_kernel = _async_start_kernel  # type: ignore[assignment]

    async def _async_wait(self, pollinterval: float = 0.1) -> None:
        # jupyter_client polls a killed kernel every 0.1 s until it is gone: a killed kernel is gone within
        # milliseconds, so the first poll's 0.1 s was idle time for every notebook graded.
        await super()._async_wait(pollinterval=min(pollinterval, 0.005))

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        self._remove_pids_group()
        user = None if self.sandbox else runas.kernel_user()
        if user is not None:  # nothing the student's code started outlives its kernel
            runas.kill_all(user)
            shutil.rmtree(getattr(self, "_home", "") or "/nonexistent", ignore_errors=True)
        if not restart:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            if self._stage is not None:
                shutil.rmtree(self._stage, ignore_errors=True)

    cleanup_resources = _async_cleanup_resources  # type: ignore[assignment]
