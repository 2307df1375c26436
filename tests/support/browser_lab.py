"""Helpers for tests/release/test_browser.py: JupyterLab as `make lab` starts it, driven with Playwright.

Selectors are JupyterLab 4's own class names (``.jp-Cell``, ``.jp-InputPrompt``, ``.cm-content``).
The browser is Debian's ``chromium`` (``make test-tools`` installs it); Playwright's own browser
download is never used.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
LAB_SCRIPT = ROOT / "scripts" / "lab.py"

# Console errors that are not the course's fault. JupyterLab 4.6 with nbgrader 0.9.6's extensions
# printed none of their own in these tests (checked with an empty list), so only the Colab badge is
# here. Anything else printed as a console error (or thrown) fails the test.
KNOWN_NOISE = [
    # The "Open in Colab" badge at the top of every notebook is an image on colab.research.google.com.
    # The test machine is offline, so it cannot load; a student online sees it. Only that address is
    # excused: any other failed request (a figure, a script, a style sheet) still fails the test.
    (re.compile(r"^console\.error: Failed to load resource: net::ERR_[A-Z_]+ "
                r"\(https://colab\.research\.google\.com/assets/colab-badge\.svg\)$"),
     "the Colab badge is an external image and this machine is offline"),
]


def chromium_path() -> str | None:
    """Debian's Chromium, or None when it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Lab:
    """A running JupyterLab: ``url(path)`` gives an address with the token."""

    process: subprocess.Popen
    base: str
    token: str
    folder: Path
    log: Path

    def url(self, path: str = "lab") -> str:
        return f"{self.base}/{path}?token={self.token}"

    def stop(self) -> None:
        """Stop JupyterLab; it shuts its kernels down cleanly in a few seconds, which the tests do not
        wait for (a background thread does, and kills it if it hangs)."""
        self.process.terminate()  # scripts/lab.py passes it on to Jupyter

        def reap():
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process.stdout.close()

        threading.Thread(target=reap, name="stop-jupyterlab", daemon=True).start()


def start_lab(folder: Path, log: Path, token: str, env: dict[str, str]) -> Lab:
    """``scripts/lab.py`` (what `make lab` runs) on a free port; returns once it printed its URL."""
    port = free_port()
    out = log.open("w")
    process = subprocess.Popen([sys.executable, str(LAB_SCRIPT), "--notebook-dir", str(folder), "--port", str(port),
                                "--no-browser"], cwd=ROOT, env={**env, "JUPYTER_TOKEN": token},
                               stdout=subprocess.PIPE, stderr=out, text=True)
    printed = []
    for line in process.stdout:  # ends when the script exits
        printed.append(line)
        if f"token={token}" in line:
            url = line.strip()
            assert url == f"http://127.0.0.1:{port}/lab?token={token}", url
            return Lab(process, url.split("/lab?")[0], token, folder, log)
    process.wait()
    raise RuntimeError(f"scripts/lab.py ended without printing its URL: {''.join(printed)}\n{log.read_text()}")


@dataclass
class Console:
    """JavaScript console errors and uncaught exceptions of a page, less ``KNOWN_NOISE``."""

    errors: list[str] = field(default_factory=list)

    def attach(self, page) -> "Console":
        page.on("console", lambda msg: msg.type == "error" and self._add(f"console.error: {msg.text} "
                                                                          f"({msg.location.get('url', '')})"))
        page.on("pageerror", lambda exc: self._add(f"uncaught: {exc}"))
        return self

    def _add(self, text: str) -> None:
        if not any(pattern.search(text) for pattern, _ in KNOWN_NOISE):
            self.errors.append(text)

    def assert_clean(self, since: int = 0) -> None:
        """No error after the first ``since`` ones."""
        new = self.errors[since:]
        assert not new, "JavaScript errors from the course's content:\n" + "\n".join(new)


def assert_check_message(text: str, *words: str) -> None:
    """A check's output as the student sees it: its own message (containing ``words``), not a
    traceback through the course's code."""
    assert "Traceback" not in text and "most recent call last" not in text, f"a traceback wall:\n{text}"
    assert "course_utils" not in text and "hidden" not in text.lower(), f"the checks' own code shows:\n{text}"
    assert len(text.strip().splitlines()) <= 12, f"{len(text.splitlines())} lines, expected a short message:\n{text}"
    for word in words:
        assert word in text, f"{word!r} not in the check's output:\n{text}"


