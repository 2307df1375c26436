"""Warm kernels (grader/warm.py, grader/zygote.py): each kernel is a fork of one pre-imported parent in
the sandbox, and still starts as alone as a cold kernel does.

For each isolation property a kernel tries to break it and the next kernel forked from the same parent
looks for what it left; the whole attack then runs as a graded submission, and a wrong answer graded
after it by the same grading process still loses its points. ``test_verdicts_are_the_same_warm_and_cold``
grades the known answers of tests/fixtures both ways and compares every row of cells.csv.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

from grader import kernels, sandbox, warm
from grader.config import SETTINGS
from tests.support import studentenv
from tests.support.graded_class import answer_sets, solved, submissions


def _need_warm() -> None:
    ok, why = sandbox.check_bwrap()
    if not ok:
        pytest.skip(why)
    ok, why = warm.check()
    if not ok:
        pytest.skip(why)


@pytest.fixture(scope="module")
def _warm_in_this_process():
    """Cold kernels again in this process after the module's tests."""
    _need_warm()
    yield
    warm.disable()


@pytest.fixture
def parent(_warm_in_this_process):
    """Warm kernels in this process: its parent (started again if a test before stopped it)."""
    warm.enable(SETTINGS.memory)
    current = warm.current()
    current.ready()
    return current


def _run(code: str, *, student_edition: bool = True, timeout: float = 60,
         during=None) -> tuple[str, "kernels.SandboxedKernelManager"]:
    """Run ``code`` in a new sandboxed kernel (warm where this process has a parent); its stdout and error."""

    async def main():
        km = kernels.SandboxedKernelManager(student_edition=student_edition)
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        out: list[str] = []

        def hook(msg):
            content = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(content["text"])
            elif msg["msg_type"] == "error":
                out.append(f"{content['ename']}: {content['evalue']}\n")
        try:
            await kc.wait_for_ready(timeout=60)
            await kc.execute_interactive(code, timeout=timeout, output_hook=hook)
            if during is not None:
                during(km)
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
        return "".join(out), km

    return asyncio.run(main())


def test_a_kernel_is_forked_from_the_parent(parent):
    """Forked: torch and the meta device's lazy parts already imported; PID 2 of its own namespace."""
    out, km = _run("import sys, os\nprint('torch' in sys.modules, 'torch._dynamo' in sys.modules, os.getpid(), "
                   "os.getcwd())")
    assert out.split() == ["True", "True", "2", "/tmp/work"], out
    assert km._forks()


def test_the_meta_devices_lazy_parts_are_imported_for_notebooks_that_use_them():
    assert warm.needs_meta(["02_softmax_and_context", "08_kv_cache_gqa_and_windows"])
    assert not warm.needs_meta(["01_dot_products", "02_softmax_and_context", "03_trainable_self_attention"])


# What the first kernel leaves behind, and what the next one must not find. ------------------------------
LEAVE = textwrap.dedent("""
    import os, signal, subprocess, sys, threading, time
    import torch, course_utils.checks.core as core
    for path in ["/tmp/work/leak.py", "/tmp/leak", "/tmp/home/.ipython/profile_default/startup/00-leak.py",
                 "/tmp/home/.local/lib/python3.11/site-packages/usercustomize.py",
                 "/tmp/home/.local/lib/python3.11/site-packages/sitecustomize.py"]:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").write("open('/tmp/work/LEAKED', 'w').write('startup ran')\\n")
    os.environ["COURSE_LEAK"] = "1"
    sys.modules["leak_module"] = sys
    torch.leaked = True
    core.LEAKED = True
    torch.nn.functional.softmax = lambda *a, **k: "patched"
    signal.signal(signal.SIGUSR1, lambda *a: None)
    keep = open("/tmp/work/leak.py")
    os.dup2(keep.fileno(), 77)
    threading.Thread(target=time.sleep, args=(600,), name="leak-thread", daemon=True).start()
    subprocess.Popen(["sleep", "4711"], start_new_session=True)
    subprocess.Popen(["setsid", "-f", "sleep", "4712"])
    print("left", flush=True)
""")

