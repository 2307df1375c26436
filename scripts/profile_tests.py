"""Where the CPU of a pytest run goes: per test file, split into the pytest process, the kernels it
started and its other child processes. Linux only (reads ``/proc``).

    .venv/bin/python scripts/profile_tests.py [pytest arguments]
    (default: make test's own: -n 2 --dist loadfile --no-loadscope-reorder --ignore=tests/release/test_colab.py
    --ignore=tests/grader_messy/test_gradescope_container.py)

Every 0.25 s it reads each process's CPU time (``/proc/<pid>/stat``: user + system) and its parent, and
gives each process's CPU since the last reading to the test its pytest process was running then
(``tests/support/cpu_log.py`` logs each test's start and end). A graded kernel is found through its
parents (bubblewrap, the grading process, the fork server, the pytest worker). CPU spent outside the run
(the machine's own kernel threads, other programs) is printed apart. A process that ends between two
readings loses its last 0.25 s, so the sums are a little low. Not a test: the figures depend on the machine.
"""

from __future__ import annotations

import bisect
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
DEFAULT_ARGS = ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder", "--ignore=tests/release/test_colab.py",
                "--ignore=tests/grader_messy/test_gradescope_container.py"]


def _read_processes() -> dict[int, tuple[int, float]]:
    """``pid -> (parent pid, CPU seconds so far)`` of every process now."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        found[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    return found


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class Sampler(threading.Thread):
    """Reads every process's CPU time every ``every`` seconds until stopped."""

    def __init__(self, every: float = 0.25):
        super().__init__(daemon=True)
        self.every, self.stop = every, threading.Event()
        self.parents: dict[int, int] = {}
        self.commands: dict[int, str] = {}
        self.deltas: list[tuple[float, int, float]] = []  # (time, pid, CPU seconds since the last reading)
        self._last: dict[int, float] = {}
        self.first = _read_processes()

    def run(self) -> None:
        for pid, (_, cpu) in self.first.items():
            self._last[pid] = cpu  # what ran before the run is not the run's
        while not self.stop.wait(self.every):
            now = time.time()
            for pid, (parent, cpu) in _read_processes().items():
                if pid not in self.parents:
                    self.parents[pid] = parent  # the first parent: a kernel's bubblewrap may exit before it
                    self.commands[pid] = _command(pid)
                used = cpu - self._last.get(pid, 0.0)
                self._last[pid] = cpu
                if used > 0:
                    self.deltas.append((now, pid, used))


def _tests(folder: Path) -> dict[int, list[tuple[float, float, str]]]:
    """``pid -> [(start, end, test id), ...]`` from the plugin's logs, sorted."""
    runs: dict[int, list[tuple[float, float, str]]] = collections.defaultdict(list)
    started: dict[tuple[int, str], float] = {}
    for path in folder.glob("tests-*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            key = (record["pid"], record["id"])
            if "start" in record:
                started[key] = record["start"]
            elif key in started:
                runs[record["pid"]].append((started.pop(key), record["end"], record["id"]))
    for spans in runs.values():
        spans.sort()
    return runs


def report(sampler: Sampler, runs: dict[int, list[tuple[float, float, str]]], main: int) -> str:
    """The table: CPU seconds per test file and kind of process, the kernels per file, what ran outside.
    ``main``: the pytest process started (under pytest-xdist, the one that hands tests to the workers)."""

    def worker_of(pid: int) -> int | None:
        for _ in range(64):
            if pid in runs or pid == main:
                return pid
            pid = sampler.parents.get(pid, 0)
            if pid <= 1:
                return None
        return None

    def test_at(worker: int, when: float) -> str:
        spans = runs.get(worker, [])
        if not spans:
            return "(pytest's main process)"
        i = bisect.bisect_right(spans, (when, float("inf"), "")) - 1
        return spans[i][2].split("::")[0] if i >= 0 and spans[i][0] <= when <= spans[i][1] + 0.5 else "(between tests)"

    per_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    outside: collections.Counter = collections.Counter()
    kernels: dict[str, dict[int, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    first_seen: dict[int, float] = {}
    for when, pid, used in sampler.deltas:
        first_seen.setdefault(pid, when)
        worker = worker_of(pid)
        command = sampler.commands.get(pid, "")
        if worker is None:
            outside[command[:70] or f"[kernel thread {pid}]"] += used
            continue
        name = test_at(worker, first_seen[pid] if "ipykernel" in command else when)
        kind = "pytest" if pid == worker else "kernels" if "ipykernel" in command else "other children"
        per_file[name][kind] += used
        if kind == "kernels":
            kernels[name][pid] += used
    lines = [f"{'CPU s':>7} {'pytest':>7} {'kernels':>8} {'n':>4} {'mean':>5} {'others':>7}  test file"]
    for name, kinds in sorted(per_file.items(), key=lambda item: -sum(item[1].values())):
        started = kernels.get(name, {})
        mean = sum(started.values()) / len(started) if started else 0.0
        lines.append(f"{sum(kinds.values()):7.1f} {kinds['pytest']:7.1f} {kinds['kernels']:8.1f} {len(started):4d} "
                     f"{mean:5.1f} {kinds['other children']:7.1f}  {name}")
    total = sum(sum(k.values()) for k in per_file.values())
    lines.append(f"{total:7.1f} in the run; {sum(len(k) for k in kernels.values())} kernels started")
    lines.append("outside the run (the machine's own threads and programs):")
    lines += [f"{used:7.1f}  {command}" for command, used in outside.most_common(8)]
    return "\n".join(lines)


def main() -> int:
    args = sys.argv[1:] or DEFAULT_ARGS
    with tempfile.TemporaryDirectory(prefix="test-cpu-") as folder:
        env = dict(os.environ, COURSE_CPU_LOG=folder)
        env.setdefault("OMP_NUM_THREADS", "1")
        sampler = Sampler()
        sampler.start()
        began = time.time()
        run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "tests.support.cpu_log", *args], cwd=ROOT, env=env)
        code = run.wait()
        sampler.stop.set()
        sampler.join()
        print(f"\npytest exited {code} after {time.time() - began:.0f} s of wall time\n")
        print(report(sampler, _tests(Path(folder)), run.pid))
    return code


if __name__ == "__main__":
    sys.exit(main())
