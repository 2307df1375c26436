"""The sandbox command is built so that what the kernel needs stays visible wherever the course lives."""

from __future__ import annotations

import pytest

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


def test_the_kernel_computes_as_the_grader_is_told_to(monkeypatch):
    """ATEN_CPU_CAPABILITY and MKL_ENABLE_INSTRUCTIONS reach the kernel where the grader has them: the grader
    compares the kernel's outputs with the reference's computed in its own process, so both compute alike
    (float32 weights drawn from one seed differ in their last bits between CPUs)."""
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    cmd = sandbox.sandbox_command(["python"], socket_dir="/tmp/x", memory=0, bwrap="bwrap")
    assert "ATEN_CPU_CAPABILITY" not in cmd
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "SSE4_2")
    cmd = sandbox.sandbox_command(["python"], socket_dir="/tmp/x", memory=0, bwrap="bwrap")
    at = cmd.index("ATEN_CPU_CAPABILITY")
    assert cmd[at - 1] == "--setenv" and cmd[at + 1] == "default"
    assert cmd[cmd.index("MKL_ENABLE_INSTRUCTIONS") + 1] == "SSE4_2"


def test_the_font_list_is_built_once_and_read_only_inside(tmp_path):
    """Each kernel reads matplotlib's font list, built once by the grader, instead of building its own;
    it cannot change that list, and its matplotlib folder stays writable."""
    import subprocess
    import sys

    import pytest

    ok, why = sandbox.check_bwrap()
    if not ok:
        pytest.skip(why)
    fonts = sandbox.font_cache()
    assert fonts is not None and sandbox.font_cache() is fonts, "built once per process"
    listing = next(fonts.glob("fontlist-*.json"))
    probe = ("import os, matplotlib, matplotlib.font_manager as fm\n"
             f"path = '/tmp/home/.matplotlib/{listing.name}'\n"
             "print(matplotlib.get_cachedir(), os.path.exists(path), len(fm.fontManager.ttflist) > 0)\n"
             "try:\n    open(path, 'a').write('x')\n    print('written')\nexcept OSError:\n    print('read-only')\n"
             "open('/tmp/home/.matplotlib/mine', 'w').write('x')\n")
    cmd = sandbox.sandbox_command([sys.executable, "-c", probe], socket_dir=str(tmp_path), memory=0,
                                  bwrap=sandbox.bwrap_path())
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["/tmp/home/.matplotlib", "True", "True", "read-only"], done.stdout
    assert "building the font cache" not in done.stderr