FIND = textwrap.dedent("""
    import os, signal, sys, threading
    import torch, course_utils.checks.core as core
    import course_utils.checks  # noqa
    found = []
    for path in ["/tmp/work/leak.py", "/tmp/leak", "/tmp/work/LEAKED", "/tmp/home/.ipython/profile_default/startup/00-leak.py",
                 "/tmp/home/.local"]:
        if os.path.exists(path):
            found.append(path)
    if "COURSE_LEAK" in os.environ: found.append("env")
    if "leak_module" in sys.modules: found.append("sys.modules")
    if getattr(torch, "leaked", False) or getattr(core, "LEAKED", False): found.append("globals")
    if torch.nn.functional.softmax(torch.zeros(2), dim=0).tolist() != [0.5, 0.5]: found.append("patched")
    if signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL: found.append("signal")
    try:
        os.fstat(77); found.append("fd 77")
    except OSError:
        pass
    if any(t.name == "leak-thread" for t in threading.enumerate()): found.append("thread")
    for pid in os.listdir("/proc"):
        try:
            if b"47" in open(f"/proc/{pid}/cmdline", "rb").read() and b"sleep" in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(f"process {pid}")
        except OSError:
            pass
    print("found", found)
""")


def test_nothing_of_one_kernel_reaches_the_next(parent):
    """Files (home, IPython's start-up folder, usercustomize, /tmp, the working folder), processes (a
    setsid'd one too), environment, sys.modules, module globals, signal handlers, open files, threads."""
    out, _ = _run(LEAVE)
    assert "left" in out, out
    out, _ = _run(FIND)
    assert "found []" in out, out
    # And from this machine's side: no sleep of the first kernel is left anywhere.
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        assert not cmdline.startswith(b"sleep\x0047"), cmdline


RANDOM = ("import random, numpy, torch\n"
          "print(json.dumps([random.random(), float(numpy.random.rand()), torch.rand(3).tolist()]))")


def test_random_state_starts_as_a_cold_kernels(parent):
    """Python's, numpy's and torch's generators are seeded afresh in each kernel, as a fresh interpreter
    seeds them: two kernels forked from one parent draw differently."""
    first = json.loads(_run("import json\n" + RANDOM)[0])
    second = json.loads(_run("import json\n" + RANDOM)[0])
    assert first[0] != second[0] and first[1] != second[1] and first[2] != second[2]


REACH_PARENT = textwrap.dedent("""
    import ctypes, os, signal
    libc = ctypes.CDLL(None, use_errno=True)
    me = os.readlink("/proc/self")
    reached = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit() and p != me]:
        try:
            if b"zygote" not in open(f"/proc/{pid}/cmdline", "rb").read():
                continue  # the parent, and its forks, run grader/zygote.py
            nspid = [line for line in open(f"/proc/{pid}/status") if line.startswith("NSpid:")][0].split()[1:]
        except (OSError, IndexError):
            continue
        for leaf in ("mem", "environ", "maps"):
            try:
                open(f"/proc/{pid}/{leaf}", "rb").read(16); reached.append(f"{leaf} of {pid}")
            except OSError:
                pass
        for leaf in ("root", "cwd"):
            try:
                os.listdir(f"/proc/{pid}/{leaf}"); reached.append(f"{leaf} of {pid}")
            except OSError:
                pass
        try:
            fds = os.listdir(f"/proc/{pid}/fd")  # the numbers only: following one needs the right to trace
        except OSError:
            fds = []
        for fd in fds:
            for follow in (os.readlink, lambda path: os.close(os.open(path, os.O_RDONLY))):
                try:
                    follow(f"/proc/{pid}/fd/{fd}"); reached.append(f"fd {fd} of {pid}")
                except OSError:
                    pass
        if len(nspid) == 1:  # outside this kernel's PID namespace: the parent, or the fork between
            try:
                fd = os.open(f"/proc/{pid}", os.O_RDONLY)
                signal.pidfd_send_signal(fd, 0); reached.append(f"signal to {pid}")
            except OSError:
                pass
    if libc.umount2(b"/tmp", 2) == 0: reached.append("umount /tmp")
    if libc.mount(b"none", b"/tmp/work", b"tmpfs", 0, None) == 0: reached.append("mount")
    if libc.unshare(0x10000000 | 0x00020000) == 0 and libc.umount2(b"/tmp", 2) == 0:
        reached.append("umount /tmp in a new namespace")
    print("reached", reached)
""")