class Notebook:
    """One notebook open in JupyterLab, driven through the keyboard as a student would."""

    def __init__(self, page, name: str, panel: str):
        self.page, self.name, self.panel = page, name, f"#{panel}"
        self.cells = f"#{panel} .jp-Notebook .jp-Cell"  # this notebook's cells, not another tab's

    @classmethod
    def open(cls, page, lab: Lab, name: str) -> "Notebook":
        """Open ``name`` by double-clicking it in JupyterLab's file browser."""
        cells = len(json.loads((lab.folder / name).read_text(encoding="utf-8"))["cells"])
        item_name = page.locator(".jp-DirListing-itemText", has_text=re.compile(f"^{re.escape(name)}$"))
        page.locator(".jp-DirListing-item", has=item_name).dblclick()
        tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current", has_text=name)
        panel = tab.get_attribute("data-id")
        nb = cls(page, name, panel)
        # JupyterLab renders a long notebook in chunks: wait for every cell and for an idle kernel.
        page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length === n", arg=[nb.cells, cells])
        page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle$")).wait_for()
        return nb

    def close(self) -> None:
        """Close the tab with its × (save first: a changed notebook asks); the kernel keeps running."""
        tab = self.page.locator(f".lm-TabBar-tab[data-id='{self.panel[1:]}']")
        tab.locator(".lm-TabBar-tabCloseIcon").click()
        tab.wait_for(state="detached")

    def cell(self, index: int):
        return self.page.locator(self.cells).nth(index)

    def prompt(self, index: int) -> str:
        return self.cell(index).locator(".jp-InputPrompt").inner_text()

    def wait_executed(self, index: int, before: str, timeout: float = 60_000) -> None:
        """Wait until code cell ``index``'s prompt shows a new execution count (not ``before``, not ``*``).
        The cell is looked up afresh on every poll: JupyterLab may re-create a cell's nodes."""
        self.page.wait_for_function(
            "([sel, i, old]) => { const cell = document.querySelectorAll(sel)[i]; "
            "const p = cell && cell.querySelector('.jp-InputPrompt'); if (!p) return false; "
            "const t = p.textContent.trim(); return /\\[\\d+\\]/.test(t) && t !== old; }",
            arg=[self.cells, index, before], timeout=timeout)

    def select(self, index: int) -> None:
        """Select cell ``index`` in command mode (click its prompt area, then Escape)."""
        cell = self.cell(index)
        cell.scroll_into_view_if_needed()
        cell.locator(".jp-InputArea-prompt, .jp-InputPrompt").first.click()
        self.page.keyboard.press("Escape")

    def run_from(self, first: int, last: int) -> None:
        """Shift+Enter through cells ``first``..``last`` (run and advance), then wait for the code cells."""
        code = [i for i in range(first, last + 1) if "jp-CodeCell" in (self.cell(i).get_attribute("class") or "")]
        before = {i: self.prompt(i) for i in code}
        self.select(first)
        for _ in range(first, last + 1):
            self.page.keyboard.press("Shift+Enter")
        for i in code:
            self.wait_executed(i, before[i])

    def run(self, index: int) -> str:
        """Run one cell (Shift+Enter) and return its output's text."""
        before = self.prompt(index)
        self.select(index)
        self.page.keyboard.press("Shift+Enter")
        self.wait_executed(index, before)
        return self.output(index)

    def type_into(self, index: int, source: str) -> None:
        """Replace cell ``index``'s code through the keyboard: click into it, select all, type."""
        editor = self.cell(index).locator(".cm-content")
        editor.scroll_into_view_if_needed()
        editor.click()
        self.page.keyboard.press("Control+a")
        # insert_text types the text as one input, so the editor's auto-indent on Enter does not
        # indent the already indented lines a second time.
        self.page.keyboard.insert_text(source.strip("\n"))
        self.page.keyboard.press("Escape")

    def validate(self) -> str:
        """Click nbgrader's Validate button in the notebook's toolbar; the result dialog's text."""
        self.page.locator(f"{self.panel} .jp-Toolbar").get_by_text("Validate", exact=True).click()
        message = self.page.locator(".jp-Dialog .jp-Dialog-body")
        message.wait_for(timeout=90_000)  # nbgrader runs the whole notebook in a kernel of its own
        return message.inner_text()

    def close_dialog(self) -> None:
        self.page.locator(".jp-Dialog").get_by_role("button", name="Ok").click()
        self.page.locator(".jp-Dialog").wait_for(state="detached")

    def output(self, index: int) -> str:
        return self.cell(index).locator(".jp-OutputArea").inner_text()

    def save(self) -> None:
        """Ctrl+S, then wait until the tab is no longer marked as changed."""
        self.page.keyboard.press("Control+s")
        self.page.locator(".lm-TabBar-tab.jp-mod-dirty", has_text=self.name).wait_for(state="detached")

    def shot(self, name: str, index: int | None = None) -> Path:
        """Screenshot of the window (scrolled to cell ``index``) into ``ARTIFACTS/name``."""
        if index is not None:
            self.cell(index).scroll_into_view_if_needed()
        # Cells scrolled into view are painted on the next frames (JupyterLab's content-visibility).
        self.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path))
        return path