def test_a_judged_notebook_gets_the_student_edition_and_its_hand_off(monkeypatch, tmp_path):
    """grader/judge.py: the kernel sees course_utils without its answers and hidden cases, writes into
    the hand-off folder, reads the hidden inputs read-only, and is told where both are."""
    import subprocess
    import sys
    from pathlib import Path

    import course_utils

    package = Path(course_utils.__file__).resolve().parent
    outputs, inputs = tmp_path / "out", tmp_path / "in" / "inputs.pt"
    outputs.mkdir(), inputs.parent.mkdir()
    inputs.write_bytes(b"")
    cmd = sandbox.sandbox_command(["python"], socket_dir=str(tmp_path), memory=0, bwrap="bwrap",
                                  probe_dir=str(outputs), probe_inputs=str(inputs), student_edition=True)
    assert cmd[cmd.index(str(package / "instructor")) - 1] == "--tmpfs"
    stub = cmd.index(str(package / "reference.py"))
    assert cmd[stub - 2] == "--ro-bind" and "templates/student/reference.py" in cmd[stub - 1]
    assert cmd[cmd.index(sandbox.PROBE_DIR_INSIDE) - 2:cmd.index(sandbox.PROBE_DIR_INSIDE)] == ["--bind", str(outputs)]
    assert cmd[cmd.index(sandbox.PROBE_INPUTS_INSIDE) - 2] == "--ro-bind"
    assert f"{sandbox.PROBE_INPUTS_INSIDE}/inputs.pt" in cmd
    if sandbox.check_bwrap()[0]:  # and in a real sandbox: no answers, no hidden cases to be found
        real = sandbox.sandbox_command([sys.executable, "-c", (
            "import os, course_utils\n"
            "p = os.path.dirname(course_utils.__file__)\n"
            "print(sorted(os.listdir(os.path.join(p, 'instructor'))))\n"
            "try:\n    import course_utils.reference\nexcept ImportError as e:\n    print('ImportError:', e)\n"
            "open(os.path.join(os.environ['COURSE_PROBE_DIR'], 'x'), 'w').write('ok')\n")],
            socket_dir=str(tmp_path), memory=0, bwrap=sandbox.bwrap_path(), probe_dir=str(outputs),
            probe_inputs=str(inputs), student_edition=True)
        done = subprocess.run(real, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "[]" in done.stdout and "not part of the student edition" in done.stdout
        assert (outputs / "x").read_text() == "ok"


@pytest.mark.parametrize("notebook", ["01_dot_products", "02_softmax_and_context", "03_trainable_self_attention",
                                      "04_causal_attention", "05_multi_head_attention"])
def test_a_fully_judged_notebooks_kernel_gets_the_student_edition(notebook):
    """Every exercise of these notebooks is judged outside (grader/judge.py, the modules of 03 to 05 and
    05's count_parameters included), so their grading kernels see course_utils without answers or hidden
    cases."""
    from grader import course, judge

    assert judge.student_edition_kernel(notebook)
    handoff = judge.prepare(notebook)
    try:
        assert handoff.student_edition and handoff.exercises == list(course.EXERCISES[notebook])
    finally:
        handoff.remove()


def test_notebook_06s_kernel_gets_the_student_edition():
    """Notebook 06 is judged entirely outside too (its module classes' probes with the count of the fused
    kernel's calls, and the timer's simulated devices): its grading kernel has the student edition."""
    test_a_fully_judged_notebooks_kernel_gets_the_student_edition("06_efficient_attention_gpu")


def test_notebook_07s_kernel_gets_the_student_edition():
    """Notebook 07 is judged entirely outside too (the tiled attention's outputs and what the tensor watcher
    saw of each run, and the Triton kernel's (out, lse) per launch): its grading kernel has the student edition."""
    test_a_fully_judged_notebooks_kernel_gets_the_student_edition("07_flash_attention_from_scratch")


def test_notebook_10s_kernel_gets_the_student_edition():
    """Notebook 10 is judged entirely outside too (the gradients, what the tensor watcher saw of the tiled
    backward, the autograd Function's runs, what its forward keeps and gradcheck's word, the Triton kernel's
    (dk, dv) per launch): its grading kernel has the student edition."""
    test_a_fully_judged_notebooks_kernel_gets_the_student_edition("10_flash_attention_backward")


def test_notebook_08s_and_09s_kernels_get_the_student_edition():
    """Notebook 08 is judged entirely outside (its cache class as ordered sessions; check_alone's first tries
    in a kernel of their own), and so is 09 (its block and model keyed, with their cached paths handed out as
    traces of plain data; TinyGPT's first try in a kernel of its own): their grading kernels have the student
    edition."""
    test_a_fully_judged_notebooks_kernel_gets_the_student_edition("08_kv_cache_gqa_and_windows")
    test_a_fully_judged_notebooks_kernel_gets_the_student_edition("09_capstone_tiny_transformer")


def test_a_fork_bomb_stops_at_the_kernels_process_cap(tmp_path):
    """grader/cgroups.py: in the sandbox, as the kernel manager starts it, fork fails past the cap, and the
    group is gone once removed (a kernel's cleanup removes it)."""
    import subprocess
    import sys

    import pytest

    from grader import cgroups

    ok, why = sandbox.check_bwrap()
    if not ok:
        pytest.skip(why)
    capped, why = cgroups.status()
    if not capped:
        pytest.skip(f"no process cap on this machine: {why}")
    bomb = ("import os, time\nn = 0\ntry:\n    for _ in range(400):\n        if os.fork() == 0:\n"
            "            time.sleep(2)\n            os._exit(0)\n        n += 1\n"
            "except OSError as exc:\n    print('refused after', n, type(exc).__name__)\nelse:\n    print('forked', n)\n")
    group = cgroups.make_group(pids_max=64)
    assert group is not None
    try:
        cmd = group.join_prefix() + sandbox.sandbox_command([sys.executable, "-c", bomb], socket_dir=str(tmp_path),
                                                            memory=0, bwrap=sandbox.bwrap_path())
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        group.remove()
    words = done.stdout.split()
    assert words[:2] == ["refused", "after"] and int(words[2]) < 64, done.stdout + done.stderr[-1000:]
    assert not group.folder.exists()


@pytest.mark.parametrize("memory_max", [600 * 1024**2, None], ids=["capped", "uncapped"])
def test_the_kernels_processes_share_one_memory_cap(tmp_path, memory_max):
    """grader/cgroups.py: four processes of one kernel, each holding 250 MB (under any per-process cap),
    together pass a 600 MB cap: the kernel's own out-of-memory killer ends some of them, and nothing
    outside. Uncapped, the same four all finish: the cap is what stopped them."""
    import subprocess
    import sys

    from grader import cgroups

    ok, why = sandbox.check_bwrap()
    if not ok:
        pytest.skip(why)
    capped, why = cgroups.memory_status()
    if not capped:
        pytest.skip(f"no memory cap on this machine: {why}")
    hold = ("import os, time\nkids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
            "        block = b'x' * (250 * 1024**2)\n        time.sleep(3)\n        os._exit(0)\n    kids.append(pid)\n"
            "print('killed', sum(os.waitpid(pid, 0)[1] != 0 for pid in kids))\n")
    group = cgroups.make_group(memory_max=memory_max)
    assert group is not None and group.memory_max == memory_max
    try:
        cmd = group.join_prefix() + sandbox.sandbox_command([sys.executable, "-c", hold], socket_dir=str(tmp_path),
                                                            memory=0, bwrap=sandbox.bwrap_path())
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        group.remove()
    words = done.stdout.split()
    assert words[:1] == ["killed"], done.stdout + done.stderr[-1000:]
    assert (int(words[1]) >= 1) == (memory_max is not None), done.stdout
    assert not any(folder.exists() for folder in group.folders)


@pytest.mark.parametrize("shutdown, hook_runs", [("immediate", False), ("graceful", True)])
def test_the_kernel_is_stopped_at_once_after_the_last_cell(tmp_path, shutdown, hook_runs):
    """grader.execute.RobustExecute stops the kernel without letting it wind down (its default): a
    student's ``atexit`` hook never runs, and no notebook waits for Python to finalise torch. The
    ``graceful`` case shows the hook is real: it runs when the kernel is let to exit."""
    import nbformat
    from traitlets.config import Config

    from grader.execute import RobustExecute

    marker = tmp_path / "atexit-ran"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"import atexit, pathlib\natexit.register(pathlib.Path({str(marker)!r}).write_text, 'ran')")])
    config = Config()
    config.RobustExecute.kernel_manager_class = "grader.kernels.SandboxedKernelManager"
    config.SandboxedKernelManager.sandbox = False  # the hook must be able to reach tmp_path
    if shutdown != RobustExecute.shutdown_kernel.default_value:
        config.RobustExecute.shutdown_kernel = shutdown
    assert RobustExecute.shutdown_kernel.default_value == "immediate"
    RobustExecute(config=config).preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert not any(o.get("output_type") == "error" for o in nb.cells[0].outputs), nb.cells[0].outputs
    assert marker.exists() == hook_runs