def test_the_kernel_cannot_reach_its_parent(parent):
    """No control channel open in the kernel (the parent's end of the grader's socket is in no file
    descriptor of the kernel); the parent cannot be read, traced or signalled through /proc; the kernel
    cannot undo its layout (unmount its /tmp to see the parent's)."""
    held = []

    def look(km) -> None:
        kernel = km.provisioner.process.kernel_pid
        for fd in os.listdir(f"/proc/{kernel}/fd"):
            held.append(os.readlink(f"/proc/{kernel}/fd/{fd}"))

    out, km = _run(REACH_PARENT, during=look)
    assert "reached []" in out, out
    assert held and f"socket:[{parent.channel_inode}]" not in held
    assert parent.alive()


def test_a_dead_parent_is_restarted():
    """A parent that dies is started afresh for the next kernel, and counted (grade_student grades the
    notebook it served again with cold kernels: test_a_notebook_whose_parent_died_is_graded_again_cold)."""
    _need_warm()
    warm.disable()
    warm.enable(SETTINGS.memory)
    try:
        first = warm.current()
        first.ready()
        lost = warm.lost()
        first.process.kill()
        first.process.wait()
        second = warm.current()
        assert second is not first and warm.lost() == lost + 1
        out, _ = _run("print('again')")
        assert "again" in out
    finally:
        warm.disable()


def _adopted_parent(kill: bool) -> dict:
    """In a grading process: what its warm parent is (adopted from the pool's main process or its own), and
    whether a kernel forked from it runs; with ``kill``, whether the parent is started again once killed."""
    import subprocess

    parent = warm.current()
    parent.ready()
    status = Path(f"/proc/{parent.process.pid}/status").read_text()
    ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    out, _ = _run("print('forked', 1 + 1)")
    report = {"worker": os.getpid(), "folder": str(parent.folder), "zygote": parent.process.pid, "ppid": ppid,
              "adopted": isinstance(parent.process, warm.KernelProcess), "ran": "forked 2" in out}
    if kill:
        parent.process.kill()
        parent.process.wait(timeout=10)
        again = warm.current()
        again.ready()
        report.update(restarted=again is not parent and warm.lost() == 1, own=isinstance(again.process, subprocess.Popen),
                      ran_again="forked 2" in _run("print('forked', 1 + 1)")[0])
    return report


def test_a_pools_warm_parents_start_beside_its_fork_server_and_each_process_adopts_one():
    """The grader's main process starts the pool's warm parents (grader.warm.prestart) while the pool's fork
    server imports; each grading process adopts one (a different one each), forks its kernels from it, starts
    its own when the adopted one dies, and nothing of them is left once the pool and the run end."""
    from grader import autograde

    _need_warm()
    prestarted = warm.prestart(2, SETTINGS.memory, False, autograde.pool_context())
    assert prestarted is not None
    started = {str(s.folder): s.pid for s in prestarted.started}
    try:
        with autograde.grading_pool(2, True, SETTINGS.memory, False, prestarted) as pool:
            reports = [f.result() for f in [pool.submit(_adopted_parent, False) for _ in range(4)]]
            killed = pool.submit(_adopted_parent, True).result()
    finally:
        prestarted.end()
    for report in reports:
        assert report["adopted"] and report["ran"], report
        assert started[report["folder"]] == report["zygote"] and report["ppid"] == os.getpid(), report
    by_worker = {r["worker"]: r["folder"] for r in reports}
    assert len(set(by_worker.values())) == len(by_worker)  # no two processes share a parent
    assert killed["restarted"] and killed["own"] and killed["ran_again"], killed
    for folder, pid in started.items():
        assert not Path(folder).exists() and not Path(f"/proc/{pid}").exists()


def test_a_notebook_whose_parent_died_is_graded_again_cold(monkeypatch):
    from grader import autograde

    class Parent:
        def alive(self):
            return False

    calls = []

    class Api:
        def autograde(self, *args, **kwargs):
            calls.append(warm.current())
            return {"success": True}

    monkeypatch.setitem(warm._state, "enabled", True)
    monkeypatch.setitem(warm._state, "parent", None)
    monkeypatch.setattr(warm, "current", lambda: None if warm._state["suspended"] else Parent())
    job = autograde.Job(0, "s", "02_softmax_and_context", "f", "", [], [], {}, [], {})
    assert autograde._autograde_one(Api(), job) == {"success": True}
    assert len(calls) == 2 and isinstance(calls[0], Parent) and calls[1] is None


def test_cold_kernels_where_the_parent_cannot_start(monkeypatch, tmp_path, capsys):
    """No warm parent (here: bubblewrap missing for it): one line says so and grading goes on cold."""
    from grader import autograde

    monkeypatch.setattr(warm, "check", lambda: (False, "bubblewrap is not installed"))
    monkeypatch.setattr(autograde, "sandbox_settings", lambda allow: (True, ""))
    seen, real = {}, autograde.grade

    def grade(jobs, out, settings, *args):
        seen["warm"] = settings.warm_kernels
        return real(jobs, out, settings, *args)

    monkeypatch.setattr(autograde, "grade", grade)
    (tmp_path / "subs").mkdir()
    autograde.autograde(tmp_path / "subs", tmp_path / "out", progress=False)
    assert seen["warm"] is False
    assert capsys.readouterr().err.count("grader: cold kernels (bubblewrap is not installed)") == 1
    monkeypatch.setattr(warm, "check", lambda: (True, ""))
    autograde.autograde(tmp_path / "subs", tmp_path / "out", progress=False, cold_kernels=True)
    assert seen["warm"] is False


def test_a_cold_kernel_cannot_unmount_what_hides_the_instructor_edition(tmp_path):
    """The sandbox drops every capability (run as root, bubblewrap would leave them)."""
    import subprocess
    import sys

    ok, why = sandbox.check_bwrap()
    if not ok:
        pytest.skip(why)
    package = Path(sandbox._course_utils_dir())
    code = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
            f"print(libc.umount2({str(package / 'instructor')!r}.encode(), 2), os.listdir({str(package / 'instructor')!r}))")
    cmd = sandbox.sandbox_command([sys.executable, "-c", code], socket_dir=str(tmp_path), memory=0,
                                  bwrap=sandbox.bwrap_path(), student_edition=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["-1", "[]"], done.stdout + done.stderr


# Graded end to end: an attack, then a wrong answer, on one grading process. ----------------------------
_RIGHT_SOFTMAX = ("def softmax_stable(x, dim=-1):\n    shifted = x - x.max(dim=dim, keepdim=True).values\n"
                  "    e = torch.exp(shifted)\n    return e / e.sum(dim=dim, keepdim=True)\n")
#: Run in any later kernel, this would give a wrong softmax_stable full marks: after each cell, the right one.
_PAYLOAD = ("import threading, time\n"
            "def _wait():\n"
            "    for _ in range(600):\n"
            "        try:\n"
            "            from IPython import get_ipython\n"
            "            ip = get_ipython()\n"
            "        except Exception:\n"
            "            ip = None\n"
            "        if ip is not None:\n"
            f"            ip.events.register('post_run_cell', lambda *a: exec({_RIGHT_SOFTMAX!r}, ip.user_ns))\n"
            "            return\n"
            "        time.sleep(0.05)\n"
            "threading.Thread(target=_wait, daemon=True).start()\n")
ATTACK = textwrap.dedent(f"""
    import os, subprocess, sys
    payload = {_PAYLOAD!r}
    for path in ["/tmp/home/.ipython/profile_default/startup/00-fix.py",
                 "/tmp/home/.local/lib/python3.11/site-packages/usercustomize.py", "/tmp/work/sitecustomize.py"]:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").write(payload)
    exec(payload)  # this kernel, and any state a later one might share
    # A forked kernel's /proc is its parent's sandbox's: /proc/self is not the PID the kernel has.
    print("forked" if os.readlink("/proc/self") != str(os.getpid()) else "cold")
    loop = "import time\\nwhile True:\\n    time.sleep(0.2)\\n"
    subprocess.Popen([sys.executable, "-c", loop], start_new_session=True)
""") + REACH_PARENT


def _submission(name: str, extra_first: str = "", answers: dict[str, str] | None = None) -> nbformat.NotebookNode:
    nb = solved(name, answers)
    if extra_first:
        nb.cells.insert(1, nbformat.v4.new_code_cell(extra_first))
    return nb


def test_a_wrong_answer_after_an_attack_on_the_same_worker_still_loses_its_points(tmp_path):
    from grader.autograde import autograde

    _need_warm()
    name = "02_softmax_and_context"
    wrong = "def softmax_stable(x, dim=-1):\n    return x / x.sum(dim=dim, keepdim=True)\n"
    subs = tmp_path / "subs"
    for student, nb in [("a_attack", _submission(name, ATTACK, answers={"softmax_stable": wrong})),
                        ("b_wrong", _submission(name, answers={"softmax_stable": wrong})),
                        ("c_right", _submission(name))]:
        (subs / student).mkdir(parents=True)
        nbformat.write(nb, subs / student / f"{name}.ipynb")
    out = tmp_path / "out"
    assert autograde(subs, out, workers=1, progress=False) == 0
    attacked = nbformat.read(out / "nbgrader" / "autograded" / "a_attack" / name / f"{name}.ipynb", as_version=4)
    said = studentenv.output_text(attacked.cells[1])
    assert "reached []" in said and "forked" in said, said
    # The payload works where it runs: the attacker's own wrong answer passed its tests in its kernel
    # (its score is 0 all the same: the rules flag the cell), so a kernel that inherited it would pass too.
    tests = [c for c in attacked.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")
             and "softmax_stable" in c.metadata["nbgrader"].get("grade_id", "")]
    assert tests and not any(o.get("output_type") == "error" for c in tests for o in c.outputs)
    with open(out / "cells.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f)]
    softmax = {r["student_id"]: r for r in rows if "softmax_stable" in r["grade_id"]}
    assert softmax["b_wrong"]["passed"] == "no", softmax
    assert softmax["c_right"]["passed"] == "yes", softmax


def _cells(out: Path) -> list[dict]:
    with open(out / "cells.csv", newline="") as f:
        return list(csv.DictReader(f))


#: ``COURSE_WARM_NOTEBOOKS="all"`` (or "05 08") compares every notebook's known answers; default 01 (its 10
#: submissions: graded warm in the suite's class, then cold here in about 20 s on 2 busy cores).
WARM_NOTEBOOKS = os.environ.get("COURSE_WARM_NOTEBOOKS", "01")


@submissions("test_warm")
def _known_answers(taken: set) -> dict:
    """Every known answer of the chosen notebooks (tests/fixtures/answers: each k-th wrong and right answer of
    every exercise, the solution) and the blank notebook, graded warm in the suite's one class
    (``tests/support/graded_class.py``), beside the cheats and on the same workers. Where another file
    submits the same student's notebook (the solution, the blank notebook, the first wrong answers), its
    submission is the one read."""
    from grader import course

    found = {}
    for name in course.available_notebooks():
        if WARM_NOTEBOOKS != "all" and name[:2] not in WARM_NOTEBOOKS.split():
            continue
        variants = [("solution", {})] + [(f"{kind.lower()}_{k}", answers) for kind in ("WRONG", "RIGHT")
                                         for k, answers in enumerate(answer_sets(name, kind))]
        for student, answers in variants:
            found[(student, name)] = (None if (student, name) in taken else _submission(name, answers=answers), None)
        blank = nbformat.read(course.notebooks_dir() / f"{name}.ipynb", as_version=4)
        found[("blank", name)] = (None if ("blank", name) in taken else blank, None)
    return found


def test_verdicts_are_the_same_warm_and_cold(graded_class, tmp_path):
    """Every known answer of the chosen notebooks, graded with warm kernels (in the suite's class: kernels
    forked from parents that served the cheats before) and again here, the same files, with --cold-kernels:
    cells.csv alike, row for row."""
    from grader.autograde import autograde

    _need_warm()
    assert graded_class.code == 0
    chosen = set(graded_class.plans["test_warm"])
    subs = tmp_path / "subs"
    for path, content in graded_class.originals.items():
        if (path.parent.name, path.stem) in chosen:
            (subs / path.parent.name).mkdir(parents=True, exist_ok=True)
            (subs / path.parent.name / path.name).write_bytes(content)
    assert autograde(subs, tmp_path / "cold", workers=2, progress=False, cold_kernels=True) == 0
    warm_rows = [r for r in _cells(graded_class.out) if (r["student_id"], r["notebook"]) in chosen]
    cold_rows = _cells(tmp_path / "cold")
    assert {(r["student_id"], r["notebook"]) for r in warm_rows} == chosen
    assert len(warm_rows) > 20 and any(r["passed"] == "no" for r in warm_rows)
    assert warm_rows == cold_rows


def test_a_parent_that_cannot_import_means_cold_kernels(monkeypatch, capsys):
    """A parent that never gets ready (here: its Python cannot start) is not restarted for every
    notebook: one line says why, and the process's kernels are cold from then on."""
    _need_warm()
    warm.disable()
    monkeypatch.setattr(warm.sys, "executable", "/nonexistent/python")
    warm.enable(SETTINGS.memory)
    try:
        parent = warm.current()
        with pytest.raises(OSError):
            parent.ready(timeout=60)
        assert warm.current() is None and warm.current() is None
        assert capsys.readouterr().err.count("grader: the warm parent could not start") == 1
        monkeypatch.undo()
        out, km = _run("print('cold')")
        assert "cold" in out and not km._forks()
    finally:
        warm.disable()
        warm._state["said"] = False


# ---------------------------------------------------------------------------------------------
# The tests' own warm kernels (tests/support/warm_kernel.py): nbval's kernel of every solution notebook
# is forked from a pre-imported parent (grader/zygote.py, plain-fork) and must start as a cold one would.

_FINGERPRINT = r"""
import json, os, random, signal, sys, threading
import matplotlib, matplotlib.pyplot as plt, numpy, torch
import sympy, torch._dynamo  # what a notebook's first meta-device operation imports (the parent did)
mask = os.umask(0); os.umask(mask)
plt.figure(); plt.plot([1, 2]); plt.show()
print(json.dumps({
    "env": {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "PYTEST_CURRENT_TEST"))},
    "cwd": os.getcwd(), "path": sys.path, "argv": sys.argv[1:-1] + [os.path.dirname(sys.argv[-1])], "argv0": os.path.basename(sys.argv[0]),
    "executable": sys.executable, "umask": mask, "session_leader": os.getsid(0) == os.getpid(),
    "threads": sorted(type(t).__name__ for t in threading.enumerate()),
    "signals": {s.name: str(signal.getsignal(s)) for s in signal.valid_signals()
                if s not in (signal.SIGKILL, signal.SIGSTOP) and isinstance(s, signal.Signals)},
    "backend": matplotlib.get_backend(),
    "rc": {k: str(v) for k, v in sorted(matplotlib.rcParams.items())},
    "capability": torch.backends.cpu.get_cpu_capability(), "torch_threads": torch.get_num_threads(),
    "warnings": sorted(str(f) for f in __import__("warnings").filters),
    "leak": [hasattr(torch, "leaked"), "LEAKED" in os.environ, "leaked_module" in sys.modules],
    "draws": [random.random(), float(numpy.random.rand()), torch.rand(1).item(), torch.initial_seed()],
}))
torch.leaked = 1; os.environ["LEAKED"] = "1"; sys.modules["leaked_module"] = sys
"""


def _tests_kernel(code: str, *, cold: bool = False, cwd: str | None = None, env: dict | None = None,
                  during=None) -> tuple[dict | str, list[str], bool]:
    """Run ``code`` in a kernel of the tests' spec (nbval's; in ``solutions/`` unless ``cwd``), with the
    spec's provisioner unless ``cold``: (its last line of stdout read as JSON where it is, else its stdout
    and errors; its output messages' types; whether it was forked)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    from tests.support.other_cpu import KERNEL_NAME

    class ColdSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            spec = super().get_kernel_spec(kernel_name)
            spec.metadata = {k: v for k, v in spec.metadata.items() if k != "kernel_provisioner"}
            return spec

    km = KernelManager(kernel_name=KERNEL_NAME, **({"kernel_spec_manager": ColdSpecs()} if cold else {}))
    km.start_kernel(cwd=cwd or str(Path(__file__).resolve().parents[2] / "solutions"),
                    **({"env": env} if env is not None else {}))
    kc = km.client()
    kc.start_channels()
    out: list[str] = []
    kinds: list[str] = []

    def hook(msg):
        kinds.append(msg["msg_type"])
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(f"{msg['content']['ename']}: {msg['content']['evalue']}\n")
    forked = bool(getattr(km.provisioner, "forked", False))
    try:
        kc.wait_for_ready(timeout=120)
        if during is not None:
            during(km, kc)
        kc.execute_interactive(code, timeout=120, output_hook=hook)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    text = "".join(out)
    try:
        return json.loads(text.strip().splitlines()[-1]), kinds, forked
    except (ValueError, IndexError):
        return text, kinds, forked


def _need_tests_warm():
    from tests.support import warm_kernel

    if os.environ.get("COURSE_COLD_KERNELS", "") not in ("", "0"):
        pytest.skip("COURSE_COLD_KERNELS is set: the tests' kernels start cold")
    if sys.platform != "linux":
        pytest.skip("the tests' warm kernels need Linux")
    return warm_kernel


def test_a_tests_kernel_is_forked_and_starts_as_a_cold_one():
    """Everything a notebook's output could depend on reads the same in a forked kernel as in a cold one
    (environment, working folder and path, signal handlers, threads, matplotlib's backend and settings,
    the CPU's setting, warning filters), but the random generators, seeded afresh in each; and nothing
    one forked kernel changes reaches the next. (The warning filters are the same but in another order:
    the parent imports torch before ipykernel; none of them match the same warning.)"""
    _need_tests_warm()
    import signal

    # A signal this process ignores stays ignored in a kernel it starts (through execve): in a fork too.
    before = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        cold, cold_kinds, cold_forked = _tests_kernel(_FINGERPRINT, cold=True)
        first, first_kinds, first_forked = _tests_kernel(_FINGERPRINT)
        second, _, second_forked = _tests_kernel(_FINGERPRINT)
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert isinstance(cold, dict), cold
    assert isinstance(first, dict), first
    assert (cold_forked, first_forked, second_forked) == (False, True, True)
    for name in ("env", "cwd", "path", "argv", "argv0", "executable", "umask", "session_leader", "threads",
                 "signals", "backend", "rc", "capability", "torch_threads", "warnings"):
        assert first[name] == cold[name], name
    assert first["capability"] == "DEFAULT" and first["torch_threads"] == 1
    assert first["signals"]["SIGUSR2"] == str(int(signal.SIG_IGN)) != first["signals"]["SIGUSR1"]
    assert "display_data" in first_kinds and first_kinds.count("display_data") == cold_kinds.count("display_data")
    assert first["leak"] == second["leak"] == [False, False, False]
    for a, b, c in zip(cold["draws"], first["draws"], second["draws"]):
        assert len({a, b, c}) == 3  # Python's, numpy's and torch's generators: each kernel its own draws


def test_a_tests_kernel_starts_cold_where_a_fork_would_differ(tmp_path):
    """nbval's kernels (the spec names the provisioner) are forked, from a parent of their own environment;
    one whose working folder holds another copy of a package the parent imported starts cold."""
    warm_kernel = _need_tests_warm()
    from jupyter_client.manager import KernelManager

    from tests.support.other_cpu import KERNEL_NAME

    spec = KernelManager(kernel_name=KERNEL_NAME).kernel_spec
    assert spec.metadata["kernel_provisioner"]["provisioner_name"] == warm_kernel.PROVISIONER
    assert _tests_kernel("print(1)")[2]
    assert _tests_kernel("print(1)", cwd=str(Path(__file__).resolve().parents[2]))[2]  # its course_utils is the parent's
    parents = set(warm_kernel._state["parents"])
    text, _, forked = _tests_kernel("import os; print(os.environ['COURSE_SOMETHING'])",
                                    env={**os.environ, "COURSE_SOMETHING": "else"})
    assert (text, forked) == ("else\n", True)
    added = set(warm_kernel._state["parents"]) - parents  # imported in that environment
    assert len(added) == 1
    warm_kernel._state["parents"].pop(added.pop()).close()
    (tmp_path / "course_utils").mkdir()
    (tmp_path / "course_utils" / "__init__.py").write_text("")
    text, _, forked = _tests_kernel("import course_utils; print(course_utils.__file__)", cwd=str(tmp_path))
    assert (text, forked) == (f"{tmp_path / 'course_utils' / '__init__.py'}\n", False)


def test_a_tests_kernel_talks_over_unix_sockets_of_its_own():
    """No TCP ports: a port the manager picked and closed could be taken before the kernel bound it, and the
    kernel died before it answered. Its sockets' folder is its own, and goes with it."""
    _need_tests_warm()
    seen: dict = {}

    def during(km, kc):
        seen.update(transport=km.transport, folder=os.path.dirname(km.ip), files=os.listdir(os.path.dirname(km.ip)))

    assert _tests_kernel("print('one')", during=during)[::2] == ("one\n", True)
    assert seen["transport"] == "ipc" and len(seen["files"]) == 5, seen
    assert not os.path.exists(seen["folder"])


def test_a_forked_tests_kernel_is_interrupted_and_killed_with_what_it_started(tmp_path):
    """The kernel manager interrupts a forked kernel (SIGINT to its process group, as a cold one) and its
    shutdown kills what the kernel started in its session."""
    _need_tests_warm()
    marker = tmp_path / "child.pid"
    code = (f"import subprocess, time\np = subprocess.Popen(['sleep', '300'])\n"
            f"open({str(marker)!r}, 'w').write(str(p.pid))\ntime.sleep(60)\n")

    def interrupt_soon(km, kc):
        import threading

        threading.Timer(3, km.interrupt_kernel).start()

    text, _, forked = _tests_kernel(code, during=interrupt_soon)
    assert forked
    assert "KeyboardInterrupt" in text, text
    child = int(marker.read_text())
    for _ in range(50):
        try:
            state = Path(f"/proc/{child}/stat").read_text().split(") ")[1][0]
        except OSError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("the kernel's child outlived its kernel")
